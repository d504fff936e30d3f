"""The one accounting step around every upstream call: hold the worst case against every
budget and rate limit of the key, dispatch, then settle to what the call really used.

* The hold is the call's input bound plus `max_tokens` of output, priced at the deployment's
  price, charged atomically to every counter that applies (or to none). When a budget cannot
  cover it, `max_tokens` is clamped to what remains; below one token the call is refused.
* The input bound counts text by its bytes and every other part by the most the provider
  bills for it (images per model, tool definitions' framing: `IMAGE_TOKENS`, `TOOL_TOKENS`);
  parts no bound is known for (files) are refused on keys with token or USD limits.
* Input is held at its dearest price (a cache write, where the model has one); settling prices
  cached and cache-written input at their own prices.
* Settling charges the usage the provider reported, never more than the hold: the budget can
  never pass its limit. What a report costs beyond the hold is not charged; the ledger records
  it (`uncharged_micros`) and a warning is logged. A call the provider accepted but whose usage
  never arrived stays charged in full (as does a hold whose lease runs out); a call that never
  got an answer from the provider is released. Settling twice changes nothing. Reported
  counts are read as at least 0 (providers/base.py), and a settled amount is never below 0: a
  report cannot give back budget.
* A settle the store refuses (the hold's lease ran out first, or its budget share was given
  back) leaves the full hold charged; the Settlement then is the full hold's (`lapsed`), so
  the call's ledger row charges what the counters did.

Counters: `{key}:usd:{period}:{stamp}` (micro-dollars), `{key}:tok:{period}:{stamp}` (tokens),
`{key}:rpm:{minute}` and `{key}:tpm:{minute}` (fixed one-minute windows).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from kairos.gateway.accounting.counters import Counters, Line
from kairos.gateway.accounting.prices import Price
from kairos.gateway.errors import BudgetExceeded, InvalidRequest, RateLimited
from kairos.gateway.keys import KeyRecord

logger = logging.getLogger(__name__)
_CLAMP_TRIES = 5
_SETTLE_WAITS = 3  # times a refused hold waits for the key's due settles before clamping
# this process's id: 64 random bits, the prefix of every id it makes (requests, holds), and
# its mark in the registry while it lives (recovery.py)
PROCESS = os.urandom(8).hex()
_COUNTER = itertools.count()


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a call used, as OpenAI counts them: `cached` (read from the provider's prompt
    cache) and `written` (written to it) are parts of `input_tokens`; `written_1h` (Anthropic's
    1-hour cache) is a part of `written`."""

    input_tokens: int
    output_tokens: int
    cached: int = 0
    written: int = 0
    written_1h: int = 0


def new_id() -> str:
    """An id unique across processes (64 random bits per process, then a counter)."""
    return f"{PROCESS}{next(_COUNTER):012x}"  # no syscall each


_WINDOW = 120.0  # seconds a one-minute rate counter is kept


@dataclass(frozen=True, slots=True)
class Hold:
    id: str
    lines: tuple[Line, ...]
    max_tokens: int  # what the call may produce; sent upstream when the key needs a cap
    input_tokens: int  # the bound the hold was made with
    price: Price  # the deployment's, which settling bills usage at

    @property
    def cost(self) -> int:
        """Micro-dollars the hold charged: its input at the dearest input price."""
        return self.price.held().cost(self.input_tokens, self.max_tokens)


@dataclass(frozen=True, slots=True)
class Settlement:
    cost_micros: int  # what the budgets were charged
    tokens_in: int
    tokens_out: int
    usage_known: bool
    tokens_cached: int = 0  # of tokens_in: read from the provider's prompt cache
    tokens_cache_write: int = 0  # of tokens_in: written to it
    uncharged_micros: int = 0  # what the reported usage cost beyond the hold (not charged)
    # settled too late (lease ran out, share given back): the full hold stays charged, and
    # this settlement says so (cost and tokens are the hold's)
    lapsed: bool = False


