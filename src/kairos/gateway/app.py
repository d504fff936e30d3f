"""The gateway's HTTP app, its own deployment (`kairos gateway serve`): OpenAI-compatible
routes, Anthropic's `/v1/messages`, and the admin API. Each handler parses, calls
`kairos.gateway.Gateway`, formats. Errors come in the OpenAI error shape (Anthropic's on
/v1/messages) with a 4xx status naming the field and the fix; never a stack trace, never a
key. The model comes from the JSON body only: query parameters are not read. What a handler
reads of a request and writes back (bounds, draining, error shapes, streams) is edge.py; the
Prometheus metrics are metrics.py; `GET /openapi.json` serves openapi.py's document.

At the edge: routes match the path with an encoded slash kept encoded (`/admin%2fkeys` is a
404, as a proxy's path rules read it); HEAD answers as GET, without the body; an exception out
of a handler is answered by the handler its class maps to in EXCEPTION_HANDLERS (as
starlette's `exception_handlers` are).

It is a bare ASGI app, not a framework's: a proxy's whole job is to add nothing, and routing
by one dict lookup, reading headers from the scope and writing replies straight to `send`
costs a fraction of a framework's request and response objects and middleware per call.
"""

from __future__ import annotations

import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, cast
from urllib.parse import unquote

import orjson
from prometheus_client import generate_latest

from kairos import telemetry
from kairos.errors import did_you_mean
from kairos.gateway.accounting.ledger import period_bound, summarize
from kairos.gateway.bounds import shown
from kairos.gateway.edge import (
    BodyDeadline,
    ClientGone,
    Reply,
    Request,
    SSEReply,
    admin_body,
    answer,
    anthropic_error,
    headless,
    openai_error,
    presented_key,
    read_body,
)
from kairos.gateway.errors import GatewayError, InvalidRequest, Unauthenticated, UnknownModel
from kairos.gateway.gateway import Gateway
from kairos.gateway.keys import KeyRecord
from kairos.gateway.metrics import GatewayMetrics
from kairos.gateway.openapi import openapi_document
from kairos.gateway.wire.messages import chat_to_message, message_events, messages_to_chat
from kairos.gateway.wire.streams import Stream
from kairos.http.access import log_access
from kairos.http.types import Receive, Scope, Send

logger = logging.getLogger(__name__)
SETTLE_AFTER = 0.002  # seconds

Handler = Callable[[Request], Awaitable[Reply | SSEReply]]
Guard = Callable[[Request], Awaitable[None]]  # raises Unauthenticated, or lets the request in


def _json(body: Any, status: int = 200) -> Reply:
    return Reply(orjson.dumps(body), status)


