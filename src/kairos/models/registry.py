"""Which models exist: numbered versions per name, aliases that move and roll back, and every
alias change with its time and who made it. SQLite by default (`.kairos/models.db`),
PostgreSQL by URL; a registry an older kairos made gets the columns it lacks when it opens.

    registry = model_registry_from_url("sqlite:///.kairos/models.db")
    v = registry.add("risk", sha, "sklearn", "skops", size, schema, {}, {})   # v.version == 1
    registry.set_alias("risk", "prod", 1, by="ops"); registry.rollback("risk", "prod")

Every statement binds its values; names never reach SQL text.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kairos.backends import URL, connect, postgres
from kairos.backends.url import parse as parse_url
from kairos.backends.url import redact
from kairos.errors import BackendUnavailable, InvalidInput, did_you_mean
from kairos.models.errors import UnknownModel
from kairos.models.schema import ModelSchema

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
ALIAS = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


@dataclass(frozen=True)
class ModelVersion:
    """One registered version: where its artifact is and what it takes and returns."""

    name: str
    version: int
    sha256: str
    framework: str
    format: str
    size: int
    schema: ModelSchema
    metadata: Mapping[str, Any]
    extra: Mapping[str, Any]  # what loading needs (e.g. skops' trusted types)
    created_at: datetime
    aliases: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """`risk@v3`: what the query log records as the version that made a value."""
        return f"{self.name}@v{self.version}"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "sha256": self.sha256,
            "framework": self.framework,
            "format": self.format,
            "size": self.size,
            "schema": self.schema.to_json(),
            "metadata": dict(self.metadata),
            "created_at": self.created_at.isoformat(),
            "aliases": list(self.aliases),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelVersion:
        """The version `to_json` wrote (as `GET /v1/models/{name}/versions/{n}` answers it);
        `extra`, what loading the artifact needs, stays on the server."""
        return cls(
            data["name"],
            data["version"],
            data["sha256"],
            data["framework"],
            data["format"],
            data["size"],
            ModelSchema.from_json(data["schema"]),
            dict(data["metadata"]),
            {},
            datetime.fromisoformat(data["created_at"]),
            tuple(data.get("aliases") or ()),
        )


@dataclass(frozen=True)
class AliasChange:
    """One move of an alias: `set` or `rollback`, from `previous` to `version`, and who made
    it (`changed_by`: e.g. `key:3f9a0c1d`, `dashboard`, an OS user; None when not told, as in
    moves recorded before kairos kept it)."""

    name: str
    alias: str
    version: int
    previous: int | None
    action: str
    changed_at: datetime
    changed_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "version": self.version,
            "previous": self.previous,
            "action": self.action,
            "changed_at": self.changed_at.isoformat(),
            "changed_by": self.changed_by,
        }

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> AliasChange:
        """The change `to_json` wrote for model `name` (which it leaves out)."""
        return cls(
            name,
            data["alias"],
            data["version"],
            data["previous"],
            data["action"],
            datetime.fromisoformat(data["changed_at"]),
            data.get("changed_by"),
        )


_SCHEMA = [
    """create table if not exists kairos_models (
        name text not null, version integer not null, sha256 text not null,
        framework text not null, format text not null, size bigint not null,
        schema text not null, metadata text not null, extra text not null,
        created_at text not null, primary key (name, version))""",
    """create table if not exists kairos_model_aliases (
        name text not null, alias text not null, version integer not null,
        updated_at text not null, primary key (name, alias))""",
    """create table if not exists kairos_model_alias_history (
        name text not null, alias text not null, seq integer not null,
        version integer not null, previous integer, action text not null,
        undone integer not null default 0, changed_at text not null, changed_by text,
        primary key (name, alias, seq))""",
]
# columns added after the first release: added to a table made by an older kairos when the
# registry opens (rows written before read them as NULL)
_ADDED = {"kairos_model_alias_history": {"changed_by": "text"}}
_COLUMNS = "name, version, sha256, framework, format, size, schema, metadata, extra, created_at"


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidInput(
            f"model name {name!r} must be 1-128 letters, digits or . _ - (starting with a "
            "letter or digit)",
            field="name",
        )
    return name


def check_alias(alias: Any) -> str:
    if not isinstance(alias, str) or not ALIAS.fullmatch(alias):
        raise InvalidInput(
            f"alias {alias!r} must start with a letter and hold letters, digits, _ or - "
            "(e.g. 'prod', 'canary'); numbers are versions",
            field="alias",
        )
    return alias


def check_by(by: Any) -> str | None:
    """Who moved an alias: None, or a label of 1-200 characters (never a secret: callers
    pass `key:` and a digest's first hex digits, not a key).

    >>> check_by("dashboard key:3f9a0c1d")
    'dashboard key:3f9a0c1d'
    """
    if by is not None and (not isinstance(by, str) or not 1 <= len(by) <= 200):
        raise InvalidInput(
            f"by={by!r} must be who moved the alias: 1-200 characters (e.g. 'key:3f9a0c1d', "
            "'dashboard', an OS user) or None",
            field="by",
        )
    return by


class ModelRegistry:
    """Versions and aliases in one SQL database; each change is one transaction."""

    def __init__(self, connect: Any, placeholder: str, url: str) -> None:
        self._connect = connect
        self._mark = placeholder
        self.url = url
        self._lock = threading.RLock()  # re-entered when an error message lists the names
        self._depth = 0
        self._conn: Any = None

    def _sql(self, text: str) -> str:
        return text.replace("?", self._mark)

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self._connect()
                    cursor = self._conn.cursor()
                    for statement in _SCHEMA:
                        cursor.execute(statement)
                    self._add_columns(cursor)
                    self._conn.commit()
                cursor = self._conn.cursor()
            except (sqlite3.Error, OSError) as error:
                raise BackendUnavailable(f"model registry {self.url}: {error}") from None
            except Exception as error:
                if postgres.is_error(error):
                    self._conn = None
                    raise BackendUnavailable(f"model registry: {error}") from None
                raise
            self._depth += 1
            try:
                yield _Cursor(cursor, self._sql)
                if self._depth == 1:
                    self._conn.commit()
            except BaseException as error:
                if self._depth == 1:
                    self._reset_after(error)
                if _is_outage(error):
                    raise BackendUnavailable(f"model registry {self.url}: {error}") from None
                raise
            finally:
                self._depth -= 1

    def _add_columns(self, cursor: Any) -> None:
        """Add the columns a registry made by an older kairos lacks (`_ADDED`). Of two
        processes opening it at once, the one that finds the column added meanwhile goes on."""
        postgresql = self._mark == "%s"
        for table, columns in _ADDED.items():
            if postgresql:
                cursor.execute(
                    "select column_name from information_schema.columns "
                    "where table_schema = current_schema() and table_name = %s",
                    (table,),
                )
                present = {row[0] for row in cursor.fetchall()}
            else:
                present = {row[1] for row in cursor.execute(f"pragma table_info({table})")}
            for column, kind in columns.items():
                if column in present:
                    continue
                if postgresql:
                    cursor.execute(f"alter table {table} add column if not exists {column} {kind}")
                    continue
                try:
                    cursor.execute(f"alter table {table} add column {column} {kind}")
                except sqlite3.OperationalError as error:  # another process added it first
                    if "duplicate column" not in str(error):
                        raise

    def _reset_after(self, error: BaseException) -> None:
        """Roll back; a connection that failed is dropped and opened again on next use."""
        try:
            self._conn.rollback()
        except Exception:
            self._conn = None
            return
        if _is_outage(error) and self._mark == "%s":
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # --- versions ---------------------------------------------------------------------

    def add(
        self,
        name: str,
        sha256: str,
        framework: str,
        format: str,
        size: int,
        schema: ModelSchema,
        metadata: Mapping[str, Any],
        extra: Mapping[str, Any],
    ) -> ModelVersion:
        """Record the next version of `name` (1 for a new name)."""
        check_name(name)
        now = datetime.now(UTC)
        with self._tx() as cur:
            if self._mark == "%s":  # one writer per name at a time on PostgreSQL
                cur.execute("select pg_advisory_xact_lock(hashtext(?))", (name,))
            cur.execute(
                "select coalesce(max(version), 0) from kairos_models where name = ?", (name,)
            )
            version = int(cur.fetchone()[0]) + 1
            cur.execute(
                f"insert into kairos_models ({_COLUMNS}) values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    name,
                    version,
                    sha256,
                    framework,
                    format,
                    size,
                    json.dumps(schema.to_json()),
                    json.dumps(dict(metadata), default=str),
                    json.dumps(dict(extra), default=str),
                    now.isoformat(),
                ),
            )
        return ModelVersion(
            name, version, sha256, framework, format, size, schema, metadata, extra, now
        )

    def names(self) -> list[str]:
        with self._tx() as cur:
            cur.execute("select distinct name from kairos_models order by name")
            return [row[0] for row in cur.fetchall()]

    def versions(self, name: str) -> list[ModelVersion]:
        """Every version of `name`, oldest first, each with the aliases pointing at it."""
        with self._tx() as cur:
            cur.execute(
                f"select {_COLUMNS} from kairos_models where name = ? order by version", (name,)
            )
            rows = cur.fetchall()
            cur.execute("select alias, version from kairos_model_aliases where name = ?", (name,))
            aliases: dict[int, list[str]] = {}
            for alias, version in cur.fetchall():
                aliases.setdefault(int(version), []).append(alias)
        if not rows:
            self._unknown(name)
        return [_version(row, tuple(sorted(aliases.get(int(row[1]), [])))) for row in rows]

    def get(self, name: str, version: int | None = None, alias: str | None = None) -> ModelVersion:
        """One version: by number, by alias, or (neither given) the newest."""
        if version is not None and alias is not None:
            raise InvalidInput("pass a version or an alias, not both", field="version")
        with self._tx() as cur:
            if alias is not None:
                cur.execute(
                    "select version from kairos_model_aliases where name = ? and alias = ?",
                    (name, alias),
                )
                found = cur.fetchone()
                if found is None:
                    cur.execute("select alias from kairos_model_aliases where name = ?", (name,))
                    known = sorted(r[0] for r in cur.fetchall())
                    cur.execute("select 1 from kairos_models where name = ? limit 1", (name,))
                    if cur.fetchone() is None:
                        raise UnknownModel(self._missing(name), field="model")
                    raise UnknownModel(
                        f"model {name!r} has no alias {alias!r}{did_you_mean(alias, known)}; "
                        f"its aliases: {', '.join(known) or 'none'}",
                        field="alias",
                    )
                version = int(found[0])
            if version is None:
                cur.execute(
                    f"select {_COLUMNS} from kairos_models where name = ? "
                    "order by version desc limit 1",
                    (name,),
                )
            else:
                cur.execute(
                    f"select {_COLUMNS} from kairos_models where name = ? and version = ?",
                    (name, int(version)),
                )
            row = cur.fetchone()
            if row is None:
                cur.execute("select max(version) from kairos_models where name = ?", (name,))
                newest = cur.fetchone()[0]
                if newest is None:
                    raise UnknownModel(self._missing(name), field="model")
                raise UnknownModel(
                    f"model {name!r} has no version {version}; it has versions 1 to {newest}",
                    field="version",
                )
            cur.execute(
                "select alias from kairos_model_aliases where name = ? and version = ?",
                (name, int(row[1])),
            )
            aliases = tuple(sorted(r[0] for r in cur.fetchall()))
        return _version(row, aliases)

    # --- aliases ------------------------------------------------------------------------

    def set_alias(
        self, name: str, alias: str, version: int, *, by: str | None = None
    ) -> AliasChange:
        """Point `alias` at `version` (recorded with who did it, `by`, so it can be rolled
        back and told apart).

        >>> registry.set_alias("risk", "prod", 2, by="key:3f9a0c1d").previous  # doctest: +SKIP
        1
        """
        check_alias(alias)
        check_by(by)
        self.get(name, version)  # the version must exist
        return self._move(name, alias, int(version), "set", by=by)

    def rollback(self, name: str, alias: str, *, by: str | None = None) -> AliasChange:
        """Undo the alias's latest move that is not undone yet: it points where it did before
        (recorded with who did it, `by`).

        >>> registry.rollback("risk", "prod", by="dashboard").action  # doctest: +SKIP
        'rollback'
        """
        check_by(by)
        with self._tx() as cur:
            cur.execute(
                "select seq, previous from kairos_model_alias_history where name = ? and "
                "alias = ? and action = 'set' and undone = 0 order by seq desc limit 1",
                (name, alias),
            )
            found = cur.fetchone()
        if found is None or found[1] is None:
            self.get(name, alias=alias)  # unknown model or alias -> UnknownModel
            raise InvalidInput(
                f"alias {alias!r} of model {name!r} has no earlier version to roll back to",
                field="alias",
            )
        return self._move(name, alias, int(found[1]), "rollback", undo=int(found[0]), by=by)

    def _move(
        self,
        name: str,
        alias: str,
        version: int,
        action: str,
        undo: int | None = None,
        by: str | None = None,
    ) -> AliasChange:
        now = datetime.now(UTC)
        with self._tx() as cur:
            if self._mark == "%s":
                cur.execute("select pg_advisory_xact_lock(hashtext(?))", (name,))
            cur.execute(
                "select version from kairos_model_aliases where name = ? and alias = ?",
                (name, alias),
            )
            current = cur.fetchone()
            previous = None if current is None else int(current[0])
            if current is None:
                cur.execute(
                    "insert into kairos_model_aliases (name, alias, version, updated_at) "
                    "values (?, ?, ?, ?)",
                    (name, alias, version, now.isoformat()),
                )
            else:
                cur.execute(
                    "update kairos_model_aliases set version = ?, updated_at = ? "
                    "where name = ? and alias = ?",
                    (version, now.isoformat(), name, alias),
                )
            cur.execute(
                "select coalesce(max(seq), 0) from kairos_model_alias_history "
                "where name = ? and alias = ?",
                (name, alias),
            )
            seq = int(cur.fetchone()[0]) + 1
            cur.execute(
                "insert into kairos_model_alias_history (name, alias, seq, version, previous, "
                "action, undone, changed_at, changed_by) values (?, ?, ?, ?, ?, ?, 0, ?, ?)",
                (name, alias, seq, version, previous, action, now.isoformat(), by),
            )
            if undo is not None:
                cur.execute(
                    "update kairos_model_alias_history set undone = 1 "
                    "where name = ? and alias = ? and seq = ?",
                    (name, alias, undo),
                )
        return AliasChange(name, alias, version, previous, action, now, by)

    def aliases(self, name: str) -> dict[str, int]:
        with self._tx() as cur:
            cur.execute(
                "select alias, version from kairos_model_aliases where name = ? order by alias",
                (name,),
            )
            return {alias: int(version) for alias, version in cur.fetchall()}

    def history(self, name: str, alias: str | None = None) -> list[AliasChange]:
        """Every alias change of `name` (or of one alias), oldest first."""
        query = (
            "select name, alias, version, previous, action, changed_at, changed_by "
            "from kairos_model_alias_history where name = ?"
        )
        params: tuple[Any, ...] = (name,)
        if alias is not None:
            query += " and alias = ?"
            params = (name, alias)
        with self._tx() as cur:
            cur.execute(query + " order by changed_at, seq", params)
            rows = cur.fetchall()
        return [
            AliasChange(
                r[0],
                r[1],
                int(r[2]),
                None if r[3] is None else int(r[3]),
                r[4],
                datetime.fromisoformat(r[5]),
                r[6],
            )
            for r in rows
        ]

    def _missing(self, name: str) -> str:
        known = self.names()
        return (
            f"no model named {name!r}{did_you_mean(name, known)}; registered models: "
            f"{', '.join(known) or 'none'} (register one with client.models.register)"
        )

    def _unknown(self, name: str) -> None:
        raise UnknownModel(self._missing(name), field="model")


@dataclass
class _Cursor:
    """A DB-API cursor whose statements are written with `?` for either driver."""

    cursor: Any
    sql: Any
    rows: list[Any] = field(default_factory=list)

    def execute(self, text: str, params: tuple[Any, ...] = ()) -> None:
        self.cursor.execute(self.sql(text), params)

    def fetchone(self) -> Any:
        return self.cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return list(self.cursor.fetchall())


def _is_outage(error: BaseException) -> bool:
    """A database that is down or locked, not a statement that is wrong."""
    return isinstance(error, sqlite3.OperationalError) or postgres.is_outage(error)


def _version(row: Any, aliases: tuple[str, ...]) -> ModelVersion:
    return ModelVersion(
        row[0],
        int(row[1]),
        row[2],
        row[3],
        row[4],
        int(row[5]),
        ModelSchema.from_json(json.loads(row[6])),
        json.loads(row[7]),
        json.loads(row[8]),
        datetime.fromisoformat(row[9]),
        aliases,
    )


def model_registry_from_url(url: str) -> ModelRegistry:
    """`sqlite:///path/models.db` (default) or `postgresql://...`; connects on first use."""

    def sqlite(parsed: URL) -> ModelRegistry:
        path = parsed.file_path()

        def connect_sqlite() -> sqlite3.Connection:
            if path != ":memory:":
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, check_same_thread=False, timeout=30)
            conn.execute("pragma journal_mode=wal")
            return conn

        return ModelRegistry(connect_sqlite, "?", url)

    def unknown(parsed: URL) -> InvalidInput:
        return InvalidInput(
            f"model registry URL {redact(url)!r}: use sqlite:///path/models.db or postgresql://...",
            field="models.registry",
        )

    parsed = parse_url(url)
    if not parsed.authority or (parsed.family == "sqlite" and not parsed.rest.startswith("/")):
        raise unknown(parsed)
    openers = {
        "sqlite": sqlite,
        "postgresql": lambda parsed: ModelRegistry(
            lambda: postgres.connect(url), "%s", redact(url)
        ),
    }
    return connect(parsed, openers, unknown=unknown)
