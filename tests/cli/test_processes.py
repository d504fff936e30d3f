"""Processes that share a project folder on the embedded stores: `kairos serve` under load
while `kairos query`, `materialize`, `offline`, `log` and `models` run beside it (no lock
errors, nothing acknowledged lost), and `kairos serve --workers 2`, whose two processes answer
windows over the events either was sent, at once."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kairos as kr
from examples.fraud.generate import ANCHOR, generate
from tests.server.fraud import DB, USERS, copy_project, online_body

pytestmark = pytest.mark.slow

KAIROS = [sys.executable, "-m", "kairos.cli"]


@pytest.fixture(scope="module")
def fraud_db() -> Path:
    return generate(DB)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serving(project: Path, *options: str) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    """`kairos serve` on the project, ready; stopped with SIGTERM (so it flushes) after."""
    port = free_port()
    output = project.parent / f"serve-{port}.out"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [*KAIROS, "serve", str(project), "--port", str(port), *options],
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=project,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise AssertionError(f"kairos serve exited early:\n{output.read_text()}")
            try:
                if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"kairos serve not ready:\n{output.read_text()}")
            time.sleep(0.1)
        yield base, process, output
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) in (0, -signal.SIGTERM), output.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def kairos(project: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """A CLI command on the project; it must succeed and never meet a lock."""
    done = subprocess.run(
        [*KAIROS, *arguments], cwd=project, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, (arguments, done.stdout, done.stderr)
    assert "lock" not in done.stderr.lower(), (arguments, done.stderr)
    return done


class Load:
    """Queries sent to a server from a thread until stopped; what it acknowledged is kept."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.answers: list[dict[str, Any]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        outputs = ["user.name", "user.txn_count[7d]", "user.risk"]
        with httpx.Client(base_url=self.base, timeout=60) as http:
            i = 0
            while not self._stop.is_set():
                uid = USERS[i % 40]
                body = online_body(uid, outputs, staleness={"user.name": "0s"})
                response = http.post("/v1/query/online", json=body)
                if response.status_code != 200 or response.json()["errors"]:
                    self.failures.append(response.text)
                else:
                    self.answers.append({"uid": uid, **response.json()})
                i += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)


def test_the_cli_works_on_a_project_a_loaded_server_is_using(
    fraud_db: Path, tmp_path: Path
) -> None:
    project = copy_project(tmp_path / "fraud")
    settings = project / "kairos.yaml"  # the SQLite online store, shared by every process too
    settings.write_text(
        settings.read_text().replace(
            "online_store: memory://", "online_store: sqlite:///.kairos/online.db"
        )
    )
    week = "user.txn_count[7d]"
    with serving(project) as (base, _, output):
        load = Load(base)
        try:
            while len(load.answers) < 20 and not load.failures:
                time.sleep(0.05)
            queried = kairos(
                project,
                *("query", "--project", ".", "--json", "--in", "user.id=u0150"),
                *("--out", "user.name", "--out", week, "--now", ANCHOR.isoformat()),
            )
            assert json.loads(queried.stdout)["values"]["user.name"] == "User 150"
            start = (ANCHOR - timedelta(days=2)).isoformat()
            kairos(
                project,
                *("materialize", week, "--project", ".", "--start", start),
                *("--end", ANCHOR.isoformat(), "--every", "1d", "--keys", "u0160,u0161"),
                "--online",
            )
            spine = project / "spine.parquet"
            pq.write_table(
                pa.table({"user.id": ["u0160", "u0161", "u0160"], "ts": [ANCHOR, ANCHOR, ANCHOR]}),
                spine,
            )
            kairos(
                project,
                *("offline", "--project", ".", "--spine", str(spine), "--out", week),
                *("--output", str(project / "out.parquet"), "--stored"),
            )
            listed = kairos(project, "log", "list", "--project", ".", "--limit", "5")
            assert len(listed.stdout.splitlines()) >= 5
            shown = load.answers[0]["query_id"]
            assert shown in kairos(project, "log", "show", shown, "--project", ".").stdout
            assert "risk" in kairos(project, "models", "list", "--project", ".").stdout
            while len(load.answers) < 60 and not load.failures:
                time.sleep(0.05)
        finally:
            load.stop()
        assert load.failures == []
        # what the CLI materialized, as the server reads it from the store
        with httpx.Client(base_url=base, timeout=30) as http:
            served = http.post(
                "/v1/query/offline",
                json={
                    "spine": {"user.id": ["u0160", "u0161"], "ts": [ANCHOR.isoformat()] * 2},
                    "outputs": [week],
                    "recompute": False,
                },
            )
    assert "query log flushed" in output.read_text()
    answers = load.answers
    with kr.Client(project) as client:  # after the server: every acknowledged query is kept
        for answer in answers:
            assert client.log.get(answer["query_id"]) is not None, answer["query_id"]
        uids = sorted({a["uid"] for a in answers} | {"u0150"})
        names = client.offline_query(
            {"user.id": uids, "ts": [ANCHOR] * len(uids)}, ["user.name"], recompute=False
        ).column("user.name")
        assert names == [f"User {int(uid[1:])}" for uid in uids]  # each computed value kept
        recomputed = client.offline_query(
            {"user.id": ["u0160", "u0161"], "ts": [ANCHOR] * 2}, [week]
        ).column(week)
    stored = pq.read_table(project / "out.parquet").column(week).to_pylist()
    assert stored == [recomputed[0], recomputed[1], recomputed[0]]
    assert served.status_code == 200, served.text
    assert served.json()["columns"][week] == recomputed


