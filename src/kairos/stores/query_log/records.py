"""What the query log keeps: the records, and how they are encoded for storage.

Values are stored with `kairos.stores.codec` (tagged JSON: `{"$dt": "2026-..."}` for a
datetime), so every feature value reads back as the same type, has-many rows included. A
value of a type the codec cannot keep is stored as its `repr` string, so the record is kept
rather than lost.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from kairos.errors import BackendUnavailable
from kairos.stores.codec import CorruptValue, UnencodableValue, decode_text, encode, restore


@contextmanager
def collector_paused(paused: bool = True) -> Iterator[None]:
    """Pause the cyclic garbage collector while thousands of records are read or replayed:
    each allocates many small objects, which would start it over and over, every pass
    scanning all that was read so far (several times the work itself). Records hold no
    cycles; whatever else is made meanwhile is collected after."""
    if not paused or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class QueryLogError(BackendUnavailable):
    """The query log could not be opened, written or read."""


class LoggedValue(NamedTuple):
    """One feature value of a logged decision: the value, when it was observed, where it came
    from (`cache`, `input`, `default`, `expression`, `window`, `events`, or the resolver or
    model that made it), the version of that code, and for a value served from the cache its
    age at the query's `now` in seconds (freshness measured, not assumed). A named tuple:
    a record holds one per feature, made and read by the thousand in a replay."""

    value: Any
    observed_at: datetime | None
    source: str | None  # "cache", "resolver:<name>", "model:<name>", ...
    version: str | None  # resolver/model/prompt version that made the value
    error_code: str | None
    error_message: str | None
    age_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The value as `GET /v1/log/{query_id}` shows it.

        >>> LoggedValue(0.12, None, "model:risk", "risk@v2", None, None).to_dict()["version"]
        'risk@v2'
        """
        return {
            "value": self.value,
            "observed_at": self.observed_at,
            "source": self.source,
            "version": self.version,
            "error_code": self.error_code,
            "error_message": self.error_message,
            "age_s": self.age_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoggedValue:
        """The value `to_dict` wrote (observed_at a datetime or ISO 8601 text)."""
        return cls(
            data["value"],
            _time(data["observed_at"]),
            data["source"],
            data.get("version"),
            data.get("error_code"),
            data.get("error_message"),
            data.get("age_s"),
        )


def _time(value: Any) -> Any:
    """A time of a JSON answer: a datetime (tagged JSON), ISO 8601 text (plain JSON) or None."""
    return datetime.fromisoformat(value) if isinstance(value, str) else value


@dataclass(frozen=True, slots=True)
class PlanInfo:
    """What a decision's plan was: its fingerprint, the definitions' hash, the features it
    touched and the version of the code computing each, so search can find decisions by
    feature or model version and a replay can tell what changed. One per plan, stored once."""

    fingerprint: str
    definitions: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    versions: dict[str, str | None]  # every column of the plan -> version of its code
    models: tuple[str, ...] = ()  # model versions the plan calls (`risk@v2`)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "definitions": self.definitions,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "versions": dict(self.versions),
            "models": list(self.models),
        }

    @classmethod
    def stored(cls, info: Any) -> PlanInfo | None:
        """A plan as the plans table keeps it (JSON text, or what the driver parsed), or
        None when it is not one (a corrupt row costs its plan, not every read)."""
        try:
            data = orjson.loads(info) if isinstance(info, str | bytes) else info
            return cls.from_dict(data)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
            return None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanInfo:
        return cls(
            data["fingerprint"],
            data["definitions"],
            tuple(data["inputs"]),
            tuple(data["outputs"]),
            dict(data["versions"]),
            tuple(data.get("models") or ()),
        )


