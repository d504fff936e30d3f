"""OpenTelemetry traces (the `otel` extra): a span per query with a child per plan node, a
span per gateway call with a child per attempt, a server span per HTTP request, and W3C trace
context continued from incoming `traceparent` headers and sent on every upstream call.

Off unless asked for. The standard variables turn it on: `OTEL_TRACES_EXPORTER=console` or
`otlp` (comma-separated for both; `none` or `OTEL_SDK_DISABLED=true` keep it off). The SDK
reads the rest itself: `OTEL_SERVICE_NAME` (default here: kairos), `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_TRACES_SAMPLER[_ARG]`, `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` and its headers. Or hand
kairos a tracer provider of your own (an in-memory exporter in tests, your app's provider):

>>> from opentelemetry.sdk.trace import TracerProvider  # doctest: +SKIP
>>> telemetry.configure(TracerProvider())  # doctest: +SKIP

Every hook elsewhere in kairos is one check, `if telemetry.TRACER is None`, so tracing off costs
a module attribute read per hook. No span holds a feature value, a parameter of a SQL
statement, a prompt, an answer, an exception's message or a credential: names, counts,
statuses and timings only.

Importing this module reads no environment: `from_environment()` does, once per process (a
Client and a Gateway call it as they are made). The SDK is imported only when it is used.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, TypeVar

from kairos.errors import KairosError

try:
    from opentelemetry import propagate, trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
except ImportError:  # the plain install: tracing stays off
    API = False
else:
    API = True

T = TypeVar("T")
logger = logging.getLogger(__name__)

INSTALL = "pip install 'kairos-inference[otel]'"
EXPORTERS = ("console", "otlp", "none")
SCOPE = "kairos"  # the instrumentation scope every kairos span is made under

# The tracer kairos' spans come from; None: tracing is off (every hook checks only this).
TRACER: Tracer | None = None
_configured = False  # configure() was called: the environment no longer decides
_read_environment = False


class TelemetryUnavailable(KairosError, RuntimeError):
    """Traces were asked for, but cannot be made as asked (the extra is missing, or an
    exporter kairos does not ship is named)."""


def configure(provider: TracerProvider | None) -> None:
    """Trace kairos with `provider` (any OpenTelemetry TracerProvider), or stop tracing with
    None. Wins over the environment for the rest of the process. kairos never sets the global
    tracer provider: pass `trace.get_tracer_provider()` to join your application's.

    >>> provider = TracerProvider()  # doctest: +SKIP
    >>> provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))  # doctest: +SKIP
    >>> telemetry.configure(provider)  # doctest: +SKIP
    """
    global TRACER, _configured
    _configured = True
    if provider is None:
        TRACER = None
        return
    if not API:
        raise TelemetryUnavailable(f"tracing needs the OpenTelemetry API: {INSTALL}")
    TRACER = provider.get_tracer(SCOPE)


def from_environment() -> bool:
    """Turn tracing on when the OTEL_* variables ask for it; once per process, and never
    after `configure()`. A request kairos cannot meet (the extra missing, an unknown
    exporter) is logged as an error naming the fix, and tracing stays off: observability
    does not stop a server from starting. Returns whether tracing is on."""
    global TRACER, _read_environment
    if _configured or _read_environment:
        return TRACER is not None
    _read_environment = True
    try:
        provider = provider_from_environment()
    except TelemetryUnavailable as error:
        logger.error("tracing is off: %s", error)
        return False
    if provider is not None:
        TRACER = provider.get_tracer(SCOPE)
    return TRACER is not None


def provider_from_environment() -> Any:
    """An SDK TracerProvider exporting where OTEL_TRACES_EXPORTER says (batched), or None
    when tracing is not asked for; TelemetryUnavailable when it cannot be built."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    given = os.environ.get("OTEL_TRACES_EXPORTER", "")
    names = [n.strip().lower() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise TelemetryUnavailable(
            f"OTEL_TRACES_EXPORTER={given!r}: kairos exports traces to console or otlp (or "
            f"none); {unknown[0]!r} is neither"
        )
    names = [n for n in dict.fromkeys(names) if n != "none"]
    if not names:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise TelemetryUnavailable(
            f"OTEL_TRACES_EXPORTER={given!r} asks for traces, but the OpenTelemetry SDK is not "
            f"installed: {INSTALL}"
        ) from None
    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "kairos"}))
    exporters = [_exporter(name) for name in names]
    provider = SDKTracerProvider(resource=resource)  # OTEL_TRACES_SAMPLER[_ARG]
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporter(name: str) -> Any:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(out=sys.stdout)  # the stdout of now, not of its import
    protocol = (
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol != "http/protobuf":
        raise TelemetryUnavailable(
            f"OTLP protocol {protocol!r}: kairos ships the http/protobuf exporter; set "
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (a collector's port 4318)"
        )
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise TelemetryUnavailable(
            f"OTEL_TRACES_EXPORTER=otlp needs the OTLP exporter, which is not installed: {INSTALL}"
        ) from None
    return OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT, _HEADERS, _TIMEOUT


# --- what the hooks call (only ever with TRACER set) ------------------------------------------


def start(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: str = "internal",
    parent: Context | None = None,
) -> Span:
    """A span, child of `parent` (default: the current span), not made current."""
    tracer = TRACER
    if tracer is None:
        return trace.INVALID_SPAN
    span_kind = getattr(SpanKind, kind.upper())  # internal, server or client
    return tracer.start_span(name, context=parent, kind=span_kind, attributes=attributes)


def recording() -> bool:
    """Whether the current span records (a traced, sampled operation is running here)."""
    return trace.get_current_span().is_recording()


def current(span: Span) -> Any:
    """A context manager making `span` the current one (where children and outgoing
    traceparent headers take it from); it does not end the span."""
    return trace.use_span(span, end_on_exit=False, record_exception=False,
                          set_status_on_exception=False)  # fmt: skip


def failed(span: Span, error: BaseException | str) -> None:
    """Mark a span failed: its status and `error.type`, never a message (it may hold data)."""
    kind = error if isinstance(error, str) else _error_type(error)
    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, kind))


