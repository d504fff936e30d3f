"""The Decisions pages, over the query log's search (`client.log`): find decisions by entity
key, time range, feature and model version, newest first; a decision's page shows every value
it read or produced (source, version, observed_at, cache age, error), the exact vector each
model was given, each LLM call (rendered messages, deployment, answer, usage, cost, timings),
the trace as a waterfall (LLM calls split into context assembly, queue, TTFT and decode) and
the prompt's tokens per feature; and a form to replay it (`kairos.ui.replays`)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from kairos.client.client import Client
from kairos.errors import InvalidInput
from kairos.project.decisions import MAX_PAGE, DecisionLog
from kairos.stores.query_log import LoggedQuery, LoggedValue, Search
from kairos.ui import replays
from kairos.ui.app import UI, UIError
from kairos.ui.charts import Bars, Waterfall, bars, waterfall
from kairos.ui.replays import (
    Choice,
    entity_pairs,
    limit_of,
    model_choices,
    number,
    value_text,
    when_text,
)

MAX_SEARCH, DEFAULT_SEARCH = 500, 50  # decisions one search page lists
OUTPUTS_SHOWN = 4  # outputs of a decision in the search results
SHORT = 60  # characters of a value in the search results
LONG = 120  # a value longer than this, or on several lines, is drawn as a block
MOST = 20_000  # characters of one value on a decision's page
CSS_KINDS = frozenset({"sql", "python", "model", "llm", "cache", "expression", "input", "nearest"})


def routes(ui: UI) -> list[BaseRoute]:
    pages = DecisionPages(ui)
    return [
        Route("/decisions", ui.page(pages.index), methods=["GET"]),
        Route("/decisions/{query_id}", ui.page(pages.decision), methods=["GET"]),
        *replays.routes(ui),
    ]


# --- the search ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Filters:
    """The search form's fields as typed (what the page shows back)."""

    entity: tuple[str, ...]
    since: str
    until: str
    feature: str
    model: str
    limit: str

    def query(self, **changes: str) -> str:
        """These filters as a URL query, with `changes` (the pager's `until`).

        >>> Filters(("user.id:u1",), "1h", "", "", "", "").query(until="x")
        'entity=user.id%3Au1&since=1h&until=x'
        """
        fields = {
            "since": self.since, "until": self.until, "feature": self.feature,
            "model": self.model, "limit": self.limit, **changes,
        }  # fmt: skip
        pairs = [("entity", e) for e in self.entity if e.strip()]
        return urlencode(pairs + [(k, v) for k, v in fields.items() if v.strip()])


def filters_of(params: QueryParams) -> Filters:
    """
    >>> filters_of(QueryParams("entity=user.id:u1&entity=&limit=5")).entity
    ('user.id:u1',)
    """
    return Filters(
        tuple(e for e in params.getlist("entity") if e.strip()),
        *(params.get(name, "").strip() for name in ("since", "until", "feature", "model", "limit")),
    )


def search_of(client: Client, filters: Filters) -> Search:
    """The log search the filters name; a bad field is a UIError naming it."""
    entity = entity_pairs(filters.entity)
    limit = limit_of(filters.limit, DEFAULT_SEARCH, MAX_SEARCH)
    try:
        return client.log.parse(
            entity=entity or None,
            since=when_text(filters.since),
            until=when_text(filters.until),
            feature=filters.feature or None,
            model=filters.model or None,
            limit=limit,
        )
    except InvalidInput as error:
        raise UIError(str(error), error.field) from None


