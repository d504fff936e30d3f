"""The Responses API over a provider that serves chat calls only (kairos' Anthropic
provider): a Responses request as a chat request, a chat answer as a response object, and a
chat stream as the Responses stream's typed events. A field with no chat equivalent is a 400
naming it, never dropped; the chat request is then checked by the provider's own translation.

>>> to_chat({"model": "m", "instructions": "Be brief", "input": "Hi", "max_output_tokens": 9})
{'model': 'm', 'messages': [{'role': 'system', 'content': 'Be brief'}, {'role': 'user', \
'content': 'Hi'}], 'max_tokens': 9}
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from kairos.gateway.accounting.accountant import new_id
from kairos.gateway.bounds import cut, shown
from kairos.gateway.errors import InvalidRequest

_PASSED = ("model", "temperature", "top_p", "parallel_tool_calls", "stream")
_CARRIED = frozenset({
    *_PASSED, "input", "instructions", "max_output_tokens", "tools", "tool_choice", "text",
    "user", "safety_identifier",
})  # fmt: skip
# fields that do not change the answer (the gateway keeps no responses, bills by its prices)
_HARMLESS = frozenset({"store", "metadata", "stream_options", "prompt_cache_key", "service_tier"})
_DEFAULTS: dict[str, Any] = {"truncation": "disabled", "include": [], "background": False}
_ROLES = frozenset({"user", "assistant", "system", "developer"})


def untranslatable(name: str, why: str = "") -> InvalidRequest:
    """The 400 for a field (or part) kairos' Anthropic translation cannot carry."""
    return InvalidRequest(
        f"{cut(name)} cannot be sent to an Anthropic deployment{why}; drop it, or call a "
        "model served by an OpenAI-compatible deployment",
        param=cut(name),
    )


def check_fields(
    body: dict[str, Any],
    carried: frozenset[str],
    harmless: frozenset[str],
    defaults: dict[str, Any],
) -> None:
    """A 400 naming the first field of `body` a translation cannot honour: one it neither
    carries nor may drop (`harmless`, or at its value in `defaults`)."""
    for name in sorted(body):
        value = body[name]
        if value is None or name in carried or name in harmless:
            continue
        if name not in defaults:
            raise untranslatable(name)
        if value != defaults[name]:
            raise untranslatable(name, f" as {shown(value)} (only {defaults[name]!r})")


# --- Responses request -> chat ---------------------------------------------------------------


