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

The statement is read with sqlglot in its source's dialect (SQLite, DuckDB or PostgreSQL):
its tokens find the parameters, its syntax tree the output columns and whether the key
comparison may become `IN (...)`. The text sent to the database is the user's own, edited
only where a parameter or the key comparison stands.

A has-many resolver's rows come from a source that can fetch Arrow (DuckDB; PostgreSQL with
the ADBC driver) as an Arrow table, split by key without a Python object per value, and
reach the engine as columns; SQLite's (and a source's refusal: None) come as rows.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import Token, TokenType, exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ParseError, TokenError

from kairos.definitions.durations import parse_duration
from kairos.errors import DefinitionError, KairosError
from kairos.resolvers.calls import Made

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
# The sources' dialects, named as sqlglot names them; SQL of no known source reads as PostgreSQL.
DIALECTS = ("sqlite", "duckdb", "postgres")
DEFAULT_DIALECT = "postgres"
# Clauses of a SELECT that act on its whole result rather than on each row.
_WHOLE_RESULT_CLAUSES = ("distinct", "group", "having", "qualify", "windows", "limit", "offset")
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

    @property
    def sql(self) -> str:
        """The text as written, `:name` parameters in place."""
        return self.render(lambda index: ":" + self.params[index - 1])


@dataclass(frozen=True, slots=True)
class SqlStatement:
    """A resolver's statement as its source's dialect reads it."""

    text: SqlText
    columns: list[str] | None  # see selected_columns


def _dialect(name: str | None) -> Dialect:
    return Dialect.get_or_raise(name if name in DIALECTS else DEFAULT_DIALECT)


def _parameter_spans(sql: str, tokens: Sequence[Token]) -> Iterator[tuple[int, int, str]]:
    """(start, end, name) of each `:name`: a colon token touching a name token. Strings,
    quoted names and comments are tokens of their own (or no token), and `::` is a cast."""
    for colon, name in itertools.pairwise(tokens):
        if colon.token_type is TokenType.COLON and name.start == colon.end + 1:
            text = sql[name.start : name.end + 1]
            if _IDENT.fullmatch(text):
                yield colon.start, name.end + 1, text


def split_parameters(sql: str, dialect: str | None = None) -> SqlText:
    """Find `:name` parameters outside quotes and comments; `::type` casts are not params.

    >>> split_parameters("select id from t where id = :id and note = ':x'").params
    ('id',)
    """
    try:
        tokens = _dialect(dialect).tokenize(sql)
    except TokenError:  # e.g. an unterminated string: no parameter can be told apart
        return SqlText((sql,), ())
    return _split(sql, tokens)


def _split(sql: str, tokens: Sequence[Token]) -> SqlText:
    parts: list[str] = []
    params: list[str] = []
    last = 0
    for start, end, name in _parameter_spans(sql, tokens):
        parts.append(sql[last:start])
        params.append(name)
        last = end
    parts.append(sql[last:])
    return SqlText(tuple(parts), tuple(params))


def _parse(sql: str, dialect: str | None) -> tuple[list[Token], list[exp.Expr]]:
    """The statement's tokens and its syntax trees (one per statement); raises sqlglot's
    TokenError or ParseError."""
    reader = _dialect(dialect)
    tokens = reader.tokenize(sql)
    trees = reader.parser().parse(tokens, sql)
    return tokens, [
        tree for tree in trees if tree is not None and not isinstance(tree, exp.Semicolon)
    ]


def _statement(sql: str, dialect: str | None) -> tuple[list[Token], exp.Expr] | None:
    """The tokens and tree of the one statement in sql, or None if it is not one statement."""
    try:
        tokens, trees = _parse(sql, dialect)
    except (TokenError, ParseError):
        return None
    return (tokens, trees[0]) if len(trees) == 1 else None


