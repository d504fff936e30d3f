"""The ledger: one row per request, what it asked for, where it went, what it used and cost.

Rows are written behind the request (batched every `interval` seconds) so the ledger adds no
round trip to a call; budgets never depend on it (the counters are charged before dispatch).
No row holds a key or a credential: `key_id` is the key's public id.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LedgerRow:
    request_id: str
    key_id: str
    route: str  # chat | completion | embedding | messages
    model_requested: str
    model_dispatched: str | None  # the model group actually served
    provider: str | None
    deployment: str | None  # the upstream model name
    tokens_in: int
    tokens_out: int
    cost_micros: int
    price_version: str
    ttft_ms: float | None
    latency_ms: float
    status: str  # ok | client_disconnected | upstream_error | budget_exceeded | ...
    attempts: int
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["created_at"] = self.created_at.isoformat()
        return row


class LedgerStore(Protocol):
    async def write_rows(self, rows: Sequence[LedgerRow]) -> None: ...

    async def read_rows(
        self, key_id: str | None, since: datetime | None, until: datetime | None
    ) -> list[LedgerRow]: ...


class LedgerWriter:
    """Buffers rows and writes them in batches; `flush()` writes what is buffered now."""

    def __init__(self, store: LedgerStore, interval: float = 0.1) -> None:
        self._store = store
        self._interval = interval
        self._rows: list[LedgerRow] = []
        self._task: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None

    def add(self, row: LedgerRow) -> None:
        self._rows.append(row)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._later())

    async def _later(self) -> None:
        await asyncio.sleep(self._interval)
        await self.flush()

    async def flush(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            rows, self._rows = self._rows, []
            if not rows:
                return
            try:
                await self._store.write_rows(rows)
            except Exception:
                self._rows[:0] = rows  # keep them for the next flush
                logger.exception("ledger write failed; %d rows kept for retry", len(rows))

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()


def period_bound(value: str | None) -> datetime | None:
    """A `since`/`until` bound of a usage query: ISO 8601, UTC when it names no zone; None
    stays None. Raises ValueError for anything else."""
    if value is None:
        return None
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def summarize(rows: Sequence[LedgerRow]) -> dict[str, Any]:
    """Totals per key and model over `rows`."""
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        model = row.model_dispatched or row.model_requested
        entry = totals.setdefault(
            (row.key_id, model),
            {"key_id": row.key_id, "model": model, "requests": 0, "tokens_in": 0,
             "tokens_out": 0, "cost_micros": 0},
        )  # fmt: skip
        entry["requests"] += 1
        entry["tokens_in"] += row.tokens_in
        entry["tokens_out"] += row.tokens_out
        entry["cost_micros"] += row.cost_micros
    return {
        "requests": len(rows),
        "cost_micros": sum(r.cost_micros for r in rows),
        "tokens_in": sum(r.tokens_in for r in rows),
        "tokens_out": sum(r.tokens_out for r in rows),
        "by_key_and_model": sorted(totals.values(), key=lambda e: (e["key_id"], e["model"])),
    }
