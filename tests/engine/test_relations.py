"""Relations: has-one paths through a foreign key, and has-many rows, with nothing from the future.

A foreign key is null when declared nullable ("Customer.id | None") and a resolver returns
None, or when it is an expression that evaluates to None (Order.customer_id below).
"""

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kairos import DataFrame, FeatureTime, Now, Windowed, _, features, online, windowed
from kairos.definitions.feature import FeatureRef, PathRef, ref_of
from tests.engine.conftest import MakeClient

NOW = datetime(2026, 1, 10, tzinfo=UTC)


@features
class Order:
    id: str
    raw_customer: str | None
    customer_id: "Customer.id" = _.raw_customer
    customer: "Customer"  # the has-one relation, declared so type checkers know it
    amount: float
    status: str
    ts: FeatureTime
    shout: str


@features
class Customer:
    id: str
    name: str
    email: str
    orders: DataFrame[Order]
    spent: float = _.orders[_.amount].sum()
    order_count: int = _.orders.count()
    recent: Windowed[int] = windowed("1d", "7d", expression=_.orders[_.ts > _.window_start].count())
    seen_statuses: str
    declined_total: float
    latest_order: datetime


def order_rows(customer: str) -> list[dict[str, Any]]:
    rows = [
        ("o1", 5.0, "ok", NOW - timedelta(hours=2)),
        ("o2", 7.0, "declined", NOW - timedelta(days=3)),
        ("o3", 11.0, "declined", NOW - timedelta(days=10)),
        ("o4", 1000.0, "declined", NOW + timedelta(seconds=1)),  # does not exist yet at NOW
    ]
    return [
        {"id": oid, "customer_id": customer, "amount": amount, "status": status, "ts": ts}
        for oid, amount, status, ts in rows
    ]


@pytest.fixture
def customer_calls() -> Counter[str]:
    return Counter()


@pytest.fixture
def customer_resolvers(customer_calls: Counter[str]) -> list[Any]:
    @online
    def raw_customer(oid: Order.id) -> Order.raw_customer:
        return None if oid == "guest" else "c1"

    @online
    def customer_name(cid: Customer.id) -> Customer.name:
        customer_calls[cid] += 1
        return f"name-{cid}"

    @online
    def customer_email(cid: Customer.id) -> Customer.email:
        return f"{cid}@example.com"

    @online
    def customer_orders(cid: Customer.id) -> DataFrame[Order]:
        return order_rows(cid)  # type: ignore[return-value]  # a list of dicts is accepted

    return [raw_customer, customer_name, customer_email, customer_orders]


def test_has_one_path_reads_the_related_entity(
    make_client: MakeClient, customer_resolvers: list[Any], customer_calls: Counter[str]
) -> None:
    @online
    def shout(email: Order.customer.email, amount: Order.amount) -> Order.shout:
        return f"{email}:{amount}".upper()

    @online
    def order_amount(oid: Order.id) -> Order.amount:
        return 1.5

    client = make_client(Order, Customer, *customer_resolvers, shout, order_amount)
    result = client.query(
        input={Order.id: "o1"},
        output=["order.customer.name", Order.customer.email, Order.shout, Order.customer_id],
        now=NOW,
    )

    assert result.errors == []
    assert result.values == {
        "order.customer.name": "name-c1",
        "order.customer.email": "c1@example.com",
        "order.shout": "C1@EXAMPLE.COM:1.5",
        "order.customer_id": "c1",
    }
    assert result.features["order.customer.name"].source == "customer_name"
    assert customer_calls == Counter({"c1": 1})


def test_null_foreign_key_gives_null_path_features_without_errors(
    make_client: MakeClient, customer_resolvers: list[Any], customer_calls: Counter[str]
) -> None:
    client = make_client(Order, Customer, *customer_resolvers)
    result = client.query(
        input={Order.id: "guest"},
        output=["order.customer.name", Order.customer.email, Order.customer_id],
        now=NOW,
    )

    assert result.errors == []
    assert result.values == {
        "order.customer.name": None,
        "order.customer.email": None,
        "order.customer_id": None,
    }
    assert customer_calls == Counter()  # no customer, nothing to look up


