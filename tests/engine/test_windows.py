"""Windowed aggregates over events written to kairos: answered from an index, checked
against the obvious slow computation, and the same online and offline."""

import math
import random
import statistics
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kairos as kr
from kairos import DataFrame, FeatureTime, Now, Windowed, _, features, windowed
from tests.conftest import REDIS_URL, delete_redis_prefix, need_redis

T0 = datetime(2026, 5, 1, tzinfo=UTC)


@features(events=True)
class Payment:
    id: str
    account_id: "Account.id"
    amount: float | None
    kind: str
    at: FeatureTime


@features
class Account:
    id: str
    payments: DataFrame[Payment]
    count: Windowed[int] = windowed(
        "1h", "1d", "30d", expression=_.payments[_.at > _.window_start].count()
    )
    refunds: Windowed[int] = windowed(
        "7d", expression=_.payments[_.kind == "refund", _.at > _.window_start].count()
    )
    total: Windowed[float] = windowed(
        "1d", "30d", expression=_.payments[_.amount, _.at > _.window_start].sum()
    )
    average: Windowed[float | None] = windowed(
        "30d", expression=_.payments[_.amount, _.at >= _.window_start].mean()
    )
    low: Windowed[float | None] = windowed(
        "7d", expression=_.payments[_.amount, _.at > _.window_start].min()
    )
    high: Windowed[float | None] = windowed(
        "7d", expression=_.payments[_.amount, _.at > _.window_start].max()
    )
    spread: Windowed[float | None] = windowed(
        "30d", expression=_.payments[_.amount, _.at > _.window_start].std()
    )
    kinds: Windowed[int] = windowed(
        "30d", expression=_.payments[_.kind, _.at > _.window_start].distinct_count()
    )
    # not indexable (the filter depends on Now twice): evaluated over the rows instead
    recent_big: Windowed[int] = windowed(
        "1d",
        expression=_.payments[
            _.at > _.window_start, _.amount > 0, _.at <= Now - timedelta(hours=1)
        ].count(),
    )
    lifetime: int = _.payments.count()


WINDOWED = [
    "account.count[1h]", "account.count[1d]", "account.count[30d]", "account.refunds[7d]",
    "account.total[1d]", "account.total[30d]", "account.average[30d]", "account.low[7d]",
    "account.high[7d]", "account.spread[30d]", "account.kinds[30d]", "account.recent_big[1d]",
]  # fmt: skip


