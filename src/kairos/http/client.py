"""A small HTTP/1.1 client for upstream calls: keep-alive connections per origin on asyncio
protocols, responses parsed by httptools (the C parser uvicorn uses), bodies read whole or
streamed as they arrive. It does only what the gateway needs (POST JSON, TLS, content-length and
chunked bodies, HTTP(S)_PROXY and NO_PROXY) at a fraction of a general client's cost per call
(bench/gateway.py measures it against httpx in the same run).

A request is never sent twice once its bytes may have reached the upstream: such a failure is the
caller's (a retry could bill the call twice). One that provably never reached it is sent again
on a fresh connection, at most `RESENDS` times: the peer's TCP acknowledged none of its bytes
(Linux's TCP_INFO `bytes_acked`) and no byte of an answer came. That is a pooled connection the
upstream closed just as the request went out, or a new one an upstream with a full accept queue
reset: a healthy upstream under a burst, not a failure of it. Where TCP_INFO cannot be read, every
written request counts as reached. A pooled connection whose peer already hung up (its TCP state
is no longer ESTABLISHED, though the loop has not seen the end yet) is never reused. Pooled
connections are dropped after `IDLE_EXPIRY` seconds unused (before a server's usual 5 s
keep-alive ends them under a request) and after `MAX_AGE` seconds in all (so a changed DNS
answer or a drained upstream is picked up).

>>> client = HTTPClient()  # doctest: +SKIP
>>> response = await client.request("POST", "https://x.example/v1", {}, b"{}", 30)  # doctest: +SKIP
>>> response.status, await response.read()  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import ssl
import struct
import time
import urllib.request
from collections.abc import AsyncIterator, Mapping
from typing import cast
from urllib.parse import unquote, urlsplit

import httptools

from kairos import telemetry
from kairos.errors import KairosError

_IDLE_PER_ORIGIN = 256
_GAP = 0.001  # seconds between new connections to one origin past a burst
_BURST = 32  # new connections to one origin opened at once
IDLE_EXPIRY = 4.0  # seconds a pooled connection may wait unused
MAX_AGE = 300.0  # seconds a connection is reused for, from its opening
_END = b""
RESENDS = 2  # times a request that provably never reached the upstream is sent again
_RESEND_PAUSE = (0.02, 0.1)  # seconds before each resend: an accept queue drains meanwhile
_TAKEN_WITHIN = 1.0  # seconds for the peer's TCP to acknowledge a request's first bytes
_TCP_INFO = getattr(socket, "TCP_INFO", None)  # Linux only
_TCP_ESTABLISHED = 1
_BYTES_ACKED = 120  # offset of tcpi_bytes_acked (a u64) in struct tcp_info, Linux >= 4.1


class HTTPFailure(KairosError, ConnectionError):
    """The exchange failed; `connected` says whether the request could have reached the
    upstream (False: provably not, so it was not served)."""

    def __init__(self, message: str, *, connected: bool, timed_out: bool = False) -> None:
        super().__init__(message)
        self.connected = connected
        self.timed_out = timed_out


class _Probe:
    """The kernel's view of one connection (TCP_INFO) through a duplicate of its socket, so it
    can still be read when the loop reports the connection lost (uvloop closes its descriptor
    first). Without TCP_INFO (not Linux, not TCP) it knows nothing and says so."""

    __slots__ = ("_socket",)

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self._socket: socket.socket | None = None
        raw = transport.get_extra_info("socket")
        if _TCP_INFO is None or raw is None or raw.family not in (socket.AF_INET, socket.AF_INET6):
            return
        try:
            self._socket = socket.socket(fileno=os.dup(raw.fileno()))
        except OSError:
            self._socket = None

    def _info(self) -> bytes | None:
        if self._socket is None:
            return None
        try:
            info = self._socket.getsockopt(socket.IPPROTO_TCP, cast(int, _TCP_INFO), 136)
        except OSError:
            return None
        return info if len(info) >= _BYTES_ACKED + 8 else None

    def acked(self) -> int | None:
        """Bytes the peer's TCP acknowledged so far (None: unknown)."""
        info = self._info()
        return None if info is None else int(struct.unpack_from("Q", info, _BYTES_ACKED)[0])

    def discard_unsent(self) -> None:
        """Closing will reset the connection and drop what is still queued (SO_LINGER 0):
        a request judged never reached must not arrive after all."""
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )

    def established(self) -> bool:
        """False once the peer has hung up (FIN or RST), even before the loop reads it."""
        info = self._info()
        return info is None or info[0] == _TCP_ESTABLISHED

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


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
        self.opened = time.monotonic()
        self.idle_since = self.opened
        self.tunnel: asyncio.StreamWriter | None = None  # a proxy's CONNECT tunnel, when in one
        self.probe: _Probe | None = None
        self.acked_before: int | None = None  # the peer's acknowledged bytes before the request
        self.answered = False  # a byte of the current exchange's answer arrived

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.probe = _Probe(transport)

    def eof_received(self) -> bool | None:
        self.closed = True  # the upstream ended the connection: it is never reused
        return None

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(HTTPFailure(f"unreadable response ({error})", connected=True))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        try:
            if self.complete:
                return
            delimited = "content-length" in self.headers or "chunked" in self.headers.get(
                "transfer-encoding", ""
            )
            if exc is None and self.head is not None and self.head.done() and not delimited:
                self.on_message_complete()  # a body that ends when the connection does
                return
            reached = self.reached()
            self._fail(HTTPFailure(
                "the upstream closed the connection"
                + ("" if reached else " before it took the request"),
                connected=reached,
            ))  # fmt: skip
        finally:
            if self.probe is not None:
                self.probe.close()

    def reached(self) -> bool:
        """Whether the current request may have reached the upstream: False only when the
        peer's TCP acknowledged none of its bytes and no answer came (so nothing read it)."""
        if self.answered or self.acked_before is None or self.probe is None:
            return True
        acked = self.probe.acked()
        return acked is None or acked > self.acked_before

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
        self.answered = False
        self.acked_before = None if self.probe is None else self.probe.acked()
        self.head = asyncio.get_running_loop().create_future()
        transport.write(raw)
        return self.head

    def reusable(self) -> bool:
        return (
            self.complete and not self.closed and self.keep_alive
            and time.monotonic() - self.opened < MAX_AGE
        )  # fmt: skip

    def alive(self) -> bool:
        """Not closed, and (where the kernel says) the peer has not hung up."""
        return not self.closed and (self.probe is None or self.probe.established())

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def abandon(self) -> bool:
        """Close after a failed exchange; True when the request provably never reached the
        upstream (its unsent bytes are then dropped, never delivered late)."""
        reached = self.reached()
        if not reached and self.probe is not None:
            self.probe.discard_unsent()
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        return not reached


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


