"""Checks of call bodies (OpenAI shapes), before anything is held or sent. Each error names
the field and the fix; the caller's body is never echoed back."""

from __future__ import annotations

from typing import Any

import orjson

from kairos.gateway.errors import InvalidRequest


def _positive(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"{name} must be a positive integer, e.g. 256", param=name)
    return value


def _common(body: dict[str, Any], default_max_tokens: int) -> tuple[str, bool, int]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest('model is required: a model name, e.g. "gpt-4o-mini"', param="model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and (
        not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool)
    ):
        raise InvalidRequest(
            'stream_options is an object, e.g. {"include_usage": true}', param="stream_options"
        )
    n = body.get("n")
    if n is not None and n != 1:
        raise InvalidRequest(
            "n must be 1 through the gateway (each request is budgeted as one answer); "
            "send several requests instead",
            param="n",
        )
    wanted = _positive(body, "max_completion_tokens") or _positive(body, "max_tokens")
    return model, stream, wanted or default_max_tokens


def check_chat(body: dict[str, Any], default_max_tokens: int) -> tuple[str, bool, int, int]:
    """(model, stream, max_tokens wanted, input bytes + messages) of a chat request."""
    model, stream, wanted = _common(body, default_max_tokens)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest(
            'messages is a non-empty list, e.g. [{"role": "user", "content": "Hi"}]',
            param="messages",
        )
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(
                f"messages[{index}] must be an object with a role and content",
                param=f"messages[{index}]",
            )
    return model, stream, wanted, len(messages)


def check_completion(body: dict[str, Any]) -> tuple[str, bool, int, int]:
    """(model, stream, max_tokens wanted, number of prompts): each prompt gets an answer."""
    # the completions API's own default for max_tokens is 16
    model, stream, wanted = _common(body, 16)
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise InvalidRequest(
            "best_of must be 1 through the gateway (each request is budgeted as one answer)",
            param="best_of",
        )
    prompt = body.get("prompt")
    if not (isinstance(prompt, str) or (
        isinstance(prompt, list) and prompt and all(isinstance(p, str | int | list) for p in prompt)
    )):  # fmt: skip
        raise InvalidRequest(
            'prompt is a string or a list of strings, e.g. "Say hi"', param="prompt"
        )
    many = isinstance(prompt, list) and not all(isinstance(p, int) for p in prompt)
    return model, stream, wanted, len(prompt) if many else 1


def check_embedding(body: dict[str, Any]) -> tuple[str, int]:
    model, stream, _ = _common(body, 0)
    if stream:
        raise InvalidRequest("embeddings are not streamed; drop stream", param="stream")
    given = body.get("input")
    if not (isinstance(given, str) or (isinstance(given, list) and given)):
        raise InvalidRequest(
            'input is a string or a non-empty list of strings, e.g. ["hello"]', param="input"
        )
    return model, len(given) if isinstance(given, list) else 1


# Settings that are not sent to the model as input; everything else (messages, prompt, input,
# tools, functions, response_format, ...) may be, so it counts towards the input bound.
_CONTROLS = frozenset({
    "model", "max_tokens", "max_completion_tokens", "stream", "stream_options", "n", "stop",
    "temperature", "top_p", "seed", "user", "presence_penalty", "frequency_penalty",
    "logprobs", "top_logprobs", "best_of", "echo", "suffix", "encoding_format", "dimensions",
    "metadata", "store", "service_tier", "parallel_tool_calls", "logit_bias",
})  # fmt: skip


def input_bytes(body: dict[str, Any]) -> int:
    """Bytes of what the model reads, as JSON: at least the bytes of its text (escaping only
    adds), tools and schemas included."""
    return len(orjson.dumps({k: v for k, v in body.items() if k not in _CONTROLS}))