class GatewayServer:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.metrics = GatewayMetrics([*gateway.config.models, *gateway.config.aliases])
        self._openapi = orjson.dumps(openapi_document())
        gateway.observers.append(self.metrics.observe)

    # --- OpenAI routes ---------------------------------------------------------------------

    async def chat(self, request: Request) -> Reply | SSEReply:
        reply = await self.gateway.chat(_key(request), await read_body(request))
        return self._openai(reply)

    async def completions(self, request: Request) -> Reply | SSEReply:
        reply = await self.gateway.completion(_key(request), await read_body(request))
        return self._openai(reply)

    async def responses(self, request: Request) -> Reply | SSEReply:
        reply = await self.gateway.responses(_key(request), await read_body(request))
        return self._openai(reply)

    async def embeddings(self, request: Request) -> Reply:
        return _json(await self.gateway.embedding(_key(request), await read_body(request)))

    async def models(self, request: Request) -> Reply:
        names = self.gateway.models(_key(request))
        return _json({"object": "list", "data": [_model_object(name) for name in names]})

    async def model(self, request: Request) -> Reply:
        name, allowed = request.rest, self.gateway.models(_key(request))
        # a model the key may not use answers as a missing one: names cannot be probed
        if name not in allowed:
            raise UnknownModel(
                f"no model {shown(name)} for this key{did_you_mean(name, allowed)}; "
                "GET /v1/models lists the models it may use",
                param="model",
            )
        return _json(_model_object(name))

    def _openai(self, reply: dict[str, Any] | Stream) -> Reply | SSEReply:
        if not isinstance(reply, Stream):
            return _json(reply)
        return SSEReply(reply.frame_batches(), reply)

    # --- Anthropic route -------------------------------------------------------------------

    async def messages(self, request: Request) -> Reply | SSEReply:
        body = await read_body(request)
        chat = messages_to_chat(body)
        reply = await self.gateway.messages_chat(_key(request), chat)
        if not isinstance(reply, Stream):
            return _json(chat_to_message(reply, body["model"]))
        events = message_events(aiter(reply), body["model"], reply.request_id)
        return SSEReply(((event, False) async for event in events), reply)

    async def count_tokens(self, request: Request) -> Reply:
        tokens = await self.gateway.count_tokens(_key(request), await read_body(request))
        return _json({"input_tokens": tokens})

    # --- the guards, composed around the route table by GatewayApp ---------------------------

    async def gateway_key(self, request: Request) -> None:
        """A /v1 route's guard: the request's gateway key, checked, on `request.key`."""
        request.key = await self.gateway.authenticate(presented_key(request))

    async def admin_key(self, request: Request) -> None:
        """An /admin route's guard: the admin key (gateway keys cannot use it)."""
        expected = self.gateway.config.admin_key
        given = presented_key(request) or ""
        if not expected:
            raise Unauthenticated("the admin API is off: set gateway.admin_key_env to enable it")
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise Unauthenticated("the admin API needs the admin key (gateway keys cannot use it)")

    async def create_key(self, request: Request) -> Reply:
        plain, record = await self.gateway.create_key(**await admin_body(request))
        return _json({**record.public(), "key": plain}, 201)  # the only time it is shown

    async def list_keys(self, request: Request) -> Reply:
        return _json({"keys": [k.public() for k in await self.gateway.list_keys()]})

    async def revoke_key(self, request: Request) -> Reply:
        ident = request.rest
        if not await self.gateway.revoke_key(ident):
            raise _NotFound(f"no active key {shown(ident)}; GET /admin/keys lists them")
        return _json({"id": ident, "revoked": True})

    async def usage(self, request: Request) -> Reply:
        params = request.query()
        since, until = _time(params.get("since"), "since"), _time(params.get("until"), "until")
        rows = await self.gateway.usage(params.get("key"), since, until)
        body = summarize(rows)
        if params.get("rows") in ("1", "true"):
            body["rows"] = [row.as_dict() for row in rows]
        return _json(body)

    async def healthz(self, request: Request) -> Reply:
        return _json({"status": "ok"})

    async def openapi(self, request: Request) -> Reply:
        return Reply(self._openapi)

    async def metrics_endpoint(self, request: Request) -> Reply:
        return Reply(
            generate_latest(self.metrics.registry), media_type=b"text/plain; version=0.0.4"
        )


def _key(request: Request) -> KeyRecord:
    """The key a guarded route's request was checked with (by `GatewayServer.gateway_key`)."""
    if request.key is None:  # a /v1 route left out of the guarded table: a bug, a 500
        raise RuntimeError(f"no gateway key checked for {request.path}")
    return request.key


def _model_object(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "kairos-gateway"}


class _Internal(GatewayError):
    status = 500
    kind = "api_error"
    code = "internal_error"

    def __init__(self, name: str) -> None:
        super().__init__(f"internal error ({name})")


class _NotFound(GatewayError):
    status = 404
    code = "not_found"


class _NotAllowed(GatewayError):
    status = 405
    code = "method_not_allowed"


def _time(value: str | None, name: str) -> datetime | None:
    try:
        return period_bound(value)
    except ValueError:
        raise InvalidRequest(
            f'{name} is an ISO 8601 time, e.g. "2026-11-01T00:00:00Z"', param=name
        ) from None


def _as_raised(route: str, error: Exception) -> GatewayError | None:
    """A gateway error answers as it is: its status, message and headers."""
    return cast(GatewayError, error)  # the handler of GatewayError and its subclasses only


