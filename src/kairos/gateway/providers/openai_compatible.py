"""OpenAI's API as a provider, and every server that speaks it (vLLM, llama.cpp's server,
kairos' own deployments): calls go in the OpenAI wire format as they are, streams are passed
on chunk by chunk, and in-band errors (a chunk or event carrying `error`) raise.

Credentials go in request headers only; no message built here contains them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from kairos.gateway.config import ProviderConfig
from kairos.gateway.errors import UnsupportedRoute, UpstreamError, UpstreamIncomplete
from kairos.gateway.providers.base import (
    PATHS,
    RESPONSE_ENDS,
    event_stream,
    json_reply,
    post,
    refusal,
    transport_failure,
)
from kairos.gateway.providers.scrub import Secrets
from kairos.http import sse
from kairos.http.client import HTTPClient, HTTPFailure


class OpenAICompatible:
    """OpenAI, vLLM, llama.cpp's server, kairos' own deployments: `base_url` ends in /v1."""

    kinds = frozenset(PATHS)

    def __init__(self, config: ProviderConfig, client: HTTPClient | None = None) -> None:
        self.name = config.name
        self.config = config
        self._client = client or HTTPClient()
        self._headers = {"content-type": "application/json", **config.headers}
        if config.api_key:
            self._headers["authorization"] = f"Bearer {config.api_key}"
        self._secrets = Secrets.of_provider(config)

    def __repr__(self) -> str:
        return f"OpenAICompatible({self.name!r}, {self.config.base_url!r})"

    def _url(self, kind: str) -> str:
        if kind not in PATHS:
            raise UnsupportedRoute(f"provider {self.name!r} does not serve {kind} calls")
        return self.config.base_url + PATHS[kind]

    async def send(self, kind: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        url = self._url(kind)
        response = await post(self._client, self.config, url, self._headers, body, timeout)
        return await json_reply(self.config, response)

    async def stream(self, kind: str, body: dict[str, Any], timeout: float) -> AsyncIterator[bytes]:
        if kind == "responses":
            async for data in self._response_events(body, timeout):
                yield data
            return
        # usage is always asked for upstream: it is what the call is billed by
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        url = self._url(kind)
        response = await post(self._client, self.config, url, self._headers, body, timeout)
        if response.status != 200:
            raise await refusal(self.config, response)
        # the body parsed here, not through event_stream: one generator less per chunk
        parser = sse.Parser()
        done = False
        try:
            async for piece in response.chunks():
                for event in parser.feed(piece):
                    if done or event.data.startswith(b"[DONE]"):
                        done = True  # read on to the body's end, so the connection is reused
                        continue
                    yield self._chunk(event.data)
            for event in parser.close():
                if done or event.data.startswith(b"[DONE]"):
                    done = True
                    continue
                yield self._chunk(event.data)
            if not done:  # a body that ends early by its framing (or with no framing at all)
                raise UpstreamIncomplete(
                    f"provider {self.name!r} ended the stream without `data: [DONE]`; "
                    "the answer may be cut short"
                )
        except HTTPFailure as error:
            raise transport_failure(self.config, error) from None  # connected: accepted
        finally:
            response.close()

    async def _response_events(self, body: dict[str, Any], timeout: float) -> AsyncIterator[bytes]:
        """A Responses stream's events (the JSON of each) up to its last one, which carries the
        usage; an `error` event, or a stream that ends before its last event, raises."""
        url = self._url("responses")
        payload = {**body, "stream": True}
        response = await post(self._client, self.config, url, self._headers, payload, timeout)
        ended = False
        async for event in event_stream(self.config, response):
            data = event.data  # a credential quoted in it is masked by the gateway's Stream
            if ended or data.startswith(b"[DONE]"):
                continue  # read on to the body's end, so the connection is reused
            kind = sse.data_type(data)
            if kind == "error" or event.event == "error":
                # masked before it is cut: a key across the cut would leave its head behind
                message = self._secrets.scrub(_event_message(data))[:300]
                raise UpstreamError(
                    f"provider {self.name!r} failed mid-stream: {message}", accepted=True
                )
            ended = kind in RESPONSE_ENDS
            yield data
        if not ended:
            raise UpstreamIncomplete(
                f"provider {self.name!r} ended the stream before its last event "
                "(response.completed); the answer may be cut short"
            )

    def _chunk(self, data: bytes) -> bytes:
        """A streamed event's data, checked to be a chunk (not an in-band error)."""
        if not data.startswith(b"{"):
            raise UpstreamError(
                f"provider {self.name!r} streamed an event that is not a JSON object",
                accepted=True,
            )
        if b'"error"' in data:
            self._raise_if_error(data)
        return data

    def _raise_if_error(self, data: bytes) -> None:
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamError(
                f"provider {self.name!r} streamed an event that is not JSON", accepted=True
            ) from None
        problem = chunk.get("error") if isinstance(chunk, dict) else None
        if problem:
            text = problem.get("message") if isinstance(problem, dict) else problem
            text = self._secrets.scrub(str(text))[:300]  # a provider may quote the key it got
            raise UpstreamError(f"provider {self.name!r} failed mid-stream: {text}", accepted=True)

    def check(self, kind: str, body: dict[str, Any]) -> None:
        """Nothing to translate: the call goes in the provider's own wire format."""

    async def count_tokens(self, body: dict[str, Any], timeout: float) -> int | None:
        return None  # the OpenAI API has no count endpoint: the gateway counts by tokenizer

    async def close(self) -> None:
        await self._client.close()


def _event_message(data: bytes) -> str:
    """The message of an in-band `error` event (Responses: `message`; else `error.message`)."""
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return "an event that is not JSON"
    if not isinstance(event, dict):
        return "an event that is not a JSON object"
    problem = event.get("error")
    message = problem.get("message") if isinstance(problem, dict) else event.get("message")
    return str(message or problem or "no message")
