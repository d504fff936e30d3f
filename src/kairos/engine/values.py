"""Check and normalize feature values against their declared types.

Lenient where data sources are (SQLite's 0/1 for bool, ISO strings for datetimes, ints for
floats), strict where a mistake would silently change meaning (a string for an int).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from kairos.definitions.graph import FeatureInfo
from kairos.definitions.types import ValueType
from kairos.errors import InvalidValue


def to_utc(value: datetime) -> datetime:
    """The same instant in UTC (a naive time is taken to be UTC already)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidValue(
            f"{value.isoformat()} is outside the range of times kairos can handle in UTC"
        ) from None


def coerce(vt: ValueType, value: Any) -> Any:
    """The value in its canonical form, or InvalidValue naming what was expected."""
    if value is None:
        return None
    kind = vt.kind
    if kind == "any":
        return value
    if kind == "float":
        if isinstance(value, float):
            return value
        if isinstance(value, int | Decimal) and not isinstance(value, bool):
            return float(value)
    elif kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif kind == "str":
        if isinstance(value, str):
            return value
    elif kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
    elif kind == "datetime":
        if isinstance(value, datetime):
            return to_utc(value)
        if isinstance(value, str):
            try:
                return to_utc(datetime.fromisoformat(value))
            except ValueError:
                pass
    elif kind == "date":
        if isinstance(value, datetime):
            return value.date()
        if isinstance(value, date):
            return value
        if isinstance(value, str):
            try:
                return date.fromisoformat(value)
            except ValueError:
                pass
    elif kind == "timedelta":
        if isinstance(value, timedelta):
            return value
    elif kind == "list":
        if isinstance(value, list | tuple):
            item = vt.item or ValueType("any", True)
            return [coerce(item, v) for v in value]
    elif kind == "vector":
        return _vector(vt, value)
    elif kind == "dict" and isinstance(value, dict):
        return value
    raise InvalidValue(f"expected {vt}, got {type(value).__name__} {_short(value)}")


def _vector(vt: ValueType, value: Any) -> list[float]:
    """A list, tuple or numpy array of numbers of the vector's length, as a list of floats."""
    if hasattr(value, "tolist") and not isinstance(value, list | tuple):
        value = value.tolist()  # a numpy array (or a scalar, refused below)
    if not isinstance(value, list | tuple):
        raise InvalidValue(
            f"expected {vt} (a list of {vt.dimensions} floats), got {type(value).__name__} "
            f"{_short(value)}"
        )
    if len(value) != vt.dimensions:
        raise InvalidValue(f"expected {vt}: {vt.dimensions} floats, got {len(value)}")
    floats = []
    for index, item in enumerate(value):
        if isinstance(item, bool) or not isinstance(item, int | float | Decimal):
            raise InvalidValue(
                f"expected {vt}: item {index} is {type(item).__name__} {_short(item)}, not a number"
            )
        floats.append(float(item))
    return floats


def check(info: FeatureInfo, value: Any, *, allow_null: bool) -> Any:
    """Coerce to the feature's type and enforce nullability and min/max."""
    if value is None:
        if allow_null or info.type is None or info.type.nullable:
            return None
        raise InvalidValue(
            f"got None but {info.fqn} is not nullable; declare it `{info.type} | None`"
        )
    if info.type is None:
        return value
    value = coerce(info.type, value)
    if info.min is not None and value < info.min:
        raise InvalidValue(f"{_short(value)} is below the minimum {info.min!r}")
    if info.max is not None and value > info.max:
        raise InvalidValue(f"{_short(value)} is above the maximum {info.max!r}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
