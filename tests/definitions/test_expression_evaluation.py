# On a feature class `User.balance` is a Feature, not the declared float; mypy reads the latter.
# mypy: disable-error-code="attr-defined, assignment"
"""`_` expressions evaluated end to end: defined on a feature class, bound by `Graph.build`,
compiled by the engine and run on dependency values. Nulls propagate; filters keep a row only
when the predicate is True."""

import math
import statistics
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

import kairos as kr
from kairos import DataFrame, DefinitionError, FeatureTime, Now, Windowed, _, feature, features
from kairos import windowed as windowed_feature
from kairos.definitions import expressions as ex
from kairos.definitions.binding import bind_feature
from kairos.definitions.graph import Graph
from kairos.engine.evaluate import aggregate_values, compile_expression

NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


@features
class Transaction:
    id: str
    user_id: "User.id"
    amount: float | None
    status: str | None
    is_fraud: bool | None
    ts: FeatureTime
    doubled: float | None = _.amount * 2


def evaluate(expression: Any, now: datetime = NOW, **values: Any) -> Any:
    """Define `user.result` by `expression`, bind and compile it, and run it on `values`
    (keyed by the short names of the user's features)."""

    @features
    class User:
        id: str
        balance: float | None
        credit: float | None
        name: str | None
        flag: bool | None
        other: bool | None
        signup_at: datetime | None
        born_on: date | None
        transactions: DataFrame[Transaction]
        result: Any = feature(expression=expression)

    bound = bind_feature(Graph.build([User, Transaction]), "user", "result")
    assert all(dep.path == () for dep in bound.deps)
    slots = [values[dep.name] for dep in bound.deps]
    return compile_expression(bound.tree)(slots, now, None)


def rows(*amounts: float | None, **columns: Any) -> list[dict[str, Any]]:
    """Has-many rows keyed by Transaction's short feature names."""
    return [
        {"id": f"t{i}", "amount": a, "ts": NOW - timedelta(hours=1), **columns}
        for i, a in enumerate(amounts)
    ]


# --- arithmetic and comparison ------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (_.balance + _.credit, 9.0),
        (_.balance - _.credit, 3.0),
        (_.balance * _.credit, 18.0),
        (_.balance / _.credit, 2.0),
        (_.balance // 4, 1.0),
        (_.balance % 4, 2.0),
        (_.balance**2, 36.0),
        (-_.balance, -6.0),
        (abs(_.credit - _.balance), 3.0),
        (10 - _.balance, 4.0),
        (_.balance == 6, True),
        (_.balance != 6, False),
        (_.balance < _.credit, False),
        (_.balance <= 6, True),
        (_.balance > _.credit, True),
        (_.balance >= 7, False),
        ((_.balance / 4).round(1), 1.5),
    ],
)
def test_arithmetic_and_comparison(expression: ex.Expr, expected: Any) -> None:
    result = evaluate(expression, balance=6.0, credit=3.0)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    "expression",
    [
        _.balance + _.credit,
        _.balance - _.credit,
        _.balance * _.credit,
        _.balance / _.credit,
        _.balance**_.credit,
        _.balance == _.credit,
        _.balance != _.credit,
        _.balance < _.credit,
        _.balance >= _.credit,
    ],
)
@pytest.mark.parametrize(("balance", "credit"), [(None, 3.0), (6.0, None), (None, None)])
def test_null_operands_give_null(
    expression: ex.Expr, balance: float | None, credit: float | None
) -> None:
    assert evaluate(expression, balance=balance, credit=credit) is None


@pytest.mark.parametrize("expression", [-_.balance, abs(_.balance), _.balance.round(2)])
def test_functions_of_null_are_null(expression: ex.Expr) -> None:
    assert evaluate(expression, balance=None) is None


def test_comparing_with_none_is_null_not_false() -> None:
    assert evaluate(_.name == None, name="ann") is None  # noqa: E711 - builds a node
    assert evaluate(_.name.is_null(), name=None) is True
    assert evaluate(_.name.is_not_null(), name=None) is False


# --- three-valued logic -------------------------------------------------------------------

T, F, N = True, False, None
AND = {
    (T, T): T,
    (T, F): F,
    (T, N): N,
    (F, T): F,
    (F, F): F,
    (F, N): F,
    (N, T): N,
    (N, F): F,
    (N, N): N,
}
OR = {
    (T, T): T,
    (T, F): T,
    (T, N): T,
    (F, T): T,
    (F, F): F,
    (F, N): N,
    (N, T): T,
    (N, F): N,
    (N, N): N,
}


