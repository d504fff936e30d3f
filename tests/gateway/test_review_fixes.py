"""Fixes from the review of the gateway split: input a provider fetches itself is refused on
keys with limits, a completion's suffix is counted, count_tokens is a request like any other
(rpm, ledger), a Responses stream error is masked before it is cut, and providers answer
check / count_tokens themselves (no special case for Anthropic in the gateway)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from kairos.gateway import BudgetExceeded, Gateway
from kairos.gateway.config import ProviderConfig
from kairos.gateway.errors import InvalidRequest, UpstreamError
from kairos.gateway.providers.openai_compatible import OpenAICompatible
from kairos.gateway.providers.responses_chat import usage_as_responses
from tests.gateway.conftest import PROVIDER_SECRET, config, new_key
from tests.gateway.fake_upstream import FakeUpstream, ServerThread

HI = [{"role": "user", "content": "hi"}]
HEAD = PROVIDER_SECRET[:8]  # a piece this long from the key's start is already a leak


# --- input the provider fetches itself --------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        (
            "responses",
            {"input": [{"type": "item_reference", "id": "msg_1"},
                       {"role": "user", "content": "go on"}]},
            "input[0]",
        ),
        ("chat", {"messages": HI, "web_search_options": {}}, "web_search_options"),
    ],
)  # fmt: skip
def test_input_fetched_by_the_provider_is_refused_on_keys_with_limits(
    upstream: FakeUpstream, tmp_path: Path, kind: str, body: dict[str, Any], param: str
) -> None:
    body = {"model": "chat", "max_tokens": 5, **body}
    if kind == "responses":
        body = {"max_output_tokens": 16, **{k: v for k, v in body.items() if k != "max_tokens"}}

    async def scenario() -> list[InvalidRequest | None]:
        gateway = Gateway(config(upstream, tmp_path))
        call = gateway.responses if kind == "responses" else gateway.chat
        _, budgeted = await gateway.create_key(
            name="b", budgets=[{"period": "day", "tokens": 10**6}]
        )
        _, limited = await gateway.create_key(name="l", tpm=10**6)
        _, free = await gateway.create_key(name="f", rpm=100)
        errors: list[InvalidRequest | None] = []
        try:
            await call(free, body)  # nothing to bound: it goes
            for key in (budgeted, limited):
                try:
                    await call(key, body)
                    errors.append(None)
                except InvalidRequest as error:
                    errors.append(error)
        finally:
            await gateway.close()
        return errors

    errors = asyncio.run(scenario())
    assert all(e is not None and e.param == param for e in errors), errors
    assert len(upstream.received) == 1  # the free key's call only


def test_a_completions_suffix_counts_towards_the_input_bound(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """A budget of 400 tokens covers "hi" and 5 output tokens, not a suffix of 2,000 bytes."""
    body = {"model": "chat", "prompt": "hi", "max_tokens": 5}

    async def scenario() -> BudgetExceeded | None:
        gateway = Gateway(config(upstream, tmp_path))
        _, key = await gateway.create_key(name="b", budgets=[{"period": "day", "tokens": 400}])
        try:
            await gateway.completion(key, body)
            try:
                await gateway.completion(key, {**body, "suffix": "ab " * 700})
            except BudgetExceeded as error:
                return error
            return None
        finally:
            await gateway.close()

    assert asyncio.run(scenario()) is not None
    assert len(upstream.received) == 1


# --- count_tokens is a request like any other -------------------------------------------------


def test_count_tokens_counts_against_the_keys_rpm_and_is_logged(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    key = new_key(served, rpm=2)

    def count() -> httpx.Response:
        return httpx.post(
            f"{served.url}/v1/messages/count_tokens",
            json={"model": "claude", "messages": HI},
            headers={"x-api-key": key},
        )

    assert [count().json()["input_tokens"] for _ in range(2)] == [100, 100]
    refused = count()
    assert refused.status_code == 429, refused.text
    assert refused.json()["type"] == "error" and int(refused.headers["retry-after"]) >= 0
    assert len(upstream.received) == 2  # the third was refused before it left
    gateway: Gateway = served.gateway  # type: ignore[attr-defined]
    rows = served.call(gateway.usage())
    assert sorted((r.route, r.status, r.tokens_in, r.cost_micros) for r in rows) == [
        ("count_tokens", "ok", 0, 0), ("count_tokens", "ok", 0, 0),
        ("count_tokens", "rate_limit_exceeded", 0, 0),
    ]  # fmt: skip


# --- a Responses stream error is masked, then cut ----------------------------------------------


def test_a_responses_stream_error_is_masked_before_it_is_cut(upstream: FakeUpstream) -> None:
    """The key begins 280 characters into the message: cut at 300 first, its head would stay."""
    url = upstream.url  # type: ignore[attr-defined]
    provider = OpenAICompatible(ProviderConfig("fake", "openai", f"{url}/v1", PROVIDER_SECRET))
    body = {"model": "wordy", "input": "hi", "max_output_tokens": 5}

    async def scenario() -> UpstreamError:
        try:
            with pytest.raises(UpstreamError) as caught:
                async for _ in provider.stream("responses", body, 5.0):
                    pass
            return caught.value
        finally:
            await provider.close()

    error = asyncio.run(scenario())
    assert "scripted overload xxx" in error.message and "***" in error.message
    assert HEAD not in error.message and error.accepted


# --- one name per job, one refusal for a field the translation cannot carry -------------------


def test_chat_usage_in_the_responses_names() -> None:
    usage = {"prompt_tokens": 10, "completion_tokens": 2,
             "prompt_tokens_details": {"cached_tokens": 4}}  # fmt: skip
    translated = usage_as_responses(usage)
    assert translated is not None
    assert (translated["input_tokens"], translated["output_tokens"]) == (10, 2)
    assert translated["input_tokens_details"] == {"cached_tokens": 4}


@pytest.mark.parametrize(
    ("kind", "extra", "message"),
    [
        ("chat", {"seed": 1}, "seed cannot be sent to an Anthropic deployment; drop it"),
        ("chat", {"n": 2}, "n cannot be sent to an Anthropic deployment as 2 (only 1); drop it"),
        (
            "responses",
            {"truncation": "auto"},
            "truncation cannot be sent to an Anthropic deployment as 'auto' (only 'disabled'); "
            "drop it",
        ),
        ("responses", {"reasoning": {}}, "reasoning cannot be sent to an Anthropic deployment;"),
    ],
)
def test_a_field_anthropic_cannot_carry_is_refused_alike_on_both_routes(
    upstream: FakeUpstream, tmp_path: Path, kind: str, extra: dict[str, Any], message: str
) -> None:
    body: dict[str, Any] = {"model": "claude", **extra}
    body.update({"messages": HI} if kind == "chat" else {"input": "hi"})

    async def scenario() -> InvalidRequest:
        gateway = Gateway(config(upstream, tmp_path))
        _, key = await gateway.create_key(name="k")
        try:
            with pytest.raises(InvalidRequest) as caught:
                await (gateway.chat if kind == "chat" else gateway.responses)(key, body)
            return caught.value
        finally:
            await gateway.close()

    error = asyncio.run(scenario())
    assert error.message.startswith(message) and error.param == next(iter(extra))
    assert error.message.endswith("call a model served by an OpenAI-compatible deployment")
    assert upstream.received == []


# --- providers check and count for themselves ---------------------------------------------------


class _Strict(OpenAICompatible):
    """An OpenAI-compatible provider that takes no `seed` and counts tokens its own way."""

    def check(self, kind: str, body: dict[str, Any]) -> None:
        if "seed" in body:
            raise InvalidRequest("seed is not taken here; drop it", param="seed")

    async def count_tokens(self, body: dict[str, Any], timeout: float) -> int:
        return 7 * len(body["messages"])


def test_every_provider_checks_a_body_before_the_hold_and_counts_its_tokens(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    gateway_config = config(upstream, tmp_path)
    providers = {name: _Strict(p) for name, p in gateway_config.providers.items()}

    async def scenario() -> tuple[InvalidRequest | None, int]:
        gateway = Gateway(gateway_config, providers=providers)  # type: ignore[arg-type]
        _, key = await gateway.create_key(name="k")
        try:
            try:
                await gateway.chat(key, {"model": "chat", "messages": HI, "seed": 1})
                refused = None
            except InvalidRequest as error:
                refused = error
            return refused, await gateway.count_tokens(key, {"model": "chat", "messages": HI})
        finally:
            await gateway.close()

    refused, counted = asyncio.run(scenario())
    assert refused is not None and refused.param == "seed"
    assert counted == 7  # the provider's count, not the gateway's tokenizer (none for echo)
    assert upstream.received == []
