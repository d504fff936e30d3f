"""LLM resolvers: a `kr.completion(...)` feature (and its `kr.completion_usage`) or a
`kr.embedding(...)` feature turned into an async resolver whose inputs are the features its
templates read.

The planner and the engine see an ordinary async resolver, run once per entity (concurrently
for a bulk or offline query). It renders the prompt, counts the tokens each input feature
contributed with the model's tokenizer, and sends the request to a `Completer` (the gateway,
in process: keys, budgets, failover and the ledger apply). Streaming is used so time to first
token is measured where the answer arrives; queue and decode times come from the engine when
it reports them (`kairos_timings`, as kairos' own llama.cpp worker does).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import json
import time
from collections.abc import AsyncIterable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from kairos.definitions.completion import CompletionOptions, EmbeddingOptions, UsageOptions
from kairos.definitions.feature import FeatureRef, class_spec, field_of
from kairos.definitions.graph import Graph
from kairos.definitions.types import DataFrame, FeaturesSpec
from kairos.errors import DefinitionError, KairosError, did_you_mean
from kairos.llm.embeddings import LOCAL_MINILM
from kairos.llm.prompts import TEMPLATE, Prompt, Template, Windows
from kairos.llm.tokens import Tokenizer
from kairos.resolvers.calls import Answered, LLMCall
from kairos.resolvers.python import Resolver

# tokens a chat template adds around the messages, kept free when max_tokens is clamped
FORMAT_MARGIN = 32
# A local embedding feature's default timeout: the first call loads the model into memory.
LOCAL_MODEL_TIMEOUT = timedelta(seconds=60)


class CompletionFailed(KairosError, RuntimeError):
    """The model's answer could not be had or read (refused, cut off, not the JSON asked)."""