EVENTS_PROJECT = """
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
    paid: Windowed[int] = windowed("7d", expression=_.payments[_.at > _.window_start].count())
    total: Windowed[float] = windowed(
        "7d", expression=_.payments[_.amount, _.at > _.window_start].sum()
    )
"""
T0 = datetime(2026, 3, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=2)


def payment(i: int, payer: str, amount: float) -> dict[str, Any]:
    return {
        "id": f"e{i}",
        "payer_id": payer,
        "amount": amount,
        "at": (T0 + timedelta(minutes=i)).isoformat(),
    }


def test_two_workers_answer_windows_over_the_events_either_was_sent(tmp_path: Path) -> None:
    project = tmp_path / "events"
    project.mkdir()
    (project / "features.py").write_text(textwrap.dedent(EVENTS_PROJECT))
    (project / "kairos.yaml").write_text("server: {host: 127.0.0.1}\n")
    payers = ["p0", "p1", "p2"]
    sent: dict[str, dict[str, Any]] = {}
    with serving(project, "--workers", "2") as (base, _, output):

        def send(rows: list[dict[str, Any]]) -> None:
            # a new connection each time: the kernel hands it to either worker
            response = httpx.post(f"{base}/v1/events/payment", json={"rows": rows}, timeout=30)
            assert response.status_code == 200, response.text
            sent.update({row["id"]: row for row in rows})

        def ask_both(payer: str) -> set[str]:
            """Ask until both workers answered; each answer must count every event sent."""
            workers: set[str] = set()
            expected = [r for r in sent.values() if r["payer_id"] == payer]
            for _ in range(200):
                response = httpx.post(
                    f"{base}/v1/query/online",
                    json={
                        "inputs": {"payer.id": payer},
                        "outputs": ["payer.paid[7d]", "payer.total[7d]"],
                        "now": NOW.isoformat(),
                    },
                    timeout=30,
                )
                assert response.status_code == 200, response.text
                body = response.json()
                assert body["values"]["payer.paid[7d]"] == len(expected), (payer, body)
                assert body["values"]["payer.total[7d]"] == pytest.approx(
                    sum(r["amount"] for r in expected)
                )
                workers.add(body["query_id"][:16])  # each worker's client has its own prefix
                if len(workers) == 2:
                    break
            return workers

        for batch in range(4):  # after the first, both workers hold an index: it must follow
            send([payment(batch * 30 + i, payers[i % 3], float(i)) for i in range(30)])
            assert all(len(ask_both(payer)) == 2 for payer in payers)
        # a correction: an event sent again under its id, to another payer
        send([{**payment(5, "p1", 500.0)}])
        assert all(len(ask_both(payer)) == 2 for payer in payers)
        # a CLI process beside them reads the same events
        queried = kairos(
            project,
            *("query", "--project", ".", "--json", "--in", "payer.id=p1"),
            *("--out", "payer.paid[7d]", "--now", NOW.isoformat()),
        )
        expected = sum(1 for r in sent.values() if r["payer_id"] == "p1")
        assert json.loads(queried.stdout)["values"]["payer.paid[7d]"] == expected
    assert output.read_text().count("query log flushed") == 2  # each worker flushed its own
