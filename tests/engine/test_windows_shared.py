"""Windows in Redis: two clients on one Redis (two servers, in effect) agree at once with a
brute-force oracle, through ties, late events, retried and replaced events; a new windowed
feature is built from the events Redis holds; a Redis that lost its data is reloaded from the
offline store, at the start or under running servers (until then every window is refused,
never answered from a partial state)."""

import random
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

import kairos as kr
from kairos import DataFrame, FeatureTime, Windowed, _, features, windowed
from kairos.engine import windows_shared
from kairos.errors import OnlineStoreUnavailable
from tests.conftest import REDIS_URL, delete_redis_prefix, needs_redis
from tests.engine.test_windows import T0, WINDOWED, Account, Payment, brute, events, same

pytestmark = needs_redis()


@pytest.fixture
def url() -> Iterator[str]:
    prefix = f"kw{uuid.uuid4().hex[:12]}"
    yield f"{REDIS_URL}?prefix={prefix}"
    delete_redis_prefix(prefix)


def server(url: str, *definitions: object, offline: str = "none://") -> kr.Client:
    return kr.Client(
        definitions=list(definitions or (Payment, Account)),
        query_log="none://",
        online_store=url,
        offline_store=offline,
    )


def check(client: kr.Client, rows: list[dict[str, object]], seed: int, rounds: int = 25) -> None:
    rng = random.Random(seed)
    for _round in range(rounds):
        now = T0 + timedelta(seconds=rng.randint(-3600, 42 * 86400))
        if rng.random() < 0.3:
            now = rng.choice(rows)["at"]  # type: ignore[assignment]  # on an event's time
        account = rng.choice(["a1", "a2", "a3", "nobody"])
        result = client.query({"account.id": account}, WINDOWED, now=now)
        assert result.errors == []
        for name, value in brute(rows, account, now).items():
            assert same(result.get_value(name), value), (name, now, account)


def test_two_servers_on_one_redis_agree_with_the_oracle_at_once(url: str) -> None:
    rows = events(11, 2400)  # ~800 per account: 30-day windows are merged from tiles
    shuffled = rows[:]
    random.Random(5).shuffle(shuffled)  # late events
    with server(url) as writer, server(url) as reader:
        for start in range(0, 1200, 300):
            writer.write_events(Payment, shuffled[start : start + 300])
        check(reader, shuffled[:1200], seed=1)  # seen by the other server at once
        writer.write_events(Payment, shuffled[1200:])
        writer.write_events(Payment, shuffled[:500])  # retried deliveries change nothing
        check(reader, rows, seed=2)
        check(writer, rows, seed=3, rounds=5)
        # the same id with a new row replaces the event, min and max included
        changed = [dict(r, amount=(r["amount"] or 0) * -3 + 1) for r in rows[:400]]
        assert reader.write_events(Payment, changed) == 400
        now_rows = changed + rows[400:]
        check(writer, now_rows, seed=4)
        offline = writer.offline_query(
            {"account.id": ["a1", "a2"], "ts": [T0 + timedelta(days=20)] * 2}, WINDOWED
        ).to_pylist()
        for row, account in zip(offline, ["a1", "a2"], strict=True):
            for name, value in brute(now_rows, account, T0 + timedelta(days=20)).items():
                assert same(row[name], value), name


def test_an_event_moved_to_another_entity_or_time_leaves_its_old_window(url: str) -> None:
    with server(url) as one, server(url) as two:
        one.write_events(Payment, [{"id": "m", "account_id": "a1", "amount": 9.0, "kind": "card",
                                    "at": T0}])  # fmt: skip
        two.write_events(Payment, [{"id": "m", "account_id": "a2", "amount": 4.0, "kind": "card",
                                    "at": T0 + timedelta(hours=3)}])  # fmt: skip
        wanted = ["account.count[1d]", "account.high[7d]", "account.payments"]
        first = one.query({"account.id": "a1"}, wanted, now=T0 + timedelta(hours=4))
        second = one.query({"account.id": "a2"}, wanted, now=T0 + timedelta(hours=4))
    assert first.get_value("account.count[1d]") == 0
    assert first.get_value("account.high[7d]") is None
    assert first.get_value("account.payments") == []
    assert second.get_value("account.count[1d]") == 1
    assert second.get_value("account.high[7d]") == 4.0
    assert [r["id"] for r in second.get_value("account.payments")] == ["m"]


