"""The ledger: one row per request, what it asked for, where it went, what it used and cost.

A call's row is written twice. Before each dispatch, a `pending` row, durable before the call
leaves: it says where the call went and charges its full hold (what the lease rule charges a
call whose usage never arrives). Once the call ends, its final row replaces it, written behind
the request (batched every `interval` seconds) so the end adds no round trip to a call. A
process that dies leaves its calls' rows `pending`; the next gateway to start marks them
`interrupted` (recovery.py), still charging the full hold, as the counters do. So the ledger
never shows less than the counters charged. No row holds a key or a credential: `key_id` is
the key's public id.
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
    status: str  # ok | pending | interrupted | client_disconnected | upstream_error | ...
    attempts: int
    created_at: datetime
    tokens_cached: int = 0  # of tokens_in: read from the provider's prompt cache
    tokens_cache_write: int = 0  # of tokens_in: written to it
    # what the provider's reported usage cost beyond the hold: not charged to any budget (a
    # hold that was not the worst case); cost_micros + uncharged_micros is the provider's bill
    uncharged_micros: int = 0
    # the hold in the shared counters that carries the call's (its budget share's, or its
    # own): recovery settles a dead process's holds to what their rows charged
    hold_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["created_at"] = self.created_at.isoformat()
        del row["hold_id"]  # bookkeeping between the ledger and the counters
        return row


class LedgerStore(Protocol):
    async def write_rows(self, rows: Sequence[LedgerRow]) -> None:
        """Insert rows, each replacing the row of its request_id (a pending one) if any."""
        ...

    async def read_rows(
        self, key_id: str | None, since: datetime | None, until: datetime | None
    ) -> list[LedgerRow]: ...


class LedgerWriter:
    """Buffers rows and writes them in batches; `flush()` writes what is buffered now.
    Pending rows are written at once instead (`pending`)."""

    def __init__(self, store: LedgerStore, interval: float = 0.1) -> None:
        self._store = store
        self._interval = interval
        self._rows: list[LedgerRow] = []
        self._task: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._writing = False  # a pending row's write is on its way
        self._queued: list[LedgerRow] = []  # pending rows that go with the next write
        self._next: asyncio.Future[None] | None = None  # done once those are written
        self._group: asyncio.Task[None] | None = None

    async def pending(self, row: LedgerRow) -> None:
        """Write a dispatched call's pending row (durable when this returns). Rows that come
        while one is being written go together in the next write (one transaction, one
        connection), so a burst of calls does not take a connection each."""
        if self._writing:
            self._queued.append(row)
            if self._next is None:
                self._next = asyncio.get_running_loop().create_future()
                # a caller that went away leaves no error unread
                self._next.add_done_callback(lambda done: done.cancelled() or done.exception())
            await asyncio.shield(self._next)
            return
        self._writing = True
        try:
            await self._store.write_rows([row])
        finally:
            self._write_queued()

    def _write_queued(self) -> None:
        if not self._queued or self._next is None:
            self._writing = False
            return
        rows, self._queued = self._queued, []
        written, self._next = self._next, None
        self._group = asyncio.get_running_loop().create_task(self._write_group(rows, written))

    async def _write_group(self, rows: list[LedgerRow], written: asyncio.Future[None]) -> None:
        try:
            await self._store.write_rows(rows)
        except Exception as error:
            written.set_exception(error)
        else:
            written.set_result(None)
        finally:
            self._write_queued()

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
        "tokens_cached": sum(r.tokens_cached for r in rows),
        "tokens_cache_write": sum(r.tokens_cache_write for r in rows),
        # reported beyond what holds covered, so charged to no budget: 0 when bounds hold
        "uncharged_micros": sum(r.uncharged_micros for r in rows),
        "by_key_and_model": sorted(totals.values(), key=lambda e: (e["key_id"], e["model"])),
    }
