"""The gateway's upstream HTTP client against a raw socket server: bodies by length, chunked
and until close; kept-alive connections reused; connect failures and timeouts told apart."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from kairos.http.client import HTTPClient, HTTPFailure

Reply = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


async def serve(reply: Reply) -> tuple[asyncio.Server, str, list[int]]:
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await reply(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}/v1/x", connections


def test_bodies_by_length_chunked_and_close() -> None:
    async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            body = await read_request(reader)
            if body == b"chunked":
                writer.write(
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                    b"5\r\nline1\r\n7\r\n\nline2\n\r\n0\r\n\r\n"
                )
            else:
                writer.write(b"HTTP/1.1 201 Created\r\ncontent-length: 4\r\n\r\n" + body[:4])
            await writer.drain()

    async def until_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async def scenario() -> None:
        client = HTTPClient()
        server, url, connections = await serve(keep_alive)
        try:
            response = await client.request("POST", url, {}, b"abcdef", 5.0)
            assert (response.status, await response.read()) == (201, b"abcd")
            response = await client.request("POST", url, {}, b"chunked", 5.0)
            assert [line async for line in response.lines()] == [b"line1", b"line2"]
            assert len(connections) == 1  # the connection was kept and reused
            closing, close_url, _ = await serve(until_close)
            response = await client.request("POST", close_url, {}, b"x", 5.0)
            assert await response.read() == b"all of it"
            closing.close()
        finally:
            await client.close()
            server.close()

    asyncio.run(scenario())


def test_connect_failures_and_timeouts_are_told_apart() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(5)

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()

    async def scenario() -> None:
        client = HTTPClient()
        try:
            with pytest.raises(HTTPFailure) as refused:
                await client.request("POST", "http://127.0.0.1:1/v1/x", {}, b"", 1.0)
            assert not refused.value.connected
            server, url, _ = await serve(silent)
            with pytest.raises(HTTPFailure) as slow:
                await client.request("POST", url, {}, b"", 0.2)
            assert slow.value.connected and slow.value.timed_out
            server.close()
            server, url, _ = await serve(cut)
            response = await client.request("POST", url, {}, b"", 5.0)
            with pytest.raises(HTTPFailure, match="closed the connection"):
                await response.read()
            server.close()
        finally:
            await client.close()

    asyncio.run(scenario())
