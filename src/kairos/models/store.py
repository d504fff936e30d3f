"""The model store: register (save, hash, record), resolve a name to a version, and keep one
loaded Predictor per version.

    store = ModelStore(model_registry_from_url("sqlite:///.kairos/models.db"),
                       ArtifactVolume(".kairos/models"))
    v = store.register("risk", fitted_pipeline, aliases=["prod"])
    version, predictor = store.predictor("risk", alias="prod")
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from kairos.errors import InvalidInput
from kairos.models import formats
from kairos.models.errors import UnsupportedModel
from kairos.models.predictor import Predictor
from kairos.models.registry import AliasChange, ModelRegistry, ModelVersion, check_name
from kairos.models.volume import ArtifactVolume


class ModelStore:
    """Registry + artifact volume + loaded predictors (each version loaded once)."""

    def __init__(
        self,
        registry: ModelRegistry,
        volume: ArtifactVolume,
        *,
        max_batch: int = 1024,
        max_wait: float = 0.0,
        threads: int | None = 1,
    ) -> None:
        self.registry = registry
        self.volume = volume
        self.max_batch = max_batch
        self.max_wait = max_wait
        self.threads = threads  # native threads of each predictor's model calls
        self._predictors: dict[tuple[str, int], Predictor] = {}
        self._lock = threading.Lock()

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
        """Save `model` in its framework's safe format, store it by sha256, record the next
        version of `name` and point `aliases` at it."""
        check_name(name)
        if isinstance(aliases, str):
            aliases = [aliases]
        if metadata is not None and not isinstance(metadata, Mapping):
            raise InvalidInput("metadata must be a mapping", field="metadata")
        array = None if sample is None else np.asarray(sample, dtype=np.float64)
        saved = formats.save(
            model,
            inputs=inputs,
            output=output,
            sample=array,
            files=files,
            allow_pickle=allow_pickle,
        )
        # Load what was saved and run it once: the artifact must work before it is recorded.
        infer = formats.load(saved.data, saved.framework, saved.format, saved.extra)
        probe = Predictor(infer, saved.schema, raw=saved.extra.get("raw", "value"))
        rows = array if array is not None else np.zeros((2, saved.schema.n_features))
        try:
            out = probe.run(np.ascontiguousarray(rows[:2], dtype=saved.schema.dtype))
        except Exception as error:
            raise UnsupportedModel(
                f"model {name!r}: the saved artifact did not predict on "
                f"{'sample' if array is not None else 'a row of zeros'} ({error}); pass "
                "sample= with a few real rows"
            ) from error
        schema = replace(saved.schema, output_shape=tuple(int(d) for d in out.shape[1:]))
        digest = self.volume.put(saved.data)
        version = self.registry.add(
            name,
            digest,
            saved.framework,
            saved.format,
            len(saved.data),
            schema,
            metadata or {},
            saved.extra,
        )
        for alias in aliases:
            self.registry.set_alias(name, alias, version.version)
        return self.registry.get(name, version.version)

    def get(self, name: str, version: int | None = None, alias: str | None = None) -> ModelVersion:
        return self.registry.get(name, version, alias)

    def versions(self, name: str) -> list[ModelVersion]:
        return self.registry.versions(name)

    def names(self) -> list[str]:
        return self.registry.names()

    def set_alias(
        self, name: str, alias: str, version: int, *, by: str | None = None
    ) -> AliasChange:
        return self.registry.set_alias(name, alias, version, by=by)

    def rollback(self, name: str, alias: str, *, by: str | None = None) -> AliasChange:
        return self.registry.rollback(name, alias, by=by)

    def predictor(
        self, name: str, version: int | None = None, alias: str | None = None
    ) -> tuple[ModelVersion, Predictor]:
        record = self.registry.get(name, version, alias)
        return record, self.predictor_for(record)

    def predictor_for(self, record: ModelVersion) -> Predictor:
        """The loaded predictor of one version; the artifact's hash is checked on load."""
        key = (record.name, record.version)
        found = self._predictors.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self._predictors.get(key)
            if found is None:
                data = self.volume.get(record.sha256)
                infer = formats.load(data, record.framework, record.format, dict(record.extra))
                found = Predictor(
                    infer,
                    record.schema,
                    raw=str(record.extra.get("raw", "value")),
                    max_batch=self.max_batch,
                    max_wait=self.max_wait,
                    threads=self.threads,
                    label=record.label,
                )
                self._predictors[key] = found
        return found

    def close(self) -> None:
        with self._lock:
            predictors, self._predictors = list(self._predictors.values()), {}
        for predictor in predictors:
            predictor.close()
        self.registry.close()