def events(seed: int, count: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for index in range(count):
        at = T0 + timedelta(seconds=rng.randint(0, 40 * 86400))
        if index % 7 == 0 and rows:
            at = rows[-1]["at"]  # ties on time
        rows.append(
            {
                "id": f"p{index}",
                "account_id": rng.choice(["a1", "a2", "a3"]),
                "amount": None if rng.random() < 0.1 else round(rng.uniform(-50, 500), 2),
                "kind": rng.choice(["card", "card", "refund", "transfer"]),
                "at": at,
            }
        )
    return rows


def brute(rows: list[dict[str, Any]], account: str, now: datetime) -> dict[str, Any]:
    mine = [r for r in rows if r["account_id"] == account and r["at"] <= now]

    def inside(r: dict[str, Any], window: timedelta, inclusive: bool = False) -> bool:
        return bool(r["at"] >= now - window if inclusive else r["at"] > now - window)

    def amounts(window: timedelta, inclusive: bool = False) -> list[float]:
        return [
            r["amount"] for r in mine if inside(r, window, inclusive) and r["amount"] is not None
        ]

    week, month, day = timedelta(days=7), timedelta(days=30), timedelta(days=1)
    return {
        "account.count[1h]": sum(1 for r in mine if inside(r, timedelta(hours=1))),
        "account.count[1d]": sum(1 for r in mine if inside(r, day)),
        "account.count[30d]": sum(1 for r in mine if inside(r, month)),
        "account.refunds[7d]": sum(1 for r in mine if inside(r, week) and r["kind"] == "refund"),
        "account.total[1d]": sum(amounts(day)),
        "account.total[30d]": sum(amounts(month)),
        "account.average[30d]": statistics.fmean(a) if (a := amounts(month, True)) else None,
        "account.low[7d]": min(amounts(week), default=None),
        "account.high[7d]": max(amounts(week), default=None),
        "account.spread[30d]": statistics.stdev(a) if len(a := amounts(month)) > 1 else None,
        "account.kinds[30d]": len({r["kind"] for r in mine if inside(r, month)}),
        "account.recent_big[1d]": sum(
            1
            for r in mine
            if inside(r, day)
            and r["amount"] is not None
            and r["amount"] > 0
            and r["at"] <= now - timedelta(hours=1)
        ),
    }


@pytest.fixture(params=["in_process", "redis"])
def online_store(request: pytest.FixtureRequest) -> Iterator[str]:
    """Windows in this process (memory online store) or in Redis, shared by every server."""
    if request.param == "in_process":
        yield "memory://"
        return
    need_redis()
    prefix = f"kw{uuid.uuid4().hex[:12]}"
    yield f"{REDIS_URL}?prefix={prefix}"
    delete_redis_prefix(prefix)


@pytest.fixture
def client(online_store: str) -> Iterator[kr.Client]:
    with kr.Client(
        definitions=[Payment, Account], query_log="none://", online_store=online_store
    ) as client:
        yield client


def same(got: Any, expected: Any) -> bool:
    if isinstance(expected, float) and got is not None:
        return math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-6)
    return bool(got == expected)


def test_indexed_windows_match_brute_force(client: kr.Client) -> None:
    rows = events(1, 3000)
    shuffled = rows[:]
    random.Random(2).shuffle(shuffled)  # late events too
    for start in range(0, len(shuffled), 500):
        client.write_events(Payment, shuffled[start : start + 500])
    rng = random.Random(3)
    for _round in range(40):
        now = T0 + timedelta(seconds=rng.randint(-86400, 42 * 86400))
        if rng.random() < 0.2:
            now = rng.choice(rows)["at"]  # exactly on an event's time
        account = rng.choice(["a1", "a2", "a3", "nobody"])
        result = client.query({"account.id": account}, WINDOWED, now=now)
        assert result.errors == []
        for name, value in brute(rows, account, now).items():
            assert same(result.get_value(name), value), (name, now, account)


def test_the_plan_uses_the_index_where_it_can(client: kr.Client) -> None:
    plan = client.plan(["account.id"], [*WINDOWED, "account.lifetime"])
    kinds = {node.label: node.kind for node in plan.nodes}
    assert kinds["account.count[30d]"] == "window"
    assert kinds["account.spread[30d]"] == "window"
    assert kinds["account.recent_big[1d]"] == "expression"  # not indexable: scans rows
    assert kinds["account.payments"] == "events"  # no resolver needed
    assert kinds["account.lifetime"] == "expression"


def test_nothing_from_the_future_and_rows_as_of_now(client: kr.Client) -> None:
    client.write_events(
        "payment",
        [
            {"id": "x1", "account_id": "a9", "amount": 5, "kind": "card", "at": T0},
            {
                "id": "x2",
                "account_id": "a9",
                "amount": 7,
                "kind": "card",
                "at": T0 + timedelta(hours=2),
            },
        ],
    )
    result = client.query(
        {"account.id": "a9"}, ["account.payments", "account.total[1d]"], now=T0 + timedelta(hours=1)
    )
    assert [r["id"] for r in result.get_value("account.payments")] == ["x1"]
    assert result.get_value("account.total[1d]") == 5.0


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seconds=st.integers(min_value=-3600, max_value=41 * 86400),
    account=st.sampled_from(["a1", "a2"]),
)
def test_online_at_t_equals_offline_at_t(client: kr.Client, seconds: int, account: str) -> None:
    later = T0 + timedelta(days=99)
    if not client.query({"account.id": "a1"}, ["account.lifetime"], now=later).get_value(
        "account.lifetime"
    ):
        client.write_events(Payment, events(4, 600))
    now = T0 + timedelta(seconds=seconds)
    online = client.query({"account.id": account}, WINDOWED, now=now)
    offline = client.offline_query({"account.id": [account], "ts": [now]}, WINDOWED)
    [row] = offline.to_pylist()
    for name in WINDOWED:
        assert row[name] == online.get_value(name), name