@pytest.mark.parametrize(("operands", "expected"), AND.items())
def test_and_is_kleene(operands: tuple[bool | None, bool | None], expected: bool | None) -> None:
    flag, other = operands
    assert evaluate(_.flag & _.other, flag=flag, other=other) is expected


@pytest.mark.parametrize(("operands", "expected"), OR.items())
def test_or_is_kleene(operands: tuple[bool | None, bool | None], expected: bool | None) -> None:
    flag, other = operands
    assert evaluate(_.flag | _.other, flag=flag, other=other) is expected


@pytest.mark.parametrize(("flag", "expected"), [(T, F), (F, T), (N, N)])
def test_not(flag: bool | None, expected: bool | None) -> None:
    assert evaluate(~_.flag, flag=flag) is expected


def test_and_or_short_circuit_on_the_deciding_operand() -> None:
    # the right side would fail (None > 1 is None, but 1 / 0 raises) if it were evaluated
    assert evaluate((_.balance > 10) & (_.credit / 0 > 1), balance=1.0, credit=1.0) is False
    assert evaluate((_.balance > 0) | (_.credit / 0 > 1), balance=1.0, credit=1.0) is True


# --- conditionals and null helpers --------------------------------------------------------


@pytest.mark.parametrize(("flag", "expected"), [(T, "yes"), (F, "no"), (N, "no")])
def test_if_then_else_takes_then_only_when_true(flag: bool | None, expected: str) -> None:
    assert evaluate(kr.if_then_else(_.flag, "yes", "no"), flag=flag) == expected


def test_coalesce_and_fill_null() -> None:
    coalesce = kr.coalesce(_.balance, _.credit, 0.0)
    assert evaluate(coalesce, balance=None, credit=2.0) == 2.0
    assert evaluate(coalesce, balance=1.0, credit=2.0) == 1.0
    assert evaluate(coalesce, balance=None, credit=None) == 0.0
    assert evaluate(kr.coalesce(_.balance, _.credit), balance=None, credit=None) is None
    assert evaluate(_.balance.fill_null(-1), balance=None) == -1
    assert evaluate(_.balance.fill_null(-1), balance=0.0) == 0.0


@pytest.mark.parametrize(("name", "expected"), [("ann", True), ("zed", False), (None, None)])
def test_is_in(name: str | None, expected: bool | None) -> None:
    assert evaluate(_.name.is_in(["ann", "bob"]), name=name) is expected


# --- strings and datetimes ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (_.name.str.lower(), "  ann smith "),
        (_.name.str.upper(), "  ANN SMITH "),
        (_.name.str.strip(), "Ann Smith"),
        (_.name.str.len(), 12),
        (_.name.str.contains("Smith"), True),
        (_.name.str.contains("smith"), False),
        (_.name.str.strip().str.startswith("Ann"), True),
        (_.name.str.endswith("x"), False),
        (_.name.str.strip().str.concat("/", 7), "Ann Smith/7"),
    ],
)
def test_string_functions(expression: ex.Expr, expected: Any) -> None:
    assert evaluate(expression, name="  Ann Smith ") == expected


@pytest.mark.parametrize(
    "expression",
    [
        _.name.str.lower(),
        _.name.str.len(),
        _.name.str.contains("a"),
        _.name.str.startswith("a"),
        _.name.str.concat("x"),
    ],
)
def test_string_functions_of_null_are_null(expression: ex.Expr) -> None:
    assert evaluate(expression, name=None) is None


def test_concat_with_a_null_part_is_null() -> None:
    assert evaluate(_.name.str.concat(_.balance), name="a", balance=None) is None


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        (_.signup_at.dt.year(), 2025),
        (_.signup_at.dt.month(), 12),
        (_.signup_at.dt.day(), 31),
        (_.signup_at.dt.hour(), 18),
        (_.signup_at.dt.weekday(), 2),  # a Wednesday
        (_.signup_at.dt.date(), date(2025, 12, 31)),
        (_.born_on.dt.date(), date(1990, 5, 17)),
        ((Now - _.signup_at).dt.total_seconds(), 9.75 * 86400),
        ((Now - _.signup_at).dt.days(), 9.75),
    ],
)
def test_datetime_functions(expression: ex.Expr, expected: Any) -> None:
    signup = datetime(2025, 12, 31, 18, 0, tzinfo=UTC)
    assert evaluate(expression, signup_at=signup, born_on=date(1990, 5, 17)) == expected


