"""Fixtures shared by the client tests: the engines offline queries and backfills run on."""

from collections.abc import Iterator

import pytest
import ray

from kairos.client import ray_engine


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
