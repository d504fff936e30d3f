"""The cache never fails a query, a future `now` never poisons it, and bad inputs of one
resolver never crash the query."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

import kairos as kr
from kairos import DataFrame, FeatureTime, _, features, offline, online
from kairos.resolvers.sql import batch_text, per_key, split_parameters
from kairos.stores.online import MemoryOnlineStore

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)


@features
class Visit:
    id: str
    shop_id: "Shop.id"
    amount: float
    ts: FeatureTime


@features(max_staleness="1h")
class Shop:
    id: str
    name: str
    visits: DataFrame[Visit]
    # only an @offline resolver computes it
    audited: bool


@online
def shop_name(sid: Shop.id) -> Shop.name:
    return f"shop {sid}"


@online
def shop_visits(sid: Shop.id) -> DataFrame[Visit]:
    return DataFrame([{"id": "v1", "shop_id": sid, "amount": 3.0, "ts": NOW - timedelta(days=1)}])


@offline
def audited(sid: Shop.id) -> Shop.audited:
    return str(sid)[0] == "s"


@online
def big_visits(visits: Shop.visits[_.amount > "x"]) -> Shop.audited:  # compares float to str
    return len(visits) > 0


DEFINITIONS = [Visit, Shop, shop_name, shop_visits, audited]


@pytest.fixture
def store() -> MemoryOnlineStore:
    return MemoryOnlineStore()


@pytest.fixture
def client(store: MemoryOnlineStore) -> Iterator[kr.Client]:
    with kr.Client(definitions=DEFINITIONS, online_store=store) as client:
        yield client


def test_an_unreachable_online_store_is_a_cache_miss_not_an_error() -> None:
    with kr.Client(definitions=DEFINITIONS, online_store="redis://127.0.0.1:1/0") as client:
        result = client.query({"shop.id": "s1"}, ["shop.name"], now=NOW)
    assert result.errors == []
    assert result.get_value("shop.name") == "shop s1"
    statuses = {t.label: t.status for t in result.trace if t.kind == "cache"}
    assert statuses == {"online store read": "error", "online store write": "error"}


def test_a_future_now_never_writes_the_cache(client: kr.Client, store: MemoryOnlineStore) -> None:
    future = datetime.now(UTC) + timedelta(days=365)
    client.query({"shop.id": "s1"}, ["shop.name"], now=future)
    assert len(store) == 0
    client.query({"shop.id": "s1"}, ["shop.name"])
    assert len(store) == 1


def test_a_cached_value_counts_once(client: kr.Client) -> None:
    client.query({"shop.id": "s1"}, ["shop.name"], now=NOW)
    again = client.query({"shop.id": "s1"}, ["shop.name"], now=NOW + timedelta(minutes=1))
    assert again.meta.cache_hits == 1


def test_a_has_many_filter_that_fails_is_that_feature_s_error() -> None:
    with kr.Client(definitions=[Visit, Shop, shop_name, shop_visits, big_visits]) as client:
        result = client.query({"shop.id": "s1"}, ["shop.audited", "shop.name"], now=NOW)
    [error] = result.errors
    assert error.feature == "shop.audited" and error.code == "resolver_error"
    assert "preparing the inputs of 'big_visits' failed: TypeError" in error.message
    assert result.get_value("shop.name") == "shop s1"


def test_offline_queries_use_offline_resolvers(client: kr.Client) -> None:
    with pytest.raises(kr.NoPath):
        client.query({"shop.id": "s1"}, ["shop.audited"], now=NOW)
    result = client.offline_query({"shop.id": ["s1", "x2"], "ts": [NOW, NOW]}, ["shop.audited"])
    assert result.column("shop.audited") == [True, False]


@pytest.mark.parametrize(
    "sql",
    [
        "select user_id as id, count(*) as n from t where user_id = :id",
        "select id, name from t where id = :id limit 1",
        "select distinct id, name from t where id = :id",
        "select id, sum(amount) over (partition by id) as s from t where id = :id",
        "select id, name from t where id = :id union select id, name from u where id = :id",
    ],
)
def test_statements_over_the_whole_result_are_never_pushed_down(sql: str) -> None:
    assert not per_key(sql)
    assert batch_text(split_parameters(sql), "id") is None


def test_plain_lookups_are_pushed_down() -> None:
    sql = "select id, name, 'count' as label from users where id = :id"
    assert per_key(sql)
    assert batch_text(split_parameters(sql), "id") is not None
