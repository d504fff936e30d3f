"""The query log: every online query appended, so the exact inputs and outputs of any past
decision can be read back (and replayed against a new model or prompt).

`append` is on the query's hot path, so it only encodes the record and puts it on a bounded
queue (a client's queries go further: `append_later` queues what the writer needs to build
and encode the records itself); one writer thread per log commits each batch in one
transaction, `max_wait` (5 ms) after its first record arrived. A `kill -9` loses at most the
records answered in the last ~50 ms (a query waits before it answers while the log is more
than `max_lag`, 25 ms, behind; measured by killing a loaded server in
tests/stores/test_query_log_durability.py), none with `durability="acknowledged"` (a query
answers once its record is committed; concurrent queries share a commit), and never leaves
a half-written row; `flush` and `get` return only after everything appended before them is
committed.

    >>> log = query_log_from_url("sqlite:///.kairos/query_log.db")
    >>> log.append(record)                      # cheap, never raises
    >>> log.get(record.query_id).outputs["user.risk"].value
    0.12
    >>> log.close()                             # flushes; also done at interpreter exit

Records and their encoding live in `kairos.stores.query_log.records`.
"""

from __future__ import annotations

from typing import Any, Final

from kairos.backends import URL, connect
from kairos.backends.url import option_names, take_options
from kairos.backends.url import redact as redact_url
from kairos.errors import KairosError
from kairos.stores.query_log.base import DEFAULT_TABLE, NullQueryLog, QueryLog, Search
from kairos.stores.query_log.batched import DURABILITY, BatchedQueryLog
from kairos.stores.query_log.records import (
    LoggedQuery,
    LoggedValue,
    PlanInfo,
    QueryLogError,
    collector_paused,
)

__all__ = [
    "DEFAULT_TABLE",
    "DURABILITY",
    "BatchedQueryLog",
    "LoggedQuery",
    "LoggedValue",
    "NullQueryLog",
    "PlanInfo",
    "QueryLog",
    "QueryLogError",
    "Search",
    "collector_paused",
    "query_log_from_url",
    "redact_url",
]

_EXAMPLES: Final = (
    "'sqlite:///.kairos/query_log.db', 'postgresql://user@host:5432/db?table=kairos_query_log' "
    "or 'none://'"
)


def query_log_from_url(url: str, **settings: Any) -> QueryLog:
    """Open the query log a URL names; `settings` go to `BatchedQueryLog` (durability,
    max_batch, ...).

    >>> query_log_from_url("sqlite:///.kairos/query_log.db")        # relative path
    >>> query_log_from_url("sqlite:////var/lib/kairos/log.db")      # absolute path
    >>> query_log_from_url("postgresql://kairos@db:5432/prod?table=query_log&schema=ml")
    >>> query_log_from_url("none://")                               # keeps nothing
    """
    shown = redact_url(url)
    if "://" not in url:
        raise KairosError(f"query log URL {shown!r} has no scheme; use {_EXAMPLES}")

    def sqlite(parsed: URL) -> QueryLog:
        rest, options = take_options(url, {"table"})
        unknown = sorted(option_names(rest))
        if unknown:
            raise KairosError(
                f"query log URL {shown!r} has unknown option {unknown[0]!r}; supported: table"
            )
        path = rest.partition("://")[2].partition("?")[0]
        if not path.startswith("/") or path in ("/", "/:memory:"):
            raise KairosError(
                f"query log URL {shown!r} needs a file path, which readers in other processes "
                "can open too: 'sqlite:///relative/log.db' or 'sqlite:////absolute/log.db'"
            )
        return BatchedQueryLog.sqlite(
            path[1:], table=options.get("table", DEFAULT_TABLE), **settings
        )

    def postgres(parsed: URL) -> QueryLog:
        conninfo, options = take_options(url, {"table", "schema"})
        return BatchedQueryLog.postgres(
            conninfo,
            table=options.get("table", DEFAULT_TABLE),
            schema=options.get("schema"),
            **settings,
        )

    def unknown(parsed: URL) -> KairosError:
        return KairosError(
            f"query log URL scheme {url.partition('://')[0]!r} (in {shown!r}) is not "
            f"supported; use {_EXAMPLES}"
        )

    return connect(
        url,
        {"none": lambda parsed: NullQueryLog(), "sqlite": sqlite, "postgresql": postgres},
        unknown=unknown,
    )
