# mypy: disable-error-code="attr-defined, assignment"
"""The vectorized evaluator (rows held as Arrow columns) against the row engine: the same
answers over random frames with nulls, NaN, ties, empty windows and int64 edges. Integers
(and their types) must match exactly; floats to within one ulp (they match exactly here)."""

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kairos import DataFrame, FeatureTime, Now, Windowed, _, feature, features, windowed
from kairos.definitions import expressions as ex
from kairos.definitions.binding import bind_feature
from kairos.definitions.graph import Graph
from kairos.engine import columnar
from kairos.engine.evaluate import aggregate_values, compile_expression
from kairos.engine.rows import normalize_rows

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
HOUR = timedelta(hours=1)


@features(namespace="event")
class Event:
    id: str
    owner_id: "Owner.id"
    amount: float | None
    qty: int | None
    kind: str | None
    flag: bool | None
    ts: FeatureTime


AGGREGATES = ("count", "sum", "mean", "min", "max", "std", "distinct_count")
FILTERS: list[Any] = [
    None,
    _.kind == "a",
    _.flag,
    ~_.flag,
    _.amount > 0.5,
    (_.qty > 3) | _.flag,
    (_.amount <= 1.0) & (_.kind != "b"),
    _.amount.is_null(),
    _.qty.is_not_null(),
    _.kind.is_in(["a", "é"]),
    _.qty * 2 > 5,
    _.amount / 2 > 0.1,
    _.qty + 1.5 > 2,
    _.kind.str.startswith("a"),
    _.ts > Now - timedelta(hours=30),
]
PROJECTIONS: list[Any] = [
    _.amount, _.qty, _.kind, _.ts, _.amount * 2, _.qty + 1, _.amount + _.qty,
    _.kind.str.len(),
]  # fmt: skip


def _expressions() -> dict[str, Any]:
    found: dict[str, Any] = {}
    for f, where in enumerate(FILTERS):
        window = [_.ts > Now - timedelta(hours=1 + 7 * f)]
        items = window + ([where] if where is not None else [])
        found[f"c{f}"] = _.events[(*items,)].count()
        for p, column in enumerate(PROJECTIONS):
            every = p < 2  # every aggregate of amount and qty, one of each other projection
            for fn in AGGREGATES if every else (AGGREGATES[(f + p) % len(AGGREGATES)],):
                found[f"{fn}_{f}_{p}"] = getattr(_.events[(*items, column)], fn)()
    return found


EXPRESSIONS = _expressions()


@features(namespace="owner")
class Owner:
    id: str
    events: DataFrame[Event]
    recent: Windowed[int] = windowed(
        "1h", "1d", "30d", expression=_.events[_.ts > _.window_start].count()
    )
    spent: Windowed[float | None] = windowed(
        "1d", "30d", expression=_.events[_.flag, _.amount, _.ts > _.window_start].sum()
    )
    locals().update({name: feature(expression=e) for name, e in EXPRESSIONS.items()})
    __annotations__.update(dict.fromkeys(EXPRESSIONS, Any))


GRAPH = Graph.build([Owner, Event])
NAMES = [*EXPRESSIONS, "recent[1h]", "recent[1d]", "recent[30d]", "spent[1d]", "spent[30d]"]
TREES = {name: bind_feature(GRAPH, "owner", name).tree for name in NAMES}
INFO = GRAPH.feature("owner", "events")