class _NotTaken(Exception):
    pass


def _expire_head(head: asyncio.Future[None]) -> None:
    if not head.done():
        head.set_exception(_HeadTimeout())


def _check_taken(head: asyncio.Future[None], connection: _Connection) -> None:
    """A request whose bytes the peer has not acknowledged after `_TAKEN_WITHIN` seconds sits
    in a handshake the upstream dropped (its accept queue was full): send it afresh."""
    if not head.done() and not connection.reached():
        head.set_exception(_NotTaken())


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Response:
    """Status and headers; the body is read with `read()` or `lines()`, once."""

    def __init__(
        self, client: HTTPClient, origin: Origin, connection: _Connection,
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


class _Proxy:
    """A forward proxy: its address and, when its URL has credentials, their header value."""

    __slots__ = ("authorization", "host", "port")

    def __init__(self, url: str) -> None:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 8080
        self.authorization: str | None = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self.authorization = "Basic " + base64.b64encode(pair.encode()).decode()


# (host, port, tls, proxied): connections are pooled per origin and per route to it
Origin = tuple[str, int, bool, bool]


class _Target:
    """What a URL resolves to once: the pool it uses, the request target and host header,
    the proxy on the way (HTTP_PROXY/HTTPS_PROXY unless NO_PROXY names the host)."""

    __slots__ = ("extra", "netloc", "origin", "path", "proxy")

    def __init__(self, url: str, proxies: Mapping[str, str]) -> None:
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if tls else 80)
        self.netloc = host if parts.port is None else f"{host}:{port}"
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        proxy_url = proxies.get("https" if tls else "http")
        bypass = bool(proxies.get("no")) and urllib.request.proxy_bypass_environment(  # type: ignore[attr-defined]
            self.netloc, {"no": proxies["no"]}
        )
        self.proxy = _Proxy(proxy_url) if proxy_url and not bypass else None
        self.origin: Origin = (host, port, tls, self.proxy is not None)
        self.extra = ""  # headers a plain-HTTP proxy needs on every request
        if self.proxy is not None and not tls:
            self.path = f"http://{self.netloc}{self.path}"  # absolute form, for the proxy
            if self.proxy.authorization:
                self.extra = f"proxy-authorization: {self.proxy.authorization}\r\n"


