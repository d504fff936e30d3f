"""Bulk queries: one run of one plan for many entities, answers aligned to the input order."""

import asyncio
import threading
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

import kairos as kr
from kairos import _, features, online
from tests.engine.conftest import MakeClient

NOW = datetime(2026, 1, 10, tzinfo=UTC)


@features
class Item:
    id: str
    price: float
    with_tax: float = _.price * 1.5
    stock: int


def test_bulk_calls_a_sync_resolver_once_per_entity_in_one_run(make_client: MakeClient) -> None:
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    @online
    def price(iid: Item.id) -> Item.price:
        key: str = iid
        with lock:
            calls[key] += 1
        return float(key.removeprefix("i"))

    client = make_client(Item, price)
    ids = [f"i{n}" for n in range(50)]
    result = client.query_bulk(input={Item.id: ids}, output=[Item.with_tax, Item.price], now=NOW)

    assert calls == Counter(dict.fromkeys(ids, 1))
    assert result.meta.rows == 50
    assert len(result) == 50
    assert result.errors == []
    assert result.column(Item.price) == [float(n) for n in range(50)]
    assert result.column("item.with_tax") == [n * 1.5 for n in range(50)]
    assert result.meta.now == NOW
    # One plan run: each node appears once in the trace, covering every row.
    price_steps = [t for t in result.trace if t.label == "price"]
    assert [(t.rows, t.status) for t in price_steps] == [(50, "ok")]
    assert result.trace[-1].label == "total"
    assert result.trace[-1].rows == 50
    row = result.row(7)
    assert row["item.price"].value == 7.0
    assert row["item.price"].source == "price"
    assert result.to_rows()[3] == {"item.with_tax": 4.5, "item.price": 3.0}


def test_bulk_results_follow_input_order_not_completion_order(make_client: MakeClient) -> None:
    finished: list[str] = []

    @online
    async def stock(iid: Item.id) -> Item.stock:
        # later rows finish first
        index = int(str(iid).removeprefix("i"))
        await asyncio.sleep(0.01 * (5 - index))
        finished.append(iid)
        return index * 100

    client = make_client(Item, stock)
    ids = ["i0", "i1", "i2", "i3", "i4"]
    result = client.query_bulk(input={Item.id: ids}, output=[Item.stock], now=NOW)

    assert finished == list(reversed(ids))
    assert result.values == {"item.stock": [0, 100, 200, 300, 400]}


def test_bulk_with_duplicate_entities(make_client: MakeClient) -> None:
    @online
    def price(iid: Item.id) -> Item.price:
        return float(len(iid))

    client = make_client(Item, price)
    result = client.query_bulk(input={Item.id: ["a", "bb", "a"]}, output=[Item.price], now=NOW)

    assert result.column(Item.price) == [1.0, 2.0, 1.0]


def test_bulk_accepts_rows(make_client: MakeClient) -> None:
    @online
    def stock(iid: Item.id, price: Item.price) -> Item.stock:
        return int(price) + len(iid)

    client = make_client(Item, stock)
    rows: list[dict[Any, Any]] = [
        {Item.id: "a", Item.price: 10.0},
        {"item.id": "bb", "item.price": 20},
    ]
    result = client.query_bulk(input=rows, output=[Item.stock, Item.with_tax], now=NOW)

    assert result.errors == []
    assert result.values == {"item.stock": [11, 22], "item.with_tax": [15.0, 30.0]}


def test_bulk_columns_of_different_lengths_are_invalid(make_client: MakeClient) -> None:
    client = make_client(Item)
    with pytest.raises(kr.InvalidInput) as raised:
        client.query_bulk(
            input={Item.id: ["a", "b"], Item.price: [1.0]}, output=[Item.with_tax], now=NOW
        )

    message = str(raised.value)
    assert "item.id=2" in message
    assert "item.price=1" in message


def test_bulk_rows_with_different_features_are_invalid(make_client: MakeClient) -> None:
    client = make_client(Item)
    with pytest.raises(kr.InvalidInput, match="row 1"):
        client.query_bulk(
            input=[{Item.id: "a", Item.price: 1.0}, {Item.id: "b"}], output=[Item.with_tax]
        )


def test_bulk_column_that_is_not_a_list_is_invalid(make_client: MakeClient) -> None:
    client = make_client(Item)
    with pytest.raises(kr.InvalidInput, match=r"item\.id"):
        client.query_bulk(input={Item.id: "abc"}, output=[Item.with_tax])


def test_bulk_wrong_input_type_names_the_row(make_client: MakeClient) -> None:
    client = make_client(Item)
    with pytest.raises(kr.InvalidInput) as raised:
        client.query_bulk(input={Item.price: [1.0, "two"]}, output=[Item.with_tax])

    assert "'item.price'" in str(raised.value)
    assert "row 1" in str(raised.value)


def test_empty_bulk_returns_empty_columns(make_client: MakeClient) -> None:
    @online
    def price(iid: Item.id) -> Item.price:
        raise AssertionError("no entity, no call")

    client = make_client(Item, price)
    result = client.query_bulk(input={Item.id: []}, output=[Item.price], now=NOW)

    assert result.meta.rows == 0
    assert result.values == {"item.price": []}
    assert result.errors == []
