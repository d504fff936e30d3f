"""A kairos.Client serves cached values from every online-store backend, as the engine decides.

The store only keeps the newest value; the engine serves it while now - observed_at is within
max_staleness (1m here) and recomputes after.
"""

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

import kairos as kr
from kairos import DataFrame, Features, FeatureTime, features, online
from kairos.errors import KairosError
from kairos.stores import StoredValue
from tests.stores.conftest import OnlineBackend

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
JOINED = datetime(2020, 5, 1, 9, 30, tzinfo=UTC)


@features
class Purchase:
    id: str
    member_id: "Member.id"
    amount: float
    ts: FeatureTime


@features(max_staleness="1m")
class Member:
    id: str
    name: str
    joined: datetime
    tags: list[str]
    purchases: DataFrame[Purchase]


class Counted:
    """Resolvers that count their calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

        @online
        def profile(mid: Member.id) -> Features[Member.name, Member.joined, Member.tags]:
            with self.lock:
                self.calls += 1
            return ("Ann", JOINED, ["gold", "early"])

        @online
        def purchases(mid: Member.id) -> DataFrame[Purchase]:
            return DataFrame(
                [
                    {"id": "p1", "member_id": mid, "amount": 5.0, "ts": NOW - timedelta(hours=1)},
                    {"id": "p2", "member_id": mid, "amount": 7.5, "ts": NOW - timedelta(days=2)},
                ]
            )

        self.definitions = [Member, Purchase, profile, purchases]


@pytest.fixture
def counted() -> Counted:
    return Counted()


@pytest.fixture
def make_client(counted: Counted) -> Iterator[list[kr.Client]]:
    clients: list[kr.Client] = []
    yield clients
    for client in clients:
        client.close()


def open_client(clients: list[kr.Client], counted: Counted, store: object) -> kr.Client:
    client = kr.Client(definitions=counted.definitions, online_store=store)  # type: ignore[arg-type]
    clients.append(client)
    return client


def ask(client: kr.Client, at: datetime) -> kr.QueryResult:
    return client.query(input={Member.id: "m1"}, output=[Member.name], now=at)


def test_a_cached_value_is_served_within_max_staleness(
    store_url: str, counted: Counted, make_client: list[kr.Client]
) -> None:
    client = open_client(make_client, counted, store_url)

    first = ask(client, NOW)
    second = ask(client, NOW + timedelta(seconds=30))
    stale = ask(client, NOW + timedelta(minutes=2))

    assert first.meta.cache_hits == 0
    assert first.features["member.name"].source != "cache"
    assert second.meta.cache_hits == 1
    assert second.features["member.name"].source == "cache"
    assert second.features["member.name"].observed_at == NOW
    assert second.values == {"member.name": "Ann"}
    assert stale.meta.cache_hits == 0
    assert counted.calls == 2


def test_cached_values_keep_their_types(
    store_url: str, counted: Counted, make_client: list[kr.Client]
) -> None:
    client = open_client(make_client, counted, store_url)
    outputs = [Member.name, Member.joined, Member.tags, Member.purchases]

    first = client.query(input={Member.id: "m1"}, output=outputs, now=NOW)
    second = client.query(input={Member.id: "m1"}, output=outputs, now=NOW + timedelta(seconds=5))

    assert second.meta.cache_hits == 4
    assert second.values == first.values
    assert type(second.get_value(Member.joined)) is datetime
    assert second.get_value(Member.tags) == ["gold", "early"]
    rows = second.get_value(Member.purchases)
    assert [type(row["ts"]) for row in rows] == [datetime, datetime]


def test_a_store_object_is_used_and_closed_by_the_client(
    online_backend: OnlineBackend, counted: Counted, make_client: list[kr.Client]
) -> None:
    client = open_client(make_client, counted, online_backend.store)

    ask(client, NOW)
    cached = ask(client, NOW + timedelta(seconds=30))
    found = online_backend.run(online_backend.store.get([("member", "m1", "name")]))
    make_client.pop().close()

    assert cached.features["member.name"].source == "cache"
    assert found == [StoredValue("Ann", NOW)]
    if online_backend.name != "memory":  # a memory store has nothing to close
        with pytest.raises(KairosError, match="closed"):
            online_backend.run(online_backend.store.get([("member", "m1", "name")]))


def test_a_new_client_on_the_same_url_finds_the_cache(
    store_url: str, counted: Counted, make_client: list[kr.Client]
) -> None:
    if store_url.startswith("memory:"):
        pytest.skip("memory stores keep nothing across clients")
    ask(open_client(make_client, counted, store_url), NOW)
    make_client.pop().close()

    cached = ask(open_client(make_client, counted, store_url), NOW + timedelta(seconds=30))

    assert cached.features["member.name"].source == "cache"
    assert counted.calls == 1


def test_a_client_used_from_many_threads_shares_one_store(
    store_url: str, counted: Counted, make_client: list[kr.Client]
) -> None:
    client = open_client(make_client, counted, store_url)
    ask(client, NOW)

    # each thread runs the client's queries on its own event loop
    with ThreadPoolExecutor(4) as threads:
        results = list(threads.map(lambda s: ask(client, NOW + timedelta(seconds=s)), range(8)))

    assert all(r.features["member.name"].source == "cache" for r in results)
    assert counted.calls == 1


def test_a_store_works_from_a_loop_running_in_another_thread(
    online_backend: OnlineBackend,
) -> None:
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever)
    thread.start()
    try:
        item = (("member", "m1", "name"), StoredValue("Ann", NOW))
        asyncio.run_coroutine_threadsafe(online_backend.store.put([item]), other).result(5)
        found = online_backend.run(online_backend.store.get([("member", "m1", "name")]))
        assert found == [StoredValue("Ann", NOW)]
        # closed from this thread's loop while the other loop still runs
        online_backend.run(online_backend.store.close())
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join()
        other.close()
