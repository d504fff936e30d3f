"""A small shop project (customers and their orders) served by every kind of SQL source.

`shop` writes the project into tmp_path: `features.py`, `kairos.yaml` naming one source
(`shop`), `customer.sql` and `orders.sql`. The data lives in the backend the test is
parametrized over: a SQLite file, a DuckDB file, Parquet or CSV files read by DuckDB, or a
schema of its own in PostgreSQL.
"""

from __future__ import annotations

import contextlib
import sqlite3
import textwrap
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import psycopg
import pytest
import yaml

import kairos as kr
from tests.conftest import POSTGRES_URL, need_postgres

KINDS = ["sqlite", "duckdb-file", "duckdb-parquet", "duckdb-csv", "postgres"]
SOURCE = "shop"
NOW = datetime(2026, 1, 10, tzinfo=UTC)
LEVELS = ("gold", "silver", "bronze")

# (id, name, level): the SQL aliases `level as tier`.
CUSTOMERS = [(f"c{i:03d}", f"Customer {i}", LEVELS[i % 3]) for i in range(30)]
NAMES = {cid: name for cid, name, _ in CUSTOMERS}
TIERS = {cid: level for cid, _, level in CUSTOMERS}


def _orders() -> list[tuple[str, str, float, datetime]]:
    rows = []
    for i in range(120):
        customer = f"c{i % 25:03d}"  # c025..c029 have no orders
        amount = float((i * 37) % 100) + 0.25 * (i % 4)  # quarters: sums are exact
        # Every 9th order is placed after NOW; o019 is exactly 4 days before NOW.
        ts = NOW + timedelta(hours=1 + i) if i % 9 == 0 else NOW - timedelta(hours=5 * i + 1)
        rows.append((f"o{i:03d}", customer, amount, ts))
    return rows


# (id, customer_id, amount, ts)
ORDERS = _orders()

FEATURES = """\
from kairos import DataFrame, FeatureTime, _, features


@features
class Order:
    id: str
    customer_id: "Customer.id"
    amount: float
    ts: FeatureTime


@features
class Customer:
    id: str
    name: str
    tier: str
    orders: DataFrame[Order]
    order_count: int = _.orders.count()
    spent: float = _.orders[_.amount].sum()
"""

CUSTOMER_SQL = """\
-- resolves: Customer
-- source: shop
select id, name, level as tier from customers where id = :id
"""

ORDERS_SQL = """\
-- resolves: Order
-- source: shop
select id, customer_id, amount, ts
from orders
where customer_id = :customer_id and ts <= :now
order by ts
"""


def orders_of(customer: str, now: datetime) -> list[tuple[str, str, float, datetime]]:
    """The customer's orders that exist at `now`, straight from the data."""
    return [row for row in ORDERS if row[1] == customer and row[3] <= now]


def as_utc(value: Any) -> datetime:
    """A timestamp as a driver hands it back (ISO text, naive UTC or aware) in UTC."""
    moment = datetime.fromisoformat(value) if isinstance(value, str) else value
    if not isinstance(moment, datetime):
        raise TypeError(f"not a timestamp: {value!r}")
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


@dataclass(frozen=True)
class Backend:
    """Where the shop's `customers` and `orders` tables live, and how to read them directly."""

    kind: str
    dialect: str
    config: str | dict[str, Any]  # the `sources.shop` entry of kairos.yaml
    data_dir: Path
    schema: str | None = None

    def count(self, table: str) -> int:
        """Rows in `table`, read around kairos with the backend's own driver."""
        if self.kind == "sqlite":
            with contextlib.closing(sqlite3.connect(self.data_dir / "shop.db")) as connection:
                row = connection.execute(f"select count(*) from {table}").fetchone()
        elif self.kind == "postgres":
            with psycopg.connect(POSTGRES_URL) as connection:
                row = connection.execute(f"select count(*) from {self.schema}.{table}").fetchone()
        else:
            reader = {
                "duckdb-file": f"{table}",
                "duckdb-parquet": f"read_parquet('{self.data_dir / table}.parquet')",
                "duckdb-csv": f"read_csv('{self.data_dir / table}.csv')",
            }[self.kind]
            database = str(self.data_dir / "shop.duckdb") if self.kind == "duckdb-file" else ""
            with duckdb.connect(database or ":memory:", read_only=bool(database)) as connection:
                row = connection.execute(f"select count(*) from {reader}").fetchone()
        if row is None:  # pragma: no cover - count(*) always returns a row
            raise AssertionError(f"no count for {table}")
        return int(row[0])


