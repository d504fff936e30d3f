"""The spans of a gateway call (kairos.telemetry), only made with tracing on: one per call,
named as OpenTelemetry's GenAI conventions name a client call (`chat <model>`), and a child
per attempt at a deployment (`kairos.gateway.attempt <provider>`), which is the current span
while the provider is called, so the request leaves with its `traceparent`.

A call and its attempt carry the gen_ai attributes: the operation, the requested and the
answering model, input and output tokens, the provider; the time to the first token; an
attempt also its deployment, status, and the reason the call failed over from it. A streamed
call's spans end with its stream, when its usage is known. Nothing of a prompt, an answer or a
key is in them.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from kairos import telemetry
from kairos.gateway.accounting.accountant import Usage
from kairos.gateway.config import Deployment
from kairos.gateway.errors import GatewayError, UpstreamError
from kairos.gateway.providers.base import Provider, openai_usage
from kairos.gateway.wire.responses import response_usage
from kairos.gateway.wire.streams import Stream

# `call` below is a kairos.gateway.calls.Call (which imports this module, so it is not named)
Call = Any

# gen_ai.operation.name of each kind of call
OPERATIONS = {
    "chat": "chat",
    "completion": "text_completion",
    "embedding": "embeddings",
    "responses": "chat",
}


class CallSpans:
    """The span of a call (`call`) and that of its attempt in flight (`attempt`)."""

    __slots__ = ("attempt", "call")

    def __init__(self, call: Any) -> None:
        self.call = call
        self.attempt: Any = None


async def traced_call(
    call: Call, work: Awaitable[dict[str, Any] | Stream]
) -> dict[str, Any] | Stream:
    """Run a call (`work`: its `run()`) inside its span; a streamed answer's span stays open
    until the stream ends (`stream_ended`)."""
    operation = OPERATIONS.get(call.kind, call.kind)
    model = call.gateway.secrets.scrub(call.model)  # the client's own text
    span = telemetry.start(
        f"{operation} {model}",
        {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": model,
            "kairos.gateway.route": call.route,
            "kairos.gateway.request_id": call.request_id,
            "kairos.gateway.key_id": call.key.id,
            "kairos.gateway.stream": call.stream,
        },
    )
    call.spans = CallSpans(span)
    with telemetry.current(span):
        try:
            reply = await work
        except BaseException as error:
            span.set_attribute("kairos.gateway.attempts", call.attempts)
            telemetry.failed(span, error)
            span.end()
            raise
    if not isinstance(reply, Stream):
        _answered(call, span, _usage(call, reply), reply.get("model"), "ok")
        span.end()
        call.spans = None
    return reply


async def traced_attempt(
    call: Call,
    deployment: Deployment,
    provider: Provider,
    work: Awaitable[dict[str, Any] | Stream],
) -> dict[str, Any] | Stream:
    """One attempt (`work`: `Call._attempt`) inside its span, the call's child."""
    spans = call.spans
    kind = call.gateway.config.providers.get(deployment.provider)
    span = telemetry.start(
        f"kairos.gateway.attempt {deployment.provider}",
        {
            "gen_ai.operation.name": OPERATIONS.get(call.kind, call.kind),
            "gen_ai.request.model": deployment.model,
            "gen_ai.provider.name": kind.kind if kind is not None else provider.name,
            "kairos.gateway.provider": deployment.provider,
            "kairos.gateway.deployment": deployment.model,
            "kairos.gateway.model_group": deployment.group,
            "kairos.gateway.attempt": call.attempts + 1,
        },
        kind="client",
    )
    if spans is not None:
        spans.attempt = span
    with telemetry.current(span):
        try:
            reply = await work
        except BaseException as error:
            _attempt_failed(span, error)
            span.end()
            raise
    if not isinstance(reply, Stream):
        _answered(call, span, _usage(call, reply), reply.get("model"), "ok")
        span.end()
    return reply


def stream_ended(call: Call, usage: Usage | None, status: str) -> None:
    """A streamed call's stream ended (`status` as the ledger logs it): its attempt's span
    and the call's end, with the usage the stream carried."""
    spans = call.spans
    if spans is None:
        return
    model = call.deployment.model if call.deployment is not None else None
    for span in (spans.attempt, spans.call):
        if span is not None:
            _answered(call, span, usage, model, status)
            span.end()
    call.spans = None


def _usage(call: Call, reply: dict[str, Any]) -> Usage | None:
    return response_usage(reply) if call.kind == "responses" else openai_usage(reply)


def _answered(call: Call, span: Any, usage: Usage | None, model: Any, status: str) -> None:
    attributes: dict[str, Any] = {"kairos.gateway.status": status}
    attributes["kairos.gateway.attempts"] = call.attempts
    if isinstance(model, str) and model:
        attributes["gen_ai.response.model"] = model
    if usage is not None:
        attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
        attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
        if usage.cached:
            attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached
    if call.ttft is not None:
        # seconds, as the GenAI conventions' time-to-first-token measures it
        attributes["gen_ai.server.time_to_first_token"] = call.ttft
    if call.deployment is not None:
        attributes["kairos.gateway.provider"] = call.deployment.provider
        attributes["kairos.gateway.deployment"] = call.deployment.model
    span.set_attributes(attributes)
    if status == "ok":
        telemetry.ok(span)
    else:
        telemetry.failed(span, status)


def _attempt_failed(span: Any, error: BaseException) -> None:
    telemetry.failed(span, error)
    if isinstance(error, GatewayError):
        span.set_attribute("kairos.gateway.status", error.code)
        if isinstance(error, UpstreamError) and error.retryable:
            # the call moves on to the next deployment, if it has one
            span.set_attribute("kairos.gateway.failover_reason", _reason(error))


def _reason(error: UpstreamError) -> str:
    """Why a call left a deployment: kairos' own head of the message, "provider 'x'
    answered 503" (what follows it is the provider's text, which is not kept)."""
    return error.message.split(": ", 1)[0][:120]
