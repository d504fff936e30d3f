"""`kr.Client(url=..., key=...)`: the same test bodies run against the embedded client and a
remote one of a real server (uvicorn on a free port) over the same project, and both answer
with the same types. Then what only a remote client has: keys, retries, an unreachable URL."""

import asyncio
import json
import socket
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import skops.io
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

import kairos as kr
from examples.fraud.features import User
from examples.fraud.generate import ANCHOR
from examples.fraud.train import INPUTS
from kairos.cli.main import main
from kairos.client.remote import RemoteClient
from kairos.client.wire import RemoteError, ServerUnavailable, Unauthorized
from kairos.engine.result import BulkResult, FeatureError, NodeTiming, QueryResult
from kairos.errors import BackendUnavailable, InvalidInput, KairosError, UnknownFeature
from kairos.models.errors import UnknownModel
from kairos.models.registry import AliasChange, ModelVersion
from kairos.project.offline import OfflineResult
from kairos.stores.codec import TAGGED_JSON, decode
from kairos.stores.query_log import LoggedQuery
from tests.client.conftest import REMOTE_KEY
from tests.gateway.fake_upstream import ServerThread
from tests.server.fraud import copy_project

OUTPUTS = [User.name, User.txn_count["1d"], User.declines["7d"], "user.risk", User.signup_at]


def test_a_query_answers_values_sources_times_and_a_trace(any_client: Any) -> None:
    r = any_client.query(input={User.id: "u0001"}, output=OUTPUTS, now=ANCHOR)
    assert isinstance(r, QueryResult)
    assert r.get_value(User.name) == "User 1"
    assert r.get_value("user.txn_count[24h]") == r.values["user.txn_count[1d]"]
    assert isinstance(r.get_value(User.txn_count["1d"]), int)
    assert 0.0 <= r.get_value(User.risk) <= 1.0
    signup = r.get_value(User.signup_at)
    assert isinstance(signup, datetime) and signup.tzinfo is not None  # a datetime, not text
    assert r.errors == []
    assert r.get(User.risk).source == "model:risk:user.risk"
    observed = r.get(User.name).observed_at
    assert isinstance(observed, datetime) and observed <= ANCHOR
    assert r.meta.now == ANCHOR
    assert isinstance(r.meta.query_id, str) and r.meta.query_id
    assert r.meta.rows == 1 and r.meta.computed > 0
    assert all(isinstance(step, NodeTiming) for step in r.trace)
    assert {"model:risk:user.risk", "total"} <= {step.label for step in r.trace}


def test_an_unknown_user_is_an_error_per_feature_not_a_failed_query(any_client: Any) -> None:
    r = any_client.query(input={User.id: "nobody"}, output=[User.name, User.risk], now=ANCHOR)
    failed = {error.feature: error for error in r.errors}
    assert set(failed) == {"user.name", "user.risk"}
    assert all(isinstance(e, FeatureError) and e.code and e.message for e in failed.values())
    assert r.get(User.name).error == failed["user.name"]
    assert r.get_value(User.name, "none") == "none"


def test_the_remote_answer_equals_the_embedded_one(served: Any, tmp_path: Path) -> None:
    with kr.Client(url=served.url, key=REMOTE_KEY) as remote:
        far = remote.query(input={User.id: "u0002"}, output=OUTPUTS, now=ANCHOR)
        far_failed = remote.query(input={User.id: "nobody"}, output=OUTPUTS, now=ANCHOR)
    # an embedded client on another copy of the same project computes the same
    with kr.Client(copy_project(tmp_path / "other")) as embedded:
        near = embedded.query(input={User.id: "u0002"}, output=OUTPUTS, now=ANCHOR)
        near_failed = embedded.query(input={User.id: "nobody"}, output=OUTPUTS, now=ANCHOR)
    assert far.features == near.features  # values, times, sources, errors: all of them
    assert far_failed.features == near_failed.features and far_failed.errors
    assert sorted((s.kind, s.label, s.rows, s.status) for s in far.trace) == sorted(
        (s.kind, s.label, s.rows, s.status) for s in near.trace
    )  # independent nodes run concurrently: in either order
    assert (far.meta.now, far.meta.rows, far.meta.computed) == (
        near.meta.now, near.meta.rows, near.meta.computed,
    )  # fmt: skip


