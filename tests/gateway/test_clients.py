"""Real clients of the gateway, unchanged, over HTTP: `langchain-openai`'s ChatOpenAI (invoke,
stream with usage, tools, structured output, the Responses API) and the `litellm` SDK used as
a client (`openai/<model>` with the gateway as its api_base); the `openai` SDK's
`models.retrieve`. No client may reach past loopback: litellm reads its bundled cost map
(LITELLM_LOCAL_MODEL_COST_MAP) and runs no callbacks."""

from __future__ import annotations

import asyncio
import importlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import openai
import pytest
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from kairos.gateway import Gateway
from kairos.gateway.app import create_gateway_app
from tests.gateway.conftest import config, deployment, ledger, new_key
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, ServerThread

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
# Run before litellm is imported: any lookup of a host that is not loopback is recorded.
_NO_NETWORK = """
import socket, sys
asked = []
lookup = socket.getaddrinfo
def guarded(host, *args, **kwargs):
    if host not in ("127.0.0.1", "localhost", "::1"):
        asked.append(host)
        raise OSError("no network in this test")
    return lookup(host, *args, **kwargs)
socket.getaddrinfo = guarded
"""


class Weather(BaseModel):
    city: str
    degrees: int


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Hosts the clients tried to look up beyond loopback (they are refused); must stay empty."""
    asked: list[str] = []
    lookup = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in _LOOPBACK:
            asked.append(str(host))
            raise OSError("no network in this test")
        return lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)
    yield asked
    assert asked == [], f"a client tried to reach {asked}"


@pytest.fixture(scope="module")
def litellm_module() -> Iterator[ModuleType]:
    """litellm imported with its bundled cost map; no callbacks (it has no telemetry of its own
    any more), no tokenizer downloads, no "get help" banners on errors."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        module = importlib.import_module("litellm")
        patch.setattr(module, "disable_hf_tokenizer_download", True)
        patch.setattr(module, "suppress_debug_info", True)
        patch.setattr(module, "success_callback", [])
        patch.setattr(module, "failure_callback", [])
        patch.setattr(module, "callbacks", [])
        yield module


