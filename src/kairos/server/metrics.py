"""Prometheus metrics of one server: requests and latency by endpoint, latency per resolver,
cache hits and misses (their ratio is the hit ratio), query log records dropped, and for
queries that reach an LLM the whole path by model: context assembly, queue, time to first
token, decode, tokens/s, total."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kairos.engine.result import NodeTiming

_LATENCY_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
)  # fmt: skip


_LLM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_LLM_STAGES = {
    "context": "Time from a query's start to its LLM request (features computed, prompt built)",
    "queue": "Time an LLM request waited in the engine's queue",
    "ttft": "Time from an LLM request to its first token",
    "decode": "Time from an LLM call's first token to its last",
    "total": "Time from an LLM request to its last token",
}
_LLM_FIELDS = {
    "context": "context_ms",
    "queue": "queue_ms",
    "ttft": "ttft_ms",
    "decode": "decode_ms",
    "total": "total_ms",
}


class _QueryLogDropped(Collector):
    """`kairos_query_log_dropped_total`, read from the log when /metrics is rendered (the log
    counts its drops itself, also those of queries made outside the server)."""

    def __init__(self, dropped: Callable[[], int], lost: Callable[[], int]) -> None:
        self._dropped = dropped
        self._lost = lost

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "kairos_query_log_dropped",
            "Query log records not kept: given to append() while the queue was full or the "
            "log closed (queries wait for the writer instead)",
            value=self._dropped(),
        )
        yield CounterMetricFamily(
            "kairos_query_log_lost",
            "Query log records the writer took but could not write (the database failed for "
            "longer than the log's retry_for)",
            value=self._lost(),
        )


class _Streams(Collector):
    """Per stream consumed by this server: messages, events written, dead-lettered, failed
    batches and the broker's lag, read from the consumers when /metrics is rendered."""

    def __init__(self, streams: Callable[[], Sequence[tuple[str, Any]]]) -> None:
        self._streams = streams

    def collect(self) -> Iterator[Metric]:
        counts = {
            "messages": CounterMetricFamily(
                "kairos_stream_messages", "Messages read from a stream", labels=["stream"]
            ),
            "events": CounterMetricFamily(
                "kairos_stream_events", "Events written from a stream", labels=["stream"]
            ),
            "dead": CounterMetricFamily(
                "kairos_stream_dead_letters",
                "Messages put on the dead-letter stream, with their reason",
                labels=["stream"],
            ),
            "errors": CounterMetricFamily(
                "kairos_stream_errors",
                "Batches that failed (broker or store) and are read again",
                labels=["stream"],
            ),
        }
        lag = GaugeMetricFamily(
            "kairos_stream_lag", "Messages the broker has not delivered yet", labels=["stream"]
        )
        for name, stats in self._streams():
            for field, family in counts.items():
                family.add_metric([name], getattr(stats, field))
            if stats.lag is not None:
                lag.add_metric([name], stats.lag)
        yield from counts.values()
        yield lag


class Metrics:
    def __init__(
        self,
        query_log_dropped: Callable[[], int] = lambda: 0,
        query_log_lost: Callable[[], int] = lambda: 0,
        streams: Callable[[], Sequence[tuple[str, Any]]] = list,
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_QueryLogDropped(query_log_dropped, query_log_lost))
        self.registry.register(_Streams(streams))
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
        # one histogram per stage of an LLM call, labelled by model
        self.llm_stages = {
            stage: Histogram(
                f"kairos_llm_{stage}_seconds",
                help_text,
                ["model"],
                buckets=_LLM_BUCKETS,
                registry=self.registry,
            )
            for stage, help_text in _LLM_STAGES.items()
        }
        self.llm_tokens_per_second = Histogram(
            "kairos_llm_decode_tokens_per_second",
            "Decode rate of LLM calls made by queries",
            ["model"],
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
            registry=self.registry,
        )
        self.llm_prompt_tokens = Counter(
            "kairos_llm_prompt_tokens",
            "Prompt tokens of LLM calls made by queries, by the feature they came from",
            ["model", "feature"],
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

    def observe_query(
        self,
        trace: list[NodeTiming],
        hits: int,
        computed: int,
        llm: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        for call in llm:
            model = str(call.get("model"))
            for stage, field_name in _LLM_FIELDS.items():
                value = call.get(field_name)
                if isinstance(value, int | float):
                    self.llm_stages[stage].labels(model).observe(value / 1000)
            rate = call.get("tokens_per_s")
            if isinstance(rate, int | float):
                self.llm_tokens_per_second.labels(model).observe(rate)
            for feature, count in (call.get("tokens_by_feature") or {}).items():
                if isinstance(count, int) and count > 0:
                    self.llm_prompt_tokens.labels(model, feature).inc(count)
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
