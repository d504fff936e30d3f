"""Every route of the HTTP server over the fraud example, answers checked against the SQLite
data read independently and against each other (a logged query reads back as it was served)."""

import sqlite3
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.routing import Route

import kairos as kr
from examples.fraud.generate import ANCHOR
from kairos.server import create_app
from tests.server.fraud import DB, OUTPUTS, USERS, copy_project, error_of, online_body

pytestmark = pytest.mark.anyio

PUBLIC = {"/healthz", "/readyz", "/openapi.json"}


def from_the_file(uid: str) -> dict[str, Any]:
    """What the example's data says about a user at ANCHOR, the slow obvious way."""
    with sqlite3.connect(f"file:{DB}?mode=ro", uri=True) as db:
        name, email = db.execute("select name, email from users where id = ?", (uid,)).fetchone()
        rows = db.execute(
            "select status, ts from transactions where user_id = ?", (uid,)
        ).fetchall()
    times = [(status, datetime.fromisoformat(ts)) for status, ts in rows]
    return {
        "user.name": name,
        "user.email": email,
        "user.txn_count[1d]": sum(ANCHOR - timedelta(days=1) < t <= ANCHOR for _, t in times),
        "user.declines[7d]": sum(
            s == "declined" and ANCHOR - timedelta(days=7) < t <= ANCHOR for s, t in times
        ),
    }


async def test_online_query_answers_from_the_data_and_says_where_each_value_came_from(
    http: httpx.AsyncClient,
) -> None:
    response = await http.post("/v1/query/online", json=online_body("u0003"))

    assert response.status_code == 200, response.text
    body = response.json()
    expected = from_the_file("u0003")
    assert body["errors"] == []
    assert datetime.fromisoformat(body["now"]) == ANCHOR
    assert len(body["query_id"]) == 32
    assert set(body["values"]) == set(OUTPUTS)
    for name in ("user.name", "user.txn_count[1d]", "user.declines[7d]"):
        assert body["values"][name] == expected[name], name
    assert 0.0 <= body["values"]["user.risk"] <= 1.0
    sources = {name: f["source"] for name, f in body["features"].items()}
    assert sources["user.name"] == "user"  # the SQL resolver user.sql
    assert sources["user.risk"] == "model:risk:user.risk"  # the registered model
    assert sources["user.txn_count[1d]"] == "expression"
    for name, feature in body["features"].items():
        assert feature["value"] == body["values"][name]
        assert feature["cached"] is False
        assert datetime.fromisoformat(feature["observed_at"]) == ANCHOR
    assert body["meta"]["cache_hits"] == 0
    labels = {t["label"] for t in body["trace"]}
    assert {"user", "transactions", "model:risk:user.risk", "total"} <= labels
    assert all(t["duration_ms"] >= 0 and t["status"] == "ok" for t in body["trace"])


async def test_a_repeated_online_query_is_served_from_the_cache(http: httpx.AsyncClient) -> None:
    first = (await http.post("/v1/query/online", json=online_body("u0001"))).json()
    later = (ANCHOR + timedelta(seconds=30)).isoformat()
    second = (await http.post("/v1/query/online", json=online_body("u0001", now=later))).json()

    assert second["values"] == first["values"]
    assert second["meta"]["cache_hits"] == len(OUTPUTS)
    assert all(f["cached"] and f["source"] == "cache" for f in second["features"].values())
    assert second["query_id"] != first["query_id"]


async def test_bulk_query_gives_one_row_per_user_and_per_row_errors(
    http: httpx.AsyncClient,
) -> None:
    uids = ["u0001", "u0002", "nobody", "u0150"]
    body = {
        "inputs": {"user.id": uids},
        "outputs": OUTPUTS,
        "now": ANCHOR.isoformat(),
        "staleness": {o: "0s" for o in OUTPUTS},
    }
    response = await http.post("/v1/query/bulk", json=body)

    assert response.status_code == 200, response.text
    bulk = response.json()
    assert bulk["rows"] == 4
    assert all(len(bulk["values"][o]) == 4 for o in OUTPUTS)
    assert {e["row"] for e in bulk["errors"]} == {2}
    # no such user: what needs the users row fails; the user has no transactions either
    failed = {e["feature"] for e in bulk["errors"]}
    assert failed == {"user.name", "user.account_age_days", "user.risk"}
    assert all(bulk["values"][name][2] is None for name in failed)
    assert bulk["values"]["user.txn_count[1d]"][2] == 0
    for row, uid in enumerate(uids):
        if uid == "nobody":
            continue
        one = await http.post("/v1/query/online", json=online_body(uid))
        for name, value in one.json()["values"].items():
            expected = pytest.approx(value, rel=1e-12) if isinstance(value, float) else value
            assert bulk["values"][name][row] == expected, (uid, name)
        assert bulk["values"]["user.name"][row] == from_the_file(uid)["user.name"]


