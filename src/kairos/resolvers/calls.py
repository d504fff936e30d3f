"""What a query's model and LLM calls report for its decision record.

The client sets `CALLS` around a query; the engine sets `ROWS` to the query rows a resolver
node computes, and the runner narrows it to the one row of a per-entity call. A model
resolver then reports the exact input matrix it gave the model, row by row; an LLM resolver
the rendered messages, the answer, the deployment that served it, its tokens, cost and
timings. Nothing is reported when no query is listening (`CALLS` unset).
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Calls:
    """The calls of one query, in the order they finished."""

    llm: list[dict[str, Any]] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)


CALLS: contextvars.ContextVar[Calls | None] = contextvars.ContextVar("kairos_calls", default=None)
# The query rows (entities) the resolver call running in this context computes, in the order
# of its arguments; None outside a query.
ROWS: contextvars.ContextVar[tuple[int, ...] | None] = contextvars.ContextVar(
    "kairos_rows", default=None
)


@contextmanager
def computing(rows: Sequence[int]) -> Iterator[None]:
    """Run a resolver call (or a node's calls) for these query rows."""
    token = ROWS.set(tuple(rows))
    try:
        yield
    finally:
        ROWS.reset(token)


def narrowed(index: int) -> tuple[int, ...] | None:
    """The query row of call `index` among those `ROWS` names (for a per-entity call)."""
    rows = ROWS.get()
    if rows is None or index >= len(rows):
        return None
    return (rows[index],)


def current_row() -> int | None:
    """The query row of the per-entity call running here, or None."""
    rows = ROWS.get()
    return rows[0] if rows is not None and len(rows) == 1 else None


def report_llm(call: dict[str, Any]) -> None:
    calls = CALLS.get()
    if calls is not None:
        calls.llm.append(call)


def report_model(call: dict[str, Any]) -> None:
    calls = CALLS.get()
    if calls is not None:
        calls.models.append(call)


def listening() -> bool:
    """Whether a query wants calls reported (so a resolver can skip building the record)."""
    return CALLS.get() is not None