def page_of(log: DecisionLog, search: Search, before: str) -> list[LoggedQuery]:
    """A page of the search; with `before` (the last id the previous page showed, whose `now`
    is `search.until`), the decisions at that same `now` with a smaller id come first, then
    the older ones: many decisions share one `now` (a bulk query's rows), and an exclusive
    `until` alone would skip those the previous page had no room for."""
    if not before or search.until is None:
        return log.find(search)
    at, want = search.until, search.limit
    ties = replace(search, since=max(search.since or at, at), until=at + _TICK)
    fetch = want * 2
    while True:
        found_at = log.find(replace(ties, limit=fetch))
        kept = [r for r in found_at if r.query_id < before]
        # bounded: past MAX_PAGE decisions at one `now` the rest of them are skipped (a page
        # is never a read of a million records)
        if len(kept) >= want or len(found_at) < fetch or fetch >= MAX_PAGE:
            break
        fetch = min(fetch * 4, MAX_PAGE)
    kept.sort(key=lambda r: r.query_id, reverse=True)  # the store's order: now, then id
    page = kept[:want]
    if len(page) < want:
        page += log.find(replace(search, limit=want - len(page)))
    return page


_TICK = timedelta(microseconds=1)  # the log keeps times to the microsecond


@dataclass(frozen=True, slots=True)
class Found:
    """One decision in the search results."""

    query_id: str
    now: datetime
    duration_ms: float
    inputs: tuple[tuple[str, str], ...]  # (feature, value as shown): the entity
    outputs: tuple[tuple[str, str, bool], ...]  # (feature, value as shown, failed)
    more: int  # outputs not shown
    models: tuple[str, ...]
    cost_usd: float | None


def found(record: LoggedQuery) -> Found:
    outputs = tuple(
        (name, _short(value), value.error_code is not None)
        for name, value in list(record.outputs.items())[:OUTPUTS_SHOWN]
    )
    inputs = tuple((name, value_text(value, SHORT)) for name, value in record.inputs.items())
    return Found(
        record.query_id, record.now, record.duration_ms, inputs, outputs,
        max(0, len(record.outputs) - OUTPUTS_SHOWN), models_of(record), record.cost_usd,
    )  # fmt: skip


def _short(value: LoggedValue) -> str:
    if value.error_code is not None:
        return value_text(f"error: {value.error_message or value.error_code}", SHORT)
    return value_text(value.value, SHORT)


def models_of(record: LoggedQuery) -> tuple[str, ...]:
    """The model versions a decision called, then its LLM calls' models.

    >>> from datetime import UTC
    >>> at = datetime(2026, 6, 1, tzinfo=UTC)
    >>> calls = [{"version": "risk@v2"}]
    >>> models_of(LoggedQuery("q", at, {}, {}, 1.0, [], at, model_calls=calls))
    ('risk@v2',)
    """
    called = [*(record.plan.models if record.plan is not None else ())]
    called += [str(c["version"]) for c in record.model_calls if c.get("version")]
    called += [str(c["model"]) for c in record.llm_calls if c.get("model")]
    return tuple(dict.fromkeys(called))


# --- one decision ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ValueRow:
    name: str
    role: str  # input | output | "" (read or computed on the way)
    text: str
    block: bool  # long or on several lines: drawn as a block
    source: str
    version: str
    observed_at: datetime | None
    age_s: float | None
    error: str  # "code: message", or empty


def value_rows(record: LoggedQuery) -> list[ValueRow]:
    """Every value of the decision: its inputs, then its outputs, then the rest, by name."""
    rows = []
    for name, value in record.values.items():
        role = (
            "input" if name in record.inputs
            else "output" if name in record.outputs
            else ""
        )  # fmt: skip
        text = value_text(value.value, MOST)
        error = f"{value.error_code}: {value.error_message or ''}" if value.error_code else ""
        rows.append(
            ValueRow(
                name, role, text, len(text) > LONG or "\n" in text, value.source or "",
                value.version or "", value.observed_at, value.age_s, error,
            )
        )  # fmt: skip
    order = {"input": 0, "output": 1, "": 2}
    return sorted(rows, key=lambda r: (order[r.role], r.name))


@dataclass(frozen=True, slots=True)
class ModelCall:
    feature: str
    model: str
    version: str
    vector: tuple[tuple[str, str], ...]  # (input feature, the value the model was given)


