"""Fixtures for the dashboard tests: the fraud example served in process, as the server tests
serve it (the real ASGI app over a real client and SQLite files)."""

from tests.server.conftest import anyio_backend, app, client, fraud_db, http

__all__ = ["anyio_backend", "app", "client", "fraud_db", "http"]