class Completer(Protocol):
    """Where LLM requests go: OpenAI-shaped bodies in, OpenAI-shaped replies out."""

    async def chat(
        self, body: dict[str, Any], served: dict[str, Any] | None = None
    ) -> dict[str, Any] | AsyncIterable[dict[str, Any]]:
        """`served`, when given, is filled with who answered: request_id, provider,
        deployment, and `cost`, a function from the reply's `usage` to micro-dollars."""
        ...

    async def embed(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def tokenizer(self, model: str) -> Tokenizer: ...

    def context(self, model: str, tokenizer: Tokenizer) -> int | None: ...


@dataclass(frozen=True)
class TemplateInputs:
    """The features a template reads, as resolver inputs, and how to hand them to Jinja."""

    refs: tuple[FeatureRef, ...]  # resolver parameters, in order
    names: tuple[str, ...]  # template variable each parameter feeds
    windows: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name -> windows
    rows: frozenset[str] = frozenset()  # has-many names (lists of rows)
    retrieved: frozenset[str] = frozenset()  # has-many found by kr.nearest: tokens per row

    def values(self, args: tuple[Any, ...]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for ref, name, value in zip(self.refs, self.names, args, strict=True):
            if name in self.windows:
                found.setdefault(name, Windows())[str(ref.window)] = value
            elif name in self.rows:
                found[name] = list(value.rows if isinstance(value, DataFrame) else value or [])
            else:
                found[name] = value
        return found

    def empty(self) -> dict[str, Any]:
        """Each variable with no value: what a feature's tokens are measured against."""
        found: dict[str, Any] = {}
        for name in self.names:
            if name in self.windows:
                found[name] = Windows({w: "" for w in self.windows[name]})
            elif name in self.rows:
                found[name] = []
            else:
                found[name] = ""
        return found


def template_inputs(graph: Graph, output: FeatureRef, variables: frozenset[str]) -> TemplateInputs:
    """Resolver inputs for the variables of a template on `output`'s class."""
    info = graph.cls(output.root)
    where = f"{output.fqn} (its template)"
    refs: list[FeatureRef] = []
    names: list[str] = []
    windows: dict[str, tuple[str, ...]] = {}
    rows: set[str] = set()
    retrieved: set[str] = set()
    for name in sorted(variables):
        if name in info.windowed:
            found = tuple(n[len(name) + 1 : -1] for n in info.features if n.startswith(name + "["))
            windows[name] = found
            for window in found:
                refs.append(FeatureRef(output.root, (), name, window))
                names.append(name)
            continue
        feature = info.features.get(name)
        if feature is None:
            raise DefinitionError(
                f"{where} uses {name!r}, which is not a feature of {output.root}"
                f"{did_you_mean(name, [*info.features, *info.windowed])}"
            )
        if name == output.name:
            raise DefinitionError(f"{where} reads the feature it computes")
        if feature.kind == "has_one":
            raise DefinitionError(
                f"{where} uses the relation {name!r}; declare the value it reads as a feature "
                f"of {output.root} (e.g. `{name}_name: str = _.{name}.name`) and use that"
            )
        if feature.kind == "has_many":
            rows.add(name)
            if feature.nearest is not None:
                retrieved.add(name)
        refs.append(FeatureRef(output.root, (), name))
        names.append(name)
    return TemplateInputs(tuple(refs), tuple(names), windows, frozenset(rows), frozenset(retrieved))


class CompletionResolver(Resolver[..., Any]):
    """Renders one `kr.completion` feature's prompt per entity and asks the model."""

    def __init__(
        self,
        output: FeatureRef,
        options: CompletionOptions,
        inputs: TemplateInputs,
        prompt: Prompt,
        usage: FeatureRef | None,
        completer: Callable[[], Completer],
    ) -> None:
        self.output = output
        self.options = options
        self.inputs = inputs
        self.prompt = prompt
        self.usage = usage
        self._completer = completer
        fn = self._make_function()
        super().__init__(fn, "online", options.timeout, f"llm:{output.fqn}")

    @functools.cached_property
    def version(self) -> str:
        """The model and a hash of the prompt, so the query log says what produced a value."""
        text = json.dumps(
            [
                self.options.model,
                [[m.role, m.template] for m in self.options.messages],
                self.options.max_tokens,
                self.options.temperature,
                self.options.seed,
                self.options.schema,
                self.options.stop,
                self.options.extra_body,
            ],
            sort_keys=True,
            default=str,
        )
        return f"{self.options.model}#{hashlib.sha256(text.encode()).hexdigest()[:10]}"

    @property
    def where(self) -> str:
        return f"{self.output.fqn} = kr.completion(model={self.options.model!r}, ...)"

    def __repr__(self) -> str:
        return f"<llm resolver {self.options.model} -> {self.output.fqn}>"

    def _make_function(self) -> Callable[..., Any]:
        async def complete(*args: Any) -> Any:
            return await self.complete(self.inputs.values(args))

        parameters = [
            inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ref)
            for i, ref in enumerate(self.inputs.refs)
        ]
        returned: Any = self.output
        if self.usage is not None:
            returned = FeaturesSpec((self.output, self.usage))
        complete.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            parameters, return_annotation=returned
        )
        complete.__name__ = complete.__qualname__ = f"complete_{self.output.name}"
        return complete

    async def complete(self, values: dict[str, Any]) -> Answered:
        completer = self._completer()
        options = self.options
        started = time.perf_counter()
        messages = self.prompt.render(values)
        # off the event loop: a first use loads a GGUF vocabulary (a second, on a CPU)
        tokenizer = await asyncio.to_thread(completer.tokenizer, options.model)
        by_feature = self.prompt.attribute(
            values, self.inputs.empty(), tokenizer.count, messages, self.inputs.retrieved
        )
        body: dict[str, Any] = {
            "model": options.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for key in ("temperature", "seed"):
            if getattr(options, key) is not None:
                body[key] = getattr(options, key)
        if options.stop:
            body["stop"] = list(options.stop)
        body.update(options.extra_body or {})
        max_tokens = self._fit(by_feature, completer.context(options.model, tokenizer))
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if options.schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": self.output.name, "schema": dict(options.schema)},
            }
        assembled = time.perf_counter()
        served: dict[str, Any] = {}
        answer = await _collect(await completer.chat(body, served), assembled)
        finished = time.perf_counter()
        prompt_tokens = answer.usage.get("prompt_tokens")
        counted = sum(by_feature.values())
        if isinstance(prompt_tokens, int) and tokenizer.exact:
            # chat formatting and special tokens: what the engine counted beyond the contents
            by_feature["(format)"] = max(prompt_tokens - counted, 0)
        # the engine's own timings (a kairos worker's queue and prefill) fill what this side
        # cannot see; TTFT, decode and totals are measured here, the same for every upstream
        engine = {k: v for k, v in answer.timings.items() if k.endswith(("_ms", "_per_s"))}
        usage = {
            **engine,
            "feature": self.output.fqn,
            "model": answer.model or options.model,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": answer.usage.get("completion_tokens"),
            "tokens_by_feature": by_feature,
            "tokenizer": tokenizer.name,
            "exact": tokenizer.exact,
            "render_ms": round((assembled - started) * 1000, 3),
            "ttft_ms": answer.ttft_ms if answer.ttft_ms is not None else engine.get("ttft_ms"),
            "total_ms": round((finished - assembled) * 1000, 3),
        }
        if answer.ttft_ms is not None and answer.decode_ms is not None:
            usage["decode_ms"] = answer.decode_ms
            tokens = answer.usage.get("completion_tokens")
            if isinstance(tokens, int) and tokens > 1 and answer.decode_ms > 0:
                usage["tokens_per_s"] = round((tokens - 1) / answer.decode_ms * 1000, 2)
        # the decision record: what was sent, who answered, what it cost
        call = LLMCall(
            {
                **usage,
                **_billed(served, answer.usage, by_feature),
                "row": None,  # the engine's: the query row this call computed
                "version": self.version,
                "messages": messages,
                "answer": answer.text,
                "sent_at": assembled,
            }
        )
        try:
            value = self._parse(answer.text)
        except CompletionFailed as error:  # made and paid for: the record keeps it all the same
            return Answered(None, call, error)
        return Answered(value if self.usage is None else (value, usage), call)

    def _fit(self, by_feature: Mapping[str, int], context: int | None) -> int | None:
        """`max_tokens`, clamped so the prompt and the answer fit the model's context; a
        prompt that leaves no room fails naming the features that fill it."""
        wanted = self.options.max_tokens
        if context is None:
            return wanted
        prompt = sum(by_feature.values()) + FORMAT_MARGIN
        room = context - prompt
        if room < 1:
            largest = sorted(
                ((n, c) for n, c in by_feature.items() if n != TEMPLATE), key=lambda x: -x[1]
            )[:3]
            named = ", ".join(f"{n} ({c} tokens)" for n, c in largest)
            raise CompletionFailed(
                f"{self.output.fqn}: the prompt is about {prompt} tokens and the model's context "
                f"is {context}; shorten what fills it: {named}"
            )
        return room if wanted is None else min(wanted, room)

    def _parse(self, text: str) -> Any:
        if self.options.schema is None:
            return text
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            raise CompletionFailed(
                f"{self.output.fqn}: the model's answer is not the JSON the schema asks for: "
                f"{text[:80]!r}"
            ) from None
        parser = self.options.parser
        if parser is None:
            return parsed
        try:
            return parser.model_validate(parsed).model_dump(mode="json")
        except Exception as error:  # pydantic's ValidationError, named in the message
            raise CompletionFailed(
                f"{self.output.fqn}: the answer does not fit {parser.__name__}: {error}"
            ) from None


