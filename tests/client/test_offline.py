"""Offline queries that recompute each spine row as of its own time, on the fraud example."""

import random
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kairos as kr
from examples.fraud.generate import ANCHOR, generate
from kairos.stores.online import MemoryOnlineStore
from tests.examples.test_fraud import independent_aggregates

PROJECT = Path(__file__).parents[2] / "examples" / "fraud"
WINDOWED = ["user.txn_count[1d]", "user.declines[7d]", "user.avg_ticket[90d]"]
EXAMPLE_FEATURES = [*WINDOWED, "user.txn_count[7d]", "user.account_age_days", "user.risk"]


@pytest.fixture(scope="module")
def client() -> Iterator[kr.Client]:
    generate()
    with kr.Client(PROJECT, query_log="none://") as client:
        client.models.warm()  # as a server does: no query spends its timeout loading a model
        yield client


def test_every_row_matches_a_brute_force_oracle(client: kr.Client, engine: str) -> None:
    rng = random.Random(11)
    users = [f"u{i:04d}" for i in range(1, 41)]
    ts = [ANCHOR - timedelta(seconds=rng.randint(0, 150 * 86400)) for _ in range(120)]
    ts += [ts[0], ts[0], ANCHOR - timedelta(days=400)]  # ties, and a time before any event
    uids: list[str | None] = [rng.choice(users) for _ in ts]
    uids[1], ts[1] = uids[0], ts[0]  # a duplicate spine row
    uids[5] = None  # a null key
    result = client.offline_query({"user.id": uids, "ts": ts}, WINDOWED, engine=engine)

    assert len(result) == len(ts)
    rows = result.to_pylist()
    for index, (uid, when, row) in enumerate(zip(uids, ts, rows, strict=True)):
        assert row["user.id"] == uid and row["ts"] == when, index  # spine order, all rows kept
        if uid is None:
            assert all(row[name] is None for name in WINDOWED)
            continue
        expected = independent_aggregates(uid, when)
        assert row["user.txn_count[1d]"] == expected["user.txn_count[1d]"], index
        assert row["user.declines[7d]"] == expected["user.declines[7d]"], index
        average = expected["user.avg_ticket[90d]"]
        if average is None:
            assert row["user.avg_ticket[90d]"] is None, index
        else:
            assert row["user.avg_ticket[90d]"] == pytest.approx(average, rel=1e-12), index
    assert rows[0] == rows[1]
    assert rows[-1]["user.txn_count[1d]"] == 0 and rows[-1]["user.avg_ticket[90d]"] is None
    assert result.errors == []


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    user=st.integers(min_value=1, max_value=200),
    seconds_before=st.integers(min_value=-3 * 86400, max_value=130 * 86400),
)
def test_online_at_t_equals_offline_at_t(client: kr.Client, user: int, seconds_before: int) -> None:
    uid = f"u{user:04d}"
    when = ANCHOR - timedelta(seconds=seconds_before)
    online = client.query(
        {"user.id": uid},
        EXAMPLE_FEATURES,
        now=when,
        staleness=dict.fromkeys(EXAMPLE_FEATURES, "0s"),
    )
    offline = client.offline_query({"user.id": [uid], "ts": [when]}, EXAMPLE_FEATURES)
    [row] = offline.to_pylist()
    for name in EXAMPLE_FEATURES:
        assert row[name] == online.get_value(name), name


