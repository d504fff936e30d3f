"""Anthropic's Messages API, both ways: a provider that serves OpenAI-shaped chat calls from
an Anthropic upstream, and the translation that lets `/v1/messages` callers (the official
`anthropic` SDK) use any deployment. Streams are translated event by event."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from kairos.gateway import sse
from kairos.gateway.config import ProviderConfig
from kairos.gateway.errors import (
    InvalidRequest,
    UnsupportedRoute,
    UpstreamError,
    UpstreamIncomplete,
)
from kairos.gateway.http import HTTPClient
from kairos.gateway.providers import event_stream, json_reply, post
from kairos.gateway.scrub import Secrets

API_VERSION = "2023-06-01"
_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}
_FINISH = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _text(content: Any, where: str) -> str:
    """Text of a message's content: a string or a list of text parts (either API's shape)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                raise InvalidRequest(
                    f"{where}[{index}]: only text parts are supported through the gateway's "
                    'translation, e.g. {"type": "text", "text": "..."}',
                    param=where,
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise InvalidRequest(f"{where} must be a string or a list of text parts", param=where)


# --- OpenAI chat request -> Anthropic upstream ----------------------------------------------


def to_anthropic(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat request as an Anthropic Messages request."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for index, message in enumerate(body.get("messages", [])):
        role = message.get("role")
        text = _text(message.get("content", ""), f"messages[{index}].content")
        if role in ("system", "developer"):
            system.append(text)
        elif role in ("user", "assistant"):
            messages.append({"role": role, "content": text})
        else:
            raise InvalidRequest(
                f"messages[{index}].role {role!r} cannot be sent to an Anthropic deployment; "
                "use system, user or assistant",
                param=f"messages[{index}].role",
            )
    request: dict[str, Any] = {
        "model": body["model"],
        "messages": messages,
        "max_tokens": body.get("max_completion_tokens") or body["max_tokens"],
    }
    if system:
        request["system"] = "\n\n".join(system)
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            request[name] = body[name]
    stop = body.get("stop")
    if stop:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    return request


def from_anthropic(reply: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic message as an OpenAI chat completion."""
    text = "".join(
        part.get("text", "") for part in reply.get("content", []) if part.get("type") == "text"
    )
    usage = reply.get("usage") or {}
    tokens_in, tokens_out = int(usage.get("input_tokens", 0)), int(usage.get("output_tokens", 0))
    return {
        "id": reply.get("id", ""),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": reply.get("model", ""),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": _STOP.get(reply.get("stop_reason") or "", "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": tokens_in,
            "completion_tokens": tokens_out,
            "total_tokens": tokens_in + tokens_out,
        },
    }


async def chunks_from_anthropic(
    events: AsyncIterator[sse.Event], provider: str
) -> AsyncIterator[dict[str, Any]]:
    """Anthropic stream events as OpenAI chunks; the last carries usage."""
    ident, model, tokens_in, tokens_out = "", "", 0, 0
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }  # fmt: skip

    async for event in events:
        try:
            data = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            raise UpstreamError(
                f"provider {provider!r} streamed an event that is not JSON"
            ) from None
        kind = data.get("type")
        if kind == "message_start":
            message = data.get("message", {})
            ident, model = message.get("id", ""), message.get("model", "")
            tokens_in = int((message.get("usage") or {}).get("input_tokens", 0))
            yield chunk({"role": "assistant", "content": ""})
        elif kind == "content_block_delta":
            delta = data.get("delta", {})
            if delta.get("type") == "text_delta":
                yield chunk({"content": delta.get("text", "")})
        elif kind == "message_delta":
            usage = data.get("usage") or {}
            tokens_out = int(usage.get("output_tokens", tokens_out))
            tokens_in = int(usage.get("input_tokens") or tokens_in)
            stop = (data.get("delta") or {}).get("stop_reason")
            yield chunk({}, _STOP.get(stop or "", "stop"))
        elif kind == "message_stop":
            yield {
                "id": ident, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [],
                "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                          "total_tokens": tokens_in + tokens_out},
            }  # fmt: skip
            return
        elif kind == "error":
            error = data.get("error") or {}
            raise UpstreamError(
                f"provider {provider!r} failed mid-stream: {error.get('message', 'error')}"
            )
    # the body ended by its framing (or with none) before message_stop: cut short
    raise UpstreamIncomplete(
        f"provider {provider!r} ended the stream before message_stop; the answer may be cut short"
    )


class AnthropicProvider:
    """An Anthropic Messages API upstream serving chat calls."""

    kinds = frozenset({"chat"})

    def __init__(self, config: ProviderConfig, client: HTTPClient | None = None) -> None:
        self.name = config.name
        self.config = config
        self._client = client or HTTPClient()
        self._headers = {
            "content-type": "application/json",
            "anthropic-version": API_VERSION,
            **config.headers,
        }
        if config.api_key:
            self._headers["x-api-key"] = config.api_key

    def _url(self, kind: str) -> str:
        if kind != "chat":
            raise UnsupportedRoute(f"provider {self.name!r} (anthropic) serves chat calls only")
        return self.config.base_url + "/v1/messages"

    async def send(self, kind: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        url = self._url(kind)
        response = await post(
            self._client, self.config, url, self._headers, to_anthropic(body), timeout
        )
        reply = await json_reply(self.config, response)
        try:
            return from_anthropic(reply)
        except (AttributeError, TypeError, ValueError):
            raise UpstreamError(f"provider {self.name!r} sent a malformed message") from None

    async def stream(self, kind: str, body: dict[str, Any], timeout: float) -> AsyncIterator[bytes]:
        url = self._url(kind)
        payload = {**to_anthropic(body), "stream": True}
        response = await post(self._client, self.config, url, self._headers, payload, timeout)
        chunks = chunks_from_anthropic(event_stream(self.config, response), self.name)
        try:
            async for chunk in chunks:
                yield orjson.dumps(chunk)
        except UpstreamError as error:
            error.accepted = True
            Secrets.of_provider(self.config).scrub_error(error)  # it may quote the key it got
            raise
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    async def close(self) -> None:
        await self._client.close()


# --- Anthropic request from a /v1/messages caller -> OpenAI chat, and back ------------------


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages API request as an OpenAI chat request (checked; errors name the field)."""
    allowed = {
        "model", "messages", "max_tokens", "system", "temperature", "top_p", "top_k",
        "stop_sequences", "stream", "metadata",
    }  # fmt: skip
    unknown = set(body) - allowed
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidRequest(
            f"{name!r} is not supported on /v1/messages; use {', '.join(sorted(allowed))}",
            param=name,
        )
    if not isinstance(body.get("model"), str):
        raise InvalidRequest('model is required, e.g. "claude-haiku-4-5"', param="model")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise InvalidRequest("max_tokens is required: a positive integer", param="max_tokens")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest(
            'messages is a non-empty list, e.g. [{"role": "user", "content": "Hi"}]',
            param="messages",
        )
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": _text(system, "system")})
    for index, message in enumerate(raw):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise InvalidRequest(
                f"messages[{index}] needs role user or assistant and content",
                param=f"messages[{index}]",
            )
        messages.append(
            {
                "role": message["role"],
                "content": _text(message.get("content"), f"messages[{index}].content"),
            }
        )
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": max_tokens}
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if body.get("stream"):
        chat["stream"] = True
    return chat


def chat_to_message(reply: dict[str, Any], model: str) -> dict[str, Any]:
    """An OpenAI chat completion as an Anthropic message."""
    choice = (reply.get("choices") or [{}])[0]
    text = (choice.get("message") or {}).get("content") or ""
    usage = reply.get("usage") or {}
    return {
        "id": "msg_" + str(reply.get("id", "")).removeprefix("chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": _FINISH.get(choice.get("finish_reason") or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens", 0)),
            "output_tokens": int(usage.get("completion_tokens", 0)),
        },
    }


async def message_events(
    chunks: AsyncIterator[dict[str, Any]], model: str, request_id: str
) -> AsyncIterator[bytes]:
    """OpenAI chunks (and gateway error events) as an Anthropic event stream."""
    yield sse.encode(
        {
            "type": "message_start",
            "message": {
                "id": f"msg_{request_id}", "type": "message", "role": "assistant",
                "model": model, "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            },
        },
        "message_start",
    )  # fmt: skip
    yield sse.encode(
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        "content_block_start",
    )
    finish, tokens_in, tokens_out = "stop", 0, 0
    async for chunk in chunks:
        if "error" in chunk:
            error = chunk["error"]
            yield sse.encode(
                {"type": "error", "error": {"type": "api_error", "message": error["message"]}},
                "error",
            )
            return
        for choice in chunk.get("choices") or []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                yield sse.encode(
                    {"type": "content_block_delta", "index": 0,
                     "delta": {"type": "text_delta", "text": text}},
                    "content_block_delta",
                )  # fmt: skip
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            tokens_in = int(usage.get("prompt_tokens", 0))
            tokens_out = int(usage.get("completion_tokens", 0))
    yield sse.encode({"type": "content_block_stop", "index": 0}, "content_block_stop")
    yield sse.encode(
        {
            "type": "message_delta",
            "delta": {"stop_reason": _FINISH.get(finish, "end_turn"), "stop_sequence": None},
            "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out},
        },
        "message_delta",
    )
    yield sse.encode({"type": "message_stop"}, "message_stop")
