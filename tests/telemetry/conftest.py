"""Fixtures of the tracing tests: kairos traced into the SDK's in-memory exporter for one
test (the tracer kairos had before is put back after it; no global tracer provider is ever
set), and span helpers that read the finished spans by name and by parent."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from kairos import telemetry
from tests.gateway.fake_upstream import ServerThread


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    before = (telemetry.TRACER, telemetry._configured)
    telemetry.configure(provider)
    try:
        yield exporter
    finally:
        telemetry.TRACER, telemetry._configured = before
        provider.shutdown()


def named(exporter: InMemorySpanExporter, prefix: str) -> list[ReadableSpan]:
    """The finished spans whose name starts with `prefix`, in the order they started."""
    found = [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]
    return sorted(found, key=lambda s: s.start_time or 0)


def one(exporter: InMemorySpanExporter, prefix: str) -> ReadableSpan:
    found = named(exporter, prefix)
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


def children(exporter: InMemorySpanExporter, parent: ReadableSpan) -> list[ReadableSpan]:
    """The finished spans whose parent is `parent` (same trace), in the order they started."""
    context = parent.context
    found = [
        s
        for s in exporter.get_finished_spans()
        if s.parent is not None
        and s.parent.span_id == context.span_id
        and s.context is not None
        and s.context.trace_id == context.trace_id
    ]
    return sorted(found, key=lambda s: s.start_time or 0)


def wait_for(exporter: InMemorySpanExporter, prefix: str, timeout: float = 5.0) -> ReadableSpan:
    """The one span named `prefix...`, waiting for it: a server's span ends after it sent its
    answer, in the server's thread."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = named(exporter, prefix)
        if found:
            return one(exporter, prefix)
        time.sleep(0.01)
    raise AssertionError(f"no span {prefix!r}: {[s.name for s in exporter.get_finished_spans()]}")


def attribute_values(found: Sequence[ReadableSpan]) -> list[str]:
    """Every attribute value of these spans, as text (to look for what must not be there)."""
    return [str(v) for s in found for v in (s.attributes or {}).values()]


@dataclass
class Collector:
    """An OTLP/HTTP collector on a real port: (content type, body) of each POST /v1/traces."""

    url: str = ""
    received: list[tuple[str, bytes]] = field(default_factory=list)

    def spans(self) -> list[Span]:
        """Every span exported to it so far."""
        found = []
        for _, body in self.received:
            for resource in ExportTraceServiceRequest.FromString(body).resource_spans:
                for scope in resource.scope_spans:
                    found += list(scope.spans)
        return found


@pytest.fixture
def collector() -> Iterator[Collector]:
    found = Collector()

    async def traces(request: Request) -> Response:
        found.received.append((request.headers.get("content-type", ""), await request.body()))
        return Response(b"", 200, media_type="application/x-protobuf")

    app = Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])
    with ServerThread(app) as server:
        found.url = server.url
        yield found
