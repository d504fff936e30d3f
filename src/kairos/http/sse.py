"""Server-sent events: read them from an upstream body, write them to a client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Event:
    event: str | None
    data: bytes


async def events(lines: AsyncIterator[bytes]) -> AsyncIterator[Event]:
    """Events from the lines of an SSE body (comments and ids are skipped)."""
    parser = Parser()
    async for line in lines:
        for event in parser.feed(line + b"\n"):
            yield event
    for event in parser.close():
        yield event


class Parser:
    """Events from an SSE body fed in pieces as they arrive, split anywhere; everything a
    piece completes is parsed in one call (no await per line).

    >>> parser = Parser()
    >>> parser.feed(b'data: {"a": 1}\\r'), parser.feed(b'\\n\\r\\ndata: {"b"')
    ([], [Event(event=None, data=b'{"a": 1}')])
    """

    __slots__ = ("_data", "_name", "_pending")

    def __init__(self) -> None:
        self._pending = b""
        self._name: str | None = None
        self._data: list[bytes] = []

    def feed(self, piece: bytes) -> list[Event]:
        """The events `piece` completes."""
        pending = self._pending + piece if self._pending else piece
        found: list[Event] = []
        if b"\r" in pending or self._data or self._name is not None:
            *complete, self._pending = pending.split(b"\n")
            for line in complete:
                self._line(line.removesuffix(b"\r"), found)
            return found
        # the usual shape, whole events of one `data: ` line each: no parsing line by line
        *events, self._pending = pending.split(b"\n\n")
        for event in events:
            if event.startswith(b"data: ") and b"\n" not in event:
                found.append(Event(None, event[6:]))
            elif event:
                for line in event.split(b"\n"):
                    self._line(line, found)
                self._line(b"", found)
        return found

    def close(self) -> list[Event]:
        """The last event, when the body ended without a blank line after it."""
        found: list[Event] = []
        if self._pending:  # lines after the last blank one
            for line in self._pending.split(b"\n"):
                self._line(line.removesuffix(b"\r"), found)
            self._pending = b""
        if self._data:
            found.append(Event(self._name, b"\n".join(self._data)))
            self._name, self._data = None, []
        return found

    def _line(self, line: bytes, found: list[Event]) -> None:
        if not line:
            data = self._data
            if data:
                found.append(Event(self._name, data[0] if len(data) == 1 else b"\n".join(data)))
                self._data = []
            self._name = None
        elif line.startswith(b"data:"):
            self._data.append(line[5:].removeprefix(b" "))
        elif line.startswith(b"event:"):
            self._name = line[6:].strip().decode()


def data_type(data: bytes) -> str | None:
    """The `type` of an event's JSON data, read without decoding it when it comes first (as
    OpenAI's Responses and Anthropic's events send it).

    >>> data_type(b'{"type":"response.completed","response":{}}')
    'response.completed'
    """
    if data.startswith(b'{"type":"'):
        end = data.find(b'"', 9)
        if end > 9 and b"\\" not in data[9:end]:
            return data[9:end].decode()
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    kind = parsed.get("type") if isinstance(parsed, dict) else None
    return kind if isinstance(kind, str) else None


def frame(payload: bytes) -> bytes:
    """One SSE frame carrying JSON already encoded."""
    return b"data: " + payload + b"\n\n"


def encode(data: Any, event: str | None = None) -> bytes:
    """One SSE frame carrying `data` as JSON."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"
