"""A deployment group registered in the real gateway as one model group."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson

from kairos.gateway import Gateway, GatewayConfig
from kairos.serving.deploy import DeploymentSpec
from kairos.serving.group_provider import DeploymentProvider, gateway_entries
from kairos.serving.supervisor import DeploymentGroup
from tests.serving.test_worker import _metric

ENVIRON = {"GW_ADMIN": "admin-key-1", "GW_PEPPER": "pepper-1"}


def test_gateway_calls_reach_the_least_busy_replica_and_are_billed(
    tiny_model: Path, tmp_path: Path
) -> None:
    spec = DeploymentSpec(name="tiny", model=str(tiny_model), replicas=2, ctx=256, threads=1,
                          poll_interval=0.1, ready_timeout=30)  # fmt: skip

    async def run() -> tuple[list[Any], Any, list[float]]:
        async with DeploymentGroup(spec, log_dir=tmp_path) as group:
            raw = {
                "admin_key_env": "GW_ADMIN", "pepper_env": "GW_PEPPER",
                "registry": f"sqlite:///{tmp_path / 'gw.db'}",
                "counters": f"sqlite:///{tmp_path / 'gw.db'}",
                **gateway_entries("tiny", price={"input": 1, "output": 1}),
            }  # fmt: skip
            config = GatewayConfig.from_mapping(raw, base_dir=tmp_path, environ=ENVIRON)
            provider = DeploymentProvider(group)
            gateway = Gateway(config, providers={"tiny": provider})
            try:
                _, key = await gateway.create_key(name="t")
                body = {"model": "tiny", "prompt": "hi", "max_tokens": 3, "ignore_eos": True}
                replies = await asyncio.gather(*(gateway.completion(key, body) for _ in range(4)))
                stream = await gateway.chat(key, {"model": "tiny", "max_tokens": 2,
                    "messages": [{"role": "user", "content": "a"}], "stream": True,
                    "ignore_eos": True})  # fmt: skip
                chunks = [  # the gateway hands chunks on as dicts or as their JSON bytes
                    c if isinstance(c, dict) else orjson.loads(c)
                    async for c in stream  # type: ignore[union-attr]
                ]
                await stream.wait()  # type: ignore[union-attr]
                rows = await gateway.usage()
                # tokens each replica generated beyond its 1-token readiness probe
                served = [_metric(url, "kairos_llm_generation_tokens_total") - 1
                          for url in group.urls]  # fmt: skip
            finally:
                await gateway.close()
            return [*replies, chunks], rows, served

    results, rows, served = asyncio.run(run())
    *replies, chunks = results
    assert all(r["usage"]["completion_tokens"] == 3 for r in replies)
    assert all(n >= 3 for n in served) and sum(served) == 4 * 3 + 2  # both replicas served
    assert any(c.get("choices") for c in chunks)
    assert len(rows) == 5 and all(row.status == "ok" for row in rows)
    assert sum(row.tokens_out for row in rows) == 4 * 3 + 2
