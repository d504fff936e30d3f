"""Cached online query over HTTP: kairos vs Feast's Python feature server, beside the Redis floor.

    bash bench/feast_env.sh                # once: Feast 0.67 in bench/.venv-feast (optional)
    .venv/bin/python bench/online_http.py [--requests-1 2000] [--requests-16 8000]

One entity, 10 float features, served from Redis at 127.0.0.1:6379, all in the same run (this
machine is shared and noisy, so only same-run ratios mean anything):

- redis floor: one HMGET of kairos' entity hash with redis-py (asyncio), no HTTP;
- kairos: `python -m kairos.cli serve` (one process), POST /v1/query/online; every answer must
  be a cache hit (`meta.cache_hits == 10`); the query log stays on, as the product runs;
- feast: `feast serve` from bench/.venv-feast, one worker, access log off (kairos has none),
  otherwise Feast's defaults; POST /get-online-features. Its default recycles the gunicorn
  worker every ~1000 requests, which fails the requests in flight and sets its p99 at 16
  clients; `--feast-max-requests 0` measures Feast without that.

The load generator is the same for both servers: this process on uvloop, one keep-alive
HTTP/1.1 connection per concurrent client, closed loop (a client sends its next request when
its answer arrives), a warmup, then a fixed number of requests. Percentiles are over successful
requests; a failure is a non-200, a wrong answer, a timeout or a broken connection. `srv CPU`
is the server's process-group CPU time (user + system, reaped children included) per
successful request: less noisy than latency on a busy machine. Every key written to Redis has
a unique prefix (kairos) or project name (Feast) and is deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import orjson
import redis
import redis.asyncio
import uvloop

from kairos.stores.online.redis import RedisOnlineStore

BENCH_DIR = Path(__file__).resolve().parent
FEAST_VENV = BENCH_DIR / ".venv-feast"
FEAST_HELPER = BENCH_DIR / "feast_repo.py"

ENTITY = "e1"
VALUES = [float(i + 1) for i in range(10)]
NAMES = [f"f{i}" for i in range(10)]
NAMESPACE = "account"  # the snake_case name of the class in kairos_features_module
KAIROS_OUTPUTS = [f"{NAMESPACE}.{name}" for name in NAMES]


def kairos_features_module() -> str:
    """features.py of the kairos project: 10 floats cached an hour; the resolver fills it."""
    fields = "".join(f"    {name}: float\n" for name in NAMES)
    outputs = ", ".join(f"Account.{name}" for name in NAMES)
    return (
        "from kairos import Features, features, online\n\n\n"
        '@features(max_staleness="1h")\n'
        f"class Account:\n    id: str\n{fields}\n\n"
        "@online\n"
        f"def account_values(aid: Account.id) -> Features[{outputs}]:\n"
        f"    return {tuple(VALUES)!r}\n"
    )


# Targets from the issue: (description, passed?) is computed in `targets`.
LATENCY_RATIO_1 = 0.5  # kairos p50 and p99 at most half of Feast's at 1 client
THROUGHPUT_RATIO_16 = 2.0  # kairos req/s at least 2x Feast's at 16 clients
P99_RATIO_16 = 5.0  # kairos p99 at least 5x lower than Feast's at 16 clients


# --- load generator -----------------------------------------------------------------------


class HttpProtocolError(Exception):
    """The server's answer is not an HTTP/1.1 response this client can read."""


class HttpConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection with at most one request in flight."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False

    @classmethod
    async def open(cls, port: int) -> HttpConnection:
        loop = asyncio.get_running_loop()
        _, connection = await loop.create_connection(cls, "127.0.0.1", port)
        return connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport quacks like asyncio.Transport without subclassing it
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        marker = head.find(b"\r\ncontent-length:")
        if not head.startswith(b"http/1.1 ") or marker < 0:
            waiter.set_exception(HttpProtocolError(f"unreadable response head {head[:80]!r}"))
            self.close()
            return
        value_start = marker + len(b"\r\ncontent-length:")
        value_end = head.find(b"\r\n", value_start)
        length = int(head[value_start : value_end if value_end >= 0 else None])
        total = end + 4 + length
        if len(self.buffer) < total:
            return
        body = bytes(self.buffer[end + 4 : total])
        del self.buffer[:total]
        if b"\r\nconnection: close" in head:
            self.closed = True
        waiter.set_result((int(head[9:12]), body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"connection lost: {exc}"))

    async def request(self, raw: bytes, timeout: float) -> tuple[int, bytes]:
        if self.transport is None or self.closed:
            raise ConnectionError("connection is closed")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[tuple[int, bytes]] = loop.create_future()
        self.waiter = waiter
        self.transport.write(raw)
        timer = loop.call_later(timeout, self._expire, waiter)
        try:
            return await waiter
        finally:
            timer.cancel()

    def _expire(self, waiter: asyncio.Future[tuple[int, bytes]]) -> None:
        if not waiter.done():
            waiter.set_exception(TimeoutError("no answer in time"))
            self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Caller(Protocol):
    """One concurrent client: `call` sends one request, True when the answer is right."""

    async def call(self) -> bool: ...

    async def close(self) -> None: ...


class HttpCaller:
    def __init__(
        self, port: int, path: str, body: bytes, check: Callable[[bytes], bool], timeout: float
    ) -> None:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.raw = head.encode() + body
        self.port = port
        self.check = check
        self.timeout = timeout
        self.connection: HttpConnection | None = None

    async def call(self) -> bool:
        try:
            if self.connection is None or self.connection.closed:
                self.connection = await HttpConnection.open(self.port)
            status, body = await self.connection.request(self.raw, self.timeout)
        except (OSError, TimeoutError, HttpProtocolError):
            await self.close()
            return False
        try:
            return status == 200 and self.check(body)
        except (ValueError, KeyError, TypeError, IndexError):  # a malformed answer
            return False

    async def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


class RedisCaller:
    """The floor: one HMGET of the entity hash on the client's own connection."""

    def __init__(self, host: str, port: int, key: str, fields: list[str], timeout: float) -> None:
        self.client = redis.asyncio.Redis(
            host=host, port=port, single_connection_client=True, socket_timeout=timeout
        )
        self.key = key
        self.fields = fields

    async def call(self) -> bool:
        try:
            reply = await self.client.hmget(self.key, self.fields)
        except (redis.RedisError, OSError):
            return False
        return len(reply) == len(self.fields) and None not in reply

    async def close(self) -> None:
        await self.client.aclose()


@dataclass
class Run:
    latencies_ms: list[float]
    failed: int
    wall_s: float
    cpu_s: float | None = None


async def drive(callers: Sequence[Caller], count: int) -> Run:
    """Send `count` requests through the callers, each as soon as its previous one answered."""
    remaining = count
    latencies: list[float] = []
    failed = 0

    async def client(caller: Caller) -> None:
        nonlocal remaining, failed
        while remaining > 0:
            remaining -= 1
            started = time.perf_counter_ns()
            ok = await caller.call()
            if ok:
                latencies.append((time.perf_counter_ns() - started) / 1e6)
            else:
                failed += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(caller) for caller in callers))
    return Run(latencies, failed, time.perf_counter() - started)


async def measure(
    make_caller: Callable[[], Caller],
    clients: int,
    count: int,
    warmup: int,
    server_pid: int | None,
) -> Run:
    callers = [make_caller() for _ in range(clients)]
    try:
        await drive(callers, warmup)
        gc.collect()
        gc.disable()  # the generator's own pauses would show up as server latency
        try:
            cpu_before = group_cpu_s(server_pid) if server_pid else None
            run = await drive(callers, count)
            if server_pid and cpu_before is not None:
                run.cpu_s = group_cpu_s(server_pid) - cpu_before
        finally:
            gc.enable()
        return run
    finally:
        for caller in callers:
            await caller.close()


def group_cpu_s(pgid: int) -> float:
    """CPU seconds of every process in a process group, children they reaped included."""
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # exited meanwhile
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid:  # fields[0] is state (field 3 of proc(5))
            ticks += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return ticks / os.sysconf("SC_CLK_TCK")


