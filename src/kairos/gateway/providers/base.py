"""Upstream providers behind one Protocol, and what their implementations share: usage as
OpenAI reports it, the POST of a JSON call and the reading of its answer, whole or as events,
with failures as UpstreamErrors. Requests and replies are in the OpenAI wire format (chat
completions, completions, embeddings); an adapter for another API translates both ways. The
implementations: openai_compatible.py (OpenAI and the servers that speak its API) and
anthropic.py; `Gateway` picks one per configured provider (`provider_for`).

Credentials go in request headers only; no message built here contains them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

import orjson

from kairos.gateway.accounting.accountant import Usage
from kairos.gateway.config import ProviderConfig
from kairos.gateway.errors import UpstreamError
from kairos.gateway.providers.scrub import Secrets
from kairos.http import sse
from kairos.http.client import HTTPClient, HTTPFailure, Response

PATHS = {
    "chat": "/chat/completions", "completion": "/completions", "embedding": "/embeddings",
    "responses": "/responses",
}  # fmt: skip
# the events a Responses stream ends with: each carries the response and its usage
RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def chunk_usage(raw: bytes) -> Usage | None:
    """Usage in the JSON of a stream chunk, looking inside only when it may have one."""
    if b'"usage"' not in raw or b'"usage":null' in raw or b'"usage": null' in raw:
        return None
    try:
        return openai_usage(orjson.loads(raw))
    except orjson.JSONDecodeError:
        return None


# the most tokens one count is read as: far above any real call
_MOST_TOKENS = 1 << 62


def openai_usage(body: Any) -> Usage | None:
    """Usage from an OpenAI reply or stream chunk, when it carries one."""
    usage = body.get("usage") if isinstance(body, dict) else None
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(usage, dict) or not isinstance(prompt, int) or isinstance(prompt, bool):
        return None
    prompt = _count(prompt, _MOST_TOKENS)  # a negative count would give budget back
    completion = _count(usage.get("completion_tokens"), _MOST_TOKENS)
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens") if isinstance(details, dict) else None, prompt)
    # cache writes are Anthropic's, carried this way by kairos' translation (and LiteLLM's)
    written = _count(usage.get("cache_creation_input_tokens"), prompt - cached)
    creation = usage.get("cache_creation")
    written_1h = _count(
        creation.get("ephemeral_1h_input_tokens") if isinstance(creation, dict) else None, written
    )
    return Usage(prompt, completion, cached, written, written_1h)


def _count(value: Any, most: int) -> int:
    """A reported token count, 0 when absent or malformed, at most `most` (a part never
    exceeds its whole)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return 0
    return min(value, max(most, 0))


class Provider(Protocol):
    name: str
    kinds: frozenset[str]  # which of chat, completion, embedding it serves

    async def send(self, kind: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One call answered whole (`body["model"]` is the upstream model)."""
        ...

    def stream(self, kind: str, body: dict[str, Any], timeout: float) -> AsyncIterator[bytes]:
        """A streamed call as OpenAI chunks, each the JSON of one (passed on as is: no decoding
        and encoding per chunk); the last carries `usage` when it is known. Raises
        UpstreamError (before or after the first chunk)."""
        ...

    def check(self, kind: str, body: dict[str, Any]) -> None:
        """Raise InvalidRequest (naming the field) when `body` cannot be sent as it is: run
        before anything is held, so a field the provider cannot carry is never dropped."""
        ...

    async def count_tokens(self, body: dict[str, Any], timeout: float) -> int | None:
        """Input tokens of an Anthropic count_tokens body (`body["model"]` is the upstream
        model); a 400 when they cannot be counted exactly; None for a provider with no count
        endpoint (the gateway counts by the model's own tokenizer)."""
        ...

    async def close(self) -> None: ...


def upstream_failure(provider: ProviderConfig, status: int, text: bytes) -> UpstreamError:
    """An UpstreamError for a non-2xx answer, quoting the provider's message (key scrubbed)."""
    message, limit = "", 300
    try:
        body = orjson.loads(text)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            message = str(error.get("message", ""))
        elif isinstance(error, str):
            message = error
    except orjson.JSONDecodeError:
        message, limit = text.decode(errors="replace"), 200
    # scrubbed whole, then cut: a key across the cut would leave its head behind
    message = Secrets.of_provider(provider).scrub(message)[:limit]
    retryable = status == 429 or status >= 500 or status == 408
    return UpstreamError(
        f"provider {provider.name!r} answered {status}: {message or 'no message'}",
        status=status if 400 <= status < 500 and not retryable else 502,
        retryable=retryable,
    )


def transport_failure(provider: ProviderConfig, error: HTTPFailure) -> UpstreamError:
    """An exchange that broke. Once the request was written (`connected`) the provider may
    have served it: billable, and never sent to another deployment; before, nothing was."""
    text = Secrets.of_provider(provider).scrub(str(error))
    return UpstreamError(
        f"provider {provider.name!r} {'timed out' if error.timed_out else 'failed'}: {text}",
        status=504 if error.timed_out else 502,
        retryable=not error.connected,
        accepted=error.connected,
    )


async def post(
    client: HTTPClient,
    provider: ProviderConfig,
    url: str,
    headers: dict[str, str],
    payload: dict[str, Any],
    timeout: float,
) -> Response:
    """POST JSON; failures to connect or answer become UpstreamError."""
    try:
        return await client.request(
            "POST", url, headers, orjson.dumps(payload), timeout,
            connect_timeout=min(timeout, 5.0),
        )  # fmt: skip
    except HTTPFailure as error:
        raise transport_failure(provider, error) from None


async def json_reply(provider: ProviderConfig, response: Response) -> dict[str, Any]:
    """The JSON object a 200 answer carries; anything else raises UpstreamError."""
    try:
        text = await response.read()
    except HTTPFailure as error:
        if response.status != 200:  # its status already says it was not served
            raise upstream_failure(provider, response.status, b"") from None
        raise transport_failure(provider, error) from None
    if response.status != 200:
        raise upstream_failure(provider, response.status, text)
    try:
        # a provider that answers an error with a 200 may quote the key it was sent
        reply = orjson.loads(Secrets.of_provider(provider).scrub(text))
    except orjson.JSONDecodeError:
        reply = None
    if not isinstance(reply, dict):  # after a 200: the provider may bill it
        raise UpstreamError(
            f"provider {provider.name!r} sent a body that is not a JSON object",
            retryable=False,
            accepted=True,
        )
    return reply


async def refusal(provider: ProviderConfig, response: Response) -> UpstreamError:
    """The UpstreamError for a streamed call answered with something other than 200."""
    try:
        text = await response.read()
    except HTTPFailure:  # its status already says it was not served
        text = b""
    return upstream_failure(provider, response.status, text)


async def event_stream(provider: ProviderConfig, response: Response) -> AsyncIterator[sse.Event]:
    """The events of a 200 streamed answer; failures after it are `accepted` UpstreamErrors."""
    if response.status != 200:
        raise await refusal(provider, response)
    parser = sse.Parser()
    try:
        async for piece in response.chunks():
            for event in parser.feed(piece):
                yield event
        for event in parser.close():
            yield event
    except HTTPFailure as error:
        raise transport_failure(provider, error) from None  # connected: accepted
    except UpstreamError as error:
        error.accepted = True  # after a 200: the provider took the call
        raise
    finally:
        response.close()
