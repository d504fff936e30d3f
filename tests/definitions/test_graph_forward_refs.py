# On a feature class `User.balance` is a Feature, not the declared float; mypy reads the latter.
# mypy: disable-error-code="attr-defined, assignment"
"""Feature classes written with `from __future__ import annotations`: every annotation is a
string, and a foreign key may name a class defined further down the module."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest

from kairos import (
    DataFrame,
    DefinitionError,
    FeatureTime,
    Primary,
    Windowed,
    _,
    feature,
    features,
    windowed,
)
from kairos.definitions.binding import bind_feature
from kairos.definitions.feature import FeatureRef, class_spec, field_of, ref_of
from kairos.definitions.graph import Graph
from kairos.definitions.types import ValueType


@features
class Transaction:
    id: Primary[str]
    user_id: User.id
    merchant_id: Merchant.code
    amount: float | None
    tags: list[str]
    ts: FeatureTime


@features
class Merchant:
    code: Primary[int]
    # the merchant's trading name
    name: str
    opened_on: date | None


@features(max_staleness="10m")
class User:
    id: str
    signup_at: datetime
    transactions: DataFrame[Transaction]
    txn_count: Windowed[int] = windowed(
        "1d", "7d", expression=_.transactions[_.ts > _.window_start].count()
    )
    total: float = feature(expression=_.transactions[_.amount].sum(), max_staleness="1m")


GRAPH = Graph.build([Transaction, Merchant, User])


def test_annotations_are_strings_until_the_graph_is_built() -> None:
    spec = class_spec(Transaction)
    assert spec is not None
    assert field_of(spec.features["user_id"]).annotation == "User.id"
    assert field_of(spec.features["amount"]).annotation == "float | None"


def test_foreign_keys_to_classes_defined_later_create_relations() -> None:
    spec = class_spec(Transaction)
    assert spec is not None
    assert field_of(spec.features["user"]).implicit
    assert field_of(spec.features["merchant"]).implicit
    assert ref_of(Transaction.user.signup_at) == FeatureRef("transaction", ("user",), "signup_at")


def test_string_annotations_resolve_to_value_types() -> None:
    assert GRAPH.feature("transaction", "amount").type == ValueType("float", nullable=True)
    assert GRAPH.feature("transaction", "tags").type == ValueType("list", item=ValueType("str"))
    assert GRAPH.feature("merchant", "opened_on").type == ValueType("date", nullable=True)
    assert GRAPH.feature("user", "signup_at").type == ValueType("datetime")


def test_string_markers_resolve() -> None:
    assert GRAPH.cls("transaction").primary == "id"
    assert GRAPH.cls("merchant").primary == "code"
    assert GRAPH.feature("merchant", "code").type == ValueType("int")
    assert GRAPH.cls("transaction").feature_time == "ts"


def test_forward_foreign_keys_resolve() -> None:
    user_id = GRAPH.feature("transaction", "user_id")
    assert (user_id.fk_target, user_id.type) == (("user", "id"), ValueType("str"))
    merchant_id = GRAPH.feature("transaction", "merchant_id")
    assert (merchant_id.fk_target, merchant_id.type) == (("merchant", "code"), ValueType("int"))
    merchant = GRAPH.feature("transaction", "merchant")
    assert (merchant.kind, merchant.target, merchant.join_key) == (
        "has_one",
        "merchant",
        "merchant_id",
    )


def test_has_many_and_windows_resolve() -> None:
    assert GRAPH.feature("user", "transactions").join_key == "user_id"
    assert GRAPH.feature("user", "txn_count[7d]").type == ValueType("int")
    assert GRAPH.feature("user", "txn_count[7d]").max_staleness == timedelta(minutes=10)
    assert GRAPH.feature("user", "total").max_staleness == timedelta(minutes=1)


def test_expressions_bind() -> None:
    bound = bind_feature(GRAPH, "user", "txn_count[1d]")
    assert bound.deps == (FeatureRef("user", (), "transactions"),)


def test_descriptions_come_from_comments() -> None:
    assert GRAPH.description("merchant", "name") == "the merchant's trading name"


def test_classes_defined_in_a_function_resolve_each_other() -> None:
    @features
    class Order:
        id: str
        shop_id: Shop.id
        placed_at: FeatureTime

    @features
    class Shop:
        id: int
        orders: DataFrame[Order]
        order_count: int = _.orders.count()

    graph = Graph.build([Order, Shop])
    assert graph.feature("order", "shop_id").type == ValueType("int")
    assert graph.feature("order", "shop").target == "shop"
    assert graph.feature("shop", "orders").join_key == "shop_id"
    assert bind_feature(graph, "shop", "order_count").deps == (FeatureRef("shop", (), "orders"),)


def test_a_forward_reference_to_a_class_outside_the_project_names_the_field() -> None:
    @features
    class Order:
        id: str
        shop_id: Shop.id

    with pytest.raises(
        DefinitionError, match=r"^Order\.shop_id: cannot read annotation 'Shop\.id'"
    ):
        Graph.build([Order])
