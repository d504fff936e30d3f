"""`kairos.Client`: the one entry point. Embedded: definitions, planner, engine and stores
live in this process; nothing needs a server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
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
from kairos.definitions.graph import Graph
from kairos.definitions.windows import indexed_window
from kairos.engine.execution import Engine
from kairos.engine.inputs import check_inputs
from kairos.engine.result import (
    BulkResult,
    ColumnData,
    FeatureValue,
    NodeTiming,
    QueryMeta,
    QueryResult,
)
from kairos.engine.tracing import traced_offline, traced_query
from kairos.engine.values import to_utc
from kairos.engine.windows import WindowIndex
from kairos.engine.windows_shared import windows_for
from kairos.errors import DefinitionError, InvalidInput, InvalidValue, KairosError
from kairos.gateway import Gateway
from kairos.planner.plan import Plan
from kairos.planner.planner import Planner
from kairos.project.config import Config
from kairos.project.decisions import DecisionLog, decision_records, snapshot_values, whole_path
from kairos.project.events import (
    FollowingIndex,
    event_class,
    foreign_keys,
    last_of_each,
    persist,
    stored_events,
    typed_events,
)
from kairos.project.fingerprint import definitions_fingerprint
from kairos.project.inputs import bulk_columns
from kairos.project.llm import GatewayCompleter, feature_models
from kairos.project.models import Models
from kairos.project.modules import Project
from kairos.project.offline import Datasets, OfflineResult, Progress, Recompute, offline_query
from kairos.project.snapshot import FeatureNames, OfflineHistory, Snapshot, plan_with
from kairos.project.vectors import VectorFeatures
from kairos.resolvers.calls import Calls
from kairos.resolvers.llm import EmbeddingResolver, llm_resolvers
from kairos.resolvers.model import ModelResolver
from kairos.resolvers.nearest import nearest_resolvers
from kairos.resolvers.registry import ResolverSet
from kairos.sources import source_from_config
from kairos.stores.datasets import DatasetStore
from kairos.stores.offline import OfflineStore
from kairos.stores.offline.writer import OfflineWriter
from kairos.stores.online import OnlineStore, online_store_from_url
from kairos.stores.query_log import (
    LoggedQuery,
    NullQueryLog,
    PlanInfo,
    QueryLog,
    query_log_from_url,
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
        if isinstance(project, Project):
            loaded = project
        elif project is not None:
            loaded = Project.load(project)
        else:
            loaded = Project(None, (), ())
        folder = loaded.root.parent if loaded.root and loaded.root.is_file() else loaded.root
        self.config = config or (Config.load(folder) if folder is not None else Config())
        telemetry.from_environment()  # OTEL_TRACES_EXPORTER and friends, once per process
        extra = Project.from_objects(definitions)
        self.project = Project(
            loaded.root,
            tuple(dict.fromkeys((*loaded.feature_classes, *extra.feature_classes))),
            tuple(dict.fromkeys((*loaded.resolvers, *extra.resolvers))),
        )
        if not self.project.feature_classes:
            raise KairosError(
                "the project declares no @features classes; pass a project folder or "
                "definitions=[...]"
            )
        self.graph = Graph.build(self.project.feature_classes)
        base = self.config.base_dir or Path.cwd()
        # Sources connect lazily: building them does no I/O.
        self.sources = {
            name: source_from_config(name, spec, base) for name, spec in self.config.sources.items()
        }
        # `kr.predict` features become resolvers pinned to the model versions they resolve to.
        self.models = Models(self.config.models, base, self.graph, self._bind_models)
        # `kr.completion` / `kr.embedding` features call the gateway, in process; the
        # project's own gateway runs its `deployments:` when a call first needs one
        llm = llm_resolvers(self.graph, lambda: self.llm)
        self.llm = GatewayCompleter(
            self.config.base_dir,
            gateway,
            llm_key or self.config.llm.key,
            self.config.llm.tokenizers,
            self.config.llm.context,
            deployments=self.config.deployments,
            models=feature_models(llm),
            budgets=self.config.llm.budgets,
        )
        # `kr.nearest` features search an index per vector feature, opened on first use
        self.vectors = VectorFeatures(
            self.graph,
            vectors
            or self.config.vectors
            or str((self.config.base_dir or Path.cwd()) / ".kairos" / "vectors"),
            {(r.output.root, r.output.name): r for r in llm if isinstance(r, EmbeddingResolver)},
        )
        declared = (
            *self.project.resolvers,
            *llm,
            *nearest_resolvers(self.graph, self.vectors.index),
        )
        timeout = (
            self.config.resolver_timeout
            if default_timeout is None
            else parse_duration(default_timeout, field="default_timeout")
        )
        planner = plan_with(self.graph, declared, self.models.resolvers(), self.sources, timeout)
        # Backends that start threads come last, each closed again if a later one fails.
        log = self.config.query_log if query_log is None else query_log
        mode = self.config.query_log_durability  # kairos.yaml's query_log.durability
        opened: QueryLog = query_log_from_url(log, durability=mode) if isinstance(log, str) else log
        self.log = DecisionLog(opened, FeatureNames(self.graph), lambda: self.datasets)
        self._logging = not isinstance(opened, NullQueryLog)
        store = self.config.online_store if online_store is None else online_store
        self._online_url = store if isinstance(store, str) else None  # for Ray workers
        try:
            online = online_store_from_url(store) if isinstance(store, str) else store
        except BaseException:
            self.log.close()
            raise
        offline = self.config.offline_store if offline_store is None else offline_store
        history = OfflineHistory(offline)
        folder_for_data = self.config.base_dir or Path.cwd()
        self.datasets = Datasets(
            DatasetStore(folder_for_data / ".kairos" / "datasets"),
            lambda: definitions_fingerprint(self.graph, self.resolvers),
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="kairos-resolver"
        )
        self.windows = windows_for(
            online, (lambda: stored_events(self.graph, history.store)) if history.kept else None
        )
        if history.kept and isinstance(self.windows, WindowIndex):
            # in this process, over a store other processes may write: follow what they write
            self.windows = FollowingIndex(self.graph, history.store)
        for namespace, info in self.graph.classes.items():
            for name in info.features:
                indexed = indexed_window(self.graph, namespace, name)
                if indexed is not None:
                    kind = info.features[name].type
                    self.windows.register(
                        (namespace, name),
                        indexed.child,
                        indexed.fk,
                        indexed.spec,
                        None if kind is None else kind.kind,
                    )
        engine = Engine(
            self.graph,
            online,
            self._pool,
            observe=history.writer is not None,
            windows=self.windows,
        )
        self._runtime = Snapshot(
            self.graph,
            FeatureNames(self.graph),
            declared,
            self.sources,
            planner,
            engine,
            online,
            history,
        )
        self._local = threading.local()
        self._loops: list[asyncio.AbstractEventLoop] = []
        self._loops_lock = threading.Lock()
        self._helper: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False
        self._id_prefix = uuid.uuid4().hex[:16]
        self._id_counter = itertools.count(1)
        self._plans: dict[str, tuple[Snapshot, PlanInfo]] = {}

    def _bind_models(self, models: list[ModelResolver]) -> None:
        """Plan with these `kr.predict` resolvers from now on: the one place the runtime
        changes."""
        self._runtime = self._runtime.rebound(models)

    # --- what queries run on (read-only; rebinding models swaps the runtime whole) -----

    @property
    def runtime(self) -> Snapshot:
        return self._runtime

    @property
    def resolvers(self) -> ResolverSet:
        return self._runtime.resolvers

    @property
    def planner(self) -> Planner:
        return self._runtime.planner

    @property
    def engine(self) -> Engine:
        return self._runtime.engine

    @property
    def store(self) -> OnlineStore:
        """The online store."""
        return self._runtime.store

    @property
    def offline_writer(self) -> OfflineWriter | None:
        """What keeps online values in the offline store (None with `none://`)."""
        return self._runtime.offline.writer

    @property
    def declared_resolvers(self) -> tuple[Any, ...]:
        """The project's resolvers and its LLM features' (not the `kr.predict` ones)."""
        return self._runtime.declared

    def offline_store(self) -> OfflineStore:
        """The offline store, opened on first use."""
        return self._runtime.offline.store()

    # --- names --------------------------------------------------------------------------

    def name(self, feature: Any) -> str:
        """The canonical name of a feature ref or string: `User.txn_count["24h"]` ->
        "user.txn_count[1d]"."""
        return self._runtime.name(feature)

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
            self._runtime,
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
            self._online_url,
            self._id_prefix,
            vectors=self.vectors.url,
        )
        return recompute_engine(engine, address, self._runtime, rebuild)

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
            self._runtime,
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
                self._runtime,
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
            await self._check_query_id(query_id)
        when = _now(now)
        runtime = self._runtime  # one planner and engine for the whole query
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
            query_id or self._new_query_id(),
            when,
            total,
            rows,
            outcome.cache_hits,
            outcome.computed,
            tuple(whole_path(call.record(), started, total, full=False) for call in calls.llm),
        )
        result = BulkResult(outcome.columns, meta, trace, self.name)
        writer = runtime.offline.writer
        if writer is not None and outcome.observed:
            writer.add(outcome.observed)
        if self._logging:  # the writer thread builds and encodes the records
            values = snapshot_values(outcome.values)
            inputs = {name: values[name].values for name in columns}
            build = functools.partial(
                self._records, runtime, plan, inputs, result, values, calls, started
            )
            await self.log.store.append_later(build, rows)
        return result

    def _new_query_id(self) -> str:
        """Unique without a syscall per query: a random 64-bit prefix per client, then a
        counter, so one client's ids sort in the order its queries finished."""
        return f"{self._id_prefix}{next(self._id_counter):016x}"

    def _known(self, feature: Any, field: str) -> str:
        """The name of a feature the project has; an unknown one is bad input for `field`."""
        try:
            return self._runtime.name.known(feature)
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

    async def _check_query_id(self, query_id: str) -> None:
        """A caller's query id names one decision: it must be readable back and unused."""
        if not isinstance(query_id, str) or not QUERY_ID.fullmatch(query_id):
            raise InvalidInput(
                f"query_id {query_id!r} must be 1-128 letters, digits or . _ ~ : -",
                field="query_id",
            )
        if self._logging and await asyncio.to_thread(self.log.get, query_id) is not None:
            raise InvalidInput(
                f"query_id {query_id!r} was already used; each query id names one decision",
                field="query_id",
            )

    def _records(
        self,
        runtime: Snapshot,
        plan: Plan,
        inputs: dict[str, list[Any]],
        result: BulkResult,
        values: dict[str, ColumnData],
        calls: Calls,
        started: float,
    ) -> list[LoggedQuery]:
        """Each entity's decision record, with its plan as `_plan_info` names it."""
        info = self._plan_info(runtime, plan)
        return decision_records(info, plan, inputs, result, values, calls, started)

    def _plan_info(self, runtime: Snapshot, plan: Plan) -> PlanInfo:
        """The plan as a decision record names it (built once per plan and runtime; the
        writer thread calls this)."""
        found = self._plans.get(plan.fingerprint)
        if found is not None and found[0] is runtime:
            return found[1]
        definitions = definitions_fingerprint(runtime.graph, runtime.resolvers)
        info = PlanInfo(
            plan.fingerprint,
            definitions,
            plan.inputs,
            plan.outputs,
            {name: plan.versions.get(name) for name in plan.columns},
            plan.models,
        )
        if len(self._plans) >= 1024:  # plans of runtimes long replaced: let them go
            self._plans.clear()
        self._plans[plan.fingerprint] = (runtime, info)
        return info

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
        if self._closed:
            return
        self._closed = True
        steps: list[Callable[[], Awaitable[object]]] = [
            lambda: asyncio.to_thread(self.log.close),
            lambda: asyncio.to_thread(self._runtime.offline.close),
            *(source.close for source in self.sources.values()),
            self.store.close,
            lambda: asyncio.to_thread(self.windows.close),
            lambda: asyncio.to_thread(self.models.close),
            self.vectors.close,
            self.llm.aclose,  # stops the LLM replicas: never skipped for an earlier failure
        ]
        failed: list[Exception] = []
        for step in steps:
            try:
                await step()
            except Exception as error:  # close the rest, then say what failed first
                failed.append(error)
        if failed:
            raise failed[0]

    def close(self) -> None:
        """`aclose()`, then stop the resolver threads and event loops (a failure too)."""
        try:
            self._sync(self.aclose())
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
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


# A query id a caller may choose: readable back as a URL path segment, at most 128 chars.
QUERY_ID = re.compile(r"[A-Za-z0-9._~:-]{1,128}")


def _now(now: datetime | None) -> datetime:
    if now is None:
        return datetime.now(UTC)
    if not isinstance(now, datetime):
        raise InvalidInput(f"now={now!r} must be a datetime", field="now")
    try:
        return to_utc(now)
    except InvalidValue as error:
        raise InvalidInput(f"now: {error}", field="now") from None
