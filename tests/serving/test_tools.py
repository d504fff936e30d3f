# mypy: disable-error-code="union-attr"
# (the SDK types a tool call as function | custom; these are all function calls)
"""Tool calls on the real Gemma 3 270M through the official openai SDK: grammar-constrained."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from openai import OpenAI

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string", "maxLength": 20}},
                                          "required": ["city"]}}},
]  # fmt: skip
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(gemma_worker: str) -> OpenAI:
    return OpenAI(base_url=gemma_worker + "/v1", api_key="unused", max_retries=0)


def test_a_forced_tool_is_called_with_valid_arguments(client: OpenAI) -> None:
    choice: Any = {"type": "function", "function": {"name": "get_weather"}}
    r = client.chat.completions.create(
        model="gemma",
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=80,
        seed=1,
        parallel_tool_calls=False,  # the base model repeats a call until max_tokens
    )
    [answer] = r.choices
    assert answer.finish_reason == "tool_calls" and answer.message.content is None
    calls = answer.message.tool_calls or []
    assert calls and all(c.function.name == "get_weather" for c in calls)
    for call in calls:
        assert call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_required_calls_some_tool_and_parallel_off_calls_one(client: OpenAI) -> None:
    for seed in range(3):
        r = client.chat.completions.create(model="gemma", messages=ASK, tools=TOOLS,
                                           tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=80, seed=seed, temperature=1.0)  # fmt: skip
        [call] = r.choices[0].message.tool_calls or []
        assert call.function.name in ("get_weather", "get_time")
        json.loads(call.function.arguments)


def test_auto_is_a_message_or_valid_calls_and_none_is_a_message(client: OpenAI) -> None:
    for seed in range(3):
        r = client.chat.completions.create(model="gemma", messages=ASK, tools=TOOLS,
                                           tool_choice="auto", max_tokens=60, seed=seed,
                                           temperature=1.0)  # fmt: skip
        message = r.choices[0].message
        if message.tool_calls:
            assert r.choices[0].finish_reason == "tool_calls"
        else:
            assert message.content is not None and not message.content.startswith("{")
    r = client.chat.completions.create(
        model="gemma", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=20, temperature=0
    )
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason != "tool_calls"


def test_a_tool_result_turn_is_accepted(client: OpenAI) -> None:
    args = json.dumps({"city": "Paris", "unit": "celsius"})
    turns: list[Any] = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                                                 "function": {"name": "get_weather",
                                                                              "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]  # fmt: skip
    r = client.chat.completions.create(
        model="gemma", messages=turns, tools=TOOLS, tool_choice="none", max_tokens=16, temperature=0
    )
    assert r.choices[0].message.content
    assert r.usage is not None and r.usage.prompt_tokens > 60  # the tool turns were rendered


def test_streamed_tool_call_deltas_reassemble_to_the_same_call(client: OpenAI) -> None:
    choice: Any = {"type": "function", "function": {"name": "get_weather"}}
    common: dict[str, Any] = {"model": "gemma", "messages": ASK, "tools": TOOLS,
                              "tool_choice": choice, "max_tokens": 80, "temperature": 0,
                              "parallel_tool_calls": False}  # fmt: skip
    whole = client.chat.completions.create(**common)
    calls: dict[int, dict[str, str]] = {}
    reasons = []
    for chunk in client.chat.completions.create(**common, stream=True):
        if not chunk.choices:
            continue
        reasons.append(chunk.choices[0].finish_reason)
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            if delta.function and delta.function.name:
                call["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
    expected = [{"name": c.function.name, "arguments": c.function.arguments}
                for c in whole.choices[0].message.tool_calls or []]  # fmt: skip
    assert [calls[i] for i in sorted(calls)] == expected and expected
    assert reasons[-1] == "tool_calls"
