"""The bounds of what a client sends the gateway: the range of every integer field it reads
and the longest model name, in one place (docs/gateway.md lists them). Each is checked before
anything is held, stored or sent; out of range is a 400 naming the field and its range.

An output limit (`max_tokens` and its kin) is at most 2**31 - 1, PostgreSQL's `integer`; with
`n` at most 128 and at most 2048 prompts a completion, a call's whole hold stays under the
10**15 a budget counter may hold exactly (keys.MAX_AMOUNT), and its cost fits 64 bits at any
price up to $10,000 per million tokens.

>>> integer({"n": 2}, "n", 1, MOST_CHOICES, "answers to generate")
2
"""

from __future__ import annotations

import reprlib
from typing import Any

from kairos.gateway.errors import InvalidRequest

MAX_TOKENS = 2**31 - 1  # output tokens a limit may ask for
MOST_CHOICES = 128  # n: OpenAI's own limit
MOST_PROMPTS = 2048  # prompts in one completion (each is held as n answers)
MOST_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs
MOST_LOGPROBS = 5  # the completions API's limit on logprobs
MOST_LOGIT_BIAS = 100  # a logit_bias value is from -100 to 100
INT64 = (-(2**63), 2**63 - 1)  # seed
MAX_MODEL_NAME = 256  # characters of a requested model name (and of a ledger row's)

_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60
_SHOWN.maxdict = _SHOWN.maxlist = 4
_SHOWN.maxlevel = 2


def integer(body: dict[str, Any], name: str, low: int, high: int, what: str) -> int | None:
    """`body[name]` when it is an integer from `low` to `high` (None when absent or null);
    else a 400 naming the field, its range and what it counts."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidRequest(
            f"{name} must be an integer from {low} to {high} ({what}), got {shown(value)}",
            param=name,
        )
    return value


def model_name(body: dict[str, Any], example: str) -> str:
    """The requested model: a name of 1 to MAX_MODEL_NAME characters, else a 400."""
    model = body.get("model")
    if not isinstance(model, str) or not model or len(model) > MAX_MODEL_NAME:
        raise InvalidRequest(
            f"model must be a model name of 1 to {MAX_MODEL_NAME} characters, e.g. {example!r} "
            "(GET /v1/models lists the ones your key may use)",
            param="model",
        )
    return model


def shown(value: Any) -> str:
    """`value` as an error message may quote it: its repr, cut short (a client's 8 MiB string
    is not sent back to it, nor logged, whole).

    >>> shown("x" * 1000)[:10], len(shown("x" * 1000))
    ("'xxxxxxxxx", 60)
    """
    return _SHOWN.repr(value)


def cut(name: str) -> str:
    """A field name (or path) a client chose, as an error names it: cut to 60 characters.

    >>> cut("temperature"), len(cut("x" * 1000))
    ('temperature', 60)
    """
    return name if len(name) <= 60 else name[:57] + "..."
