"""`assemble(folder, config, overrides) -> Runtime`: the one place a project's parts are
built, in an order where a part that fails closes the ones built before it, and the one
`Runtime` that owns them and closes them.

    runtime = assemble("examples/fraud", None, Overrides())  # doctest: +SKIP
    runtime.current.planner.plan(["user.id"], ["user.risk"])  # doctest: +SKIP
    await runtime.aclose()  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kairos import telemetry
from kairos.definitions.durations import DurationLike, parse_duration
from kairos.definitions.graph import Graph
from kairos.definitions.windows import indexed_window
from kairos.engine.execution import Engine
from kairos.engine.windows import WindowIndex
from kairos.engine.windows_shared import windows_for
from kairos.errors import KairosError
from kairos.gateway import Gateway
from kairos.project.config import Config
from kairos.project.decisions import DecisionLog
from kairos.project.events import FollowingIndex, stored_events
from kairos.project.fingerprint import definitions_fingerprint
from kairos.project.llm import GatewayCompleter, feature_models
from kairos.project.models import Models
from kairos.project.modules import Project
from kairos.project.offline import Datasets
from kairos.project.session import Session
from kairos.project.snapshot import FeatureNames, OfflineHistory, Snapshot, plan_with
from kairos.project.vectors import VectorFeatures
from kairos.resolvers.llm import EmbeddingResolver, llm_resolvers
from kairos.resolvers.model import ModelResolver
from kairos.resolvers.nearest import nearest_resolvers
from kairos.sources import Source, source_from_config
from kairos.stores.datasets import DatasetStore
from kairos.stores.offline import OfflineStore
from kairos.stores.online import OnlineStore, online_store_from_url
from kairos.stores.query_log import QueryLog, query_log_from_url


@dataclass(frozen=True)
class Overrides:
    """What a caller sets over `kairos.yaml`: more definitions, stores (a URL or an open
    one), the resolver timeout, the resolver threads, an in-process gateway and its key,
    the vector indexes' URL."""

    definitions: Iterable[Any] = ()
    online_store: str | OnlineStore | None = None
    offline_store: str | OfflineStore | None = None
    query_log: str | QueryLog | None = None
    default_timeout: DurationLike | None = None
    max_workers: int = 32
    gateway: Gateway | None = None
    llm_key: str | None = None
    vectors: str | None = None


