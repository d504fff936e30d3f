"""OpenAI function tools on a model without tool tokens (Gemma 3): prompt, grammar, parsing.

The format the model sees and writes (documented in docs/llm.md):

- the tool list goes at the head of the first user turn, one JSON object per line
  (`{"name", "description", "parameters"}`) after a line saying how to call them;
- a call is the whole assistant turn, one compact JSON object:
  `{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}`, which is also how an
  earlier assistant turn with `tool_calls` is rendered back;
- a tool result (role `tool`) is a user turn `{"tool_result":{"tool_call_id":..,"name":..,
  "content":..}}`.

The assistant turn is constrained by grammar: `required` or a named tool allow only calls
(arguments following that tool's JSON schema), `auto` allows calls or a plain message that
does not start with `{`, `none` renders no tool list and no grammar.

    plan = tool_plan(body)                     # None without tools
    messages = plan.render(messages); gbnf = plan.grammar()
    content, calls = plan.parse(text)          # calls: OpenAI message.tool_calls
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from kairos.serving.errors import LLMRequestError
from kairos.serving.structured import check_schema, named_grammar

_HOW = (
    "You can call these tools. To call tools, answer with only a JSON object "
    '{"tool_calls":[{"name":"<tool name>","arguments":{...}}]} and nothing else; '
    'tool results come back as {"tool_result":...}.'
)
_TEXT = r"text ::= [^{] [^\x00]*"  # a plain message: anything not starting with "{"


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolPlan:
    tools: tuple[Tool, ...]
    choice: str  # "auto", "required", "none" or a tool's name
    parallel: bool

    @property
    def calls_only(self) -> bool:
        return self.choice not in ("auto", "none")

    def render(self, messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """Messages Gemma's template takes: tool turns as text, the tool list up front."""
        out: list[dict[str, Any]] = []
        for message in messages:
            role, content = message["role"], message.get("content") or ""
            if role == "tool":
                result = {"tool_call_id": message.get("tool_call_id"),
                          "name": message.get("name"), "content": content}  # fmt: skip
                role, content = "user", _compact({"tool_result": result})
            elif role == "assistant" and message.get("tool_calls"):
                calls = [_rendered_call(call) for call in message["tool_calls"]]
                content = _compact({"tool_calls": calls})
            if out and out[-1]["role"] == role:  # templates want user/model turns to alternate
                out[-1] = {"role": role, "content": out[-1]["content"] + "\n" + content}
            else:
                out.append({"role": role, "content": content})
        if self.choice != "none" and self.tools:
            listing = "\n".join(
                _compact({"name": t.name, "description": t.description,
                          "parameters": t.parameters}) for t in self.tools)  # fmt: skip
            head = f"{_HOW}\n{listing}\n\n"
            first = next((m for m in out if m["role"] == "user"), None)
            if first is None:
                out.insert(0, {"role": "user", "content": head.rstrip()})
            else:
                first["content"] = head + first["content"]
        return out

    def grammar(self) -> str | None:
        if self.choice == "none":
            return None
        chosen = [t for t in self.tools if self.choice in ("auto", "required", t.name)]
        call = {"anyOf": [{"type": "object",
                           "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                           "required": ["name", "arguments"]} for t in chosen]}  # fmt: skip
        calls = {"type": "array", "items": call, "minItems": 1}
        if not self.parallel:
            calls["maxItems"] = 1
        schema = {"type": "object", "properties": {"tool_calls": calls},
                  "required": ["tool_calls"]}  # fmt: skip
        rules = named_grammar(schema, "calls")
        if self.calls_only:
            return f"root ::= calls\n{rules}"
        return f"root ::= calls | text\n{_TEXT}\n{rules}"

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """(content, tool_calls) of a finished turn; calls in OpenAI's message shape."""
        if self.choice == "none" or not text.startswith("{"):
            return text, []
        try:
            calls = json.loads(text)["tool_calls"]
        except (ValueError, KeyError, TypeError):
            return text, []  # cut off by max_tokens: what came, as text
        return None, [openai_call(c["name"], c["arguments"]) for c in calls]


def openai_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    return {"id": call_id or new_call_id(), "type": "function",
            "function": {"name": name, "arguments": _compact(arguments)}}  # fmt: skip


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def tool_plan(body: Mapping[str, Any]) -> ToolPlan | None:
    """`tools`, `tool_choice`, `parallel_tool_calls` of a chat body; None without tools."""
    raw = body.get("tools")
    choice = body.get("tool_choice")
    if raw in (None, []):
        if choice not in (None, "none", "auto"):
            raise LLMRequestError("tool_choice needs tools: send tools too", param="tool_choice")
        return None
    if not isinstance(raw, list):
        raise LLMRequestError('tools must be a list of {"type": "function", ...}', param="tools")
    tools = tuple(_tool(t, i) for i, t in enumerate(raw))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise LLMRequestError("tools: two tools share a name; names must be unique", param="tools")
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        name = (
            (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        )
        if name not in names:
            raise LLMRequestError(
                f"tool_choice names {name!r}, which is not among tools {names}",
                param="tool_choice",
            )
        choice = name
    elif choice not in ("auto", "required", "none"):
        raise LLMRequestError(
            'tool_choice must be "auto", "required", "none" or '
            '{"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise LLMRequestError(
            "parallel_tool_calls must be true or false", param="parallel_tool_calls"
        )
    return ToolPlan(tools, choice, parallel)


def _tool(raw: Any, index: int) -> Tool:
    where = f"tools[{index}]"
    if (
        not isinstance(raw, dict)
        or raw.get("type") != "function"
        or not isinstance(raw.get("function"), dict)
    ):
        raise LLMRequestError(
            f'{where} must be {{"type": "function", "function": {{"name": ..., '
            f'"parameters": {{...}}}}}}',
            param=where,
        )
    function = raw["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise LLMRequestError(f"{where}.function.name must be a non-empty string", param=where)
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    checked = check_schema(parameters, f"{where}.function.parameters", refs=False)
    return Tool(name, str(function.get("description") or ""), checked)


def _rendered_call(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise LLMRequestError("an assistant tool_call must have a function", param="messages")
    arguments = function.get("arguments") or "{}"
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        parsed = arguments
    return {"name": function.get("name"), "arguments": parsed}


def _compact(value: Any) -> str:
    return orjson.dumps(value).decode()


class ToolCallStream:
    """Splits a streamed `{"tool_calls":[...]}` turn into OpenAI `tool_calls` deltas: a call's
    id and name once its name is complete, then its arguments piece by piece."""

    _HEAD = '{"tool_calls":['

    def __init__(self) -> None:
        self._text = ""
        self._at = len(self._HEAD)  # next character to read
        self._index = -1
        self._depth = 0  # inside the arguments value: {[ nesting
        self._in_string = False
        self._escaped = False
        self._state = "call"  # call -> args -> (after) -> call ...

    def feed(self, piece: str) -> list[dict[str, Any]]:
        self._text += piece
        deltas: list[dict[str, Any]] = []
        while True:
            if self._state == "call":
                prefix = '{"name":'
                start = self._at + (1 if self._text[self._at : self._at + 1] == "," else 0)
                head = self._text[start:]
                end = head.find(',"arguments":')
                if not head.startswith(prefix) or end < 0:
                    return deltas
                name = json.loads(head[len(prefix) : end])
                self._index += 1
                deltas.append({"index": self._index, "id": new_call_id(), "type": "function",
                               "function": {"name": name, "arguments": ""}})  # fmt: skip
                self._at = start + end + len(',"arguments":')
                self._state, self._depth = "args", 0
            elif self._state == "args":
                taken = self._arguments()
                if taken:
                    deltas.append({"index": self._index, "function": {"arguments": taken}})
                if self._state == "args":
                    return deltas
            else:  # the call's closing "}", then "," (another call) or "]}"
                if len(self._text) <= self._at:
                    return deltas
                self._at += 1
                self._state = "call"

    def _arguments(self) -> str:
        start = self._at
        for i in range(start, len(self._text)):
            c = self._text[i]
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c in "{[":
                self._depth += 1
            elif c in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._at, self._state = i + 1, "after"
                    return self._text[start : i + 1]
        self._at = len(self._text)
        return self._text[start:]
