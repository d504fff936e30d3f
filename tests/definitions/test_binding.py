# On a feature class `User.balance` is a Feature, not the declared float; mypy reads the latter.
# mypy: disable-error-code="attr-defined, assignment"
"""Binding `_` expressions to feature classes: dependencies, filters vs projections, window
bounds, and the mistakes `Graph.build` reports."""

from datetime import datetime, timedelta

import pytest

from kairos import (
    DataFrame,
    DefinitionError,
    FeatureTime,
    Now,
    Windowed,
    _,
    feature,
    features,
    windowed,
)
from kairos.definitions import expressions as ex
from kairos.definitions.binding import Field, Rows, Slot, bind_feature, bind_rows_items
from kairos.definitions.feature import FeatureRef
from kairos.definitions.graph import Graph


@features
class Transaction:
    id: str
    user_id: "User.id"
    amount: float | None
    fee: float
    status: str
    is_fraud: bool
    note: str | None
    ts: FeatureTime
    # computed per row; a has-many projection evaluates it on each row
    gross: float = _.amount + _.fee


@features
class Order:
    id: str
    user_id: "User.id"
    owner_balance: float = _.user.balance
    owner_recent: int = _.user.txn_count["24h"]


@features
class User:
    id: str
    name: str
    balance: float
    credit: float
    transactions: DataFrame[Transaction]
    txn_count: Windowed[int] = windowed(
        "1d", "7d", expression=_.transactions[_.ts > _.window_start].count()
    )
    spend: Windowed[float] = windowed(
        "1h", expression=_.transactions[_.ts >= _.window_start, _.ts < _.window_end, _.amount].sum()
    )
    doubled: float = _.balance * 2 + _.balance
    headroom: float = feature(expression=_.credit - _.balance)
    total: float = _.transactions[_.amount].sum()
    gross_total: float = _.transactions[_.gross].sum()
    ok_total: float = _.transactions[_.status == "ok", _.amount].sum()
    fraud_count: int = _.transactions[_.is_fraud].count()
    recent_ratio: float = _.txn_count["24h"] / _.txn_count["7d"]
    last_day: int = _.transactions[_.ts > Now - timedelta(days=1)].count()


GRAPH = Graph.build([User, Transaction, Order])
TRANSACTIONS = FeatureRef("user", (), "transactions")


def test_dependencies_are_listed_once_in_order_of_appearance() -> None:
    bound = bind_feature(GRAPH, "user", "doubled")
    assert bound.namespace == "user"
    assert bound.deps == (FeatureRef("user", (), "balance"),)
    assert bound.tree.same_as((Slot(0) * 2) + Slot(0))
    assert bound.source == "((_.balance * 2) + _.balance)"


def test_each_dependency_gets_its_own_slot() -> None:
    bound = bind_feature(GRAPH, "user", "headroom")
    assert bound.deps == (FeatureRef("user", (), "credit"), FeatureRef("user", (), "balance"))
    assert bound.tree.same_as(Slot(0) - Slot(1))


def test_a_has_one_path_is_a_dependency() -> None:
    bound = bind_feature(GRAPH, "order", "owner_balance")
    assert bound.deps == (FeatureRef("order", ("user",), "balance"),)
    assert bound.deps[0].fqn == "order.user.balance"
    assert bound.tree.same_as(Slot(0))


def test_windows_in_dependencies_are_canonical() -> None:
    bound = bind_feature(GRAPH, "user", "recent_ratio")
    assert [d.fqn for d in bound.deps] == ["user.txn_count[1d]", "user.txn_count[7d]"]
    through = bind_feature(GRAPH, "order", "owner_recent")
    assert through.deps == (FeatureRef("order", ("user",), "txn_count", "1d"),)


def test_a_projection_reads_a_field_of_each_row() -> None:
    bound = bind_feature(GRAPH, "user", "total")
    assert bound.deps == (TRANSACTIONS,)
    expected = ex.Agg("sum", Rows(Slot(0), (), (Field("amount"),), ("amount",)))
    assert bound.tree.same_as(expected)


def test_comparisons_filter_and_plain_columns_project() -> None:
    tree = bind_feature(GRAPH, "user", "ok_total").tree
    assert isinstance(tree, ex.Agg)
    rows = tree.base
    assert isinstance(rows, Rows)
    assert len(rows.filters) == 1
    assert rows.filters[0].same_as(Field("status") == "ok")
    assert len(rows.projections) == 1
    assert rows.projections[0].same_as(Field("amount"))
    assert rows.names == ("amount",)


