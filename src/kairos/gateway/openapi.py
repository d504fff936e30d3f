"""The OpenAPI document of the gateway (`GET /openapi.json` on `kairos gateway serve`): its
routes, the fields the gateway itself reads with their bounds (bounds.py, keys.py), and its
error shapes. Other fields of a call body go to the provider as sent, so call bodies take
additional properties. It names no model: which models a key may use is `GET /v1/models`,
behind the key.

>>> sorted(openapi_document()["paths"])[:3]
['/admin/keys', '/admin/keys/{id}', '/admin/usage']
"""

from __future__ import annotations

from typing import Any

from kairos.gateway.bounds import (
    INT64,
    MAX_MODEL_NAME,
    MAX_TOKENS,
    MOST_CHOICES,
    MOST_LOGIT_BIAS,
    MOST_LOGPROBS,
    MOST_PROMPTS,
    MOST_TOP_LOGPROBS,
)
from kairos.gateway.edge import MAX_BODY
from kairos.gateway.keys import MAX_AMOUNT, MAX_PER_MINUTE, MAX_USD, MOST_KEY_MODELS


def _integer(low: int, high: int, text: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": high, "description": text}


def _model(example: str) -> dict[str, Any]:
    return {
        "type": "string", "minLength": 1, "maxLength": MAX_MODEL_NAME, "example": example,
        "description": "A model group or alias of the gateway (GET /v1/models)",
    }  # fmt: skip


_OUTPUT = _integer(1, MAX_TOKENS, "Output tokens at most")
_STREAM = {"type": "boolean"}
_N = _integer(1, MOST_CHOICES, "Answers to generate, each held and billed")
_SEED = _integer(*INT64, "Sampling seed")
_LOGIT_BIAS = {
    "type": "object",
    "additionalProperties": {"type": "number", "minimum": -MOST_LOGIT_BIAS,
                             "maximum": MOST_LOGIT_BIAS},
}  # fmt: skip
_STOP = {
    "oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    ]
}
_CHAT_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "example": "user"},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    },
}
_ANTHROPIC_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"type": "string", "enum": ["user", "assistant"]},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    },
}
_HI = [{"role": "user", "content": "Say hi"}]

