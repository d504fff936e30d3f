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
  tools    chat: calls the tool asked for (tool_choice's, else the first) with
           `arguments[its name]`; for a json_schema response_format, answers
           `arguments[the schema's name]` as JSON content
  tool_use chat and /v1/messages, whole or streamed: calls the request's tools with input
           `tool_input` (the forced one, else the first two, or one when parallel calls are
           off), as OpenAI tool_calls or tool_use blocks, streaming the input in pieces;
           Anthropic's answer says "Let me check." first unless a tool is forced

`/v1/messages/count_tokens` answers 100 input tokens per message plus one per tool.

/v1/responses (the Responses API) answers echo, fail, busy, bad and slow the same, and streams
typed events ending with `response.completed` (usage in it); `cut` drops the connection after
two deltas, `broken` sends an `error` event (quoting the credential; `wordy` quotes it after
254 characters of filler), `truncated` ends without
a terminal event, `failing` ends with `response.failed` (usage in it), `late` sends its deltas
0.1 s apart, `forging` sends an event whose type holds line breaks.

`cut` and `truncated` apply to chat, completions and /v1/messages streams alike.

A test that needs answers of its own (the LLM features', the evaluation judge's) subclasses
`FakeUpstream` and overrides `reply(body)`: its chat calls are answered with that text and
usage, whole or streamed in `pieces` chunks `pause` seconds apart (`last(body)` adds fields to
the usage chunk), in place of the scripted modes. This is the one fake provider of the suite.

`ServerThread` runs any ASGI app with uvicorn on a free localhost port in a thread;
`close_delimited` serves one on the running loop with bodies that end when the connection does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import socket
import struct
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

from kairos.http.server import Server

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
        self.arguments: dict[str, dict[str, Any]] = {}  # what `tools` answers, by tool name
        # prompt-cache tokens reported, by upstream model: {"read": n, "write": n, "write_1h": n}
        self.cache: dict[str, dict[str, int]] = {}
        self.remote_image = (4096, 1536)  # the size of every image sent by URL (not fetched)
        self.tool_input: dict[str, Any] = {"city": "Paris"}  # what `tool_use` answers

    pieces = 1  # a `reply` streamed: its text in this many chunks
    pause = 0.0  # seconds before each chunk of a streamed `reply`

    def reply(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """A subclass's own answer to a chat call, (text, OpenAI usage); None: the modes."""
        return None

    def last(self, body: dict[str, Any]) -> dict[str, Any]:
        """Fields a subclass adds to a streamed `reply`'s usage chunk."""
        return {}

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/v1/embeddings", self.embeddings, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
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
        limit = (
            body.get("max_completion_tokens")
            or body.get("max_tokens")
            or body.get("max_output_tokens")
            or 16
        )
        return int(min(limit, self.chunks))

    async def chat(self, request: Request) -> Response:
        body, mode, failure = await self._begin(request)
        if failure:
            return failure
        reply = self.reply(body)
        if reply is not None:
            return self._reply(body, *reply)
        if mode == "tools" and not body.get("stream"):
            return _json(self._scripted(body))
        if mode == "tool_use":
            return self._chat_tool_use(body)
        out = self._out(body)
        if not body.get("stream"):
            return _json({
                "id": "chatcmpl-fake", "object": "chat.completion", "created": 1,
                "model": body["model"],
                "choices": [{"index": i, "message": {"role": "assistant", "content": "tok " * out},
                             "finish_reason": "stop"} for i in range(body.get("n") or 1)],
                "usage": self._usage(body, out * (body.get("n") or 1)),
            })  # fmt: skip
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(
            self._chat_stream(body, mode, out, include, _credential(request)),
            media_type="text/event-stream",
        )

    async def _chat_stream(
        self, body: dict[str, Any], mode: str, out: int, include: bool, quoted: str = ""
    ) -> AsyncIterator[bytes]:
        choices = range(body.get("n") or 1)  # each step streams a chunk of every choice

        def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
            chunk = {
                "id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                "model": body["model"],
                "choices": [{"index": i, "delta": delta, "finish_reason": finish}
                            for i in choices],
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
            usage = self._usage(body, out * len(choices))
            chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                     "model": body["model"], "choices": [], "usage": usage}  # fmt: skip
            yield b"data: " + orjson.dumps(chunk) + b"\n\n"
        yield b"data: [DONE]\n\n"
        self.finished_streams += 1

    def _reply(self, body: dict[str, Any], text: str, usage: dict[str, Any]) -> Response:
        if not body.get("stream"):
            return _json({
                "id": "chatcmpl-fake", "object": "chat.completion", "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": "stop"}],
                "usage": usage,
            })  # fmt: skip
        size = max(len(text) // self.pieces, 1)
        pieces = [text[i * size : (i + 1) * size] for i in range(self.pieces - 1)]
        pieces.append(text[(self.pieces - 1) * size :])
        last = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                "model": body["model"], "choices": [], "usage": usage}  # fmt: skip
        last.update(self.last(body))

        async def stream() -> AsyncIterator[bytes]:
            for piece in pieces:
                if self.pause:
                    await asyncio.sleep(self.pause)
                chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                         "model": body["model"],
                         "choices": [{"index": 0, "delta": {"content": piece},
                                      "finish_reason": None}]}  # fmt: skip
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            yield b"data: " + orjson.dumps(last) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    def _tools_called(self, body: dict[str, Any], anthropic: bool) -> list[str]:
        """The names of the tools a `tool_use` answer calls."""
        if anthropic:
            names = [tool["name"] for tool in body.get("tools") or []]
            choice = body.get("tool_choice") or {}
            forced = choice.get("name") if choice.get("type") == "tool" else None
            single = bool(choice.get("disable_parallel_tool_use"))
        else:
            names = [tool["function"]["name"] for tool in body.get("tools") or []]
            choice = body.get("tool_choice")
            forced = choice["function"]["name"] if isinstance(choice, dict) else None
            single = body.get("parallel_tool_calls") is False
        return [forced] if forced else names[: 1 if single else 2]

    def _tool_pieces(self) -> list[str]:
        """The tool input's JSON in three pieces, as a provider streams it."""
        text = orjson.dumps(self.tool_input).decode()
        third = max(1, len(text) // 3)
        return [text[:third], text[third : 2 * third], text[2 * third :]]

    def _chat_tool_use(self, body: dict[str, Any]) -> Response:
        names = self._tools_called(body, anthropic=False)
        arguments = orjson.dumps(self.tool_input).decode()
        usage = {"prompt_tokens": TOKENS_IN, "completion_tokens": 7,
                 "total_tokens": TOKENS_IN + 7}  # fmt: skip
        if not body.get("stream"):
            calls = [{"id": f"call_{i}", "type": "function",
                      "function": {"name": name, "arguments": arguments}}
                     for i, name in enumerate(names)]  # fmt: skip
            return _json({
                "id": "chatcmpl-fake", "object": "chat.completion", "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                    "role": "assistant", "content": None, "tool_calls": calls}}],
                "usage": usage,
            })  # fmt: skip

        def frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                     "model": body["model"], "choices": [choice]}  # fmt: skip
            return b"data: " + orjson.dumps(chunk) + b"\n\n"

        out = [frame({"role": "assistant", "content": None})]
        for index, name in enumerate(names):
            out.append(frame({"tool_calls": [{
                "index": index, "id": f"call_{index}", "type": "function",
                "function": {"name": name, "arguments": ""}}]}))  # fmt: skip
            for piece in self._tool_pieces():
                out.append(frame({"tool_calls": [
                    {"index": index, "function": {"arguments": piece}}]}))  # fmt: skip
        out.append(frame({}, "tool_calls"))
        last = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                "model": body["model"], "choices": [], "usage": usage}  # fmt: skip
        out += [b"data: " + orjson.dumps(last) + b"\n\n", b"data: [DONE]\n\n"]
        return Response(b"".join(out), media_type="text/event-stream")

    async def count_tokens(self, request: Request) -> Response:
        body, _, failure = await self._begin(request)
        if failure:
            return failure
        return _json({"input_tokens": 100 * len(body["messages"]) + len(body.get("tools") or [])})

    def _scripted(self, body: dict[str, Any]) -> dict[str, Any]:
        """A `tools` chat answer: a call to the tool asked for, or JSON content for a schema."""
        schema = (body.get("response_format") or {}).get("json_schema")
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if schema:
            message["content"] = orjson.dumps(self.arguments[schema["name"]]).decode()
            finish = "stop"
        else:
            choice = body.get("tool_choice")
            name = (
                choice["function"]["name"]
                if isinstance(choice, dict)
                else body["tools"][0]["function"]["name"]
            )
            arguments = orjson.dumps(self.arguments[name]).decode()
            call = {"name": name, "arguments": arguments}
            message["tool_calls"] = [{"id": "call_fake", "type": "function", "function": call}]
            finish = "tool_calls"
        return {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 1,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": TOKENS_IN, "completion_tokens": 7,
                      "total_tokens": TOKENS_IN + 7},
        }  # fmt: skip

    async def responses(self, request: Request) -> Response:
        body, mode, failure = await self._begin(request)
        if failure:
            return failure
        out = self._out(body)
        if not body.get("stream"):
            return _json(_response(body, out, "completed"))
        quoted = request.headers.get("authorization", "")
        return StreamingResponse(
            self._response_stream(body, mode, out, quoted), media_type="text/event-stream"
        )

    async def _response_stream(
        self, body: dict[str, Any], mode: str, out: int, quoted: str
    ) -> AsyncIterator[bytes]:
        sequence = 0

        def event(data: dict[str, Any]) -> bytes:
            nonlocal sequence
            data = {"type": data.pop("type"), "sequence_number": sequence, **data}
            sequence += 1
            return f"event: {data['type']}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"

        item = {"type": "message", "id": "msg_fake", "status": "in_progress",
                "role": "assistant", "content": []}  # fmt: skip
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": "msg_fake", "output_index": 0, "content_index": 0}
        yield event({"type": "response.created", "response": _response(body, 0, "in_progress")})
        yield event({"type": "response.in_progress", "response": _response(body, 0, "in_progress")})
        yield event({"type": "response.output_item.added", "output_index": 0, "item": item})
        yield event({"type": "response.content_part.added", **where, "part": part})
        if mode == "forging":  # a type that, written as an `event:` line, would start a frame
            forged = {"type": 'response.output_text.delta\n\ndata: {"forged": 1}'}
            yield b"data: " + orjson.dumps(forged) + b"\n\n"
        for index in range(out):
            if mode == "late":
                await asyncio.sleep(0.1)
            if index == 2 and mode == "cut":
                raise RuntimeError("scripted cut")  # uvicorn drops the connection
            if index == 2 and mode in ("broken", "wordy"):
                # wordy: the key lies across the 300 characters a provider's message is cut to
                filler = "x" * 254 if mode == "wordy" else ""
                message = f"scripted overload {filler}({quoted})"
                yield event({"type": "error", "code": "server_error", "message": message})
                return
            yield event({"type": "response.output_text.delta", **where, "delta": "tok ",
                         "logprobs": []})  # fmt: skip
        if mode == "truncated":
            return
        text = "tok " * out
        yield event({"type": "response.output_text.done", **where, "text": text, "logprobs": []})
        yield event({"type": "response.content_part.done", **where, "part": {**part, "text": text}})
        done = _response(body, out, "completed")["output"][0]
        yield event({"type": "response.output_item.done", "output_index": 0, "item": done})
        last = "failed" if mode == "failing" else "completed"
        yield event({"type": f"response.{last}", "response": _response(body, out, last)})
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
        prompt = body["prompt"]
        prompts = len(prompt) if isinstance(prompt, list) and not isinstance(prompt[0], int) else 1
        answers = prompts * (body.get("n") or 1)  # n answers to each prompt
        return _json({
            "id": "cmpl-fake", "object": "text_completion", "created": 1, "model": body["model"],
            "choices": [{"index": i, "text": "tok " * out, "finish_reason": "stop",
                         "logprobs": None} for i in range(answers)],
            "usage": {"prompt_tokens": TOKENS_IN, "completion_tokens": out * answers,
                      "total_tokens": TOKENS_IN + out * answers},
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
        if mode == "tool_use":
            return self._message_tool_use(body)
        out = int(min(body["max_tokens"], self.chunks))
        if not body.get("stream"):
            return _json({
                "id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"],
                "content": [{"type": "text", "text": "tok " * out}], "stop_reason": "end_turn",
                "stop_sequence": None, "usage": self._message_usage(body, out),
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
            "usage": self._message_usage(body, 1)}})  # fmt: skip
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

    def _message_tool_use(self, body: dict[str, Any]) -> Response:
        names = self._tools_called(body, anthropic=True)
        forced = (body.get("tool_choice") or {}).get("type") in ("tool", "any")
        text: list[dict[str, Any]] = [] if forced else [{"type": "text", "text": "Let me check."}]
        uses = [{"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": self.tool_input}
                for i, name in enumerate(names)]  # fmt: skip
        blocks = [*text, *uses]
        usage = {"input_tokens": TOKENS_IN, "output_tokens": 7}
        if not body.get("stream"):
            return _json({
                "id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"],
                "content": blocks, "stop_reason": "tool_use", "stop_sequence": None,
                "usage": usage,
            })  # fmt: skip

        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\n".encode() + b"data: " + orjson.dumps(data) + b"\n\n"

        out = [event("message_start", {"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"],
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": TOKENS_IN, "output_tokens": 1}}})]  # fmt: skip
        for index, block in enumerate(blocks):
            start = {**block, "input": {}} if block["type"] == "tool_use" else {**block, "text": ""}
            started = {"type": "content_block_start", "index": index, "content_block": start}
            out.append(event("content_block_start", started))
            if block["type"] == "text":
                deltas = [{"type": "text_delta", "text": block["text"]}]
            else:
                deltas = [{"type": "input_json_delta", "partial_json": piece}
                          for piece in ["", *self._tool_pieces()]]  # fmt: skip
            for delta in deltas:
                out.append(event("content_block_delta", {
                    "type": "content_block_delta", "index": index, "delta": delta}))  # fmt: skip
            out.append(event("content_block_stop", {"type": "content_block_stop", "index": index}))
        stop = {"stop_reason": "tool_use", "stop_sequence": None}
        out.append(event("message_delta", {"type": "message_delta", "delta": stop,
                                           "usage": {"output_tokens": 7}}))  # fmt: skip
        out.append(event("message_stop", {"type": "message_stop"}))
        return Response(b"".join(out), media_type="text/event-stream")

    def _images(self, body: dict[str, Any]) -> list[tuple[int, int, str]]:
        """(width, height, detail) of each image part of a chat or Messages request: a PNG's
        from its header, an image sent by URL `remote_image`."""
        found = []
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, dict) else None
            for part in content if isinstance(content, list) else []:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "image_url":
                    image = part["image_url"]
                    url = image["url"] if isinstance(image, dict) else image
                    detail = image.get("detail", "auto") if isinstance(image, dict) else "auto"
                    data = url.partition(",")[2] if url.startswith("data:") else None
                elif kind == "image":
                    source, detail = part["source"], "auto"
                    data = source.get("data") if source.get("type") == "base64" else None
                else:
                    continue
                size = _png_size(base64.b64decode(data)) if data else self.remote_image
                found.append((*size, detail))
        return found

    def _usage(self, body: dict[str, Any], out: int) -> dict[str, Any]:
        """OpenAI usage: images billed by OpenAI's formula, the scripted cache reads (a part of
        prompt_tokens)."""
        images = sum(_openai_image(body["model"], *image) for image in self._images(body))
        read = self.cache.get(body["model"], {}).get("read", 0)
        prompt = TOKENS_IN + images + read
        usage: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": out,
            "total_tokens": prompt + out,
        }
        if read:
            usage["prompt_tokens_details"] = {"cached_tokens": read}
        return usage

    def _message_usage(self, body: dict[str, Any], out: int) -> dict[str, Any]:
        """Anthropic usage: images billed by Anthropic's formula, the scripted cache reads and
        writes (beside input_tokens, which leaves them out)."""
        images = sum(_claude_image(width, height) for width, height, _ in self._images(body))
        usage: dict[str, Any] = {"input_tokens": TOKENS_IN + images, "output_tokens": out}
        cache = self.cache.get(body["model"])
        if cache:
            usage["cache_read_input_tokens"] = cache.get("read", 0)
            usage["cache_creation_input_tokens"] = cache.get("write", 0)
            long = cache.get("write_1h", 0)
            usage["cache_creation"] = {
                "ephemeral_5m_input_tokens": cache.get("write", 0) - long,
                "ephemeral_1h_input_tokens": long,
            }
        return usage