def _billed(
    served: Mapping[str, Any], usage: Mapping[str, Any], by_feature: Mapping[str, int]
) -> dict[str, Any]:
    """Who served a call and what it cost in USD (as the provider bills the reported usage,
    prompt-cache reads included), and per prompt feature: its share of the prompt's cost by
    its tokens, when the completer said (the gateway does)."""
    billed: dict[str, Any] = {
        name: served.get(name) for name in ("request_id", "provider", "deployment", "attempts")
    }
    cost: Callable[[dict[str, Any]], int | None] | None = served.get("cost")
    micros = cost(dict(usage)) if cost is not None and usage else None
    if cost is None or micros is None:
        return {**billed, "cost_usd": None, "cost_by_feature": None}
    # a feature's prompt tokens at the input rate, or at the prompt's average rate when the
    # provider's prompt cache made it cheaper (which tokens were cached is not known)
    full = (cost({"prompt_tokens": 1_000_000, "completion_tokens": 0}) or 0) / 1e12
    tokens = sum(by_feature.values())
    prompt = (cost({**usage, "completion_tokens": 0}) or 0) / 1e6
    rate = min(full, prompt / tokens) if tokens else full
    billed["cost_usd"] = micros / 1e6
    billed["cost_by_feature"] = {name: n * rate for name, n in by_feature.items()}
    return billed


@dataclass
class _Answer:
    text: str
    model: str | None
    usage: dict[str, Any]
    timings: dict[str, Any]
    ttft_ms: float | None
    decode_ms: float | None


async def _collect(reply: dict[str, Any] | AsyncIterable[dict[str, Any]], sent: float) -> _Answer:
    """The text, usage and timings of a chat reply, streamed or not."""
    if isinstance(reply, dict):
        choice = (reply.get("choices") or [{}])[0]
        text = (choice.get("message") or {}).get("content") or ""
        return _Answer(
            text,
            reply.get("model"),
            dict(reply.get("usage") or {}),
            dict(reply.get("kairos_timings") or {}),
            None,
            None,
        )
    pieces: list[str] = []
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    model = None
    first = last = None
    async for chunk in reply:
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise CompletionFailed(f"the model stream failed: {message}")
        model = chunk.get("model") or model
        for choice in chunk.get("choices") or ():
            delta = (choice.get("delta") or {}).get("content")
            if delta:
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
                pieces.append(delta)
        if chunk.get("usage"):
            usage = dict(chunk["usage"])
        if chunk.get("kairos_timings"):
            timings = dict(chunk["kairos_timings"])
    ttft = None if first is None else round((first - sent) * 1000, 3)
    decode = None if first is None or last is None else round((last - first) * 1000, 3)
    return _Answer("".join(pieces), model, usage, timings, ttft, decode)


