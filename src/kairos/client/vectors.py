"""The vector indexes behind a project's `kr.nearest` features, and the writes that keep them
current.

One index per searched vector feature (`doc.embedding`), at the project's `vectors:` URL (an
embedded folder, by default `.kairos/vectors`, or `postgresql://...` for pgvector), opened on
first use and closed with the client. Rows of a searched class reach its index wherever they
are written (`client.write_events`, so streams too, and backfills): a row without its vector
gets it from the feature's `kr.embedding` model, one call for the whole batch, before anything
is kept; a row whose vector cannot be had fails the write naming the row.

    >>> vectors = VectorFeatures(graph, ".kairos/vectors", embedders)  # doctest: +SKIP
    >>> documents = await vectors.documents(doc_info, rows)  # fills each row's vector
    >>> await vectors.write(documents)
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kairos.definitions.graph import ClassInfo, Graph
from kairos.definitions.nearest import NearestSearch
from kairos.engine.values import check
from kairos.errors import InvalidInput, InvalidValue, KairosError
from kairos.resolvers.llm import EmbeddingResolver
from kairos.resolvers.nearest import json_value
from kairos.stores import vectors as vector_stores
from kairos.stores.vectors import Document, VectorIndex


class VectorFeatures:
    """The indexes of a graph's `kr.nearest` features; `embedders` are the `kr.embedding`
    resolvers by (namespace, feature), which fill in a vector a written row lacks."""

    def __init__(
        self,
        graph: Graph,
        url: str,
        embedders: Mapping[tuple[str, str], EmbeddingResolver],
    ) -> None:
        self.graph = graph
        self.url = url
        self.embedders = dict(embedders)
        self.searches: dict[str, NearestSearch] = {}  # index name -> (one of) its searches
        for info in graph.classes.values():
            for feature in info.features.values():
                if feature.nearest is not None:
                    self.searches.setdefault(feature.nearest.index, feature.nearest)
        self._indexes: dict[str, VectorIndex] = {}
        self._lock = threading.Lock()

    def searched(self, namespace: str) -> list[NearestSearch]:
        """The searches over `namespace`'s rows, one per indexed vector feature."""
        return [s for s in self.searches.values() if s.target == namespace]

    def index(self, search: NearestSearch) -> VectorIndex:
        """The index a search reads, opened on first use."""
        with self._lock:
            found = self._indexes.get(search.index)
            if found is None:
                found = vector_stores.open_vector_index(self.url, search.index, search.dimensions)
                self._indexes[search.index] = found
            return found

    async def documents(
        self, info: ClassInfo, rows: Sequence[dict[str, Any]]
    ) -> dict[str, list[Document]]:
        """One document per row for each index over `info`'s class; a row without
        its vector gets it computed (and kept in the row, so the offline store has it too).
        InvalidInput names the row whose vector cannot be had; nothing is written here."""
        found: dict[str, list[Document]] = {}
        time_field = str(info.feature_time)
        for search in self.searched(info.namespace):
            vector_info = info.features[search.vector]
            missing = [i for i, row in enumerate(rows) if row.get(search.vector) is None]
            if missing:
                vectors = await self._embed(info, search, [rows[i] for i in missing], missing)
                for i, vector in zip(missing, vectors, strict=True):
                    try:
                        rows[i][search.vector] = check(vector_info, vector, allow_null=False)
                    except InvalidValue as error:
                        raise InvalidInput(
                            f"row {i}: the embedding of {vector_info.fqn} is not what it "
                            f"declares: {error}",
                            field=search.vector,
                        ) from None
            batch = found.setdefault(search.index, [])
            for row in rows:
                attributes = {
                    name: json_value(value)
                    for name, value in row.items()
                    if name != search.vector
                    and info.features[name].type is not None
                    and info.features[name].type.kind != "vector"  # type: ignore[union-attr]
                }
                batch.append(
                    Document(
                        str(row[info.primary]), row[time_field], row[search.vector], attributes
                    )
                )
        return found

    async def _embed(
        self,
        info: ClassInfo,
        search: NearestSearch,
        rows: Sequence[Mapping[str, Any]],
        numbers: Sequence[int],
    ) -> list[list[float]]:
        embedder = self.embedders.get((info.namespace, search.vector))
        if embedder is None:
            raise InvalidInput(
                f"row {numbers[0]} has no {info.namespace}.{search.vector}, and no kr.embedding "
                f"computes it; give the vector in every row, or declare it "
                f"`{search.vector}: Vector[{search.dimensions}] = kr.embedding(...)`",
                field=search.vector,
            )
        texts = []
        for number, row in zip(numbers, rows, strict=True):
            try:
                texts.append(embedder.text(row))
            except KairosError as error:
                raise InvalidInput(
                    f"row {number}: the input of {info.namespace}.{search.vector} cannot be "
                    f"rendered: {error}",
                    field=search.vector,
                ) from None
        try:
            return await embedder.embed_texts(texts)
        except KairosError as batch_error:
            # one call for the batch failed: find the row it failed on, one at a time
            for number, text in zip(numbers, texts, strict=True):
                try:
                    await embedder.embed_texts([text])
                except KairosError as error:
                    raise InvalidInput(
                        f"row {number}: embedding {info.namespace}.{search.vector} failed: {error}",
                        field=search.vector,
                    ) from None
            raise InvalidInput(
                f"embedding {info.namespace}.{search.vector} for {len(texts)} rows failed: "
                f"{batch_error}",
                field=search.vector,
            ) from None

    async def write(self, documents: Mapping[str, Sequence[Document]]) -> None:
        """Add the documents' versions to their indexes (by index name)."""
        for name, batch in documents.items():
            if batch:
                await self.index(self.searches[name]).write(batch)

    async def close(self) -> None:
        with self._lock:
            indexes, self._indexes = list(self._indexes.values()), {}
        for index in indexes:
            await index.close()
