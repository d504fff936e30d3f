"""The in-process API (no HTTP hop): what a feature-graph resolver calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import pytest

from kairos.gateway import Gateway
from tests.gateway.conftest import config, deployment, new_key, stream_in_process
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, ServerThread

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("include_usage", [True, False])
def test_streams_in_process(upstream: FakeUpstream, tmp_path: Path, include_usage: bool) -> None:
    body: dict[str, Any] = {"model": "chat", "messages": HI, "max_tokens": 3}
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    chunks, rows = stream_in_process(config(upstream, tmp_path), body)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "tok tok tok "
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage == ([{"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}]
                     if include_usage else [])  # fmt: skip
    [row] = rows
    assert (row.tokens_out, row.cost_micros, row.status) == (3, TOKENS_IN + 3, "ok")


def test_anthropic_callers_get_anthropic_errors(upstream: FakeUpstream, tmp_path: Path) -> None:
    models = {
        "down": {"deployments": [deployment("fail")]},
        "broken": {"deployments": [deployment("broken")]},
    }
    gateway = Gateway(config(upstream, tmp_path, models=models))
    from kairos.gateway.app import create_gateway_app

    with ServerThread(create_gateway_app(gateway), kairos=True) as server:
        server.gateway = gateway  # type: ignore[attr-defined]
        sdk = anthropic.Anthropic(base_url=server.url, api_key=new_key(server), max_retries=0)
        with pytest.raises(anthropic.APIStatusError) as failed:
            sdk.messages.create(model="down", max_tokens=5, messages=HI)  # type: ignore[arg-type]
        assert failed.value.status_code == 502 and "scripted 500" in str(failed.value)
        with (
            pytest.raises(anthropic.APIStatusError, match="mid-stream"),
            sdk.messages.stream(model="broken", max_tokens=5, messages=HI) as stream,  # type: ignore[arg-type]
        ):
            for _ in stream.text_stream:
                pass
        sdk.close()
        server.call(gateway.close())
