"""The query log: every online query is appended and can be read back exactly.

One test body per behaviour runs over SQLite (a file under tmp_path) and PostgreSQL (database
`test`, a fresh table per test, dropped afterwards).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from datetime import time as time_of_day
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql

from kairos.errors import KairosError
from kairos.stores.codec import decode, encode
from kairos.stores.query_log import (
    BatchedQueryLog,
    LoggedQuery,
    LoggedValue,
    NullQueryLog,
    PlanInfo,
    QueryLogError,
    query_log_from_url,
)
from tests.conftest import POSTGRES_URL, need_postgres

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


@dataclass
class Backend:
    """A way to open logs on one backend, and to block its writer (a competing lock)."""

    kind: str
    url: str
    lock_table: Callable[[], AbstractContextManager[None]]
    drop_table: Callable[[], None]
    opened: list[BatchedQueryLog]

    def open(self, **settings: Any) -> BatchedQueryLog:
        log = query_log_from_url(self.url, **settings)
        assert isinstance(log, BatchedQueryLog)
        self.opened.append(log)
        return log


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    opened: list[BatchedQueryLog] = []
    if request.param == "sqlite":
        path = tmp_path / "logs" / "query_log.db"

        @contextmanager
        def lock_sqlite() -> Iterator[None]:
            conn = sqlite3.connect(path, isolation_level=None)
            try:
                conn.execute("BEGIN EXCLUSIVE")
                yield
                conn.execute("ROLLBACK")
            finally:
                conn.close()

        def drop_sqlite() -> None:
            with sqlite3.connect(path) as conn:
                conn.execute("DROP TABLE kairos_query_log")
            conn.close()

        yield Backend("sqlite", f"sqlite:///{path}", lock_sqlite, drop_sqlite, opened)
        for log in opened:
            log.close()
        return

    need_postgres()
    table = f"kairos_qlog_test_{uuid.uuid4().hex[:12]}"

    @contextmanager
    def lock_pg() -> Iterator[None]:
        with psycopg.connect(POSTGRES_URL) as conn:
            conn.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(table))
            )
            yield
            conn.rollback()

    def drop_pg() -> None:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))

    try:
        yield Backend("postgres", f"{POSTGRES_URL}?table={table}", lock_pg, drop_pg, opened)
    finally:
        for log in opened:
            log.close()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


def make_record(query_id: str, i: int = 0, *, now: datetime = T0) -> LoggedQuery:
    return LoggedQuery(
        query_id=query_id,
        now=now,
        inputs={"user.id": f"u{i}", "request.n": i},
        outputs={
            "user.balance": LoggedValue(
                float(i) + 0.5, now - timedelta(seconds=i), "resolver:balance", "v1", None, None
            ),
            "user.txn_count[7d]": LoggedValue(i, now, "expression", None, None, None),
        },
        duration_ms=1.25 * i,
        trace=[{"node": "balance", "ms": 0.5, "cached": i % 2 == 0}],
        logged_at=now + timedelta(milliseconds=3),
    )


# Every kind of feature value the log must give back as the same type and value.
EVERY_VALUE: dict[str, Any] = {
    "none": None,
    "true": True,
    "false": False,
    "zero": 0,
    "negative": -7,
    "big_int": 2**70,
    "float": 0.1,
    "whole_float": 1.0,
    "negative_zero": -0.0,
    "inf": math.inf,
    "minus_inf": -math.inf,
    "text": "héllo \x00 ✓ \"quoted\" \\ 'single'",
    "empty_text": "",
    "utc": datetime(2026, 1, 10, 12, 0, 0, 123456, tzinfo=UTC),
    "offset": datetime(2026, 1, 10, 17, 30, tzinfo=timezone(timedelta(hours=5, minutes=30))),
    "naive": datetime(2026, 1, 10, 12, 0),
    "date": date(2026, 1, 10),
    "time": time_of_day(23, 59, 59, 999999),
    "timedelta": timedelta(days=-1, seconds=5, microseconds=7),
    "decimal": Decimal("12.340"),
    "bytes": b"\x00\xffbin",
    "tuple": (1, "a", None),
    "list": [1, 2.5, "x", None, [True, {"deep": date(2020, 2, 29)}]],
    "dict": {"a": 1, "b": {"c": [datetime(2025, 12, 31, 23, 59, tzinfo=UTC)]}},
    "dollar_keys": {"$dt": "not a tag", "$map": [1]},
    "int_keys": {1: "one", 2: "two"},
    "has_many": [
        {"id": "t1", "amount": 12.5, "status": "ok", "ts": T0 - timedelta(hours=1)},
        {"id": "t2", "amount": -3.0, "status": "declined", "ts": T0 - timedelta(days=2)},
    ],
    "empty_rows": [],
}


def assert_same(got: Any, want: Any, path: str = "value") -> None:
    """Equal *and* of the same type all the way down (1 == 1.0 == True would hide a change)."""
    assert type(got) is type(want), f"{path}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), path
    elif isinstance(want, float):
        assert got == want and math.copysign(1, got) == math.copysign(1, want), path
    elif isinstance(want, datetime):
        assert got == want and got.utcoffset() == want.utcoffset(), f"{path}: {got!r} {want!r}"
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{path}[{key!r}]")
    elif isinstance(want, list | tuple):
        assert len(got) == len(want), path
        for index, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{index}]")
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def assert_same_record(got: LoggedQuery | None, want: LoggedQuery) -> None:
    assert got is not None, f"{want.query_id!r} was not logged"
    assert got.query_id == want.query_id
    # `now`/`logged_at` are timestamp columns: the instant is kept (Postgres answers in UTC).
    assert got.now == want.now and got.now.utcoffset() is not None
    assert got.logged_at == want.logged_at and got.logged_at.utcoffset() is not None
    assert got.duration_ms == want.duration_ms
    assert_same(got.inputs, want.inputs, "inputs")
    assert_same(got.trace, want.trace, "trace")
    assert list(got.outputs) == list(want.outputs)
    for name, out in want.outputs.items():
        assert_same(got.outputs[name].value, out.value, f"outputs[{name!r}]")
        assert got.outputs[name].observed_at == out.observed_at
        assert (got.outputs[name].source, got.outputs[name].version) == (out.source, out.version)
        assert got.outputs[name].error_code == out.error_code
        assert got.outputs[name].error_message == out.error_message


def test_every_value_type_round_trips_exactly(backend: Backend) -> None:
    record = LoggedQuery(
        query_id="q-every-type",
        now=datetime(2026, 1, 10, 13, 0, 0, 1, tzinfo=timezone(timedelta(hours=1))),
        inputs={"user.id": "u1", "$odd.input": 3, **EVERY_VALUE},
        outputs={
            **{
                f"probe.{name}": LoggedValue(value, T0, "resolver:probe", "v7", None, None)
                for name, value in EVERY_VALUE.items()
            },
            "user.nan": LoggedValue(math.nan, None, None, None, None, None),
            "user.risk": LoggedValue(
                None, None, "model:risk", "3", "timeout", "model 'risk' took longer than 50ms"
            ),
        },
        duration_ms=12.345678901234,
        trace=[{"node": "risk", "ms": 50.0, "error": "timeout"}, {"node": "probe", "rows": 2}],
        logged_at=T0 + timedelta(microseconds=1),
    )
    log = backend.open()
    log.append(record)
    assert_same_record(log.get("q-every-type"), record)
    assert log.get("q-missing") is None
    log.close()

    # A new log on the same table (as `kairos log show` in another process) reads it back.
    reopened = backend.open()
    assert_same_record(reopened.get("q-every-type"), record)


def test_get_flushes_a_just_appended_record(backend: Backend) -> None:
    # A writer that would otherwise wait 30 s for more records before writing a batch.
    log = backend.open(max_wait=30.0, max_batch=10_000)
    record = make_record("q-just-made", 3)
    started = time.monotonic()
    log.append(record)
    assert_same_record(log.get("q-just-made"), record)
    assert time.monotonic() - started < 5.0


def test_recent_is_newest_first(backend: Backend) -> None:
    log = backend.open()
    for i in range(5):
        log.append(make_record(f"q{i}", i))
    assert [r.query_id for r in log.recent(3)] == ["q4", "q3", "q2"]
    assert [r.query_id for r in log.recent()] == ["q4", "q3", "q2", "q1", "q0"]
    assert_same_record(log.recent(1)[0], make_record("q4", 4))


def test_recent_without_nested_values_keeps_everything_else(backend: Backend) -> None:
    log = backend.open()
    rows = [{"id": "t1", "amount": 2.5, "ts": T0}, {"id": "t2", "amount": 1.0, "ts": T0}]
    record = make_record("q-rows", 2)
    seen = LoggedValue(rows, T0 - timedelta(seconds=30), "resolver:txns", "v3", None, None, 30.0)
    record = dataclasses.replace(record, values={**record.values, "user.transactions": seen})
    log.append(record)
    (full,) = log.recent(1)
    (light,) = log.recent(1, nested=False)
    assert full.values["user.transactions"].value == rows
    assert light.values["user.transactions"] == seen._replace(value=None)
    assert {n: v for n, v in light.values.items() if n != "user.transactions"} == {
        n: v for n, v in full.values.items() if n != "user.transactions"
    }
    assert (light.trace, light.inputs, light.now) == (full.trace, full.inputs, full.now)


def test_appends_are_written_in_batches(backend: Backend) -> None:
    log = backend.open(max_queue=5000)
    records = [make_record(f"q{i:04d}", i) for i in range(2000)]
    for record in records:
        log.append(record)
    log.flush()
    assert log.dropped == 0
    assert log.records_written == 2000
    assert 1 <= log.batches_written <= 2000 // 20, log.batches_written
    stored = log.recent(limit=5000)
    assert [r.query_id for r in stored] == [r.query_id for r in reversed(records)]
    for i in (0, 999, 1999):
        assert_same_record(log.get(f"q{i:04d}"), records[i])


def test_a_full_queue_drops_instead_of_raising(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    log = backend.open(max_queue=5, max_batch=1, put_timeout=0.001)
    with backend.lock_table():  # the writer blocks on its first batch; the queue fills up
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="kairos.stores.query_log"):
            for i in range(50):
                log.append(make_record(f"q{i}", i))
        appended_in = time.monotonic() - started
    log.flush()
    assert log.dropped > 0
    assert "dropped a record because its queue is full" in caplog.text
    assert appended_in < 2.0  # each full-queue append waited ~put_timeout, not for the lock
    kept = log.recent(limit=100)
    assert len(kept) == 50 - log.dropped == log.records_written
    for stored in kept:
        assert_same_record(stored, make_record(stored.query_id, int(stored.query_id[1:])))


def test_a_failing_database_is_reported_by_flush_not_raised_into_queries(
    backend: Backend,
) -> None:
    log = backend.open(retry_for=0.2)
    log.append(make_record("q-ok", 1))
    log.flush()
    backend.drop_table()
    log.append(make_record("q-lost", 2))  # the query goes on
    with pytest.raises(QueryLogError, match="could not write 1 records"):
        log.flush()
    assert log.lost == 1 and log.records_written == 1
    log.append(make_record("q-lost-too", 3))  # the writer survived and keeps trying
    with pytest.raises(QueryLogError, match="could not write 1 records"):
        log.flush()
    assert log.lost == 2


def test_async_wrappers(backend: Backend) -> None:
    log = backend.open()

    async def main() -> tuple[LoggedQuery | None, list[LoggedQuery]]:
        log.append(make_record("q-async", 1))
        await log.aflush()
        return await log.aget("q-async"), await log.arecent(1)

    got, recent = asyncio.run(main())
    assert_same_record(got, make_record("q-async", 1))
    assert [r.query_id for r in recent] == ["q-async"]


def test_close_flushes_and_later_appends_are_dropped(backend: Backend) -> None:
    log = backend.open(max_wait=30.0, max_batch=10_000)
    log.append(make_record("q-before-close", 1))
    log.close()
    log.close()  # twice is fine
    log.append(make_record("q-after-close", 2))  # never raises into a query
    assert log.dropped == 1
    with pytest.raises(QueryLogError, match="closed"):
        log.get("q-before-close")
    reopened = backend.open()
    assert_same_record(reopened.get("q-before-close"), make_record("q-before-close", 1))
    assert reopened.get("q-after-close") is None


def test_duplicate_query_id_keeps_the_first_record(backend: Backend) -> None:
    log = backend.open()
    log.append(make_record("q-dup", 1))
    log.append(make_record("q-dup", 2))
    log.append(make_record("q-other", 3))
    assert_same_record(log.get("q-dup"), make_record("q-dup", 1))
    assert_same_record(log.get("q-other"), make_record("q-other", 3))
    assert log.lost == 0


def test_unencodable_value_is_kept_as_its_repr(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    log = backend.open()
    record = make_record("q-odd", 1)
    odd = uuid.UUID(int=7)
    record.inputs["odd"] = odd
    with caplog.at_level(logging.WARNING, logger="kairos.stores.query_log"):
        log.append(record)
        got = log.get("q-odd")
    assert got is not None
    assert got.inputs == {**record.inputs, "odd": repr(odd)}
    assert "UUID" in caplog.text


# --- crash safety (SQLite file) ---------------------------------------------------------------

CRASHING_WRITER = textwrap.dedent(
    """
    import itertools, sys
    from datetime import UTC, datetime, timedelta
    from kairos.stores.query_log import BatchedQueryLog, LoggedQuery, LoggedValue

    T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)

    def record(query_id, i):
        rows = [{"id": f"t{i}-{n}", "amount": n * 1.5, "ts": T0 - timedelta(minutes=n)}
                for n in range(20)]
        return LoggedQuery(
            query_id=query_id, now=T0, inputs={"user.id": f"u{i}", "i": i},
            outputs={"user.transactions": LoggedValue(rows, T0, "sql:txns", "1", None, None)},
            duration_ms=float(i), trace=[{"node": "txns", "i": i}], logged_at=T0)

    log = BatchedQueryLog.sqlite(sys.argv[1], max_wait=0.001, max_batch=50)
    for i in range(500):
        log.append(record(f"flushed-{i}", i))
    log.flush()
    print("flushed", flush=True)
    for i in itertools.count():
        log.append(record(f"after-{i}", i))
    """
)


def crash_record(query_id: str, i: int) -> LoggedQuery:
    rows = [
        {"id": f"t{i}-{n}", "amount": n * 1.5, "ts": T0 - timedelta(minutes=n)} for n in range(20)
    ]
    return LoggedQuery(
        query_id=query_id,
        now=T0,
        inputs={"user.id": f"u{i}", "i": i},
        outputs={"user.transactions": LoggedValue(rows, T0, "sql:txns", "1", None, None)},
        duration_ms=float(i),
        trace=[{"node": "txns", "i": i}],
        logged_at=T0,
    )


def test_kill_9_keeps_every_flushed_record_and_no_half_rows(tmp_path: Path) -> None:
    path = tmp_path / "crash" / "log.db"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
    child = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # it warns about drops once its queue fills
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "flushed"
        time.sleep(0.3)  # let it commit more batches; the kill lands mid-stream
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()

    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    conn.close()
    with BatchedQueryLog.sqlite(path) as log:
        for i in range(500):
            assert_same_record(log.get(f"flushed-{i}"), crash_record(f"flushed-{i}", i))
        stored = log.recent(limit=1_000_000)  # decodes every row there is
        after = [r for r in stored if r.query_id.startswith("after-")]
        assert len(stored) == 500 + len(after)
        for record in after:
            assert_same_record(record, crash_record(record.query_id, int(record.query_id[6:])))


# --- how long an answered decision stays uncommitted ------------------------------------------


@dataclass
class Commits:
    """When each record's batch was committed (the backend's write returned)."""

    at: dict[str, float]

    @classmethod
    def watch(cls, log: BatchedQueryLog) -> Commits:
        commits = cls({})
        write = log._backend.write_batch

        def timed(rows: Any) -> None:
            write(rows)
            done = time.monotonic()
            for row in rows:
                commits.at[row.query_id] = done

        log._backend.write_batch = timed  # type: ignore[method-assign]
        return commits


async def serve_busily(log: BatchedQueryLog, seconds: float, queries: int = 16) -> dict[str, float]:
    """`queries` concurrent 'queries' on one event loop, each 0.3 ms of CPU then its record
    appended with `append_later` (as the client does), then 1 ms of network; the moment each
    was answered, by query id."""
    answered: dict[str, float] = {}
    end = time.monotonic() + seconds

    async def query(number: int) -> None:
        for i in itertools.count():
            if time.monotonic() >= end:
                return
            started = time.perf_counter()
            while time.perf_counter() - started < 0.0003:  # the query's own work
                pass
            query_id = f"q{number}-{i}"
            await log.append_later(functools.partial(lambda q: [make_record(q, 1)], query_id), 1)
            answered[query_id] = time.monotonic()
            await asyncio.sleep(0.001)

    await asyncio.gather(*(query(n) for n in range(queries)))
    return answered


def test_a_busy_event_loop_leaves_no_answered_record_uncommitted_for_long(
    backend: Backend,
) -> None:
    log = backend.open()
    commits = Commits.watch(log)
    answered = asyncio.run(serve_busily(log, 1.5))
    log.flush()
    lags = sorted(commits.at[q] - at for q, at in answered.items())
    assert len(lags) == len(answered) > 500
    # The bound a kill -9 of a real server keeps (50 ms) is measured in
    # test_query_log_durability.py; here, with the event loop never idle, 3x that for a
    # shared machine's noise. The writer before the fix left records 300-1400 ms here.
    assert lags[-1] < 0.150, f"p50 {lags[len(lags) // 2] * 1000:.1f} ms, max {lags[-1] * 1000:.1f}"


def test_a_log_behind_makes_queries_wait_before_they_answer(backend: Backend) -> None:
    log = backend.open(retry_for=30.0)

    async def main() -> None:
        await log.append_later(lambda: [make_record("q-first", 1)], 1)  # the log is current
        await asyncio.sleep(0.1)  # the writer is stuck on the lock: q-first is 100 ms old
        waiting = asyncio.create_task(log.append_later(lambda: [make_record("q-next", 2)], 1))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # it does not answer while q-first is at risk
        locked.close()  # the database is free again
        await asyncio.wait_for(waiting, 10)

    with contextlib.ExitStack() as locked:
        locked.enter_context(backend.lock_table())
        asyncio.run(main())
    assert {r.query_id for r in log.recent(10)} == {"q-first", "q-next"}


def test_acknowledged_appends_return_once_committed_and_share_commits(backend: Backend) -> None:
    log = backend.open(durability="acknowledged")
    commits = Commits.watch(log)

    async def append(query_id: str) -> bool:
        await log.append_later(lambda: [make_record(query_id, 1)], 1)
        return query_id in commits.at  # committed before append_later returned

    async def main() -> list[bool]:
        return await asyncio.gather(*(append(f"q{i}") for i in range(64)))

    assert all(asyncio.run(main()))
    assert log.batches_written < 64  # concurrent queries shared commits
    assert len(log.recent(100)) == 64


def test_an_acknowledged_append_raises_when_its_record_cannot_be_written(
    backend: Backend,
) -> None:
    log = backend.open(durability="acknowledged", retry_for=0.2)
    asyncio.run(log.append_later(lambda: [make_record("q-ok", 1)], 1))
    backend.drop_table()
    with pytest.raises(QueryLogError, match="could not write this decision"):
        asyncio.run(log.append_later(lambda: [make_record("q-lost", 2)], 1))
    assert log.lost == 1


def test_durability_must_be_one_it_knows(tmp_path: Path) -> None:
    with pytest.raises(KairosError, match="durability 'always' is not one of batched, ackn"):
        query_log_from_url(f"sqlite:///{tmp_path / 'log.db'}", durability="always")


# --- URLs ---------------------------------------------------------------------------------------


def test_urls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(query_log_from_url("none://"), NullQueryLog)
    null = query_log_from_url("none://")
    null.append(make_record("q", 1))
    assert null.get("q") is None and null.recent() == []

    monkeypatch.chdir(tmp_path)
    relative = query_log_from_url("sqlite:///rel/dir/log.db")
    try:
        relative.append(make_record("q-rel", 1))
        relative.flush()
    finally:
        relative.close()
    assert (tmp_path / "rel" / "dir" / "log.db").exists()

    absolute = tmp_path / "abs" / "log.db"
    log = query_log_from_url(f"sqlite:///{absolute}?table=other_log")
    try:
        log.append(make_record("q-abs", 1))
        assert_same_record(log.get("q-abs"), make_record("q-abs", 1))
    finally:
        log.close()
    with sqlite3.connect(absolute) as conn:
        assert conn.execute("SELECT query_id FROM other_log").fetchall() == [("q-abs",)]
    conn.close()


def test_url_errors_name_the_scheme_and_hide_the_password() -> None:
    with pytest.raises(KairosError, match="'mysql'") as unsupported:
        query_log_from_url("mysql://bob:s3cret@db.example/prod")
    assert "s3cret" not in str(unsupported.value)
    assert "bob:***@db.example" in str(unsupported.value)

    with pytest.raises(KairosError, match="no scheme"):
        query_log_from_url("query_log.db")
    with pytest.raises(KairosError, match="file path"):
        query_log_from_url("sqlite:///:memory:")
    with pytest.raises(KairosError, match="not allowed"):
        query_log_from_url("sqlite:///x.db?table=drop table")

    with pytest.raises(QueryLogError) as unreachable:
        query_log_from_url("postgresql://postgres:s3cret@127.0.0.1:1/test?table=t")
    assert "s3cret" not in str(unreachable.value)
    assert unreachable.value.__cause__ is None


def test_a_records_dict_is_what_the_log_gives_back(tmp_path: Path) -> None:
    """`to_dict()` is the record as `GET /v1/log/{query_id}` shows it, outputs as stored."""
    record = make_record("as-dict", 2)
    assert record.to_dict() == {
        "query_id": "as-dict",
        "now": T0,
        "inputs": {"user.id": "u2", "request.n": 2},
        "outputs": {
            "user.balance": {
                "value": 2.5,
                "observed_at": T0 - timedelta(seconds=2),
                "source": "resolver:balance",
                "version": "v1",
                "error_code": None,
                "error_message": None,
                "age_s": None,
            },
            "user.txn_count[7d]": {
                "value": 2,
                "observed_at": T0,
                "source": "expression",
                "version": None,
                "error_code": None,
                "error_message": None,
                "age_s": None,
            },
        },
        "values": {name: value.to_dict() for name, value in record.outputs.items()},
        "model_calls": [],
        "llm_calls": [],
        "plan": None,
        "duration_ms": 2.5,
        "trace": [{"node": "balance", "ms": 0.5, "cached": True}],
        "logged_at": T0 + timedelta(milliseconds=3),
    }
    with BatchedQueryLog.sqlite(tmp_path / "log.db") as log:
        log.append(record)
        got = log.get("as-dict")
    assert got is not None and got.to_dict() == record.to_dict()


def test_a_record_reads_back_from_its_dict_as_json() -> None:
    """`from_dict` is `to_dict` undone, from plain JSON (times as ISO text) or from tagged
    JSON (what a remote client reads): the same record."""
    record = dataclasses.replace(
        make_record("from-dict", 3),
        plan=PlanInfo("fp", "defs", ("user.id",), ("user.balance",), {"user.balance": "v1"}),
    )
    plain = orjson.loads(orjson.dumps(record.to_dict()))
    assert isinstance(plain["now"], str)
    assert LoggedQuery.from_dict(plain) == record
    assert LoggedQuery.from_dict(decode(encode(record.to_dict()))) == record


def test_each_value_is_stored_once_and_rows_as_columns(tmp_path: Path) -> None:
    """An output is not stored again among the values, and a has-many's column names are
    written once per value, not once per row."""
    rows = [{"id": f"t{i}", "amount": float(i), "status": "ok"} for i in range(200)]
    record = make_record("compact", 1)
    record = LoggedQuery(
        record.query_id, record.now, record.inputs, record.outputs, record.duration_ms,
        record.trace, record.logged_at,
        values={
            **record.outputs,
            "user.transactions": LoggedValue(rows, T0, "resolver:txns", "v2", None, None),
        },
    )  # fmt: skip
    with BatchedQueryLog.sqlite(tmp_path / "log.db") as log:
        log.append(record)
        got = log.get("compact")
    assert got is not None and got.values["user.transactions"].value == rows
    assert list(got.values) == ["user.transactions", "user.balance", "user.txn_count[7d]"]
    with sqlite3.connect(tmp_path / "log.db") as db:
        stored, outputs = db.execute(
            "select feature_values, outputs from kairos_query_log where query_id = 'compact'"
        ).fetchone()
    assert "user.balance" in outputs and "user.balance" not in stored
    assert stored.count('"amount"') == 1 and '"$rows"' in stored
    naive = len(orjson.dumps(rows))
    assert len(stored) < 0.6 * naive


def test_rows_written_by_something_else_are_a_query_log_error_not_a_crash(
    tmp_path: Path,
) -> None:
    """A row whose `now` is not a time fails its read with QueryLogError (a 503 over HTTP); a
    corrupt plan costs only that plan: the records naming it read back without one."""
    path = tmp_path / "log.db"
    with BatchedQueryLog.sqlite(path) as log:
        log.append(make_record("fine", 1))
        log.append(make_record("odd", 2))
        log.flush()
        with sqlite3.connect(path) as db:
            db.execute("update kairos_query_log set now = 'yesterday' where query_id = 'odd'")
            db.execute("insert into kairos_query_log_plans values ('p1', '{\"broken\": 1}')")
            db.execute("update kairos_query_log set plan = 'p1' where query_id = 'fine'")
        db.close()
        with pytest.raises(QueryLogError, match="cannot be read"):
            log.get("odd")
        fine = log.get("fine")
    assert fine is not None and fine.plan is None and fine.outputs["user.balance"].value == 1.5
