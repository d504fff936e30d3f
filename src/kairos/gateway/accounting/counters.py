"""Budget and rate counters: the one place where spending is checked and charged atomically.

A hold adds the worst case of a call to every counter that applies, in one atomic step, or
to none of them when any would pass its limit. Settling replaces a hold's amounts with what
the call really used, once (settling twice, or after the lease ran out, changes nothing). A
hold that is never settled stays charged in full: that is the lease rule, with nothing to
sweep but the hold's own record. Hold records are kept in the store, so the holds of a process
that died can be settled by the next gateway to start, to what the ledger says its calls
charged (recovery.py).

Backends (one URL picks one): `sqlite:///file` (one write transaction), `postgresql://`
(conditional UPDATEs in a fixed order in one transaction), `redis://` (one Lua script).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Line:
    """Add `amount` to `counter` unless that passes `limit`; the counter may be dropped after
    `expires_at` (epoch seconds; None = never), e.g. a per-minute rate window."""

    counter: str
    limit: int
    amount: int
    expires_at: float | None = None


class Counters(Protocol):
    async def spent(self, counters: Sequence[str]) -> list[int]:
        """What each counter holds now (0 for one never charged)."""
        ...

    async def hold(self, hold_id: str, lines: Sequence[Line], lease_until: float) -> int | None:
        """Charge every line or none; None when held, else the index of a line that refused."""
        ...

    async def settle(self, hold_id: str, actual: Mapping[str, int]) -> bool:
        """Replace the hold's amounts by `actual` (per counter); False if already settled or
        its lease ran out (then the full hold stays charged)."""
        ...

    async def orphans(self, process: str) -> list[tuple[str, dict[str, int]]]:
        """Open holds of a process (ids beginning with its prefix, its budget shares' too),
        each with what it holds per counter, for recovering a dead process's: `settle` then
        settles one as that process would have."""
        ...

    async def close(self) -> None: ...


def process_holds(process: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """Id ranges (low inclusive, high exclusive) of a process's holds: its calls' (the
    process's id prefix) and its budget shares' (`share-` and the prefix)."""
    return (process, process + "g"), ("share-" + process, "share-" + process + "g")
