"""`online_store_from_url`: the scheme picks the backend; a bad URL is named, its secret not."""

import asyncio
from pathlib import Path

import pytest

from kairos.errors import KairosError
from kairos.stores import (
    MemoryOnlineStore,
    OnlineStore,
    RedisOnlineStore,
    SQLiteOnlineStore,
    online_store_from_url,
    redact_url,
)
from tests.conftest import REDIS_URL


def close(store: OnlineStore) -> None:
    asyncio.run(store.close())


def test_memory_url() -> None:
    store = online_store_from_url("memory://")
    assert isinstance(store, MemoryOnlineStore)
    close(store)


def test_sqlite_url_with_a_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = online_store_from_url("sqlite:///state/online.db")
    try:
        assert isinstance(store, SQLiteOnlineStore)
        assert (tmp_path / "state" / "online.db").is_file()
    finally:
        close(store)


def test_sqlite_url_with_an_absolute_path(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "online.db"
    store = online_store_from_url(f"sqlite:///{path}")  # sqlite:////tmp/... for /tmp/...
    try:
        assert isinstance(store, SQLiteOnlineStore)
        assert path.is_file()
    finally:
        close(store)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:online.db"])
def test_sqlite_url_without_a_file(url: str) -> None:
    with pytest.raises(KairosError, match="names no file"):
        online_store_from_url(url)


def test_redis_url_with_a_prefix() -> None:
    store = online_store_from_url(f"{REDIS_URL}?prefix=test123")
    try:
        assert isinstance(store, RedisOnlineStore)
        assert store.prefix == "test123"
        assert store.entity_key("user", "u1") == 'test123:user:"u1"'
        assert store.entity_key("user", 1) == "test123:user:1"
    finally:
        close(store)


def test_redis_url_default_prefix() -> None:
    store = online_store_from_url("rediss://cache.internal:6380/2")
    assert isinstance(store, RedisOnlineStore)
    assert store.entity_key("user", "u1") == 'kairos:user:"u1"'
    close(store)  # never connected: nothing to close, and no error


def test_an_unsupported_scheme_is_named_and_the_password_redacted() -> None:
    with pytest.raises(KairosError) as raised:
        online_store_from_url("postgresql://kairos:hunter2@db:5432/features")
    message = str(raised.value)
    assert "'postgresql'" in message
    assert "hunter2" not in message
    assert "kairos:***@db:5432" in message
    for supported in ("memory://", "sqlite:///", "redis://"):
        assert supported in message


def test_a_url_without_a_scheme() -> None:
    with pytest.raises(KairosError, match="no scheme"):
        online_store_from_url("online.db")


def test_a_bad_redis_url_fails_at_once_without_its_password() -> None:
    with pytest.raises(KairosError) as raised:
        online_store_from_url("redis://app:hunter2@cache:notaport/0")
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        ("redis://app:s3cret@cache:6379/0", "redis://app:***@cache:6379/0"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("redis://s3cret@cache:6379/0", "redis://***@cache:6379/0"),
        ("app:s3cret@cache:6379", "app:***@cache:6379"),
        (
            "postgresql://db/x?sslmode=require&password=s3cret",
            "postgresql://db/x?sslmode=require&password=***",
        ),
        ("redis://cache:6379/0?prefix=p", "redis://cache:6379/0?prefix=p"),
    ],
)
def test_redact_url(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted
