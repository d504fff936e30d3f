"""Model resolvers: a `kr.predict(...)` feature turned into a batch resolver whose inputs are
the model's input features and whose output is the prediction.

The planner and the engine see an ordinary `@online(batch=True)` async resolver: one call per
query (or per offline query) with a list per input, answered by the model's Predictor, which
micro-batches it with concurrent queries. Each ModelResolver is pinned to one registered
version, so a plan that uses it records exactly that version (`risk@v3`) in the query log; when
an alias moves, the client builds new resolvers and a new planner.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from kairos.definitions import expressions as ex
from kairos.definitions.feature import FeatureRef, class_spec, field_of, window_name
from kairos.definitions.graph import Graph
from kairos.definitions.predict import ModelOptions
from kairos.errors import DefinitionError, KairosError
from kairos.models.errors import SchemaMismatch
from kairos.models.predictor import Predictor
from kairos.models.registry import ModelVersion
from kairos.resolvers.calls import Answered, ModelCall
from kairos.resolvers.python import Resolver


class ModelUnavailable(KairosError, LookupError):
    """The model a feature declares is not registered, does not fit, or failed to load."""


class ModelResolver(Resolver[..., Any]):
    """Runs one registered model version for one `kr.predict` feature."""

    node_kind = "model"  # plan nodes, traces and metrics tell model time from the rest

    def __init__(
        self,
        output: FeatureRef,
        options: ModelOptions,
        inputs: tuple[FeatureRef, ...],
        record: ModelVersion | None,
        load: Callable[[ModelVersion], Predictor],
        problem: str | None = None,
        touch: Callable[[], None] | None = None,
    ) -> None:
        self.output = output
        self.options = options
        self.record = record
        self.problem = problem
        self._load = load
        self._touch = touch
        self._predictor: Predictor | None = None
        self._loading = threading.Lock()
        self.prepare = self._prepare
        self.input_names = tuple(ref.fqn for ref in inputs)
        fn = self._make_function(inputs)
        name = f"model:{options.model}:{output.fqn}"
        super().__init__(fn, "online", options.timeout, name, batch=True)

    @property
    def version(self) -> str:
        """`risk@v3`: the registered version this resolver runs."""
        if self.record is None:
            return f"{self.options.model}@unregistered"
        return self.record.label

    @property
    def where(self) -> str:
        return f"{self.output.fqn} = kr.predict({self.options.model!r}, ...)"

    def __repr__(self) -> str:
        return f"<model resolver {self.version} -> {self.output.fqn}>"

    def _make_function(self, inputs: tuple[FeatureRef, ...]) -> Callable[..., Any]:
        async def predict(*columns: list[Any]) -> Answered:
            return await self.predict_columns(columns)

        parameters = [
            inspect.Parameter(f"x{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=ref)
            for i, ref in enumerate(inputs)
        ]
        predict.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            parameters, return_annotation=self.output
        )
        predict.__name__ = predict.__qualname__ = f"predict_{self.output.name}"
        return predict

    def warm(self) -> None:
        """Load the predictor now (a server does before it takes traffic)."""
        if self.record is not None and self.problem is None and self._predictor is None:
            self._loaded()

    def _loaded(self) -> Predictor:
        """The predictor, loaded once however many queries ask for it at the same time."""
        if self.record is None:
            raise ModelUnavailable(self.problem or f"model {self.options.model!r} is unavailable")
        with self._loading:
            if self._predictor is None:
                self._predictor = self._load(self.record)
            return self._predictor

    async def _prepare(self) -> None:
        """Load the artifact before the engine starts the call's timeout, so a first query
        after a start (a fresh import of the model's framework: seconds) is not a timeout.
        A load that fails is left to the call, which fails the feature with its error."""
        if self._predictor is None and self.record is not None and self.problem is None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._loaded)

    async def predict_columns(self, columns: tuple[list[Any], ...]) -> Answered:
        """One model call (through the micro-batcher) for every entity of a query: the
        predictions, and the call for the decision record."""
        if self._touch is not None:
            self._touch()
        if self.record is None or self.problem is not None:
            raise ModelUnavailable(self.problem or f"model {self.options.model!r} is unavailable")
        predictor = self._predictor
        if predictor is None:
            predictor = await asyncio.to_thread(self._loaded)
        rows = len(columns[0]) if columns else 0
        matrix = np.empty((rows, len(columns)), dtype=predictor.schema.dtype)
        for index, column in enumerate(columns):
            try:
                matrix[:, index] = np.asarray(column, dtype=np.float64)
            except (TypeError, ValueError):
                name = predictor.schema.inputs[index]
                raise SchemaMismatch(
                    f"model {self.record.label} input {name!r} ({self.options.inputs[index]!r})"
                    f" must be a number; got {column[:3]!r}"
                ) from None
        out = await predictor.submit_async(matrix)
        # the decision record keeps the exact vectors the model was given
        call = ModelCall(
            self.output.fqn, self.options.model, self.version, self.input_names, matrix
        )
        return Answered(out.tolist(), call)


def model_features(graph: Graph) -> list[tuple[FeatureRef, ModelOptions, tuple[FeatureRef, ...]]]:
    """Every `kr.predict` feature of the graph: (output, options, input refs in order)."""
    found = []
    for namespace, info in graph.classes.items():
        spec = class_spec(info.cls)
        if spec is None:
            continue
        for name, feature in spec.features.items():
            options = field_of(feature).options
            if not isinstance(options, ModelOptions):
                continue
            output = FeatureRef(namespace, (), name)
            found.append((output, options, input_refs(graph, output, options)))
    return found


def input_refs(graph: Graph, output: FeatureRef, options: ModelOptions) -> tuple[FeatureRef, ...]:
    """The features a `kr.predict(...)` of `output` passes the model, in order."""
    return tuple(_input_ref(graph, output, item) for item in options.inputs)


def _input_ref(graph: Graph, output: FeatureRef, item: Any) -> FeatureRef:
    where = f"{output.fqn} = kr.predict(...)"
    if isinstance(item, ex.Col):
        *hops, name = item.path
        ref = FeatureRef(output.root, tuple(hops), name, item.window and window_name(item.window))
    else:
        ref = item
    if ref.root != output.root:
        raise DefinitionError(
            f"{where}: input {ref.fqn} is not a feature of {output.root}; reach other classes "
            f"through relations (e.g. _.account.age)"
        )
    try:
        _, info = graph.walk(ref)
    except KairosError as error:
        raise DefinitionError(f"{where}: {error}") from None
    if info.kind != "scalar":
        raise DefinitionError(f"{where}: input {ref.fqn} is not a single value")
    return ref


def check_fit(
    output: FeatureRef, options: ModelOptions, inputs: Iterable[FeatureRef], record: ModelVersion
) -> str | None:
    """Why `record` cannot serve this feature (wrong number of inputs), or None."""
    refs = list(inputs)
    if len(refs) != record.schema.n_features:
        return (
            f"model {record.label} takes {record.schema.n_features} inputs "
            f"({record.schema.describe()}) but {output.fqn} = kr.predict(...) passes "
            f"{len(refs)} ({', '.join(r.fqn for r in refs)}); list one feature per model input"
        )
    return None
