"""The upstream client's promises (issue 13, item 10): a request is never sent twice, pooled
connections expire, HTTP_PROXY / HTTPS_PROXY (CONNECT, with credentials) and NO_PROXY are
honoured, and a deployment's deadline bounds a whole attempt, a stream included."""

from __future__ import annotations

import asyncio
import base64
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import cast
from urllib.parse import unquote

import httpx
import orjson
import pytest
import trustme
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from kairos.gateway import Gateway
from kairos.gateway.app import create_gateway_app
from kairos.http import client as http_client
from kairos.http.client import HTTPClient, HTTPFailure
from tests.gateway.conftest import config, deployment, new_key
from tests.gateway.fake_upstream import FakeUpstream, ServerThread
from tests.http.test_client import read_request, serve

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def test_a_request_is_never_sent_twice() -> None:
    """The upstream closes a kept-alive connection after reading the second request, without
    answering: it may have acted on it, so the client reports the failure, not a retry."""
    received: list[bytes] = []

    async def once_then_silence(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await read_request(reader))
        writer.write(OK)
        await writer.drain()
        received.append(await read_request(reader))  # read, then the connection ends

    async def scenario() -> None:
        client = HTTPClient(proxies={})
        server, url, connections = await serve(once_then_silence)
        try:
            first = await client.request("POST", url, {}, b"one", 5)
            assert await first.read() == b"ok"
            with pytest.raises(HTTPFailure) as failure:
                await client.request("POST", url, {}, b"two", 5)
            assert failure.value.connected  # the bytes may have reached it
            await asyncio.sleep(0.1)
            assert received == [b"one", b"two"]  # the second request went out once
            assert len(connections) == 1
        finally:
            await client.close()
            await asyncio.sleep(0.05)  # the server's handlers see the close and end
            server.close()

    asyncio.run(scenario())


async def _keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        await read_request(reader)
        writer.write(OK)
        await writer.drain()


@pytest.mark.parametrize("limit", ["IDLE_EXPIRY", "MAX_AGE"])
def test_pooled_connections_expire(monkeypatch: pytest.MonkeyPatch, limit: str) -> None:
    async def scenario() -> list[int]:
        client = HTTPClient(proxies={})
        server, url, connections = await serve(_keep_alive)
        try:
            for _ in range(3):
                assert await (await client.request("POST", url, {}, b"x", 5)).read() == b"ok"
            monkeypatch.setattr(http_client, limit, 0.05)
            await asyncio.sleep(0.1)
            for _ in range(2):
                assert await (await client.request("POST", url, {}, b"x", 5)).read() == b"ok"
                await asyncio.sleep(0.1)
            return connections
        finally:
            await client.close()
            await asyncio.sleep(0.05)  # the server's handlers see the close and end
            server.close()

    # one connection while it is fresh; then a new one per request once each has expired
    assert len(asyncio.run(scenario())) == 3


class Proxy:
    """A forward proxy on loopback: absolute-form requests relayed, CONNECT tunnels opened;
    with `credentials`, a request without them gets a 407."""

    def __init__(self, credentials: str | None = None) -> None:
        self.credentials = credentials
        self.seen: list[str] = []  # request lines
        self.url = ""
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        user = f"{self.credentials}@" if self.credentials else ""
        self.url = f"http://{user}127.0.0.1:{port}"

    def _allowed(self, head: bytes) -> bool:
        if self.credentials is None:
            return True
        expected = base64.b64encode(unquote(self.credentials).encode()).decode()
        return f"proxy-authorization: basic {expected}".lower().encode() in head.lower()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            line = head.split(b"\r\n", 1)[0].decode()
            self.seen.append(line)
            if not self._allowed(head):
                writer.write(
                    b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n"
                )
                return
            method, target, _ = line.split(" ")
            if method == "CONNECT":
                host, port = target.rsplit(":", 1)
                up_reader, up_writer = await asyncio.open_connection(host, int(port))
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
                return
            address = target.split("//", 1)[1].split("/", 1)[0]
            host, port = address.rsplit(":", 1)
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            up_writer.write(head)  # the request as it came (absolute form is valid for servers)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


