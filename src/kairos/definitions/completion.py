"""Features computed by an LLM from a prompt built of other features.

    @features
    class User:
        id: str
        name: str
        txn_count: Windowed[int] = windowed("1d", "7d", expression=...)
        transactions: DataFrame[Transaction]
        advice: str = kr.completion(
            model="local/gemma-270m",
            messages=[
                kr.message("system", "You are a careful fraud analyst. Answer in one line."),
                kr.message("user", "{{ name }} made {{ txn_count['1d'] }} payments today. Risky?"),
            ],
            max_tokens=32,
            temperature=0,
        )
        advice_usage: dict = kr.completion_usage("advice")   # tokens, per-feature tokens, timings
        profile: list = kr.embedding(model="local/minilm", input="{{ name }}")
        bio_vector: Vector[384] = kr.embedding(model="local/minilm", input=_.bio)

Templates are Jinja2, rendered in a sandbox. A template names the class's features directly
(`{{ name }}`); a windowed feature is a mapping from window to value (`txn_count['7d']`); a
has-many feature is its list of rows (`{% for t in transactions %}{{ t.amount }}{% endfor %}`).
With `schema=` (a JSON schema, or a pydantic model class) the model is asked for JSON and the
feature's value is the parsed object. Like `windowed(...)` and `kr.predict(...)`, these only
record declarations; the client turns them into resolvers. No I/O here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kairos.definitions import expressions as ex
from kairos.definitions.durations import DurationLike, optional_duration
from kairos.definitions.feature import MISSING, FeatureOptions
from kairos.errors import DefinitionError

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message whose content is a template over features."""

    role: str
    template: str


def message(role: str, template: str) -> Message:
    """A chat message: `kr.message("user", "Hello {{ name }}")`."""
    if role not in ROLES:
        raise DefinitionError(f"message role {role!r} is not one of {', '.join(ROLES)}")
    if not isinstance(template, str):
        raise DefinitionError(f"message({role!r}, ...): the template must be a string")
    return Message(role, template)


@dataclass(frozen=True, slots=True)
class CompletionOptions(FeatureOptions):
    """A feature whose value is an LLM's answer to messages rendered from other features."""

    model: str = ""
    messages: tuple[Message, ...] = ()
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    schema: Mapping[str, Any] | None = None  # JSON schema of the answer
    parser: Any = None  # a pydantic model class the answer is validated with
    timeout: timedelta | None = None
    stop: tuple[str, ...] = ()
    extra_body: Mapping[str, Any] | None = None  # provider-specific request fields


@dataclass(frozen=True, slots=True)
class UsageOptions(FeatureOptions):
    """A feature holding the usage and timings of the completion feature `source`."""

    source: str = ""


@dataclass(frozen=True, slots=True)
class EmbeddingOptions(FeatureOptions):
    """A feature whose value is the embedding vector of a template over other features."""

    model: str = ""
    input: str = ""
    timeout: timedelta | None = None


def completion(
    *,
    model: str,
    messages: Sequence[Message | tuple[str, str]],
    max_tokens: int | None = None,
    temperature: float | None = None,
    seed: int | None = None,
    schema: Any = None,
    stop: Sequence[str] = (),
    extra_body: Mapping[str, Any] | None = None,
    timeout: DurationLike | None = None,
    max_staleness: DurationLike | None = None,
    description: str | None = None,
    tags: Iterable[str] = (),
    owner: str | None = None,
) -> Any:
    """Declare a feature as an LLM completion of `messages` (templates over features), sent
    through the gateway to `model` (a model group or alias the gateway knows). `extra_body`
    adds fields a provider understands (e.g. `{"ignore_eos": True}` for llama.cpp or vLLM)."""
    if not isinstance(model, str) or not model:
        raise DefinitionError("completion(model=...): name the model (a gateway model group)")
    if isinstance(messages, str | Message) or not messages:
        raise DefinitionError(
            "completion(messages=[...]): give a list of kr.message(role, template)"
        )
    checked = []
    for item in messages:
        if isinstance(item, Message):
            checked.append(item)
        elif isinstance(item, tuple) and len(item) == 2:
            checked.append(message(*item))
        else:
            raise DefinitionError(
                f"completion(messages=...): {item!r} is not kr.message(role, template)"
            )
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise DefinitionError(f"completion(max_tokens={max_tokens!r}) must be a positive int")
    if temperature is not None and not 0 <= temperature <= 2:
        raise DefinitionError(f"completion(temperature={temperature!r}) must be in [0, 2]")
    json_schema, parser = _schema(schema)
    if isinstance(stop, str) or not all(isinstance(s, str) for s in stop):
        raise DefinitionError(f"completion(stop={stop!r}) is a list of strings")
    reserved = {"model", "messages", "stream", "stream_options", "max_tokens"}
    if extra_body is not None and (
        not isinstance(extra_body, Mapping) or reserved & set(extra_body)
    ):
        raise DefinitionError(
            f"completion(extra_body=...) is a dict of extra request fields; it cannot set "
            f"{', '.join(sorted(reserved))}"
        )
    return CompletionOptions(
        default=MISSING,
        max_staleness=optional_duration(max_staleness, field="max_staleness"),
        description=description,
        tags=tuple(tags),
        owner=owner,
        model=model,
        messages=tuple(checked),
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        schema=json_schema,
        parser=parser,
        timeout=optional_duration(timeout, field="timeout"),
        stop=tuple(stop),
        extra_body=None if extra_body is None else dict(extra_body),
    )


