"""What every stream is (`Stream`), a message, and a `streams:` entry of kairos.yaml."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kairos.backends.url import redact
from kairos.errors import BackendUnavailable, ProjectError

_KINDS = ("redis", "nats", "kafka")
_KEYS = {"kind", "url", "stream", "events", "format", "map", "group", "consumer", "batch",
         "dead_letter", "claim_after"}  # fmt: skip
_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,200}")


@dataclass(frozen=True)
class StreamSpec:
    """One `streams:` entry: where messages come from and which events class they feed.

    `format: json` reads each message body as a JSON object of the event's features by name;
    `map: module:function` calls a Python function with the message (a dict: `id`, `body`
    (bytes), `fields` (Redis) or `subject` and `headers` (NATS)) that returns the event dict,
    or None to skip the message."""

    name: str
    kind: str
    url: str
    stream: str
    events: str
    format: str = "json"
    map: str | None = None
    group: str = "kairos"
    consumer: str = "kairos-1"
    batch: int = 500
    dead_letter: str = ""  # where poison messages go; default: `<stream>.dead`
    claim_after: float = 30.0  # seconds before another consumer's unacked messages are taken

    @property
    def shown_url(self) -> str:
        return redact(self.url)

    @property
    def dead(self) -> str:
        return self.dead_letter or f"{self.stream}.dead"

    @classmethod
    def parse(cls, name: str, raw: Any, where: str) -> StreamSpec:
        at = f"{where}: streams.{name}"
        if not isinstance(raw, dict):
            raise ProjectError(f"{at} is a mapping with kind, url, stream and events")
        unknown = sorted(set(raw) - _KEYS)
        if unknown:
            raise ProjectError(
                f"{at}: unknown key {unknown[0]!r}; known: {', '.join(sorted(_KEYS))}"
            )
        for key in ("kind", "url", "stream", "events"):
            if not isinstance(raw.get(key), str) or not raw[key]:
                raise ProjectError(f"{at}.{key} is required (a string)")
        if raw["kind"] not in _KINDS:
            raise ProjectError(
                f"{at}.kind {raw['kind']!r} is not supported; use {' or '.join(_KINDS)}"
            )
        format_ = raw.get("format", "json")
        mapper = raw.get("map")
        if format_ != "json":
            raise ProjectError(f"{at}.format {format_!r}: only json; or give map: module:function")
        if mapper is not None and (not isinstance(mapper, str) or ":" not in mapper):
            raise ProjectError(f"{at}.map is module:function, e.g. mymodule:to_event")
        for key in ("stream", "group", "consumer", "dead_letter"):
            value = raw.get(key)
            if value is not None and not (isinstance(value, str) and _NAME.fullmatch(value)):
                raise ProjectError(
                    f"{at}.{key} {value!r}: use letters, digits and . _ : - (1-200 characters)"
                )
        batch = raw.get("batch", 500)
        if not isinstance(batch, int) or isinstance(batch, bool) or not 1 <= batch <= 10_000:
            raise ProjectError(f"{at}.batch is a number of messages 1..10000, got {batch!r}")
        claim = raw.get("claim_after", 30)
        if not isinstance(claim, int | float) or isinstance(claim, bool) or claim <= 0:
            raise ProjectError(f"{at}.claim_after is seconds > 0, got {claim!r}")
        return cls(
            name=name,
            kind=raw["kind"],
            url=raw["url"],
            stream=raw["stream"],
            events=raw["events"],
            format=format_,
            map=mapper,
            group=raw.get("group", "kairos"),
            consumer=raw.get("consumer", "kairos-1"),
            batch=batch,
            dead_letter=raw.get("dead_letter", ""),
            claim_after=float(claim),
        )


def unavailable(spec: StreamSpec, error: Exception) -> BackendUnavailable:
    """A broker call that failed, named by stream, URL (no password) and key."""
    return BackendUnavailable(
        f"stream {spec.name!r} ({spec.shown_url}, {spec.stream}): {type(error).__name__}: {error}"
    )


@dataclass(frozen=True, slots=True)
class Message:
    """One message: its broker id, its body, and what the broker needs to acknowledge it."""

    id: str
    body: bytes
    fields: dict[str, Any]  # the Redis entry's fields; NATS: subject and headers
    handle: Any = None


class Stream(Protocol):
    spec: StreamSpec

    async def read(self, count: int, timeout: float) -> list[Message]:
        """Up to `count` messages: first any delivered before and never acknowledged (a
        consumer that was killed), then new ones, waiting at most `timeout` seconds."""
        ...

    async def ack(self, messages: Sequence[Message]) -> None:
        """Acknowledge messages whose events are durable."""
        ...

    async def dead_letter(self, message: Message, reason: str) -> None:
        """Put a message that cannot become an event on the dead-letter stream, with why,
        and acknowledge it (it is not delivered again)."""
        ...

    async def redeliver(self) -> None:
        """After a batch failed (it is not acknowledged): read it again next."""
        ...

    async def lag(self) -> int | None:
        """Messages not yet delivered to this consumer group, when the broker says."""
        ...

    async def close(self) -> None: ...
