"""Chaos: the online store's Redis restarts empty under two running `kairos serve` processes.

Every answer is either right (the brute-force count over the events the servers acknowledged)
or HTTP 503 `OnlineStoreUnavailable`, never a wrong 0; the windows are whole again within 15 s
without restarting the servers; events written during and after the loss count on the
reloaded state (201, not 1); a cached feature that Redis lost is recomputed (a miss).

The Redis here is a private `redis-server` (no persistence) on a free loopback port that the
test starts, kills and starts again; the shared Redis on 6379 is never touched."""

import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server binary"),
]

PROJECT = """
from pathlib import Path

from kairos import DataFrame, FeatureTime, Windowed, _, feature, features, online, windowed

@features(events=True)
class Payment:
    id: str
    payer_id: "Payer.id"
    amount: float
    at: FeatureTime

@features
class Payer:
    id: str
    label: str = feature(max_staleness="1h")
    payments: DataFrame[Payment]
    paid: Windowed[int] = windowed("7d", expression=_.payments[_.at > _.window_start].count())
    total: Windowed[float] = windowed(
        "7d", expression=_.payments[_.amount, _.at > _.window_start].sum()
    )
    biggest: Windowed[float | None] = windowed(
        "7d", expression=_.payments[_.amount, _.at > _.window_start].max()
    )
    lifetime: int = _.payments.count()

@online
def label(pid: Payer.id) -> Payer.label:
    with Path(__file__).with_name("label_calls.txt").open("a") as calls:
        calls.write(pid + "\\n")  # how often the cache missed, across processes
    return "payer " + pid
"""
T0 = datetime(2026, 3, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=3)
OUTPUTS = ["payer.label", "payer.paid[7d]", "payer.total[7d]", "payer.biggest[7d]",
           "payer.lifetime"]  # fmt: skip
PAYERS = ["p0", "p1", "nobody"]
RECOVERY = 15.0  # seconds the windows may take to be whole again


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivateRedis:
    """A `redis-server` of this test's own: no RDB, no AOF, so a restart comes back empty."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.folder / "redis.out").open("ab")
        with log:
            self.process = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "no", "--dir", str(self.folder)],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as probe:
                    probe.ping()
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def keys(self) -> int:
        with redis.Redis(port=self.port) as client:
            return int(client.dbsize())


@contextmanager
def private_redis(folder: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(folder)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@contextmanager
def serving(project: Path) -> Iterator[httpx.Client]:
    """`kairos serve` on the project, ready; killed after."""
    port = free_port()
    output = project.parent / f"serve-{port}.out"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "kairos.cli", "serve", str(project), "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=project,
        )
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    try:
        deadline = time.monotonic() + 90
        while True:
            if process.poll() is not None:
                raise AssertionError(f"kairos serve exited early:\n{output.read_text()}")
            try:
                if http.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"kairos serve not ready:\n{output.read_text()}")
            time.sleep(0.1)
        yield http
    finally:
        http.close()
        process.kill()
        process.wait(timeout=30)


def payment(i: int, payer: str) -> dict[str, Any]:
    return {
        "id": f"e{i}",
        "payer_id": payer,
        "amount": float(i % 17) + 0.5,
        "at": T0 + timedelta(minutes=i),
    }


def brute(sent: list[dict[str, Any]], payer: str) -> dict[str, Any]:
    """The answer the slow, obvious way, from the events the servers acknowledged."""
    mine = [e for e in sent if e["payer_id"] == payer and e["at"] <= NOW]
    week = [e["amount"] for e in mine if e["at"] > NOW - timedelta(days=7)]
    return {
        "payer.label": "payer " + payer,
        "payer.paid[7d]": len(week),
        "payer.total[7d]": sum(week),
        "payer.biggest[7d]": max(week, default=None),
        "payer.lifetime": len(mine),
    }


class Traffic:
    """Writes and queries to the servers in turn, each answer checked against the oracle."""

    def __init__(self, servers: list[httpx.Client]) -> None:
        self.servers = servers
        self.sent: list[dict[str, Any]] = []
        self.turn = 0
        self.refused = 0  # 503 OnlineStoreUnavailable answers
        self.right = 0

    def next_server(self) -> httpx.Client:
        self.turn += 1
        return self.servers[self.turn % len(self.servers)]

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Sent until acknowledged: an event id counts once, however often it is sent."""
        body = {"rows": [dict(r, at=r["at"].isoformat()) for r in rows]}
        deadline = time.monotonic() + RECOVERY
        while True:
            response = self.next_server().post("/v1/events/payment", json=body)
            if response.status_code == 200:
                assert response.json() == {"written": len(rows)}
                self.sent += rows
                return
            self.refusal(response)
            assert time.monotonic() < deadline, "events refused for 15 s"
            time.sleep(0.05)

    def refusal(self, response: httpx.Response) -> None:
        assert response.status_code == 503, (response.status_code, response.text)
        assert response.json()["error"]["code"] == "OnlineStoreUnavailable", response.text
        self.refused += 1

    def query(self, payer: str) -> bool:
        """One query: True when answered (and right), False when refused with a 503."""
        body = {"inputs": {"payer.id": payer}, "outputs": OUTPUTS, "now": NOW.isoformat()}
        response = self.next_server().post("/v1/query/online", json=body)
        if response.status_code != 200:
            self.refusal(response)
            return False
        answer = response.json()
        assert answer["errors"] == [], answer
        expected = brute(self.sent, payer)
        got = {name: answer["values"][name] for name in OUTPUTS}
        assert got == pytest.approx(expected), (payer, len(self.sent), got, expected)
        self.right += 1
        return True

    def all_right(self) -> bool:
        return all([self.query(payer) for payer in PAYERS])


