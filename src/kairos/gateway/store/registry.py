"""Where keys and the ledger live: SQLite by default, PostgreSQL in production.

The registry also knows which gateway processes are alive: each one `attach`es before its
first call (it holds a lock that the operating system or the database lets go of when the
process dies, however it dies), so a gateway that starts can tell the calls of a dead process
from those of a live one and recover only the former (accounting/recovery.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

import orjson

from kairos.gateway.accounting.ledger import LedgerRow
from kairos.gateway.keys import Budget, KeyRecord


class Registry(Protocol):
    async def put_key(self, record: KeyRecord) -> None: ...

    async def get_key(self, key_id: str) -> KeyRecord | None: ...

    async def list_keys(self) -> list[KeyRecord]: ...

    async def revoke_key(self, key_id: str, at: datetime) -> bool: ...

    async def update_key(
        self, key_id: str, models: tuple[str, ...], budgets: tuple[Budget, ...]
    ) -> bool:
        """Give an active key another allow-list and budgets; its id, and so what its
        counters hold, stays. False when no active key has that id."""

    async def write_rows(self, rows: Sequence[LedgerRow]) -> None:
        """Insert rows, each replacing the row of its request_id (a pending one) if any."""
        ...

    async def read_rows(
        self, key_id: str | None, since: datetime | None, until: datetime | None
    ) -> list[LedgerRow]: ...

    async def attach(self, process: str) -> None:
        """Mark `process` (the id prefix of its requests and holds) alive until it exits or
        detaches as often as it attached."""
        ...

    async def detach(self, process: str) -> None:
        """Drop this process's mark, once it left nothing to recover (a clean close)."""
        ...

    async def dead_processes(self) -> list[str]:
        """Processes that attached and are gone (not this one), not yet forgotten."""
        ...

    async def process_rows(self, process: str, since: datetime) -> list[LedgerRow]:
        """A process's rows: every pending one, and the rest created since `since`."""
        ...

    async def forget(self, process: str) -> None:
        """Drop a dead process's mark once its calls are recovered."""
        ...

    async def close(self) -> None: ...


KEY_COLUMNS = "id, name, secret_hash, created_at, models, rpm, tpm, budgets, expires_at, revoked_at"
LEDGER_COLUMNS = (
    "request_id, key_id, route, model_requested, model_dispatched, provider, deployment, "
    "tokens_in, tokens_out, cost_micros, price_version, ttft_ms, latency_ms, status, attempts, "
    "created_at, tokens_cached, tokens_cache_write, uncharged_micros, hold_id"
)
# columns added after the first release, with their SQL type: added to an existing table on
# start (`alter table ... add column`), 0 in rows written before them
# What the dashboard sums per key and model group: an index holding these next to (key_id,
# created_at) answers its reads of a day's calls without touching the table (~2x faster).
USAGE_COLUMNS = (
    "model_dispatched, model_requested, status, attempts, tokens_in, tokens_out, cost_micros, "
    "ttft_ms"
)
LEDGER_ADDED = {
    "tokens_cached": "bigint not null default 0",
    "tokens_cache_write": "bigint not null default 0",
    "uncharged_micros": "bigint not null default 0",
    "hold_id": "text",
}
_CREATED = [name.strip() for name in LEDGER_COLUMNS.split(",")].index("created_at")


def key_lists(models: tuple[str, ...], budgets: tuple[Budget, ...]) -> tuple[str, str]:
    """A key's allow-list and budgets as the JSON text both stores keep."""
    listed = orjson.dumps([b.as_dict() for b in budgets]).decode()
    return orjson.dumps(list(models)).decode(), listed


def key_to_row(record: KeyRecord) -> tuple[object, ...]:
    """Times as epoch microseconds, lists as JSON text: the same row in SQLite and Postgres."""
    models, budgets = key_lists(record.models, record.budgets)
    return (
        record.id,
        record.name,
        record.secret_hash,
        to_micros(record.created_at),
        models,
        record.rpm,
        record.tpm,
        budgets,
        to_micros(record.expires_at) if record.expires_at else None,
        to_micros(record.revoked_at) if record.revoked_at else None,
    )


def key_from_row(row: Sequence[object]) -> KeyRecord:
    ident, name, secret_hash, created, models, rpm, tpm, budgets, expires, revoked = row
    return KeyRecord(
        id=str(ident),
        name=str(name),
        secret_hash=str(secret_hash),
        created_at=from_micros(int(created)),  # type: ignore[call-overload]
        models=tuple(orjson.loads(str(models))),
        rpm=rpm,  # type: ignore[arg-type]
        tpm=tpm,  # type: ignore[arg-type]
        budgets=tuple(
            Budget(b["period"], b["usd_micros"], b["tokens"]) for b in orjson.loads(str(budgets))
        ),
        expires_at=from_micros(int(expires)) if expires is not None else None,  # type: ignore[call-overload]
        revoked_at=from_micros(int(revoked)) if revoked is not None else None,  # type: ignore[call-overload]
    )


def ledger_to_row(row: LedgerRow) -> tuple[object, ...]:
    values = list(astuple_row(row))
    values[_CREATED] = to_micros(row.created_at)
    return tuple(values)


def astuple_row(row: LedgerRow) -> tuple[object, ...]:
    return tuple(getattr(row, name.strip()) for name in LEDGER_COLUMNS.split(","))


def ledger_from_row(values: Sequence[object]) -> LedgerRow:
    fields = list(values)
    fields[_CREATED] = from_micros(int(fields[_CREATED]))  # type: ignore[call-overload]
    return LedgerRow(*fields)  # type: ignore[arg-type]


def ledger_upsert() -> str:
    """The `on conflict` clause that lets a final row replace its pending one (SQLite and
    PostgreSQL spell it alike)."""
    names = [name.strip() for name in LEDGER_COLUMNS.split(",")][1:]  # all but request_id
    updates = ", ".join(f"{name} = excluded.{name}" for name in names)
    return f"on conflict (request_id) do update set {updates}"


def id_range(process: str) -> tuple[str, str]:
    """Bounds (low inclusive, high exclusive) of the ids that begin with a process's prefix
    (lower-case hex): a range over the primary key, not a scan."""
    return process, process + "g"


def to_micros(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000)


def from_micros(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / 1_000_000, UTC)
