"""What the server answered lately, for the Live page: each request's endpoint, status and
latency, and each query's cache hits, kept for the last `window` seconds in memory (bounded).
Prometheus keeps the totals; this keeps what a person looking at the server now wants: the
last minutes' rate and percentiles.

Each request is a few numbers in parallel deques (its time, endpoint, status, seconds),
so recording one costs four appends on the request's path, and a summary finds the window
by bisecting the times and reads the rest as arrays: a full Traffic (100k requests) is
summed up in milliseconds, not in a Python loop per request."""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np

MOST_ENDPOINTS = 1000  # names kept apart; any more are counted as "other"


@dataclass(frozen=True, slots=True)
class EndpointSummary:
    """One endpoint over the window: requests in the last minute and the whole window, their
    rates, latency percentiles (ms) over the window and the answers by status class."""

    endpoint: str
    last_minute: int
    last_window: int
    per_s_minute: float
    per_s_window: float
    p50_ms: float
    p99_ms: float
    by_class: dict[str, int]  # "2xx", "3xx", "4xx", "5xx" -> requests in the window

    @property
    def errors(self) -> int:
        return self.by_class.get("4xx", 0) + self.by_class.get("5xx", 0)


@dataclass(frozen=True, slots=True)
class CacheSummary:
    """The queries of the last minute and of the window (and their rates): the features
    they served from the cache vs computed; a ratio is None when no feature was served."""

    queries_minute: int
    queries_window: int
    per_s_minute: float
    per_s_window: float
    hits_minute: int
    computed_minute: int
    hits_window: int
    computed_window: int

    @property
    def ratio_minute(self) -> float | None:
        return _ratio(self.hits_minute, self.computed_minute)

    @property
    def ratio_window(self) -> float | None:
        return _ratio(self.hits_window, self.computed_window)


