"""The Live page: what the server is doing now and whether what it serves is fresh.

From the server's recent traffic (`kairos.ui.traffic`): queries per second over the last
minute and five, p50/p99 latency and errors by status class per endpoint, the cache hit
ratio. From the streams' consumers: their lag, messages and dead letters. From the newest
decision records (`?decisions=`, 1000 by default): the age of each feature's values as they
were served against the feature's `max_staleness`, flagging features whose p99 is older
(stale inputs reaching a model), and what the LLM calls cost per decision, by feature.

    >>> Mount("/ui", routes=routes(UI(client)))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeGuard

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from kairos.backends.url import redact
from kairos.client.client import Client
from kairos.definitions.graph import Graph
from kairos.errors import KairosError
from kairos.stores.query_log import LoggedQuery
from kairos.stores.query_log.records import collector_paused
from kairos.ui.app import UI, UIError, fmt_age
from kairos.ui.charts import WIDTH, Bar, Bars, series
from kairos.ui.traffic import percentile

DECISIONS = 1000  # decision records the freshness and cost numbers cover by default
MOST_DECISIONS = 2500  # the most a page reads: ~160 ms of decoding, inside the 300 ms goal
REFRESH_S = 5
CHART_ROWS = 24  # freshness bars drawn at most (the stalest first); the table has every one
CHART_CAP = 3.0  # a bar past 3x its max_staleness is drawn at 3x (its text says how old)
CHART_FILL = 0.62  # of the chart's width the longest bar takes: the rest is for its text


@dataclass(frozen=True, slots=True)
class Freshness:
    """How old one feature's values were when decisions were served them (seconds).

    `limit_s` is the feature's max_staleness (0: computed for every query, never cached;
    None: not a feature of this project any more); `stale` when the p99 age is past it."""

    feature: str
    served: int  # values with a known age
    cached: int  # of them from the cache
    p50_s: float
    p99_s: float
    max_s: float
    limit_s: float | None
    over: int  # values older than max_staleness

    @property
    def stale(self) -> bool:
        return bool(self.limit_s) and self.p99_s > (self.limit_s or 0.0)

    @property
    def ratio(self) -> float | None:
        """The p99 age as a fraction of max_staleness (None without a limit)."""
        return self.p99_s / self.limit_s if self.limit_s else None


@dataclass(frozen=True, slots=True)
class LLMCost:
    """One LLM feature's calls over the decisions covered; means are per decision covered
    (a decision that did not call it counts as 0), cost None when no call was priced."""

    feature: str
    calls: int
    decisions: int  # decisions that called it
    prompt_tokens: float
    completion_tokens: float
    cost_usd: float | None
    total_usd: float | None


@dataclass(frozen=True, slots=True)
class PromptShare:
    """What one feature put into prompts: tokens and its share of the cost, per decision."""

    feature: str
    tokens: float
    cost_usd: float | None


@dataclass(frozen=True, slots=True)
class DecisionSummary:
    """Freshness and LLM cost over the newest `covered` decisions (`oldest`..`newest` by
    their `now`)."""

    covered: int
    oldest: datetime | None
    newest: datetime | None
    freshness: tuple[Freshness, ...]
    llm: tuple[LLMCost, ...]
    prompt: tuple[PromptShare, ...]
    cost_usd: float | None  # LLM spend per decision
    tokens: float  # LLM tokens (prompt + completion) per decision
    llm_decisions: int  # decisions that called an LLM

    @property
    def stale(self) -> tuple[Freshness, ...]:
        return tuple(row for row in self.freshness if row.stale)


@dataclass(frozen=True, slots=True)
class StreamRow:
    name: str
    lag: int | None
    messages: int
    events: int
    skipped: int
    dead: int
    errors: int
    last_error: str


def routes(ui: UI) -> list[BaseRoute]:
    page = LivePage(ui)
    return [Route("/live", ui.page(page.live), methods=["GET"])]


class LivePage:
    def __init__(self, ui: UI) -> None:
        self.ui = ui
        self._graph: Graph | None = None
        self._limits: dict[str, float | None] = {}  # feature name -> max_staleness (s)

    async def live(self, request: Request) -> Response:
        client = self.ui.client_or_404()
        wanted = _decisions(request.query_params.get("decisions"))
        now = time.time()
        traffic = self.ui.traffic
        endpoints = traffic.endpoints(now)
        cache = traffic.cache(now)
        rate = traffic.rate(now)
        streams = stream_rows(self.ui.streams())
        problem = None
        try:
            summary = await asyncio.to_thread(self.summary, client, wanted)
        except KairosError as error:  # the log cannot be read: the rest of the page shows
            summary, problem = summarize([], client.graph), str(error)
        chart = freshness_chart(summary.freshness)
        return self.ui.render(
            request, "live.html", title="Live", refresh=REFRESH_S, endpoints=endpoints,
            cache=cache, rate=series(
                rate, top_text=_short(max(rate, default=0.0)),
                first=f"-{fmt_age(traffic.window)}", last="now",
            ),
            window=fmt_age(traffic.window), streams=streams, summary=summary, chart=chart,
            wanted=wanted, most=MOST_DECISIONS, problem=problem,
            uptime=fmt_age(now - traffic.started),
        )  # fmt: skip

    def summary(self, client: Client, wanted: int) -> DecisionSummary:
        # thousands of records are decoded: without the collector's passes over them all
        # (half again the time, at random), as the log's own searches do
        graph = client.graph
        if graph is not self._graph:  # definitions reloaded: their limits may differ
            self._graph, self._limits = graph, {}
        with collector_paused():
            records = client.log.recent(wanted, nested=False)  # ages, not rows
            return summarize(records, graph, self._limits)


def _decisions(text: str | None) -> int:
    """`?decisions=`: how many of the newest decision records to read.

    >>> _decisions(None), _decisions("200")
    (1000, 200)
    """
    if text is None or not text.strip():
        return DECISIONS
    try:
        wanted = int(text)
    except ValueError:
        wanted = 0
    if not 1 <= wanted <= MOST_DECISIONS:
        raise UIError(
            f"decisions={text!r} must be a whole number from 1 to {MOST_DECISIONS}, "
            f"e.g. ?decisions={DECISIONS}",
            "decisions",
        )
    return wanted


def _short(rate: float) -> str:
    """A rate in the 4 characters a chart's axis label has.

    >>> _short(333.4), _short(12.34), _short(0.5)
    ('333', '12.3', '0.50')
    """
    return f"{rate:.0f}" if rate >= 100 else f"{rate:.1f}" if rate >= 10 else f"{rate:.2f}"


# --- decisions: freshness and cost ---------------------------------------------------------


@dataclass
class _Ages:
    ages: list[float] = field(default_factory=list)
    cached: int = 0


def summarize(
    records: Sequence[LoggedQuery], graph: Graph, limits: dict[str, float | None] | None = None
) -> DecisionSummary:
    """Freshness per feature and LLM cost per decision over `records`. A value's age is its
    `age_s` (a cache read, measured when served), else the decision's `now` minus its
    `observed_at`; the query's own inputs and failed values are left out. `limits` caches
    each feature's max_staleness between calls.

    >>> summarize([], client.graph).covered  # doctest: +SKIP
    0
    """
    limits = {} if limits is None else limits
    seen: dict[str, _Ages] = {}
    llm: dict[str, list[Any]] = {}  # feature -> [calls, decisions, prompt, completion, usd]
    prompt: dict[str, list[Any]] = {}  # prompt feature -> [tokens, usd]
    llm_decisions = 0
    for record in records:
        now = record.now
        for name, value in record.values.items():
            if value.source == "input" or value.error_code is not None:
                continue
            age = value.age_s
            if age is None:
                if value.observed_at is None:
                    continue
                try:
                    age = (now - value.observed_at).total_seconds()
                except TypeError:  # a naive time beside an aware one: no age to tell
                    continue
            entry = seen.get(name)
            if entry is None:
                entry = seen[name] = _Ages()
            entry.ages.append(age)
            if value.source == "cache":
                entry.cached += 1
        if record.llm_calls:
            llm_decisions += 1
            _add_calls(record.llm_calls, llm, prompt)
    covered = len(records)
    rows = []
    for name, entry in seen.items():
        if name not in limits:
            limits[name] = _limit(graph, name)
        limit = limits[name]
        ages = sorted(entry.ages)
        rows.append(
            Freshness(
                name,
                len(ages),
                entry.cached,
                percentile(ages, 50),
                percentile(ages, 99),
                ages[-1],
                limit,
                sum(1 for a in ages if limit and a > limit),
            )
        )
    rows.sort(key=lambda r: (not r.stale, -(r.ratio or 0.0), r.feature))
    per = max(covered, 1)
    costs = [
        LLMCost(name, calls, decisions, tokens / per, completion / per,
                None if usd is None else usd / per, usd)
        for name, (calls, decisions, tokens, completion, usd) in sorted(llm.items())
    ]  # fmt: skip
    shares = sorted(
        (PromptShare(name, tokens / per, None if usd is None else usd / per)
         for name, (tokens, usd) in prompt.items()),
        key=lambda s: (-s.tokens, s.feature),
    )  # fmt: skip
    priced = [c.total_usd for c in costs if c.total_usd is not None]
    return DecisionSummary(
        covered,
        min((r.now for r in records), default=None),
        max((r.now for r in records), default=None),
        tuple(rows),
        tuple(costs),
        tuple(shares),
        sum(priced) / per if priced else None,
        sum(c.prompt_tokens + c.completion_tokens for c in costs),
        llm_decisions,
    )


def _add_calls(
    calls: Iterable[dict[str, Any]], llm: dict[str, list[Any]], prompt: dict[str, list[Any]]
) -> None:
    """One decision's LLM calls added to the totals by LLM feature and by prompt feature."""
    counted: set[str] = set()
    for call in calls:
        name = str(call.get("feature") or call.get("model") or "?")
        totals = llm.get(name)
        if totals is None:
            totals = llm[name] = [0, 0, 0, 0, None]
        totals[0] += 1
        if name not in counted:
            counted.add(name)
            totals[1] += 1
        totals[2] += _count(call.get("prompt_tokens"))
        totals[3] += _count(call.get("completion_tokens"))
        cost = call.get("cost_usd")
        if _finite(cost):
            totals[4] = (totals[4] or 0.0) + cost
        by_cost = call.get("cost_by_feature")
        by_cost = by_cost if isinstance(by_cost, dict) else {}
        by_tokens = call.get("tokens_by_feature")
        for feature, tokens in (by_tokens if isinstance(by_tokens, dict) else {}).items():
            share = prompt.get(str(feature))
            if share is None:
                share = prompt[str(feature)] = [0, None]
            share[0] += _count(tokens)
            feature_cost = by_cost.get(feature)
            if _finite(feature_cost):
                share[1] = (share[1] or 0.0) + feature_cost


