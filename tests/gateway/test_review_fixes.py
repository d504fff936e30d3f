"""Fixes from the review of the gateway split: input a provider fetches itself is refused on
keys with limits, a completion's suffix is counted, count_tokens is a request like any other
(rpm, ledger), a Responses stream error is masked before it is cut, and providers answer
check / count_tokens themselves (no special case for Anthropic in the gateway)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kairos.gateway import BudgetExceeded, Gateway
from kairos.gateway.errors import InvalidRequest
from tests.gateway.conftest import PROVIDER_SECRET, config
from tests.gateway.fake_upstream import FakeUpstream

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
