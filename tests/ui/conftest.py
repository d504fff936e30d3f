"""Fixtures for the dashboard tests: the fraud example served in process, as the server tests
serve it (the real ASGI app over a real client and SQLite files), asked for by a browser on
this machine (`Host: localhost`: without keys the dashboard answers no other host)."""

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from tests.server.conftest import anyio_backend, app, client, fraud_db

__all__ = ["anyio_backend", "app", "client", "fraud_db", "http"]


@pytest.fixture
async def http(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        yield http
