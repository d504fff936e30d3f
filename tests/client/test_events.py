"""Events written to kairos are kept: in the offline store (DuckDB file or PostgreSQL) before
the write is acknowledged, read back by a new client, deduplicated by id (a retried delivery
counts once, a corrected event replaces the old one), and checked against brute force."""

import random
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

import kairos as kr
from kairos.errors import InvalidInput
from tests.conftest import POSTGRES_URL, need_postgres
from tests.engine.test_windows import WINDOWED, Account, Payment, brute, events, same

T0 = datetime(2026, 5, 1, tzinfo=UTC)


@pytest.fixture(params=["duckdb", "postgres"])
def offline_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "duckdb":
        yield f"duckdb:///{tmp_path / 'offline.duckdb'}"
        return
    need_postgres()
    schema = f"events_{uuid.uuid4().hex[:10]}"
    yield f"{POSTGRES_URL}?schema={schema}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(
            sql.SQL("drop schema if exists {} cascade").format(sql.Identifier(schema))
        )


def client_on(offline_url: str) -> kr.Client:
    return kr.Client(definitions=[Payment, Account], offline_store=offline_url, query_log="none://")


def values_at(client: kr.Client, account: str, now: datetime) -> dict[str, Any]:
    result = client.query({"account.id": account}, WINDOWED, now=now)
    assert not result.errors
    return {name: result.get_value(name) for name in WINDOWED}


def test_a_new_client_answers_from_the_events_an_old_one_was_sent(offline_url: str) -> None:
    rows = events(11, 300)
    with client_on(offline_url) as first:
        for start in range(0, len(rows), 100):
            assert first.write_events(Payment, rows[start : start + 100]) == 100
    now = T0 + timedelta(days=25)
    with client_on(offline_url) as second:
        for account in ("a1", "a2", "a3"):
            got, expected = values_at(second, account, now), brute(rows, account, now)
            assert all(same(got[n], expected[n]) for n in WINDOWED), account
        # stored as features too: the payment's amount as of a time, read offline
        offline = second.offline_query(
            {"payment.id": [rows[0]["id"]], "ts": [rows[0]["at"]]},
            [Payment.amount],
            recompute=False,
        )
        assert offline.column("payment.amount") == [rows[0]["amount"]]


def test_a_retried_event_counts_once_and_a_corrected_one_replaces_it(offline_url: str) -> None:
    rows = events(12, 120)
    now = T0 + timedelta(days=41)
    with client_on(offline_url) as client:
        client.write_events(Payment, rows)
        before = {a: values_at(client, a, now) for a in ("a1", "a2", "a3")}
        client.write_events(Payment, random.Random(0).sample(rows, 40))  # redelivered
        assert {a: values_at(client, a, now) for a in ("a1", "a2", "a3")} == before
        # a correction: another amount, account and time under an id already written
        corrected = {**rows[5], "amount": 12345.0, "account_id": "a9", "at": T0}
        client.write_events(Payment, [corrected])
        fixed = [corrected if r["id"] == corrected["id"] else r for r in rows]
        for account in ("a1", "a2", "a3", "a9"):
            got, expected = values_at(client, account, now), brute(fixed, account, now)
            assert all(same(got[n], expected[n]) for n in WINDOWED), account
    with client_on(offline_url) as reopened:  # the store agrees after a restart
        for account in ("a1", "a2", "a3", "a9"):
            got, expected = values_at(reopened, account, now), brute(fixed, account, now)
            assert all(same(got[n], expected[n]) for n in WINDOWED), account


def test_the_last_of_one_id_in_a_batch_wins(offline_url: str) -> None:
    first = {"id": "p1", "account_id": "a1", "amount": 1.0, "kind": "card", "at": T0}
    second = {**first, "amount": 2.0}
    now = T0 + timedelta(minutes=1)
    with client_on(offline_url) as client:
        assert client.write_events(Payment, [first, second]) == 1
        assert client.query({"account.id": "a1"}, ["account.total[1d]"], now=now).get_value(
            "account.total[1d]"
        ) == pytest.approx(2.0)
    with client_on(offline_url) as reopened:
        assert reopened.query({"account.id": "a1"}, ["account.total[1d]"], now=now).get_value(
            "account.total[1d]"
        ) == pytest.approx(2.0)


def test_an_event_without_an_id_is_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'offline.duckdb'}"
    good = {"id": "p1", "account_id": "a1", "amount": 1.0, "kind": "card", "at": T0}
    with client_on(url) as client, pytest.raises(InvalidInput, match="event 1 has no 'id'"):
        client.write_events(Payment, [good, {**good, "id": None}])
    with client_on(url) as reopened:
        result = reopened.query({"account.id": "a1"}, ["account.count[1d]"], now=T0)
        assert result.get_value("account.count[1d]") == 0


BAD_IDS = [("", "blank"), ("   ", "blank"), ("e" * 257, "257 characters"),
           ("e" * 100_000, "100000 characters")]  # fmt: skip


@pytest.mark.parametrize(("bad", "said"), BAD_IDS)
def test_an_event_id_blank_or_past_256_characters_is_refused_naming_it(
    tmp_path: Path, bad: str, said: str
) -> None:
    url = f"duckdb:///{tmp_path / 'offline.duckdb'}"
    good = {"id": "p1", "account_id": "a1", "amount": 1.0, "kind": "card", "at": T0}
    with client_on(url) as client:
        with pytest.raises(InvalidInput, match=f"event 1: id .*{said}.*at most 256") as raised:
            client.write_events(Payment, [good, {**good, "id": bad}])
        assert raised.value.field == "id"
        assert len(str(raised.value)) < 300  # a 100 KB id is not repeated back
        assert client.write_events(Payment, [{**good, "id": "e" * 256}]) == 1  # the most
    with client_on(url) as reopened:  # nothing of the refused batch was kept
        result = reopened.query({"account.id": "a1"}, ["account.count[1d]"], now=T0)
        assert result.get_value("account.count[1d]") == 1


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_post_events_refuses_a_bad_id_with_a_4xx_naming_the_field(
    tmp_path: Path, anyio_backend: str
) -> None:
    import httpx

    from kairos.server import create_app

    row = {"id": "h1", "account_id": "a7", "amount": 3.5, "kind": "card", "at": T0.isoformat()}
    with client_on(f"duckdb:///{tmp_path / 'offline.duckdb'}") as client:
        transport = httpx.ASGITransport(app=create_app(client))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            for bad, _ in BAD_IDS:
                response = await http.post(
                    "/v1/events/payment", json={"rows": [{**row, "id": bad}]}
                )
                assert response.status_code == 422, response.text[:300]
                error = response.json()["error"]
                assert error["field"] == "id" and "at most 256" in error["message"]
            kept = await http.post("/v1/events/payment", json={"rows": [row]})
            assert kept.json() == {"written": 1}