def _unanswered(route: str, error: Exception) -> GatewayError | None:
    """The client left before its request was read: nobody to answer."""
    return None


def _internal(route: str, error: Exception) -> GatewayError | None:
    """A handler's own bug: a 500 naming the exception's class, never a stack trace (nor a
    key) to the client."""
    logger.error("gateway %s failed: %s", route, type(error).__name__)
    return _Internal(type(error).__name__)


# what an exception out of a handler answers, found along its class's MRO (as starlette's
# `exception_handlers` are): the error to send in the route's shape, or None for no answer
ExceptionHandler = Callable[[str, Exception], GatewayError | None]
EXCEPTION_HANDLERS: dict[type[Exception], ExceptionHandler] = {
    GatewayError: _as_raised,
    ClientGone: _unanswered,
    Exception: _internal,
}


def _exception_handler(error: Exception) -> ExceptionHandler:
    for cls in type(error).__mro__:
        handler = EXCEPTION_HANDLERS.get(cls)
        if handler is not None:
            return handler
    return _internal  # not reached: every exception is an Exception


class _Route:
    """A handler, its name in the metrics and the shape its errors are sent in (OpenAI's,
    or Anthropic's on /v1/messages)."""

    __slots__ = ("errors", "guard", "handler", "name")

    def __init__(
        self, name: str, handler: Handler, errors: Callable[[GatewayError], Reply] = openai_error
    ) -> None:
        self.name = name
        self.handler = handler
        self.errors = errors
        self.guard: Guard | None = None  # set by `_guarded`, around the route table


Routes = dict[str, dict[str, _Route]]


def _guarded(guard: Guard, routes: Routes) -> Routes:
    """`routes`, each checked by `guard` before its handler runs (a 401 in the route's own
    error shape when it refuses), as a Starlette middleware wraps the routes it is given."""
    for methods in routes.values():
        for route in methods.values():
            route.guard = guard
    return routes


