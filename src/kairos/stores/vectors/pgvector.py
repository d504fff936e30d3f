"""The pgvector index: one PostgreSQL table per index, an HNSW index over it, psycopg 3 async.

    <name> (id text, observed_at timestamptz, valid_to timestamptz (null: newest),
            embedding vector(n), attributes jsonb, PRIMARY KEY (id, observed_at))
    <name>_hnsw: USING hnsw (embedding vector_cosine_ops)

A write inserts versions (the same id and observed_at replaces that version) and recomputes
`valid_to` of every version of the ids it touched, in one transaction holding an advisory lock
per id (or one for the table, past ID_LOCKS ids), so writers of the same document take turns.
A search is one statement:

    WHERE observed_at <= now AND (valid_to IS NULL OR valid_to > now) AND <conditions>
    ORDER BY embedding <=> q LIMIT k

pgvector's HNSW scan (0.6, 0.7) filters *after* it walks `hnsw.ef_search` candidates, so a
selective filter can leave fewer than k rows. When a search returns fewer than k rows, the
index counts the matching rows (up to k); if more match than came back, it searches again with
`hnsw.ef_search` at pgvector's maximum (SET LOCAL, in a transaction), and then, if still short,
exactly (SET LOCAL enable_indexscan = off). So a search returns min(k, matching) rows.

The graph is built with m 16, ef_construction 200 and searched with ef_search 100. With
ef_construction 128 and ef_search 64, recall@10 at 100k x 384 was 0.974-0.995 over three builds
in bench/vectors.py, but one build in CI gave 0.938: pgvector draws a graph's levels at random,
so a 0.95 promise needs margin. pgvector's defaults (m 16, ef_construction 64) gave 0.93 at
ef_search 40 and 0.96 at 100. The planner walks the HNSW index for the validity and
condition filters too (EXPLAIN: an Index Scan with a Filter). Options of the index, also
`?m=&ef_construction=&ef_search=` in its URL; m and ef_construction apply when the graph is
built (an existing one keeps its own until a bulk write rebuilds it). A first search's
ef_search is its connection's setting, so it costs no SET round trip.

A bulk write (>= BULK_ROWS versions, into a table holding no more rows than it brings) drops
the HNSW index, inserts and builds it again, in its one transaction: 1.1 ms a version for
100k in one write, against 8.5 ms a version written into the built graph (bench/vectors.py,
a loaded 2-core VM). Searches wait for that commit. Vectors travel as one binary `vector[]`.

Conditions compare as their value's type, as the embedded index does (columns.py):
`jsonb_typeof` first, strings byte-wise (COLLATE "C", as numpy compares code points).

>>> index = PgVectorIndex("postgresql://app@db/bank", "docs", dimensions=384)
"""

from __future__ import annotations

import asyncio
import functools
import struct
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import orjson