class HTTPClient:
    """Keep-alive connections per origin. `proxies` maps "http"/"https"/"no" to proxy URLs and
    the NO_PROXY list (default: the HTTP_PROXY, HTTPS_PROXY and NO_PROXY environment
    variables, read when the client is made); `ssl_context` verifies TLS upstreams (default:
    the system's trust store)."""

    def __init__(
        self, *, proxies: Mapping[str, str] | None = None, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self._idle: dict[Origin, list[_Connection]] = {}
        self._next_open: dict[Origin, float] = {}
        self._targets: dict[str, _Target] = {}
        self._ssl = ssl_context
        self._proxies = dict(
            urllib.request.getproxies_environment() if proxies is None else proxies
        )

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
        """Send a request; return once the response's headers arrived. `timeout` bounds each
        wait for the upstream (the head, then each piece of the body); the gateway bounds a
        whole attempt (Deployment.deadline)."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _Target(url, self._proxies)
        lines = [
            f"{method} {target.path} HTTP/1.1", f"host: {target.netloc}",
            f"content-length: {len(body)}",
        ]  # fmt: skip
        if telemetry.TRACER is not None:  # the current span's `traceparent` goes along
            headers = telemetry.outgoing(headers)
        lines += [f"{name}: {value}" for name, value in headers.items()]
        raw = ("\r\n".join(lines) + "\r\n" + target.extra + "\r\n").encode("latin-1") + body
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        resends = 0
        while True:
            connection = None if resends else self._idle_connection(target.origin)
            if connection is None:
                connection = await self._connect(target, connect_timeout)
            try:
                await self._exchange(connection, raw, max(deadline - loop.time(), 0.0), timeout)
            except HTTPFailure as failure:
                if failure.connected or resends == RESENDS or failure.timed_out:
                    raise
                pause = _RESEND_PAUSE[min(resends, len(_RESEND_PAUSE) - 1)]
                if loop.time() + pause >= deadline:
                    raise
                resends += 1  # provably never reached the upstream: send it again, fresh
                await asyncio.sleep(pause)
                continue
            return Response(self, target.origin, connection, timeout)

    @staticmethod
    async def _exchange(connection: _Connection, raw: bytes, wait: float, timeout: float) -> None:
        """Write the request and wait (at most `wait` seconds) for the answer's head."""
        head = connection.start(raw)
        loop = asyncio.get_running_loop()
        timer = loop.call_later(wait, _expire_head, head)
        taken = loop.call_later(_TAKEN_WITHIN, _check_taken, head, connection)
        try:
            await head
        except _HeadTimeout:
            untaken = connection.abandon()
            raise HTTPFailure(
                f"no answer from the upstream in {timeout:g}s"
                + (" (it never took the request)" if untaken else ""),
                connected=not untaken, timed_out=True,
            ) from None  # fmt: skip
        except _NotTaken:
            untaken = connection.abandon()
            raise HTTPFailure(
                f"the upstream did not take the request in {_TAKEN_WITHIN:g}s",
                connected=not untaken,
            ) from None
        except BaseException:  # cancelled (a deadline, a caller gone): the exchange is void
            connection.close()
            raise
        finally:
            timer.cancel()
            taken.cancel()

    def _idle_connection(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if not connection.alive():
                connection.close()
                continue
            if now - connection.idle_since > IDLE_EXPIRY or now - connection.opened > MAX_AGE:
                connection.close()  # the upstream may be closing it right now
                continue
            connection.body = _Body()
            return connection
        return None

    async def _connect(self, target: _Target, timeout: float) -> _Connection:
        # a token bucket per origin: _BURST connections at once, then one per _GAP seconds
        now = asyncio.get_running_loop().time()
        at = max(now - _BURST * _GAP, self._next_open.get(target.origin, 0.0)) + _GAP
        self._next_open[target.origin] = at
        if at > now:
            await asyncio.sleep(at - now)
        return await self._open(target, timeout)

    async def _open(self, target: _Target, timeout: float) -> _Connection:
        host, port, tls, _ = target.origin
        proxy = target.proxy
        if tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        loop = asyncio.get_running_loop()
        where = f"{host}:{port}" + (
            f" through the proxy {proxy.host}:{proxy.port}" if proxy else ""
        )
        try:
            async with asyncio.timeout(timeout):
                if proxy is None:
                    _, connection = await loop.create_connection(
                        _Connection, host, port, ssl=self._ssl if tls else None
                    )
                elif not tls:
                    _, connection = await loop.create_connection(
                        _Connection, proxy.host, proxy.port
                    )
                else:
                    connection = await self._tunnel(proxy, host, port)
        # a proxy that hangs up (EOFError) or answers garbage (LimitOverrunError, ValueError):
        # the request was not sent either way (ssl.SSLError is an OSError)
        except (OSError, TimeoutError, EOFError, asyncio.LimitOverrunError, ValueError) as error:
            raise HTTPFailure(
                f"cannot connect to {where} ({type(error).__name__})", connected=False
            ) from None
        return connection

    async def _tunnel(self, proxy: _Proxy, host: str, port: int) -> _Connection:
        """A TLS connection to host:port inside a proxy's CONNECT tunnel."""
        reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
        try:
            head = f"CONNECT {host}:{port} HTTP/1.1\r\nhost: {host}:{port}\r\n"
            if proxy.authorization:
                head += f"proxy-authorization: {proxy.authorization}\r\n"
            writer.write((head + "\r\n").encode("latin-1"))
            answer = await reader.readuntil(b"\r\n\r\n")
            status = answer.split(b" ", 2)[1:2]
            if status != [b"200"]:
                raise ConnectionRefusedError(f"the proxy answered {answer[:40]!r} to CONNECT")
            connection = _Connection()
            transport = await asyncio.get_running_loop().start_tls(
                writer.transport, connection, cast(ssl.SSLContext, self._ssl),
                server_hostname=host,
            )  # fmt: skip
        except BaseException:
            writer.close()
            raise
        if transport is None:
            raise ConnectionError("TLS through the proxy's tunnel failed")
        connection.connection_made(transport)
        # the stream writer must outlive the tunnel: collected, it would close the socket under it
        connection.tunnel = writer
        return connection

    def _release(self, origin: Origin, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
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
