"""The DuckDB offline store: as-of reads against a brute-force oracle, typed round trips, keys,
hostile names, URLs, and a size check."""

import random
import threading
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from kairos.definitions.types import ValueType
from kairos.errors import InvalidInput, InvalidValue, KairosError
from kairos.stores.offline import (
    DuckDBOfflineStore,
    offline_store_from_url,
    python_values,
    table_name,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
INT, STR, FLOAT = ValueType("int"), ValueType("str"), ValueType("float")


def minutes(n: int) -> datetime:
    return T0 + timedelta(minutes=n)


@pytest.fixture(params=["memory", "file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DuckDBOfflineStore]:
    path = ":memory:" if request.param == "memory" else tmp_path / "sub" / "offline.duckdb"
    opened = DuckDBOfflineStore(path)
    yield opened
    opened.close()


# --- the oracle ------------------------------------------------------------------------------

# (key, observed_at, inserted_at, order written, value)
Event = tuple[Any, datetime, datetime, int, Any]


def oracle(events: list[Event], key: Any, at: datetime | None, ttl: timedelta | None) -> Any:
    """The obvious way: every event of the key observed in (at - ttl, at], the latest one,
    ties to the one inserted last, then to the one written last."""
    if key is None or at is None:
        return None
    best: Event | None = None
    for event in events:
        event_key, observed_at, inserted_at, order, _ = event
        if type(event_key) is not type(key) or event_key != key or observed_at > at:
            continue
        if ttl is not None and observed_at <= at - ttl:
            continue
        if best is None or (observed_at, inserted_at, order) > best[1:4]:
            best = event
    return None if best is None else best[4]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("key_kind", ["int", "str"])
def test_asof_matches_a_brute_force_oracle(
    store: DuckDBOfflineStore, seed: int, key_kind: str
) -> None:
    rng = random.Random(seed)
    keys: list[Any] = list(range(6)) if key_kind == "int" else [f"k{i}" for i in range(6)]
    events: list[Event] = []
    order = 0
    # several writes: a few share an explicit inserted_at, the rest take "now"
    for batch in range(8):
        size = rng.randint(1, 30)
        batch_keys = [rng.choice(keys) for _ in range(size)]
        # few distinct minutes: many ties on observed_at within and across batches
        observed = [minutes(rng.randint(10, 40)) for _ in range(size)]
        values = [None if rng.random() < 0.1 else rng.randint(-1000, 1000) for _ in range(size)]
        if batch % 3 == 0:
            given: datetime | None = minutes(1000 + rng.randint(0, 2))
        else:
            given = None
        store.write("user", "score", INT, ValueType(key_kind), batch_keys, observed, values, given)
        inserted = given if given is not None else datetime.now(UTC) + timedelta(days=365)
        for k, at, v in zip(batch_keys, observed, values, strict=True):
            events.append((k, at, inserted, order, v))
            order += 1
    # the same observed_at written again later, a different value: the later insert wins
    store.write("user", "score", INT, ValueType(key_kind), [keys[0]], [minutes(20)], [123456])
    events.append((keys[0], minutes(20), datetime.now(UTC) + timedelta(days=366), order, 123456))

    spine_keys: list[Any] = []
    spine_times: list[datetime | None] = []
    for _ in range(300):
        spine_keys.append(None if rng.random() < 0.05 else rng.choice([*keys, keys[0]]))
        # minutes 0-50: rows before any event, on event times, and after them all
        spine_times.append(None if rng.random() < 0.03 else minutes(rng.randint(0, 50)))
    spine_keys += spine_keys[:20]  # duplicate spine rows: each is answered
    spine_times += spine_times[:20]
    unknown = 999 if key_kind == "int" else "nobody"
    spine_keys.append(unknown)
    spine_times.append(minutes(50))

    for ttl in (None, timedelta(minutes=5), timedelta(minutes=1), timedelta(hours=2)):
        got = store.asof("user", "score", spine_keys, spine_times, ttl).to_pylist()
        expected = [oracle(events, k, t, ttl) for k, t in zip(spine_keys, spine_times, strict=True)]
        assert got == expected, f"ttl={ttl}"
        assert any(v is not None for v in expected)
    # a spine inside the events' span: segments hold rows after its last time and (with a
    # ttl) before its first time less the ttl, which the read filters out
    inside = [minutes(24 + i % 4) for i in range(len(spine_keys))]
    for ttl in (None, timedelta(minutes=5)):
        got = store.asof("user", "score", spine_keys, inside, ttl).to_pylist()
        expected = [oracle(events, k, t, ttl) for k, t in zip(spine_keys, inside, strict=True)]
        assert got == expected, f"inside, ttl={ttl}"


def test_ties_inside_one_batch_go_to_the_row_written_last(store: DuckDBOfflineStore) -> None:
    store.write("user", "x", INT, STR, ["u", "u", "u"], [minutes(1)] * 3, [1, 2, 3])
    assert store.asof("user", "x", ["u"], [minutes(1)]).to_pylist() == [3]


def test_ttl_excludes_exactly_ttl_old_and_includes_just_newer(store: DuckDBOfflineStore) -> None:
    store.write("user", "x", INT, STR, ["u"], [minutes(0)], [7])
    spine = [minutes(0), minutes(10), minutes(10) - timedelta(microseconds=1), minutes(-1)]
    got = store.asof("user", "x", ["u"] * 4, spine, ttl=timedelta(minutes=10)).to_pylist()
    assert got == [7, None, 7, None]


def test_a_feature_never_written_is_all_null(store: DuckDBOfflineStore) -> None:
    got = store.asof("user", "never", ["a", "b", None], [minutes(1)] * 3)
    assert len(got) == 3 and got.null_count == 3
    assert store.value_kind("user", "never") is None


def test_empty_spine_and_empty_write(store: DuckDBOfflineStore) -> None:
    store.write("user", "x", INT, STR, [], [], [])
    store.write("user", "y", INT, STR, ["u"], [minutes(0)], [1])
    assert len(store.asof("user", "y", [], [])) == 0
    assert store.asof("user", "y", ["u"], [None]).to_pylist() == [None]


# --- types and keys --------------------------------------------------------------------------

EAST = timezone(timedelta(hours=5))
ROUND_TRIPS: list[tuple[str, list[Any]]] = [
    ("bool", [True, False, None]),
    ("int", [0, -(2**63), 2**63 - 1, None]),
    ("float", [0.5, -1e300, float("inf"), None]),
    ("str", ["", "héllo ☃", "x' or '1'='1", None]),
    ("datetime", [T0, datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=EAST), None]),
    ("date", [date(2026, 2, 28), date(1, 1, 1), None]),
    ("timedelta", [timedelta(days=-3, microseconds=7), timedelta(days=40000), None]),
    ("list", [[1, "a", None], [], [T0, [date(2026, 1, 2)]], None]),
    ("dict", [{"a": 1, "b": [1.5, None]}, {}, {"$x": timedelta(seconds=1), "at": T0}, None]),
    ("any", [1, "s", [1, 2], {"k": {"n": None}}, 2.5, None]),
]


@pytest.mark.parametrize(("kind", "values"), ROUND_TRIPS, ids=[k for k, _ in ROUND_TRIPS])
def test_every_value_type_round_trips(
    store: DuckDBOfflineStore, kind: str, values: list[Any]
) -> None:
    keys = [f"k{i}" for i in range(len(values))]
    store.write("thing", "v", ValueType(kind, True), STR, keys, [minutes(0)] * len(keys), values)
    got = store.asof("thing", "v", keys, [minutes(1)] * len(keys))
    assert store.value_kind("thing", "v") == kind
    decoded = python_values(got, kind)
    assert decoded == values
    assert [type(v) for v in decoded] == [type(v) for v in values]


def test_int_and_str_keys_are_different_features_and_never_mixed(
    store: DuckDBOfflineStore,
) -> None:
    store.write("user", "by_int", INT, INT, [1, 12, 123], [minutes(0)] * 3, [10, 20, 30])
    store.write("user", "by_str", INT, STR, ["1", "12"], [minutes(0)] * 2, [11, 21])
    assert store.asof("user", "by_int", [123, 1, 2], [minutes(1)] * 3).to_pylist() == [30, 10, None]
    assert store.asof("user", "by_str", ["12", "1"], [minutes(1)] * 2).to_pylist() == [21, 11]
    with pytest.raises(InvalidValue, match="expected int"):
        store.asof("user", "by_int", ["1"], [minutes(1)])
    with pytest.raises(InvalidValue, match="bool"):
        store.asof("user", "by_int", [True], [minutes(1)])
    with pytest.raises(InvalidValue, match="expected str"):
        store.asof("user", "by_str", [1], [minutes(1)])
    with pytest.raises(InvalidValue, match="first written"):
        store.write("user", "by_int", INT, STR, ["1"], [minutes(0)], [1])
    with pytest.raises(InvalidValue, match="first written"):
        store.write("user", "by_int", STR, INT, [1], [minutes(0)], ["1"])
    # a failed write leaves what was stored alone
    assert store.asof("user", "by_int", [1], [minutes(1)]).to_pylist() == [10]


def test_bad_writes_are_refused_with_the_fix(store: DuckDBOfflineStore) -> None:
    with pytest.raises(InvalidValue, match="timezone"):
        store.write("user", "x", INT, STR, ["u"], [datetime(2026, 1, 1)], [1])
    with pytest.raises(InvalidValue, match="timezone"):
        store.asof("user", "x", ["u"], [datetime(2026, 1, 1)])
    with pytest.raises(InvalidInput, match="lengths 2, 1 and 1"):
        store.write("user", "x", INT, STR, ["u", "v"], [minutes(0)], [1])
    with pytest.raises(InvalidValue, match="key is None"):
        store.write("user", "x", INT, STR, [None], [minutes(0)], [1])
    with pytest.raises(InvalidValue, match="expected int"):
        store.write("user", "x", INT, STR, ["u"], [minutes(0)], ["one"])
    with pytest.raises(InvalidValue, match="bool"):
        store.write("user", "x", INT, STR, ["u"], [minutes(0)], [True])
    with pytest.raises(InvalidValue, match="key type 'float'"):
        store.write("user", "x", INT, FLOAT, [1.0], [minutes(0)], [1])
    with pytest.raises(InvalidValue, match="cannot store"):
        store.write("user", "j", ValueType("any"), STR, ["u"], [minutes(0)], [object()])
    with pytest.raises(InvalidInput, match="ttl"):
        store.asof("user", "x", ["u"], [minutes(0)], ttl=timedelta(0))
    assert store.value_kind("user", "x") is None


def test_sql_looking_names_and_keys_are_only_data(store: DuckDBOfflineStore) -> None:
    hostile = 'x"; drop table kairos_offline_features; --'
    keys = ["'); drop table kairos_offline_features; --", 'a"b', "\\", "%", ""]
    store.write(hostile, hostile, STR, STR, keys, [minutes(0)] * 5, keys)
    # names that clean up to the same text still get their own tables
    store.write("user", "txn_count[7d]", INT, STR, ["u"], [minutes(0)], [7])
    store.write("user", "txn_count_7d", INT, STR, ["u"], [minutes(0)], [8])
    assert table_name("user", "txn_count[7d]") != table_name("user", "txn_count_7d")
    assert store.asof(hostile, hostile, keys, [minutes(1)] * 5).to_pylist() == keys
    assert store.asof("user", "txn_count[7d]", ["u"], [minutes(1)]).to_pylist() == [7]
    assert store.asof("user", "txn_count_7d", ["u"], [minutes(1)]).to_pylist() == [8]


# --- lifecycle -------------------------------------------------------------------------------


def test_a_file_store_keeps_its_values_across_reopening(tmp_path: Path) -> None:
    path = tmp_path / "offline.duckdb"
    first = DuckDBOfflineStore(path)
    first.write("user", "x", FLOAT, INT, [1], [minutes(0)], [1.5])
    first.close()
    first.close()  # twice is harmless
    with pytest.raises(KairosError, match="closed"):
        first.asof("user", "x", [1], [minutes(1)])
    second = offline_store_from_url(f"duckdb:///{path}")
    try:
        assert second.asof("user", "x", [1], [minutes(1)]).to_pylist() == [1.5]
    finally:
        second.close()


def test_urls() -> None:
    memory = offline_store_from_url("duckdb:///:memory:")
    memory.close()
    with pytest.raises(KairosError, match="scheme 'mysql'") as raised:
        offline_store_from_url("mysql://app:s3cret@db/kairos")
    assert "s3cret" not in str(raised.value)
    with pytest.raises(KairosError, match="names no file"):
        offline_store_from_url("duckdb://")
    with pytest.raises(KairosError, match="no scheme"):
        offline_store_from_url("offline.duckdb")


def test_threads_write_and_read_at_once(store: DuckDBOfflineStore) -> None:
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(20):
                store.write("user", f"f{worker}", INT, INT, [worker], [minutes(i)], [i])
                got = store.asof("user", f"f{worker}", [worker], [minutes(i)]).to_pylist()
                if got != [i]:
                    raise AssertionError(got)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_200k_events_by_200k_spine_rows_is_fast() -> None:
    n = 200_000
    rng = np.random.default_rng(0)
    base = np.int64(1_767_225_600_000_000)  # 2026-01-01 in microseconds
    week = 7 * 86_400 * 1_000_000
    keys = pa.array(rng.integers(0, 50_000, n))
    observed = pa.array(base + rng.integers(0, week, n)).view(pa.timestamp("us", tz="UTC"))
    store = DuckDBOfflineStore(":memory:")
    try:
        store.write("user", "amount", FLOAT, INT, keys, observed, pa.array(rng.random(n)))
        spine_keys = pa.array(rng.integers(0, 50_000, n))
        spine_times = pa.array(base + rng.integers(0, week, n)).view(pa.timestamp("us", tz="UTC"))
        started = time.perf_counter()
        got = store.asof("user", "amount", spine_keys, spine_times, ttl=timedelta(days=3))
        elapsed = time.perf_counter() - started
        assert len(got) == n and 0 < got.null_count < n
        assert elapsed < 3.0, f"as-of of {n:,} rows took {elapsed:.2f} s"
        # spot-check rows against the slow way
        event_keys, event_micros = keys.to_numpy(), observed.view(pa.int64()).to_numpy()
        values = store.asof("user", "amount", keys, observed).to_pylist()  # own time: itself
        for row in rng.integers(0, n, 50):
            key, at = spine_keys[row].as_py(), spine_times.view(pa.int64())[row].as_py()
            hits = np.flatnonzero(
                (event_keys == key) & (event_micros <= at) & (event_micros > at - 3 * week // 7)
            )
            if len(hits) == 0:
                assert got[row].as_py() is None
            else:
                latest = hits[np.argmax(event_micros[hits])]
                assert got[row].as_py() == values[latest]
    finally:
        store.close()


def test_a_later_write_of_the_same_instant_wins_after_reopening(tmp_path: Path) -> None:
    path = tmp_path / "offline.duckdb"
    store = DuckDBOfflineStore(path)
    try:
        store.write("user", "x", INT, STR, ["u", "v"], [minutes(0), minutes(0)], [1, 5])
        assert store.asof("user", "x", ["u"], [minutes(1)]).to_pylist() == [1]
        store.write("user", "x", INT, STR, ["u"], [minutes(0)], [2])
        assert store.asof("user", "x", ["u", "v"], [minutes(1)] * 2).to_pylist() == [2, 5]
    finally:
        store.close()
    reopened = DuckDBOfflineStore(path)
    try:
        store_ties = reopened.asof("user", "x", ["u"] * 3, [minutes(1)] * 3).to_pylist()
        assert store_ties == [2, 2, 2]
    finally:
        reopened.close()


# --- several features written together ---------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_features_written_together_and_apart_match_the_oracle(
    store: DuckDBOfflineStore, seed: int
) -> None:
    """Writes of random subsets of features (one table per subset, a feature spread over
    several tables) read back in one asof_many exactly as the per-feature oracle says."""
    rng = random.Random(seed)
    features = ["a", "b", "c"]
    keys = [f"k{i}" for i in range(5)]
    events: dict[str, list[Event]] = {f: [] for f in features}
    order = 0
    for batch in range(10):
        chosen = rng.sample(features, rng.randint(1, 3))
        size = rng.randint(1, 20)
        batch_keys = [rng.choice(keys) for _ in range(size)]
        observed = [minutes(rng.randint(10, 30)) for _ in range(size)]
        written = {f: [rng.randint(-99, 99) for _ in range(size)] for f in chosen}
        given = minutes(2000 + batch) if batch % 4 == 0 else None
        store.write_many(
            "user", STR, batch_keys, observed, {f: (INT, written[f]) for f in chosen}, given
        )
        inserted = given or datetime.now(UTC) + timedelta(days=365 + batch)
        for i in range(size):
            for f in chosen:
                events[f].append((batch_keys[i], observed[i], inserted, order, written[f][i]))
            order += 1
    spine_keys: list[Any] = [rng.choice([*keys, None]) for _ in range(200)]
    spine_times: list[Any] = [minutes(rng.randint(0, 40)) for _ in range(200)]
    ttls = {"a": None, "b": timedelta(minutes=4), "c": timedelta(minutes=15)}
    got = store.asof_many("user", [*features, "never"], spine_keys, spine_times, ttls)
    assert got["never"].null_count == 200
    for f in features:
        expected = [
            oracle(events[f], k, t, ttls[f]) for k, t in zip(spine_keys, spine_times, strict=True)
        ]
        assert got[f].to_pylist() == expected, f
        assert any(v is not None for v in expected)
        alone = store.asof("user", f, spine_keys, spine_times, ttls[f]).to_pylist()
        assert alone == expected


def test_a_later_write_of_one_feature_overrides_the_group_it_was_written_in(
    store: DuckDBOfflineStore,
) -> None:
    store.write_many("user", STR, ["u"], [minutes(1)], {"a": (INT, [1]), "b": (INT, [10])})
    store.write("user", "a", INT, STR, ["u"], [minutes(1)], [2])  # same instant, inserted later
    store.write("user", "b", INT, STR, ["u"], [minutes(0)], [20])  # older: loses
    got = store.asof_many("user", ["a", "b"], ["u", "u"], [minutes(1), minutes(0)])
    assert got["a"].to_pylist() == [2, None]
    assert got["b"].to_pylist() == [10, 20]


def test_write_many_refuses_mixed_lengths_and_changed_types(store: DuckDBOfflineStore) -> None:
    with pytest.raises(InvalidInput, match=r"user\.b.*lengths 1, 1 and 2"):
        store.write_many("user", STR, ["u"], [minutes(0)], {"a": (INT, [1]), "b": (INT, [1, 2])})
    with pytest.raises(InvalidInput, match="at least one feature"):
        store.write_many("user", STR, ["u"], [minutes(0)], {})
    store.write("user", "a", INT, STR, ["u"], [minutes(0)], [1])
    with pytest.raises(InvalidValue, match=r"'user\.a'.*stored with int values"):
        store.write_many("user", STR, ["u"], [minutes(1)], {"a": (STR, ["x"]), "b": (INT, [1])})
    # nothing of the refused write was kept, not even the other feature
    assert store.value_kind("user", "b") is None
    assert store.asof("user", "a", ["u"], [minutes(5)]).to_pylist() == [1]


def test_a_file_with_the_one_table_per_feature_catalog_is_read(tmp_path: Path) -> None:
    import duckdb

    path = tmp_path / "old.duckdb"
    connection = duckdb.connect(str(path))
    table = table_name("user", "age")
    connection.execute(
        "create table kairos_offline_features (namespace varchar not null, feature varchar not "
        "null, table_name varchar not null unique, value_kind varchar not null, key_kind "
        "varchar not null, ties boolean not null default false, primary key (namespace, "
        "feature))"
    )
    connection.execute(
        f'create table "{table}" (key VARCHAR, observed_at TIMESTAMPTZ not null, '
        "inserted_at TIMESTAMPTZ not null, value BIGINT)"
    )
    connection.execute(
        f'insert into "{table}" values (?, ?, ?, ?)', ["u", minutes(0), minutes(0), 41]
    )
    connection.execute(
        "insert into kairos_offline_features values ('user', 'age', ?, 'int', 'str', false)",
        [table],
    )
    connection.close()
    reopened = DuckDBOfflineStore(path)
    try:
        assert reopened.asof("user", "age", ["u"], [minutes(1)]).to_pylist() == [41]
        reopened.write("user", "age", INT, STR, ["u"], [minutes(2)], [42])
        assert reopened.asof("user", "age", ["u"], [minutes(3)]).to_pylist() == [42]
    finally:
        reopened.close()
    again = DuckDBOfflineStore(path)  # migrated once: a second open changes nothing
    try:
        assert again.asof("user", "age", ["u", "u"], [minutes(1), minutes(3)]).to_pylist() == [
            41,
            42,
        ]
    finally:
        again.close()