def test_a_new_windowed_feature_is_built_from_the_events_redis_holds(url: str) -> None:
    @features(namespace="account")
    class Account:  # the same class, with one more windowed feature
        id: str
        payments: DataFrame[Payment]
        count: Windowed[int] = windowed(
            "1h", "1d", "30d", expression=_.payments[_.at > _.window_start].count()
        )
        cards: Windowed[float] = windowed(
            "40d", expression=_.payments[_.kind == "card", _.amount, _.at > _.window_start].sum()
        )

    rows = events(21, 900)
    with server(url) as old:
        old.write_events(Payment, rows)
    now = T0 + timedelta(days=41)
    with server(url, Payment, Account) as new:
        got = new.query({"account.id": "a1"}, ["account.cards[40d]"], now=now)
    expected = sum(
        r["amount"]
        for r in rows
        if r["account_id"] == "a1"
        and r["kind"] == "card"
        and r["amount"] is not None
        and now - timedelta(days=40) < r["at"] <= now
    )
    assert same(got.get_value("account.cards[40d]"), expected)


def test_a_redis_that_lost_its_data_is_reloaded_from_the_offline_store(
    url: str, tmp_path: Path
) -> None:
    offline = f"duckdb:///{tmp_path}/offline.duckdb"
    rows = events(31, 600)
    with server(url, offline=offline) as first:
        first.write_events(Payment, rows)
    delete_redis_prefix(url.rpartition("prefix=")[2])  # Redis restarted empty
    with server(url, offline=offline) as second:
        check(second, rows, seed=6, rounds=10)


def test_redis_down_is_a_clear_error() -> None:
    with (
        server("redis://127.0.0.1:1/0") as client,
        pytest.raises(kr.KairosError, match="unreachable"),
    ):
        client.write_events(Payment, events(1, 3))


def test_window_keys_live_under_the_store_prefix(url: str) -> None:
    with server(url) as client:
        client.write_events(Payment, events(41, 20))
    prefix = url.rpartition("prefix=")[2]
    r = redis.Redis.from_url(REDIS_URL)
    try:
        keys = {k.decode() for k in r.scan_iter(match=f"{prefix}:*", count=1000)}
    finally:
        r.close()
    assert any(k.startswith(f"{prefix}:ev:payment") for k in keys)
    assert any(k.startswith(f"{prefix}:w:") for k in keys)
    assert all(k.startswith(f"{prefix}:") for k in keys)


