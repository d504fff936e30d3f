"""HTTP/1.1 conformance at the gateway's edge: framing attacks, bad bodies, old protocol
versions, pipelining and size bounds. Each case is raw bytes on a fresh connection and a
*safe verdict* (what a server in front of provider credentials may answer); the same cases run
against `kairos gateway serve` (a real process) and against uvicorn serving the same app in
this process, and both must give the same verdict.

A verdict reads the responses on the connection until it closes: their statuses, and whether
the body a request carried reached the app whole (the admin route echoes the key's name).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httptools
import pytest
import yaml

from kairos.gateway import Gateway
from kairos.gateway.app import create_gateway_app
from tests.gateway.conftest import ADMIN_KEY, ENVIRON, config
from tests.gateway.fake_upstream import FakeUpstream, ServerThread, free_port

ROOT = Path(__file__).resolve().parents[2]
BODY = b'{"name": "smuggle-check"}'
SMUGGLED = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"  # a request hidden in a body


def post(
    path: str = "/admin/keys", *, headers: str = "", body: bytes = BODY, version: str = "1.1"
) -> bytes:
    head = (
        f"POST {path} HTTP/{version}\r\nhost: 127.0.0.1\r\n"
        f"authorization: Bearer {ADMIN_KEY}\r\ncontent-type: application/json\r\n{headers}\r\n"
    )
    return head.encode() + body


def chunked(*chunks: bytes) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"


@dataclass
class Exchange:
    statuses: list[int]
    bodies: list[bytes]
    closed: bool  # the server closed the connection (within the read window)
    seconds: float

    @property
    def echoed(self) -> bool:
        """The first request's body reached the app whole (a key named after it was made)."""
        return bool(self.bodies) and b"smuggle-check" in self.bodies[0]


