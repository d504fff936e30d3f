"""Prometheus metrics of one server: requests and latency by endpoint, latency per resolver,
cache hits and misses (their ratio is the hit ratio)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

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

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def observe_query(self, trace: list[NodeTiming], hits: int, computed: int) -> None:
        for timing in trace:
            if timing.kind != "query":
                self.resolver_latency.labels(timing.label, timing.kind).observe(
                    timing.duration_ms / 1000
                )
        self.cache_hits.inc(hits)
        self.cache_misses.inc(computed)

    def render(self) -> bytes:
        return generate_latest(self.registry)
