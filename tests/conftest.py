"""What the whole suite shares: the services kairos is tested against where this machine has
them (PostgreSQL, Redis, NATS JetStream, Debian's chromium), each declared once with its probe.

A test that needs one takes its fixture (`postgres_url`, `redis_url`, `nats_url`), calls
`need_postgres()` and the like, or marks its module with `needs_postgres()` and the like: the
test is skipped, naming the address, where the service is not running. The probes are cached
per process, so under pytest-xdist each worker asks once.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

import psycopg
import pytest
import redis

POSTGRES_SERVER = "postgresql://postgres@127.0.0.1:5432"  # + "/<database>"
POSTGRES_URL = f"{POSTGRES_SERVER}/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
NATS_URL = "nats://127.0.0.1:4222"
CHROMIUM = Path("/usr/bin/chromium")  # Debian's; Playwright never downloads one here


@functools.cache
def postgres_available() -> bool:
    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=3).close()
    except psycopg.Error:
        return False
    return True


@functools.cache
def redis_available() -> bool:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


@functools.cache
def nats_available() -> bool:
    """A NATS server greets a new connection with its INFO line."""
    try:
        with socket.create_connection(("127.0.0.1", 4222), timeout=1) as sock:
            return sock.recv(4).startswith(b"INFO")
    except OSError:
        return False


def need_postgres() -> None:
    if not postgres_available():
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_URL}")


def need_redis() -> None:
    if not redis_available():
        pytest.skip(f"Redis is not reachable at {REDIS_URL}")


def need_nats() -> None:
    if not nats_available():
        pytest.skip(f"NATS is not reachable at {NATS_URL}")


def need_chromium() -> None:
    """Skip where no chromium is installed, except under CI, where `make test` installs it."""
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install chromium` (make test does, as root)")


def needs_postgres() -> pytest.MarkDecorator:
    """A module's `pytestmark`: its tests skip where PostgreSQL is not running."""
    return pytest.mark.skipif(not postgres_available(), reason=f"no PostgreSQL at {POSTGRES_URL}")


def needs_redis() -> pytest.MarkDecorator:
    """A module's `pytestmark`: its tests skip where Redis is not running."""
    return pytest.mark.skipif(not redis_available(), reason=f"no Redis at {REDIS_URL}")


def delete_redis_prefix(prefix: str) -> None:
    """Delete every key under `prefix:` (a test's own prefix) from the shared Redis."""
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture
def postgres_url() -> str:
    """The shared PostgreSQL's database `test` (a test makes its own schema or tables there)."""
    need_postgres()
    return POSTGRES_URL


@pytest.fixture
def redis_url() -> str:
    """The shared Redis (a test keeps its keys under a prefix of its own)."""
    need_redis()
    return REDIS_URL


@pytest.fixture
def nats_url() -> str:
    """The shared NATS JetStream (a test uses subjects of its own)."""
    need_nats()
    return NATS_URL
