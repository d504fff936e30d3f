"""The gateway's HTTP app, its own deployment (`kairos gateway serve`): OpenAI-compatible
routes, Anthropic's `/v1/messages`, and the admin API. Each handler parses, calls
`kairos.gateway.Gateway`, formats. Errors come in the OpenAI error shape (Anthropic's on
/v1/messages) with a 4xx status naming the field and the fix; never a stack trace, never a
key. The model comes from the JSON body only: query parameters are not read.

At the edge: routes match the path with an encoded slash kept encoded (`/admin%2fkeys` is a
404, as a proxy's path rules read it); HEAD answers as GET, without the body; a 429 carries
Retry-After when its limit starts again (the next minute, UTC day or month; a total budget
never does, so it has none); a body its handler did not read (a 413, a 401) is read and
dropped, up to DRAIN_BYTES and DRAIN_SECONDS, so the client reads the answer instead of a
reset; past that the answer closes the connection.

It is a bare ASGI app, not a framework's: a proxy's whole job is to add nothing, and routing
by one dict lookup, reading headers from the scope and writing replies straight to `send`
costs a fraction of a framework's request and response objects and middleware per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from datetime import datetime
from typing import Any
from urllib.parse import parse_qsl, unquote

import orjson
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from kairos.errors import did_you_mean
from kairos.gateway.errors import GatewayError, InvalidRequest, Unauthenticated, UnknownModel
from kairos.gateway.gateway import Gateway
from kairos.gateway.ledger import LedgerRow, period_bound, summarize
from kairos.gateway.messages import chat_to_message, message_events, messages_to_chat
from kairos.gateway.streams import Stream

logger = logging.getLogger(__name__)
SETTLE_AFTER = 0.002  # seconds

MAX_BODY = 8 * 1024 * 1024
# a body not read (over MAX_BODY, or refused before reading) is read and dropped up to this
# size and for this long before its answer; past either the answer closes the connection
DRAIN_BYTES = 4 * MAX_BODY
DRAIN_SECONDS = 10.0
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
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
        child = self._child
        child(self.calls, model, row.provider or "-", row.status).inc()
        if row.tokens_in or row.tokens_out:
            child(self.tokens, model, "in").inc(row.tokens_in)
            child(self.tokens, model, "out").inc(row.tokens_out)
            child(self.cost, model).inc(row.cost_micros)
        if row.ttft_ms is not None:
            child(self.ttft, model).observe(row.ttft_ms / 1000)


class Reply:
    """A whole answer: status, body and extra headers, written with two `send` calls."""

    __slots__ = ("body", "headers", "status")

    def __init__(
        self, body: bytes, status: int = 200, headers: list[tuple[bytes, bytes]] | None = None,
        media_type: bytes = b"application/json",
    ) -> None:  # fmt: skip
        self.body = body
        self.status = status
        self.headers = [
            (b"content-type", media_type), (b"content-length", b"%d" % len(body)),
            *(headers or ()),
        ]  # fmt: skip

    async def __call__(self, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


def _json(body: Any, status: int = 200) -> Reply:
    return Reply(orjson.dumps(body), status)


def openai_error(error: GatewayError) -> Reply:
    body = {
        "error": {
            "message": error.message,
            "type": error.kind,
            "param": error.param,
            "code": error.code,
        }
    }
    headers = _error_headers(error)
    if error.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="kairos-gateway"'))
    return Reply(orjson.dumps(body), error.status, headers)


def anthropic_error(error: GatewayError) -> Reply:
    kind = _ANTHROPIC_TYPES.get(error.status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": error.message}}
    return Reply(orjson.dumps(body), error.status, _error_headers(error))


def _error_headers(error: GatewayError) -> list[tuple[bytes, bytes]]:
    headers = []
    if error.retry_after is not None:  # a 429 of a limit that starts again
        headers.append((b"retry-after", b"%d" % error.retry_after))
    if isinstance(error, _TooLarge | _BodyTimeout) and error.close:  # body not read to its end
        headers.append((b"connection", b"close"))
    return headers


class _ClientGone(Exception):
    """The client disconnected before its request was read: nobody to answer."""


class Request:
    """What a handler reads of an HTTP request: headers (lower-case names), the query string,
    the part of the path after a route's prefix, and the body (read once, size-checked)."""

    __slots__ = ("_receive", "consumed", "headers", "method", "path", "rest", "scope")

    def __init__(self, scope: Scope, receive: Receive, rest: str = "") -> None:
        self.scope = scope
        self._receive = receive
        self.consumed = False  # the body was read to its end (or its reading stopped for good)
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.rest = rest
        self.headers: dict[str, str] = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
        }

    def query(self) -> dict[str, str]:
        return dict(parse_qsl(self.scope.get("query_string", b"").decode("latin-1")))

    async def body(self) -> bytes:
        self.consumed = True
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY:
            raise _TooLarge(close=not await self._drain(0))
        parts: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone()
            part: bytes = message.get("body", b"")
            more = message.get("more_body", False)
            if not more and not parts:
                if len(part) > MAX_BODY:
                    raise _TooLarge(close=False)
                return part  # the usual case: the whole body in one message
            size += len(part)
            if size > MAX_BODY:
                raise _TooLarge(close=more and not await self._drain(size))
            parts.append(part)
            if not more:
                return b"".join(parts)

    async def discard(self) -> bool:
        """Read the body a handler left unread and drop it (see `_drain`); False: the
        answer must close the connection."""
        self.consumed = True
        declared = self.headers.get("content-length", "")
        return await self._drain(0) if declared != "0" else True

    async def _drain(self, size: int) -> bool:
        """Read the rest of the body (`size` bytes read so far) and drop it, so that a
        client still sending reads its answer rather than a reset. Gives up (False) past
        DRAIN_BYTES or DRAIN_SECONDS, or when the client waits for 100-continue (it sent
        nothing yet)."""
        declared = self.headers.get("content-length", "")
        if self.headers.get("expect", "").lower() == "100-continue" or (
            declared.isdigit() and int(declared) > DRAIN_BYTES
        ):
            return False
        with contextlib.suppress(TimeoutError, _BodyTimeout):
            async with asyncio.timeout(DRAIN_SECONDS):
                while size <= DRAIN_BYTES:
                    message = await self._receive()
                    if message["type"] == "http.disconnect":
                        raise _ClientGone()
                    size += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return True
        return False


