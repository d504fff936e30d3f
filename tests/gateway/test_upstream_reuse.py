"""A healthy plain upstream through the gateway (issue 27, item 1): concurrent calls, a
failover group whose first member answers 429, and calls right after the upstream restarts
are all served, and the ledger bills exactly what the upstream served."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kairos.gateway import Gateway, GatewayConfig
from kairos.gateway.app import create_gateway_app
from tests.gateway.fake_upstream import ServerThread, free_port
from tests.http.test_client_reuse import upstream_process

PRICE = {"input": 1, "output": 1}  # one micro-dollar per token


def _deployment(provider: str) -> dict[str, Any]:
    return {"provider": provider, "model": "echo", "price": PRICE, "timeout": "5s"}


@pytest.fixture
def gateway_over(tmp_path: Path) -> Iterator[tuple[ServerThread, str, int]]:
    """A gateway whose model `chat` fails over from a 429-answering upstream to a plain one;
    yields the served gateway, a key, and the plain upstream's port."""
    port = free_port()
    with upstream_process("--status", "429") as busy:
        raw = {
            "admin_key_env": "GW_ADMIN",
            "pepper_env": "GW_PEPPER",
            "registry": f"sqlite:///{tmp_path / 'gateway.db'}",
            "counters": f"sqlite:///{tmp_path / 'gateway.db'}",
            "providers": {
                "busy": {"kind": "openai", "base_url": f"{busy}/v1", "api_key_env": "KEY"},
                "plain": {
                    "kind": "openai", "base_url": f"http://127.0.0.1:{port}/v1",
                    "api_key_env": "KEY",
                },
            },
            "models": {"chat": {"deployments": [_deployment("busy"), _deployment("plain")]}},
        }  # fmt: skip
        environ = {"KEY": "k", "GW_ADMIN": "admin", "GW_PEPPER": "pepper"}
        gateway = Gateway(GatewayConfig.from_mapping(raw, base_dir=tmp_path, environ=environ))
        with ServerThread(create_gateway_app(gateway), kairos=True) as served:
            key, _ = served.call(gateway.create_key(name="load", budgets=[]))
            served.gateway = gateway  # type: ignore[attr-defined]
            yield served, key, port
            served.call(gateway.close())


async def _calls(url: str, key: str, count: int) -> Counter[int]:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32}
    headers = {"authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        replies = await asyncio.gather(*[
            client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
            for _ in range(count)
        ])  # fmt: skip
    return Counter(reply.status_code for reply in replies)


@pytest.mark.slow
def test_concurrent_failover_and_restart_are_served_and_billed_as_served(
    gateway_over: tuple[ServerThread, str, int],
) -> None:
    served, key, port = gateway_over
    gateway: Gateway = served.gateway  # type: ignore[attr-defined]
    answered = 0
    for _restart in range(2):
        with upstream_process("--port", str(port)) as plain:
            for _wave in range(2):
                statuses = asyncio.run(_calls(served.url, key, 100))
                assert statuses == {200: 100}, statuses
                answered += 100
            served_here = httpx.get(f"{plain}/count").json()["served"]
            assert served_here == 200  # each call reached the upstream once
    usage = served.call(gateway.usage())
    billed = sum(row.tokens_in + row.tokens_out for row in usage)
    assert billed == answered * 11  # 10 prompt + 1 completion tokens each, nothing more
