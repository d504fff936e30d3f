"""Fixtures for the model tests: a model store over a real registry (SQLite file, and
PostgreSQL at 127.0.0.1:5432 when it is there, in a schema of the test's own) and a local
artifact volume."""

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
from psycopg import sql

from kairos.models import ArtifactVolume, ModelStore, model_registry_from_url
from tests.conftest import POSTGRES_URL, need_postgres


@pytest.fixture(params=["sqlite", "postgres"])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'models.db'}"
        return
    need_postgres()
    url = POSTGRES_URL
    # a schema of the test's own: the registry's tables have fixed names, and tests run at once
    schema = f"kairos_models_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("create schema {}").format(sql.Identifier(schema)))
    yield f"{url}?options=-csearch_path%3D{schema}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("drop schema {} cascade").format(sql.Identifier(schema)))


@pytest.fixture
def store(registry_url: str, tmp_path: Path) -> Iterator[ModelStore]:
    store = ModelStore(model_registry_from_url(registry_url), ArtifactVolume(tmp_path / "vol"))
    yield store
    store.close()


@pytest.fixture
def local_store(tmp_path: Path) -> Iterator[ModelStore]:
    store = ModelStore(
        model_registry_from_url(f"sqlite:///{tmp_path / 'models.db'}"),
        ArtifactVolume(tmp_path / "vol"),
    )
    yield store
    store.close()


@pytest.fixture(scope="session")
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(300, 4))
    y = (x[:, 0] + 0.5 * x[:, 1] - x[:, 2] > 0).astype(int)
    return x, y