def test_windows_are_right_or_refused_and_whole_again_after_redis_restarts_empty(
    tmp_path: Path,
) -> None:
    with ExitStack() as stack:
        store = stack.enter_context(private_redis(tmp_path))
        project = tmp_path / "project"
        project.mkdir()
        (project / "features.py").write_text(textwrap.dedent(PROJECT))
        (project / "kairos.yaml").write_text(
            f"online_store: {store.url}\nquery_log: none://\nserver: {{host: 127.0.0.1}}\n"
        )
        calls = project / "label_calls.txt"
        traffic = Traffic([stack.enter_context(serving(project)) for _ in range(2)])
        for start in range(0, 200, 50):
            traffic.write([payment(i, "p0") for i in range(start, start + 50)])
        for start in range(200, 3200, 500):  # enough that the reload takes a while
            traffic.write([payment(i, "p1") for i in range(start, start + 500)])
        assert traffic.all_right() and traffic.all_right()
        assert brute(traffic.sent, "p0")["payer.paid[7d]"] == 200
        cached = len(calls.read_text().splitlines())

        store.kill()  # Redis restarts empty under the running servers
        store.start()
        assert store.keys() == 0
        restarted = time.monotonic()
        traffic.query("p0")  # the first answer after the loss: right or refused, never 0
        traffic.write([payment(3200, "p0")])  # written into the empty Redis: counts as 201
        whole = None
        for attempt in range(1_000_000):
            if attempt % 3 == 0 and attempt < 1000:  # events keep coming while it reloads
                traffic.write([payment(3300 + attempt, "p1")])
            if traffic.all_right():
                whole = time.monotonic() - restarted
                break
            assert time.monotonic() - restarted < RECOVERY, "windows not whole after 15 s"
            time.sleep(0.02)
        assert whole is not None
        traffic.write([payment(4310, "p0")])  # after the reload: counts on the whole state
        assert brute(traffic.sent, "p0")["payer.paid[7d]"] == 202
        for _round in range(3):
            assert traffic.all_right()
        # the cached labels went with Redis: a miss, computed again, never an error; cached
        # again from then on
        assert len(calls.read_text().splitlines()) > cached
        cached = len(calls.read_text().splitlines())
        for _round in range(3):
            assert traffic.all_right()
        assert len(calls.read_text().splitlines()) == cached
        print(f"whole again {whole:.2f}s after the restart; {traffic.refused} answers refused")
