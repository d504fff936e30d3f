"""How an attempt fails (issue 13 review): a request that may have reached its provider is
charged in full and never sent to another deployment; one that did not (or a provider that
raised something unexpected) is free and fails over; nothing between the hold and the
dispatch can strand the router, the hold or the ledger's pending row; a candidate skipped
after a provider failed does not hide that failure."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from kairos.gateway import Gateway, UpstreamError
from kairos.gateway.app import create_gateway_app
from kairos.gateway.calls import Call
from kairos.gateway.errors import InternalError
from kairos.gateway.keys import KeyRecord
from kairos.gateway.providers.openai_compatible import OpenAICompatible
from kairos.http.client import HTTPClient, HTTPFailure
from tests.gateway.conftest import config, deployment, new_key
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, ServerThread

HI = [{"role": "user", "content": "hi"}]
BUDGET = [{"period": "total", "usd_micros": 1_000_000}]  # CHEAP: a micro-dollar a token
# a deployment on the provider `nowhere` (replaced by each test), then the fake provider's
FAILOVER = {
    "group": {
        "deployments": [
            {**deployment("echo"), "provider": "nowhere"},
            deployment("echo", priority=1),
        ]
    }
}
Scenario = Callable[[Gateway, KeyRecord], Awaitable[Any]]


def run(
    upstream: FakeUpstream,
    tmp_path: Path,
    models: dict[str, Any],
    scenario: Scenario,
) -> Any:
    async def main() -> Any:
        gateway = Gateway(config(upstream, tmp_path, models=models))
        try:
            _, key = await gateway.create_key(name="t", budgets=BUDGET)
            return await scenario(gateway, key)
        finally:
            await gateway.close()

    return asyncio.run(main())


async def spent(gateway: Gateway, key: KeyRecord) -> int:
    await gateway.drain()  # settled, and budget shares given back
    [total] = await gateway.counters.spent([f"{key.id}:usd:total:all"])
    return total


def in_flight(gateway: Gateway) -> list[int]:
    return [health.in_flight for health in gateway.router._health.values()]


async def answer(reply: Any) -> Any:
    """A whole reply as is; a stream read to its end."""
    if isinstance(reply, dict):
        return reply
    return [chunk async for chunk in reply]


@pytest.mark.parametrize("stream", [False, True])
def test_a_timeout_after_sending_is_charged_and_not_failed_over(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """The provider got the request and did not answer within the deployment's timeout: it
    may still serve (and bill) it, so the hold is charged and no other deployment gets it."""
    monkeypatch.setattr(upstream, "slow_seconds", 1.5)
    slow = {**deployment("slow"), "timeout": 0.5}
    models = {"group": {"deployments": [slow, deployment("echo", priority=1)]}}
    body = {"model": "group", "messages": HI, "max_tokens": 20, "stream": stream}

    async def scenario(gateway: Gateway, key: KeyRecord) -> None:
        with pytest.raises(UpstreamError) as error:
            await gateway.chat(key, body)
        assert error.value.status == 504
        assert [r["model"] for r in upstream.received] == ["slow"]  # sent once, not failed over
        [row] = await gateway.usage()
        assert row.status == "upstream_error" and row.tokens_out == 20  # the full hold
        assert row.cost_micros == await spent(gateway, key) > 20
        assert in_flight(gateway) == [0, 0]

    run(upstream, tmp_path, models, scenario)


@pytest.mark.parametrize("stream", [False, True])
def test_a_failure_building_the_upstream_body_strands_nothing(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """Whatever raises between the hold and the dispatch: the hold is given back, the router
    finished, a final row logged, and the caller gets a gateway error (not a bare one)."""

    def broken(self: Call, *args: Any) -> dict[str, Any]:
        raise TypeError("'<' not supported between instances of 'str' and 'int'")

    monkeypatch.setattr(Call, "_upstream_body", broken)
    models = {"group": {"deployments": [deployment("echo")]}}
    body = {"model": "group", "messages": HI, "max_tokens": 20, "stream": stream}

    async def scenario(gateway: Gateway, key: KeyRecord) -> None:
        with pytest.raises(InternalError) as error:
            await gateway.chat(key, body)
        assert error.value.status == 500 and "TypeError" in error.value.message
        assert await spent(gateway, key) == 0
        assert in_flight(gateway) == [0]
        assert [row.status for row in await gateway.usage()] == ["internal_error"]
        assert upstream.received == []

    run(upstream, tmp_path, models, scenario)


def test_a_bad_output_limit_strands_nothing_over_http(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The reviewer's repro: a client error in a field the cap lowers is a JSON error (400
    once the request is validated for it), and the router, hold and ledger are left clean."""
    gateway = Gateway(config(upstream, tmp_path))
    with ServerThread(create_gateway_app(gateway), kairos=True) as served:
        served.gateway = gateway  # type: ignore[attr-defined]
        key = new_key(served, budgets=BUDGET)
        body = {"model": "chat", "messages": HI, "max_completion_tokens": 5, "max_tokens": "x"}
        with httpx.Client(timeout=10) as client:
            for _ in range(3):
                reply = client.post(
                    f"{served.url}/v1/chat/completions",
                    headers={"authorization": f"Bearer {key}"},
                    json=body,
                )
                assert reply.status_code == 400, reply.text  # a client error, not a 500
                assert "error" in reply.json() and "Traceback" not in reply.text
        record = served.call(gateway.authenticate(key))
        assert served.call(spent(gateway, record)) == 0
        assert in_flight(gateway) == [0] * len(in_flight(gateway))
        assert "pending" not in [row.status for row in served.call(gateway.usage())]
        served.call(gateway.close())


