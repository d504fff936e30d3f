"""The gateway's edge towards admins and odd clients: key fields out of range get a 422 (a
one-line error from the CLI), an encoded slash routes nowhere, HEAD answers GET's head, every
429 says when to retry, a body over the limit is read before its 413. Keys and usage need no
provider credentials. HTTP tests run on kairos' server and on uvicorn: they rely on the app."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from kairos.cli.main import main
from kairos.gateway import Gateway, GatewayConfig
from kairos.gateway.accounting.accountant import input_bound, seconds_to_reset
from kairos.gateway.app import create_gateway_app
from kairos.gateway.edge import DRAIN_BYTES, MAX_BODY
from kairos.gateway.errors import GatewayConfigError
from kairos.gateway.keys import MAX_AMOUNT, MAX_PER_MINUTE
from kairos.gateway.wire.openai import input_parts
from tests.gateway.conftest import (
    ADMIN_KEY,
    ENVIRON,
    PG_URL,
    config,
    deployment,
    drop_postgres,
    new_key,
    postgres_available,
)
from tests.gateway.fake_upstream import FakeUpstream, ServerThread

HI = [{"role": "user", "content": "hi"}]
BOUND = input_bound(len(orjson.dumps({"messages": HI})), 1)
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(params=["kairos", "uvicorn"])
def edge(
    request: pytest.FixtureRequest, upstream: FakeUpstream, tmp_path: Path
) -> Iterator[ServerThread]:
    """The default gateway served by kairos' HTTP server and by uvicorn."""
    gateway = Gateway(config(upstream, tmp_path))
    app = create_gateway_app(gateway)
    with ServerThread(app, kairos=request.param == "kairos") as server:
        server.gateway = gateway  # type: ignore[attr-defined]
        yield server
        server.call(gateway.close())