# --- servers ------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])

    def stop(self) -> None:
        """SIGTERM (a graceful stop flushes kairos' query log), then SIGKILL the group."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        # workers left behind (gunicorn) share the group started for this server
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


def start_server(
    name: str, command: list[str], port: int, cwd: Path, log: Path, env: dict[str, str]
) -> Server:
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    return Server(name, port, process, log)


def wait_ready(server: Server, path: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}{path}", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} not ready after {timeout:.0f}s:\n{server.log_tail()}")


def post(port: int, path: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# --- kairos -------------------------------------------------------------------------------

KAIROS_PATH = "/v1/query/online"
KAIROS_BODY = orjson.dumps({"inputs": {f"{NAMESPACE}.id": ENTITY}, "outputs": KAIROS_OUTPUTS})
KAIROS_EXPECTED = dict(zip(KAIROS_OUTPUTS, VALUES, strict=True))


def kairos_ok(body: bytes) -> bool:
    answer = orjson.loads(body)
    return bool(
        answer["meta"]["cache_hits"] == 10
        and not answer["errors"]
        and answer["values"] == KAIROS_EXPECTED
    )


def start_kairos(folder: Path, prefix: str, redis_address: str) -> Server:
    folder.mkdir()
    (folder / "features.py").write_text(kairos_features_module())
    (folder / "kairos.yaml").write_text(
        f"online_store: redis://{redis_address}/0?prefix={prefix}\n"
        "query_log: sqlite:///.kairos/query_log.db\n"
    )
    port = free_port()
    command = [sys.executable, "-m", "kairos.cli", "serve", str(folder), "--port", str(port)]
    server = start_server("kairos", command, port, folder, folder.parent / "kairos.log", env())
    wait_ready(server, "/healthz", 60)
    status, body = post(port, KAIROS_PATH, KAIROS_BODY)  # computes, fills the cache
    if status != 200 or orjson.loads(body)["errors"]:
        raise RuntimeError(f"kairos warm query failed ({status}): {body[:500]!r}")
    status, body = post(port, KAIROS_PATH, KAIROS_BODY)
    if status != 200 or not kairos_ok(body):
        raise RuntimeError(f"kairos second query is not 10 cache hits ({status}): {body[:500]!r}")
    return server


# --- feast --------------------------------------------------------------------------------

FEAST_PATH = "/get-online-features"
FEAST_BODY = orjson.dumps(
    {"features": [f"bench:{name}" for name in NAMES], "entities": {"eid": [ENTITY]}}
)
FEAST_EXPECTED = dict(zip(NAMES, VALUES, strict=True))


def feast_ok(body: bytes) -> bool:
    answer = orjson.loads(body)
    got: dict[str, Any] = {}
    for name, result in zip(answer["metadata"]["feature_names"], answer["results"], strict=True):
        if name == "eid":
            continue
        if result["statuses"] != ["PRESENT"]:
            return False
        got[name] = result["values"][0]
    return got == FEAST_EXPECTED


@dataclass
class Feast:
    server: Server | None = None
    version: str = ""
    unavailable: str = ""  # why there are no Feast rows


def start_feast(
    repo: Path, project: str, redis_address: str, max_requests: int | None = None
) -> Feast:
    python, cli = FEAST_VENV / "bin" / "python", FEAST_VENV / "bin" / "feast"
    if not cli.exists():
        return Feast(unavailable=f"{FEAST_VENV.name} missing; run bash bench/feast_env.sh")
    values = ",".join(str(v) for v in VALUES)
    setup = [python, FEAST_HELPER, repo, "--project", project, "--entity", ENTITY]
    setup += ["--redis", redis_address, "--values", values]
    try:
        done = subprocess.run(
            [str(a) for a in setup], capture_output=True, text=True, timeout=300, env=env()
        )
    except subprocess.TimeoutExpired:
        return Feast(unavailable="setting up the Feast repo took over 300s")
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Feast(unavailable=f"feast_repo.py failed: {last[:200]}")
    written = orjson.loads(done.stdout.strip().splitlines()[-1])
    read = {k: v[0] for k, v in written["values"].items() if k != "eid"}
    if read != FEAST_EXPECTED:
        return Feast(unavailable=f"Feast read back {read!r}, wrote {FEAST_EXPECTED!r}")
    port = free_port()
    command = [str(cli), "-c", str(repo), "serve", "-h", "127.0.0.1", "-p", str(port)]
    command += ["-w", "1", "--no-access-log"]
    if max_requests is not None:
        command += ["--max-requests", str(max_requests)]
    server = start_server("feast", command, port, repo, repo.parent / "feast.log", env())
    feast = Feast(server, written["feast"])
    try:
        wait_ready(server, "/health", 120)
        status, body = post(port, FEAST_PATH, FEAST_BODY)
        if status != 200 or not feast_ok(body):
            raise RuntimeError(f"Feast answered {status}: {body[:300]!r}")
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        feast.unavailable = f"feast serve did not work: {str(error).splitlines()[0][:200]}"
    return feast


def env() -> dict[str, str]:
    return {**os.environ, "FEAST_USAGE": "False", "PYTHONUNBUFFERED": "1"}


# --- report -------------------------------------------------------------------------------


def percentile(samples: list[float], q: int) -> float:
    if len(samples) < 2:
        return samples[0] if samples else float("nan")
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


@dataclass
class Row:
    scenario: str
    clients: int
    run: Run | None = None
    note: str = ""
    p50: float = field(init=False, default=float("nan"))
    p99: float = field(init=False, default=float("nan"))
    rps: float = field(init=False, default=float("nan"))

    def __post_init__(self) -> None:
        if self.run is not None and self.run.latencies_ms:
            self.p50 = statistics.median(self.run.latencies_ms)
            self.p99 = percentile(self.run.latencies_ms, 99)
            self.rps = len(self.run.latencies_ms) / self.run.wall_s


def print_table(rows: list[Row]) -> None:
    floors = {r.clients: r.p50 for r in rows if r.scenario.startswith("redis")}
    header = (
        f"{'scenario':<22} {'clients':>7} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} "
        f"{'failed':>7} {'p50 / redis floor':>18} {'srv CPU ms/req':>15}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        if row.run is None:
            print(f"{row.scenario:<22} {row.clients:>7}   {row.note}")
            continue
        cpu = "-"
        if row.run.cpu_s is not None and row.run.latencies_ms:
            cpu = f"{row.run.cpu_s * 1000 / len(row.run.latencies_ms):.3f}"
        print(
            f"{row.scenario:<22} {row.clients:>7} {row.p50:>8.3f} {row.p99:>8.3f} "
            f"{row.rps:>8.0f} {row.run.failed:>7} {row.p50 / floors[row.clients]:>17.1f}x "
            f"{cpu:>15}"
        )


def targets(rows: list[Row], feast_unavailable: str) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for each target of the issue."""
    by = {(r.scenario, r.clients): r for r in rows}
    k1, k16 = by["kairos", 1], by["kairos", 16]
    failed = sum(r.run.failed for r in (k1, k16) if r.run is not None)
    results: list[tuple[str, str, str]] = []
    compare = [
        ("1 client: kairos p50 <= 0.5x Feast p50", 1, "p50", LATENCY_RATIO_1, "le"),
        ("1 client: kairos p99 <= 0.5x Feast p99", 1, "p99", LATENCY_RATIO_1, "le"),
        ("16 clients: kairos req/s >= 2x Feast", 16, "rps", THROUGHPUT_RATIO_16, "ge"),
        ("16 clients: kairos p99 <= Feast p99 / 5", 16, "p99", 1 / P99_RATIO_16, "le"),
    ]
    for label, clients, metric, ratio, sense in compare:
        if feast_unavailable:
            results.append((label, "-", "n/a (Feast unavailable)"))
            continue
        ours, theirs = getattr(by["kairos", clients], metric), getattr(by["feast", clients], metric)
        passed = ours <= ratio * theirs if sense == "le" else ours >= ratio * theirs
        unit = "req/s" if metric == "rps" else "ms"
        measured = f"{ours:.3f} vs {theirs:.3f} {unit} ({ours / theirs:.2f}x)"
        results.append((label, measured, "PASS" if passed else "FAIL"))
    results.append(
        ("kairos: no failed request", f"{failed} failed", "PASS" if not failed else "FAIL")
    )
    return results


