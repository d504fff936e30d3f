"""Nearest resolvers: a `kr.nearest(...)` feature turned into an async resolver that searches
the documents' vector index as of the query's `now`.

Its inputs are the entity's query vector, `Now` (the request's `now` online, the spine row's
`ts` offline) and the entity's features its filters compare with; its value is the has-many
rows of the documents found, nearest first, each the document's features plus `distance`.
Filters and the point in time apply inside the index's search (`VectorIndex.search`), so k
rows come back whenever k documents match.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime
from typing import Any

from kairos.definitions.feature import FeatureRef
from kairos.definitions.graph import Graph
from kairos.definitions.nearest import NearestSearch
from kairos.definitions.types import Now
from kairos.resolvers.python import Resolver
from kairos.stores.vectors import Condition, Hit, VectorIndex

DISTANCE = "distance"


class NearestResolver(Resolver[..., Any]):
    """Searches one `kr.nearest` feature's index per entity."""

    node_kind = "nearest"  # what plans and traces call its node

    def __init__(
        self,
        output: FeatureRef,
        search: NearestSearch,
        index: Callable[[NearestSearch], VectorIndex],
        primary: str,
        feature_time: str | None,
    ) -> None:
        self.output = output
        self.search = search
        self._index = index
        self.primary = primary
        self.feature_time = feature_time

        async def find(query: Any, now: datetime, *parents: Any) -> list[dict[str, Any]]:
            return await self.find(query, now, parents)

        parameters = [
            inspect.Parameter(
                "query",
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                annotation=FeatureRef(output.root, (), search.query),
            ),
            inspect.Parameter("now", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Now),
            *(
                inspect.Parameter(
                    f"p{i}",
                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                    annotation=FeatureRef(output.root, (), name),
                )
                for i, name in enumerate(search.parents)
            ),
        ]
        find.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            parameters, return_annotation=output
        )
        find.__name__ = find.__qualname__ = f"nearest_{output.name}"
        super().__init__(find, "online", search.timeout, f"nearest:{output.fqn}")

    @property
    def version(self) -> str:
        """The search as declared, so the query log says what found a value."""
        text = json.dumps(
            [self.search.index, self.search.query, self.search.k, self.search.filters],
            default=repr,
        )
        return f"nearest#{hashlib.sha256(text.encode()).hexdigest()[:10]}"

    @property
    def where(self) -> str:
        return f"{self.output.fqn} = kr.nearest({self.search.index}, ...)"

    def __repr__(self) -> str:
        return f"<nearest resolver {self.search.index} -> {self.output.fqn}>"

    def conditions(self, parents: Sequence[Any]) -> list[Condition] | None:
        """The index's conditions for one entity; None when one compares with a null (which
        no document matches)."""
        values = dict(zip(self.search.parents, parents, strict=True))
        found = []
        for f in self.search.filters:
            value = f.value if f.parent is None else values[f.parent]
            if value is None:
                return None
            found.append(Condition(f.column, f.op, json_value(value)))  # type: ignore[arg-type]
        return found

    async def find(self, query: Any, now: datetime, parents: Sequence[Any]) -> list[dict[str, Any]]:
        """The rows of the documents nearest `query` as of `now`."""
        conditions = self.conditions(parents)
        if query is None or conditions is None:
            return []  # no query vector, or a filter nothing matches: no neighbours
        index = self._index(self.search)
        hits = await index.search(list(query), self.search.k, as_of=now, where=conditions)
        return [self.row(hit) for hit in hits]

    def row(self, hit: Hit) -> dict[str, Any]:
        row = dict(hit.attributes)
        row[self.primary] = hit.id
        if self.feature_time is not None:
            row[self.feature_time] = hit.observed_at
        row.pop(self.search.vector, None)  # the index holds it; a row does not repeat it
        row[DISTANCE] = hit.distance
        return row


def json_value(value: Any) -> Any:
    """An attribute as the index keeps it (JSON): a time as its ISO text in UTC, which rows
    read back as the time it was and which compares in time order."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        return aware.astimezone(UTC).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, tuple):
        return tuple(json_value(v) for v in value)
    return value


def nearest_resolvers(
    graph: Graph, index: Callable[[NearestSearch], VectorIndex]
) -> list[NearestResolver]:
    """One resolver per `kr.nearest` feature of the graph; `index` opens a search's index."""
    made = []
    for namespace, info in graph.classes.items():
        for name, feature in info.features.items():
            if feature.nearest is not None:
                documents = graph.cls(feature.nearest.target)
                made.append(
                    NearestResolver(
                        FeatureRef(namespace, (), name),
                        feature.nearest,
                        index,
                        documents.primary,
                        documents.feature_time,
                    )
                )
    return made


__all__ = ["DISTANCE", "NearestResolver", "nearest_resolvers"]