from kairos.backends import postgres
from kairos.backends.url import redact, scrub, take_options
from kairos.errors import BackendUnavailable, InvalidInput, KairosError
from kairos.stores.vectors.base import Condition, Document, Hit, VectorLike
from kairos.stores.vectors.checks import (
    Vector,
    check_document,
    check_search,
    check_time,
    unit_vectors,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql as pgsql
    from psycopg_pool import AsyncConnectionPool

# the graph's build and search parameters (measured in bench/vectors.py; see the module doc)
M = 16
EF_CONSTRUCTION = 200
EF_SEARCH = 100
EF_SEARCH_MAX = 1000  # pgvector's maximum
# a write of at least this many versions, into a table of at most as many rows, rebuilds the graph
BULK_ROWS = 1000
ID_LOCKS = 64  # a write touching more ids locks the whole table (for its writers) instead
OPTIONS = ("m", "ef_construction", "ef_search")
MAX_NAME = 48  # bytes: the table's name plus "_hnsw" stays within PostgreSQL's 63
POOL_SIZE = 10

_SQL_OPERATORS = {"==": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_JSON_TYPES = {"str": "string", "number": "number", "bool": "boolean"}


class PgVectorIndex:
    """A `VectorIndex` in PostgreSQL with pgvector; connects on its first call."""

    def __init__(
        self,
        url: str,
        name: str,
        dimensions: int,
        *,
        m: int | None = None,
        ef_construction: int | None = None,
        ef_search: int | None = None,
    ) -> None:
        """`m`, `ef_construction` (the graph) and `ef_search` (a search's first walk) default
        to the URL's `?m=&ef_construction=&ef_search=`, else to M, EF_CONSTRUCTION, EF_SEARCH.

        >>> PgVectorIndex("postgresql://app@db/bank?ef_search=100", "docs", dimensions=384)
        """
        if isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1:
            raise InvalidInput(
                f"vector index {name!r}: dimensions {dimensions!r} is not a positive int; "
                "pass the length of the vectors it will hold, e.g. 384",
                field="dimensions",
            )
        if not isinstance(name, str) or not name or len(name.encode()) > MAX_NAME:
            raise InvalidInput(
                f"vector index name {name!r} is not a non-empty name of at most {MAX_NAME} "
                "bytes; it names the table",
                field="name",
            )
        url, options = take_options(url, OPTIONS)
        self.m = _parameter(name, "m", m, options, M, 2, 100)
        self.ef_construction = _parameter(
            name, "ef_construction", ef_construction, options, EF_CONSTRUCTION, 4, 1000
        )
        self.ef_search = _parameter(
            name, "ef_search", ef_search, options, EF_SEARCH, 1, EF_SEARCH_MAX
        )
        if self.ef_construction < 2 * self.m:
            raise InvalidInput(
                f"vector index {name!r}: ef_construction {self.ef_construction!r} is less than "
                f"2 x m ({2 * self.m}); pgvector needs ef_construction >= 2 x m",
                field="ef_construction",
            )
        self.dimensions = dimensions
        self.name = name
        self._url = url
        self._where = f"vector index {name!r} at {redact(url)!r}"
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._opening: asyncio.Lock | None = None
        self._closed = False
        self._vector_oid = 0  # pgvector's type in this database, read when connecting

    # -- connecting ----------------------------------------------------------------------

    def _failed(self, error: Exception) -> Exception:
        # the driver's text may quote the URL, password included: scrubbed of it
        message = scrub(str(error).strip(), self._url)
        return BackendUnavailable(f"{self._where} failed ({type(error).__name__}: {message})")

    def _table(self, suffix: str = "") -> pgsql.Identifier:
        from psycopg import sql

        return sql.Identifier(self.name + suffix)

    async def _connection_pool(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        if self._closed:
            raise KairosError(f"{self._where} is closed; open it again to use it")
        if self._pool is not None:
            return self._pool
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._pool is None:
                with postgres.failures_as(self._failed):
                    connection = await postgres.connect_async(
                        self._url, autocommit=True, connect_timeout=postgres.CONNECT_TIMEOUT
                    )
                    async with connection:
                        await self._create(connection)
                self._pool = await postgres.open_pool(
                    self._url,
                    # a first search needs no SET (a round trip): its ef_search is the session's
                    kwargs={
                        "autocommit": True,
                        "options": f"-c TimeZone=UTC -c hnsw.ef_search={self.ef_search}",
                    },
                    max_size=POOL_SIZE,
                    timeout=30,
                    name=f"kairos-vectors-{self.name}",
                )
            return self._pool

    async def _create(self, connection: psycopg.AsyncConnection[Any]) -> None:
        """The table and its HNSW index, unless they exist (then their dimensions are checked)."""
        from psycopg import sql

        async with connection.transaction():
            # processes starting together must not race to create the table
            await connection.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 727274))",
                ("kairos.vectors." + self.name,),
            )
            row = await (
                await connection.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'")
            ).fetchone()
            if row is None:
                try:
                    async with connection.transaction():
                        await connection.execute("CREATE EXTENSION IF NOT EXISTS vector")
                except Exception as error:
                    if not postgres.is_error(error):
                        raise
                    raise BackendUnavailable(
                        f"{self._where}: the pgvector extension is not installed in this "
                        f"database and kairos may not install it ({type(error).__name__}); "
                        "run CREATE EXTENSION vector as a superuser (pgvector >= 0.6)"
                    ) from None
            found = await (
                await connection.execute(
                    "SELECT atttypmod FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                    "AND attname = 'embedding'",
                    (self._table().as_string(connection),),
                )
            ).fetchone()
            if found is not None and found[0] != self.dimensions:
                raise BackendUnavailable(
                    f"{self._where} holds vectors of {found[0]} dimensions, not "
                    f"{self.dimensions}; open it with dimensions={found[0]} or use another name"
                )
            await connection.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (id text NOT NULL, "
                    "observed_at timestamptz NOT NULL, valid_to timestamptz, "
                    "embedding vector({}) NOT NULL, attributes jsonb NOT NULL DEFAULT '{{}}', "
                    "PRIMARY KEY (id, observed_at))"
                ).format(self._table(), sql.Literal(self.dimensions))
            )
            await connection.execute(self._create_graph(if_not_exists=True))
            typed = await (
                await connection.execute(
                    "SELECT atttypid FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                    "AND attname = 'embedding'",
                    (self._table().as_string(connection),),
                )
            ).fetchone()
            if typed is not None:
                self._vector_oid = int(typed[0])

    def _create_graph(self, *, if_not_exists: bool = False) -> pgsql.Composed:
        from psycopg import sql

        return sql.SQL(
            "CREATE INDEX {} {} ON {} USING hnsw (embedding vector_cosine_ops) "
            "WITH (m = {}, ef_construction = {})"
        ).format(
            sql.SQL("IF NOT EXISTS" if if_not_exists else ""),
            self._table("_hnsw"),
            self._table(),
            sql.Literal(self.m),
            sql.Literal(self.ef_construction),
        )

    # -- writing -------------------------------------------------------------------------

    async def write(self, documents: Sequence[Document]) -> None:
        """Add versions; the same (id, observed_at) again replaces that version."""
        for document in documents:
            check_document(document)
        vectors = unit_vectors(documents, self.dimensions)
        latest: dict[tuple[str, int], int] = {}  # one row per version: the last write wins
        for at, document in enumerate(documents):
            latest[(document.id, check_time(document.observed_at, what="observed_at"))] = at
        chosen = sorted(latest.values())
        if not chosen:
            return
        ids = [documents[at].id for at in chosen]
        params = (
            ids,
            [documents[at].observed_at for at in chosen],
            [orjson.dumps(dict(documents[at].attributes)).decode() for at in chosen],
        )
        from psycopg import sql

        insert = sql.SQL(
            "INSERT INTO {t} (id, observed_at, embedding, attributes) "
            "SELECT i, o, e, a::jsonb FROM unnest(%s::text[], %s::timestamptz[], "
            "%s::text[], %b::vector[]) AS v(i, o, a, e) "
            "ON CONFLICT (id, observed_at) DO UPDATE "
            "SET embedding = excluded.embedding, attributes = excluded.attributes"
        ).format(t=self._table())
        # every version of the touched ids ends where the next begins (writes may come late)
        relink = sql.SQL(
            "UPDATE {t} AS t SET valid_to = n.next FROM (SELECT id, observed_at, "
            "lead(observed_at) OVER (PARTITION BY id ORDER BY observed_at) AS next "
            "FROM {t} WHERE id = ANY(%s::text[])) AS n "
            "WHERE t.id = n.id AND t.observed_at = n.observed_at "
            "AND t.valid_to IS DISTINCT FROM n.next"
        ).format(t=self._table())
        pool = await self._connection_pool()
        touched = sorted(set(ids))
        with postgres.failures_as(self._failed):
            async with pool.connection() as connection, connection.transaction():
                # the table's lock first (shared, or alone for many ids: a lock per id of
                # 100k ids ran out of PostgreSQL's lock table), then the ids' in one order
                table_lock = "kairos.vectors.writes." + self.name
                if len(touched) > ID_LOCKS:
                    await connection.execute(
                        "SELECT pg_advisory_xact_lock(hashtextextended(%s, 727275))",
                        (table_lock,),
                    )
                else:
                    await connection.execute(
                        "SELECT pg_advisory_xact_lock_shared(hashtextextended(%s, 727275))",
                        (table_lock,),
                    )
                    await connection.execute(
                        "SELECT pg_advisory_xact_lock(h) FROM (SELECT hashtextextended(i, "
                        "727275) AS h FROM unnest(%s::text[]) AS i ORDER BY h) AS locks",
                        ([f"{self.name}/{id_}" for id_ in touched],),
                    )
                rows = await self._bulk_rows(connection, len(chosen))
                if rows:
                    await connection.execute(
                        sql.SQL("DROP INDEX IF EXISTS {}").format(self._table("_hnsw"))
                    )
                cursor = connection.cursor()
                cursor.adapters.register_dumper(_Vectors, _vectors_dumper())
                embeddings = _Vectors(vectors[chosen], self._vector_oid)
                await cursor.execute(insert, (*params, embeddings))
                await connection.execute(relink, (touched,))
                if rows:
                    # the graph is built in memory, else on disk and slower; only ever raised
                    await connection.execute(
                        "SELECT set_config('maintenance_work_mem', greatest(%s, (SELECT "
                        "setting::bigint FROM pg_settings WHERE name = 'maintenance_work_mem'))"
                        "::text || 'kB', true)",
                        (_graph_kilobytes(rows, self.dimensions, self.m),),
                    )
                    await connection.execute(self._create_graph())

    async def _bulk_rows(self, connection: psycopg.AsyncConnection[Any], versions: int) -> int:
        """The table's rows after a write of `versions` that rebuilds the graph; 0 when the
        write should insert into the graph instead (too few versions, or too many rows)."""
        if versions < BULK_ROWS:
            return 0
        from psycopg import sql

        # bulk writers take turns: two would deadlock upgrading their locks to drop the index
        await connection.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 727276))",
            ("kairos.vectors.bulk." + self.name,),
        )
        cursor = await connection.execute(
            sql.SQL("SELECT count(*) FROM (SELECT 1 FROM {} LIMIT %s) AS r").format(self._table()),
            (versions + 1,),
        )
        counted = await cursor.fetchone()
        existing = 0 if counted is None else int(counted[0])
        return existing + versions if existing <= versions else 0

    # -- searching -----------------------------------------------------------------------

    async def search(
        self,
        query: VectorLike,
        k: int,
        *,
        as_of: datetime,
        where: Sequence[Condition] = (),
    ) -> list[Hit]:
        """The min(k, matching) nearest versions valid as of `as_of` matching `where`."""
        vector, _, conditions = check_search(query, k, as_of, where, self.dimensions)
        from psycopg import sql

        filters, filter_params = _filters(conditions)
        eligible = sql.SQL("observed_at <= %s AND (valid_to IS NULL OR valid_to > %s)" + filters)
        nearest = sql.SQL(
            "SELECT id, observed_at, attributes, embedding <=> %s::vector AS distance "
            "FROM {t} WHERE {eligible} ORDER BY embedding <=> %s::vector LIMIT %s"
        ).format(t=self._table(), eligible=eligible)
        text = _vector_text(vector)
        params = (text, as_of, as_of, *filter_params, text, k)
        pool = await self._connection_pool()
        with postgres.failures_as(self._failed):
            async with pool.connection() as connection:
                if k <= self.ef_search:
                    cursor = await connection.execute(nearest, params)
                    rows = await cursor.fetchall()
                else:
                    first = min(k, EF_SEARCH_MAX)
                    rows = await _run(
                        connection, nearest, params, f"SET LOCAL hnsw.ef_search = {first}"
                    )
                if len(rows) < k:
                    count = sql.SQL(
                        "SELECT count(*) FROM (SELECT 1 FROM {t} WHERE {eligible} LIMIT %s) AS m"
                    ).format(t=self._table(), eligible=eligible)
                    cursor = await connection.execute(count, (as_of, as_of, *filter_params, k))
                    counted = await cursor.fetchone()
                    matching = 0 if counted is None else int(counted[0])
                    for setting in (
                        f"SET LOCAL hnsw.ef_search = {EF_SEARCH_MAX}",
                        "SET LOCAL enable_indexscan = off",
                    ):
                        if len(rows) >= matching:
                            break
                        rows = await _run(connection, nearest, params, setting)
        return [
            Hit(id_, max(0.0, float(distance)), observed_at, attributes)
            for id_, observed_at, attributes, distance in rows
        ]

    async def close(self) -> None:
        """Close the pool. Idempotent."""
        self._closed = True
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()


