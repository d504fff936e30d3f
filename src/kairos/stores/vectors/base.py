"""What every vector index is: the `VectorIndex` protocol, the document versions it keeps and
the hits it returns.

One semantics for every backend. An index keeps every *version* of a document: a version of
id `d` written with `observed_at = t` is valid from `t` until the next version of `d` (if any).
A search `as_of = now` sees, for each id, only its newest version with `observed_at <= now`,
and applies `where` and validity *during* the search: it returns min(k, number of matching
valid documents) hits, nearest first, never fewer because a filter removed candidates after an
approximate top-k. Distances are cosine distances (1 - cosine similarity), in [0, 2].

>>> index.write([Document("d1", t0, [0.1, 0.2, ...], {"lang": "en", "text": "..."})])
>>> index.search([0.1, 0.2, ...], k=5, as_of=now, where=[Condition("lang", "==", "en")])
[Hit(id='d1', distance=0.0, observed_at=t0, attributes={'lang': 'en', 'text': '...'})]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, TypeAlias

import numpy as np
import numpy.typing as npt

# A vector as callers hold one: a list of floats or a numpy array (any float dtype).
VectorLike: TypeAlias = Sequence[float] | npt.NDArray[np.floating[Any]]

Operator = Literal["==", "!=", "<", "<=", ">", ">=", "in"]
OPERATORS: tuple[str, ...] = ("==", "!=", "<", "<=", ">", ">=", "in")


@dataclass(frozen=True, slots=True)
class Condition:
    """`attributes[column] <op> value`; a null attribute never matches (as in SQL).
    For `in`, `value` is a tuple of options."""

    column: str
    op: Operator
    value: Any


@dataclass(frozen=True, slots=True)
class Document:
    """One version of one document: its vector and the attributes filters and rows read."""

    id: str
    observed_at: datetime  # timezone-aware UTC
    vector: VectorLike
    attributes: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Hit:
    id: str
    distance: float
    observed_at: datetime
    attributes: dict[str, Any]


class VectorIndex(Protocol):
    """What the engine needs from a vector index. Calls are async so a networked index
    (pgvector) does not block the event loop; an embedded one may answer without awaiting."""

    dimensions: int

    async def write(self, documents: Sequence[Document]) -> None:
        """Add versions (idempotent for the same id and observed_at: the last write wins)."""
        ...

    async def search(
        self,
        query: VectorLike,
        k: int,
        *,
        as_of: datetime,
        where: Sequence[Condition] = (),
    ) -> list[Hit]:
        """Up to k nearest valid versions as of `as_of` matching every condition."""
        ...

    async def close(self) -> None: ...
