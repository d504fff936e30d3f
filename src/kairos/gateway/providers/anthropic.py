"""Anthropic's Messages API as a provider: OpenAI-shaped chat calls (and Responses calls,
through chat) served from an Anthropic upstream, translated both ways, streams event by event.
The other direction, `/v1/messages` callers (the official `anthropic` SDK) on any deployment,
is wire/messages.py; the usage translation both directions share is here.

Nothing is dropped silently: a field either side cannot carry is a 400 naming it. OpenAI chat
fields, for an Anthropic deployment:

- translated: messages (system and developer turns are `system`; tool_calls are tool_use
  blocks; consecutive tool messages are one user turn of tool_result blocks; image_url parts
  are image blocks, base64 from data: URLs, `url` sources from http(s); a file part holding a
  base64 PDF is a document block), max_tokens / max_completion_tokens, temperature, top_p,
  stop, stream, tools (function tools; `strict` is not enforced by Anthropic), tool_choice
  (auto, none, required -> any, a named function -> tool), parallel_tool_calls: false
  (disable_parallel_tool_use), user or safety_identifier (metadata.user_id).
- response_format: json_schema becomes one forced tool whose input_schema is the schema, and
  json_object one taking any object (so the answer is always an object, which a system line
  asking for JSON would not promise); the tool's input is returned as the message's text, and
  the answer's finish_reason is stop. Neither combines with tools (a 400).
- dropped, as they do not change the answer: stream_options (the gateway asks for usage),
  metadata (tags of OpenAI's stored completions), prediction (a latency hint),
  prompt_cache_key, service_tier; and n, logprobs, frequency/presence_penalty, store,
  logit_bias, modalities at their defaults (1, false, 0, false, {}, ["text"]).
- a 400: anything else, e.g. seed (Anthropic has no sampling seed), logprobs or top_logprobs,
  n > 1, logit_bias, penalties, audio or other modalities, reasoning_effort, verbosity,
  functions / function_call (use tools), web_search_options, a message's `name`, and
  content parts other than text, image_url and file.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from kairos.gateway.bounds import shown
from kairos.gateway.config import ProviderConfig
from kairos.gateway.errors import (
    InvalidRequest,
    UnsupportedRoute,
    UpstreamError,
    UpstreamIncomplete,
)
from kairos.gateway.providers.base import event_stream, json_reply, post
from kairos.gateway.providers.responses_chat import (
    check_fields,
    response_events,
    to_chat,
    to_response,
    untranslatable,
)
from kairos.http import sse
from kairos.http.client import HTTPClient

API_VERSION = "2023-06-01"
_STOP = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "model_context_window_exceeded": "length",
}


def content_text(content: Any, where: str) -> str:
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

# OpenAI chat fields carried to Anthropic by `to_anthropic` (each decided in the docstring)
_CARRIED = frozenset({
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop",
    "stream", "tools", "tool_choice", "parallel_tool_calls", "response_format", "user",
    "safety_identifier",
})  # fmt: skip
# fields that do not change the answer, so an Anthropic call goes without them
_HARMLESS = frozenset({
    "stream_options",  # the gateway asks for usage itself; Anthropic streams always carry it
    "metadata",  # tags for OpenAI's stored completions; nothing is stored at Anthropic
    "prediction",  # a latency hint (the expected output); the answer does not depend on it
    "prompt_cache_key",  # OpenAI's cache-routing hint
    "service_tier",  # OpenAI's processing tier; the gateway bills by its own prices
})  # fmt: skip
# fields that are harmless at their default value (and a 400 otherwise)
_DEFAULTS: dict[str, Any] = {
    "n": 1, "logprobs": False, "frequency_penalty": 0, "presence_penalty": 0, "store": False,
    "logit_bias": {}, "modalities": ["text"],
}  # fmt: skip
_MESSAGE_FIELDS = {
    "system": {"role", "content"},
    "developer": {"role", "content"},
    "user": {"role", "content"},
    "assistant": {"role", "content", "tool_calls", "refusal"},
    "tool": {"role", "content", "tool_call_id"},
}
_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
JSON_ANSWER = "json_answer"  # the forced tool a json_object response_format becomes


def _data_url(url: str, where: str) -> tuple[str, str]:
    """(media type, base64 data) of a `data:<type>;base64,<data>` URL."""
    head, comma, data = url.partition(",")
    media, _, encoding = head.removeprefix("data:").partition(";")
    if not comma or encoding != "base64" or not media:
        raise InvalidRequest(
            f'{where} must be a base64 data URL ("data:image/png;base64,...") or an https URL',
            param=where,
        )
    return media, data


def _image_block(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An OpenAI image_url part as an Anthropic image block (`detail` has no equivalent: it
    picks OpenAI's resolution, and Claude sizes images itself)."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    where = f"{where}.image_url.url"
    if not isinstance(url, str):
        raise InvalidRequest(f"{where} is required: a data: or https URL", param=where)
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    if not url.startswith("data:"):
        raise InvalidRequest(f"{where} must be a data: or https URL", param=where)
    media, data = _data_url(url, where)
    if media not in _IMAGE_TYPES:
        raise InvalidRequest(
            f"{where}: Anthropic takes images of type {', '.join(_IMAGE_TYPES)}, not "
            f"{shown(media)}",
            param=where,
        )
    return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}


def _file_block(part: dict[str, Any], where: str) -> dict[str, Any]:
    """An OpenAI file part carrying a PDF as an Anthropic document block."""
    file = part.get("file")
    data_url = file.get("file_data") if isinstance(file, dict) else None
    if not isinstance(data_url, str):
        raise untranslatable(f"{where}.file", " unless it has file_data (file ids are OpenAI's)")
    media, data = _data_url(data_url, f"{where}.file.file_data")
    if media != "application/pdf":
        raise untranslatable(f"{where}.file", f" as {shown(media)} (Anthropic reads PDFs)")
    return {"type": "document", "source": {"type": "base64", "media_type": media, "data": data}}


def _user_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of parts", param=where)
    blocks = []
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if part.get("text"):  # Anthropic refuses empty text blocks
                blocks.append({"type": "text", "text": str(part["text"])})
        elif kind == "image_url":
            blocks.append(_image_block(part, at))
        elif kind == "file":
            blocks.append(_file_block(part, at))
        else:
            raise untranslatable(
                f"{at}.type", f" as {shown(kind)} (it takes text, image_url, file)"
            )
    return blocks


def _assistant_blocks(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    content = message.get("content")
    blocks: list[dict[str, Any]] = []
    if isinstance(content, list):  # text and refusal parts
        for index, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in ("text", "refusal"):
                raise untranslatable(f"{where}.content[{index}].type", f" as {shown(kind)}")
            if part.get(kind):
                blocks.append({"type": "text", "text": str(part[kind])})
    elif content:
        blocks.append({"type": "text", "text": content_text(content, f"{where}.content")})
    if message.get("refusal"):
        blocks.append({"type": "text", "text": str(message["refusal"])})
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise InvalidRequest(f"{where}.tool_calls must be a list", param=f"{where}.tool_calls")
    for index, call in enumerate(calls):
        at = f"{where}.tool_calls[{index}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise untranslatable(f"{at}.type", " unless it is a function call")
        arguments = function.get("arguments") or "{}"
        try:
            given = orjson.loads(arguments) if isinstance(arguments, str) else None
        except orjson.JSONDecodeError:
            given = None
        if not isinstance(given, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequest(
                f"{at}.function needs a name and arguments that are a JSON object, as a string",
                param=f"{at}.function",
            )
        blocks.append({"type": "tool_use", "id": str(call.get("id", "")),
                       "name": function["name"], "input": given})  # fmt: skip
    return blocks


def _tool_result(message: dict[str, Any], where: str) -> dict[str, Any]:
    ident = message.get("tool_call_id")
    if not isinstance(ident, str) or not ident:
        raise InvalidRequest(
            f"{where}.tool_call_id is required: the id of the tool call it answers",
            param=f"{where}.tool_call_id",
        )
    text = content_text(message.get("content") or "", f"{where}.content")
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": ident}
    if text:
        result["content"] = text
    return result


def _anthropic_messages(raw: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """(system texts, Anthropic messages) of OpenAI chat messages."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for index, message in enumerate(raw or []):
        where = f"messages[{index}]"
        role = message.get("role")
        if role not in _MESSAGE_FIELDS:
            raise InvalidRequest(
                f"{where}.role {shown(role)} cannot be sent to an Anthropic deployment; "
                "use system, developer, user, assistant or tool",
                param=f"{where}.role",
            )
        extra = sorted(k for k, v in message.items() if v is not None)
        extra = [k for k in extra if k not in _MESSAGE_FIELDS[role]]
        if extra:
            raise untranslatable(f"{where}.{extra[0]}", f" (on a {role} message)")
        if role in ("system", "developer"):
            system.append(content_text(message.get("content", ""), f"{where}.content"))
            continue
        if role == "user":
            blocks = _user_blocks(message.get("content"), f"{where}.content")
        elif role == "assistant":
            blocks = _assistant_blocks(message, where)
        else:
            blocks, role = [_tool_result(message, where)], "user"
        # consecutive turns of a role are one Anthropic message: tool results, then any text
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": blocks})
    return system, messages


