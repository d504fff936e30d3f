"""The worker over real HTTP, serving a tiny random model: protocol shape, counts, timings."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.serving.sse import events

TIMING_KEYS = {
    "queue_ms",
    "prefill_ms",
    "ttft_ms",
    "decode_ms",
    "total_ms",
    "tokens_per_s",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
}


def counts(usage: dict[str, Any]) -> dict[str, Any]:
    """Usage without prompt_tokens_details: cached tokens depend on what ran before."""
    return {k: v for k, v in usage.items() if k != "prompt_tokens_details"}


def count(url: str, **body: Any) -> int:
    answer = httpx.post(url + "/tokenize", json=body)
    assert answer.status_code == 200, answer.text
    return int(answer.json()["count"])


def test_health_and_models(worker: str) -> None:
    assert httpx.get(worker + "/health").json()["status"] == "ok"
    models = httpx.get(worker + "/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in models["data"]] == [
        ("tiny", "model", 256)
    ]


def test_tokenize_counts_with_the_models_own_tokenizer(worker: str) -> None:
    answer = httpx.post(worker + "/tokenize", json={"prompt": "ab c"}).json()
    # one token per character, a SentencePiece word marker for the space, and BOS
    assert answer["count"] == len(answer["tokens"]) == 1 + len("\u2581ab\u2581c")
    assert answer["tokens"][0] == 1 and answer["max_model_len"] == 256


def test_a_completion_has_usage_and_timings(worker: str) -> None:
    body = {
        "model": "tiny",
        "prompt": "Hello world",
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": True,
    }
    answer = httpx.post(worker + "/v1/completions", json=body)
    assert answer.status_code == 200
    r = answer.json()
    assert r["object"] == "text_completion" and r["model"] == "tiny"
    assert r["id"].startswith("cmpl-")
    [choice] = r["choices"]
    assert choice["finish_reason"] == "length" and isinstance(choice["text"], str)
    prompt_tokens = count(worker, prompt="Hello world")
    assert counts(r["usage"]) == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 12,
        "total_tokens": prompt_tokens + 12,
    }
    t = r["kairos_timings"]
    assert set(t) == TIMING_KEYS
    assert (t["prompt_tokens"], t["completion_tokens"]) == (prompt_tokens, 12)
    assert t["ttft_ms"] == pytest.approx(t["queue_ms"] + t["prefill_ms"], abs=0.01)
    assert t["total_ms"] == pytest.approx(t["ttft_ms"] + t["decode_ms"], abs=0.5)
    assert t["tokens_per_s"] == pytest.approx(11 / (t["decode_ms"] / 1e3), rel=1e-6)


def test_a_stream_matches_the_plain_answer_and_ends_with_usage(worker: str) -> None:
    body = {"prompt": "Once", "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    plain = httpx.post(worker + "/v1/completions", json=body).json()
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", worker + "/v1/completions", json=streamed) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        got = list(events(response.iter_lines()))
    assert got[-1] == "[DONE]"
    chunks: list[dict[str, Any]] = [c for c in got[:-1] if isinstance(c, dict)]
    usage = chunks[-1]
    assert usage["choices"] == [] and counts(usage["usage"]) == counts(plain["usage"])
    assert set(usage["kairos_timings"]) == TIMING_KEYS
    assert all(c["usage"] is None for c in chunks[:-1])
    text = "".join(c["choices"][0]["text"] for c in chunks[:-1])
    assert text == plain["choices"][0]["text"]  # greedy: the same tokens either way
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


def test_a_stream_without_include_usage_has_no_usage_chunk(worker: str) -> None:
    body = {"prompt": "x", "max_tokens": 3, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", worker + "/v1/completions", json=body) as response:
        got = list(events(response.iter_lines()))
    assert got[-1] == "[DONE]"
    assert all(isinstance(c, dict) and c["choices"] and "usage" not in c for c in got[:-1])


def test_chat_uses_the_models_template(worker: str) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    body = {
        "model": "tiny",
        "messages": messages,
        "max_tokens": 5,
        "ignore_eos": True,
        "temperature": 0,
    }
    r = httpx.post(worker + "/v1/chat/completions", json=body).json()
    assert r["object"] == "chat.completion" and r["id"].startswith("chatcmpl-")
    assert r["choices"][0]["message"]["role"] == "assistant"
    # <s><system>Be brief.\n<user>Hi\n<assistant>: the GGUF's template, BOS once
    rendered = "<system>Be brief.\n<user>Hi\n<assistant>"
    assert r["usage"]["prompt_tokens"] == count(worker, messages=messages)
    assert r["usage"]["prompt_tokens"] == count(worker, prompt=rendered)
    with httpx.stream(
        "POST", worker + "/v1/chat/completions", json={**body, "stream": True}
    ) as response:
        got = [c for c in events(response.iter_lines()) if isinstance(c, dict)]
    assert got[0]["object"] == "chat.completion.chunk"
    assert got[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in got)
    assert text == r["choices"][0]["message"]["content"]
    assert got[-1]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length"}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/completions", {"prompt": 5}, 400, "prompt"),
        ("/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
        ("/v1/completions", {"prompt": "x", "model": "gpt-4o"}, 404, "model"),
        ("/v1/completions", {"prompt": "x" * 300}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1, 9999]}, 400, "prompt"),
        ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
        ("/tokenize", {"text": "x"}, 400, "prompt"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(
    worker: str, path: str, body: Any, status: int, param: str
) -> None:
    answer = httpx.post(worker + path, json=body)
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error["param"] == param and error["message"]
    assert "Traceback" not in answer.text


def test_unknown_routes_and_methods_answer_json(worker: str) -> None:
    missing = httpx.post(worker + "/v1/embeddings", json={"input": "x"})
    assert missing.status_code == 404 and "/v1/completions" in missing.json()["error"]["message"]
    wrong = httpx.get(worker + "/v1/completions")
    assert wrong.status_code == 405 and wrong.json()["error"]["code"] == "method_not_allowed"


def test_a_body_that_is_not_json_is_a_400(worker: str) -> None:
    answer = httpx.post(worker + "/v1/completions", content=b"{nope")
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "body"


def test_a_prompt_near_the_context_gets_max_tokens_clamped(worker: str) -> None:
    prompt = "x" * 240  # 242 tokens of 256
    r = httpx.post(
        worker + "/v1/completions", json={"prompt": prompt, "max_tokens": 100, "ignore_eos": True}
    ).json()
    assert r["usage"]["completion_tokens"] == 256 - r["usage"]["prompt_tokens"]
    assert r["choices"][0]["finish_reason"] == "length"


async def _stream(url: str, tokens: int, log: dict[str, list[float]], key: str) -> dict[str, Any]:
    body = {
        "prompt": key,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with (
        httpx.AsyncClient(timeout=60) as client,
        client.stream("POST", url + "/v1/completions", json=body) as response,
    ):
        last: dict[str, Any] = {}
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                last = json.loads(line[6:])
                # only chunks with generated text: a stream's usage chunk (after its last token)
                # and the next stream's first chunk (before its first token) leave the worker
                # together, and one client loop may read them in either order
                if any(choice.get("text") for choice in last.get("choices") or ()):
                    log.setdefault(key, []).append(time.perf_counter())
        return last


def test_requests_beyond_capacity_queue_in_order_and_never_interrupt(slow_worker: str) -> None:
    log: dict[str, list[float]] = {}

    async def counted(name: str) -> float:
        return await asyncio.to_thread(_metric, slow_worker, name)

    async def run() -> list[dict[str, Any]]:
        # `a` runs long enough for b, c and d to queue behind it; each is sent once the worker
        # has counted the one before, so the order they arrive in is the order they were sent
        # (sleeping between sends is not: a loaded client can deliver them in another order)
        tasks = [asyncio.create_task(_stream(slow_worker, 300, log, "a"))]
        while await counted("kairos_llm_requests_running") < 1:
            await asyncio.sleep(0.005)
        for waiting, key in enumerate("bcd", start=1):
            tasks.append(asyncio.create_task(_stream(slow_worker, 40, log, key)))
            while await counted("kairos_llm_requests_waiting") < waiting:
                await asyncio.sleep(0.005)
        assert not tasks[0].done(), "a finished before the others queued: use a slower model"
        return await asyncio.gather(*tasks)

    finals = asyncio.run(run())
    # every stream got all its tokens
    assert [f["usage"]["completion_tokens"] for f in finals] == [300, 40, 40, 40]
    # one after another, in arrival order: no stream's chunks interleave another's. A stream's
    # last chunk and the next one's first can leave the worker in one loop turn, and the two
    # client loops may then read them in either order; any earlier chunk must come first.
    for before, after in itertools.pairwise("abcd"):
        assert log[after][0] > log[before][-2]
    # b, c and d each waited for the streams before it (a's 300 tokens at least); a did not
    queued = [f["kairos_timings"]["queue_ms"] for f in finals]
    assert min(queued[1:]) > max(50.0, queued[0])


def _metric(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(?:{{(.*)}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match.group(1) or "") for k, v in labels.items()):
            total += float(match.group(2))
    return total


def test_a_client_that_disconnects_cancels_its_generation(slow_worker: str) -> None:
    before = _metric(slow_worker, "kairos_llm_generation_tokens_total")
    cancelled = _metric(slow_worker, "kairos_llm_requests_total", finish_reason="cancelled")
    body = {"prompt": "a", "max_tokens": 900, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", slow_worker + "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        got = [next(lines) for _ in range(6)]  # a few chunks, then hang up
    assert any(line.startswith("data: {") for line in got)
    deadline = time.monotonic() + 10
    while _metric(slow_worker, "kairos_llm_requests_total", finish_reason="cancelled") == cancelled:
        assert time.monotonic() < deadline, "generation was not cancelled"
        time.sleep(0.05)
    assert _metric(slow_worker, "kairos_llm_requests_running") == 0
    generated = _metric(slow_worker, "kairos_llm_generation_tokens_total") - before
    assert 0 < generated < 900


def test_a_queued_request_whose_client_leaves_never_runs(slow_worker: str) -> None:
    before = _metric(slow_worker, "kairos_llm_generation_tokens_total")
    cancelled = _metric(slow_worker, "kairos_llm_requests_total", finish_reason="cancelled")

    async def waiting() -> float:
        return await asyncio.to_thread(_metric, slow_worker, "kairos_llm_requests_waiting")

    async def run() -> dict[str, Any]:
        first = asyncio.create_task(_stream(slow_worker, 300, {}, "a"))
        while await asyncio.to_thread(_metric, slow_worker, "kairos_llm_requests_running") < 1:
            await asyncio.sleep(0.01)
        body = {"prompt": "b", "max_tokens": 50, "ignore_eos": True}
        async with httpx.AsyncClient(timeout=60) as client:
            second = asyncio.create_task(client.post(slow_worker + "/v1/completions", json=body))
            while await waiting() < 1:  # queued behind `first`
                await asyncio.sleep(0.01)
            second.cancel()  # the client gives up: its connection closes
            await asyncio.gather(second, return_exceptions=True)
        while await waiting() > 0:  # it left the queue without running
            await asyncio.sleep(0.01)
        assert not first.done()
        return await first

    final = asyncio.run(run())
    assert final["usage"]["completion_tokens"] == 300
    counted = _metric(slow_worker, "kairos_llm_requests_total", finish_reason="cancelled")
    assert counted == cancelled + 1
    assert _metric(slow_worker, "kairos_llm_generation_tokens_total") - before == 300


def test_metrics_expose_queue_and_latency_histograms(worker: str) -> None:
    httpx.post(
        worker + "/v1/completions", json={"prompt": "a", "max_tokens": 3, "ignore_eos": True}
    )
    text = httpx.get(worker + "/metrics").text
    for name in (
        "kairos_llm_requests_waiting",
        "kairos_llm_requests_running",
        "kairos_llm_request_queue_time_seconds_bucket",
        "kairos_llm_time_to_first_token_seconds_bucket",
        "kairos_llm_decode_time_seconds_bucket",
        "kairos_llm_decode_tokens_per_second_bucket",
    ):
        assert f"\n{name}" in text, name
    assert _metric(worker, "kairos_llm_request_queue_time_seconds_count") >= 1


def test_metrics_can_be_asked_for_by_name(worker: str) -> None:
    wanted = httpx.QueryParams(
        [("name[]", "kairos_llm_requests_waiting"), ("name[]", "kairos_llm_requests_running")]
    )
    text = httpx.get(worker + "/metrics", params=wanted).text
    samples = {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")}
    assert samples == {"kairos_llm_requests_waiting", "kairos_llm_requests_running"}


def test_cores_the_process_may_not_use_are_refused_by_name(tiny_model: Path) -> None:
    missing = max(os.sched_getaffinity(0)) + 64
    done = subprocess.run(
        [sys.executable, "-m", "kairos.serving.worker", "--model", str(tiny_model),
         "--cpus", str(missing)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"--cpus {missing} cannot be used" in done.stderr
    assert "this process may run on cores" in done.stderr