def test_a_bool_column_filters() -> None:
    tree = bind_feature(GRAPH, "user", "fraud_count").tree
    assert isinstance(tree, ex.Agg)
    assert isinstance(tree.base, Rows)
    assert [f.key() for f in tree.base.filters] == [Field("is_fraud").key()]
    assert tree.base.projections == ()


@pytest.mark.parametrize(
    ("item", "is_filter"),
    [
        (_.amount > 1, True),
        (_.amount != 1, True),
        ((_.amount > 1) & (_.fee < 2), True),
        ((_.amount > 1) | _.is_fraud, True),
        (~_.is_fraud, True),
        (_.is_fraud, True),
        (_.note.is_null(), True),
        (_.note.is_not_null(), True),
        (_.status.is_in(["ok", "pending"]), True),
        (_.status.str.contains("ok"), True),
        (_.status.str.startswith("o"), True),
        (_.status.str.endswith("k"), True),
        (_.amount, False),
        (_.amount * 2, False),
        (_.amount.fill_null(0), False),
        (_.status.str.lower(), False),
        (_.ts.dt.hour(), False),
        (_.gross, False),
    ],
)
def test_filters_and_projections_are_told_apart(item: ex.Expr, is_filter: bool) -> None:
    filters, projections, _names = bind_rows_items(GRAPH, "transaction", (item,), "test")
    assert (len(filters), len(projections)) == ((1, 0) if is_filter else (0, 1))


def test_projection_names() -> None:
    _filters, projections, names = bind_rows_items(
        GRAPH, "transaction", (_.amount, _.fee * 2, Transaction.status), "test"
    )
    assert len(projections) == 3
    assert names == ("amount", "(_.fee * 2)", "status")


def test_a_computed_child_column_is_inlined_on_the_row() -> None:
    tree = bind_feature(GRAPH, "user", "gross_total").tree
    assert isinstance(tree, ex.Agg)
    assert isinstance(tree.base, Rows)
    (projection,) = tree.base.projections
    assert projection.same_as(Field("amount") + Field("fee"))
    assert tree.base.names == ("gross",)


def test_each_window_substitutes_its_own_bounds() -> None:
    for window, delta in (("1d", timedelta(days=1)), ("7d", timedelta(days=7))):
        tree = bind_feature(GRAPH, "user", f"txn_count[{window}]").tree
        assert isinstance(tree, ex.Agg)
        assert isinstance(tree.base, Rows)
        (only,) = tree.base.filters
        assert only.same_as(Field("ts") > ex.NowRef() - delta)


def test_window_end_is_now() -> None:
    tree = bind_feature(GRAPH, "user", "spend[1h]").tree
    assert isinstance(tree, ex.Agg)
    assert isinstance(tree.base, Rows)
    start, end = tree.base.filters
    assert start.same_as(Field("ts") >= ex.NowRef() - timedelta(hours=1))
    assert end.same_as(Field("ts") < ex.NowRef())
    assert [p.key() for p in tree.base.projections] == [Field("amount").key()]


def test_now_stays_now() -> None:
    tree = bind_feature(GRAPH, "user", "last_day").tree
    assert isinstance(tree, ex.Agg)
    assert isinstance(tree.base, Rows)
    assert tree.base.filters[0].same_as(Field("ts") > ex.NowRef() - timedelta(days=1))


def test_count_needs_no_projection() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        n: int = _.transactions.count()
        n_amounts: int = _.transactions[_.amount, _.fee].count()

    graph = Graph.build([User, Transaction])
    tree = bind_feature(graph, "user", "n").tree
    assert tree.same_as(ex.Agg("count", Rows(Slot(0), (), (), ())))
    assert bind_feature(graph, "user", "n_amounts").deps == (TRANSACTIONS,)


def test_a_real_feature_called_window_start_wins() -> None:
    @features
    class User:
        id: str
        window_start: datetime
        opened: bool = _.window_start < Now

    bound = bind_feature(Graph.build([User]), "user", "opened")
    assert bound.deps == (FeatureRef("user", (), "window_start"),)


def test_only_expression_features_can_be_bound() -> None:
    with pytest.raises(DefinitionError, match=r"^user\.balance is not defined by an expression$"):
        bind_feature(GRAPH, "user", "balance")


# --- mistakes reported by Graph.build -----------------------------------------------------


def _build_error(user_class: type) -> str:
    """The DefinitionError message of building `user_class` with Transaction."""
    with pytest.raises(DefinitionError) as info:
        Graph.build([user_class, Transaction])
    return str(info.value)


