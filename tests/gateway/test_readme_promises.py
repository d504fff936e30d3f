"""Promises of the README's "Model gateway" section that no other test held to, each over
real HTTP: a PDF reaches an Anthropic deployment as a document block; a whole answer whose
connection broke after the request was sent is billed in full and not sent again; a
Responses stream translated from Anthropic's that ends short ends with an `error` event; a
deployment's `timeout` bounds each wait of a stream; a client that leaves mid-stream is read
on for `stream_drain` only."""

from __future__ import annotations

import base64
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from kairos.gateway import Gateway
from kairos.gateway.accounting.ledger import LedgerRow
from kairos.gateway.app import create_gateway_app
from tests.gateway.conftest import config, deployment, new_key
from tests.gateway.fake_upstream import TOKENS_IN, FakeUpstream, ServerThread

HI = [{"role": "user", "content": "hi"}]
BUDGET = [{"period": "total", "usd_micros": 1_000_000}]  # CHEAP: a micro-dollar a token
PDF = b"%PDF-1.4\n1 0 obj<</Type/Catalog>>endobj\ntrailer<</Root 1 0 R>>\n%%EOF\n"


@pytest.fixture
def serve(upstream: FakeUpstream, tmp_path: Path) -> Iterator[Any]:
    """Serve a gateway of `config(upstream, tmp_path, **extra)` over HTTP; closed after."""
    servers: list[ServerThread] = []

    def start(**extra: Any) -> ServerThread:
        gateway = Gateway(config(upstream, tmp_path, **extra))
        server = ServerThread(create_gateway_app(gateway), kairos=True).__enter__()
        server.gateway = gateway  # type: ignore[attr-defined]
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.call(server.gateway.close())  # type: ignore[attr-defined]
        server.__exit__(None, None, None)


def headers(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def final_row(server: ServerThread) -> LedgerRow:
    """The one ledger row, once the call is settled (`usage()` drains first)."""
    gateway: Gateway = server.gateway  # type: ignore[attr-defined]
    [row] = server.call(gateway.usage())
    return row


def spent(server: ServerThread, plain: str) -> int:
    """What the key's total USD counter was charged, budget shares given back."""
    gateway: Gateway = server.gateway  # type: ignore[attr-defined]
    record = server.call(gateway.authenticate(plain))
    server.call(gateway.drain())
    [total] = server.call(gateway.counters.spent([f"{record.id}:usd:total:all"]))
    return int(total)


def sse_data(raw: bytes) -> list[Any]:
    """The `data:` of each SSE frame; `[DONE]` as the string."""
    found: list[Any] = []
    for frame in raw.decode().split("\n\n"):
        for line in frame.splitlines():
            if line.startswith("data: "):
                found.append(line[6:] if line[6:] == "[DONE]" else orjson.loads(line[6:]))
    return found


# --- provider parity: PDFs ------------------------------------------------------------------


def test_a_pdf_file_part_reaches_an_anthropic_deployment_as_a_document_block(
    served: ServerThread, upstream: FakeUpstream
) -> None:
    data = base64.b64encode(PDF).decode()
    file = {"filename": "a.pdf", "file_data": f"data:application/pdf;base64,{data}"}
    content = [{"type": "text", "text": "summarise"}, {"type": "file", "file": file}]
    body = {"model": "claude", "messages": [{"role": "user", "content": content}], "max_tokens": 5}
    reply = httpx.post(
        f"{served.url}/v1/chat/completions", json=body, headers=headers(new_key(served))
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "tok " * 5
    [sent] = upstream.received
    assert sent["messages"][0]["content"] == [
        {"type": "text", "text": "summarise"},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                        "data": data}},
    ]  # fmt: skip
    # a file's tokens cannot be bounded: a key with a USD limit is refused it, before sending
    limited = httpx.post(
        f"{served.url}/v1/chat/completions",
        json=body,
        headers=headers(new_key(served, budgets=BUDGET)),
    )
    assert 400 <= limited.status_code < 500, limited.text
    assert len(upstream.received) == 1


# --- failover: a request sent and then broken -----------------------------------------------


class _HangUp(socketserver.BaseRequestHandler):
    """Reads a whole request, then closes the connection without answering."""

    server: _HangUpServer

    def handle(self) -> None:
        sock: socket.socket = self.request
        data = b""
        while b"\r\n\r\n" not in data:
            piece = sock.recv(65536)
            if not piece:
                return
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += sock.recv(65536)
        self.server.received.append(orjson.loads(body))
        sock.shutdown(socket.SHUT_RDWR)


class _HangUpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HangUp)
        self.received: list[dict[str, Any]] = []


@pytest.fixture
def hang_up() -> Iterator[_HangUpServer]:
    with _HangUpServer() as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield server
        server.shutdown()


