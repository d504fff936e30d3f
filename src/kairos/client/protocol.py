"""`KairosClient`: what an embedded `Client` and a `RemoteClient` both answer, so code written
against one runs against the other (mypy checks both satisfy it: tests/client/test_protocol.py).

    def risk(client: KairosClient, user: str) -> float:
        return client.query({"user.id": user}, ["user.risk"]).get_value("user.risk")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, Self

from kairos.definitions.durations import DurationLike
from kairos.engine.result import BulkResult, QueryResult
from kairos.project.offline import OfflineResult, Progress


class KairosClient(Protocol):
    """The queries, plans and names an embedded and a remote client share."""

    def name(self, feature: Any) -> str: ...

    def explain(self, input: Iterable[Any], output: Iterable[Any]) -> str: ...

    def query(
        self,
        input: Mapping[Any, Any],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> QueryResult: ...

    async def query_async(
        self,
        input: Mapping[Any, Any],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> QueryResult: ...

    def query_bulk(
        self,
        input: Mapping[Any, Sequence[Any]] | Sequence[Mapping[Any, Any]],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> BulkResult: ...

    async def query_bulk_async(
        self,
        input: Mapping[Any, Sequence[Any]] | Sequence[Mapping[Any, Any]],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> BulkResult: ...

    def offline_query(
        self,
        spine: Any,
        output: Sequence[Any],
        *,
        timestamp: str = "ts",
        recompute: bool | Sequence[Any] = True,
        engine: str = "local",
        address: str | None = None,
        progress: Progress | None = None,
    ) -> OfflineResult: ...

    async def offline_query_async(
        self,
        spine: Any,
        output: Sequence[Any],
        *,
        timestamp: str = "ts",
        recompute: bool | Sequence[Any] = True,
        engine: str = "local",
        address: str | None = None,
        progress: Progress | None = None,
    ) -> OfflineResult: ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...

    async def aclose(self) -> None: ...
