"""The online-store contract, one test body per behaviour, run on every backend.

A store keeps, per (namespace, key, feature), the value with the newest observed_at it was
given (an equal observed_at replaces; an older one never does) and gives values back exactly
as they were put: same types, and copies the caller may change.
"""

import asyncio
import random
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from kairos.stores import StoredValue
from kairos.stores.online import StoreKey
from tests.stores.conftest import OnlineBackend

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)

EVERY_TYPE: dict[str, Any] = {
    "none": None,
    "true": True,
    "false": False,
    "int": 42,
    "negative_int": -7,
    "big_int": 2**80,
    "float": 0.1,
    "whole_float": 3.0,
    "infinite_float": float("-inf"),
    "str": "Ann ✓",
    "empty_str": "",
    "dollar_str": "$dt",
    "datetime": datetime(2026, 1, 9, 8, 30, 15, 123456, tzinfo=UTC),
    "date": date(2026, 1, 9),
    "time": time(8, 30),
    "timedelta": timedelta(days=-1, seconds=5, microseconds=7),
    "decimal": Decimal("10.50"),
    "bytes": b"\x00\xff",
    "list": [1, "a", None, 2.5, [True]],
    "tuple": (1, "a"),
    "dict": {"a": 1, "b": [date(2026, 1, 1)], "$dt": "not a tag"},
    "int_keyed_dict": {1: "one", 2: "two"},
    "rows": [
        {"id": "t1", "amount": 5.0, "ts": datetime(2026, 1, 9, tzinfo=UTC), "ok": True},
        {"id": "t2", "amount": 7, "ts": datetime(2026, 1, 8, tzinfo=UTC), "ok": None},
    ],
    "empty_rows": [],
}