Handler = Callable[[Request], Awaitable["Reply | _SSEReply"]]


def presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key") or None


async def read_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("the body is not valid JSON; send a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", param="body")
    return body


async def _admin_body(request: Request) -> dict[str, Any]:
    """An admin body, read by the stdlib's parser: a number too big for 64 bits (and NaN or
    Infinity) then gets a 422 naming its field rather than a 400 for the whole body."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidRequest("the body is not valid JSON; send a JSON object") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", param="body")
    return body


class _TooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"

    def __init__(self, *, close: bool) -> None:
        super().__init__(f"the body is over {MAX_BODY} bytes; send a smaller request")
        self.close = close  # the body was not read to its end: the connection cannot go on


class _BodyTimeout(InvalidRequest):
    status = 408
    code = "request_timeout"
    close = True

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the request body did not arrive within {seconds:g}s; send it at once")


class _BodyDeadline:
    """`receive` with the whole request body due within `seconds` of its head: a body sent a
    byte at a time cannot hold a connection (and its handler) for ever."""

    __slots__ = ("_deadline", "_receive", "_seconds")

    def __init__(self, receive: Receive, seconds: float) -> None:
        self._receive = receive
        self._seconds = seconds
        self._deadline: float | None = asyncio.get_running_loop().time() + seconds

    async def __call__(self) -> Message:
        if self._deadline is None:  # the body is in: what is left is waiting for a disconnect
            return await self._receive()
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            raise _BodyTimeout(self._seconds) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._deadline = None
        return message


class _SSEReply:
    """An event stream written straight to the ASGI `send`, one message per batch of frames
    (the last one also ends the response). A client that goes away is reported to the Stream
    (which stops its reader): the gateway then reads the upstream on (bounded) to bill it."""

    status = 200

    def __init__(self, content: AsyncIterator[tuple[bytes, bool]], stream: Stream) -> None:
        self.content = content
        self.stream = stream
        self.headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", stream.request_id.encode()),
        ]

    async def __call__(self, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(self._watch(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            async for body, last in self.content:
                if watcher.done():
                    break
                await send({"type": "http.response.body", "body": body, "more_body": not last})
                if last:
                    break
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
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

    # --- OpenAI routes ---------------------------------------------------------------------

    async def chat(self, request: Request) -> Reply | _SSEReply:
        key = await self.gateway.authenticate(presented_key(request))
        reply = await self.gateway.chat(key, await read_body(request))
        return self._openai(reply)

    async def completions(self, request: Request) -> Reply | _SSEReply:
        key = await self.gateway.authenticate(presented_key(request))
        reply = await self.gateway.completion(key, await read_body(request))
        return self._openai(reply)

    async def responses(self, request: Request) -> Reply | _SSEReply:
        key = await self.gateway.authenticate(presented_key(request))
        reply = await self.gateway.responses(key, await read_body(request))
        return self._openai(reply)

    async def embeddings(self, request: Request) -> Reply:
        key = await self.gateway.authenticate(presented_key(request))
        return _json(await self.gateway.embedding(key, await read_body(request)))

    async def models(self, request: Request) -> Reply:
        key = await self.gateway.authenticate(presented_key(request))
        return _json(
            {"object": "list", "data": [_model_object(name) for name in self.gateway.models(key)]}
        )

    async def model(self, request: Request) -> Reply:
        key = await self.gateway.authenticate(presented_key(request))
        name, allowed = request.rest, self.gateway.models(key)
        # a model the key may not use answers as a missing one: names cannot be probed
        if name not in allowed:
            raise UnknownModel(
                f"no model {name!r} for this key{did_you_mean(name, allowed)}; "
                "GET /v1/models lists the models it may use",
                param="model",
            )
        return _json(_model_object(name))

    def _openai(self, reply: dict[str, Any] | Stream) -> Reply | _SSEReply:
        if not isinstance(reply, Stream):
            return _json(reply)
        return _SSEReply(reply.frame_batches(), reply)

    # --- Anthropic route -------------------------------------------------------------------

    async def messages(self, request: Request) -> Reply | _SSEReply:
        key = await self.gateway.authenticate(presented_key(request))
        body = await read_body(request)
        chat = messages_to_chat(body)
        reply = await self.gateway.messages_chat(key, chat)
        if not isinstance(reply, Stream):
            return _json(chat_to_message(reply, body["model"]))
        events = message_events(aiter(reply), body["model"], reply.request_id)
        return _SSEReply(((event, False) async for event in events), reply)

    async def count_tokens(self, request: Request) -> Reply:
        key = await self.gateway.authenticate(presented_key(request))
        tokens = await self.gateway.count_tokens(key, await read_body(request))
        return _json({"input_tokens": tokens})

    # --- admin -----------------------------------------------------------------------------

    def _admin(self, request: Request) -> None:
        expected = self.gateway.config.admin_key
        given = presented_key(request) or ""
        if not expected:
            raise Unauthenticated("the admin API is off: set gateway.admin_key_env to enable it")
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise Unauthenticated("the admin API needs the admin key (gateway keys cannot use it)")

    async def create_key(self, request: Request) -> Reply:
        self._admin(request)
        plain, record = await self.gateway.create_key(**await _admin_body(request))
        return _json({**record.public(), "key": plain}, 201)  # the only time it is shown

    async def list_keys(self, request: Request) -> Reply:
        self._admin(request)
        return _json({"keys": [k.public() for k in await self.gateway.list_keys()]})

    async def revoke_key(self, request: Request) -> Reply:
        self._admin(request)
        ident = request.rest
        if not await self.gateway.revoke_key(ident):
            raise _NotFound(f"no active key {ident!r}; GET /admin/keys lists them")
        return _json({"id": ident, "revoked": True})

    async def usage(self, request: Request) -> Reply:
        self._admin(request)
        params = request.query()
        since, until = _time(params.get("since"), "since"), _time(params.get("until"), "until")
        rows = await self.gateway.usage(params.get("key"), since, until)
        body = summarize(rows)
        if params.get("rows") in ("1", "true"):
            body["rows"] = [row.as_dict() for row in rows]
        return _json(body)

    async def healthz(self, request: Request) -> Reply:
        return _json({"status": "ok"})

    async def metrics_endpoint(self, request: Request) -> Reply:
        return Reply(
            generate_latest(self.metrics.registry), media_type=b"text/plain; version=0.0.4"
        )


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


class _Route:
    __slots__ = ("anthropic", "handler", "name")

    def __init__(self, name: str, handler: Handler, anthropic: bool = False) -> None:
        self.name = name
        self.handler = handler
        self.anthropic = anthropic


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
        self.routes: dict[str, dict[str, _Route]] = {
            "/v1/chat/completions": {"POST": _Route("chat", server.chat)},
            "/v1/completions": {"POST": _Route("completions", server.completions)},
            "/v1/embeddings": {"POST": _Route("embeddings", server.embeddings)},
            "/v1/responses": {"POST": _Route("responses", server.responses)},
            "/v1/models": {"GET": _Route("models", server.models)},
            "/v1/messages": {"POST": _Route("messages", server.messages, anthropic=True)},
            "/v1/messages/count_tokens": {
                "POST": _Route("count_tokens", server.count_tokens, anthropic=True)
            },
            "/admin/keys": {
                "POST": _Route("admin_keys", server.create_key),
                "GET": _Route("admin_keys", server.list_keys),
            },
            "/admin/usage": {"GET": _Route("admin_usage", server.usage)},
            "/healthz": {"GET": _Route("healthz", server.healthz)},
            "/metrics": {"GET": _Route("metrics", server.metrics_endpoint)},
        }
        self.revoke = {"DELETE": _Route("admin_revoke", server.revoke_key)}
        self.model = {"GET": _Route("model", server.model)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        receive = _BodyDeadline(receive, self.gateway.config.body_timeout)
        path: str = scope["path"]
        # routes match `target`; a route's rest is read from `path` (the same up to there)
        target = _route_target(path, scope.get("raw_path"))
        if scope["method"] == "HEAD":
            send = _headless(send)
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
                await _answer(Request(scope, receive), openai_error(missing), receive, send)
                return
        route = methods.get(scope["method"])
        if route is None and scope["method"] == "HEAD":
            route = methods.get("GET")  # HEAD answers as GET does, without the body
        request = Request(scope, receive, rest)
        if route is None:
            error = _NotAllowed(f"{scope['method']} is not allowed on {path}")
            await _answer(request, openai_error(error), receive, send)
            return
        try:
            reply = await route.handler(request)
        except GatewayError as error:
            reply = (anthropic_error if route.anthropic else openai_error)(error)
        except _ClientGone:
            return
        except Exception as error:  # never a stack trace (nor a key) to the client
            logger.error("gateway %s failed: %s", route.name, type(error).__name__)
            reply = (anthropic_error if route.anthropic else openai_error)(
                _Internal(type(error).__name__)
            )
        self.server.metrics.answered(route.name, reply.status, time.perf_counter() - started)
        await _answer(request, reply, receive, send)

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


async def _answer(request: Request, reply: Reply | _SSEReply, receive: Receive, send: Send) -> None:
    """Send `reply` once the request is read to its end: a client still sending a body the
    handler did not read (a 401, a 404...) then reads the answer rather than a reset."""
    if not request.consumed:
        try:
            drained = await request.discard()
        except _ClientGone:
            return
        if not drained:
            reply.headers.append((b"connection", b"close"))
    await reply(receive, send)


def _route_target(path: str, raw_path: bytes | None) -> str:
    """The path routes match: `path` (decoded), but an encoded slash stays encoded. It
    separates no segments, as a proxy's path rules in front read it: `/admin%2fkeys` is not
    the admin API."""
    raw = (raw_path or b"").partition(b"?")[0]
    if b"%2f" not in raw and b"%2F" not in raw:
        return path
    return "%2F".join(unquote(part) for part in re.split("%2[fF]", raw.decode("latin-1")))


def _headless(send: Send) -> Send:
    """`send` for a HEAD request: the status and headers (content-length too), no body."""

    async def headless(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return headless


def create_gateway_app(gateway: Gateway, *, close_gateway: bool = False) -> GatewayApp:
    """The ASGI app serving `gateway`; with `close_gateway`, shutdown settles calls in flight,
    writes the ledger and closes the stores."""
    return GatewayApp(gateway, close_gateway=close_gateway)
