"""The gateway in process: keys, routing, the accounting step and the ledger behind calls in
the OpenAI wire format. The HTTP app is a thin layer over this; code in the same process (the
feature graph's LLM resolvers) calls it directly with no HTTP hop:

>>> gateway = Gateway(GatewayConfig.load("."))  # doctest: +SKIP
>>> plain, key = await gateway.create_key(name="features", models=["chat"])  # doctest: +SKIP
>>> reply = await gateway.chat(key, {"model": "chat", "messages": [...]})  # doctest: +SKIP

Every generating call, on every route, goes through `_dispatch` and its `Call` (calls.py),
which holds before and settles after each attempt. `count_tokens` generates nothing: it asks
its provider itself, after a hold that counts it against the key's rpm, and is logged as a
Call's rows are (route count_tokens, no tokens, no cost). A streamed answer is a `Stream`
(wire/streams.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

from kairos import telemetry
from kairos.gateway.accounting.accountant import PROCESS, Accountant
from kairos.gateway.accounting.counters import Counters
from kairos.gateway.accounting.ledger import LedgerRow, LedgerWriter
from kairos.gateway.accounting.prices import Price
from kairos.gateway.accounting.recovery import recover
from kairos.gateway.accounting.shares import SharedCounters
from kairos.gateway.calls import Call
from kairos.gateway.config import GatewayConfig, ProviderConfig
from kairos.gateway.errors import (
    GatewayConfigError,
    GatewayError,
    InvalidRequest,
    ModelNotAllowed,
    Unauthenticated,
    UpstreamError,
)
from kairos.gateway.keys import KeyRecord, key_id, key_spec, new_key
from kairos.gateway.providers.anthropic import AnthropicProvider
from kairos.gateway.providers.base import Provider
from kairos.gateway.providers.openai_compatible import OpenAICompatible
from kairos.gateway.providers.router import Router
from kairos.gateway.providers.scrub import Secrets
from kairos.gateway.store import counters_from_url, registry_from_url
from kairos.gateway.store.registry import Registry
from kairos.gateway.tracing import traced_call
from kairos.gateway.wire import openai
from kairos.gateway.wire.messages import count_request, tokenizer_count
from kairos.gateway.wire.responses import check_responses
from kairos.gateway.wire.streams import Stream

logger = logging.getLogger(__name__)


def provider_for(config: ProviderConfig) -> Provider:
    """The provider serving `config`: Anthropic's API by its own adapter, anything else as
    OpenAI-compatible."""
    if config.unset_key_env:
        raise GatewayConfigError(
            f"provider {config.name!r}: its api_key_env names {config.unset_key_env}, which is "
            "not set in the environment; set it (commands that call no provider do not need it)"
        )
    if config.kind == "anthropic":
        return AnthropicProvider(config)
    return OpenAICompatible(config)


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
        telemetry.from_environment()  # OTEL_TRACES_EXPORTER and friends, once per process
        self.registry = registry or registry_from_url(config.registry)
        self.counters = counters or counters_from_url(config.counters)
        if providers is None:
            providers = {n: provider_for(p) for n, p in config.providers.items()}
        self.providers = providers
        self.router = Router(config)
        self.secrets = Secrets.of(config)  # masked in every text that leaves (providers/scrub.py)
        # holds are served from budget shares in memory while a key has room (accounting/shares.py)
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
        processes that died (accounting/recovery.py). Once; the first call waits for it (the
        HTTP app runs it as it starts)."""
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

    async def update_key(self, ident: str, /, **spec: Any) -> KeyRecord | None:
        """Give an active key the allow-list (`models`) and `budgets` of admin fields, keeping
        its id, so its counters go on counting; None when no active key has that id."""
        checked = key_spec({"name": "update", **spec})
        done = await self.registry.update_key(ident, checked["models"], checked["budgets"])
        self._keys.pop(ident, None)
        self._verified = {t: hit for t, hit in self._verified.items() if hit[1].id != ident}
        return await self.registry.get_key(ident) if done else None

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

    async def chat(
        self, key: KeyRecord | str, body: dict[str, Any], *, served: dict[str, Any] | None = None
    ) -> dict[str, Any] | Stream:
        """A chat completion (OpenAI shape); a Stream when `body["stream"]` is true. A
        `served` dict is filled with the request id, provider, deployment and attempts of the
        attempt that answered, and `cost` (usage -> micro-dollars at its price): what a
        decision record keeps."""
        model, stream, wanted, parts = openai.check_chat(body, self.config.default_max_tokens)
        return await self._dispatch(
            key, "chat", "chat", body, model, stream, wanted, parts, openai.choices(body),
            served=served,
        )  # fmt: skip

    async def completion(
        self, key: KeyRecord | str, body: dict[str, Any]
    ) -> dict[str, Any] | Stream:
        model, stream, wanted, prompts = openai.check_completion(body)
        answers = prompts * openai.choices(body)  # n answers to each prompt
        return await self._dispatch(
            key, "completion", "completion", body, model, stream, wanted, prompts, answers
        )

    async def embedding(self, key: KeyRecord | str, body: dict[str, Any]) -> dict[str, Any]:
        model, parts = openai.check_embedding(body)
        reply = await self._dispatch(key, "embedding", "embedding", body, model, False, 0, parts)
        if isinstance(reply, Stream):  # a call that is not streamed answers whole
            raise TypeError("an embedding call returned a stream")
        return reply

    async def responses(
        self, key: KeyRecord | str, body: dict[str, Any]
    ) -> dict[str, Any] | Stream:
        """A Responses API call (OpenAI shape, OpenAI-kind deployments only); a ResponseStream
        of its typed events when `body["stream"]` is true."""
        model, stream, wanted, parts = check_responses(body, self.config.default_max_tokens)
        return await self._dispatch(
            key, "responses", "responses", body, model, stream, wanted, parts
        )

    async def messages_chat(
        self, key: KeyRecord | str, chat_body: dict[str, Any]
    ) -> dict[str, Any] | Stream:
        """A /v1/messages call, already translated to a chat body; logged as route messages."""
        model, stream, wanted, parts = openai.check_chat(
            chat_body, self.config.default_max_tokens, stop_field="stop_sequences"
        )
        if stream:
            chat_body = {**chat_body, "stream_options": {"include_usage": True}}
        return await self._dispatch(
            key, "chat", "messages", chat_body, model, stream, wanted, parts
        )

    async def count_tokens(self, key: KeyRecord | str, body: dict[str, Any]) -> int:
        """Input tokens of a /v1/messages request (Anthropic's count_tokens), counted by the
        model's first deployment the key may use (`Provider.count_tokens`: Anthropic's by its
        endpoint, another by the model's own tokenizer). Not billed, but a request like any
        other for the key's rpm, and logged (route count_tokens, no tokens, no cost)."""
        record = key if isinstance(key, KeyRecord) else await self.authenticate(key)
        if not self._started:
            await self.start()
        chat = count_request(body)
        call = Call(self, record, "count_tokens", "count_tokens", chat["model"], chat, False, 0, 0)
        try:
            group = self.router.group_of(chat["model"])
            deployments = self.router.candidates(group, record.allows)
            if not self.router.reachable(group, record.allows):
                raise ModelNotAllowed(
                    f"key {record.id!r} may not use model {chat['model']!r}; GET /v1/models "
                    "lists the models it may use",
                    param="model",
                )
            if not deployments:
                raise UpstreamError(
                    f"every deployment of model {chat['model']!r} is failing; retry shortly",
                    status=503,
                )
            deployment = deployments[0]
            # only the rpm applies: nothing is generated, and counting is not billed
            requests_only = dataclasses.replace(record, budgets=(), tpm=None)
            hold = await self.accountant.hold(requests_only, Price(0, 0), 0, 0)
            await self.accountant.settle(hold, None, accepted=False)
            call.attempts = 1
            upstream = {**body, "model": deployment.model}
            provider = self.providers[deployment.provider]
            tokens = await provider.count_tokens(upstream, deployment.timeout)
            if tokens is None:  # no count endpoint: the model's own tokenizer
                tokens = tokenizer_count(upstream)
        except GatewayError as error:
            self.secrets.scrub_error(error)  # whatever provider built it, no credential leaves
            call.log(None, None, error.code)
            raise
        call.log(deployment, provider, "ok")
        return tokens

    async def _dispatch(
        self,
        key: KeyRecord | str,
        kind: str,
        route: str,
        body: dict[str, Any],
        model: str,
        stream: bool,
        wanted: int,
        messages: int,
        answers: int = 1,
        *,
        served: dict[str, Any] | None = None,
    ) -> dict[str, Any] | Stream:
        """`messages`: the parts of the input framed as messages (chat messages, prompts)."""
        record = key if isinstance(key, KeyRecord) else await self.authenticate(key)
        if not self._started:
            await self.start()
        call = Call(
            self, record, kind, route, model, body, stream, wanted, messages, answers, served
        )
        try:
            if telemetry.TRACER is None:
                return await call.run()
            return await traced_call(call, call.run())
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