@dataclass
class Traffic:
    """Recent requests and cache lookups of one server process: the newest `most` of each.
    Times are `time.time()` seconds, in the order they were recorded.

    >>> traffic = Traffic()
    >>> traffic.observe_request("query_online", 200, 0.004)
    >>> traffic.requests
    1
    """

    window: float = 300.0  # seconds summed up
    most: int = 100_000  # entries kept at most (a busy server keeps the newest)
    started: float = field(default_factory=time.time)
    _times: deque[float] = field(init=False, repr=False)
    _codes: deque[int] = field(init=False, repr=False)
    _statuses: deque[int] = field(init=False, repr=False)
    _seconds: deque[float] = field(init=False, repr=False)
    _names: dict[str, int] = field(init=False, repr=False)
    _query_times: deque[float] = field(init=False, repr=False)
    _hits: deque[int] = field(init=False, repr=False)
    _computed: deque[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._times, self._codes = deque(maxlen=self.most), deque(maxlen=self.most)
        self._statuses, self._seconds = deque(maxlen=self.most), deque(maxlen=self.most)
        self._names = {}
        self._query_times = deque(maxlen=self.most)
        self._hits, self._computed = deque(maxlen=self.most), deque(maxlen=self.most)

    @property
    def requests(self) -> int:
        """Requests held."""
        return len(self._times)

    @property
    def queries(self) -> int:
        """Queries held."""
        return len(self._query_times)

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.add_request(time.time(), endpoint, status, seconds)

    def observe_query(self, cache_hits: int, computed: int) -> None:
        """One query's features served from the cache and computed."""
        self.add_query(time.time(), cache_hits, computed)

    def add_request(self, moment: float, endpoint: str, status: int, seconds: float) -> None:
        """A request answered at `moment` (a `time.time()`, not before the last one's)."""
        code = self._names.get(endpoint)
        if code is None:
            name = endpoint if len(self._names) < MOST_ENDPOINTS else "other"
            code = self._names.setdefault(name, len(self._names))
        self._times.append(moment)
        self._codes.append(code)
        self._statuses.append(status)
        self._seconds.append(seconds)

    def add_query(self, moment: float, cache_hits: int, computed: int) -> None:
        """A query answered at `moment` (a `time.time()`, not before the last one's)."""
        self._query_times.append(moment)
        self._hits.append(cache_hits)
        self._computed.append(computed)

    # --- what the Live page shows ------------------------------------------------------------

    def span(self, seconds: float, now: float | None = None, lookups: bool = False) -> float:
        """The seconds of the last `seconds` this holds every request (or query, `lookups`)
        of: shorter while the process is younger, or when the bound `most` let older go.

        >>> Traffic(started=100.0).span(60, now=130.0)
        30.0
        """
        now = time.time() if now is None else now
        times = self._query_times if lookups else self._times
        start = max(now - seconds, self.started)
        if len(times) == self.most:  # full: what is older was let go
            start = max(start, times[0])
        return max(now - start, 1e-9)

    def endpoints(self, now: float | None = None, minute: float = 60.0) -> list[EndpointSummary]:
        """Each endpoint's requests over the window, busiest first.

        >>> traffic = Traffic(started=0.0)
        >>> traffic.add_request(10.0, "log_get", 200, 0.002)
        >>> traffic.add_request(250.0, "log_get", 404, 0.004)
        >>> [(e.last_minute, e.last_window, e.p99_ms, e.by_class) for e in traffic.endpoints(300.0)]
        [(1, 2, 4.0, {'2xx': 1, '4xx': 1})]
        """
        now = time.time() if now is None else now
        times = self._times
        start = bisect_left(times, now - self.window)
        count = len(times) - start
        if not count:
            return []
        in_minute = count - (bisect_left(times, now - minute) - start)
        codes = _array(self._codes, start, count, np.int32)
        statuses = _array(self._statuses, start, count, np.int32) // 100
        seconds = _array(self._seconds, start, count, np.float64) * 1000
        recent = np.zeros(count, dtype=bool)
        recent[count - in_minute :] = True
        names = {code: name for name, code in self._names.items()}
        span_minute, span_window = self.span(minute, now), self.span(self.window, now)
        summaries = []
        for code in np.unique(codes).tolist():
            mask = codes == code
            latencies = np.sort(seconds[mask])
            classes = np.bincount(statuses[mask].clip(0, 9), minlength=10)
            minute_count = int(np.count_nonzero(recent & mask))
            summaries.append(
                EndpointSummary(
                    names[code],
                    minute_count,
                    len(latencies),
                    minute_count / span_minute,
                    len(latencies) / span_window,
                    float(percentile(latencies, 50)),
                    float(percentile(latencies, 99)),
                    {f"{k}xx": int(n) for k, n in enumerate(classes.tolist()) if n},
                )
            )
        summaries.sort(key=lambda s: (-s.last_window, s.endpoint))
        return summaries

    def cache(self, now: float | None = None, minute: float = 60.0) -> CacheSummary:
        """Cache hits vs computed features of the queries in the last minute and the window.

        >>> traffic = Traffic(started=0.0)
        >>> traffic.add_query(10.0, 0, 6)
        >>> traffic.add_query(250.0, 6, 0)
        >>> summary = traffic.cache(300.0)
        >>> summary.queries_window, summary.ratio_minute, summary.ratio_window
        (2, 1.0, 0.5)
        """
        now = time.time() if now is None else now
        times = self._query_times
        start, recent = bisect_left(times, now - self.window), bisect_left(times, now - minute)
        queries, queries_minute = len(times) - start, len(times) - recent
        hits = sum(islice(self._hits, start, None))
        computed = sum(islice(self._computed, start, None))
        hits_minute = sum(islice(self._hits, recent, None))
        computed_minute = sum(islice(self._computed, recent, None))
        return CacheSummary(
            queries_minute, queries,
            queries_minute / self.span(minute, now, lookups=True),
            queries / self.span(self.window, now, lookups=True),
            hits_minute, computed_minute, hits, computed,
        )  # fmt: skip

    def rate(self, now: float | None = None, bucket: float = 10.0) -> list[float]:
        """Queries per second in each `bucket` seconds of the window, oldest first.

        >>> traffic = Traffic(started=0.0)
        >>> for moment in (285.0, 295.0, 296.0):
        ...     traffic.add_query(moment, 1, 0)
        >>> traffic.rate(300.0, bucket=100.0)
        [0.0, 0.0, 0.03]
        """
        now = time.time() if now is None else now
        buckets = max(1, math.ceil(self.window / bucket))
        times = self._query_times
        edges = [bisect_left(times, now - (buckets - k) * bucket) for k in range(buckets)]
        edges.append(len(times))
        return [(edges[k + 1] - edges[k]) / bucket for k in range(buckets)]


def percentile(ordered: Sequence[float] | Any, q: float) -> float:
    """The `q`th percentile (nearest rank) of values sorted ascending; NaN when empty.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 50), percentile([1.0, 2.0, 3.0, 4.0], 99)
    (2.0, 4.0)
    """
    if not len(ordered):
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


def _array(values: deque[Any], start: int, count: int, dtype: Any) -> Any:
    return np.fromiter(islice(values, start, None), dtype=dtype, count=count)


def _ratio(hits: int, computed: int) -> float | None:
    total = hits + computed
    return hits / total if total else None
