"""What only the Redis store does: its key layout, script loading, bad data, no server."""

import asyncio
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis

from kairos.stores import RedisOnlineStore, StoredValue
from kairos.stores.online.redis import OnlineStoreUnavailable
from tests.conftest import REDIS_URL, delete_redis_prefix, needs_redis

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)

pytestmark = needs_redis()


@pytest.fixture
def prefix() -> Iterator[str]:
    name = f"kairos-test-{uuid.uuid4().hex}"
    yield name
    delete_redis_prefix(name)


@pytest.fixture
def raw() -> Iterator["redis.Redis"]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


def test_one_hash_per_entity_one_field_per_feature(prefix: str, raw: "redis.Redis") -> None:
    async def write() -> None:
        store = RedisOnlineStore(f"{REDIS_URL}?prefix={prefix}")
        try:
            await store.put(
                [
                    (("user", "u1", "name"), StoredValue("Ann", T0)),
                    (("user", "u1", "tags"), StoredValue(["a"], T0)),
                    (("user", 7, "name"), StoredValue("Bo", T0)),
                ]
            )
        finally:
            await store.close()

    asyncio.run(write())

    assert sorted(raw.scan_iter(match=f"{prefix}:*")) == [
        f'{prefix}:user:"u1"'.encode(),
        f"{prefix}:user:7".encode(),
    ]
    fields = raw.hgetall(f'{prefix}:user:"u1"')
    assert sorted(fields) == [b"name", b"tags"]
    # observed_at as 18 digits (microseconds since 0001-01-01 UTC), then the codec's bytes
    assert fields[b"name"] == b"063903643200000000" + b'"Ann"'


def test_puts_load_the_script_when_redis_has_forgotten_it(prefix: str, raw: "redis.Redis") -> None:
    async def run() -> list[StoredValue | None]:
        store = RedisOnlineStore(REDIS_URL, prefix=prefix)
        try:
            await store.put([(("user", "u1", "name"), StoredValue("Ann", T0))])
            raw.script_flush()
            await store.put([(("user", "u1", "name"), StoredValue("Bo", T0))])
            return await store.get([("user", "u1", "name")])
        finally:
            await store.close()

    assert asyncio.run(run()) == [StoredValue("Bo", T0)]


@pytest.mark.parametrize(
    "garbage", [b"not kairos data", b"063903643200000000{no", b"06390364320000000"]
)
def test_unreadable_data_is_a_miss_and_the_next_put_replaces_it(
    prefix: str, raw: "redis.Redis", garbage: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    raw.hset(f'{prefix}:user:"u1"', "name", garbage)

    async def run() -> tuple[list[StoredValue | None], list[StoredValue | None]]:
        store = RedisOnlineStore(REDIS_URL, prefix=prefix)
        try:
            missed = await store.get([("user", "u1", "name")])
            await store.put([(("user", "u1", "name"), StoredValue("Ann", T0))])
            return missed, await store.get([("user", "u1", "name")])
        finally:
            await store.close()

    missed, replaced = asyncio.run(run())

    assert missed == [None]
    assert "unreadable" in caplog.text
    assert replaced == [StoredValue("Ann", T0)]


def test_prefixes_keep_stores_apart(prefix: str) -> None:
    async def run() -> list[StoredValue | None]:
        mine = RedisOnlineStore(REDIS_URL, prefix=prefix)
        theirs = RedisOnlineStore(REDIS_URL, prefix=f"{prefix}-other")
        try:
            await theirs.put([(("user", "u1", "name"), StoredValue("theirs", T0))])
            return await mine.get([("user", "u1", "name")])
        finally:
            await mine.close()
            await theirs.close()
            delete_redis_prefix(f"{prefix}-other")

    assert asyncio.run(run()) == [None]


def test_an_unreachable_server_is_named_without_its_password() -> None:
    async def run() -> None:
        store = RedisOnlineStore("redis://app:hunter2@127.0.0.1:1/0")
        try:
            with pytest.raises(OnlineStoreUnavailable) as raised:
                await store.get([("user", "u1", "name")])
            message = str(raised.value)
            assert "127.0.0.1:1" in message
            assert "hunter2" not in message
            with pytest.raises(OnlineStoreUnavailable):
                await store.put([(("user", "u1", "name"), StoredValue("Ann", T0))])
        finally:
            await store.close()

    asyncio.run(run())