def ok(span: Span) -> None:
    span.set_status(Status(StatusCode.OK))


def _error_type(error: BaseException) -> str:
    code = getattr(error, "code", None)
    if isinstance(error, KairosError) and isinstance(code, str):
        return code  # a request error's code: `upstream_error`, `budget_exceeded`
    return type(error).__qualname__


async def traced(
    name: str,
    attributes: Mapping[str, Any] | None,
    work: Awaitable[T],
    finish: Callable[[Span, T], None] | None = None,
    *,
    kind: str = "internal",
) -> T:
    """Await `work` inside a new current span; `finish(span, result)` adds what the result
    says. An exception marks the span failed (its type only) and goes on."""
    span = start(name, attributes, kind=kind)
    with current(span):
        try:
            result = await work
        except BaseException as error:
            failed(span, error)
            span.end()
            raise
        if finish is not None:
            finish(span, result)
    span.end()
    return result


def outgoing(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` plus the current trace context (`traceparent`, `tracestate`, `baggage`)."""
    carrier = dict(headers)
    propagate.inject(carrier)
    return carrier


def incoming(headers: Iterable[tuple[bytes, bytes]]) -> Context:
    """The trace context an ASGI request's headers carry (an empty one when none)."""
    carrier: dict[str, str] = {}
    for name, value in headers:
        key = name.decode("latin-1").lower()
        if key in ("traceparent", "tracestate", "baggage"):
            carrier[key] = value.decode("latin-1")
    return propagate.extract(carrier)


# kairos.http.types' ASGI aliases (that package sits above this module)
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def serve(
    scope: Scope, receive: Receive, send: Send, app: ASGIApp, route: Callable[[Scope], str]
) -> None:
    """Run an ASGI app for one HTTP request inside a server span that continues the request's
    `traceparent`, named `METHOD route` (`route(scope)`: a route template, never a raw path
    with ids in it; "" where no route matches, and the span is named by the method alone)."""
    method = scope.get("method", "GET")
    template = route(scope)  # before the app runs: a router may rewrite the scope
    attributes = {"http.request.method": method, "url.path": scope.get("path", ""),
                  "url.scheme": scope.get("scheme", "http")}  # fmt: skip
    if template:
        attributes["http.route"] = template
    span = start(
        f"{method} {template}" if template else method,  # no route: the method alone
        attributes,
        kind="server",
        parent=incoming(scope.get("headers") or ()),
    )
    status = 0

    async def sending(message: Message) -> None:
        nonlocal status
        if message.get("type") == "http.response.start":
            status = int(message.get("status", 0))
            span.set_attribute("http.response.status_code", status)
        await send(message)

    with current(span):
        try:
            await app(scope, receive, sending)
        except BaseException as error:
            failed(span, error)
            raise
        finally:
            if status >= 500:
                failed(span, str(status))
            span.end()


class ServerSpans:
    """ASGI middleware: `serve()` around every HTTP request of a Starlette app, the route
    template read from the route that matched (`Middleware(ServerSpans)`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if TRACER is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await serve(scope, receive, send, self.app, starlette_route)


def starlette_route(scope: Scope) -> str:
    """The path template of the Starlette route a request matches (mounts included), or ""
    for none: spans are grouped by route, not by every id in a path."""
    for route in getattr(scope.get("app"), "routes", ()):
        template = _matched(route, scope)
        if template is not None:
            return template
    return ""


def _matched(route: Any, scope: Scope) -> str | None:
    try:
        match, child = route.matches(scope)
    except Exception:  # a route that cannot read this scope: not the one
        return None
    if match.name != "FULL":
        return None
    template = str(getattr(route, "path", ""))
    routes = getattr(route, "routes", None)
    if routes:  # a Mount: the route inside it
        inner = {**scope, **child}
        for sub in routes:
            found = _matched(sub, inner)
            if found is not None:
                return template + found
    return template or "/"
