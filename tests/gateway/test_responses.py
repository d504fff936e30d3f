"""The Responses API (`POST /v1/responses`) through the gateway, by the official `openai` SDK
and raw HTTP: whole and streamed, with the keys, allow-lists, budgets, failover and ledger of
chat; a stream cut short ends with an `error` event and a non-ok ledger row."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from kairos.gateway import Gateway, Stream
from kairos.gateway.accounting.accountant import input_bound
from kairos.gateway.app import create_gateway_app
from kairos.gateway.wire.openai import input_parts
from tests.gateway.conftest import (
    PROVIDER_SECRET,
    closed_after_test,
    config,
    deployment,
    ledger,
    new_key,
)
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, ServerThread


def client(served: ServerThread, key: str) -> openai.OpenAI:
    return closed_after_test(openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=0))


def post(served: ServerThread, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{served.url}/v1/responses", json=body, headers={"authorization": f"Bearer {key}"}
    )


def events(raw: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(event name, data) of each SSE frame of a body."""
    found = []
    for frame in raw.strip().split("\n\n"):
        name, data = None, None
        for line in frame.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        assert data is not None, frame
        found.append((name, orjson.loads(data)))
    return found


def test_whole_response(served: ServerThread, upstream: FakeUpstream) -> None:
    sdk = client(served, new_key(served))
    response = sdk.responses.create(
        model="chat", input="hi", instructions="be brief", max_output_tokens=3
    )
    assert response.output_text == "tok tok tok "
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (TOKENS_IN, 3)
    sent = upstream.received[-1]
    assert sent["model"] == "echo" and sent["max_output_tokens"] == 3
    assert sent["instructions"] == "be brief" and "max_tokens" not in sent
    assert upstream.headers[-1]["authorization"] == f"Bearer {PROVIDER_SECRET}"
    [row] = ledger(served)
    assert (row["route"], row["status"], row["model_requested"]) == ("responses", "ok", "chat")
    assert (row["tokens_in"], row["tokens_out"], row["cost_micros"]) == (TOKENS_IN, 3, 13)


def test_streamed_response(served: ServerThread, upstream: FakeUpstream) -> None:
    sdk = client(served, new_key(served))
    input_items: Any = [{"role": "user", "content": "hi"}]
    stream = sdk.responses.create(model="chat", input=input_items, max_output_tokens=4, stream=True)
    seen = list(stream)
    kinds = [event.type for event in seen]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert text == "tok " * 4
    last = seen[-1]
    assert last.type == "response.completed" and last.response.usage is not None
    assert (last.response.usage.input_tokens, last.response.usage.output_tokens) == (TOKENS_IN, 4)
    # the upstream is asked for the stream as the client sent it (no chat stream_options)
    assert upstream.received[-1]["stream"] is True
    assert "stream_options" not in upstream.received[-1]
    [row] = ledger(served)
    assert (row["route"], row["status"], row["tokens_out"], row["cost_micros"]) == (
        "responses", "ok", 4, 14,
    )  # fmt: skip
    assert row["ttft_ms"] is not None


def test_sdk_stream_helper_assembles_the_response(served: ServerThread) -> None:
    sdk = client(served, new_key(served))
    with sdk.responses.stream(model="chat", input="hi", max_output_tokens=3) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert deltas == ["tok "] * 3 and final.output_text == "tok " * 3
    assert final.usage is not None and final.usage.output_tokens == 3


def test_an_event_type_cannot_forge_frames(served: ServerThread, upstream: FakeUpstream) -> None:
    """A provider's event whose type holds line breaks is passed on without an `event:` line:
    it cannot start a frame of its own in the client's stream."""
    upstream.behaviour["echo"] = "forging"
    body = {"model": "chat", "input": "hi", "max_output_tokens": 2, "stream": True}
    found = events(post(served, new_key(served), body).text)
    assert {"forged": 1} not in [data for _, data in found]
    [odd] = [(name, data) for name, data in found if "forged" in data["type"]]
    assert odd[0] is None
    assert found[-1][0] == "response.completed"


def test_stream_frames_are_typed_events_without_done(served: ServerThread) -> None:
    key = new_key(served)
    body = {"model": "chat", "input": "hi", "max_output_tokens": 2, "stream": True}
    reply = post(served, key, body)
    assert reply.status_code == 200
    assert "[DONE]" not in reply.text
    found = events(reply.text)
    assert all(name == data["type"] for name, data in found)  # `event:` names each frame
    assert [data["sequence_number"] for _, data in found] == list(range(len(found)))
    assert found[-1][0] == "response.completed"


