"""What the provider receives is what the client sent: no output limit is added unless the
key's budgets or tpm need a cap (or the provider requires one), and a cap goes in the field
that provider and model expect."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from kairos.gateway import Gateway
from kairos.gateway.accounting.accountant import input_bound
from kairos.gateway.errors import GatewayConfigError
from kairos.gateway.keys import KeyRecord
from kairos.gateway.wire.messages import messages_to_chat
from tests.gateway.conftest import config, deployment
from tests.gateway.fake_upstream import FakeUpstream

HI = [{"role": "user", "content": "hi"}]
BOUND = input_bound(len(orjson.dumps({"messages": HI})), 1)
DAY = [{"period": "day", "usd": 100}]  # room for far more than default_max_tokens

Call = Callable[[Gateway, KeyRecord], Awaitable[Any]]


def received(
    upstream: FakeUpstream, tmp_path: Path, key: dict[str, Any], call: Call, **settings: Any
) -> dict[str, Any]:
    """The body the provider received for one call made with a key of `key`'s spec."""

    async def scenario() -> None:
        gateway = Gateway(config(upstream, tmp_path, **settings))
        try:
            _, record = await gateway.create_key(name="fwd", **key)
            reply = await call(gateway, record)
            if hasattr(reply, "wait"):  # a stream: read it to its end
                async for _ in reply:
                    pass
        finally:
            await gateway.close()

    asyncio.run(scenario())
    [body] = upstream.received
    return body


def chat(body: dict[str, Any]) -> Call:
    return lambda gateway, key: gateway.chat(key, {"model": "chat", "messages": HI, **body})


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"max_completion_tokens": 7, "reasoning_effort": "low"},
        {"max_tokens": 7, "temperature": 0.2, "seed": 3, "user": "u1"},
        {"rpm_only": True},
    ],
)
def test_an_unbounded_key_forwards_the_body_as_sent(
    upstream: FakeUpstream, tmp_path: Path, fields: dict[str, Any]
) -> None:
    key: dict[str, Any] = {"rpm": 100} if fields.pop("rpm_only", False) else {}
    body = received(upstream, tmp_path, key, chat(fields))
    # no max_tokens added (reasoning models refuse it), nothing dropped or renamed
    assert body == {"model": "echo", "messages": HI, **fields}


def test_an_unbounded_stream_adds_only_the_usage_request(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    body = received(upstream, tmp_path, {}, chat({"stream": True}))
    assert body == {
        "model": "echo", "messages": HI, "stream": True,
        "stream_options": {"include_usage": True},  # what the call is billed by
    }  # fmt: skip


@pytest.mark.parametrize(
    "key", [{"budgets": DAY}, {"budgets": [{"period": "month", "tokens": 10**6}]}, {"tpm": 10**6}]
)
def test_a_budgeted_key_sends_its_cap_as_max_completion_tokens(
    upstream: FakeUpstream, tmp_path: Path, key: dict[str, Any]
) -> None:
    body = received(upstream, tmp_path, key, chat({}))
    assert body == {"model": "echo", "messages": HI, "max_completion_tokens": 4096}


def test_the_cap_is_what_the_budget_covers(upstream: FakeUpstream, tmp_path: Path) -> None:
    key = {"budgets": [{"period": "day", "usd_micros": BOUND + 40}]}
    body = received(upstream, tmp_path, key, chat({}), default_max_tokens=1000)
    assert body == {"model": "echo", "messages": HI, "max_completion_tokens": 40}


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ({"max_tokens": 30}, {"max_completion_tokens": 30}),  # within the cap: its value
        ({"max_tokens": 500}, {"max_completion_tokens": 40}),  # lowered to the cap
        ({"max_completion_tokens": 500}, {"max_completion_tokens": 40}),
        ({"max_tokens": 500, "max_completion_tokens": 20},
         {"max_completion_tokens": 20}),  # one field, the one the provider reads
    ],
)  # fmt: skip
def test_a_client_limit_goes_in_the_provider_field(
    upstream: FakeUpstream, tmp_path: Path, sent: dict[str, Any], expected: dict[str, Any]
) -> None:
    key = {"budgets": [{"period": "day", "usd_micros": BOUND + 40}]}
    body = received(upstream, tmp_path, key, chat(sent))
    assert body == {"model": "echo", "messages": HI, **expected}


def test_token_field_names_the_field_of_an_older_server(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    url = f"{upstream.url}/v1"  # type: ignore[attr-defined]
    old = {"kind": "openai", "base_url": url, "token_field": "max_tokens"}
    settings = {
        "providers": {"old": old},
        "models": {"chat": {"deployments": [{**deployment("echo"), "provider": "old"}]}},
    }
    body = received(upstream, tmp_path, {"budgets": DAY}, chat({}), **settings)
    assert body == {"model": "echo", "messages": HI, "max_tokens": 4096}
    # an unbounded key still sends nothing of its own
    upstream.received.clear()
    body = received(upstream, tmp_path, {}, chat({}), **settings)
    assert body == {"model": "echo", "messages": HI}


def test_token_field_is_checked(upstream: FakeUpstream, tmp_path: Path) -> None:
    url = f"{upstream.url}/v1"  # type: ignore[attr-defined]
    with pytest.raises(GatewayConfigError, match="token_field must be one of"):
        config(upstream, tmp_path, providers={"x": {"base_url": url, "token_field": "tokens"}})
    with pytest.raises(GatewayConfigError, match="token_field must be one of"):
        config(
            upstream, tmp_path,
            providers={"x": {"kind": "anthropic", "base_url": url,
                             "token_field": "max_completion_tokens"}},
        )  # fmt: skip


def test_anthropic_always_gets_max_tokens(upstream: FakeUpstream, tmp_path: Path) -> None:
    body = received(upstream, tmp_path, {}, chat({"model": "claude"}))
    assert body["max_tokens"] == 4096  # Anthropic requires one: the default, unbounded key
    upstream.received.clear()
    body = received(upstream, tmp_path, {}, chat({"model": "claude", "max_completion_tokens": 9}))
    assert body["max_tokens"] == 9


def test_messages_max_tokens_goes_in_the_openai_field(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    anthropic_body = {"model": "chat", "max_tokens": 5, "messages": HI}

    def call(gateway: Gateway, key: KeyRecord) -> Awaitable[Any]:
        return gateway.messages_chat(key, messages_to_chat(anthropic_body))

    body = received(upstream, tmp_path, {}, call)
    assert body == {"model": "echo", "messages": HI, "max_completion_tokens": 5}


@pytest.mark.parametrize(("key", "expected"), [({}, {}), ({"budgets": DAY}, {"max_tokens": 16})])
def test_completions_add_max_tokens_only_for_a_cap(
    upstream: FakeUpstream, tmp_path: Path, key: dict[str, Any], expected: dict[str, Any]
) -> None:
    def call(gateway: Gateway, record: KeyRecord) -> Awaitable[Any]:
        return gateway.completion(record, {"model": "chat", "prompt": "Say hi"})

    body = received(upstream, tmp_path, key, call)
    # the completions API's own default is 16: what the hold assumed
    assert body == {"model": "echo", "prompt": "Say hi", **expected}
