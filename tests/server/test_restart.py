"""`kairos serve` as a real process over real HTTP: queries it acknowledged survive a SIGKILL,
and a SIGTERM flushes the query log on the way out without being asked to."""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.fraud import USERS, copy_project, online_body

pytestmark = pytest.mark.slow

OUTPUTS = ["user.name", "user.txn_count[7d]", "user.risk"]
SERVE = [sys.executable, "-m", "kairos.cli", "serve"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    """One `python -m kairos.cli serve` process and an HTTP client to it."""

    def __init__(self, project: Path, output: Path) -> None:
        self.port = free_port()
        self.output = output
        with output.open("ab") as sink:
            self.process = subprocess.Popen(
                [*SERVE, str(project), "--port", str(self.port)],
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=project,
            )
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"kairos serve exited early:\n{self.output.read_text()}")
            try:
                if self.http.get("/readyz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"kairos serve not ready in {timeout}s:\n{self.output.read_text()}")

    def query(self, uid: str) -> dict[str, Any]:
        response = self.http.post("/v1/query/online", json=online_body(uid, OUTPUTS))
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        assert body["errors"] == []
        return body

    def stop(self, signal_number: int) -> int:
        os.kill(self.process.pid, signal_number)
        return self.process.wait(timeout=30)

    def close(self) -> None:
        self.http.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


@contextmanager
def served(project: Path) -> Iterator[Served]:
    server = Served(project, project.parent / "server.out")
    try:
        server.wait_ready()
        yield server
    finally:
        server.close()


def assert_logged_as_served(server: Served, queries: list[dict[str, Any]]) -> None:
    for query in queries:
        response = server.http.get(f"/v1/log/{query['query_id']}")
        assert response.status_code == 200, (query["query_id"], response.text)
        logged = response.json()
        assert logged["now"] == query["now"]
        for name, feature in query["features"].items():
            out = logged["outputs"][name]
            assert (out["value"], out["source"]) == (feature["value"], feature["source"]), name


def test_acknowledged_queries_survive_a_sigkill(fraud_db: Path, tmp_path: Path) -> None:
    project = copy_project(tmp_path / "fraud")
    with served(project) as server:
        queries = [server.query(uid) for uid in USERS[:50]]
        # `get` flushes what was appended before it: the last query's record, and every
        # earlier one, is committed once this answers
        assert server.http.get(f"/v1/log/{queries[-1]['query_id']}").status_code == 200
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL

    assert len({q["query_id"] for q in queries}) == 50
    with served(project) as again:
        assert_logged_as_served(again, queries)


def test_a_sigterm_flushes_the_log_without_being_asked(fraud_db: Path, tmp_path: Path) -> None:
    project = copy_project(tmp_path / "fraud")
    with served(project) as server:
        queries = [server.query(uid) for uid in USERS[50:70]]
        # uvicorn shuts down gracefully, then re-raises the signal it caught
        assert server.stop(signal.SIGTERM) in (0, -signal.SIGTERM)
    assert "query log flushed" in (tmp_path / "server.out").read_text()

    with served(project) as again:
        assert_logged_as_served(again, queries)
