"""Charts as SVG geometry: the numbers become rectangles and points here, the templates
(`charts.html`) draw them. Drawn on the server, so a chart needs no script (the CSP forbids
every one) and a page is one response."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

WIDTH = 720  # the viewBox width every chart is drawn in (the browser scales it)


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    value: float
    text: str  # the value as shown
    y: float
    width: float
    kind: str = "bar"


@dataclass(frozen=True, slots=True)
class Bars:
    bars: tuple[Bar, ...]
    height: float
    left: float  # where bars start (after the labels)
    limit_x: float | None = None  # a limit drawn as a dashed line (a budget, a max_staleness)


def bars(
    items: Sequence[tuple[str, float, str]],
    *,
    limit: float | None = None,
    row: float = 22,
    left: float = 220,
    kinds: Sequence[str] | None = None,
    right: float = 10,
) -> Bars:
    """Horizontal bars, one per (label, value, text), scaled to the largest value (or limit);
    `right` is the room kept after the longest bar (for its text).

    >>> chart = bars([("a", 1.0, "1"), ("b", 2.0, "2")])
    >>> [round(b.width) for b in chart.bars]
    [240, 480]
    """
    top = max([v for _, v, _ in items if math.isfinite(v)] + [limit or 0.0, 1e-12])
    span = WIDTH - left - right
    drawn = tuple(
        Bar(label, value, text, i * row, max(0.0, value / top * span * 0.98) if value else 0.0,
            kinds[i] if kinds else "bar")
        for i, (label, value, text) in enumerate(items)
    )  # fmt: skip
    limit_x = None if limit is None else left + limit / top * span * 0.98
    return Bars(drawn, max(row, len(items) * row), left, limit_x)


@dataclass(frozen=True, slots=True)
class Series:
    points: str  # an SVG polyline's points
    height: float
    top: str  # the largest value, as shown
    first: str  # the first and last x labels
    last: str


def series(values: Sequence[float], *, top_text: str, first: str, last: str) -> Series:
    """A line over evenly spaced values (a time series' buckets), from 0 to the largest.

    >>> series([0, 1, 2], top_text="2", first="a", last="b").points
    '40.0,150.0 380.0,80.0 720.0,10.0'
    """
    height = 160.0
    top = max([*values, 1e-12])
    step = (WIDTH - 40) / max(1, len(values) - 1)
    points = " ".join(
        f"{40 + i * step:.1f},{height - 10 - v / top * (height - 20):.1f}"
        for i, v in enumerate(values)
    )
    return Series(points, height, top_text, first, last)


@dataclass(frozen=True, slots=True)
class Span:
    label: str
    kind: str
    x: float
    width: float
    y: float
    text: str


@dataclass(frozen=True, slots=True)
class Waterfall:
    spans: tuple[Span, ...]
    height: float
    left: float
    total: str


def waterfall(
    items: Sequence[tuple[str, str, float, float]], *, left: float = 240, row: float = 20
) -> Waterfall:
    """A trace as a waterfall: (label, kind, start_ms, duration_ms) per span, on one time axis.

    >>> w = waterfall([("sql", "sql", 0.0, 2.0), ("model", "model", 2.0, 2.0)])
    >>> [(round(s.x), round(s.width)) for s in w.spans]
    [(240, 230), (470, 230)]
    """
    end = max([start + duration for _, _, start, duration in items] + [1e-9])
    span = WIDTH - left - 10
    drawn = tuple(
        Span(label, kind, left + start / end * span * 0.98,
             max(1.0, duration / end * span * 0.98), i * row, f"{duration:.3f} ms")
        for i, (label, kind, start, duration) in enumerate(items)
    )  # fmt: skip
    return Waterfall(drawn, max(row, len(items) * row), left, f"{end:.3f} ms")
