"""A small HTTP/1.1 server for ASGI apps, used by the gateway (`kairos gateway serve`).

A proxy's added latency is what it does per request, and on a small machine a general
server's bookkeeping is a large part of it: uvicorn writes a response's head and body with
two system calls (two packets for the client to wake up to), arms a keep-alive timer per
request and checks every header with two regular expressions. This server does what the
gateway needs and nothing else: httptools parses, one task runs the app per request, the
response's head goes out in the same write as its first body bytes, requests pipelined on a
connection are answered in order, writes wait while the client is not reading, idle
connections close after `keep_alive` seconds. SIGINT/SIGTERM stop it: no new connections,
requests in flight get `grace` seconds, then the app's lifespan shutdown runs.

A request line is `METHOD SP /path SP HTTP/1.x`, single spaces, the target in origin-form (or
`OPTIONS *`); anything else is a 400 and a close. httptools takes runs of spaces and an
absolute-form target (a request meant for a proxy, whose host the app would never see), and
it tells no offsets, so the server checks each request line itself: httptools is fed a request
line, then the rest of its head, then a Content-Length body whole (a chunked one a line at a
time), so that every request begins where a piece fed to it does.

Any ASGI server runs the same app (the tests run it under this one; uvicorn works too).

>>> serve(app, "127.0.0.1", 8080)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
from collections import deque
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import unquote

import httptools

from kairos.errors import KairosError
from kairos.http.types import ASGIApp, Message, Scope

logger = logging.getLogger(__name__)

MAX_HEAD = 64 * 1024  # bytes of request line and headers
MAX_BUFFERED = 256 * 1024  # request body bytes held before reading pauses for the app
# origin-form (or OPTIONS' asterisk-form) between single spaces; httptools checks the rest
_REQUEST_LINE = re.compile(rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+ /[^ ]*|OPTIONS \*) HTTP/\d\.\d\r\n")
_BAD_LINE = (
    b"malformed request line: send METHOD SP /path SP HTTP/1.1 (single spaces, no scheme or host)"
)
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_STATUS = {
    status.value: f"HTTP/1.1 {status.value} {status.phrase}\r\n".encode() for status in HTTPStatus
}


class _Cycle:
    """One request and its response."""

    __slots__ = (
        "body", "chunked", "complete", "connection", "continue_pending", "head", "keep_alive",
        "more", "remaining", "response_complete", "response_started", "scope", "waiters",
    )  # fmt: skip

    def __init__(self, connection: _Connection, scope: Scope, keep_alive: bool) -> None:
        self.connection = connection
        self.scope = scope
        self.keep_alive = keep_alive
        self.body: list[bytes] = []
        self.complete = False  # the whole request body arrived
        self.more = True
        self.waiters: list[asyncio.Future[None]] = []
        self.response_started = False
        self.response_complete = False
        self.head = b""  # the response's head, sent with the first body bytes
        self.chunked = False
        self.remaining = 0  # content-length bytes still to send
        self.continue_pending = False

    def wake(self) -> None:
        if self.waiters:
            for waiter in self.waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self.waiters = []

    async def receive(self) -> Message:
        connection = self.connection
        if self.continue_pending and not connection.closed:
            self.continue_pending = False
            connection.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        while not (self.body or self.complete) and not connection.closed:
            connection.resume_reading()
            await self._wait()
        if self.body or (self.complete and self.more):
            data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
            self.body = []
            self.more = not self.complete
            return {"type": "http.request", "body": data, "more_body": self.more}
        # the body was read: what is left to wait for is the client leaving
        while not connection.closed and not self.response_complete:
            await self._wait()
        return {"type": "http.disconnect"}

    async def _wait(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        await waiter

    async def send(self, message: Message) -> None:
        connection = self.connection
        if connection.write_paused and not connection.closed:
            await connection.drain()
        if connection.closed:
            return
        kind = message["type"]
        if not self.response_started:
            if kind != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {kind}")
            self.response_started = True
            self.continue_pending = False
            self.head = self._head(message)
            return
        if kind != "http.response.body" or self.response_complete:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        body: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        if self.scope["method"] == "HEAD":
            data = b""
        elif self.chunked:
            data = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            if not more:
                data += b"0\r\n\r\n"
        else:
            if self.remaining >= 0:  # -1: no length, the body ends when the connection does
                if len(body) > self.remaining:
                    raise RuntimeError("the response body is longer than its content-length")
                self.remaining -= len(body)
            data = body
        if self.head:
            data, self.head = self.head + data, b""
        if data:
            connection.write(data)
        if not more:
            if self.remaining > 0 and self.scope["method"] != "HEAD":
                raise RuntimeError("the response body is shorter than its content-length")
            self.response_complete = True
            self.wake()
            connection.finished(self)

    def _head(self, message: Message) -> bytes:
        status = int(message["status"])
        line = _STATUS.get(status) or f"HTTP/1.1 {status} Unknown\r\n".encode()
        parts = [line]
        length: int | None = None
        for name, value in message.get("headers", ()):
            lowered = name.lower()
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
                raise RuntimeError("a response header holds a line break")
            if lowered == b"content-length":
                length = int(value)
            elif lowered == b"connection" and b"close" in value.lower():
                self.keep_alive = False
                continue
            parts += (name, b": ", value, b"\r\n")
        no_body = self.scope["method"] == "HEAD" or status in (204, 304) or status < 200
        if length is not None:
            self.remaining = 0 if no_body else length
        elif no_body:
            pass
        elif self.scope["http_version"] == "1.0":
            self.keep_alive = False  # no chunked encoding in HTTP/1.0: the close ends the body
            self.remaining = -1
        else:
            self.chunked = True
            parts.append(b"transfer-encoding: chunked\r\n")
        if self.connection.server.stopping or not self.complete:
            self.keep_alive = False  # a body not read to its end leaves the connection unusable
        if not self.keep_alive:
            parts.append(b"connection: close\r\n")
        parts.append(b"\r\n")
        return b"".join(parts)


class _Connection(asyncio.Protocol):
    """One client connection: parses requests, runs one app task per request, in order."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closed = False
        self.write_paused = False
        self._drained: asyncio.Future[None] | None = None
        self._reading = True
        self._idle: asyncio.TimerHandle | None = None
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._head_size = 0
        self._in_head = False  # between a request's first byte and the end of its headers
        self._head_bytes = 0  # bytes received while a head was incomplete
        self._error: tuple[int, bytes] | None = None  # a bad request after the one answered
        self._bad: bytes | None = None  # why a callback refused the request being parsed
        self._current: _Cycle | None = None  # the request being parsed
        self._line_due = True  # the next bytes begin a request line (after any empty lines)
        self._line = bytearray()  # the part of that line received so far
        self._body_left = 0  # bytes of a Content-Length body the parser has yet to be fed
        self._tail = b""  # the last bytes received before: a head's blank line may begin there
        self._queue: deque[_Cycle] = deque()  # parsed, waiting for the one before to answer
        self._active: _Cycle | None = None  # the request the app is answering
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.client = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        self.server.connections.add(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        start, size = 0, len(data)
        while start < size and self._error is None and not self.closed:
            end = self._piece_end(data, start)
            line_due = self._line_due
            if not self._feed(data, start, end):
                return
            # checked once httptools took it, so what it refuses keeps its own reason
            if line_due and not self._request_line(data[start:end]):
                return
            start = end
        self._tail = data[-3:] if size >= 3 else (self._tail + data)[-3:]

    def _piece_end(self, data: bytes, start: int) -> int:
        """Where the next piece of `data` fed to httptools ends: at most where a request
        line, a head or a body ends, so a request begins only where a piece does."""
        if self._body_left:  # a Content-Length body
            end = min(len(data), start + self._body_left)
            self._body_left -= end - start
            return end
        if self._in_head and not self._line_due:  # headers, to the empty line ending them
            before = data[start - 3 : start] if start >= 3 else (self._tail + data[:start])[-3:]
            seam = (before + data[start : start + 3]).find(b"\r\n\r\n")
            if seam >= 0:  # the blank line began in what was fed before
                return start + seam + 4 - len(before)
            found = data.find(b"\r\n\r\n", start)
            return len(data) if found < 0 else found + 4
        newline = data.find(b"\n", start)  # a request line, or a line of a chunked body
        return len(data) if newline < 0 else newline + 1

    def _request_line(self, piece: bytes) -> bool:
        """Collect the request line `piece` is part of and check it once whole; False when it
        is refused."""
        self._line += piece
        if not piece.endswith(b"\n"):
            if len(self._line) > MAX_HEAD:
                self._refuse(431, b"request head too large")
                return False
            return True
        line, self._line = bytes(self._line), bytearray()
        if line == b"\r\n":  # an empty line before a request is ignored (RFC 9112, 2.2)
            return True
        self._line_due = False
        if _REQUEST_LINE.fullmatch(line) is None:
            self._refuse(400, _BAD_LINE)
            return False
        return True

    def _feed(self, data: bytes, start: int, end: int) -> bool:
        """Feed `data[start:end]` to the parser; False when the connection is refused (or the
        rest of `data` was handled after an upgrade offer)."""
        try:
            self.parser.feed_data(memoryview(data)[start:end])
        except httptools.HttpParserUpgrade as upgrade:
            # an offer to switch protocols (h2c, websocket) is declined by answering in
            # HTTP/1.1; the bytes after the head are the next request. (A head that offers one
            # and declares a body was refused in on_headers_complete: httptools stops framing
            # at the end of an upgrade's head, so its body would be read as another request.)
            if self.parser.get_method() == b"CONNECT":
                self._refuse(400, b"CONNECT is not supported")
                return False
            self.parser = httptools.HttpRequestParser(self)
            self._line_due, self._body_left = True, 0
            offset = start + (upgrade.args[0] if upgrade.args else end - start)
            if offset < len(data):
                self.data_received(data[offset:])
            return False
        except httptools.HttpParserError:  # also what a callback raised, wrapped
            self._abandon_current()
            if self._head_size > MAX_HEAD:
                self._refuse(431, b"request head too large")
            else:
                self._refuse(400, self._bad or b"invalid HTTP request")
            return False
        if self._in_head:  # the parser holds an unfinished head: bound it
            self._head_bytes += end - start
            if self._head_bytes > MAX_HEAD:
                self._head_size = self._head_bytes
                self._refuse(431, b"request head too large")
                return False
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self._idle is not None:
            self._idle.cancel()
        for cycle in (self._active, self._current, *self._queue):
            if cycle is not None:
                cycle.wake()
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    # --- httptools callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = []
        self._head_size = 0
        self._in_head = True
        self._bad = None

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._grow(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name.lower(), value))
        self._grow(len(name) + len(value))

    def _grow(self, size: int) -> None:
        self._head_size += size
        if self._head_size > MAX_HEAD:
            raise _HeadTooLarge()

    def on_headers_complete(self) -> None:
        if self.parser.should_upgrade() and any(
            name in (b"content-length", b"transfer-encoding") and value.strip() not in (b"", b"0")
            for name, value in self._headers
        ):
            self._bad = b"a request offering a protocol upgrade cannot carry a body"
            raise _Refused()
        if self.parser.get_http_version() not in ("1.1", "1.0"):  # 0.9 has no status line
            self._bad = b"HTTP/1.1 or HTTP/1.0 only"
            raise _Refused()
        self._in_head = False
        self._head_bytes = 0
        if self._idle is not None:  # a request is here: no idle close until it is answered
            self._idle.cancel()
            self._idle = None
        self._body_left = _content_length(self._headers)
        url = httptools.parse_url(self._url)
        raw_path = url.path
        scope: Scope = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": self.parser.get_http_version(),
            "server": self.local,
            "client": self.client,
            "scheme": "http",
            "method": self.parser.get_method().decode("ascii"),
            "root_path": "",
            "path": unquote(raw_path.decode("ascii", "replace")),
            "raw_path": raw_path,
            "query_string": url.query or b"",
            "headers": self._headers,
            "state": dict(self.server.state),
        }
        cycle = _Cycle(self, scope, self.parser.should_keep_alive())
        for name, value in self._headers:
            if name == b"expect" and value.lower() == b"100-continue":
                cycle.continue_pending = True
        self._current = cycle
        if self._active is None:
            self._start(cycle)
        else:
            self._queue.append(cycle)
            self.pause_reading()  # answer what is here before reading more

    def on_body(self, body: bytes) -> None:
        cycle = self._current
        if cycle is not None:
            cycle.body.append(body)
            if cycle is self._active:
                cycle.wake()
            if sum(map(len, cycle.body)) > MAX_BUFFERED:
                self.pause_reading()  # until the app reads (receive() resumes)

    def on_message_complete(self) -> None:
        self._line_due = True
        cycle = self._current
        if cycle is not None:
            cycle.complete = True
            cycle.wake()
        self._current = None

    def _abandon_current(self) -> None:
        """The request being parsed is malformed: it will never be whole, so the app must not
        wait for the rest of its body (nor start on it, when it waits in the queue)."""
        cycle, self._current = self._current, None
        if cycle is None:
            return
        if cycle in self._queue:
            self._queue.remove(cycle)
        elif cycle is self._active and not cycle.response_started:
            # answer the refusal now, and let the app's receive() see the client gone
            self._active = None
            self._queue.clear()
            self._refuse(400, self._bad or b"invalid HTTP request body")
            cycle.wake()

    # --- requests -------------------------------------------------------------------------

    def _start(self, cycle: _Cycle) -> None:
        self._active = cycle
        task = self.loop.create_task(self._run(cycle))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _run(self, cycle: _Cycle) -> None:
        try:
            await self.server.app(cycle.scope, cycle.receive, cycle.send)
            failed = not cycle.response_complete
            if failed and not self.closed:
                logger.error("the app returned without finishing its response")
        except Exception as error:  # the app's own bug: a 500, never its details
            logger.error("request failed in the app: %s", type(error).__name__)
            failed = True
        try:
            if failed and (not cycle.response_started or cycle.head) and not self.closed:
                cycle.response_started, cycle.head, cycle.chunked = False, b"", False
                cycle.keep_alive = False
                body = b"Internal Server Error"
                await cycle.send({"type": "http.response.start", "status": 500, "headers": [
                    (b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body)),
                    (b"connection", b"close")]})  # fmt: skip
                await cycle.send({"type": "http.response.body", "body": body})
        finally:
            if not cycle.response_complete:
                self.close()  # a response cut short: the client cannot trust this connection

    def finished(self, cycle: _Cycle) -> None:
        """The response is sent: next request, or close."""
        self._active = None
        # a request whose body was not read to its end leaves the connection unusable
        if not cycle.keep_alive or not cycle.complete or self.server.stopping:
            self.close()
            return
        if self._queue:
            self._start(self._queue.popleft())
            return
        if self._error is not None:
            self._refuse(*self._error)
            return
        self.resume_reading()
        if self._current is None:
            self._arm_idle()

    def _refuse(self, status: int, message: bytes) -> None:
        if self._active is not None or self._queue:
            # requests before the bad one are answered first, then the refusal
            self._error = (status, message)
            self.pause_reading()
            return
        if not self.closed:
            self.write(
                _STATUS[status] + b"content-type: text/plain\r\nconnection: close\r\n"
                b"content-length: %d\r\n\r\n%b" % (len(message), message)
            )
        self.close()

    # --- transport ------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    async def drain(self) -> None:
        self._drained = self.loop.create_future()
        try:
            await self._drained
        finally:
            self._drained = None

    def pause_reading(self) -> None:
        if self._reading and self.transport is not None and not self.closed:
            self._reading = False
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if not self._reading and self.transport is not None and not self.closed:
            self._reading = True
            self.transport.resume_reading()

    def _arm_idle(self) -> None:
        self._idle = self.loop.call_later(self.server.keep_alive, self.close_if_idle)

    def close_if_idle(self) -> None:
        if self._active is None and self._current is None:
            self.close()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.closed = True
            self.transport.abort()


