"""What a `kill -9` of a loaded `kairos serve` loses of the decisions it answered: at most the
last 50 ms of them by default, none with `query_log: {durability: acknowledged}`.

A real server process (one worker) answers 16 connections that query back to back; each
answer's query id and the moment it arrived are kept; the server is SIGKILLed mid-stream and
the log is read back. Measured on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import psycopg
import pytest
from psycopg import sql

from kairos.errors import ProjectError
from kairos.project.config import Config
from kairos.stores.query_log import BatchedQueryLog, query_log_from_url
from tests.conftest import POSTGRES_URL, need_postgres

pytestmark = pytest.mark.slow

BOUND_S = 0.050  # what the default durability may lose: answers of the last 50 ms
CONNECTIONS = 16
LOAD_S = 2.0

FEATURES = (
    "from kairos import Features, features, online\n\n\n"
    "@features(max_staleness='1h')\n"
    "class Account:\n    id: str\n"
    + "".join(f"    f{i}: float\n" for i in range(10))
    + "\n\n@online\n"
    "def account_values(aid: Account.id) -> Features["
    + ", ".join(f"Account.f{i}" for i in range(10))
    + "]:\n    return (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, float(len(aid)))\n"
)


def request(port: int, account: str) -> bytes:
    body = orjson.dumps(
        {"inputs": {"account.id": account}, "outputs": [f"account.f{i}" for i in range(10)]}
    )
    head = (
        f"POST /v1/query/online HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class Killed:
    answered: list[tuple[str, float]]  # (query id, monotonic time its answer arrived)
    killed_at: float


async def load_then_kill(port: int, pid: int) -> Killed:
    """Query on CONNECTIONS keep-alive connections for LOAD_S, then SIGKILL the server."""
    answered: list[tuple[str, float]] = []
    stop = asyncio.Event()

    async def connection(number: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        raw = request(port, f"a{number}")
        try:
            while not stop.is_set():
                writer.write(raw)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                body = await reader.readexactly(length)
                arrived = time.monotonic()
                assert status == 200, body[:300]
                answered.append((orjson.loads(body)["query_id"], arrived))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # killed
        finally:
            writer.close()

    tasks = [asyncio.create_task(connection(n)) for n in range(CONNECTIONS)]
    await asyncio.sleep(LOAD_S)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    stop.set()
    await asyncio.gather(*tasks)
    return Killed(answered, killed_at)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_and_kill(folder: Path) -> Killed:
    port = free_port()
    output = folder / "server.out"
    with output.open("wb") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "kairos.cli", "serve", str(folder), "--port", str(port)],
            cwd=folder,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while not ready(port):
            assert server.poll() is None, output.read_text()
            assert time.monotonic() < deadline, f"not ready in 60 s:\n{output.read_text()}"
            time.sleep(0.05)
        killed = asyncio.run(load_then_kill(port, server.pid))
        assert server.wait(timeout=30) == -signal.SIGKILL
        return killed
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def ready(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


@pytest.fixture(params=["sqlite", "postgres"])
def log_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'project' / '.kairos' / 'query_log.db'}"
        return
    need_postgres()
    table = f"kairos_qlog_kill_{uuid.uuid4().hex[:12]}"
    yield f"{POSTGRES_URL}?table={table}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        for name in (table, f"{table}_keys", f"{table}_plans"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


def lost_after_kill(
    folder: Path, log_url: str, durability: str | None
) -> tuple[Killed, list[tuple[str, float]]]:
    folder.mkdir(exist_ok=True)
    (folder / "features.py").write_text(FEATURES)
    log = log_url if durability is None else f"{{url: '{log_url}', durability: {durability}}}"
    (folder / "kairos.yaml").write_text(f"online_store: memory://\nquery_log: {log}\n")
    killed = serve_and_kill(folder)
    assert len(killed.answered) >= 200, f"too little load: {len(killed.answered)} answers"
    reader = query_log_from_url(log_url)
    assert isinstance(reader, BatchedQueryLog)
    try:
        kept = reader.get_many([query_id for query_id, _ in killed.answered])
    finally:
        reader.close()
    assert kept, "nothing was logged"
    lost = [(query_id, at) for query_id, at in killed.answered if query_id not in kept]
    return killed, lost


def test_a_kill_9_loses_at_most_the_last_50_ms_of_answered_decisions(
    log_url: str, tmp_path: Path
) -> None:
    killed, lost = lost_after_kill(tmp_path / "project", log_url, None)
    if lost:
        oldest = min(at for _, at in lost)
        window_ms = (killed.killed_at - oldest) * 1000
        assert window_ms <= BOUND_S * 1000, (
            f"{len(lost)} of {len(killed.answered)} answered decisions lost, the oldest "
            f"answered {window_ms:.1f} ms before the kill"
        )


def test_acknowledged_durability_loses_no_answered_decision(log_url: str, tmp_path: Path) -> None:
    killed, lost = lost_after_kill(tmp_path / "project", log_url, "acknowledged")
    assert not lost, (
        f"{len(lost)} of {len(killed.answered)} answered decisions lost, answered "
        f"{(killed.killed_at - min(at for _, at in lost)) * 1000:.1f} ms before the kill"
    )


def test_the_durability_setting_is_read_and_checked(tmp_path: Path) -> None:
    (tmp_path / "kairos.yaml").write_text(
        "query_log: {url: sqlite:///logs/q.db, durability: acknowledged}\n"
    )
    config = Config.load(tmp_path)
    assert config.query_log == f"sqlite:///{tmp_path / 'logs' / 'q.db'}"
    assert config.query_log_durability == "acknowledged"
    (tmp_path / "kairos.yaml").write_text("query_log: {durability: acknowledged}\n")
    assert Config.load(tmp_path).query_log.endswith("/.kairos/query_log.db")
    (tmp_path / "kairos.yaml").write_text("query_log: sqlite:///q.db\n")
    assert Config.load(tmp_path).query_log_durability == "batched"
    (tmp_path / "kairos.yaml").write_text("query_log: {durability: always}\n")
    with pytest.raises(ProjectError, match="durability` is one of batched, ackn"):
        Config.load(tmp_path)
    (tmp_path / "kairos.yaml").write_text("query_log: {path: q.db}\n")
    with pytest.raises(ProjectError, match="takes url and durability, not 'path'"):
        Config.load(tmp_path)
