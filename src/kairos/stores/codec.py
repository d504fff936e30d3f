"""Feature values to bytes and back, exactly: the type that went in is the type that comes out.

JSON (orjson) carries None, bool, int, float, str, lists and str-keyed dicts as themselves.
Everything JSON would blur is a one-key dict whose key starts with "$":

    datetime  {"$dt": "2026-01-10T12:00:00+00:00"}    date      {"$date": "2026-01-10"}
    timedelta {"$td": [days, seconds, microseconds]}  time      {"$time": "12:00:00"}
    nan, ±inf {"$float": "nan"}                       big int   {"$int": "123..."}
    tuple     {"$tuple": [...]}                       set       {"$set": [...]}
    frozenset {"$frozenset": [...]}                   bytes     {"$bytes": "<base64>"}
    Decimal   {"$decimal": "1.10"}
    a dict with a key starting with "$"               {"$dict": {...}}  (so it is not a tag)
    a dict with a key that is not a str               {"$items": [[key, value], ...]}
    rows (a has-many: 2+ dicts, same str keys)        {"$rows": [[names], [row 0], ...]}

A datetime keeps its UTC offset; one in a named zone (ZoneInfo) reads back with the fixed
offset it had. A subclass (an Enum mixin, pandas.Timestamp) reads back as its base type.

>>> decode(encode({"at": datetime(2026, 1, 10, tzinfo=UTC), "n": 1}))
{'at': datetime.datetime(2026, 1, 10, 0, 0, tzinfo=datetime.timezone.utc), 'n': 1}
"""

from __future__ import annotations

import base64
import math
from collections.abc import Callable, Hashable
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

import orjson

from kairos.errors import KairosError

__all__ = [
    "TAGGED_JSON",
    "CorruptValue",
    "UnencodableValue",
    "decode",
    "decode_text",
    "encode",
    "encode_key",
    "from_micros",
    "restore",
    "to_micros",
]

# The media type of this encoding over HTTP: a remote client asks for it (Accept) so that
# values read back as the types the server had.
TAGGED_JSON = "application/vnd.kairos.tagged+json"
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SCALARS = (str, bool, type(None))


class UnencodableValue(KairosError, TypeError):
    """A value of a type the online stores cannot keep exactly."""


class CorruptValue(KairosError, ValueError):
    """Stored bytes that are not something `encode` wrote."""


def encode(value: Any) -> bytes:
    """A feature value as bytes; `decode` gives back an equal value of the same type.

    >>> encode([1, "a", None])
    b'[1,"a",null]'
    """
    if type(value) in _SCALARS:  # the common case skips the walk
        return _dumps(value)
    try:
        tree = _to_json(value)
    except RecursionError:
        raise UnencodableValue(
            "cannot store a value nested this deeply (or containing itself)"
        ) from None
    return _dumps(tree)


def decode(data: bytes) -> Any:
    """The value `encode` was given.

    >>> decode(b'{"$td":[1,30,0]}')
    datetime.timedelta(days=1, seconds=30)
    """
    try:
        loaded = orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise CorruptValue(
            f"stored value {bytes(data[:40])!r} is not valid JSON: {error}"
        ) from None
    if type(loaded) is list or type(loaded) is dict:
        return _from_json(loaded)
    return loaded


def decode_text(text: str) -> Any:
    """`decode` of JSON text; text with no tag in it (no `"$`) is plain JSON and skips the
    walk that restores tagged values."""
    if '"$' in text:
        return decode(text.encode("utf-8"))
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise CorruptValue(f"stored value {text[:40]!r} is not valid JSON: {error}") from None


def restore(tree: Any) -> Any:
    """A value as `encode` was given it, from its parsed JSON (tags restored)."""
    if type(tree) is list or type(tree) is dict:
        return _from_json(tree)
    return tree


def encode_key(key: Hashable) -> str:
    """A primary key as text that keeps its type: 1 -> '1', "1" -> '"1"'.

    >>> encode_key("u1"), encode_key(1)
    ('"u1"', '1')
    """
    return encode(key).decode()


def to_micros(observed_at: datetime) -> int:
    """An aware datetime as whole microseconds since 1970-01-01 UTC (exact, sortable)."""
    if observed_at.tzinfo is None or observed_at.utcoffset() is None:
        raise UnencodableValue(
            f"observed_at {observed_at!r} has no timezone; pass an aware datetime "
            "(e.g. datetime.now(UTC))"
        )
    return (observed_at - _EPOCH) // timedelta(microseconds=1)


def from_micros(micros: int) -> datetime:
    """The UTC datetime `to_micros` was given."""
    return _EPOCH + timedelta(microseconds=micros)


# --- encoding ---------------------------------------------------------------------------------


def _dumps(tree: Any) -> bytes:
    try:
        return orjson.dumps(tree)
    except orjson.JSONEncodeError as error:
        raise UnencodableValue(f"cannot store value: {error}") from None


