"""The gateway in process: keys, routing, the accounting step and the ledger behind calls in
the OpenAI wire format. The HTTP app is a thin layer over this; code in the same process (the
feature graph's LLM resolvers) calls it directly with no HTTP hop:

>>> gateway = Gateway(GatewayConfig.load("."))  # doctest: +SKIP
>>> plain, key = await gateway.create_key(name="features", models=["chat"])  # doctest: +SKIP
>>> reply = await gateway.chat(key, {"model": "chat", "messages": [...]})  # doctest: +SKIP

Every call, on every route, goes through `_dispatch`: the only code that talks to a provider,
and it holds before and settles after each attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from kairos.gateway import requests, sse
from kairos.gateway.accounting import (
    PROCESS,
    Accountant,
    Hold,
    Settlement,
    check_bounded,
    input_bound,
    key_reset,
    new_id,
    parts_bound,
)
from kairos.gateway.anthropic import AnthropicProvider, chat_tokens, count_request
from kairos.gateway.config import Deployment, GatewayConfig
from kairos.gateway.counters import Counters, counters_from_url
from kairos.gateway.errors import (
    BudgetExceeded,
    GatewayError,
    InvalidRequest,
    ModelNotAllowed,
    PriceUnknown,
    Unauthenticated,
    UnsupportedRoute,
    UpstreamError,
)
from kairos.gateway.keys import KeyRecord, key_id, key_spec, new_key
from kairos.gateway.ledger import LedgerRow, LedgerWriter
from kairos.gateway.prices import Price
from kairos.gateway.providers import (
    RESPONSE_ENDS,
    Provider,
    Usage,
    chunk_usage,
    openai_usage,
    provider_for,
)
from kairos.gateway.recovery import recover
from kairos.gateway.registry import Registry, registry_from_url
from kairos.gateway.responses import check_responses, error_event, event_usage, response_usage
from kairos.gateway.router import Router
from kairos.gateway.scrub import Secrets
from kairos.gateway.shares import SharedCounters

logger = logging.getLogger(__name__)

_FREE = Price(0, 0)  # an unpriced model, for keys without a USD budget
# the field a capped call's output limit goes in when the client sent none (chat: the
# provider's `token_field`); a client's own field is kept, lowered to the cap
_TOKEN_FIELD = {"chat": "max_completion_tokens", "completion": "max_tokens"}
_OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens")


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
        settle_after: float = 0.0,
        secrets: Secrets | None = None,
        deadline: float | None = None,
    ) -> None:
        self.request_id = request_id
        self._ends_by = deadline  # loop time the attempt must end by, the stream included
        self._settle_after = settle_after
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
            # settling and logging are not the client's to wait for: the reader writes the last
            # frames first, and the client's next request is read and sent on first
            await asyncio.sleep(self._settle_after)
            await on_end(usage, status)

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


class Gateway:
    """Keys, budgets, routing, failover and the ledger in front of the configured providers."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        registry: Registry | None = None,
        counters: Counters | None = None,
        providers: dict[str, Provider] | None = None,
    ) -> None:
        self.config = config
        self.registry = registry or registry_from_url(config.registry)
        self.counters = counters or counters_from_url(config.counters)
        if providers is None:
            providers = {n: provider_for(p) for n, p in config.providers.items()}
        self.providers = providers
        self.router = Router(config)
        self.secrets = Secrets.of(config)  # masked in every text that leaves (scrub.py)
        # holds are served from budget shares in memory while a key has room (shares.py)
        self.shares = SharedCounters(self.counters, depth=config.budget_shares, lease=config.lease)
        self.accountant = Accountant(self.shares, lease=config.lease, settles=self._settles)
        self.ledger = LedgerWriter(self.registry)
        self._keys: dict[str, tuple[float, KeyRecord | None]] = {}
        # keys that matched lately, by a digest keyed with a secret of this process: a key in
        # use is checked against its peppered hash once per `key_cache`, not on every call
        self._verified: dict[bytes, tuple[float, KeyRecord]] = {}
        self._tag_key = os.urandom(32)
        self._rechecking: set[bytes] = set()
        self._revocations = 0  # revokes through this process (a recheck begun before loses)
        self._tasks: set[asyncio.Future[Any]] = set()
        self._started = False  # marked alive in the registry, dead processes recovered
        self._starting = asyncio.Lock()
        # per key: calls answered whose settling is deferred (`settle_after`), not done yet
        self._due: dict[str, set[asyncio.Future[None]]] = {}
        # seconds between an answer's last byte and its settling and logging. An HTTP server
        # sets a few ms: the same client's next request is then read and sent upstream before
        # that work, which would otherwise run first (on a keep-alive connection, requests
        # follow at once). In process, 0: a sync caller's loop may not run again soon.
        self.settle_after = 0.0
        # called with each ledger row as it is written (the HTTP app's metrics listen here)
        self.observers: list[Callable[[LedgerRow], None]] = []

    async def start(self) -> None:
        """Mark this process alive in the registry, then recover the calls of gateway
        processes that died (recovery.py). Once; the first call waits for it (the HTTP app
        runs it as it starts)."""
        async with self._starting:
            if self._started:
                return
            await self.registry.attach(PROCESS)
            try:
                since = datetime.now(UTC) - timedelta(seconds=2 * self.config.lease + 60)
                await recover(self.registry, self.counters, since=since)
            except Exception as error:  # never keeps calls out; the next gateway to start retries
                logger.error("recovering dead gateway processes failed: %s", error)
            self._started = True

    # --- keys ----------------------------------------------------------------------------

    async def create_key(self, /, **spec: Any) -> tuple[str, KeyRecord]:
        """Create a key from admin fields (name, models, rpm, tpm, budgets, expires_at);
        returns (the full key, shown once; its record)."""
        if not self.config.pepper:
            raise InvalidRequest("the gateway has no pepper: set gateway.pepper_env", param=None)
        plain, record = new_key(self.config.pepper, **key_spec(spec))
        await self.registry.put_key(record)
        return plain, record

    async def list_keys(self) -> list[KeyRecord]:
        return await self.registry.list_keys()

    async def revoke_key(self, ident: str) -> bool:
        done = await self.registry.revoke_key(ident, datetime.now(UTC))
        self._revocations += 1
        self._keys.pop(ident, None)
        self._verified = {t: hit for t, hit in self._verified.items() if hit[1].id != ident}
        return done

    async def authenticate(self, presented: str | None) -> KeyRecord:
        """The active key record for a presented key. Errors never repeat the key."""
        if not presented:
            raise Unauthenticated(
                "send your gateway key as `Authorization: Bearer <key>` (or `x-api-key`)"
            )
        now = time.monotonic()
        # nobody can aim at an entry (the tag is keyed), so the lookup's timing tells nothing
        tag = hashlib.blake2b(presented.encode(), key=self._tag_key, digest_size=32).digest()
        hit = self._verified.get(tag)
        if hit is not None and now - hit[0] < self.config.key_cache:
            record = hit[1]
            if now - hit[0] > self.config.key_cache / 2 and tag not in self._rechecking:
                # a key in use is checked again ahead of time, off the calls' path
                self._rechecking.add(tag)
                self._spawn(self._recheck(tag, presented, self._revocations))
        else:
            ident = key_id(presented)
            found = await self._record(ident) if ident else None
            # the digest is computed even for an unknown id, so timing says nothing about ids
            matches = (found or _NOBODY).matches(self.config.pepper, presented)
            if found is None or not matches:
                raise Unauthenticated("the key is not valid; check it or ask for a new one")
            record = found
            if len(self._verified) > 4096:
                self._verified = {
                    t: h for t, h in self._verified.items() if now - h[0] < self.config.key_cache
                }
            self._verified[tag] = (now, record)
        if not record.active(datetime.now(UTC)):
            raise Unauthenticated(f"key {record.id!r} is revoked or expired; ask for a new one")
        return record

    async def _recheck(self, tag: bytes, presented: str, revocations: int) -> None:
        """Read a remembered key's record again and check it, as a call would once the entry
        is `key_cache` old; a revoke meanwhile in this process wins."""
        try:
            ident = key_id(presented)
            if ident is None:  # cannot be: the key matched before
                return
            record = await self.registry.get_key(ident)
            now = time.monotonic()
            if revocations != self._revocations:
                return
            self._keys[ident] = (now, record)
            if record is not None and record.matches(self.config.pepper, presented):
                self._verified[tag] = (now, record)
            else:
                self._verified.pop(tag, None)
        finally:
            self._rechecking.discard(tag)

    async def _record(self, ident: str) -> KeyRecord | None:
        now = time.monotonic()
        cached = self._keys.get(ident)
        if cached is not None and now - cached[0] < self.config.key_cache:
            return cached[1]
        record = await self.registry.get_key(ident)
        self._keys[ident] = (now, record)
        return record

    def models(self, key: KeyRecord) -> list[str]:
        """Model groups and aliases the key may call."""
        names = [name for name in self.config.models if key.allows(name)]
        names += [alias for alias, group in self.config.aliases.items() if key.allows(group)]
        return names

    async def usage(
        self, key: str | None = None, since: datetime | None = None, until: datetime | None = None
    ) -> list[LedgerRow]:
        if not self._started:
            await self.start()
        await self.drain()
        await self.ledger.flush()
        return await self.registry.read_rows(key, since, until)

    # --- calls ---------------------------------------------------------------------------

    async def chat(self, key: KeyRecord | str, body: dict[str, Any]) -> dict[str, Any] | Stream:
        """A chat completion (OpenAI shape); a Stream when `body["stream"]` is true."""
        model, stream, wanted, parts = requests.check_chat(body, self.config.default_max_tokens)
        bound = input_bound(requests.input_bytes(body), parts)
        return await self._dispatch(
            key, "chat", "chat", body, model, stream, wanted, bound, requests.choices(body)
        )

    async def completion(
        self, key: KeyRecord | str, body: dict[str, Any]
    ) -> dict[str, Any] | Stream:
        model, stream, wanted, prompts = requests.check_completion(body)
        bound = input_bound(requests.input_bytes(body), prompts)
        answers = prompts * requests.choices(body)  # n answers to each prompt
        return await self._dispatch(
            key, "completion", "completion", body, model, stream, wanted, bound, answers
        )

    async def embedding(self, key: KeyRecord | str, body: dict[str, Any]) -> dict[str, Any]:
        model, parts = requests.check_embedding(body)
        bound = input_bound(requests.input_bytes(body), parts)
        reply = await self._dispatch(key, "embedding", "embedding", body, model, False, 0, bound)
        if isinstance(reply, Stream):  # a call that is not streamed answers whole
            raise TypeError("an embedding call returned a stream")
        return reply

    async def responses(
        self, key: KeyRecord | str, body: dict[str, Any]
    ) -> dict[str, Any] | Stream:
        """A Responses API call (OpenAI shape, OpenAI-kind deployments only); a ResponseStream
        of its typed events when `body["stream"]` is true."""
        model, stream, wanted, parts = check_responses(body, self.config.default_max_tokens)
        bound = input_bound(requests.input_bytes(body), parts)
        return await self._dispatch(
            key, "responses", "responses", body, model, stream, wanted, bound
        )

    async def messages_chat(
        self, key: KeyRecord | str, chat_body: dict[str, Any]
    ) -> dict[str, Any] | Stream:
        """A /v1/messages call, already translated to a chat body; logged as route messages."""
        model, stream, wanted, parts = requests.check_chat(
            chat_body, self.config.default_max_tokens
        )
        if stream:
            chat_body = {**chat_body, "stream_options": {"include_usage": True}}
        bound = input_bound(requests.input_bytes(chat_body), parts)
        return await self._dispatch(
            key, "chat", "messages", chat_body, model, stream, wanted, bound
        )

    async def count_tokens(self, key: KeyRecord | str, body: dict[str, Any]) -> int:
        """Input tokens of a /v1/messages request (Anthropic's count_tokens), not billed: the
        model's first deployment the key may use counts them, Anthropic's by its provider,
        another here when kairos has the model's own tokenizer (else a 400)."""
        record = key if isinstance(key, KeyRecord) else await self.authenticate(key)
        chat = count_request(body)
        group = self.router.group_of(chat["model"])
        deployments = self.router.candidates(group, record.allows)
        if not self.router.reachable(group, record.allows):
            raise ModelNotAllowed(
                f"key {record.id!r} may not use model {chat['model']!r}; GET /v1/models lists "
                "the models it may use",
                param="model",
            )
        if not deployments:
            raise UpstreamError(
                f"every deployment of model {chat['model']!r} is failing; retry shortly", status=503
            )
        deployment = deployments[0]
        provider = self.providers[deployment.provider]
        if isinstance(provider, AnthropicProvider):
            upstream = {**body, "model": deployment.model}
            return await provider.count_tokens(upstream, deployment.timeout)
        return chat_tokens(chat, deployment.model)

    async def _dispatch(
        self,
        key: KeyRecord | str,
        kind: str,
        route: str,
        body: dict[str, Any],
        model: str,
        stream: bool,
        wanted: int,
        bound: int,
        answers: int = 1,
    ) -> dict[str, Any] | Stream:
        record = key if isinstance(key, KeyRecord) else await self.authenticate(key)
        if not self._started:
            await self.start()
        call = _Call(self, record, kind, route, model, body, stream, wanted, bound, answers)
        try:
            return await call.run()
        except GatewayError as error:
            self.secrets.scrub_error(error)  # whatever provider built it, no credential leaves
            call.log(None, None, error.code)
            raise

    async def drain(self) -> None:
        """Wait until every call this gateway answered is settled and logged."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.shares.release()  # the counters then hold exactly what calls used

    def _spawn(self, work: Awaitable[Any]) -> None:
        self._track(asyncio.ensure_future(work))

    def _after_answer(self, key_id: str, work: Coroutine[Any, Any, None]) -> None:
        """Settling and logging a whole answer: `settle_after` once it is sent, in a task of
        its own that `drain()` waits for."""
        self._spawn(self._deferred(key_id, work))

    async def _deferred(self, key_id: str, work: Coroutine[Any, Any, None]) -> None:
        """`work` (an answered call's settling) `settle_after` from now; a hold of the same
        key refused meanwhile waits for it (`_settles`)."""
        done = asyncio.get_running_loop().create_future()
        due = self._due.setdefault(key_id, set())
        due.add(done)
        try:
            await asyncio.sleep(self.settle_after)
            await work
        finally:
            due.discard(done)
            if not due and self._due.get(key_id) is due:
                del self._due[key_id]
            done.set_result(None)

    async def _settles(self, key_id: str) -> bool:
        """Wait until the key's answered calls are settled (and the budget shares they gave
        back to are returned to the store); False when none was due."""
        due = self._due.get(key_id)
        if not due:
            return False
        await asyncio.wait(list(due))
        await self.shares.returned()
        return True

    def _track(self, task: asyncio.Future[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            error = task.exception()
            text = self.secrets.scrub(str(error))
            logger.error("settling a call failed: %s: %s", type(error).__name__, text)

    async def close(self) -> None:
        """Wait for calls still settling, write the ledger, close stores and providers."""
        await self.drain()
        await self.ledger.close()
        for provider in self.providers.values():
            await provider.close()
        await self.shares.close()  # gives back what shares reserved, closes the counters
        if self._started:  # all settled and logged: nothing for another gateway to recover
            await self.registry.detach(PROCESS)
        await self.registry.close()


_NOBODY = KeyRecord(id="", name="", secret_hash="0" * 64, created_at=datetime.now(UTC))


class _Call:
    """One request through the gateway: attempts in route order, each held and settled."""

    def __init__(
        self,
        gateway: Gateway,
        key: KeyRecord,
        kind: str,
        route: str,
        model: str,
        body: dict[str, Any],
        stream: bool,
        wanted: int,
        bound: int,
        answers: int = 1,
    ) -> None:
        self.gateway = gateway
        self.answers = answers  # n, and each prompt of a completion: the hold covers them all
        self.parts = requests.input_parts(body)  # bounded per deployment (images per model)
        self.key = key
        self.kind = kind
        self.route = route
        self.model = model
        self.body = body
        self.stream = stream
        self.wanted = wanted
        self.bound = bound
        self.request_id = new_id()
        self.started = time.perf_counter()
        self.created_at = datetime.now(UTC)
        self.attempts = 0
        self.cost = self.tokens_in = self.tokens_out = 0
        self.tokens_cached = self.tokens_cache_write = self.uncharged = 0
        self.deployment: Deployment | None = None
        self.hold_id: str | None = None  # the store hold carrying the last attempt's
        self.ttft: float | None = None

    async def run(self) -> dict[str, Any] | Stream:
        gateway, key = self.gateway, self.key
        router = gateway.router
        group = router.group_of(self.model)
        if not router.reachable(group, key.allows):
            raise ModelNotAllowed(
                f"key {key.id!r} may not use model {self.model!r} (nor any of its fallbacks); "
                "GET /v1/models lists the models it may use",
                param="model",
            )
        check_bounded(self.parts, key)
        candidates = router.candidates(group, key.allows)
        last: GatewayError | None = None
        tried = 0
        for deployment in candidates:
            if tried > gateway.config.retries:
                break
            provider = gateway.providers[deployment.provider]
            if self.kind not in provider.kinds:
                last = UnsupportedRoute(
                    f"model {self.model!r} has no deployment that serves {self.kind} calls",
                    param="model",
                )
                continue
            if isinstance(provider, AnthropicProvider):
                try:  # before any hold: a field Anthropic cannot take is a 400, never dropped
                    provider.check(self.kind, self.body)
                except InvalidRequest as error:
                    last = error
                    continue
            price = deployment.price or gateway.config.prices.get(deployment.model)
            if price is None:
                if any(b.usd_micros is not None for b in key.budgets):
                    last = PriceUnknown(
                        f"no price for {deployment.model!r}, and key {key.id!r} has a USD "
                        "budget; add the model under gateway.prices",
                        param="model",
                    )
                    continue
                price = _FREE
            if not router.acquire(deployment):
                continue
            tried += 1
            try:
                bound = self.bound + parts_bound(self.parts, deployment.model)
                hold = await gateway.accountant.hold(key, price, bound, self.wanted * self.answers)
                if self.wanted and hold.max_tokens < self.answers:  # not a token for each
                    await gateway.accountant.settle(hold, None, accepted=False)
                    raise BudgetExceeded(
                        f"key {key.id!r} has too little budget left for {self.answers} answers; "
                        "send fewer prompts or lower max_tokens",
                        retry_after=key_reset(key, gateway.accountant.clock()),
                    )
                if self.kind == "responses" and hold.max_tokens < min(self.wanted, 16):
                    # OpenAI refuses a max_output_tokens below 16: a cap clamped under it is
                    # a budget too small for this call, not the client's bad request
                    await gateway.accountant.settle(hold, None, accepted=False)
                    raise BudgetExceeded(
                        f"key {key.id!r} has too little budget left for 16 output tokens (the "
                        "least max_output_tokens the Responses API takes); shorten the input "
                        "or raise the budget",
                        retry_after=key_reset(key, gateway.accountant.clock()),
                    )
            except BaseException:
                router.finished(deployment, "neutral", 0.0)
                raise
            try:
                return await self._attempt(deployment, provider, hold)
            except UpstreamError as error:
                if not error.retryable:
                    raise
                last = error
        raise last or UpstreamError(
            f"every deployment of model {self.model!r} is failing (circuits open); retry shortly",
            status=503,
        )

    def _upstream_body(self, deployment: Deployment, hold: Hold) -> dict[str, Any]:
        body = {**self.body, "model": deployment.model}
        if self.kind in _TOKEN_FIELD:
            self._cap(body, deployment, hold.max_tokens // self.answers)
        elif self.kind == "responses" and (self.key.caps_output or "max_output_tokens" in body):
            body["max_output_tokens"] = hold.max_tokens  # the client's, or what budgets cover
        if self.kind != "responses":  # a Responses call's stream_options are the client's
            body.pop("stream_options", None)
        return body

    def _cap(self, body: dict[str, Any], deployment: Deployment, cap: int) -> None:
        """The client's output limits go as sent unless the call needs a cap: the key's
        budgets or tpm bound the output, or the provider requires one (Anthropic). A limit
        the client sent is then lowered to the cap in its own field (the model accepts that
        field); with none, the cap goes in the provider's field. /v1/messages' max_tokens is
        Anthropic's, not the client's OpenAI field: it always goes in the provider's."""
        provider = self.gateway.config.providers.get(deployment.provider)
        field = _TOKEN_FIELD[self.kind]
        if provider is not None and self.kind == "chat":
            field = provider.token_field
        if self.route == "messages":
            body.pop("max_tokens", None)
        elif not self.key.caps_output and (provider is None or provider.kind != "anthropic"):
            return  # nothing to bound: no limit is added (reasoning models refuse max_tokens)
        sent = [name for name in _OUTPUT_LIMITS if body.get(name) is not None]
        for name in sent:
            body[name] = min(body[name], cap)
        if not sent:
            body[field] = cap

    async def _attempt(
        self, deployment: Deployment, provider: Provider, hold: Hold
    ) -> dict[str, Any] | Stream:
        self.hold_id = self.gateway.shares.store_hold(hold.id)
        try:  # durable before the call leaves: a process killed now leaves this row behind
            await self.gateway.ledger.pending(self._pending_row(deployment, hold))
        except BaseException as error:
            self.gateway._spawn(self._settle(hold, None, accepted=False))
            self.gateway.router.finished(deployment, "neutral", 0.0)
            if not isinstance(error, GatewayError):  # _dispatch logs those
                self.log(deployment, provider, "client_disconnected")
            raise
        self.attempts += 1
        self.deployment = deployment
        body = self._upstream_body(deployment, hold)
        sent = time.perf_counter()
        ends_by = asyncio.get_running_loop().time() + deployment.deadline
        if not self.stream:
            try:
                async with asyncio.timeout_at(ends_by):
                    reply = await provider.send(self.kind, body, deployment.timeout)
            except TimeoutError:  # the attempt's deadline: the provider may have served it
                await self._settle(hold, None, accepted=True)
                self.gateway.router.finished(deployment, "failed", 0.0)
                raise UpstreamError(
                    f"provider {provider.name!r} did not answer within the deployment's "
                    f"deadline ({deployment.deadline:g}s)", status=504, accepted=True,
                    retryable=False,  # the attempt's time is spent, and it may be billed
                ) from None  # fmt: skip
            except UpstreamError as error:
                await self._settle(hold, None, accepted=error.accepted)
                self.gateway.router.finished(
                    deployment, "failed" if error.retryable else "neutral", 0.0
                )
                raise
            except BaseException:  # cancelled while waiting: the provider may have served it
                self.gateway._spawn(self._cut(hold, deployment, provider))
                self.gateway.router.finished(deployment, "neutral", 0.0)
                raise
            elapsed = time.perf_counter() - sent
            self.ttft = elapsed
            self.gateway.router.finished(deployment, "ok", elapsed)
            # the hold already covers the call: settling (which only gives back) and logging
            # need not delay the answer
            usage = response_usage(reply) if self.kind == "responses" else openai_usage(reply)
            self.gateway._after_answer(self.key.id, self._close(hold, usage, deployment, provider))
            return reply
        upstream = provider.stream(self.kind, body, deployment.timeout).__aiter__()
        try:
            wait = min(deployment.timeout, deployment.deadline)
            first = await asyncio.wait_for(upstream.__anext__(), wait)
        except (UpstreamError, TimeoutError, StopAsyncIteration) as error:
            with contextlib.suppress(Exception):
                await upstream.aclose()  # type: ignore[attr-defined]
            accepted = isinstance(error, UpstreamError) and error.accepted
            await self._settle(hold, None, accepted=accepted)
            self.gateway.router.finished(deployment, "failed", 0.0)
            if isinstance(error, UpstreamError):
                raise
            raise UpstreamError(
                f"provider {provider.name!r} sent nothing within {deployment.timeout:g}s",
                status=504,
                accepted=accepted,
            ) from None
        except BaseException:  # cancelled while waiting: the provider may have served it
            self.gateway._spawn(self._cut(hold, deployment, provider))
            self.gateway.router.finished(deployment, "neutral", 0.0)
            raise
        self.ttft = time.perf_counter() - sent

        async def ended(usage: Usage | None, status: str) -> None:
            await self._settle(hold, usage, accepted=True)
            outcome = "failed" if status in ("upstream_error", "upstream_incomplete") else "ok"
            self.gateway.router.finished(deployment, outcome, time.perf_counter() - sent)
            self.log(deployment, provider, status)

        def on_end(usage: Usage | None, status: str) -> Awaitable[None]:
            # deferred like a whole answer's, and as visible to the key's next refused hold
            return self.gateway._deferred(self.key.id, ended(usage, status))

        options = self.body.get("stream_options") or {}
        responses = self.kind == "responses"  # its usage is in its last event, always sent
        result = (ResponseStream if responses else Stream)(
            first,
            upstream,
            include_usage=responses or bool(options.get("include_usage")),
            drain=self.gateway.config.stream_drain,
            on_end=on_end,
            request_id=self.request_id,
            secrets=self.gateway.secrets,
            deadline=ends_by,
        )
        self.gateway._track(result.task)
        return result

    async def _close(
        self, hold: Hold, usage: Usage | None, deployment: Deployment, provider: Provider
    ) -> None:
        await self._settle(hold, usage, accepted=True)
        self.log(deployment, provider, "ok")

    async def _cut(self, hold: Hold, deployment: Deployment, provider: Provider) -> None:
        """A call whose caller left while the provider had it: charged in full, as it may
        have been served."""
        await self._settle(hold, None, accepted=True)
        self.log(deployment, provider, "client_disconnected")

    def _pending_row(self, deployment: Deployment, hold: Hold) -> LedgerRow:
        """The row of the call as it is dispatched: what it cost so far plus the full hold,
        which is what the lease rule charges if its end is never logged."""
        return dataclasses.replace(
            self.row(deployment, "pending"),
            tokens_in=self.tokens_in + hold.input_tokens,
            tokens_out=self.tokens_out + hold.max_tokens,
            cost_micros=self.cost + hold.cost,
            ttft_ms=None,
            latency_ms=0.0,
            attempts=self.attempts + 1,
        )

    async def _settle(self, hold: Hold, usage: Usage | None, *, accepted: bool) -> Settlement:
        settlement = await self.gateway.accountant.settle(hold, usage, accepted=accepted)
        self.cost += settlement.cost_micros
        self.tokens_in += settlement.tokens_in
        self.tokens_out += settlement.tokens_out
        self.tokens_cached += settlement.tokens_cached
        self.tokens_cache_write += settlement.tokens_cache_write
        self.uncharged += settlement.uncharged_micros
        return settlement

    def log(self, deployment: Deployment | None, provider: Provider | None, status: str) -> None:
        row = self.row(deployment, status)
        self.gateway.ledger.add(row)
        for observe in self.gateway.observers:
            observe(row)

    def row(self, deployment: Deployment | None, status: str) -> LedgerRow:
        deployment = deployment or self.deployment
        return LedgerRow(
            request_id=self.request_id,
            key_id=self.key.id,
            route=self.route,
            model_requested=self.gateway.secrets.scrub(self.model),  # the client's own text
            model_dispatched=deployment.group if deployment else None,
            provider=deployment.provider if deployment else None,
            deployment=deployment.model if deployment else None,
            tokens_in=self.tokens_in,
            tokens_out=self.tokens_out,
            cost_micros=self.cost,
            price_version=self.gateway.config.prices.version,
            ttft_ms=self.ttft * 1000 if self.ttft is not None else None,
            latency_ms=(time.perf_counter() - self.started) * 1000,
            status=status,
            attempts=self.attempts,
            created_at=self.created_at,
            tokens_cached=self.tokens_cached,
            tokens_cache_write=self.tokens_cache_write,
            uncharged_micros=self.uncharged,
            hold_id=self.hold_id,
        )