def test_a_bulk_query_answers_a_value_per_entity(any_client: Any) -> None:
    rows = [{User.id: "u0003"}, {"user.id": "nobody"}, {User.id: "u0004"}]
    r = any_client.query_bulk(rows, [User.name, User.txn_count["7d"]], now=ANCHOR)
    assert isinstance(r, BulkResult)
    assert len(r) == 3
    assert r.column(User.name) == ["User 3", None, "User 4"]
    assert [(e.feature, e.row) for e in r.errors] == [("user.name", 1)]
    assert r.column(User.txn_count["7d"])[1] == 0  # no transactions of nobody's
    first = r.row(0)["user.name"]
    assert isinstance(first.observed_at, datetime) and first.source == "user"
    assert r.row(1)["user.name"].error is not None
    columns = any_client.query_bulk({User.id: ["u0003", "u0004"]}, [User.name], now=ANCHOR)
    assert columns.values == {"user.name": ["User 3", "User 4"]}
    assert columns.meta.query_id != r.meta.query_id


def test_an_offline_query_answers_each_row_as_of_its_time(any_client: Any) -> None:
    spine = {
        "user.id": ["u0005", "u0005", "nobody"],
        "ts": [ANCHOR, ANCHOR - timedelta(30), ANCHOR],
    }
    r = any_client.offline_query(spine, [User.name, User.txn_count["7d"]])
    assert isinstance(r, OfflineResult)
    assert len(r) == 3
    assert r.column("user.name") == ["User 5", "User 5", None]
    assert r.column("ts") == spine["ts"]  # timestamps, not text
    assert str(r.table.schema.field("user.txn_count[7d]").type) == "int64"
    assert {(e.feature, e.row) for e in r.errors} >= {("user.name", 2)}


def test_explain_prints_the_plan(any_client: Any) -> None:
    text = any_client.explain([User.id], [User.risk])
    assert isinstance(text, str)
    assert "model:risk:user.risk" in text


def test_the_log_reads_back_what_a_query_answered(any_client: Any) -> None:
    r = any_client.query(
        input={User.id: "u0006"}, output=OUTPUTS, now=ANCHOR, query_id="remote-log-u0006"
    )
    logged = any_client.log.get("remote-log-u0006")
    assert isinstance(logged, LoggedQuery)
    assert (logged.query_id, logged.now, logged.inputs) == (
        r.meta.query_id,
        ANCHOR,
        {"user.id": "u0006"},
    )
    for name, feature in r.features.items():
        out = logged.outputs[name]
        assert (out.value, out.source, out.observed_at) == (
            feature.value, feature.source, feature.observed_at,
        ), name  # fmt: skip
    assert logged.plan is not None and "user.risk" in logged.plan.outputs
    assert logged.model_calls and isinstance(logged.logged_at, datetime)
    assert any_client.log.get("never-made") is None

    found = any_client.log.search(entity={User.id: "u0006"}, since=ANCHOR - timedelta(1))
    assert [record.query_id for record in found] == ["remote-log-u0006"]
    assert found[0].outputs == logged.outputs
    assert any_client.log.search(entity={User.id: "u0006"}, model="risk", limit=1)
    assert any_client.log.search(entity={User.id: "u0007"}) == []