def exchange(server: ServerThread, data: bytes) -> bytes:
    """Send raw bytes; everything the server sends until it closes (the last request says
    `connection: close`)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(data)
        received = []
        while chunk := sock.recv(1 << 16):
            received.append(chunk)
    return b"".join(received)


def keys(server: ServerThread) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = httpx.get(f"{server.url}/admin/keys", headers=ADMIN).json()[
        "keys"
    ]
    return listed


# --- bad admin input: a 422 naming the field and its range ---------------------------------


def budget(value: str) -> bytes:
    return b'{"name": "x", "budgets": [{"period": "day", %b}]}' % value.encode()


def limit(name: str, value: str) -> bytes:
    return b'{"name": "x", "%b": %b}' % (name.encode(), value.encode())


@pytest.mark.parametrize(
    ("raw", "param", "range_"),
    [
        (budget('"usd": 1e308'), "budgets[0].usd", "from 0 to 1000000000"),
        (budget('"usd": -1e308'), "budgets[0].usd", "from 0 to 1000000000"),
        (budget('"usd": 1000000000.5'), "budgets[0].usd", "from 0 to 1000000000"),
        (budget('"usd": -0.01'), "budgets[0].usd", "from 0 to 1000000000"),
        (budget('"usd": "inf"'), "budgets[0].usd", "from 0 to 1000000000"),
        (budget('"usd": "nan"'), "budgets[0].usd", "from 0 to 1000000000"),
        (budget('"usd": "1e308"'), "budgets[0].usd", "from 0 to 1000000000"),
        (budget('"usd": "5"'), "budgets[0].usd", "from 0 to 1000000000"),
        (budget('"usd": true'), "budgets[0].usd", "from 0 to 1000000000"),
        # not JSON (orjson refuses them), but read as what they mean, so the field is named
        (budget('"usd": NaN'), "budgets[0].usd", "from 0 to 1000000000"),
        (budget('"usd": Infinity'), "budgets[0].usd", "from 0 to 1000000000"),
        (budget('"usd_micros": 9223372036854775808'), "budgets[0].usd_micros",
         f"from 0 to {MAX_AMOUNT}"),
        (budget('"usd_micros": 1.5'), "budgets[0].usd_micros", f"from 0 to {MAX_AMOUNT}"),
        (budget('"tokens": 1e20'), "budgets[0].tokens", f"from 0 to {MAX_AMOUNT}"),
        (budget(f'"tokens": {10**30}'), "budgets[0].tokens", f"from 0 to {MAX_AMOUNT}"),
        (budget('"tokens": -5'), "budgets[0].tokens", f"from 0 to {MAX_AMOUNT}"),
        (budget('"tokens": "100"'), "budgets[0].tokens", f"from 0 to {MAX_AMOUNT}"),
        (limit("rpm", str(2**63)), "rpm", f"from 1 to {MAX_PER_MINUTE}"),
        (limit("rpm", str(MAX_PER_MINUTE + 1)), "rpm", f"from 1 to {MAX_PER_MINUTE}"),
        (limit("rpm", "-1"), "rpm", f"from 1 to {MAX_PER_MINUTE}"),
        (limit("rpm", "0"), "rpm", f"from 1 to {MAX_PER_MINUTE}"),
        (limit("rpm", "true"), "rpm", f"from 1 to {MAX_PER_MINUTE}"),
        (limit("rpm", '"60"'), "rpm", f"from 1 to {MAX_PER_MINUTE}"),
        (limit("rpm", "1.5"), "rpm", f"from 1 to {MAX_PER_MINUTE}"),
        (limit("tpm", str(2**64)), "tpm", f"from 1 to {MAX_PER_MINUTE}"),
        (limit("tpm", "1e308"), "tpm", f"from 1 to {MAX_PER_MINUTE}"),
        (limit("self", "1"), "self", "use name, models"),  # not a keyword argument clash
    ],
)  # fmt: skip
def test_bad_key_fields_get_a_422_naming_the_field(
    served: ServerThread, raw: bytes, param: str, range_: str
) -> None:
    response = httpx.post(f"{served.url}/admin/keys", content=raw, headers=ADMIN)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and range_ in error["message"]
    assert error["type"] == "invalid_request_error" and "Traceback" not in response.text
    assert keys(served) == []


def test_not_json_is_still_a_400(served: ServerThread) -> None:
    for raw in (b'{"name": "x",', b"[1, 2]", b"\xff\xfe", b"[" * 100_000):
        response = httpx.post(f"{served.url}/admin/keys", content=raw, headers=ADMIN)
        assert response.status_code == 400, raw[:10]
    assert keys(served) == []


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_the_largest_values_fit_every_registry(
    upstream: FakeUpstream, tmp_path: Path, store: str
) -> None:
    prefix = f"gwtest_{uuid.uuid4().hex[:12]}"
    registry = None
    if store == "postgres":
        if not postgres_available():
            pytest.skip(f"no PostgreSQL at {PG_URL}")
        registry = f"{PG_URL}?prefix={prefix}"
    spec = {
        "rpm": MAX_PER_MINUTE, "tpm": MAX_PER_MINUTE,
        "budgets": [{"period": "day", "usd": MAX_AMOUNT // 10**6},
                    {"period": "total", "tokens": MAX_AMOUNT}],
    }  # fmt: skip

    async def scenario() -> dict[str, Any]:
        gateway = Gateway(config(upstream, tmp_path, registry=registry))
        try:
            _, record = await gateway.create_key(name="big", **spec)
            await gateway.chat(record, {"model": "chat", "messages": HI})  # counters take them
            [listed] = await gateway.list_keys()
            return listed.public()
        finally:
            await gateway.close()

    try:
        listed = asyncio.run(scenario())
    finally:
        if store == "postgres":
            drop_postgres(prefix)
    assert (listed["rpm"], listed["tpm"]) == (MAX_PER_MINUTE, MAX_PER_MINUTE)
    assert listed["budgets"] == [
        {"period": "day", "usd_micros": MAX_AMOUNT, "tokens": None},
        {"period": "total", "usd_micros": None, "tokens": MAX_AMOUNT},
    ]


def test_the_largest_budgets_count_exactly_on_every_counters_backend(
    upstream: FakeUpstream, tmp_path: Path, counters_url: str
) -> None:
    async def scenario() -> list[int]:
        gateway = Gateway(config(upstream, tmp_path, counters=counters_url, budget_shares=0))
        try:
            _, key = await gateway.create_key(
                name="big", budgets=[{"period": "total", "usd_micros": MAX_AMOUNT,
                                      "tokens": MAX_AMOUNT}],
            )  # fmt: skip
            for _ in range(3):
                await gateway.chat(key, {"model": "chat", "messages": HI, "max_tokens": 5})
            await gateway.drain()
            return await gateway.counters.spent(
                [f"{key.id}:usd:total:all", f"{key.id}:tok:total:all"]
            )
        finally:
            await gateway.close()

    # 10 in and 5 out a call at a micro-dollar a token, held at the limit's scale and settled
    assert asyncio.run(scenario()) == [3 * 15, 3 * 15]


# --- routing: an encoded slash is no separator; HEAD answers as GET ---------------------------


@pytest.mark.parametrize(
    "path", ["/admin%2fkeys", "/admin%2Fkeys", "/admin%2fusage", "/v1%2fmodels"]
)
def test_an_encoded_slash_does_not_route(edge: ServerThread, path: str) -> None:
    for method, body in (("POST", b'{"name": "sneaky"}'), ("GET", b"")):
        head = f"{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN_KEY}\r\n"
        head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
        reply = exchange(edge, head.encode() + b"connection: close\r\n\r\n" + body)
        assert reply.startswith(b"HTTP/1.1 404 "), reply[:200]
        assert b'"keys"' not in reply and b"kgw-" not in reply
    assert keys(edge) == []


def test_an_encoded_slash_inside_a_model_id_is_part_of_it(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    # the openai SDK quotes a model id's slash: only where it separates routes does it not
    models = {"org/model": {"deployments": [deployment("echo")]}}
    gateway = Gateway(config(upstream, tmp_path, models=models))
    with ServerThread(create_gateway_app(gateway)) as server:
        server.gateway = gateway  # type: ignore[attr-defined]
        headers = {"authorization": f"Bearer {new_key(server)}"}
        response = httpx.get(f"{server.url}/v1/models/org%2Fmodel", headers=headers)
        assert response.status_code == 200 and response.json()["id"] == "org/model"
        server.call(gateway.close())


def test_head_answers_with_gets_head_and_no_body(edge: ServerThread) -> None:
    length = len(httpx.get(f"{edge.url}/healthz").content)
    # a HEAD and then a GET on one connection: any body after the HEAD would break the second
    reply = exchange(
        edge,
        b"HEAD /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    first, _, after = reply.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 ")
    assert f"content-length: {length}".encode() in first.lower()
    assert after.startswith(b"HTTP/1.1 200 ")  # nothing between the two
    assert after.endswith(b'{"status":"ok"}')
    for path, status in (("/metrics", 200), ("/v1/models", 401), ("/admin/usage", 401)):
        response = httpx.head(f"{edge.url}{path}")
        assert response.status_code == status and response.content == b""
    assert httpx.head(f"{edge.url}/v1/chat/completions").status_code == 405  # a POST route


# --- Retry-After on every 429 -------------------------------------------------------------------


def chat(server: ServerThread, key: str, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "chat", "messages": HI, **body},
        headers={"authorization": f"Bearer {key}"},
    )


def retry_after(response: httpx.Response) -> int:
    assert response.status_code == 429, response.text
    return int(response.headers["retry-after"])


def test_a_rate_limit_says_retry_at_the_next_minute(served: ServerThread) -> None:
    key = new_key(served, rpm=1)
    assert chat(served, key).status_code == 200
    before = seconds_to_reset("minute", time.time())
    assert before is not None and before - 1 <= retry_after(chat(served, key)) <= before
    messages = httpx.post(
        f"{served.url}/v1/messages",
        json={"model": "chat", "max_tokens": 5, "messages": HI},
        headers={"x-api-key": key},
    )
    assert 1 <= retry_after(messages) <= 60 and messages.json()["type"] == "error"
    key = new_key(served, tpm=BOUND)  # no room for one output token
    assert 1 <= retry_after(chat(served, key)) <= 60


@pytest.mark.parametrize("period", ["day", "month"])
def test_a_spent_budget_says_when_its_period_starts_again(
    served: ServerThread, period: str
) -> None:
    key = new_key(served, budgets=[{"period": period, "tokens": BOUND}])
    expected = seconds_to_reset(period, time.time())
    assert expected is not None and abs(retry_after(chat(served, key)) - expected) <= 5


def test_a_spent_total_budget_has_no_retry_after(served: ServerThread) -> None:
    response = chat(served, new_key(served, budgets=[{"period": "total", "tokens": BOUND}]))
    assert response.status_code == 429 and "retry-after" not in response.headers


def test_too_little_for_every_prompt_says_when_to_retry(served: ServerThread) -> None:
    body = {"model": "chat", "prompt": ["a", "b", "c"], "max_tokens": 50}
    room = input_bound(input_parts(body).text_bytes, 3) + 2  # two output tokens for three answers
    key = new_key(served, budgets=[{"period": "day", "tokens": room}])
    response = httpx.post(
        f"{served.url}/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )
    expected = seconds_to_reset("day", time.time())
    assert expected is not None and abs(retry_after(response) - expected) <= 5


def test_seconds_to_reset() -> None:
    def at(text: str) -> float:
        return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()

    assert seconds_to_reset("minute", at("2026-12-31T23:59:00")) == 60
    assert seconds_to_reset("day", at("2026-12-31T23:59:59.5")) == 1
    assert seconds_to_reset("month", at("2026-12-31T23:00:00")) == 3600
    assert seconds_to_reset("month", at("2026-02-15T00:00:00")) == 14 * 86400
    assert seconds_to_reset("total", at("2026-02-15T00:00:00")) is None


# --- a body over the limit: read, then answered 413 -------------------------------------------


def oversized(chunked: bool, key: str | None) -> bytes:
    body = b'{"model": "chat", "messages": "' + b"x" * (2 * MAX_BODY) + b'"}'
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    if key:
        head += b"authorization: Bearer %b\r\n" % key.encode()
    if not chunked:
        return head + b"content-length: %d\r\n\r\n" % len(body) + body
    step = 1 << 20
    pieces = [body[i : i + step] for i in range(0, len(body), step)]
    framed = b"".join(b"%x\r\n%b\r\n" % (len(piece), piece) for piece in pieces)
    return head + b"transfer-encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n"


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("keyed", [True, False])
def test_an_unread_body_is_read_before_its_answer(
    edge: ServerThread, chunked: bool, keyed: bool
) -> None:
    # the client sends all of its body, reads the 413 (or the 401 refused before reading),
    # and the connection goes on
    request = oversized(chunked, new_key(edge) if keyed else None)
    reply = exchange(
        edge, request + b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    first, _, rest = reply.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 413 " if keyed else b"HTTP/1.1 401 "), reply[:300]
    assert (b'"code":"request_too_large"' in rest) is keyed
    assert b"HTTP/1.1 200 " in rest and rest.endswith(b'{"status":"ok"}')


def test_a_body_past_the_drain_limit_gets_its_413_and_a_close(edge: ServerThread) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %b\r\ncontent-length: %d\r\n\r\n"
        % (new_key(edge).encode(), DRAIN_BYTES + 1)
    )
    reply = exchange(edge, head)  # the server answers at once and closes: exchange returns
    first, _, _ = reply.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 413 ") and b"connection: close" in first.lower()


# --- the CLI: one line for bad input; keys and usage without provider credentials ------------


@pytest.fixture
def project(upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    provider = {"kind": "openai", "base_url": f"{upstream.url}/v1", "api_key_env": "FAKE_KEY"}  # type: ignore[attr-defined]
    gateway = {
        "admin_key_env": "GW_ADMIN",
        "pepper_env": "GW_PEPPER",
        "providers": {"fake": provider},
        "models": {"chat": {"deployments": [deployment("echo")]}},
    }
    (tmp_path / "kairos.yaml").write_text(yaml.safe_dump({"gateway": gateway}))
    return tmp_path


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--budget", "day:usd=1e308"], "budgets[0].usd"),
        (["--budget", "day:usd=inf"], "budgets[0].usd"),
        (["--budget", "day:usd=nan"], "budgets[0].usd"),
        (["--budget", "day:usd=-3"], "budgets[0].usd"),
        (["--budget", f"day:tokens={10**20}"], "budgets[0].tokens"),
        (["--rpm", str(2**63)], "rpm"),
        (["--tpm", "-5"], "tpm"),
    ],
)
def test_cli_bad_key_fields_are_one_line(
    project: Path, capsys: pytest.CaptureFixture[str], args: list[str], field: str
) -> None:
    code = main(["gateway", "keys", "create", "--name", "x", "--project", str(project), *args])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith(f"kairos: {field} must be") and "from" in line
    assert main(["gateway", "keys", "list", "--json", "--project", str(project)]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_keys_and_usage_need_no_provider_credentials(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FAKE_KEY")
    args = ["--project", str(project)]
    assert main(["gateway", "keys", "create", "--name", "ops", "--json", *args]) == 0
    created = json.loads(capsys.readouterr().out)
    assert main(["gateway", "keys", "list", *args]) == 0
    assert created["id"] in capsys.readouterr().out
    assert main(["gateway", "usage", *args]) == 0
    assert "0 requests" in capsys.readouterr().out
    assert main(["gateway", "keys", "revoke", created["id"], *args]) == 0
    capsys.readouterr()
    # what calls providers still needs them, and says which
    assert main(["gateway", "serve", "--port", "1", *args]) == 2
    assert "FAKE_KEY" in capsys.readouterr().err
    with pytest.raises(GatewayConfigError, match="FAKE_KEY, which is not set"):
        Gateway(GatewayConfig.load(project))


def test_cli_in_a_clean_environment(project: Path) -> None:
    # a fresh process whose environment has the gateway's own secrets and no provider key
    env = {"PATH": os.environ.get("PATH", ""), "GW_ADMIN": ADMIN_KEY, "GW_PEPPER": "pepper-1"}
    env.update({k: v for k, v in os.environ.items() if k.startswith(("PYTHON", "VIRTUAL_ENV"))})
    assert "FAKE_KEY" not in env
    for command in (["keys", "list", "--json"], ["usage", "--json"]):
        done = subprocess.run(
            [sys.executable, "-c", "from kairos.cli import main; raise SystemExit(main())",
             "gateway", *command, "--project", str(project)],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        json.loads(done.stdout)
