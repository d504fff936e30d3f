"""A streamed call's chunks as the client reads them: `Stream` for chat and completion
chunks, `ResponseStream` for the Responses API's typed events. The gateway's `Call` builds
one from the provider's first chunk; the HTTP app writes its frames."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from kairos.gateway.accounting.accountant import Usage
from kairos.gateway.errors import UpstreamError
from kairos.gateway.providers.base import RESPONSE_ENDS, chunk_usage
from kairos.gateway.providers.scrub import Secrets
from kairos.gateway.wire.responses import error_event, event_usage
from kairos.http import sse


class Stream:
    """A streamed call's chunks as the client reads them: `async for chunk in stream` gives
    OpenAI chunk objects; `stream.frames()` gives the same as SSE frames, passed through as
    the provider sent them (no decoding and encoding per chunk).

    A task of its own reads the upstream, so a client that goes away does not stop it: the
    rest is read (at most `drain` seconds more) until the usage arrives, then the call is
    settled and logged. After the first chunk a failure arrives as a final `{"error": ...}`.
    """

    def __init__(
        self,
        first: bytes,
        upstream: AsyncIterator[bytes],
        *,
        include_usage: bool,
        drain: float,
        on_end: Callable[[Usage | None, str], Awaitable[None]],
        request_id: str,
        secrets: Secrets | None = None,
        deadline: float | None = None,
    ) -> None:
        self.request_id = request_id
        self._ends_by = deadline  # loop time the attempt must end by, the stream included
        self._secrets = secrets or Secrets(())
        self.include_usage = include_usage
        self._drain = drain
        # what the pump read and the reader has not taken yet; None marks the end
        self._arrived: list[bytes | dict[str, Any] | None] = []
        self._waiter: asyncio.Future[None] | None = None
        self._client_gone = False
        self.delivered = False  # the client read every chunk
        self.upstream_failed = False  # the provider ended the stream with a failure event
        self._deadline: asyncio.Timeout | None = None
        self.task = asyncio.get_running_loop().create_task(self._pump(first, upstream, on_end))

    async def _pump(
        self,
        first: bytes,
        upstream: AsyncIterator[bytes],
        on_end: Callable[[Usage | None, str], Awaitable[None]],
    ) -> None:
        usage = self._usage(first)
        status = "ok"
        arrive = self._arrive
        scrub = self._secrets.scrub  # a provider may quote the key it was sent in any event
        arrive(scrub(first))
        try:
            async with asyncio.timeout_at(self._ends_by) as deadline:
                self._deadline = deadline
                if self._client_gone:
                    self._cut_after(self._drain)
                async for chunk in upstream:
                    usage = self._usage(chunk) or usage
                    if not self._client_gone:
                        arrive(scrub(chunk))
        except UpstreamError as error:
            status = error.code  # upstream_error; upstream_incomplete for a stream cut short
            message = scrub(error.message)
            arrive({"error": {"message": message, "type": error.kind, "code": error.code}})
        except TimeoutError:
            if self._client_gone:
                status = "drain_timeout"
            else:  # the attempt's deadline: the client is told, the call billed in full
                status = "deadline_exceeded"
                arrive({"error": {"message": "the provider's stream ran past the deployment's "
                                  "deadline", "type": "api_error", "code": status}})  # fmt: skip
        except Exception as error:  # never leave the client or the hold hanging
            status = "internal_error"
            arrive(
                {"error": {"message": f"internal error ({type(error).__name__})",
                           "type": "api_error", "code": "internal_error"}}
            )  # fmt: skip
        finally:
            with contextlib.suppress(Exception):
                await upstream.aclose()  # type: ignore[attr-defined]
            arrive(None)
            if self._client_gone and status == "ok":
                status = "client_disconnected"
            if self.upstream_failed and status == "ok":
                status = "upstream_error"
            await on_end(usage, status)  # deferred by the gateway (`Gateway._deferred`)

    def _usage(self, chunk: bytes) -> Usage | None:
        """The usage a chunk carries (an OpenAI chat or completion chunk's)."""
        return chunk_usage(chunk)

    def _arrive(self, item: bytes | dict[str, Any] | None) -> None:
        self._arrived.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def client_left(self) -> None:
        """The client is gone: read on only until the usage arrives or `drain` runs out."""
        self._client_gone = True
        self._cut_after(self._drain)
        waiter = self._waiter  # a reader waiting for chunks stops
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _cut_after(self, seconds: float) -> None:
        """Stop reading the upstream in `seconds` (or at the attempt's deadline, if sooner)."""
        if self._deadline is not None:
            when = asyncio.get_running_loop().time() + seconds
            self._deadline.reschedule(when if self._ends_by is None else min(when, self._ends_by))

    def _hidden(self, chunk: bytes) -> bool:
        """The usage-only chunk the gateway asked for when the client did not."""
        if self.include_usage or chunk_usage(chunk) is None:
            return False
        return not orjson.loads(chunk).get("choices")

    async def _batches(self) -> AsyncIterator[tuple[list[bytes | dict[str, Any]], bool]]:
        """What has arrived, in batches (everything the pump read before the reader got to
        it), each with whether it is the last."""
        finished = False
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._arrived:
                    waiter = self._waiter = loop.create_future()
                    try:
                        await waiter
                    finally:
                        self._waiter = None
                    if self._client_gone:
                        return
                batch, self._arrived = self._arrived, []
                ended = batch[-1] is None
                items = [
                    item
                    for item in (batch[:-1] if ended else batch)
                    if item is not None and (isinstance(item, dict) or not self._hidden(item))
                ]
                if ended:
                    # before the last batch goes out: its reader may stop right after it
                    finished = self.delivered = True
                    yield items, True
                    return
                if items:
                    yield items, False
        finally:
            if not finished:
                self.client_left()

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        async for batch, _ in self._batches():
            for item in batch:
                if isinstance(item, dict):
                    yield item
                else:
                    chunk = orjson.loads(item)
                    if not self.include_usage:
                        chunk.pop("usage", None)
                    yield chunk

    async def frame_batches(self) -> AsyncIterator[tuple[bytes, bool]]:
        """Server-sent event frames, those that arrived together joined, each batch with
        whether it is the last (so a server can end the response in the same write); the
        last ends with `data: [DONE]` unless an error came first."""
        failed = False
        async for batch, last in self._batches():
            frames = []
            for item in batch:
                if isinstance(item, dict):
                    failed = True
                    frames.append(sse.encode(item))
                else:
                    frames.append(sse.frame(item))
            if last and not failed:
                frames.append(sse.DONE)
            yield b"".join(frames), last

    async def frames(self) -> AsyncIterator[bytes]:
        """Server-sent event frames (those that arrived together in one write), ending with
        `data: [DONE]` unless an error came first."""
        async for frames, _ in self.frame_batches():
            if frames:
                yield frames

    async def wait(self) -> None:
        """Until the upstream is read, the call settled and logged."""
        await asyncio.shield(self.task)


class ResponseStream(Stream):
    """A Responses API stream: its typed events (`event: response.output_text.delta`, ...),
    passed through as the provider sent them, ending with its last event (`response.completed`,
    `.incomplete` or `.failed`; no `[DONE]`), whose `response.usage` bills the call. A failure
    after the first event arrives as an `error` event; `response.failed` is logged as one."""

    _sequence = 0  # events given to the client: the next one's sequence_number

    def _usage(self, chunk: bytes) -> Usage | None:
        kind = sse.data_type(chunk)
        if kind not in RESPONSE_ENDS:
            return None
        self.upstream_failed = kind == "response.failed"
        return event_usage(chunk)

    def _frame(self, item: bytes | dict[str, Any]) -> bytes:
        if isinstance(item, dict):
            return sse.encode(error_event(item["error"], self._sequence), "error")
        self._sequence += 1
        kind = sse.data_type(item)
        # a type with a line break in it would start a frame of the provider's making
        named = kind is not None and kind.isprintable()
        return (f"event: {kind}\n".encode() if named else b"") + sse.frame(item)

    async def frame_batches(self) -> AsyncIterator[tuple[bytes, bool]]:
        async for batch, last in self._batches():
            yield b"".join([self._frame(item) for item in batch]), last

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        async for batch, _ in self._batches():
            for item in batch:
                if isinstance(item, dict):
                    yield error_event(item["error"], self._sequence)
                else:
                    self._sequence += 1
                    yield orjson.loads(item)