@pytest.fixture(scope="session")
def shop_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two tables as a SQLite file, a DuckDB file, and Parquet and CSV files."""
    folder = tmp_path_factory.mktemp("shop_data")
    with contextlib.closing(sqlite3.connect(folder / "shop.db")) as connection:
        connection.execute("create table customers (id text primary key, name text, level text)")
        connection.execute(
            "create table orders (id text primary key, customer_id text, amount real, ts text)"
        )
        connection.executemany("insert into customers values (?, ?, ?)", CUSTOMERS)
        # SQLite has no time type: ISO 8601 text, in the form kairos binds `:now` in.
        connection.executemany(
            "insert into orders values (?, ?, ?, ?)",
            [(oid, cid, amount, ts.isoformat()) for oid, cid, amount, ts in ORDERS],
        )
        connection.commit()
    with duckdb.connect(str(folder / "shop.duckdb")) as database:
        database.execute(
            "create table customers (id varchar primary key, name varchar, level varchar)"
        )
        # TIMESTAMP (naive UTC): TIMESTAMPTZ values need pytz to reach Python.
        database.execute(
            "create table orders (id varchar primary key, customer_id varchar, amount double, "
            "ts timestamp)"
        )
        database.executemany("insert into customers values (?, ?, ?)", CUSTOMERS)
        database.executemany(
            "insert into orders values (?, ?, ?, ?)",
            [(oid, cid, amount, ts.replace(tzinfo=None)) for oid, cid, amount, ts in ORDERS],
        )
        for table in ("customers", "orders"):
            for suffix, options in (("parquet", "format parquet"), ("csv", "format csv, header")):
                database.execute(f"copy {table} to '{folder / table}.{suffix}' ({options})")
    return folder


@pytest.fixture(scope="session")
def shop_schema() -> Iterator[str]:
    """A schema of its own in database `test`, holding the two tables; dropped afterwards."""
    need_postgres()
    admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    schema = f"kairos_resolvers_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f"create schema {schema}")
        try:
            admin.execute(
                f"create table {schema}.customers (id text primary key, name text, level text)"
            )
            admin.execute(
                f"create table {schema}.orders (id text primary key, customer_id text, "
                "amount double precision, ts timestamptz)"
            )
            with admin.cursor() as cursor:
                cursor.executemany(f"insert into {schema}.customers values (%s, %s, %s)", CUSTOMERS)
                cursor.executemany(f"insert into {schema}.orders values (%s, %s, %s, %s)", ORDERS)
            yield schema
        finally:
            admin.execute(f"drop schema {schema} cascade")


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, shop_data: Path) -> Backend:
    kind: str = request.param
    if kind == "sqlite":
        return Backend(kind, "sqlite", f"sqlite:///{shop_data / 'shop.db'}", shop_data)
    if kind == "duckdb-file":
        return Backend(kind, "duckdb", f"duckdb:///{shop_data / 'shop.duckdb'}", shop_data)
    if kind in ("duckdb-parquet", "duckdb-csv"):
        suffix = kind.rpartition("-")[2]
        tables = {t: str(shop_data / f"{t}.{suffix}") for t in ("customers", "orders")}
        return Backend(kind, "duckdb", {"url": "duckdb:///:memory:", "tables": tables}, shop_data)
    schema: str = request.getfixturevalue("shop_schema")
    url = f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    return Backend(kind, "postgres", url, shop_data, schema)


@dataclass
class Statement:
    """One statement a source ran: its text, bound values, and what came back."""

    sql: str
    params: list[Any]
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    arrow: bool = False  # fetched as an Arrow table (rows: the table's, read back here)


@dataclass
class Shop:
    """The project folder, and the clients opened on it (closed at teardown)."""

    folder: Path
    backend: Backend
    monkeypatch: pytest.MonkeyPatch
    clients: list[kr.Client] = field(default_factory=list)

    def write_sql(self, name: str, text: str) -> Path:
        path = self.folder / name
        path.write_text(textwrap.dedent(text))
        return path

    def client(self) -> kr.Client:
        client = kr.Client(self.folder)
        self.clients.append(client)
        return client

    def statements(self, client: kr.Client) -> list[Statement]:
        """Record every statement the shop source runs: a spy on the real database call."""
        source = client.sources[SOURCE]
        fetch = source.fetch

        async def recording(sql: str, params: Sequence[Any]) -> Any:
            statement = Statement(sql, list(params))
            ran.append(statement)
            statement.columns, statement.rows = await fetch(sql, params)
            return statement.columns, statement.rows

        fetch_arrow = getattr(source, "fetch_arrow", None)

        async def recording_arrow(sql: str, params: Sequence[Any]) -> Any:
            table = await fetch_arrow(sql, params)  # type: ignore[misc]
            if table is not None:  # None: the source reads rows with fetch instead
                statement = Statement(sql, list(params), table.column_names, arrow=True)
                statement.rows = [tuple(r.values()) for r in table.to_pylist()]
                ran.append(statement)
            return table

        ran: list[Statement] = []
        self.monkeypatch.setattr(source, "fetch", recording)
        if fetch_arrow is not None:
            self.monkeypatch.setattr(source, "fetch_arrow", recording_arrow)
        return ran


@pytest.fixture
def shop(backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shop]:
    folder = tmp_path / "shop"
    folder.mkdir()
    (folder / "features.py").write_text(FEATURES)
    settings = {"sources": {SOURCE: backend.config}, "query_log": "none://"}
    (folder / "kairos.yaml").write_text(yaml.safe_dump(settings))
    project = Shop(folder, backend, monkeypatch)
    project.write_sql("customer.sql", CUSTOMER_SQL)
    project.write_sql("orders.sql", ORDERS_SQL)
    yield project
    for client in project.clients:
        client.close()