async def _run(
    connection: psycopg.AsyncConnection[Any],
    query: pgsql.Composed,
    params: Sequence[Any],
    setting: str,
) -> list[tuple[Any, ...]]:
    async with connection.transaction():
        await connection.execute(setting)
        cursor = await connection.execute(query, params)
        return await cursor.fetchall()


def _graph_kilobytes(rows: int, dimensions: int, m: int) -> int:
    """About what pgvector's HNSW build holds in memory: each vector, 2m neighbours on the
    bottom layer (and a few above), the element's header; a quarter more to spare."""
    return (rows * (4 * dimensions + 48 * m + 256) * 5 // 4) // 1024 + 1024


class _Vectors:
    """Rows of float32 vectors, sent as one binary `vector[]` parameter (the text form took
    ~0.8 ms a vector of 384 to print here; this is a few numpy calls)."""

    __slots__ = ("data",)

    def __init__(self, vectors: npt.NDArray[np.float32], vector_oid: int) -> None:
        rows, dimensions = vectors.shape
        # array_recv: ndim, has nulls, element type, then length and lower bound per dimension
        header = struct.pack("!iiIii", 1, 0, vector_oid, rows, 1)
        element = np.dtype(
            [("size", ">i4"), ("dim", ">i2"), ("unused", ">i2"), ("values", ">f4", (dimensions,))]
        )
        body = np.empty(rows, element)
        body["size"] = 4 + 4 * dimensions
        body["dim"] = dimensions
        body["unused"] = 0
        body["values"] = vectors
        self.data = header + body.tobytes()


@functools.cache
def _vectors_dumper() -> type[psycopg.adapt.Dumper]:
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class VectorsDumper(Dumper):
        format = Format.BINARY  # oid 0: the server reads the type from the SQL's cast

        def dump(self, obj: Any) -> bytes:
            data: bytes = obj.data
            return data

    return VectorsDumper


def _vector_text(vector: Vector) -> str:
    """pgvector's text form, '[0.1,0.2,...]' (float32 values print exactly as float64)."""
    return "[" + ",".join(map(repr, vector.astype(np.float64).tolist())) + "]"


def _filters(conditions: Sequence[Condition]) -> tuple[str, list[Any]]:
    """` AND (...)` per condition, and its parameters in order (column names bound too)."""
    text = ""
    params: list[Any] = []
    for condition in conditions:
        if condition.op == "in":
            groups: dict[str, list[Any]] = {}
            for option in condition.value:
                groups.setdefault(_json_kind(option), []).append(option)
            parts = []
            for kind, options in groups.items():
                if kind == "str":
                    parts.append(
                        "(jsonb_typeof(attributes -> %s) = 'string' "
                        "AND (attributes ->> %s) = ANY(%s::text[]))"
                    )
                    params += [condition.column, condition.column, options]
                else:
                    parts.append(
                        f"(jsonb_typeof(attributes -> %s) = '{_JSON_TYPES[kind]}' "
                        "AND (attributes -> %s) = ANY(%s::jsonb[]))"
                    )
                    params += [
                        condition.column,
                        condition.column,
                        [orjson.dumps(option).decode() for option in options],
                    ]
            text += " AND (" + (" OR ".join(parts) or "FALSE") + ")"
            continue
        kind = _json_kind(condition.value)
        operator = _SQL_OPERATORS[condition.op]
        if kind == "str":
            text += (
                " AND (jsonb_typeof(attributes -> %s) = 'string' "
                f'AND (attributes ->> %s) COLLATE "C" {operator} %s)'
            )
            params += [condition.column, condition.column, condition.value]
        else:
            text += (
                f" AND (jsonb_typeof(attributes -> %s) = '{_JSON_TYPES[kind]}' "
                f"AND (attributes -> %s) {operator} %s::jsonb)"
            )
            params += [condition.column, condition.column, orjson.dumps(condition.value).decode()]
    return text, params


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "str"
    return "number"


def _parameter(
    name: str,
    key: str,
    given: int | None,
    options: dict[str, str],
    default: int,
    low: int,
    high: int,
) -> int:
    """A graph parameter: the argument, else the URL's `?key=`, else the default; checked."""
    value: object = given
    if value is None:
        value = options.get(key, default)
        if isinstance(value, str):
            value = int(value) if value.isascii() and value.isdigit() else value  # not "²"
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(
            f"vector index {name!r}: {key} {value!r} is not an int from {low} to {high}; "
            f"pass e.g. {key}={default}",
            field=key,
        )
    return value