class _HeadTooLarge(Exception):
    pass


class _Refused(Exception):
    """Raised in a parser callback to refuse the request (the reason is in `_bad`)."""


def _content_length(headers: list[tuple[bytes, bytes]]) -> int:
    """Bytes of a request body framed by Content-Length (httptools has checked the value and
    refused one beside Transfer-Encoding); 0 when chunked or without a body."""
    for name, value in headers:
        if name == b"content-length":
            return int(value)
    return 0


def _address(value: Any) -> tuple[str, int] | None:
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None


class Server:
    """Serves `app` until `stop()`; `started` is set once it listens."""

    def __init__(self, app: ASGIApp, *, keep_alive: float = 5.0, grace: float = 30.0) -> None:
        self.app = app
        self.keep_alive = keep_alive
        self.grace = grace
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.state: dict[str, Any] = {}
        self.stopping = False
        self.started = asyncio.Event()
        self._stop = asyncio.Event()
        self._lifespan: _Lifespan | None = None

    def stop(self) -> None:
        """Stop (safe to call from a signal handler on the server's loop)."""
        self._stop.set()

    async def serve(self, host: str, port: int) -> None:
        self._lifespan = _Lifespan(self.app, self.state)
        await self._lifespan.startup()
        try:
            listener = await asyncio.get_running_loop().create_server(
                lambda: _Connection(self), host, port, reuse_address=True, backlog=2048
            )
        except OSError as error:
            await self._lifespan.shutdown()
            raise KairosError(
                f"cannot listen on {host}:{port} ({error.strerror or error}); "
                "choose another port with --port"
            ) from None
        self.started.set()
        try:
            await self._stop.wait()
        finally:
            self.stopping = True
            listener.close()
            for connection in list(self.connections):
                connection.close_if_idle()
            late: set[asyncio.Task[None]] = set()
            if self.tasks:
                _, late = await asyncio.wait(list(self.tasks), timeout=self.grace)
            for connection in list(self.connections):
                if late:  # past the grace: cut them, whatever is still unsent
                    connection.abort()
                else:
                    connection.close()
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=5)
            await listener.wait_closed()
            await self._lifespan.shutdown()