def _anthropic_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise InvalidRequest('tools is a list of {"type": "function", ...}', param="tools")
    out = []
    for index, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            raise untranslatable(f"tools[{index}]", " unless it is a function tool")
        if not isinstance(function.get("name"), str):
            raise InvalidRequest(f"tools[{index}].function.name is required",
                                 param=f"tools[{index}].function.name")  # fmt: skip
        # `strict` has no Anthropic equivalent: Claude follows input_schema, unenforced
        translated = {
            "name": function["name"],
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            translated["description"] = function["description"]
        out.append(translated)
    return out


def _anthropic_tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if parallel is not None and not isinstance(parallel, bool):
        raise InvalidRequest("parallel_tool_calls must be true or false",
                             param="parallel_tool_calls")  # fmt: skip
    named = choice.get("function") if isinstance(choice, dict) else None
    translated: dict[str, Any] | None
    if choice is None:
        translated = {"type": "auto"} if parallel is False else None
    elif isinstance(choice, str) and choice in ("auto", "none", "required"):
        translated = {"type": {"required": "any"}.get(choice, choice)}
    elif isinstance(named, dict) and choice.get("type") == "function" and named.get("name"):
        translated = {"type": "tool", "name": str(named["name"])}
    else:
        raise InvalidRequest(
            'tool_choice is "auto", "none", "required" or '
            '{"type": "function", "function": {"name": "..."}} for an Anthropic deployment',
            param="tool_choice",
        )
    if translated is not None and parallel is False and translated["type"] != "none":
        translated["disable_parallel_tool_use"] = True
    return translated


def answer_tool(body: dict[str, Any]) -> str | None:
    """The name of the forced tool that carries a JSON `response_format`'s answer, if any."""
    response_format = body.get("response_format")
    if not isinstance(response_format, dict):
        return None
    if response_format.get("type") == "json_object":
        return JSON_ANSWER
    schema = response_format.get("json_schema")
    if response_format.get("type") == "json_schema" and isinstance(schema, dict):
        return str(schema.get("name") or "")
    return None


def _answer_tools(response_format: Any) -> list[dict[str, Any]]:
    """The single tool a JSON response_format becomes (none for text)."""
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if response_format is None or kind == "text":
        return []
    if kind == "json_object":
        return [{"name": JSON_ANSWER, "description": "Give the answer as a JSON object.",
                 "input_schema": {"type": "object"}}]  # fmt: skip
    spec = response_format.get("json_schema") if kind == "json_schema" else None
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"]:
        raise InvalidRequest(
            'response_format is {"type": "text"}, {"type": "json_object"} or {"type": '
            '"json_schema", "json_schema": {"name": "...", "schema": {...}}}',
            param="response_format",
        )
    if not isinstance(schema, dict) or schema.get("type") != "object":
        raise untranslatable(
            "response_format.json_schema.schema", " unless its root is an object schema"
        )
    description = spec.get("description") or "Give the answer in this schema."
    return [{"name": spec["name"], "description": description, "input_schema": schema}]


def to_anthropic(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat request as an Anthropic Messages request; a field that cannot be
    carried is an InvalidRequest naming it, never dropped.

    >>> to_anthropic({"model": "claude", "max_tokens": 5, "tool_choice": "required",
    ...     "tools": [{"type": "function", "function": {"name": "f"}}],
    ...     "messages": [{"role": "user", "content": "hi"}]})["tool_choice"]
    {'type': 'any'}
    """
    check_fields(body, _CARRIED, _HARMLESS, _DEFAULTS)
    system, messages = _anthropic_messages(body.get("messages"))
    request: dict[str, Any] = {
        "model": body["model"],
        "messages": messages,
        # Anthropic requires it; the gateway sets it to what the hold covers
        "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens") or 4096,
    }
    if system:
        request["system"] = "\n\n".join(system)
    for name in ("temperature", "top_p"):
        if body.get(name) is not None:
            request[name] = body[name]
    stop = body.get("stop")
    if stop:
        request["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    user = body.get("user") or body.get("safety_identifier")
    if user:
        request["metadata"] = {"user_id": str(user)}
    if body.get("tools"):
        request["tools"] = _anthropic_tools(body["tools"])
    choice = _anthropic_tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"))
    if choice is not None and body.get("tools"):
        request["tool_choice"] = choice
    elif choice is not None and choice["type"] not in ("auto", "none"):
        raise InvalidRequest(f"tool_choice {shown(body['tool_choice'])} needs tools", param="tools")
    # without tools, "auto", "none" and parallel_tool_calls choose among nothing: Anthropic
    # refuses a tool_choice without tools, and the answer is the same without one
    answer = _answer_tools(body.get("response_format"))
    if answer:
        if body.get("tools"):
            raise untranslatable(
                "response_format", " together with tools (a JSON answer is a forced tool there)"
            )
        request["tools"] = answer
        request["tool_choice"] = {"type": "tool", "name": answer[0]["name"]}
    return request


def from_anthropic(reply: dict[str, Any], answer: str | None = None) -> dict[str, Any]:
    """An Anthropic message as an OpenAI chat completion: tool_use blocks are tool calls,
    except the `answer` tool's, whose input is the answer's text (a JSON response_format)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in reply.get("content", []):
        kind = part.get("type")
        if kind == "text":
            texts.append(part.get("text", ""))
        elif kind == "tool_use" and part.get("name") == answer:
            texts.append(orjson.dumps(part.get("input") or {}).decode())
        elif kind == "tool_use":
            function = {"name": part.get("name", ""),
                        "arguments": orjson.dumps(part.get("input") or {}).decode()}  # fmt: skip
            calls.append({"id": part.get("id", ""), "type": "function", "function": function})
    message: dict[str, Any] = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
    }
    if calls:
        message["tool_calls"] = calls
    finish = _STOP.get(reply.get("stop_reason") or "", "stop")
    if finish == "tool_calls" and not calls:  # the answer tool: the answer is done
        finish = "stop"
    usage = reply.get("usage") or {}
    return {
        "id": reply.get("id", ""),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": reply.get("model", ""),
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish,
            }
        ],
        "usage": usage_as_openai(usage),
    }


