"""Prometheus metrics of one server: requests and latency by endpoint, latency per resolver,
cache hits and misses (their ratio is the hit ratio)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kairos.engine.result import NodeTiming

_LATENCY_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
)  # fmt: skip


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "kairos_requests", "HTTP requests", ["endpoint", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "kairos_request_latency_seconds",
            "HTTP request latency",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.resolver_latency = Histogram(
            "kairos_resolver_latency_seconds",
            "Time per plan node (resolver, expression or store call)",
            ["resolver", "kind"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "kairos_cache_hits",
            "Feature values served from the online store",
            registry=self.registry,
        )
        self.cache_misses = Counter(
            "kairos_cache_misses", "Feature values computed", registry=self.registry
        )
        self.hit_ratio = Gauge(
            "kairos_cache_hit_ratio",
            "Share of feature values served from the online store since the server started",
            registry=self.registry,
        )
        self._hits = self._misses = 0
        self._request_children: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._node_children: dict[tuple[str, str], Any] = {}

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        key = (endpoint, status)
        children = self._request_children.get(key)
        if children is None:  # labels() is a dict lookup under a lock: do it once per label set
            children = self._request_children[key] = (
                self.requests.labels(endpoint, str(status)),
                self.latency.labels(endpoint),
            )
        children[0].inc()
        children[1].observe(seconds)

    def observe_query(self, trace: list[NodeTiming], hits: int, computed: int) -> None:
        for timing in trace:
            if timing.kind != "query":
                key = (timing.label, timing.kind)
                child = self._node_children.get(key)
                if child is None:
                    child = self._node_children[key] = self.resolver_latency.labels(*key)
                child.observe(timing.duration_ms / 1000)
        self.cache_hits.inc(hits)
        self.cache_misses.inc(computed)
        self._hits += hits
        self._misses += computed
        if self._hits + self._misses:
            self.hit_ratio.set(self._hits / (self._hits + self._misses))

    def render(self) -> bytes:
        return generate_latest(self.registry)