@pytest.fixture
def second_version(embedded: kr.Client) -> ModelVersion:
    """A second version of the example's model "risk", not yet behind an alias."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(100, len(INPUTS)))
    model = make_pipeline(SimpleImputer(), LogisticRegression()).fit(x, (x[:, 2] > 0).astype(int))
    return embedded.models.register("risk", model, inputs=INPUTS, metadata={"note": "v2"})


def test_models_list_get_move_an_alias_and_predict(
    second_version: ModelVersion, any_client: Any
) -> None:
    models = any_client.models
    assert "risk" in models.names()
    versions = models.versions("risk")
    assert [v.version for v in versions] == [1, 2]
    assert all(isinstance(v, ModelVersion) for v in versions)
    assert models.get("risk", alias="prod").version == 1
    assert models.get("risk").sha256 == second_version.sha256
    assert models.get("risk", 2).schema == second_version.schema
    assert models.aliases("risk") == {"prod": 1}

    moved = models.set_alias("risk", "prod", 2)
    assert isinstance(moved, AliasChange)
    assert (moved.name, moved.alias, moved.version, moved.previous) == ("risk", "prod", 2, 1)
    assert models.aliases("risk") == {"prod": 2}
    r = any_client.query(input={User.id: "u0008"}, output=[User.risk], now=ANCHOR)
    assert any_client.log.get(r.meta.query_id).outputs["user.risk"].version == "risk@v2"
    back = models.rollback("risk", "prod")
    assert (back.action, back.version) == ("rollback", 1)
    assert [c.action for c in models.history("risk", "prod")][-2:] == ["set", "rollback"]

    rows = [dict.fromkeys(INPUTS, 1.0), dict.fromkeys(INPUTS, 2.0)]
    predictions = models.predict("risk", rows, version=2)
    assert isinstance(predictions, np.ndarray) and predictions.shape == (2,)
    assert np.allclose(predictions, models.predict("risk", np.ones((2, 5)) * [[1], [2]], version=2))

    with pytest.raises(UnknownModel, match="nope"):
        models.versions("nope")
    with pytest.raises(UnknownModel, match="staging"):
        models.get("risk", alias="staging")


def test_a_remote_client_registers_a_saved_artifact(
    served: Any, embedded: kr.Client, tmp_path: Path
) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(100, len(INPUTS)))
    model = LogisticRegression().fit(x, (x[:, 0] > 0).astype(int))  # skops trusts its types
    saved = tmp_path / "risk.skops"
    saved.write_bytes(skops.io.dumps(model))
    with RemoteClient(served.url, key=REMOTE_KEY) as remote:
        record = remote.models.register(
            "risk", saved, format="skops", inputs=INPUTS, aliases=["staging"]
        )
        assert isinstance(record, ModelVersion) and record.version == 2
        assert record.schema.inputs == tuple(INPUTS)
        assert remote.models.aliases("risk") == {"prod": 1, "staging": 2}
        rows = np.ones((2, len(INPUTS))) * [[1], [-1]]
        assert np.allclose(
            remote.models.predict("risk", rows, version=2), model.predict_proba(rows)[:, 1]
        )
        again = remote.models.register("risk", saved.read_bytes(), format="skops", inputs=INPUTS)
        assert again.version == 3  # the bytes of the file as sent
        with pytest.raises(InvalidInput) as bad:
            remote.models.register("risk", saved, format="pickle")
        assert bad.value.field == "format"
        with pytest.raises(InvalidInput, match="safe format") as wrong:
            remote.models.register("risk", model, format="skops")
        assert wrong.value.field == "artifact"
    assert embedded.models.get("risk", alias="staging").sha256 == record.sha256


def test_async_variants_answer_the_same_types(any_client: Any) -> None:
    async def run() -> tuple[QueryResult, BulkResult, OfflineResult]:
        one = await any_client.query_async({User.id: "u0009"}, [User.name], now=ANCHOR)
        many = await any_client.query_bulk_async({User.id: ["u0009"]}, [User.name], now=ANCHOR)
        spine = {"user.id": ["u0009"], "ts": [ANCHOR]}
        offline = await any_client.offline_query_async(spine, [User.name])
        await any_client.aclose()  # in the loop that made the calls: its connections too
        return one, many, offline

    one, many, offline = asyncio.run(run())
    assert one.get_value(User.name) == many.column(User.name)[0] == offline.column("user.name")[0]


@pytest.mark.parametrize(
    ("call", "error", "field"),
    [
        (lambda c: c.query(input=[("user.id", "u1")], output=[User.name]), InvalidInput, "input"),
        (lambda c: c.query(input={User.id: "u1"}, output="user.name"), InvalidInput, "output"),
        (lambda c: c.query(input={User.id: "u1"}, output=["user.nmae"]), UnknownFeature, None),
        (lambda c: c.query({User.id: "u1"}, [User.name], now="yesterday"), InvalidInput, "now"),
        (lambda c: c.query({User.id: "u1"}, [User.name], query_id="a b"), InvalidInput, "query_id"),
        (
            lambda c: c.query({User.id: "u1"}, [User.name], staleness={User.name: "soon"}),
            InvalidInput,
            "staleness",
        ),
        (lambda c: c.query_bulk({User.id: "u1"}, [User.name]), InvalidInput, "input"),
        (lambda c: c.offline_query({"user.id": ["u1"]}, [User.name]), InvalidInput, "ts"),
        (lambda c: c.log.search(limit=0), InvalidInput, "limit"),
        (lambda c: c.log.search(since="someday"), InvalidInput, "since"),
    ],
)
def test_bad_input_is_the_same_error_naming_the_field(
    any_client: Any, call: Any, error: type[KairosError], field: str | None
) -> None:
    with pytest.raises(error) as raised:
        call(any_client)
    if field is not None:
        assert raised.value.field == field  # type: ignore[attr-defined]
    if isinstance(raised.value, UnknownFeature):
        assert "user.name" in str(raised.value)  # did you mean


# --- only remote --------------------------------------------------------------------------


def test_kr_client_with_a_url_is_a_remote_client_and_refuses_embedded_options() -> None:
    remote = kr.Client(url="http://127.0.0.1:9", key="the-secret")
    assert isinstance(remote, RemoteClient) and not isinstance(remote, kr.Client)
    assert "the-secret" not in repr(remote)
    remote.close()
    with pytest.raises(InvalidInput, match="online_store") as raised:
        kr.Client(url="http://127.0.0.1:9", online_store="memory://")
    assert raised.value.field == "online_store"
    with pytest.raises(InvalidInput, match="project"):
        kr.Client("examples/fraud", url="http://127.0.0.1:9")
    with pytest.raises(InvalidInput, match="url=") as raised:
        kr.Client(key="k")
    assert raised.value.field == "key"
    with pytest.raises(InvalidInput, match="http://") as raised:
        kr.Client(url="127.0.0.1:8000")
    assert raised.value.field == "url"
    with pytest.raises(InvalidInput, match=r"kr\.Client\(url='http://h:8000'") as raised:
        kr.Client("http://h:8000")  # an address where the project folder goes
    assert raised.value.field == "project"


def test_a_wrong_or_missing_key_is_a_clear_error_without_the_key(served: Any) -> None:
    for key in ("wrong-key-123", None):
        with kr.Client(url=served.url, key=key) as remote, pytest.raises(Unauthorized) as raised:
            remote.query(input={User.id: "u0001"}, output=[User.name])
        message = str(raised.value)
        assert served.url in message and "key=" in message
        assert "wrong-key-123" not in message and REMOTE_KEY not in message
        assert raised.value.status == 401


def test_the_server_answers_tagged_json_only_when_asked(served: Any) -> None:
    body = {"inputs": {"user.id": "u0001"}, "outputs": ["user.signup_at"]}
    auth = {"authorization": f"Bearer {REMOTE_KEY}"}
    plain = httpx.post(f"{served.url}/v1/query/online", json=body, headers=auth)
    assert plain.headers["content-type"] == "application/json"
    assert isinstance(plain.json()["values"]["user.signup_at"], str)
    tagged = httpx.post(
        f"{served.url}/v1/query/online", json=body, headers={**auth, "accept": TAGGED_JSON}
    )
    assert tagged.headers["content-type"] == TAGGED_JSON
    assert isinstance(decode(tagged.content)["values"]["user.signup_at"], datetime)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_unreachable_server_is_an_error_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with RemoteClient(url, retries=1, backoff=0.01) as remote:
        with pytest.raises(ServerUnavailable, match=url) as raised:
            remote.log.get("q1")
        assert isinstance(raised.value, ConnectionError)
        with pytest.raises(ServerUnavailable, match="kairos serve"):
            remote.query(input={"user.id": "u1"}, output=["user.name"])


class Flaky:
    """A tiny server whose every route answers 503 the first time, then 200."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.app = Starlette(
            routes=[
                Route("/v1/log/{query_id}", self.answer, methods=["GET"]),
                Route("/v1/query/online", self.answer, methods=["POST"]),
                Route("/v1/query/plan", self.answer, methods=["POST"]),
                Route("/v1/models", self.proxy_down, methods=["GET"]),
            ]
        )

    async def proxy_down(self, request: Request) -> PlainTextResponse:
        """A proxy in front of a server that is down: always a 502, and not JSON."""
        self.hits["/v1/models"] = self.hits.get("/v1/models", 0) + 1
        return PlainTextResponse("<html>502 Bad Gateway</html>", 502)

    async def answer(self, request: Request) -> JSONResponse:
        path = request.url.path
        self.hits[path] = self.hits.get(path, 0) + 1
        if self.hits[path] == 1:
            error = {"code": "BackendUnavailable", "message": "the query log is restarting"}
            return JSONResponse({"error": error}, 503)
        if path == "/v1/query/plan":
            return JSONResponse({"explain": "0 sql user", "nodes": []})
        return JSONResponse({"error": {"code": "not_found", "message": "no such query"}}, 404)


