"""SQLite files as a source: `sqlite:///relative/path.db` or `sqlite:////absolute/path.db`.

Placeholders are `?`. Each of the source's threads holds its own connection in autocommit
mode, so reads never hold a transaction open. The file must exist (it is opened `mode=rw`,
or `mode=ro` with `?read_only=true`); values come back as stored (dates stay strings).

Options: `?pool_max=4` (threads, so concurrent queries), `?read_only=false`,
`?busy_timeout=5` (seconds to wait on a writer's lock).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kairos.backends.threads import ConnectionThreads
from kairos.backends.url import redact, take_options
from kairos.errors import KairosError
from kairos.sources.errors import SourceError, closed, source_thread
from kairos.sources.url import (
    file_location,
    flag,
    positive_float,
    positive_int,
    reject_other_options,
)

_OPTIONS = ("pool_max", "read_only", "busy_timeout")


class SQLiteSource:
    """A SQLite file read through a small pool of threads.

    >>> source = SQLiteSource("bank", "sqlite:///bank.db", path="/srv/app/bank.db")
    >>> await source.fetch("select name from users where id = ?", ["u1"])
    (['name'], [('Ada',)])
    """

    dialect = "sqlite"

    def __init__(
        self,
        name: str,
        url: str,
        *,
        path: str,
        read_only: bool = False,
        pool_max: int = 4,
        busy_timeout: float = 5.0,
    ) -> None:
        self.name = name
        self.url = url
        self.path = path
        self.read_only = read_only
        self._busy_timeout = busy_timeout
        self._threads = ConnectionThreads(
            self._connect,
            size=pool_max,
            thread_name=source_thread(name),
            closed=lambda: closed(name),
        )

    def __repr__(self) -> str:
        return f"SQLiteSource(name={self.name!r}, url={redact(self.url)!r})"

    def placeholder(self, index: int) -> str:
        return "?"

    async def fetch(
        self, sql: str, params: Sequence[Any]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        values = tuple(params)
        return await self._threads.run(lambda connection: self._query(connection, sql, values))

    async def close(self) -> None:
        await self._threads.close()

    def _connect(self) -> sqlite3.Connection:
        mode = "ro" if self.read_only else "rw"  # "rw" does not create a missing file
        try:
            return sqlite3.connect(
                f"file:{quote(self.path)}?mode={mode}",
                uri=True,
                timeout=self._busy_timeout,
                isolation_level=None,
                check_same_thread=False,  # closed by the thread that shuts the pool down
            )
        except sqlite3.Error as error:
            raise SourceError(
                f"source {self.name!r} (sqlite) cannot open {self.path!r}: {error}; "
                "check that the file exists and is readable"
            ) from error

    def _query(
        self, connection: sqlite3.Connection, sql: str, params: tuple[Any, ...]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            cursor = connection.execute(sql, params)
            try:
                if cursor.description is None:
                    return [], []
                names = [column[0] for column in cursor.description]
                return names, cursor.fetchall()
            finally:
                cursor.close()
        except sqlite3.Error as error:
            raise SourceError(
                f"source {self.name!r} (sqlite): {type(error).__name__}: {error}"
            ) from error


def sqlite_source(name: str, url: str, base_dir: Path) -> SQLiteSource:
    """Build a SQLiteSource from its URL; no file is opened until the first fetch."""
    rest, options = take_options(url, _OPTIONS)
    reject_other_options(rest, _OPTIONS, source=name)
    path = file_location(rest, base_dir, source=name)
    if path == ":memory:":
        raise KairosError(
            f"source {name!r}: an in-memory SQLite database is empty and private to one "
            "connection; point the URL at a file, or use duckdb:///:memory: with tables"
        )
    return SQLiteSource(
        name,
        url,
        path=path,
        read_only=flag(options, "read_only", False, source=name),
        pool_max=positive_int(options, "pool_max", 4, source=name),
        busy_timeout=positive_float(options, "busy_timeout", 5.0, source=name),
    )
