"""A ledger that survives kill -9: `kairos gateway serve` killed with 50 calls in flight leaves
a pending row for each; the next gateway to start marks them interrupted, charging the full
hold, and settles the dead process's budget shares to what its rows charged, so the ledger
and the counters agree. A live gateway's calls are never recovered by another."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
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
from kairos.gateway.accounting.accountant import input_bound
from kairos.gateway.accounting.counters import Line
from kairos.gateway.accounting.ledger import LedgerRow, LedgerWriter
from kairos.gateway.store import counters_from_url, registry_from_url
from tests.gateway.conftest import (
    ADMIN_KEY,
    ENVIRON,
    PG_URL,
    REDIS_URL,
    deployment,
    drop_postgres,
    drop_redis,
    postgres_available,
    redis_available,
)
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, free_port

HI = [{"role": "user", "content": "hi"}]
BOUND = input_bound(len(orjson.dumps({"messages": HI})), 1)
MAX_TOKENS = 50
FULL = BOUND + MAX_TOKENS  # a call's full hold, in micro-dollars at $1 per million tokens
LIMIT = 1_000_000  # room for budget shares: holds are served from memory
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(registry URL, counters URL): SQLite for both, PostgreSQL for both, or a SQLite
    registry with Redis counters."""
    prefix = f"gwtest_{uuid.uuid4().hex[:12]}"
    sqlite = f"sqlite:///{tmp_path / 'gateway.db'}"
    if request.param == "sqlite":
        yield sqlite, sqlite
    elif request.param == "postgres":
        if not postgres_available():
            pytest.skip(f"no PostgreSQL at {PG_URL}")
        yield f"{PG_URL}?prefix={prefix}", f"{PG_URL}?prefix={prefix}"
        drop_postgres(prefix)
    else:
        if not redis_available():
            pytest.skip(f"no Redis at {REDIS_URL}")
        yield sqlite, f"{REDIS_URL}?prefix={prefix}"
        drop_redis(prefix)


@pytest.fixture
def project(
    upstream: FakeUpstream,
    tmp_path: Path,
    stores: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Path]:
    for name, value in ENVIRON.items():
        monkeypatch.setenv(name, value)
    registry, counters = stores
    gateway = {
        "admin_key_env": "GW_ADMIN",
        "pepper_env": "GW_PEPPER",
        "registry": registry,
        "counters": counters,
        "providers": {
            "fake": {
                "kind": "openai",
                "base_url": f"{upstream.url}/v1",  # type: ignore[attr-defined]
                "api_key_env": "FAKE_KEY",
            }
        },
        "models": {
            "chat": {"deployments": [deployment("echo")]},
            "slow": {"deployments": [deployment("slow", timeout="60s")]},
        },
    }
    (tmp_path / "kairos.yaml").write_text(yaml.safe_dump({"gateway": gateway}))
    slow_seconds = upstream.slow_seconds
    upstream.slow_seconds = 8.0  # in flight until the gateway is killed
    yield tmp_path
    upstream.slow_seconds = slow_seconds


class Served:
    """`kairos gateway serve` in a process of its own."""

    def __init__(self, project: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = project / f"gateway-{self.port}.log"  # a pipe would fill with access lines
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from kairos.cli import main; raise SystemExit(main())",
                 "gateway", "serve", "--project", str(project), "--port", str(self.port)],
                env={**os.environ, **ENVIRON}, stdout=subprocess.DEVNULL, stderr=sink,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.url}/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"the gateway did not start: {self.stderr()}")
            time.sleep(0.05)

    def stderr(self) -> str:
        if self.process.poll() is None:
            return ""
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.communicate(timeout=20)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.communicate(timeout=20)

    def create_key(self) -> dict[str, Any]:
        """A key with a total budget of LIMIT, made over the admin API."""
        reply = httpx.post(
            f"{self.url}/admin/keys",
            json={"name": "svc", "budgets": [{"period": "total", "usd": LIMIT / 1e6}]},
            headers=ADMIN,
        )
        assert reply.status_code == 201, reply.text
        body: dict[str, Any] = reply.json()
        return body

    def usage(self, key_id: str) -> dict[str, Any]:
        reply = httpx.get(f"{self.url}/admin/usage?key={key_id}&rows=1", headers=ADMIN)
        assert reply.status_code == 200, reply.text
        body: dict[str, Any] = reply.json()
        return body