class EmbeddingResolver(Resolver[..., Any]):
    """Renders one `kr.embedding` feature's input per entity and asks for its vector."""

    def __init__(
        self,
        output: FeatureRef,
        options: EmbeddingOptions,
        inputs: TemplateInputs,
        template: Template,
        completer: Callable[[], Completer],
    ) -> None:
        self.output = output
        self.options = options
        self.inputs = inputs
        self.template = template
        self._completer = completer

        async def embed(*args: Any) -> Any:
            text = self.template.render(self.inputs.values(args))
            return (await self.embed_texts([text]))[0]

        embed.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [
                inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=r)
                for i, r in enumerate(inputs.refs)
            ],
            return_annotation=output,
        )
        embed.__name__ = embed.__qualname__ = f"embed_{output.name}"
        timeout = options.timeout
        if timeout is None and options.model == LOCAL_MINILM:
            timeout = LOCAL_MODEL_TIMEOUT  # its first call loads the model, seconds on a CPU
        super().__init__(embed, "online", timeout, f"embedding:{output.fqn}")

    @property
    def version(self) -> str:
        return f"{self.options.model}#embedding"

    def text(self, row: Mapping[str, Any]) -> str:
        """The input text for a row of the class's feature values (a written event)."""
        missing = [r.name for r in self.inputs.refs if r.name not in row and not r.window]
        if missing:
            raise CompletionFailed(f"{self.output.fqn}: the row has no {', '.join(missing)}")
        return self.template.render(
            self.inputs.values(tuple(row[r.name] for r in self.inputs.refs))
        )

    async def embed_texts(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in one call to the model."""
        reply = await self._completer().embed({"model": self.options.model, "input": texts})
        data = sorted(reply.get("data") or [], key=lambda d: d.get("index", 0))
        if len(data) != len(texts) or any("embedding" not in d for d in data):
            raise CompletionFailed(
                f"{self.output.fqn}: the embedding reply has {len(data)} vectors for "
                f"{len(texts)} texts"
            )
        return [[float(x) for x in d["embedding"]] for d in data]


def completion_resolver(
    graph: Graph,
    output: FeatureRef,
    options: CompletionOptions,
    completer: Callable[[], Completer],
    usage: FeatureRef | None = None,
) -> CompletionResolver:
    """The resolver of one `kr.completion` feature (`options`: what `kr.completion(...)`
    returned, the declared one or a new prompt to replay)."""
    prompt = Prompt.compile(options.messages, f"{output.fqn} = kr.completion(...)")
    inputs = template_inputs(graph, output, prompt.variables)
    return CompletionResolver(output, options, inputs, prompt, usage, completer)


def llm_resolvers(graph: Graph, completer: Callable[[], Completer]) -> list[Resolver[..., Any]]:
    """One resolver per `kr.completion` / `kr.embedding` feature of the graph."""
    made: list[Resolver[..., Any]] = []
    for namespace, info in graph.classes.items():
        spec = class_spec(info.cls)
        if spec is None:
            continue
        declared = {name: field_of(f).options for name, f in spec.features.items()}
        usages: dict[str, str] = {}
        for name, options in declared.items():
            if isinstance(options, UsageOptions):
                source = declared.get(options.source)
                if not isinstance(source, CompletionOptions):
                    raise DefinitionError(
                        f"{namespace}.{name} = kr.completion_usage({options.source!r}): "
                        f"{namespace}.{options.source} is not a kr.completion feature"
                    )
                if options.source in usages:
                    raise DefinitionError(
                        f"{namespace}.{options.source} has two usage features "
                        f"({usages[options.source]}, {name}); keep one"
                    )
                usages[options.source] = name
        for name, options in declared.items():
            output = FeatureRef(namespace, (), name)
            if isinstance(options, CompletionOptions):
                usage = usages.get(name)
                made.append(
                    completion_resolver(
                        graph,
                        output,
                        options,
                        completer,
                        None if usage is None else FeatureRef(namespace, (), usage),
                    )
                )
            elif isinstance(options, EmbeddingOptions):
                template = Template.compile(options.input, f"{output.fqn} = kr.embedding(...)")
                inputs = template_inputs(graph, output, template.variables)
                made.append(EmbeddingResolver(output, options, inputs, template, completer))
    return made


__all__ = [
    "TEMPLATE",
    "Completer",
    "CompletionFailed",
    "CompletionResolver",
    "EmbeddingResolver",
    "completion_resolver",
    "llm_resolvers",
]