def test_datetime_functions_of_null_are_null() -> None:
    assert evaluate(_.signup_at.dt.hour(), signup_at=None) is None
    assert evaluate((Now - _.signup_at).dt.days(), signup_at=None) is None


def test_now_is_the_query_time() -> None:
    assert evaluate(Now - timedelta(days=1), now=NOW) == NOW - timedelta(days=1)
    later = NOW + timedelta(hours=5)
    assert evaluate(_.signup_at > Now - timedelta(hours=1), now=later, signup_at=NOW) is False
    assert evaluate(_.signup_at > Now - timedelta(hours=6), now=later, signup_at=NOW) is True


def test_naive_datetime_literals_are_utc() -> None:
    cutoff = datetime(2026, 1, 1)  # naive on purpose
    assert evaluate(_.signup_at > cutoff, signup_at=NOW) is True
    assert evaluate(_.signup_at == datetime(2026, 1, 10, 12), signup_at=NOW) is True


def test_naive_datetimes_inside_is_in_are_utc_too() -> None:
    naive = datetime(2026, 1, 10, 12)  # naive on purpose
    assert evaluate(_.signup_at.is_in([naive]), signup_at=NOW) is True
    assert evaluate(_.signup_at.is_in([datetime(2026, 1, 10, 13)]), signup_at=NOW) is False


# --- has-many rows: filters, projections, aggregations ------------------------------------


def test_a_filter_keeps_a_row_only_when_true() -> None:
    data = rows(1.0, 5.0, None, 10.0)
    assert evaluate(_.transactions[_.amount > 2].count(), transactions=data) == 2
    # the null row fails `> 2` and `not (> 2)` alike
    assert evaluate(_.transactions[~(_.amount > 2)].count(), transactions=data) == 1


def test_a_bool_column_filter_drops_null_and_false() -> None:
    data = [
        {"id": "a", "is_fraud": True, "amount": 1.0},
        {"id": "b", "is_fraud": False, "amount": 2.0},
        {"id": "c", "is_fraud": None, "amount": 4.0},
        {"id": "d", "is_fraud": True, "amount": 8.0},
    ]
    assert evaluate(_.transactions[_.is_fraud].count(), transactions=data) == 2
    assert evaluate(_.transactions[_.is_fraud, _.amount].sum(), transactions=data) == 9.0


def test_several_filters_must_all_hold() -> None:
    data = rows(1.0, 5.0, 10.0, status="ok") + rows(7.0, status="declined")
    expression = _.transactions[_.status == "ok", _.amount > 2, _.amount].sum()
    assert evaluate(expression, transactions=data) == 15.0


def test_filters_see_the_query_time() -> None:
    data = [
        {"id": "a", "amount": 1.0, "ts": NOW - timedelta(hours=2)},
        {"id": "b", "amount": 2.0, "ts": NOW - timedelta(days=2)},
    ]
    expression = _.transactions[_.ts > Now - timedelta(days=1), _.amount].sum()
    assert evaluate(expression, transactions=data) == 1.0
    assert evaluate(expression, now=NOW + timedelta(hours=23), transactions=data) == 0
    assert evaluate(expression, now=NOW - timedelta(hours=36), transactions=data) == 3.0


def test_a_computed_child_column_is_evaluated_on_each_row() -> None:
    assert evaluate(_.transactions[_.doubled].sum(), transactions=rows(1.0, 2.5, None)) == 7.0


def test_projections_without_aggregation_are_rows() -> None:
    data = rows(1.0, 2.0, status="ok")
    assert evaluate(_.transactions[_.amount], transactions=data) == [1.0, 2.0]
    assert evaluate(_.transactions[_.amount > 1, _.amount, _.status], transactions=data) == [
        {"amount": 2.0, "status": "ok"}
    ]
    assert evaluate(_.transactions[_.amount > 1], transactions=data) == [data[1]]


