"""What a query's model and LLM calls hand back to the engine for its decision record.

A model resolver's function returns `Answered(predictions, ModelCall(...))`: the values and
the exact input matrix the model was given; an LLM resolver's `Answered(value, LLMCall(...))`:
the rendered messages, the answer, the deployment that served it, its tokens, cost and
timings. The runner takes the values apart from the call; the engine, which knows the query
rows it gave the runner, pins the call to them (`for_rows`) and returns every call in its
outcome (`Calls`), from which the client builds the decision record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model call: row i of `vectors` is what the model was given for query row
    `rows[i]` (the matrix is kept as is: a query that keeps no record pays no copy)."""

    feature: str
    model: str
    version: str  # `risk@v3`
    inputs: tuple[str, ...]  # the features of the matrix's columns, in order
    vectors: np.ndarray[Any, Any]
    rows: tuple[int, ...] = ()  # set by the engine

    def for_rows(self, rows: tuple[int, ...]) -> ModelCall:
        return dataclasses.replace(self, rows=rows)

    def record(self) -> dict[str, Any]:
        """The call as the decision record keeps it (`rows` then every row's vector)."""
        return {
            "feature": self.feature,
            "model": self.model,
            "version": self.version,
            "inputs": list(self.inputs),
            "rows": list(self.rows),
            "vectors": self.vectors.tolist(),
        }


@dataclass(frozen=True, slots=True)
class LLMCall:
    """One LLM call of one query row: what was sent, who answered, its tokens, cost and
    timings (`fields`: the decision record's keys, `row` among them, set by the engine)."""

    fields: dict[str, Any]
    row: int | None = None

    def for_rows(self, rows: tuple[int, ...]) -> LLMCall:
        return dataclasses.replace(self, row=rows[0] if len(rows) == 1 else None)

    def record(self) -> dict[str, Any]:
        """The call as the decision record keeps it (a new dict each time)."""
        record = dict(self.fields)
        record["row"] = self.row  # in its place among the keys when `fields` has it
        return record


Call = ModelCall | LLMCall
# how a runner tells the engine of a call it made, as the call finishes: the indexes (among
# the entities the runner was given) of the entities it computed, and the call
Made = Callable[[tuple[int, ...], Call], None]


@dataclass(frozen=True, slots=True)
class Answered:
    """What a model or LLM resolver's function returns to the engine: its value (for a batch
    call, the list of values) and the call that made it."""

    value: Any
    call: Call
    # the call was made but its answer is no value (an LLM's JSON that does not fit the
    # schema): the query row fails with it, and the decision record keeps the call
    error: Exception | None = None


@dataclass(slots=True)
class Calls:
    """The model and LLM calls of one run, each in the order they finished."""

    llm: list[LLMCall] = field(default_factory=list)
    models: list[ModelCall] = field(default_factory=list)

    def add(self, call: Call) -> None:
        if isinstance(call, ModelCall):
            self.models.append(call)
        else:
            self.llm.append(call)
