"""The pgvector index: one PostgreSQL table per index, an HNSW index over it, psycopg 3 async.

    <name> (id text, observed_at timestamptz, valid_to timestamptz (null: newest),
            embedding vector(n), attributes jsonb, PRIMARY KEY (id, observed_at))
    <name>_hnsw: USING hnsw (embedding vector_cosine_ops)

A write inserts versions (the same id and observed_at replaces that version) and recomputes
`valid_to` of every version of the ids it touched, in one transaction holding an advisory lock
per id, so writers of the same document take turns. A search is one statement:

    WHERE observed_at <= now AND (valid_to IS NULL OR valid_to > now) AND <conditions>
    ORDER BY embedding <=> q LIMIT k

pgvector's HNSW scan (0.6, 0.7) filters *after* it walks `hnsw.ef_search` candidates, so a
selective filter can leave fewer than k rows. When a search returns fewer than k rows, the
index counts the matching rows (up to k); if more match than came back, it searches again with
`hnsw.ef_search` at pgvector's maximum (SET LOCAL, in a transaction), and then, if still short,
exactly (SET LOCAL enable_indexscan = off). So a search returns min(k, matching) rows.

Conditions compare as their value's type, as the embedded index does (columns.py):
`jsonb_typeof` first, strings byte-wise (COLLATE "C", as numpy compares code points).

>>> index = PgVectorIndex("postgresql://app@db/bank", "docs", dimensions=384)
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from kairos.backends import postgres
from kairos.backends.url import redact, scrub
from kairos.errors import BackendUnavailable, InvalidInput, KairosError
from kairos.stores.vectors.base import Condition, Document, Hit, VectorLike
from kairos.stores.vectors.checks import (
    Vector,
    check_conditions,
    check_document,
    check_k,
    check_time,
    unit_vector,
    unit_vectors,
)

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql as pgsql
    from psycopg_pool import AsyncConnectionPool

# hnsw.ef_search of a first search (pgvector's default, 40, gave recall@10 0.94 at 100k x 384
# in bench/vectors.py); pgvector allows up to 1000
EF_SEARCH_DEFAULT = 100
EF_SEARCH_MAX = 1000
MAX_NAME = 48  # bytes: the table's name plus "_hnsw" stays within PostgreSQL's 63
POOL_SIZE = 10

_SQL_OPERATORS = {"==": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_JSON_TYPES = {"str": "string", "number": "number", "bool": "boolean"}


class PgVectorIndex:
    """A `VectorIndex` in PostgreSQL with pgvector; connects on its first call."""

    def __init__(self, url: str, name: str, dimensions: int) -> None:
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
        self.dimensions = dimensions
        self.name = name
        self._url = url
        self._where = f"vector index {name!r} at {redact(url)!r}"
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._opening: asyncio.Lock | None = None
        self._closed = False

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
                    kwargs={"autocommit": True, "options": "-c TimeZone=UTC"},
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
            await connection.execute(
                sql.SQL(
                    "CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (embedding vector_cosine_ops)"
                ).format(self._table("_hnsw"), self._table())
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
            [_vector_text(vectors[at]) for at in chosen],
            [orjson.dumps(dict(documents[at].attributes)).decode() for at in chosen],
        )
        from psycopg import sql

        insert = sql.SQL(
            "INSERT INTO {t} (id, observed_at, embedding, attributes) "
            "SELECT i, o, e::vector, a::jsonb FROM unnest(%s::text[], %s::timestamptz[], "
            "%s::text[], %s::text[]) AS v(i, o, e, a) "
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
                await connection.execute(
                    "SELECT pg_advisory_xact_lock(h) FROM (SELECT hashtextextended(i, 727275) "
                    "AS h FROM unnest(%s::text[]) AS i ORDER BY h) AS locks",
                    ([f"{self.name}/{id_}" for id_ in touched],),
                )
                await connection.execute(insert, params)
                await connection.execute(relink, (touched,))

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
        check_k(k)
        vector = unit_vector(query, dimensions=self.dimensions, what="search query")
        check_time(as_of, what="search as_of")
        conditions = check_conditions(where)
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
                first = EF_SEARCH_DEFAULT if k <= EF_SEARCH_DEFAULT else min(k, EF_SEARCH_MAX)
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