def read_statement(sql: str, dialect: str, where: str) -> SqlStatement:
    """The statement read in `dialect`; a DefinitionError naming `where` if it cannot be."""
    try:
        tokens, trees = _parse(sql, dialect)
    except ParseError as error:
        first = error.errors[0] if error.errors else {}
        near = f" near {first['highlight']!r}" if first.get("highlight") else ""
        description = first.get("description", str(error))
        reason = f"{description}{near} at line {first.get('line')}, column {first.get('col')}"
        raise DefinitionError(
            f"{where}: cannot parse the statement as {dialect} SQL ({reason}); fix the SQL so "
            "that it is one statement the source's database accepts"
        ) from None
    except TokenError as error:
        reason = str(error.__cause__ or error).splitlines()[0]
        raise DefinitionError(
            f"{where}: cannot read the statement as {dialect} SQL ({reason}); close the quote, "
            "quoted name or comment left open"
        ) from None
    if len(trees) != 1:
        raise DefinitionError(f"{where}: the file holds {len(trees)} statements; keep one SELECT")
    return SqlStatement(_split(sql, tokens), _columns(trees[0]))


def selected_columns(sql: str, dialect: str | None = None) -> list[str] | None:
    """Output names of the top-level SELECT list (`expr as alias` -> alias), or None when a
    column cannot be named (e.g. `*` or an unaliased expression).

    >>> selected_columns("select c.id, level as tier from customers c")
    ['id', 'tier']
    """
    read = _statement(sql, dialect)
    return None if read is None else _columns(read[1])


def _columns(tree: exp.Expr) -> list[str] | None:
    if not isinstance(tree, exp.Query):
        return None
    select: exp.Expr = tree
    while isinstance(select, exp.SetOperation):  # the first SELECT names a union's columns
        select = select.this
    if not isinstance(select, exp.Select) or select.args.get("from_") is None:
        return None
    columns = []
    for item in select.expressions:
        if isinstance(item, exp.Alias):
            name = item.alias
        elif isinstance(item, exp.Column) and not isinstance(item.this, exp.Star):
            name = item.name
        else:
            return None
        if not _IDENT.fullmatch(name):
            return None
        columns.append(name)
    return columns


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
        self.version = hashlib.sha256(sql.encode()).hexdigest()[:12]
        self._statements: dict[str, SqlStatement] = {}

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.path else f"<sql {self.name}>"

    def __repr__(self) -> str:
        return f"<{self.kind} sql resolver {self.name}>"

    def read(self, dialect: str) -> SqlStatement:
        """The statement as `dialect` reads it (read once per dialect); a DefinitionError
        naming the file and the fix where sqlglot cannot parse it."""
        if dialect not in self._statements:
            where = f"sql resolver {self.name!r} ({self.where})"
            self._statements[dialect] = read_statement(self.sql, dialect, where)
        return self._statements[dialect]

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
        self.text = plan.resolver.read(source.dialect).text
        # has-many rows as Arrow where the source can fetch them so
        self.arrow = plan.rows and callable(getattr(source, "fetch_arrow", None))

    async def run(
        self,
        calls: list[list[Any]],
        results: list[tuple[bool, Any] | None],
        pool: Any,
        made: Made,  # a SQL query is no model or LLM call: nothing is added
    ) -> None:
        plan = self.plan
        key_index = plan.params.index(plan.key_param)
        others = [[v for i, v in enumerate(c) if i != key_index] for c in calls]
        same_others = all(o == others[0] for o in others)
        if plan.batch is not None and same_others and len(calls) > 1:
            keys = list(dict.fromkeys(c[key_index] for c in calls))
            found: dict[Any, Any] = {}
            try:
                for start in range(0, len(keys), MAX_BATCH):
                    chunk = keys[start : start + MAX_BATCH]
                    rows = await self.fetch_batch(chunk, calls[0])
                    if isinstance(rows, pa.Table):  # each key's rows in a chunk of its own
                        for key, part in _groups(rows, plan.key_param):
                            found[_norm(key)] = part
                        continue
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

    async def run_lateral(self, calls: list[list[Any]]) -> list[Any] | None:
        """Each call's rows from one statement per MAX_LATERAL calls; None where the
        arguments have no common SQL type or the database refuses the form (the caller then
        runs one statement per call, which reports any real error)."""
        text = self.text
        names = list(dict.fromkeys(text.params))
        types = _argument_types(self.source.dialect, names, self.plan.params, calls)
        if types is None:
            return None
        found: list[Any] = []
        try:
            for start in range(0, len(calls), MAX_LATERAL):
                found.extend(await self.fetch_lateral(calls[start : start + MAX_LATERAL], types))
        except Exception as error:  # e.g. a statement that cannot be a subquery
            logger.debug("lateral batch of %s refused: %s", self.plan.resolver.name, error)
            return None
        return found

    async def fetch_lateral(self, calls: list[list[Any]], types: Mapping[str, str]) -> list[Any]:
        text = self.text
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
        table = await self.source.fetch_arrow(sql, params) if self.arrow else None
        if table is not None:
            call_column, *names_out = table.column_names
            table = table.rename_columns(
                [call_column, *(self.plan.columns.get(c, c) for c in names_out)]
            )
            parts: list[Any] = [[] for _ in calls]
            for call_row, part in _groups(table, call_column):
                parts[int(call_row)] = part.drop_columns([call_column])
            return parts
        columns_out, rows = await self.source.fetch(sql, params)
        names_out = [self.plan.columns.get(c, c) for c in columns_out[1:]]
        found: list[list[dict[str, Any]]] = [[] for _ in calls]
        for row in rows:
            found[int(row[0])].append(dict(zip(names_out, row[1:], strict=True)))
        return found

    def shape(self, rows: Any, call: list[Any], key_index: int) -> tuple[bool, Any]:
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

    async def fetch_one(self, call: list[Any]) -> list[dict[str, Any]] | pa.Table:
        values = dict(zip(self.plan.params, call, strict=True))
        text = self.text
        sql = text.render(self.source.placeholder, self.percent)
        return await self.fetch(sql, [values[name] for name in text.params])

    async def fetch_batch(
        self, keys: list[Any], call: list[Any]
    ) -> list[dict[str, Any]] | pa.Table:
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

    async def fetch(self, sql: str, params: Sequence[Any]) -> list[dict[str, Any]] | pa.Table:
        if self.source.dialect == "sqlite":
            # SQLite has no time type; projects store ISO 8601 text, which compares in order.
            params = [p.isoformat() if isinstance(p, datetime | date) else p for p in params]
        table = await self.source.fetch_arrow(sql, params) if self.arrow else None
        if table is not None:
            return table.rename_columns([self.plan.columns.get(c, c) for c in table.column_names])
        columns, rows = await self.source.fetch(sql, params)
        names = [self.plan.columns.get(c, c) for c in columns]
        return [dict(zip(names, row, strict=True)) for row in rows]


