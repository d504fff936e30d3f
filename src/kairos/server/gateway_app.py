"""The gateway's HTTP app, its own deployment (`kairos gateway serve`): OpenAI-compatible
routes, Anthropic's `/v1/messages`, and the admin API. Each handler parses, calls
`kairos.gateway.Gateway`, formats. Errors come in the OpenAI error shape (Anthropic's on
/v1/messages) with a 4xx status naming the field and the fix; never a stack trace, never a
key. The model comes from the JSON body only: query parameters are not read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from kairos.gateway.anthropic import chat_to_message, message_events, messages_to_chat
from kairos.gateway.errors import GatewayError, InvalidRequest, Unauthenticated
from kairos.gateway.gateway import Gateway, Stream
from kairos.gateway.ledger import LedgerRow, summarize

logger = logging.getLogger(__name__)

MAX_BODY = 8 * 1024 * 1024
Handler = Callable[[Request], Awaitable[Response]]
_ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    503: "overloaded_error",
}  # fmt: skip


class _Metrics:
    def __init__(self) -> None:
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

    def observe(self, row: LedgerRow) -> None:
        model = row.model_dispatched or row.model_requested
        self.calls.labels(model, row.provider or "-", row.status).inc()
        if row.tokens_in or row.tokens_out:
            self.tokens.labels(model, "in").inc(row.tokens_in)
            self.tokens.labels(model, "out").inc(row.tokens_out)
            self.cost.labels(model).inc(row.cost_micros)
        if row.ttft_ms is not None:
            self.ttft.labels(model).observe(row.ttft_ms / 1000)


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def openai_error(error: GatewayError) -> Response:
    body = {
        "error": {
            "message": error.message,
            "type": error.kind,
            "param": error.param,
            "code": error.code,
        }
    }
    response = _json(body, error.status)
    if error.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="kairos-gateway"'
    return response


def anthropic_error(error: GatewayError) -> Response:
    kind = _ANTHROPIC_TYPES.get(error.status, "api_error")
    return _json({"type": "error", "error": {"type": kind, "message": error.message}}, error.status)


def presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key") or None


async def read_body(request: Request) -> dict[str, Any]:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise _TooLarge()
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise _TooLarge()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("the body is not valid JSON; send a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", param="body")
    return body


class _TooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"

    def __init__(self) -> None:
        super().__init__(f"the body is over {MAX_BODY} bytes; send a smaller request")


class _SSEResponse(Response):
    """An event stream written straight to the ASGI `send`, one message per batch of frames
    (the last one also ends the response). A client that goes away is reported to the Stream
    (which stops its reader): the gateway then reads the upstream on (bounded) to bill it."""

    def __init__(self, content: AsyncIterator[tuple[bytes, bool]], stream: Stream) -> None:
        super().__init__(
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-request-id": stream.request_id},
        )
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self.content = content
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(self._watch(receive))
        try:
            await send(
                {"type": "http.response.start", "status": self.status_code,
                 "headers": self.raw_headers}
            )  # fmt: skip
            async for body, last in self.content:
                if watcher.done():
                    break
                await send({"type": "http.response.body", "body": body, "more_body": not last})
                if last:
                    break
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (OSError, ClientDisconnect):
            pass  # the client went away; the upstream is read on and billed regardless
        finally:
            watcher.cancel()
            with contextlib.suppress(Exception):
                await self.content.aclose()  # type: ignore[attr-defined]
            if not self.stream.delivered:
                self.stream.client_left()

    async def _watch(self, receive: Receive) -> None:
        """Until the client disconnects; then the stream stops waiting for it."""
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self.stream.delivered:
            self.stream.client_left()


class GatewayServer:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.metrics = _Metrics()
        gateway.observers.append(self.metrics.observe)

    def route(self, name: str, handler: Handler, *, anthropic: bool = False) -> Handler:
        shape = anthropic_error if anthropic else openai_error

        async def wrapped(request: Request) -> Response:
            started = time.perf_counter()
            try:
                response = await handler(request)
            except GatewayError as error:
                response = shape(error)
            except Exception as error:  # never a stack trace (nor a key) to the client
                logger.error("gateway %s failed: %s", name, type(error).__name__)
                response = shape(_Internal(type(error).__name__))
            self.metrics.requests.labels(name, str(response.status_code)).inc()
            self.metrics.latency.labels(name).observe(time.perf_counter() - started)
            return response

        return wrapped

    # --- OpenAI routes ---------------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        key = await self.gateway.authenticate(presented_key(request))
        reply = await self.gateway.chat(key, await read_body(request))
        return self._openai(reply)

    async def completions(self, request: Request) -> Response:
        key = await self.gateway.authenticate(presented_key(request))
        reply = await self.gateway.completion(key, await read_body(request))
        return self._openai(reply)

    async def embeddings(self, request: Request) -> Response:
        key = await self.gateway.authenticate(presented_key(request))
        return _json(await self.gateway.embedding(key, await read_body(request)))

    async def models(self, request: Request) -> Response:
        key = await self.gateway.authenticate(presented_key(request))
        return _json(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "created": 0, "owned_by": "kairos-gateway"}
                    for name in self.gateway.models(key)
                ],
            }
        )

    def _openai(self, reply: dict[str, Any] | Stream) -> Response:
        if not isinstance(reply, Stream):
            return _json(reply)

        return _SSEResponse(reply.frame_batches(), reply)

    # --- Anthropic route -------------------------------------------------------------------

    async def messages(self, request: Request) -> Response:
        key = await self.gateway.authenticate(presented_key(request))
        body = await read_body(request)
        chat = messages_to_chat(body)
        reply = await self.gateway.messages_chat(key, chat)
        if not isinstance(reply, Stream):
            return _json(chat_to_message(reply, body["model"]))
        events = message_events(aiter(reply), body["model"], reply.request_id)
        return _SSEResponse(((event, False) async for event in events), reply)

    # --- admin -----------------------------------------------------------------------------

    def _admin(self, request: Request) -> None:
        expected = self.gateway.config.admin_key
        given = presented_key(request) or ""
        if not expected:
            raise Unauthenticated("the admin API is off: set gateway.admin_key_env to enable it")
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise Unauthenticated("the admin API needs the admin key (gateway keys cannot use it)")

    async def create_key(self, request: Request) -> Response:
        self._admin(request)
        plain, record = await self.gateway.create_key(**await read_body(request))
        return _json({**record.public(), "key": plain}, 201)  # the only time it is shown

    async def list_keys(self, request: Request) -> Response:
        self._admin(request)
        return _json({"keys": [k.public() for k in await self.gateway.list_keys()]})

    async def revoke_key(self, request: Request) -> Response:
        self._admin(request)
        ident = request.path_params["key_id"]
        if not await self.gateway.revoke_key(ident):
            raise _NotFound(f"no active key {ident!r}; GET /admin/keys lists them")
        return _json({"id": ident, "revoked": True})

    async def usage(self, request: Request) -> Response:
        self._admin(request)
        params = request.query_params
        since, until = _time(params.get("since"), "since"), _time(params.get("until"), "until")
        rows = await self.gateway.usage(params.get("key"), since, until)
        body = summarize(rows)
        if params.get("rows") in ("1", "true"):
            body["rows"] = [row.as_dict() for row in rows]
        return _json(body)

    async def healthz(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(
            generate_latest(self.metrics.registry), media_type="text/plain; version=0.0.4"
        )


class _Internal(GatewayError):
    status = 500
    kind = "api_error"
    code = "internal_error"

    def __init__(self, name: str) -> None:
        super().__init__(f"internal error ({name})")


class _NotFound(GatewayError):
    status = 404
    code = "not_found"


def _time(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(
            f'{name} is an ISO 8601 time, e.g. "2026-11-01T00:00:00Z"', param=name
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def create_gateway_app(gateway: Gateway, *, close_gateway: bool = False) -> Starlette:
    """The ASGI app serving `gateway`; with `close_gateway`, shutdown settles calls in flight,
    writes the ledger and closes the stores."""
    server = GatewayServer(gateway)
    r = server.route
    routes = [
        Route("/v1/chat/completions", r("chat", server.chat), methods=["POST"]),
        Route("/v1/completions", r("completions", server.completions), methods=["POST"]),
        Route("/v1/embeddings", r("embeddings", server.embeddings), methods=["POST"]),
        Route("/v1/models", r("models", server.models), methods=["GET"]),
        Route("/v1/messages", r("messages", server.messages, anthropic=True), methods=["POST"]),
        Route("/admin/keys", r("admin_keys", server.create_key), methods=["POST"]),
        Route("/admin/keys", r("admin_keys", server.list_keys), methods=["GET"]),
        Route("/admin/keys/{key_id}", r("admin_revoke", server.revoke_key), methods=["DELETE"]),
        Route("/admin/usage", r("admin_usage", server.usage), methods=["GET"]),
        Route("/healthz", r("healthz", server.healthz), methods=["GET"]),
        Route("/metrics", r("metrics", server.metrics_endpoint), methods=["GET"]),
    ]

    async def not_found(request: Request, exc: Exception) -> Response:
        return openai_error(_NotFound(f"no route {request.method} {request.url.path}"))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        error = _NotFound(f"{request.method} is not allowed on {request.url.path}")
        error.status = 405
        error.code = "method_not_allowed"
        return openai_error(error)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        if close_gateway:
            await gateway.close()

    app = Starlette(
        routes=routes,
        exception_handlers={404: not_found, 405: not_allowed},
        lifespan=lifespan,
    )
    app.state.gateway = gateway
    return app
