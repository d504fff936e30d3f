"""The production topology of the README, on this machine: two `kairos serve` processes on
Redis (online store, windows, stream) and PostgreSQL (offline store, query log, model
registry), consuming one Redis stream as one consumer group.

Both servers answer the same at once (events sent to either, or to the stream, are in both
servers' windows), the log holds every query of both, and killing one server with SIGKILL
loses no acknowledged event: the survivor takes over its unacknowledged stream messages, and
every event is counted once.
"""

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
from psycopg import sql

import kairos as kr
from tests.conftest import (
    POSTGRES_SERVER,
    REDIS_URL,
    delete_redis_prefix,
    postgres_available,
    redis_available,
)
from tests.gateway.fake_upstream import free_port

POSTGRES = f"{POSTGRES_SERVER}/postgres"  # where a test creates a database of its own
T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)
PAYERS = [f"p{i}" for i in range(6)]

FEATURES = """
from kairos import DataFrame, FeatureTime, Windowed, _, features, windowed


@features(events=True)
class Payment:
    id: str
    payer_id: "Payer.id"
    amount: float
    at: FeatureTime


@features
class Payer:
    id: str
    payments: DataFrame[Payment]
    paid: Windowed[int] = windowed("1d", "7d", expression=_.payments[_.at > _.window_start].count())
    total: Windowed[float] = windowed(
        "7d", expression=_.payments[_.amount, _.at > _.window_start].sum()
    )
"""


pytestmark = pytest.mark.skipif(
    not (redis_available() and postgres_available()), reason="needs Redis and PostgreSQL"
)


@pytest.fixture
def database() -> Iterator[str]:
    """A database of its own: offline store, query log and registry start empty."""
    name = f"kairos_topology_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(POSTGRES, autocommit=True) as connection:
        connection.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    yield f"{POSTGRES_SERVER}/{name}"
    with psycopg.connect(POSTGRES, autocommit=True) as connection:
        connection.execute(
            sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name))
        )


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@pytest.fixture
def project(tmp_path: Path, database: str) -> Iterator[tuple[Path, str, str]]:
    prefix = f"kprod{uuid.uuid4().hex[:8]}"
    stream = f"{prefix}-payments"
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "features.py").write_text(FEATURES)
    (folder / "kairos.yaml").write_text(
        textwrap.dedent(f"""\
        online_store: {REDIS_URL}?prefix={prefix}
        offline_store: {database}
        query_log: {database}
        models:
          registry: {database}
        streams:
          payments:
            kind: redis
            url: {REDIS_URL}
            stream: {stream}
            events: payment
            group: servers
            consumer: ${{KAIROS_CONSUMER}}
            claim_after: 1
            batch: 25
        """)
    )
    yield folder, prefix, stream
    delete_redis_prefix(prefix)
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(stream, f"{stream}.dead")
    client.close()


def start(folder: Path, name: str) -> Server:
    port = free_port()
    log = folder.parent / f"{name}.log"
    env = {**os.environ, "KAIROS_CONSUMER": name}
    command = [sys.executable, "-m", "kairos.cli", "serve", str(folder),
               "--port", str(port)]  # fmt: skip
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=folder, env=env, stdout=out, stderr=out)
    server = Server(name, port, process, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{name} exited: {server.output()}")
        try:
            if httpx.get(f"{server.url}/readyz", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"{name} did not start: {server.output()}")


def stop(server: Server, how: int = signal.SIGTERM) -> None:
    if server.process.poll() is None:
        server.process.send_signal(how)
        server.process.wait(30)


def payment(i: int, rng: random.Random) -> dict[str, Any]:
    at = T0 - timedelta(seconds=rng.randint(0, 9 * 86400))
    if i % 9 == 0:
        at = T0 - timedelta(days=3)  # ties on time
    return {"id": f"e{i}", "payer_id": rng.choice(PAYERS), "amount": float(rng.randint(1, 99)),
            "at": at.isoformat()}  # fmt: skip


def expected(events: dict[str, dict[str, Any]], payer: str, now: datetime) -> dict[str, Any]:
    mine = [e for e in events.values() if e["payer_id"] == payer]
    inside = [e for e in mine if now - timedelta(days=7) < datetime.fromisoformat(e["at"]) <= now]
    day = [e for e in mine if now - timedelta(days=1) < datetime.fromisoformat(e["at"]) <= now]
    return {
        "payer.paid[7d]": len(inside),
        "payer.paid[1d]": len(day),
        "payer.total[7d]": float(sum(e["amount"] for e in inside)),
    }


def ask(server: Server, payer: str, now: datetime, query_id: str) -> dict[str, Any]:
    body = {"inputs": {"payer.id": payer}, "outputs": ["payer.paid[1d]", "payer.paid[7d]",
            "payer.total[7d]"], "now": now.isoformat(), "query_id": query_id}  # fmt: skip
    reply = httpx.post(f"{server.url}/v1/query/online", json=body, timeout=10)
    assert reply.status_code == 200, reply.text
    values: dict[str, Any] = reply.json()["values"]
    return values


def settle(
    servers: list[Server], events: dict[str, dict[str, Any]], asked: list[str], timeout: float
) -> None:
    """Wait until every server answers every payer as the oracle does, at several `now`s:
    the end, days back, exactly on the tied time and a second after the window edge."""
    nows = [T0, T0 - timedelta(days=2, hours=5), T0 - timedelta(days=3),
            T0 + timedelta(days=4, seconds=1)]  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        wrong = []
        for server in servers:
            for payer in PAYERS:
                for now in nows:
                    query_id = f"q-{server.name}-{len(asked)}"
                    asked.append(query_id)
                    if ask(server, payer, now, query_id) != expected(events, payer, now):
                        wrong.append((server.name, payer, now))
        if not wrong:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"servers still disagree with the oracle: {wrong}")
        time.sleep(0.2)


