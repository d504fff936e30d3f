"""A plain keep-alive HTTP/1.1 upstream, as many users' own services are: the standard
library's ThreadingHTTPServer (listen backlog 5), answering every POST at once. Run as a
process (`python -m tests.http.threading_upstream`); it prints its port, and answers
`GET /count` with how many POSTs it served."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SERVED = [0]
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with LOCK:
            SERVED[0] += 1
        self._answer(b'{"ok": true}')

    def do_GET(self) -> None:
        self._answer(json.dumps({"served": SERVED[0]}).encode())

    def handle(self) -> None:
        with contextlib.suppress(ConnectionError):  # a client reset its connection
            super().handle()


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()
