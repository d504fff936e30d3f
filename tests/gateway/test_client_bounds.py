"""Every integer a client sends is bounded before it meets a store: out of its documented range
(docs/gateway.md) it is a 400 naming the field, with budgets or without. Served over HTTP by
kairos' own server, as `kairos gateway serve` runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from kairos.gateway.bounds import MAX_TOKENS
from kairos.gateway.errors import GatewayConfigError
from tests.gateway.conftest import config, new_key
from tests.gateway.fake_upstream import FakeUpstream, ServerThread

HI = [{"role": "user", "content": "hi"}]
CHAT = {"model": "chat", "messages": HI}
COMPLETION = {"model": "chat", "prompt": "Say hi"}
EMBEDDING = {"model": "chat", "input": "hello"}
RESPONSES = {"model": "chat", "input": "Say hi"}
MESSAGES = {"model": "chat", "messages": HI, "max_tokens": 5}
# past 2**31 - 1: 1e18 fitted SQLite and PostgreSQL but not a cost; 2**63 and 2**64 - 1 did
# not fit a ledger row (a 500 OverflowError on a key without budgets)
HUGE = [2**31, 10**18, 2**63, 2**64 - 1]
BUDGETS = [{"period": "day", "usd": 5}]


def post(server: ServerThread, path: str, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers={"authorization": f"Bearer {key}"})


def refused(response: httpx.Response, field: str) -> None:
    """A 400 whose error names `field` (in `param` too, on the OpenAI routes)."""
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert field in error["message"], error
    if "param" in error:  # OpenAI's shape; Anthropic's error has none
        assert error["param"] == field, error


OUTPUT_LIMITS = [
    ("/v1/chat/completions", CHAT, "max_tokens"),
    ("/v1/chat/completions", CHAT, "max_completion_tokens"),
    ("/v1/completions", COMPLETION, "max_tokens"),
    ("/v1/responses", RESPONSES, "max_output_tokens"),
    ("/v1/messages", MESSAGES, "max_tokens"),
]


@pytest.mark.parametrize("budgets", [False, True], ids=["no budgets", "budgets"])
@pytest.mark.parametrize(("path", "body", "field"), OUTPUT_LIMITS)
def test_an_output_limit_past_2_31_is_a_400_naming_it(
    served: ServerThread,
    upstream: FakeUpstream,
    path: str,
    body: dict[str, Any],
    field: str,
    budgets: bool,
) -> None:
    key = new_key(served, budgets=BUDGETS) if budgets else new_key(served)
    for value in HUGE:
        refused(post(served, path, key, {**body, field: value}), field)
    assert upstream.received == []
    # the largest it takes is served: held as asked, or clamped to what the budget covers
    answered = post(served, path, key, {**body, field: MAX_TOKENS})
    assert answered.status_code == 200, answered.text[:500]


OTHER_INTEGERS = [
    ("/v1/chat/completions", CHAT, "n", [0, 129, 2**63]),
    ("/v1/chat/completions", CHAT, "top_logprobs", [-1, 21, 2**63]),
    ("/v1/chat/completions", CHAT, "seed", [2**63, 2**64 - 1]),
    ("/v1/completions", COMPLETION, "n", [0, 129]),
    ("/v1/completions", COMPLETION, "logprobs", [-1, 6, 2**63]),
    ("/v1/completions", COMPLETION, "seed", [2**63]),
    ("/v1/completions", COMPLETION, "best_of", [2, True, 2**63]),
    ("/v1/embeddings", EMBEDDING, "dimensions", [0, 2**31, 2**63]),
    ("/v1/responses", RESPONSES, "top_logprobs", [-1, 21, 2**63]),
    ("/v1/responses", RESPONSES, "max_tool_calls", [0, 2**31, 2**63]),
]


@pytest.mark.parametrize(
    ("path", "body", "field", "values"),
    OTHER_INTEGERS,
    ids=[f"{p} {f}" for p, _, f, _ in OTHER_INTEGERS],
)
def test_every_other_integer_has_a_maximum(
    served: ServerThread,
    upstream: FakeUpstream,
    path: str,
    body: dict[str, Any],
    field: str,
    values: list[Any],
) -> None:
    key = new_key(served)
    for value in values:
        refused(post(served, path, key, {**body, field: value}), field)
    assert upstream.received == []


@pytest.mark.parametrize("bias", [101, -101, 2**63, "1"])
def test_logit_bias_values_are_from_minus_100_to_100(
    served: ServerThread, upstream: FakeUpstream, bias: Any
) -> None:
    key = new_key(served)
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)):
        refused(post(served, path, key, {**body, "logit_bias": {"50256": bias}}), "logit_bias")
    assert upstream.received == []
    answered = post(served, "/v1/chat/completions", key, {**CHAT, "logit_bias": {"50256": -100}})
    assert answered.status_code == 200, answered.text[:500]


def test_a_completion_takes_at_most_2048_prompts(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    """Each prompt is held as n answers of max_tokens: the count multiplies the hold."""
    key = new_key(served)
    refused(post(served, "/v1/completions", key, {**COMPLETION, "prompt": ["a"] * 2049}), "prompt")
    assert upstream.received == []
    answered = post(served, "/v1/completions", key, {**COMPLETION, "prompt": ["a"] * 2048})
    assert answered.status_code == 200, answered.text[:500]


def test_the_configured_default_output_limit_is_bounded_alike(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    with pytest.raises(GatewayConfigError, match=f"default_max_tokens must be .* {MAX_TOKENS}"):
        config(upstream, tmp_path, default_max_tokens=MAX_TOKENS + 1)
    assert config(upstream, tmp_path, default_max_tokens=MAX_TOKENS).default_max_tokens > 0