class _Responses:
    """httptools callbacks collecting every response on the connection."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.bodies: list[bytes] = []
        self._body = b""
        self.parser = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.statuses.append(self.parser.get_status_code())
        self.bodies.append(self._body)
        self._body = b""


def exchange(port: int, *writes: bytes, window: float = 3.0, pause: float = 0.0) -> Exchange:
    """Send `writes` (with `pause` seconds between them), then read until the server closes
    or `window` seconds pass with nothing new."""
    responses = _Responses()
    started = time.monotonic()
    closed = False
    with socket.create_connection(("127.0.0.1", port), timeout=window) as sock:
        for index, data in enumerate(writes):
            if index and pause:
                time.sleep(pause)
            with contextlib.suppress(OSError):
                sock.sendall(data)
        while True:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                closed = True
                break
            if not data:
                closed = True
                break
            with contextlib.suppress(httptools.HttpParserError):
                responses.parser.feed_data(data)
    return Exchange(responses.statuses, responses.bodies, closed, time.monotonic() - started)


# --- the cases: (bytes to send, verdict) ------------------------------------------------------


def rejected(result: Exchange) -> bool:
    """At most a 4xx, nothing after it, the connection closed at once."""
    return (
        len(result.statuses) <= 1 and all(400 <= s < 500 for s in result.statuses)
        and result.closed and result.seconds < 2.5
    )  # fmt: skip


def answered_once(result: Exchange) -> bool:
    """The request was served with its whole body, and nothing in it ran as a request."""
    return result.statuses[:1] == [201] and result.echoed and len(result.statuses) == 1


def safe_framing(result: Exchange) -> bool:
    """Either verdict is safe for an ambiguous frame; a second response is not."""
    return rejected(result) or answered_once(result)


CASES: dict[str, tuple[list[bytes], Callable[[Exchange], bool]]] = {
    "content-length body": ([post(headers=f"content-length: {len(BODY)}\r\n")], answered_once),
    "chunked body": (
        [post(headers="transfer-encoding: chunked\r\n", body=chunked(BODY[:7], BODY[7:]))],
        answered_once,
    ),
    "length and chunked together": (
        [
            post(
                headers=f"content-length: {len(BODY)}\r\ntransfer-encoding: chunked\r\n",
                body=chunked(BODY) + SMUGGLED,
            )
        ],
        rejected,
    ),
    "two different lengths": (
        [post(headers=f"content-length: {len(BODY)}\r\ncontent-length: 3\r\n", body=BODY)],
        rejected,
    ),
    "length with a sign": ([post(headers=f"content-length: +{len(BODY)}\r\n")], rejected),
    "space before the colon": ([post(headers=f"content-length : {len(BODY)}\r\n")], rejected),
    "folded header": (
        [post(headers=f"content-length: {len(BODY)}\r\nx-folded: a\r\n  b\r\n")],
        rejected,
    ),
    "chunked not last": (
        [post(headers="transfer-encoding: chunked, identity\r\n", body=chunked(BODY))],
        rejected,
    ),
    "bad chunk size": ([post(headers="transfer-encoding: chunked\r\n", body=b"zz\r\n")], rejected),
    "overflowing chunk size": (
        [post(headers="transfer-encoding: chunked\r\n", body=b"f" * 40 + b"\r\nabc")],
        rejected,
    ),
    "bad chunk extension": (
        [post(headers="transfer-encoding: chunked\r\n", body=b"5;\x00=1\r\nhello\r\n0\r\n\r\n")],
        rejected,
    ),
    "websocket upgrade with a body": (
        [
            post(
                headers=f"connection: upgrade\r\nupgrade: websocket\r\n"
                f"content-length: {len(BODY) + len(SMUGGLED)}\r\n",
                body=BODY + SMUGGLED,
            )
        ],
        safe_framing,
    ),
    "h2c upgrade with a body": (
        [
            post(
                headers=f"connection: upgrade, http2-settings\r\nupgrade: h2c\r\n"
                f"http2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
                f"content-length: {len(BODY) + len(SMUGGLED)}\r\n",
                body=BODY + SMUGGLED,
            )
        ],
        safe_framing,
    ),
    "upgrade with a chunked body": (
        [
            post(
                headers="connection: upgrade\r\nupgrade: h2c\r\ntransfer-encoding: chunked\r\n",
                body=chunked(BODY + SMUGGLED),
            )
        ],
        safe_framing,
    ),
    "HTTP/1.0 with a length": (
        [post(headers=f"content-length: {len(BODY)}\r\n", version="1.0")],
        lambda r: answered_once(r) and r.closed,
    ),
    # a 0.9 client reads no status line: refusing it and answering it once are both safe
    "HTTP/0.9": ([b"GET /healthz\r\n\r\n"], lambda r: rejected(r) or r.statuses == [200]),
    "pipelined": (
        [
            post(headers=f"content-length: {len(BODY)}\r\n")
            + b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
        ],
        lambda r: r.statuses == [201, 200] and r.echoed,
    ),
    "oversized head": (
        [b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + b"x-big: " + b"a" * 100_000 + b"\r\n\r\n"],
        lambda r: r.closed and len(r.statuses) <= 1 and all(s in (400, 431) for s in r.statuses),
    ),
    "oversized body": (
        [post(headers=f"content-length: {9 * 1024 * 1024}\r\n", body=b"")],
        lambda r: r.statuses == [413],
    ),
}


# --- the two servers --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway_process(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """`kairos gateway serve` in its own process."""
    folder = tmp_path_factory.mktemp("conformance")
    url = upstream.url  # type: ignore[attr-defined]
    section = {
        "admin_key_env": "GW_ADMIN", "pepper_env": "GW_PEPPER", "body_timeout": "1s",
        "providers": {"fake": {"kind": "openai", "base_url": f"{url}/v1",
                               "api_key_env": "FAKE_KEY"}},
        "models": {"chat": {"deployments": [{"provider": "fake", "model": "echo"}]}},
    }  # fmt: skip
    (folder / "kairos.yaml").write_text(yaml.safe_dump({"gateway": section}))
    port = free_port()
    log = folder / "gateway.log"  # a file: a pipe nobody reads would fill with access lines
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "kairos.cli", "gateway", "serve", "--project", str(folder),
             "--port", str(port)],
            cwd=ROOT, env={**os.environ, **ENVIRON}, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start: {log.read_text()!r}")
            time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


def _uvicorn(upstream: FakeUpstream, factory: pytest.TempPathFactory, parser: str) -> Iterator[int]:
    folder = factory.mktemp(f"conformance-{parser}")
    gateway = Gateway(config(upstream, folder, body_timeout="1s"))
    with ServerThread(create_gateway_app(gateway), http=parser) as server:
        yield server.port
        server.call(gateway.close())


@pytest.fixture(scope="module")
def uvicorn_httptools(
    upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """uvicorn with httptools (its fast parser, what the bench compares) serving the same app.
    (uvicorn's h11 parser is not compared: in this test it also answered a request sent after a
    chunked body whose head declared a Content-Length too, where a proxy framing by the length
    would have passed it through as body.)"""
    yield from _uvicorn(upstream, tmp_path_factory, "httptools")


SERVERS = {"gateway": "gateway_process", "uvicorn-httptools": "uvicorn_httptools"}
# Where uvicorn 0.54 itself is unsafe (found by this test; kept so an upgrade that fixes one
# shows up as an XPASS): with httptools it reads the body of a request that offers an upgrade
# as nothing (the app gets an empty body, the bytes are left unread) and accepts a 100 KB head.
UVICORN_UNSAFE = {
    ("uvicorn-httptools", "websocket upgrade with a body"),
    ("uvicorn-httptools", "h2c upgrade with a body"),
    ("uvicorn-httptools", "upgrade with a chunked body"),
    ("uvicorn-httptools", "oversized head"),
}


@pytest.fixture(params=list(SERVERS))
def server(request: pytest.FixtureRequest) -> tuple[str, int]:
    return request.param, int(request.getfixturevalue(SERVERS[request.param]))


@pytest.mark.parametrize("case", list(CASES))
def test_every_case_gets_a_safe_verdict(
    server: tuple[str, int], case: str, request: pytest.FixtureRequest
) -> None:
    name, port = server
    if (name, case) in UVICORN_UNSAFE:
        request.applymarker(pytest.mark.xfail(reason=f"{name} is unsafe here", strict=True))
    writes, verdict = CASES[case]
    result = exchange(port, *writes)
    assert verdict(result), f"{case}: {result}"


def test_a_trickled_body_is_cut_after_the_body_timeout(server: tuple[str, int]) -> None:
    port = server[1]
    head = post(headers=f"content-length: {len(BODY)}\r\n", body=b"")
    # one byte every 0.4 s: the 1 s body timeout ends it long before the body would
    writes = [head, *(BODY[i : i + 1] for i in range(8))]
    result = exchange(port, *writes, pause=0.4)
    assert result.statuses == [408] and result.closed, result


def test_a_bad_chunk_after_a_good_start_closes_at_once(server: tuple[str, int]) -> None:
    port = server[1]
    # the app is already waiting for the body when the bad chunk arrives
    head = post(headers="transfer-encoding: chunked\r\n", body=b"")
    result = exchange(port, head, b'3\r\n{"n\r\nzz\r\n', pause=0.3)
    assert rejected(result), result


REFUSED = [case for case, (_, verdict) in CASES.items() if verdict is rejected]


@pytest.mark.parametrize("case", REFUSED)
def test_the_gateway_answers_a_refused_request_400_and_closes(
    gateway_process: int, case: str
) -> None:
    """Stricter than the shared verdict: kairos' own server says why with a 400."""
    writes, _ = CASES[case]
    result = exchange(gateway_process, *writes)
    assert result.statuses == [400] and result.closed, f"{case}: {result}"