def test_sum_without_a_column_is_an_error() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        total: float = _.transactions.sum()

    message = _build_error(User)
    assert message == (
        "user.total: sum() needs exactly one column: write _.transactions[_.column].sum() (got 0)"
    )


def test_a_bool_filter_is_not_the_column_to_sum() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        total: float = _.transactions[_.is_fraud].sum()

    assert "sum() needs exactly one column" in _build_error(User)


@pytest.mark.parametrize("agg", ["sum", "mean", "min", "max", "std", "distinct_count"])
def test_two_columns_are_one_too_many(agg: str) -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        x: float = getattr(_.transactions[_.amount, _.fee], agg)()

    message = _build_error(User)
    assert message.startswith(f"user.x: {agg}() needs exactly one column")
    assert message.endswith("(got 2)")


def test_walking_a_has_many_as_has_one_is_an_error() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        amount: float = _.transactions.amount

    message = _build_error(User)
    assert message.startswith("user.amount: user.transactions is not a has-one relation")


def test_aggregating_a_scalar_is_an_error() -> None:
    @features
    class User:
        id: str
        balance: float
        total: float = _.balance.sum()

    assert _build_error(User) == (
        "user.total: _.balance[...] filters a has-many feature; _.balance is not one"
    )


def test_aggregating_an_aggregate_is_an_error() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        x: float = _.transactions.count().sum()

    assert _build_error(User).startswith("user.x: sum() applies to a has-many feature")


def test_a_bare_relation_is_an_error() -> None:
    @features
    class Order:
        id: str
        user_id: "User.id"
        who: str = _.user

    with pytest.raises(DefinitionError) as info:
        Graph.build([User, Transaction, Order])
    assert str(info.value) == (
        "order.who: _.user is a relation; use one of its features, e.g. _.user.id"
    )


def test_an_unknown_name_is_an_error_with_a_suggestion() -> None:
    @features
    class User:
        id: str
        balance: float
        double: float = _.balanse * 2

    assert _build_error(User) == (
        "user.double: unknown feature 'user.balanse'; did you mean 'user.balance'?"
    )


def test_a_windowed_feature_without_window_names_the_windows() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        txn_count: Windowed[int] = windowed("1d", "7d", expression=_.transactions.count())
        busy: bool = _.txn_count > 10

    assert _build_error(User) == (
        "user.busy: user.txn_count is windowed; pick a window: "
        "user.txn_count[1d], user.txn_count[7d]"
    )


def test_an_undeclared_window_is_an_error() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        txn_count: Windowed[int] = windowed("1d", expression=_.transactions.count())
        busy: bool = _.txn_count["30d"] > 10

    assert _build_error(User).startswith("user.busy: unknown feature 'user.txn_count[30d]'")


@pytest.mark.parametrize("bound", ["window_start", "window_end"])
def test_window_bounds_outside_windowed_are_an_error(bound: str) -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        n: int = _.transactions[getattr(_, bound) < _.ts].count()

    assert _build_error(User) == (
        f"user.n: _.{bound} is only defined inside windowed(..., expression=...)"
    )


def test_window_bounds_outside_windowed_are_an_error_at_the_top_too() -> None:
    @features
    class User:
        id: str
        age: timedelta = Now - _.window_start

    assert "_.window_start is only defined inside windowed" in _build_error(User)


def test_a_path_inside_items_is_an_error() -> None:
    @features
    class User:
        id: str
        name: str
        transactions: DataFrame[Transaction]
        n: int = _.transactions[_.user.name == "x"].count()

    assert _build_error(User).startswith(
        "user.n: inside [...] use the row's own features (e.g. _.amount); got _.user.name"
    )


def test_a_relation_inside_items_is_an_error() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        n: int = _.transactions[_.user].count()

    assert _build_error(User) == "user.n: inside [...] transaction.user is a relation, not a column"


def test_a_nested_aggregation_inside_items_is_an_error() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        n: int = _.transactions[_.transactions.count() > 1].count()

    assert "nested has-many expressions are not supported inside [...]" in _build_error(User)


def test_an_aggregation_of_a_windowed_feature_is_an_error() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        txn_count: Windowed[int] = windowed("1d", expression=_.transactions.count())
        x: int = _.txn_count["1d"].sum()

    assert _build_error(User) == (
        "user.x: _.txn_count['1d'] is one value per entity; filters and aggregations apply to "
        "has-many features such as _.transactions"
    )


def test_an_unknown_name_inside_items_is_a_definition_error() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        total: float = _.transactions[_.amont].sum()

    assert _build_error(User) == (
        "user.total: inside [...]: unknown feature 'transaction.amont'; "
        "did you mean 'transaction.amount'?"
    )
