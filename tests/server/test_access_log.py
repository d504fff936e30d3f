"""The server's access log (logger kairos.access): one line per request, the dashboard's and
the unrouted ones too, with the method, the path alone, the status, the time and the query id;
never a header, a query string or a body. A resolver's failure reaches the caller with its file
and line and without a traceback, which goes to the log."""

import logging
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from starlette.applications import Starlette

import kairos as kr
from kairos import features, online
from kairos.http.access import ACCESS
from kairos.server import create_app
from tests.server.fraud import online_body

pytestmark = pytest.mark.anyio

SECRET = "s3cret-key-value"


@pytest.fixture
def access(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO, logger="kairos.access"):
        yield caplog


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "kairos.access"]


async def test_each_request_writes_one_line_with_its_query_id(
    http: httpx.AsyncClient, access: pytest.LogCaptureFixture
) -> None:
    answer = await http.post("/v1/query/online", json=online_body("u0001", ["user.name"]))
    assert answer.status_code == 200
    query_id = answer.json()["query_id"]
    bulk = await http.post(
        "/v1/query/bulk", json={"inputs": {"user.id": ["u0001", "u0002"]}, "outputs": ["user.name"]}
    )
    assert bulk.status_code == 200
    assert (await http.get("/healthz")).status_code == 200
    assert (await http.get("/no/such/route")).status_code == 404
    assert (await http.get("/v1/query/online")).status_code == 405

    records = lines(access)
    seen = [(r.method, r.path, r.status, r.query_id) for r in records]  # type: ignore[attr-defined]
    assert seen == [
        ("POST", "/v1/query/online", 200, query_id),
        ("POST", "/v1/query/bulk", 200, bulk.json()["query_id"]),
        ("GET", "/healthz", 200, None),
        ("GET", "/no/such/route", 404, None),
        ("GET", "/v1/query/online", 405, None),
    ]
    first = records[0]
    assert first.levelno == logging.INFO
    assert 0 < first.duration_ms < 30_000  # type: ignore[attr-defined]
    assert first.getMessage() == (
        f"POST /v1/query/online 200 {first.duration_ms:.2f} ms query_id={query_id}"  # type: ignore[attr-defined]
    )


async def test_a_line_never_holds_a_header_a_query_string_or_a_body(
    http: httpx.AsyncClient, access: pytest.LogCaptureFixture
) -> None:
    await http.post(
        f"/v1/query/online?api_key={SECRET}",
        json=online_body(SECRET, ["user.name"]),  # a body's value
        headers={"Authorization": f"Bearer {SECRET}", "X-Api-Key": SECRET},
    )
    await http.get(f"/v1/log?entity=user.id:{SECRET}", headers={"Cookie": f"k={SECRET}"})
    records = lines(access)
    assert [r.path for r in records] == ["/v1/query/online", "/v1/log"]  # type: ignore[attr-defined]
    for record in records:
        text = record.getMessage() + repr(vars(record))
        assert SECRET not in text and "Bearer" not in text and "api_key" not in text


async def test_the_dashboards_pages_and_its_sign_in_form_write_lines(
    app: Starlette, access: pytest.LogCaptureFixture
) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        assert (await http.get("/ui/features")).status_code == 200
        assert (await http.get("/ui/login")).status_code == 200
        assert (await http.get("/ui/static/kairos.css")).status_code == 200
        assert (await http.get("/ui/no-such-page")).status_code == 404
    seen = [(r.method, r.path, r.status) for r in lines(access)]  # type: ignore[attr-defined]
    assert seen == [
        ("GET", "/ui/features", 200),
        ("GET", "/ui/login", 200),
        ("GET", "/ui/static/kairos.css", 200),
        ("GET", "/ui/no-such-page", 404),
    ]


async def test_with_the_access_log_off_nothing_is_written(
    http: httpx.AsyncClient, access: pytest.LogCaptureFixture
) -> None:
    ACCESS.disabled = True
    try:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/ui/login")).status_code == 200
    finally:
        ACCESS.disabled = False
    assert lines(access) == []


@features
class Shop:
    id: str
    rating: float


@online
def rating(sid: Shop.id) -> Shop.rating:
    raise ValueError(f"bad row {sid}")


@pytest.fixture
async def failing() -> AsyncIterator[httpx.AsyncClient]:
    with kr.Client(definitions=[Shop, rating], query_log="none://") as client:
        transport = httpx.ASGITransport(app=create_app(client))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            yield http


async def test_a_failing_resolvers_file_and_line_reach_the_body_and_its_traceback_the_log(
    failing: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="kairos.resolvers"):
        answer = await failing.post(
            "/v1/query/online", json={"inputs": {"shop.id": "s1"}, "outputs": ["shop.rating"]}
        )
    assert answer.status_code == 200
    (error,) = answer.json()["errors"]
    line = rating.fn.__code__.co_firstlineno + 2  # its `raise`
    assert error["message"] == (
        f"resolver 'rating' raised ValueError: bad row s1 (test_access_log.py:{line})"
    )
    assert "Traceback" not in answer.text and __file__ not in answer.text
    (record,) = [r for r in caplog.records if r.name == "kairos.resolvers"]
    assert "Traceback (most recent call last)" in caplog.text
    assert f'"{__file__}", line {line}' in caplog.text
    assert record.exc_info is not None


async def test_an_internal_error_is_a_500_without_a_traceback_and_the_log_has_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the query log's file went away")

    with kr.Client(definitions=[Shop, rating], query_log="none://") as client:
        monkeypatch.setattr(client.log.store, "search", broken)  # a fault no handler expects
        transport = httpx.ASGITransport(app=create_app(client))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            with caplog.at_level(logging.ERROR, logger="kairos.server.app"):
                answer = await http.get("/v1/log")
    assert answer.status_code == 500
    assert answer.json()["error"]["message"] == "internal error (RuntimeError)"
    assert "Traceback" not in answer.text and "went away" not in answer.text
    (record,) = [r for r in caplog.records if r.name == "kairos.server.app"]
    assert record.getMessage() == "internal error answering GET log_search"
    assert record.exc_info is not None and "went away" in caplog.text