@pytest.mark.parametrize(
    ("mode", "code"),
    [("cut", "upstream_error"), ("truncated", "upstream_incomplete"), ("broken", "upstream_error")],
)
def test_stream_cut_short_ends_with_an_error_event(
    served: ServerThread, upstream: FakeUpstream, mode: str, code: str
) -> None:
    upstream.behaviour["echo"] = mode
    key = new_key(served)
    body = {"model": "chat", "input": "hi", "max_output_tokens": 5, "stream": True}
    reply = post(served, key, body)
    found = events(reply.text)
    name, last = found[-1]
    assert name == "error" and last["type"] == "error", found
    assert last["code"] == code and last["message"]
    assert last["sequence_number"] == len(found) - 1
    assert not any(data["type"] == "response.completed" for _, data in found)
    assert PROVIDER_SECRET not in reply.text  # `broken` quotes the credential it was sent
    [row] = ledger(served)
    assert row["status"] == code
    # no usage arrived: the call is charged as held (input bound + max_output_tokens)
    assert row["tokens_out"] == 5 and row["cost_micros"] > 5


def test_sdk_sees_a_cut_stream_end_without_completion(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    upstream.behaviour["echo"] = "truncated"
    sdk = client(served, new_key(served))
    stream = sdk.responses.create(model="chat", input="hi", max_output_tokens=4, stream=True)
    kinds = [event.type for event in stream]
    assert kinds[-1] == "error" and "response.completed" not in kinds


def test_a_client_that_leaves_mid_stream_is_billed_by_the_usage(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    upstream.behaviour["echo"] = "late"
    key = new_key(served)
    finished = upstream.finished_streams
    body = {"model": "chat", "input": "hi", "max_output_tokens": 5, "stream": True}
    headers = {"authorization": f"Bearer {key}"}
    with (
        httpx.Client() as http,
        http.stream("POST", f"{served.url}/v1/responses", json=body, headers=headers) as reply,
    ):
        assert next(reply.iter_lines()) == "event: response.created"  # then hang up
    deadline = time.monotonic() + 10
    while (rows := ledger(served)) and rows[0]["status"] == "pending":
        assert time.monotonic() < deadline, rows
        time.sleep(0.05)
    [row] = rows
    assert (row["status"], row["tokens_in"], row["tokens_out"]) == (
        "client_disconnected",
        TOKENS_IN,
        5,
    )
    assert upstream.finished_streams == finished + 1  # read on to its last event


def test_failed_response_is_passed_on_billed_and_logged(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    upstream.behaviour["echo"] = "failing"
    key = new_key(served)
    body = {"model": "chat", "input": "hi", "max_output_tokens": 3, "stream": True}
    found = events(post(served, key, body).text)
    assert found[-1][0] == "response.failed"
    assert found[-1][1]["response"]["error"]["message"] == "scripted failure"
    [row] = ledger(served)
    assert row["status"] == "upstream_error"
    assert (row["tokens_in"], row["tokens_out"]) == (TOKENS_IN, 3)  # its usage bills it


def test_budget_bounds_input_and_clamps_max_output_tokens(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    key = new_key(served, budgets=[{"period": "total", "tokens": 1000}])
    reply = post(served, key, {"model": "chat", "input": "hi", "max_output_tokens": 100_000})
    assert reply.status_code == 200, reply.text
    sent = upstream.received[-1]["max_output_tokens"]
    assert 0 < sent < 1000  # clamped to what the budget covers beyond the input bound
    # instructions count toward the input bound: 2,000 bytes cannot fit in what is left
    refused = post(served, key, {"model": "chat", "input": "hi", "instructions": "x" * 2000})
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "budget_exceeded"
    items = [{"role": "user", "content": "y" * 2000}]
    assert post(served, key, {"model": "chat", "input": items}).status_code == 429


def test_a_cap_clamped_below_16_is_a_budget_refusal(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    """OpenAI refuses max_output_tokens under 16: a budget with room for fewer is a 429."""
    key = new_key(served, budgets=[{"period": "total", "tokens": 1000}])
    body: dict[str, Any] = {"model": "chat", "input": "hi", "instructions": ""}
    held = input_bound(input_parts(body).text_bytes, 2)  # the input and the instructions
    body["instructions"] = "x" * (1000 - held - 10)  # room for 10 output tokens
    refused = post(served, key, body)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "budget_exceeded"
    assert "16 output tokens" in refused.json()["error"]["message"]
    assert upstream.received == []
    body["instructions"] = "x" * (1000 - held - 20)  # room for 20
    assert post(served, key, body).status_code == 200
    assert upstream.received[-1]["max_output_tokens"] == 20


def test_no_cap_is_added_when_no_budget_needs_one(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    for key in (new_key(served), new_key(served, rpm=100)):  # requests per minute bound no output
        reply = post(served, key, {"model": "chat", "input": "hi"})
        assert reply.status_code == 200, reply.text
        assert "max_output_tokens" not in upstream.received[-1]
    capped = new_key(served, tpm=100_000)
    assert post(served, capped, {"model": "chat", "input": "hi"}).status_code == 200
    assert upstream.received[-1]["max_output_tokens"] == 4096  # default_max_tokens, held


def test_allow_list(served: ServerThread) -> None:
    key = new_key(served, models=["other"])
    denied = post(served, key, {"model": "chat", "input": "hi"})
    assert denied.status_code == 403 and denied.json()["error"]["param"] == "model"
    assert post(served, key, {"model": "other", "input": "hi"}).status_code == 200
    statuses = sorted((row["route"], row["status"]) for row in ledger(served))
    assert statuses == [("responses", "model_not_allowed"), ("responses", "ok")]


# --- on an Anthropic deployment: through chat, translated both ways ---------------------------


def test_anthropic_whole_response(served: ServerThread, upstream: FakeUpstream) -> None:
    sdk = client(served, new_key(served))
    response = sdk.responses.create(
        model="claude", input="hi", instructions="be brief", max_output_tokens=3
    )
    assert response.output_text == "tok tok tok " and response.status == "completed"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (TOKENS_IN, 3)
    sent = upstream.received[-1]  # a Messages request
    assert (sent["system"], sent["max_tokens"]) == ("be brief", 3)
    assert sent["messages"][0]["role"] == "user"
    [row] = ledger(served)
    assert (row["route"], row["provider"], row["status"]) == ("responses", "claude", "ok")
    assert (row["tokens_in"], row["tokens_out"]) == (TOKENS_IN, 3)


def test_anthropic_streamed_response(served: ServerThread, upstream: FakeUpstream) -> None:
    key = new_key(served)
    sdk = client(served, key)
    with sdk.responses.stream(model="claude", input="hi", max_output_tokens=4) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and kinds.count("response.output_text.delta") == 4
    assert final.output_text == "tok " * 4
    assert final.usage is not None and final.usage.output_tokens == 4
    body = {"model": "claude", "input": "hi", "max_output_tokens": 2, "stream": True}
    found = events(post(served, key, body).text)
    assert [data["sequence_number"] for _, data in found] == list(range(len(found)))
    assert all(name == data["type"] for name, data in found)
    rows = ledger(served)
    assert [(r["status"], r["tokens_out"]) for r in rows] == [("ok", 4), ("ok", 2)]


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_cache_reads_and_writes_are_billed(
    served: ServerThread, upstream: FakeUpstream, stream: bool
) -> None:
    upstream.cache["echo"] = {"read": 1_000, "write": 400, "write_1h": 100}
    try:
        body = {"model": "claude", "input": "hi", "max_output_tokens": 2, "stream": stream}
        assert post(served, new_key(served), body).status_code == 200
    finally:
        del upstream.cache["echo"]
    [row] = ledger(served)
    assert (row["tokens_in"], row["tokens_cached"], row["tokens_cache_write"]) == (
        TOKENS_IN + 1_400,
        1_000,
        400,
    )


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_function_calls(
    served: ServerThread, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    upstream.behaviour["echo"] = "tool_use"
    monkeypatch.setattr(upstream, "tool_input", {"city": "Oslo"})  # the fake is session-wide
    city = {"type": "object", "properties": {"city": {"type": "string"}}}
    weather = {"type": "function", "name": "get_weather", "parameters": city}
    body = {
        "model": "claude",
        "input": "Weather in Oslo?",
        "tools": [weather],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "stream": stream,
    }
    reply = post(served, new_key(served), body)
    assert reply.status_code == 200, reply.text
    if stream:
        found = events(reply.text)
        pieces = [d["delta"] for _, d in found if d["type"].endswith("arguments.delta")]
        assert orjson.loads("".join(pieces)) == {"city": "Oslo"}
        response = found[-1][1]["response"]
    else:
        response = reply.json()
    [call] = [item for item in response["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_weather" and orjson.loads(call["arguments"]) == {"city": "Oslo"}
    sent = upstream.received[-1]
    assert sent["tools"][0]["name"] == "get_weather"
    assert sent["tool_choice"] == {"type": "tool", "name": "get_weather"}


def test_anthropic_tool_results_go_back(served: ServerThread, upstream: FakeUpstream) -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "-3 C"},
    ]  # fmt: skip
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    body = {"model": "claude", "input": history, "tools": [weather], "max_output_tokens": 2}
    reply = post(served, new_key(served), body)
    assert reply.status_code == 200, reply.text
    messages = upstream.received[-1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    [use] = [b for b in messages[1]["content"] if b["type"] == "tool_use"]
    assert (use["id"], use["name"], use["input"]) == ("call_1", "get_weather", {"city": "Oslo"})
    [result] = [b for b in messages[2]["content"] if b["type"] == "tool_result"]
    assert result["tool_use_id"] == "call_1"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"tools": [{"type": "file_search"}]}, "tools[0]"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0].image_url",
        ),
        ({"text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "array"}}}},
         "response_format.json_schema.schema"),
    ],
)  # fmt: skip
def test_anthropic_untranslatable_fields_are_named(
    served: ServerThread, upstream: FakeUpstream, extra: dict[str, Any], param: str
) -> None:
    reply = post(served, new_key(served), {"model": "claude", "input": "hi", **extra})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    assert upstream.received == []


def test_failover_from_openai_to_anthropic(upstream: FakeUpstream, tmp_path: Path) -> None:
    claude = {**deployment("echo"), "provider": "claude", "priority": 1}
    models = {"chat": {"deployments": [deployment("fail"), claude]}}
    gateway = Gateway(config(upstream, tmp_path, models=models))
    with ServerThread(create_gateway_app(gateway), kairos=True) as server:
        server.gateway = gateway  # type: ignore[attr-defined]
        key = new_key(server)
        for stream in (False, True):
            body = {"model": "chat", "input": "hi", "max_output_tokens": 2, "stream": stream}
            reply = post(server, key, body)
            assert reply.status_code == 200, reply.text
            assert "tok tok " in reply.text
        rows = ledger(server)
        assert [(r["attempts"], r["provider"], r["status"]) for r in rows] == [
            (2, "claude", "ok"),
            (2, "claude", "ok"),
        ]
        server.call(gateway.close())


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "chat"}, "input"),
        ({"model": "chat", "input": []}, "input"),
        ({"model": "chat", "input": ["hi"]}, "input[0]"),
        ({"model": "chat", "input": "hi", "instructions": 3}, "instructions"),
        ({"model": "chat", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "chat", "input": "hi", "prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"model": "chat", "input": "hi", "background": True}, "background"),
        ({"input": "hi"}, "model"),
    ],
)
def test_bad_bodies_name_the_field(
    served: ServerThread, upstream: FakeUpstream, body: dict[str, Any], param: str
) -> None:
    reply = post(served, new_key(served), body)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param
    assert upstream.received == []


def test_parts_the_budget_cannot_bound(served: ServerThread, upstream: FakeUpstream) -> None:
    """Images count at their worst case; stored input and built-in tools are refused on a key
    with limits, and forwarded for a key without."""
    limited = new_key(served, budgets=[{"period": "total", "tokens": 1000}])
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    text = {"type": "input_text", "text": "what is it?"}
    assert post(served, limited, {"model": "chat", "input": "hi"}).status_code == 200
    items = [{"role": "user", "content": [text, image]}]
    refused = post(served, limited, {"model": "chat", "input": items})
    assert refused.status_code == 429, refused.text  # a few bytes, an image's worth of tokens
    stored = {"model": "chat", "input": "go on", "previous_response_id": "resp_1"}
    searching = {"model": "chat", "input": "news?", "tools": [{"type": "web_search"}]}
    for body, param in ((stored, "previous_response_id"), (searching, "tools[0]")):
        reply = post(served, limited, body)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text
    sent = len(upstream.received)
    assert post(served, new_key(served), stored).status_code == 200
    assert upstream.received[sent]["previous_response_id"] == "resp_1"


def test_failover_to_the_next_deployment(upstream: FakeUpstream, tmp_path: Path) -> None:
    models = {"chat": {"deployments": [deployment("fail"), deployment("echo")]}}
    gateway = Gateway(config(upstream, tmp_path, models=models))
    with ServerThread(create_gateway_app(gateway), kairos=True) as server:
        server.gateway = gateway  # type: ignore[attr-defined]
        key = new_key(server)
        reply = post(server, key, {"model": "chat", "input": "hi", "max_output_tokens": 2})
        assert reply.status_code == 200, reply.text
        assert [body["model"] for body in upstream.received] == ["fail", "echo"]
        [row] = ledger(server)
        assert (row["attempts"], row["deployment"], row["status"]) == (2, "echo", "ok")
        server.call(gateway.close())


def test_in_process_stream(upstream: FakeUpstream, tmp_path: Path) -> None:
    async def scenario() -> tuple[list[str], list[Any]]:
        gateway = Gateway(config(upstream, tmp_path))
        try:
            plain, _ = await gateway.create_key(name="graph")
            body = {"model": "chat", "input": "hi", "max_output_tokens": 2, "stream": True}
            stream = await gateway.responses(plain, body)
            assert isinstance(stream, Stream)
            kinds = [event["type"] async for event in stream]
            return kinds, await gateway.usage()
        finally:
            await gateway.close()

    kinds, rows = asyncio.run(scenario())
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    [row] = rows
    assert (row.route, row.status, row.tokens_out) == ("responses", "ok", 2)
