"""Failover, circuit breakers and routing strategies."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kairos.gateway import Gateway, GatewayConfig, UpstreamError
from kairos.gateway.providers.router import Router
from tests.gateway.conftest import config, deployment
from tests.gateway.fake_upstream import FakeUpstream

HI = [{"role": "user", "content": "hi"}]
BODY: dict[str, Any] = {"model": "group", "messages": HI, "max_tokens": 2}


def run_gateway(
    upstream: FakeUpstream, tmp_path: Path, models: dict[str, Any], scenario: Any
) -> Any:
    async def main() -> Any:
        gateway = Gateway(config(upstream, tmp_path, models=models))
        try:
            _, key = await gateway.create_key(name="t")
            return await scenario(gateway, key)
        finally:
            await gateway.close()

    return asyncio.run(main())


# a timeout after the request was sent is billed, not failed over (test_attempt_failures.py)
@pytest.mark.parametrize("failing", ["fail", "busy", "unreachable"])
def test_failover_to_the_next_deployment(
    upstream: FakeUpstream, tmp_path: Path, failing: str
) -> None:
    first = deployment(failing)
    if failing == "unreachable":
        first = {**deployment("echo"), "provider": "nowhere"}
    models = {"group": {"deployments": [first, deployment("echo", priority=1)]}}

    async def scenario(gateway: Gateway, key: Any) -> Any:
        reply = await gateway.chat(key, BODY)
        return reply, await gateway.usage()

    reply, rows = run_gateway(upstream, tmp_path, models, scenario)
    assert reply["usage"]["completion_tokens"] == 2
    [row] = rows
    assert (row.attempts, row.deployment, row.status) == (2, "echo", "ok")
    assert row.cost_micros == 12  # only the answered attempt is billed


def test_a_client_error_does_not_fail_over(upstream: FakeUpstream, tmp_path: Path) -> None:
    upstream.behaviour["bad-one"] = "bad"
    models = {"group": {"deployments": [deployment("bad-one"), deployment("echo", priority=1)]}}

    async def scenario(gateway: Gateway, key: Any) -> Any:
        with pytest.raises(UpstreamError) as error:
            await gateway.chat(key, BODY)
        return error.value

    error = run_gateway(upstream, tmp_path, models, scenario)
    assert error.status == 400 and "scripted 400" in error.message
    assert [r["model"] for r in upstream.received] == ["bad-one"]


def test_the_circuit_opens_then_probes_half_open(upstream: FakeUpstream, tmp_path: Path) -> None:
    upstream.behaviour["flaky"] = "fail"
    models = {"group": {"deployments": [deployment("flaky"), deployment("echo", priority=1)]}}
    now = [0.0]

    async def scenario(gateway: Gateway, key: Any) -> list[list[str]]:
        gateway.router.clock = lambda: now[0]
        sent: list[list[str]] = []
        for step in range(6):
            if step == 4:
                now[0] = 1.5  # past the 1 s cooldown: one probe goes to flaky
            if step == 5:
                upstream.behaviour["flaky"] = "echo"
                now[0] = 3.0  # the probe failed at 1.5 and reopened it; probe again
            upstream.received.clear()
            await gateway.chat(key, BODY)
            sent.append([r["model"] for r in upstream.received])
        flaky = gateway.config.models["group"].deployments[0]
        sent.append([gateway.router.state(flaky)])
        return sent

    sent = run_gateway(upstream, tmp_path, models, scenario)
    assert sent[:3] == [["flaky", "echo"]] * 3  # three failures open the circuit (failures: 3)
    assert sent[3] == ["echo"]  # open: flaky is skipped
    assert sent[4] == ["flaky", "echo"]  # half-open probe fails: open again
    assert sent[5] == ["flaky"]  # the next probe succeeds
    assert sent[6] == ["closed"]


def test_fallback_groups_obey_the_allow_list(upstream: FakeUpstream, tmp_path: Path) -> None:
    models = {
        "group": {"deployments": [deployment("fail")], "fallbacks": ["backup"]},
        "backup": {"deployments": [deployment("echo")]},
    }

    async def scenario(gateway: Gateway, key: Any) -> Any:
        _, narrow = await gateway.create_key(name="narrow", models=["group"])
        with pytest.raises(UpstreamError):
            await gateway.chat(narrow, BODY)  # backup is not allowed: no fallback to it
        sent = [r["model"] for r in upstream.received]
        upstream.received.clear()
        reply = await gateway.chat(key, BODY)  # "*" may fall back
        return sent, [r["model"] for r in upstream.received], reply

    narrow_sent, wide_sent, reply = run_gateway(upstream, tmp_path, models, scenario)
    assert narrow_sent == ["fail"]
    assert wide_sent == ["fail", "echo"] and reply["choices"]


def strategy_router(strategy: str, weights: tuple[float, ...] = (1.0, 1.0)) -> Router:
    raw = {
        "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
        "models": {
            "g": {
                "strategy": strategy,
                "deployments": [
                    {"provider": "p", "model": f"m{i}", "weight": w, "priority": i}
                    for i, w in enumerate(weights)
                ],
            }
        },
    }
    return Router(GatewayConfig.from_mapping(raw, environ={}), rng=random.Random(7))


def test_strategies_order_deployments() -> None:
    def everyone(group: str) -> bool:
        return True

    router = strategy_router("priority")
    assert [d.model for d in router.candidates("g", everyone)] == ["m0", "m1"]

    router = strategy_router("weighted", (1.0, 3.0))
    firsts = Counter(router.candidates("g", everyone)[0].model for _ in range(2000))
    assert 0.70 < firsts["m1"] / 2000 < 0.80  # weight 3 of 4

    router = strategy_router("least-busy")
    m0 = router.config.models["g"].deployments[0]
    assert router.acquire(m0)
    assert [d.model for d in router.candidates("g", everyone)] == ["m1", "m0"]

    router = strategy_router("lowest-latency")
    m0, m1 = router.config.models["g"].deployments
    for deployment_, seconds in ((m0, 0.5), (m1, 0.1)):
        router.acquire(deployment_)
        router.finished(deployment_, "ok", seconds)
    assert [d.model for d in router.candidates("g", everyone)] == ["m1", "m0"]
