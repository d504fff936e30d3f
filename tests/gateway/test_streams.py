"""Streams: a client that disconnects is still billed; failures before the first byte fail
over, after it they arrive in-band."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from kairos.gateway import Gateway
from kairos.gateway.app import create_gateway_app
from tests.gateway.conftest import config, deployment, new_key, rows_when
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, ServerThread

HI: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture
def routed(upstream: FakeUpstream, tmp_path: Path) -> Iterator[ServerThread]:
    models = {
        "late": {"deployments": [deployment("late")]},
        "cut": {"deployments": [deployment("cut")]},
        "broken": {"deployments": [deployment("broken")]},
        "failover": {
            "deployments": [deployment("busy"), deployment("echo", priority=1)],
        },
    }
    gateway = Gateway(config(upstream, tmp_path, models=models))
    with ServerThread(create_gateway_app(gateway), kairos=True) as server:
        server.gateway = gateway  # type: ignore[attr-defined]
        yield server
        server.call(gateway.close())


def test_a_client_that_disconnects_mid_stream_is_billed(
    routed: ServerThread, upstream: FakeUpstream
) -> None:
    key = new_key(routed)
    finished = upstream.finished_streams
    with (
        httpx.Client() as client,
        client.stream(
            "POST",
            f"{routed.url}/v1/chat/completions",
            json={"model": "late", "messages": HI, "max_tokens": 5, "stream": True},
            headers={"authorization": f"Bearer {key}"},
        ) as response,
    ):
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # the first chunk, then hang up
    [row] = rows_when(routed, 1)
    assert row.status == "client_disconnected"
    assert (row.tokens_in, row.tokens_out, row.cost_micros) == (TOKENS_IN, 5, TOKENS_IN + 5)
    assert upstream.finished_streams == finished + 1  # the upstream was read to its end


def test_a_stream_fails_over_before_its_first_byte(
    routed: ServerThread, upstream: FakeUpstream
) -> None:
    sdk = openai.OpenAI(base_url=f"{routed.url}/v1", api_key=new_key(routed), max_retries=0)
    with sdk:
        chunks = list(
            sdk.chat.completions.create(model="failover", messages=HI, max_tokens=2, stream=True)
        )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "tok tok "
    assert [r["model"] for r in upstream.received] == ["busy", "echo"]
    [row] = rows_when(routed, 1)
    assert (row.attempts, row.deployment, row.status) == (2, "echo", "ok")
    assert row.cost_micros == TOKENS_IN + 2  # the refused attempt is not billed


@pytest.mark.parametrize("model", ["broken", "cut"])
def test_after_the_first_byte_errors_arrive_in_band(
    routed: ServerThread, upstream: FakeUpstream, model: str
) -> None:
    sdk = openai.OpenAI(base_url=f"{routed.url}/v1", api_key=new_key(routed), max_retries=0)
    received = []
    with sdk, pytest.raises(openai.APIError, match=r"mid-stream|failed|timed out"):
        for chunk in sdk.chat.completions.create(
            model=model, messages=HI, max_tokens=5, stream=True
        ):
            received.append(chunk)
    assert received  # some chunks arrived before the error
    [row] = rows_when(routed, 1)
    assert row.status == "upstream_error" and row.attempts == 1
    # the provider took the call and its usage never came: the full hold is charged
    assert row.cost_micros > TOKENS_IN + 5