async def test_bulk_query_over_every_user(http: httpx.AsyncClient) -> None:
    body = {"inputs": {"user.id": USERS}, "outputs": ["user.name", "user.risk"]}
    response = await http.post("/v1/query/bulk", json={**body, "now": ANCHOR.isoformat()})

    assert response.status_code == 200
    bulk = response.json()
    assert bulk["rows"] == len(USERS) and bulk["errors"] == []
    assert bulk["values"]["user.name"] == [f"User {i}" for i in range(1, len(USERS) + 1)]
    assert all(0.0 <= r <= 1.0 for r in bulk["values"]["user.risk"])


async def test_plan_lists_nodes_in_dependency_order(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/v1/query/plan", json={"inputs": ["user.id"], "outputs": ["user.risk"]}
    )

    assert response.status_code == 200, response.text
    plan = response.json()
    assert "model:risk:user.risk" in plan["explain"]
    nodes = {n["id"]: n for n in plan["nodes"]}
    writer = {w: n["id"] for n in plan["nodes"] for w in n["writes"]}
    risk = nodes[writer["user.risk"]]
    assert (risk["kind"], risk["label"]) == ("model", "model:risk:user.risk")
    assert set(risk["reads"]) == {
        "user.txn_count[1d]",
        "user.txn_count[7d]",
        "user.declines[7d]",
        "user.avg_ticket[90d]",
        "user.account_age_days",
    }
    for node in plan["nodes"]:
        assert set(node["after"]) <= set(nodes), node
        for read in node["reads"]:
            if read in writer:  # inputs (user.id) and `now` are not written by a node
                assert writer[read] in node["after"], (node, read)
    assert {n["kind"] for n in plan["nodes"]} >= {"sql", "expression", "model"}


async def test_the_log_returns_exactly_what_a_query_returned(http: httpx.AsyncClient) -> None:
    served = (await http.post("/v1/query/online", json=online_body("u0007"))).json()
    cached = (await http.post("/v1/query/online", json=online_body("u0007"))).json()

    for query in (served, cached):
        response = await http.get(f"/v1/log/{query['query_id']}")
        assert response.status_code == 200, response.text
        logged = response.json()
        assert logged["query_id"] == query["query_id"]
        assert logged["inputs"] == {"user.id": "u0007"}
        assert logged["now"] == query["now"]
        assert set(logged["outputs"]) == set(OUTPUTS)
        for name, feature in query["features"].items():
            out = logged["outputs"][name]
            assert out["value"] == feature["value"], name
            assert out["source"] == feature["source"], name
            assert out["observed_at"] == feature["observed_at"], name
            assert out["error_code"] is None
    # what made a computed value is named; a cached one points back at the cache
    first = (await http.get(f"/v1/log/{served['query_id']}")).json()["outputs"]
    assert all(out["version"] for out in first.values())
    again = (await http.get(f"/v1/log/{cached['query_id']}")).json()["outputs"]
    assert all(out["source"] == "cache" and out["version"] is None for out in again.values())


async def test_the_log_keeps_errors_and_bulk_rows(http: httpx.AsyncClient) -> None:
    failed = (await http.post("/v1/query/online", json=online_body("nobody"))).json()
    logged = (await http.get(f"/v1/log/{failed['query_id']}")).json()
    for error in failed["errors"]:
        out = logged["outputs"][error["feature"]]
        assert (out["value"], out["error_code"]) == (None, error["code"])
        assert out["error_message"] == error["message"]

    body = {"inputs": {"user.id": ["u0011", "u0012"]}, "outputs": ["user.name"]}
    bulk = (await http.post("/v1/query/bulk", json=body)).json()
    for row, uid in enumerate(["u0011", "u0012"]):
        record = (await http.get(f"/v1/log/{bulk['query_id']}-{row}")).json()
        assert record["inputs"] == {"user.id": uid}
        assert record["outputs"]["user.name"]["value"] == bulk["values"]["user.name"][row]


async def test_a_query_id_chosen_by_the_caller_is_the_one_logged(http: httpx.AsyncClient) -> None:
    body = online_body("u0020", ["user.name"], query_id="decision-2026-06-01-u0020")
    served = (await http.post("/v1/query/online", json=body)).json()
    assert served["query_id"] == "decision-2026-06-01-u0020"

    logged = (await http.get("/v1/log/decision-2026-06-01-u0020")).json()
    assert logged["outputs"]["user.name"]["value"] == "User 20"