# --- main ---------------------------------------------------------------------------------


async def run_all(
    args: argparse.Namespace, kairos: Server, feast: Feast, redis_key: str
) -> list[Row]:
    host, port = args.redis.rsplit(":", 1)
    plans: list[tuple[str, Callable[[], Caller], int | None]] = [
        (
            "redis floor (HMGET)",
            lambda: RedisCaller(host, int(port), redis_key, NAMES, args.timeout),
            None,
        ),
        (
            "kairos",
            lambda: HttpCaller(kairos.port, KAIROS_PATH, KAIROS_BODY, kairos_ok, args.timeout),
            kairos.process.pid,
        ),
    ]
    if feast.server is not None and not feast.unavailable:
        server = feast.server
        plans.append(
            (
                "feast",
                lambda: HttpCaller(server.port, FEAST_PATH, FEAST_BODY, feast_ok, args.timeout),
                server.process.pid,
            )
        )
    rows = []
    for clients, count in ((1, args.requests_1), (16, args.requests_16)):
        for name, make_caller, pid in plans:
            print(f"  {name}, {clients} client(s), {count} requests ...", flush=True)
            run = await measure(make_caller, clients, count, args.warmup, pid)
            rows.append(Row(name, clients, run))
        if len(plans) < 3:
            rows.append(Row("feast", clients, note=f"unavailable: {feast.unavailable}"))
    return rows