def test_http_proxy_and_no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        proxy = Proxy(credentials="user:p%40ss")
        await proxy.start()
        server, url, connections = await serve(_keep_alive)
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        via = HTTPClient()  # read from the environment
        direct = HTTPClient(proxies={"http": proxy.url, "no": "localhost,127.0.0.1"})
        try:
            assert await (await via.request("POST", url, {}, b"x", 5)).read() == b"ok"
            assert proxy.seen == [f"POST {url} HTTP/1.1"]  # the absolute form, to the proxy
            assert await (await direct.request("POST", url, {}, b"x", 5)).read() == b"ok"
            assert len(proxy.seen) == 1  # NO_PROXY: straight to the upstream
            assert len(connections) == 2
        finally:
            await via.close()
            await direct.close()
            await asyncio.sleep(0.05)
            server.close()
            proxy.close()

    asyncio.run(scenario())


@pytest.fixture(scope="module")
def tls() -> Iterator[tuple[ssl.SSLContext, ssl.SSLContext]]:
    """(server context for 127.0.0.1, client context trusting it)."""
    authority = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    authority.configure_trust(client)
    yield server, client


def test_https_through_a_connect_tunnel(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_context, client_context = tls

    async def scenario() -> None:
        proxy = Proxy(credentials="me:secret")
        await proxy.start()
        server = await asyncio.start_server(_keep_alive, "127.0.0.1", 0, ssl=server_context)
        port = server.sockets[0].getsockname()[1]
        url = f"https://127.0.0.1:{port}/v1/chat/completions"
        client = HTTPClient(proxies={"https": proxy.url}, ssl_context=client_context)
        refused = HTTPClient(proxies={"https": proxy.url.replace("me:secret@", "")},
                             ssl_context=client_context)  # fmt: skip
        try:
            for _ in range(2):  # the second reuses the tunnel
                assert await (await client.request("POST", url, {}, b"x", 5)).read() == b"ok"
            assert proxy.seen == [f"CONNECT 127.0.0.1:{port} HTTP/1.1"]
            with pytest.raises(HTTPFailure) as failure:  # 407 without the credentials
                await refused.request("POST", url, {}, b"x", 5)
            assert not failure.value.connected and "proxy" in str(failure.value)
        finally:
            await client.close()
            await refused.close()
            await asyncio.sleep(0.05)
            server.close()
            proxy.close()

    asyncio.run(scenario())


def _slow_stream_app() -> Starlette:
    """A provider whose stream never ends: a chunk every 0.2 s (each wait is short)."""

    async def chat(request: Request) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            for index in range(100):
                chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                         "choices": [{"index": 0, "delta": {"content": f"{index} "}}]}  # fmt: skip
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
                await asyncio.sleep(0.2)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def completions(request: Request) -> JSONResponse:
        await asyncio.sleep(3)  # answers whole, but late
        return JSONResponse({"choices": [{"index": 0, "text": "late"}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/v1/completions", completions, methods=["POST"])])  # fmt: skip


def test_a_deadline_bounds_the_whole_attempt(tmp_path: Path) -> None:
    with ServerThread(_slow_stream_app()) as slow:
        models = {"chat": {"deployments": [deployment("m", timeout="5s", deadline="1s")]}}
        provider = cast(FakeUpstream, SimpleNamespace(url=slow.url))  # config() reads its url
        gateway = Gateway(config(provider, tmp_path, models=models))
        with ServerThread(create_gateway_app(gateway), kairos=True) as served:
            served.gateway = gateway  # type: ignore[attr-defined]
            key = new_key(served, budgets=[{"period": "total", "tokens": 100_000}])
            started = time.monotonic()
            with httpx.Client(timeout=10) as client:
                answer = client.post(
                    f"{served.url}/v1/chat/completions",
                    headers={"authorization": f"Bearer {key}"},
                    json={"model": "chat", "stream": True, "max_tokens": 50,
                          "messages": [{"role": "user", "content": "hi"}]},
                )  # fmt: skip
            elapsed = time.monotonic() - started
            assert 0.9 < elapsed < 3, elapsed  # not the 20 s the stream would take
            assert b'"code":"deadline_exceeded"' in answer.content
            assert b"[DONE]" not in answer.content
            rows = served.call(gateway.usage())
            assert [row.status for row in rows] == ["deadline_exceeded"]
            assert rows[0].tokens_out == 50  # charged as served: the provider may bill it all
            started = time.monotonic()
            with httpx.Client(timeout=10) as client:  # answered whole: the same bound
                late = client.post(
                    f"{served.url}/v1/completions", headers={"authorization": f"Bearer {key}"},
                    json={"model": "chat", "prompt": "hi", "max_tokens": 5},
                )  # fmt: skip
            assert late.status_code == 504 and "deadline" in late.json()["error"]["message"]
            assert time.monotonic() - started < 2.5
            served.call(gateway.close())
