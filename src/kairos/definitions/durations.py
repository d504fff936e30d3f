"""Durations as users write them: "30s", "5m", "1h30m", "7d", "1w", "infinity", or a timedelta."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from kairos.errors import DefinitionError

INFINITY = timedelta.max
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")

DurationLike = str | int | float | timedelta


def parse_duration(value: DurationLike, *, field: str = "duration") -> timedelta:
    """Parse a duration.

    >>> parse_duration("1h30m")
    datetime.timedelta(seconds=5400)
    """
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise DefinitionError(f"{field}={value!r} is not a duration; write e.g. '5m' or '1d'")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise DefinitionError(
                f"{field}={value!r} is not a finite number of seconds; write 'infinity' for "
                "no limit"
            )
        if value < 0:
            raise DefinitionError(f"{field}={value!r} is negative; durations are >= 0")
        return _seconds(value, field, value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("infinity", "inf", "forever"):
            return INFINITY
        if text and _PART.sub("", text) == "":
            seconds = sum(float(n) * _UNITS[u] for n, u in _PART.findall(text))
            return _seconds(seconds, field, value)
    raise DefinitionError(
        f"{field}={value!r} is not a duration; write e.g. '30s', '5m', '1h30m', '7d' or 'infinity'"
    )


def optional_duration(value: DurationLike | None, *, field: str) -> timedelta | None:
    """`parse_duration` for a setting that may be left out (None stays None)."""
    return None if value is None else parse_duration(value, field=field)


def format_duration(value: timedelta) -> str:
    """The shortest canonical spelling: 86400 s -> "1d", 5400 s -> "1h30m"."""
    if value == INFINITY:
        return "infinity"
    total_ms = round(value.total_seconds() * 1000)
    if total_ms == 0:
        return "0s"
    parts = []
    for unit, factor in (("d", 86400_000), ("h", 3600_000), ("m", 60_000), ("s", 1000)):
        count, total_ms = divmod(total_ms, factor)
        if count:
            parts.append(f"{count}{unit}")
    if total_ms:
        parts.append(f"{total_ms}ms")
    return "".join(parts)


def _seconds(seconds: float, field: str, written: object) -> timedelta:
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise DefinitionError(
            f"{field}={written!r} is longer than kairos can represent; write 'infinity' for "
            "no limit"
        ) from None