def delete_keys(client: redis.Redis, pattern: str) -> int:
    keys = list(client.scan_iter(match=pattern, count=1000))
    return int(client.delete(*keys)) if keys else 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests-1", type=int, default=2000, help="requests at 1 client")
    parser.add_argument("--requests-16", type=int, default=8000, help="requests at 16 clients")
    parser.add_argument("--warmup", type=int, default=300, help="requests before measuring")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per request")
    parser.add_argument("--redis", default="127.0.0.1:6379", help="host:port")
    parser.add_argument("--no-feast", action="store_true", help="skip Feast")
    parser.add_argument(
        "--feast-max-requests",
        type=int,
        help="Feast's worker restarts after this many requests (its default: 1000; 0: never)",
    )
    args = parser.parse_args()

    run_id = secrets.token_hex(4)
    prefix = f"kairos_bench_{run_id}"
    project = f"kairos_bench_{run_id}"
    host, port = args.redis.rsplit(":", 1)
    plain = redis.Redis(host=host, port=int(port))
    plain.ping()  # fail now, not halfway, when Redis is not there
    redis_key = RedisOnlineStore(f"redis://{args.redis}/0", prefix=prefix).entity_key(
        NAMESPACE, ENTITY
    )
    servers: list[Server] = []
    with tempfile.TemporaryDirectory(prefix="kairos-bench-http-") as tmp:
        try:
            print("starting kairos ...", flush=True)
            kairos = start_kairos(Path(tmp) / "kairos_project", prefix, args.redis)
            servers.append(kairos)
            stored = plain.hmget(redis_key, NAMES)
            if None in stored:
                raise RuntimeError(f"kairos did not write {redis_key!r} fields {NAMES}")
            if args.no_feast:
                feast = Feast(unavailable="skipped (--no-feast)")
            else:
                print("setting up Feast (repo, apply, write, serve) ...", flush=True)
                feast = start_feast(
                    Path(tmp) / "feast_repo", project, args.redis, args.feast_max_requests
                )
            if feast.server is not None:
                servers.append(feast.server)
            rows = uvloop.run(run_all(args, kairos, feast, redis_key))
        finally:
            for server in servers:
                server.stop()
            deleted = delete_keys(plain, f"{prefix}:*") + delete_keys(plain, f"*{project}")
            plain.close()

    print(
        "\nonline query over HTTP: 1 entity x 10 float features from Redis; "
        f"warmup {args.warmup}, failures excluded from percentiles"
    )
    recycle = args.feast_max_requests
    if feast.unavailable:
        feast_line = "Feast unavailable"
    elif recycle is None:
        feast_line = f"Feast {feast.version}: 1 worker, recycled every ~1000 requests (default)"
    else:
        every = f"recycled every {recycle} requests" if recycle else "never recycled"
        feast_line = f"Feast {feast.version}: 1 worker, {every}"
    print(f"kairos: 1 process, query log on; {feast_line}; access logs off")
    print(f"{deleted} Redis keys written by this run deleted\n")
    print_table(rows)
    print("\ntargets (issue)")
    for label, measured, verdict in targets(rows, feast.unavailable):
        print(f"  {label:<42} {measured:<36} {verdict}")


if __name__ == "__main__":
    main()