def _groups(table: pa.Table, column: str) -> Iterator[tuple[Any, pa.Table]]:
    """(value, its rows) for each value of `column`: one sort, then zero-copy slices."""
    if table.num_rows == 0:
        return
    keys = table.column(column)
    distinct = pc.unique(keys)
    index = pc.index_in(keys, value_set=distinct).to_numpy(zero_copy_only=False)
    order = np.argsort(index, kind="stable")
    ordered = table.take(pa.array(order))
    counts = np.bincount(index, minlength=len(distinct))
    start = 0
    for value, count in zip(distinct.to_pylist(), counts.tolist(), strict=True):
        yield value, ordered.slice(start, count)
        start += count


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


def _acts_on_many_rows(node: exp.Expr) -> bool:
    """An aggregate or window: its value comes from several rows."""
    if isinstance(node, exp.AggFunc | exp.Window | exp.WithinGroup | exp.Filter):
        return True
    # Aggregates sqlglot has no class for (jsonb_agg, every) are read as unknown functions.
    name = node.name.lower() if isinstance(node, exp.Anonymous) else ""
    return name.endswith("agg") or name == "every"


def _keeps_rows(select: exp.Select) -> bool:
    """Whether each row of this SELECT comes from one row of its FROM, alone: no aggregate,
    window, DISTINCT, GROUP BY, LIMIT... in its own scope (a subquery is a scope of its own)."""
    if any(select.args.get(clause) for clause in _WHOLE_RESULT_CLAUSES):
        return False
    nested = exp.Query
    scope = select.walk(prune=lambda node: node is not select and isinstance(node, nested))
    return not any(_acts_on_many_rows(node) for node in scope if not isinstance(node, nested))