def _in_flight(url: str, key: str, upstream: FakeUpstream, calls: int, before: int) -> None:
    """Send `calls` slow calls at once and return while they are all with the provider (the
    calls stay open in a thread's loop until the gateway goes away)."""

    async def one(client: httpx.AsyncClient) -> None:
        with contextlib.suppress(httpx.TransportError):  # the gateway was killed under it
            await client.post(
                "/v1/chat/completions",
                json={"model": "slow", "messages": HI, "max_tokens": MAX_TOKENS},
            )

    async def burst() -> None:
        limits = httpx.Limits(max_connections=calls)
        headers = {"authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            base_url=url, headers=headers, limits=limits, timeout=60
        ) as client:
            await asyncio.gather(*(one(client) for _ in range(calls)))

    threading.Thread(target=asyncio.run, args=(burst(),), daemon=True).start()
    deadline = time.monotonic() + 30
    while len(upstream.received) < before + calls:
        assert time.monotonic() < deadline, f"{len(upstream.received) - before} calls arrived"
        time.sleep(0.01)


def _spent(counters_url: str, key_id: str) -> int:
    async def read() -> int:
        counters = counters_from_url(counters_url)
        try:
            [spent] = await counters.spent([f"{key_id}:usd:total:all"])
            return spent
        finally:
            await counters.close()

    return asyncio.run(read())