def test_a_whole_answer_broken_after_sending_is_billed_in_full_and_not_sent_again(
    serve: Any, upstream: FakeUpstream, hang_up: _HangUpServer
) -> None:
    url = f"http://127.0.0.1:{hang_up.server_address[1]}/v1"
    base = upstream.url  # type: ignore[attr-defined]
    fake = {"kind": "openai", "base_url": f"{base}/v1", "api_key_env": "FAKE_KEY"}
    providers = {"fake": fake, "hangup": {"kind": "openai", "base_url": url}}
    first = {**deployment("echo"), "provider": "hangup"}
    models = {"group": {"deployments": [first, deployment("echo", priority=1)]}}
    server = serve(models=models, providers=providers)
    plain = new_key(server, budgets=BUDGET)
    body = {"model": "group", "messages": HI, "max_tokens": 20}
    reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers(plain))
    assert 500 <= reply.status_code < 600, reply.text
    assert [sent["model"] for sent in hang_up.received] == ["echo"]  # sent once
    assert upstream.received == []  # and not to the second deployment
    row = final_row(server)
    assert (row.status, row.attempts, row.provider) == ("upstream_error", 1, "hangup")
    assert row.tokens_out == 20  # the full hold: no usage came
    assert row.cost_micros == spent(server, plain) > TOKENS_IN + 20


# --- truthful streams: the Responses API through an Anthropic deployment --------------------


@pytest.mark.parametrize(
    ("mode", "status"), [("truncated", "upstream_incomplete"), ("cut", "upstream_error")]
)
def test_a_responses_stream_from_anthropic_cut_short_ends_with_an_error_event(
    served: ServerThread, upstream: FakeUpstream, mode: str, status: str
) -> None:
    upstream.behaviour["echo"] = mode  # /v1/messages: no message_stop, or a dropped connection
    body = {"model": "claude", "input": "hi", "max_output_tokens": 5, "stream": True}
    reply = httpx.post(f"{served.url}/v1/responses", json=body, headers=headers(new_key(served)))
    assert reply.status_code == 200
    found = sse_data(reply.content)
    kinds = [data["type"] for data in found]
    assert kinds[-1] == "error", kinds
    assert found[-1]["code"] == status
    assert "response.completed" not in kinds and "[DONE]" not in found
    deltas = [data["delta"] for data in found if data["type"] == "response.output_text.delta"]
    assert deltas == ["tok ", "tok "]  # what came before the cut was passed on
    row = final_row(served)
    assert (row.route, row.provider, row.status) == ("responses", "claude", status)
    assert row.tokens_out == 5  # no usage came: charged as held


# --- truthful streams: `timeout` bounds each wait -------------------------------------------


def test_a_stream_stalled_past_the_timeout_ends_with_an_error_event(
    serve: Any, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `timed`: the first chunk at once, then 5 chunks 2 s apart (the stream lasts 10 s)
    monkeypatch.setattr(upstream, "stream_seconds", 10.0)
    models = {"group": {"deployments": [deployment("timed", timeout="0.5s")]}}
    server = serve(models=models)
    body = {"model": "group", "messages": HI, "max_tokens": 5, "stream": True}
    began = time.monotonic()
    with httpx.stream(
        "POST",
        f"{server.url}/v1/chat/completions",
        json=body,
        headers=headers(new_key(server)),
        timeout=30,
    ) as reply:
        raw = reply.read()
    took = time.monotonic() - began
    found = sse_data(raw)
    assert found[0]["choices"][0]["delta"]["role"] == "assistant"  # the stream had begun
    assert "error" in found[-1] and "[DONE]" not in found, found
    assert took < 4, took  # the first 2 s gap ended it, not the stream's end at 10 s
    row = final_row(server)
    assert row.status not in ("ok", "pending"), row.status
    assert row.status == found[-1]["error"]["code"]


# --- budgets: a client that leaves mid-stream ------------------------------------------------


def test_a_client_that_leaves_is_read_on_for_stream_drain_only(
    serve: Any, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `timed`: the first chunk at once, then 5 chunks 4 s apart (20 s), usage last
    monkeypatch.setattr(upstream, "stream_seconds", 20.0)
    models = {"group": {"deployments": [deployment("timed", timeout="10s")]}}
    server = serve(models=models, stream_drain="0.5s")
    plain = new_key(server, budgets=BUDGET)
    body = {"model": "group", "messages": HI, "max_tokens": 5, "stream": True}
    with (
        httpx.Client(timeout=30) as http,
        http.stream(
            "POST", f"{server.url}/v1/chat/completions", json=body, headers=headers(plain)
        ) as reply,
    ):
        assert next(reply.iter_lines()).startswith("data: ")  # one chunk, then hang up
    left = time.monotonic()
    row = final_row(server)  # waits for the stream to be read and settled
    took = time.monotonic() - left
    assert row.status == "drain_timeout", row.status
    assert took < 3, took  # about stream_drain after leaving, not the next chunk (4 s) or 20 s
    assert row.tokens_out == 5  # no usage came before the drain ran out: the full hold
    assert row.cost_micros == spent(server, plain) > TOKENS_IN + 5
