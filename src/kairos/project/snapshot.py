"""What a client's queries run on: the feature graph, the planner over the resolvers bound to
it, the engine and the stores. The client owns one `Snapshot` and hands its helpers (offline
queries, backfills) the runtime or the parts they need, never the client itself.

A `Snapshot` does not change: re-binding `kr.predict` features to the model versions their
aliases point at now makes a new one (`rebound`), which the client swaps in whole, so each
query plans and runs on one consistent set.

    runtime = runtime.rebound(models.resolvers())  # doctest: +SKIP
    runtime.planner.plan(["user.id"], [runtime.name(User.risk)])  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from kairos.definitions.feature import Feature
from kairos.definitions.graph import Graph
from kairos.engine.execution import Engine
from kairos.errors import KairosError
from kairos.planner.planner import Planner
from kairos.resolvers.model import ModelResolver
from kairos.resolvers.python import Resolver
from kairos.resolvers.registry import ResolverSet
from kairos.resolvers.sql import SqlResolver
from kairos.sources import Source
from kairos.stores.offline import OfflineStore, offline_store_from_url
from kairos.stores.offline.writer import OfflineWriter
from kairos.stores.online import OnlineStore

Declared = Resolver[..., Any] | SqlResolver


class OfflineHistory:
    """The offline store, opened on first use, and the writer that keeps online values in
    it; no writer when the store is `none://`."""

    def __init__(self, store: str | OfflineStore) -> None:
        self._store: OfflineStore | None = None if isinstance(store, str) else store
        self._url = store if isinstance(store, str) else None
        self._lock = threading.Lock()
        self.kept = store != "none://"
        self.writer = OfflineWriter(self.store) if self.kept else None

    def store(self) -> OfflineStore:
        """The offline store, opened now if it was not yet."""
        with self._lock:
            if self._store is None:
                if self._url is None or self._url == "none://":
                    raise KairosError(
                        "this client keeps no offline store; set offline_store in kairos.yaml "
                        "(e.g. duckdb:///.kairos/offline.duckdb) or pass offline_store="
                    )
                self._store = offline_store_from_url(self._url)
            return self._store

    def close(self) -> None:
        """Flush and stop the writer, then close the store if it was opened."""
        if self.writer is not None:
            self.writer.close()
        if self._store is not None:
            self._store.close()


class FeatureNames:
    """Canonical feature names, with the strings callers send remembered (up to 65536)."""

    def __init__(self, graph: Graph) -> None:
        self._graph = graph
        self._names: dict[str, str] = {}

    def __call__(self, feature: Any) -> str:
        if isinstance(feature, Feature):
            return feature.fqn
        if isinstance(feature, str):
            found = self._names.get(feature)
            if found is None:
                found = self._graph.ref(feature).fqn
                if len(self._names) < 65536:
                    self._names[feature] = found
            return found
        return self._graph.ref(feature).fqn

    def known(self, feature: Any) -> str:
        """The canonical name of a feature the graph has (an unknown one raises, with the
        names it may have meant)."""
        name = self(feature)
        self._graph.info(self._graph.ref(name))
        return name


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The graph, its resolvers and planner, the engine and the stores of one client."""

    graph: Graph
    name: FeatureNames
    declared: tuple[Declared, ...]  # the project's resolvers and its LLM features'
    sources: Mapping[str, Source]
    planner: Planner  # over the declared resolvers and the kr.predict ones bound last
    engine: Engine
    store: OnlineStore
    offline: OfflineHistory

    @property
    def resolvers(self) -> ResolverSet:
        return self.planner.resolvers

    def rebound(self, models: Sequence[ModelResolver]) -> Snapshot:
        """This runtime with `models` as its `kr.predict` resolvers: new plans use them
        (queries already running finish on the plans they started with)."""
        return replace(
            self,
            planner=plan_with(
                self.graph, self.declared, models, self.sources, self.planner.default_timeout
            ),
        )


def plan_with(
    graph: Graph,
    declared: Sequence[Declared],
    models: Sequence[ModelResolver],
    sources: Mapping[str, Source],
    timeout: timedelta,
) -> Planner:
    """A planner over the declared resolvers and the model resolvers, bound to the graph."""
    resolvers = ResolverSet.build(graph, (*declared, *models), sources)
    return Planner(graph, resolvers, default_timeout=timeout)