def _to_json(value: Any) -> Any:
    encoder = _ENCODERS.get(type(value))
    if encoder is None:
        encoder = _subclass_encoder(value)
    return encoder(value)


def _int(value: int) -> Any:
    value = int(value)  # an int subclass (IntEnum) is kept as its int
    return value if _INT64_MIN <= value <= _INT64_MAX else {"$int": str(value)}


def _float(value: float) -> Any:
    value = float(value)
    return value if math.isfinite(value) else {"$float": repr(value)}


def _datetime(value: datetime) -> Any:
    return {"$dt": datetime.isoformat(value)}


def _date(value: date) -> Any:
    return {"$date": date.isoformat(value)}


def _time(value: time) -> Any:
    return {"$time": time.isoformat(value)}


def _timedelta(value: timedelta) -> Any:
    return {"$td": [value.days, value.seconds, value.microseconds]}


def _list(value: list[Any]) -> Any:
    return [_to_json(item) for item in value]


def _rows(value: list[Any]) -> Any:
    """A list; a has-many's rows (dicts with the same str keys, in the same order) are kept
    as columns named once: `{"$rows": [[names...], [values of row 0...], ...]}`."""
    if len(value) > 1 and type(value[0]) is dict:
        names = list(value[0])
        if all(type(k) is str and not k.startswith("$") for k in names) and all(
            type(row) is dict and len(row) == len(names) and list(row) == names for row in value
        ):
            return {"$rows": [names, *([_to_json(v) for v in row.values()] for row in value)]}
    return [_to_json(item) for item in value]


def _dict(value: dict[Any, Any]) -> Any:
    if not all(type(k) is str for k in value):
        return {"$items": [[_to_json(k), _to_json(v)] for k, v in value.items()]}
    tree = {k: _to_json(v) for k, v in value.items()}
    return {"$dict": tree} if any(k.startswith("$") for k in value) else tree


_ENCODERS: dict[type, Callable[[Any], Any]] = {
    str: str.__str__,  # a str subclass (an Enum mixin) becomes its plain text
    bool: bool,
    type(None): lambda value: None,
    int: _int,
    float: _float,
    datetime: _datetime,
    date: _date,
    time: _time,
    timedelta: _timedelta,
    list: _rows,
    dict: _dict,
    tuple: lambda value: {"$tuple": _list(value)},
    set: lambda value: {"$set": _list(value)},
    frozenset: lambda value: {"$frozenset": _list(value)},
    bytes: lambda value: {"$bytes": base64.b64encode(value).decode()},
    Decimal: lambda value: {"$decimal": str(value)},
}


def _subclass_encoder(value: Any) -> Callable[[Any], Any]:
    # A subclass (StrEnum, IntEnum, pandas.Timestamp, a float subclass) is kept as its base type.
    # datetime before date and bool before int: each is a subclass of the other.
    for base in (bool, str, int, float, datetime, date, time, timedelta, list, dict, tuple):
        if isinstance(value, base):
            return _ENCODERS[base]
    raise UnencodableValue(
        f"cannot store a value of type {type(value).__name__!r} ({value!r:.60}); online stores "
        "keep None, bool, int, float, str, datetime, date, time, timedelta, Decimal, bytes "
        "and lists, tuples, sets and dicts of those"
    )


# --- decoding ---------------------------------------------------------------------------------


def _from_json(tree: Any) -> Any:
    kind = type(tree)
    if kind is list:
        return [_from_json(item) for item in tree]
    if kind is not dict:
        return tree
    if len(tree) == 1:
        ((tag, body),) = tree.items()
        if tag.startswith("$"):
            restore = _DECODERS.get(tag)
            if restore is None:
                raise CorruptValue(f"stored value has unknown tag {tag!r}")
            try:
                return restore(body)
            except (TypeError, ValueError, ArithmeticError, AttributeError, LookupError) as error:
                raise CorruptValue(
                    f"stored {tag!r} value {body!r:.60} is invalid: {error}"
                ) from None
    return {k: _from_json(v) for k, v in tree.items()}


def _restore_float(body: str) -> float:
    if body not in ("nan", "inf", "-inf"):
        raise ValueError("expected 'nan', 'inf' or '-inf'")
    return float(body)


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "$dt": datetime.fromisoformat,
    "$date": date.fromisoformat,
    "$time": time.fromisoformat,
    "$td": lambda body: timedelta(days=body[0], seconds=body[1], microseconds=body[2]),
    "$float": _restore_float,
    "$int": int,
    "$tuple": lambda body: tuple(_from_json(item) for item in body),
    "$set": lambda body: {_from_json(item) for item in body},
    "$frozenset": lambda body: frozenset(_from_json(item) for item in body),
    "$bytes": lambda body: base64.b64decode(body, validate=True),
    "$decimal": Decimal,
    "$dict": lambda body: {k: _from_json(v) for k, v in body.items()},
    "$items": lambda body: {_from_json(k): _from_json(v) for k, v in body},
    "$rows": lambda body: [
        dict(zip(body[0], map(_from_json, row), strict=True)) for row in body[1:]
    ],
}