def to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request (already checked by `responses.check_responses`) as a chat one."""
    check_fields(body, _CARRIED, _HARMLESS, _DEFAULTS)
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    given = body["input"]
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    else:
        for index, item in enumerate(given):
            _item(item, f"input[{index}]", messages)
    chat: dict[str, Any] = {name: body[name] for name in _PASSED if body.get(name) is not None}
    chat["messages"] = messages
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    user = body.get("safety_identifier") or body.get("user")
    if user:
        chat["user"] = user
    if body.get("tools"):
        chat["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(body["tools"])]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    text = body.get("text")
    if text is not None:
        response_format = _format(text)
        if response_format is not None:
            chat["response_format"] = response_format
    return chat


def _item(item: dict[str, Any], where: str, messages: list[dict[str, Any]]) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise InvalidRequest(
                f"{where}.role is user, assistant, system or developer", param=f"{where}.role"
            )
        content = item.get("content")
        if isinstance(content, str):
            messages.append({"role": role, "content": content})
            return
        if not isinstance(content, list):
            raise InvalidRequest(
                f"{where}.content is a string or a list of parts", param=f"{where}.content"
            )
        parts = [_part(part, f"{where}.content[{j}]") for j, part in enumerate(content)]
        if role == "assistant":  # chat's assistant messages hold text only
            texts = [part.get("text", "") for part in parts if part["type"] == "text"]
            if len(texts) != len(parts):
                raise untranslatable(f"{where}.content", " (an assistant's parts are text)")
            messages.append({"role": role, "content": "".join(texts)})
        else:
            messages.append({"role": role, "content": parts})
    elif kind == "function_call":
        call = {
            "id": str(item.get("call_id") or ""),
            "type": "function",
            "function": {
                "name": str(item.get("name") or ""),
                "arguments": item.get("arguments") or "{}",
            },
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)  # calls made together are one assistant turn
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            texts = [p.get("text") for p in output if isinstance(p, dict)]
            if not all(isinstance(t, str) for t in texts) or len(texts) != len(output):
                raise untranslatable(f"{where}.output", " unless it is text")
            output = "".join(str(t) for t in texts)
        if not isinstance(output, str):
            raise InvalidRequest(f"{where}.output is a string", param=f"{where}.output")
        messages.append(
            {"role": "tool", "tool_call_id": str(item.get("call_id") or ""), "content": output}
        )
    else:
        raise untranslatable(f"{where}.type", f" {shown(kind)}")


def _part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind == "input_image":
        if not isinstance(part.get("image_url"), str):
            raise untranslatable(
                f"{where}.image_url", " unless it is a URL (file ids are OpenAI's)"
            )
        image: dict[str, Any] = {"url": part["image_url"]}
        if part.get("detail"):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        if not isinstance(part.get("file_data"), str):
            raise untranslatable(f"{where}.file_data", " is required (file ids are OpenAI's)")
        file = {"file_data": part["file_data"], "filename": part.get("filename") or "file"}
        return {"type": "file", "file": file}
    raise untranslatable(f"{where}.type", f" {shown(kind)}")


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not tool.get("name"):
        raise untranslatable(f"{where}", " unless it is a function tool with a name")
    function = {"name": tool["name"]}
    for name in ("description", "parameters", "strict"):
        if tool.get(name) is not None:
            function[name] = tool[name]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise untranslatable("tool_choice", f" {shown(choice)}")


def _format(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, dict) or set(text) - {"format"}:
        raise untranslatable("text", " beyond its format")
    spec = text.get("format") or {"type": "text"}
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {k: spec[k] for k in ("name", "schema", "strict", "description") if k in spec}
        return {"type": "json_schema", "json_schema": schema}
    raise untranslatable("text.format", f" {shown(kind)}")


# --- chat answer -> response object ----------------------------------------------------------


def usage_as_responses(usage: Any) -> dict[str, Any] | None:
    """A chat answer's usage in the Responses API's names (cache writes carried along)."""
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        return None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
    out = usage.get("completion_tokens") or 0
    result = {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["prompt_tokens"] + out,
    }
    for name in ("cache_creation_input_tokens", "cache_creation"):
        if name in usage:
            result[name] = usage[name]
    return result


def _message(ident: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": ident, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}  # fmt: skip


def _call(ident: str, call: dict[str, Any], status: str) -> dict[str, Any]:
    function = call.get("function") or {}
    return {"type": "function_call", "id": ident, "call_id": call.get("id") or ident,
            "name": function.get("name") or "", "arguments": function.get("arguments") or "",
            "status": status}  # fmt: skip


def _response(
    body: dict[str, Any], ident: str, status: str, output: list[dict[str, Any]], usage: Any
) -> dict[str, Any]:
    return {
        "id": ident, "object": "response", "created_at": int(time.time()), "status": status,
        "model": body.get("model"), "output": output, "usage": usage, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"), "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
        "text": body.get("text") or {"format": {"type": "text"}}, "truncation": "disabled",
    }  # fmt: skip


def to_response(reply: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """A chat answer as the response object the Responses request `body` gets."""
    choices = reply.get("choices") or [{}]
    message = choices[0].get("message") or {}
    ident = f"resp_{reply.get('id') or new_id()}"
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(_message(f"msg_{ident[5:]}", str(message["content"]), "completed"))
    for index, call in enumerate(message.get("tool_calls") or []):
        output.append(_call(f"fc_{ident[5:]}_{index}", call, "completed"))
    status = "incomplete" if choices[0].get("finish_reason") == "length" else "completed"
    return _response(body, ident, status, output, usage_as_responses(reply.get("usage")))


# --- chat stream -> the Responses stream's events --------------------------------------------


async def response_events(
    chunks: AsyncIterator[bytes], body: dict[str, Any]
) -> AsyncIterator[bytes]:
    """The JSON of each Responses stream event for a chat stream's chunks: response.created,
    output items (text deltas, function call argument deltas) opened and closed in order, and
    response.completed (or .incomplete) carrying the usage. A failure of the chat stream is
    raised as it came (the gateway ends the client's stream with an error event)."""
    writer = _Events(body)
    begun = False
    try:
        async for raw in chunks:
            if not begun:  # only after the provider's first chunk: a refusal fails over
                begun = True
                for frame in writer.beginning():
                    yield frame
            for frame in writer.chunk(orjson.loads(raw)):
                yield frame
    finally:
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]
    for frame in [*([] if begun else writer.beginning()), *writer.end()]:
        yield frame


