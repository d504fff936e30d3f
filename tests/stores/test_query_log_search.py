"""Search of the query log: by entity, time, feature and model, newest first, checked against
the slow obvious answer (every record filtered in Python) on SQLite and PostgreSQL; and a log
file written before search existed keeps its rows and is searchable by time."""

from __future__ import annotations

import dataclasses
import random
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg import sql

from kairos.stores.query_log import (
    BatchedQueryLog,
    LoggedQuery,
    LoggedValue,
    PlanInfo,
    Search,
    query_log_from_url,
)
from tests.conftest import POSTGRES_URL, need_postgres

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)

# Three plans: what each touched and which model versions it called.
PLANS = [
    PlanInfo("plan-a", "defs1", ("user.id",), ("user.risk",),
             {"user.id": None, "user.txn_count[1d]": None, "user.risk": "risk@v1"}, ("risk@v1",)),
    PlanInfo("plan-b", "defs2", ("user.id",), ("user.risk",),
             {"user.id": None, "user.txn_count[1d]": None, "user.risk": "risk@v2"}, ("risk@v2",)),
    PlanInfo("plan-c", "defs2", ("user.id", "merchant.id"), ("user.name",),
             {"user.id": None, "merchant.id": None, "user.name": "user.sql@3"}),
]  # fmt: skip

Open = Callable[..., BatchedQueryLog]


def _drop_pg(table: str) -> None:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        for name in (table, f"{table}_keys", f"{table}_plans"):
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.fixture(params=["sqlite", "postgres"])
def open_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Open]:
    """`open_log()` opens a log on this test's own SQLite file or PostgreSQL tables (dropped
    afterwards); every log opened is closed."""
    opened: list[BatchedQueryLog] = []
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'query_log.db'}"
        table = None
    else:
        need_postgres()
        table = f"kairos_qsearch_{uuid.uuid4().hex[:12]}"
        url = f"{POSTGRES_URL}?table={table}"

    def open_log(**settings: Any) -> BatchedQueryLog:
        log = query_log_from_url(url, **settings)
        assert isinstance(log, BatchedQueryLog)
        opened.append(log)
        return log

    try:
        yield open_log
    finally:
        for log in opened:
            log.close()
        if table is not None:
            _drop_pg(table)


def decision(
    query_id: str,
    now: datetime,
    inputs: dict[str, Any],
    plan: PlanInfo | None = None,
) -> LoggedQuery:
    risk = LoggedValue(0.5, now, "model:risk", plan.models[0] if plan and plan.models else None,
                       None, None)  # fmt: skip
    return LoggedQuery(
        query_id=query_id,
        now=now,
        inputs=inputs,
        outputs={"user.risk": risk},
        duration_ms=1.0,
        trace=[],
        logged_at=now + timedelta(milliseconds=2),
        plan=plan,
    )


def many_decisions(count: int = 120) -> list[LoggedQuery]:
    """Users u0-u4 and merchants m0-m2 over two hours, some sharing a `now` to the
    microsecond (ties go by query id), some with no merchant, some with an int key."""
    rng = random.Random(15)
    records = []
    for i in range(count):
        inputs: dict[str, Any] = {"user.id": f"u{rng.randrange(5)}"}
        if rng.random() < 0.7:
            inputs["merchant.id"] = f"m{rng.randrange(3)}"
        if rng.random() < 0.3:
            inputs["request.n"] = rng.randrange(3)
        now = T0 + timedelta(minutes=rng.randrange(120), microseconds=rng.choice([0, 0, 250_000]))
        plan = rng.choice([*PLANS, None])
        records.append(decision(f"q{i:04d}", now, inputs, plan))
    return records


def matches(record: LoggedQuery, search: Search) -> bool:
    """What `search` means, the slow obvious way."""
    if any(record.inputs.get(name) is None or str(record.inputs[name]) != key
           for name, key in search.entity):  # fmt: skip
        return False
    if search.since is not None and record.now < search.since:
        return False
    if search.until is not None and record.now >= search.until:
        return False
    if search.before is not None and (record.now, record.query_id) >= search.before:
        return False
    if search.feature is not None or search.model is not None:
        plan = record.plan
        if plan is None:
            return False
        if search.feature is not None and search.feature not in plan.versions:
            return False
        if search.model is not None and not any(
            search.model in (version, version.split("@")[0]) for version in plan.models
        ):
            return False
    return True


def expected(records: list[LoggedQuery], search: Search) -> list[str]:
    found = sorted(
        (r for r in records if matches(r, search)), key=lambda r: (r.now, r.query_id), reverse=True
    )
    return [r.query_id for r in found[: search.limit]]


def found(log: BatchedQueryLog, search: Search) -> list[str]:
    return [record.query_id for record in log.search(search)]


