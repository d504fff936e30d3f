"""`kairos serve`: run the HTTP server until stopped; flush the query log on the way out.

With `--workers N`, N processes answer on one port (uvicorn's supervisor binds the socket once
and restarts a worker that dies); each builds its own client on the project's stores, which
every embedded store allows: the DuckDB offline store is a folder of segments any process adds
to, the SQLite online store and query log are WAL files, and each worker's window index follows
the events the others write.
"""

from __future__ import annotations

import atexit
import errno
import gc
import ipaddress
import os
import socket
import sys
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from kairos.cli.server_logging import configure_logging
from kairos.client import Client
from kairos.errors import KairosError
from kairos.project.config import Config, LoggingConfig, ServerConfig
from kairos.server import create_app

# what a worker process is told by the process that starts it (it is a fresh interpreter)
_PROJECT, _HOST, _PORT = "KAIROS_SERVE_PROJECT", "KAIROS_SERVE_HOST", "KAIROS_SERVE_PORT"


def is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_settings(configured: ServerConfig, host: str | None, port: int | None) -> ServerConfig:
    """The project's server settings with the command line's host and port, refused when
    they would serve beyond this machine without keys."""
    settings = ServerConfig(
        host=host or configured.host, port=port or configured.port, keys=configured.keys
    )
    if not settings.keys and not is_local(settings.host):
        raise KairosError(
            f"refusing to serve on {settings.host} without API keys; add "
            "server.keys to kairos.yaml (e.g. keys: ['${KAIROS_API_KEY}']) or bind 127.0.0.1"
        )
    return settings


def _uvicorn(app: Starlette | str, settings: ServerConfig, workers: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        log_config=None,  # configure_logging's handler and levels (kairos.yaml `logging:`)
        log_level=None,
        access_log=False,  # kairos.access writes the access lines
        lifespan="on",
        workers=workers,
        factory=isinstance(app, str),
    )


def _announce(project: str, settings: ServerConfig, workers: int) -> None:
    processes = f", {workers} worker processes" if workers > 1 else ""
    auth = "bearer keys required" if settings.keys else "no auth, localhost only"
    print(
        f"kairos serving {project} on http://{settings.host}:{settings.port} ({auth}{processes}); "
        f"dashboard at http://{settings.host}:{settings.port}/ui",
        flush=True,
    )


def serve(project: str, host: str | None, port: int | None, workers: int = 1) -> int:
    """Serve `project` until stopped, in this process or in `workers` processes.

    >>> serve("examples/fraud", "127.0.0.1", 8000, workers=4)  # doctest: +SKIP
    """
    if workers < 1:
        raise KairosError(f"--workers {workers} must be at least 1")
    if workers > 1:
        return _serve_workers(project, host, port, workers)
    config = Config.load(Path(project))
    taken = port_taken(server_settings(config.server, host, port))
    if taken:  # before the client loads its models and opens its stores
        print(f"kairos: {taken}", file=sys.stderr, flush=True)
        return 1
    configure_logging(config.logging)
    client = Client(project)
    try:
        settings = server_settings(client.config.server, host, port)
        app = create_app(client, settings, close_client=True)
        server = uvicorn.Server(_uvicorn(app, settings, 1))
        freeze_heap()
        _announce(project, settings, 1)
        server.run()
    finally:
        client.close()  # idempotent; the app's shutdown already flushed the query log
    return 0


def freeze_heap() -> None:
    """Keep everything built so far, which lives as long as the server, out of the
    collector's scans (they otherwise pause requests for milliseconds); unfrozen at exit, so
    the interpreter's last collection frees it: DuckDB's objects left frozen are reported as
    `nanobind: leaked ... instances` when the process ends."""
    gc.collect()
    gc.freeze()
    atexit.register(gc.unfreeze)


def port_taken(settings: ServerConfig) -> str | None:
    """Why `settings`' host and port cannot be listened on (one line naming the port and the
    fix), or None when they can (the socket is closed again at once).

    >>> port_taken(ServerConfig(host="127.0.0.1", port=0)) is None
    True
    """
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((settings.host, settings.port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                return (
                    f"port {settings.port} on {settings.host} is in use; stop what holds it or "
                    "serve on another with --port"
                )
            return (
                f"cannot listen on {settings.host}:{settings.port} ({error.strerror}); "
                "pick another with --host or --port"
            )
    return None


def _serve_workers(project: str, host: str | None, port: int | None, workers: int) -> int:
    folder = Path(project).resolve()
    project_config = Config.load(folder)
    settings = server_settings(project_config.server, host, port)
    taken = port_taken(settings)
    if taken:
        print(f"kairos: {taken}", file=sys.stderr, flush=True)
        return 1
    configure_logging(project_config.logging)  # the supervisor's; each worker sets its own
    os.environ.update(
        {_PROJECT: str(folder), _HOST: settings.host, _PORT: str(settings.port)}
    )  # the workers' environment: they are spawned, not forked
    config = _uvicorn(f"{__name__}:worker_app", settings, workers)
    socket = config.bind_socket()
    supervisor = Multiprocess(config, sockets=[socket])
    _announce(project, settings, workers)
    try:
        supervisor.run()  # until SIGINT or SIGTERM, then each worker shuts down in turn
    finally:
        socket.close()
    if any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes):
        raise KairosError(f"a worker could not start serving {project} (see its error above)")
    return 0


def worker_app() -> Starlette:
    """The app of one `kairos serve --workers N` process (uvicorn calls it in each worker)."""
    try:
        configure_logging(LoggingConfig.load(os.environ[_PROJECT]))
        client = Client(os.environ[_PROJECT])
    except KairosError as error:
        print(f"kairos: {error}", file=sys.stderr, flush=True)
        sys.exit(STARTUP_FAILURE)  # the supervisor stops instead of restarting it for ever
    try:
        settings = server_settings(client.config.server, os.environ[_HOST], int(os.environ[_PORT]))
        app = create_app(client, settings, close_client=True)
    except BaseException:
        client.close()
        raise
    freeze_heap()
    return app
