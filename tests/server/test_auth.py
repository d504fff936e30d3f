"""Bearer keys: with keys configured every /v1 route and /metrics need one, the probes and the
OpenAPI document stay public, and no key is ever echoed. `kairos serve` will not expose a
server beyond loopback without keys."""

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import kairos as kr
from kairos.cli.serve import serve
from kairos.errors import KairosError, ProjectError
from kairos.project.config import ServerConfig
from kairos.server import create_app
from kairos.ui.throttle import AuthThrottle
from tests.server.fraud import PROJECT, copy_project, error_of, online_body

KEY = "secret-key"
# (method, path, JSON body) of every route that needs a key
PROTECTED: list[tuple[str, str, Any]] = [
    ("POST", "/v1/query/online", online_body("u0001", ["user.name"])),
    ("POST", "/v1/query/bulk", {"inputs": {"user.id": ["u0001"]}, "outputs": ["user.name"]}),
    ("POST", "/v1/query/plan", {"inputs": ["user.id"], "outputs": ["user.risk"]}),
    ("GET", "/v1/log/some-query", None),
    ("GET", "/metrics", None),
]
PUBLIC = ["/healthz", "/readyz", "/openapi.json"]
WRONG: list[dict[str, Any]] = [
    {},
    {"authorization": "Bearer secret-kez"},
    {"authorization": f"Bearer {KEY}x"},
    {"authorization": f"Basic {KEY}"},
    {"authorization": KEY},
    {"authorization": "Bearer "},
    {"authorization": f"Bearer{KEY}"},
    {"x-api-key": KEY},
    {"authorization": b"Bearer \xe9t\xe9"},  # not ASCII: still a 401, not a 500
]


@pytest.fixture
async def secured(client: kr.Client) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(client, ServerConfig(keys=(KEY, "second-key")))
    app.state.server.throttle.most = 1000  # these try many wrong keys; the throttle's own below
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        yield http


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path", "body"), PROTECTED)
async def test_protected_routes_need_a_valid_bearer_key(
    secured: httpx.AsyncClient, method: str, path: str, body: Any
) -> None:
    for headers in WRONG:
        response = await secured.request(method, path, json=body, headers=headers)
        error = error_of(response, 401)
        assert error["code"] == "unauthorized", headers
        assert "Bearer" in error["message"]
    # a bad body without a key is still a 401: nothing is parsed before the key is checked
    json_type = {"content-type": "application/json"}
    error_of(await secured.request(method, path, content=b"{nope", headers=json_type), 401)

    for header in (f"Bearer {KEY}", f"bearer {KEY}", "Bearer second-key", f"Bearer  {KEY} "):
        response = await secured.request(method, path, json=body, headers={"authorization": header})
        expected = 404 if path.startswith("/v1/log/") else 200
        assert response.status_code == expected, (header, response.text)


@pytest.mark.anyio
@pytest.mark.parametrize("path", PUBLIC)
async def test_probes_and_the_openapi_document_stay_public(
    secured: httpx.AsyncClient, path: str
) -> None:
    assert (await secured.get(path)).status_code == 200
    assert (await secured.get(path, headers={"authorization": "Bearer wrong"})).status_code == 200


@pytest.mark.anyio
async def test_a_401_says_how_to_authenticate(secured: httpx.AsyncClient) -> None:
    response = await secured.get("/metrics")
    assert response.status_code == 401
    assert response.headers.get("www-authenticate", "").lower().startswith("bearer")


@pytest.mark.anyio
async def test_no_key_is_ever_echoed(secured: httpx.AsyncClient) -> None:
    seen: list[httpx.Response] = []
    attempts = [*WRONG[:-1], {"authorization": f"Bearer {KEY}"}]
    for headers in attempts:
        for method, path, body in PROTECTED:
            seen.append(await secured.request(method, path, json=body, headers=headers))
        for path in PUBLIC:
            seen.append(await secured.get(path, headers=headers))
    # the key as a query input, and a wrong key as a query id: answered, never repeated
    auth = {"authorization": f"Bearer {KEY}"}
    seen.append(await secured.get("/v1/log/secret-kez", headers=auth))
    seen.append(await secured.get("/metrics", headers=auth))

    assert len(seen) == len(attempts) * (len(PROTECTED) + len(PUBLIC)) + 2
    for response in seen:
        text = response.text + " ".join(f"{k}: {v}" for k, v in response.headers.items())
        assert KEY not in text, (response.request.url, text[:500])
        assert "second-key" not in text
    assert "secret-kez" in seen[-2].text  # the check above can see what a body repeats


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nothing_listens_on(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "api.example.com"])
def test_serve_refuses_a_public_host_without_keys(fraud_db: Path, host: str) -> None:
    port = free_port()
    with pytest.raises(KairosError, match="without API keys") as raised:
        serve(str(PROJECT), host, port)
    assert host in str(raised.value)
    assert "server.keys" in str(raised.value)  # the fix
    assert nothing_listens_on(port)


