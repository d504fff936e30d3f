"""`client.log`: the decisions this project served — read one, search them, turn them into a
training set of the values as served.

    >>> client.log.get(query_id).values["user.txn_count[1d]"].value  # doctest: +SKIP
    >>> client.log.search(entity={User.id: "u1"}, since="1h", model="risk@v2")  # doctest: +SKIP

Every method of the underlying `QueryLog` (append, flush, recent, close...) is here too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from kairos.definitions.durations import DurationLike, parse_duration
from kairos.definitions.frame import DataFrame
from kairos.engine.result import BulkResult, ColumnData
from kairos.engine.values import to_utc
from kairos.errors import DefinitionError, InvalidInput, InvalidValue, KairosError
from kairos.planner.plan import Plan
from kairos.project.offline import Datasets, OfflineResult
from kairos.project.snapshot import FeatureNames
from kairos.resolvers.calls import Calls
from kairos.stores.datasets import DatasetVersion
from kairos.stores.query_log import LoggedQuery, LoggedValue, PlanInfo, QueryLog, Search
from kairos.stores.query_log.records import search_key

# search answers at most this many decisions at once; page with `until=` the oldest's `now`
MAX_LIMIT = 1_000_000
# what one reply of the server (or a page of the dashboard) lists at most: a listing is built
# in memory, so a bigger one is paged (`until=`), never one reply of a gigabyte
MAX_PAGE = 10_000


class DecisionLog:
    """The query log with search in the project's feature names."""

    def __init__(
        self,
        log: QueryLog,
        names: FeatureNames,
        datasets: Callable[[], Datasets] | None = None,
    ) -> None:
        self.store = log
        self._names = names
        self._datasets = datasets  # where to_dataset(name=...) saves (client.datasets)

    def __getattr__(self, name: str) -> Any:  # append, flush, recent, close, dropped...
        return getattr(self.store, name)

    def get(self, query_id: str) -> LoggedQuery | None:
        """One decision's record, or None."""
        return self.store.get(query_id)

    def get_many(self, query_ids: Sequence[str]) -> dict[str, LoggedQuery]:
        """The records of these decisions found, by query id."""
        return self.store.get_many(query_ids)

    def recent(self, limit: int = 20, *, nested: bool = True) -> list[LoggedQuery]:
        """The newest `limit` decisions, newest first (`nested=False`: without their
        model and LLM calls, e.g. for ages and counts)."""
        return self.store.recent(limit, nested=nested)

    def find(self, search: Search) -> list[LoggedQuery]:
        """The decisions a search already checked (`parse`) names, newest first."""
        return self.store.search(search)

    @property
    def dropped(self) -> int:
        """Records the log's queue had no room for (a metric)."""
        return self.store.dropped

    @property
    def lost(self) -> int:
        """Records the log failed to write (a metric)."""
        return self.store.lost

    def search(
        self,
        *,
        entity: Mapping[Any, Any] | None = None,
        since: datetime | DurationLike | None = None,
        until: datetime | DurationLike | None = None,
        feature: Any = None,
        model: str | None = None,
        limit: int = 100,
    ) -> list[LoggedQuery]:
        """Decisions newest first: for this entity (`{User.id: "u1"}`), with `now` in
        [since, until) (a datetime, or a duration back from now: "1h"), whose plan touched
        `feature`, that called `model` (`"risk@v2"`, or `"risk"` for any version)."""
        return self.find(
            self.parse(
                entity=entity, since=since, until=until, feature=feature, model=model, limit=limit
            )
        )

    def parse(
        self,
        *,
        entity: Mapping[Any, Any] | None = None,
        since: datetime | DurationLike | None = None,
        until: datetime | DurationLike | None = None,
        feature: Any = None,
        model: str | None = None,
        limit: int = 100,
    ) -> Search:
        """The search these arguments name, checked (each bad one named in its error)."""
        keys = []
        for name, value in (entity or {}).items():
            key = search_key(value)
            if key is None:
                raise InvalidInput(
                    f"entity {name!r}: search by a str or int key, got {value!r}",
                    field="entity",
                )
            keys.append((self._name(name, "entity"), key))
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidInput(f"limit must be 1..{MAX_LIMIT}, got {limit!r}", field="limit")
        if model is not None and (not isinstance(model, str) or not model):
            raise InvalidInput(
                f"model must be a name or a version like 'risk@v2', got {model!r}", field="model"
            )
        start, end = moment(since, "since"), moment(until, "until")
        if start is not None and end is not None and start >= end:
            raise InvalidInput(f"since ({start}) must be before until ({end})", field="since")
        return Search(
            tuple(keys),
            start,
            end,
            None if feature is None else self._name(feature, "feature"),
            model,
            limit,
        )

    def to_dataset(
        self,
        *,
        features: Sequence[Any],
        since: datetime | DurationLike | None = None,
        until: datetime | DurationLike | None = None,
        entity: Mapping[Any, Any] | None = None,
        name: str | None = None,
        limit: int = 100_000,
    ) -> OfflineResult | DatasetVersion:
        """The values the decisions were served, as a training set ("log and wait"): one row
        per decision that logged any of `features` (oldest first), with columns `query_id`,
        `now`, the decision's inputs (`user.id`) and one per feature (null where a decision
        did not log it; has-many values kept as lists of rows). With `name`, saved with
        `client.datasets` at once and the saved version returned.

        >>> client.log.to_dataset(since="7d", features=[User.risk], name="served")  # doctest: +SKIP
        """
        if isinstance(features, str) or not isinstance(features, Sequence) or not features:
            raise InvalidInput(
                "features must be a non-empty list of features, e.g. [User.risk]",
                field="features",
            )
        wanted = list(dict.fromkeys(self._name(f, "features") for f in features))
        found = self.search(entity=entity, since=since, until=until, limit=limit)
        records = [r for r in reversed(found) if any(n in r.values for n in wanted)]
        if not records:
            raise InvalidInput(
                f"no logged decision in this range has any of {', '.join(wanted)}; widen "
                "since/until or check that the query log is on",
                field="features",
            )
        inputs = [n for n in dict.fromkeys(k for r in records for k in r.inputs) if n not in wanted]
        columns: dict[str, list[Any]] = {
            "query_id": [r.query_id for r in records],
            "now": [r.now for r in records],
            **{n: [r.inputs.get(n) for r in records] for n in inputs},
            **{n: [_served(r, n) for r in records] for n in wanted},
        }
        arrays = {}
        for column, values in columns.items():
            try:
                arrays[column] = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as error:
                raise InvalidInput(
                    f"features: the logged values of {column!r} do not fit one column "
                    f"({error}); leave it out",
                    field="features",
                ) from None
        query = {
            "log": {
                "since": _iso(moment(since, "since")),
                "until": _iso(moment(until, "until")),
                "entity": {self._name(k, "entity"): v for k, v in (entity or {}).items()},
                "limit": limit,
            },
            "outputs": wanted,
            "timestamp": "now",
            "decisions": len(records),
        }
        result = OfflineResult(pa.table(arrays), [], query)
        if name is None:
            return result
        if self._datasets is None:
            raise KairosError("this log has no dataset store to save to; call without name=")
        return self._datasets().save(name, result)

    def _name(self, feature: Any, field: str) -> str:
        try:
            return self._names.known(feature)
        except (KairosError, KeyError) as error:
            raise InvalidInput(f"{field}: {error}", field=field) from None

    def __repr__(self) -> str:
        return f"<DecisionLog {getattr(self.store, 'name', type(self.store).__name__)}>"