def test_the_gateway_refuses_http09(gateway_process: int) -> None:
    result = exchange(gateway_process, b"GET /healthz\r\n\r\n")
    assert result.statuses == [400] and result.closed, result


# Request lines kairos' server refuses with a 400 and a close: only `METHOD SP /path SP
# HTTP/1.x` (single spaces, origin-form) is a request to the gateway; an absolute-form target
# is a request for a proxy, whose host the gateway would ignore (a proxy in front may route by
# it). uvicorn with httptools answers them (httptools takes both): only kairos' own server is
# held to this.
MALFORMED_LINES = {
    "two spaces before the target": b"GET  /healthz HTTP/1.1\r\nhost: x\r\n\r\n",
    "two spaces before the version": b"GET /healthz  HTTP/1.1\r\nhost: x\r\n\r\n",
    "absolute-form target": b"GET http://elsewhere.example/healthz HTTP/1.1\r\nhost: x\r\n\r\n",
    "absolute-form https target": b"GET https://127.0.0.1/admin/keys HTTP/1.1\r\nhost: x\r\n\r\n",
    "authority-form target": b"CONNECT 127.0.0.1:443 HTTP/1.1\r\nhost: x\r\n\r\n",
    "asterisk-form on GET": b"GET * HTTP/1.1\r\nhost: x\r\n\r\n",
}
ADMIN_GET = f"GET /admin/keys HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN_KEY}\r\n"


@pytest.mark.parametrize("case", list(MALFORMED_LINES))
def test_the_gateway_refuses_a_malformed_request_line(gateway_process: int, case: str) -> None:
    result = exchange(gateway_process, MALFORMED_LINES[case])
    assert result.statuses == [400] and result.closed, f"{case}: {result}"
    assert b"request line" in result.bodies[0] or b"CONNECT" in result.bodies[0], result


@pytest.mark.parametrize("case", list(MALFORMED_LINES))
def test_a_malformed_request_line_after_good_requests_is_refused_in_its_turn(
    gateway_process: int, case: str
) -> None:
    """Pipelined after a request without a body, one with a Content-Length body (its end is
    not a line's end) and a chunked one, in one write and split across writes (the head's
    blank line too): the good ones are answered, then the 400."""
    good = (
        f"{ADMIN_GET}\r\n".encode()
        + post(headers=f"content-length: {len(BODY)}\r\n")
        + post(headers="transfer-encoding: chunked\r\n", body=chunked(BODY[:7], BODY[7:]))
    )
    writes = good + MALFORMED_LINES[case]
    blank = len(ADMIN_GET) + 1  # between the first head's blank line's CR and LF
    for split in (
        [writes],
        [writes[:30], writes[30:-10], writes[-10:]],
        [writes[:blank], writes[blank:]],
    ):
        result = exchange(gateway_process, *split, pause=0.05 if len(split) > 1 else 0.0)
        assert result.statuses == [200, 201, 201, 400] and result.closed, f"{case}: {result}"


def test_empty_lines_before_a_request_and_asterisk_form_options_are_taken(
    gateway_process: int,
) -> None:
    result = exchange(gateway_process, b"\r\n\r\nGET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
    assert result.statuses == [200], result
    result = exchange(
        gateway_process, b"OPTIONS * HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    assert result.statuses == [404] and result.closed, result


def test_heads_are_bounded_at_64_kib(gateway_process: int) -> None:
    def head(size: int) -> bytes:
        return b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * size + b"\r\n\r\n"

    assert exchange(gateway_process, head(60 * 1024)).statuses == [200]
    over = exchange(gateway_process, head(65 * 1024))
    assert over.statuses == [431] and over.closed, over
