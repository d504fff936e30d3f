"""A fake LLM provider speaking real HTTP (OpenAI and Anthropic wire formats), with scripted
behaviour chosen by the upstream model name (or `behaviour[model]`, changeable mid-test):

  echo     answers at once; usage: 10 tokens in, min(max_tokens, 5) out
  slow     waits `slow_seconds` first
  fail     500            busy   429            bad    400
  cut      streams two chunks, then drops the connection (no usage)
  late     streams 5 chunks 0.1 s apart, usage last (for client-disconnect tests)
  broken   streams two chunks, then an in-band error event quoting the credential (chat,
           and Anthropic's `event: error` on /v1/messages)
  truncated  streams two chunks, then ends the body (well framed) without its terminal
           event (no `data: [DONE]`; no `message_stop` on /v1/messages)
  page     500 with a non-JSON page: 190 bytes, then the credential (across byte 200)
  timed    answers after `delay` seconds; streams `chunks` chunks over `stream_seconds`

`cut` and `truncated` apply to chat, completions and /v1/messages streams alike.

`ServerThread` runs any ASGI app with uvicorn on a free localhost port in a thread;
`close_delimited` serves one on the running loop with bodies that end when the connection does.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from kairos.server.http1 import Server

T = TypeVar("T")
TOKENS_IN = 10


class FakeUpstream:
    def __init__(self, *, delay: float = 0.0, chunks: int = 5, stream_seconds: float = 0.0) -> None:
        self.behaviour: dict[str, str] = {}
        self.received: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.delay = delay
        self.chunks = chunks
        self.stream_seconds = stream_seconds
        self.slow_seconds = 0.3
        self.finished_streams = 0
        self.keep_log = True

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
            ]
        )

    async def _begin(self, request: Request) -> tuple[dict[str, Any], str, Response | None]:
        body = orjson.loads(await request.body())
        if self.keep_log:
            self.received.append(body)
            self.headers.append(dict(request.headers))
        mode = self.behaviour.get(body.get("model", ""), body.get("model", ""))
        if mode == "slow":
            await asyncio.sleep(self.slow_seconds)
        if mode == "timed" and self.delay and not body.get("stream"):
            await asyncio.sleep(self.delay)
        if mode == "page":  # an error page from a proxy in front of the provider
            page = b"<html><body>" + b"x" * 178 + _credential(request).encode() + b"</body></html>"
            return body, mode, Response(page, 500, media_type="text/html")
        failure = {"fail": 500, "busy": 429, "bad": 400}.get(mode)
        if failure:
            # a careless provider that quotes the credential it was sent
            quoted = request.headers.get("authorization", "")
            message = {"error": {"message": f"scripted {failure} ({quoted})", "type": "scripted"}}
            return (
                body,
                mode,
                Response(orjson.dumps(message), failure, media_type="application/json"),
            )
        return body, mode, None

    def _out(self, body: dict[str, Any]) -> int:
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or 16
        return int(min(limit, self.chunks))

    async def chat(self, request: Request) -> Response:
        body, mode, failure = await self._begin(request)
        if failure:
            return failure
        out = self._out(body)
        if not body.get("stream"):
            return _json({
                "id": "chatcmpl-fake", "object": "chat.completion", "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok " * out},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": TOKENS_IN, "completion_tokens": out,
                          "total_tokens": TOKENS_IN + out},
            })  # fmt: skip
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            self._chat_stream(body, mode, out, include, _credential(request)),
            media_type="text/event-stream",
        )

    async def _chat_stream(
        self, body: dict[str, Any], mode: str, out: int, include: bool, quoted: str = ""
    ) -> AsyncIterator[bytes]:
        def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
            chunk = {
                "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }  # fmt: skip
            return b"data: " + orjson.dumps(chunk) + b"\n\n"

        pause = {"late": 0.1, "timed": self.stream_seconds / max(out, 1)}.get(mode, 0.0)
        if mode == "timed" and self.delay:
            await asyncio.sleep(self.delay)
        yield frame({"role": "assistant", "content": ""})
        # chunk i is due at start + (i + 1) * pause, like a provider whose tokens come at its
        # own pace: a late wake-up (this machine is shared with the caller) delays one chunk,
        # it does not push back every chunk after it
        loop = asyncio.get_running_loop()
        start = loop.time()
        for index in range(out):
            if pause:
                await asyncio.sleep(max(0.0, start + (index + 1) * pause - loop.time()))
            if index == 2 and mode == "cut":
                raise RuntimeError("scripted cut")  # uvicorn drops the connection
            if index == 2 and mode == "broken":
                error = {"error": {"message": f"scripted overload (key {quoted})"}}
                yield b"data: " + orjson.dumps(error) + b"\n\n"
                return
            if index == 2 and mode == "truncated":
                return
            yield frame({"content": "tok "})
        yield frame({}, "stop")
        if include:
            usage = {
                "prompt_tokens": TOKENS_IN,
                "completion_tokens": out,
                "total_tokens": TOKENS_IN + out,
            }
            chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                     "model": body["model"], "choices": [], "usage": usage}  # fmt: skip
            yield b"data: " + orjson.dumps(chunk) + b"\n\n"
        yield b"data: [DONE]\n\n"
        self.finished_streams += 1

    async def completions(self, request: Request) -> Response:
        body, mode, failure = await self._begin(request)
        if failure:
            return failure
        out = self._out(body)
        if body.get("stream"):
            return StreamingResponse(
                self._completion_stream(body, mode, out), media_type="text/event-stream"
            )
        return _json({
            "id": "cmpl-fake", "object": "text_completion", "created": 1, "model": body["model"],
            "choices": [{"index": 0, "text": "tok " * out, "finish_reason": "stop",
                         "logprobs": None}],
            "usage": {"prompt_tokens": TOKENS_IN, "completion_tokens": out,
                      "total_tokens": TOKENS_IN + out},
        })  # fmt: skip

    async def _completion_stream(
        self, body: dict[str, Any], mode: str, out: int
    ) -> AsyncIterator[bytes]:
        def frame(text: str, finish: str | None = None, usage: Any = None) -> bytes:
            chunk = {
                "id": "cmpl-fake", "object": "text_completion", "created": 1,
                "model": body["model"], "usage": usage,
                "choices": [{"index": 0, "text": text, "finish_reason": finish,
                             "logprobs": None}] if usage is None else [],
            }  # fmt: skip
            return b"data: " + orjson.dumps(chunk) + b"\n\n"

        for index in range(out):
            if index == 2 and mode == "cut":
                raise RuntimeError("scripted cut")  # uvicorn drops the connection
            if index == 2 and mode == "truncated":
                return
            yield frame("tok ")
        yield frame("", "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": TOKENS_IN, "completion_tokens": out,
                     "total_tokens": TOKENS_IN + out}  # fmt: skip
            yield frame("", usage=usage)
        yield b"data: [DONE]\n\n"
        self.finished_streams += 1

    async def embeddings(self, request: Request) -> Response:
        body, _, failure = await self._begin(request)
        if failure:
            return failure
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        return _json({
            "object": "list", "model": body["model"],
            "data": [{"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]}
                     for i in range(len(inputs))],
            "usage": {"prompt_tokens": TOKENS_IN, "total_tokens": TOKENS_IN},
        })  # fmt: skip

    async def messages(self, request: Request) -> Response:
        body, mode, failure = await self._begin(request)
        if failure:
            return failure
        out = int(min(body["max_tokens"], self.chunks))
        if not body.get("stream"):
            return _json({
                "id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"],
                "content": [{"type": "text", "text": "tok " * out}], "stop_reason": "end_turn",
                "stop_sequence": None, "usage": {"input_tokens": TOKENS_IN, "output_tokens": out},
            })  # fmt: skip
        return StreamingResponse(
            self._message_stream(body, out, mode, _credential(request)),
            media_type="text/event-stream",
        )

    async def _message_stream(
        self, body: dict[str, Any], out: int, mode: str = "echo", quoted: str = ""
    ) -> AsyncIterator[bytes]:
        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"

        yield event("message_start", {"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"],
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": TOKENS_IN, "output_tokens": 1}}})  # fmt: skip
        block = {"type": "text", "text": ""}
        yield event(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        )
        yield event("ping", {"type": "ping"})
        for index in range(out):
            if index == 2 and mode == "cut":
                raise RuntimeError("scripted cut")  # uvicorn drops the connection
            if index == 2 and mode == "truncated":
                return
            if index == 2 and mode == "broken":
                error = {"type": "overloaded_error", "message": f"scripted overload ({quoted})"}
                yield event("error", {"type": "error", "error": error})
                return
            delta = {"type": "text_delta", "text": "tok "}
            yield event(
                "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
            )
        yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
        yield event("message_delta", {"type": "message_delta",
                                      "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                      "usage": {"output_tokens": out}})  # fmt: skip
        yield event("message_stop", {"type": "message_stop"})


def _credential(request: Request) -> str:
    """The key a provider was sent (a careless one quotes it back)."""
    bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
    return request.headers.get("x-api-key") or bearer


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status, media_type="application/json")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerThread:
    """An ASGI app served on 127.0.0.1 in a background thread (its own loop): by uvicorn, or,
    with `kairos=True`, by kairos' own HTTP/1.1 server (what `kairos gateway serve` runs)."""

    def __init__(
        self, app: Any, *, port: int | None = None, loop: str = "asyncio", kairos: bool = False
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: uvicorn.Server | Server
        if kairos:
            self.server = Server(app)
        else:
            config = uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="error", lifespan="off",
                loop=loop, http="httptools", access_log=False,
            )  # fmt: skip
            self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        server = self.server
        try:
            if isinstance(server, Server):
                self.loop.run_until_complete(server.serve("127.0.0.1", self.port))
            else:
                self.loop.run_until_complete(server.serve())
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    @property
    def started(self) -> bool:
        server = self.server
        return server.started.is_set() if isinstance(server, Server) else server.started

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run a coroutine on the server's loop (where its app's resources live)."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def __exit__(self, *exc: object) -> None:
        server = self.server
        if isinstance(server, Server):
            assert self.loop is not None
            self.loop.call_soon_threadsafe(server.stop)
        else:
            server.should_exit = True
        self.thread.join(10)


