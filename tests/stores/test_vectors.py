"""Vector indexes, one test body over every backend: the embedded index (`embedded`; and
`embedded-graph`, the same index with exact search turned off below the graph, so every
search goes through hnswlib's filtered search and the exact retry) and pgvector on a real
PostgreSQL 16 + pgvector 0.6 server that `pgserver` (PyPI) starts in a temporary folder.

The oracle is brute force: numpy over every document's newest version as of `now`.
Recall is measured on 100k x 384 clustered vectors on both backends, built once per backend
(pgvector's write of 100k takes its bulk path: insert, then build the graph, ~1-2 minutes
here), with a filter and with versions that must stay invisible before their time.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
import warnings
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import psycopg
import pytest

from kairos.errors import BackendUnavailable, InvalidInput, KairosError
from kairos.stores.vectors import (
    Condition,
    Document,
    EmbeddedVectorIndex,
    Hit,
    PgVectorIndex,
    VectorIndex,
    open_vector_index,
)

T = TypeVar("T")
T0 = datetime(2024, 1, 1, tzinfo=UTC)
BACKENDS = ["embedded", "embedded-graph", "pgvector"]
RECALL_SIZE = 100_000
T1 = T0 + timedelta(days=1)


def clustered(n: int, d: int, queries: int, seed: int = 7) -> tuple[npt.NDArray[np.float32], ...]:
    """Unit vectors near 100 low-rank clusters (like text embeddings: a low intrinsic
    dimension), and queries drawn from the same clusters."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((100, d)).astype(np.float32)
    bases = rng.standard_normal((100, 16, d)).astype(np.float32) * 0.25
    out = []
    for m in (n, queries):
        which = rng.integers(0, 100, m)
        z = rng.standard_normal((m, 16)).astype(np.float32)
        x = centers[which] + 0.05 * rng.standard_normal((m, d)).astype(np.float32)
        for cluster in range(100):
            members = which == cluster
            x[members] += z[members] @ bases[cluster]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out.append(x)
    return tuple(out)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A PostgreSQL 16 server with pgvector, from the `pgserver` wheel, in its own folder and
    socket; stopped and removed at the end of the session."""
    # not under pytest's temp root: as root, pgserver runs PostgreSQL as user `pgserver`, and
    # every pytest that starts (another worker's, another session's) makes that root 0700 again
    folder = Path(tempfile.mkdtemp(prefix="kairos-pgserver-"))
    with warnings.catch_warnings():
        # pgserver reads XDG_RUNTIME_DIR when imported, and warns that it is not set
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import get_server

        server = get_server(folder / "pgdata", cleanup_mode="stop")
    try:
        url = server.get_uri()
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
        yield url
    finally:
        server.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class Backend:
    name: str
    folder: Path
    pg: str | None
    loop: asyncio.AbstractEventLoop
    opened: list[VectorIndex] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def open(self, name: str, dimensions: int) -> VectorIndex:
        index: VectorIndex
        if self.pg is not None:
            table = f"{name}_{uuid.uuid4().hex[:8]}"
            self.tables.append(table)
            index = open_vector_index(self.pg, table, dimensions)
        elif self.name == "embedded-graph":
            index = EmbeddedVectorIndex(self.folder, name, dimensions, exact_below=0)
        else:
            index = open_vector_index(str(self.folder), name, dimensions)
        self.opened.append(index)
        return index

    def write(self, index: VectorIndex, documents: list[Document]) -> None:
        self.run(index.write(documents))

    def search(self, index: VectorIndex, query: Any, k: int, **options: Any) -> list[Hit]:
        return self.run(index.search(query, k, **options))


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    pg = request.getfixturevalue("pg_url") if request.param == "pgvector" else None
    loop = asyncio.new_event_loop()
    backend = Backend(request.param, tmp_path / "vectors", pg, loop)
    try:
        yield backend
    finally:
        for index in backend.opened:
            loop.run_until_complete(index.close())
        loop.close()
        if pg is not None and backend.tables:
            with psycopg.connect(pg, autocommit=True) as connection:
                for table in backend.tables:
                    connection.execute(f'DROP TABLE IF EXISTS "{table}"')


def brute_force(
    vectors: npt.NDArray[np.float32], query: npt.NDArray[np.float32], k: int
) -> list[int]:
    order: list[int] = np.argsort(-(vectors @ query), kind="stable")[:k].tolist()
    return order


@dataclass
class Corpus:
    """100k documents at T0 ({"n": i, "bucket": i % 10}); then, at T1, a new version of
    2 documents per query placed right beside it (so a search before T1 that saw them would
    return them first)."""

    backend: Backend
    index: VectorIndex
    vectors: npt.NDArray[np.float32]  # as of T0
    later: npt.NDArray[np.float32]  # as of T1
    moved: npt.NDArray[np.int64]  # the documents with a T1 version
    queries: npt.NDArray[np.float32]


@pytest.fixture(scope="module", params=["embedded", "pgvector"])
def corpus(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Corpus]:
    pg = request.getfixturevalue("pg_url") if request.param == "pgvector" else None
    loop = asyncio.new_event_loop()
    backend = Backend(request.param, tmp_path_factory.mktemp("recall"), pg, loop)
    vectors, queries = clustered(RECALL_SIZE, 384, 50)
    rng = np.random.default_rng(11)
    moved = rng.choice(RECALL_SIZE, 2 * len(queries), replace=False)
    later = vectors.copy()
    near = np.repeat(queries, 2, axis=0) + 0.01 * rng.standard_normal((len(moved), 384))
    later[moved] = near / np.linalg.norm(near, axis=1, keepdims=True)
    try:
        index = backend.open("recall", 384)
        backend.write(
            index,
            [
                Document(f"d{i}", T0, vectors[i], {"n": i, "bucket": i % 10})
                for i in range(RECALL_SIZE)
            ],
        )
        backend.write(
            index,
            [Document(f"d{i}", T1, later[i], {"n": i, "bucket": i % 10}) for i in moved.tolist()],
        )
        yield Corpus(backend, index, vectors, later, moved, queries)
    finally:
        for opened in backend.opened:
            loop.run_until_complete(opened.close())
        loop.close()
        if pg is not None:
            with psycopg.connect(pg, autocommit=True) as connection:
                for table in backend.tables:
                    connection.execute(f'DROP TABLE IF EXISTS "{table}"')


def _recall(
    corpus: Corpus,
    vectors: npt.NDArray[np.float32],
    now: datetime,
    where: list[Condition],
    eligible: npt.NDArray[np.bool_],
) -> tuple[float, list[list[Hit]]]:
    rows = np.flatnonzero(eligible)
    candidates = vectors[rows]
    found, every = 0, []
    for query in corpus.queries:
        hits = corpus.backend.search(corpus.index, query, 10, as_of=now, where=where)
        truth = rows[brute_force(candidates, query, 10)]
        assert len(hits) == 10
        got = [hit.distance for hit in hits]
        assert got == sorted(got)
        exact = [1 - float(vectors[int(hit.id[1:])] @ query) for hit in hits]
        assert got == pytest.approx(exact, abs=1e-4)  # each hit's distance, of its version
        found += len({hit.id for hit in hits} & {f"d{i}" for i in truth})
        every.append(hits)
    return found / (10 * len(corpus.queries)), every


# the first test of each backend builds its corpus: the pgvector graph takes ~1-2 minutes here
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_recall_at_10_against_brute_force_at_100k(corpus: Corpus) -> None:
    everything = np.ones(RECALL_SIZE, dtype=bool)
    before, hits = _recall(corpus, corpus.vectors, T0, [], everything)
    assert before >= 0.95
    # the T1 versions, nearest to every query, are not seen before T1
    assert all(hit.observed_at == T0 for query_hits in hits for hit in query_hits)
    after, hits = _recall(corpus, corpus.later, T1, [], everything)
    assert after >= 0.95
    moved = {f"d{i}" for i in corpus.moved}
    for query_hits in hits:
        ids = [hit.id for hit in query_hits]
        assert len(set(ids)) == 10  # one version per document
        assert all((hit.observed_at == T1) == (hit.id in moved) for hit in query_hits)


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_filtered_recall_at_10_at_100k(corpus: Corpus) -> None:
    bucket = np.arange(RECALL_SIZE) % 10 == 3
    where = [Condition("bucket", "==", 3)]
    for now, vectors in ((T0, corpus.vectors), (T1, corpus.later)):
        found, hits = _recall(corpus, vectors, now, where, bucket)
        assert found >= 0.95, now
        assert all(hit.attributes["bucket"] == 3 for query_hits in hits for hit in query_hits)


def _grouped(backend: Backend, n: int = 3000) -> tuple[VectorIndex, npt.NDArray[np.float32]]:
    vectors, _ = clustered(n, 32, 1, seed=3)
    index = backend.open("grouped", 32)
    backend.write(
        index,
        [
            Document(f"d{i}", T0, vectors[i], {"group": i % 100, "rare": i in (5, 1500, 2999)})
            for i in range(n)
        ],
    )
    return index, vectors


def test_a_selective_filter_still_returns_k_hits(backend: Backend) -> None:
    index, vectors = _grouped(backend)
    members = np.arange(7, len(vectors), 100)  # 30 documents of 3000
    for query in vectors[:20]:
        hits = backend.search(index, query, 10, as_of=T0, where=[Condition("group", "==", 7)])
        assert len(hits) == 10
        assert all(hit.attributes["group"] == 7 for hit in hits)
        truth = members[brute_force(vectors[members], query, 1)[0]]
        assert hits[0].id == f"d{truth}"  # the nearest member is never lost


def test_a_filter_matching_three_documents_returns_exactly_those(backend: Backend) -> None:
    index, vectors = _grouped(backend)
    for query in vectors[:5]:
        hits = backend.search(index, query, 10, as_of=T0, where=[Condition("rare", "==", True)])
        assert sorted(hit.id for hit in hits) == ["d1500", "d2999", "d5"]
        assert [hit.id for hit in hits] == [
            f"d{[5, 1500, 2999][i]}" for i in brute_force(vectors[[5, 1500, 2999]], query, 3)
        ]


def test_conditions_compare_as_their_value_type(backend: Backend) -> None:
    attributes: list[dict[str, Any]] = [
        {"lang": "en", "year": 2019, "score": 0.5, "ok": True},
        {"lang": "fr", "year": 2021.0, "score": 2, "ok": False},
        {"lang": "de", "year": "2020", "tags": ["x"]},
        {"lang": None, "year": 2023},
        {"year": 2020, "lang": "EN"},
    ]
    rng = np.random.default_rng(5)
    index = backend.open("conditions", 8)
    backend.write(
        index,
        [
            Document(f"d{i}", T0, rng.standard_normal(8).tolist(), a)
            for i, a in enumerate(attributes)
        ],
    )
    cases: list[tuple[Condition, set[int]]] = [
        (Condition("lang", "==", "en"), {0}),
        (Condition("lang", "!=", "en"), {1, 2, 4}),  # null and missing never match
        (Condition("lang", "<", "a"), {4}),  # code-point order: "EN" < "a"
        (Condition("year", ">=", 2020), {1, 3, 4}),  # "2020" is a str, not a number
        (Condition("year", "==", 2021), {1}),  # 2021 == 2021.0
        (Condition("year", "==", "2020"), {2}),
        (Condition("year", "in", (2019, 2023.0, "2020")), {0, 2, 3}),
        (Condition("lang", "in", ()), set()),
        (Condition("score", "<=", 2), {0, 1}),
        (Condition("ok", "==", False), {1}),
        (Condition("ok", "==", 0), set()),  # a bool is not a number
        (Condition("missing", "==", 1), set()),
        (Condition("tags", "==", "x"), set()),  # a list is no str
    ]
    for condition, expected in cases:
        hits = backend.search(index, rng.standard_normal(8), 10, as_of=T0, where=[condition])
        assert {int(hit.id[1:]) for hit in hits} == expected, condition
    both = [Condition("year", ">=", 2020), Condition("lang", "!=", "EN")]
    assert {h.id for h in backend.search(index, np.ones(8), 10, as_of=T0, where=both)} == {"d1"}


def test_point_in_time(backend: Backend) -> None:
    index = backend.open("pit", 4)
    day = timedelta(days=1)
    backend.write(
        index,
        [
            Document("old", T0, [1, 0, 0, 0], {"v": 1}),
            Document("moved", T0, [1, 0.1, 0, 0], {"v": 1}),
            Document("moved", T0 + 2 * day, [0, 0, 1, 0], {"v": 2}),
            Document("future", T0 + 5 * day, [1, 0, 0, 0], {"v": 1}),
        ],
    )
    backend.write(index, [Document("moved", T0 + day, [0, 1, 0, 0], {"v": 3})])  # late, between

    def seen(now: datetime, where: list[Condition] | None = None) -> list[tuple[str, int]]:
        hits = backend.search(index, [1, 0, 0, 0], 10, as_of=now, where=where or [])
        return sorted((hit.id, hit.attributes["v"]) for hit in hits)

    assert seen(T0 - day) == []
    assert seen(T0) == [("moved", 1), ("old", 1)]
    assert seen(T0 + day) == [("moved", 3), ("old", 1)]
    assert seen(T0 + 2 * day - timedelta(microseconds=1)) == [("moved", 3), ("old", 1)]
    assert seen(T0 + 3 * day) == [("moved", 2), ("old", 1)]
    assert seen(T0 + 5 * day) == [("future", 1), ("moved", 2), ("old", 1)]
    # an old version matching a filter is not found once a newer one is valid
    assert seen(T0 + 3 * day, [Condition("v", "==", 1)]) == [("old", 1)]
    hits = backend.search(index, [0, 0, 1, 0], 1, as_of=T0 + 3 * day)
    assert (hits[0].id, hits[0].observed_at, hits[0].distance) == ("moved", T0 + 2 * day, 0.0)


def test_the_same_version_written_again_replaces_it(backend: Backend) -> None:
    index = backend.open("rewrite", 3)
    backend.write(index, [Document("a", T0, [1, 0, 0], {"v": 1}), Document("b", T0, [0, 1, 0])])
    backend.write(index, [Document("a", T0, [0, 0, 1], {"v": 2})])
    hits = backend.search(index, [0, 0, 1], 10, as_of=T0)
    assert [(hit.id, hit.attributes) for hit in hits] == [("a", {"v": 2}), ("b", {})]
    assert hits[0].distance == pytest.approx(0.0, abs=1e-6)


def test_bad_input_is_refused_naming_the_document_and_the_fix(backend: Backend) -> None:
    index = backend.open("bad", 3)
    cases: list[tuple[Document, str]] = [
        (Document("short", T0, [1.0, 2.0]), "document 'short': vector has 2 values"),
        (Document("nan", T0, [1.0, float("nan"), 0.0]), "document 'nan': vector .* NaN"),
        (Document("zero", T0, [0.0, 0.0, 0.0]), "document 'zero': vector is all zeros"),
        (Document("naive", datetime(2024, 1, 1), [1, 0, 0]), "timezone-aware"),
        (Document("", T0, [1, 0, 0]), "document id '' is not"),
        (Document("when", T0, [1, 0, 0], {"at": T0}), "'at'.*not a JSON value"),
    ]
    for document, message in cases:
        with pytest.raises(InvalidInput, match=message):
            backend.write(index, [Document("fine", T0, [1, 0, 0]), document])
    assert backend.search(index, [1, 0, 0], 5, as_of=T0) == []  # nothing of a refused write
    with pytest.raises(InvalidInput, match="search query: vector has 4 values"):
        backend.search(index, [1, 0, 0, 0], 5, as_of=T0)
    with pytest.raises(InvalidInput, match="k 0 is not a positive int"):
        backend.search(index, [1, 0, 0], 0, as_of=T0)
    with pytest.raises(InvalidInput, match=r"as_of .* timezone-aware"):
        backend.search(index, [1, 0, 0], 5, as_of=datetime(2024, 1, 1))
    with pytest.raises(InvalidInput, match="operator '~' is not one of"):
        backend.search(index, [1, 0, 0], 5, as_of=T0, where=[Condition("a", "~", 1)])  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="'in' needs a tuple"):
        backend.search(index, [1, 0, 0], 5, as_of=T0, where=[Condition("a", "in", "ab")])
    with pytest.raises(InvalidInput, match="null never matches"):
        backend.search(index, [1, 0, 0], 5, as_of=T0, where=[Condition("a", "==", None)])


def test_reopening_with_other_dimensions_is_refused(backend: Backend) -> None:
    index = backend.open("dims", 3)
    backend.write(index, [Document("a", T0, [1, 0, 0])])
    backend.run(index.close())
    with pytest.raises(BackendUnavailable, match="3 dimensions, not 4; open it with dimensions=3"):
        # the embedded index reads its folder when opened, pgvector on its first call
        if backend.pg is not None:
            other: VectorIndex = PgVectorIndex(backend.pg, backend.tables[-1], 4)
        else:
            other = EmbeddedVectorIndex(backend.folder, "dims", 4)
        backend.opened.append(other)
        backend.run(other.search([1, 0, 0, 0], 1, as_of=T0))


# -- the embedded index only ---------------------------------------------------------------


def test_reopening_the_folder_loads_every_version(tmp_path: Path) -> None:
    vectors, queries = clustered(3000, 16, 5, seed=9)

    async def scenario() -> None:
        index = EmbeddedVectorIndex(tmp_path, "docs", 16, exact_below=100)  # with a graph
        await index.write([Document(f"d{i}", T0, vectors[i], {"i": i}) for i in range(3000)])
        await index.write([Document("d0", T0 + timedelta(days=1), vectors[1], {"i": -1})])
        before = [await index.search(q, 5, as_of=T0 + timedelta(days=2)) for q in queries]
        old = await index.search(vectors[0], 1, as_of=T0)
        await index.close()
        assert (tmp_path / "docs" / "CURRENT").read_text() == "1"
        again = EmbeddedVectorIndex(tmp_path, "docs", 16, exact_below=100)
        assert again._graph is not None  # loaded from the snapshot, not rebuilt
        assert [await again.search(q, 5, as_of=T0 + timedelta(days=2)) for q in queries] == before
        assert await again.search(vectors[0], 1, as_of=T0) == old
        assert old[0].attributes == {"i": 0}
        await again.close()

    asyncio.run(scenario())


def test_writes_survive_a_process_that_dies_without_closing(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import asyncio, os
        from datetime import datetime, timezone
        from kairos.stores.vectors import Document, EmbeddedVectorIndex
        t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
        async def main():
            index = EmbeddedVectorIndex({str(tmp_path)!r}, "docs", 2)
            await index.write([Document("a", t0, [1, 0], {{"n": 1}})])
            await index.write([Document("b", t0, [0, 1])])
            os._exit(0)  # no close: no snapshot, only the log
        asyncio.run(main())
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    with open(tmp_path / "docs" / "log-0", "ab") as log:
        log.write(b"\x10\x00\x00")  # a record torn by the crash
    index = EmbeddedVectorIndex(tmp_path, "docs", 2)
    try:
        hits = asyncio.run(index.search([1, 0], 5, as_of=T0))
        assert [(hit.id, hit.attributes) for hit in hits] == [("a", {"n": 1}), ("b", {})]
    finally:
        asyncio.run(index.close())


def test_a_folder_is_open_once(tmp_path: Path) -> None:
    index = EmbeddedVectorIndex(tmp_path, "docs", 2)
    with pytest.raises(BackendUnavailable, match="already open"):
        EmbeddedVectorIndex(tmp_path, "docs", 2)
    asyncio.run(index.close())
    asyncio.run(EmbeddedVectorIndex(tmp_path, "docs", 2).close())


def test_searches_and_writes_from_threads(tmp_path: Path) -> None:
    vectors, _ = clustered(2000, 16, 1, seed=4)
    index = EmbeddedVectorIndex(tmp_path, "docs", 16, exact_below=50)

    def writer(part: int) -> None:
        docs = [Document(f"d{i}", T0, vectors[i]) for i in range(part, 2000, 4)]
        for start in range(0, len(docs), 50):
            asyncio.run(index.write(docs[start : start + 50]))

    def reader(part: int) -> int:
        return sum(len(asyncio.run(index.search(vectors[i], 3, as_of=T0))) for i in range(200))

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        writes = [pool.submit(writer, part) for part in range(4)]
        reads = [pool.submit(reader, part) for part in range(4)]
        for future in writes + reads:
            future.result()
    hits = asyncio.run(index.search(vectors[1234], 1, as_of=T0))
    assert hits[0].id == "d1234"
    assert len(asyncio.run(index.search(vectors[0], 2000, as_of=T0))) == 2000
    asyncio.run(index.close())


def test_open_vector_index_chooses_the_backend_by_url(tmp_path: Path) -> None:
    index = open_vector_index(f"file://{tmp_path}", "docs", 2)
    assert isinstance(index, EmbeddedVectorIndex)
    asyncio.run(index.close())
    assert (tmp_path / "docs" / "LOCK").exists()
    pg = open_vector_index("postgres://app:s3cret@db.invalid/bank", "docs", 2)
    assert isinstance(pg, PgVectorIndex)  # connects on first use
    with pytest.raises(KairosError, match=r"'redis://cache' has scheme 'redis'; supported: a "):
        open_vector_index("redis://cache", "docs", 2)
    with pytest.raises(InvalidInput, match="is not a plain name"):
        open_vector_index(str(tmp_path), "../up", 2)
    with pytest.raises(InvalidInput, match="dimensions 0 is not a positive int"):
        open_vector_index(str(tmp_path), "docs", 0)


def test_pgvector_failures_hide_the_password() -> None:
    index = PgVectorIndex("postgresql://app:s3cret@127.0.0.1:1/bank", "docs", 2)
    with pytest.raises(BackendUnavailable) as raised:
        asyncio.run(index.search([1, 0], 1, as_of=T0))
    assert "s3cret" not in str(raised.value)
    assert "postgresql://app:***@127.0.0.1:1/bank" in str(raised.value)


# -- pgvector only -------------------------------------------------------------------------


def _graph(pg: str, table: str) -> tuple[int, list[str]]:
    """The oid and the options of the table's HNSW index."""
    with psycopg.connect(pg, autocommit=True) as connection:
        row = connection.execute(
            "SELECT oid, reloptions FROM pg_class WHERE relname = %s", (f"{table}_hnsw",)
        ).fetchone()
    assert row is not None
    return int(row[0]), list(row[1])


