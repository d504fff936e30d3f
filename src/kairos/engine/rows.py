"""Has-many values: normalize what a resolver returns, and filter/project rows for inputs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from kairos.definitions.graph import FeatureInfo, Graph
from kairos.engine.evaluate import Compiled
from kairos.engine.values import coerce
from kairos.errors import InvalidValue, did_you_mean


def normalize_rows(
    graph: Graph, info: FeatureInfo, value: Any, now: datetime
) -> list[dict[str, Any]]:
    """Rows keyed by the child's feature names, typed, without rows from after `now`.

    Accepts a kairos DataFrame, a list of dicts or of feature-class instances, or anything with
    `to_dict("records")` (pandas).
    """
    if info.target is None:  # pragma: no cover - only has-many features get here
        raise InvalidValue(f"{info.fqn} is not a has-many feature")
    child = graph.cls(info.target)
    if value is None:
        return []
    if hasattr(value, "to_dict") and not isinstance(value, dict):
        value = value.to_dict("records")
    if hasattr(value, "rows") and isinstance(value.rows, list):
        value = value.rows
    if not isinstance(value, list | tuple):
        raise InvalidValue(
            f"expected rows for {info.fqn} (a list of dicts or a DataFrame); "
            f"got {type(value).__name__}"
        )
    rows: list[dict[str, Any]] = []
    time_column = child.feature_time
    for item in value:
        raw = vars(item) if hasattr(item, "__kairos__") else item
        if not isinstance(raw, dict):
            raise InvalidValue(f"each row of {info.fqn} must be a dict; got {type(item).__name__}")
        row: dict[str, Any] = {}
        for key, cell in raw.items():
            name = str(key).rpartition(".")[2]
            feature = child.features.get(name)
            if feature is None:
                raise InvalidValue(
                    f"rows of {info.fqn} have a column {key!r} that {child.namespace} does not "
                    f"declare{did_you_mean(name, child.features)}"
                )
            row[name] = coerce(feature.type, cell) if feature.type is not None else cell
        if time_column is not None:
            observed = row.get(time_column)
            if observed is not None and observed > now:
                continue  # nothing from the future: this row does not exist yet
        rows.append(row)
    return rows


def select_rows(
    rows: Sequence[dict[str, Any]],
    filters: Sequence[Compiled],
    projections: Sequence[Compiled],
    names: Sequence[str],
    now: datetime,
) -> list[dict[str, Any]]:
    """Rows passing every filter, reduced to the projected columns (all columns if none)."""
    kept = [r for r in rows if all(f((), now, r) is True for f in filters)]
    if not projections:
        return kept
    return [
        {name: project((), now, r) for name, project in zip(names, projections, strict=True)}
        for r in kept
    ]
