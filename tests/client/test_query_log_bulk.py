"""A bulk query through a Client keeps every decision: when the query log's queue is full the
query waits for the writer (backpressure) rather than dropping records."""

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest

import kairos as kr
from kairos import _, features, online
from kairos.stores.query_log import BatchedQueryLog

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@features
class Account:
    id: str
    balance: float
    doubled: float = _.balance * 2


@online
def balance(aid: Account.id) -> Account.balance:
    key: str = aid
    return float(key.removeprefix("a"))


def rows_in(path: Path) -> tuple[int, int]:
    """Rows and distinct query ids in the log file, read independently of kairos."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows, distinct = db.execute(
            "select count(*), count(distinct query_id) from kairos_query_log"
        ).fetchone()
    db.close()
    return int(rows), int(distinct)


def test_a_20000_row_bulk_query_keeps_all_20000_records(tmp_path: Path) -> None:
    path = tmp_path / "query_log.db"
    ids = [f"a{i}" for i in range(20_000)]  # twice the default queue of 10,000
    with kr.Client(definitions=[Account, balance], query_log=f"sqlite:///{path}") as client:
        result = client.query_bulk(input={Account.id: ids}, output=[Account.doubled], now=NOW)
        client.log.flush()
        dropped = client.log.store.dropped
        last = client.log.get(f"{result.meta.query_id}-19999")

    assert result.errors == []
    assert dropped == 0
    assert rows_in(path) == (20_000, 20_000)
    assert last is not None
    assert last.inputs == {"account.id": "a19999"}
    assert last.value("account.doubled") == 39_998.0
    assert last.values["account.balance"].source == "balance"


@pytest.mark.parametrize("max_queue", [1, 64])
def test_a_small_queue_slows_the_query_down_but_keeps_every_record(
    tmp_path: Path, max_queue: int
) -> None:
    path = tmp_path / "query_log.db"
    log = BatchedQueryLog.sqlite(path, max_queue=max_queue, max_batch=50)
    ids = [f"a{i}" for i in range(2_000)]
    with kr.Client(definitions=[Account, balance], query_log=log) as client:
        client.query_bulk(input={Account.id: ids}, output=[Account.doubled], now=NOW)
        client.query(input={Account.id: "a1"}, output=[Account.doubled], now=NOW)
        client.log.flush()
        dropped = client.log.store.dropped

    assert dropped == 0
    assert rows_in(path) == (2_001, 2_001)
    assert log.batches_written >= 2_001 // 50  # the writer ran while the query waited


@features
class Shop:
    id: str
    orders: kr.DataFrame["Order"]
    spent: float = _.orders[_.amount].sum()


@features
class Order:
    id: str
    shop_id: Shop.id
    amount: float


@online
def shop_orders(sid: Shop.id) -> Shop.orders:
    return [{"id": f"{sid}-o{i}", "shop_id": sid, "amount": float(i)} for i in range(3)]


def test_the_record_is_what_the_query_saw_though_the_caller_changes_its_rows(
    tmp_path: Path,
) -> None:
    """The writer thread builds the records after the query answered: has-many rows are
    copied first, so a caller changing the rows it got back does not change the log."""
    with kr.Client(
        definitions=[Shop, Order, shop_orders], query_log=f"sqlite:///{tmp_path / 'log.db'}"
    ) as client:
        result = client.query({Shop.id: "s1"}, [Shop.orders, Shop.spent], now=NOW)
        rows = result.get_value(Shop.orders)
        rows[0]["amount"] = 1000.0
        rows.append({"id": "forged", "shop_id": "s1", "amount": 5.0})
        record = client.log.get(result.meta.query_id)
    assert record is not None
    assert [r["amount"] for r in record.value("shop.orders")] == [0.0, 1.0, 2.0]
    assert record.value("shop.spent") == 3.0


@features
class Item:
    id: str
    tags: list[str]
    meta: dict[str, int]


@online
def item_parts(iid: Item.id) -> kr.Features[Item.tags, Item.meta]:
    return ["a", "b"], {"n": 1}


def test_list_and_dict_values_are_logged_as_served_though_the_caller_changes_them(
    tmp_path: Path,
) -> None:
    with kr.Client(
        definitions=[Item, item_parts], query_log=f"sqlite:///{tmp_path / 'log.db'}"
    ) as client:
        result = client.query({Item.id: "i1"}, [Item.tags, Item.meta], now=NOW)
        result.values["item.tags"].append("MUTATED")
        result.get_value(Item.meta)["n"] = 999
        record = client.log.get(result.meta.query_id)
    assert record is not None
    assert record.value("item.tags") == ["a", "b"] and record.value("item.meta") == {"n": 1}