_CHAT = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": _model("gpt-4o-mini"),
        "messages": {"type": "array", "minItems": 1, "items": _CHAT_MESSAGE},
        "max_tokens": _OUTPUT,
        "max_completion_tokens": _OUTPUT,
        "n": _N,
        "seed": _SEED,
        "top_logprobs": _integer(0, MOST_TOP_LOGPROBS, "Likeliest tokens per position"),
        "logprobs": {"type": "boolean"},
        "logit_bias": _LOGIT_BIAS,
        "stop": _STOP,
        "stream": _STREAM,
        "stream_options": {"type": "object", "properties": {"include_usage": _STREAM}},
        "temperature": {"type": "number"},
        "top_p": {"type": "number"},
        "user": {"type": "string"},
        "tools": {"type": "array", "items": {"type": "object"}},
        "response_format": {"type": "object"},
    },
    "example": {"model": "gpt-4o-mini", "messages": _HI, "max_tokens": 64},
}
_PROMPT = {
    "oneOf": [
        {"type": "string"},
        {"type": "array", "minItems": 1, "maxItems": MOST_PROMPTS, "items": {"type": "string"}},
        {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
    ]
}
_COMPLETION = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        "model": _model("gpt-4o-mini"),
        "prompt": _PROMPT,
        "max_tokens": _OUTPUT,
        "n": _N,
        "seed": _SEED,
        "logprobs": _integer(0, MOST_LOGPROBS, "Likeliest tokens per position"),
        "best_of": {"type": "integer", "enum": [1]},
        "logit_bias": _LOGIT_BIAS,
        "stop": _STOP,
        "stream": _STREAM,
        "stream_options": {"type": "object", "properties": {"include_usage": _STREAM}},
        "suffix": {"type": "string"},
        "echo": {"type": "boolean"},
    },
    "example": {"model": "gpt-4o-mini", "prompt": "Say hi", "max_tokens": 16},
}
_EMBEDDING = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": _model("text-embedding-3-small"),
        "input": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "minItems": 1, "items": {"type": "string"}},
            ]
        },
        "dimensions": _integer(1, MAX_TOKENS, "Of each embedding"),
        "encoding_format": {"type": "string", "enum": ["float", "base64"]},
        "user": {"type": "string"},
    },
    "example": {"model": "text-embedding-3-small", "input": "hello"},
}
_RESPONSES = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": _model("gpt-4o-mini"),
        "input": {
            "oneOf": [
                {"type": "string"},
                {"type": "array", "minItems": 1, "items": {"type": "object"}},
            ]
        },
        "instructions": {"type": "string"},
        "max_output_tokens": _OUTPUT,
        "top_logprobs": _integer(0, MOST_TOP_LOGPROBS, "Likeliest tokens per position"),
        "max_tool_calls": _integer(1, MAX_TOKENS, "Built-in tool calls"),
        "stream": _STREAM,
        "temperature": {"type": "number"},
        "top_p": {"type": "number"},
        "user": {"type": "string"},
    },
    "example": {"model": "gpt-4o-mini", "input": "Say hi", "max_output_tokens": 64},
}
_MESSAGES_COMMON = {
    "model": _model("claude-haiku-4-5"),
    "messages": {"type": "array", "minItems": 1, "items": _ANTHROPIC_MESSAGE},
    "system": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
    "tools": {"type": "array", "items": {"type": "object"}},
    "tool_choice": {"type": "object"},
}
_MESSAGES = {
    "type": "object",
    "required": ["model", "messages", "max_tokens"],
    "additionalProperties": False,  # a field /v1/messages does not take is a 400 naming it
    "properties": {
        **_MESSAGES_COMMON,
        "max_tokens": _OUTPUT,
        "temperature": {"type": "number"},
        "top_p": {"type": "number"},
        "stop_sequences": {"type": "array", "items": {"type": "string"}},
        "stream": _STREAM,
        "metadata": {
            "type": "object",
            "properties": {"user_id": {"type": "string"}},
            "additionalProperties": False,
        },
    },
    "example": {"model": "claude-haiku-4-5", "messages": _HI, "max_tokens": 64},
}
_COUNT = {
    "type": "object",
    "required": ["model", "messages"],
    "additionalProperties": False,
    "properties": _MESSAGES_COMMON,
    "example": {"model": "claude-haiku-4-5", "messages": _HI},
}
_BUDGET = {
    "type": "object",
    "required": ["period"],
    "additionalProperties": False,
    "properties": {
        "period": {"type": "string", "enum": ["day", "month", "total"]},
        "usd": {"type": "number", "minimum": 0, "maximum": MAX_USD},
        "usd_micros": _integer(0, MAX_AMOUNT, "Micro-dollars"),
        "tokens": _integer(0, MAX_AMOUNT, "Tokens, input plus output"),
    },
}
_NEW_KEY = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "models": {
            "type": "array",
            "minItems": 1,
            "maxItems": MOST_KEY_MODELS,
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_NAME},
        },
        "rpm": _integer(1, MAX_PER_MINUTE, "Requests per minute"),
        "tpm": _integer(1, MAX_PER_MINUTE, "Tokens per minute"),
        "budgets": {"type": "array", "items": _BUDGET},
        "expires_at": {"type": "string", "format": "date-time"},
    },
    "example": {"name": "billing", "models": ["chat"], "budgets": [{"period": "day", "usd": 5}]},
}
_OPENAI_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string"},
            },
        }
    },
}
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"type": "string", "enum": ["error"]},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_ERRORS = {
    400: "A field out of its range or shape; the message names it and the fix",
    401: "No key, or a key that is unknown, revoked or expired",
    403: "The key may not use the model",
    404: "No such model (or one the key may not use), key or route",
    413: f"A body over {MAX_BODY} bytes",
    422: "An admin field out of its range; `param` names it",
    429: "A rate limit or budget is used up (see Retry-After)",
    502: "The provider failed",
    503: "Every deployment is failing, or the budget store is unreachable",
}