def test_kairos_serve_exits_2_with_the_reason(fraud_db: Path) -> None:
    port = free_port()
    command = [sys.executable, "-m", "kairos.cli", "serve", str(PROJECT)]
    done = subprocess.run(
        [*command, "--host", "0.0.0.0", "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=60,  # a server that started would never exit by itself
    )
    assert done.returncode == 2, done
    assert "refusing to serve on 0.0.0.0 without API keys" in done.stderr
    assert "Traceback" not in done.stderr
    assert "kairos serving" not in done.stdout


@pytest.mark.anyio
async def test_readyz_hides_source_errors_from_callers_without_a_key(tmp_path: Path) -> None:
    project = copy_project(tmp_path / "fraud")
    (project / "data" / "fraud.db").rename(project / "data" / "moved.db")
    with kr.Client(project, query_log="none://", offline_store="none://") as client:
        app = create_app(client, ServerConfig(keys=("secret-key",)))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            anonymous = await http.get("/readyz")
            insider = await http.get("/readyz", headers={"Authorization": "Bearer secret-key"})
    assert anonymous.status_code == insider.status_code == 503
    assert anonymous.json()["sources"] == {"bank": "unavailable"}
    assert "fraud.db" in insider.json()["sources"]["bank"]


@pytest.mark.parametrize("workers", ["1", "2"])
def test_kairos_serve_on_a_port_in_use_says_so_in_one_line(fraud_db: Path, workers: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        command = [sys.executable, "-m", "kairos.cli", "serve", str(PROJECT)]
        done = subprocess.run(
            [*command, "--port", str(port), "--workers", workers],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines() == [
        f"kairos: port {port} on 127.0.0.1 is in use; stop what holds it or serve on another "
        "with --port"
    ]
    assert "kairos serving" not in done.stdout


# --- an empty key is a configuration error, not a server that refuses everyone ----------


@pytest.mark.parametrize("value", ["", " ", "\t\n"])
def test_an_empty_or_blank_key_is_a_config_error_at_start(
    fraud_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    project = copy_project(tmp_path / "fraud")
    config = project / "kairos.yaml"
    config.write_text(
        config.read_text().replace(
            "  host: 127.0.0.1\n", '  host: 0.0.0.0\n  keys: ["${KAIROS_API_KEY}"]\n'
        )
    )
    monkeypatch.setenv("KAIROS_API_KEY", value)
    port = free_port()
    with pytest.raises(ProjectError, match=r"`server\.keys` entry 1 is empty or blank") as raised:
        serve(str(project), None, port)
    assert "KAIROS_API_KEY" in str(raised.value)  # the fix names what to set
    assert nothing_listens_on(port)
    with pytest.raises(ProjectError, match=r"server\.keys"):
        ServerConfig(keys=("good-key", value))  # built in code, the same rule


def test_kairos_serve_with_an_empty_key_exits_2_naming_server_keys(
    fraud_db: Path, tmp_path: Path
) -> None:
    project = copy_project(tmp_path / "fraud")
    config = project / "kairos.yaml"
    config.write_text(
        config.read_text().replace(
            "  port: 8000\n", '  port: 8000\n  keys: ["${KAIROS_API_KEY}"]\n'
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "kairos.cli", "serve", str(project), "--host", "0.0.0.0",
         "--port", str(free_port())],
        capture_output=True, text=True, timeout=60, env={**os.environ, "KAIROS_API_KEY": ""},
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "`server.keys` entry 1 is empty or blank" in done.stderr
    assert "Traceback" not in done.stderr and "kairos serving" not in done.stdout


# --- failed authentications are throttled per client -----------------------------------


def from_address(app: Any, address: str, **headers: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=headers)


@pytest.mark.anyio
async def test_ten_wrong_keys_a_minute_lock_a_client_out_with_retry_after(
    client: kr.Client,
) -> None:
    app = create_app(client, ServerConfig(keys=(KEY,)))
    wrong = {"authorization": "Bearer guess"}
    async with from_address(app, "203.0.113.7", **wrong) as guesser:
        for _ in range(10):
            error_of(await guesser.get("/v1/log/x"), 401)
        for _ in range(3):
            locked = await guesser.get("/v1/log/x")
            error = error_of(locked, 429)
            assert error["code"] == "too_many_failures"
            assert 0 < int(locked.headers["retry-after"]) <= 60
        # locked out, the key is not even checked: guessing on gets no answer at all
        right = await guesser.get("/v1/log/x", headers={"authorization": f"Bearer {KEY}"})
        error_of(right, 429)
        # a minute after its first failure it may try again
        throttle = app.state.server.throttle
        now = throttle.clock()
        throttle.clock = lambda: now + 61
        assert (await guesser.get("/metrics", headers={"authorization": f"Bearer {KEY}"})
                ).status_code == 200  # fmt: skip
    async with from_address(app, "198.51.100.1") as other:  # another client: not locked
        assert (await other.get("/metrics", headers={"authorization": f"Bearer {KEY}"})
                ).status_code == 200  # fmt: skip


@pytest.mark.anyio
async def test_success_and_requests_without_a_key_are_never_counted(client: kr.Client) -> None:
    app = create_app(client, ServerConfig(keys=(KEY,)))
    async with from_address(app, "203.0.113.8") as http:
        for _ in range(30):
            ok = await http.get("/metrics", headers={"authorization": f"Bearer {KEY}"})
            assert ok.status_code == 200
            error_of(await http.get("/metrics"), 401)  # no key: told to send one, not counted
        for _ in range(9):
            error_of(await http.get("/metrics", headers={"authorization": "Bearer x"}), 401)
        ok = await http.get("/metrics", headers={"authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200


@pytest.mark.anyio
async def test_readyz_is_no_way_around_the_throttle(client: kr.Client) -> None:
    app = create_app(client, ServerConfig(keys=(KEY,)))
    async with from_address(app, "203.0.113.9", authorization="Bearer guess") as guesser:
        for _ in range(10):
            assert (await guesser.get("/readyz")).status_code == 200  # public: answered
        error_of(await guesser.get("/metrics"), 429)  # but each wrong key was counted


def test_the_throttle_remembers_a_bounded_number_of_clients() -> None:
    throttle = AuthThrottle(most=3, window=60.0, clients=100, clock=lambda: 0.0)
    for address in range(10_000):
        throttle.failed(f"10.0.{address // 256}.{address % 256}")
    assert len(throttle) == 100
    for _ in range(3):
        throttle.failed("192.0.2.1")
    assert throttle.retry_after("192.0.2.1") == 60 and len(throttle) == 100
