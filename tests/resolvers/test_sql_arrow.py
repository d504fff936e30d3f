# mypy: disable-error-code="attr-defined"
"""A has-many SQL resolver's rows reach the engine as an Arrow table on DuckDB and PostgreSQL
(no dict per row), with the same answers as when the same rows are read as Python rows:
nulls, NaN-free floats, ints, bools, text, numeric and timestamps, one entity, a batch (keys
pushed down as IN (...)) and an offline spine (one lateral statement)."""

from __future__ import annotations

import asyncio
import textwrap
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pyarrow as pa
import pytest
import yaml

import kairos as kr
from kairos.definitions.frame import DataFrame
from kairos.engine import execution
from kairos.sources.postgres import PostgresSource
from tests.conftest import POSTGRES_URL, need_postgres

NOW = datetime(2026, 1, 10, tzinfo=UTC)
OWNERS = ["o0", "o1", "o2", "o3", "nobody"]

FEATURES = """\
from datetime import datetime, timedelta

from kairos import DataFrame, FeatureTime, Now, _, features


@features
class Event:
    id: str
    owner_id: "Owner.id"
    amount: float | None
    qty: int | None
    kind: str | None
    flag: bool | None
    price: float | None
    ts: FeatureTime


@features
class Owner:
    id: str
    events: DataFrame[Event]
    n: int = _.events.count()
    spent: float = _.events[_.amount].sum()
    average: float | None = _.events[_.amount].mean()
    qty_sum: int = _.events[_.qty].sum()
    flagged: int = _.events[_.flag].count()
    kinds: int = _.events[_.kind].distinct_count()
    dear: float | None = _.events[_.price].max()
    recent: int = _.events[_.ts > Now - timedelta(days=1)].count()
    latest: datetime | None = _.events[_.ts].max()
"""

EVENTS_SQL = """\
-- resolves: Event
-- source: db
select id, owner_id, amount, qty, kind, flag, price, ts from events
where owner_id = :owner_id and ts <= :now
"""
OUTPUTS = [
    "owner.n", "owner.spent", "owner.average", "owner.qty_sum", "owner.flagged", "owner.kinds",
    "owner.dear", "owner.recent", "owner.latest", "owner.events",
]  # fmt: skip


def _events() -> list[tuple[Any, ...]]:
    rows = []
    for i in range(60):
        rows.append(
            (
                f"e{i:02d}",
                f"o{i % 4}",
                None if i % 7 == 0 else (i * 37 % 100) / 8,
                None if i % 5 == 0 else i - 20,
                None if i % 6 == 0 else "abc"[i % 3],
                None if i % 4 == 3 else i % 2 == 0,
                None if i % 9 == 0 else Decimal(f"{i}.{i % 10}5"),
                NOW - timedelta(hours=7 * i - 30),  # a few are after NOW
            )
        )
    return rows


EVENTS = _events()


