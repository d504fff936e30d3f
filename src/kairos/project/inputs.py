"""Query inputs checked against their features: one rule for online, bulk and offline."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kairos.definitions.graph import Graph
from kairos.engine.rows import normalize_rows
from kairos.engine.values import check
from kairos.errors import InvalidInput, InvalidValue


def check_inputs(
    graph: Graph,
    columns: dict[str, list[Any]],
    now_of: Callable[[int], datetime],
    *,
    nulls: bool,
    where: Callable[[int, str], str],
) -> None:
    """Type every input value in place (has-many rows as of their row's time); a null is
    kept only with `nulls` (offline: that row's features are null). `where(row, name)` says
    which value was wrong in the error."""
    for name, values in columns.items():
        info = graph.info(graph.ref(name))
        for index, value in enumerate(values):
            if value is None and nulls:
                continue
            try:
                if info.kind == "has_many":
                    values[index] = normalize_rows(graph, info, value, now_of(index))
                else:
                    values[index] = check(info, value, allow_null=False)
            except InvalidValue as error:
                raise InvalidInput(f"{where(index, name)}: {error}", field=name) from None


def bulk_columns(
    input: Mapping[Any, Sequence[Any]] | Sequence[Mapping[Any, Any]], name: Callable[[Any], str]
) -> dict[str, list[Any]]:
    """A bulk query's input as columns by feature name (`name` names a feature): given as
    columns (`{User.id: ["u1", "u2"]}`) or rows (`[{User.id: "u1"}, ...]`).

    >>> bulk_columns([{"user.id": "u1"}, {"user.id": "u2"}], str)
    {'user.id': ['u1', 'u2']}
    """
    if isinstance(input, Mapping):
        columns = {}
        for key, values in input.items():
            if isinstance(values, str | bytes) or not isinstance(values, Sequence):
                raise InvalidInput(
                    f"input {name(key)!r} of a bulk query must be a list of values, "
                    f"one per entity; got {type(values).__name__}",
                    field="input",
                )
            columns[name(key)] = list(values)
    elif isinstance(input, Sequence) and not isinstance(input, str | bytes):
        names = [[name(k) for k in row] for row in input]
        keys = list(dict.fromkeys(k for row in names for k in row))
        columns = {k: [] for k in keys}
        for index, row in enumerate(input):
            if not isinstance(row, Mapping) or len(row) != len(keys):
                raise InvalidInput(
                    f"bulk input row {index} must set the same features as the others "
                    f"({', '.join(keys)})",
                    field="input",
                )
            for key, value in row.items():
                columns[name(key)].append(value)
    else:
        raise InvalidInput(
            "bulk input must be {feature: [values...]} or a list of rows", field="input"
        )
    lengths = {len(v) for v in columns.values()}
    if len(lengths) > 1:
        raise InvalidInput(
            "bulk input columns have different lengths: "
            + ", ".join(f"{k}={len(v)}" for k, v in columns.items()),
            field="input",
        )
    return columns