def seconds_to_reset(period: str, now: float) -> int | None:
    """Whole seconds (at least 1) until a period's counters start again, UTC; None for
    `total`, which never resets.

    >>> seconds_to_reset("minute", 90.5)
    30
    """
    if period == "total":
        return None
    if period == "minute":
        return 60 - int(now) % 60
    moment = datetime.fromtimestamp(now, UTC)
    start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        following = start + timedelta(days=1)
    else:
        following = (start.replace(day=1) + timedelta(days=32)).replace(day=1)
    return max(1, math.ceil((following - moment).total_seconds()))


def key_reset(key: KeyRecord, now: float) -> int | None:
    """Seconds until every budget and the tpm limit of `key` have started again; None when
    one of them is a total budget."""
    periods = [budget.period for budget in key.budgets] + (["minute"] if key.tpm else [])
    resets = [seconds_to_reset(period, now) for period in periods]
    if not resets or None in resets:
        return None
    return max(r for r in resets if r is not None)


def input_bound(text_bytes: int, parts: int) -> int:
    """A safe upper bound on the input tokens of text: every BPE token covers at least one
    byte, plus a few tokens of framing per message. Other parts: `parts_bound`."""
    return text_bytes + 8 * parts + 8


# --- the most a provider bills for one input part that is not text --------------------------
# OpenAI (platform.openai.com/docs/guides/images-vision, "Calculating costs"): a high-detail
# image is fitted in 2048 x 2048, then its short side in 768 px, and billed a base plus a price
# per 512 px tile, so 2048 x 768 (4 x 2 tiles) is the most; the `detail` asked for does not
# lower the bound (auto may pick high). Patch models bill 32 px patches, at most 1,536, times a
# multiplier. Anthropic (docs.anthropic.com/en/docs/build-with-claude/vision): width x height
# / 750, images over 1.15 megapixels resized to stay within ~1,600 tokens.
def _tiles(base: int, per_tile: int) -> int:
    return base + 8 * per_tile


def _patches(multiplier: float) -> int:
    return math.ceil(1536 * multiplier)


IMAGE_TOKENS = {  # a model family: its name, or its name then "-" and a snapshot date
    "gpt-4o": _tiles(85, 170),
    "gpt-4.1": _tiles(85, 170),
    "gpt-4-turbo": _tiles(85, 170),
    "gpt-4o-mini": _tiles(2833, 5667),  # priced per token so an image costs as on gpt-4o
    "o1": _tiles(75, 150),
    "o3": _tiles(75, 150),
    "gpt-4.1-mini": _patches(1.62),
    "gpt-4.1-nano": _patches(2.46),
    "o4-mini": _patches(1.72),
}
CLAUDE_IMAGE_TOKENS = 1_600  # every claude-* model
# a model not named above (a new family, a self-hosted model: Qwen2-VL takes up to 16,384 per
# image): the most any known family bills
UNKNOWN_IMAGE_TOKENS = max(IMAGE_TOKENS.values())
IMAGE_FRAMING = 16  # the image part's own JSON is left out of the text bytes
# Tool definitions are text (their JSON counts by its bytes), rendered into a system prompt of
# the provider's: Anthropic documents at most 530 tokens for it (claude-3-opus, tool_choice
# auto; docs.anthropic.com/en/docs/agents-and-tools/tool-use "Pricing"), OpenAI's rendering
# (a TypeScript namespace) is shorter than the JSON; plus framing per tool.
TOOLS_PROMPT_TOKENS = 530
TOOL_TOKENS = 16
# Audio (input_audio) counts by the bytes of its base64 data, like text: mp3 spends at least
# 1,000 bytes a second (8 kbps, its least), a WAV its header's byte rate (checked to be as much:
# a header can claim one sample a second), and OpenAI bills user audio 1 token per 100 ms
# (platform.openai.com/docs/guides/realtime-costs).
AUDIO_LEAST_BYTES_PER_SECOND = 1_000


