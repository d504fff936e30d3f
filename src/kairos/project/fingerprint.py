"""A short, stable hash of a client's definitions, so a saved dataset says which code made it.

    >>> definitions_fingerprint(client.graph, client.resolvers)  # doctest: +SKIP
    '3f9a0c51d2e8b7a4'

It covers every feature (namespace, name, kind, type, expression, window, staleness, keys and
relations) and every bound resolver (name, kind, code version, outputs). It is built only
from text, never from `id()` or `hash()`, so two processes with the same definitions agree.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from kairos.definitions.graph import FeatureInfo, Graph
from kairos.resolvers.registry import BoundResolver, ResolverSet

FINGERPRINT_LENGTH = 16


def definitions_fingerprint(graph: Graph, resolvers: ResolverSet) -> str:
    """16 hex digits of sha256 over the graph's feature classes and the bound resolvers."""
    digest = hashlib.sha256()
    for namespace in sorted(graph.classes):
        info = graph.classes[namespace]
        digest.update(_line(["class", namespace, info.primary, info.feature_time]))
        for name in sorted(info.features):
            digest.update(_line(_feature(info.features[name])))
    for resolver in sorted((_resolver(bound) for bound in resolvers.resolvers), key=json.dumps):
        digest.update(_line(resolver))
    return digest.hexdigest()[:FINGERPRINT_LENGTH]


def _feature(info: FeatureInfo) -> list[Any]:
    return [
        "feature",
        info.namespace,
        info.name,
        info.kind,
        repr(info.type),
        None if info.expression is None else repr(info.expression),
        _seconds(info.window),
        _seconds(info.max_staleness),
        _seconds(info.ttl),
        info.target,
        info.join_key,
        None if info.fk_target is None else list(info.fk_target),
        info.is_primary,
        info.is_feature_time,
    ]


def _resolver(bound: BoundResolver) -> list[Any]:
    # `bound.kind` is python | sql; the resolver's own kind is online | offline.
    return [
        "resolver",
        bound.namespace,
        bound.name,
        bound.kind,
        str(getattr(bound.resolver, "kind", "")),
        bound.version,
        list(bound.outputs),
    ]


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _line(parts: list[Any]) -> bytes:
    return json.dumps(parts, separators=(",", ":")).encode() + b"\n"
