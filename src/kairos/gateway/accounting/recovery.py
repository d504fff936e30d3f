"""Recovering the calls of a gateway process that died (kill -9, a crash, a lost machine).

Each process marks itself alive in the registry before its first call, and every call leaves
a `pending` ledger row, charging its full hold, before it is dispatched (ledger.py). When a
gateway starts, it looks for processes that are gone and, for each:

* settles the holds it left open in the shared counters (its budget shares' and its calls'
  own) to what the ledger says their calls charged: a call that ended and was logged counts
  what it used, one still pending counts its full hold (the lease rule). A share's reserved
  and unused part is given back, so the counters charge no more than the ledger shows;
* marks its pending rows `interrupted` (their charge stays the full hold);
* forgets it.

Settling is idempotent (a hold's record goes with its settle), so two gateways starting at
once may both recover a process. A hold whose lease ran out before recovery stays charged in
full, as any hold does.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Protocol

from kairos.gateway.accounting.counters import Counters
from kairos.gateway.accounting.ledger import LedgerRow, LedgerStore

logger = logging.getLogger(__name__)


class Processes(LedgerStore, Protocol):
    """What recovery needs of the registry (store.registry.Registry): the dead processes,
    their ledger rows, and forgetting a process once recovered."""

    async def dead_processes(self) -> list[str]: ...

    async def process_rows(self, process: str, since: datetime) -> list[LedgerRow]: ...

    async def forget(self, process: str) -> None: ...


def charged(held: Mapping[str, int], rows: Sequence[LedgerRow]) -> dict[str, int]:
    """What a hold's counters should carry for the calls whose rows name it, by counter
    kind as `Accountant.settle` charges them (money, one request each, tokens)."""
    cost = sum(row.cost_micros for row in rows)
    tokens = sum(row.tokens_in + row.tokens_out for row in rows)
    actual = {}
    for counter in held:
        if ":usd:" in counter:
            actual[counter] = cost
        elif ":rpm:" in counter:
            actual[counter] = len(rows)
        else:
            actual[counter] = tokens
    return actual


async def recover(registry: Processes, counters: Counters, *, since: datetime) -> int:
    """Recover every dead process (see the module doc); rows older than `since` that are not
    pending cannot belong to a hold still open. Returns how many calls were interrupted.

    >>> await recover(gateway.registry, gateway.counters, since=an_hour_ago)  # doctest: +SKIP
    3
    """
    interrupted = 0
    for process in await registry.dead_processes():
        rows = await registry.process_rows(process, since)
        by_hold: dict[str, list[LedgerRow]] = {}
        for row in rows:
            if row.hold_id is not None:
                by_hold.setdefault(row.hold_id, []).append(row)
        holds = await counters.orphans(process)
        for hold_id, held in holds:
            await counters.settle(hold_id, charged(held, by_hold.get(hold_id, ())))
        cut = [
            dataclasses.replace(row, status="interrupted")
            for row in rows
            if row.status == "pending"
        ]
        if cut:
            await registry.write_rows(cut)
        await registry.forget(process)
        interrupted += len(cut)
        if cut or holds:
            logger.warning(
                "recovered gateway process %s: %d calls interrupted, %d holds settled",
                process, len(cut), len(holds),
            )  # fmt: skip
    return interrupted