def test_null_foreign_key_in_bulk_nulls_only_that_row(
    make_client: MakeClient, customer_resolvers: list[Any], customer_calls: Counter[str]
) -> None:
    client = make_client(Order, Customer, *customer_resolvers)
    result = client.query_bulk(
        input={Order.id: ["o1", "guest", "o2"]}, output=["order.customer.name"], now=NOW
    )

    assert result.errors == []
    assert result.values == {"order.customer.name": ["name-c1", None, "name-c1"]}


def test_has_one_path_to_a_feature_called_name(
    make_client: MakeClient, customer_resolvers: list[Any]
) -> None:
    client = make_client(Order, Customer, *customer_resolvers)
    path: Any = Order.customer.name
    assert isinstance(path, PathRef)
    assert ref_of(path) == FeatureRef("order", ("customer",), "name")
    assert str(path) == "order.customer.name"
    result = client.query(input={Order.id: "o1"}, output=[path], now=NOW)

    assert result.values == {"order.customer.name": "name-c1"}


def test_future_rows_are_dropped_before_expression_aggregates(
    make_client: MakeClient, customer_resolvers: list[Any]
) -> None:
    client = make_client(Order, Customer, *customer_resolvers)
    result = client.query(
        input={Customer.id: "c1"},
        output=[
            Customer.spent,
            Customer.order_count,
            Customer.recent["1d"],
            Customer.recent["7d"],
            Customer.orders,
        ],
        now=NOW,
    )

    assert result.errors == []
    assert result.values["customer.spent"] == 23.0
    assert result.values["customer.order_count"] == 3
    assert result.values["customer.recent[1d]"] == 1
    assert result.values["customer.recent[7d]"] == 2
    assert [row["id"] for row in result.values["customer.orders"]] == ["o1", "o2", "o3"]

    # The same rows, a little later: o4 exists now.
    later = client.query(
        input={Customer.id: "c1"}, output=[Customer.spent], now=NOW + timedelta(seconds=1)
    )
    assert later.get_value(Customer.spent) == 1023.0


def test_future_rows_are_dropped_before_resolver_inputs(
    make_client: MakeClient, customer_resolvers: list[Any]
) -> None:
    seen: dict[str, Any] = {}

    @online
    def seen_statuses(orders: Customer.orders) -> Customer.seen_statuses:
        seen["all"] = orders
        frame: DataFrame[Order] = orders
        return ",".join(sorted({row["status"] for row in frame}))

    @online
    def declined_total(
        declined: Customer.orders[_.amount, _.status == "declined"],
    ) -> Customer.declined_total:
        seen["declined"] = declined
        frame: DataFrame[Order] = declined
        return float(sum(frame["amount"]))

    @online
    def latest_order(orders: Customer.orders[_.ts], now: Now) -> Customer.latest_order:
        seen["now"] = now
        frame: DataFrame[Order] = orders
        latest: datetime = max(frame["ts"])
        return latest

    client = make_client(
        Order, Customer, *customer_resolvers, seen_statuses, declined_total, latest_order
    )
    result = client.query(
        input={Customer.id: "c1"},
        output=[Customer.seen_statuses, Customer.declined_total, Customer.latest_order],
        now=NOW,
    )

    assert result.errors == []
    assert isinstance(seen["all"], DataFrame)
    assert [row["id"] for row in seen["all"]] == ["o1", "o2", "o3"]
    # Filtered to declined rows, projected to the amount column.
    assert seen["declined"].rows == [{"amount": 7.0}, {"amount": 11.0}]
    assert seen["now"] == NOW
    assert result.values == {
        "customer.seen_statuses": "declined,ok",
        "customer.declined_total": 18.0,
        "customer.latest_order": NOW - timedelta(hours=2),
    }