@pytest.mark.slow
def test_a_killed_gateway_leaves_every_dispatched_call_in_the_ledger(
    project: Path,
    upstream: FakeUpstream,
    stores: tuple[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = Served(project)
    try:
        created = first.create_key()
        key, key_id = created["key"], created["id"]
        with httpx.Client(base_url=first.url, headers={"authorization": f"Bearer {key}"}) as c:
            for _ in range(10):  # answered and logged before the crash
                reply = c.post(
                    "/v1/chat/completions",
                    json={"model": "chat", "messages": HI, "max_tokens": MAX_TOKENS},
                )
                assert reply.status_code == 200, reply.text
        time.sleep(0.5)  # their rows are written (every 0.1 s)
        _in_flight(first.url, key, upstream, 50, before=10)
        charged_at_kill = _spent(stores[1], key_id)
        first.kill()
    finally:
        first.stop()
    received = len(upstream.received)
    assert received == 60
    # the dead process's budget shares reserved more than its calls took
    assert charged_at_kill > 10 * (TOKENS_IN + 5) + 50 * FULL

    second = Served(project)  # recovers the dead process's calls as it starts
    try:
        usage = second.usage(key_id)
    finally:
        second.stop()
    statuses = [row["status"] for row in usage["rows"]]
    assert usage["requests"] == received
    assert statuses.count("ok") == 10 and statuses.count("interrupted") == 50
    cut = [row for row in usage["rows"] if row["status"] == "interrupted"]
    assert all(row["cost_micros"] == FULL and row["provider"] == "fake" for row in cut)
    assert all(row["deployment"] == "slow" and row["model_requested"] == "slow" for row in cut)
    spent = _spent(stores[1], key_id)
    assert usage["cost_micros"] >= spent  # the ledger never shows less than was charged
    assert usage["cost_micros"] == spent == 10 * (TOKENS_IN + 5) + 50 * FULL
    # and the CLI says the same
    assert main(["gateway", "usage", "--key", key_id, "--json", "--project", str(project)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == 60 and summary["cost_micros"] == spent


@pytest.mark.slow
def test_a_gateway_starting_leaves_a_live_gateways_calls_alone(
    project: Path, upstream: FakeUpstream, stores: tuple[str, str]
) -> None:
    first = Served(project)
    second: Served | None = None
    try:
        created = first.create_key()
        _in_flight(first.url, created["key"], upstream, 5, before=0)
        second = Served(project)  # starts, and recovers nothing: the first one is alive
        rows = second.usage(created["id"])["rows"]
        assert [row["status"] for row in rows] == ["pending"] * 5
        assert all(row["cost_micros"] == FULL for row in rows)  # charged the full hold so far
        deadline = time.monotonic() + 30
        while {row["status"] for row in rows} != {"ok"}:  # the first one answers them
            assert time.monotonic() < deadline, rows
            time.sleep(0.2)
            rows = second.usage(created["id"])["rows"]
        assert len(rows) == 5
    finally:
        first.stop()
        if second is not None:
            second.stop()
    # stopped cleanly: its shares given back, the counters hold what the calls used
    assert _spent(stores[1], created["id"]) == 5 * (TOKENS_IN + 5)


DEAD = "0123456789abcdef"  # a process id that no live process has


def test_a_dead_process_holds_are_found_and_settled_by_another(counters_url: str) -> None:
    """Hold records outlive their process on every backend: another process lists them by
    the dead one's id prefix (its calls' and its shares') and settles them."""

    async def scenario() -> None:
        dead = counters_from_url(counters_url)
        lease = time.time() + 60
        assert await dead.hold(f"{DEAD}000000000001", [Line("usd", 1000, 100)], lease) is None
        share = f"share-{DEAD}000000000002"
        assert await dead.hold(share, [Line("usd", 1000, 400), Line("rpm", 50, 16)], lease) is None
        assert await dead.hold("fedcba98765432100000000003", [Line("usd", 1000, 7)], lease) is None
        await dead.close()  # as if killed: nothing settled

        alive = counters_from_url(counters_url)
        try:
            orphans = dict(await alive.orphans(DEAD))
            assert orphans == {f"{DEAD}000000000001": {"usd": 100}, share: {"usd": 400, "rpm": 16}}
            assert await alive.settle(share, {"usd": 30, "rpm": 2})
            assert await alive.settle(f"{DEAD}000000000001", {"usd": 100})
            assert not await alive.settle(share, {"usd": 0, "rpm": 0})  # once only
            assert await alive.spent(["usd", "rpm"]) == [100 + 30 + 7, 2]
            assert await alive.orphans(DEAD) == []
        finally:
            await alive.close()

    asyncio.run(scenario())


def test_pending_rows_of_a_burst_are_written_together(tmp_path: Path) -> None:
    """Each pending row is durable when `pending` returns; rows that come while one is being
    written share the next write."""
    writes: list[int] = []

    async def scenario() -> list[LedgerRow]:
        registry = registry_from_url(f"sqlite:///{tmp_path / 'ledger.db'}")
        write_rows = registry.write_rows

        async def counted(rows: Any) -> None:
            writes.append(len(rows))
            await write_rows(rows)

        registry.write_rows = counted  # type: ignore[method-assign]
        writer = LedgerWriter(registry)
        now = datetime.now(UTC)
        rows = [
            LedgerRow(
                request_id=f"{DEAD}{index:012x}",
                key_id="k",
                route="chat",
                model_requested="chat",
                model_dispatched="chat",
                provider="fake",
                deployment="echo",
                tokens_in=1,
                tokens_out=2,
                cost_micros=3,
                price_version="v",
                ttft_ms=None,
                latency_ms=0.0,
                status="pending",
                attempts=1,
                created_at=now,
            )
            for index in range(200)
        ]
        try:
            await asyncio.gather(*(writer.pending(row) for row in rows))
            return await registry.process_rows(DEAD, now)
        finally:
            await registry.close()

    written = asyncio.run(scenario())
    assert len(written) == 200 and {row.status for row in written} == {"pending"}
    assert sum(writes) == 200 and len(writes) < 10  # not a write (nor a connection) each