def per_key(sql: str, dialect: str | None = None) -> bool:
    """Whether each result row depends on its own key only, so `= :key` may become `IN (...)`.

    LIMIT, aggregates, DISTINCT, window functions and set operations act on the whole result:
    pushing a batch of keys into them would mix the keys' answers. This judges the outermost
    SELECT; a subquery is judged on its own, where the key comparison stands (batch_text):
    `(select max(amount) from orders o where o.customer_id = c.id)` is evaluated per row.

    >>> per_key("select id, name from t where id = :id"), per_key("select count(*) from t")
    (True, False)
    """
    read = _statement(sql, dialect)
    return read is not None and isinstance(read[1], exp.Select) and _keeps_rows(read[1])


def _key_filters_rows(compare: exp.EQ) -> bool:
    """Whether `col = :key` filters the rows of the statement's result, one by one: a
    conjunct of a WHERE whose SELECT keeps rows, read by its outer SELECTs only as a FROM
    (a derived table, or a CTE read once) of SELECTs that keep rows too."""
    node = compare.parent
    while isinstance(node, exp.And | exp.Paren):
        node = node.parent
    if not isinstance(node, exp.Where) or not isinstance(node.parent, exp.Select):
        return False
    select: exp.Expr | None = node.parent
    while isinstance(select, exp.Select) and _keeps_rows(select):
        holder = select.parent
        if holder is None:
            return True
        if isinstance(holder, exp.Subquery) and isinstance(holder.parent, exp.From):
            select = holder.parent.parent
        elif isinstance(holder, exp.CTE) and isinstance(holder.parent, exp.With):
            owner = holder.parent.parent
            reads = [
                table
                for table in (owner.find_all(exp.Table) if owner is not None else ())
                if table.name == holder.alias and not table.db
            ]
            if len(reads) != 1 or not isinstance(reads[0].parent, exp.From):
                return False
            select = reads[0].parent.parent
        else:
            return False
    return False


def batch_text(
    text: SqlText, key_param: str, dialect: str | None = None
) -> tuple[SqlText, str] | None:
    """Rewrite the one `col = :key` comparison into `col IN (:__keys__)`, or None where the
    rewrite would change an entity's rows (see per_key and _key_filters_rows).

    The text is edited where the comparison stands, the rest left as written.

    >>> found = batch_text(split_parameters("select id from t where id = :id"), "id")
    >>> found[0].render(lambda i: "?"), found[1]
    ('select id from t where id IN (?)', 'id')
    """
    hits = [i for i, p in enumerate(text.params) if p == key_param]
    if len(hits) != 1:
        return None
    sql = text.sql
    read = _statement(sql, dialect)
    if read is None:
        return None
    tokens, tree = read
    placeholders = [p for p in tree.find_all(exp.Placeholder) if p.this == key_param]
    compare = placeholders[0].parent if len(placeholders) == 1 else None
    if not isinstance(compare, exp.EQ) or compare.expression is not placeholders[0]:
        return None
    column = compare.this
    if not isinstance(column, exp.Column) or isinstance(column.this, exp.Star):
        return None
    # Where the comparison stands: `col`, then `=` and `:key` with nothing but spaces between.
    index = hits[0]
    start = len(SqlText(text.parts[: index + 1], text.params[:index]).sql)  # where `:key` is
    part_start = start - len(text.parts[index])
    at = next((i for i, token in enumerate(tokens) if token.start == start), 0)
    if at < 2:
        return None
    equals, last = tokens[at - 1], tokens[at - 2]
    column_start = column.parts[0].meta.get("start")
    if (
        equals.token_type is not TokenType.EQ
        or last.end != column.parts[-1].meta.get("end")
        or column_start is None
        or sql[last.end + 1 : equals.start].strip()
        or sql[equals.end + 1 : start].strip()
        or not _key_filters_rows(compare)
    ):
        return None
    parts = list(text.parts)
    parts[index] = sql[part_start:column_start] + sql[column_start : last.end + 1] + " IN ("
    parts[index + 1] = ")" + parts[index + 1]
    params = list(text.params)
    params[index] = "__keys__"
    return SqlText(tuple(parts), tuple(params)), column.name
