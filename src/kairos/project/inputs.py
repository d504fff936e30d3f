"""A bulk query's input, given as columns or as rows, read into columns by feature name (typing
the values against their features is the engine's: `kairos.engine.inputs`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kairos.errors import InvalidInput


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
