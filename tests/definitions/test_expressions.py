"""`_` expressions: immutable, hashable trees built by operators; nothing is evaluated."""

import copy
import dataclasses
import pickle
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest

import kairos as kr
from kairos import DefinitionError, Now, _
from kairos.definitions import expressions as ex
from kairos.definitions.expressions import AGGREGATIONS, Agg, BinOp, Call, Col, Lit, NowRef, Select

# --- the `_` root -------------------------------------------------------------------------


def test_attributes_of_underscore_are_columns() -> None:
    assert isinstance(_.amount, Col)
    assert _.amount.path == ("amount",)
    assert _.user.name.path == ("user", "name")
    assert _.user.account.tier.path == ("user", "account", "tier")
    assert repr(_.user.name) == "_.user.name"


def test_a_string_item_picks_a_window() -> None:
    column = _.txn_count["7d"]
    assert isinstance(column, Col)
    assert (column.path, column.window) == (("txn_count",), "7d")
    assert repr(column) == "_.txn_count['7d']"


def test_dunder_lookups_are_not_columns() -> None:
    with pytest.raises(AttributeError):
        _.__wrapped__  # noqa: B018
    with pytest.raises(AttributeError):
        _.amount.__wrapped__  # noqa: B018


def test_underscore_alone_is_not_an_expression() -> None:
    with pytest.raises(DefinitionError, match="`_` alone is not an expression"):
        ex.lift(_)
    with pytest.raises(DefinitionError, match="`_` alone is not an expression"):
        _.amount + _


# --- immutability, structural equality and hashing ----------------------------------------


def test_nodes_are_frozen() -> None:
    node = _.amount + 1
    assert isinstance(node, BinOp)
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.op = "-"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        _.amount.path = ("other",)


def test_equal_trees_are_the_same_and_hash_alike() -> None:
    def build() -> Any:
        return kr.if_then_else(
            (_.transactions[_.status == "ok", _.amount].sum() > 10) & ~_.blocked,
            _.name.str.lower(),
            kr.coalesce(_.nickname, "anon"),
        )

    a, b = build(), build()
    assert a is not b
    assert a.same_as(b)
    assert hash(a) == hash(b)
    assert a.key() == b.key()


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (_.amount + 1, _.amount + 2),
        (_.amount + 1, _.amount - 1),
        (_.amount + 1, 1 + _.amount),
        (_.amount + 1, _.amount + 1.0),
        (_.amount == 1, _.amount == True),  # noqa: E712 - builds a node, not a comparison
        (_.amount, _.amounts),
        (_.txn_count["1d"], _.txn_count["7d"]),
        (_.transactions[_.amount].sum(), _.transactions[_.amount].mean()),
        (_.transactions[_.amount].sum(), _.transactions[_.fee].sum()),
        (_.name.str.lower(), _.name.str.upper()),
        (kr.coalesce(_.a, _.b), kr.coalesce(_.b, _.a)),
    ],
)
def test_different_trees_are_not_the_same(left: ex.Expr, right: ex.Expr) -> None:
    assert not left.same_as(right)
    assert left.key() != right.key()


def test_same_as_rejects_non_expressions() -> None:
    assert not Lit(1).same_as(1)
    assert not _.amount.same_as("_.amount")


def test_keys_work_as_cache_keys() -> None:
    cache = {(_.amount * 2).key(): "doubled"}
    assert cache[(_.amount * 2).key()] == "doubled"
    assert (_.amount * 3).key() not in cache


def test_unhashable_literals_still_have_a_key() -> None:
    node = Lit([1, 2])
    assert node.same_as(Lit([1, 2]))
    assert hash(node) == hash(Lit([1, 2]))


def test_trees_survive_pickle_and_deepcopy() -> None:
    tree = _.transactions[_.ts > Now - timedelta(days=1), _.amount].sum() / _.balance
    assert pickle.loads(pickle.dumps(tree)).same_as(tree)
    assert copy.deepcopy(tree).same_as(tree)


# --- truth value --------------------------------------------------------------------------


def test_an_expression_has_no_truth_value() -> None:
    with pytest.raises(DefinitionError, match=r"use & \| ~ instead of and / or / not"):
        bool(_.amount > 1)


