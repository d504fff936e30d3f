"""Signing in to the dashboard, its cookies, CSRF and the headers every page carries, over the
real ASGI app of the fraud example."""

from collections.abc import AsyncIterator

import httpx
import pytest

import kairos as kr
from kairos.project.config import ServerConfig
from kairos.server import create_app

KEY = "auth-test-key-0123456789"
pytestmark = pytest.mark.anyio


@pytest.fixture
async def keyed(client: kr.Client) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(client, ServerConfig(keys=(KEY,)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        yield http


def csrf_of(http: httpx.AsyncClient) -> str:
    return str(http.cookies["kairos_csrf"])


async def sign_in(http: httpx.AsyncClient, key: str, **extra: str) -> httpx.Response:
    await http.get("/ui/login")
    form = {"csrf": csrf_of(http), "key": key, **extra}
    return await http.post("/ui/login", data=form, headers={"origin": "http://localhost"})


async def test_without_a_key_a_page_sends_you_to_sign_in(keyed: httpx.AsyncClient) -> None:
    response = await keyed.get("/ui/features?q=risk")
    assert response.status_code == 303
    assert response.headers["location"] == "/ui/login?next=/ui/features?q=risk&admin=0"
    login = await keyed.get(response.headers["location"])
    assert login.status_code == 200 and 'name="key"' in login.text
    assert 'value="/features?q=risk"' in login.text


async def test_a_wrong_key_is_refused_and_the_right_one_sets_a_strict_cookie(
    keyed: httpx.AsyncClient,
) -> None:
    wrong = await sign_in(keyed, "nope")
    assert wrong.status_code == 401 and "not one of this server" in wrong.text
    assert "nope" not in wrong.text  # a key given is never echoed
    right = await sign_in(keyed, KEY, next="/features?q=risk")
    assert right.status_code == 303 and right.headers["location"] == "/ui/features?q=risk"
    cookie = right.headers["set-cookie"].lower()
    assert cookie.startswith("kairos_key=")
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/ui" in cookie
    page = await keyed.get("/ui/features")
    assert page.status_code == 200 and "user.risk" in page.text
    assert KEY not in page.text


async def test_a_bearer_header_opens_the_pages_too(keyed: httpx.AsyncClient) -> None:
    page = await keyed.get("/ui/features", headers={"authorization": f"Bearer {KEY}"})
    assert page.status_code == 200


@pytest.mark.parametrize("target", ["//evil.example/x", "https://evil.example", "/\\evil", "x"])
async def test_signing_in_never_sends_you_to_another_site(
    keyed: httpx.AsyncClient, target: str
) -> None:
    response = await sign_in(keyed, KEY, next=target)
    assert response.status_code == 303 and response.headers["location"] == "/ui/"


async def test_forms_need_the_csrf_token_and_this_origin(keyed: httpx.AsyncClient) -> None:
    await sign_in(keyed, KEY)
    token = csrf_of(keyed)
    missing = await keyed.post("/ui/logout", data={})
    assert missing.status_code == 403 and "CSRF" in missing.text
    forged = await keyed.post("/ui/logout", data={"csrf": "x" * 43})
    assert forged.status_code == 403
    elsewhere = await keyed.post(
        "/ui/logout", data={"csrf": token}, headers={"origin": "https://evil.example"}
    )
    assert elsewhere.status_code == 403 and "another site" in elsewhere.text
    assert (await keyed.get("/ui/features")).status_code == 200  # still signed in
    out = await keyed.post(
        "/ui/logout", data={"csrf": token}, headers={"origin": "http://localhost"}
    )
    assert out.status_code == 303
    assert "kairos_key" not in keyed.cookies
    assert (await keyed.get("/ui/features")).status_code == 303


async def test_a_server_key_does_not_open_the_gateway_pages(keyed: httpx.AsyncClient) -> None:
    await sign_in(keyed, KEY)
    gateway = await keyed.get("/ui/gateway")
    assert gateway.status_code == 404  # this project runs no gateway: its pages are elsewhere
    assert "kairos gateway serve" in gateway.text


async def test_every_page_carries_the_security_headers(http: httpx.AsyncClient) -> None:
    paths = ["/ui/features", "/ui/features/user.risk", "/ui/decisions", "/ui/models", "/ui/live",
             "/ui/login", "/ui/features/no.such", "/ui/static/kairos.css"]  # fmt: skip
    for path in paths:
        response = await http.get(path)
        headers = response.headers
        assert headers["content-security-policy"].startswith("default-src 'none'"), path
        assert headers["x-content-type-options"] == "nosniff", path
        assert headers["x-frame-options"] == "DENY", path
    missing = await http.get("/ui/features/no.such")
    assert missing.status_code == 404 and "no feature &#39;no.such&#39;" in missing.text
    assert "Traceback" not in missing.text


async def test_without_keys_only_requests_for_this_machine_are_answered(app: object) -> None:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    for host, status in [("localhost", 200), ("127.0.0.1:8000", 200), ("[::1]:8000", 200),
                         ("rebound.example", 403), ("127.0.0.1.nip.io", 403)]:  # fmt: skip
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as http:
            page = await http.get("/ui/features")
            assert page.status_code == status, host
            if status == 403:  # refused before the dashboard: the server's own rule
                assert page.json()["error"]["field"] == "Host" and "user.risk" not in page.text


async def test_a_key_no_cookie_can_hold_is_refused_not_a_500(client: kr.Client) -> None:
    app = create_app(client, ServerConfig(keys=("ключ-0123456789",)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        response = await sign_in(http, "ключ-0123456789")
    assert response.status_code == 401 and "not one of this server" in response.text


# --- wrong keys are throttled per client, the API's and the sign-in's together -----------


def from_address(app: object, address: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 40000))  # type: ignore[arg-type]
    return httpx.AsyncClient(transport=transport, base_url="http://localhost")


async def test_ten_wrong_sign_ins_a_minute_lock_a_client_out(client: kr.Client) -> None:
    app = create_app(client, ServerConfig(keys=(KEY,)))
    async with from_address(app, "203.0.113.20") as guesser:
        for attempt in range(10):
            assert (await sign_in(guesser, f"guess-{attempt}")).status_code == 401
        locked = await sign_in(guesser, KEY)  # not even checked while locked out
        assert locked.status_code == 429 and 0 < int(locked.headers["retry-after"]) <= 60
        assert "try again in" in locked.text and KEY not in locked.text
        page = await guesser.get("/ui/features", headers={"authorization": f"Bearer {KEY}"})
        assert page.status_code == 429 and "user.risk" not in page.text
    async with from_address(app, "198.51.100.20") as other:  # another client signs in
        assert (await sign_in(other, KEY)).status_code == 303


async def test_wrong_key_cookies_count_and_so_does_the_api(client: kr.Client) -> None:
    app = create_app(client, ServerConfig(keys=(KEY,)))
    async with from_address(app, "203.0.113.21") as guesser:
        for attempt in range(5):  # a guessed cookie is a guess too
            guesser.cookies.set("kairos_key", f"guess-{attempt}", path="/ui")
            assert (await guesser.get("/ui/features")).status_code == 303
        guesser.cookies.clear()
        for _ in range(5):
            api = await guesser.get("/v1/log/x", headers={"authorization": "Bearer nope"})
            assert api.status_code == 401
        assert (await sign_in(guesser, KEY)).status_code == 429
        assert (await guesser.get("/v1/log/x")).status_code == 429


async def test_signed_in_pages_and_empty_sign_ins_are_never_counted(client: kr.Client) -> None:
    app = create_app(client, ServerConfig(keys=(KEY,)))
    async with from_address(app, "203.0.113.22") as http:
        for _ in range(12):  # no key at all: sent to sign in, no guess
            assert (await http.get("/ui/features")).status_code == 303
            assert (await sign_in(http, "")).status_code == 401
        assert (await sign_in(http, KEY)).status_code == 303
        for _ in range(30):
            assert (await http.get("/ui/live")).status_code == 200
