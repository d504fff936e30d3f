"""One `backend` fixture over every kind of source, each serving the same `users` table."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import time
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import psycopg
import pytest

from kairos.sources import Source, source_from_config
from kairos.sources.errors import source_thread
from tests.conftest import POSTGRES_URL, need_postgres

T = TypeVar("T")

USERS = [(f"u{i}", f"name {i}", i + 0.5) for i in range(1000)]
KINDS = ["sqlite", "duckdb-file", "duckdb-parquet", "duckdb-csv", "duckdb-tables", "postgres"]


@dataclass(frozen=True)
class Backend:
    """How to reach the `users` table on one kind of source."""

    kind: str
    url: str
    base_dir: Path
    tables: Mapping[str, str] | None = None
    duckdb_file: Path | None = None

    def config(self, **options: object) -> str | dict[str, Any]:
        """The source's config, with extra `?options` appended to its URL."""
        url = self.url
        if options:
            extra = "&".join(f"{key}={value}" for key, value in options.items())
            url += ("&" if "?" in url else "?") + extra
        return url if self.tables is None else {"url": url, "tables": self.tables}

    def source(self, name: str, **options: object) -> Source:
        if self.kind == "postgres":
            options.setdefault("application_name", name)
        return source_from_config(name, self.config(**options), self.base_dir)

    def run(self, body: Callable[[Source], Awaitable[T]], **options: object) -> T:
        """Build a source, run `body` with it in a fresh event loop, always close it."""
        source = self.source(f"bank_{uuid.uuid4().hex[:8]}", **options)

        async def main() -> T:
            try:
                return await body(source)
            finally:
                await source.close()

        return asyncio.run(main())

    def held(self, source: Source, *, settle: bool = True) -> list[str]:
        """What `source` still holds: its threads, server connections, files. `settle`
        gives server connections a moment to go once their client has closed them."""
        held = [
            thread.name
            for thread in threading.enumerate()
            if thread.name.startswith(source_thread(source.name) + "_")
        ]
        if self.kind == "sqlite":
            held += _open_sqlite_connections(self.base_dir / "users.db")
        if self.kind == "postgres":
            count = _server_connections(source.name, settle=settle)
            if count:
                held.append(f"{count} server connections")
        if self.duckdb_file is not None:
            try:  # DuckDB refuses a second, read-write handle on a file open read-only
                duckdb.connect(str(self.duckdb_file)).close()
            except duckdb.Error as error:
                held.append(f"{self.duckdb_file.name}: {error}")
        return held


def _open_sqlite_connections(path: Path) -> list[str]:
    found = []
    with warnings.catch_warnings():  # some objects (torch's) warn when their class is read
        warnings.simplefilter("ignore")
        connections = [t for t in gc.get_objects() if isinstance(t, sqlite3.Connection)]
    for connection in connections:
        try:
            files = connection.execute("pragma database_list").fetchall()
        except sqlite3.ProgrammingError:  # closed
            continue
        if any(row[2] == str(path) for row in files):
            found.append(f"open connection to {path.name}")
    return found


def _server_connections(application_name: str, *, settle: bool) -> int:
    deadline = time.monotonic() + (3 if settle else 0)  # a backend exits after its client
    while True:
        with psycopg.connect(POSTGRES_URL) as connection:
            row = connection.execute(
                "select count(*) from pg_stat_activity where application_name = %s",
                [application_name],
            ).fetchone()
        count = int(row[0]) if row else 0
        if count == 0 or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


def sql(source: Source, template: str, count: int = 1) -> str:
    """`template` with `{}` replaced by `count` of the source's placeholders, comma-separated."""
    return template.format(", ".join(source.placeholder(i) for i in range(1, count + 1)))


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The users table as a SQLite file, a DuckDB file, Parquet and CSV files."""
    folder = tmp_path_factory.mktemp("sources")
    with sqlite3.connect(folder / "users.db") as connection:
        connection.execute("create table users (id text primary key, name text, balance real)")
        connection.executemany("insert into users values (?, ?, ?)", USERS)
    connection.close()
    with duckdb.connect(str(folder / "users.duckdb")) as database:
        database.execute(
            "create table users (id varchar primary key, name varchar, balance double)"
        )
        database.executemany("insert into users values (?, ?, ?)", USERS)
    (folder / "data").mkdir()
    with duckdb.connect(":memory:") as database:
        database.execute("attach $1 as src (read_only)", [str(folder / "users.duckdb")])
        for target, options in [
            (folder / "users.parquet", "format parquet"),
            (folder / "users.csv", "format csv, header"),
            (folder / "data" / "users.parquet", "format parquet"),
        ]:
            quoted = str(target).replace("'", "''")
            database.execute(f"copy src.users to '{quoted}' ({options})")
    return folder


@pytest.fixture(scope="session")
def postgres_schema() -> Iterator[str]:
    """A schema of its own in database `test`, holding `users`; dropped afterwards."""
    need_postgres()
    admin = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=3)
    schema = f"kairos_sources_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f"create schema {schema}")
        try:
            admin.execute(
                f"create table {schema}.users "
                "(id text primary key, name text, balance double precision)"
            )
            with admin.cursor() as cursor:
                cursor.executemany(f"insert into {schema}.users values (%s, %s, %s)", USERS)
            yield schema
        finally:
            admin.execute(f"drop schema {schema} cascade")


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, data_dir: Path) -> Backend:
    kind: str = request.param
    if kind == "sqlite":
        return Backend(kind, "sqlite:///users.db", data_dir)
    if kind == "duckdb-file":
        return Backend(
            kind, "duckdb:///users.duckdb", data_dir, duckdb_file=data_dir / "users.duckdb"
        )
    if kind == "duckdb-parquet":
        return Backend(kind, "duckdb:///users.parquet", data_dir)
    if kind == "duckdb-csv":
        return Backend(kind, f"duckdb:///{data_dir}/users.csv", Path("/nonexistent"))
    if kind == "duckdb-tables":
        return Backend(kind, "duckdb:///:memory:", data_dir, tables={"users": "data/users.parquet"})
    schema = request.getfixturevalue("postgres_schema")
    url = f"{POSTGRES_URL}?options=-csearch_path%3D{schema}"
    return Backend(kind, url, data_dir)
