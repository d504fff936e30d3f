"""Slots on the real Gemma 3 270M: concurrent streams decode together, each on its own."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import orjson
import pytest

pytestmark = pytest.mark.slow

# counting: continuations the model is sure of, so greedy tokens do not hinge on a near-tie
# (llama.cpp's CPU kernels round differently at other batch sizes; see docs/llm.md)
PROMPTS = [f"{k}, {k + 1}, {k + 2}, {k + 3}," for k in range(10, 90, 10)]


async def stream(url: str, prompt: str, tokens: int = 16) -> tuple[str, dict[str, Any]]:
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "seed": 5,
            "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    text, usage = "", {}
    async with (
        httpx.AsyncClient(timeout=300) as client,
        client.stream("POST", url + "/v1/completions", json=body) as r,
    ):
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = orjson.loads(line[6:])
            if chunk["choices"]:
                text += chunk["choices"][0]["text"]
            else:
                usage = chunk["usage"]
    return text, usage


def test_eight_concurrent_streams_each_get_the_lone_answer(gemma_worker: str) -> None:
    async def run() -> tuple[list[str], list[str]]:
        lone = [(await stream(gemma_worker, p))[0] for p in PROMPTS]
        together = await asyncio.gather(*(stream(gemma_worker, p) for p in PROMPTS))
        return lone, [text for text, _ in together]

    lone, together = asyncio.run(run())
    assert together == lone
    assert len(set(lone)) == len(PROMPTS)  # each its own: no stream got another's tokens


def test_a_cancelled_stream_frees_its_slot_at_once(gemma_worker: str) -> None:
    async def run() -> float:
        async with httpx.AsyncClient(timeout=300) as client:
            long = {"prompt": "Once upon a time", "max_tokens": 900, "ignore_eos": True,
                    "stream": True}  # fmt: skip
            holders = [asyncio.create_task(stream(gemma_worker, f"{i} " * 3, 900))
                       for i in range(7)]  # fmt: skip
            async with client.stream("POST", gemma_worker + "/v1/completions", json=long) as r:
                async for _line in r.aiter_lines():
                    if await _gauge(client, gemma_worker, "kairos_llm_requests_running") == 8:
                        break
                ninth = asyncio.create_task(stream(gemma_worker, "1, 2, 3,", 2))
                while (
                    await _gauge(client, gemma_worker, "kairos_llm_requests_waiting") < 1
                ):  # all 8 slots busy: it waits
                    await asyncio.sleep(0.02)
            cancelled = time.perf_counter()  # leaving the block closed the 8th stream
            await ninth
            took = time.perf_counter() - cancelled
            for task in holders:
                task.cancel()
            await asyncio.gather(*holders, return_exceptions=True)
            return took

    assert asyncio.run(run()) < 3.0  # 7 long streams still run; the 9th did not wait for them


def test_a_repeated_prompt_reports_cached_tokens(gemma_worker: str) -> None:
    prompt = "The prefix of this prompt is long enough to be worth keeping in a slot: " * 3
    first = asyncio.run(stream(gemma_worker, prompt, 2))[1]
    again = asyncio.run(stream(gemma_worker, prompt, 2))[1]
    assert first["prompt_tokens_details"]["cached_tokens"] <= 1  # at most the BOS
    assert again["prompt_tokens_details"]["cached_tokens"] == again["prompt_tokens"] - 1


async def _gauge(client: httpx.AsyncClient, url: str, name: str) -> float:
    text = (await client.get(url + "/metrics", params={"name[]": name})).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))
