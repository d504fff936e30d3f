"""The query log's PostgreSQL backend: a table written with psycopg 3.

psycopg is imported when a log is opened, not when kairos is: most processes never use it.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from kairos.backends import postgres
from kairos.backends.url import redact, scrub
from kairos.stores.query_log.base import _COLUMNS, DEFAULT_TABLE, Search, _check_name
from kairos.stores.query_log.records import PlanInfo, QueryLogError, _Row

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql as pgsql


class _PostgresBackend:
    """A PostgreSQL table, written with psycopg 3 from the writer thread. Each batch is one
    transaction with synchronous_commit on (a commit has reached the server's WAL on disk).
    The structured columns are `json` (kept verbatim; `jsonb` would reorder dict keys and
    turn -0.0 into 0), so SQL can still look inside: `inputs->>'user.id'`.

    Beside the records: `<table>_keys` (an entity key of a record's inputs, its `now` and
    its query id; the index search reads) and `<table>_plans` (each plan once)."""

    def __init__(self, conninfo: str, table: str = DEFAULT_TABLE, schema: str | None = None):
        from psycopg import sql

        self._sql = sql
        self._conninfo = conninfo
        self.name = redact(conninfo)
        _check_name("table", table)
        if schema is not None:
            _check_name("schema", schema)
        self._writer: psycopg.Connection[tuple[Any, ...]] | None = None
        self._reader: psycopg.Connection[tuple[Any, ...]] | None = None
        self._read_lock = threading.Lock()
        self._plans: dict[str, PlanInfo] = {}
        self._written_plans: set[str] = set()

        def named(suffix: str) -> pgsql.Identifier:
            name = f"{table}{suffix}"
            return sql.Identifier(name) if schema is None else sql.Identifier(schema, name)

        target, keys, plans = named(""), named("_keys"), named("_plans")
        self._keys = keys
        # One statement per batch, in autocommit (so one transaction, one round trip): the
        # columns as arrays, the plans and keys written by data-modifying CTEs. Every round
        # trip hands the GIL to the serving thread and waits (~5 ms under load) to get it
        # back; executemany inside BEGIN/COMMIT made several per batch.
        self._insert = sql.SQL(
            "WITH new_plans AS (INSERT INTO {plans} SELECT * FROM unnest(%s::text[], "
            "%s::text[]::json[]) ON CONFLICT DO NOTHING), "
            "new_keys AS (INSERT INTO {keys} SELECT * FROM unnest(%s::text[], %s::text[], "
            "%s::timestamptz[], %s::text[]) ON CONFLICT DO NOTHING) "
            "INSERT INTO {target} ({columns}, feature_values, calls, plan) SELECT * FROM "
            "unnest(%s::text[], %s::timestamptz[], %s::text[]::json[], %s::text[]::json[], "
            "%s::text[]::json[], %s::float8[], %s::timestamptz[], %s::text[]::json[], "
            "%s::text[]::json[], %s::text[]) ON CONFLICT (query_id) DO NOTHING"
        ).format(plans=plans, keys=keys, target=target, columns=sql.SQL(_COLUMNS))
        self._select_plans = sql.SQL("SELECT plan, info FROM {}").format(plans)
        self._select = sql.SQL(
            "SELECT l.query_id, l.now, l.inputs::text, l.outputs::text, l.trace::text, "
            "l.duration_ms, l.logged_at, l.feature_values::text, l.calls::text, l.plan FROM {} l"
        ).format(target)
        create = [
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (seq bigint GENERATED ALWAYS AS IDENTITY, "
                "query_id text PRIMARY KEY, now timestamptz NOT NULL, inputs json NOT NULL, "
                "outputs json NOT NULL, trace json NOT NULL, "
                "duration_ms double precision NOT NULL, logged_at timestamptz NOT NULL)"
            ).format(target),
            # a log written by an older kairos keeps its rows and gains the new columns
            sql.SQL(
                "ALTER TABLE {} ADD COLUMN IF NOT EXISTS feature_values json NOT NULL "
                "DEFAULT '{{}}', ADD COLUMN IF NOT EXISTS calls json NOT NULL DEFAULT '{{}}', "
                "ADD COLUMN IF NOT EXISTS plan text"
            ).format(target),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (seq)").format(
                sql.Identifier(f"{table}_seq_idx"), target
            ),
            # (now, query_id): the order searches answer in, so a page read after another
            # (`before`) starts where it ended, ties on `now` too (a bulk query's decisions
            # share one); they replace older logs' (now) and (plan, now)
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (now, query_id)").format(
                sql.Identifier(f"{table}_now_id_idx"), target
            ),
            sql.SQL("CREATE INDEX IF NOT EXISTS {} ON {} (plan, now, query_id)").format(
                sql.Identifier(f"{table}_plan_id_idx"), target
            ),
            sql.SQL("DROP INDEX IF EXISTS {}").format(named("_now_idx")),
            sql.SQL("DROP INDEX IF EXISTS {}").format(named("_plan_idx")),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (name text NOT NULL, value text NOT NULL, "
                "now timestamptz NOT NULL, query_id text NOT NULL, "
                "PRIMARY KEY (name, value, now, query_id))"
            ).format(keys),
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (plan text PRIMARY KEY, info json NOT NULL)"
            ).format(plans),
        ]
        if schema is not None:
            create.insert(
                0, sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema))
            )
        older = sql.SQL(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = "
            "coalesce(%s, current_schema()) AND table_name = %s AND column_name = 'query_id' "
            "AND NOT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = "
            "coalesce(%s, current_schema()) AND table_name = %s "
            "AND column_name = 'feature_values')"
        )
        backfill = sql.SQL(
            "INSERT INTO {} SELECT j.key, j.value, l.now, l.query_id FROM {} l, "
            "json_each_text(l.inputs) j WHERE json_typeof(l.inputs -> j.key) = 'string' OR "
            "(json_typeof(l.inputs -> j.key) = 'number' AND j.value ~ '^-?[0-9]+$') "
            "ON CONFLICT DO NOTHING"
        ).format(keys, target)
        try:
            with self._connect() as conn, conn.transaction():
                # Two servers starting at once would race on CREATE ... IF NOT EXISTS.
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"kairos:{table}",))
                migrating = conn.execute(older, (schema, table, schema, table)).fetchone()
                for statement in create:
                    conn.execute(statement)
                if migrating:  # a log from before decision records: index its entity keys
                    conn.execute(backfill)
        except Exception as exc:
            # `from None`: the original message may echo the connection string
            raise QueryLogError(
                f"cannot open query log {self.name!r}: {self.scrub(str(exc).strip())}"
            ) from None

    def scrub(self, text: str) -> str:
        return scrub(text, self._conninfo)

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        conn = postgres.connect(
            self._conninfo, autocommit=True, connect_timeout=postgres.CONNECT_TIMEOUT
        )
        conn.execute("SET TIME ZONE 'UTC'")
        conn.execute("SET synchronous_commit TO on")  # flush() promises durable commits
        return conn

    def write_batch(self, rows: Sequence[_Row]) -> None:
        plans: dict[str, PlanInfo] = {}
        for row in rows:
            plan = row.plan
            if plan is not None and plan.fingerprint not in self._written_plans:
                plans[plan.fingerprint] = plan
        keys = [(name, value, row.now, row.query_id) for row in rows for name, value in row.keys]
        params = (
            list(plans),
            [orjson.dumps(p.to_dict()).decode() for p in plans.values()],
            [k[0] for k in keys],
            [k[1] for k in keys],
            [k[2] for k in keys],
            [k[3] for k in keys],
            [row.query_id for row in rows],
            [row.now for row in rows],
            [row.inputs for row in rows],
            [row.outputs for row in rows],
            [row.trace for row in rows],
            [row.duration_ms for row in rows],
            [row.logged_at for row in rows],
            [row.values for row in rows],
            [row.calls for row in rows],
            [None if row.plan is None else row.plan.fingerprint for row in rows],
        )
        try:
            if self._writer is None:
                self._writer = self._connect()
            self._writer.execute(self._insert, params)
        except Exception as error:
            if postgres.is_error(error):
                self.close_writer()  # reconnect on the next batch
            raise
        self._written_plans.update(plans)

    def close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _reading(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._reader is None or self._reader.closed:
            self._reader = self._connect()
        return self._reader

    def _failed(self, exc: Exception) -> QueryLogError:
        self._close_reader()
        return QueryLogError(f"cannot read query log {self.name!r}: {self.scrub(str(exc).strip())}")

    def _read(self, query: pgsql.Composed, params: Sequence[Any]) -> list[_Row]:
        with self._read_lock:
            try:
                fetched = self._reading().execute(query, tuple(params)).fetchall()
                if {row[9] for row in fetched if row[9] is not None} - self._plans.keys():
                    self._load_plans()
            except Exception as exc:
                if not postgres.is_error(exc):
                    raise
                raise self._failed(exc) from None
        return [
            _Row(
                query_id=row[0],
                now=row[1],
                inputs=row[2],
                outputs=row[3],
                trace=row[4],
                duration_ms=row[5],
                logged_at=row[6],
                values=row[7],
                calls=row[8],
                plan=None if row[9] is None else self._plans.get(row[9]),
            )
            for row in fetched
        ]

    def _load_plans(self) -> None:
        for plan, info in self._reading().execute(self._select_plans).fetchall():
            found = PlanInfo.stored(info)
            if found is not None:  # a corrupt row costs its plan, not every read
                self._plans[plan] = found

    def fetch_plans(self) -> dict[str, PlanInfo]:
        with self._read_lock:
            try:
                self._load_plans()
            except Exception as exc:
                if not postgres.is_error(exc):
                    raise
                raise self._failed(exc) from None
            return dict(self._plans)

    def fetch_one(self, query_id: str) -> _Row | None:
        sql = self._sql
        rows = self._read(self._select + sql.SQL(" WHERE l.query_id = %s"), (query_id,))
        return rows[0] if rows else None

    def fetch_many(self, query_ids: Sequence[str]) -> list[_Row]:
        sql = self._sql
        return self._read(self._select + sql.SQL(" WHERE l.query_id = ANY(%s)"), (list(query_ids),))

    def fetch_recent(self, limit: int) -> list[_Row]:
        sql = self._sql
        return self._read(self._select + sql.SQL(" ORDER BY l.seq DESC LIMIT %s"), (limit,))

    def fetch_search(self, search: Search, plans: Sequence[str] | None) -> list[_Row]:
        """Newest first; with an entity key through the keys index, else the `now` index."""
        sql = self._sql
        where: list[pgsql.Composable] = []
        params: list[Any] = []
        query: pgsql.Composed = self._select
        if search.entity:
            (name, value), *others = search.entity
            query = query + sql.SQL(" JOIN {} k ON k.query_id = l.query_id").format(self._keys)
            where.append(sql.SQL("k.name = %s AND k.value = %s"))
            params += [name, value]
            order = sql.SQL("k.now")
            for other_name, other_value in others:
                where.append(
                    sql.SQL(
                        "l.query_id IN (SELECT query_id FROM {} WHERE name = %s AND value = %s)"
                    ).format(self._keys)
                )
                params += [other_name, other_value]
        else:
            order = sql.SQL("l.now")
        if search.since is not None:
            where.append(sql.SQL("{} >= %s").format(order))
            params.append(search.since)
        if search.until is not None:
            where.append(sql.SQL("{} < %s").format(order))
            params.append(search.until)
        if search.before is not None:  # the page after the one that ended there
            where.append(sql.SQL("({}, l.query_id) < (%s, %s)").format(order))
            params += list(search.before)
        if plans is not None:
            where.append(sql.SQL("l.plan = ANY(%s)"))
            params.append(list(plans))
        if where:
            query = query + sql.SQL(" WHERE ") + sql.SQL(" AND ").join(where)
        query = query + sql.SQL(" ORDER BY {} DESC, l.query_id DESC LIMIT %s").format(order)
        params.append(search.limit)
        return self._read(query, params)

    def _close_reader(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def close_readers(self) -> None:
        with self._read_lock:
            self._close_reader()
