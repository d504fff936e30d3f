"""Checks of call bodies (OpenAI shapes), before anything is held or sent. Each error names
the field and the fix; the caller's body is never echoed back."""

from __future__ import annotations

import base64
import binascii
from typing import Any

import orjson

from kairos.gateway import bounds
from kairos.gateway.accounting.accountant import AUDIO_LEAST_BYTES_PER_SECOND, InputParts
from kairos.gateway.errors import InvalidRequest


def choices(body: dict[str, Any]) -> int:
    """Answers asked for per prompt (`n`, checked by the check_* functions): each is held and
    billed as one answer."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


def model_and_stream(body: dict[str, Any]) -> tuple[str, bool]:
    """(model, stream) of a call body, checked: the fields every generating route shares."""
    model = bounds.model_name(body, "gpt-4o-mini")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("stream must be true or false", param="stream")
    return model, stream


def _output_limit(body: dict[str, Any], name: str) -> int | None:
    return bounds.integer(body, name, 1, bounds.MAX_TOKENS, "output tokens, e.g. 256")


def _common(body: dict[str, Any], default_max_tokens: int) -> tuple[str, bool, int]:
    model, stream = model_and_stream(body)
    options = body.get("stream_options")
    if options is not None and (
        not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool)
    ):
        raise InvalidRequest(
            'stream_options is an object, e.g. {"include_usage": true}', param="stream_options"
        )
    bounds.integer(body, "n", 1, bounds.MOST_CHOICES, "answers to generate, each billed")
    bounds.integer(body, "seed", *bounds.INT64, "a 64-bit sampling seed")
    newer = _output_limit(body, "max_completion_tokens")
    older = _output_limit(body, "max_tokens")
    return model, stream, newer or older or default_max_tokens


def _logit_bias(body: dict[str, Any]) -> None:
    """`logit_bias`: token ids to a bias from -100 to 100 (OpenAI's range)."""
    bias = body.get("logit_bias")
    most = bounds.MOST_LOGIT_BIAS
    if bias is not None and not (
        isinstance(bias, dict)
        and all(
            isinstance(v, int | float) and not isinstance(v, bool) and -most <= v <= most
            for v in bias.values()
        )
    ):
        raise InvalidRequest(
            f'logit_bias maps token ids to a bias from -{most} to {most}, e.g. {{"50256": -100}}',
            param="logit_bias",
        )


_MOST_STOPS = 4  # OpenAI's limit on stop sequences


def _stop(body: dict[str, Any], field: str) -> None:
    """`stop`: a string or a list of up to 4 strings (OpenAI's rule); from /v1/messages
    (`field` stop_sequences) as many strings as Anthropic takes."""
    stop = body.get("stop")
    if stop is None or isinstance(stop, str):
        return
    most = _MOST_STOPS if field == "stop" else None  # Anthropic documents no limit
    strings = isinstance(stop, list) and all(isinstance(s, str) for s in stop)
    if not strings or (most is not None and len(stop) > most):
        which = f"up to {most} strings" if most is not None else "strings"
        raise InvalidRequest(f'{field} is a string or a list of {which}, e.g. ["END"]', param=field)


def check_chat(
    body: dict[str, Any], default_max_tokens: int, *, stop_field: str = "stop"
) -> tuple[str, bool, int, int]:
    """(model, stream, max_tokens wanted, input bytes + messages) of a chat request;
    `stop_field` names the client's field `stop` came from (/v1/messages: stop_sequences)."""
    model, stream, wanted = _common(body, default_max_tokens)
    _stop(body, stop_field)
    top = bounds.MOST_TOP_LOGPROBS
    bounds.integer(body, "top_logprobs", 0, top, "likeliest tokens returned per position")
    _logit_bias(body)
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
    if body.get("max_completion_tokens") is not None:
        raise InvalidRequest(
            "max_completion_tokens is a chat completions field; the completions API takes "
            "max_tokens",
            param="max_completion_tokens",
        )
    model, stream, wanted = _common(body, 16)
    _stop(body, "stop")
    bounds.integer(body, "logprobs", 0, bounds.MOST_LOGPROBS, "likeliest tokens per position")
    _logit_bias(body)
    best_of = body.get("best_of")
    if best_of is not None and (type(best_of) is not int or best_of != 1):
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
    if many and len(prompt) > bounds.MOST_PROMPTS:
        raise InvalidRequest(
            f"prompt is a list of at most {bounds.MOST_PROMPTS} prompts (each is held as n "
            "answers of max_tokens); send the rest in another request",
            param="prompt",
        )
    return model, stream, wanted, len(prompt) if many else 1


def check_embedding(body: dict[str, Any]) -> tuple[str, int]:
    model, stream, _ = _common(body, 0)
    bounds.integer(body, "dimensions", 1, bounds.MAX_TOKENS, "of each embedding")
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
    "logprobs", "top_logprobs", "best_of", "echo", "encoding_format", "dimensions",
    "metadata", "store", "service_tier", "parallel_tool_calls", "logit_bias",
})  # fmt: skip


