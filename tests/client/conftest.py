"""Fixtures shared by the client tests: the engines offline queries and backfills run on, and
one client that is embedded or remote."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

import kairos as kr
from examples.fraud.generate import generate
from kairos.client import ray_engine
from kairos.project.config import ServerConfig
from kairos.server import create_app
from tests.gateway.fake_upstream import ServerThread
from tests.server.fraud import DB, copy_project


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """Ray on this machine with two worker CPUs, started once for a test module."""
    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


@pytest.fixture(params=["local", "ray"])
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """What recomputes: this process, or Ray workers (with parts of a few rows, so that
    even a small spine is split across both workers)."""
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
        monkeypatch.setattr(ray_engine, "ROWS_PER_PART", 8)
    return str(request.param)


# --- one client, embedded or remote: the same test body runs against both -------------------

REMOTE_KEY = "remote-test-key"


@pytest.fixture(scope="session")
def fraud_db() -> Path:
    """The fraud example's seeded SQLite file (and its trained model), written once per run."""
    return generate(DB)


@pytest.fixture
def embedded(fraud_db: Path, tmp_path: Path) -> Iterator[kr.Client]:
    """An embedded client on a copy of the fraud example (its data, models and query log are
    this test's own: alias moves and logged queries reach no other test)."""
    with kr.Client(copy_project(tmp_path / "fraud")) as client:
        client.models.warm()  # as `kairos serve` does: a cold model load is not a 5 s timeout
        yield client


@pytest.fixture
def served(embedded: kr.Client) -> Iterator[ServerThread]:
    """`embedded` served over HTTP by uvicorn on a free port, with a bearer key."""
    app = create_app(embedded, ServerConfig(keys=(REMOTE_KEY,)))
    with ServerThread(app) as server:
        yield server


@pytest.fixture(params=["embedded", "remote"])
def any_client(request: pytest.FixtureRequest, embedded: kr.Client) -> Iterator[Any]:
    """The embedded client, or a remote one (`kr.Client(url=...)`) of a server over it."""
    if request.param == "embedded":
        yield embedded
        return
    server = request.getfixturevalue("served")
    with kr.Client(url=server.url, key=REMOTE_KEY) as remote:
        yield remote
