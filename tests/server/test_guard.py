"""What the server refuses before any route runs (`kairos.server.guard`): without keys, a
request for another host (DNS rebinding) or from another site's page; with keys or without,
a /v1 body that is not of the route's type (a cross-site "simple" POST: text/plain, a form,
nothing). Each attack is tried for real over ASGI, and what it tried to change is read back
unchanged."""

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

import kairos as kr
from kairos.project.config import ServerConfig
from kairos.server import create_app
from tests.server.fraud import copy_project, error_of, online_body

pytestmark = pytest.mark.anyio

KEY = "guard-key"
EVENT = {"rows": [{"id": "t-guard", "user_id": "u0001", "amount": 1.0}]}
# every kind of route: a query, the log, the probes, metrics, the document, the dashboard
GETS = ["/v1/log", "/v1/models", "/healthz", "/readyz", "/metrics", "/openapi.json", "/ui/models"]
REBOUND = ["rebound.example", "rebound.example:8000", "127.0.0.1.nip.io", "10.0.0.5:8000", ""]


@pytest.fixture
def project(fraud_db: Path, tmp_path: Path) -> Path:
    """A copy of the example whose registry a test may change (aliases moved, models added)."""
    return copy_project(tmp_path / "fraud")


@pytest.fixture
def own(project: Path, tmp_path: Path) -> Any:
    with kr.Client(project, query_log=f"sqlite:///{tmp_path / 'log.db'}") as client:
        yield client


def asgi(app: Starlette, host: str = "127.0.0.1", **headers: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url=f"http://{host}", headers=headers
    )


async def test_without_keys_a_request_for_another_host_is_refused_on_every_route(
    app: Starlette,
) -> None:
    for host in REBOUND:
        async with asgi(app) as http:
            for path in GETS:
                response = await http.get(path, headers={"host": host})
                error = error_of(response, 403)
                assert error["code"] == "forbidden_host" and error["field"] == "Host", path
                assert "server.keys" in error["message"]  # the fix
            query = await http.post(
                "/v1/query/online", json=online_body("u0001"), headers={"host": host}
            )
            assert error_of(query, 403)["field"] == "Host"
            assert "u0001" not in query.text


async def test_without_keys_this_machine_is_answered_under_each_of_its_names(
    app: Starlette,
) -> None:
    for host in ["127.0.0.1", "127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000"]:
        async with asgi(app, host) as http:
            for path in GETS:
                response = await http.get(path)
                assert response.status_code in (200, 503), (host, path, response.text)


async def test_without_keys_the_configured_host_is_answered_too(own: kr.Client) -> None:
    app = create_app(own, ServerConfig(host="kairos.internal"))
    async with asgi(app, "kairos.internal:8000") as http:
        assert (await http.get("/v1/models")).status_code == 200
    async with asgi(app, "other.internal:8000") as http:
        assert error_of(await http.get("/v1/models"), 403)["field"] == "Host"


async def test_a_cross_site_text_plain_post_changes_nothing(own: kr.Client) -> None:
    """The attacks of issue 27: a page elsewhere POSTs text/plain (no preflight) to roll an
    alias back, write an event, run a replay, query."""
    app = create_app(own)
    own.models.set_alias("risk", "prod", own.models.versions("risk")[-1].version)
    before = own.models.history("risk")
    page = {"origin": "https://evil.example", "sec-fetch-site": "cross-site"}
    plain = {"content-type": "text/plain"}
    attacks = [
        ("/v1/models/risk/aliases/prod/rollback", b""),
        ("/v1/models/risk/aliases/prod/rollback", b"{}"),
        ("/v1/events/transaction", b'{"rows": []}'),
        ("/v1/replay", b'{"since": "1d"}'),
        ("/v1/query/online", b'{"inputs": {"user.id": "u0001"}, "outputs": ["user.name"]}'),
    ]
    async with asgi(app) as http:
        for path, body in attacks:
            # from the page: refused for where it came from
            response = await http.post(path, content=body, headers={**page, **plain})
            assert error_of(response, 403)["code"] == "cross_origin", path
            # a browser that sends neither header still cannot send a body of another type
            for headers in (plain, {"content-type": "application/x-www-form-urlencoded"},
                            {"content-type": "multipart/form-data; boundary=x"}, {}):  # fmt: skip
                response = await http.post(path, content=body, headers=headers)
                error = error_of(response, 415)
                assert error["field"] == "Content-Type", (path, headers)
                assert "application/json" in error["message"]
    assert own.models.history("risk") == before  # nothing rolled back