class Runtime:
    """Every part of one project, built by `assemble` and closed by `aclose` and `shutdown`.

    `current` is what queries plan and run on; moving a model alias swaps it whole
    (`rebind`), so each query plans and runs on one consistent set.
    """

    project: Project
    config: Config
    graph: Graph
    sources: Mapping[str, Source]
    models: Models
    llm: GatewayCompleter
    vectors: VectorFeatures
    log: DecisionLog
    session: Session
    datasets: Datasets
    windows: Any  # a WindowIndex, FollowingIndex or the shared windows in Redis
    pool: concurrent.futures.ThreadPoolExecutor
    online_url: str | None  # the online store's URL, for Ray workers (None: an object)
    current: Snapshot

    def __init__(self) -> None:
        self._closed = False

    def rebind(self, models: list[ModelResolver]) -> None:
        """Plan with these `kr.predict` resolvers from now on: the one place the snapshot
        changes."""
        self.current = self.current.rebound(models)

    async def aclose(self) -> None:
        """Flush the query log, close the sources, the stores, the models and the gateway's
        replicas (once; each part is closed even if an earlier one fails)."""
        if self._closed:
            return
        self._closed = True
        steps: list[Callable[[], Awaitable[object]]] = [
            lambda: asyncio.to_thread(self.log.close),
            lambda: asyncio.to_thread(self.current.offline.close),
            *(source.close for source in self.sources.values()),
            self.current.store.close,
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

    def shutdown(self) -> None:
        """Stop the resolver threads (after `aclose`, or when it failed)."""
        self.pool.shutdown(wait=False, cancel_futures=True)


def assemble(
    project: str | Path | Project | None, config: Config | None, overrides: Overrides
) -> Runtime:
    """Load the project (a folder, a `.py` file or a `Project`), read its `kairos.yaml`
    unless `config` is given, and build every part."""
    if isinstance(project, Project):
        loaded = project
    elif project is not None:
        loaded = Project.load(project)
    else:
        loaded = Project(None, (), ())
    folder = loaded.root.parent if loaded.root and loaded.root.is_file() else loaded.root
    runtime = Runtime()
    runtime.config = config = config or (Config.load(folder) if folder is not None else Config())
    telemetry.from_environment()  # OTEL_TRACES_EXPORTER and friends, once per process
    extra = Project.from_objects(overrides.definitions)
    runtime.project = Project(
        loaded.root,
        tuple(dict.fromkeys((*loaded.feature_classes, *extra.feature_classes))),
        tuple(dict.fromkeys((*loaded.resolvers, *extra.resolvers))),
    )
    if not runtime.project.feature_classes:
        raise KairosError(
            "the project declares no @features classes; pass a project folder or definitions=[...]"
        )
    runtime.graph = graph = Graph.build(runtime.project.feature_classes)
    base = config.base_dir or Path.cwd()
    # Sources connect lazily: building them does no I/O.
    runtime.sources = sources = {
        name: source_from_config(name, spec, base) for name, spec in config.sources.items()
    }
    # `kr.predict` features become resolvers pinned to the model versions they resolve to.
    runtime.models = Models(config.models, base, graph, runtime.rebind)
    # `kr.completion` / `kr.embedding` features call the gateway, in process; the
    # project's own gateway runs its `deployments:` when a call first needs one
    llm = llm_resolvers(graph, lambda: runtime.llm)
    runtime.llm = GatewayCompleter(
        config.base_dir,
        overrides.gateway,
        overrides.llm_key or config.llm.key,
        config.llm.tokenizers,
        config.llm.context,
        deployments=config.deployments,
        models=feature_models(llm),
        budgets=config.llm.budgets,
    )
    # `kr.nearest` features search an index per vector feature, opened on first use
    runtime.vectors = VectorFeatures(
        graph,
        overrides.vectors
        or config.vectors
        or str((config.base_dir or Path.cwd()) / ".kairos" / "vectors"),
        {(r.output.root, r.output.name): r for r in llm if isinstance(r, EmbeddingResolver)},
    )
    declared = (
        *runtime.project.resolvers,
        *llm,
        *nearest_resolvers(graph, runtime.vectors.index),
    )
    timeout = (
        config.resolver_timeout
        if overrides.default_timeout is None
        else parse_duration(overrides.default_timeout, field="default_timeout")
    )
    planner = plan_with(graph, declared, runtime.models.resolvers(), sources, timeout)
    # Backends that start threads come last, each closed again if a later one fails.
    log = config.query_log if overrides.query_log is None else overrides.query_log
    mode = config.query_log_durability  # kairos.yaml's query_log.durability
    opened: QueryLog = query_log_from_url(log, durability=mode) if isinstance(log, str) else log
    runtime.log = DecisionLog(opened, FeatureNames(graph), lambda: runtime.datasets)
    runtime.session = Session(runtime.log)
    store = config.online_store if overrides.online_store is None else overrides.online_store
    runtime.online_url = store if isinstance(store, str) else None  # for Ray workers
    try:
        online = online_store_from_url(store) if isinstance(store, str) else store
    except BaseException:
        runtime.log.close()
        raise
    offline = config.offline_store if overrides.offline_store is None else overrides.offline_store
    history = OfflineHistory(offline)
    folder_for_data = config.base_dir or Path.cwd()
    runtime.datasets = Datasets(
        DatasetStore(folder_for_data / ".kairos" / "datasets"),
        lambda: definitions_fingerprint(graph, runtime.current.resolvers),
    )
    runtime.pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=overrides.max_workers, thread_name_prefix="kairos-resolver"
    )
    runtime.windows = windows_for(
        online, (lambda: stored_events(graph, history.store)) if history.kept else None
    )
    if history.kept and isinstance(runtime.windows, WindowIndex):
        # in this process, over a store other processes may write: follow what they write
        runtime.windows = FollowingIndex(graph, history.store)
    for namespace, info in graph.classes.items():
        for name in info.features:
            indexed = indexed_window(graph, namespace, name)
            if indexed is not None:
                kind = info.features[name].type
                runtime.windows.register(
                    (namespace, name),
                    indexed.child,
                    indexed.fk,
                    indexed.spec,
                    None if kind is None else kind.kind,
                )
    engine = Engine(
        graph,
        online,
        runtime.pool,
        observe=history.writer is not None,
        windows=runtime.windows,
    )
    runtime.current = Snapshot(
        graph, FeatureNames(graph), declared, sources, planner, engine, online, history
    )
    return runtime
