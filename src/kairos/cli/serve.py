"""`kairos serve`: run the HTTP server until stopped; flush the query log on the way out."""

from __future__ import annotations

import gc
import ipaddress

import uvicorn

from kairos.client import Client
from kairos.client.config import ServerConfig
from kairos.errors import KairosError
from kairos.server import create_app


def is_local(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(project: str, host: str | None, port: int | None) -> int:
    client = Client(project)
    try:
        configured = client.config.server
        server_config = ServerConfig(
            host=host or configured.host, port=port or configured.port, keys=configured.keys
        )
        if not server_config.keys and not is_local(server_config.host):
            raise KairosError(
                f"refusing to serve on {server_config.host} without API keys; add "
                "server.keys to kairos.yaml (e.g. keys: ['${KAIROS_API_KEY}']) or bind 127.0.0.1"
            )
        app = create_app(client, server_config, close_client=True)
        config = uvicorn.Config(
            app,
            host=server_config.host,
            port=server_config.port,
            loop="uvloop",
            http="httptools",
            log_level="warning",
            access_log=False,
            lifespan="on",
        )
        server = uvicorn.Server(config)
        # Everything built so far lives as long as the server: keep it out of the collector's
        # scans, which otherwise pause requests for milliseconds.
        gc.collect()
        gc.freeze()
        print(
            f"kairos serving {project} on http://{server_config.host}:{server_config.port} "
            f"({'bearer keys required' if server_config.keys else 'no auth, localhost only'})",
            flush=True,
        )
        server.run()
    finally:
        client.close()  # idempotent; the app's shutdown already flushed the query log
    return 0