class _Events:
    """The Responses events of one chat stream, chunk by chunk."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.ident = f"resp_{new_id()}"
        self.sequence = itertools.count()
        self.output: list[dict[str, Any]] = []  # items in output_index order
        self.text: dict[str, Any] | None = None  # the open message item
        self.calls: dict[int, dict[str, Any]] = {}  # open function calls, by chat call index
        self.usage: Any = None
        self.finish: str | None = None

    def event(self, kind: str, **fields: Any) -> bytes:
        return orjson.dumps({"type": kind, "sequence_number": next(self.sequence), **fields})

    def beginning(self) -> list[bytes]:
        running = _response(self.body, self.ident, "in_progress", [], None)
        return [
            self.event("response.created", response=running),
            self.event("response.in_progress", response=running),
        ]

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        frames: list[bytes] = []
        self.usage = usage_as_responses(chunk.get("usage")) or self.usage
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                frames += self._text(str(delta["content"]))
            for call in delta.get("tool_calls") or []:
                frames += self._call(call)
            self.finish = choice.get("finish_reason") or self.finish
        return frames

    def end(self) -> list[bytes]:
        status = "incomplete" if self.finish == "length" else "completed"
        final = _response(self.body, self.ident, status, self.output, self.usage)
        return [
            *self._close_text(),
            *self._close_calls(),
            self.event(f"response.{status}", response=final),
        ]

    def _text(self, piece: str) -> list[bytes]:
        frames = self._close_calls()
        text = self.text
        if text is None:
            text = self.text = _message(
                f"msg_{self.ident[5:]}_{len(self.output)}", "", "in_progress"
            )
            self.output.append(text)
            where = {"item_id": text["id"], "output_index": len(self.output) - 1}
            frames.append(
                self.event(
                    "response.output_item.added",
                    output_index=where["output_index"],
                    item={**text, "content": []},
                )
            )
            frames.append(
                self.event(
                    "response.content_part.added",
                    **where,
                    content_index=0,
                    part={**text["content"][0]},
                )
            )
        text["content"][0]["text"] += piece
        frames.append(
            self.event(
                "response.output_text.delta",
                item_id=text["id"],
                output_index=self.output.index(text),
                content_index=0,
                delta=piece,
                logprobs=[],
            )
        )
        return frames

    def _call(self, call: dict[str, Any]) -> list[bytes]:
        frames: list[bytes] = []
        number = call.get("index", 0)
        item = self.calls.get(number)
        if item is None:
            frames += self._close_text()
            item = _call(f"fc_{self.ident[5:]}_{len(self.output)}", call, "in_progress")
            item["arguments"] = ""
            self.calls[number] = item
            self.output.append(item)
            frames.append(
                self.event(
                    "response.output_item.added", output_index=len(self.output) - 1, item={**item}
                )
            )
        piece = (call.get("function") or {}).get("arguments")
        if piece:
            item["arguments"] += piece
            frames.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.output.index(item),
                    delta=piece,
                )
            )
        return frames

    def _close_text(self) -> list[bytes]:
        text, self.text = self.text, None
        if text is None:
            return []
        index = self.output.index(text)
        part = text["content"][0]
        text["status"] = "completed"
        where = {"item_id": text["id"], "output_index": index, "content_index": 0}
        return [
            self.event("response.output_text.done", **where, text=part["text"], logprobs=[]),
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=index, item=text),
        ]

    def _close_calls(self) -> list[bytes]:
        frames = []
        for item in self.calls.values():
            item["status"] = "completed"
            index = self.output.index(item)
            frames.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    arguments=item["arguments"],
                )
            )
            frames.append(self.event("response.output_item.done", output_index=index, item=item))
        self.calls.clear()
        return frames
