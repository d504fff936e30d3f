"""Budget shares: holds served from this process's memory, out of amounts it reserved in the
shared counters beforehand, so a call pays no counters round trip while its key has room.

A share is one hold in the shared counters, for a set of counters (one key's budgets and rate
windows), of `depth` times a call's worst case on each, but never more than 1/64 of what
remained on a counter when it was taken. Holds of calls are then charged to the share in
memory, all lines or none; settling gives back to the share. Every amount a call is granted
was first charged in the shared store, so budgets hold across processes exactly as before:
what changes is only that up to one share per key per process is reserved and not yet used.

The next share is taken in the background once one is half used or half its `lifetime` old,
so calls seldom wait for the store. A share retires when it cannot cover a call, when the
next one replaces it, when its counters roll over (the next minute, day or month), and after
`lifetime` seconds; once its last call settled it is settled in the store to what its calls
really used. Near a limit (less than 128 worst cases left) no share
is taken and every hold goes to the store, so the last of a budget is split exactly. A
process that dies with a share open leaves it charged in full (at most `depth` worst cases,
at most 1/64 of what remained) until the next gateway to start settles it to what the ledger
says its calls charged (recovery.py; each call's row names its share, `store_hold`); past its
lease it stays charged in full, as any hold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from kairos.gateway.accounting.accountant import new_id
from kairos.gateway.accounting.counters import Counters, Line

logger = logging.getLogger(__name__)

_FRACTION = 64  # a share takes at most this fraction of what remains
_MARGIN = 5.0  # seconds before a share's lease ends that it is given back, calls open or not
Shape = tuple[tuple[str, int], ...]  # a call's counters and limits


class _Share:
    __slots__ = (
        "counters", "granted", "id", "lease_until", "open", "released", "renew_at", "renewing",
        "retired", "used",
    )  # fmt: skip

    def __init__(
        self,
        ident: str,
        counters: tuple[str, ...],
        granted: list[int],
        renew_at: float,
        lease_until: float,
    ) -> None:
        self.id = ident
        self.counters = counters
        self.granted = granted  # charged in the store, per counter
        self.used = [0] * len(granted)  # handed to calls (their holds, then what they used)
        self.open = 0  # calls holding from it, not settled yet
        self.renew_at = renew_at  # monotonic time after which the next one is taken ahead
        self.renewing = False
        self.lease_until = lease_until  # epoch seconds: the store charges it in full after
        self.retired = False  # no new calls
        self.released = False  # settled in the store (calls settling later change nothing)


class SharedCounters:
    """A `Counters` in front of the shared one, serving holds from shares (see module doc)."""

    def __init__(
        self, store: Counters, *, depth: int = 16, lifetime: float = 2.0, lease: float = 600.0
    ) -> None:
        self.store = store
        self.depth = depth
        self.lifetime = lifetime
        self.lease = lease
        self._shares: dict[Shape, _Share] = {}
        self._holds: dict[str, tuple[_Share, tuple[int, ...], float]] = {}
        self._not_before: dict[Shape, float] = {}  # no share taken for it until then
        self._taking: dict[Shape, asyncio.Task[_Share | None]] = {}
        self._waiting: set[_Share] = set()  # retired with calls open
        self._work: set[asyncio.Task[Any]] = set()  # shares being taken or given back
        self._closed = False
        self.served = self.taken = 0  # holds served from shares; shares taken

    async def spent(self, counters: Sequence[str]) -> list[int]:
        """What the store holds: calls' holds and usage, plus what shares reserved unused."""
        return await self.store.spent(counters)

    async def hold(self, hold_id: str, lines: Sequence[Line], lease_until: float) -> int | None:
        shape = tuple((line.counter, line.limit) for line in lines)
        share = self._shares.get(shape)
        if share is not None and self._take(share, hold_id, lines, lease_until):
            if not share.renewing and (
                share.renew_at < time.monotonic()
                or any(u * 2 > g for u, g in zip(share.used, share.granted, strict=True))
            ):  # half used or half its life gone: the next share is taken off the call's path
                share.renewing = True
                self._background(self._new_share(shape, lines))
            return None
        if share is not None:
            self._retire(shape, share)
        share = await self._new_share(shape, lines)
        if share is not None and self._take(share, hold_id, lines, lease_until):
            return None
        return await self.store.hold(hold_id, lines, lease_until)

    def _take(self, share: _Share, hold_id: str, lines: Sequence[Line], lease: float) -> bool:
        if share.retired or lease > share.lease_until - _MARGIN:
            return False
        used, granted = share.used, share.granted
        for index, line in enumerate(lines):
            if used[index] + line.amount > granted[index]:
                return False
        for index, line in enumerate(lines):
            used[index] += line.amount
        share.open += 1
        self.served += 1
        self._holds[hold_id] = (share, tuple(line.amount for line in lines), lease)
        return True

    async def _new_share(self, shape: Shape, lines: Sequence[Line]) -> _Share | None:
        """A new share for `shape` (None where none can be had); calls that miss together
        wait for one taking, not one each."""
        if self._closed or self.depth < 2:
            return None
        taking = self._taking.get(shape)
        if taking is None:
            if self._not_before.get(shape, 0.0) > time.monotonic():
                return None
            taking = asyncio.get_running_loop().create_task(self._take_share(shape, lines))
            self._taking[shape] = taking
            taking.add_done_callback(lambda _: self._taking.pop(shape, None))
        return await asyncio.shield(taking)

    async def _take_share(self, shape: Shape, lines: Sequence[Line]) -> _Share | None:
        now = time.monotonic()
        self._lapse(time.time())
        if len(self._not_before) > 4096:
            self._not_before = {s: t for s, t in self._not_before.items() if t > now}
        counters = tuple(line.counter for line in lines)
        lease_until = time.time() + self.lease + 2 * self.lifetime + _MARGIN
        # a share of `depth` worst cases, else of 2; the store grants it only where it is at
        # most 1/64 of what remains: spent + 64 x size <= limit, one conditional hold
        for depth in (self.depth, 2):
            ident = "share-" + new_id()
            sizes = [line.amount * depth for line in lines]
            wide = [
                Line(
                    line.counter,
                    line.limit - (_FRACTION - 1) * size,
                    size,
                    line.expires_at and line.expires_at + self.lifetime,
                )
                for line, size in zip(lines, sizes, strict=True)
            ]
            if min(sizes) > 0 and await self.store.hold(ident, wide, lease_until) is None:
                break
        else:  # near the limit (or a zero amount): every hold to the store for a while
            self._not_before[shape] = now + self.lifetime
            return None
        share = _Share(ident, counters, sizes, now + self.lifetime / 2, lease_until)
        self.taken += 1
        if self._closed:  # closed while it was being taken: give it back at once
            share.retired = True
            await self._release(share)
            return None
        if (old := self._shares.get(shape)) is not None:  # the one it renews
            self._retire(shape, old)
        self._shares[shape] = share
        asyncio.get_running_loop().call_later(self.lifetime, self._retire, shape, share)
        return share

    def _retire(self, shape: Shape, share: _Share) -> None:
        share.retired = True
        if self._shares.get(shape) is share:
            del self._shares[shape]
        if share.released:
            return
        if share.open == 0:
            self._waiting.discard(share)
            self._background(self._release(share))
        else:
            self._waiting.add(share)

    def _lapse(self, now: float) -> None:
        """Shares whose calls stay open until near the share's lease: given back as they are
        (open calls counted in full), so one lost call does not keep the rest charged."""
        for share in [s for s in self._waiting if s.lease_until - _MARGIN <= now]:
            self._waiting.discard(share)
            self._holds = {h: r for h, r in self._holds.items() if r[0] is not share}
            self._background(self._release(share))

    def _background(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._work.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._work.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            logger.error("a budget share failed: %s: %s", type(error).__name__, error)

    async def _release(self, share: _Share) -> None:
        if share.released:
            return
        share.released = True
        try:
            await self.store.settle(share.id, dict(zip(share.counters, share.used, strict=True)))
        except Exception as error:  # the share stays charged in full: never more than used
            logger.error("releasing a budget share failed: %s: %s", type(error).__name__, error)

    async def settle(self, hold_id: str, actual: Mapping[str, int]) -> bool:
        record = self._holds.pop(hold_id, None)
        if record is None:
            return await self.store.settle(hold_id, actual)
        share, amounts, lease_until = record
        share.open -= 1
        # once its lease ran out (or its share was given back) the full hold stays charged
        settled = not share.released and lease_until >= time.time()
        if settled:
            for index, (counter, amount) in enumerate(zip(share.counters, amounts, strict=True)):
                share.used[index] += actual.get(counter, amount) - amount
        if share.retired and share.open == 0 and not share.released:
            self._waiting.discard(share)
            # in a task of its own: a caller cancelled now cannot leave the share unsettled
            self._background(self._release(share))
        return settled

    def store_hold(self, hold_id: str) -> str:
        """The hold in the store that carries a call's hold: its share's, or its own."""
        record = self._holds.get(hold_id)
        return hold_id if record is None else record[0].id

    async def orphans(self, process: str) -> list[tuple[str, dict[str, int]]]:
        return await self.store.orphans(process)

    async def returned(self) -> None:
        """Until the shares being given back (or taken) now are done with the store."""
        if self._work:
            await asyncio.wait(list(self._work))

    async def release(self) -> None:
        """Give back what idle shares reserved (the store then holds exactly what calls used);
        shares with calls open are given back when their last call settles."""
        for _ in range(8):  # under steady traffic new shares keep coming: a few passes
            for shape, share in list(self._shares.items()):
                if share.open == 0:
                    self._retire(shape, share)
            pending = [*self._work, *self._taking.values()]
            if not pending:
                return
            await asyncio.gather(*pending, return_exceptions=True)

    async def close(self) -> None:
        """Give every share back (calls never settled stay charged in full), then close the
        store."""
        self._closed = True
        while self._taking or self._work:
            await asyncio.gather(*self._work, *self._taking.values(), return_exceptions=True)
        for shape, share in list(self._shares.items()):
            self._retire(shape, share)
        for share in [*self._waiting, *(record[0] for record in self._holds.values())]:
            self._background(self._release(share))
        self._waiting.clear()
        while self._work:
            await asyncio.gather(*self._work, return_exceptions=True)
        await self.store.close()
