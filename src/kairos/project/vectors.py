"""The vector indexes behind a project's `kr.nearest` features, and the writes that keep them
current.

One index per searched vector feature (`doc.embedding`), at the project's `vectors:` URL (an
embedded folder, by default `.kairos/vectors`, or `postgresql://...` for pgvector), opened on
first use and closed with the client. Rows of a searched class reach its index wherever they
are written. Through `client.write_events` (so streams too) a row without its vector gets it
from the feature's `kr.embedding` model, one call for the whole batch, before anything is
kept; a row whose vector cannot be had fails the write naming the row. A backfill
(`client.materialize`) computes the vector and every scalar feature with the rest of its rows
(`backfilled`), and `BackfillVersions` turns the rows into versions, a failed row left out.

    >>> vectors = VectorFeatures(graph, ".kairos/vectors", embedders)  # doctest: +SKIP
    >>> documents = await vectors.documents(doc_info, rows)  # fills each row's vector
    >>> await vectors.write(documents)
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kairos.definitions.graph import ClassInfo, Graph
from kairos.definitions.nearest import NearestSearch
from kairos.engine.values import check, to_utc
from kairos.errors import InvalidInput, InvalidValue, KairosError, PlanError
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

    def backfilled(
        self, info: ClassInfo, plannable: Callable[[str], PlanError | None]
    ) -> list[str]:
        """The features a backfill of `info`'s class computes so that each row becomes a
        whole version in its indexes: every vector searched and every scalar feature (the
        FeatureTime only where `plannable` finds a way to compute it; else versions are
        observed at the grid time). Empty for a class no `kr.nearest` searches.
        `plannable(name)` is the planner's error for computing `name` from the key, or None."""
        searches = self.searched(info.namespace)
        if not searches:
            return []
        wanted = [f"{info.namespace}.{s.vector}" for s in searches]
        for name in version_attributes(info):
            fqn = f"{info.namespace}.{name}"
            error = plannable(fqn)
            if error is None:
                wanted.append(fqn)
            elif name != info.feature_time:
                indexes = ", ".join(s.index for s in searches)
                raise InvalidInput(
                    f"a backfill of {info.namespace} writes whole documents to the vector "
                    f"index of {indexes}, and {fqn} cannot be computed from "
                    f"{info.namespace}.{info.primary}: {error}; give {fqn} a resolver, or "
                    f"write the documents with client.write_events",
                    field="features",
                )
        return wanted

    async def close(self) -> None:
        with self._lock:
            indexes, self._indexes = list(self._indexes.values()), {}
        for index in indexes:
            await index.close()


def version_attributes(info: ClassInfo) -> list[str]:
    """The features a document version carries besides its id and vector: the class's
    scalar features that are not vectors or windows."""
    return [
        name
        for name, feature in info.features.items()
        if feature.kind == "scalar"
        and name != info.primary
        and name not in info.windowed
        and feature.type is not None
        and feature.type.kind != "vector"
    ]


class BackfillVersions:
    """Turns a backfill's computed rows of a searched class into document versions, in grid
    order, skipping a version identical to the id's previous one (the same observed_at, or
    the same vector and attributes), so a daily grid over an unchanged document adds nothing.

    >>> versions = BackfillVersions(info, vectors.searched(info.namespace))  # doctest: +SKIP
    >>> await vectors.write(versions.rows(keys, times, columns, failed))
    """

    def __init__(self, info: ClassInfo, searches: Sequence[NearestSearch]) -> None:
        self.info = info
        self.searches = list(searches)
        self.attributes = version_attributes(info)
        self.previous: dict[tuple[str, str], Document] = {}
        self.written = 0

    def rows(
        self,
        keys: Sequence[Any],
        times: Sequence[datetime],
        columns: Mapping[str, Sequence[Any]],
        failed: set[tuple[int | None, str]],
    ) -> dict[str, list[Document]]:
        """The new versions of one part of a backfill: `columns` by feature name (fqn), one
        value per row; a row with a failed feature of a version (its error is already in
        the report) or a null vector gives none."""
        ns, feature_time = self.info.namespace, self.info.feature_time
        found: dict[str, list[Document]] = {}
        names = [f"{ns}.{a}" for a in self.attributes if f"{ns}.{a}" in columns]
        for search in self.searches:
            vector_name = f"{ns}.{search.vector}"
            needed = [vector_name, *names]
            batch = found.setdefault(search.index, [])
            for row, (key, moment) in enumerate(zip(keys, times, strict=True)):
                vector = columns[vector_name][row]
                if key is None or vector is None or any((row, n) in failed for n in needed):
                    continue
                observed_at = moment
                stated = columns.get(f"{ns}.{feature_time}")
                if stated is not None and stated[row] is not None:
                    # when the document says it became true; never after the grid time
                    observed_at = min(to_utc(stated[row]), moment)
                attributes = {
                    name.split(".", 1)[1]: json_value(columns[name][row]) for name in names
                }
                attributes[self.info.primary] = json_value(key)
                if feature_time is not None:
                    attributes[feature_time] = json_value(observed_at)
                document = Document(str(key), observed_at, list(vector), attributes)
                previous = self.previous.get((search.index, document.id))
                if previous is not None and _same(previous, document, feature_time):
                    continue
                self.previous[(search.index, document.id)] = document
                batch.append(document)
                self.written += 1
        return found


def _same(previous: Document, document: Document, feature_time: str | None) -> bool:
    # the same time with other content is a correction: written, it replaces that version
    if {k: v for k, v in previous.attributes.items() if k != feature_time} != {
        k: v for k, v in document.attributes.items() if k != feature_time
    }:
        return False
    # recomputed from the same input, a vector can differ in its last bits (batching)
    return len(previous.vector) == len(document.vector) and all(
        math.isclose(a, b, rel_tol=0.0, abs_tol=1e-6)
        for a, b in zip(previous.vector, document.vector, strict=True)
    )
