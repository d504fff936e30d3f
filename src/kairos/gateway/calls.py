"""One request through the gateway: attempts in route order over the model's deployments,
each held before it is sent and settled after, with its ledger rows (pending as it leaves,
final when it ends). `Gateway._dispatch` runs one `Call` per request.

A call takes the gateway itself, not a few of its parts: it uses the router, providers,
accountant, budget shares, ledger, secrets, observers and the gateway's task bookkeeping
(deferred settling that `drain()` waits for). `CallContext` names those parts, so this module
need not import the gateway, which imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, Protocol

from kairos import telemetry
from kairos.gateway.accounting.accountant import (
    Accountant,
    Hold,
    Settlement,
    Usage,
    check_bounded,
    input_bound,
    key_reset,
    new_id,
    parts_bound,
)
from kairos.gateway.accounting.ledger import LedgerRow, LedgerWriter
from kairos.gateway.accounting.prices import Price
from kairos.gateway.accounting.shares import SharedCounters
from kairos.gateway.bounds import MAX_MODEL_NAME
from kairos.gateway.config import Deployment, GatewayConfig
from kairos.gateway.errors import (
    BudgetExceeded,
    GatewayError,
    InternalError,
    InvalidRequest,
    ModelNotAllowed,
    PriceUnknown,
    UnsupportedRoute,
    UpstreamError,
)
from kairos.gateway.keys import KeyRecord
from kairos.gateway.providers.base import Provider, openai_usage
from kairos.gateway.providers.router import Router
from kairos.gateway.providers.scrub import Secrets
from kairos.gateway.tracing import CallSpans, stream_ended, traced_attempt
from kairos.gateway.wire import openai
from kairos.gateway.wire.responses import response_usage
from kairos.gateway.wire.streams import ResponseStream, Stream

_FREE = Price(0, 0)  # an unpriced model, for keys without a USD budget
# the field a capped call's output limit goes in (chat: the provider's `token_field`)
_TOKEN_FIELD = {"chat": "max_completion_tokens", "completion": "max_tokens"}
_OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens")

logger = logging.getLogger(__name__)


def _skipped(last: GatewayError | None, error: GatewayError) -> GatewayError:
    """What a call fails with once a candidate is skipped: a provider's failure before it
    (the real one) is kept."""
    return last if isinstance(last, UpstreamError) else error


def _outcome(error: UpstreamError) -> str:
    """The breaker's view of a failed attempt: a provider refusing the request (a 400) is
    not failing."""
    return "failed" if error.retryable or error.accepted else "neutral"


class CallContext(Protocol):
    """What a call uses of the gateway running it (`Gateway` is one)."""

    config: GatewayConfig
    router: Router
    providers: dict[str, Provider]
    accountant: Accountant
    shares: SharedCounters
    ledger: LedgerWriter
    secrets: Secrets
    observers: list[Callable[[LedgerRow], None]]

    def _spawn(self, work: Awaitable[Any]) -> None: ...

    def _after_answer(self, key_id: str, work: Coroutine[Any, Any, None]) -> None: ...

    async def _deferred(self, key_id: str, work: Coroutine[Any, Any, None]) -> None: ...

    def _track(self, task: asyncio.Future[Any]) -> None: ...


class Call:
    """One request through the gateway: attempts in route order, each held and settled."""

    def __init__(
        self,
        gateway: CallContext,
        key: KeyRecord,
        kind: str,
        route: str,
        model: str,
        body: dict[str, Any],
        stream: bool,
        wanted: int,
        messages: int,
        answers: int = 1,
        served: dict[str, Any] | None = None,
    ) -> None:
        self.gateway = gateway
        self.served = served  # filled with who served the call and at what price, if given
        self.answers = answers  # n, and each prompt of a completion: the hold covers them all
        self.parts = openai.input_parts(body)  # the parts bounded per deployment (images)
        self.bound = input_bound(self.parts.text_bytes, messages)  # the text's bound
        self.key = key
        self.kind = kind
        self.route = route
        self.model = model
        self.body = body
        self.stream = stream
        self.wanted = wanted
        self.request_id = new_id()
        self.started = time.perf_counter()
        self.created_at = datetime.now(UTC)
        self.attempts = 0
        self.cost = self.tokens_in = self.tokens_out = 0
        self.tokens_cached = self.tokens_cache_write = self.uncharged = 0
        self.deployment: Deployment | None = None
        self.hold_id: str | None = None  # the store hold carrying the last attempt's
        self.ttft: float | None = None
        self.spans: CallSpans | None = None  # with tracing on (tracing.py)

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
                last = _skipped(
                    last,
                    UnsupportedRoute(
                        f"model {self.model!r} has no deployment that serves {self.kind} calls",
                        param="model",
                    ),
                )
                continue
            try:  # before any hold: a field the provider cannot take is a 400, never dropped
                provider.check(self.kind, self.body)
            except InvalidRequest as error:
                last = _skipped(last, error)
                continue
            price = deployment.price or gateway.config.prices.get(deployment.model)
            if price is None:
                if any(b.usd_micros is not None for b in key.budgets):
                    last = _skipped(
                        last,
                        PriceUnknown(
                            f"no price for {deployment.model!r}, and key {key.id!r} has a USD "
                            "budget; add the model under gateway.prices",
                            param="model",
                        ),
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
                attempt = self._attempt(deployment, provider, hold)
                if telemetry.TRACER is None:
                    return await attempt
                return await traced_attempt(self, deployment, provider, attempt)
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
        budgets or tpm bound the output, or the provider requires one (Anthropic). The cap
        then goes in the provider's field (its `token_field`; max_tokens for completions),
        the only one it is sure to read, and the other is dropped. /v1/messages' max_tokens
        is Anthropic's, not the client's OpenAI field: it is always capped this way."""
        provider = self.gateway.config.providers.get(deployment.provider)
        field = _TOKEN_FIELD[self.kind]
        if provider is not None and self.kind == "chat":
            field = provider.token_field
        if self.route == "messages":
            body.pop("max_tokens", None)
        elif not self.key.caps_output and (provider is None or provider.kind != "anthropic"):
            return  # nothing to bound: no limit is added (reasoning models refuse max_tokens)
        for name in _OUTPUT_LIMITS:
            body.pop(name, None)
        body[field] = cap

    async def _attempt(
        self, deployment: Deployment, provider: Provider, hold: Hold
    ) -> dict[str, Any] | Stream:
        self.hold_id = self.gateway.shares.store_hold(hold.id)
        try:  # nothing is sent until this is done: any failure gives the hold back
            body = self._upstream_body(deployment, hold)
            # durable before the call leaves: a process killed now leaves this row behind
            await self.gateway.ledger.pending(self._pending_row(deployment, hold))
        except BaseException as error:
            self.gateway._spawn(self._settle(hold, None, accepted=False))
            self.gateway.router.finished(deployment, "neutral", 0.0)
            if isinstance(error, GatewayError):  # _dispatch logs those
                raise
            if not isinstance(error, Exception):  # cancelled: the caller left
                self.log(deployment, provider, "client_disconnected")
                raise
            name = type(error).__name__
            logger.error("a call failed before it was sent: %s: %s", name, self._text(error))
            raise InternalError(f"internal error ({name}); the call was not sent") from None
        self.attempts += 1
        self.deployment = deployment
        if self.served is not None:  # an in-process caller's record of the call (features)
            self.served.update(
                request_id=self.request_id,
                group=deployment.group,
                provider=deployment.provider,
                deployment=deployment.model,
                attempts=self.attempts,
                cost=functools.partial(_usage_cost, hold.price),
            )
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
                self.gateway.router.finished(deployment, _outcome(error), 0.0)
                raise
            except asyncio.CancelledError:  # the caller left: the provider may have served it
                self.gateway._spawn(self._cut(hold, deployment, provider))
                self.gateway.router.finished(deployment, "neutral", 0.0)
                raise
            except Exception as error:
                raise await self._broken(error, hold, deployment, provider) from None
            elapsed = time.perf_counter() - sent
            self.ttft = elapsed
            self.gateway.router.finished(deployment, "ok", elapsed)
            # the hold already covers the call: settling (which only gives back) and logging
            # need not delay the answer
            usage = response_usage(reply) if self.kind == "responses" else openai_usage(reply)
            self.gateway._after_answer(self.key.id, self._close(hold, usage, deployment, provider))
            return reply
        upstream = provider.stream(self.kind, body, deployment.timeout).__aiter__()
        wait = min(deployment.timeout, deployment.deadline)
        try:
            first = await asyncio.wait_for(upstream.__anext__(), wait)
        except asyncio.CancelledError:  # the caller left: the provider may have served it
            self.gateway._spawn(self._cut(hold, deployment, provider))
            self.gateway.router.finished(deployment, "neutral", 0.0)
            raise
        except Exception as error:
            with contextlib.suppress(Exception):
                await upstream.aclose()  # type: ignore[attr-defined]
            if isinstance(error, TimeoutError):  # billed as sent: it may be, or about to be
                error = UpstreamError(
                    f"provider {provider.name!r} sent nothing within {wait:g}s",
                    status=504, retryable=False, accepted=True,
                )  # fmt: skip
            elif isinstance(error, StopAsyncIteration):
                error = UpstreamError(
                    f"provider {provider.name!r} ended its stream before its first chunk",
                    retryable=False, accepted=True,
                )  # fmt: skip
            elif not isinstance(error, UpstreamError):
                raise await self._broken(error, hold, deployment, provider) from None
            await self._settle(hold, None, accepted=error.accepted)
            self.gateway.router.finished(deployment, _outcome(error), 0.0)
            raise error from None
        self.ttft = time.perf_counter() - sent

        async def ended(usage: Usage | None, status: str) -> None:
            await self._settle(hold, usage, accepted=True)
            outcome = "failed" if status in ("upstream_error", "upstream_incomplete") else "ok"
            self.gateway.router.finished(deployment, outcome, time.perf_counter() - sent)
            self.log(deployment, provider, status)

        def on_end(usage: Usage | None, status: str) -> Awaitable[None]:
            if self.spans is not None:
                stream_ended(self, usage, status)
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

    async def _broken(
        self, error: Exception, hold: Hold, deployment: Deployment, provider: Provider
    ) -> UpstreamError:
        """A provider that raised something else than an UpstreamError (a bug in it, or in its
        client): whether it sent the request is unknown, so the hold is given back and the
        next deployment tried."""
        await self._settle(hold, None, accepted=False)
        self.gateway.router.finished(deployment, "failed", 0.0)
        name = type(error).__name__
        logger.error("provider %r failed: %s: %s", provider.name, name, self._text(error))
        return UpstreamError(f"provider {provider.name!r} failed ({name})")

    def _text(self, error: BaseException) -> str:
        """An exception's message as it may be logged: credentials masked, cut short."""
        return self.gateway.secrets.scrub(str(error))[:300]

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
            # the client's own text: credentials masked, then cut (a row keeps no more)
            model_requested=self.gateway.secrets.scrub(self.model)[:MAX_MODEL_NAME],
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


def _usage_cost(price: Price, usage: dict[str, Any]) -> int | None:
    """Micro-dollars an OpenAI `usage` object costs at `price`, prompt-cache reads and writes
    at their own rates (what the provider bills), or None when it carries no token counts."""
    parsed = openai_usage({"usage": usage})
    if parsed is None:
        return None
    return price.cost(
        parsed.input_tokens,
        parsed.output_tokens,
        cached=parsed.cached,
        written=parsed.written,
        written_1h=parsed.written_1h,
    )