def model_call(call: Mapping[str, Any]) -> ModelCall:
    """
    >>> model_call({"feature": "u.risk", "model": "risk", "version": "risk@v1",
    ...             "inputs": ["u.a"], "vector": [1.5]}).vector
    (('u.a', '1.5'),)
    """
    names = [str(n) for n in call.get("inputs") or []]
    vector = list(call.get("vector") or [])
    names += [f"#{i}" for i in range(len(names), len(vector))]
    return ModelCall(
        str(call.get("feature", "")), str(call.get("model", "")), str(call.get("version", "")),
        tuple((name, value_text(v)) for name, v in zip(names, vector, strict=False)),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class LLMCall:
    feature: str
    facts: tuple[tuple[str, str], ...]  # (label, text): model, deployment, usage, cost...
    messages: tuple[tuple[str, str], ...]  # (role, content) as the provider received them
    answer: str
    timings: tuple[tuple[str, float], ...]  # (stage, ms)
    tokens: tuple[tuple[str, int, str, float | None], ...]  # (feature, tokens, share, cost)
    chart: Bars | None  # the prompt's tokens per feature


_LLM_FACTS = (
    ("model", "model"), ("provider", "provider"), ("deployment", "deployment"),
    ("version", "version"), ("request id", "request_id"), ("attempts", "attempts"),
    ("prompt tokens", "prompt_tokens"), ("completion tokens", "completion_tokens"),
    ("tokenizer", "tokenizer"), ("tokens/s", "tokens_per_s"),
)  # fmt: skip
_LLM_TIMINGS = (
    ("context assembly", "context_ms"), ("prompt render", "render_ms"), ("queue", "queue_ms"),
    ("TTFT", "ttft_ms"), ("decode", "decode_ms"), ("LLM total", "total_ms"),
    ("query", "query_ms"),
)  # fmt: skip


def llm_call(call: Mapping[str, Any]) -> LLMCall:
    """One LLM call of a decision as its page shows it."""
    facts = [(label, value_text(call[key])) for label, key in _LLM_FACTS if key in call]
    if "exact" in call:
        facts.append(("token counts", "exact" if call["exact"] else "approximate"))
    cost = call.get("cost_usd")
    facts.append(("cost", f"${cost:.6f}" if number(cost) else "not priced"))
    messages = tuple(
        (str(m.get("role", "")), value_text(_content(m.get("content")), MOST))
        for m in call.get("messages") or []
        if isinstance(m, Mapping)
    )
    timings = tuple(
        (label, float(call[key])) for label, key in _LLM_TIMINGS if _ms(call.get(key)) is not None
    )
    counts = call.get("tokens_by_feature")
    costs = call.get("cost_by_feature")
    costs = costs if isinstance(costs, Mapping) else {}
    items = sorted(
        ((str(n), int(c)) for n, c in (counts.items() if isinstance(counts, Mapping) else ())
         if isinstance(c, int) and not isinstance(c, bool)),
        key=lambda item: (-item[1], item[0]),
    )  # fmt: skip
    total = sum(c for _, c in items) or 1
    tokens = tuple(
        (n, c, f"{c / total:.0%}", costs.get(n) if number(costs.get(n)) else None) for n, c in items
    )
    chart = (
        bars([(n, float(c), f"{c} ({share})") for n, c, share, _ in tokens], right=90)
        if items
        else None
    )
    return LLMCall(
        str(call.get("feature", "")), tuple(facts), messages,
        value_text(call.get("answer", ""), MOST),
        timings, tokens, chart,
    )  # fmt: skip


def _content(content: Any) -> str:
    """A message's content: its text, or each part's text (or JSON) for a list of parts."""
    if isinstance(content, list):
        return "\n".join(
            str(p["text"]) if isinstance(p, Mapping) and "text" in p else value_text(p)
            for p in content
        )
    return value_text(content)


@dataclass(frozen=True, slots=True)
class SpanRow:
    label: str
    kind: str  # its colour class
    start_ms: float
    duration_ms: float
    status: str
    rows: str


_STAGE_KINDS = {"context", "render", "llm", "queue", "ttft", "decode"}


def spans(trace: Sequence[Mapping[str, Any]]) -> list[SpanRow]:
    """The trace's steps in start order, each LLM call's stages right after its node.

    >>> [s.label for s in spans([{"kind": "query", "label": "total", "start_ms": 0,
    ...     "duration_ms": 5}, {"kind": "python", "label": "llm:u.v", "start_ms": 1,
    ...     "duration_ms": 3}, {"kind": "llm", "feature": "u.v", "context_ms": 1.2,
    ...     "ttft_ms": 2, "decode_ms": 1, "total_ms": 3}])]
    ['query total', 'python llm:u.v', 'u.v: context assembly', 'u.v: LLM request', 'u.v: TTFT', 'u.v: decode']
    """  # noqa: E501
    calls = [t for t in trace if t.get("kind") == "llm"]
    steps = sorted(
        (t for t in trace if t.get("kind") != "llm"), key=lambda t: _ms(t.get("start_ms")) or 0.0
    )
    out: list[SpanRow] = []
    placed: set[int] = set()
    for step in steps:
        kind, label = str(step.get("kind", "")), str(step.get("label", ""))
        css = "llm" if kind == "python" and label.startswith("llm:") else kind
        out.append(
            SpanRow(
                "query total" if kind == "query" else f"{kind} {label}",
                css if css in CSS_KINDS or css == "query" else "other",
                _ms(step.get("start_ms")) or 0.0, _ms(step.get("duration_ms")) or 0.0,
                str(step.get("status", "")), value_text(step.get("rows")),
            )
        )  # fmt: skip
        for index, call in enumerate(calls):
            if index not in placed and label == f"llm:{call.get('feature')}":
                out += _llm_spans(call)
                placed.add(index)
    for index, call in enumerate(calls):
        if index not in placed:
            out += _llm_spans(call)
    return out


def _llm_spans(call: Mapping[str, Any]) -> list[SpanRow]:
    """An LLM call's stages on the query's time axis: the context assembly from the query's
    start to the request (the prompt render at its end), then queue and TTFT from the
    request, decode after the first token."""
    name = str(call.get("feature", "llm"))
    context, render = _ms(call.get("context_ms")), _ms(call.get("render_ms"))
    sent = context or 0.0
    ttft = _ms(call.get("ttft_ms"))
    stages = [
        ("context assembly", "context", 0.0, context),
        ("prompt render", "render", max(0.0, sent - (render or 0.0)), render),
        ("LLM request", "llm", sent, _ms(call.get("total_ms"))),
        ("queue", "queue", sent, _ms(call.get("queue_ms"))),
        ("TTFT", "ttft", sent, ttft),
        ("decode", "decode", sent + (ttft or 0.0), _ms(call.get("decode_ms"))),
    ]
    return [
        SpanRow(f"{name}: {label}", kind, start, duration, "ok", "")
        for label, kind, start, duration in stages
        if duration is not None
    ]


def _ms(value: Any) -> float | None:
    return float(value) if number(value) and math.isfinite(value) else None


def trace_chart(rows: Sequence[SpanRow]) -> Waterfall | None:
    """The waterfall of `rows`; an LLM call's stages, drawn right under its node, are named
    by their stage alone (the table beside names the feature too).

    >>> [s.label for s in trace_chart([SpanRow("u.v: TTFT", "ttft", 1, 2, "ok", "")]).spans]
    ['↳ TTFT']
    """
    if not rows:
        return None
    return waterfall([(_chart_label(r), r.kind, r.start_ms, r.duration_ms) for r in rows])


def _chart_label(row: SpanRow) -> str:
    _, colon, stage = row.label.rpartition(": ")
    return f"↳ {stage}" if colon and row.kind in _STAGE_KINDS else row.label


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision as its page shows it."""

    record: LoggedQuery
    facts: tuple[tuple[str, str], ...]
    inputs: tuple[tuple[str, str, str], ...]  # (feature, value, a search by it or empty)
    values: tuple[ValueRow, ...]
    model_calls: tuple[ModelCall, ...]
    llm_calls: tuple[LLMCall, ...]
    spans: tuple[SpanRow, ...]
    chart: Waterfall | None
    kinds: tuple[str, ...]  # the span kinds present, for the legend
    recomputable: tuple[str, ...]  # what a replay may recompute: every computed value


def decision(record: LoggedQuery) -> Decision:
    plan = record.plan
    facts = [
        ("duration", f"{record.duration_ms:.3f} ms"),
        ("models", ", ".join(models_of(record)) or "none"),
        ("LLM cost", f"${record.cost_usd:.6f}" if record.cost_usd is not None else "none"),
    ]
    if plan is not None:
        facts += [("plan", plan.fingerprint), ("definitions", plan.definitions)]
    rows = spans(record.trace)
    computed = (
        n for n, v in record.values.items() if n not in record.inputs and v.source != "input"
    )
    inputs = tuple(
        (name, value_text(value, MOST), _by_entity(name, value))
        for name, value in record.inputs.items()
    )
    return Decision(
        record, tuple(facts), inputs, tuple(value_rows(record)),
        tuple(model_call(c) for c in record.model_calls),
        tuple(llm_call(c) for c in record.llm_calls), tuple(rows), trace_chart(rows),
        tuple(dict.fromkeys(r.kind for r in rows)), tuple(sorted(computed)),
    )  # fmt: skip


def _by_entity(name: str, value: Any) -> str:
    """The search query for the decisions of this input's entity (str and int keys only).

    >>> _by_entity("user.id", "u1"), _by_entity("user.amount", 1.5)
    ('entity=user.id%3Au1', '')
    """
    if isinstance(value, bool) or not isinstance(value, str | int):
        return ""
    return urlencode({"entity": f"{name}:{value}"})


# --- the pages -----------------------------------------------------------------------------


class DecisionPages:
    def __init__(self, ui: UI) -> None:
        self.ui = ui
        self._features: list[str] | None = None  # definitions are immutable: listed once

    def features(self, client: Client) -> list[str]:
        if self._features is None:
            self._features = sorted(
                info.fqn for cls in client.graph.classes.values() for info in cls.features.values()
            )
        return self._features

    async def index(self, request: Request) -> Response:
        client = self.ui.client_or_404()
        filters = filters_of(request.query_params)
        features = self.features(client)
        try:
            search = search_of(client, filters)
        except UIError as error:
            return self.ui.render(
                request, "decisions.html", status=error.status, title="Decisions",
                filters=filters, rows=[], older=None, error=str(error), field=error.field,
                features=features, most=MAX_SEARCH, default=DEFAULT_SEARCH,
            )  # fmt: skip
        before = request.query_params.get("before", "").strip()
        records = await asyncio.to_thread(page_of, client.log, search, before)
        older = None
        if records and len(records) == search.limit:
            last = records[-1]
            older = filters.query(until=last.now.isoformat(), before=last.query_id)
        return self.ui.render(
            request, "decisions.html", title="Decisions", filters=filters,
            rows=[found(r) for r in records], older=older, error=None, features=features,
            most=MAX_SEARCH, default=DEFAULT_SEARCH,
        )  # fmt: skip

    async def decision(self, request: Request) -> Response:
        client = self.ui.client_or_404()
        query_id = request.path_params["query_id"]
        record, choices = await asyncio.to_thread(_lookup, client, query_id)
        if record is None:
            raise UIError(
                f"no logged decision {query_id!r}; search for it on the Decisions page",
                "query_id",
                404,
            )
        return self.ui.render(
            request, "decision.html", title=f"Decision {query_id}", d=decision(record),
            choices=choices,
        )  # fmt: skip


def _lookup(client: Client, query_id: str) -> tuple[LoggedQuery | None, list[Choice]]:
    record = client.log.get(query_id) if 0 < len(query_id) <= 256 else None
    return record, model_choices(client) if record is not None else []
