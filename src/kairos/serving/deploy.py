"""What an open-weight deployment is: its spec, and the command line each engine replica runs.

    spec = DeploymentSpec(name="gemma", model="gemma.gguf", replicas=2, max_replicas=4)
    engine_command(spec, port=8201)        # ['.../python', '-m', 'kairos.serving.worker', ...]

Engines:
- `llamacpp` (CPU): kairos' own worker (`kairos.serving.worker`) around llama-cpp-python in process.
- `vllm` (GPU): `vllm serve MODEL --host H --port P --served-model-name NAME --max-model-len N
  --gpu-memory-utilization U --tensor-parallel-size T --seed S`. vLLM only listens once the
  weights are loaded; its `/health` is 200 then (503 if the engine died); both engines are
  checked the same way (the model listed on `/v1/models`, then a 1-token completion). Replica i
  sees GPUs i*T .. i*T+T-1 through CUDA_VISIBLE_DEVICES unless `share_gpu` is set (then give
  each replica a `gpu_memory_utilization` of at most 1/replicas).

`kairos.serving.supervisor.DeploymentGroup` runs a spec.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from kairos.errors import InvalidInput

ENGINES = ("llamacpp", "vllm")


@dataclass(frozen=True, slots=True)
class EngineKind:
    """How the supervisor reads an engine's queue from its Prometheus text."""

    name: str
    waiting_metric: str
    running_metric: str


ENGINE_KINDS = {
    "llamacpp": EngineKind(
        "llamacpp", "kairos_llm_requests_waiting", "kairos_llm_requests_running"
    ),
    # vLLM renames metrics between versions; these are 0.6 to 0.11's names
    "vllm": EngineKind("vllm", "vllm:num_requests_waiting", "vllm:num_requests_running"),
}


@dataclass(frozen=True, slots=True)
class DeploymentSpec:
    """One model group of identical replicas; times are seconds."""

    name: str
    model: str  # a GGUF path (llamacpp); a path or Hugging Face id (vllm)
    engine: str = "llamacpp"
    replicas: int = 1  # how many to start with
    min_replicas: int | None = None  # None: `replicas` (no scaling down below the start)
    max_replicas: int | None = None  # None: `replicas` (no scaling up)
    host: str = "127.0.0.1"
    port_base: int | None = None  # replica i listens on port_base + i; None: free ports
    ctx: int = 2048  # context length (vllm: --max-model-len)
    threads: int | None = None  # llamacpp: CPU threads per replica
    slots: int = 8  # llamacpp: requests each replica decodes together (continuous batching)
    # llamacpp: the cores each replica's process runs on; replica i gets cpus[i % len(cpus)]
    # (e.g. ((0,), (1,)): one core each); (): wherever the OS puts it
    cpus: tuple[tuple[int, ...], ...] = ()
    seed: int = 0
    gpu_memory_utilization: float = 0.9  # vllm
    tensor_parallel_size: int = 1  # vllm
    share_gpu: bool = False  # vllm: every replica sees every GPU
    extra_args: tuple[str, ...] = ()  # passed through to the engine's command line
    ready_timeout: float = 300.0  # for one replica to load and answer its first completion
    poll_interval: float = 0.5  # how often replicas are checked (process alive, queue depth)
    scale_up_after: float = 5.0  # requests must keep waiting this long before one is added
    scale_down_after: float = 60.0  # the group must be idle this long before one is removed
    drain_timeout: float = 60.0  # in-flight requests may run this long after a stop
    unresponsive_after: float = 30.0  # a ready replica silent on /metrics this long is replaced
    max_failures: int = 3  # a replica that fails to start this many times in a row is given up
    env: tuple[tuple[str, str], ...] = field(default=())  # extra environment for every replica

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise InvalidInput(
                f"engine {self.engine!r} is not one kairos deploys: use one of {ENGINES}",
                field="engine",
            )
        if not self.name or self.name.strip() != self.name:
            raise InvalidInput(
                f"deployment name {self.name!r} must be non-empty, without surrounding spaces",
                field="name",
            )
        if self.replicas < 1:
            raise InvalidInput(f"replicas={self.replicas} must be at least 1", field="replicas")
        low, high = self.lowest, self.highest
        if not 1 <= low <= self.replicas <= high:
            raise InvalidInput(
                f"replicas must satisfy 1 <= min ({low}) <= replicas ({self.replicas}) <= max "
                f"({high}): adjust --min-replicas/--max-replicas",
                field="replicas",
            )
        if self.cpus and self.engine != "llamacpp":
            raise InvalidInput(
                f"cpus={self.cpus!r} pins llamacpp replicas only; for {self.engine!r} leave it "
                "empty",
                field="cpus",
            )
        bad = [group for group in self.cpus if not group or any(c < 0 for c in group)]
        if bad:
            raise InvalidInput(
                f"cpus={self.cpus!r}: {bad[0]!r} is not a set of core numbers; give each "
                "replica one or more cores >= 0, e.g. ((0,), (1,))",
                field="cpus",
            )
        if self.ctx < 16:
            raise InvalidInput(f"ctx={self.ctx} is too small: use at least 16", field="ctx")
        if self.slots < 1:
            raise InvalidInput(f"slots={self.slots} must be at least 1", field="slots")

    @property
    def lowest(self) -> int:
        return self.replicas if self.min_replicas is None else self.min_replicas

    @property
    def highest(self) -> int:
        return self.replicas if self.max_replicas is None else self.max_replicas

    @property
    def kind(self) -> EngineKind:
        return ENGINE_KINDS[self.engine]


def engine_command(
    spec: DeploymentSpec, port: int, *, parent_pid: int | None = None, index: int = 0
) -> list[str]:
    """The argv replica `index` runs, listening on `port`."""
    if spec.engine == "vllm":
        command = [
            "vllm", "serve", spec.model,
            "--host", spec.host,
            "--port", str(port),
            "--served-model-name", spec.name,
            "--max-model-len", str(spec.ctx),
            "--gpu-memory-utilization", str(spec.gpu_memory_utilization),
            "--tensor-parallel-size", str(spec.tensor_parallel_size),
            "--seed", str(spec.seed),
        ]  # fmt: skip
        return [*command, *spec.extra_args]
    command = [
        sys.executable, "-m", "kairos.serving.worker",
        "--model", spec.model,
        "--name", spec.name,
        "--host", spec.host,
        "--port", str(port),
        "--ctx", str(spec.ctx),
        "--slots", str(spec.slots),
        "--seed", str(spec.seed),
        "--graceful", str(spec.drain_timeout),
    ]  # fmt: skip
    if spec.threads is not None:
        command += ["--threads", str(spec.threads)]
    if spec.cpus:
        command += ["--cpus", ",".join(str(c) for c in spec.cpus[index % len(spec.cpus)])]
    if parent_pid is not None:
        command += ["--parent-pid", str(parent_pid)]
    return [*command, *spec.extra_args]


def engine_env(spec: DeploymentSpec, index: int) -> dict[str, str]:
    """Environment additions for replica `index` (vLLM: which GPUs it sees)."""
    env = dict(spec.env)
    if spec.engine == "vllm" and not spec.share_gpu:
        first = index * spec.tensor_parallel_size
        gpus = range(first, first + spec.tensor_parallel_size)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    return env


def cores_argument(value: str) -> tuple[int, ...]:
    """`--cpus 0,1` on a command line: the cores one process runs on."""
    try:
        cores = tuple(int(part) for part in value.split(","))
    except ValueError:
        cores = ()
    if not cores or min(cores) < 0:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a list of core numbers; give e.g. 0 or 0,1"
        )
    return cores
