"""The DuckDB offline store shared by processes: writers in several processes at once (while
small segments are merged) lose nothing and never meet a lock, a reader in another process sees
every finished write and never a half one, a follower (`changed_rows`) reads each write of the
others exactly once, and a store file of the older layout is moved into segments once, whoever
opens it first, with a crash in the middle of the move recovered."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import pytest

from kairos.definitions.types import ValueType
from kairos.errors import KairosError
from kairos.stores.offline import DuckDBOfflineStore, table_name
from kairos.stores.offline import duckdb as offline_duckdb
from kairos.stores.offline.duckdb import MERGE_AT
from kairos.stores.offline.segments import Layout

T0 = datetime(2026, 1, 1, tzinfo=UTC)
INT, STR = ValueType("int"), ValueType("str")
WRITERS, WRITES = 3, 60

# One process writing: a feature every writer shares (one table, so one seq and many merges)
# and a pair written together that only it writes.
WRITER = textwrap.dedent("""
    import sys
    from datetime import UTC, datetime, timedelta
    from kairos.definitions.types import ValueType
    from kairos.stores.offline import DuckDBOfflineStore

    path, worker, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = DuckDBOfflineStore(path)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(count):
        at = t0 + timedelta(seconds=i)
        store.write("user", "score", ValueType("int"), ValueType("str"), [f"w{worker}-{i}"],
                    [at], [worker * 100_000 + i])
        if i % 10 == 0:
            store.write_many("user", ValueType("str"), [f"w{worker}"], [at],
                             {"a": (ValueType("int"), [i]), "b": (ValueType("str"), [str(i)])})
    store.close()