def test_and_or_not_keywords_are_refused() -> None:
    with pytest.raises(DefinitionError, match=r"kr\.if_then_else"):
        _.a > 1 and _.b > 1  # noqa: B018
    with pytest.raises(DefinitionError):
        not _.flag  # noqa: B018


def test_chained_comparisons_are_refused() -> None:
    # `a < b < c` is `a < b and b < c` in Python, which needs a truth value
    with pytest.raises(DefinitionError):
        0 < _.amount < 10  # noqa: B015


def test_equality_builds_a_node() -> None:
    node = _.status == "ok"
    assert isinstance(node, BinOp)
    assert (node.op, node.right.key()) == ("==", ("lit", "str", "ok"))


# --- operators ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "op"),
    [
        (lambda a: a + 2, "+"),
        (lambda a: a - 2, "-"),
        (lambda a: a * 2, "*"),
        (lambda a: a / 2, "/"),
        (lambda a: a // 2, "//"),
        (lambda a: a % 2, "%"),
        (lambda a: a**2, "**"),
        (lambda a: a == 2, "=="),
        (lambda a: a != 2, "!="),
        (lambda a: a < 2, "<"),
        (lambda a: a <= 2, "<="),
        (lambda a: a > 2, ">"),
        (lambda a: a >= 2, ">="),
        (lambda a: a & 2, "&"),
        (lambda a: a | 2, "|"),
    ],
)
def test_binary_operators(build: Callable[[Any], Any], op: str) -> None:
    node = build(_.x)
    assert isinstance(node, BinOp)
    assert node.op == op
    assert node.left.same_as(_.x)
    assert node.right.same_as(Lit(2))


@pytest.mark.parametrize(
    ("build", "op"),
    [
        (lambda a: 2 + a, "+"),
        (lambda a: 2 - a, "-"),
        (lambda a: 2 * a, "*"),
        (lambda a: 2 / a, "/"),
        (lambda a: True & a, "&"),
        (lambda a: False | a, "|"),
    ],
)
def test_reflected_operators_keep_operand_order(build: Callable[[Any], Any], op: str) -> None:
    node = build(_.x)
    assert isinstance(node, BinOp)
    assert node.op == op
    assert isinstance(node.left, Lit)
    assert node.right.same_as(_.x)


def test_reflected_comparison_flips() -> None:
    # Python turns `2 < _.x` into `_.x > 2`
    assert (2 < _.x).same_as(_.x > 2)  # noqa: SIM300


@pytest.mark.parametrize(
    ("node", "fn"),
    [
        (-_.x, "neg"),
        (abs(_.x), "abs"),
        (_.x.abs(), "abs"),
        (~_.x, "not"),
        (_.x.is_null(), "is_null"),
        (_.x.is_not_null(), "is_not_null"),
    ],
)
def test_unary_calls(node: ex.Expr, fn: str) -> None:
    assert isinstance(node, Call)
    assert node.fn == fn
    assert len(node.args) == 1
    assert node.args[0].same_as(_.x)


def test_helper_calls_lift_their_arguments() -> None:
    assert _.x.fill_null(0).same_as(Call("fill_null", (_.x, Lit(0))))
    assert _.x.round(2).same_as(Call("round", (_.x, Lit(2))))
    assert _.x.round().same_as(Call("round", (_.x, Lit(0))))
    assert _.x.is_in(["a", "b"]).same_as(Call("is_in", (_.x, Lit(("a", "b")))))


def test_if_then_else_and_coalesce() -> None:
    node = kr.if_then_else(_.amount > 100, "big", "small")
    assert node.same_as(Call("if_then_else", (_.amount > 100, Lit("big"), Lit("small"))))
    assert kr.coalesce(_.a, _.b, 0).same_as(Call("coalesce", (_.a, _.b, Lit(0))))


