"""Replay: logged decisions re-run as of their logged `now` against a new model version, a
new prompt or model definition, or a new resolver.

Every feature that is not downstream of what changed takes **the value the decision logged**;
only what is downstream is recomputed, from those values. The sources are not read for
anything the decision already saw, so rows updated or deleted since cannot change a replay.
Decisions with the same logged plan run together, as one bulk run of the engine with each
row at its own `now` (the online store is neither read nor written).

A replay reads, decodes and re-runs `CHUNK` (1,000) decisions at a time: the reads in a thread,
the run on the event loop, which serves other queries between chunks and between plans. With
`keep=N` it keeps only the summary's sums and the first N rows (changed ones first), so a
replay of 100,000 decisions (what `POST /v1/replay` takes) needs the memory of one chunk.

    >>> result = client.replay(since="1d", models={"risk": 2})  # doctest: +SKIP
    >>> result.to_pandas()  # query_id, feature, logged, replayed, changed  # doctest: +SKIP
    >>> result.summary()["features"]["user.risk"]["mean_abs_delta"]  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from kairos import telemetry
from kairos.client.replay_summary import ReplayRow, ReplayTally
from kairos.definitions.completion import CompletionOptions
from kairos.definitions.durations import DurationLike
from kairos.definitions.frame import DataFrame
from kairos.definitions.predict import ModelOptions
from kairos.engine.result import ColumnData
from kairos.errors import InvalidInput
from kairos.planner.plan import Plan
from kairos.project.decisions import DecisionLog
from kairos.project.snapshot import Snapshot, plan_with
from kairos.resolvers.calls import Calls
from kairos.resolvers.llm import Completer, CompletionResolver, completion_resolver
from kairos.resolvers.model import ModelResolver
from kairos.stores.query_log import LoggedQuery, QueryLog, collector_paused

if TYPE_CHECKING:
    import pandas


class ModelPins(Protocol):
    """What a replay needs of `client.models`: resolvers at other versions, or for a new
    `kr.predict` definition."""

    def pinned(self, pins: Mapping[str, int | str]) -> list[ModelResolver]: ...

    def resolver_for(self, output: Any, options: ModelOptions) -> ModelResolver: ...


# decisions read, decoded and replayed at a time: what a replay holds at once (keep=N)
CHUNK = 1_000
SLICE = 0.05  # seconds one engine run of a replay aims at (`Pace`)


@dataclass
class ReplayResult:
    """What a replay computed, feature by feature, and how it differs from what was served.

    `records` are the logged decisions replayed (oldest last, as searched); `llm_calls` the
    replay's LLM calls by query id (tokens, TTFT, cost of the new prompt). A replay run with
    `keep=N` holds only the first N `rows` (changed ones first) and no records or calls; its
    `summary()` still covers every decision. `more`: the range held more decisions than
    the replay's `limit` took."""

    rows: list[ReplayRow]
    records: list[LoggedQuery]
    changed: tuple[str, ...]  # the features whose definition the replay changed
    recomputed: tuple[str, ...]  # every column recomputed (downstream of `changed`)
    llm_calls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    plans: dict[str, str] = field(default_factory=dict)  # logged plan -> replayed plan
    definitions: dict[str, str] = field(default_factory=dict)  # "logged" / "replayed"
    seconds: float = 0.0
    # features a change needed that decisions had not computed (their outputs came from the
    # cache): computed from the sources as of the logged `now`, by how many decisions
    from_sources: dict[str, int] = field(default_factory=dict)
    tally: ReplayTally | None = field(default=None, repr=False)  # None: summed from rows
    more: bool = False

    @property
    def decisions(self) -> int:
        return len(self.records) if self.tally is None else self.tally.decisions

    def __len__(self) -> int:
        return len(self.rows)

    def to_pandas(self) -> pandas.DataFrame:
        """One row per (decision, feature): query_id, now, feature, logged, replayed, changed."""
        import pandas

        return pandas.DataFrame(
            {
                "query_id": [r.query_id for r in self.rows],
                "now": [r.now for r in self.rows],
                "feature": [r.feature for r in self.rows],
                "logged": [r.logged for r in self.rows],
                "replayed": [r.replayed for r in self.rows],
                "changed": [r.changed for r in self.rows],
            }
        )

    def summary(self) -> dict[str, Any]:
        """Decisions, changed count and share; per feature the numeric deltas; for LLM
        features prompt tokens, TTFT and cost before and after."""
        tally = self.tally
        if tally is None:
            tally = ReplayTally()
            tally.add(self.records, self.rows, self.llm_calls)
        decisions = tally.decisions
        return {
            "decisions": decisions,
            "changed_decisions": tally.changed_decisions,
            "changed_share": tally.changed_decisions / decisions if decisions else 0.0,
            "changed": list(self.changed),
            "recomputed": list(self.recomputed),
            "features": {name: f.summary() for name, f in tally.features.items()},
            "llm": tally.llm_summary(),
            "from_sources": dict(self.from_sources),
            "plans": dict(self.plans),
            "definitions": dict(self.definitions),
            "seconds": round(self.seconds, 3),
            "decisions_per_s": round(decisions / self.seconds, 1) if self.seconds else None,
            "more": self.more,
        }

    def to_dict(self, rows: int | None = 1000) -> dict[str, Any]:
        """The summary and the first `rows` rows, changed ones first (what HTTP answers)."""
        ordered = sorted(self.rows, key=lambda r: not r.changed)
        return {
            "summary": self.summary(),
            "rows": [
                {
                    "query_id": r.query_id,
                    "now": r.now,
                    "feature": r.feature,
                    "logged": r.logged,
                    "replayed": r.replayed,
                    "changed": r.changed,
                    "error": r.error,
                }
                for r in (ordered if rows is None else ordered[:rows])
            ],
        }

    def to_markdown(self) -> str:
        """A short report: what changed, and per feature how much."""
        s = self.summary()
        lines = [
            "# Replay",
            "",
            f"- decisions: {s['decisions']} ({s['seconds']} s, "
            f"{s['decisions_per_s'] or '-'} decisions/s)",
            f"- changed: {', '.join(s['changed']) or 'nothing'}; recomputed: "
            f"{', '.join(s['recomputed']) or 'nothing'}",
            f"- decisions whose outputs changed: {s['changed_decisions']} "
            f"({s['changed_share']:.1%})",
            "",
            "| feature | rows | changed | mean logged | mean replayed | mean abs delta "
            "| max abs delta |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, f in s["features"].items():
            lines.append(
                f"| {name} | {f['rows']} | {f['changed']} | {_fmt(f.get('mean_logged'))} | "
                f"{_fmt(f.get('mean_replayed'))} | {_fmt(f.get('mean_abs_delta'))} | "
                f"{_fmt(f.get('max_abs_delta'))} |"
            )
        if s["llm"]:
            lines += [
                "",
                "| LLM feature | | calls | mean prompt tokens | p50 TTFT ms | p99 TTFT ms "
                "| cost USD |",
                "|---|---|---:|---:|---:|---:|---:|",
            ]
            for name, both in s["llm"].items():
                for when in ("logged", "replayed"):
                    st = both[when]
                    lines.append(
                        f"| {name} | {when} | {st['calls']} | {_fmt(st['mean_prompt_tokens'])} "
                        f"| {_fmt(st['p50_ttft_ms'])} | {_fmt(st['p99_ttft_ms'])} "
                        f"| {_fmt(st['cost_usd'])} |"
                    )
        return "\n".join(lines) + "\n"


def replay_runtime(
    runtime: Snapshot,
    models: ModelPins,
    *,
    pins: Mapping[str, int | str] | None = None,
    features: Mapping[str, Any] | None = None,
    resolvers: Mapping[Any, Any] | None = None,
    recompute: Sequence[str] = (),
    completer: Callable[[], Completer],
) -> tuple[Snapshot, set[str]]:
    """The runtime a replay runs on (the client's with its changes) and the features changed.

    `pins`: model name -> version or alias; `features`: feature name -> a new `kr.predict` /
    `kr.completion` definition; `resolvers`: an old resolver (or its name) -> the new one;
    `recompute`: features to recompute although nothing they depend on changed."""
    graph = runtime.graph
    changed = set(recompute)
    model_resolvers = models.pinned(pins or {})
    changed |= {r.output.fqn for r in model_resolvers if r.options.model in (pins or {})}
    declared = list(runtime.declared)
    for name, options in (features or {}).items():
        ref = graph.ref(name)
        changed.add(ref.fqn)
        if isinstance(options, ModelOptions):
            new = models.resolver_for(ref, options)
            model_resolvers = [r for r in model_resolvers if r.output.fqn != ref.fqn] + [new]
        elif isinstance(options, CompletionOptions):
            old = [r for r in declared if isinstance(r, CompletionResolver) and r.output == ref]
            usage = old[0].usage if old else None
            declared = [r for r in declared if r not in old]
            declared.append(completion_resolver(graph, ref, options, completer, usage))
        else:
            raise InvalidInput(
                f"features[{ref.fqn!r}] must be a new kr.predict(...) or kr.completion(...) "
                f"definition, got {type(options).__name__}",
                field="features",
            )
    for old, new in (resolvers or {}).items():
        found = [
            r
            for r in declared
            if r is old or (isinstance(old, str) and getattr(r, "name", None) == old)
        ]
        if not found:
            raise InvalidInput(
                f"resolvers: {getattr(old, 'name', old)!r} is not one of the project's "
                "resolvers; key the mapping by the resolver (or its name) to replace",
                field="resolvers",
            )
        declared = [new if r is found[0] else r for r in declared]
    planner = plan_with(
        graph, declared, model_resolvers, runtime.sources, runtime.planner.default_timeout
    )
    for bound in planner.resolvers.resolvers:
        if any(bound.resolver is new for new in (resolvers or {}).values()):
            changed |= {f"{bound.namespace}.{output}" for output in bound.outputs}
    return replace(runtime, declared=tuple(declared), planner=planner), changed


def _name(resolver: Any) -> str | None:
    return getattr(resolver, "name", None)


def decision_ids(query_ids: Any) -> list[str]:
    """The query ids a replay names, each once, in order; not a list of ids: InvalidInput."""
    if (
        isinstance(query_ids, str)
        or not isinstance(query_ids, Sequence)
        or not all(isinstance(q, str) for q in query_ids)
    ):
        raise InvalidInput("query_ids must be a list of query ids", field="query_ids")
    return list(dict.fromkeys(query_ids))


class Decisions:
    """The decisions a replay takes, `CHUNK` at a time, read and decoded in a thread: by id
    (each must be logged), or the newest `limit` a search finds (None: every one), page by
    page (`Search.before`). After the last chunk, `more` says whether the search had more.

        >>> async for chunk in Decisions.found(client.log, since="1d"): ...  # doctest: +SKIP
    """

    def __init__(self, chunks: Callable[[Decisions], AsyncIterator[list[LoggedQuery]]]) -> None:
        self._chunks = chunks
        self.more = False

    def __aiter__(self) -> AsyncIterator[list[LoggedQuery]]:
        return self._chunks(self)

    @classmethod
    def of(cls, records: Sequence[LoggedQuery]) -> Decisions:
        """Decisions already read."""

        async def chunks(_: Decisions) -> AsyncIterator[list[LoggedQuery]]:
            for start in range(0, len(records), CHUNK):
                yield list(records[start : start + CHUNK])

        return cls(chunks)

    @classmethod
    def by_id(cls, log: QueryLog, query_ids: Any) -> Decisions:
        wanted = decision_ids(query_ids)

        async def chunks(_: Decisions) -> AsyncIterator[list[LoggedQuery]]:
            for start in range(0, len(wanted), CHUNK):
                ids = wanted[start : start + CHUNK]
                found = await asyncio.to_thread(log.get_many, ids)
                missing = [q for q in ids if q not in found]
                if missing:
                    raise InvalidInput(
                        f"query_ids: no logged decision {missing[0]!r} ({len(missing)} missing)",
                        field="query_ids",
                    )
                yield [found[q] for q in ids]

        return cls(chunks)

    @classmethod
    def found(
        cls,
        log: DecisionLog,
        *,
        entity: Mapping[Any, Any] | None = None,
        since: datetime | DurationLike | None = None,
        until: datetime | DurationLike | None = None,
        limit: int | None = None,
    ) -> Decisions:
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise InvalidInput(f"limit must be a whole number >= 1, got {limit!r}", field="limit")
        search = log.parse(entity=entity, since=since, until=until, limit=CHUNK)
        store = log.store

        async def chunks(self: Decisions) -> AsyncIterator[list[LoggedQuery]]:
            left = math.inf if limit is None else limit
            page = replace(search, limit=int(min(CHUNK, left)))
            while left > 0:
                found = await asyncio.to_thread(store.search, page)
                if found:
                    yield found
                left -= len(found)
                if len(found) < page.limit:
                    return
                page = replace(
                    page,
                    limit=int(min(CHUNK, left)) or 1,  # at the limit: one more, to say `more`
                    before=(found[-1].now, found[-1].query_id),
                )
            self.more = bool(await asyncio.to_thread(store.search, page))

        return cls(chunks)


async def replay(
    runtime: Snapshot,
    records: Sequence[LoggedQuery] | Decisions,
    changed: set[str],
    definitions: str,
    *,
    keep: int | None = None,
) -> ReplayResult:
    """Re-run `records` on `runtime` (the client's, with the changed definitions), taking the
    logged value of every column not downstream of a feature in `changed`; a chunk at a time
    (`Decisions`). With `keep`, hold only the first `keep` rows (changed first) and the sums
    of the summary."""
    decisions = records if isinstance(records, Decisions) else Decisions.of(records)
    work = _replay(runtime, decisions, changed, definitions, keep)
    if telemetry.TRACER is None:
        return await work
    return await telemetry.traced(  # the decisions replayed are counted as they are read
        "kairos.replay",
        {},
        work,
        lambda span, r: span.set_attribute("kairos.replay.records", r.decisions),
    )


async def _replay(
    runtime: Snapshot,
    decisions: Decisions,
    changed: set[str],
    definitions: str,
    keep: int | None,
) -> ReplayResult:
    started = time.perf_counter()
    tally = ReplayTally()
    rows: list[ReplayRow] = []
    unchanged: list[ReplayRow] = []  # keep=N: the first N unchanged rows, after the changed
    records: list[LoggedQuery] = []
    llm: dict[str, list[dict[str, Any]]] = {}
    pace = Pace()
    # The cyclic collector waits for the whole replay (its chunks' objects have no cycles and
    # are freed by their counts): running between chunks, every few its churn made a full
    # collection of the server's heap (~150 ms holding the GIL, every query waiting).
    with collector_paused():
        async for chunk in decisions:
            part, calls = await _replay_chunk(runtime, chunk, changed, tally, pace)
            tally.add(chunk, part, calls)
            if keep is None:
                rows += part
                records += chunk
                llm.update(calls)
            else:
                _keep(part, keep, rows, unchanged)
            await asyncio.sleep(0)  # a server's queries run between chunks
    if keep is not None:
        rows += unchanged[: keep - len(rows)]
    return ReplayResult(
        rows,
        records,
        tuple(sorted(changed)),
        tuple(sorted(tally.recomputed)),
        llm,
        tally.plans,
        {"logged": ", ".join(sorted(tally.logged_definitions)), "replayed": definitions},
        time.perf_counter() - started,
        tally.from_sources,
        tally,
        decisions.more,
    )


@dataclass
class Pace:
    """How many decisions one engine run takes: as many as run in about `SLICE` seconds, so
    no run holds the event loop for long. The engine's work per decision varies a hundred
    fold (a logged value is copied; has-many rows computed from the sources again are
    normalized row by row, ~0.4 ms a decision), so the size follows what the last run took,
    starting small."""

    rows: int = 64

    def ran(self, rows: int, seconds: float) -> None:
        per_row = seconds / max(rows, 1)
        wanted = int(SLICE / per_row) if per_row > 0 else CHUNK
        self.rows = max(16, min(CHUNK, wanted, self.rows * 4))  # grows 4x a run at most


def _keep(
    part: Iterable[ReplayRow], keep: int, changed: list[ReplayRow], unchanged: list[ReplayRow]
) -> None:
    """Keep the first `keep` changed rows and the first `keep` unchanged ones, in order: what
    `to_dict(keep)` answers (changed rows first) whatever the replay's size."""
    for row in part:
        if row.changed:
            if len(changed) < keep:
                changed.append(row)
        elif len(unchanged) < keep:
            unchanged.append(row)


async def _replay_chunk(
    runtime: Snapshot,
    records: Sequence[LoggedQuery],
    changed: set[str],
    tally: ReplayTally,
    pace: Pace,
) -> tuple[list[ReplayRow], dict[str, list[dict[str, Any]]]]:
    """Replay a chunk of decisions, plan by plan; its rows and LLM calls by query id."""
    groups: dict[tuple[Any, ...], list[LoggedQuery]] = {}
    for record in records:
        groups.setdefault(_plan_key(record), []).append(record)
    rows: list[ReplayRow] = []
    llm: dict[str, list[dict[str, Any]]] = {}
    for (_, inputs, outputs), group in groups.items():
        full = runtime.planner.plan(list(inputs), list(outputs))
        dirty = _downstream(full, changed)
        tally.recomputed |= dirty
        logged_plan = group[0].plan
        if logged_plan is not None:
            tally.plans[logged_plan.fingerprint] = full.fingerprint
        compared = list(dict.fromkeys([*outputs, *(c for c in full.columns if c in dirty)]))
        targets = [c for c in compared if c in dirty]
        if not targets:  # nothing this plan computes changed: every value is the logged one
            for record in group:
                rows.extend(_same(record, compared))
            continue
        reads = _reads(full, dirty, set(inputs))
        kept = [c for c in full.columns if c not in dirty]
        for (missing, given), subgroup in _by_missing(group, reads, kept).items():
            for name in missing:  # not computed by the decision (its output was cached)
                tally.from_sources[name] = tally.from_sources.get(name, 0) + len(subgroup)
            plan = runtime.planner.plan(sorted(given), targets)
            await _compare(runtime, plan, subgroup, compared, rows, llm, pace)
    return rows, llm


def _by_missing(
    records: Sequence[LoggedQuery], reads: set[str], kept: Sequence[str]
) -> dict[tuple[frozenset[str], frozenset[str]], list[LoggedQuery]]:
    """Records by which of `reads` they did not log, and the logged columns a run of them
    starts from: `reads` when they logged all (most do), else every column not downstream
    of the change that they logged, so what is missing is computed from the nearest."""
    groups: dict[tuple[frozenset[str], frozenset[str]], list[LoggedQuery]] = {}
    whole = frozenset(reads)
    for record in records:
        missing = frozenset(name for name in reads if not _has(record, name))
        given = frozenset(c for c in kept if _has(record, c)) if missing else whole
        groups.setdefault((missing, given), []).append(record)
    return groups


def _has(record: LoggedQuery, name: str) -> bool:
    return name in record.values or name in record.inputs


async def _compare(
    runtime: Snapshot,
    plan: Plan,
    group: Sequence[LoggedQuery],
    compared: Sequence[str],
    rows: list[ReplayRow],
    llm: dict[str, list[dict[str, Any]]],
    pace: Pace,
) -> None:
    """Run `plan` over `group` (in slices `pace` sizes) and add a row per decision and
    compared feature."""
    start = 0
    while start < len(group):
        chunk = group[start : start + pace.rows]
        start += len(chunk)
        began = time.perf_counter()
        values, calls = await _run(runtime, plan, chunk)
        pace.ran(len(chunk), time.perf_counter() - began)
        for index, record in enumerate(chunk):
            for name in compared:
                logged = _logged(record, name)
                column = values.get(name)
                if column is None:
                    rows.append(ReplayRow(record.query_id, record.now, name, logged, logged, False))
                    continue
                error = column.errors[index]
                value = column.values[index]
                if isinstance(value, DataFrame):  # has-many rows as logged: dicts
                    value = value.rows
                rows.append(
                    ReplayRow(
                        record.query_id,
                        record.now,
                        name,
                        logged,
                        value,
                        not _equal(logged, value) or error is not None,
                        None if error is None else error.message,
                    )
                )
        for call in calls.llm:
            if call.row is not None:
                kept = {k: v for k, v in call.record().items() if k != "sent_at"}
                llm.setdefault(chunk[call.row].query_id, []).append(kept)
        await asyncio.sleep(0)  # a server's queries run between chunks


def _plan_key(record: LoggedQuery) -> tuple[Any, ...]:
    if record.plan is not None:
        return (record.plan.fingerprint, record.plan.inputs, record.plan.outputs)
    # a record from before plans were logged: its inputs and outputs name the query
    return (None, tuple(sorted(record.inputs)), tuple(record.outputs))


def _downstream(plan: Plan, changed: set[str]) -> set[str]:
    """The columns of `plan` computed by a changed feature or from one (nodes run in
    topological order, so one pass sees every upstream first)."""
    dirty: set[str] = set()
    for node in plan.nodes:
        hit = any(_feature_of(plan, c) in changed for c in node.outputs) or any(
            c in dirty for c in (*node.inputs, *([node.key] if node.key else []))
        )
        if hit:
            dirty.update(node.outputs)
    return dirty


def _feature_of(plan: Plan, column: str) -> str:
    info = plan.columns[column].info
    return f"{info.namespace}.{info.name}"


def _reads(plan: Plan, dirty: set[str], inputs: set[str]) -> set[str]:
    """The logged columns the recomputed nodes read: the query's inputs, and every column
    not downstream of the change that a recomputed node (or its entity key) reads."""
    reads = set(inputs)
    for node in plan.nodes:
        if dirty.isdisjoint(node.outputs):
            continue
        for column in (*node.inputs, *([node.key] if node.key else [])):
            if column not in dirty:
                reads.add(column)
    return reads


async def _run(
    runtime: Snapshot, plan: Plan, records: Sequence[LoggedQuery]
) -> tuple[dict[str, ColumnData], Calls]:
    """One bulk run of the engine: each record a row, at its own `now`, from its values."""
    columns = {name: [_logged(record, name) for record in records] for name in plan.inputs}
    nows = [record.now for record in records]
    outcome = await runtime.engine.run(plan, columns, len(records), max(nows), {}, row_times=nows)
    return outcome.values, outcome.calls


def _logged(record: LoggedQuery, name: str) -> Any:
    found = record.values.get(name)
    if found is not None:
        return found.value
    return record.inputs.get(name)


def _same(record: LoggedQuery, names: Sequence[str]) -> list[ReplayRow]:
    return [
        ReplayRow(record.query_id, record.now, n, _logged(record, n), _logged(record, n), False)
        for n in names
    ]


# floats this close are one value computed in another order: a model scoring a batch of
# rows (BLAS) and scoring them one by one differ in the last bit or two
_ROUNDING = 1e-12


def _equal(a: Any, b: Any) -> bool:
    """Equal values: ints exactly, floats within rounding (NaN equals NaN), anything else by
    type and value."""
    if _number(a) and _number(b):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return math.isclose(a, b, rel_tol=_ROUNDING, abs_tol=_ROUNDING) or (
            math.isnan(a) and math.isnan(b)
        )
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # values that cannot be compared (arrays): by their text
        return repr(a) == repr(b)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


__all__ = ["CHUNK", "Decisions", "ReplayResult", "ReplayRow", "decision_ids", "replay"]