@pytest.mark.parametrize("kind", ["arrow", "pandas", "polars", "columns", "rows"])
def test_spines_in_every_format_give_the_same_rows(client: kr.Client, kind: str) -> None:
    uids = ["u0003", "u0001", "u0003"]
    ts = [ANCHOR, ANCHOR - timedelta(days=2), ANCHOR - timedelta(hours=5)]
    columns = {"user.id": uids, "ts": ts}
    spine: Any = columns
    if kind == "arrow":
        spine = pa.table(columns)
    elif kind == "pandas":
        spine = pd.DataFrame(columns)
    elif kind == "polars":
        spine = pl.DataFrame(columns)
    elif kind == "rows":
        spine = [{"user.id": u, "ts": t} for u, t in zip(uids, ts, strict=True)]
    result = client.offline_query(spine, ["user.txn_count[1d]"])
    expected = [
        independent_aggregates(u, t)["user.txn_count[1d]"] for u, t in zip(uids, ts, strict=True)
    ]
    assert result.column("user.txn_count[1d]") == expected
    assert result.to_pandas()["user.id"].tolist() == uids
    assert result.to_polars()["user.txn_count[1d]"].to_list() == expected


def test_a_custom_timestamp_column(client: kr.Client) -> None:
    result = client.offline_query(
        {"user.id": ["u0001"], "as_of": [ANCHOR]}, ["user.txn_count[1d]"], timestamp="as_of"
    )
    assert result.column("user.txn_count[1d]") == [
        independent_aggregates("u0001", ANCHOR)["user.txn_count[1d]"]
    ]


def test_offline_rows_never_touch_the_online_cache(tmp_path: Path) -> None:
    generate()
    store = MemoryOnlineStore()
    with kr.Client(PROJECT, online_store=store, query_log="none://") as client:
        client.offline_query({"user.id": ["u0001"], "ts": [ANCHOR]}, ["user.risk"])
        assert len(store) == 0
        client.query({"user.id": "u0001"}, ["user.risk"], now=ANCHOR)
        assert len(store) > 0


def test_bad_spines_are_clear_errors(client: kr.Client) -> None:
    with pytest.raises(kr.InvalidInput, match="no timestamp column 'ts'"):
        client.offline_query({"user.id": ["u0001"]}, ["user.risk"])
    with pytest.raises(kr.InvalidInput, match=r"spine row 0: ts='yesterday' is not a datetime"):
        client.offline_query({"user.id": ["u0001"], "ts": ["yesterday"]}, ["user.risk"])
    with pytest.raises(kr.InvalidInput, match=r"spine row 0, 'user.id'"):
        client.offline_query({"user.id": [7], "ts": [ANCHOR]}, ["user.risk"])
    with pytest.raises(kr.UnknownFeature, match=r"did you mean 'user\.risk'"):
        client.offline_query({"user.id": ["u0001"], "ts": [ANCHOR]}, ["user.rsk"])
    with pytest.raises(kr.InvalidInput, match=r"recompute names user\.name, which the query"):
        client.offline_query(
            {"user.id": ["u0001"], "ts": [ANCHOR]}, ["user.risk"], recompute=["user.name"]
        )


def test_an_empty_spine_gives_an_empty_table(client: kr.Client) -> None:
    empty: dict[str, list[datetime | str]] = {"user.id": [], "ts": []}
    assert len(client.offline_query(empty, ["user.risk"])) == 0


def test_offline_results_are_saved_as_versioned_datasets(tmp_path: Path) -> None:
    generate()
    with kr.Client(PROJECT, query_log="none://", offline_store="none://") as client:
        client.datasets.store.root = tmp_path  # keep the example folder clean
        spine = {"user.id": ["u0001", "u0002"], "ts": [ANCHOR, ANCHOR]}
        first = client.offline_query(spine, ["user.txn_count[1d]", "user.risk"])
        saved = client.datasets.save("training", first)
        second = client.datasets.save("training", client.offline_query(spine, ["user.risk"]))
        assert (saved.version, second.version) == (1, 2)
        loaded = client.datasets.get("training", 1)
        assert loaded.table.equals(first.table)
        assert loaded.query["outputs"] == ["user.txn_count[1d]", "user.risk"]
        assert loaded.query["spine_rows"] == 2
        assert len(loaded.definitions_hash) == 16
        assert client.datasets.get("training").version == 2
        assert client.datasets.names() == ["training"]
