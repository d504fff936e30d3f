"""DuckDB as a source: a database file, an in-memory database, or Parquet/CSV files as views.

- `duckdb:///bank.duckdb`: a database file, opened read-only (`?read_only=false` to write);
- `duckdb:///:memory:`: an empty in-memory database (SQL may call `read_parquet(...)`);
- `duckdb:///data/txns.parquet` (or `.csv`, `.tsv`): an in-memory database with one view,
  `txns`, named after the file's stem;
- `{url: "duckdb:///:memory:", tables: {txns: "data/txns.parquet", users: "users.csv"}}`:
  one view per entry (globs such as `data/*.parquet` work here).

Placeholders are `$1, $2, ...`. `fetch_arrow` returns a result as an Arrow table (DuckDB's
own columns, no Python object per value): a has-many SQL resolver's rows. Every thread of
the source holds its own cursor on one shared database, so the views are visible to all of
them. Options: `?pool_max=4`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from kairos.backends.threads import ConnectionThreads
from kairos.backends.url import redact, take_options
from kairos.errors import KairosError
from kairos.sources.errors import SourceError, closed, source_thread
from kairos.sources.url import file_location, flag, positive_int, reject_other_options

_OPTIONS = ("pool_max", "read_only")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# File suffix -> the DuckDB table function that reads it.
_READERS = {
    ".parquet": "read_parquet",
    ".csv": "read_csv",
    ".tsv": "read_csv",
    ".csv.gz": "read_csv",
    ".tsv.gz": "read_csv",
}


class DuckDBSource:
    """A DuckDB database read through a small pool of threads.

    >>> source = DuckDBSource("lake", "duckdb:///txns.parquet", database=":memory:",
    ...                       views={"txns": "/srv/app/txns.parquet"})
    >>> await source.fetch("select count(*) as n from txns where user_id = $1", ["u1"])
    (['n'], [(3,)])
    """

    dialect = "duckdb"

    def __init__(
        self,
        name: str,
        url: str,
        *,
        database: str,
        read_only: bool = True,
        views: Mapping[str, str] | None = None,
        pool_max: int = 4,
    ) -> None:
        self.name = name
        self.url = url
        self.database = database
        self.read_only = read_only and database != ":memory:"
        self.views = dict(views or {})
        self._root: duckdb.DuckDBPyConnection | None = None
        self._root_lock = threading.Lock()
        self._threads = ConnectionThreads(
            self._cursor,
            size=pool_max,
            thread_name=source_thread(name),
            closed=lambda: closed(name),
        )

    def __repr__(self) -> str:
        return f"DuckDBSource(name={self.name!r}, url={redact(self.url)!r})"

    def placeholder(self, index: int) -> str:
        return f"${index}"

    async def fetch(
        self, sql: str, params: Sequence[Any]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        values = list(params)
        return await self._threads.run(lambda cursor: self._query(cursor, sql, values))

    async def fetch_arrow(self, sql: str, params: Sequence[Any]) -> pa.Table:
        """The result as an Arrow table, made by DuckDB from its own columns."""
        values = list(params)
        return await self._threads.run(lambda cursor: self._query_arrow(cursor, sql, values))

    async def close(self) -> None:
        await self._threads.close()  # the cursors first, then the database they share
        with self._root_lock:
            root, self._root = self._root, None
        if root is not None:
            root.close()

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._root_lock:
            if self._root is None:
                self._root = self._open()
            return self._root.cursor()

    def _open(self) -> duckdb.DuckDBPyConnection:
        try:
            root = duckdb.connect(self.database, read_only=self.read_only)
        except duckdb.Error as error:
            raise SourceError(
                f"source {self.name!r} (duckdb) cannot open {self.database!r}: {error}"
            ) from error
        try:
            for view, path in self.views.items():
                reader = _READERS[_suffix(path)]
                root.execute(
                    f'create view "{view}" as select * from {reader}({_string_literal(path)})'
                )
        except duckdb.Error as error:
            root.close()
            raise SourceError(
                f"source {self.name!r} (duckdb) cannot read {path!r} as view {view!r}: {error}"
            ) from error
        return root

    def _query(
        self, cursor: duckdb.DuckDBPyConnection, sql: str, params: list[Any]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            cursor.execute(sql, params)
            if cursor.description is None:
                return [], []
            names = [column[0] for column in cursor.description]
            return names, cursor.fetchall()
        except duckdb.Error as error:
            raise SourceError(
                f"source {self.name!r} (duckdb): {type(error).__name__}: {error}"
            ) from error

    def _query_arrow(
        self, cursor: duckdb.DuckDBPyConnection, sql: str, params: list[Any]
    ) -> pa.Table:
        try:
            # a relation's own to_arrow_table: the DB-API cursor's copies the rows once more
            relation = cursor.sql(sql, params=params or None)
            return relation.to_arrow_table() if relation is not None else pa.table({})
        except duckdb.Error as error:
            raise SourceError(
                f"source {self.name!r} (duckdb): {type(error).__name__}: {error}"
            ) from error


def _suffix(path: str) -> str:
    lowered = path.lower()
    for suffix in sorted(_READERS, key=len, reverse=True):
        if lowered.endswith(suffix):
            return suffix
    return Path(path).suffix


def _string_literal(text: str) -> str:
    # DDL cannot take bound parameters, so the path becomes a quoted SQL string.
    return "'" + text.replace("'", "''") + "'"


def _view_paths(name: str, tables: Mapping[str, Any], base_dir: Path) -> dict[str, str]:
    views: dict[str, str] = {}
    for view, path in tables.items():
        if not isinstance(view, str) or not _IDENTIFIER.fullmatch(view):
            raise KairosError(
                f"source {name!r}: table name {view!r} is not an identifier; use letters, "
                "digits and underscores, not starting with a digit"
            )
        if not isinstance(path, str | Path) or not str(path):
            raise KairosError(f"source {name!r}: table {view!r} needs a file path, got {path!r}")
        if _suffix(str(path)).lower() not in _READERS:
            raise KairosError(
                f"source {name!r}: table {view!r} reads {str(path)!r}, which is not a "
                f"{'/'.join(sorted(set(_READERS)))} file"
            )
        views[view] = str(base_dir.absolute() / path)
    return views


def duckdb_source(
    name: str, url: str, base_dir: Path, tables: Mapping[str, Any] | None = None
) -> DuckDBSource:
    """Build a DuckDBSource from its URL (and `tables`); nothing is opened until a fetch."""
    rest, options = take_options(url, _OPTIONS)
    reject_other_options(rest, _OPTIONS, source=name)
    location = file_location(rest, base_dir, source=name)
    pool_max = positive_int(options, "pool_max", 4, source=name)
    read_only = flag(options, "read_only", True, source=name)
    suffix = _suffix(location).lower()
    if suffix in _READERS:
        stem = Path(location).name[: -len(suffix)]
        if tables:
            raise KairosError(
                f"source {name!r}: {redact(url)!r} already names a file; put it under "
                "tables: and set url: duckdb:///:memory:"
            )
        if not _IDENTIFIER.fullmatch(stem):
            raise KairosError(
                f"source {name!r}: the view would be named {stem!r} (the file's stem), which "
                "is not an identifier; use url: duckdb:///:memory: with tables: {name: path}"
            )
        views = {stem: location}
        return DuckDBSource(name, url, database=":memory:", views=views, pool_max=pool_max)
    if tables and location != ":memory:":
        raise KairosError(
            f"source {name!r}: tables: needs url: duckdb:///:memory: (views are not written "
            f"into {redact(url)!r})"
        )
    views = _view_paths(name, tables or {}, base_dir)
    return DuckDBSource(
        name, url, database=location, read_only=read_only, views=views, pool_max=pool_max
    )