@pytest.mark.parametrize(
    ("build", "fn", "args"),
    [
        (lambda e: e.str.lower(), "str.lower", ()),
        (lambda e: e.str.upper(), "str.upper", ()),
        (lambda e: e.str.strip(), "str.strip", ()),
        (lambda e: e.str.len(), "str.len", ()),
        (lambda e: e.str.contains("x"), "str.contains", ("x",)),
        (lambda e: e.str.startswith("x"), "str.startswith", ("x",)),
        (lambda e: e.str.endswith("x"), "str.endswith", ("x",)),
        (lambda e: e.str.concat("-", 1), "str.concat", ("-", 1)),
        (lambda e: e.dt.year(), "dt.year", ()),
        (lambda e: e.dt.month(), "dt.month", ()),
        (lambda e: e.dt.day(), "dt.day", ()),
        (lambda e: e.dt.hour(), "dt.hour", ()),
        (lambda e: e.dt.weekday(), "dt.weekday", ()),
        (lambda e: e.dt.date(), "dt.date", ()),
        (lambda e: e.dt.total_seconds(), "dt.total_seconds", ()),
        (lambda e: e.dt.days(), "dt.days", ()),
    ],
)
def test_str_and_dt_functions(build: Callable[[Any], Any], fn: str, args: tuple[Any, ...]) -> None:
    node = build(_.x)
    assert node.same_as(Call(fn, (_.x, *(Lit(a) for a in args))))


@pytest.mark.parametrize("name", AGGREGATIONS)
def test_aggregations(name: str) -> None:
    base = _.transactions[_.amount]
    node = getattr(base, name)()
    assert isinstance(node, Agg)
    assert node.fn == name
    assert node.base.same_as(base)
    assert repr(node) == f"_.transactions[_.amount].{name}()"


def test_the_aggregations() -> None:
    assert AGGREGATIONS == ("count", "sum", "mean", "min", "max", "std", "distinct_count")


def test_items_filter_and_project_a_has_many_feature() -> None:
    node = _.transactions[_.status == "ok", _.amount]
    assert isinstance(node, Select)
    assert node.base.same_as(_.transactions)
    assert len(node.items) == 2
    assert node.items[0].same_as(_.status == "ok")
    assert node.items[1].same_as(_.amount)
    assert repr(node) == "_.transactions[(_.status == 'ok'), _.amount]"


def test_one_item_is_a_one_item_select() -> None:
    node = _.transactions[_.amount]
    assert isinstance(node, Select)
    assert len(node.items) == 1


# --- literals and Now ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        3,
        2.5,
        "x",
        date(2026, 1, 1),
        datetime(2026, 1, 1, tzinfo=UTC),
        timedelta(hours=1),
    ],
)
def test_plain_values_lift_to_literals(value: Any) -> None:
    node = ex.lift(value)
    assert isinstance(node, Lit)
    assert node.value == value


@pytest.mark.parametrize("value", [[1, 2], (1, 2), {1, 2}, frozenset({1, 2})])
def test_collections_lift_to_tuples(value: Any) -> None:
    node = ex.lift(value)
    assert isinstance(node, Lit)
    assert sorted(node.value) == [1, 2]
    assert isinstance(node.value, tuple)


@pytest.mark.parametrize("value", [object(), {"a": 1}, b"bytes", 1j])
def test_other_values_cannot_be_lifted(value: Any) -> None:
    with pytest.raises(DefinitionError, match="cannot be used in an expression"):
        _.x + value


def test_now_minus_a_timedelta_is_an_expression() -> None:
    node = Now - timedelta(days=1)
    assert isinstance(node, BinOp)
    assert node.same_as(BinOp("-", NowRef(), Lit(timedelta(days=1))))
    assert repr(node) == "(Now - datetime.timedelta(days=1))"


def test_now_takes_part_in_expressions() -> None:
    assert (_.ts > Now).same_as(BinOp(">", _.ts, NowRef()))
    assert (Now + timedelta(hours=1)).same_as(BinOp("+", NowRef(), Lit(timedelta(hours=1))))
    assert (Now - _.signup_at).same_as(BinOp("-", NowRef(), _.signup_at))
    assert (Now >= _.ts).same_as(BinOp(">=", NowRef(), _.ts))
    then = datetime(2026, 1, 1, tzinfo=UTC)
    assert (then - Now).same_as(BinOp("-", Lit(then), NowRef()))
    assert ex.lift(Now).same_as(NowRef())


def test_filtering_by_a_relative_time_builds_the_tree() -> None:
    node = _.transactions[_.ts > Now - timedelta(days=1)].count()
    expected = Agg(
        "count",
        Select(_.transactions, (BinOp(">", _.ts, BinOp("-", NowRef(), Lit(timedelta(days=1)))),)),
    )
    assert node.same_as(expected)