# Parts a model reads as something other than text (every API's name for them), bounded by
# what the provider bills for one; the bytes of their JSON (a base64 image) are not counted.
_IMAGES = frozenset({"image_url", "input_image", "image"})
_FILES = frozenset({"file", "input_file", "document"})
_AUDIO = "input_audio"
_MARKS = tuple(f'"type":"{kind}"'.encode() for kind in _IMAGES | _FILES | {_AUDIO})
# fields that bring in input the request does not carry: stored at the provider (Responses),
# or search results (chat's web_search_options)
_STORED = ("previous_response_id", "conversation", "web_search_options")
_TOOL_KINDS = frozenset({"function", "custom"})  # others (web search, ...) read unbounded input


def _read(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in _CONTROLS}


def input_parts(body: dict[str, Any]) -> InputParts:
    """What the model reads, measured once: the bytes of its text as JSON (at least the bytes
    of the text, escaping only adds; tools and schemas included, images left out), then the
    parts that are not text: images, tool definitions, and the first part whose tokens nothing
    bounds (a file, stored input), by its field."""
    tools = body.get("tools")
    tools = tools if isinstance(tools, list) else []
    functions = body.get("functions")
    count = len(tools) + (len(functions) if isinstance(functions, list) else 0)
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        count += 1  # a provider may render it as a tool (kairos' Anthropic translation does)
    unbounded = next((name for name in _STORED if body.get(name) is not None), None)
    given = body.get("input")
    for index, item in enumerate(given if isinstance(given, list) else []):
        if unbounded is None and isinstance(item, dict) and item.get("type") == "item_reference":
            unbounded = f"input[{index}]"  # a stored item, fetched by the provider
    for index, tool in enumerate(tools):
        if unbounded is None and isinstance(tool, dict) and tool.get("type") not in _TOOL_KINDS:
            unbounded = f"tools[{index}]"
    read = _read(body)
    raw = orjson.dumps(read)
    if not any(mark in raw for mark in _MARKS):
        return InputParts(0, count, unbounded, len(raw))
    images: list[Any] = []
    files: list[str] = []
    _walk(read, [], images, files)
    text = len(raw) - sum(len(orjson.dumps(image)) for image in images)
    return InputParts(len(images), count, unbounded or (files[0] if files else None), text)


def _slow_audio(part: dict[str, Any]) -> bool:
    """Audio that may be billed more than a token per byte: not mp3, nor a WAV whose byte rate
    is at least AUDIO_LEAST_BYTES_PER_SECOND (its text bytes bound it: accounting/accountant.py)."""
    audio = part.get("input_audio")
    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
        return True
    if audio.get("format") == "mp3":
        return False
    try:
        header = base64.b64decode(audio["data"][:64])
    except (binascii.Error, ValueError):
        return True
    if header[:4] != b"RIFF" or header[8:16] != b"WAVEfmt ":
        return True
    return int.from_bytes(header[28:32], "little") < AUDIO_LEAST_BYTES_PER_SECOND


def _walk(value: Any, path: list[str], images: list[Any], files: list[str]) -> None:
    """Collect the image parts under `value`, and the fields of its file parts."""
    if isinstance(value, dict):
        kind = value.get("type")
        if kind in _IMAGES:
            images.append(value)
            return
        if kind in _FILES or (kind == _AUDIO and _slow_audio(value)):
            files.append("".join(path).lstrip("."))
        for name, item in value.items():
            if isinstance(item, dict | list):
                path.append(f".{name}")
                _walk(item, path, images, files)
                path.pop()
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, dict | list):
                path.append(f"[{index}]")
                _walk(item, path, images, files)
                path.pop()