class _Lifespan:
    """The ASGI lifespan protocol; an app that does not speak it is served without it."""

    def __init__(self, app: ASGIApp, state: dict[str, Any]) -> None:
        self.app = app
        self.state = state
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.outbox: asyncio.Queue[Message] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.supported = True

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": _ASGI, "state": self.state}
        try:
            await self.app(scope, self.inbox.get, self.outbox.put)
        except Exception as error:
            self.supported = False
            logger.info("the app has no lifespan (%s)", type(error).__name__)
        finally:
            await self.outbox.put({"type": "lifespan.ended"})

    async def _exchange(self, kind: str) -> None:
        if not self.supported:
            return
        await self.inbox.put({"type": f"lifespan.{kind}"})
        reply = await self.outbox.get()
        if reply["type"] == "lifespan.ended":
            self.supported = False
        elif reply["type"] == f"lifespan.{kind}.failed":
            raise RuntimeError(f"the app's {kind} failed: {reply.get('message', '')}")

    async def startup(self) -> None:
        self.task = asyncio.create_task(self._run())
        await self._exchange("startup")

    async def shutdown(self) -> None:
        await self._exchange("shutdown")
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self.task, 5)


def serve(
    app: ASGIApp, host: str, port: int, *, on_start: Callable[[], None] | None = None
) -> None:
    """Serve until SIGINT or SIGTERM, on uvloop."""
    import uvloop

    async def main() -> None:
        server = Server(app)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, server.stop)
        task = asyncio.create_task(server.serve(host, port))
        started = asyncio.create_task(server.started.wait())
        await asyncio.wait([task, started], return_when=asyncio.FIRST_COMPLETED)
        if started.done() and on_start is not None:
            on_start()
        await task

    uvloop.run(main())