@dataclass(frozen=True, slots=True)
class InputParts:
    """What a request's input is made of: the bytes of its text, and the parts that are not
    counted as text: images, tool definitions, and the first part nothing bounds, by its field:
    a file (pages unknown before the call), audio of unknown length, input stored at the
    provider or fetched by a built-in tool."""

    images: int = 0
    tools: int = 0
    unbounded: str | None = None
    text_bytes: int = 0


def image_tokens(model: str) -> int:
    """The most one image may be billed as on an upstream `model`.

    >>> image_tokens("gpt-4o-2024-08-06"), image_tokens("claude-haiku-4-5")
    (1445, 1600)
    """
    if model.startswith("claude-"):
        return CLAUDE_IMAGE_TOKENS
    if model in IMAGE_TOKENS:
        return IMAGE_TOKENS[model]
    for family in sorted(IMAGE_TOKENS, key=len, reverse=True):  # gpt-4o-mini before gpt-4o
        if model.startswith(family + "-") and model[len(family) + 1 : len(family) + 2].isdigit():
            return IMAGE_TOKENS[family]
    return UNKNOWN_IMAGE_TOKENS


def parts_bound(parts: InputParts, model: str) -> int:
    """The most input tokens the parts other than text may be billed as on `model`."""
    tools = TOOLS_PROMPT_TOKENS + TOOL_TOKENS * parts.tools if parts.tools else 0
    return parts.images * (image_tokens(model) + IMAGE_FRAMING) + tools


def check_bounded(parts: InputParts, key: KeyRecord) -> None:
    """Refuse a part nothing bounds on a key whose token or USD limits a hold must cover."""
    if parts.unbounded is not None and (key.budgets or key.tpm is not None):
        raise InvalidRequest(
            f"{parts.unbounded} brings input whose tokens cannot be bounded before the call "
            "(a file's pages, audio that is neither mp3 nor a WAV of at least 1,000 bytes a "
            "second, input stored at the provider, a built-in tool's results), and key "
            f"{key.id!r} has a budget or a tokens-per-minute limit; send text or images "
            "instead, or use a key without token or USD limits",
            param=parts.unbounded,
        )


