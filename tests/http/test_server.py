"""kairos' own HTTP/1.1 server (what `kairos gateway serve` runs), over real sockets."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from kairos.errors import KairosError
from kairos.http.server import MAX_HEAD, Server
from kairos.http.types import Receive, Scope, Send


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class App:
    """Echoes the request (method, path, query, body) as JSON-ish text; paths script the rest."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.disconnected = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                self.events.append(message["type"])
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        path = scope["path"]
        body = b""
        while True:
            if path == "/slow-reader":
                await asyncio.sleep(0.001)
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if path == "/boom":
            raise RuntimeError("a bug in the app")
        if path == "/nothing":
            return  # an app bug too: no response at all
        if path == "/slow":
            await self.release.wait()
        if path == "/stream":  # no content-length: chunked, until the client leaves
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for index in range(3):
                await send({"type": "http.response.body", "body": b"part%d;" % index,
                            "more_body": True})  # fmt: skip
            if scope["query_string"] == b"forever":
                self.events.append((await receive())["type"])
                self.disconnected.set()
                await send({"type": "http.response.body", "body": b"late", "more_body": True})
                return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if path == "/big":
            chunk = bytes(range(256)) * 4096  # 1 MiB
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"%d" % (len(chunk) * 16))]})  # fmt: skip
            for index in range(16):
                await send({"type": "http.response.body", "body": chunk, "more_body": index < 15})
            return
        text = f"{scope['method']} {path} {scope['query_string'].decode()} ".encode() + body
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"),
                                (b"content-length", b"%d" % len(text))]})  # fmt: skip
        await send({"type": "http.response.body", "body": text})


@asynccontextmanager
async def serving(app: App, **options: Any) -> AsyncIterator[tuple[Server, int]]:
    port = free_port()
    server = Server(app, **options)
    task = asyncio.create_task(server.serve("127.0.0.1", port))
    await asyncio.wait_for(server.started.wait(), 5)
    try:
        yield server, port
    finally:
        server.stop()
        await asyncio.wait_for(task, 10)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
    if "content-length" in headers:
        return status, headers, await reader.readexactly(int(headers["content-length"]))
    body = b""
    while headers.get("transfer-encoding") == "chunked":
        size = int((await reader.readline()).strip(), 16)
        body += (await reader.readexactly(size + 2))[:-2]
        if size == 0:
            break
    return status, headers, body


async def request(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    try:
        return await read_response(reader)
    finally:
        writer.close()


def test_keep_alive_and_pipelining_answer_in_order_on_one_connection() -> None:
    async def main() -> None:
        app = App()
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /a?x=1 HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\nhello")
            status, headers, body = await read_response(reader)
            assert (status, body) == (200, b"POST /a x=1 hello")
            assert headers["content-length"] == "17" and "connection" not in headers
            # two requests in one write: both answered, in order, on the same connection
            writer.write(b"GET /b HTTP/1.1\r\nhost: t\r\n\r\nGET /c HTTP/1.1\r\nhost: t\r\n\r\n")
            assert (await read_response(reader))[2] == b"GET /b  "
            assert (await read_response(reader))[2] == b"GET /c  "
            writer.close()
        assert app.events == ["lifespan.startup", "lifespan.shutdown"]

    asyncio.run(main())


def test_a_whole_answer_is_one_write() -> None:
    """The head and the body leave together: a client wakes up once per answer."""

    async def main() -> None:
        async with serving(App()) as (_, port):
            loop = asyncio.get_running_loop()
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.setblocking(False)
                await loop.sock_sendall(sock, b"GET /one HTTP/1.1\r\nhost: t\r\n\r\n")
                data = await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)
                assert data.startswith(b"HTTP/1.1 200 OK\r\n")
                assert data.endswith(b"\r\n\r\nGET /one  ")

    asyncio.run(main())


