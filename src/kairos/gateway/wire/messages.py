"""The `/v1/messages` route (Anthropic's Messages API) on any deployment: an Anthropic
request as an OpenAI chat body for the gateway, the chat reply as an Anthropic message, the
chat stream as Anthropic events, and `/v1/messages/count_tokens`. (The provider direction,
chat calls served by an Anthropic upstream, is providers/anthropic.py.)

`/v1/messages` takes system, messages (text, image, base64 PDF document, tool_use and
tool_result blocks; a tool_result's is_error is said in its text, as OpenAI's tool messages
have no flag), tools (client tools; Anthropic's server tools are a 400), tool_choice,
metadata.user_id (-> user), stop_sequences, temperature, top_p, stream; top_k, thinking and
the rest are a 400. `cache_control` marks are dropped: caching changes the price, never the
answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from kairos.gateway.bounds import MAX_TOKENS, cut, integer, model_name, shown
from kairos.gateway.errors import InvalidRequest, UpstreamError
from kairos.gateway.providers.anthropic import content_text, usage_as_anthropic
from kairos.http import sse
from kairos.llm.tokens import tokenizer_for

_FINISH = {
    "stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
    "content_filter": "refusal",
}  # fmt: skip

_MESSAGES_FIELDS = frozenset({
    "model", "messages", "max_tokens", "system", "temperature", "top_p", "stop_sequences",
    "stream", "metadata", "tools", "tool_choice",
})  # fmt: skip


def _openai_image(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An Anthropic image block as an OpenAI image_url part."""
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    if source.get("type") == "base64" and source.get("media_type") and source.get("data"):
        url = f"data:{source['media_type']};base64,{source['data']}"
    elif source.get("type") == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise InvalidRequest(
            f'{where}.source is {{"type": "base64", "media_type": ..., "data": ...}} or '
            '{"type": "url", "url": ...} (file ids are Anthropic\'s own)',
            param=f"{where}.source",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _openai_file(block: dict[str, Any], where: str) -> dict[str, Any]:
    """An Anthropic document block holding a base64 PDF as an OpenAI file part."""
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    if source.get("type") != "base64" or source.get("media_type") != "application/pdf":
        raise InvalidRequest(
            f"{where}.source: only base64 PDF documents can be sent to this model's deployment",
            param=f"{where}.source",
        )
    data_url = f"data:application/pdf;base64,{source.get('data', '')}"
    name = str(block.get("title") or "document.pdf")
    return {"type": "file", "file": {"file_data": data_url, "filename": name}}


def _tool_message(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A tool_result block as an OpenAI tool message (text only: OpenAI's tool messages are)."""
    if not isinstance(block.get("tool_use_id"), str):
        raise InvalidRequest(f"{where}.tool_use_id is required", param=f"{where}.tool_use_id")
    content = block.get("content")
    text = content_text(content, f"{where}.content") if content is not None else ""
    if block.get("is_error"):  # OpenAI has no error flag: the model reads it in the text
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": text}


def _chat_messages(message: Any, index: int) -> list[dict[str, Any]]:
    """One Anthropic message as OpenAI chat messages: a user turn's tool results become tool
    messages (first, as OpenAI wants them right after the call), its other blocks a user one."""
    where = f"messages[{index}]"
    role = message.get("role") if isinstance(message, dict) else None
    if role not in ("user", "assistant"):
        raise InvalidRequest(f"{where} needs role user or assistant and content", param=where)
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content must be a string or a list of blocks",
                             param=f"{where}.content")  # fmt: skip
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for number, block in enumerate(content):
        at = f"{where}.content[{number}]"
        kind = block.get("type") if isinstance(block, dict) else None
        # cache_control on a block is a caching hint: the answer does not depend on it
        if kind == "text":
            parts.append({"type": "text", "text": str(block.get("text", ""))})
        elif kind == "image" and role == "user":
            parts.append(_openai_image(block, at))
        elif kind == "document" and role == "user":
            parts.append(_openai_file(block, at))
        elif kind == "tool_result" and role == "user":
            tools.append(_tool_message(block, at))
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input"), dict):
                raise InvalidRequest(f"{at} needs a name and an input object", param=at)
            arguments = orjson.dumps(block["input"]).decode()
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": block["name"], "arguments": arguments}})  # fmt: skip
        else:
            takes = "text, image, document, tool_result" if role == "user" else "text, tool_use"
            raise InvalidRequest(
                f"{at}.type {shown(kind)} cannot be translated for this model's deployment; a "
                f"{role} message takes {takes} blocks",
                param=f"{at}.type",
            )
    if role == "assistant":
        text = "".join(p["text"] for p in parts)
        reply: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            reply["tool_calls"] = calls
        return [reply]
    if parts and all(p["type"] == "text" for p in parts):
        return [*tools, {"role": "user", "content": "".join(p["text"] for p in parts)}]
    return [*tools, {"role": "user", "content": parts}] if parts else tools


def _chat_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequest('tools is a list of {"name", "input_schema", ...}', param="tools")
    out = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise InvalidRequest(
                f"{where}: Anthropic's server tools ({shown(kind)}) cannot be run by this model's "
                "deployment; define a client tool with name, description and input_schema",
                param=where,
            )
        if not isinstance(tool.get("name"), str) or not isinstance(tool.get("input_schema"), dict):
            raise InvalidRequest(f"{where} needs a name and an input_schema object", param=where)
        function: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _chat_tool_choice(choice: Any, chat: dict[str, Any]) -> None:
    """Anthropic's tool_choice as OpenAI's tool_choice and parallel_tool_calls, in `chat`."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "any", "none"):
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    elif kind == "tool" and isinstance(choice.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        raise InvalidRequest(
            'tool_choice is {"type": "auto"}, {"type": "any"}, {"type": "none"} or '
            '{"type": "tool", "name": "..."}',
            param="tool_choice",
        )
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages API request as an OpenAI chat request (checked; errors name the field)."""
    unknown = set(body) - _MESSAGES_FIELDS
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidRequest(
            f"{shown(name)} is not supported on /v1/messages; use "
            + ", ".join(sorted(_MESSAGES_FIELDS)),
            param=cut(name),
        )
    model_name(body, "claude-haiku-4-5")
    max_tokens = integer(body, "max_tokens", 1, MAX_TOKENS, "output tokens, e.g. 1024")
    if max_tokens is None:
        raise InvalidRequest(
            f"max_tokens is required: an integer from 1 to {MAX_TOKENS}, e.g. 1024",
            param="max_tokens",
        )
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest(
            'messages is a non-empty list, e.g. [{"role": "user", "content": "Hi"}]',
            param="messages",
        )
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": content_text(system, "system")})
    for index, message in enumerate(raw):
        messages += _chat_messages(message, index)
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": max_tokens}
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences"):
        chat["stop"] = body["stop_sequences"]
    if body.get("stream"):
        chat["stream"] = True
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict) or set(metadata) - {"user_id"}:
            raise InvalidRequest('metadata is {"user_id": "..."}', param="metadata")
        if metadata.get("user_id"):
            chat["user"] = str(metadata["user_id"])
    if body.get("tools"):
        chat["tools"] = _chat_tools(body["tools"])
    if body.get("tool_choice") is not None:
        _chat_tool_choice(body["tool_choice"], chat)
    return chat


def chat_to_message(reply: dict[str, Any], model: str) -> dict[str, Any]:
    """An OpenAI chat completion as an Anthropic message; its tool calls are tool_use blocks."""
    choice = (reply.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text = message.get("content") or ""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            given = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            given = None
        if not isinstance(given, dict):  # models can write broken JSON; Anthropic's is an object
            raise UpstreamError("the model's tool call arguments are not a JSON object")
        content.append({"type": "tool_use", "id": str(call.get("id", "")),
                        "name": str(function.get("name", "")), "input": given})  # fmt: skip
    usage = reply.get("usage") or {}
    return {
        "id": "msg_" + str(reply.get("id", "")).removeprefix("chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content or [{"type": "text", "text": ""}],
        "stop_reason": _FINISH.get(choice.get("finish_reason") or "stop", "end_turn"),
        "stop_sequence": None,
        "usage": usage_as_anthropic(usage),
    }


class _Blocks:
    """The content blocks of a translated stream: text at index 0 first, then a block for
    each tool call, or text again (OpenAI streams each call's pieces before the next's)."""

    def __init__(self) -> None:
        self.index = 0  # the open block
        self.kind = "text"
        self.calls: dict[int, int] = {}  # a tool call's index -> its block's

    def text(self, text: str) -> list[bytes]:
        events = self._start({"type": "text", "text": ""}) if self.kind != "text" else []
        self.kind = "text"
        delta = {"type": "text_delta", "text": text}
        return [*events, self._delta(self.index, delta)]

    def tool_call(self, call: dict[str, Any]) -> list[bytes]:
        function = call.get("function") or {}
        number = call.get("index", 0)
        events = []
        if number not in self.calls:
            name, ident = str(function.get("name") or ""), str(call.get("id") or "")
            events = self._start({"type": "tool_use", "id": ident, "name": name, "input": {}})
            self.kind, self.calls[number] = "tool_use", self.index
        if function.get("arguments"):
            delta = {"type": "input_json_delta", "partial_json": function["arguments"]}
            events.append(self._delta(self.calls[number], delta))
        return events

    def stop(self) -> bytes:
        return sse.encode({"type": "content_block_stop", "index": self.index}, "content_block_stop")

    def _start(self, block: dict[str, Any]) -> list[bytes]:
        stop = self.stop()
        self.index += 1
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [stop, sse.encode(start, "content_block_start")]

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        event = {"type": "content_block_delta", "index": index, "delta": delta}
        return sse.encode(event, "content_block_delta")


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
    finish, usage = "stop", {}
    blocks = _Blocks()
    async for chunk in chunks:
        if "error" in chunk:
            error = chunk["error"]
            yield sse.encode(
                {"type": "error", "error": {"type": "api_error", "message": error["message"]}},
                "error",
            )
            return
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                for event in blocks.text(delta["content"]):
                    yield event
            for call in delta.get("tool_calls") or []:
                for event in blocks.tool_call(call):
                    yield event
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
    yield blocks.stop()
    yield sse.encode(
        {
            "type": "message_delta",
            "delta": {"stop_reason": _FINISH.get(finish, "end_turn"), "stop_sequence": None},
            "usage": usage_as_anthropic(usage),
        },
        "message_delta",
    )
    yield sse.encode({"type": "message_stop"}, "message_stop")


# --- /v1/messages/count_tokens ----------------------------------------------------------------

COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice"})


def count_request(body: dict[str, Any]) -> dict[str, Any]:
    """A count_tokens body, checked, as the chat request it stands for (errors name the field)."""
    unknown = set(body) - COUNT_FIELDS
    if unknown:
        name = sorted(unknown)[0]
        raise InvalidRequest(
            f"{shown(name)} is not supported on /v1/messages/count_tokens; use "
            + ", ".join(sorted(COUNT_FIELDS)),
            param=cut(name),
        )
    return messages_to_chat({**body, "max_tokens": 1})


def tokenizer_count(body: dict[str, Any]) -> int:
    """Input tokens of a count_tokens body (`body["model"]` the upstream model) by the model's
    own tokenizer, for a provider with no count endpoint; a 400 when kairos has none."""
    return chat_tokens(count_request(body), body["model"])


def chat_tokens(chat: dict[str, Any], model: str) -> int:
    """Input tokens of a chat request by the model's own tokenizer, framed as OpenAI's
    cookbook counts them (3 per message, 3 priming the reply); tool definitions count as
    their JSON. A model kairos has no exact tokenizer for, or an image, is a 400.

    >>> chat_tokens({"messages": [{"role": "user", "content": "hello world"}]}, "gpt-4")
    9
    """
    tokenizer = tokenizer_for(model)
    if not tokenizer.exact:
        raise InvalidRequest(
            f"the gateway cannot count tokens for {model!r}: it has no exact tokenizer for that "
            "model (only OpenAI's cl100k_base models and Anthropic deployments are counted)",
            param="model",
        )
    count = tokenizer.count
    total = 3
    for message in chat["messages"]:
        total += 3 + count(message["role"])
        content = message.get("content") or ""
        for part in [content] if isinstance(content, str) else content:
            if isinstance(part, str):
                total += count(part)
            elif part.get("type") == "text":
                total += count(part["text"])
            else:  # an image's tokens depend on its size and detail, which need decoding it
                raise InvalidRequest(
                    f"the gateway cannot count {shown(part.get('type'))} parts for {model!r}; "
                    "count the text only",
                    param="messages",
                )
        for call in message.get("tool_calls") or []:
            total += count(call["function"]["name"]) + count(call["function"]["arguments"])
    if chat.get("tools"):
        total += count(orjson.dumps(chat["tools"]).decode())
    return total