async def close_delimited(app: Any) -> tuple[asyncio.Server, str]:
    """Serve `app` on the running loop, one request per connection, each answer's body with
    neither a content-length nor chunks: it ends when the connection closes (HTTP/1.0 style,
    as some servers and proxies stream). Returns the server and its URL."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            method, target, _ = head[0].split(" ", 2)
            fields = [line.partition(":") for line in head[1:] if line]
            headers = [(n.strip().lower().encode(), v.strip().encode()) for n, _, v in fields]
            body = await reader.readexactly(int(dict(headers).get(b"content-length", b"0")))
            path, _, query = target.partition("?")
            scope = {
                "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
                "query_string": query.encode(), "root_path": "", "headers": headers,
                "server": ("127.0.0.1", 0), "client": ("127.0.0.1", 0),
            }  # fmt: skip
            requested = False

            async def receive() -> dict[str, Any]:
                nonlocal requested
                if requested:  # nothing more: wait until the answer is written
                    await asyncio.Event().wait()
                requested = True
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    lines = [f"HTTP/1.1 {message['status']} OK", "connection: close"]
                    lines += [
                        f"{n.decode()}: {v.decode()}"
                        for n, v in message.get("headers", [])
                        if n.lower() not in (b"content-length", b"transfer-encoding")
                    ]
                    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
                elif message["type"] == "http.response.body":
                    writer.write(message.get("body", b""))
                    await writer.drain()

            with contextlib.suppress(Exception):  # a scripted cut: the body just ends
                await app(scope, receive, send)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"
