"""Streams consumed into events: each `streams:` entry of kairos.yaml feeds an events class
(`@features(events=True)`) through `client.write_events`, so its windows see the events.

A batch is acknowledged only after its events are written (durably, with an offline store):
a consumer killed mid-batch gets it again, and the event id makes a repeat count once —
at-least-once delivery, exactly once in effect. A message that cannot become an event (not
JSON, a missing id or time, a value of the wrong type, a map function that raised) goes to
the dead-letter stream with the reason and does not stop the consumer. A failing broker or
store stops nothing either: the batch is left unacknowledged and read again.

    >>> consumers = consumers_for(client)                    # one per streams: entry
    >>> await consumers[0].step()                            # one batch; returns messages
    >>> await run_consumers(consumers, stop)                 # until `stop` is set
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from kairos.errors import BackendUnavailable, InvalidInput, KairosError, ProjectError
from kairos.sources.streams import Message, Stream, stream_from_config

if TYPE_CHECKING:
    from kairos.client.client import Client

logger = logging.getLogger("kairos.streams")
LAG_EVERY = 1.0  # seconds between reads of a stream's lag (for /metrics)


@dataclass
class StreamStats:
    """What one consumer did since it started."""

    messages: int = 0
    events: int = 0  # written (a repeat of an event id counts again here, once in the index)
    skipped: int = 0  # the map function returned None
    dead: int = 0
    errors: int = 0  # batches that failed (broker or store) and were read again
    lag: int | None = None  # messages the broker has not delivered yet
    last_error: str = ""


class Consumer:
    """Reads one stream, writes its events, acknowledges, dead-letters the poison."""

    def __init__(self, client: Client, stream: Stream) -> None:
        self.client = client
        self.stream = stream
        self.spec = stream.spec
        self.name = self.spec.name
        self.namespace = _events_namespace(client, self.spec.events, self.name)
        self.mapper = _mapper(self.spec.map, self.name, client)
        self.stats = StreamStats()

    async def step(self, timeout: float = 1.0) -> int:
        """Read one batch (waiting at most `timeout`), write it, acknowledge it; the number
        of messages it held."""
        messages = await self.stream.read(self.spec.batch, timeout)
        if not messages:
            return 0
        events: list[tuple[Message, dict[str, Any]]] = []
        done: list[Message] = []
        poison: list[tuple[Message, str]] = []
        for message in messages:
            try:
                event = self._event(message)
            except Exception as error:  # the message, or the user's map function
                poison.append((message, f"{type(error).__name__}: {error}"))
                continue
            if event is None:
                self.stats.skipped += 1
                done.append(message)
            else:
                events.append((message, event))
        if events:
            try:
                self.client.write_events(self.namespace, [event for _, event in events])
                done += [message for message, _ in events]
                self.stats.events += len(events)
            except InvalidInput:  # some event is bad: find which, keep the others
                for message, event in events:
                    try:
                        self.client.write_events(self.namespace, [event])
                    except InvalidInput as error:
                        poison.append((message, str(error)))
                        continue
                    done.append(message)
                    self.stats.events += 1
        for message, reason in poison:
            await self.stream.dead_letter(message, reason)
            self.stats.dead += 1
            logger.warning("stream %s: message %s dead-lettered: %s", self.name, message.id, reason)
        await self.stream.ack(done)
        self.stats.messages += len(messages)
        return len(messages)

    def _event(self, message: Message) -> dict[str, Any] | None:
        if self.mapper is not None:
            found = self.mapper({"id": message.id, "body": message.body, **message.fields})
            if found is not None and not isinstance(found, dict):
                raise TypeError(f"map {self.spec.map} returned {type(found).__name__}, not dict")
            return found
        event = orjson.loads(message.body)
        if not isinstance(event, dict):
            raise ValueError("the message body is JSON but not an object of features by name")
        return event

    async def run(self, stop: asyncio.Event, idle: float = 1.0) -> None:
        """Step until `stop` is set; a failing broker or store is retried with backoff."""
        delay = 0.1
        checked = -math.inf
        while not stop.is_set():
            try:
                await self.step(idle)
                delay = 0.1
                if time.monotonic() - checked >= LAG_EVERY:  # one broker call, not per batch
                    self.stats.lag = await self.stream.lag()
                    checked = time.monotonic()
            except (BackendUnavailable, KairosError, OSError) as error:
                self.stats.errors += 1
                self.stats.last_error = str(error)
                with contextlib.suppress(BackendUnavailable, KairosError, OSError):
                    await self.stream.redeliver()  # the failed batch is read again
                logger.warning("stream %s: %s; retrying in %.1fs", self.name, error, delay)
                with contextlib.suppress(TimeoutError):  # or stop: no need to wait it out
                    await asyncio.wait_for(stop.wait(), delay)
                delay = min(delay * 2, 5.0)

    async def drain(self, idle: float = 0.5) -> int:
        """Step until a read finds nothing for `idle` seconds; the messages it handled."""
        total = 0
        while count := await self.step(idle):
            total += count
        self.stats.lag = await self.stream.lag()
        return total

    async def close(self) -> None:
        await self.stream.close()


def consumers_for(client: Client, names: Sequence[str] = ()) -> list[Consumer]:
    """A consumer per `streams:` entry of the client's config (or those named)."""
    streams = client.config.streams
    unknown = [n for n in names if n not in streams]
    if unknown:
        raise ProjectError(
            f"no stream {unknown[0]!r} in kairos.yaml; configured: {', '.join(streams) or 'none'}"
        )
    return [
        Consumer(client, stream_from_config(name, raw))
        for name, raw in streams.items()
        if not names or name in names
    ]


async def run_consumers(consumers: Sequence[Consumer], stop: asyncio.Event) -> None:
    """Run every consumer until `stop` is set, then close their streams."""
    try:
        await asyncio.gather(*(consumer.run(stop) for consumer in consumers))
    finally:
        for consumer in consumers:
            await consumer.close()


def _events_namespace(client: Client, events: str, stream: str) -> str:
    graph = client.graph
    found = events if events in graph.classes else None
    if found is None:  # a class name: Transaction -> transaction
        found = next((ns for ns, info in graph.classes.items() if info.cls.__name__ == events),
                     None)  # fmt: skip
    if found is None or not graph.classes[found].events:
        takers = [ns for ns, info in graph.classes.items() if info.events]
        raise ProjectError(
            f"streams.{stream}.events {events!r} is not an events class of the project; "
            f"events classes: {', '.join(takers) or 'none (declare @features(events=True))'}"
        )
    return found


def _mapper(
    spec: str | None, stream: str, client: Client
) -> Callable[[dict[str, Any]], Any] | None:
    if spec is None:
        return None
    module_name, _, function = spec.partition(":")
    folder = client.config.base_dir
    if folder is not None and str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # map modules live in the project folder
    try:
        module = importlib.import_module(module_name)
        mapper = getattr(module, function)
    except (ImportError, AttributeError) as error:
        raise ProjectError(f"streams.{stream}.map {spec!r}: {error}") from None
    if not callable(mapper):
        raise ProjectError(f"streams.{stream}.map {spec!r} is not a function")
    return mapper  # type: ignore[no-any-return]


__all__ = ["Consumer", "StreamStats", "consumers_for", "run_consumers"]
