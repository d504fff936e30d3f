"""`kairos.Client`: the one entry point. Embedded: definitions, planner, engine and stores
live in this process; nothing needs a server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from kairos import telemetry
from kairos.client.backfill import BackfillReport, materialize
from kairos.client.evaluate import Evaluation, evaluate
from kairos.client.ray_engine import Rebuild, recompute_engine
from kairos.client.remote import RemoteClient
from kairos.client.replay import Decisions, ReplayResult, replay, replay_runtime
from kairos.definitions.durations import DurationLike, parse_duration
from kairos.engine.execution import Engine
from kairos.engine.inputs import check_inputs
from kairos.engine.result import (
    BulkResult,
    FeatureValue,
    NodeTiming,
    QueryMeta,
    QueryResult,
)
from kairos.engine.tracing import traced_offline, traced_query
from kairos.engine.values import to_utc
from kairos.errors import DefinitionError, InvalidInput, InvalidValue, KairosError
from kairos.gateway import Gateway
from kairos.planner.plan import Plan
from kairos.planner.planner import Planner
from kairos.project.assemble import Overrides, assemble
from kairos.project.config import Config
from kairos.project.decisions import whole_path
from kairos.project.events import (
    event_class,
    foreign_keys,
    last_of_each,
    persist,
    typed_events,
)
from kairos.project.fingerprint import definitions_fingerprint
from kairos.project.inputs import bulk_columns
from kairos.project.modules import Project
from kairos.project.offline import OfflineResult, Progress, Recompute, offline_query
from kairos.project.snapshot import Snapshot
from kairos.resolvers.registry import ResolverSet
from kairos.stores.offline import OfflineStore
from kairos.stores.offline.writer import OfflineWriter
from kairos.stores.online import OnlineStore
from kairos.stores.query_log import (
    QueryLog,
)

T = TypeVar("T")


class Client:
    """Query features of a project.

    >>> client = kr.Client("examples/fraud")  # doctest: +SKIP
    >>> r = client.query(input={User.id: "u1"}, output=[User.risk])  # doctest: +SKIP
    >>> r.get_value(User.risk), r.meta.query_id, r.trace  # doctest: +SKIP

    With `url=` (and the server's `key=`) it is a `RemoteClient` of a `kairos serve` instead:
    the same queries, log and models over HTTP (kairos.client.remote).
    """

    def __new__(
        cls, project: Any = None, *, url: str | None = None, key: str | None = None, **options: Any
    ) -> Any:
        if url is None:
            if isinstance(project, str) and project.startswith(("http://", "https://")):
                raise InvalidInput(
                    f"{project!r} is a server's address, not a project folder: "
                    f"kr.Client(url={project!r}, key=...) is a client of that server",
                    field="project",
                )
            if key is not None:
                raise InvalidInput(
                    "key= is the key of a kairos server: pass its url= too, e.g. "
                    "kr.Client(url='http://127.0.0.1:8000', key=...)",
                    field="key",
                )
            return super().__new__(cls)
        given = (["project"] if project is not None else []) + sorted(options)
        if given:
            raise InvalidInput(
                f"kr.Client(url=...) is a client of a kairos server, which has the project "
                f"and its stores; leave out {', '.join(given)} (or url=, for an embedded "
                "client)",
                field=given[0],
            )
        return RemoteClient(url, key=key)

    def __init__(
        self,
        project: str | Path | Project | None = None,
        *,
        url: str | None = None,  # a RemoteClient is made instead (__new__)
        key: str | None = None,
        definitions: Iterable[Any] = (),
        config: Config | None = None,
        online_store: str | OnlineStore | None = None,
        offline_store: str | OfflineStore | None = None,
        query_log: str | QueryLog | None = None,
        default_timeout: DurationLike | None = None,
        max_workers: int = 32,
        gateway: Gateway | None = None,
        llm_key: str | None = None,
        vectors: str | None = None,
    ) -> None:
        runtime = assemble(
            project,
            config,
            Overrides(
                definitions,
                online_store,
                offline_store,
                query_log,
                default_timeout,
                max_workers,
                gateway,
                llm_key,
                vectors,
            ),
        )
        self._runtime = runtime
        self.project, self.config, self.graph = runtime.project, runtime.config, runtime.graph
        self.sources, self.models, self.llm = runtime.sources, runtime.models, runtime.llm
        self.vectors, self.log, self.datasets = runtime.vectors, runtime.log, runtime.datasets
        self.windows = runtime.windows
        self._session = runtime.session
        self._local = threading.local()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._loops_lock = threading.Lock()
        self._helper: concurrent.futures.ThreadPoolExecutor | None = None

    # --- what queries run on (read-only; rebinding models swaps the runtime whole) -----

    @property
    def runtime(self) -> Snapshot:
        """What queries plan and run on now (swapped whole when a model alias moves)."""
        return self._runtime.current

    @property
    def resolvers(self) -> ResolverSet:
        return self._runtime.current.resolvers

    @property
    def planner(self) -> Planner:
        return self._runtime.current.planner

    @property
    def engine(self) -> Engine:
        return self._runtime.current.engine

    @property
    def store(self) -> OnlineStore:
        """The online store."""
        return self._runtime.current.store

    @property
    def offline_writer(self) -> OfflineWriter | None:
        """What keeps online values in the offline store (None with `none://`)."""
        return self._runtime.current.offline.writer

    @property
    def declared_resolvers(self) -> tuple[Any, ...]:
        """The project's resolvers and its LLM features' (not the `kr.predict` ones)."""
        return self._runtime.current.declared

    def offline_store(self) -> OfflineStore:
        """The offline store, opened on first use."""
        return self._runtime.current.offline.store()

    # --- names --------------------------------------------------------------------------

    def name(self, feature: Any) -> str:
        """The canonical name of a feature ref or string: `User.txn_count["24h"]` ->
        "user.txn_count[1d]"."""
        return self._runtime.current.name(feature)

    # --- planning -----------------------------------------------------------------------

    def plan(self, input: Iterable[Any], output: Iterable[Any]) -> Plan:
        """The plan for these input and output features (cached)."""
        return self.planner.plan([self.name(i) for i in input], [self.name(o) for o in output])

    def explain(self, input: Iterable[Any], output: Iterable[Any]) -> str:
        """The plan as text: each node, what it reads and writes, what it waits for."""
        return self.plan(input, output).explain()

    # --- queries ------------------------------------------------------------------------

    def query(
        self,
        input: Mapping[Any, Any],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> QueryResult:
        """Compute `output` for one entity identified by `input`."""
        return self._sync(
            self.query_async(input, output, now=now, staleness=staleness, query_id=query_id)
        )

    async def query_async(
        self,
        input: Mapping[Any, Any],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> QueryResult:
        if not isinstance(input, Mapping):
            raise InvalidInput(
                "input must be a mapping of feature -> value, e.g. "
                "{User.id: 'u1'}; for many entities use query_bulk",
                field="input",
            )
        columns = {self.name(k): [v] for k, v in input.items()}
        bulk = await self._run(columns, 1, output, now, staleness, query_id)
        features = {
            name: FeatureValue(
                name,
                col.values[0],
                col.observed_at[0],
                col.source[0],
                None if col.errors[0] is None else replace(col.errors[0], row=None),
            )
            for name, col in bulk.columns.items()
        }
        return QueryResult(features, bulk.meta, bulk.trace, self.name)

    def query_bulk(
        self,
        input: Mapping[Any, Sequence[Any]] | Sequence[Mapping[Any, Any]],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> BulkResult:
        """Compute `output` for many entities in one run of the plan.

        `input` is columns (`{User.id: ["u1", "u2"]}`) or rows (`[{User.id: "u1"}, ...]`).
        """
        return self._sync(
            self.query_bulk_async(input, output, now=now, staleness=staleness, query_id=query_id)
        )

    async def query_bulk_async(
        self,
        input: Mapping[Any, Sequence[Any]] | Sequence[Mapping[Any, Any]],
        output: Sequence[Any],
        *,
        now: datetime | None = None,
        staleness: Mapping[Any, DurationLike] | None = None,
        query_id: str | None = None,
    ) -> BulkResult:
        columns = bulk_columns(input, self.name)
        rows = len(next(iter(columns.values()))) if columns else 0
        return await self._run(columns, rows, output, now, staleness, query_id, "bulk")

    def offline_query(
        self,
        spine: Any,
        output: Sequence[Any],
        *,
        timestamp: str = "ts",
        recompute: bool | Sequence[Any] = True,
        engine: str = "local",
        address: str | None = None,
        progress: Progress | None = None,
    ) -> OfflineResult:
        """Compute `output` for every spine row as of that row's timestamp; `engine="ray"`
        recomputes on Ray workers (the cluster at `address`, else Ray on this machine).

        >>> spine = {"user.id": ["u1", "u1"], "ts": [t1, t2]}  # doctest: +SKIP
        >>> client.offline_query(spine, [User.risk]).to_pandas()  # doctest: +SKIP
        """
        return self._sync(
            self.offline_query_async(
                spine,
                output,
                timestamp=timestamp,
                recompute=recompute,
                engine=engine,
                address=address,
                progress=progress,
            )
        )

    async def offline_query_async(
        self,
        spine: Any,
        output: Sequence[Any],
        *,
        timestamp: str = "ts",
        recompute: bool | Sequence[Any] = True,
        engine: str = "local",
        address: str | None = None,
        progress: Progress | None = None,
    ) -> OfflineResult:
        work = offline_query(
            self._runtime.current,
            spine,
            output,
            timestamp=timestamp,
            recompute=recompute,
            engine=self._recompute(engine, address),
            progress=progress,
        )
        return await (work if telemetry.TRACER is None else traced_offline(work))

    def _recompute(self, engine: str, address: str | None) -> Recompute | None:
        """What recomputes offline rows: this process (None), or Ray workers that build
        this client again from its project (kairos.client.ray_engine)."""
        rebuild = Rebuild(
            type(self),
            self.project,
            self.config,
            self._runtime.online_url,
            self._session.id_prefix,
            vectors=self.vectors.url,
        )
        return recompute_engine(engine, address, self._runtime.current, rebuild)

    def replay(
        self,
        query_ids: Sequence[str] | None = None,
        *,
        since: datetime | DurationLike | None = None,
        until: datetime | DurationLike | None = None,
        entity: Mapping[Any, Any] | None = None,
        limit: int | None = 100_000,
        models: Mapping[str, int | str] | None = None,
        features: Mapping[Any, Any] | None = None,
        resolvers: Mapping[Any, Any] | None = None,
        recompute: Sequence[Any] = (),
        keep: int | None = None,
    ) -> ReplayResult:
        """Re-run logged decisions (by id, or the newest `limit` found by time and entity)
        as of their logged `now` with what changed: `models={"risk": 2}` (a version or
        alias), `features={User.verdict: kr.completion(...)}`, `resolvers={old: new}`; every
        value not downstream of a change is the logged one. `keep=N`: hold only the summary
        and the first N rows (changed first), not every row and record.

        >>> client.replay(since="1d", models={"risk": 2}).summary()  # doctest: +SKIP
        """
        return self._sync(
            self.replay_async(
                query_ids,
                since=since,
                until=until,
                entity=entity,
                limit=limit,
                models=models,
                features=features,
                resolvers=resolvers,
                recompute=recompute,
                keep=keep,
            )
        )

    async def replay_async(
        self,
        query_ids: Sequence[str] | None = None,
        *,
        since: datetime | DurationLike | None = None,
        until: datetime | DurationLike | None = None,
        entity: Mapping[Any, Any] | None = None,
        limit: int | None = 100_000,
        models: Mapping[str, int | str] | None = None,
        features: Mapping[Any, Any] | None = None,
        resolvers: Mapping[Any, Any] | None = None,
        recompute: Sequence[Any] = (),
        keep: int | None = None,
    ) -> ReplayResult:
        """`replay`, awaited; read and run `CHUNK` decisions at a time (`limit=None`: every
        one the search finds). With `keep=N` the result holds only the first N rows (changed
        first) and the summary: the memory of one chunk, whatever the replay's size."""
        decisions = (
            Decisions.by_id(self.log.store, query_ids)
            if query_ids is not None
            else Decisions.found(self.log, entity=entity, since=since, until=until, limit=limit)
        )
        runtime, changed = replay_runtime(
            self._runtime.current,
            self.models,
            pins=models,
            features={self._known(k, "features"): v for k, v in (features or {}).items()},
            resolvers=resolvers,
            recompute=[self._known(f, "recompute") for f in recompute],
            completer=lambda: self.llm,
        )
        definitions = definitions_fingerprint(runtime.graph, runtime.resolvers)
        return await replay(runtime, decisions, changed, definitions, keep=keep)

    def evaluate(
        self,
        replayed: ReplayResult,
        labels: Any,
        *,
        metrics: Sequence[str],
        label: str = "label",
        timestamp: str = "ts",
        horizon: DurationLike | None = None,
        features: Sequence[Any] | None = None,
        schema: Mapping[str, Any] | None = None,
        judge_model: str | None = None,
        threshold: float = 0.5,
        report: str | Path | None = None,
    ) -> Evaluation:
        """Score a replay's logged and replayed values against `labels` (keyed by query_id,
        or by entity + ts) with `metrics` (accuracy, auc, log_loss, mae; exact_match,
        json_valid, contains, judge); with `report=` a folder, write report.md and scores.png
        there. The rules: kairos.client.evaluate.

        >>> client.evaluate(result, outcomes, metrics=["auc"]).metrics  # doctest: +SKIP
        """
        return self._sync(
            evaluate(
                replayed,
                labels,
                metrics=metrics,
                names=self.name,
                chat=self.llm,
                label=label,
                timestamp=timestamp,
                horizon=horizon,
                features=features,
                schema=schema,
                judge_model=judge_model,
                threshold=threshold,
                report=report,
            )
        )

    def write_events(self, events_of: Any, rows: Sequence[Mapping[str, Any]]) -> int:
        """Add rows of an `@features(events=True)` class; windowed aggregates over them are
        answered from an index from then on. With an offline store the events are kept there
        first (and read back when a client starts); an event whose id was already written
        replaces it, and the same event sent twice counts once. Returns the number of rows
        accepted.

        >>> client.write_events(Transaction, [{"id": "t1", "user_id": "u1", ...}])  # doctest: +SKIP
        """
        namespace = events_of if isinstance(events_of, str) else self.graph.namespace_of(events_of)
        info = event_class(self.graph, namespace)
        documents: dict[str, Any] = {}
        if self.vectors.searched(namespace):
            # a searched class's rows get their vectors (computed if not given) before
            # anything is kept, so a row whose embedding fails leaves nothing half-written;
            # every version of a document stays searchable as of its own time, even where
            # the windows and the offline store keep only an id's last row (which then
            # carries its vector too)
            versions = typed_events(info, rows, versions=True)
            documents = self._sync(self.vectors.documents(info, versions))
            typed = last_of_each(info, versions)  # already checked
        else:
            typed = typed_events(info, rows)
        self.windows.check(str(info.feature_time), typed)  # refused before anything is kept
        if self.offline_writer is not None:  # durable first: an acknowledged event is kept
            persist(self.offline_store(), info, typed)
        self.windows.write(
            namespace, foreign_keys(info), str(info.feature_time), typed, info.primary
        )
        if documents:
            self._sync(self.vectors.write(documents))
        return len(typed)

    def fetch(
        self, source: str, sql: str, params: Sequence[Any] = ()
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a statement on a configured source and return (columns, rows); parameters are
        bound by the driver. Only DuckDB sources are opened read-only."""
        if source not in self.sources:
            raise InvalidInput(
                f"unknown source {source!r}; configured: {', '.join(self.sources) or 'none'}",
                field="source",
            )
        return self._sync(self.sources[source].fetch(sql, list(params)))

    def materialize(
        self,
        *,
        keys: Sequence[Any],
        start: datetime,
        end: datetime,
        every: DurationLike,
        features: Sequence[Any],
        online: bool = False,
        progress: Progress | None = None,
        engine: str = "local",
        address: str | None = None,
    ) -> BackfillReport:
        """Backfill `features` for `keys` at `start`, `start + every`, ... `end` into the
        offline store (with `online`, the latest values into the online store; a searched
        class's rows into its index); `engine="ray"` computes on Ray workers."""
        return self._sync(
            materialize(
                self._runtime.current,
                keys=keys,
                start=start,
                end=end,
                every=every,
                features=features,
                online=online,
                progress=progress,
                engine=self._recompute(engine, address),
                vectors=self.vectors,
            )
        )

    async def _run(
        self,
        columns: dict[str, list[Any]],
        rows: int,
        output: Sequence[Any],
        now: datetime | None,
        staleness: Mapping[Any, DurationLike] | None,
        query_id: str | None,
        kind: str = "online",
    ) -> BulkResult:
        run = self._execute(columns, rows, output, now, staleness, query_id)
        return await (run if telemetry.TRACER is None else traced_query(kind, run))

    async def _execute(
        self,
        columns: dict[str, list[Any]],
        rows: int,
        output: Sequence[Any],
        now: datetime | None,
        staleness: Mapping[Any, DurationLike] | None,
        query_id: str | None,
    ) -> BulkResult:
        started = time.perf_counter()
        if isinstance(output, str | bytes) or not isinstance(output, Sequence | set | frozenset):
            raise InvalidInput(
                "output must be a list of features, e.g. output=[User.balance]", field="output"
            )
        if query_id is not None:
            await self._session.check_query_id(query_id)
        when = _now(now)
        runtime = self._runtime.current  # one planner and engine for the whole query
        plan = runtime.planner.plan(columns, [runtime.name(o) for o in output])
        check_inputs(
            self.graph,
            columns,
            lambda _row: when,
            nulls=False,
            where=lambda row, name: f"input {name!r}" + (f" (row {row})" if rows > 1 else ""),
        )
        limits = self._staleness(staleness)
        outcome = await runtime.engine.run(plan, columns, rows, when, limits)
        calls = outcome.calls  # the model and LLM calls the run made, for the decision record
        total = (time.perf_counter() - started) * 1000
        trace = [*outcome.trace, NodeTiming(None, "query", "total", 0.0, total, rows, "ok")]
        meta = QueryMeta(
            query_id or self._session.new_query_id(),
            when,
            total,
            rows,
            outcome.cache_hits,
            outcome.computed,
            tuple(whole_path(call.record(), started, total, full=False) for call in calls.llm),
        )
        result = BulkResult(outcome.columns, meta, trace, self.name)
        await self._session.record(runtime, plan, columns, outcome, result, calls, started)
        return result

    def _known(self, feature: Any, field: str) -> str:
        """The name of a feature the project has; an unknown one is bad input for `field`."""
        try:
            return self._runtime.current.name.known(feature)
        except KairosError as error:
            raise InvalidInput(f"{field}: {error}", field=field) from None

    def _staleness(self, staleness: Mapping[Any, DurationLike] | None) -> dict[str, timedelta]:
        limits = {}
        for key, value in (staleness or {}).items():
            name = self.name(key)
            self.graph.info(self.graph.ref(name))  # an unknown feature is an error, not ignored
            try:
                limits[name] = parse_duration(value, field=f"staleness[{name!r}]")
            except DefinitionError as error:
                raise InvalidInput(str(error), field="staleness") from None
        return limits

    # --- running async code from sync callers ----------------------------------------------

    def _sync(self, coroutine: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._loop().run_until_complete(coroutine)
        # Called from inside an event loop (a notebook, an async app): use a helper thread,
        # the same one every time so its event loop is reused.
        with self._loops_lock:
            if self._helper is None:
                self._helper = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="kairos-sync"
                )
            helper = self._helper
        return helper.submit(lambda: self._loop().run_until_complete(coroutine)).result()

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop: asyncio.AbstractEventLoop | None = getattr(self._local, "loop", None)
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            self._local.loop = loop
            with self._loops_lock:
                self._loops.append(loop)
        return loop

    async def aclose(self) -> None:
        """Flush the query log, close the sources and the online store (once)."""
        await self._runtime.aclose()

    def close(self) -> None:
        """`aclose()`, then stop the resolver threads and event loops (a failure too)."""
        try:
            self._sync(self.aclose())
        finally:
            self._runtime.shutdown()
            with self._loops_lock:
                loops, self._loops = self._loops, []
                helper, self._helper = self._helper, None
            if helper is not None:
                helper.shutdown(wait=True)
            for loop in loops:
                if not loop.is_running() and not loop.is_closed():
                    loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    if not isinstance(now, datetime):
        raise InvalidInput(f"now={now!r} must be a datetime", field="now")
    try:
        return to_utc(now)
    except InvalidValue as error:
        raise InvalidInput(f"now: {error}", field="now") from None
