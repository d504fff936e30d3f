"""Independent plan nodes run concurrently; a node starts only once what it reads is done."""

import asyncio
import time
from datetime import UTC, datetime

import kairos as kr
from kairos import features, online
from tests.engine.conftest import MakeClient

NOW = datetime(2026, 1, 10, tzinfo=UTC)
SLEEP = 0.1
# Two sleeps of SLEEP run one after the other would take at least 2 * SLEEP.
CONCURRENT_LIMIT = 0.18


@features
class Account:
    id: str
    score_a: float
    score_b: float
    combined: float


def timing(result: kr.QueryResult, label: str) -> kr.NodeTiming:
    (found,) = [t for t in result.trace if t.label == label]
    return found


def test_two_sync_resolvers_sleep_concurrently(make_client: MakeClient) -> None:
    @online
    def slow_a(aid: Account.id) -> Account.score_a:
        time.sleep(SLEEP)
        return 1.0

    @online
    def slow_b(aid: Account.id) -> Account.score_b:
        time.sleep(SLEEP)
        return 2.0

    client = make_client(Account, slow_a, slow_b)
    started = time.perf_counter()
    result = client.query(
        input={Account.id: "a1"}, output=[Account.score_a, Account.score_b], now=NOW
    )
    elapsed = time.perf_counter() - started

    assert result.values == {"account.score_a": 1.0, "account.score_b": 2.0}
    assert result.errors == []
    assert elapsed < CONCURRENT_LIMIT, f"sync resolvers ran one after the other ({elapsed:.3f}s)"
    a, b = timing(result, "slow_a"), timing(result, "slow_b")
    # The two intervals overlap.
    assert a.start_ms < b.start_ms + b.duration_ms
    assert b.start_ms < a.start_ms + a.duration_ms


def test_two_async_resolvers_sleep_concurrently(make_client: MakeClient) -> None:
    @online
    async def slow_a(aid: Account.id) -> Account.score_a:
        await asyncio.sleep(SLEEP)
        return 1.0

    @online
    async def slow_b(aid: Account.id) -> Account.score_b:
        await asyncio.sleep(SLEEP)
        return 2.0

    client = make_client(Account, slow_a, slow_b)
    started = time.perf_counter()
    result = client.query(
        input={Account.id: "a1"}, output=[Account.score_a, Account.score_b], now=NOW
    )
    elapsed = time.perf_counter() - started

    assert result.values == {"account.score_a": 1.0, "account.score_b": 2.0}
    assert result.errors == []
    assert elapsed < CONCURRENT_LIMIT, f"async resolvers ran one after the other ({elapsed:.3f}s)"


def test_sync_and_async_resolvers_sleep_concurrently(make_client: MakeClient) -> None:
    @online
    def slow_a(aid: Account.id) -> Account.score_a:
        time.sleep(SLEEP)
        return 1.0

    @online
    async def slow_b(aid: Account.id) -> Account.score_b:
        await asyncio.sleep(SLEEP)
        return 2.0

    client = make_client(Account, slow_a, slow_b)
    started = time.perf_counter()
    result = client.query(
        input={Account.id: "a1"}, output=[Account.score_a, Account.score_b], now=NOW
    )
    elapsed = time.perf_counter() - started

    assert result.errors == []
    assert elapsed < CONCURRENT_LIMIT, f"resolvers ran one after the other ({elapsed:.3f}s)"


def test_dependent_resolver_runs_after_both_of_its_inputs(make_client: MakeClient) -> None:
    finished: list[str] = []

    @online
    def slow_a(aid: Account.id) -> Account.score_a:
        time.sleep(SLEEP)
        finished.append("slow_a")
        return 1.0

    @online
    async def slow_b(aid: Account.id) -> Account.score_b:
        await asyncio.sleep(SLEEP / 2)
        finished.append("slow_b")
        return 2.0

    @online
    def combine(a: Account.score_a, b: Account.score_b) -> Account.combined:
        finished.append("combine")
        return a * 10 + b

    client = make_client(Account, slow_a, slow_b, combine)
    started = time.perf_counter()
    result = client.query(input={Account.id: "a1"}, output=[Account.combined], now=NOW)
    elapsed = time.perf_counter() - started

    assert result.get_value(Account.combined) == 12.0
    assert result.errors == []
    assert finished[-1] == "combine"
    assert sorted(finished[:2]) == ["slow_a", "slow_b"]
    # One level of sleeps, not two: the inputs overlapped, then combine ran.
    assert elapsed < CONCURRENT_LIMIT

    labels = [t.label for t in result.trace]
    assert labels.index("combine") > labels.index("slow_a")
    assert labels.index("combine") > labels.index("slow_b")
    combined = timing(result, "combine")
    for label in ("slow_a", "slow_b"):
        before = timing(result, label)
        assert combined.start_ms >= before.start_ms + before.duration_ms - 1e-6
    assert result.trace[-1].kind == "query"
    assert result.trace[-1].label == "total"
    assert result.trace[-1].duration_ms >= combined.start_ms + combined.duration_ms - 1e-6


def test_expressions_run_as_soon_as_their_inputs_are_done_each_with_its_own_timing(
    make_client: MakeClient,
) -> None:
    @features
    class Wallet:
        id: str
        fast: float
        slow: float
        doubled: float = kr._.fast * 2
        quadrupled: float = kr._.doubled * 2
        both: float = kr._.quadrupled + kr._.slow

    @online
    async def fast(wid: Wallet.id) -> Wallet.fast:
        return 1.0

    @online
    async def slow(wid: Wallet.id) -> Wallet.slow:
        await asyncio.sleep(SLEEP)
        return 10.0

    client = make_client(Wallet, fast, slow)
    result = client.query(
        {Wallet.id: "w1"}, [Wallet.doubled, Wallet.quadrupled, Wallet.both], now=NOW
    )

    assert result.values == {"wallet.doubled": 2.0, "wallet.quadrupled": 4.0, "wallet.both": 14.0}
    steps = {t.label: t for t in result.trace}
    assert {"wallet.doubled", "wallet.quadrupled", "wallet.both"} <= set(steps)
    late = steps["slow"].start_ms + steps["slow"].duration_ms
    # the chain over `fast` ran while `slow` slept, one step after the other; `both` after both
    assert steps["wallet.quadrupled"].start_ms + steps["wallet.quadrupled"].duration_ms < late
    assert steps["wallet.quadrupled"].start_ms >= steps["wallet.doubled"].start_ms
    assert steps["wallet.both"].start_ms >= late - 1e-6