def _served(record: LoggedQuery, name: str) -> Any:
    found = record.values.get(name)
    return None if found is None else found.value


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


# `+00:00` sent unescaped in a URL (or typed into a form) arrives as ` 00:00`
_SPACED_OFFSET = re.compile(r"(T[0-9:.]+) ([0-9]{2}:?[0-9]{2})$")


def entity_keys(pairs: Iterable[str]) -> dict[str, str]:
    """`FEATURE:KEY` texts (a URL's or a form's `entity=`) by feature; a malformed or
    repeated one is an InvalidInput naming `entity`.

    >>> entity_keys(["user.id:u1", "card.id:c9"])
    {'user.id': 'u1', 'card.id': 'c9'}
    """
    entity: dict[str, str] = {}
    for pair in pairs:
        name, colon, key = pair.partition(":")
        if not colon or not name:
            raise InvalidInput(
                f"entity={pair!r} must be FEATURE:KEY, e.g. entity=user.id:u1", field="entity"
            )
        if entity.setdefault(name, key) != key:
            raise InvalidInput(f"entity names {name!r} twice; give each key once", field="entity")
    return entity


def typed_time(text: str) -> str:
    """A time as a URL or a form brought it, its offset's `+` restored where it became a
    space.

    >>> typed_time("2026-06-01T12:00:00 00:00"), typed_time("1h")
    ('2026-06-01T12:00:00+00:00', '1h')
    """
    return _SPACED_OFFSET.sub(r"\1+\2", text)