def test_bad_events_are_clear_errors(client: kr.Client) -> None:
    with pytest.raises(kr.InvalidInput, match="has no feature 'amout'; did you mean 'amount'"):
        client.write_events(Payment, [{"id": "1", "account_id": "a", "amout": 1, "at": T0}])
    with pytest.raises(kr.InvalidInput, match="has no 'at'"):
        client.write_events(Payment, [{"id": "1", "account_id": "a", "kind": "card"}])
    with pytest.raises(kr.InvalidInput, match="does not take events"):
        client.write_events(Account, [{"id": "a"}])


def test_events_need_a_feature_time() -> None:
    @features(events=True)
    class Tick:
        id: str

    with pytest.raises(kr.DefinitionError, match="events=True but has no FeatureTime"):
        kr.Client(definitions=[Tick])


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_events_over_http(client: kr.Client) -> None:
    import httpx

    from kairos.server import create_app

    app = create_app(client)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as h:
        row = {"id": "h1", "account_id": "a7", "amount": 3.5, "kind": "card", "at": T0.isoformat()}
        written = await h.post("/v1/events/payment", json={"rows": [row]})
        assert written.status_code == 200 and written.json() == {"written": 1}
        body = {
            "inputs": {"account.id": "a7"},
            "outputs": ["account.total[1d]"],
            "now": T0.isoformat(),
        }
        answer = await h.post("/v1/query/online", json=body)
        assert answer.json()["values"]["account.total[1d]"] == 3.5
        bad = await h.post("/v1/events/payment", json={"rows": [{**row, "amout": 1}]})
        assert bad.status_code == 422 and "did you mean 'amount'" in bad.json()["error"]["message"]
        assert (await h.post("/v1/events/account", json={"rows": []})).status_code == 422
        assert (await h.post("/v1/events/nope", json={"rows": []})).status_code == 404
    await client.aclose()  # on this loop: its Redis connections belong to it


def test_large_integer_sums_stay_exact_and_bad_rows_do_not_break_the_index(
    online_store: str,
) -> None:
    @features(events=True, namespace="tick")
    class Tick:
        id: str
        box_id: "Box.id"
        n: int
        d: int
        at: FeatureTime

    @features(namespace="box")
    class Box:
        id: str
        ticks: DataFrame[Tick]
        total: Windowed[int] = windowed("1h", expression=_.ticks[_.n, _.at > _.window_start].sum())
        ratio: Windowed[float | None] = windowed(
            "1d", expression=_.ticks[_.n / _.d, _.at > _.window_start].max()
        )

    with kr.Client(
        definitions=[Tick, Box], query_log="none://", online_store=online_store
    ) as client:
        rows = [
            {"id": "t0", "box_id": "b", "n": 2**60, "d": 1, "at": T0},
            {"id": "t1", "box_id": "b", "n": 1, "d": 0, "at": T0 + timedelta(hours=5)},  # n / 0
            {"id": "t2", "box_id": "b", "n": 2, "d": 1, "at": T0 + timedelta(hours=5)},
        ]
        client.write_events(Tick, rows)
        result = client.query(
            {"box.id": "b"}, ["box.total[1h]", "box.ratio[1d]"], now=T0 + timedelta(hours=5)
        )
    assert result.get_value("box.total[1h]") == 3  # exact, beside an old 2**60
    assert result.get_value("box.ratio[1d]") == float(2**60)  # the failing row counts as null