async def test_a_foreign_origin_or_cross_site_fetch_is_refused(app: Starlette) -> None:
    async with asgi(app, "127.0.0.1:8000") as http:
        for headers in (
            {"origin": "https://evil.example"},
            {"origin": "http://127.0.0.1:9999"},  # another local port is another origin
            {"origin": "null"},  # a sandboxed frame, a file:// page
            {"sec-fetch-site": "cross-site"},
            {"sec-fetch-site": "cross-site", "sec-fetch-mode": "cors", "sec-fetch-dest": "empty"},
        ):
            response = await http.get("/v1/log", headers=headers)
            error = error_of(response, 403)
            assert error["code"] == "cross_origin" and error["field"] in (
                "Origin",
                "Sec-Fetch-Site",
            )
            query = await http.post("/v1/query/online", json=online_body("u0001"), headers=headers)
            assert error_of(query, 403)["code"] == "cross_origin"
        # its own pages and tools that send no Origin
        for headers in (
            {},
            {"origin": "http://127.0.0.1:8000"},
            {"sec-fetch-site": "same-origin"},
            {"sec-fetch-site": "none"},
        ):
            query = await http.post("/v1/query/online", json=online_body("u0001"), headers=headers)
            assert query.status_code == 200, (headers, query.text)
        # a link to the dashboard followed from another site: shown to the user, not the site
        link = {"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate",
                "sec-fetch-dest": "document"}  # fmt: skip
        assert (await http.get("/ui/models", headers=link)).status_code == 200
        post = await http.post("/v1/query/online", json=online_body("u0001"), headers=link)
        assert error_of(post, 403)["code"] == "cross_origin"


async def test_routes_that_read_other_bodies_take_their_documented_types(
    own: kr.Client,
) -> None:
    app = create_app(own)
    async with asgi(app) as http:
        # an artifact's bytes: octet-stream, not a form or text
        for kind in ("text/plain", "application/x-www-form-urlencoded", "application/json"):
            refused = await http.post(
                "/v1/models/x/versions?format=onnx", content=b"\x00", headers={"content-type": kind}
            )
            assert error_of(refused, 415)["field"] == "Content-Type", kind
            assert "application/octet-stream" in refused.json()["error"]["message"]
        garbage = await http.post(
            "/v1/models/x/versions?format=onnx", content=b"\x00garbage",
            headers={"content-type": "application/octet-stream"},
        )  # fmt: skip
        assert error_of(garbage, 422)["field"] == "body"  # read: the artifact is checked
        # predict: JSON or an Arrow stream
        arrow = await http.post(
            "/v1/models/risk/predict", content=b"nope",
            headers={"content-type": "application/vnd.apache.arrow.stream"},
        )  # fmt: skip
        assert error_of(arrow, 422)["field"] == "body"
        text = await http.post(
            "/v1/models/risk/predict",
            content=b'{"rows": []}',
            headers={"content-type": "text/plain"},
        )
        error_of(text, 415)
        # a JSON type with parameters is JSON; a rollback sends {} as JSON
        body = b'{"inputs": {"user.id": "u0001"}, "outputs": ["user.name"]}'
        charset = await http.post(
            "/v1/query/online", content=body,
            headers={"content-type": "Application/JSON; charset=utf-8"},
        )  # fmt: skip
        assert charset.status_code == 200, charset.text
        own.models.set_alias("risk", "canary", own.models.versions("risk")[-1].version)
        rolled = await http.post("/v1/models/risk/aliases/canary/rollback", json={})
        assert rolled.status_code in (200, 422), rolled.text  # read: not refused for its type


async def test_unknown_routes_and_methods_are_still_404_and_405(app: Starlette) -> None:
    async with asgi(app) as http:
        error_of(await http.post("/v1/nothing", content=b"x"), 404)
        error_of(await http.post("/v1/log", content=b"x"), 405)


async def test_with_keys_any_host_and_origin_is_answered_and_bodies_still_need_their_type(
    own: kr.Client,
) -> None:
    app = create_app(own, ServerConfig(host="0.0.0.0", keys=(KEY,)))
    auth = {"authorization": f"Bearer {KEY}"}
    async with asgi(app, "api.example.com", **auth) as http:
        assert (await http.get("/v1/models")).status_code == 200
        site = {"origin": "https://app.example.com", "sec-fetch-site": "cross-site"}
        query = await http.post("/v1/query/online", json=online_body("u0001"), headers=site)
        assert query.status_code == 200, query.text
        plain = await http.post(
            "/v1/query/online", content=b"{}", headers={"content-type": "text/plain"}
        )
        error_of(plain, 415)


@pytest.fixture
async def local_http(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi(app) as http:
        yield http


async def test_refusals_are_in_the_access_log(
    local_http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="kairos.access"):
        await local_http.get("/v1/log", headers={"host": "rebound.example"})
        await local_http.post("/v1/query/online", content=b"{}")
    lines = [r.getMessage() for r in caplog.records if r.name == "kairos.access"]
    assert any(line.startswith("GET /v1/log 403") for line in lines), lines
    assert any(line.startswith("POST /v1/query/online 415") for line in lines), lines