@pytest.fixture
def litellm(litellm_module: ModuleType) -> Iterator[ModuleType]:
    """litellm, whose cached HTTP clients are closed after the test (an async one is closed
    by the test, in its loop): their pooled sockets never reach the GC. Its sync calls run
    their service hooks on the thread's current event loop, making one (never closed) when
    there is none: they get one that is closed after the test."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield litellm_module
    asyncio.set_event_loop(None)
    loop.close()
    for cached in litellm_module.in_memory_llm_clients_cache.cache_dict.values():
        if isinstance(cached, openai.OpenAI):
            cached.close()
    litellm_module.in_memory_llm_clients_cache.flush_cache()


def chat_model(served: ServerThread, key: str, **options: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=options.pop("model", "chat"),
        base_url=f"{served.url}/v1",
        api_key=key,  # type: ignore[arg-type]
        max_retries=0,
        use_responses_api=options.pop("use_responses_api", False),
        **options,
    )


# --- langchain-openai ----------------------------------------------------------------------


def test_langchain_invoke(served: ServerThread, upstream: FakeUpstream, offline: list[str]) -> None:
    reply = chat_model(served, new_key(served), max_tokens=3).invoke("hi")
    assert reply.content == "tok tok tok "
    assert reply.usage_metadata is not None
    assert (reply.usage_metadata["input_tokens"], reply.usage_metadata["output_tokens"]) == (
        TOKENS_IN, 3,
    )  # fmt: skip
    [row] = ledger(served)
    assert (row["route"], row["status"], row["tokens_out"]) == ("chat", "ok", 3)


def test_langchain_stream_with_usage(
    served: ServerThread, upstream: FakeUpstream, offline: list[str]
) -> None:
    model = chat_model(served, new_key(served), max_tokens=4, stream_usage=True)
    chunks = list(model.stream("hi"))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert isinstance(whole, AIMessageChunk) and whole.content == "tok " * 4
    assert whole.usage_metadata is not None
    assert (whole.usage_metadata["input_tokens"], whole.usage_metadata["output_tokens"]) == (
        TOKENS_IN, 4,
    )  # fmt: skip
    assert upstream.received[-1]["stream_options"] == {"include_usage": True}
    [row] = ledger(served)
    assert (row["status"], row["tokens_out"], row["cost_micros"]) == ("ok", 4, TOKENS_IN + 4)


def test_langchain_tool_call(
    served: ServerThread, upstream: FakeUpstream, offline: list[str]
) -> None:
    upstream.behaviour["echo"] = "tools"
    upstream.arguments["get_weather"] = {"city": "Paris"}
    model = chat_model(served, new_key(served)).bind_tools([get_weather])
    reply = model.invoke("What is the weather in Paris?")
    [call] = reply.tool_calls
    assert (call["name"], call["args"], call["id"]) == (
        "get_weather",
        {"city": "Paris"},
        "call_fake",
    )
    sent = upstream.received[-1]
    assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather"]
    assert sent["tools"][0]["function"]["parameters"]["required"] == ["city"]


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(
    served: ServerThread, upstream: FakeUpstream, offline: list[str], method: str
) -> None:
    upstream.behaviour["echo"] = "tools"
    upstream.arguments["Weather"] = {"city": "Oslo", "degrees": -3}
    model = chat_model(served, new_key(served)).with_structured_output(Weather, method=method)  # type: ignore[arg-type]
    assert model.invoke("Weather in Oslo?") == Weather(city="Oslo", degrees=-3)
    sent = upstream.received[-1]
    if method == "json_schema":
        assert sent["response_format"]["json_schema"]["name"] == "Weather"
    else:
        assert sent["tool_choice"]["function"]["name"] == "Weather"


def test_langchain_on_the_responses_api(
    served: ServerThread, upstream: FakeUpstream, offline: list[str]
) -> None:
    model = chat_model(served, new_key(served), max_tokens=2, use_responses_api=True)
    reply = model.invoke("hi")
    assert reply.text == "tok tok "
    assert reply.usage_metadata is not None and reply.usage_metadata["output_tokens"] == 2
    streamed = list(model.stream("hi"))
    assert "".join(chunk.text for chunk in streamed) == "tok tok "
    assert [row["route"] for row in ledger(served)] == ["responses", "responses"]


def test_langchain_responses_api_tools_on_an_anthropic_deployment(
    served: ServerThread,
    upstream: FakeUpstream,
    offline: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    upstream.behaviour["echo"] = "tool_use"
    monkeypatch.setattr(upstream, "tool_input", {"city": "Lima"})  # the fake is session-wide
    # an Anthropic deployment, through the gateway's Responses translation
    model = chat_model(served, new_key(served), model="claude", use_responses_api=True)
    tools = model.bind_tools([get_weather], tool_choice="get_weather")
    [call] = tools.invoke("Weather in Lima?").tool_calls
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Lima"})
    streamed = list(tools.stream("Weather in Lima?"))
    whole = streamed[0]
    for chunk in streamed[1:]:
        whole = whole + chunk  # type: ignore[assignment]
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == [("get_weather", {"city": "Lima"})]
    assert [row["provider"] for row in ledger(served)] == ["claude", "claude"]


# --- litellm -------------------------------------------------------------------------------


def test_litellm_import_reaches_nothing() -> None:
    """With LITELLM_LOCAL_MODEL_COST_MAP, importing litellm looks up no host (in a fresh
    interpreter: this one may have imported it already)."""
    code = _NO_NETWORK + "import litellm\nprint(asked)\n"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        env=env, capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_litellm_completion(served: ServerThread, litellm: ModuleType, offline: list[str]) -> None:
    reply = litellm.completion(
        model="openai/chat",
        api_base=f"{served.url}/v1",
        api_key=new_key(served),
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        num_retries=0,
    )
    assert reply.choices[0].message.content == "tok tok tok "
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (TOKENS_IN, 3)
    [row] = ledger(served)
    assert (row["route"], row["model_requested"], row["status"]) == ("chat", "chat", "ok")


# litellm's streaming chunk types hold TypedDicts with ReadOnly items (thinking blocks,
# reasoning items, ...); pydantic warns about each (a UserWarning from its schema builder)
# when it first builds their schema: those warnings only
@pytest.mark.filterwarnings(
    "ignore:Items? .* on TypedDict class .* using the `ReadOnly` qualifier:UserWarning:"
    "pydantic._internal._generate_schema"
)
# and it reads model_fields / model_computed_fields off a chunk instance (deprecated since
# pydantic 2.11) as it copies a chunk: that warning, from that module, only
@pytest.mark.filterwarnings(
    "ignore:Accessing the 'model_(computed_)?fields' attribute on the instance is deprecated"
    ":pydantic.warnings.PydanticDeprecatedSince211:litellm.litellm_core_utils.model_response_utils"
)
def test_litellm_async_stream(
    served: ServerThread, litellm: ModuleType, offline: list[str]
) -> None:
    key = new_key(served)
    logging_worker = importlib.import_module("litellm.litellm_core_utils.logging_worker")

    async def scenario() -> list[Any]:
        try:
            stream = await litellm.acompletion(
                model="openai/chat",
                api_base=f"{served.url}/v1",
                api_key=key,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=4,
                stream=True,
                stream_options={"include_usage": True},
                num_retries=0,
            )
            return [chunk async for chunk in stream]
        finally:
            # litellm's success logging runs in a worker of this loop: it finishes here, or
            # at exit in a loop of its own that it never closes
            await logging_worker.GLOBAL_LOGGING_WORKER.flush()
            await logging_worker.GLOBAL_LOGGING_WORKER.stop()
            await litellm.close_litellm_async_clients()

    chunks = asyncio.run(scenario())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "tok " * 4
    usage = [c.usage for c in chunks if getattr(c, "usage", None)]
    assert usage and (usage[-1].prompt_tokens, usage[-1].completion_tokens) == (TOKENS_IN, 4)
    [row] = ledger(served)
    assert (row["status"], row["tokens_out"]) == ("ok", 4)


def test_litellm_responses(
    served: ServerThread, upstream: FakeUpstream, litellm: ModuleType, offline: list[str]
) -> None:
    reply = litellm.responses(
        model="openai/chat",
        api_base=f"{served.url}/v1",
        api_key=new_key(served),
        input="hi",
        max_output_tokens=16,  # OpenAI's least (litellm raises a smaller one to it)
        num_retries=0,
    )
    out = min(16, upstream.chunks)  # the fake answers at most `chunks` tokens
    assert reply.output[0].content[0].text == "tok " * out
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (TOKENS_IN, out)
    assert upstream.received[-1]["max_output_tokens"] == 16
    [row] = ledger(served)
    assert (row["route"], row["status"], row["tokens_out"]) == ("responses", "ok", out)


def test_litellm_sees_gateway_errors(
    served: ServerThread, litellm: ModuleType, offline: list[str]
) -> None:
    key = new_key(served, models=["other"])
    with pytest.raises(litellm.exceptions.APIError) as refused:
        litellm.completion(
            model="openai/chat",
            api_base=f"{served.url}/v1",
            api_key=key,
            messages=[{"role": "user", "content": "hi"}],
            num_retries=0,
        )
    assert refused.value.status_code == 403 and "may not use model 'chat'" in str(refused.value)


# --- GET /v1/models/{id} -------------------------------------------------------------------


def test_model_retrieve(served: ServerThread) -> None:
    key = new_key(served, models=["chat"])
    sdk = openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=0)
    try:
        model = sdk.models.retrieve("chat")
        assert (model.id, model.object, model.owned_by) == ("chat", "model", "kairos-gateway")
        with pytest.raises(openai.NotFoundError) as missing:
            sdk.models.retrieve("nope")
        assert missing.value.body["code"] == "model_not_found"  # type: ignore[index]
        assert "'nope'" in missing.value.message and "GET /v1/models" in missing.value.message
    finally:
        sdk.close()
    headers = {"authorization": f"Bearer {key}"}
    # a model the key may not use answers exactly as one that does not exist
    hidden = httpx.get(f"{served.url}/v1/models/other", headers=headers)
    absent = httpx.get(f"{served.url}/v1/models/absent", headers=headers)
    assert hidden.status_code == absent.status_code == 404
    assert hidden.json()["error"]["message"].replace("'other'", "X") == absent.json()["error"][
        "message"
    ].replace("'absent'", "X")
    assert httpx.get(f"{served.url}/v1/models/chat").status_code == 401  # a key is needed
    listed = httpx.get(f"{served.url}/v1/models", headers=headers).json()["data"]
    assert listed == [httpx.get(f"{served.url}/v1/models/chat", headers=headers).json()]


def test_model_retrieve_aliases_and_slashed_names(upstream: FakeUpstream, tmp_path: Path) -> None:
    models = {
        "org/chat": {"deployments": [deployment("echo")]},
        "other": {"deployments": [deployment("echo")]},
    }
    gateway = Gateway(config(upstream, tmp_path, models=models, aliases={"fast": "org/chat"}))
    with ServerThread(create_gateway_app(gateway), kairos=True) as server:
        server.gateway = gateway  # type: ignore[attr-defined]
        headers = {"authorization": f"Bearer {new_key(server, models=['org/chat'])}"}
        for name in ("org/chat", "fast"):
            found = httpx.get(f"{server.url}/v1/models/{name}", headers=headers)
            assert found.status_code == 200 and found.json()["id"] == name
        assert httpx.get(f"{server.url}/v1/models/other", headers=headers).status_code == 404
        server.call(gateway.close())
