"""The embedded vector index: every document version in memory, an HNSW graph (hnswlib) over
them, and an index file under a folder (files.py) that reopening loads.

A search first computes, as one vectorized mask over all versions, which are *eligible*:
valid as of `now` (`observed_at <= now <` the next version's `observed_at`) and matching every
condition (columns.py). Then:

- few eligible versions (eligible² <= EXACT_SCALE x versions, measured in bench/vectors.py:
  exact numpy search over them is then faster than a filtered graph search): exact search;
- otherwise the graph search, with the mask as hnswlib's `filter`, so a version that is not
  eligible is skipped *during* the search and never takes a place in the top k;
- and if the graph returns fewer than min(k, eligible) hits (a very selective filter can cut
  the graph into pieces the search cannot reach), exact search over the eligible versions.

So a search returns min(k, eligible) hits, always. Calls are thread-safe (one lock); a large
write runs on a thread so the event loop is not held while the graph grows.

>>> index = EmbeddedVectorIndex(".kairos/vectors", "docs", dimensions=384)
>>> await index.write([Document("d1", t0, vector, {"lang": "en"})])
>>> await index.search(query, k=10, as_of=now, where=[Condition("lang", "==", "en")])
"""

from __future__ import annotations

import asyncio
import bisect
import threading
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from kairos.errors import InvalidInput, KairosError
from kairos.stores.vectors.base import Condition, Document, Hit, VectorLike
from kairos.stores.vectors.checks import (
    Vector,
    check_document,
    check_search,
    check_time,
    time_of,
    unit_vectors,
)
from kairos.stores.vectors.columns import Columns, Mask
from kairos.stores.vectors.files import IndexFiles, Rows

if TYPE_CHECKING:
    import hnswlib

NEVER = np.iinfo(np.int64).max  # valid_to of a document's newest version
# Search is exact when eligible**2 <= EXACT_SCALE * rows. Measured (bench/vectors.py
# --threshold, 100k x 384): a filtered graph search costs ~0.16 ms / (eligible share), an
# exact one ~0.18 µs per eligible row; they cross near 9k eligible rows of 100k (3% of 1M).
EXACT_SCALE = 900
# HNSW settings (bench/vectors.py --candidates: recall@10 0.9995 at 100k x 384, 0.15 ms).
M = 16
EF_CONSTRUCTION = 100
EF_SEARCH = 100
# A write of this many documents or more runs on a thread.
THREAD_WRITES = 1_000
# The log is folded into a new snapshot when it holds more rows than this and the snapshot.
SNAPSHOT_ROWS = 50_000


