"""Read a server-sent-events body the way OpenAI clients do: one JSON object per `data:`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any


def events(lines: Iterable[str]) -> Iterator[dict[str, Any] | str]:
    """Yield each event's JSON, and the string "[DONE]" for the terminator."""
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        yield data if data == "[DONE]" else json.loads(data)
