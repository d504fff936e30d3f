"""What the server answered lately, for the Live page: each request's endpoint, status and
latency, and each query's cache hits, kept for the last `window` seconds in memory (bounded).
Prometheus keeps the totals; this keeps what a person looking at the server now wants: the
last minutes' rate and percentiles."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Traffic:
    """Recent requests and cache lookups of one server process.

    >>> traffic = Traffic()
    >>> traffic.observe_request("query_online", 200, 0.004)
    >>> len(traffic.requests)
    1
    """

    window: float = 300.0  # seconds kept
    most: int = 100_000  # entries kept at most (a busy server keeps the newest)
    requests: deque[tuple[float, str, int, float]] = field(init=False)
    lookups: deque[tuple[float, int, int]] = field(init=False)
    started: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.requests = deque(maxlen=self.most)
        self.lookups = deque(maxlen=self.most)

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.append((time.time(), endpoint, status, seconds))

    def observe_query(self, cache_hits: int, computed: int) -> None:
        """One query's features served from the cache and computed."""
        self.lookups.append((time.time(), cache_hits, computed))
