"""A plain keep-alive HTTP/1.1 upstream, as many users' own services are: the standard
library's ThreadingHTTPServer (listen backlog 5), answering every POST at once with an
OpenAI-style chat completion (10 prompt tokens, 1 completion token), or with `--status N` and
an error. Run as a process (`python -m tests.http.threading_upstream [--port P] [--status N]`);
it prints its port, and answers `GET /count` with how many POSTs it served."""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SERVED = [0]
LOCK = threading.Lock()
STATUS = [200]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if STATUS[0] != 200:
            self._answer(STATUS[0], b'{"error": {"message": "not now"}}')
            return
        with LOCK:
            SERVED[0] += 1
        completion = {
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "echo",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "ok"}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
        }  # fmt: skip
        self._answer(200, json.dumps(completion).encode())

    def do_GET(self) -> None:
        self._answer(200, json.dumps({"served": SERVED[0]}).encode())

    def handle(self) -> None:
        with contextlib.suppress(ConnectionError):  # a client reset its connection
            super().handle()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--status", type=int, default=200)
    options = parser.parse_args()
    STATUS[0] = options.status
    server = ThreadingHTTPServer(("127.0.0.1", options.port), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()