@pytest.fixture
def flaky() -> Iterator[tuple[Flaky, str]]:
    server = Flaky()
    with ServerThread(server.app) as thread:
        yield server, thread.url


def test_idempotent_calls_are_retried_after_a_503_and_queries_are_not(
    flaky: tuple[Flaky, str],
) -> None:
    server, url = flaky
    with RemoteClient(url, backoff=0.01) as remote:
        assert remote.log.get("q1") is None  # a 503, then the 404 that means "not logged"
        assert server.hits["/v1/log/q1"] == 2
        assert remote.explain(["user.id"], ["user.name"]) == "0 sql user"
        assert server.hits["/v1/query/plan"] == 2
        with pytest.raises(BackendUnavailable, match="restarting"):
            remote.query(input={"user.id": "u1"}, output=["user.name"])
        assert server.hits["/v1/query/online"] == 1  # a query is a logged decision: sent once
    with RemoteClient(url, retries=2, backoff=0.01) as remote:
        with pytest.raises(RemoteError, match="502 Bad Gateway") as raised:
            remote.models.names()
        assert (raised.value.status, server.hits["/v1/models"]) == (502, 3)  # a fixed count


def test_kairos_query_with_url_asks_the_server_through_the_remote_client(
    served: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KAIROS_API_KEY", REMOTE_KEY)
    argv = ["query", "--url", served.url, "--in", "user.id=u0010", "--out", "user.name"]
    assert main([*argv, "--now", ANCHOR.isoformat(), "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["values"] == {"user.name": "User 10"}
    assert body["now"] == ANCHOR.isoformat()
    assert main([*argv, "--out", "user.nmae"]) == 2  # the server's UnknownFeature, one line
    assert "user.name" in capsys.readouterr().err
    monkeypatch.setenv("KAIROS_API_KEY", "wrong")
    assert main(argv) == 2
    assert "refused the key" in capsys.readouterr().err
