"""The gateway's HTTP edge: what its handlers read of a request and write back. A body is read
once and bounded (MAX_BODY, a 413) and due within the gateway's body_timeout of the head (a
408); a body its handler did not read (a 413, a 401) is read and dropped, up to DRAIN_BYTES and
DRAIN_SECONDS, so the client reads the answer instead of a reset; past that the answer closes
the connection. Errors go out in the OpenAI error shape or Anthropic's; a 429 carries
Retry-After when its limit starts again (the next minute, UTC day or month; a total budget
never does, so it has none). Streams are written straight to the ASGI `send`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl

import orjson

from kairos.gateway.bounds import cut
from kairos.gateway.errors import GatewayError, InvalidRequest
from kairos.gateway.keys import KeyRecord
from kairos.gateway.wire.streams import Stream
from kairos.http.types import Message, Receive, Scope, Send

MAX_BODY = 8 * 1024 * 1024
# a body not read (over MAX_BODY, or refused before reading) is read and dropped up to this
# size and for this long before its answer; past either the answer closes the connection
DRAIN_BYTES = 4 * MAX_BODY
DRAIN_SECONDS = 10.0
MOST_MESSAGE = 2048  # characters of an error message sent back
_ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
    429: "rate_limit_error", 503: "overloaded_error",
}  # fmt: skip


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


def _message(error: GatewayError) -> str:
    """The error's message as sent: a check that quotes a client's text cuts it (bounds.shown),
    and this bounds what one that did not would send back."""
    text = error.message
    return text if len(text) <= MOST_MESSAGE else text[: MOST_MESSAGE - 3] + "..."


def openai_error(error: GatewayError) -> Reply:
    body = {
        "error": {
            "message": _message(error),
            "type": error.kind,
            "param": cut(error.param) if error.param is not None else None,
            "code": error.code,
        }
    }
    headers = _error_headers(error)
    if error.status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="kairos-gateway"'))
    return Reply(orjson.dumps(body), error.status, headers)


def anthropic_error(error: GatewayError) -> Reply:
    kind = _ANTHROPIC_TYPES.get(error.status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": _message(error)}}
    return Reply(orjson.dumps(body), error.status, _error_headers(error))


def _error_headers(error: GatewayError) -> list[tuple[bytes, bytes]]:
    headers = []
    if error.retry_after is not None:  # a 429 of a limit that starts again
        headers.append((b"retry-after", b"%d" % error.retry_after))
    if isinstance(error, TooLarge | BodyTimeout) and error.close:  # body not read to its end
        headers.append((b"connection", b"close"))
    return headers


class ClientGone(Exception):
    """The client disconnected before its request was read: nobody to answer."""


class Request:
    """What a handler reads of an HTTP request: headers (lower-case names), the query string,
    the part of the path after a route's prefix, and the body (read once, size-checked)."""

    __slots__ = ("_receive", "consumed", "headers", "key", "method", "path", "rest", "scope")

    def __init__(self, scope: Scope, receive: Receive, rest: str = "") -> None:
        self.scope = scope
        self._receive = receive
        self.consumed = False  # the body was read to its end (or its reading stopped for good)
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.rest = rest
        self.key: KeyRecord | None = None  # the gateway key, once its route's guard checked it
        self.headers: dict[str, str] = {
            name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
        }

    def query(self) -> dict[str, str]:
        return dict(parse_qsl(self.scope.get("query_string", b"").decode("latin-1")))

    async def body(self) -> bytes:
        self.consumed = True
        declared = self.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY:
            raise TooLarge(close=not await self._drain(0))
        parts: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ClientGone()
            part: bytes = message.get("body", b"")
            more = message.get("more_body", False)
            if not more and not parts:
                if len(part) > MAX_BODY:
                    raise TooLarge(close=False)
                return part  # the usual case: the whole body in one message
            size += len(part)
            if size > MAX_BODY:
                raise TooLarge(close=more and not await self._drain(size))
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
            declared.isascii() and declared.isdigit() and int(declared) > DRAIN_BYTES
        ):
            return False
        with contextlib.suppress(TimeoutError, BodyTimeout):
            async with asyncio.timeout(DRAIN_SECONDS):
                while size <= DRAIN_BYTES:
                    message = await self._receive()
                    if message["type"] == "http.disconnect":
                        raise ClientGone()
                    size += len(message.get("body", b""))
                    if not message.get("more_body", False):
                        return True
        return False


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
        raise InvalidRequest(
            "the body is not valid JSON; send a JSON object", param="body"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", param="body")
    return body


async def admin_body(request: Request) -> dict[str, Any]:
    """An admin body, read by the stdlib's parser: a number too big for 64 bits (and NaN or
    Infinity) then gets a 422 naming its field rather than a 400 for the whole body."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidRequest(
            "the body is not valid JSON; send a JSON object", param="body"
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", param="body")
    return body


class TooLarge(InvalidRequest):
    status = 413
    code = "request_too_large"

    def __init__(self, *, close: bool) -> None:
        super().__init__(f"the body is over {MAX_BODY} bytes; send a smaller request")
        self.close = close  # the body was not read to its end: the connection cannot go on


class BodyTimeout(InvalidRequest):
    status = 408
    code = "request_timeout"
    close = True

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the request body did not arrive within {seconds:g}s; send it at once")


class BodyDeadline:
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
            raise BodyTimeout(self._seconds) from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self._deadline = None
        return message


class SSEReply:
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


async def answer(request: Request, reply: Reply | SSEReply, receive: Receive, send: Send) -> None:
    """Send `reply` once the request is read to its end: a client still sending a body the
    handler did not read (a 401, a 404...) then reads the answer rather than a reset."""
    if not request.consumed:
        try:
            drained = await request.discard()
        except ClientGone:
            return
        if not drained:
            reply.headers.append((b"connection", b"close"))
    await reply(receive, send)


def headless(send: Send) -> Send:
    """`send` for a HEAD request: the status and headers (content-length too), no body."""

    async def headless(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return headless
