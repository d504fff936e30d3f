"""The one accounting step around every upstream call: hold the worst case against every
budget and rate limit of the key, dispatch, then settle to what the call really used.

* The hold is the call's input bound plus `max_tokens` of output, priced at the deployment's
  price, charged atomically to every counter that applies (or to none). When a budget cannot
  cover it, `max_tokens` is clamped to what remains; below one token the call is refused.
* Settling charges the usage the provider reported. A call the provider accepted but whose
  usage never arrived stays charged in full (as does a hold whose lease runs out); a call that
  never got an answer from the provider is released. Settling twice changes nothing.

Counters: `{key}:usd:{period}:{stamp}` (micro-dollars), `{key}:tok:{period}:{stamp}` (tokens),
`{key}:rpm:{minute}` and `{key}:tpm:{minute}` (fixed one-minute windows).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from kairos.gateway.counters import Counters, Line
from kairos.gateway.errors import BudgetExceeded, RateLimited
from kairos.gateway.keys import KeyRecord
from kairos.gateway.prices import Price
from kairos.gateway.providers import Usage

_CLAMP_TRIES = 5
_PROCESS = os.urandom(8).hex()  # ids are this process's prefix and a counter: no syscall each
_COUNTER = itertools.count()


def new_id() -> str:
    """An id unique across processes (64 random bits per process, then a counter)."""
    return f"{_PROCESS}{next(_COUNTER):012x}"


_WINDOW = 120.0  # seconds a one-minute rate counter is kept


@dataclass(frozen=True, slots=True)
class Hold:
    id: str
    lines: tuple[Line, ...]
    max_tokens: int  # what the call may produce; forwarded upstream
    input_tokens: int  # the bound the hold was made with
    price: Price


@dataclass(frozen=True, slots=True)
class Settlement:
    cost_micros: int
    tokens_in: int
    tokens_out: int
    usage_known: bool


def input_bound(text_bytes: int, parts: int) -> int:
    """A safe upper bound on input tokens: every BPE token covers at least one byte, plus a
    few tokens of framing per message."""
    return text_bytes + 8 * parts + 8


class Accountant:
    def __init__(
        self, counters: Counters, *, lease: float, clock: Callable[[], float] = time.time
    ) -> None:
        self.counters = counters
        self.lease = lease
        self.clock = clock
        self._stamp_second = -1
        self._stamp: dict[str, str] = {}

    def _stamps(self, now: float) -> dict[str, str]:
        """Period stamps (UTC) of this second: minute, day, month, total."""
        second = int(now)
        if self._stamp_second != second:
            moment = datetime.fromtimestamp(second, UTC)
            self._stamp = {
                "minute": moment.strftime("%Y%m%d%H%M"),
                "day": moment.strftime("%Y-%m-%d"),
                "month": moment.strftime("%Y-%m"),
                "total": "all",
            }
            self._stamp_second = second
        return self._stamp

    def lines(self, key: KeyRecord, price: Price, input_tokens: int, max_tokens: int) -> list[Line]:
        now = self.clock()
        stamps = self._stamps(now)
        minute = stamps["minute"]
        tokens = input_tokens + max_tokens
        lines = []
        for budget in key.budgets:
            stamp = stamps[budget.period]
            if budget.usd_micros is not None:
                lines.append(
                    Line(
                        f"{key.id}:usd:{budget.period}:{stamp}",
                        budget.usd_micros,
                        price.cost(input_tokens, max_tokens),
                    )
                )
            if budget.tokens is not None:
                lines.append(Line(f"{key.id}:tok:{budget.period}:{stamp}", budget.tokens, tokens))
        if key.rpm is not None:
            lines.append(Line(f"{key.id}:rpm:{minute}", key.rpm, 1, now + _WINDOW))
        if key.tpm is not None:
            lines.append(Line(f"{key.id}:tpm:{minute}", key.tpm, tokens, now + _WINDOW))
        return lines

    async def hold(self, key: KeyRecord, price: Price, input_tokens: int, max_tokens: int) -> Hold:
        """Reserve the worst case, clamping `max_tokens` to what the budgets cover."""
        hold_id = new_id()
        wanted = max_tokens
        refused: int | None = 0
        lines: list[Line] = []
        for _ in range(_CLAMP_TRIES):
            lines = self.lines(key, price, input_tokens, max_tokens)
            if not lines:
                return Hold(hold_id, (), max_tokens, input_tokens, price)
            refused = await self.counters.hold(hold_id, lines, self.clock() + self.lease)
            if refused is None:
                return Hold(hold_id, tuple(lines), max_tokens, input_tokens, price)
            if ":rpm:" in lines[refused].counter:
                raise RateLimited(
                    f"key {key.id!r} used its {key.rpm} requests per minute; retry next minute"
                )
            max_tokens = await self._affordable(lines, price, input_tokens, wanted)
            if max_tokens < (1 if wanted else 0):  # embeddings want no output tokens
                raise self._refusal(key, lines, refused)
        raise self._refusal(key, lines, refused or 0)

    async def _affordable(
        self, lines: list[Line], price: Price, input_tokens: int, wanted: int
    ) -> int:
        spent = await self.counters.spent([line.counter for line in lines])
        best = wanted
        for line, used in zip(lines, spent, strict=True):
            room = line.limit - used
            if ":usd:" in line.counter:
                best = min(best, price.affordable_output(input_tokens, room))
            elif ":rpm:" not in line.counter:
                best = min(best, room - input_tokens)
        return best

    def _refusal(self, key: KeyRecord, lines: list[Line], index: int) -> Exception:
        counter = lines[index].counter
        if ":tpm:" in counter:
            return RateLimited(
                f"key {key.id!r} used its {key.tpm} tokens per minute; retry next minute or "
                "ask for fewer max_tokens"
            )
        _, unit, period, _ = counter.split(":", 3)
        limit = lines[index].limit
        amount = f"${limit / 1_000_000:.6f}" if unit == "usd" else f"{limit} tokens"
        return BudgetExceeded(
            f"key {key.id!r} has too little left of its {period} budget ({amount}) for this "
            "request; shorten the input, lower max_tokens, or raise the budget"
        )

    async def settle(self, hold: Hold, usage: Usage | None, *, accepted: bool) -> Settlement:
        """Charge what the call used: the reported usage; the full hold when the provider
        accepted the call but no usage arrived; nothing when it never accepted it."""
        if usage is not None:
            settlement = Settlement(
                hold.price.cost(usage.input_tokens, usage.output_tokens),
                usage.input_tokens,
                usage.output_tokens,
                True,
            )
        elif accepted:
            settlement = Settlement(
                hold.price.cost(hold.input_tokens, hold.max_tokens),
                hold.input_tokens,
                hold.max_tokens,
                False,
            )
        else:
            settlement = Settlement(0, 0, 0, False)
        if hold.lines:
            tokens = settlement.tokens_in + settlement.tokens_out
            actual = {}
            for line in hold.lines:
                if ":usd:" in line.counter:
                    actual[line.counter] = settlement.cost_micros
                elif ":rpm:" in line.counter:
                    actual[line.counter] = line.amount  # a request counts whatever happened
                else:
                    actual[line.counter] = tokens
            await self.counters.settle(hold.id, actual)
        return settlement
