"""What the query log keeps: the records, and how they are encoded for storage.

Values are stored with `kairos.stores.codec` (tagged JSON: `{"$dt": "2026-..."}` for a
datetime), so every feature value reads back as the same type, has-many rows included. A
value of a type the codec cannot keep is stored as its `repr` string, so the record is kept
rather than lost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from kairos.errors import BackendUnavailable
from kairos.stores.codec import CorruptValue, UnencodableValue, decode, encode


class QueryLogError(BackendUnavailable):
    """The query log could not be opened, written or read."""


@dataclass(frozen=True, slots=True)
class LoggedValue:
    """One output of a logged query: the value served and where it came from."""

    value: Any
    observed_at: datetime | None
    source: str | None  # "cache", "resolver:<name>", "model:<name>", ...
    version: str | None  # resolver/model/prompt version that made the value
    error_code: str | None
    error_message: str | None

    def to_dict(self) -> dict[str, Any]:
        """The output as stored and as `GET /v1/log/{query_id}` shows it.

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
        }


@dataclass(frozen=True, slots=True)
class LoggedQuery:
    """Everything a decision saw. `append` encodes it at once, so later changes to the
    values (by the caller holding the query's result) do not reach the log."""

    query_id: str
    now: datetime
    inputs: dict[str, Any]
    outputs: dict[str, LoggedValue]
    duration_ms: float
    trace: list[dict[str, Any]]
    logged_at: datetime

    def to_dict(self) -> dict[str, Any]:
        """The record as `GET /v1/log/{query_id}` shows it (Python values: datetimes stay)."""
        return {
            "query_id": self.query_id,
            "now": self.now,
            "inputs": self.inputs,
            "outputs": {name: value.to_dict() for name, value in self.outputs.items()},
            "duration_ms": self.duration_ms,
            "trace": self.trace,
            "logged_at": self.logged_at,
        }


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
    """A record as stored: codec JSON text for the structured columns."""

    query_id: str
    now: datetime
    inputs: str
    outputs: str
    trace: str
    duration_ms: float
    logged_at: datetime


def _encode_record(record: LoggedQuery, unkept: set[str]) -> _Row:
    if not isinstance(record.query_id, str) or not record.query_id or "\x00" in record.query_id:
        raise TypeError(f"query_id must be a non-empty str without NUL, got {record.query_id!r}")
    for name in ("now", "logged_at"):
        if not isinstance(getattr(record, name), datetime):
            raise TypeError(f"{name} must be a datetime, got {getattr(record, name)!r}")
    # The same JSON the codec writes for the whole dict, built from its known layout: only
    # each value goes through the codec (a Fragment), which is several times faster.
    times: dict[datetime, Any] = {}  # most values share one observed_at: format it once
    outputs = {
        name: {
            "value": out.value
            if _plain(out.value)
            else orjson.Fragment(_encode_kept(out.value, unkept)),
            "observed_at": None
            if out.observed_at is None
            else times.get(out.observed_at)
            or times.setdefault(out.observed_at, _tagged_time(out.observed_at)),
            "source": out.source,
            "version": out.version,
            "error_code": out.error_code,
            "error_message": out.error_message,
        }
        for name, out in record.outputs.items()
        if isinstance(name, str) and not name.startswith("$")
    }
    if len(outputs) != len(record.outputs):  # an odd name: let the codec handle all of it
        encoded_outputs = _encode_kept(_plain_outputs(record), unkept)
    else:
        encoded_outputs = orjson.dumps(outputs).decode("utf-8")
    return _Row(
        query_id=record.query_id,
        now=record.now,
        inputs=_encode_kept(record.inputs, unkept),
        outputs=encoded_outputs,
        trace=_encode_trace(record.trace, unkept),
        duration_ms=float(record.duration_ms),
        logged_at=record.logged_at,
    )


def _tagged_time(value: datetime) -> Any:
    """What the codec writes for a datetime."""
    return {"$dt": value.isoformat()}


def _plain_outputs(record: LoggedQuery) -> dict[str, Any]:
    return {name: out.to_dict() for name, out in record.outputs.items()}


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


def _decode_record(row: _Row) -> LoggedQuery:
    try:
        outputs = {
            name: LoggedValue(
                value=out["value"],
                observed_at=out["observed_at"],
                source=out["source"],
                version=out["version"],
                error_code=out["error_code"],
                error_message=out["error_message"],
            )
            for name, out in decode(row.outputs.encode("utf-8")).items()
        }
        return LoggedQuery(
            query_id=row.query_id,
            now=row.now,
            inputs=decode(row.inputs.encode("utf-8")),
            outputs=outputs,
            duration_ms=row.duration_ms,
            trace=decode(row.trace.encode("utf-8")),
            logged_at=row.logged_at,
        )
    except (CorruptValue, TypeError, KeyError, AttributeError) as exc:
        raise QueryLogError(
            f"query log record {row.query_id!r} cannot be decoded ({type(exc).__name__}: {exc})"
        ) from exc
