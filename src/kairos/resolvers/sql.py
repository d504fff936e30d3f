"""SQL resolvers: `.sql` files in a project, with a comment header.

    -- resolves: User
    -- source: bank
    -- type: online            (or offline; default online)
    -- timeout: 2s             (optional)
    select id, name, email, created_at as signup_at from users where id = :id

Columns map to the resolved class's features by name (alias them with `as`). Parameters are
`:name` where `name` is a feature of the resolved class (or `now`); values are bound by the
driver, never spliced into the text. A parameter that is the class's primary key makes the
resolver produce the selected features; one that is a foreign key (`:user_id` on
Transaction) makes it fill the parent's has-many feature (`User.transactions`). For a batch
of entities the key comparison (`id = :id`) becomes `id IN (...)`: one statement.

Where that rewrite cannot apply (other arguments differ per entity, like `:now` for each row
of an offline spine, or the statement aggregates or limits its rows), DuckDB and PostgreSQL
get one statement anyway: the calls' arguments as a `VALUES` list joined `LATERAL` to the
user's statement, which the database evaluates once per call, exactly as if run alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from kairos.definitions.durations import parse_duration
from kairos.errors import DefinitionError, KairosError

_HEADER = re.compile(r"^\s*--\s*([a-z_]+)\s*:\s*(.*?)\s*$")
_IDENT = re.compile(r"[A-Za-z_]\w*")
# Batches this size or smaller go out as one statement; larger ones are split.
MAX_BATCH = 1000
MAX_LATERAL = 500  # calls per lateral statement (each binds one value per parameter)
# dialect -> argument kind -> the SQL type a lateral statement casts it to
LATERAL_TYPES: dict[str, dict[str, str]] = {
    "duckdb": {
        "bool": "BOOLEAN",
        "int": "BIGINT",
        "float": "DOUBLE",
        "str": "VARCHAR",
        "datetime": "TIMESTAMPTZ",
        "date": "DATE",
    },
    "postgres": {
        "bool": "boolean",
        "int": "bigint",
        "float": "double precision",
        "str": "text",
        "datetime": "timestamptz",
        "date": "date",
    },
}
logger = logging.getLogger("kairos.sql")


@dataclass(frozen=True, slots=True)
class SqlText:
    """User SQL split around its `:name` parameters (strings and comments left alone)."""

    parts: tuple[str, ...]  # len(parts) == len(params) + 1
    params: tuple[str, ...]

    def render(self, placeholder: Any, escape_percent: bool = False) -> str:
        pieces = []
        for index, part in enumerate(self.parts):
            pieces.append(part.replace("%", "%%") if escape_percent else part)
            if index < len(self.params):
                pieces.append(placeholder(index + 1))
        return "".join(pieces)


_DOLLAR = re.compile(r"\$([A-Za-z_]\w*)?\$")


def scan(sql: str) -> list[tuple[str, str]]:
    """Split SQL into ("code" | "string" | "comment", text) segments, in order. Strings are
    '...', "..." (doubled quotes escape) and Postgres $tag$...$tag$; comments -- and /* */."""
    segments: list[tuple[str, str]] = []
    start = i = 0
    n = len(sql)
    while i < n:
        ch = sql[i]
        end = -1
        kind = ""
        if ch in ("'", '"'):
            kind = "string"
            end = sql.find(ch, i + 1)
            while end != -1 and end + 1 < n and sql[end + 1] == ch:  # doubled quote escape
                end = sql.find(ch, end + 2)
            end = n if end == -1 else end + 1
        elif sql.startswith("--", i):
            kind = "comment"
            end = sql.find("\n", i)
            end = n if end == -1 else end
        elif sql.startswith("/*", i):
            kind = "comment"
            end = sql.find("*/", i + 2)
            end = n if end == -1 else end + 2
        elif ch == "$" and (i == 0 or not (sql[i - 1].isalnum() or sql[i - 1] == "_")):
            match = _DOLLAR.match(sql, i)
            if match:
                kind = "string"
                end = sql.find(match.group(0), match.end())
                end = n if end == -1 else end + len(match.group(0))
        if not kind:
            i += 1
            continue
        if i > start:
            segments.append(("code", sql[start:i]))
        segments.append((kind, sql[i:end]))
        start = i = end
    if start < n:
        segments.append(("code", sql[start:]))
    return segments


def split_parameters(sql: str) -> SqlText:
    """Find `:name` parameters outside quotes and comments; `::type` casts are not params."""
    parts: list[str] = []
    params: list[str] = []
    current: list[str] = []
    for kind, text in scan(sql):
        if kind != "code":
            current.append(text)
            continue
        i = last = 0
        while i < len(text):
            if text.startswith("::", i):
                i += 2
            elif text[i] == ":" and (match := _IDENT.match(text, i + 1)):
                current.append(text[last:i])
                parts.append("".join(current))
                current = []
                params.append(match.group(0))
                i = last = match.end()
            else:
                i += 1
        current.append(text[last:])
    parts.append("".join(current))
    return SqlText(tuple(parts), tuple(params))


def _masked(sql: str, *, strings: bool) -> str:
    """The SQL with comments blanked (and, with `strings`, quoted text replaced by x), the
    same length, so positions found in it are positions in the original."""
    pieces = []
    for kind, text in scan(sql):
        if kind == "code" or (kind == "string" and not strings):
            pieces.append(text)
        elif kind == "comment":
            pieces.append(" " * len(text))
        else:
            pieces.append(text[0] + "x" * (len(text) - 2) + text[-1] if len(text) > 1 else "x")
    return "".join(pieces)


def selected_columns(sql: str) -> list[str] | None:
    """Output names of the top-level SELECT list (`expr as alias` -> alias), or None when a
    column cannot be named (e.g. `*` or an unaliased expression)."""
    masked = _masked(sql, strings=True)  # for keywords, commas and parentheses
    code = _masked(sql, strings=False)  # for names, which may be "quoted"
    lowered = masked.lower()
    depth = 0
    select_at = from_at = -1
    for match in re.finditer(r"\(|\)|\bselect\b|\bfrom\b", lowered):
        token = match.group(0)
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
        elif depth == 0 and token == "select" and select_at < 0:
            select_at = match.end()
        elif depth == 0 and token == "from" and select_at >= 0:
            from_at = match.start()
            break
    if select_at < 0 or from_at < 0:
        return None
    distinct = re.match(r"\s*distinct\b", lowered[select_at:from_at])
    if distinct:
        select_at += distinct.end()
    columns = []
    for begin, finish in _top_level_items(masked, select_at, from_at):
        item = code[begin:finish].strip()
        alias = re.search(r"\bas\s+\"?([A-Za-z_]\w*)\"?\s*$", item, flags=re.IGNORECASE)
        if alias and re.search(r"\bas\s+\S+\s*$", masked[begin:finish], flags=re.IGNORECASE):
            columns.append(alias.group(1))
        elif re.fullmatch(r"(?:[A-Za-z_]\w*\.)?\"?([A-Za-z_]\w*)\"?", item):
            columns.append(item.split(".")[-1].strip('"'))
        else:
            return None
    return columns


def _top_level_items(masked: str, start: int, end: int) -> list[tuple[int, int]]:
    """Spans of the comma-separated items between start and end, outside parentheses."""
    spans = []
    depth = 0
    begin = start
    for index in range(start, end):
        ch = masked[index]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            spans.append((begin, index))
            begin = index + 1
    spans.append((begin, end))
    return spans


class SqlResolver:
    """One `.sql` file: what it resolves, from which source, and its text."""

    is_async = True

    def __init__(
        self,
        name: str,
        sql: str,
        *,
        resolves: str,
        source: str | None,
        kind: str = "online",
        timeout: timedelta | None = None,
        path: Path | None = None,
        line: int = 1,
    ) -> None:
        self.name = name
        self.sql = sql
        self.resolves = resolves
        self.source = source
        self.kind = kind
        self.timeout = timeout
        self.path = path
        self.line = line
        self.text = split_parameters(sql)
        self.columns = selected_columns(sql)
        self.version = hashlib.sha256(sql.encode()).hexdigest()[:12]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.path else f"<sql {self.name}>"

    def __repr__(self) -> str:
        return f"<{self.kind} sql resolver {self.name}>"

    @classmethod
    def from_file(cls, path: Path) -> SqlResolver:
        """Read a `.sql` file and its `-- key: value` header."""
        text = path.read_text()
        header: dict[str, str] = {}
        body_line = 1
        for number, line in enumerate(text.splitlines(), start=1):
            match = _HEADER.match(line)
            if match:
                header[match.group(1)] = match.group(2)
            elif line.strip() and not line.strip().startswith("--"):
                body_line = number
                break
        where = f"{path}"
        unknown = set(header) - {"resolves", "source", "type", "timeout", "name"}
        if unknown:
            raise DefinitionError(
                f"{where}: unknown header key(s) {', '.join(sorted(unknown))}; use resolves, "
                "source, type, timeout, name"
            )
        if "resolves" not in header:
            raise DefinitionError(f"{where}: add a header line `-- resolves: ClassName`")
        kind = header.get("type", "online")
        if kind not in ("online", "offline"):
            raise DefinitionError(f"{where}: `-- type: {kind}` must be online or offline")
        timeout = (
            parse_duration(header["timeout"], field=f"{where} timeout")
            if "timeout" in header
            else None
        )
        return cls(
            header.get("name", path.stem),
            text,
            resolves=header["resolves"],
            source=header.get("source"),
            kind=kind,
            timeout=timeout,
            path=path,
            line=body_line,
        )


@dataclass(frozen=True)
class SqlPlan:
    """How a bound SQL resolver runs: its key parameter and how rows map back to entities."""

    resolver: SqlResolver
    key_param: str  # the parameter that identifies the entity (:id or :user_id)
    key_column: str | None  # the selected column holding the key (batches need it)
    rows: bool  # True: rows fill a has-many feature; False: one row gives scalar features
    params: tuple[str, ...]  # parameter name per resolver input, in input order
    batch: SqlText | None  # the text with `col IN (:__keys__)` when a batch can be pushed down
    columns: Mapping[str, str]  # output column -> feature name


class SqlRunner:
    """Runs a bound SQL resolver for a batch of entities against its source."""

    def __init__(self, plan: SqlPlan, source: Any) -> None:
        self.plan = plan
        self.source = source
        self.percent = getattr(source, "escape_percent", False)

    async def run(
        self, calls: list[list[Any]], results: list[tuple[bool, Any] | None], pool: Any
    ) -> None:
        plan = self.plan
        key_index = plan.params.index(plan.key_param)
        others = [[v for i, v in enumerate(c) if i != key_index] for c in calls]
        same_others = all(o == others[0] for o in others)
        if plan.batch is not None and same_others and len(calls) > 1:
            keys = list(dict.fromkeys(c[key_index] for c in calls))
            found: dict[Any, list[dict[str, Any]]] = {}
            try:
                for start in range(0, len(keys), MAX_BATCH):
                    chunk = keys[start : start + MAX_BATCH]
                    rows = await self.fetch_batch(chunk, calls[0])
                    for row in rows:  # rows are keyed by feature names by now
                        found.setdefault(_norm(row.get(plan.key_param)), []).append(row)
            except Exception as error:  # the database's failure becomes each row's error
                for index in range(len(calls)):
                    results[index] = (False, error)
                return
            for index, call in enumerate(calls):
                results[index] = self.shape(found.get(_norm(call[key_index]), []), call, key_index)
            return

        distinct: dict[tuple[Any, ...], list[int]] = {}
        for index, call in enumerate(calls):
            distinct.setdefault(tuple(_norm(v) for v in call), []).append(index)
        if len(distinct) > 1 and self.source.dialect in LATERAL_TYPES:
            groups = list(distinct.values())
            answered = await self.run_lateral([calls[g[0]] for g in groups])
            if answered is not None:
                for indexes, rows in zip(groups, answered, strict=True):
                    result = self.shape(rows, calls[indexes[0]], key_index)
                    for index in indexes:
                        results[index] = result
                return

        # One statement per distinct set of arguments, run concurrently.

        async def one(indexes: list[int]) -> None:
            call = calls[indexes[0]]
            try:
                result = self.shape(await self.fetch_one(call), call, key_index)
            except Exception as error:  # the database's failure becomes these rows' error
                result = (False, error)
            for index in indexes:
                results[index] = result

        await asyncio.gather(*(one(indexes) for indexes in distinct.values()))

    async def run_lateral(self, calls: list[list[Any]]) -> list[list[dict[str, Any]]] | None:
        """Each call's rows from one statement per MAX_LATERAL calls; None where the
        arguments have no common SQL type or the database refuses the form (the caller then
        runs one statement per call, which reports any real error)."""
        text = self.plan.resolver.text
        names = list(dict.fromkeys(text.params))
        types = _argument_types(self.source.dialect, names, self.plan.params, calls)
        if types is None:
            return None
        found: list[list[dict[str, Any]]] = []
        try:
            for start in range(0, len(calls), MAX_LATERAL):
                found.extend(await self.fetch_lateral(calls[start : start + MAX_LATERAL], types))
        except Exception as error:  # e.g. a statement that cannot be a subquery
            logger.debug("lateral batch of %s refused: %s", self.plan.resolver.name, error)
            return None
        return found

    async def fetch_lateral(
        self, calls: list[list[Any]], types: Mapping[str, str]
    ) -> list[list[dict[str, Any]]]:
        text = self.plan.resolver.text
        names = list(types)
        counter = 0

        def placeholder(cast: str) -> str:
            nonlocal counter
            counter += 1
            return f"cast({self.source.placeholder(counter)} as {cast})"

        rows_sql, params = [], []
        integer = LATERAL_TYPES[self.source.dialect]["int"]
        for index, call in enumerate(calls):
            values = dict(zip(self.plan.params, call, strict=True))
            cells = [placeholder(integer)] + [placeholder(types[n]) for n in names]
            rows_sql.append("(" + ", ".join(cells) + ")")
            params.extend([index, *[values[n] for n in names]])
        inner = []
        for index, part in enumerate(text.parts):
            inner.append(part.replace("%", "%%") if self.percent else part)
            if index < len(text.params):
                inner.append(f"kairos_call.p{names.index(text.params[index])}")
        body = "".join(inner).rstrip().rstrip(";")
        columns = ", ".join(["kairos_call_row", *(f"p{i}" for i in range(len(names)))])
        sql = (
            f"select kairos_call.kairos_call_row, kairos_result.* from (values "
            f"{', '.join(rows_sql)}) as kairos_call({columns}) cross join lateral (\n{body}\n) "
            "as kairos_result"
        )
        columns_out, rows = await self.source.fetch(sql, params)
        names_out = [self.plan.columns.get(c, c) for c in columns_out[1:]]
        found: list[list[dict[str, Any]]] = [[] for _ in calls]
        for row in rows:
            found[int(row[0])].append(dict(zip(names_out, row[1:], strict=True)))
        return found

    def shape(
        self, rows: list[dict[str, Any]], call: list[Any], key_index: int
    ) -> tuple[bool, Any]:
        if self.plan.rows:
            return True, rows
        if not rows:
            return False, LookupError(
                f"sql resolver {self.plan.resolver.name!r} found no row for "
                f"{self.plan.key_param}={call[key_index]!r}"
            )
        if len(rows) > 1:
            return False, LookupError(
                f"sql resolver {self.plan.resolver.name!r} found {len(rows)} rows for "
                f"{self.plan.key_param}={call[key_index]!r}; a resolver of single features "
                "returns at most one row per key"
            )
        return True, rows[0]

    async def fetch_one(self, call: list[Any]) -> list[dict[str, Any]]:
        values = dict(zip(self.plan.params, call, strict=True))
        text = self.plan.resolver.text
        sql = text.render(self.source.placeholder, self.percent)
        return await self.fetch(sql, [values[name] for name in text.params])

    async def fetch_batch(self, keys: list[Any], call: list[Any]) -> list[dict[str, Any]]:
        values = dict(zip(self.plan.params, call, strict=True))
        text = self.plan.batch
        if text is None:  # pragma: no cover - checked by the caller
            raise KairosError("no batch statement")
        params: list[Any] = []
        pieces = []
        counter = 0

        def placeholder() -> str:
            nonlocal counter
            counter += 1
            return str(self.source.placeholder(counter))

        for index, part in enumerate(text.parts):
            pieces.append(part.replace("%", "%%") if self.percent else part)
            if index < len(text.params):
                name = text.params[index]
                if name == "__keys__":
                    pieces.append(", ".join(placeholder() for _ in keys))
                    params.extend(keys)
                else:
                    pieces.append(placeholder())
                    params.append(values[name])
        return await self.fetch("".join(pieces), params)

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]]:
        if self.source.dialect == "sqlite":
            # SQLite has no time type; projects store ISO 8601 text, which compares in order.
            params = [p.isoformat() if isinstance(p, datetime | date) else p for p in params]
        columns, rows = await self.source.fetch(sql, params)
        names = [self.plan.columns.get(c, c) for c in columns]
        return [dict(zip(names, row, strict=True)) for row in rows]


def _argument_types(
    dialect: str, names: list[str], params: Sequence[str], calls: list[list[Any]]
) -> dict[str, str] | None:
    """The SQL type of each parameter over all calls, or None if one has no single type."""
    types: dict[str, str] = {}
    for name in names:
        at = list(params).index(name)
        kinds = {kind for call in calls if (kind := _kind(call[at])) is not None}
        if len(kinds) > 1 or "other" in kinds:
            return None
        types[name] = LATERAL_TYPES[dialect][kinds.pop() if kinds else "str"]
    return types


def _kind(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, datetime):
        return "datetime" if value.tzinfo is not None else "other"
    if isinstance(value, date):
        return "date"
    return "other"


def _norm(key: Any) -> Any:
    # Databases may hand back 7 for "7" (or the reverse); match keys by their text.
    return None if key is None else str(key)


_WHOLE_RESULT = re.compile(
    r"\b(limit|offset|fetch|group\s+by|having|distinct|union|intersect|except|over|window|"
    r"count|sum|avg|min|max|array_agg|string_agg|group_concat|bool_and|bool_or)\b",
    re.IGNORECASE,
)


def per_key(sql: str) -> bool:
    """Whether each result row depends on its own key only, so `= :key` may become `IN (...)`.

    LIMIT, aggregates, DISTINCT, window functions and set operations act on the whole result:
    pushing a batch of keys into them would mix the keys' answers.
    """
    return _WHOLE_RESULT.search(_masked(sql, strings=True)) is None


def batch_text(text: SqlText, key_param: str) -> tuple[SqlText, str] | None:
    """Rewrite the one `col = :key` comparison into `col IN (:__keys__)`."""
    if not per_key("".join(text.parts)):
        return None
    hits = [i for i, p in enumerate(text.params) if p == key_param]
    if len(hits) != 1:
        return None
    index = hits[0]
    before = text.parts[index]
    match = re.search(r"([A-Za-z_][\w.\"]*)\s*=\s*$", before)
    if match is None:
        return None
    column = match.group(1).split(".")[-1].strip('"')
    parts = list(text.parts)
    parts[index] = before[: match.start()] + f"{match.group(1)} IN ("
    parts[index + 1] = ")" + parts[index + 1]
    params = list(text.params)
    params[index] = "__keys__"
    return SqlText(tuple(parts), tuple(params)), column
