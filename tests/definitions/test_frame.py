# mypy: disable-error-code="attr-defined, arg-type, call-arg, var-annotated"
"""`DataFrame`: every constructor gives the same rows and the same Arrow table; bad input is
refused naming the row or column and the fix; and the Chalk idiom (a resolver returning
`DataFrame([Transaction(id=..., amount=...)])`) answers windowed aggregates end to end."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

import kairos as kr
from kairos import DataFrame, FeatureTime, Windowed, _, features, online, windowed
from kairos.errors import InvalidValue

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
T0 = NOW - timedelta(days=3)
T1 = NOW - timedelta(hours=2)


@features(namespace="frame_txn")
class Transaction:
    id: str
    account_id: "Account.id"
    amount: float | None
    ts: FeatureTime


@features(namespace="frame_account")
class Account:
    id: str
    transactions: DataFrame[Transaction]
    count: Windowed[int] = windowed(
        "1d", "7d", expression=_.transactions[_.ts > _.window_start].count()
    )
    spent: Windowed[float] = windowed(
        "1d", "7d", expression=_.transactions[_.amount, _.ts > _.window_start].sum()
    )
    biggest: Windowed[float | None] = windowed(
        "7d", expression=_.transactions[_.amount, _.ts > _.window_start].max()
    )


ROWS = [
    {"id": "t1", "amount": 3.0, "ts": T0},
    {"id": "t2", "amount": None, "ts": T1},
    {"id": "t3", "amount": 4.5, "ts": T1},
]
COLUMNS = {
    "id": ["t1", "t2", "t3"],
    "amount": [3.0, None, 4.5],
    "ts": [T0, T1, T1],
}


def _constructed(kind: str) -> DataFrame[Any]:
    if kind == "dicts":
        return DataFrame(ROWS)
    if kind == "instances":
        return DataFrame([Transaction(**row) for row in ROWS])
    if kind == "columns":
        return DataFrame(COLUMNS)
    if kind == "feature_columns":  # keyed by the features themselves
        return DataFrame(
            {Transaction.id: COLUMNS["id"], Transaction.amount: COLUMNS["amount"],
             Transaction.ts: COLUMNS["ts"]}
        )  # fmt: skip
    table = pa.table(COLUMNS)
    if kind == "arrow":
        return DataFrame(table)
    if kind == "batch":
        return DataFrame(table.to_batches()[0])
    if kind == "pandas":
        return DataFrame(pd.DataFrame(COLUMNS))
    if kind == "polars":
        return DataFrame(pl.DataFrame(COLUMNS))
    if kind == "frame":
        return DataFrame(DataFrame(ROWS))
    raise AssertionError(kind)


KINDS = [
    "dicts", "instances", "columns", "feature_columns", "arrow", "batch", "pandas", "polars",
    "frame",
]  # fmt: skip


def _plain(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # pandas keeps a missing float as NaN and a time as a pandas Timestamp
    return [
        {
            k: None if v != v else (v.to_pydatetime() if hasattr(v, "to_pydatetime") else v)
            for k, v in row.items()
        }
        for row in rows
    ]


@pytest.mark.parametrize("kind", KINDS)
def test_every_constructor_gives_the_same_rows_columns_and_table(kind: str) -> None:
    frame = _constructed(kind)
    assert len(frame) == 3
    assert frame.columns == ["id", "amount", "ts"]
    assert _plain(list(frame)) == ROWS
    assert frame["id"] == ["t1", "t2", "t3"]
    assert frame[Transaction.id] == ["t1", "t2", "t3"]
    assert frame["missing"] == [None, None, None]
    table = frame.to_arrow()
    assert table.num_rows == 3 and table.column_names == ["id", "amount", "ts"]
    assert table.column("amount").null_count == 1  # pandas NaN as a missing value too
    assert table.column("id").to_pylist() == ["t1", "t2", "t3"]
    assert _plain(frame.to_polars().to_dicts()) == ROWS
    assert _plain(frame.to_pandas().to_dict("records")) == ROWS


def test_a_frame_from_dicts_is_equal_to_one_from_an_arrow_table_and_to_its_rows() -> None:
    assert DataFrame(ROWS) == DataFrame(pa.table(COLUMNS))
    assert DataFrame(ROWS) == ROWS
    assert DataFrame(ROWS) != DataFrame(ROWS[:2])
    assert hash(DataFrame(ROWS)) == hash(DataFrame(pa.table(COLUMNS)))


def test_a_frame_from_columns_makes_row_dicts_only_when_iterated() -> None:
    frame = DataFrame(pa.table(COLUMNS))
    assert frame.table is not None and frame._rows is None
    assert frame["amount"] == [3.0, None, 4.5] and frame._rows is None
    assert len(frame) == 3 and frame._rows is None
    assert next(iter(frame)) == ROWS[0] and frame._rows is not None


def test_empty_frames() -> None:
    assert len(DataFrame()) == 0 and list(DataFrame()) == [] and DataFrame().columns == []
    assert DataFrame([]).to_arrow().num_rows == 0
    assert len(DataFrame({"amount": []})) == 0


def test_a_row_that_is_neither_a_dict_nor_a_feature_instance_names_its_index_and_the_fix() -> None:
    with pytest.raises(InvalidValue, match=r"row 1 of a DataFrame is a tuple.*Transaction\(id="):
        DataFrame([{"id": "t1"}, ("t2", 3.0)])
    with pytest.raises(InvalidValue, match=r"row 0 of a DataFrame is a str \('t1'\)"):
        DataFrame(["t1"])


def test_columns_of_different_lengths_are_refused_naming_each_length() -> None:
    with pytest.raises(InvalidValue, match=r"one length each.*'id': 2, 'amount': 1"):
        DataFrame({"id": ["t1", "t2"], "amount": [1.0]})


def test_a_column_of_mixed_types_is_refused_with_the_fix() -> None:
    with pytest.raises(InvalidValue, match="give each column one type"):
        DataFrame({"amount": [1.0, "lots"]}).to_arrow()
    with pytest.raises(InvalidValue, match=r"column id with type object.*one type"):
        DataFrame(pd.DataFrame({"id": ["t1", 2]}))  # an InvalidValue, not Arrow's own error


# --- the Chalk idiom, end to end through a client ----------------------------------------


@online
def account_transactions(aid: Account.id) -> DataFrame[Transaction]:
    ids = {"a1": range(6), "a2": range(0)}[aid]
    return DataFrame(
        [
            Transaction(id=f"t{i}", amount=None if i == 4 else 10.0 * i + 0.5,
                        ts=NOW - timedelta(hours=10 * i + 1))
            for i in ids
        ]
        + ([Transaction(id="late", amount=1e9, ts=NOW + timedelta(minutes=1))] if ids else [])
    )  # fmt: skip


def test_a_resolver_returning_feature_instances_answers_windowed_aggregates() -> None:
    client = kr.Client(
        definitions=[Transaction, Account, account_transactions], query_log="none://"
    )
    try:
        outputs = [
            "frame_account.count[1d]", "frame_account.count[7d]", "frame_account.spent[1d]",
            "frame_account.spent[7d]", "frame_account.biggest[7d]",
        ]  # fmt: skip
        result = client.query({"frame_account.id": "a1"}, outputs, now=NOW)
        assert not result.errors
        # hours before NOW: 1, 11, 21, 31, 41 (amount None), 51; the row after NOW is unseen
        assert [result.get_value(o) for o in outputs] == [
            3, 6, 0.5 + 10.5 + 20.5, 0.5 + 10.5 + 20.5 + 30.5 + 50.5, 50.5,
        ]  # fmt: skip
        empty = client.query({"frame_account.id": "a2"}, outputs, now=NOW)
        assert not empty.errors
        assert [empty.get_value(o) for o in outputs] == [0, 0, 0, 0, None]
        rows = client.query(
            {"frame_account.id": "a1"}, ["frame_account.transactions"], now=NOW
        ).get_value("frame_account.transactions")
        assert [r["id"] for r in rows] == ["t0", "t1", "t2", "t3", "t4", "t5"]
    finally:
        client.close()


def test_an_arrow_table_naming_a_column_twice_is_refused_naming_it() -> None:
    @online
    def doubled(aid: Account.id) -> DataFrame[Transaction]:
        return DataFrame(
            pa.table({"id": ["t1"], "amount": [1.0], "frame_txn.amount": [2.0], "ts": [T0]})
        )

    with kr.Client(definitions=[Transaction, Account, doubled], query_log="none://") as client:
        result = client.query({"frame_account.id": "a1"}, ["frame_account.transactions"], now=NOW)
    (error,) = result.errors
    assert error.code == "invalid_value" and "'amount' twice" in error.message