def test_every_window_from_tiles_still_matches_the_oracle(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(windows_shared, "EXACT", 0)  # no window is answered from its rows
    rows = events(51, 900)
    with server(url) as writer, server(url) as reader:
        writer.write_events(Payment, rows)
        check(reader, rows, seed=7)
        # replacing the largest and smallest amounts recomputes the tiles' min and max
        amounts = sorted((r for r in rows if r["amount"] is not None), key=lambda r: r["amount"])
        moved = [dict(r, amount=100.0) for r in amounts[:20] + amounts[-20:]]
        writer.write_events(Payment, moved)
        by_id = {r["id"]: r for r in moved}
        check(reader, [by_id.get(r["id"], r) for r in rows], seed=8)


@features(events=True, namespace="reading")
class Reading:
    id: str
    meter_id: "Meter.id"
    value: float | None
    stamp: int
    label: str
    at: FeatureTime


@features(namespace="meter")
class Meter:
    id: str
    readings: DataFrame[Reading]
    labelled: Windowed[int] = windowed(
        "30d", expression=_.readings[_.label, _.at > _.window_start].count()
    )
    label_sum: Windowed[float | None] = windowed(
        "30d", expression=_.readings[_.label, _.at > _.window_start].sum()
    )
    spread: Windowed[float | None] = windowed(
        "30d", expression=_.readings[_.stamp, _.at > _.window_start].std()
    )
    total: Windowed[float] = windowed(
        "30d", expression=_.readings[_.value, _.at > _.window_start].sum()
    )
    high: Windowed[float | None] = windowed(
        "30d", expression=_.readings[_.value, _.at > _.window_start].max()
    )


METER = ["meter.labelled[30d]", "meter.spread[30d]", "meter.total[30d]", "meter.high[30d]"]


def readings(count: int, start: datetime) -> list[dict[str, object]]:
    rng = random.Random(9)
    return [
        {"id": f"r{i}", "meter_id": "m", "value": float(i % 10), "stamp": 1_700_000_000 + i % 2,
         "label": "k", "at": start + timedelta(microseconds=rng.randrange(20 * 86400 * 10**6))}
        for i in range(count)
    ]  # fmt: skip


@pytest.mark.parametrize("exact", [64, 0])
def test_tiles_count_any_value_and_keep_precision_and_survive_replacements(
    url: str, monkeypatch: pytest.MonkeyPatch, exact: int
) -> None:
    monkeypatch.setattr(windows_shared, "EXACT", exact)
    start = datetime(1969, 12, 20, tzinfo=UTC)  # across 1970, at microseconds
    rows = readings(600, start)
    now = start + timedelta(days=25)
    with (
        server(url, Reading, Meter) as shared,
        kr.Client(definitions=[Reading, Meter], query_log="none://") as local,
    ):
        for client in (shared, local):
            client.write_events(Reading, rows)
            # an inf and a huge value, each replaced again: no trace may stay in a sum
            client.write_events(Reading, [dict(rows[0], value=float("inf"))])
            client.write_events(Reading, [dict(rows[1], value=1e17)])
            client.write_events(Reading, [rows[0], rows[1]])
        got = shared.query({"meter.id": "m"}, [*METER, "meter.label_sum[30d]"], now=now)
        want = local.query({"meter.id": "m"}, [*METER, "meter.label_sum[30d]"], now=now)
    assert got.get_value("meter.labelled[30d]") == 600  # a count of strings counts them
    assert got.get_value("meter.total[30d]") == sum(float(i % 10) for i in range(600))
    assert got.get_value("meter.high[30d]") == 9.0
    assert same(got.get_value("meter.spread[30d]"), want.get_value("meter.spread[30d]"))
    assert got.get_value("meter.spread[30d]") == pytest.approx(0.5004, abs=1e-4)
    for name in METER:
        assert same(got.get_value(name), want.get_value(name)), name
    # a sum over strings fails on that row, as a scan of the rows does
    assert [e.feature for e in got.errors] == ["meter.label_sum[30d]"]


def test_a_load_from_the_offline_store_never_replaces_a_newer_event(
    url: str, tmp_path: Path
) -> None:
    offline = f"duckdb:///{tmp_path}/offline.duckdb"
    first = {"id": "p1", "account_id": "a1", "amount": 5.0, "kind": "card", "at": T0}
    with server(url, offline=offline) as durable:
        durable.write_events(Payment, [first])
    with server(url) as other:  # a server without that offline store corrects the event
        other.write_events(Payment, [dict(first, amount=50.0)])
    prefix = url.rpartition("prefix=")[2]
    r = redis.Redis.from_url(REDIS_URL)
    try:  # as if this Redis never had the offline store's events loaded
        r.delete(*[k for k in r.scan_iter(match=f"{prefix}:w:loaded:*")])
    finally:
        r.close()
    with server(url, offline=offline) as restarted:
        got = restarted.query({"account.id": "a1"}, ["account.total[1d]"], now=T0)
    assert got.get_value("account.total[1d]") == 50.0


def test_an_event_windows_in_redis_cannot_keep_is_refused_before_it_is_stored(
    url: str, tmp_path: Path
) -> None:
    offline = f"duckdb:///{tmp_path}/offline.duckdb"
    old = {"id": "p0", "account_id": "a1", "amount": 1.0, "kind": "card",
           "at": datetime(1600, 1, 1, tzinfo=UTC)}  # fmt: skip
    with server(url, offline=offline) as client:
        with pytest.raises(kr.InvalidInput, match="outside the years 1685-2255"):
            client.write_events(Payment, [old])
        stored = client.offline_store().latest_rows("payment", ["at"])
    assert stored.num_rows == 0


def test_a_stored_event_windows_in_redis_cannot_keep_does_not_stop_the_load(
    url: str, tmp_path: Path
) -> None:
    offline = f"duckdb:///{tmp_path}/offline.duckdb"
    old = {"id": "p0", "account_id": "a1", "amount": 1.0, "kind": "card",
           "at": datetime(1600, 1, 1, tzinfo=UTC)}  # fmt: skip
    recent = dict(old, id="p1", amount=2.0, at=T0)
    with kr.Client(
        definitions=[Payment, Account], query_log="none://", offline_store=offline
    ) as in_process:  # windows in this process keep any time
        in_process.write_events(Payment, [old, recent])
    with server(url, offline=offline) as shared:
        got = shared.query({"account.id": "a1"}, ["account.total[1d]"], now=T0)
    assert got.errors == [] and got.get_value("account.total[1d]") == 2.0


# --- a Redis that loses its data under running servers ------------------------------------

WEEK = T0 + timedelta(days=20)


def right_or_refused(client: kr.Client, rows: list[dict[str, Any]], account: str) -> bool:
    """One query: False if refused with OnlineStoreUnavailable, else True and right."""
    try:
        result = client.query({"account.id": account}, [*WINDOWED, "account.lifetime"], now=WEEK)
    except OnlineStoreUnavailable:
        return False
    assert result.errors == []
    for name, value in brute(rows, account, WEEK).items():
        assert same(result.get_value(name), value), (name, account)
    lifetime = sum(1 for r in rows if r["account_id"] == account and r["at"] <= WEEK)
    assert result.get_value("account.lifetime") == lifetime
    return True


def until_whole(clients: list[kr.Client], rows: list[dict[str, Any]]) -> float:
    """Seconds until every client answers right; every answer before is right or refused."""
    started = time.monotonic()
    while not all([right_or_refused(c, rows, a) for c in clients for a in ("a1", "a2")]):
        assert time.monotonic() - started < 15, "the windows are not whole again after 15 s"
        time.sleep(0.01)
    return time.monotonic() - started


def test_a_redis_emptied_under_running_servers_is_refused_then_reloaded_once(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offline = f"duckdb:///{tmp_path}/offline.duckdb"
    loads: list[bool] = []
    load = windows_shared.SharedWindows._load

    def counted(self: windows_shared.SharedWindows, token: str, lost: bool) -> None:
        loads.append(lost)
        load(self, token, lost)

    monkeypatch.setattr(windows_shared.SharedWindows, "_load", counted)
    rows = events(61, 600)
    with server(url, offline=offline) as one, server(url, offline=offline) as two:
        one.write_events(Payment, rows)
        assert until_whole([one, two], rows) < 1 and loads == [False]  # the first start's
        delete_redis_prefix(url.rpartition("prefix=")[2])  # Redis restarted empty
        late = dict(rows[0], id="late", at=WEEK - timedelta(hours=1))
        assert two.write_events(Payment, [late]) == 1  # into the empty Redis: kept
        rows.append(late)
        right_or_refused(one, rows, "a1")  # refused while it reloads, right after
        until_whole([two, one], rows)
        two.write_events(Payment, [dict(late, id="later")])  # on the reloaded state
        rows.append(dict(late, id="later"))
        assert until_whole([one, two], rows) < 1
    assert loads == [False, True]  # one load for both servers, by whichever noticed first


def test_a_write_into_an_emptied_redis_does_not_make_its_windows_look_whole(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offline = f"duckdb:///{tmp_path}/offline.duckdb"
    rows = events(71, 300)
    with server(url, offline=offline) as client:
        client.write_events(Payment, rows)
        monkeypatch.setattr(windows_shared.SharedWindows, "_reload_soon", lambda self: None)
        delete_redis_prefix(url.rpartition("prefix=")[2])
        late = dict(rows[0], id="late", at=WEEK - timedelta(hours=1))
        client.write_events(Payment, [late])  # alone in Redis: an account with 1 payment
        rows.append(late)
        for wanted in (["account.count[30d]"], ["account.payments"], ["account.total[1d]"]):
            with pytest.raises(OnlineStoreUnavailable, match="reloaded from the offline store"):
                client.query({"account.id": late["account_id"]}, wanted, now=WEEK)
        monkeypatch.undo()  # the next refusal reloads
        until_whole([client], rows)


def test_a_load_that_loses_its_lease_midway_is_not_marked_whole(url: str, tmp_path: Path) -> None:
    offline = f"duckdb:///{tmp_path}/offline.duckdb"
    rows = events(81, 500)
    with server(url, offline=offline) as first:
        first.write_events(Payment, rows)
    delete_redis_prefix(url.rpartition("prefix=")[2])
    with server(url, offline=offline) as restarted:
        windows = restarted.windows
        assert isinstance(windows, windows_shared.SharedWindows)
        loader, calls = windows._loader, []
        assert loader is not None

        def restarting_midway() -> Iterator[Any]:
            calls.append(1)
            batches = list(loader())
            if len(calls) == 1:  # Redis restarts between the lease and the first chunk
                delete_redis_prefix(url.rpartition("prefix=")[2])
            yield from batches

        windows._loader = restarting_midway
        until_whole([restarted], rows)
    assert len(calls) == 2


def test_a_series_only_one_server_knows_is_built_by_it_after_a_reload(
    url: str, tmp_path: Path
) -> None:
    @features(namespace="account")
    class Account:  # the same class, with one more windowed feature (a server deployed later)
        id: str
        payments: DataFrame[Payment]
        cards: Windowed[float] = windowed(
            "40d", expression=_.payments[_.kind == "card", _.amount, _.at > _.window_start].sum()
        )

    offline = f"duckdb:///{tmp_path}/offline.duckdb"
    rows = events(91, 400)
    now = T0 + timedelta(days=41)
    expected = sum(
        r["amount"]
        for r in rows
        if r["account_id"] == "a1"
        and r["kind"] == "card"
        and r["amount"] is not None
        and now - timedelta(days=40) < r["at"] <= now
    )
    with server(url, offline=offline) as old, server(url, Payment, Account, offline=offline) as new:
        new.query({"account.id": "a1"}, ["account.cards[40d]"], now=now)  # built at its start
        old.write_events(Payment, rows)  # (old writes no contribution to `cards`: rows only)
        delete_redis_prefix(url.rpartition("prefix=")[2])
        until_whole([old], rows)  # reloaded by the old server: its series, not `cards`
        started = time.monotonic()
        while True:
            try:
                got = new.query({"account.id": "a1"}, ["account.cards[40d]"], now=now)
            except OnlineStoreUnavailable:
                assert time.monotonic() - started < 15
                time.sleep(0.01)
                continue
            assert same(got.get_value("account.cards[40d]"), expected)
            break


def test_without_an_offline_store_a_lost_redis_counts_the_events_written_since(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    rows = events(101, 200)
    with server(url) as client:
        client.write_events(Payment, rows)
        delete_redis_prefix(url.rpartition("prefix=")[2])
        late = dict(rows[0], id="late", at=WEEK - timedelta(hours=1))
        client.write_events(Payment, [late])
        until_whole([client], [late])  # all it can know: the events it was given since
    assert "no offline store to reload them from" in caplog.text
