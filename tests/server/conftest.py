"""Fixtures for the HTTP server tests: the fraud example served in process (the real ASGI app
over a real client and SQLite file, called through httpx), always closed."""

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette

import kairos as kr
from examples.fraud.generate import generate
from kairos.server import create_app
from tests.server.fraud import DB, PROJECT


@pytest.fixture(scope="session")
def fraud_db() -> Path:
    """The example's seeded SQLite file, written once per run."""
    return generate(DB)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def client(fraud_db: Path, tmp_path: Path) -> Iterator[kr.Client]:
    """A client on the example project; its query log is a file of this test's own, so a test
    reads back only the queries it made."""
    with kr.Client(PROJECT, query_log=f"sqlite:///{tmp_path / 'query_log.db'}") as client:
        client.models.warm()  # as `kairos serve` does: a cold model load is not a 5 s timeout
        yield client


@pytest.fixture
def app(client: kr.Client) -> Starlette:
    return create_app(client)


@pytest.fixture
async def http(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    # this machine's name: without keys the server answers no other Host (DNS rebinding)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
        yield http