def test_two_servers_on_redis_and_postgres_agree_log_everything_and_survive_a_kill(
    project: tuple[Path, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, _prefix, stream = project
    rng = random.Random(7)
    broker = redis.Redis.from_url(REDIS_URL)
    servers = [start(folder, "a"), start(folder, "b")]
    asked: list[str] = []
    events: dict[str, dict[str, Any]] = {}
    try:
        # events through the stream (either server's consumer takes each) and over HTTP to one
        for i in range(300):
            event = payment(i, rng)
            events[event["id"]] = event
            broker.xadd(stream, {"data": json.dumps(event)})
        direct = [payment(i, rng) for i in range(300, 360)]
        events.update({e["id"]: e for e in direct})
        reply = httpx.post(f"{servers[1].url}/v1/events/payment", json={"rows": direct})
        assert reply.json() == {"written": 60}
        # a retried delivery and a correction: the same id counts once, the last row wins
        broker.xadd(stream, {"data": json.dumps(events["e5"])})
        events["e6"] = {**events["e6"], "amount": 1000.0}
        httpx.post(f"{servers[0].url}/v1/events/payment", json={"rows": [events["e6"]]})
        settle(servers, events, asked, timeout=60)

        # kill one server while the stream still flows: what it took and did not
        # acknowledge is claimed by the other; nothing acknowledged is lost
        for i in range(360, 700):
            event = payment(i, rng)
            events[event["id"]] = event
            broker.xadd(stream, {"data": json.dumps(event)})
        time.sleep(0.05)
        stop(servers[0], signal.SIGKILL)
        survivor = servers[1]
        settle([survivor], events, asked, timeout=90)
        pending = broker.xpending(stream, "servers")
        assert pending["pending"] == 0, pending

        # a replacement server starts on the same stores and agrees at once
        servers[0] = start(folder, "c")
        settle(servers, events, asked, timeout=30)
    finally:
        for server in servers:
            stop(server)
        broker.close()
    for server in servers:  # a clean stop (uvicorn ends by the signal it handled)
        assert server.process.returncode in (0, -signal.SIGTERM), server.output()
        assert "query log flushed" in server.output()

    # every query the cleanly stopped servers answered is in the shared log (the killed one
    # loses at most the records its log writer had not flushed)
    cleanly_stopped = [q for q in asked if not q.startswith("q-a-")]
    monkeypatch.setenv("KAIROS_CONSUMER", "reader")
    with kr.Client(folder, online_store="memory://") as client:
        logged = {q: client.log.get(q) for q in cleanly_stopped}
        assert [q for q, record in logged.items() if record is None] == []
        sample = logged[cleanly_stopped[-1]]
        assert (
            sample is not None
            and sample.outputs["payer.paid[7d]"].value
            == expected(events, sample.inputs["payer.id"], sample.now)["payer.paid[7d]"]
        )