def same(a: Any, b: Any) -> bool:
    """Equal, and of the same type all the way down (1 == 1.0 == True is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def key(name: str, entity: Any = "u1", namespace: str = "user") -> StoreKey:
    return (namespace, entity, name)


def test_every_value_type_round_trips(online_backend: OnlineBackend) -> None:
    items = [(key(name), StoredValue(value, T0)) for name, value in EVERY_TYPE.items()]
    online_backend.put(items)

    found = online_backend.get([k for k, _ in items])

    for (k, stored), got in zip(items, found, strict=True):
        assert got is not None, k
        assert same(got.value, stored.value), (k, got.value)
        assert got.observed_at == T0


def test_missing_keys_are_none(online_backend: OnlineBackend) -> None:
    online_backend.put([(key("name"), StoredValue("Ann", T0))])

    found = online_backend.get(
        [key("balance"), key("name", "u2"), key("name", namespace="account"), key("name")]
    )

    assert found == [None, None, None, StoredValue("Ann", T0)]
    assert online_backend.get([]) == []


def test_newer_value_replaces_older(online_backend: OnlineBackend) -> None:
    online_backend.put([(key("name"), StoredValue("old", T0))])
    online_backend.put([(key("name"), StoredValue("new", T0 + timedelta(seconds=1)))])

    assert online_backend.get([key("name")]) == [StoredValue("new", T0 + timedelta(seconds=1))]


def test_older_value_never_replaces_newer(online_backend: OnlineBackend) -> None:
    newest = T0 + timedelta(microseconds=1)  # the smallest step still counts
    online_backend.put([(key("name"), StoredValue("new", newest))])
    online_backend.put([(key("name"), StoredValue("old", T0))])
    online_backend.put([(key("name"), StoredValue("ancient", datetime(1, 1, 1, tzinfo=UTC)))])

    assert online_backend.get([key("name")]) == [StoredValue("new", newest)]


def test_equal_observed_at_replaces(online_backend: OnlineBackend) -> None:
    online_backend.put([(key("name"), StoredValue("first", T0))])
    online_backend.put([(key("name"), StoredValue("second", T0))])

    assert online_backend.get([key("name")]) == [StoredValue("second", T0)]


@pytest.mark.parametrize("order", [[2, 0, 3, 1], [3, 2, 1, 0], [0, 1, 2, 3]])
def test_duplicates_in_one_batch_keep_the_newest(
    online_backend: OnlineBackend, order: list[int]
) -> None:
    batch = [(key("name"), StoredValue(f"v{i}", T0 + timedelta(minutes=i))) for i in order]
    batch.append((key("other"), StoredValue("x", T0)))

    online_backend.put(batch)

    assert online_backend.get([key("name"), key("other")]) == [
        StoredValue("v3", T0 + timedelta(minutes=3)),
        StoredValue("x", T0),
    ]


def test_older_values_in_a_batch_do_not_replace_stored_newer_ones(
    online_backend: OnlineBackend,
) -> None:
    later = T0 + timedelta(hours=1)
    online_backend.put([(key("a"), StoredValue("stored", later))])

    online_backend.put([(key("a"), StoredValue("older", T0)), (key("b"), StoredValue("fresh", T0))])

    assert online_backend.get([key("a"), key("b")]) == [
        StoredValue("stored", later),
        StoredValue("fresh", T0),
    ]


def test_many_keys_in_one_get(online_backend: OnlineBackend) -> None:
    features = ["name", "balance", "score", "tags"]
    items = [
        (key(name, f"u{i}"), StoredValue([i, name], T0 + timedelta(seconds=i)))
        for i in range(500)
        for name in features
    ]
    online_backend.put(items)
    wanted = [k for k, _ in items]
    random.Random(7).shuffle(wanted)
    wanted += [key("name", "nobody"), key("name", "u3"), key("missing", "u3")]  # + a duplicate

    found = online_backend.get(wanted)

    assert len(found) == 2003
    for (_, entity, name), got in zip(wanted[:2000], found[:2000], strict=True):
        i = int(str(entity)[1:])
        assert got == StoredValue([i, name], T0 + timedelta(seconds=i)), (entity, name)
    assert found[2000:] == [None, StoredValue([3, "name"], T0 + timedelta(seconds=3)), None]


def test_int_and_str_keys_are_distinct(online_backend: OnlineBackend) -> None:
    online_backend.put(
        [
            (key("name", 1), StoredValue("int key", T0)),
            (key("name", "1"), StoredValue("str key", T0)),
        ]
    )

    found = online_backend.get([key("name", 1), key("name", "1"), key("name", 2)])

    assert found == [StoredValue("int key", T0), StoredValue("str key", T0), None]


def test_namespaces_and_features_are_separate(online_backend: OnlineBackend) -> None:
    online_backend.put(
        [
            (("user", "k1", "name"), StoredValue("user name", T0)),
            (("account", "k1", "name"), StoredValue("account name", T0)),
            (("user", "k1", "nickname"), StoredValue("nick", T0)),
        ]
    )

    found = online_backend.get(
        [("account", "k1", "name"), ("user", "k1", "nickname"), ("user", "k1", "name")]
    )

    assert [f.value if f else None for f in found] == ["account name", "nick", "user name"]


def test_values_are_copies(online_backend: OnlineBackend) -> None:
    rows: list[dict[str, Any]] = [{"id": "t1", "tags": ["a"]}]
    online_backend.put([(key("rows"), StoredValue(rows, T0))])
    rows[0]["tags"].append("changed after put")

    (first,) = online_backend.get([key("rows")])
    assert first is not None
    first.value[0]["tags"].append("changed after get")
    first.value.append({"id": "t2"})
    (second,) = online_backend.get([key("rows")])

    assert second == StoredValue([{"id": "t1", "tags": ["a"]}], T0)


def test_observed_at_is_an_equal_aware_instant(online_backend: OnlineBackend) -> None:
    plus_two = datetime(2026, 1, 10, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    online_backend.put([(key("name"), StoredValue("Ann", plus_two))])

    (found,) = online_backend.get([key("name")])

    assert found is not None
    assert found.observed_at == T0
    assert found.observed_at.utcoffset() is not None


def test_concurrent_puts_end_with_the_newest(online_backend: OnlineBackend) -> None:
    puts = [(key("counter"), StoredValue(i, T0 + timedelta(milliseconds=i))) for i in range(50)]
    random.Random(11).shuffle(puts)

    async def put_all() -> None:
        await asyncio.gather(*(online_backend.store.put([item]) for item in puts))

    online_backend.run(put_all())

    assert online_backend.get([key("counter")]) == [
        StoredValue(49, T0 + timedelta(milliseconds=49))
    ]


def test_concurrent_puts_from_two_stores_end_with_the_newest(online_backend: OnlineBackend) -> None:
    if online_backend.name == "memory":
        pytest.skip("memory stores do not share data")
    other = online_backend.open()
    puts = [(key("counter"), StoredValue(i, T0 + timedelta(milliseconds=i))) for i in range(50)]
    random.Random(5).shuffle(puts)

    async def put_all() -> None:
        await asyncio.gather(
            *((online_backend.store if i % 2 else other).put([item]) for i, item in enumerate(puts))
        )

    online_backend.run(put_all())

    assert online_backend.run(other.get([key("counter")])) == [
        StoredValue(49, T0 + timedelta(milliseconds=49))
    ]


def test_a_new_store_on_the_same_url_sees_the_values(online_backend: OnlineBackend) -> None:
    if online_backend.name == "memory":
        pytest.skip("memory stores keep nothing after they close")
    online_backend.put([(key("name"), StoredValue(["Ann"], T0))])

    reopened = online_backend.open()

    assert online_backend.run(reopened.get([key("name")])) == [StoredValue(["Ann"], T0)]