@dataclass(frozen=True, slots=True)
class LoggedQuery:
    """Everything a decision saw. `append` encodes it at once, so later changes to the
    values (by the caller holding the query's result) do not reach the log.

    `outputs` are the features the query asked for; `values` every feature the plan read or
    produced (inputs, cache reads, intermediates and the outputs); `model_calls` each model
    call with the exact input vector the model was given; `llm_calls` each LLM call with its
    rendered messages, the deployment that answered, the answer, tokens (per feature), cost
    and timings."""

    query_id: str
    now: datetime
    inputs: dict[str, Any]
    outputs: dict[str, LoggedValue]
    duration_ms: float
    trace: list[dict[str, Any]]
    logged_at: datetime
    values: dict[str, LoggedValue] = field(default_factory=dict)
    model_calls: list[dict[str, Any]] = field(default_factory=list)
    llm_calls: list[dict[str, Any]] = field(default_factory=list)
    plan: PlanInfo | None = None

    def __post_init__(self) -> None:
        if any(name not in self.values for name in self.outputs):  # values hold the outputs
            object.__setattr__(self, "values", {**self.values, **self.outputs})

    def value(self, feature: str) -> Any:
        """The value a feature had in this decision (output or intermediate)."""
        found = self.values.get(feature)
        if found is None:
            raise KeyError(f"decision {self.query_id!r} has no value for {feature!r}")
        return found.value

    @property
    def cost_usd(self) -> float | None:
        """What the decision's LLM calls cost, when the gateway priced them."""
        costs = [call.get("cost_usd") for call in self.llm_calls]
        known = [c for c in costs if isinstance(c, int | float)]
        return sum(known) if known else None

    def to_dict(self) -> dict[str, Any]:
        """The record as `GET /v1/log/{query_id}` shows it (Python values: datetimes stay)."""
        return {
            "query_id": self.query_id,
            "now": self.now,
            "inputs": self.inputs,
            "outputs": {name: value.to_dict() for name, value in self.outputs.items()},
            "values": {name: value.to_dict() for name, value in self.values.items()},
            "model_calls": self.model_calls,
            "llm_calls": self.llm_calls,
            "plan": None if self.plan is None else self.plan.to_dict(),
            "duration_ms": self.duration_ms,
            "trace": self.trace,
            "logged_at": self.logged_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoggedQuery:
        """The record `to_dict` wrote, as `GET /v1/log/{query_id}` answers it.

        >>> LoggedQuery.from_dict(record.to_dict()) == record  # doctest: +SKIP
        True
        """
        outputs = {name: LoggedValue.from_dict(v) for name, v in data["outputs"].items()}
        values = {name: LoggedValue.from_dict(v) for name, v in data["values"].items()}
        plan = data.get("plan")
        return cls(
            data["query_id"],
            _time(data["now"]),
            dict(data["inputs"]),
            outputs,
            data["duration_ms"],
            list(data["trace"]),
            _time(data["logged_at"]),
            values,
            list(data.get("model_calls") or ()),
            list(data.get("llm_calls") or ()),
            None if plan is None else PlanInfo.from_dict(plan),
        )


def _kept(value: Any, unkept: set[str]) -> Any:
    """`value` with every part the codec cannot keep replaced by its repr (named in `unkept`),
    so one odd value does not cost the whole record."""
    if isinstance(value, dict):
        return {_kept(k, unkept): _kept(v, unkept) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = [_kept(item, unkept) for item in value]
        return items if isinstance(value, list) else type(value)(items)
    try:
        encode(value)
    except UnencodableValue:
        unkept.add(type(value).__name__)
        return repr(value)
    return value


def _encode_kept(value: Any, unkept: set[str]) -> str:
    try:
        data = encode(value)
    except UnencodableValue:
        data = encode(_kept(value, unkept))
    return data.decode("utf-8")


@dataclass(frozen=True, slots=True)
class _Row:
    """A record as stored: codec JSON text for the structured columns. `values` holds the
    values that are not outputs (each value is stored once); `keys` the entity keys of the
    inputs search finds the record by; `plan` is stored once per plan, beside the records."""

    query_id: str
    now: datetime
    inputs: str
    outputs: str
    trace: str
    duration_ms: float
    logged_at: datetime
    values: str = "{}"
    calls: str = "{}"
    plan: PlanInfo | None = None
    keys: tuple[tuple[str, str], ...] = ()


def search_key(value: Any) -> str | None:
    """An input value as the text search compares (`u1`, `42`), or None when it is not a
    key one searches by (a float, a list...)."""
    kind = type(value)
    if kind is str:
        return None if "\x00" in value else str(value)  # PostgreSQL text holds no NUL
    if kind is int:
        return str(value)
    return None


def _encode_values(
    values: dict[str, LoggedValue],
    skip: dict[str, LoggedValue] | None,
    unkept: set[str],
    times: dict[datetime, Any],
    inputs: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> str | None:
    """Values as the JSON the codec would write for their dicts, built from the known layout:
    only each value goes through the codec (a Fragment), which is several times faster, and
    fields that are None are left out. The query's own inputs (source "input", observed at
    `now`) are not written again: `"$inputs": 1` says to read them from the inputs. None when
    a name is odd (the caller then lets the codec do all of it)."""
    encoded: dict[str, Any] = {}
    for name, out in values.items():
        if skip is not None and name in skip:
            continue
        if type(name) is not str or name.startswith("$"):
            return None
        value, observed, source, version, error_code, error_message, age = out
        if (
            source == "input"
            and inputs is not None
            and observed == now
            and error_code is None
            and name in inputs
            and value is inputs[name]
        ):
            encoded["$inputs"] = 1
            continue
        kind = type(value)
        if not (
            kind is str
            or value is None
            or kind is bool
            or (kind is float and value - value == 0.0)  # finite
            or (kind is int and -(2**63) <= value < 2**63)
        ):
            value = orjson.Fragment(_encode_kept(value, unkept))
        if observed is not None:
            observed = times.get(observed) or times.setdefault(observed, _tagged_time(observed))
        item = {"value": value, "observed_at": observed, "source": source}
        if version is not None:
            item["version"] = version
        if error_code is not None:
            item["error_code"] = error_code
            item["error_message"] = error_message
        if age is not None and age - age == 0.0:
            item["age_s"] = age
        encoded[name] = item
    return orjson.dumps(encoded).decode("utf-8")


def _encode_record(record: LoggedQuery, unkept: set[str]) -> _Row:
    if not isinstance(record.query_id, str) or not record.query_id or "\x00" in record.query_id:
        raise TypeError(f"query_id must be a non-empty str without NUL, got {record.query_id!r}")
    for name in ("now", "logged_at"):
        if not isinstance(getattr(record, name), datetime):
            raise TypeError(f"{name} must be a datetime, got {getattr(record, name)!r}")
    times: dict[datetime, Any] = {}  # most values share one observed_at: format it once
    outputs = _encode_values(record.outputs, None, unkept, times)
    if outputs is None:
        outputs = _encode_kept(_plain_values(record.outputs), unkept)
    values = _encode_values(record.values, record.outputs, unkept, times, record.inputs, record.now)
    if values is None:
        rest = {n: v for n, v in record.values.items() if n not in record.outputs}
        values = _encode_kept(_plain_values(rest), unkept)
    calls = "{}"
    if record.model_calls or record.llm_calls:
        calls = _encode_kept({"models": record.model_calls, "llm": record.llm_calls}, unkept)
    keys = tuple(
        (name, key)
        for name, value in record.inputs.items()
        if isinstance(name, str) and (key := search_key(value)) is not None
    )
    return _Row(
        query_id=record.query_id,
        now=record.now,
        inputs=_encode_kept(record.inputs, unkept),
        outputs=outputs,
        trace=_encode_trace(record.trace, unkept),
        duration_ms=float(record.duration_ms),
        logged_at=record.logged_at,
        values=values,
        calls=calls,
        plan=record.plan,
        keys=keys,
    )


def _tagged_time(value: datetime) -> Any:
    """What the codec writes for a datetime."""
    return {"$dt": value.isoformat()}


def _plain_values(values: dict[str, LoggedValue]) -> dict[str, Any]:
    return {name: out.to_dict() for name, out in values.items()}


def _encode_trace(trace: list[dict[str, Any]], unkept: set[str]) -> str:
    """A trace is plain JSON (names, kinds, finite numbers), which orjson writes as the codec
    would; anything else goes through the codec."""
    try:
        return orjson.dumps(trace, option=orjson.OPT_STRICT_INTEGER).decode("utf-8")
    except orjson.JSONEncodeError:
        return _encode_kept(trace, unkept)


def _plain(value: Any) -> bool:
    """A value orjson writes exactly as the codec does: no tag needed."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is int:
        return bool(-(2**63) <= value < 2**63)
    return False


def _logged_values(
    encoded: str,
    inputs: dict[str, Any] | None = None,
    now: datetime | None = None,
    nested: bool = True,
) -> dict[str, LoggedValue]:
    """The values of a record. They were written in a known layout (`_encode_values`), so
    only each value and each `observed_at` is restored, not the whole tree; without `nested`,
    a value that is a list or a mapping is not restored at all (None)."""
    try:
        tree = orjson.loads(encoded)
    except orjson.JSONDecodeError as error:
        raise CorruptValue(f"values {encoded[:40]!r} are not valid JSON: {error}") from None
    if type(tree) is not dict:
        raise CorruptValue(f"values {encoded[:40]!r} are not an object of values by name")
    if len(tree) == 1 and next(iter(tree)).startswith("$") and "$inputs" not in tree:
        tree = restore(tree)  # odd names: the codec wrote it
    times: dict[str, datetime] = {}
    values = {}
    if tree.pop("$inputs", None) and inputs is not None:
        for name, value in inputs.items():
            values[name] = LoggedValue(value, now, "input", None, None, None, None)
    get = dict.get
    for name, out in tree.items():
        value = out["value"]
        if type(value) is dict or type(value) is list:
            value = restore(value) if nested else None
        observed = out["observed_at"]
        if type(observed) is dict and len(observed) == 1 and "$dt" in observed:
            text = observed["$dt"]
            observed = times.get(text) or times.setdefault(text, datetime.fromisoformat(text))
        elif observed is not None:
            observed = restore(observed)
        values[name] = LoggedValue(
            value,
            observed,
            out["source"],
            get(out, "version"),
            get(out, "error_code"),
            get(out, "error_message"),
            get(out, "age_s"),
        )
    return values


def _decode_record(row: _Row, nested: bool = True) -> LoggedQuery:
    try:
        outputs = _logged_values(row.outputs, nested=nested)
        calls = decode_text(row.calls)
        inputs = decode_text(row.inputs)
        return LoggedQuery(
            query_id=row.query_id,
            now=row.now,
            inputs=inputs,
            outputs=outputs,
            duration_ms=row.duration_ms,
            trace=decode_text(row.trace),
            logged_at=row.logged_at,
            values={**_logged_values(row.values, inputs, row.now, nested), **outputs},
            model_calls=calls.get("models", []),
            llm_calls=calls.get("llm", []),
            plan=row.plan,
        )
    except (CorruptValue, TypeError, KeyError, AttributeError, ValueError) as exc:
        raise QueryLogError(
            f"query log record {row.query_id!r} cannot be decoded ({type(exc).__name__}: {exc})"
        ) from exc
