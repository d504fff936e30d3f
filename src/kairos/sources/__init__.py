"""Named data sources that SQL resolvers read from: SQLite, DuckDB (files, Parquet, CSV),
PostgreSQL, each picked by the scheme of its URL.

Placeholders differ per driver; compile `:name` parameters with `source.placeholder(i)`
(1-based, in order of appearance) and pass the values positionally:

| dialect    | placeholder        | a literal `%` in SQL |
|------------|--------------------|----------------------|
| `sqlite`   | `?`                | as is                |
| `duckdb`   | `$1`, `$2`, ...    | as is                |
| `postgres` | `$1`, `$2`, ...    | as is (psycopg `AsyncRawCursor`: server-side binding) |

Values are always bound by the driver, never spliced into SQL text.

>>> bank = source_from_config("bank", "sqlite:///bank.db", base_dir=Path("examples/fraud"))
>>> await bank.fetch(f"select name from users where id = {bank.placeholder(1)}", ["u1"])
(['name'], [('Ada',)])
>>> await bank.close()

A config is a URL, or a mapping with `url:` (and, for DuckDB, `tables:`); `${VAR}` anywhere
in it reads the environment variable VAR, so passwords stay out of `kairos.yaml`:

    sources:
      bank: postgresql://app:${BANK_PASSWORD}@db:5432/bank?pool_max=20
      lake: {url: "duckdb:///:memory:", tables: {txns: data/txns.parquet}}
      local: sqlite:///data/bank.db

Interpolated values are inserted as written: percent-encode characters such as `@`, `/`
or `%` in a password before putting it in the environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from kairos.backends import URL, connect, parse
from kairos.backends.url import redact
from kairos.errors import KairosError, did_you_mean
from kairos.sources.duckdb import duckdb_source
from kairos.sources.errors import SourceError
from kairos.sources.postgres import postgres_source
from kairos.sources.sqlite import sqlite_source
from kairos.sources.url import interpolate

__all__ = ["Source", "SourceError", "redact", "source_from_config"]

_SCHEMES = ("sqlite", "duckdb", "postgresql", "postgres")
_KEYS = ("url", "tables")


class Source(Protocol):
    """A named database that SQL resolvers read from."""

    name: str
    dialect: str  # "sqlite" | "duckdb" | "postgres"

    def placeholder(self, index: int) -> str:
        """The driver's positional placeholder for parameter `index` (1-based)."""
        ...

    async def fetch(
        self, sql: str, params: Sequence[Any]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run `sql` with `params` bound by the driver; column names and rows as tuples.
        Raises SourceError naming the source when the query fails."""
        ...

    async def close(self) -> None:
        """Release every connection and thread. Idempotent."""
        ...


def source_from_config(
    name: str,
    config: str | Mapping[str, Any],
    base_dir: Path,
    *,
    environ: Mapping[str, str] | None = None,
) -> Source:
    """Build the source a config describes; no connection is made until the first fetch.

    >>> source_from_config("lake", {"url": "duckdb:///:memory:",
    ...                             "tables": {"txns": "data/txns.parquet"}}, Path("."))
    DuckDBSource(name='lake', url='duckdb:///:memory:')
    """
    env = os.environ if environ is None else environ
    if isinstance(config, str):
        url, tables = config, None
    elif isinstance(config, Mapping):
        for key in config:
            if key not in _KEYS:
                raise KairosError(
                    f"source {name!r}: unknown key {key!r}{did_you_mean(str(key), _KEYS)}; "
                    f"a source takes {', '.join(_KEYS)}"
                )
        url = config.get("url", "duckdb:///:memory:" if "tables" in config else None)
        tables = config.get("tables")
        if not isinstance(url, str):
            raise KairosError(f"source {name!r} needs url: (e.g. sqlite:///bank.db), got {url!r}")
        if tables is not None and not isinstance(tables, Mapping):
            raise KairosError(
                f"source {name!r}: tables: must map view names to files, got {tables!r}"
            )
    else:
        raise KairosError(
            f"source {name!r}: config must be a URL or a mapping with url:, got {config!r}"
        )
    url = interpolate(url.strip(), env, source=name)
    parsed = parse(url)
    scheme = parsed.scheme if parsed.authority else ""  # `sqlite:x` names no source
    if tables and scheme != "duckdb":
        raise KairosError(
            f"source {name!r}: tables: is for duckdb:///:memory: sources, not {scheme!r}"
        )

    def duckdb(parsed: URL) -> Source:
        paths = {
            view: interpolate(path, env, source=name) if isinstance(path, str) else path
            for view, path in (tables or {}).items()
        }
        return duckdb_source(name, url, base_dir, paths)

    def unknown(parsed: URL) -> KairosError:
        return KairosError(
            f"source {name!r}: unknown URL scheme {scheme!r} in {redact(url)!r}"
            f"{did_you_mean(scheme, _SCHEMES)}; supported: "
            f"{', '.join(s + '://' for s in _SCHEMES)}"
        )

    if not scheme:
        raise unknown(parsed)
    return connect(
        parsed,
        {
            "sqlite": lambda parsed: sqlite_source(name, url, base_dir),
            "duckdb": duckdb,
            "postgresql": lambda parsed: postgres_source(name, url),
        },
        unknown=unknown,
    )