async def test_an_unknown_query_id_is_a_404_naming_it(http: httpx.AsyncClient) -> None:
    error = error_of(await http.get("/v1/log/never-made"), 404)
    assert error["field"] == "query_id"
    assert "never-made" in error["message"]


async def test_healthz_and_readyz(http: httpx.AsyncClient) -> None:
    health = await http.get("/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    ready = await http.get("/readyz")
    assert (ready.status_code, ready.json()) == (200, {"status": "ready"})


async def test_readyz_is_503_naming_the_source_while_its_file_is_missing(
    fraud_db: Path, tmp_path: Path
) -> None:
    # A copy, so a test killed half-way cannot leave the shared example without its data.
    project = copy_project(tmp_path / "fraud")
    db = project / "data" / "fraud.db"
    moved = db.with_name("fraud.db.moved")
    with kr.Client(project) as client:
        transport = httpx.ASGITransport(app=create_app(client))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            db.rename(moved)
            try:
                missing = await http.get("/readyz")
                query = await http.post("/v1/query/online", json=online_body("u0001"))
            finally:
                moved.rename(db)
            back = await http.get("/readyz")
            after = await http.post("/v1/query/online", json=online_body("u0001"))

    assert missing.status_code == 503
    assert missing.json()["status"] == "unavailable"
    assert set(missing.json()["sources"]) == {"bank"}
    assert "fraud.db" in missing.json()["sources"]["bank"]
    # queries keep working: the failed features carry errors, nothing is a 5xx
    assert query.status_code == 200
    assert {e["feature"] for e in query.json()["errors"]} == set(OUTPUTS)
    assert (back.status_code, back.json()) == (200, {"status": "ready"})
    assert after.status_code == 200 and after.json()["errors"] == []


def metric_samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text parsed: sample name -> [(labels, value)]."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value_of(samples: list[tuple[dict[str, str], float]], **labels: str) -> float:
    return sum(v for got, v in samples if labels.items() <= got.items())


async def test_metrics_count_requests_latency_resolvers_and_cache_hits(
    http: httpx.AsyncClient,
) -> None:
    first = (await http.post("/v1/query/online", json=online_body("u0001"))).json()
    second = (await http.post("/v1/query/online", json=online_body("u0001"))).json()
    await http.post("/v1/query/online", json=online_body("u0001", ["user.nope"]))
    await http.post("/v1/query/bulk", json={"inputs": {"user.id": ["u0002"]}, "outputs": OUTPUTS})
    await http.post("/v1/query/plan", json={"inputs": ["user.id"], "outputs": ["user.risk"]})

    response = await http.get("/metrics")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = metric_samples(response.text)
    requests = samples["kairos_requests_total"]
    assert value_of(requests, endpoint="query_online", status="200") == 2
    assert value_of(requests, endpoint="query_online", status="422") == 1
    assert value_of(requests, endpoint="query_bulk", status="200") == 1
    assert value_of(requests, endpoint="query_plan", status="200") == 1
    latency = samples["kairos_request_latency_seconds_count"]
    assert value_of(latency, endpoint="query_online") == 3
    assert value_of(latency, endpoint="query_bulk") == 1
    resolvers = samples["kairos_resolver_latency_seconds_count"]
    assert value_of(resolvers, resolver="user", kind="sql") == 2  # u0001 once, u0002 once
    assert value_of(resolvers, resolver="transactions", kind="sql") == 2
    assert value_of(resolvers, resolver="model:risk:user.risk", kind="model") == 2
    hits = first["meta"]["cache_hits"] + second["meta"]["cache_hits"]
    assert hits == len(OUTPUTS)
    assert value_of(samples["kairos_cache_hits_total"]) == hits
    assert value_of(samples["kairos_cache_misses_total"]) > 0


async def test_openapi_is_a_valid_document_listing_every_route(
    http: httpx.AsyncClient, app: Starlette
) -> None:
    response = await http.get("/openapi.json")

    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    schemathesis.openapi.from_dict(document).validate()  # raises on an invalid document
    served = {
        (route.path, method.lower())
        for route in app.routes
        if isinstance(route, Route) and route.path != "/openapi.json"
        for method in route.methods or ()
        if method != "HEAD"
    }
    listed = {(path, method) for path, item in document["paths"].items() for method in item}
    assert listed == served
    for path, item in document["paths"].items():
        for operation in item.values():
            public = operation.get("security") == []
            assert public == (path in PUBLIC), path


def test_the_openapi_check_above_can_fail() -> None:
    broken = {"openapi": "3.0.3", "info": {"version": "1"}, "paths": {}}  # no title
    with pytest.raises(Exception, match="title"):
        schemathesis.openapi.from_dict(broken).validate()
