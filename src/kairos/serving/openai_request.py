"""Read OpenAI-style completion and chat bodies into what the engine needs, or a 400.

Fields the worker does not act on (`user`, `logit_bias` when empty, `response_format` text...)
are accepted and ignored, as OpenAI-compatible servers do; fields that would change the answer
and are not supported (`n` > 1, `logprobs`) are refused by name. `response_format` json_schema
and json_object, and chat `tools`, become a grammar (`kairos.serving.structured`, `.tools`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kairos.serving.errors import LLMRequestError
from kairos.serving.llamacpp import Sampling
from kairos.serving.structured import json_object_grammar, schema_grammar
from kairos.serving.tools import ToolPlan, tool_plan

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    model: str | None
    prompt: str | tuple[int, ...] | None  # a completion: text or token ids
    messages: tuple[dict[str, Any], ...] | None  # a chat
    sampling: Sampling  # max_tokens here is the requested one, before fitting the context
    max_tokens_given: bool
    stream: bool
    include_usage: bool
    tools: ToolPlan | None = None

    @property
    def chat(self) -> bool:
        return self.messages is not None


def completion_request(body: Any) -> CompletionRequest:
    """`POST /v1/completions` body -> request; raises LLMRequestError naming the field."""
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        prompt = tuple(prompt)
    elif not isinstance(prompt, str):
        raise LLMRequestError(
            "prompt must be a string (or a list of token ids); send one prompt per request",
            param="prompt",
        )
    _refuse(body, "echo", "suffix", "best_of")
    return _request(body, prompt=prompt, messages=None, default_max=COMPLETION_DEFAULT_MAX_TOKENS)


def chat_request(body: Any) -> CompletionRequest:
    """`POST /v1/chat/completions` body -> request; raises LLMRequestError naming the field."""
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise LLMRequestError(
            'messages must be a non-empty list like [{"role": "user", "content": "Hi"}]',
            param="messages",
        )
    parsed = tuple(_message(m, i) for i, m in enumerate(messages))
    _refuse(body, "functions", "function_call", "top_logprobs")
    plan = tool_plan(body)
    request = _request(body, prompt=None, messages=parsed, default_max=None)
    if plan is None:
        if any(m["role"] == "tool" or m.get("tool_calls") for m in parsed):
            plan = ToolPlan((), "none", False)  # only to render the earlier tool turns
        else:
            return request
    if plan.grammar() is not None and request.sampling.grammar is not None:
        raise LLMRequestError(
            "send either tools (with tool_choice other than none) or response_format, not both",
            param="response_format",
        )
    grammar = plan.grammar() or request.sampling.grammar
    return replace(request, tools=plan, sampling=replace(request.sampling, grammar=grammar))


def tokenize_request(body: Any) -> tuple[str | None, str | None, tuple[dict[str, Any], ...] | None]:
    """`POST /tokenize` (vLLM's shape): {"prompt": str} or {"messages": [...]}, optional model."""
    body = _object(body)
    model = _optional(body, "model", str)
    if "messages" in body:
        return model, None, chat_request({"messages": body["messages"]}).messages
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise LLMRequestError(
            'send {"prompt": "text"} or {"messages": [...]} to count tokens', param="prompt"
        )
    return model, prompt, None


def _request(
    body: Mapping[str, Any],
    *,
    prompt: str | tuple[int, ...] | None,
    messages: tuple[dict[str, Any], ...] | None,
    default_max: int | None,
) -> CompletionRequest:
    n = _optional(body, "n", int)
    if n not in (None, 1):
        raise LLMRequestError(f"n={n!r} is not supported: send n=1 (or omit it)", param="n")
    if body.get("logprobs") not in (None, False):
        raise LLMRequestError(
            "logprobs are not supported by this worker: omit it", param="logprobs"
        )
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = _optional(body, key, int, minimum=1)
    stream = _optional(body, "stream", bool) or False
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise LLMRequestError(
            'stream_options must be an object like {"include_usage": true}', param="stream_options"
        )
    include_usage = bool((options or {}).get("include_usage", False))
    temperature = _optional(body, "temperature", float, minimum=0.0)
    sampling = Sampling(
        max_tokens=max_tokens if max_tokens is not None else (default_max or 1 << 30),
        temperature=1.0 if temperature is None else temperature,
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=int(_number(body, "top_k", 0, 0, None)),
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        repeat_penalty=_number(body, "repetition_penalty", 1.0, 0.0, None),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        seed=_optional(body, "seed", int),
        stop=_stops(body.get("stop")),
        ignore_eos=_optional(body, "ignore_eos", bool) or False,
        grammar=_response_format(body.get("response_format")),
    )
    return CompletionRequest(
        model=_optional(body, "model", str),
        prompt=prompt,
        messages=messages,
        sampling=sampling,
        max_tokens_given=max_tokens is not None,
        stream=stream,
        include_usage=include_usage,
    )


def _response_format(value: Any) -> str | None:
    """GBNF for `response_format`: json_schema and json_object are enforced, text is none."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise LLMRequestError(
                'response_format.json_schema must be {"name": ..., "schema": {...}}',
                param="response_format.json_schema",
            )
        return schema_grammar(spec["schema"])
    raise LLMRequestError(
        'response_format must be {"type": "text" | "json_object" | "json_schema", ...}',
        param="response_format",
    )


def _object(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        raise LLMRequestError("the request body must be a JSON object", param="body")
    return body


def _message(message: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise LLMRequestError(
            f'{where} must be an object like {{"role": "user", "content": "Hi"}}', param=where
        )
    content = message.get("content")
    role = message["role"]
    if role == "assistant" and message.get("tool_calls"):
        calls = message["tool_calls"]
        if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
            raise LLMRequestError(f"{where}.tool_calls must be a list of calls", param=where)
        return {"role": role, "content": content or "", "tool_calls": calls}
    if isinstance(content, list):  # the parts form: keep the text parts, refuse the rest
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise LLMRequestError(
                    f"{where}.content: only text parts are supported by this worker",
                    param=f"{where}.content",
                )
            texts.append(str(part.get("text", "")))
        content = "".join(texts)
    if not isinstance(content, str):
        raise LLMRequestError(f"{where}.content must be a string", param=f"{where}.content")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise LLMRequestError(
                f"{where}: a tool message needs the tool_call_id it answers", param=where
            )
        return {"role": role, "content": content, "tool_call_id": call_id,
                "name": message.get("name")}  # fmt: skip
    return {"role": role, "content": content}


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and len(value) <= 4 and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise LLMRequestError("stop must be a string or a list of up to 4 strings", param="stop")


def _refuse(body: Mapping[str, Any], *names: str) -> None:
    for name in names:
        if body.get(name) not in (None, False, [], ""):
            raise LLMRequestError(f"{name} is not supported by this worker: omit it", param=name)


def _optional(
    body: Mapping[str, Any], name: str, kind: type[Any], *, minimum: float | None = None
) -> Any:
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise LLMRequestError(
            f"{name} must be {'an integer' if kind is int else 'a ' + kind.__name__}, "
            f"not {value!r}",
            param=name,
        )
    if minimum is not None and value < minimum:
        raise LLMRequestError(f"{name} must be at least {minimum}, not {value!r}", param=name)
    return value


def _number(
    body: Mapping[str, Any], name: str, default: float, low: float, high: float | None
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LLMRequestError(f"{name} must be a number, not {value!r}", param=name)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise LLMRequestError(f"{name} must be {bound}, not {value!r}", param=name)
    return float(value)