def test_rows_keep_their_declared_types(
    make_client: MakeClient, customer_resolvers: list[Any]
) -> None:
    @online
    def loose_orders(cid: Customer.id) -> DataFrame[Order]:
        # an int amount and an ISO timestamp, as a database driver might hand them over
        return DataFrame(
            [{"id": "x", "customer_id": cid, "amount": 3, "ts": "2026-01-09T00:00:00+00:00"}]
        )

    client = make_client(Order, Customer, customer_resolvers[1], loose_orders)
    result = client.query(input={Customer.id: "c1"}, output=[Customer.orders], now=NOW)

    (row,) = result.get_value(Customer.orders)
    assert row["amount"] == 3.0
    assert isinstance(row["amount"], float)
    assert row["ts"] == datetime(2026, 1, 9, tzinfo=UTC)


def test_rows_with_an_undeclared_column_are_invalid(make_client: MakeClient) -> None:
    @online
    def bad_orders(cid: Customer.id) -> DataFrame[Order]:
        return DataFrame([{"id": "x", "customer_id": cid, "amont": 3.0}])

    client = make_client(Order, Customer, bad_orders)
    result = client.query(
        input={Customer.id: "c1"}, output=[Customer.orders, Customer.spent], now=NOW
    )

    errors = {e.feature: e for e in result.errors}
    assert errors["customer.orders"].code == "invalid_value"
    assert errors["customer.orders"].resolver == "bad_orders"
    assert "'amont'" in errors["customer.orders"].message
    assert "did you mean 'amount'" in errors["customer.orders"].message
    assert errors["customer.spent"].code == "upstream_error"


def test_future_rows_in_a_has_many_input_are_dropped(make_client: MakeClient) -> None:
    client = make_client(Order, Customer)
    rows = order_rows("c1")
    rows[0]["amount"] = 5  # an int for a float feature
    rows[1]["ts"] = rows[1]["ts"].isoformat()  # a string for a datetime feature
    result = client.query(
        input={Customer.id: "c1", Customer.orders: rows},
        output=[Customer.spent, Customer.order_count, Customer.orders],
        now=NOW,
    )

    assert result.errors == []
    assert result.get_value(Customer.spent) == 23.0
    assert result.get_value(Customer.order_count) == 3
    orders = result.get_value(Customer.orders)
    assert [row["id"] for row in orders] == ["o1", "o2", "o3"]  # o4 is after `now`
    # the rows are typed like a resolver's rows
    assert orders[0]["amount"] == 5.0 and isinstance(orders[0]["amount"], float)
    assert orders[1]["ts"] == NOW - timedelta(days=3)
    assert orders[1]["ts"].tzinfo is not None


@features
class Shop:
    id: str
    name: str


@features
class Sale:
    id: str
    shop_id: "Shop.id | None"
    amount: float


@features
class Refund:
    id: str
    shop_id: Shop.id | None
    shop: Shop  # the has-one relation, declared so type checkers know it


def test_a_nullable_foreign_key_may_be_null(make_client: MakeClient) -> None:
    @online
    def shop_of(sid: Sale.id) -> Sale.shop_id:
        return None if sid == "cash" else "s1"

    @online
    def refund_shop(rid: Refund.id) -> Refund.shop_id:
        return None if rid == "r0" else "s2"

    @online
    def shop_name(sid: Shop.id) -> Shop.name:
        return f"name-{sid}"

    client = make_client(Shop, Sale, Refund, shop_of, refund_shop, shop_name)
    sales = client.query_bulk(
        input={Sale.id: ["card", "cash"]}, output=[Sale.shop_id, "sale.shop.name"], now=NOW
    )
    refunds = client.query_bulk(
        input={Refund.id: ["r0", "r1"]}, output=[Refund.shop_id, Refund.shop.name], now=NOW
    )

    assert sales.errors == []
    assert sales.values == {"sale.shop_id": ["s1", None], "sale.shop.name": ["name-s1", None]}
    assert refunds.errors == []
    assert refunds.values == {
        "refund.shop_id": [None, "s2"],
        "refund.shop.name": [None, "name-s2"],
    }
