"""Upstream providers behind one Protocol. Requests and replies are in the OpenAI wire format
(chat completions, completions, embeddings); an adapter for another API translates both ways.

Credentials go in request headers only; no message built here contains them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import orjson

from kairos.gateway import sse
from kairos.gateway.config import ProviderConfig
from kairos.gateway.errors import UnsupportedRoute, UpstreamError

PATHS = {"chat": "/chat/completions", "completion": "/completions", "embedding": "/embeddings"}


@dataclass(frozen=True, slots=True)
class Usage:
    input_tokens: int
    output_tokens: int


def openai_usage(body: Any) -> Usage | None:
    """Usage from an OpenAI reply or stream chunk, when it carries one."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict) or not isinstance(usage.get("prompt_tokens"), int):
        return None
    completion = usage.get("completion_tokens")
    return Usage(usage["prompt_tokens"], completion if isinstance(completion, int) else 0)


class Provider(Protocol):
    name: str
    kinds: frozenset[str]  # which of chat, completion, embedding it serves

    async def send(self, kind: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One call answered whole (`body["model"]` is the upstream model)."""
        ...

    def stream(
        self, kind: str, body: dict[str, Any], timeout: float
    ) -> AsyncIterator[dict[str, Any]]:
        """A streamed call as OpenAI chunks; the last carries `usage` when it is known.
        Raises UpstreamError (before or after the first chunk)."""
        ...

    async def close(self) -> None: ...


def http_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=1000, max_keepalive_connections=200),
        timeout=httpx.Timeout(60.0, connect=5.0),
        follow_redirects=False,
    )


def upstream_failure(
    provider: ProviderConfig, response: httpx.Response, text: bytes
) -> UpstreamError:
    """An UpstreamError for a non-2xx answer, quoting the provider's message (key scrubbed)."""
    message = ""
    try:
        body = orjson.loads(text)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict):
            message = str(error.get("message", ""))
        elif isinstance(error, str):
            message = error
    except orjson.JSONDecodeError:
        message = text[:200].decode(errors="replace")
    if provider.api_key:
        message = message.replace(provider.api_key, "***")
    status = response.status_code
    retryable = status == 429 or status >= 500 or status == 408
    return UpstreamError(
        f"provider {provider.name!r} answered {status}: {message[:300] or response.reason_phrase}",
        status=status if 400 <= status < 500 and not retryable else 502,
        retryable=retryable,
        reached=True,
    )


def transport_failure(provider: ProviderConfig, error: httpx.HTTPError) -> UpstreamError:
    reached = not isinstance(error, httpx.ConnectError | httpx.ConnectTimeout)
    kind = "timed out" if isinstance(error, httpx.TimeoutException) else "failed"
    return UpstreamError(
        f"provider {provider.name!r} {kind} ({type(error).__name__})",
        status=504 if kind == "timed out" else 502,
        retryable=True,
        reached=reached,
    )


class OpenAICompatible:
    """OpenAI, vLLM, llama.cpp's server, kairos' own deployments: `base_url` ends in /v1."""

    kinds = frozenset(PATHS)

    def __init__(self, config: ProviderConfig, client: httpx.AsyncClient | None = None) -> None:
        self.name = config.name
        self.config = config
        self._client = client or http_client()
        self._headers = {"content-type": "application/json", **config.headers}
        if config.api_key:
            self._headers["authorization"] = f"Bearer {config.api_key}"

    def __repr__(self) -> str:
        return f"OpenAICompatible({self.name!r}, {self.config.base_url!r})"

    def _request(self, kind: str, body: dict[str, Any], timeout: float) -> httpx.Request:
        if kind not in PATHS:
            raise UnsupportedRoute(f"provider {self.name!r} does not serve {kind} calls")
        return self._client.build_request(
            "POST",
            self.config.base_url + PATHS[kind],
            content=orjson.dumps(body),
            headers=self._headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
        )

    async def send(self, kind: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        try:
            response = await self._client.send(self._request(kind, body, timeout))
        except httpx.HTTPError as error:
            raise transport_failure(self.config, error) from None
        if response.status_code != 200:
            raise upstream_failure(self.config, response, response.content)
        try:
            reply = orjson.loads(response.content)
        except orjson.JSONDecodeError:
            raise UpstreamError(f"provider {self.name!r} sent a body that is not JSON") from None
        if not isinstance(reply, dict):
            raise UpstreamError(f"provider {self.name!r} sent JSON that is not an object")
        return reply

    async def stream(
        self, kind: str, body: dict[str, Any], timeout: float
    ) -> AsyncIterator[dict[str, Any]]:
        # usage is always asked for upstream: it is what the call is billed by
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        request = self._request(kind, body, timeout)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as error:
            raise transport_failure(self.config, error) from None
        if response.status_code != 200:
            try:
                raise upstream_failure(self.config, response, await response.aread())
            finally:
                await response.aclose()
        try:
            async for event in sse.events(response.aiter_lines()):
                if event.data.startswith("[DONE]"):
                    break
                try:
                    chunk = orjson.loads(event.data)
                except orjson.JSONDecodeError:
                    raise UpstreamError(
                        f"provider {self.name!r} streamed an event that is not JSON"
                    ) from None
                if isinstance(chunk, dict) and chunk.get("error"):
                    problem = chunk["error"]
                    text = problem.get("message") if isinstance(problem, dict) else str(problem)
                    raise UpstreamError(f"provider {self.name!r} failed mid-stream: {text}")
                yield chunk
        except UpstreamError as error:
            error.accepted = True  # after a 200: the provider took the call
            raise
        except httpx.HTTPError as error:
            failure = transport_failure(self.config, error)
            failure.accepted = True
            raise failure from None
        finally:
            await response.aclose()

    async def close(self) -> None:
        await self._client.aclose()


def provider_for(config: ProviderConfig) -> Provider:
    if config.kind == "anthropic":
        from kairos.gateway.anthropic import AnthropicProvider

        return AnthropicProvider(config)
    return OpenAICompatible(config)
