"""The gateway's Prometheus metrics (`GET /metrics`): requests and their latency by route,
and calls, tokens, cost and time to first byte by model, from the ledger rows the gateway
writes (`Gateway.observers`). A call refused before it was routed is counted by the model it
asked for when the gateway serves one by that name, else as `(unknown)`: a client cannot add
a time series per name it makes up."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from kairos.gateway.accounting.ledger import LedgerRow

UNKNOWN_MODEL = "(unknown)"


class GatewayMetrics:
    """One registry per app, so two apps in a process count apart."""

    def __init__(self, models: Collection[str] = ()) -> None:
        self.models = frozenset(models)  # the model groups and aliases served
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "kairos_gateway_requests", "Gateway requests", ["route", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.latency = Histogram(
            "kairos_gateway_latency_seconds", "Time to the answer's headers", ["route"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )  # fmt: skip
        self.calls = Counter(
            "kairos_gateway_calls", "Calls by model group, provider and status",
            ["model", "provider", "status"], registry=self.registry,
        )  # fmt: skip
        self.tokens = Counter(
            "kairos_gateway_tokens", "Tokens billed", ["model", "direction"],
            registry=self.registry,
        )  # fmt: skip
        self.cost = Counter(
            "kairos_gateway_cost_micros", "Micro-dollars billed", ["model"],
            registry=self.registry,
        )  # fmt: skip
        self.ttft = Histogram(
            "kairos_gateway_ttft_seconds", "Time to the provider's first byte", ["model"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=self.registry,
        )  # fmt: skip

        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        """A metric's child for `labels`, looked up once (prometheus' own lookup takes a lock
        and checks every label on every call)."""
        child = self._children.get((metric, *labels))
        if child is None:
            child = self._children[(metric, *labels)] = metric.labels(*labels)
        return child

    def answered(self, route: str, status: int, seconds: float) -> None:
        self._child(self.requests, route, str(status)).inc()
        self._child(self.latency, route).observe(seconds)

    def observe(self, row: LedgerRow) -> None:
        model = row.model_dispatched or row.model_requested
        if row.model_dispatched is None and model not in self.models:
            model = UNKNOWN_MODEL
        child = self._child
        child(self.calls, model, row.provider or "-", row.status).inc()
        if row.tokens_in or row.tokens_out:
            child(self.tokens, model, "in").inc(row.tokens_in)
            child(self.tokens, model, "out").inc(row.tokens_out)
            child(self.cost, model).inc(row.cost_micros)
        if row.ttft_ms is not None:
            child(self.ttft, model).observe(row.ttft_ms / 1000)
