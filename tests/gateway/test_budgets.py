"""Budgets hold under concurrency on every counters backend; holds clamp, refuse and settle."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from kairos.gateway import BudgetExceeded, Gateway, RateLimited
from kairos.gateway.accounting.accountant import input_bound
from kairos.gateway.errors import AccountingUnavailable
from tests.gateway.conftest import config, new_key
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, ServerThread

HI = [{"role": "user", "content": "hi"}]
BOUND = input_bound(len(orjson.dumps({"messages": HI})), 1)  # a hold's input bound for HI


@pytest.mark.slow
@pytest.mark.parametrize("limit", [1_000, 30_000])
def test_200_concurrent_requests_never_exceed_the_budget(
    upstream: FakeUpstream, tmp_path: Path, counters_url: str, limit: int
) -> None:
    """Two gateways (as two processes would) share one set of counters. A budget of 1,000
    micro-dollars is too small for budget shares (every hold goes to the store); one of 30,000
    starts with holds served from shares and ends, near its limit, with every hold in the
    store."""
    upstream.keep_log = False  # each answer really costs 10 + 5 = 15 micro-dollars
    served_from_shares: list[int] = []

    async def scenario() -> tuple[int, int, int, list[int]]:
        gateways = [Gateway(config(upstream, tmp_path, counters=counters_url)) for _ in range(2)]
        _, key = await gateways[0].create_key(
            name="small", budgets=[{"period": "total", "usd_micros": limit}]
        )

        async def one(index: int) -> str:
            try:
                await gateways[index % 2].chat(
                    key, {"model": "chat", "messages": HI, "max_tokens": 50}
                )
            except BudgetExceeded:
                return "refused"
            return "ok"

        try:
            outcomes = await asyncio.gather(*(one(i) for i in range(200)))
            # what the burst's holds left unused is free again: spend it one call at a time
            while True:
                for gateway in gateways:
                    await gateway.drain()  # every answered call settled
                outcomes.append(outcome := await one(0))
                if outcome != "ok":
                    break
            [spent] = await gateways[0].counters.spent([f"{key.id}:usd:total:all"])
            for gateway in gateways:
                await gateway.ledger.flush()
            rows = await gateways[0].usage(key.id)
            costs = [row.cost_micros for row in rows if row.status == "ok"]
            served_from_shares.extend(gateway.shares.served for gateway in gateways)
            return outcomes.count("ok"), outcomes.count("refused"), spent, costs
        finally:
            for gateway in gateways:
                await gateway.close()

    try:
        served, refused, spent, costs = asyncio.run(scenario())
    finally:
        upstream.keep_log = True
    assert served + refused > 200
    assert spent <= limit
    assert spent == sum(costs)  # settled to real usage, no drift
    assert all(TOKENS_IN + 1 <= c <= TOKENS_IN + 5 for c in costs)  # clamped ones answer less
    assert len(costs) == served
    assert spent > limit - (BOUND + 1)  # refused only when not even one output token fits
    if limit > 1_000:
        assert all(served > 0 for served in served_from_shares)
    else:
        assert served_from_shares == [0, 0]


def test_max_tokens_is_clamped_to_what_remains(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    remaining = BOUND + 40
    key = new_key(served, budgets=[{"period": "day", "usd_micros": remaining}])
    response = httpx.post(
        f"{served.url}/v1/chat/completions",
        json={"model": "chat", "messages": HI, "max_tokens": 1000},
        headers={"authorization": f"Bearer {key}"},
    )
    assert response.status_code == 200
    assert upstream.received[-1]["max_completion_tokens"] == 40  # the cap, in the provider's field


def test_refused_with_429_when_nothing_is_left(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    key = new_key(served, budgets=[{"period": "month", "tokens": BOUND}])  # no room for output
    response = httpx.post(
        f"{served.url}/v1/chat/completions",
        json={"model": "chat", "messages": HI},
        headers={"authorization": f"Bearer {key}"},
    )
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "budget_exceeded"
    assert "month budget" in error["message"] and "max_tokens" in error["message"]
    assert upstream.received == []  # nothing was sent


def test_request_and_token_rate_limits(upstream: FakeUpstream, tmp_path: Path) -> None:
    async def scenario() -> None:
        gateway = Gateway(config(upstream, tmp_path))
        try:
            _, key = await gateway.create_key(name="rpm", rpm=2)
            body = {"model": "chat", "messages": HI, "max_tokens": 5}
            await gateway.chat(key, body)
            await gateway.chat(key, body)
            with pytest.raises(RateLimited, match="2 requests per minute"):
                await gateway.chat(key, body)
            _, key = await gateway.create_key(name="tpm", tpm=BOUND + 12)
            await gateway.chat(key, {**body, "max_tokens": 100})  # clamped to 12; 15 used
            with pytest.raises(RateLimited, match="tokens per minute"):
                await gateway.chat(key, {**body, "max_tokens": 100})
        finally:
            await gateway.close()

    asyncio.run(scenario())
    assert upstream.received[2]["max_completion_tokens"] == 12


def test_unpriced_model_is_refused_for_a_usd_budget(upstream: FakeUpstream, tmp_path: Path) -> None:
    models = {"free": {"deployments": [{"provider": "fake", "model": "echo-unpriced"}]}}
    upstream.behaviour["echo-unpriced"] = "echo"

    async def scenario() -> None:
        gateway = Gateway(config(upstream, tmp_path, models=models))
        try:
            _, capped = await gateway.create_key(
                name="usd", budgets=[{"period": "day", "usd": 1.0}]
            )
            with pytest.raises(Exception, match="no price for 'echo-unpriced'"):
                await gateway.chat(capped, {"model": "free", "messages": HI})
            _, open_key = await gateway.create_key(name="tokens only")
            reply = await gateway.chat(open_key, {"model": "free", "messages": HI})
            assert isinstance(reply, dict) and reply["usage"]["completion_tokens"] == 5
        finally:
            await gateway.close()

    asyncio.run(scenario())


def test_fails_closed_when_the_budget_store_is_down(upstream: FakeUpstream, tmp_path: Path) -> None:
    async def scenario() -> None:
        gateway = Gateway(config(upstream, tmp_path, counters="redis://127.0.0.1:1/0"))
        try:
            _, key = await gateway.create_key(name="b", budgets=[{"period": "day", "usd": 1}])
            with pytest.raises(AccountingUnavailable):
                await gateway.chat(key, {"model": "chat", "messages": HI})
        finally:
            await gateway.close()

    asyncio.run(scenario())
    assert upstream.received == []


def test_every_prompt_of_a_completion_is_held(upstream: FakeUpstream, tmp_path: Path) -> None:
    prompts = ["a", "b", "c"]
    bound = input_bound(len(orjson.dumps({"prompt": prompts})), 3)

    async def scenario() -> None:
        gateway = Gateway(config(upstream, tmp_path))
        try:
            _, key = await gateway.create_key(
                name="c", budgets=[{"period": "day", "usd_micros": bound + 3 * 7}]
            )
            await gateway.completion(key, {"model": "chat", "prompt": prompts, "max_tokens": 50})
        finally:
            await gateway.close()

    asyncio.run(scenario())
    assert upstream.received[-1]["max_tokens"] == 7  # 21 tokens of room shared by 3 answers


def test_no_route_escapes_the_budget(served: ServerThread, upstream: FakeUpstream) -> None:
    key = new_key(served, budgets=[{"period": "total", "tokens": 5}])  # less than any input
    headers = {"authorization": f"Bearer {key}"}
    calls: dict[str, dict[str, Any]] = {
        "/v1/chat/completions": {"model": "chat", "messages": HI},
        "/v1/completions": {"model": "chat", "prompt": "hi"},
        "/v1/embeddings": {"model": "chat", "input": "hi"},
        "/v1/messages": {"model": "chat", "messages": HI, "max_tokens": 5},
    }
    for path, body in calls.items():
        for stream in (False, True) if path != "/v1/embeddings" else (False,):
            sent = {**body, "stream": True} if stream else body
            response = httpx.post(f"{served.url}{path}", json=sent, headers=headers)
            assert response.status_code == 429, (path, stream, response.text)
    assert upstream.received == []
