"""Fixtures of the gateway tests: a fake provider on a real localhost port (session-wide),
gateway configurations pointing at it, a gateway served over HTTP, and counters on every
backend (SQLite, PostgreSQL, Redis) with names unique to the test."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import openai
import psycopg
import pytest
import redis

from kairos.gateway import Gateway, GatewayConfig, Stream
from kairos.gateway.accounting.ledger import LedgerRow
from kairos.gateway.app import create_gateway_app
from tests.gateway.fake_upstream import FakeUpstream, ServerThread

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
PROVIDER_SECRET = "sk-provider-secret-do-not-leak-42"
ADMIN_KEY = "admin-secret-key-7"
ENVIRON = {"FAKE_KEY": PROVIDER_SECRET, "GW_ADMIN": ADMIN_KEY, "GW_PEPPER": "pepper-1"}
CHEAP = {"input": 1, "output": 1}  # $1 per million tokens: one micro-dollar per token


@pytest.fixture(scope="session")
def upstream() -> Iterator[FakeUpstream]:
    fake = FakeUpstream()
    with ServerThread(fake.app()) as server:
        fake.url = server.url  # type: ignore[attr-defined]
        yield fake


@pytest.fixture(autouse=True)
def _reset(upstream: FakeUpstream) -> None:
    upstream.behaviour.clear()
    upstream.received.clear()
    upstream.headers.clear()


def deployment(model: str, **extra: Any) -> dict[str, Any]:
    return {"provider": "fake", "model": model, "price": CHEAP, "timeout": "5s", **extra}


def config(
    upstream: FakeUpstream,
    tmp_path: Path,
    *,
    models: dict[str, Any] | None = None,
    counters: str | None = None,
    registry: str | None = None,
    **extra: Any,
) -> GatewayConfig:
    url = upstream.url  # type: ignore[attr-defined]
    raw: dict[str, Any] = {
        "admin_key_env": "GW_ADMIN",
        "pepper_env": "GW_PEPPER",
        "registry": registry or f"sqlite:///{tmp_path / 'gateway.db'}",
        "counters": counters or f"sqlite:///{tmp_path / 'gateway.db'}",
        "providers": {
            "fake": {"kind": "openai", "base_url": f"{url}/v1", "api_key_env": "FAKE_KEY"},
            "claude": {"kind": "anthropic", "base_url": url, "api_key_env": "FAKE_KEY"},
            "nowhere": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"},  # refuses
        },
        "models": models
        or {
            "chat": {"deployments": [deployment("echo")]},
            "other": {"deployments": [deployment("echo")]},
            "claude": {"deployments": [{**deployment("echo"), "provider": "claude"}]},
        },
        "breaker": {"failures": 3, "cooldown": "1s"},
        **extra,
    }
    return GatewayConfig.from_mapping(raw, base_dir=tmp_path, environ=ENVIRON)


@functools.cache
def postgres_available() -> bool:
    try:
        psycopg.connect(PG_URL, connect_timeout=2).close()
    except psycopg.Error:
        return False
    return True


@functools.cache
def redis_available() -> bool:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def drop_postgres(prefix: str) -> None:
    with psycopg.connect(PG_URL, autocommit=True) as connection:
        for table in ("counters", "holds", "keys", "ledger", "processes"):
            connection.execute(f"drop table if exists {prefix}_{table}")


def drop_redis(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def counters_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A counters URL on each backend, private to the test."""
    prefix = f"gwtest_{uuid.uuid4().hex[:12]}"
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'counters.db'}"
    elif request.param == "postgres":
        if not postgres_available():
            pytest.skip(f"no PostgreSQL at {PG_URL}")
        yield f"{PG_URL}?prefix={prefix}"
        drop_postgres(prefix)
    else:
        if not redis_available():
            pytest.skip(f"no Redis at {REDIS_URL}")
        yield f"{REDIS_URL}?prefix={prefix}"
        drop_redis(prefix)


@pytest.fixture(params=["sqlite", "postgres"])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A registry URL on SQLite and on PostgreSQL, private to the test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.db'}"
        return
    if not postgres_available():
        pytest.skip(f"no PostgreSQL at {PG_URL}")
    prefix = f"gwtest_{uuid.uuid4().hex[:12]}"
    yield f"{PG_URL}?prefix={prefix}"
    drop_postgres(prefix)


@pytest.fixture
def served(upstream: FakeUpstream, tmp_path: Path) -> Iterator[ServerThread]:
    """The default gateway served over HTTP; `served.gateway` is the Gateway behind it."""
    gateway = Gateway(config(upstream, tmp_path))
    with ServerThread(create_gateway_app(gateway), kairos=True) as server:
        server.gateway = gateway  # type: ignore[attr-defined]
        yield server
        server.call(gateway.close())


def new_key(server: ServerThread, **spec: Any) -> str:
    gateway: Gateway = server.gateway  # type: ignore[attr-defined]
    plain, _ = server.call(gateway.create_key(**{"name": "test", **spec}))
    return plain


def ledger(served: ServerThread) -> list[dict[str, Any]]:
    """The ledger rows of the gateway behind `served`, as dicts."""
    gateway: Gateway = served.gateway  # type: ignore[attr-defined]
    return [row.as_dict() for row in served.call(gateway.usage())]


def rows_when(server: ServerThread, count: int, timeout: float = 5.0) -> list[LedgerRow]:
    """The ledger rows once there are `count` of them (or what there is after `timeout`)."""
    gateway: Gateway = server.gateway  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout
    while True:
        rows = server.call(gateway.usage())
        if len(rows) >= count or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def stream_in_process(
    gateway_config: GatewayConfig, body: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[LedgerRow]]:
    """The chunks of one streamed chat call made in process (no HTTP hop) with a new key, and
    the ledger after it."""

    async def scenario() -> tuple[list[dict[str, Any]], list[LedgerRow]]:
        gateway = Gateway(gateway_config)
        try:
            plain, _ = await gateway.create_key(name="graph")
            stream = await gateway.chat(plain, {**body, "stream": True})
            assert isinstance(stream, Stream)
            chunks = [chunk async for chunk in stream]
            return chunks, await gateway.usage()
        finally:
            await gateway.close()

    return asyncio.run(scenario())


SDK = TypeVar("SDK", openai.OpenAI, anthropic.Anthropic)
_OPEN_SDKS: list[openai.OpenAI | anthropic.Anthropic] = []


def closed_after_test(sdk: SDK) -> SDK:
    """`sdk`, to be closed when the test ends."""
    _OPEN_SDKS.append(sdk)
    return sdk


@pytest.fixture(autouse=True)
def _close_sdks() -> Iterator[None]:
    """SDK clients are closed after each test: their pooled sockets never reach the GC."""
    yield
    while _OPEN_SDKS:
        _OPEN_SDKS.pop().close()