class GatewayApp:
    """The ASGI app: exact paths in one dict, `/admin/keys/{id}` and `/v1/models/{id}` by their
    prefixes; lifespan shutdown settles calls in flight, writes the ledger and closes the
    stores (with `close_gateway`)."""

    def __init__(self, gateway: Gateway, *, close_gateway: bool = False) -> None:
        self.gateway = gateway
        # an answer's settling waits this long after its last byte: a client's next request
        # on the same connection is read and sent upstream first
        gateway.settle_after = SETTLE_AFTER
        self.server = server = GatewayServer(gateway)
        self.close_gateway = close_gateway
        # authentication, once around the table: gateway keys on /v1, the admin key on /admin
        v1, admin = server.gateway_key, server.admin_key
        self.routes: Routes = {
            **_guarded(
                v1,
                {
                    "/v1/chat/completions": {"POST": _Route("chat", server.chat)},
                    "/v1/completions": {"POST": _Route("completions", server.completions)},
                    "/v1/embeddings": {"POST": _Route("embeddings", server.embeddings)},
                    "/v1/responses": {"POST": _Route("responses", server.responses)},
                    "/v1/models": {"GET": _Route("models", server.models)},
                    "/v1/messages": {"POST": _Route("messages", server.messages, anthropic_error)},
                    "/v1/messages/count_tokens": {
                        "POST": _Route("count_tokens", server.count_tokens, anthropic_error)
                    },
                },
            ),
            **_guarded(
                admin,
                {
                    "/admin/keys": {
                        "POST": _Route("admin_keys", server.create_key),
                        "GET": _Route("admin_keys", server.list_keys),
                    },
                    "/admin/usage": {"GET": _Route("admin_usage", server.usage)},
                },
            ),
            "/healthz": {"GET": _Route("healthz", server.healthz)},
            "/openapi.json": {"GET": _Route("openapi", server.openapi)},
            "/metrics": {"GET": _Route("metrics", server.metrics_endpoint)},
        }
        # the routes with an id in their path, matched by prefix
        by_prefix = {
            **_guarded(
                admin, {"/admin/keys/": {"DELETE": _Route("admin_revoke", server.revoke_key)}}
            ),
            **_guarded(v1, {"/v1/models/": {"GET": _Route("model", server.model)}}),
        }
        self.revoke, self.model = by_prefix["/admin/keys/"], by_prefix["/v1/models/"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if telemetry.TRACER is None:
                await self._http(scope, receive, send)
            else:  # a server span continuing the request's `traceparent`
                await telemetry.serve(scope, receive, send, self._http, self._span_route)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        receive = BodyDeadline(receive, self.gateway.config.body_timeout)
        path: str = scope["path"]
        # routes match `target`; a route's rest is read from `path` (the same up to there)
        target = _route_target(path, scope.get("raw_path"))
        if scope["method"] == "HEAD":
            send = headless(send)
        methods = self.routes.get(target)
        rest = ""
        if methods is None:
            if target.startswith("/admin/keys/") and "/" not in target[12:] and target[12:]:
                methods, rest = self.revoke, path[12:]
            elif target.startswith("/v1/models/") and target[11:].strip("/"):
                # model names may hold slashes ("org/model"), sent encoded or not
                methods, rest = self.model, path[11:]
            elif target.endswith("/") and target.rstrip("/") in self.routes:
                methods = self.routes[target.rstrip("/")]
            else:
                missing = _NotFound(f"no route {scope['method']} {target}")
                log_access(scope["method"], path, 404, time.perf_counter() - started)
                await answer(Request(scope, receive), openai_error(missing), receive, send)
                return
        route = methods.get(scope["method"])
        if route is None and scope["method"] == "HEAD":
            route = methods.get("GET")  # HEAD answers as GET does, without the body
        request = Request(scope, receive, rest)
        if route is None:
            error = _NotAllowed(f"{scope['method']} is not allowed on {path}")
            log_access(scope["method"], path, 405, time.perf_counter() - started)
            shape = next(iter(methods.values())).errors  # the path's own (Anthropic's too)
            await answer(request, shape(error), receive, send)
            return
        try:
            if route.guard is not None:
                await route.guard(request)
            reply = await route.handler(request)
        except Exception as error:
            failure = _exception_handler(error)(route.name, error)
            if failure is None:
                return
            reply = route.errors(failure)
        seconds = time.perf_counter() - started
        self.server.metrics.answered(route.name, reply.status, seconds)
        log_access(scope["method"], path, reply.status, seconds)
        await answer(request, reply, receive, send)

    def _span_route(self, scope: Scope) -> str:
        """The route a request's span is named by: its path where that is a route, the
        template of a route with an id in it, else "" (never a raw unknown path)."""
        path: str = scope["path"]
        if path in self.routes or path.rstrip("/") in self.routes:
            return path.rstrip("/") or "/"
        if path.startswith("/admin/keys/"):
            return "/admin/keys/{id}"
        if path.startswith("/v1/models/"):
            return "/v1/models/{model}"
        return ""

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:  # recovers the calls of gateway processes that died
                    await self.gateway.start()
                except GatewayError as error:  # the first call tries again
                    logger.error("gateway start failed: %s", error.message)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    if self.close_gateway:
                        await self.gateway.close()
                except Exception as error:
                    logger.error("gateway shutdown failed: %s", type(error).__name__)
                    await send({"type": "lifespan.shutdown.failed", "message": str(error)})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                return


def _route_target(path: str, raw_path: bytes | None) -> str:
    """The path routes match: `path` (decoded), but an encoded slash stays encoded. It
    separates no segments, as a proxy's path rules in front read it: `/admin%2fkeys` is not
    the admin API."""
    raw = (raw_path or b"").partition(b"?")[0]
    if b"%2f" not in raw and b"%2F" not in raw:
        return path
    return "%2F".join(unquote(part) for part in re.split("%2[fF]", raw.decode("latin-1")))


def create_gateway_app(gateway: Gateway, *, close_gateway: bool = False) -> GatewayApp:
    """The ASGI app serving `gateway`; with `close_gateway`, shutdown settles calls in flight,
    writes the ledger and closes the stores."""
    return GatewayApp(gateway, close_gateway=close_gateway)