floats = st.one_of(
    st.none(),
    st.sampled_from([0.0, -0.0, 1.0, 0.5, -2.25, math.nan, math.inf, -math.inf, 1e308, 0.1]),
    st.floats(allow_nan=True, allow_infinity=False, width=64),
)
ints = st.one_of(
    st.none(),
    st.sampled_from([0, 1, 3, -3, 2**62, -(2**62), 2**63 - 1, -(2**63), 2**53 + 1]),
    st.integers(-10, 10),
)
row = st.fixed_dictionaries(
    {
        "amount": floats,
        "qty": ints,
        "kind": st.sampled_from([None, "a", "b", "é", "ab"]),
        "flag": st.sampled_from([None, True, False]),
        "ts": st.one_of(
            st.integers(-60 * 24 * 40, 120).map(lambda m: NOW + timedelta(minutes=m)),
            st.none(),
        ),
    }
)


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return bool(a == b or abs(a - b) <= math.ulp(a))
    return a == b  # type: ignore[no-any-return]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row, max_size=30), st.booleans(), st.booleans())
def test_vectorized_matches_the_row_engine(
    raw: list[dict[str, Any]], ordered: bool, timed: bool
) -> None:
    rows = [{"id": f"e{i}", **r} for i, r in enumerate(raw)]
    if timed:  # every row has a time: a sorted column is searched, not masked
        rows = [{**r, "ts": r["ts"] or NOW - HOUR} for r in rows]
    if ordered:
        rows.sort(key=lambda r: (r["ts"] is None, r["ts"] or NOW))
    frame = normalize_rows(GRAPH, INFO, rows, NOW)
    assert frame.table is not None  # held as columns
    visible = [r for r in rows if r["ts"] is None or r["ts"] <= NOW]
    vectorized_runs = 0
    for name, tree in TREES.items():
        fn = compile_expression(tree)
        try:
            expected: Any = fn([visible], NOW, None)
        except Exception as error:  # the row engine raises: so must the vectorized one
            expected = type(error)
        try:
            got: Any = fn([frame], NOW, None)
        except Exception as error:  # the row engine raises: so must the vectorized one
            got = type(error)
        assert same(got, expected), (name, got, expected)
        direct = (
            columnar.compile_aggregate(tree, compile_expression)
            if isinstance(tree, ex.Agg)
            else None
        )
        if direct is not None:
            try:
                answer = direct(frame, [frame], NOW)
            except Exception:
                continue
            vectorized_runs += 1
            assert same(answer, expected), (name, answer, expected)
    assert vectorized_runs > len(TREES) // 2  # most of them ran vectorized, not row by row


def test_sum_adds_left_to_right_like_python() -> None:
    values = [1e16, 1.0, -1e16, 1.0] * 3 + [-0.0]
    frame = DataFrame.from_arrow(pa.table({"amount": pa.array(values)}))
    assert columnar.aggregate_array("sum", frame.to_arrow().column("amount").chunk(0)) == sum(
        values
    )
    assert columnar.aggregate_array("sum", pa.array([-0.0, -0.0])) == sum([-0.0, -0.0]) == 0.0
    assert math.copysign(1, columnar.aggregate_array("sum", pa.array([-0.0]))) == 1


@pytest.mark.parametrize(
    "values",
    [[math.nan, 1.0, 0.5], [1.0, math.nan, 0.5], [0.0, -0.0], [-0.0, 0.0], [2.0, 2.0, math.nan]],
)
def test_min_max_follow_pythons_rules_for_nan_and_signed_zero(values: list[float]) -> None:
    for fn, python in (("min", min), ("max", max)):
        got = columnar.aggregate_array(fn, pa.array(values))
        want = python(values)
        assert (math.isnan(got) and math.isnan(want)) or (
            got == want and math.copysign(1, got) == math.copysign(1, want)
        )


def test_int_sums_do_not_overflow() -> None:
    values = [2**63 - 1, 2**63 - 1, 5]
    assert columnar.aggregate_array("sum", pa.array(values)) == sum(values)


def test_float_sums_add_left_to_right_on_every_python() -> None:
    # a compensated sum (Python 3.12's sum()) would give 1.0; np.add.accumulate gives 0.0
    values = [1e16, 1.0, -1e16]
    assert aggregate_values("sum", values) == 0.0
    assert aggregate_values("sum", [1, 2**70, -(2**70)]) == 1  # ints stay exact