async def chunks_from_anthropic(
    events: AsyncIterator[sse.Event], provider: str, answer: str | None = None
) -> AsyncIterator[dict[str, Any]]:
    """Anthropic stream events as OpenAI chunks; the last carries usage. A tool_use block is a
    tool call (its input_json_delta pieces the arguments), the `answer` tool's is text."""
    ident, model = "", ""
    reported: dict[str, Any] = {}  # the usage so far (message_start's, message_delta's)
    calls: dict[int, int] = {}  # a tool_use block's index -> its tool call's index
    answers: set[int] = set()  # indexes of the answer tool's blocks
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
            reported.update(message.get("usage") or {})
            yield chunk({"role": "assistant", "content": ""})
        elif kind == "content_block_start":
            block, index = data.get("content_block") or {}, data.get("index", 0)
            if block.get("type") == "tool_use" and block.get("name") == answer:
                answers.add(index)
            elif block.get("type") == "tool_use":
                calls[index] = len(calls)
                yield chunk({"tool_calls": [{
                    "index": calls[index], "id": block.get("id", ""), "type": "function",
                    "function": {"name": block.get("name", ""), "arguments": ""},
                }]})  # fmt: skip
        elif kind == "content_block_delta":
            delta, index = data.get("delta", {}), data.get("index", 0)
            if delta.get("type") == "text_delta":
                yield chunk({"content": delta.get("text", "")})
            elif delta.get("type") == "input_json_delta" and index in answers:
                yield chunk({"content": delta.get("partial_json", "")})
            elif delta.get("type") == "input_json_delta" and index in calls:
                arguments = {"arguments": delta.get("partial_json", "")}
                yield chunk({"tool_calls": [{"index": calls[index], "function": arguments}]})
        elif kind == "message_delta":
            # counts so far; a zero input count is one not given (only output counts here)
            given = (data.get("usage") or {}).items()
            reported.update((k, v) for k, v in given if v or k == "output_tokens")
            stop = (data.get("delta") or {}).get("stop_reason")
            finish = _STOP.get(stop or "", "stop")
            # the answer tool's use ends the answer; it is no tool call
            yield chunk({}, "stop" if finish == "tool_calls" and not calls else finish)
        elif kind == "message_stop":
            yield {
                "id": ident, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [], "usage": usage_as_openai(reported),
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
    """An Anthropic Messages API upstream serving chat calls, and Responses calls through
    chat (responses_chat.py translates them both ways)."""

    kinds = frozenset({"chat", "responses"})

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

    def check(self, kind: str, body: dict[str, Any]) -> None:
        """Raise InvalidRequest (naming the field) if `body` cannot be sent to Anthropic."""
        if kind == "chat":
            to_anthropic(body)
        elif kind == "responses":
            to_anthropic(to_chat(body))

    async def send(self, kind: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        if kind == "responses":
            return to_response(await self.send("chat", to_chat(body), timeout), body)
        url = self._url(kind)
        response = await post(
            self._client, self.config, url, self._headers, to_anthropic(body), timeout
        )
        reply = await json_reply(self.config, response)
        try:
            return from_anthropic(reply, answer_tool(body))
        except (AttributeError, TypeError, ValueError):
            raise UpstreamError(f"provider {self.name!r} sent a malformed message") from None

    async def stream(self, kind: str, body: dict[str, Any], timeout: float) -> AsyncIterator[bytes]:
        if kind == "responses":
            events = response_events(self.stream("chat", to_chat(body), timeout), body)
            async for event in events:
                yield event
            return
        url = self._url(kind)
        payload = {**to_anthropic(body), "stream": True}
        response = await post(self._client, self.config, url, self._headers, payload, timeout)
        chunks = chunks_from_anthropic(
            event_stream(self.config, response), self.name, answer_tool(body)
        )
        try:
            async for chunk in chunks:
                yield orjson.dumps(chunk)
        except UpstreamError as error:
            error.accepted = True  # a quoted key is masked by the gateway's Stream
            raise
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    async def count_tokens(self, body: dict[str, Any], timeout: float) -> int:
        """Input tokens of a Messages request (`body["model"]` is the upstream model), as the
        provider's own count_tokens answers."""
        url = self.config.base_url + "/v1/messages/count_tokens"
        response = await post(self._client, self.config, url, self._headers, body, timeout)
        reply = await json_reply(self.config, response)
        tokens = reply.get("input_tokens")
        if not isinstance(tokens, int) or isinstance(tokens, bool):
            raise UpstreamError(f"provider {self.name!r} sent a count without input_tokens")
        return tokens

    async def close(self) -> None:
        await self._client.close()


# --- usage, both ways -------------------------------------------------------------------------


def _tokens(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_as_openai(usage: Any) -> dict[str, Any]:
    """Anthropic usage in OpenAI's shape, as `providers.openai_usage` reads it: prompt_tokens
    counts every input token (Anthropic's input_tokens leaves the cache's out), cache reads
    are cached_tokens, cache writes cache_creation_input_tokens (as LiteLLM reports them)."""
    usage = usage if isinstance(usage, dict) else {}
    read = _tokens(usage.get("cache_read_input_tokens"))
    written = _tokens(usage.get("cache_creation_input_tokens"))
    prompt = _tokens(usage.get("input_tokens")) + read + written
    completion = _tokens(usage.get("output_tokens"))
    result: dict[str, Any] = {
        "prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }  # fmt: skip
    if read or written:
        result["prompt_tokens_details"] = {"cached_tokens": read}
        result["cache_read_input_tokens"] = read
        result["cache_creation_input_tokens"] = written
        if isinstance(usage.get("cache_creation"), dict):  # the 5-minute and 1-hour writes
            result["cache_creation"] = usage["cache_creation"]
    return result


def usage_as_anthropic(usage: Any) -> dict[str, Any]:
    """OpenAI usage (with the cache fields `usage_as_openai` writes) in Anthropic's shape."""
    usage = usage if isinstance(usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    read = _tokens(details.get("cached_tokens") if isinstance(details, dict) else None)
    written = _tokens(usage.get("cache_creation_input_tokens"))
    result: dict[str, Any] = {
        "input_tokens": max(0, _tokens(usage.get("prompt_tokens")) - read - written),
        "output_tokens": _tokens(usage.get("completion_tokens")),
    }
    if read or written:
        result["cache_read_input_tokens"] = read
        result["cache_creation_input_tokens"] = written
    return result
