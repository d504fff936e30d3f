"""What every query log is (`QueryLog`), what a storage backend under `BatchedQueryLog`
does (`_Backend`), the log that keeps nothing, and the name checks the backends share
(their URLs are read and redacted by kairos.backends.url)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Protocol

from kairos.errors import KairosError
from kairos.stores.query_log.records import LoggedQuery, PlanInfo, _Row


@dataclass(frozen=True, slots=True)
class Search:
    """Which decisions to find, newest first: those whose inputs had every `entity` key
    (name, key as text), whose `now` is in [since, until), whose plan touched `feature` and
    called `model` (a version, `risk@v2`, or a model name: any of its versions); with
    `before`, only those after it in that order (older `now`, or the same `now` and a lower
    query id): the `(now, query_id)` of the last decision of the page before, to read the
    next page."""

    entity: tuple[tuple[str, str], ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    feature: str | None = None
    model: str | None = None
    limit: int = 100
    before: tuple[datetime, str] | None = None

    def matches_plan(self, plan: PlanInfo) -> bool:
        if self.feature is not None and self.feature not in plan.versions:
            return False
        if self.model is None:
            return True
        return any(
            self.model == version or version.partition("@")[0] == self.model
            for version in plan.models
        )


DEFAULT_TABLE: Final = "kairos_query_log"


class QueryLog(Protocol):
    """Where online queries are appended and read back."""

    @property
    def dropped(self) -> int:
        """Records given to `append` that were not queued (queue full, or log closed)."""
        ...

    @property
    def lost(self) -> int:
        """Records taken by the writer that could not be written (the database failed)."""
        ...

    def append(self, record: LoggedQuery) -> None:
        """Queue one record; cheap, never blocks on I/O and never raises."""
        ...

    def flush(self, timeout: float = 10.0) -> None:
        """Return once every record appended before this call is committed durably."""
        ...

    def get(self, query_id: str) -> LoggedQuery | None:
        """The record of one query (pending writes are flushed first), or None."""
        ...

    def recent(self, limit: int = 20, *, nested: bool = True) -> list[LoggedQuery]:
        """The newest records first. With `nested=False` a value that is rows, a list or a
        mapping (a has-many's rows, a vector) reads as None, every other field as logged:
        for readers of times, sources, traces and calls (the dashboard), ~5x faster when
        decisions carry has-many rows."""
        ...

    def get_many(self, query_ids: Sequence[str]) -> dict[str, LoggedQuery]:
        """The records of these queries that exist, by id (one flush for all)."""
        ...

    def search(self, search: Search) -> list[LoggedQuery]:
        """The decisions `search` names, newest first (pending writes are flushed first)."""
        ...

    async def append_later(self, build: Callable[[], Sequence[LoggedQuery]], count: int) -> None:
        """Queue `count` records built (`build()`) and encoded off the query's path; while
        the queue is full, wait (without blocking the event loop): backpressure, never a
        dropped record."""
        ...

    def close(self) -> None:
        """Flush, then stop the writer. Safe to call twice."""
        ...

    async def aflush(self, timeout: float = 10.0) -> None: ...

    async def aget(self, query_id: str) -> LoggedQuery | None: ...

    async def arecent(self, limit: int = 20) -> list[LoggedQuery]: ...


_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,47}")


def _check_name(kind: str, name: str) -> str:
    if not _TABLE_NAME.fullmatch(name):
        raise KairosError(
            f"query log {kind} name {name!r} is not allowed; use letters, digits and '_' "
            "(at most 48, not starting with a digit), e.g. 'kairos_query_log'"
        )
    return name


class _Backend(Protocol):
    """Storage for `BatchedQueryLog`. `write_batch` and `close_writer` are only called from
    the writer thread; the read methods from any thread."""

    name: str  # for messages; never holds a password

    def scrub(self, text: str) -> str:
        """`text` (an error message) with any secret of the connection masked."""
        ...

    def write_batch(self, rows: Sequence[_Row]) -> None: ...

    def close_writer(self) -> None: ...

    def fetch_one(self, query_id: str) -> _Row | None: ...

    def fetch_recent(self, limit: int) -> list[_Row]: ...

    def fetch_many(self, query_ids: Sequence[str]) -> list[_Row]: ...

    def fetch_search(self, search: Search, plans: Sequence[str] | None) -> list[_Row]: ...

    def fetch_plans(self) -> dict[str, PlanInfo]: ...

    def close_readers(self) -> None: ...


_COLUMNS: Final = "query_id, now, inputs, outputs, trace, duration_ms, logged_at"


class NullQueryLog:
    """A log that keeps nothing (`none://`), for benchmarks."""

    name = "none://"
    batches_written = 0
    lost = 0

    @property
    def dropped(self) -> int:
        return 0

    def append(self, record: LoggedQuery) -> None:
        return None

    def flush(self, timeout: float = 10.0) -> None:
        return None

    def get(self, query_id: str) -> LoggedQuery | None:
        return None

    def recent(self, limit: int = 20, *, nested: bool = True) -> list[LoggedQuery]:
        return []

    def get_many(self, query_ids: Sequence[str]) -> dict[str, LoggedQuery]:
        return {}

    def search(self, search: Search) -> list[LoggedQuery]:
        return []

    async def append_later(self, build: Callable[[], Sequence[LoggedQuery]], count: int) -> None:
        return None

    def close(self) -> None:
        return None

    async def aflush(self, timeout: float = 10.0) -> None:
        return None

    async def aget(self, query_id: str) -> LoggedQuery | None:
        return None

    async def arecent(self, limit: int = 20) -> list[LoggedQuery]:
        return []
