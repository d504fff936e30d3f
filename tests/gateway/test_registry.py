"""Keys and the ledger on SQLite and PostgreSQL: one test body for both."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from kairos.gateway import Gateway
from kairos.gateway.accounting.ledger import LedgerRow, summarize
from kairos.gateway.keys import Budget, new_key
from kairos.gateway.store import registry_from_url
from tests.gateway.conftest import (
    PG_URL,
    REDIS_URL,
    config,
    drop_postgres,
    drop_redis,
    postgres_available,
    redis_available,
)
from tests.gateway.fake_upstream import FakeUpstream


def row(key_id: str, at: datetime, cost: int, model: str = "chat") -> LedgerRow:
    return LedgerRow(
        request_id=uuid.uuid4().hex, key_id=key_id, route="chat", model_requested=model,
        model_dispatched=model, provider="fake", deployment="echo", tokens_in=10,
        tokens_out=5, cost_micros=cost, price_version="v1", ttft_ms=1.5, latency_ms=2.0,
        status="ok", attempts=1, created_at=at,
    )  # fmt: skip


def test_keys_and_ledger_round_trip(registry_url: str) -> None:
    now = datetime.now(UTC).replace(microsecond=0)

    async def scenario() -> None:
        registry = registry_from_url(registry_url)
        try:
            _, record = new_key(
                "pepper", name="k", models=("chat",), rpm=5,
                budgets=(Budget("day", 1_000, None), Budget("total", None, 50)),
                expires_at=now + timedelta(days=1),
            )  # fmt: skip
            await registry.put_key(record)
            assert await registry.get_key(record.id) == record
            assert await registry.get_key("000000000000") is None
            assert await registry.revoke_key(record.id, now)
            assert not await registry.revoke_key(record.id, now)  # already revoked
            [listed] = await registry.list_keys()
            assert listed.revoked_at == now and listed.budgets == record.budgets
            first = row(record.id, now - timedelta(days=2), 7)
            rows = [first, row(record.id, now, 11), row("other", now, 13)]
            await registry.write_rows(rows)
            await registry.write_rows([first])  # a row written twice is kept once
            assert await registry.read_rows(record.id, None, None) == rows[:2]
            recent = await registry.read_rows(None, now - timedelta(hours=1), None)
            assert {r.key_id for r in recent} == {record.id, "other"}
            assert summarize(recent)["cost_micros"] == 24
            assert await registry.read_rows(None, None, now - timedelta(days=1)) == [first]
        finally:
            await registry.close()

    asyncio.run(scenario())


def test_a_key_changed_in_place_keeps_its_id_and_what_its_budgets_used(
    registry_url: str, upstream: FakeUpstream, tmp_path: Path
) -> None:
    async def scenario() -> None:
        gateway = Gateway(config(upstream, tmp_path, registry=registry_url))
        try:
            plain, record = await gateway.create_key(
                name="features", models=["chat"], budgets=[{"period": "total", "tokens": 100}]
            )
            held = await gateway.counters.spent([f"{record.id}:tokens:total:all"])
            updated = await gateway.update_key(
                record.id, models=["chat", "big"], budgets=[{"period": "day", "tokens": 500}]
            )
            assert updated is not None and updated.id == record.id
            assert updated.models == ("chat", "big")
            assert [(b.period, b.tokens) for b in updated.budgets] == [("day", 500)]
            assert await gateway.registry.get_key(record.id) == updated
            assert (await gateway.authenticate(plain)).models == ("chat", "big")  # no stale cache
            assert await gateway.counters.spent([f"{record.id}:tokens:total:all"]) == held
            assert await gateway.revoke_key(record.id)
            assert await gateway.update_key(record.id, models=["chat"]) is None  # revoked stays
        finally:
            await gateway.close()

    asyncio.run(scenario())


def test_production_set_up_postgres_registry_and_redis_counters(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    if not (postgres_available() and redis_available()):
        pytest.skip("needs PostgreSQL and Redis")
    prefix = f"gwtest_{uuid.uuid4().hex[:12]}"
    gateway_config = config(
        upstream,
        tmp_path,
        registry=f"{PG_URL}?prefix={prefix}",
        counters=f"{REDIS_URL}?prefix={prefix}",
    )

    async def scenario() -> tuple[int, list[LedgerRow]]:
        gateway = Gateway(gateway_config)
        try:
            plain, key = await gateway.create_key(
                name="prod", budgets=[{"period": "month", "usd_micros": 100}]
            )
            body = {"model": "chat", "messages": [{"role": "user", "content": "x"}]}
            await gateway.chat(plain, {**body, "max_tokens": 3})
            await gateway.drain()
            [spent] = await gateway.counters.spent(
                [f"{key.id}:usd:month:{datetime.now(UTC):%Y-%m}"]
            )
            return spent, await gateway.usage(key.id)
        finally:
            await gateway.close()

    try:
        spent, rows = asyncio.run(scenario())
    finally:
        drop_postgres(prefix)
        drop_redis(prefix)
    assert spent == 13 and [r.cost_micros for r in rows] == [13]


def test_an_older_sqlite_ledger_gets_the_usage_index_the_dashboard_reads(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # a ledger as an older kairos made it
        db.executescript(
            "create table gateway_ledger (request_id text primary key, key_id text not null, "
            "route text not null, model_requested text not null, model_dispatched text, "
            "provider text, deployment text, tokens_in integer not null, tokens_out integer "
            "not null, cost_micros integer not null, price_version text not null, ttft_ms real, "
            "latency_ms real not null, status text not null, attempts integer not null, "
            "created_at integer not null);"
            "create index gateway_ledger_key_time on gateway_ledger (key_id, created_at);"
        )
    registry = registry_from_url(f"sqlite:///{path}")
    asyncio.run(registry.list_keys())  # opening it upgrades the file
    asyncio.run(registry.close())
    with sqlite3.connect(path) as db:
        indexes = {row[1] for row in db.execute("pragma index_list(gateway_ledger)")}
        plan = " ".join(
            str(row[3])
            for row in db.execute(
                "explain query plan select key_id, status, sum(cost_micros), sum(tokens_in), "
                "sum(tokens_out), sum(attempts), max(ttft_ms), "
                "coalesce(model_dispatched, model_requested) from gateway_ledger "
                "where key_id = ? and created_at >= ? group by 1, 2",
                ("k", 0),
            )
        )
    assert "gateway_ledger_usage" in indexes and "gateway_ledger_key_time" not in indexes
    assert "COVERING INDEX gateway_ledger_usage" in plan, plan