def moment(value: datetime | DurationLike | None, field: str) -> datetime | None:
    """A datetime (made UTC), or a duration before now ("1h", 3600, timedelta)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        try:
            return to_utc(value)
        except InvalidValue as error:
            raise InvalidInput(f"{field}: {error}", field=field) from None
    if isinstance(value, str):
        try:
            return to_utc(datetime.fromisoformat(value))
        except (ValueError, InvalidValue):
            pass
    try:
        return datetime.now(UTC) - parse_duration(value, field=field)
    except OverflowError:
        raise InvalidInput(
            f"{field}={value!r} reaches back before year 1; give a shorter duration or an ISO "
            "time like '2026-12-01T10:00:00+00:00'",
            field=field,
        ) from None
    except DefinitionError as error:
        raise InvalidInput(
            f"{error}; or give an ISO time like '2026-12-01T10:00:00+00:00'", field=field
        ) from None


# --- what a decision record keeps of a query (the client builds its records with these) ---

# sources whose values no code version made
UNVERSIONED = frozenset({None, "cache", "input", "default"})
# what only a decision record keeps of an LLM call (not a query's reply, nor its trace)
FULL_ONLY = frozenset({"messages", "answer", "cost_by_feature"})


def whole_path(
    call: dict[str, Any], started: float, total_ms: float, *, full: bool
) -> dict[str, Any]:
    """An LLM call's record with the context assembly before it: from the query's start to
    the moment its request was sent (features computed, prompt rendered). Without `full`,
    not the messages and the answer (what a query's reply and trace show)."""
    dropped = {"sent_at"} if full else {"sent_at", *FULL_ONLY}
    record = {k: v for k, v in call.items() if k not in dropped}
    record["context_ms"] = round((call["sent_at"] - started) * 1000, 3)
    record["query_ms"] = round(total_ms, 3)
    return record


def snapshot_values(values: dict[str, ColumnData]) -> dict[str, ColumnData]:
    """The run's values as the decision record will keep them: every list and dict copied
    (has-many rows, list and dict features, such inputs), since the caller holds the same
    objects and may change them before the writer thread reads them."""
    kept = values
    for name, column in values.items():
        if any(type(value) in CONTAINERS or type(value) is DataFrame for value in column.values):
            if kept is values:
                kept = dict(values)
            copied = [copied_value(value) for value in column.values]
            kept[name] = ColumnData(copied, column.observed_at, column.source, column.errors)
    return kept


CONTAINERS = frozenset({list, dict})


def copied_value(value: Any) -> Any:
    """`value` with its lists and dicts copied, all the way down (other values are kept:
    scalars, datetimes, tuples)."""
    kind = type(value)
    if kind is DataFrame:  # has-many rows are kept as dicts
        return [copied_value(item) for item in value.rows]
    if kind is list:
        return [copied_value(item) for item in value]
    if kind is dict:
        return {key: copied_value(item) for key, item in value.items()}
    return value


def by_row(calls: Iterable[dict[str, Any]]) -> dict[int | None, list[dict[str, Any]]]:
    grouped: dict[int | None, list[dict[str, Any]]] = {}
    for call in calls:
        grouped.setdefault(call.pop("row"), []).append(call)
    return grouped


def decision_records(
    info: PlanInfo,
    plan: Plan,
    inputs: dict[str, list[Any]],
    result: BulkResult,
    values: dict[str, ColumnData],
    calls: Calls,
    started: float,
) -> list[LoggedQuery]:
    """Each entity's decision record: every value the plan read or produced, the model
    and LLM calls it made, and its plan (`info`; bulk row `i` is `<query_id>-<i>`)."""
    meta = result.meta
    versions = plan.versions
    trace = [step.to_dict() for step in result.trace]  # times kept whole
    logged_at = datetime.now(UTC)
    models = by_row(
        {
            "feature": call["feature"],
            "model": call["model"],
            "version": call["version"],
            "inputs": call["inputs"],
            "vector": vector,
            "row": row,
        }
        for call in (made.record() for made in calls.models)
        for row, vector in zip(call["rows"], call["vectors"], strict=True)
    )
    llm = by_row(
        {**whole_path(call.record(), started, meta.duration_ms, full=True), "row": call.row}
        for call in calls.llm
    )
    records = []
    now = meta.now
    ages: dict[datetime, float] = {}  # cached values mostly share one observed_at
    made = tuple.__new__  # a LoggedValue without its keyword-argument constructor
    for row in range(meta.rows):
        kept = {}
        for name, col in values.items():
            error = col.errors[row]
            source = col.source[row]
            observed = col.observed_at[row]
            value = col.values[row]
            fields: tuple[Any, ...]
            if source == "cache" and observed is not None:
                age = ages.get(observed)
                if age is None:
                    age = ages[observed] = (now - observed).total_seconds()
                fields = (value, observed, source, None, None, None, age)
            elif source in UNVERSIONED:
                fields = (value, observed, source, None, None, None, None)
            else:
                fields = (value, observed, source, versions.get(name), None, None, None)
            if error is not None:
                fields = (*fields[:4], error.code, error.message, fields[6])
            kept[name] = made(LoggedValue, fields)
        trace_of_row = trace
        llm_of_row = llm.get(row, []) + (llm.get(None, []) if meta.rows == 1 else [])
        if llm_of_row:  # the LLM calls of a decision: tokens by feature, each stage's time
            trace_of_row = trace + [
                {"kind": "llm", **{k: v for k, v in c.items() if k not in FULL_ONLY}}
                for c in llm_of_row
            ]
        records.append(
            LoggedQuery(
                meta.query_id if meta.rows == 1 else f"{meta.query_id}-{row}",
                meta.now,
                {name: column[row] for name, column in inputs.items()},
                {name: kept[name] for name in result.columns},
                meta.duration_ms,
                trace_of_row,
                logged_at,
                kept,
                models.get(row, []),
                llm_of_row,
                info,
            )
        )
    return records


__all__ = [
    "MAX_LIMIT",
    "MAX_PAGE",
    "DecisionLog",
    "decision_records",
    "moment",
    "snapshot_values",
    "whole_path",
]