async def _hang_up_on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A proxy that reads the CONNECT line and closes without answering."""
    await reader.readline()
    writer.close()


def test_a_proxy_closing_during_connect_is_a_failure_before_sending() -> None:
    async def scenario() -> None:
        proxy = await asyncio.start_server(_hang_up_on_connect, "127.0.0.1", 0)
        port = proxy.sockets[0].getsockname()[1]
        client = HTTPClient(proxies={"https": f"http://127.0.0.1:{port}"})
        try:
            with pytest.raises(HTTPFailure) as failure:
                await client.request("POST", "https://upstream.invalid/v1", {}, b"{}", 5)
            assert not failure.value.connected  # nothing was sent: another may be tried
        finally:
            await client.close()
            proxy.close()

    asyncio.run(scenario())


def test_a_proxy_closing_during_connect_is_free_and_fails_over(
    upstream: FakeUpstream, tmp_path: Path
) -> None:

    async def scenario(gateway: Gateway, key: KeyRecord) -> None:
        proxy = await asyncio.start_server(_hang_up_on_connect, "127.0.0.1", 0)
        port = proxy.sockets[0].getsockname()[1]
        tunnelled = dataclasses.replace(
            gateway.config.providers["nowhere"], base_url="https://upstream.invalid/v1"
        )
        client = HTTPClient(proxies={"https": f"http://127.0.0.1:{port}"})
        gateway.providers["nowhere"] = OpenAICompatible(tunnelled, client)
        try:
            body = {"model": "group", "messages": HI, "max_tokens": 2}
            reply = await gateway.chat(key, body)
            assert isinstance(reply, dict) and reply["usage"]["completion_tokens"] == 2
            [row] = await gateway.usage()
            assert (row.status, row.attempts, row.provider) == ("ok", 2, "fake")
            assert await spent(gateway, key) == row.cost_micros == TOKENS_IN + 2
        finally:
            proxy.close()

    run(upstream, tmp_path, FAILOVER, scenario)


class _Raising(OpenAICompatible):
    """A provider with a bug: every call raises something other than an UpstreamError."""

    async def send(self, kind: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        raise RuntimeError("a bug in the provider")

    async def stream(self, kind: str, body: dict[str, Any], timeout: float) -> AsyncIterator[bytes]:
        raise RuntimeError("a bug in the provider")
        yield b""  # an async generator, as providers' streams are


@pytest.mark.parametrize("stream", [False, True])
def test_an_unexpected_provider_exception_is_free_and_fails_over(
    upstream: FakeUpstream, tmp_path: Path, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    """Not a caller gone (which is charged): given back, logged with its type, failed over."""
    body = {"model": "group", "messages": HI, "max_tokens": 2, "stream": stream}

    async def scenario(gateway: Gateway, key: KeyRecord) -> None:
        gateway.providers["nowhere"] = _Raising(gateway.config.providers["nowhere"])
        with caplog.at_level(logging.ERROR, logger="kairos.gateway.calls"):
            await answer(await gateway.chat(key, body))
        [row] = await gateway.usage()
        assert (row.status, row.attempts, row.provider) == ("ok", 2, "fake")
        assert await spent(gateway, key) == row.cost_micros == TOKENS_IN + 2
        assert in_flight(gateway) == [0, 0]
        assert "RuntimeError" in caplog.text

    run(upstream, tmp_path, FAILOVER, scenario)


def test_a_skipped_fallback_does_not_hide_the_providers_failure(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The primary answers 500; the fallback has no price (a USD-budgeted key cannot use it):
    the call fails with the provider's 502, not the fallback's 400."""
    unpriced = {"provider": "fake", "model": "echo-unpriced", "timeout": "5s"}
    models = {
        "group": {"deployments": [deployment("fail")], "fallbacks": ["backup"]},
        "backup": {"deployments": [unpriced]},
    }

    async def scenario(gateway: Gateway, key: KeyRecord) -> None:
        with pytest.raises(UpstreamError) as error:
            await gateway.chat(key, {"model": "group", "messages": HI, "max_tokens": 2})
        assert error.value.status == 502 and "scripted 500" in error.value.message
        assert [r["model"] for r in upstream.received] == ["fail"]

    run(upstream, tmp_path, models, scenario)
