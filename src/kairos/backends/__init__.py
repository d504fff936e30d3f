"""Storage under kairos: URLs read and their secrets hidden once (url.py), SQLite off the
event loop (sqlite.py, threads.py), PostgreSQL connections and pools (postgres.py). Every
store, log, source and registry above opens what its URL names through `connect`, and a
backend that fails raises `BackendUnavailable` (or a subclass naming the store).

`connect` is ibis' `connect(url)`: the URL is parsed once, its scheme normalised
(`postgres` and `postgresql` alike, any case), and it is handed to the opener of its scheme.

>>> store = connect("sqlite:///.kairos/online.db", {"sqlite": open_sqlite},
...                 unknown=lambda url: KairosError(f"no store for {redact(url.text)!r}"))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from kairos.backends.url import URL, parse, redact
from kairos.errors import BackendUnavailable

__all__ = ["URL", "BackendUnavailable", "connect", "parse", "redact"]

T = TypeVar("T")


def connect(
    url: str | URL,
    openers: Mapping[str, Callable[[URL], T]],
    *,
    unknown: Callable[[URL], Exception],
) -> T:
    """Hand `url`, parsed (unless it is already), to the opener of its scheme's family (keys:
    `sqlite`, `duckdb`, `postgresql`, `redis`, `memory`, ...); `unknown(url)` is raised for
    any other scheme. No I/O happens here: the opener decides when to connect."""
    parsed = parse(url) if isinstance(url, str) else url
    opener = openers.get(parsed.family)
    if opener is None:
        raise unknown(parsed)
    return opener(parsed)