SEARCHES = [
    Search(),
    Search(entity=(("user.id", "u1"),)),
    Search(entity=(("user.id", "u2"), ("merchant.id", "m0"))),
    Search(entity=(("merchant.id", "m1"), ("user.id", "u3"))),
    Search(entity=(("request.n", "2"),)),  # an int key, searched as its text
    Search(since=T0 + timedelta(minutes=30)),
    Search(until=T0 + timedelta(minutes=45)),
    Search(since=T0 + timedelta(minutes=20), until=T0 + timedelta(minutes=80)),
    Search(entity=(("user.id", "u4"),), since=T0 + timedelta(minutes=60)),
    Search(feature="merchant.id"),
    Search(feature="user.txn_count[1d]", entity=(("user.id", "u0"),)),
    Search(model="risk@v2"),
    Search(model="risk"),
    Search(model="risk", until=T0 + timedelta(minutes=60), entity=(("user.id", "u1"),)),
    Search(feature="user.name", model="risk"),  # no plan has both
    Search(limit=7),
    Search(entity=(("user.id", "u1"),), limit=3),
    Search(model="risk@v1", limit=1),
]


def test_every_search_finds_what_the_obvious_filter_finds_newest_first(open_log: Open) -> None:
    records = many_decisions()
    log = open_log()
    for record in records:
        log.append(record)

    for search in SEARCHES:
        want = expected(records, search)
        assert found(log, search) == want, search
    # the searches above are not vacuous: most find something, and some are cut by `limit`
    assert sum(bool(expected(records, s)) for s in SEARCHES) >= len(SEARCHES) - 1
    assert len(expected(records, Search(entity=(("user.id", "u1"),)))) > 3


def test_pages_read_with_before_are_the_whole_answer_in_order(open_log: Open) -> None:
    records = many_decisions()  # ties on `now`: the pages must neither skip nor repeat one
    log = open_log()
    for record in records:
        log.append(record)

    for search in SEARCHES[:14]:  # every kind of filter, unlimited
        whole = expected(records, dataclasses.replace(search, limit=1000))
        paged: list[str] = []
        page = dataclasses.replace(search, limit=7)
        while True:
            got = log.search(page)
            assert [r.query_id for r in got] == expected(records, page), page
            paged += [r.query_id for r in got]
            if len(got) < page.limit:
                break
            page = dataclasses.replace(page, before=(got[-1].now, got[-1].query_id))
        assert paged == whole, search


def test_a_search_returns_whole_records(open_log: Open) -> None:
    log = open_log()
    record = decision("q-whole", T0, {"user.id": "u1", "merchant.id": "m9"}, PLANS[1])
    log.append(record)

    (got,) = log.search(Search(entity=(("user.id", "u1"),), model="risk@v2"))

    assert got.to_dict() == record.to_dict()
    assert got.plan == PLANS[1]


def test_since_is_inclusive_and_until_exclusive(open_log: Open) -> None:
    log = open_log()
    times = [T0 - timedelta(microseconds=1), T0, T0 + timedelta(microseconds=1),
             T0 + timedelta(minutes=1)]  # fmt: skip
    for i, now in enumerate(times):
        log.append(decision(f"q{i}", now, {"user.id": "u1"}))
    since, until = T0, T0 + timedelta(minutes=1)

    assert found(log, Search(since=since, until=until)) == ["q2", "q1"]
    key = (("user.id", "u1"),)  # the same bounds through the entity index
    assert found(log, Search(entity=key, since=since, until=until)) == ["q2", "q1"]
    assert found(log, Search(since=until)) == ["q3"]
    assert found(log, Search(until=since)) == ["q0"]


def test_times_in_other_offsets_compare_as_instants(open_log: Open) -> None:
    log = open_log()
    india = timezone(timedelta(hours=5, minutes=30))
    # 14:00 in +05:30 is 08:30 UTC: before T0, though its text sorts after
    log.append(decision("early", datetime(2026, 3, 1, 14, 0, tzinfo=india), {"user.id": "u1"}))
    log.append(decision("late", T0 + timedelta(minutes=5), {"user.id": "u1"}))

    assert found(log, Search(since=T0)) == ["late"]
    assert found(log, Search(entity=(("user.id", "u1"),), since=T0)) == ["late"]
    assert found(log, Search(until=T0)) == ["early"]


def test_unknown_entities_features_and_models_find_nothing(open_log: Open) -> None:
    log = open_log()
    for record in many_decisions(30):
        log.append(record)

    assert found(log, Search(entity=(("user.id", "u999"),))) == []
    assert found(log, Search(entity=(("user.id", "u1"), ("user.id", "u2")))) == []
    assert found(log, Search(entity=(("nobody.id", "u1"),))) == []
    assert found(log, Search(feature="user.nothing")) == []
    assert found(log, Search(model="risk@v9")) == []
    assert found(log, Search(model="ris")) == []  # a name matches whole, not as a prefix
    assert found(log, Search(since=T0 + timedelta(days=1))) == []


