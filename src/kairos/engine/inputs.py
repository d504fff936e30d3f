"""The caller's inputs typed against their features: the first step of every run, one rule
for online, bulk and offline queries (the client calls `check_inputs`, then `Engine.run`)."""

from __future__ import annotations

from collections.abc import Callable
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
