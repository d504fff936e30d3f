"""The SSE parser gives the same events however the body is split into pieces, including
`\r\n` line ends, multi-line data, named events, comments and a body without a final blank
line; checked against a whole-body, line-by-line oracle."""

from __future__ import annotations

import random

from kairos.http.sse import Event, Parser

PARTS = [
    b'data: {"a":1}\n\n', b"data: x\r\n\r\n", b"event: e\ndata: y\n\n", b"data:z\n\n",
    b": comment\n", b"\n", b"data: m\ndata: n\n\n", b"id: 3\n", b"data: [DONE]\n\n", b"\r\n",
]  # fmt: skip


def oracle(body: bytes) -> list[Event]:
    name: str | None = None
    data: list[bytes] = []
    found = []
    for line in body.split(b"\n"):
        line = line.removesuffix(b"\r")
        if not line:
            if data:
                found.append(Event(name, b"\n".join(data)))
            name, data = None, []
        elif line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
        elif line.startswith(b"event:"):
            name = line[6:].strip().decode()
    if data:
        found.append(Event(name, b"\n".join(data)))
    return found


def test_events_do_not_depend_on_how_the_body_is_split() -> None:
    rng = random.Random(0)
    for _ in range(3000):
        body = b"".join(rng.choice(PARTS) for _ in range(rng.randint(0, 8)))
        if rng.random() < 0.3:
            body += b"data: unterminated"
        cuts = sorted(rng.sample(range(len(body) + 1), min(len(body) + 1, rng.randint(0, 5))))
        parser, got, start = Parser(), [], 0
        for cut in [*cuts, len(body)]:
            got += parser.feed(body[start:cut])
            start = cut
        got += parser.close()
        assert got == oracle(body), (body, cuts)


def test_the_usual_stream_is_one_event_per_data_line() -> None:
    parser = Parser()
    assert parser.feed(b'data: {"a":1}\n\ndata: {"b"') == [Event(None, b'{"a":1}')]
    assert parser.feed(b":2}\n\ndata: [DONE]\n\n") == [
        Event(None, b'{"b":2}'),
        Event(None, b"[DONE]"),
    ]
    assert parser.close() == []