""")


def expected_score(key: str) -> int:
    worker, _, i = key[1:].partition("-")
    return int(worker) * 100_000 + int(i)


def start_writers(path: Path) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(w), str(WRITES)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(WRITERS)
    ]


def finish(writers: list[subprocess.Popen[str]]) -> None:
    for writer in writers:
        _, stderr = writer.communicate(timeout=120)
        assert writer.returncode == 0, stderr
        assert "lock" not in stderr.lower(), stderr


ALL_KEYS = [f"w{w}-{i}" for w in range(WRITERS) for i in range(WRITES)]


def test_writers_in_several_processes_lose_nothing_while_another_reads(tmp_path: Path) -> None:
    path = tmp_path / "offline.duckdb"
    reader = DuckDBOfflineStore(path)
    writers = start_writers(path)
    seen: dict[str, int] = {}
    try:
        while any(w.poll() is None for w in writers):
            got = reader.asof("user", "score", ALL_KEYS, [T0 + timedelta(days=1)] * len(ALL_KEYS))
            for key, value in zip(ALL_KEYS, got.to_pylist(), strict=True):
                if value is not None:  # a write is there whole, with its value, or not at all
                    assert value == expected_score(key), key
                    seen[key] = value
                elif key in seen:
                    raise AssertionError(f"{key} was read, then vanished")
            time.sleep(0.01)  # leave the writers some of this machine
        finish(writers)
        got = reader.asof("user", "score", ALL_KEYS, [T0 + timedelta(days=1)] * len(ALL_KEYS))
        assert got.to_pylist() == [expected_score(k) for k in ALL_KEYS]
        assert len(seen) > 0  # the reader read while they wrote
        latest = reader.latest_rows("user", ["score"])
        assert latest.num_rows == WRITERS * WRITES
        # the pair written together: each writer's last write, read in one join
        pairs = reader.asof_many(
            "user",
            ["a", "b"],
            [f"w{w}" for w in range(WRITERS)],
            [T0 + timedelta(days=1)] * WRITERS,
        )
        last = (WRITES - 1) // 10 * 10
        assert pairs["a"].to_pylist() == [last] * WRITERS
        assert pairs["b"].to_pylist() == [str(last)] * WRITERS
        # small segments were merged as they piled up
        folder = path / table_name("user", "score")
        assert len(list(folder.glob("*.parquet"))) < 2 * MERGE_AT
    finally:
        for writer in writers:
            writer.kill()
        reader.close()


def test_a_follower_reads_every_write_of_other_processes_exactly_once(tmp_path: Path) -> None:
    path = tmp_path / "offline.duckdb"
    follower = DuckDBOfflineStore(path)
    writers = start_writers(path)
    reads: list[str] = []
    position: dict[str, int] = {}
    try:
        while True:
            running = any(w.poll() is None for w in writers)
            rows, position = follower.changed_rows("user", ["score"], position)
            keys = rows.column("key").to_pylist()
            values = rows.column("score").to_pylist()
            assert values == [expected_score(k) for k in keys]
            reads += keys
            if not running:
                break
            time.sleep(0.01)
        finish(writers)
        rows, position = follower.changed_rows("user", ["score"], position)
        reads += rows.column("key").to_pylist()
        assert sorted(reads) == sorted(ALL_KEYS)  # each once: none missed, none twice
        assert follower.changed_rows("user", ["score"], position)[0].num_rows == 0
    finally:
        for writer in writers:
            writer.kill()
        follower.close()


# --- the older layout: one DuckDB file ----------------------------------------------------


def old_store(path: Path) -> None:
    """A store file as kairos wrote it before segments: a table of two features written
    together (with ties), a timedelta and a JSON feature of their own."""
    connection = duckdb.connect(str(path))
    connection.execute("set TimeZone = 'UTC'")
    connection.execute(
        "create table kairos_offline_segments (table_name varchar primary key, namespace "
        "varchar not null, key_kind varchar not null, ties boolean not null default false)"
    )
    connection.execute(
        "create table kairos_offline_columns (namespace varchar not null, feature varchar not "
        "null, table_name varchar not null, column_name varchar not null, value_kind varchar "
        "not null, primary key (namespace, feature, table_name))"
    )
    pair = table_name("user", "age+name")
    connection.execute(
        f'create table "{pair}" (key VARCHAR, observed_at TIMESTAMPTZ not null, inserted_at '
        "TIMESTAMPTZ not null, v0 BIGINT, v1 VARCHAR)"
    )
    rows: list[Any] = [
        ("u", T0, T0, 41, "Ada"),
        ("u", T0, T0, 42, "Ada L."),  # a tie: the later row wins
        ("v", T0 + timedelta(hours=1), T0, 7, None),
    ]
    connection.executemany(f'insert into "{pair}" values (?, ?, ?, ?, ?)', rows)
    connection.execute(
        "insert into kairos_offline_segments values (?, 'user', 'str', true)", [pair]
    )
    for feature, column, kind in (("age", "v0", "int"), ("name", "v1", "str")):
        connection.execute(
            "insert into kairos_offline_columns values ('user', ?, ?, ?, ?)",
            [feature, pair, column, kind],
        )
    for feature, sql_type, kind, value in (
        ("wait", "INTERVAL", "timedelta", timedelta(days=2, microseconds=5)),
        ("tags", "JSON", "list", '[1,"a"]'),
    ):
        table = table_name("user", feature)
        connection.execute(
            f'create table "{table}" (key VARCHAR, observed_at TIMESTAMPTZ not null, '
            f"inserted_at TIMESTAMPTZ not null, value {sql_type})"
        )
        connection.execute(f'insert into "{table}" values (?, ?, ?, ?)', ["u", T0, T0, value])
        connection.execute(
            "insert into kairos_offline_segments values (?, 'user', 'str', false)", [table]
        )
        connection.execute(
            "insert into kairos_offline_columns values ('user', ?, ?, 'value', ?)",
            [feature, table, kind],
        )
    connection.close()


def assert_old_values(store: DuckDBOfflineStore) -> None:
    at = [T0 + timedelta(days=1)] * 2
    both = store.asof_many("user", ["age", "name"], ["u", "v"], at)
    assert both["age"].to_pylist() == [42, 7]
    assert both["name"].to_pylist() == ["Ada L.", None]
    assert store.asof("user", "wait", ["u"], at[:1]).to_pylist() == [
        timedelta(days=2, microseconds=5)
    ]
    assert store.value_kind("user", "tags") == "list"
    assert store.asof("user", "tags", ["u"], at[:1]).to_pylist() == ['[1,"a"]']


def test_an_older_store_file_is_moved_into_segments_and_kept_beside(tmp_path: Path) -> None:
    path = tmp_path / "offline.duckdb"
    old_store(path)
    store = DuckDBOfflineStore(path)
    try:
        assert path.is_dir() and (tmp_path / "offline.duckdb.old").is_file()
        assert_old_values(store)
        store.write("user", "age", INT, STR, ["u"], [T0], [43])  # a tie again: the later wins
        assert store.asof("user", "age", ["u"], [T0]).to_pylist() == [43]
    finally:
        store.close()
    again = DuckDBOfflineStore(path)  # moved once: opening it again changes nothing
    try:
        assert again.asof("user", "age", ["u"], [T0]).to_pylist() == [43]
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            ".offline.duckdb.lock",
            "offline.duckdb",
            "offline.duckdb.old",
        ]
    finally:
        again.close()


def test_processes_opening_an_older_store_at_once_move_it_once(tmp_path: Path) -> None:
    path = tmp_path / "offline.duckdb"
    old_store(path)
    opener = textwrap.dedent("""
        import sys
        from datetime import UTC, datetime
        from kairos.stores.offline import DuckDBOfflineStore
        store = DuckDBOfflineStore(sys.argv[1])
        t = datetime(2026, 1, 2, tzinfo=UTC)
        print(store.asof("user", "age", ["u"], [t]).to_pylist())
        store.close()
    """)
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", opener, str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for process in openers:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert out.strip() == "[42]"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "offline.duckdb",
        "offline.duckdb.old",
    ]


def test_a_move_cut_short_is_finished_or_done_again(tmp_path: Path) -> None:
    path = tmp_path / "offline.duckdb"
    old_store(path)
    # a crash after the export, once the file was renamed away: the export is put in place
    DuckDBOfflineStore(path).close()
    os.rename(path, tmp_path / "offline.duckdb.migrating")
    (tmp_path / "offline.duckdb.migrating" / ".complete").touch()
    store = DuckDBOfflineStore(path)
    try:
        assert_old_values(store)
    finally:
        store.close()
    # a crash in the middle of the export: the file is still there, so it is exported again
    other = tmp_path / "other.duckdb"
    old_store(other)
    half = tmp_path / "other.duckdb.migrating"
    (half / "junk").mkdir(parents=True)
    store = DuckDBOfflineStore(other)
    try:
        assert_old_values(store)
        assert not half.exists() and not (other / "junk").exists()
    finally:
        store.close()


def test_an_older_store_held_by_another_process_names_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "offline.duckdb"
    old_store(path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); print('held', "
            "flush=True); time.sleep(60)",
            str(path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(KairosError, match="stop the process that holds it"):
            DuckDBOfflineStore(path)
        assert path.is_file()  # left as it was
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    store = DuckDBOfflineStore(path)  # once it is free, the move happens
    try:
        assert_old_values(store)
    finally:
        store.close()


def test_segments_a_merge_cut_short_left_behind_are_read_once(tmp_path: Path) -> None:
    path = tmp_path / "offline.duckdb"
    store = DuckDBOfflineStore(path)
    folder = path / table_name("user", "score")
    try:
        for i in range(MERGE_AT - 1):
            store.write("user", "score", INT, STR, [f"k{i}"], [T0 + timedelta(seconds=i)], [i])
        inputs = {p.name: p.read_bytes() for p in folder.glob("*.parquet")}
        store.write("user", "score", INT, STR, ["last"], [T0], [-1])  # merges all of them
        assert len(list(folder.glob("*.parquet"))) == 1
        for name, data in inputs.items():  # as a crash between the merge and the removal
            (folder / name).write_bytes(data)
        keys = [f"k{i}" for i in range(MERGE_AT - 1)]
        rows, position = store.changed_rows("user", ["score"], {})
        assert sorted(rows.column("key").to_pylist()) == sorted([*keys, "last"])
        got = store.asof("user", "score", keys, [T0 + timedelta(days=1)] * len(keys))
        assert got.to_pylist() == list(range(MERGE_AT - 1))
        store.write("user", "score", INT, STR, ["after"], [T0], [7])
        rows, _ = store.changed_rows("user", ["score"], position)
        assert rows.column("key").to_pylist() == ["after"]
    finally:
        store.close()


def test_merged_segments_are_merged_again_a_tier_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tier 0 under 1800 bytes holds a one-row segment; sixteen rows merged are tier 1
    monkeypatch.setattr(offline_duckdb, "TIER_BASE", 1800)
    store = DuckDBOfflineStore(tmp_path / "offline.duckdb")
    keys = [f"k{i}" for i in range(MERGE_AT * MERGE_AT + 20)]
    try:
        for i, key in enumerate(keys):
            store.write("user", "x", INT, STR, [key], [T0 + timedelta(seconds=i)], [i])
        listing = Layout(tmp_path / "offline.duckdb").listing(table_name("user", "x"))
        assert len(listing.segments) < 2 * MERGE_AT
        oldest = listing.segments[0]
        assert oldest.first == 1 and oldest.seq >= MERGE_AT * MERGE_AT  # merged twice over
        got = store.asof("user", "x", keys, [T0 + timedelta(days=1)] * len(keys))
        assert got.to_pylist() == list(range(len(keys)))
    finally:
        store.close()


def test_a_writer_killed_mid_write_loses_nothing_it_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "offline.duckdb"
    acknowledging = WRITER.replace(
        "[worker * 100_000 + i])", "[worker * 100_000 + i]); print(i, flush=True)"
    )
    writer = subprocess.Popen(
        [sys.executable, "-c", acknowledging, str(path), "0", "100000"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None
    try:
        acknowledged = [int(writer.stdout.readline()) for _ in range(40)]
        os.kill(writer.pid, signal.SIGKILL)  # most likely inside a write, holding its lock
        writer.wait(30)
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
    store = DuckDBOfflineStore(path)  # its lock went with it: this one writes at once
    try:
        store.write("user", "score", INT, STR, ["after"], [T0], [1])
        keys = [f"w0-{i}" for i in acknowledged]
        got = store.asof("user", "score", keys, [T0 + timedelta(days=1)] * len(keys))
        assert got.to_pylist() == [expected_score(k) for k in keys]
        assert store.asof("user", "score", ["after"], [T0]).to_pylist() == [1]
    finally:
        store.close()