class EmbeddedVectorIndex:
    """A `VectorIndex` in process, kept in `<folder>/<name>/`."""

    def __init__(
        self,
        folder: str | Path,
        name: str,
        dimensions: int,
        *,
        exact_below: int | None = None,
    ) -> None:
        """`exact_below`: search exactly when at most this many versions are eligible
        (default: the measured rule, EXACT_SCALE)."""
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            raise InvalidInput(
                f"vector index {name!r}: dimensions {dimensions!r} is not a positive int; "
                "pass the length of the vectors it will hold, e.g. 384",
                field="dimensions",
            )
        if not isinstance(name, str) or not name or name in (".", "..") or "/" in name:
            raise InvalidInput(
                f"vector index name {name!r} is not a plain name; use letters, digits, "
                "'_' or '-' (it names a folder)",
                field="name",
            )
        self.dimensions = dimensions
        self.name = name
        self._exact_below = exact_below
        self._lock = threading.Lock()
        self._closed = False
        self._count = 0
        self._vectors: Vector = np.empty((0, dimensions), np.float32)
        self._observed: npt.NDArray[np.int64] = np.empty(0, np.int64)
        self._valid_to: npt.NDArray[np.int64] = np.empty(0, np.int64)
        self._ids: list[str] = []
        self._attributes: list[dict[str, Any]] = []
        self._columns = Columns()
        # id -> its versions as sorted (observed_at µs, row)
        self._versions: dict[str, list[tuple[int, int]]] = {}
        # The newest version of each id, and the latest observed_at: a search as of a time at
        # or after it (an online query) reads this mask instead of computing one.
        self._newest: Mask = np.zeros(0, np.bool_)
        self._latest = np.iinfo(np.int64).min
        self._graph: hnswlib.Index | None = None
        self._in_graph = 0  # rows [0, _in_graph) are in the graph
        self._stale: set[int] = set()  # rows in the graph whose vector was overwritten
        self._files = IndexFiles(Path(folder) / name, dimensions)
        try:
            self._load()
        except BaseException:
            self._files.close()
            raise

    # -- reading the folder -------------------------------------------------------------

    def _load(self) -> None:
        rows, in_snapshot = self._files.load()
        self._reserve(len(rows.ids))
        # Snapshot rows are one per (id, observed_at) already; the log's are replayed as writes.
        for row in range(in_snapshot):
            self._add_row(
                rows.ids[row], rows.observed[row], rows.attributes[row], rows.vectors[row]
            )
        graph = self._files.graph
        if graph is not None:
            self._graph = self._open_graph(len(rows.ids))
            self._graph.load_index(str(graph), max_elements=max(len(self._vectors), 1))
            self._graph.set_num_threads(1)
            self._in_graph = self._graph.get_current_count()
        log = Rows(
            rows.ids[in_snapshot:],
            rows.observed[in_snapshot:],
            rows.attributes[in_snapshot:],
            rows.vectors[in_snapshot:],
        )
        self._snapshot_rows = in_snapshot
        self._logged_rows = len(log.ids)
        self._apply(log)

    # -- writing -------------------------------------------------------------------------

    async def write(self, documents: Sequence[Document]) -> None:
        """Add versions; the same (id, observed_at) again replaces that version."""
        for document in documents:
            check_document(document)
        rows = Rows(
            [document.id for document in documents],
            [
                check_time(document.observed_at, what=f"document {document.id!r}: observed_at")
                for document in documents
            ],
            [dict(document.attributes) for document in documents],
            unit_vectors(documents, self.dimensions),
        )
        if not rows.ids:
            return
        if len(rows.ids) >= THREAD_WRITES:
            await asyncio.to_thread(self._write, rows)
        else:
            self._write(rows)

    def _write(self, rows: Rows) -> None:
        with self._lock:
            self._check_open()
            self._files.append(rows)
            self._logged_rows += len(rows.ids)
            self._apply(rows)
            if self._logged_rows > max(SNAPSHOT_ROWS, self._snapshot_rows):
                self._snapshot()

    def _apply(self, rows: Rows) -> None:
        self._reserve(self._count + len(rows.ids))
        for at, id_ in enumerate(rows.ids):
            observed = rows.observed[at]
            versions = self._versions.get(id_)
            if versions is not None:
                place = bisect.bisect_left(versions, (observed, -1))
                if place < len(versions) and versions[place][0] == observed:
                    row = versions[place][1]  # the same version again: the last write wins
                    self._vectors[row] = rows.vectors[at]
                    self._attributes[row] = rows.attributes[at]
                    self._columns.set(row, rows.attributes[at])
                    if row < self._in_graph:
                        self._stale.add(row)
                    continue
            self._add_row(id_, observed, rows.attributes[at], rows.vectors[at])
        if self._graph is not None or not self._exact(self._count, self._count):
            self._update_graph()

    def _exact(self, eligible: int, rows: int) -> bool:
        if self._exact_below is not None:
            return eligible <= self._exact_below
        return eligible * eligible <= EXACT_SCALE * rows

    def _add_row(self, id_: str, observed: int, attributes: dict[str, Any], vector: Vector) -> None:
        row = self._count
        self._count += 1
        self._vectors[row] = vector
        self._observed[row] = observed
        self._ids.append(id_)
        self._attributes.append(attributes)
        self._columns.set(row, attributes)
        versions = self._versions.setdefault(id_, [])
        place = bisect.bisect_left(versions, (observed, -1))
        versions.insert(place, (observed, row))
        following = versions[place + 1][0] if place + 1 < len(versions) else NEVER
        self._valid_to[row] = following
        self._newest[row] = following == NEVER
        self._latest = max(self._latest, observed)
        if place > 0:
            self._valid_to[versions[place - 1][1]] = observed
            self._newest[versions[place - 1][1]] = False

    def _reserve(self, rows: int) -> None:
        if rows <= len(self._observed):
            return
        capacity = max(rows, 2 * len(self._observed), 1024)
        vectors = np.empty((capacity, self.dimensions), np.float32)
        vectors[: self._count] = self._vectors[: self._count]
        observed = np.empty(capacity, np.int64)
        observed[: self._count] = self._observed[: self._count]
        valid_to = np.empty(capacity, np.int64)
        valid_to[: self._count] = self._valid_to[: self._count]
        newest = np.zeros(capacity, np.bool_)
        newest[: self._count] = self._newest[: self._count]
        self._vectors, self._observed, self._valid_to = vectors, observed, valid_to
        self._newest = newest
        self._columns.reserve(capacity)
        if self._graph is not None and self._graph.get_max_elements() < capacity:
            self._graph.resize_index(capacity)

    def _open_graph(self, capacity: int) -> hnswlib.Index:
        import hnswlib  # imported on first use: `import kairos` does not pay for it

        graph = hnswlib.Index(space="ip", dim=self.dimensions)  # unit rows: 1 - ip = cosine
        graph.init_index(
            max_elements=max(capacity, 1024), M=M, ef_construction=EF_CONSTRUCTION, random_seed=7
        )
        return graph

    def _update_graph(self) -> None:
        """Put new rows into the graph, and overwritten vectors in place of the old."""
        if self._graph is None:
            self._graph = self._open_graph(len(self._observed))
        rows = np.arange(self._in_graph, self._count)
        if self._stale:
            rows = np.concatenate([np.fromiter(sorted(self._stale), np.int64), rows])
            self._stale.clear()
        if len(rows):
            self._graph.add_items(self._vectors[rows], rows, num_threads=-1)
            self._in_graph = self._count

    # -- searching -----------------------------------------------------------------------

    async def search(
        self,
        query: VectorLike,
        k: int,
        *,
        as_of: datetime,
        where: Sequence[Condition] = (),
    ) -> list[Hit]:
        """The min(k, eligible) nearest versions valid as of `as_of` matching `where`."""
        vector, now, conditions = check_search(query, k, as_of, where, self.dimensions)
        return self.search_now(vector, k, now, conditions)

    def search_now(
        self, query: Vector, k: int, now: int, conditions: tuple[Condition, ...]
    ) -> list[Hit]:
        """`search` with its arguments checked (`query` a unit vector, `now` in µs)."""
        with self._lock:
            self._check_open()
            n = self._count
            if now >= self._latest:
                eligible = self._newest[:n]
                count = len(self._versions)
            else:
                eligible = (self._observed[:n] <= now) & (self._valid_to[:n] > now)
                count = -1
            for condition in conditions:
                eligible = eligible & self._columns.mask(condition, rows=n)
                count = -1
            if count < 0:
                count = int(np.count_nonzero(eligible))
            want = min(k, count)
            if want == 0:
                return []
            found = None
            if self._graph is not None and not self._exact(count, n):
                found = self._graph_search(query, want, eligible if count < n else None)
            if found is None or len(found[0]) < want:
                found = self._exact_search(query, want, eligible, count)
            rows, distances = found
            return [
                Hit(
                    self._ids[row],
                    max(0.0, float(distance)),
                    time_of(int(self._observed[row])),
                    dict(self._attributes[row]),
                )
                for row, distance in zip(rows.tolist(), distances.tolist(), strict=True)
            ]

    def _graph_search(
        self, query: Vector, want: int, eligible: Mask | None
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]] | None:
        graph = self._graph
        if graph is None:
            return None
        graph.set_ef(max(EF_SEARCH, want))
        try:
            labels, distances = graph.knn_query(
                query,
                k=want,
                num_threads=1,
                filter=None if eligible is None else eligible.__getitem__,
            )
        except RuntimeError:  # hnswlib: fewer than k found ("Cannot return the results ...")
            return None
        return labels[0].astype(np.int64), distances[0]

    def _exact_search(
        self, query: Vector, want: int, eligible: Mask, count: int
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
        n = self._count
        if count == n:
            rows = np.arange(n)
            similarities = self._vectors[:n] @ query
        else:
            rows = np.flatnonzero(eligible)
            similarities = self._vectors[rows] @ query
        if want < len(rows):
            top = np.argpartition(-similarities, want - 1)[:want]
        else:
            top = np.arange(len(rows))
        top = top[np.argsort(-similarities[top], kind="stable")]
        return rows[top], (1.0 - similarities[top]).astype(np.float32)

    # -- closing -------------------------------------------------------------------------

    def _snapshot(self) -> None:
        n = self._count
        rows = Rows(
            self._ids[:n], self._observed[:n].tolist(), self._attributes[:n], self._vectors[:n]
        )
        graph = self._graph
        self._files.write_snapshot(rows, None if graph is None else graph.save_index)
        self._snapshot_rows = n
        self._logged_rows = 0

    def _check_open(self) -> None:
        if self._closed:
            raise KairosError(f"vector index {self.name!r} is closed; open it again to use it")

    async def close(self) -> None:
        """Fold the log into a snapshot and release the folder. Idempotent."""
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._logged_rows:
                    self._snapshot()
            finally:
                self._files.close()
