"""Python resolvers: `@online` and `@offline` functions whose signatures are the graph.

    @online
    def balance(uid: User.id) -> User.balance: ...

    @online(timeout="200ms")
    async def profile(uid: User.id, now: Now) -> Features[User.name, User.email]: ...

The decorated object is still a plain callable, so users unit-test it by calling it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import inspect
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, ParamSpec, TypeVar, overload

from kairos import telemetry
from kairos.definitions.durations import DurationLike, optional_duration
from kairos.definitions.feature import FeatureRef, HasManyRef, ref_of
from kairos.definitions.types import DataFrameSpec, FeaturesSpec, Now
from kairos.errors import DefinitionError
from kairos.resolvers.calls import Answered, Made

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Parameter:
    """One resolver parameter: a feature, a has-many feature (maybe filtered), or `Now`."""

    name: str
    ref: FeatureRef | None  # None for Now
    items: tuple[Any, ...] = ()  # [...] on a has-many input


@dataclass(frozen=True, slots=True)
class Signature:
    parameters: tuple[Parameter, ...]
    outputs: tuple[Any, ...]  # FeatureRef, or a DataFrameSpec to match against a has-many
    shape: str  # "one" (a value), "many" (Features[...]) or "rows" (DataFrame[...])


class Resolver(Generic[P, R]):
    """A user function plus what kairos needs to call it; calling it calls the function."""

    # what the engine awaits before a call's timeout starts: a one-time load (a model's
    # artifact) that is not the call's latency; None for resolvers with nothing to load
    prepare: Callable[[], Awaitable[None]] | None = None

    def __init__(
        self,
        fn: Callable[P, R],
        kind: str,
        timeout: timedelta | None,
        name: str | None,
        batch: bool = False,
    ) -> None:
        self.fn = fn
        self.kind = kind
        self.timeout = timeout
        self.batch = batch  # called once with a list per parameter, returns a list
        self.name = name or fn.__name__
        self.is_async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)
        self._signature: Signature | None = None

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.kind} resolver {self.name}>"

    @property
    def where(self) -> str:
        code = getattr(self.fn, "__code__", None)
        return f"{code.co_filename}:{code.co_firstlineno}" if code else repr(self.fn)

    @functools.cached_property
    def version(self) -> str:
        """A short hash of the function's source, so logs can tell which code made a value."""
        try:
            text = inspect.getsource(self.fn)
        except (OSError, TypeError):
            text = self.fn.__qualname__
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def signature(self) -> Signature:
        if self._signature is None:
            self._signature = _read_signature(self)
        return self._signature


class PythonRunner:
    """Calls a Python resolver once per entity: sync functions in the thread pool (one job for
    the whole batch), coroutines concurrently on the loop. A model or LLM resolver's answer
    (`Answered`) gives its value to `results` and its call to `made`, as it finishes."""

    def __init__(self, resolver: Resolver[..., Any]) -> None:
        self.fn = resolver.fn
        self.is_async = resolver.is_async
        self.batch = resolver.batch
        self.name = resolver.name

    async def run(
        self,
        calls: list[list[Any]],
        results: list[tuple[bool, Any] | None],
        pool: Executor,
        made: Made,
    ) -> None:
        fn = self.fn
        if self.batch:
            await self.run_batch(calls, results, pool, made)
            return
        if self.is_async:

            async def one(index: int) -> None:
                try:
                    results[index] = _answer(await fn(*calls[index]), (index,), made)
                except Exception as error:  # the user's resolver
                    results[index] = (False, error)

            await asyncio.gather(*(one(i) for i in range(len(calls))))
            return

        def run_all() -> None:
            for index, args in enumerate(calls):
                try:
                    results[index] = _answer(fn(*args), (index,), made)
                except Exception as error:  # the user's resolver
                    results[index] = (False, error)

        if telemetry.TRACER is not None:  # the node's span is current in the user's code too
            run_all = functools.partial(contextvars.copy_context().run, run_all)
        await asyncio.get_running_loop().run_in_executor(pool, run_all)

    async def run_batch(
        self,
        calls: list[list[Any]],
        results: list[tuple[bool, Any] | None],
        pool: Executor,
        made: Made,
    ) -> None:
        """One call for every entity: each parameter gets the list of its values."""
        if not calls:
            return
        columns = [list(column) for column in zip(*calls, strict=True)]
        try:
            if self.is_async:
                answers = await self.fn(*columns)
            else:
                answers = await asyncio.get_running_loop().run_in_executor(
                    pool, lambda: self.fn(*columns)
                )
            ok, answers = _answer(answers, tuple(range(len(calls))), made)
            if not ok:
                raise answers
            answers = list(answers)
            if len(answers) != len(calls):
                raise ValueError(
                    f"batch resolver {self.name!r} returned {len(answers)} results for "
                    f"{len(calls)} entities; return one per entity, in order"
                )
        except Exception as error:  # the user's resolver: every entity of the batch fails
            for index in range(len(calls)):
                results[index] = (False, error)
            return
        for index, answer in enumerate(answers):
            results[index] = (True, answer)


