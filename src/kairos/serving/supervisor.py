"""Run a deployment: start its replicas, keep them serving, scale them, drain them on stop.

    async with DeploymentGroup(DeploymentSpec(name="gemma", model=path, replicas=2)) as group:
        async with group.lease() as replica:       # least outstanding requests
            httpx.post(replica.url + "/v1/completions", json={...})
        group.urls                                 # ready replicas' base URLs

A replica is ready when its model is listed on `/v1/models` and a 1-token completion succeeds,
not when its port opens. A replica whose process exits is started again on the same port. With
`min_replicas < max_replicas` the group adds a replica when requests have kept waiting in the
engines' queues for `scale_up_after` seconds, and removes one (drained first) after
`scale_down_after` idle seconds. Every change is logged to `kairos.serving.deploy` and passed to
`on_event`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlencode

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kairos.http.client import HTTPClient, HTTPFailure
from kairos.serving.deploy import DeploymentSpec, engine_command, engine_env
from kairos.serving.errors import DeploymentError

log = logging.getLogger("kairos.serving.deploy")

STARTING, READY, DRAINING, STOPPED, FAILED = "starting", "ready", "draining", "stopped", "failed"


@dataclass(eq=False)
class Replica:
    """One engine process of a group; `outstanding` counts requests leased through the group."""

    index: int
    port: int
    url: str
    state: str = STARTING
    outstanding: int = 0
    waiting: int = 0  # the engine's own queue, read from its /metrics
    running: int = 0
    restarts: int = 0
    failures: int = 0  # failed starts in a row
    last_seen: float = 0.0  # monotonic time of its last answer to /metrics
    log_path: Path = Path()
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def busy(self) -> bool:
        return bool(self.outstanding or self.waiting or self.running)


class DeploymentGroup:
    """N replicas of one model served as one group; async, one event loop."""

    def __init__(
        self,
        spec: DeploymentSpec,
        *,
        on_event: Callable[[str], None] | None = None,
        log_dir: Path | str | None = None,
    ) -> None:
        self.spec = spec
        self.replicas: list[Replica] = []
        self._on_event = on_event
        self._log_dir = Path(log_dir) if log_dir else None
        self._http: httpx.AsyncClient | None = None
        self._poll: HTTPClient | None = None  # the twice-a-second load reads: the cheap client
        self._monitor: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._waiting_since: float | None = None
        self._idle_since: float | None = None
        self._next_index = 0
        self._stopping = False
        self.events: list[str] = []  # every logged change, oldest first

    # -- the public face the gateway uses --------------------------------------------------

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.state == READY]

    @property
    def urls(self) -> list[str]:
        """Base URLs of the replicas that take requests now (append `/v1/...`)."""
        return [r.url for r in self.ready]

    @property
    def size(self) -> int:
        """Replicas starting or serving (the count scaling acts on)."""
        return sum(r.state in (STARTING, READY) for r in self.replicas)

    def pick(self) -> Replica:
        """The ready replica with the fewest outstanding requests (then the shortest queue)."""
        ready = self.ready
        if not ready:
            raise DeploymentError(f"deployment {self.name!r} has no ready replica")
        return min(ready, key=lambda r: (r.outstanding, r.waiting + r.running, r.index))

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Replica]:
        """Pick a replica and count the request against it until the block ends."""
        replica = self.pick()
        replica.outstanding += 1
        try:
            yield replica
        finally:
            replica.outstanding -= 1

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {"index": r.index, "url": r.url, "state": r.state, "outstanding": r.outstanding,
             "waiting": r.waiting, "running": r.running, "restarts": r.restarts,
             "pid": r.process.pid if r.process else None}
            for r in self.replicas
        ]  # fmt: skip

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> DeploymentGroup:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start `replicas` replicas and return once every one serves; raise if one cannot."""
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix=f"kairos-deploy-{self.name}-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=2.0))
        self._poll = HTTPClient()
        self._emit(f"starting {self.spec.replicas} {self.spec.engine} replica(s) of "
                   f"{self.name!r} (logs in {self._log_dir})")  # fmt: skip
        fresh = [self._add() for _ in range(self.spec.replicas)]
        try:
            await asyncio.gather(*(self._become_ready(r, raise_on_failure=True) for r in fresh))
        except BaseException:
            await self._terminate_all()
            raise
        self._monitor = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        """Drain: stop routing, let in-flight requests finish (up to drain_timeout), then stop."""
        if self._stopping:
            return
        self._stopping = True
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        for task in list(self._tasks):
            task.cancel()
        live = [r for r in self.replicas if r.state in (STARTING, READY, DRAINING)]
        self._emit(f"stopping {self.name!r}: draining {len(live)} replica(s)")
        await asyncio.gather(*(self._retire(r) for r in live))
        if self._http is not None:
            await self._http.aclose()
        if self._poll is not None:
            await self._poll.close()
        self._emit(f"stopped {self.name!r}")

    # -- replicas --------------------------------------------------------------------------

    def _add(self) -> Replica:
        index = self._next_index
        self._next_index += 1
        port = self.spec.port_base + index if self.spec.port_base is not None else _free_port()
        host = "127.0.0.1" if self.spec.host in ("0.0.0.0", "::") else self.spec.host
        folder = self._log_dir or Path(tempfile.gettempdir())
        replica = Replica(
            index, port, f"http://{host}:{port}", log_path=folder / f"{self.name}-{index}.log"
        )
        self.replicas.append(replica)
        self._launch(replica)
        return replica

    def _launch(self, replica: Replica) -> None:
        command = engine_command(
            self.spec, replica.port, parent_pid=os.getpid(), index=replica.index
        )
        if replica._log is None:
            replica._log = replica.log_path.open("ab")
        env = {**os.environ, **engine_env(self.spec, replica.index)}
        try:
            replica.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=replica._log,
                stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        except FileNotFoundError:
            raise DeploymentError(
                f"cannot start {command[0]!r} for engine {self.spec.engine!r}: is it installed "
                f"and on PATH?"
            ) from None
        replica.state = STARTING

    async def _become_ready(self, replica: Replica, *, raise_on_failure: bool = False) -> bool:
        """Wait until the replica serves: model listed, then a 1-token completion answered."""
        began = time.monotonic()
        deadline = began + self.spec.ready_timeout
        while time.monotonic() < deadline:
            process = replica.process
            if process is None or process.poll() is not None:
                code = process.returncode if process else None
                return self._start_failed(replica, f"exited with code {code}", raise_on_failure)
            if await self._serves(replica):
                replica.state = READY
                replica.failures = 0
                replica.last_seen = time.monotonic()
                self._emit(f"replica {replica.index} of {self.name!r} ready on {replica.url} "
                           f"in {time.monotonic() - began:.1f}s")  # fmt: skip
                return True
            await asyncio.sleep(0.1)
        _stop_process(replica.process, 0)
        return self._start_failed(
            replica, f"not ready after {self.spec.ready_timeout:.0f}s", raise_on_failure
        )

    async def _serves(self, replica: Replica) -> bool:
        if self._http is None:
            return False
        try:
            listed = await self._http.get(replica.url + "/v1/models")
            if listed.status_code != 200:
                return False
            if self.name not in {m.get("id") for m in listed.json().get("data", [])}:
                return False
            probe = {"model": self.name, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
            answer = await self._http.post(replica.url + "/v1/completions", json=probe)
            return answer.status_code == 200 and bool(answer.json().get("choices"))
        except (httpx.HTTPError, ValueError):
            return False

    def _start_failed(self, replica: Replica, why: str, raise_on_failure: bool) -> bool:
        replica.failures += 1
        tail = _tail(replica.log_path)
        message = f"replica {replica.index} of {self.name!r} failed to start: {why}"
        if raise_on_failure:
            replica.state = FAILED
            raise DeploymentError(f"{message}\n{tail}".rstrip())
        if replica.failures >= self.spec.max_failures:
            replica.state = FAILED
            self._emit(f"{message}; given up after {replica.failures} tries\n{tail}".rstrip())
        else:
            self._emit(f"{message}; retrying")
        return False

    async def _retire(self, replica: Replica) -> None:
        """Stop routing to a replica, wait for its work to finish, then stop its process."""
        replica.state = DRAINING
        deadline = time.monotonic() + self.spec.drain_timeout
        while time.monotonic() < deadline and replica.process and replica.process.poll() is None:
            await self._read_load(replica)
            if not replica.busy:
                break
            await asyncio.sleep(0.05)
        await asyncio.to_thread(_stop_process, replica.process, 10.0)
        replica.state = STOPPED
        if replica._log is not None:
            replica._log.close()
            replica._log = None

    async def _terminate_all(self) -> None:
        for replica in self.replicas:
            await asyncio.to_thread(_stop_process, replica.process, 5.0)
            replica.state = STOPPED
            if replica._log is not None:
                replica._log.close()
                replica._log = None
        if self._http is not None:
            await self._http.aclose()
        if self._poll is not None:
            await self._poll.close()

    # -- the watch loop --------------------------------------------------------------------

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.spec.poll_interval)
            for replica in list(self.replicas):
                process = replica.process
                if replica.state == READY and process and process.poll() is not None:
                    self._restart(replica)
            await asyncio.gather(*(self._read_load(r) for r in self.ready))
            now = time.monotonic()
            for replica in self.ready:
                silent = now - replica.last_seen
                if silent > self.spec.unresponsive_after:  # alive but hung: replace it
                    self._emit(f"replica {replica.index} of {self.name!r} has not answered "
                               f"for {silent:.0f}s; killing it")  # fmt: skip
                    await asyncio.to_thread(_stop_process, replica.process, 0)
                    self._restart(replica)
            self._autoscale(now)

    def _restart(self, replica: Replica) -> None:
        code = replica.process.returncode if replica.process else None
        replica.restarts += 1
        self._emit(f"replica {replica.index} of {self.name!r} exited with code {code}; "
                   f"restarting (restart {replica.restarts})")  # fmt: skip
        replica.waiting = replica.running = 0  # leases still open end (and count down) on their own
        self._launch(replica)
        self._spawn(self._keep_trying(replica))

    async def _keep_trying(self, replica: Replica) -> None:
        while not self._stopping and replica.state == STARTING:
            if await self._become_ready(replica):
                return
            if replica.state == FAILED:
                return
            await asyncio.sleep(min(5.0, 0.5 * replica.failures))  # back off a crash loop
            self._launch(replica)

    async def _read_load(self, replica: Replica) -> None:
        """Read the engine's waiting and running gauges from its Prometheus text."""
        if self._poll is None:
            return
        kind = self.spec.kind
        # only the two gauges (Prometheus' `name[]` filter, vLLM's server has it too), with
        # kairos' own client: the whole text through httpx, twice a second, cost both
        # processes CPU the engine was decoding with
        query = urlencode([("name[]", kind.waiting_metric), ("name[]", kind.running_metric)])
        try:
            response = await self._poll.request("GET", f"{replica.url}/metrics?{query}", {}, b"",
                                                2.0, connect_timeout=2.0)  # fmt: skip
            text = (await response.read()).decode()
        except HTTPFailure:
            return
        replica.last_seen = time.monotonic()
        waiting = running = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == kind.waiting_metric:
                    waiting += sample.value
                elif sample.name == kind.running_metric:
                    running += sample.value
        replica.waiting, replica.running = int(waiting), int(running)

    def _autoscale(self, now: float) -> None:
        spec, live = self.spec, [r for r in self.replicas if r.state in (STARTING, READY)]
        waiting = sum(r.waiting for r in live)
        if waiting > 0:
            self._waiting_since = self._waiting_since or now
        else:
            self._waiting_since = None
        if any(r.busy for r in live):
            self._idle_since = None
        else:
            self._idle_since = self._idle_since or now
        starting = any(r.state == STARTING for r in live)
        if (self._waiting_since is not None and now - self._waiting_since >= spec.scale_up_after
                and len(live) < spec.highest and not starting):  # fmt: skip
            self._emit(f"scaling {self.name!r} up to {_replicas(len(live) + 1)}: {waiting} "
                       f"request(s) waiting for {now - self._waiting_since:.1f}s")  # fmt: skip
            self._waiting_since = None
            replica = self._add()
            self._spawn(self._keep_trying(replica))
        elif (self._idle_since is not None and now - self._idle_since >= spec.scale_down_after
              and len(live) > spec.lowest and not starting):  # fmt: skip
            victim = max((r for r in live if r.state == READY), key=lambda r: r.index)
            idle = now - self._idle_since
            self._emit(f"scaling {self.name!r} down to {_replicas(len(live) - 1)}: idle for "
                       f"{idle:.1f}s; draining replica {victim.index}")  # fmt: skip
            self._idle_since = now
            victim.state = DRAINING
            self._spawn(self._retire(victim))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _emit(self, message: str) -> None:
        self.events.append(message)
        log.info(message)
        if self._on_event is not None:
            self._on_event(message)


def _stop_process(process: subprocess.Popen[bytes] | None, grace: float) -> None:
    """SIGTERM, wait up to `grace` seconds, then SIGKILL; always reaps the child."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 15) -> str:
    if not path.is_file():
        return ""
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join("  | " + line for line in text)


def _replicas(n: int) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"
