"""Where the gateway keeps its counters and its keys and ledger, by URL: each backend is
picked by the scheme (parsed once, by kairos.backends), and none connects before first use.

>>> counters_from_url("sqlite:///.kairos/gateway.db")
<kairos.gateway.store.counters_sqlite.SQLiteCounters object at ...>
"""

from __future__ import annotations

from collections.abc import Callable

from kairos.backends import URL, connect, parse
from kairos.gateway.accounting.counters import Counters
from kairos.gateway.errors import GatewayConfigError
from kairos.gateway.store.counters_postgres import PostgresCounters
from kairos.gateway.store.counters_redis import RedisCounters
from kairos.gateway.store.counters_sqlite import SQLiteCounters
from kairos.gateway.store.registry import Registry
from kairos.gateway.store.registry_postgres import PostgresRegistry
from kairos.gateway.store.registry_sqlite import SQLiteRegistry


def counters_from_url(url: str) -> Counters:
    """The counters backend a URL names; no I/O until first use."""
    parsed = parse(url)
    unknown = _refusal(url, "counters", "sqlite:///, postgresql:// or redis://")
    if not _written_out(parsed):
        raise unknown(parsed)
    openers: dict[str, Callable[[URL], Counters]] = {
        "sqlite": lambda parsed: SQLiteCounters(parsed.file_path()),
        "postgresql": lambda parsed: PostgresCounters(url),
        "redis": lambda parsed: RedisCounters(url),
    }
    return connect(parsed, openers, unknown=unknown)


def registry_from_url(url: str) -> Registry:
    """The registry a URL names; no I/O until first use."""
    parsed = parse(url)
    unknown = _refusal(url, "registry", "sqlite:/// or postgresql://")
    if not _written_out(parsed):
        raise unknown(parsed)
    openers: dict[str, Callable[[URL], Registry]] = {
        "sqlite": lambda parsed: SQLiteRegistry(parsed.file_path()),
        "postgresql": lambda parsed: PostgresRegistry(url),
    }
    return connect(parsed, openers, unknown=unknown)


def _refusal(url: str, what: str, schemes: str) -> Callable[[URL], GatewayConfigError]:
    return lambda parsed: GatewayConfigError(
        f"gateway {what} URL must start with {schemes}, got scheme {url.partition(':')[0]!r}"
    )


def _written_out(url: URL) -> bool:
    """`scheme://...`, and `sqlite:///path` for a file (the forms the gateway has taken)."""
    return url.authority and (url.family != "sqlite" or url.rest.startswith("/"))