def _count(value: Any) -> int:
    return value if type(value) is int and value > 0 else 0


def _finite(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _limit(graph: Graph, name: str) -> float | None:
    """A feature's max_staleness in seconds; None for a name the project no longer has."""
    try:
        return graph.info(graph.parse(name)).max_staleness.total_seconds()
    except KairosError:
        return None


def freshness_chart(rows: Sequence[Freshness]) -> Bars | None:
    """The cached features' p99 age as a share of their max_staleness (the dashed line),
    stalest first, on one scale: a bar past `CHART_CAP` times its limit is drawn at the cap,
    and the longest bar leaves room after it for its text.

    >>> row = Freshness("user.name", 10, 10, 5.0, 120.0, 130.0, 60.0, 2)
    >>> chart = freshness_chart([row])
    >>> chart.bars[0].kind, chart.bars[0].text
    ('stale', 'p99 2m 0s of 1m 0s (2.0×)')
    >>> round(chart.bars[0].width, 6) == round(2 * (chart.limit_x - chart.left), 6)
    True
    """
    limited = [r for r in rows if r.limit_s]
    if not limited:
        return None
    limited.sort(key=lambda r: (-(r.ratio or 0.0), r.feature))
    shown = limited[:CHART_ROWS]
    row, left = 22.0, 220.0
    scale = (WIDTH - left - 10) * CHART_FILL / CHART_CAP  # width of 1x max_staleness
    drawn = tuple(
        Bar(
            r.feature, r.ratio or 0.0,
            f"p99 {fmt_age(r.p99_s)} of {fmt_age(r.limit_s)} ({r.ratio or 0.0:.1f}×)",
            i * row, min(r.ratio or 0.0, CHART_CAP) * scale, "stale" if r.stale else "bar",
        )
        for i, r in enumerate(shown)
    )  # fmt: skip
    return Bars(drawn, len(drawn) * row, left, left + scale)


# --- streams -----------------------------------------------------------------------------

_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def stream_rows(streams: Iterable[tuple[str, Any]]) -> list[StreamRow]:
    """Each consumer's stats as a row; a URL in its last error is shown redacted.

    >>> from kairos.client.consume import StreamStats
    >>> stats = StreamStats(messages=3, lag=2, last_error="redis://:pw@h down")
    >>> stream_rows([("payments", stats)])[0].last_error
    'redis://:***@h down'
    """
    rows = []
    for name, stats in streams:
        error = str(getattr(stats, "last_error", "") or "")
        rows.append(
            StreamRow(
                str(name),
                getattr(stats, "lag", None),
                int(getattr(stats, "messages", 0)),
                int(getattr(stats, "events", 0)),
                int(getattr(stats, "skipped", 0)),
                int(getattr(stats, "dead", 0)),
                int(getattr(stats, "errors", 0)),
                _URL.sub(lambda m: redact(m.group(0)), error),
            )
        )
    return sorted(rows, key=lambda r: r.name)