def test_pgvector_graph_options_come_from_the_url(pg_url: str) -> None:
    table = f"options_{uuid.uuid4().hex[:8]}"
    index = open_vector_index(f"{pg_url}&m=8&ef_construction=40&ef_search=12", table, 4)
    assert isinstance(index, PgVectorIndex)
    assert (index.m, index.ef_construction, index.ef_search) == (8, 40, 12)

    async def scenario() -> list[Hit]:
        try:
            await index.write([Document("a", T0, [1, 0, 0, 0])])
            return await index.search([1, 0, 0, 0], 20, as_of=T0)  # k above ef_search
        finally:
            await index.close()

    try:
        assert [hit.id for hit in asyncio.run(scenario())] == ["a"]
        assert _graph(pg_url, table)[1] == ["m=8", "ef_construction=40"]
    finally:
        with psycopg.connect(pg_url, autocommit=True) as connection:
            connection.execute(f'DROP TABLE IF EXISTS "{table}"')
    assert PgVectorIndex(pg_url, "t", 4, ef_search=30).ef_search == 30  # the argument wins
    default = PgVectorIndex(pg_url, "t", 4)
    assert (default.m, default.ef_construction, default.ef_search) == (16, 200, 100)
    for options, message in (
        ("ef_search=0", "ef_search 0 is not an int from 1 to 1000"),
        ("m=big", "m 'big' is not an int from 2 to 100"),
        ("m=32&ef_construction=40", r"ef_construction 40 is less than 2 x m \(64\)"),
    ):
        with pytest.raises(InvalidInput, match=message):
            open_vector_index(f"postgresql://app@db/bank?{options}", "docs", 4)


