"""A small HTTP/1.1 client for upstream calls: keep-alive connections per origin on asyncio
protocols, responses parsed by httptools (the C parser uvicorn uses), bodies read whole or
streamed as they arrive. It does only what the gateway needs (POST JSON, TLS, content-length and
chunked bodies) at a fraction of a general client's cost per call.

>>> client = HTTPClient()  # doctest: +SKIP
>>> response = await client.request("POST", "https://x.example/v1", {}, b"{}", 30)  # doctest: +SKIP
>>> response.status, await response.read()  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

from kairos.errors import KairosError

_IDLE_PER_ORIGIN = 256
_END = b""


class HTTPFailure(KairosError, ConnectionError):
    """The exchange failed; `connected` says whether the request could have been sent."""

    def __init__(self, message: str, *, connected: bool, timed_out: bool = False) -> None:
        super().__init__(message)
        self.connected = connected
        self.timed_out = timed_out


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.headers: dict[str, str] = {}
        self.head: asyncio.Future[None] | None = None
        self.body = _Body()
        self.complete = False
        self.closed = False
        self.keep_alive = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(HTTPFailure(f"unreadable response ({error})", connected=True))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.complete:
            return
        delimited = "content-length" in self.headers or "chunked" in self.headers.get(
            "transfer-encoding", ""
        )
        if exc is None and self.head is not None and self.head.done() and not delimited:
            self.on_message_complete()  # a body that ends when the connection does
            return
        self._fail(HTTPFailure("the upstream closed the connection", connected=True))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # not readable once the body is done
        if self.head is not None and not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.body.add(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.body.end()

    def _fail(self, error: HTTPFailure) -> None:
        if self.head is not None and not self.head.done():
            self.head.set_exception(error)
        self.body.fail(error)
        self.close()

    def start(self, raw: bytes) -> asyncio.Future[None]:
        transport = cast(asyncio.Transport, self.transport)  # set by connection_made
        self.headers = {}
        self.complete = False
        self.head = asyncio.get_running_loop().create_future()
        transport.write(raw)
        return self.head

    def reusable(self) -> bool:
        return self.complete and not self.closed and self.keep_alive

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Body:
    """A response body's bytes between the protocol and its reader: one buffer and at most one
    waiting reader, woken once per arrival (cheaper per chunk than a queue and a timeout)."""

    __slots__ = ("_ended", "_error", "_parts", "_waiter")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def add(self, data: bytes) -> None:
        if not data:
            return
        self._parts.append(data)
        self._wake()

    def end(self) -> None:
        self._ended = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self, timeout: float) -> bytes:
        """Everything buffered (`_END` once the body is over); waits at most `timeout`."""
        if not self._parts and not self._ended and self._error is None:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout, _expire, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        parts = self._parts
        if parts:
            self._parts = []
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if self._ended:  # a failure after the body's end does not spoil it
            return _END
        if self._error is not None:
            raise self._error
        raise HTTPFailure(
            f"no data from the upstream for {timeout:g}s", connected=True, timed_out=True
        )


class _HeadTimeout(Exception):
    pass


def _expire_head(head: asyncio.Future[None]) -> None:
    if not head.done():
        head.set_exception(_HeadTimeout())


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Response:
    """Status and headers; the body is read with `read()` or `lines()`, once."""

    def __init__(
        self, client: HTTPClient, origin: tuple[str, int, bool], connection: _Connection,
        timeout: float,
    ) -> None:  # fmt: skip
        self._client = client
        self._origin = origin
        self._connection: _Connection | None = connection
        self._timeout = timeout
        self.status = connection.parser.get_status_code()
        self.headers = connection.headers
        self._done = False

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: all that is buffered at each step, joined."""
        if self._connection is None:
            raise HTTPFailure("the response body was already read", connected=True)
        body = self._connection.body
        try:
            while True:
                data = await body.take(self._timeout)
                if not data:  # _END
                    self._done = True
                    return
                yield data
        finally:
            self.close()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def lines(self) -> AsyncIterator[bytes]:
        """The body's lines without their line ends (for server-sent events)."""
        pending = b""
        async for chunk in self.chunks():
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.removesuffix(b"\r")
        if pending:
            yield pending.removesuffix(b"\r")

    def close(self) -> None:
        """Give the connection back when the body was read to its end, else drop it."""
        if self._connection is None:
            return
        connection, self._connection = self._connection, None
        if self._done and connection.reusable():
            self._client._release(self._origin, connection)
        else:
            connection.close()


class HTTPClient:
    def __init__(self) -> None:
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._targets: dict[str, tuple[tuple[str, int, bool], str, str]] = {}
        self._ssl: ssl.SSLContext | None = None

    async def request(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeout: float,
        *,
        connect_timeout: float = 5.0,
    ) -> Response:
        """Send a request; return once the response's headers arrived."""
        origin, path, netloc = self._target(url)
        lines = [f"{method} {path} HTTP/1.1", f"host: {netloc}", f"content-length: {len(body)}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        raw = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        reused = True
        connection = self._idle_connection(origin)
        if connection is None:
            reused = False
            connection = await self._connect(origin, connect_timeout)
        head = connection.start(raw)
        timer = asyncio.get_running_loop().call_later(timeout, _expire_head, head)
        try:
            await head
        except _HeadTimeout:
            connection.close()
            raise HTTPFailure(
                f"no answer from the upstream in {timeout:g}s", connected=True, timed_out=True
            ) from None
        except HTTPFailure:
            if reused and not connection.headers:
                # a kept-alive connection the upstream had closed: one retry on a fresh one
                return await self.request(
                    method, url, headers, body, timeout, connect_timeout=connect_timeout
                )
            raise
        finally:
            timer.cancel()
        return Response(self, origin, connection, timeout)

    def _target(self, url: str) -> tuple[tuple[str, int, bool], str, str]:
        """(origin, path, host header) of a URL, parsed once."""
        target = self._targets.get(url)
        if target is None:
            parts = urlsplit(url)
            tls = parts.scheme == "https"
            host = parts.hostname or "127.0.0.1"
            port = parts.port or (443 if tls else 80)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            netloc = host if parts.port is None else f"{host}:{port}"
            target = self._targets[url] = ((host, port, tls), path, netloc)
        return target

    def _idle_connection(self, origin: tuple[str, int, bool]) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if not connection.closed:
                connection.body = _Body()
                return connection
        return None

    async def _connect(self, origin: tuple[str, int, bool], timeout: float) -> _Connection:
        host, port, tls = origin
        if tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(
                    _Connection, host, port, ssl=self._ssl if tls else None
                )
        except (OSError, TimeoutError) as error:
            raise HTTPFailure(
                f"cannot connect to {host}:{port} ({type(error).__name__})", connected=False
            ) from None
        return connection

    def _release(self, origin: tuple[str, int, bool], connection: _Connection) -> None:
        idle = self._idle.setdefault(origin, [])
        if len(idle) < _IDLE_PER_ORIGIN:
            idle.append(connection)
        else:
            connection.close()

    async def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