@pytest.fixture(params=["duckdb", "postgres"])
def project(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    if request.param == "duckdb":
        database = tmp_path / "events.duckdb"
        with duckdb.connect(str(database)) as connection:
            connection.execute(
                "create table events (id varchar, owner_id varchar, amount double, qty bigint, "
                "kind varchar, flag boolean, price decimal(10, 2), ts timestamptz)"
            )
            connection.executemany(
                "insert into events values (?, ?, ?, ?, ?, ?, ?, ?)", [list(r) for r in EVENTS]
            )
        url: str = f"duckdb:///{database}"
        schema = None
    else:
        need_postgres()
        admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
        schema = f"kairos_arrow_{uuid.uuid4().hex[:12]}"
        admin.execute(f"create schema {schema}")
        admin.execute(
            f"create table {schema}.events (id text, owner_id text, amount double precision, "
            "qty bigint, kind text, flag boolean, price numeric(10, 2), ts timestamptz)"
        )
        with admin.cursor() as cursor:
            cursor.executemany(
                f"insert into {schema}.events values (%s, %s, %s, %s, %s, %s, %s, %s)", EVENTS
            )
        url = f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    (tmp_path / "features.py").write_text(FEATURES)
    (tmp_path / "events.sql").write_text(textwrap.dedent(EVENTS_SQL))
    settings = {"sources": {"db": url}, "query_log": "none://"}
    (tmp_path / "kairos.yaml").write_text(yaml.safe_dump(settings))
    yield tmp_path
    if schema is not None:
        with admin:
            admin.execute(f"drop schema {schema} cascade")


def _answers(
    folder: Path, monkeypatch: pytest.MonkeyPatch, arrow: bool
) -> tuple[list[Any], list[tuple[type, bool]], int]:
    """Every answer (one by one, as a batch and offline), what the engine was handed, and
    how many statements came back as Arrow."""
    client = kr.Client(folder)
    source = client.sources["db"]
    fetch_arrow = source.fetch_arrow
    handed: list[tuple[type, bool]] = []
    tables = 0

    async def spy(sql: str, params: list[Any]) -> pa.Table | None:
        nonlocal tables
        table = await fetch_arrow(sql, params) if arrow else None
        tables += table is not None
        return table

    normalize = execution.normalize_rows

    def record(graph: Any, info: Any, value: Any, now: datetime) -> DataFrame[Any]:
        handed.append((type(value), len(value) > 0))
        return normalize(graph, info, value, now)

    monkeypatch.setattr(source, "fetch_arrow", spy)
    monkeypatch.setattr(execution, "normalize_rows", record)
    try:
        answers: list[Any] = []
        for owner in OWNERS:
            result = client.query({"owner.id": owner}, OUTPUTS, now=NOW)
            assert result.errors == []
            answers.append([result.get_value(o) for o in OUTPUTS])
        bulk = client.query_bulk({"owner.id": OWNERS}, OUTPUTS, now=NOW)
        answers.append([bulk.column(o) for o in OUTPUTS])
        times = [NOW - timedelta(hours=h) for h in (0, 50, 100, 400, 3)]
        offline = client.offline_query(
            {"owner.id": OWNERS, "ts": times}, OUTPUTS[:-1], recompute=True
        )
        answers.append([offline.column(o) for o in OUTPUTS[:-1]])
    finally:
        monkeypatch.undo()
        client.close()
    return answers, handed, tables


def test_sql_has_many_rows_reach_the_engine_as_arrow_with_the_rows_answers(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_arrow, handed, tables = _answers(project, monkeypatch, arrow=True)
    as_rows, handed_rows, no_tables = _answers(project, monkeypatch, arrow=False)

    assert as_arrow == as_rows
    assert {kind for kind, some in handed if some} == {pa.Table}  # none: [] or an empty table
    assert {kind for kind, _some in handed_rows} == {list}
    assert tables == len(OWNERS) + 1 + 1 and no_tables == 0  # one each, a batch, a lateral
    single = dict(zip(OUTPUTS, as_arrow[0], strict=True))  # o0, straight from the data
    mine = [r for r in EVENTS if r[1] == "o0" and r[7] <= NOW]
    amounts = [r[2] for r in mine if r[2] is not None]
    assert single["owner.n"] == len(mine) > 5
    assert single["owner.spent"] == sum(amounts)
    assert single["owner.qty_sum"] == sum(r[3] for r in mine if r[3] is not None)
    assert single["owner.flagged"] == sum(r[5] is not None for r in mine)
    assert single["owner.dear"] == float(max(r[6] for r in mine if r[6] is not None))
    assert single["owner.latest"] == max(r[7] for r in mine)
    assert single["owner.latest"].tzinfo is not None
    rows = {r["id"]: r for r in single["owner.events"]}
    assert rows.keys() == {r[0] for r in mine}
    first_null = next(r for r in mine if r[2] is None)
    assert rows[first_null[0]]["amount"] is None
    assert rows[mine[0][0]]["ts"] == mine[0][7]
    assert as_arrow[len(OWNERS) - 1][0] == 0  # nobody: no rows, no error


def test_postgres_reads_rows_where_adbc_would_not_answer_as_psycopg() -> None:
    """None: NULL parameters, a column type without a psycopg-equal Arrow form, a statement
    ADBC refuses that psycopg runs (text bound to an int comparison). Then `fetch` answers."""
    need_postgres()
    source = PostgresSource("db", POSTGRES_URL)

    async def check() -> None:
        try:
            fetch = source.fetch_arrow
            table = await fetch("select $1::bigint + 1 as n, 1.50::numeric(4, 2) as p", [2])
            assert table is not None and table.to_pylist() == [{"n": 3, "p": Decimal("1.50")}]
            assert await fetch("select coalesce($1::bigint, 0) as n", [None]) is None
            assert await fetch("select interval '1 day' as i", []) is None
            huge = "select $1::numeric + 1 as n"  # beyond int64: psycopg binds it as numeric
            assert await fetch(huge, [2**70]) is None
            assert await source.fetch(huge, [2**70]) == (["n"], [(Decimal(2**70 + 1),)])
            refused = "select n from (values (7)) as t(n) where n = $1"
            assert await fetch(refused, ["7"]) is None
            assert await source.fetch(refused, ["7"]) == (["n"], [(7,)])
        finally:
            await source.close()

    asyncio.run(check())