def _responses(ok: str, errors: tuple[int, ...], anthropic: bool = False) -> dict[str, Any]:
    shape = "AnthropicError" if anthropic else "Error"
    answers: dict[str, Any] = {
        ok: {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}}
    }
    for status in errors:
        answers[str(status)] = {
            "description": _ERRORS[status],
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{shape}"}}},
        }
    return answers


_CALL_ERRORS = (400, 401, 403, 404, 413, 429, 502, 503)


def _call(summary: str, schema: str, *, anthropic: bool = False) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"key": []}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}
                },
            },
            "responses": _responses("200", _CALL_ERRORS, anthropic),
        }
    }


def _get(summary: str, security: str | None, errors: tuple[int, ...] = ()) -> dict[str, Any]:
    operation: dict[str, Any] = {"summary": summary, "responses": _responses("200", errors)}
    if security is not None:
        operation["security"] = [{security: []}]
    return operation


def _path_id(name: str, text: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string",
            "minLength": 1}, "description": text}  # fmt: skip


def openapi_document() -> dict[str, Any]:
    """The gateway's OpenAPI 3.0 document: the same for every configuration."""
    usage_query = [
        {"name": "key", "in": "query", "schema": {"type": "string"}, "description": "A key id"},
        *(
            {"name": name, "in": "query", "schema": {"type": "string", "format": "date-time"},
             "description": "ISO 8601; UTC when it names no zone"}
            for name in ("since", "until")
        ),
        {"name": "rows", "in": "query", "schema": {"type": "string", "enum": ["1", "true"]},
         "description": "Include the ledger rows"},
    ]  # fmt: skip
    return {
        "openapi": "3.0.3",
        "info": {"title": "kairos gateway", "version": "0.1.0"},
        "components": {
            "securitySchemes": {
                "key": {"type": "http", "scheme": "bearer", "description": "A gateway key"},
                "admin": {"type": "http", "scheme": "bearer", "description": "The admin key"},
            },
            "schemas": {
                "Error": _OPENAI_ERROR,
                "AnthropicError": _ANTHROPIC_ERROR,
                "ChatCompletionRequest": {**_CHAT, "additionalProperties": True},
                "CompletionRequest": {**_COMPLETION, "additionalProperties": True},
                "EmbeddingRequest": {**_EMBEDDING, "additionalProperties": True},
                "ResponseRequest": {**_RESPONSES, "additionalProperties": True},
                "MessageRequest": _MESSAGES,
                "CountTokensRequest": _COUNT,
                "NewKey": _NEW_KEY,
            },
        },
        "paths": {
            "/v1/chat/completions": _call("A chat completion", "ChatCompletionRequest"),
            "/v1/completions": _call("A text completion", "CompletionRequest"),
            "/v1/embeddings": _call("Embeddings", "EmbeddingRequest"),
            "/v1/responses": _call("A response (OpenAI's Responses API)", "ResponseRequest"),
            "/v1/messages": _call("A message (Anthropic's API)", "MessageRequest", anthropic=True),
            "/v1/messages/count_tokens": _call(
                "Input tokens of a message", "CountTokensRequest", anthropic=True
            ),
            "/v1/models": {"get": _get("The models the key may use", "key", (401,))},
            "/v1/models/{model}": {
                "get": {
                    **_get("A model the key may use", "key", (401, 404)),
                    "parameters": [_path_id("model", "A model group or alias")],
                }
            },
            "/admin/keys": {
                "post": {
                    "summary": "Create a key (shown once)",
                    "security": [{"admin": []}],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/NewKey"}}
                        },
                    },
                    "responses": _responses("201", (400, 401, 413, 422)),
                },
                "get": _get("Every key (never a secret)", "admin", (401,)),
            },
            "/admin/keys/{id}": {
                "delete": {
                    **_get("Revoke a key", "admin", (401, 404)),
                    "parameters": [_path_id("id", "A key id")],
                }
            },
            "/admin/usage": {
                "get": {
                    **_get("Usage totals per key and model", "admin", (400, 401)),
                    "parameters": usage_query,
                }
            },
            "/healthz": {"get": _get("Liveness", None)},
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {"200": {"description": "OK", "content": {"text/plain": {}}}},
                }
            },
            "/openapi.json": {"get": _get("This document", None)},
        },
    }