def test_pgvector_bulk_writes_rebuild_the_graph_and_others_insert_into_it(pg_url: str) -> None:
    from kairos.stores.vectors.pgvector import BULK_ROWS

    table = f"bulk_{uuid.uuid4().hex[:8]}"
    vectors, queries = clustered(5 * BULK_ROWS, 16, 5, seed=12)
    index = PgVectorIndex(pg_url, table, 16)
    graphs: list[int] = []

    async def scenario() -> list[list[Hit]]:
        try:
            # 1 row; more versions than rows: built again; fewer: inserted into the graph;
            # then as many versions as rows: built again
            for start, stop in (
                (0, 1),
                (1, 1 + BULK_ROWS),
                (1 + BULK_ROWS, 1 + 2 * BULK_ROWS),
                (1 + 2 * BULK_ROWS, 2 + 4 * BULK_ROWS),
            ):
                await index.write([Document(f"d{i}", T0, vectors[i]) for i in range(start, stop)])
                graphs.append(_graph(pg_url, table)[0])
            for i in (0, 1, 1 + BULK_ROWS, 1 + 2 * BULK_ROWS):  # a row of every write
                assert [hit.id for hit in await index.search(vectors[i], 1, as_of=T0)] == [f"d{i}"]
            return [await index.search(query, 5, as_of=T0) for query in queries]
        finally:
            await index.close()

    try:
        found = asyncio.run(scenario())
        first, second, third, fourth = graphs
        assert first != second == third != fourth
        assert _graph(pg_url, table)[1] == [
            f"m={index.m}",
            f"ef_construction={index.ef_construction}",
        ]
        for query, hits in zip(queries, found, strict=True):
            truth = brute_force(vectors[: 2 + 4 * BULK_ROWS], query, 5)
            assert len(hits) == 5
            assert hits[0].id == f"d{truth[0]}"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as connection:
            connection.execute(f'DROP TABLE IF EXISTS "{table}"')
