"""NATS JetStream: a durable pull consumer named `group` on the stream that holds `stream`
(a subject), read in batches and acknowledged once the events are durable; what is not
acknowledged is delivered again after the consumer's ack wait. Poison messages are published
to `<subject>.dead` (with the reason in a header) and terminated, so they are not redelivered.

A read sends JetStream's pull request itself (`$JS.API.CONSUMER.MSG.NEXT.<stream>.<group>`,
replied to `<inbox>.<n>`) and one subscription on `<inbox>.*` gathers every message that
comes: nats-py's `fetch` waits on each message with a task and a timer of its own, most of a
consumer's time. Delivered messages keep their stream subject; the status that ends a pull
(404 no messages, 408 expired, 409 a limit such as max ack pending) comes on its reply subject.
A message that arrives after its read gave up waits for the next read, unacknowledged.

nats-py is imported when a stream connects, not when kairos is
(`pip install 'kairos-inference[streams]'`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

from kairos.errors import BackendUnavailable, KairosError
from kairos.sources.streams.base import Message, StreamSpec, unavailable

_ENDS = frozenset({"404", "408", "409"})  # a pull is over: nothing there, expired, a limit
_LATE = 1.0  # seconds past a read's timeout that the status ending its pull may take to come


class NatsStream:
    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        self._connection: Any = None
        self._jetstream: Any = None
        self._stream_name = ""  # the JetStream stream that holds the subject
        self._inbox = ""
        self._pulls = 0
        self._reply = ""  # the pull now awaited: its reply subject, and the count that ends it
        self._until = 0
        self._over = asyncio.Event()
        self._failure = ""
        self._delivered: list[Any] = []  # arrived, not yet handed to a read

    def _unavailable(self, error: Exception) -> BackendUnavailable:
        return unavailable(self.spec, error)

    async def _connected(self) -> None:
        if self._connection is not None:
            return
        try:
            import nats
        except ImportError:
            raise KairosError(
                f"stream {self.spec.name!r} is kind nats: pip install 'kairos-inference[streams]'"
            ) from None
        try:
            connection = await nats.connect(self.spec.url, connect_timeout=5,
                                            max_reconnect_attempts=2)  # fmt: skip
            jetstream = connection.jetstream()
            name = await jetstream.find_stream_name_by_subject(self.spec.stream)
            try:
                await jetstream.consumer_info(name, self.spec.group)
            except nats.js.errors.NotFoundError:
                config = nats.js.api.ConsumerConfig(
                    durable_name=self.spec.group, filter_subject=self.spec.stream,
                    ack_wait=self.spec.claim_after, max_ack_pending=self.spec.batch * 4,
                )  # fmt: skip
                await jetstream.add_consumer(name, config)
            inbox = connection.new_inbox()
            await connection.subscribe(f"{inbox}.*", cb=self._arrived)
        except Exception as error:  # nats-py's errors share no base class with OSError
            raise self._unavailable(error) from None
        self._connection, self._jetstream = connection, jetstream
        self._stream_name, self._inbox = name, inbox

    async def _arrived(self, msg: Any) -> None:
        if not msg.subject.startswith(self._inbox):  # a message, under its stream subject
            self._delivered.append(msg)
            if len(self._delivered) >= self._until:
                self._over.set()
            return
        status = (msg.headers or {}).get("Status", "")
        if msg.subject != self._reply or status == "100":
            return  # the end of a pull whose read gave up, or a heartbeat
        if status not in _ENDS:
            description = (msg.headers or {}).get("Description", "")
            self._failure = f"JetStream answered a pull with {status} {description}"
        self._over.set()

    async def _pull(self, request: dict[str, Any], deadline: float) -> None:
        """Ask for `request["batch"]` messages; wait until they came, the pull ended or the
        deadline passed."""
        self._pulls += 1
        self._reply = f"{self._inbox}.{self._pulls}"
        self._until = len(self._delivered) + request["batch"]
        self._over = asyncio.Event()
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self._stream_name}.{self.spec.group}"
        try:
            await self._connection.publish(subject, json.dumps(request).encode(), self._reply)
        except Exception as error:
            raise self._unavailable(error) from None
        with contextlib.suppress(TimeoutError):  # nothing came in time: an empty read
            async with asyncio.timeout_at(deadline):
                await self._over.wait()
        if self._failure:
            failure, self._failure = self._failure, ""
            raise self._unavailable(RuntimeError(failure))

    async def read(self, count: int, timeout: float) -> list[Message]:
        await self._connected()
        timeout = max(timeout, 0.001)
        deadline = asyncio.get_running_loop().time() + timeout + _LATE
        if len(self._delivered) < count:  # what is there now, at once
            await self._pull({"batch": count - len(self._delivered), "no_wait": True}, deadline)
        # The server said nothing is there: wait for one, on a pull that expires before the
        # read gives up. (No answer at all: it holds the pull at max ack pending, or it has
        # no such consumer.)
        if not self._delivered and self._over.is_set():
            await self._pull({"batch": 1, "expires": int(timeout * 1e9)}, deadline)
        taken, self._delivered = self._delivered[:count], self._delivered[count:]
        return [
            Message(
                str(msg.metadata.sequence.stream),
                bytes(msg.data),
                {"subject": msg.subject, "headers": dict(msg.headers or {})},
                msg,
            )
            for msg in taken
        ]

    async def ack(self, messages: Sequence[Message]) -> None:
        try:
            for message in messages:
                await message.handle.ack()
        except Exception as error:
            raise self._unavailable(error) from None

    async def dead_letter(self, message: Message, reason: str) -> None:
        await self._connected()
        try:
            headers = {"Kairos-Reason": reason[:2000].replace("\n", " "),
                       "Kairos-Id": message.id}  # fmt: skip
            await self._connection.publish(self.spec.dead, message.body, headers=headers)
            await self._connection.flush()
            await message.handle.term()
        except Exception as error:
            raise self._unavailable(error) from None

    async def redeliver(self) -> None:
        return None  # JetStream delivers what was not acknowledged again after its ack wait

    async def lag(self) -> int | None:
        await self._connected()
        try:
            info = await self._jetstream.consumer_info(self._stream_name, self.spec.group)
        except Exception:
            return None
        return int(info.num_pending) if info.num_pending is not None else None

    async def close(self) -> None:
        if self._connection is not None:  # what was taken and not acknowledged comes again
            await self._connection.close()
            self._connection = self._jetstream = None
            self._delivered = []
