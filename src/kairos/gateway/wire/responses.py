"""OpenAI's Responses API (`POST /v1/responses`) through the gateway: the checks of a request
body, the usage of an answer, and the typed events of a stream. The same keys, allow-lists,
budgets, failover and ledger apply as to chat. OpenAI-kind providers are sent the call as it
is; an Anthropic deployment serves it through chat (providers/responses_chat.py translates
both ways).

>>> check_responses({"model": "chat", "input": "Say hi", "max_output_tokens": 64}, 4096)
('chat', False, 64, 1)
"""

from __future__ import annotations

from typing import Any

import orjson

from kairos.gateway.accounting.accountant import Usage
from kairos.gateway.bounds import MAX_TOKENS, MOST_TOP_LOGPROBS, integer
from kairos.gateway.errors import InvalidRequest
from kairos.gateway.providers.base import RESPONSE_ENDS, openai_usage
from kairos.gateway.wire.openai import model_and_stream
from kairos.http import sse

# Fields the gateway cannot account for, each with the fix: a stored prompt's text is not
# in the request (nor in another account's deployment, after a failover), a background
# response is billed after the call. (Stored conversations, previous_response_id and
# conversation, are refused on keys with limits only: requests.input_parts).
_UNACCOUNTED = {
    "prompt": "send the prompt's text in instructions and input instead",
    "background": "drop it: a background response is billed after the call, out of the "
    "gateway's sight",
}


def check_responses(body: dict[str, Any], default_max_tokens: int) -> tuple[str, bool, int, int]:
    """(model, stream, output tokens wanted, input parts) of a Responses request: `input` is a
    string or a list of input items; `instructions` is one more part."""
    model, stream = model_and_stream(body)
    for name, fix in _UNACCOUNTED.items():
        if body.get(name) not in (None, False):
            raise InvalidRequest(
                f"{name} is not supported through the gateway (what it costs is out of the "
                f"gateway's sight); {fix}",
                param=name,
            )
    wanted = integer(body, "max_output_tokens", 1, MAX_TOKENS, "output tokens, e.g. 256")
    integer(body, "top_logprobs", 0, MOST_TOP_LOGPROBS, "likeliest tokens returned per position")
    integer(body, "max_tool_calls", 1, MAX_TOKENS, "built-in tool calls")
    given = body.get("input")
    if isinstance(given, list) and given:
        for index, item in enumerate(given):
            if not isinstance(item, dict):
                raise InvalidRequest(
                    f'input[{index}] must be an input item, e.g. {{"role": "user", '
                    '"content": "Hi"}',
                    param=f"input[{index}]",
                )
        parts = len(given)
    elif isinstance(given, str):
        parts = 1
    else:
        raise InvalidRequest(
            'input is a string or a non-empty list of input items, e.g. "Say hi" or '
            '[{"role": "user", "content": "Hi"}]',
            param="input",
        )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest(
            'instructions is a string, e.g. "Answer in French"', param="instructions"
        )
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest(
            'stream_options is an object, e.g. {"include_obfuscation": false}',
            param="stream_options",
        )
    return model, stream, wanted or default_max_tokens, parts + (instructions is not None)


def response_usage(response: Any) -> Usage | None:
    """Usage of a response object (`usage.input_tokens`, `usage.output_tokens`), when known."""
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict) or not isinstance(usage.get("input_tokens"), int):
        return None
    # in chat's names, so cached input (input_tokens_details.cached_tokens) is read as chat's,
    # and cache writes as kairos' translation of an Anthropic answer carries them
    return openai_usage({"usage": {
        "prompt_tokens": usage["input_tokens"], "completion_tokens": usage.get("output_tokens"),
        "prompt_tokens_details": usage.get("input_tokens_details"),
        "cache_creation_input_tokens": usage.get("cache_creation_input_tokens"),
        "cache_creation": usage.get("cache_creation"),
    }})  # fmt: skip


def event_usage(data: bytes) -> Usage | None:
    """Usage in a stream event: only its last event (`response.completed`, `.incomplete` or
    `.failed`) carries one, in `response.usage`."""
    if sse.data_type(data) not in RESPONSE_ENDS:
        return None
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return response_usage(event.get("response")) if isinstance(event, dict) else None


def error_event(error: dict[str, Any], sequence_number: int) -> dict[str, Any]:
    """The Responses stream's in-band `error` event for a failure the gateway reports (the
    `{"error": {...}}` a chat stream ends with)."""
    return {
        "type": "error",
        "code": error.get("code"),
        "message": error.get("message"),
        "param": None,
        "sequence_number": sequence_number,
    }