def test_chunked_bodies_both_ways() -> None:
    async def main() -> None:
        async with serving(App()) as (_, port):
            raw = (b"POST /up HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n"
                   b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")  # fmt: skip
            assert (await request(port, raw))[2] == b"POST /up  abcde"
            status, headers, body = await request(port, b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
            assert headers["transfer-encoding"] == "chunked"
            assert (status, body) == (200, b"part0;part1;part2;")

    asyncio.run(main())


def test_a_body_in_many_pieces_and_a_big_answer_to_a_slow_reader() -> None:
    async def main() -> None:
        async with serving(App()) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /p HTTP/1.1\r\nhost: t\r\ncontent-length: 6\r\n\r\nab")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"cdef")
            assert (await read_response(reader))[2] == b"POST /p  abcdef"
            # 16 MiB, read slowly: the server waits for the client instead of buffering it all
            writer.write(b"GET /big HTTP/1.1\r\nhost: t\r\n\r\n")
            head = await reader.readuntil(b"\r\n\r\n")
            assert b"content-length: 16777216" in head
            await asyncio.sleep(0.3)
            body = await asyncio.wait_for(reader.readexactly(16 * 1024 * 1024), 20)
            assert body == (bytes(range(256)) * 4096) * 16
            writer.close()

    asyncio.run(main())


def test_connection_close_http10_and_bad_requests_end_the_connection() -> None:
    async def main() -> None:
        async with serving(App()) as (_, port):
            for raw in (b"GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
                        b"GET /x HTTP/1.0\r\n\r\n"):  # fmt: skip
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(raw)
                status, headers, _ = await read_response(reader)
                assert (status, headers["connection"]) == (200, "close")
                assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
                writer.close()
            status, _, body = await request(port, b"NOT HTTP AT ALL\r\n\r\n")
            assert (status, body) == (400, b"invalid HTTP request")
            huge = b"GET / HTTP/1.1\r\nx-big: " + b"a" * (MAX_HEAD + 10) + b"\r\n\r\n"
            assert (await request(port, huge))[0] == 431

    asyncio.run(main())


def test_an_app_that_fails_answers_500_and_the_server_keeps_serving() -> None:
    async def main() -> None:
        async with serving(App()) as (_, port):
            status, headers, body = await request(port, b"GET /boom HTTP/1.1\r\nhost: t\r\n\r\n")
            assert (status, body, headers["connection"]) == (500, b"Internal Server Error", "close")
            assert "a bug in the app" not in body.decode()
            assert (await request(port, b"GET /ok HTTP/1.1\r\nhost: t\r\n\r\n"))[0] == 200

    asyncio.run(main())


def test_a_client_that_leaves_mid_stream_is_seen_by_the_app() -> None:
    async def main() -> None:
        app = App()
        async with serving(app) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /stream?forever HTTP/1.1\r\nhost: t\r\n\r\n")
            await reader.readuntil(b"part2;\r\n")
            writer.close()
            await asyncio.wait_for(app.disconnected.wait(), 5)
        assert "http.disconnect" in app.events  # and sending after it did not raise

    asyncio.run(main())


def test_stop_lets_requests_in_flight_finish_then_runs_shutdown() -> None:
    async def main() -> None:
        app = App()
        port = free_port()
        server = Server(app)
        task = asyncio.create_task(server.serve("127.0.0.1", port))
        await server.started.wait()
        pending = asyncio.create_task(request(port, b"GET /slow HTTP/1.1\r\nhost: t\r\n\r\n"))
        await asyncio.sleep(0.1)
        server.stop()
        await asyncio.sleep(0.1)
        assert not task.done() and "lifespan.shutdown" not in app.events
        with pytest.raises(OSError):  # no new connections once stopping
            await asyncio.open_connection("127.0.0.1", port)
        app.release.set()
        status, headers, _ = await asyncio.wait_for(pending, 5)
        assert (status, headers["connection"]) == (200, "close")
        await asyncio.wait_for(task, 5)
        assert app.events == ["lifespan.startup", "lifespan.shutdown"]

    asyncio.run(main())


def test_idle_connections_close_after_keep_alive() -> None:
    async def main() -> None:
        async with serving(App(), keep_alive=0.2) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
            assert (await read_response(reader))[0] == 200
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()

    asyncio.run(main())


def test_a_taken_port_is_a_clear_error() -> None:
    async def main() -> None:
        async with serving(App()) as (_, port):
            with pytest.raises(KairosError, match=f"cannot listen on 127.0.0.1:{port}"):
                await Server(App()).serve("127.0.0.1", port)

    asyncio.run(main())


def test_httpx_against_it() -> None:
    """A real client library: keep-alive pool, streamed reads."""

    async def main() -> None:
        async with (
            serving(App()) as (_, port),
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client,
        ):
            replies = [await client.post("/e", content=b"x" * n) for n in (0, 1, 70_000)]
            assert [len(r.content) for r in replies] == [9, 10, 70_009]
            async with client.stream("GET", "/stream") as streamed:
                assert b"".join([p async for p in streamed.aiter_bytes()]) == b"part0;part1;part2;"

    asyncio.run(main())


def test_declined_upgrades_bad_requests_after_good_ones_and_stalled_heads() -> None:
    async def main() -> None:
        async with serving(App(), keep_alive=0.3) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            # an h2c / websocket offer is answered in HTTP/1.1, and the connection goes on
            writer.write(
                b"GET /up HTTP/1.1\r\nhost: t\r\nconnection: upgrade\r\nupgrade: h2c\r\n\r\n"
            )
            assert (await read_response(reader))[:3:2] == (200, b"GET /up  ")
            # a good request then garbage: the good one is answered, then the 400
            writer.write(b"GET /v HTTP/1.1\r\nhost: t\r\n\r\nGARBAGE\r\n\r\n")
            assert (await read_response(reader))[:3:2] == (200, b"GET /v  ")
            assert (await read_response(reader))[0] == 400
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
            # half a head, then silence: closed after keep_alive, not held forever
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /x HTTP/1.1\r\nhost: t\r\n")
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()

    asyncio.run(main())


def test_http10_without_length_no_response_and_a_big_upload_to_a_slow_reader() -> None:
    async def main() -> None:
        async with serving(App()) as (_, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /stream HTTP/1.0\r\n\r\n")  # no chunked encoding in 1.0
            data = await asyncio.wait_for(reader.read(), 5)
            assert b"transfer-encoding" not in data
            assert data.endswith(b"\r\n\r\npart0;part1;part2;")
            writer.close()
            status, _, body = await request(port, b"GET /nothing HTTP/1.1\r\nhost: t\r\n\r\n")
            assert (status, body) == (500, b"Internal Server Error")
            upload = bytes(range(256)) * 8192  # 2 MiB, read by the app a piece at a time
            raw = b"POST /slow-reader HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n" % len(
                upload
            )
            status, _, body = await request(port, raw + upload)
            assert (status, body) == (200, b"POST /slow-reader  " + upload)

    asyncio.run(main())
