"""The defaults and limits the README's gateway section names, as a configuration that sets
none of them gets them; the price table's override rule; holds priced at the dearest input."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import httpx

from kairos.gateway import Gateway, GatewayConfig, app, edge
from kairos.gateway.accounting.accountant import Accountant
from kairos.gateway.accounting.prices import Price
from kairos.gateway.app import create_gateway_app
from kairos.gateway.keys import Budget, KeyRecord
from kairos.gateway.store import counters_from_url
from kairos.http import client, server
from tests.gateway.conftest import ENVIRON, config, new_key
from tests.gateway.fake_upstream import FakeUpstream, ServerThread


def minimal(tmp_path: Path, **extra: object) -> GatewayConfig:
    raw = {
        "pepper_env": "GW_PEPPER",
        "registry": f"sqlite:///{tmp_path / 'gateway.db'}",
        "counters": f"sqlite:///{tmp_path / 'gateway.db'}",
        "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}},
        "models": {"chat": {"deployments": [{"provider": "p", "model": "gpt-4o-mini"}]}},
        **extra,
    }
    return GatewayConfig.from_mapping(raw, base_dir=tmp_path, environ=ENVIRON)


def test_the_defaults_the_readme_names(tmp_path: Path) -> None:
    config = minimal(tmp_path)
    (deployment,) = config.models["chat"].deployments
    assert deployment.timeout == 60 and deployment.deadline == 5 * 60
    assert config.stream_drain == 60 and config.key_cache == 1 and config.body_timeout == 30
    assert config.lease == 10 * 60 and config.budget_shares == 16
    gateway = Gateway(config)
    try:
        assert gateway.shares.depth == 16 and gateway.shares.lifetime == 2
    finally:
        asyncio.run(gateway.close())
    # the HTTP edge and the upstream client
    assert server.MAX_HEAD == 64 * 1024 and edge.MAX_BODY == 8 * 1024 * 1024
    assert client.IDLE_EXPIRY == 4 and client.MAX_AGE == 300
    assert app.SETTLE_AFTER == 0.002


def test_prices_in_the_configuration_go_over_the_shipped_table(tmp_path: Path) -> None:
    shipped = minimal(tmp_path).prices.get("gpt-4o-mini")
    assert shipped is not None and shipped.input > 0  # from prices.json
    config = minimal(tmp_path, prices={"gpt-4o-mini": {"input": 9.0, "output": 1.0}})
    assert config.prices.get("gpt-4o-mini") == Price(9_000_000, 1_000_000)
    assert config.prices.get("claude-haiku-4-5") == minimal(tmp_path).prices.get(
        "claude-haiku-4-5"
    )  # the rest of the table stays


def test_a_hold_prices_input_at_its_dearest_rate(tmp_path: Path) -> None:
    """A budget that covers the input at the input price but not at the cache-write price
    (which the provider may bill any input at) clamps the output: the hold is the dearer."""
    price = Price(1_000_000, 1_000_000, cache_write=2_000_000)  # $1 in/out, $2 cache writes
    key = KeyRecord(
        id="k1", name="t", secret_hash="0" * 64, created_at=datetime.now(UTC),
        budgets=(Budget("total", usd_micros=1_500),),
    )  # fmt: skip

    async def scenario() -> int:
        counters = counters_from_url(f"sqlite:///{tmp_path / 'counters.db'}")
        try:
            hold = await Accountant(counters, lease=60).hold(key, price, 500, 1_000)
            return hold.max_tokens
        finally:
            await counters.close()

    # at the input price 500 in + 1,000 out = 1,500 would fit; at $2 input, 500 in cost 1,000
    assert asyncio.run(scenario()) == 500


def test_unreachable_counters_answer_503_over_http(upstream: FakeUpstream, tmp_path: Path) -> None:
    gateway = Gateway(config(upstream, tmp_path, counters="redis://127.0.0.1:1/0"))
    with ServerThread(create_gateway_app(gateway), kairos=True) as served:
        served.gateway = gateway  # type: ignore[attr-defined]
        key = new_key(served, budgets=[{"period": "day", "usd": 1}])
        answer = httpx.post(
            f"{served.url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]}, timeout=30,
        )  # fmt: skip
        served.call(gateway.close())
    assert answer.status_code == 503 and "error" in answer.json()
    assert upstream.received == []  # failed closed: nothing was sent