def _answer(value: Any, indexes: tuple[int, ...], made: Made) -> tuple[bool, Any]:
    """A result for the engine: a model or LLM call's value (or the error its answer was),
    the engine told of the call (`made`, with the `indexes` of the entities it computed);
    any other value as it is."""
    if type(value) is not Answered:
        return True, value
    made(indexes, value.call)
    if value.error is not None:
        return False, value.error
    return True, value.value


def _annotation(resolver: Resolver[..., Any], value: Any, what: str) -> Any:
    if isinstance(value, str):
        scope = dict(getattr(resolver.fn, "__globals__", {}))
        try:
            return eval(value, scope)  # the user's own annotation text
        except Exception as error:
            raise DefinitionError(
                f"resolver {resolver.name!r} ({resolver.where}): cannot read the annotation "
                f"{value!r} of {what} ({error})"
            ) from None
    return value


def _read_signature(resolver: Resolver[..., Any]) -> Signature:
    where = f"resolver {resolver.name!r} ({resolver.where})"
    signature = inspect.signature(resolver.fn)
    parameters = []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise DefinitionError(f"{where}: *args/**kwargs cannot be resolver inputs")
        annotation = _annotation(resolver, param.annotation, f"parameter {param.name!r}")
        ref = ref_of(annotation)
        if annotation is Now:
            parameters.append(Parameter(param.name, None))
        elif isinstance(annotation, HasManyRef):
            parameters.append(Parameter(param.name, annotation.ref, annotation.items))
        elif ref is not None:
            parameters.append(Parameter(param.name, ref))
        else:
            raise DefinitionError(
                f"{where}: parameter {param.name!r} must be annotated with a feature "
                f"(e.g. `uid: User.id`) or `Now`; got {annotation!r}"
            )
    returned = _annotation(resolver, signature.return_annotation, "the return value")
    returned_ref = ref_of(returned)
    if returned_ref is not None and not isinstance(returned, HasManyRef):
        outputs: tuple[Any, ...] = (returned_ref,)
        shape = "one"
    elif isinstance(returned, FeaturesSpec):
        outputs = tuple(_output_ref(where, item) for item in returned.items)
        shape = "many"
    elif isinstance(returned, DataFrameSpec):
        outputs = (returned,)
        shape = "rows"
    else:
        raise DefinitionError(
            f"{where}: annotate what it returns: -> User.balance, -> Features[User.a, User.b] "
            f"or -> DataFrame[Transaction]; got {returned!r}"
        )
    return Signature(tuple(parameters), outputs, shape)


def _output_ref(where: str, item: Any) -> FeatureRef:
    ref = ref_of(item)
    if ref is not None and not ref.path and not isinstance(item, HasManyRef):
        return ref
    raise DefinitionError(f"{where}: Features[...] lists features of one class; got {item!r}")


@overload
def online(fn: Callable[P, R], /) -> Resolver[P, R]: ...


@overload
def online(
    *, timeout: DurationLike | None = None, name: str | None = None, batch: bool = False
) -> Callable[[Callable[P, R]], Resolver[P, R]]: ...


def online(
    fn: Any = None,
    /,
    *,
    timeout: DurationLike | None = None,
    name: str | None = None,
    batch: bool = False,
) -> Any:
    """Mark a function as an online resolver; its annotations say what it reads and returns.

    With `batch=True` it is called once per query with a list per parameter (one value per
    entity; `Now` too) and returns a list with one result per entity, in order.

    >>> @online(timeout="200ms")
    ... def balance(uid: User.id) -> User.balance: ...  # doctest: +SKIP
    """
    return _decorate("online", fn, timeout, name, batch)


@overload
def offline(fn: Callable[P, R], /) -> Resolver[P, R]: ...


@overload
def offline(
    *, timeout: DurationLike | None = None, name: str | None = None, batch: bool = False
) -> Callable[[Callable[P, R]], Resolver[P, R]]: ...


def offline(
    fn: Any = None,
    /,
    *,
    timeout: DurationLike | None = None,
    name: str | None = None,
    batch: bool = False,
) -> Any:
    """Mark a function as an offline resolver (used by offline queries and backfills)."""
    return _decorate("offline", fn, timeout, name, batch)


def _decorate(
    kind: str, fn: Any, timeout: DurationLike | None, name: str | None, batch: bool = False
) -> Any:
    limit = optional_duration(timeout, field="timeout")

    def wrap(function: Callable[..., Any]) -> Resolver[..., Any]:
        if not callable(function):
            raise DefinitionError(f"@{kind} decorates a function; got {function!r}")
        return Resolver(function, kind, limit, name, batch)

    return wrap(fn) if fn is not None else wrap