def completion_usage(source: str, *, description: str | None = None) -> Any:
    """Declare a feature holding the usage of completion feature `source` (same class): prompt
    and completion tokens, tokens per input feature, queue/TTFT/decode times, tokens/s."""
    if not isinstance(source, str) or not source:
        raise DefinitionError("completion_usage(source): name the completion feature")
    return UsageOptions(default=MISSING, description=description, source=source)


def embedding(
    *,
    model: str,
    input: Any,
    timeout: DurationLike | None = None,
    max_staleness: DurationLike | None = None,
    description: str | None = None,
    tags: Iterable[str] = (),
    owner: str | None = None,
) -> Any:
    """Declare a feature as the embedding (list of floats, or `Vector[n]`) of a text: a
    template over features (`"{{ title }}: {{ text }}"`) or a `_` expression naming features
    and joining them with string literals (`_.text`, `_.title + ": " + _.text`)."""
    if not isinstance(model, str) or not model:
        raise DefinitionError("embedding(model=...): name the embedding model")
    if isinstance(input, ex.Expr):
        input = _template_of(input, input)
    if not isinstance(input, str):
        raise DefinitionError(
            f"embedding(input={input!r}): give a template string or a `_` expression such as _.text"
        )
    return EmbeddingOptions(
        default=MISSING,
        max_staleness=optional_duration(max_staleness, field="max_staleness"),
        description=description,
        tags=tuple(tags),
        owner=owner,
        model=model,
        input=input,
        timeout=optional_duration(timeout, field="timeout"),
    )


def _template_of(node: ex.Expr, whole: ex.Expr) -> str:
    """The template that renders what a text expression computes: `_.title + ": " + _.text`
    is `{{ title }}{% raw %}: {% endraw %}{{ text }}`."""
    if isinstance(node, ex.Col) and len(node.path) == 1:
        window = f"[{node.window!r}]" if node.window else ""
        return "{{ " + node.path[0] + window + " }}"
    if isinstance(node, ex.Lit) and isinstance(node.value, str) and "{%" not in node.value:
        return "{% raw %}" + node.value + "{% endraw %}"
    if isinstance(node, ex.BinOp) and node.op == "+":
        return _template_of(node.left, whole) + _template_of(node.right, whole)
    if isinstance(node, ex.Call) and node.fn == "str.concat":
        return "".join(_template_of(arg, whole) for arg in node.args)
    raise DefinitionError(
        f"embedding(input={whole!r}): a `_` input names features of the class and joins them "
        f"with string literals (e.g. _.title + ': ' + _.text); {node!r} is not one of those. "
        "For anything else, declare the text as its own feature and embed that"
    )


def _schema(schema: Any) -> tuple[Mapping[str, Any] | None, Any]:
    """(JSON schema, pydantic model class or None) from what the user gave."""
    if schema is None:
        return None, None
    if isinstance(schema, Mapping):
        return dict(schema), None
    json_schema = getattr(schema, "model_json_schema", None)
    if callable(json_schema):
        return json_schema(), schema
    raise DefinitionError(
        f"completion(schema={schema!r}): give a JSON schema dict or a pydantic model class"
    )