class Accountant:
    def __init__(
        self,
        counters: Counters,
        *,
        lease: float,
        clock: Callable[[], float] = time.time,
        settles: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        self.counters = counters
        self.lease = lease
        self.clock = clock
        # waits for a key's calls that are answered but not settled yet (False: there are
        # none); a refused hold waits for them, since settling gives back
        self.settles = settles
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
        # one line per counter: two budgets of one period and unit (refused by key_spec, but
        # possible in a record stored before) share a counter, and the lowest limit holds
        limits: dict[str, int] = {}
        for budget in key.budgets:
            stamp = stamps[budget.period]
            for unit, limit in (("usd", budget.usd_micros), ("tok", budget.tokens)):
                if limit is not None:
                    counter = f"{key.id}:{unit}:{budget.period}:{stamp}"
                    limits[counter] = min(limit, limits.get(counter, limit))
        cost = price.cost(input_tokens, max_tokens) if limits else 0
        lines = [
            Line(counter, limit, cost if ":usd:" in counter else tokens)
            for counter, limit in limits.items()
        ]
        if key.rpm is not None:
            lines.append(Line(f"{key.id}:rpm:{minute}", key.rpm, 1, now + _WINDOW))
        if key.tpm is not None:
            lines.append(Line(f"{key.id}:tpm:{minute}", key.tpm, tokens, now + _WINDOW))
        return lines

    async def hold(self, key: KeyRecord, price: Price, input_tokens: int, max_tokens: int) -> Hold:
        """Reserve the worst case, clamping `max_tokens` to what the budgets cover."""
        hold_id = new_id()
        held = price.held()  # the hold's price; settling uses `price`
        wanted = max_tokens
        refused: int | None = 0
        lines: list[Line] = []
        waits = 0
        for _ in range(_CLAMP_TRIES + _SETTLE_WAITS):
            lines = self.lines(key, held, input_tokens, max_tokens)
            if not lines:
                return Hold(hold_id, (), max_tokens, input_tokens, price)
            refused = await self.counters.hold(hold_id, lines, self.clock() + self.lease)
            if refused is None:
                return Hold(hold_id, tuple(lines), max_tokens, input_tokens, price)
            if ":rpm:" in lines[refused].counter:
                raise RateLimited(
                    f"key {key.id!r} used its {key.rpm} requests per minute; retry next minute",
                    retry_after=seconds_to_reset("minute", self.clock()),
                )
            # the same client's previous call may be answered and not settled yet: what it
            # gives back counts before this call is clamped or refused
            if waits < _SETTLE_WAITS and self.settles is not None and await self.settles(key.id):
                waits += 1
                continue
            max_tokens = await self._affordable(lines, held, input_tokens, wanted)
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
                "ask for fewer max_tokens",
                retry_after=seconds_to_reset("minute", self.clock()),
            )
        _, unit, period, _ = counter.split(":", 3)
        limit = lines[index].limit
        amount = f"${limit / 1_000_000:.6f}" if unit == "usd" else f"{limit} tokens"
        return BudgetExceeded(
            f"key {key.id!r} has too little left of its {period} budget ({amount}) for this "
            "request; shorten the input, lower max_tokens, or raise the budget",
            retry_after=seconds_to_reset(period, self.clock()),
        )

    async def settle(self, hold: Hold, usage: Usage | None, *, accepted: bool) -> Settlement:
        """Charge what the call used: the reported usage, up to the hold; the full hold when
        the provider accepted the call but no usage arrived; nothing when it never accepted
        it."""
        held_cost = hold.cost
        if usage is not None:
            cost = hold.price.cost(
                usage.input_tokens, usage.output_tokens,
                cached=usage.cached, written=usage.written, written_1h=usage.written_1h,
            )  # fmt: skip
            charged = max(0, min(cost, held_cost))  # never a refund, never past the hold
            settlement = Settlement(
                charged, usage.input_tokens, usage.output_tokens, True,
                usage.cached, usage.written, max(0, cost - charged),
            )  # fmt: skip
        elif accepted:
            settlement = Settlement(held_cost, hold.input_tokens, hold.max_tokens, False)
        else:
            settlement = Settlement(0, 0, 0, False)
        tokens = settlement.tokens_in + settlement.tokens_out
        over = settlement.uncharged_micros > 0 or tokens > hold.input_tokens + hold.max_tokens
        if over:
            logger.warning(
                "hold %s: the provider reported more than the hold covered (%d tokens in, %d "
                "out; held %d in, %d out); charged up to the hold, %d micro-dollars uncharged",
                hold.id, settlement.tokens_in, settlement.tokens_out, hold.input_tokens,
                hold.max_tokens, settlement.uncharged_micros,
            )  # fmt: skip
        if hold.lines:
            actual = {}
            for line in hold.lines:
                if ":usd:" in line.counter:
                    used = settlement.cost_micros
                elif ":rpm:" in line.counter:
                    used = line.amount  # a request counts whatever happened
                else:
                    used = tokens
                # never more than held (the hold checked the limit, settling does not), never
                # below nothing (that would give back what other calls spent)
                actual[line.counter] = max(0, min(used, line.amount))
            if not await self.counters.settle(hold.id, actual):
                # its lease ran out (or its share was given back): the store keeps the full
                # hold charged, and so must the ledger
                logger.warning(
                    "hold %s was settled too late (its lease of %gs ran out, or its budget "
                    "share was given back); the full hold stays charged",
                    hold.id, self.lease,
                )  # fmt: skip
                return Settlement(held_cost, hold.input_tokens, hold.max_tokens, False, lapsed=True)
        return settlement
