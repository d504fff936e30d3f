"""`client.models`: register, version, alias, predict and batch-score models, and keep the
project's `kr.predict` features bound to the versions their aliases point at.

    v = client.models.register("risk", pipeline, aliases=["prod"], metadata={"auc": 0.91})
    client.models.predict("risk", [{"amount": 12.0, "count": 3}], alias="prod")
    client.models.set_alias("risk", "prod", 2); client.models.rollback("risk", "prod")
    client.models.score("risk", "spine_features.parquet", output="scores.parquet")
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kairos.definitions.feature import FeatureRef
from kairos.definitions.graph import Graph
from kairos.definitions.predict import ModelOptions
from kairos.errors import InvalidInput
from kairos.models.errors import UnknownModel
from kairos.models.predictor import Predictor
from kairos.models.registry import AliasChange, ModelVersion, model_registry_from_url
from kairos.models.schema import to_matrix
from kairos.models.store import ModelStore
from kairos.models.volume import ArtifactVolume
from kairos.project.config import ModelsConfig
from kairos.resolvers.model import ModelResolver, check_fit, input_refs, model_features

if TYPE_CHECKING:
    import pyarrow

logger = logging.getLogger("kairos.models")


class Models:
    """The client's model registry; every alias change re-binds `kr.predict` features.

    `bind` is handed each new set of `kr.predict` resolvers; the client plans with them.
    """

    def __init__(
        self,
        config: ModelsConfig,
        base: Path,
        graph: Graph,
        bind: Callable[[list[ModelResolver]], None],
    ) -> None:
        self._bind = bind
        self._made: list[ModelResolver] = []  # the kr.predict resolvers bound last
        registry = config.registry or f"sqlite:///{base / '.kairos' / 'models.db'}"
        volume = config.volume or str(base / ".kairos" / "models")
        self.store = ModelStore(
            model_registry_from_url(registry),
            ArtifactVolume(volume),
            max_batch=config.max_batch,
            max_wait=config.max_wait.total_seconds(),
            threads=config.threads,
        )
        self._refresh = config.refresh.total_seconds()
        self._graph = graph
        self._features = model_features(graph)
        self._bound: dict[str, tuple[str, int] | None] = {}  # feature -> (model, version)
        self._checked = time.monotonic()
        self._checking = threading.Lock()
        # (name, version, alias) -> (record, predictor, looked up at): predict calls do not
        # read the registry each time; changes here clear it, changes elsewhere age out.
        self._resolved: dict[tuple[Any, ...], tuple[ModelVersion, Predictor, float]] = {}

    # --- the feature graph ------------------------------------------------------------------

    def resolvers(self) -> list[ModelResolver]:
        """One resolver per `kr.predict` feature, pinned to the version it resolves to now."""
        made = [
            self._resolver(output, options, inputs) for output, options, inputs in self._features
        ]
        self._bound = {
            r.output.fqn: None if r.record is None else (r.record.name, r.record.version)
            for r in made
        }
        self._checked = time.monotonic()
        self._made = made
        return made

    def pinned(self, pins: Mapping[str, int | str]) -> list[ModelResolver]:
        """The `kr.predict` resolvers with the models in `pins` run at another version (an
        int) or alias (a str) — what a replay runs; the client's own binding is unchanged.

        >>> client.models.pinned({"risk": 2})  # doctest: +SKIP
        """
        used = {options.model for _, options, _ in self._features}
        for name, pin in pins.items():
            if name not in used:
                raise InvalidInput(
                    f"models: no kr.predict feature uses model {name!r}; "
                    f"used: {', '.join(sorted(used)) or 'none'}",
                    field="models",
                )
            if isinstance(pin, bool) or not isinstance(pin, int | str):
                raise InvalidInput(
                    f"models[{name!r}] must be a version number or an alias, got {pin!r}",
                    field="models",
                )
            try:
                self.store.get(name, pin if isinstance(pin, int) else None, _alias(pin))
            except UnknownModel as error:
                raise InvalidInput(f"models[{name!r}]: {error}", field="models") from None
        made = []
        for output, options, inputs in self._features:
            found = pins.get(options.model)
            if isinstance(found, int):
                options = replace(options, version=found, alias=None)
            elif isinstance(found, str):
                options = replace(options, version=None, alias=found)
            made.append(self._resolver(output, options, inputs))
        return made

    def resolver_for(self, output: FeatureRef, options: ModelOptions) -> ModelResolver:
        """A resolver for `output = kr.predict(...)` with these options (a new definition)."""
        return self._resolver(output, options, input_refs(self._graph, output, options))

    def _resolver(
        self, output: FeatureRef, options: ModelOptions, inputs: tuple[FeatureRef, ...]
    ) -> ModelResolver:
        record = None
        problem = None
        try:
            record = self.store.get(options.model, options.version, options.alias)
            problem = check_fit(output, options, inputs, record)
        except UnknownModel as error:
            problem = f"{output.fqn}: {error}"
        return ModelResolver(
            output,
            options,
            inputs,
            record,
            self.store.predictor_for,
            problem,
            self._touch if options.version is None else None,
        )

    def warm(self) -> None:
        """Load the predictor of every `kr.predict` feature (a failure stays that feature's
        error at query time)."""
        for resolver in self._made:
            try:
                resolver.warm()
            except Exception as error:  # reported when a query needs the model
                logger.warning("model %s not loaded ahead: %s", resolver.version, error)

    def rebind(self) -> None:
        """Bind the resolvers again, so new plans use the versions the aliases point at now
        (queries already running finish on the version they started with)."""
        if not self._features:
            return
        self._bind(self.resolvers())

    def _touch(self) -> None:
        """Called on every model run: at most every `refresh`, look (in a thread) whether an
        alias moved in another process and re-bind if so."""
        if time.monotonic() - self._checked < self._refresh or not self._checking.acquire(
            blocking=False
        ):
            return
        self._checked = time.monotonic()

        def check() -> None:
            try:
                if self._moved():
                    self.rebind()
            finally:
                self._checking.release()

        threading.Thread(target=check, name="kairos-model-aliases", daemon=True).start()

    def _moved(self) -> bool:
        for output, options, _ in self._features:
            try:
                record = self.store.get(options.model, options.version, options.alias)
                now: tuple[str, int] | None = (record.name, record.version)
            except UnknownModel:
                now = None
            except Exception:  # a registry hiccup: keep serving what is bound
                return False
            if now != self._bound.get(output.fqn):
                return True
        return False

    # --- the registry -------------------------------------------------------------------------

    def register(
        self,
        name: str,
        model: Any,
        *,
        aliases: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        inputs: Sequence[str] | None = None,
        output: str | None = None,
        sample: Any = None,
        files: Sequence[str | Path] = (),
        allow_pickle: bool = False,
    ) -> ModelVersion:
        """Register the next version of `name`; the schema is inferred from the model.

        `inputs` names its columns when the model does not; `output` is "probability"
        (a classifier's default: P(classes[1]) when binary), "label" or "value"; `sample`
        gives a few rows (needed for some torch modules); `files` go with a model defined by
        your own class; pickle is used only with `allow_pickle=True`.

        >>> client.models.register("risk", pipeline, aliases=["prod"])  # doctest: +SKIP
        """
        version = self.store.register(
            name,
            model,
            aliases=aliases,
            metadata=metadata,
            inputs=inputs,
            output=output,
            sample=sample,
            files=files,
            allow_pickle=allow_pickle,
        )
        self._rebind_if_used(name)
        return version

    def get(self, name: str, version: int | None = None, alias: str | None = None) -> ModelVersion:
        """One version (by number or alias; the newest when neither is given)."""
        return self.store.get(name, version, alias)

    def versions(self, name: str) -> list[ModelVersion]:
        return self.store.versions(name)

    def names(self) -> list[str]:
        return self.store.names()

    def aliases(self, name: str) -> dict[str, int]:
        self.store.versions(name)  # unknown model -> UnknownModel
        return self.store.registry.aliases(name)

    def history(self, name: str, alias: str | None = None) -> list[AliasChange]:
        """Every alias change of `name`, oldest first, each with its time."""
        self.store.versions(name)
        return self.store.registry.history(name, alias)

    def set_alias(
        self, name: str, alias: str, version: int, *, by: str | None = None
    ) -> AliasChange:
        """Point `alias` at `version`; `by` says who did (kept in the alias's history).

        >>> client.models.set_alias("risk", "prod", 2, by="ops")  # doctest: +SKIP
        """
        change = self.store.set_alias(name, alias, version, by=by)
        self._rebind_if_used(name)
        return change

    def rollback(self, name: str, alias: str, *, by: str | None = None) -> AliasChange:
        """Point `alias` back where it was before its latest move; `by` says who did."""
        change = self.store.rollback(name, alias, by=by)
        self._rebind_if_used(name)
        return change

    def _predictor(
        self, name: str, version: int | None, alias: str | None
    ) -> tuple[ModelVersion, Predictor]:
        key = (name, version, alias)
        found = self._resolved.get(key)
        now = time.monotonic()
        if found is not None and now - found[2] < self._refresh:
            return found[0], found[1]
        record, predictor = self.store.predictor(name, version, alias)
        if len(self._resolved) > 1024:
            self._resolved.clear()
        self._resolved[key] = (record, predictor, now)
        return record, predictor

    def _rebind_if_used(self, name: str) -> None:
        self._resolved.clear()
        if any(options.model == name for _, options, _ in self._features):
            self.rebind()

    # --- serving ------------------------------------------------------------------------------

    def predict(
        self, name: str, rows: Any, *, version: int | None = None, alias: str | None = None
    ) -> np.ndarray:
        """Predictions for `rows` (objects keyed by input name, lists, Arrow, pandas or NumPy),
        micro-batched with concurrent callers.

        >>> client.models.predict("risk", [{"amount": 12.0, "count": 3}])  # doctest: +SKIP
        """
        _, predictor = self._predictor(name, version, alias)
        return predictor.predict(rows)

    async def predict_async(
        self, name: str, rows: Any, *, version: int | None = None, alias: str | None = None
    ) -> tuple[ModelVersion, np.ndarray]:
        record, predictor = self._predictor(name, version, alias)
        return record, await predictor.predict_async(rows)

    def score(
        self,
        name: str,
        data: Any,
        *,
        version: int | None = None,
        alias: str | None = None,
        inputs: Sequence[str] | Mapping[str, str] | None = None,
        column: str = "prediction",
        output: str | Path | None = None,
    ) -> pyarrow.Table:
        """Batch scoring: `data` (a Parquet path, an offline query result, an Arrow table, a
        pandas DataFrame) with one more column of predictions, written to `output` (Parquet)
        when given. `inputs` maps model inputs to columns (a list in model order, or a
        mapping input -> column) when the names differ.

        >>> client.models.score("risk", training, output="scores.parquet")  # doctest: +SKIP
        """
        import pyarrow
        import pyarrow.parquet

        record, predictor = self.store.predictor(name, version, alias)
        table = _table(data)
        schema = record.schema
        if inputs is None:
            names = {n: n for n in schema.inputs}
        elif isinstance(inputs, Mapping):
            names = {n: str(inputs.get(n, n)) for n in schema.inputs}
        else:
            if len(inputs) != schema.n_features:
                raise InvalidInput(
                    f"inputs lists {len(inputs)} columns; model {record.label} takes "
                    f"{schema.n_features} ({schema.describe()})",
                    field="inputs",
                )
            names = dict(zip(schema.inputs, map(str, inputs), strict=True))
        missing = [c for c in names.values() if c not in table.column_names]
        if missing:
            raise InvalidInput(
                f"the data has no column {', '.join(map(repr, missing))}; model {record.label} "
                f"takes {schema.describe()} (map them with inputs=...); columns: "
                f"{', '.join(table.column_names)}",
                field="inputs",
            )
        selected = table.select(list(names.values())).rename_columns(list(names))
        predictions = predictor.score(to_matrix(selected, schema))
        if predictions.ndim == 1 and predictions.dtype.kind in "fiub":
            values = pyarrow.array(predictions)
        else:
            values = pyarrow.array(predictions.tolist())
        if column in table.column_names:
            table = table.drop_columns([column])
        scored = table.append_column(column, values)
        scored = scored.replace_schema_metadata(
            {**(scored.schema.metadata or {}), b"kairos.model": record.label.encode()}
        )
        if output is not None:
            pyarrow.parquet.write_table(scored, str(output))
        return scored

    def close(self) -> None:
        self.store.close()


def _table(data: Any) -> pyarrow.Table:
    import pyarrow
    import pyarrow.parquet

    if isinstance(data, str | Path):
        path = Path(data)
        if not path.exists():
            raise InvalidInput(f"no file {str(path)!r} to score", field="data")
        return pyarrow.parquet.read_table(str(path))
    table = getattr(data, "table", None)  # an offline query result
    if isinstance(table, pyarrow.Table):
        return table
    if isinstance(data, pyarrow.Table):
        return data
    if type(data).__module__.startswith("pandas"):
        return pyarrow.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, Mapping):
        return pyarrow.table(dict(data))
    raise InvalidInput(
        f"cannot score a {type(data).__name__}; pass a Parquet path, an offline query "
        "result, an Arrow table or a pandas DataFrame",
        field="data",
    )


def _alias(pin: int | str) -> str | None:
    return pin if isinstance(pin, str) else None
