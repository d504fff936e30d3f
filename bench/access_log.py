"""What an access line costs: a request to kairos serve's app in process (GET /healthz through
the ASGI app, httpx's ASGI transport left out: the app called directly) with the access log
off, as text and as JSON, each written to /dev/null and to a file; and the line alone beside
a plain standard-library `logger.info` through the same handler, the floor any stdlib line
pays.

    .venv/bin/python bench/access_log.py [--requests 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import kairos as kr  # noqa: E402
from kairos.cli.server_logging import configure_logging  # noqa: E402
from kairos.http.access import log_access  # noqa: E402
from kairos.project.config import LoggingConfig  # noqa: E402
from kairos.server import create_app  # noqa: E402


def per_line(n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        log_access("POST", "/v1/query/online", 200, 0.0031, "d388ffd4acff49330000000000000001")
    return (time.perf_counter() - started) / n * 1e6


def stdlib_line(n: int) -> float:
    logger = logging.getLogger("bench.plain")
    started = time.perf_counter()
    for _ in range(n):
        logger.info("%s %s %d", "POST", "/v1/query/online", 200)
    return (time.perf_counter() - started) / n * 1e6


def per_request(app: Any, n: int) -> float:
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/healthz", "raw_path": b"/healthz", "query_string": b"",
        "root_path": "", "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        return None

    async def run() -> float:
        started = time.perf_counter()
        for _ in range(n):
            await app(dict(scope), receive, send)
        return (time.perf_counter() - started) / n * 1e6

    return asyncio.run(run())


def _us(value: float) -> str:
    return "-" if value != value else f"{value:.2f}"  # NaN: not measured in this row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=20000)
    n = parser.parse_args().requests

    sinks: dict[str, TextIO] = {
        "/dev/null": open(os.devnull, "w"),  # noqa: SIM115
        "a file": tempfile.TemporaryFile("w"),  # noqa: SIM115
    }
    with kr.Client(ROOT / "examples" / "fraud", query_log="none://") as client:
        app = create_app(client)
        rows = []
        for sink_name, sink in sinks.items():
            for label, config in [
                ("off", LoggingConfig(access=False)),
                ("text", LoggingConfig(format="text")),
                ("json", LoggingConfig(format="json")),
            ]:
                configure_logging(config, sink)
                logging.getLogger("bench.plain").setLevel(logging.INFO)
                per_request(app, n // 10)  # warm
                request = per_request(app, n)
                line = per_line(n) if label != "off" else float("nan")
                plain = stdlib_line(n) if label == "text" else float("nan")
                rows.append((sink_name, label, request, line, plain))
    print(f"{'written to':10s} {'access':6s} {'GET /healthz us':>16s} {'line us':>8s} "
          f"{'plain stdlib line us':>21s}")  # fmt: skip
    for sink_name, label, request, line, plain in rows:
        print(f"{sink_name:10s} {label:6s} {request:16.2f} {_us(line):>8s} {_us(plain):>21s}")
    off = {s: r for s, label, r, _, _ in rows if label == "off"}
    for sink_name, label, request, _, _ in rows:
        if label != "off":
            print(f"{label} to {sink_name} adds {request - off[sink_name]:.2f} us a request")


if __name__ == "__main__":
    main()
