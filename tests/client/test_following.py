"""Clients that share a DuckDB offline store (as the processes of `kairos serve --workers N`
do): events one writes are in the other's windows at its next query, a correction replaces the
event everywhere, and every answer equals brute force."""

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kairos as kr
from kairos.project.events import FollowingIndex
from tests.engine.test_windows import WINDOWED, Account, Payment, brute, events, same

T0 = datetime(2026, 5, 1, tzinfo=UTC)
NOW = T0 + timedelta(days=25)


def client_on(url: str) -> kr.Client:
    return kr.Client(definitions=[Payment, Account], offline_store=url, query_log="none://")


def assert_brute(client: kr.Client, rows: list[dict[str, Any]], accounts: tuple[str, ...]) -> None:
    for account in accounts:
        result = client.query({"account.id": account}, WINDOWED, now=NOW)
        assert not result.errors
        expected = brute(rows, account, NOW)
        for name in WINDOWED:
            assert same(result.get_value(name), expected[name]), (account, name)


def test_events_one_client_writes_are_in_the_others_windows_at_once(tmp_path: Path) -> None:
    url = f"duckdb:///{tmp_path / 'offline.duckdb'}"
    rows = events(21, 240)
    accounts = ("a1", "a2", "a3")
    with client_on(url) as writer, client_on(url) as reader:
        assert isinstance(reader.windows, FollowingIndex)
        assert_brute(reader, [], accounts)  # the reader has loaded: what follows is news
        written: list[dict[str, Any]] = []
        for start in range(0, len(rows), 60):
            writer.write_events(Payment, rows[start : start + 60])
            written += rows[start : start + 60]
            assert_brute(reader, written, accounts)
        # a correction under an id already written, and a redelivery, sent by the reader
        corrected = {**rows[3], "amount": 999.0, "account_id": "a2"}
        reader.write_events(Payment, [corrected, rows[10]])
        fixed = [corrected if r["id"] == corrected["id"] else r for r in written]
        assert_brute(writer, fixed, accounts)
        assert_brute(reader, fixed, accounts)