def test_search_sees_what_was_appended_just_before(open_log: Open) -> None:
    log = open_log(max_wait=30.0)  # the writer would wait 30 s: search flushes first
    log.append(decision("q-now", T0, {"user.id": "u7"}))

    assert found(log, Search(entity=(("user.id", "u7"),))) == ["q-now"]


OLD_SCHEMA = (
    "CREATE TABLE kairos_query_log (query_id TEXT PRIMARY KEY, now TEXT NOT NULL, "
    "inputs TEXT NOT NULL, outputs TEXT NOT NULL, trace TEXT NOT NULL, "
    "duration_ms REAL NOT NULL, logged_at TEXT NOT NULL)"
)


def test_a_log_file_of_the_previous_schema_keeps_its_rows_and_is_searchable(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    old_now = T0 - timedelta(hours=1)
    outputs = {
        "user.risk": {"value": 0.25, "observed_at": {"$dt": old_now.isoformat()},
                      "source": "model:risk", "version": "risk@v1", "error_code": None,
                      "error_message": None},
    }  # fmt: skip
    with sqlite3.connect(path) as conn:
        conn.execute(OLD_SCHEMA)
        conn.execute(
            "INSERT INTO kairos_query_log VALUES (?, ?, ?, ?, ?, ?, ?)",
            ("old-1", old_now.isoformat(), orjson.dumps({"user.id": "u1"}).decode(),
             orjson.dumps(outputs).decode(), "[]", 2.5, old_now.isoformat()),
        )  # fmt: skip
    conn.close()

    with BatchedQueryLog.sqlite(path) as log:
        log.append(decision("new-1", T0, {"user.id": "u1"}, PLANS[0]))
        old = log.get("old-1")
        by_time = found(log, Search(since=old_now - timedelta(minutes=1)))
        older_only = found(log, Search(until=T0))
        new_by_entity = found(log, Search(entity=(("user.id", "u1"),), since=T0))
        every_by_entity = found(log, Search(entity=(("user.id", "u1"),)))

    assert old is not None
    assert old.inputs == {"user.id": "u1"}
    assert old.outputs["user.risk"].value == 0.25
    assert old.outputs["user.risk"].version == "risk@v1"
    assert old.outputs["user.risk"].age_s is None
    assert old.values.keys() == {"user.risk"}
    assert (old.model_calls, old.llm_calls, old.plan) == ([], [], None)
    assert by_time == ["new-1", "old-1"]
    assert older_only == ["old-1"]
    assert new_by_entity == ["new-1"]
    assert every_by_entity == ["new-1", "old-1"]  # the older row's key indexed on opening
    with sqlite3.connect(path) as conn:
        (rows,) = conn.execute("SELECT count(*) FROM kairos_query_log").fetchone()
    conn.close()
    assert rows == 2


def test_a_postgres_log_of_the_previous_schema_is_migrated_and_searchable() -> None:
    table = f"kairos_qlog_old_{uuid.uuid4().hex[:10]}"
    old_now = T0 - timedelta(hours=1)
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (seq bigint GENERATED ALWAYS AS IDENTITY, query_id text "
                "PRIMARY KEY, now timestamptz NOT NULL, inputs json NOT NULL, outputs json NOT "
                "NULL, trace json NOT NULL, duration_ms double precision NOT NULL, logged_at "
                "timestamptz NOT NULL)"
            ).format(sql.Identifier(table))
        )
        conn.execute(
            sql.SQL("INSERT INTO {} (query_id, now, inputs, outputs, trace, duration_ms, "
                    "logged_at) VALUES (%s, %s, %s, '{{}}', '[]', 1.0, %s)").format(
                sql.Identifier(table)
            ),
            ("old-1", old_now, orjson.dumps({"user.id": "u1", "n": 7, "x": 1.5}).decode(), old_now),
        )  # fmt: skip
    try:
        with BatchedQueryLog.postgres(POSTGRES_URL, table=table) as log:
            log.append(decision("new-1", T0, {"user.id": "u1"}, PLANS[0]))
            by_entity = found(log, Search(entity=(("user.id", "u1"),)))
            by_int = found(log, Search(entity=(("n", "7"),)))
            by_float = found(log, Search(entity=(("x", "1.5"),)))
            old = log.get("old-1")
        assert by_entity == ["new-1", "old-1"] and by_int == ["old-1"] and by_float == []
        assert old is not None and old.inputs["n"] == 7 and old.plan is None
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            for name in (table, f"{table}_keys", f"{table}_plans"):
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