@pytest.mark.parametrize(
    ("agg", "amounts", "expected"),
    [
        ("count", (), 0),
        ("count", (1.0, None, 3.0), 2),  # a projected column counts its non-null values
        ("sum", (), 0),
        ("sum", (None, None), 0),
        ("sum", (1.0, None, 3.0), 4.0),
        ("mean", (), None),
        ("mean", (None,), None),
        ("mean", (1.0, None, 2.0), 1.5),
        ("min", (), None),
        ("min", (3.0, None, -1.0), -1.0),
        ("max", (), None),
        ("max", (3.0, None, -1.0), 3.0),
        ("std", (), None),
        ("std", (5.0,), None),
        ("std", (5.0, None), None),
        ("std", (1.0, 2.0, 3.0, 4.0), statistics.stdev([1.0, 2.0, 3.0, 4.0])),
        ("distinct_count", (), 0),
        ("distinct_count", (1.0, 1.0, None, 2.0, None), 2),
    ],
)
def test_aggregations(agg: str, amounts: tuple[float | None, ...], expected: Any) -> None:
    result = evaluate(getattr(_.transactions[_.amount], agg)(), transactions=rows(*amounts))
    if isinstance(expected, float):
        assert result == pytest.approx(expected)
    else:
        assert result == expected


def test_count_counts_rows_and_count_of_a_column_counts_non_null_values() -> None:
    data = rows(1.0, None, 3.0, None)
    assert evaluate(_.transactions.count(), transactions=data) == 4
    assert evaluate(_.transactions[_.amount].count(), transactions=data) == 2
    # a filter without a projection still counts rows, nulls in other columns included
    assert evaluate(_.transactions[_.id != "t0"].count(), transactions=data) == 3
    assert evaluate(_.transactions[_.id != "t0", _.amount].count(), transactions=data) == 1


def test_std_is_the_sample_standard_deviation() -> None:
    result = evaluate(_.transactions[_.amount].std(), transactions=rows(2.0, 4.0))
    assert result == pytest.approx(math.sqrt(2))  # population std would be 1.0


def test_mean_is_exact_for_many_small_values() -> None:
    result = evaluate(_.transactions[_.amount].mean(), transactions=rows(*([0.1] * 10)))
    assert result == 0.1


def test_a_missing_has_many_value_aggregates_to_null() -> None:
    assert evaluate(_.transactions.count(), transactions=None) is None
    assert evaluate(_.transactions[_.amount].sum(), transactions=None) is None


def test_aggregates_combine_with_scalars() -> None:
    expression = _.transactions[_.amount].sum() / _.balance
    assert evaluate(expression, transactions=rows(2.0, 4.0), balance=3.0) == 2.0


@pytest.mark.parametrize(
    ("kind", "values", "expected"),
    [
        ("count", [1, 2, 2], 3),
        ("sum", [], 0),
        ("distinct_count", [1, 2, 2], 2),
        ("mean", [], None),
        ("std", [1], None),
    ],
)
def test_aggregate_values(kind: str, values: list[Any], expected: Any) -> None:
    assert aggregate_values(kind, values) == expected


def test_aggregate_values_rejects_unknown_kinds() -> None:
    with pytest.raises(DefinitionError, match="unknown aggregation 'median'"):
        aggregate_values("median", [1])


# --- windows ------------------------------------------------------------------------------


def test_windowed_features_count_rows_in_their_window() -> None:
    @features
    class User:
        id: str
        transactions: DataFrame[Transaction]
        txn_count: Windowed[int] = windowed_feature(
            "1d", "7d", expression=_.transactions[_.ts > _.window_start].count()
        )
        spend: Windowed[float] = windowed_feature(
            "1d",
            expression=_.transactions[_.ts > _.window_start, _.ts <= _.window_end, _.amount].sum(),
        )

    graph = Graph.build([User, Transaction])
    data = [
        {"id": "a", "amount": 1.0, "ts": NOW - timedelta(hours=2)},
        {"id": "b", "amount": 2.0, "ts": NOW - timedelta(days=3)},
        {"id": "c", "amount": 4.0, "ts": NOW - timedelta(days=10)},
        {"id": "d", "amount": 8.0, "ts": NOW + timedelta(hours=1)},
    ]

    def run(name: str) -> Any:
        bound = bind_feature(graph, "user", name)
        return compile_expression(bound.tree)([data], NOW, None)

    assert run("txn_count[1d]") == 2  # the future row passes `ts > now - 1d`
    assert run("txn_count[7d]") == 3
    assert run("spend[1d]") == 1.0  # window_end = now drops the future row


# --- unbound trees ------------------------------------------------------------------------


def test_unbound_trees_cannot_be_compiled() -> None:
    with pytest.raises(DefinitionError, match="bind it to a feature class first"):
        compile_expression(_.balance + 1)


def test_unknown_functions_cannot_be_compiled() -> None:
    with pytest.raises(DefinitionError, match=r"unknown function 'str\.reverse'"):
        compile_expression(ex.Call("str.reverse", (ex.Lit("x"),)))