# Image tokens as the providers bill them (the formulas the gateway's bounds are the maxima
# of): OpenAI's tiles, (base, per 512 px tile) by model; Anthropic's pixels / 750.
_TILES = {"gpt-4o-mini": (2833, 5667), "gpt-4o": (85, 170), "o3": (75, 150)}


def _openai_image(model: str, width: int, height: int, detail: str) -> int:
    base, tile = next(
        (cost for name, cost in _TILES.items() if model.startswith(name)), _TILES["gpt-4o"]
    )
    if detail == "low":
        return base
    scale = min(1.0, 2048 / max(width, height))  # fit in 2048 x 2048
    scale *= min(1.0, 768 / (min(width, height) * scale))  # then the short side in 768
    return base + tile * math.ceil(width * scale / 512) * math.ceil(height * scale / 512)


def _claude_image(width: int, height: int) -> int:
    scale = min(1.0, 1568 / max(width, height), math.sqrt(1_150_000 / (width * height)))
    return math.ceil(width * scale * height * scale / 750)


def _png_size(data: bytes) -> tuple[int, int]:
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("the fake upstream reads PNG images only")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _response(body: dict[str, Any], out: int, status: str) -> dict[str, Any]:
    """A Responses API response object: `out` tokens of text, usage once it is not running."""
    text = "tok " * out
    message = {"type": "message", "id": "msg_fake", "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip
    usage = {
        "input_tokens": TOKENS_IN, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": TOKENS_IN + out,
    }  # fmt: skip
    running = status == "in_progress"
    return {
        "id": "resp_fake", "object": "response", "created_at": 1, "status": status,
        "model": body["model"], "output": [] if running else [message],
        "error": {"code": "server_error", "message": "scripted failure"}
        if status == "failed" else None,
        "incomplete_details": None, "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"), "metadata": {},
        "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto", "tools": [],
        "top_p": 1.0, "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "usage": None if running else usage,
    }  # fmt: skip


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
        self,
        app: Any,
        *,
        port: int | None = None,
        loop: str = "asyncio",
        kairos: bool = False,
        http: str = "httptools",
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: uvicorn.Server | Server
        if kairos:
            self.server = Server(app)
        else:
            config = uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="error", lifespan="off",
                loop=loop, http=http, access_log=False,
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
