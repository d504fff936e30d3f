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
    name: str | None = None
    data: list[bytes] = []
    async for line in lines:
        if not line:
            if data:
                yield Event(name, data[0] if len(data) == 1 else b"\n".join(data))
            name, data = None, []
        elif line.startswith(b"data:"):
            data.append(line[5:].removeprefix(b" "))
        elif line.startswith(b"event:"):
            name = line[6:].strip().decode()
    if data:
        yield Event(name, b"\n".join(data))


def frame(payload: bytes) -> bytes:
    """One SSE frame carrying JSON already encoded."""
    return b"data: " + payload + b"\n\n"


def encode(data: Any, event: str | None = None) -> bytes:
    """One SSE frame carrying `data` as JSON."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


DONE = b"data: [DONE]\n\n"
