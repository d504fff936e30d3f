"""The fraud example end to end, checked against the SQLite data read independently."""

import hashlib
import re
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

import kairos as kr
from examples.fraud import demo
from examples.fraud.generate import ANCHOR, generate
from examples.fraud.resolvers import DB_PATH

PROJECT = Path(demo.__file__).parent
USERS = [f"u{i:04d}" for i in range(1, 201)]


@pytest.fixture(scope="module")
def client() -> Iterator[kr.Client]:
    generate()
    with kr.Client(PROJECT) as client:
        client.models.warm()  # as `kairos serve` does: a cold model load is not a 5 s timeout
        yield client


def independent_aggregates(uid: str, now: datetime) -> dict[str, object]:
    """The three aggregates, the slow obvious way, straight from the file."""
    with sqlite3.connect(DB_PATH) as db:
        rows = db.execute(
            "select amount, status, ts from transactions where user_id = ?", (uid,)
        ).fetchall()
    events = [(amount, status, datetime.fromisoformat(ts)) for amount, status, ts in rows]

    def within(ts: datetime, days: int) -> bool:
        return now - timedelta(days=days) < ts <= now

    last_90 = [amount for amount, _, ts in events if within(ts, 90)]
    return {
        "user.txn_count[1d]": sum(1 for _, _, ts in events if within(ts, 1)),
        "user.declines[7d]": sum(1 for _, s, ts in events if s == "declined" and within(ts, 7)),
        "user.avg_ticket[90d]": sum(last_90) / len(last_90) if last_90 else None,
    }


def test_generation_is_deterministic(tmp_path: Path) -> None:
    first = generate(tmp_path / "a.db", users=20, seed=3)
    second = generate(tmp_path / "b.db", users=20, seed=3)
    other = generate(tmp_path / "c.db", users=20, seed=4)

    def dump(path: Path) -> str:
        with sqlite3.connect(path) as db:
            text = "\n".join(db.iterdump())
        return hashlib.sha256(text.encode()).hexdigest()

    assert dump(first) == dump(second)
    assert dump(first) != dump(other)


@pytest.mark.parametrize("now", [ANCHOR, ANCHOR - timedelta(days=10, hours=5)])
def test_aggregates_match_the_data_for_every_user(client: kr.Client, now: datetime) -> None:
    outputs = ["user.txn_count[1d]", "user.declines[7d]", "user.avg_ticket[90d]"]
    bulk = client.query_bulk(
        {"user.id": USERS}, outputs, now=now, staleness={o: "0s" for o in outputs}
    )
    assert bulk.errors == []
    nonzero = 0
    for index, uid in enumerate(USERS):
        expected = independent_aggregates(uid, now)
        got = bulk.row(index)
        assert got["user.txn_count[1d]"].value == expected["user.txn_count[1d]"], uid
        assert got["user.declines[7d]"].value == expected["user.declines[7d]"], uid
        average = expected["user.avg_ticket[90d]"]
        if average is None:
            assert got["user.avg_ticket[90d]"].value is None, uid
        else:
            assert got["user.avg_ticket[90d]"].value == pytest.approx(average, rel=1e-12), uid
        nonzero += bool(expected["user.txn_count[1d]"])
    assert nonzero > 5  # the data exercises the windows, not just zeros


def test_rows_after_now_never_count(client: kr.Client) -> None:
    # Every user has transactions after ANCHOR; a query at ANCHOR must not see them, and a
    # query a week later must.
    later = ANCHOR + timedelta(days=7)
    early = client.query({"user.id": "u0002"}, ["user.txn_count[7d]"], now=ANCHOR)
    late = client.query({"user.id": "u0002"}, ["user.txn_count[7d]"], now=later)
    assert early.get_value("user.txn_count[7d]") == independent_count(ANCHOR)
    assert late.get_value("user.txn_count[7d]") == independent_count(later)
    assert late.get_value("user.txn_count[7d]") >= 2


def independent_count(now: datetime) -> int:
    with sqlite3.connect(DB_PATH) as db:
        rows = db.execute("select ts from transactions where user_id = 'u0002'").fetchall()
    return sum(1 for (ts,) in rows if now - timedelta(days=7) < datetime.fromisoformat(ts) <= now)


def test_risk_is_a_probability_computed_from_the_aggregates(client: kr.Client) -> None:
    result = client.query(
        {"user.id": "u0005"}, ["user.risk"], now=ANCHOR, staleness={"user.risk": "0s"}
    )
    risk = result.get_value("user.risk")
    assert 0.0 <= risk <= 1.0
    assert result.get("user.risk").source == "model:risk:user.risk"
    assert result.errors == []
    # the same number as the registered model called directly on the same inputs
    model = client.models.get("risk", alias="prod")
    inputs = client.query({"user.id": "u0005"}, list(model.schema.inputs), now=ANCHOR).values
    [direct] = client.models.predict("risk", [inputs], alias="prod")
    assert risk == pytest.approx(direct, abs=1e-12)
    logged = client.log.get(result.meta.query_id)
    assert logged is not None and logged.outputs["user.risk"].version == model.label


def test_the_risk_model_was_trained_on_point_in_time_rows(client: kr.Client) -> None:
    model = client.models.get("risk", alias="prod")
    assert model.framework == "sklearn" and model.format == "skops"
    assert model.schema.inputs == (
        "user.txn_count[1d]",
        "user.txn_count[7d]",
        "user.declines[7d]",
        "user.avg_ticket[90d]",
        "user.account_age_days",
    )
    assert model.schema.classes == (0, 1) and model.schema.output == "probability"
    assert model.metadata["rows"] == 200 * 8
    assert 0.5 < model.metadata["train_accuracy"] <= 1.0


def test_unknown_user_is_an_error_for_its_features_only(client: kr.Client) -> None:
    result = client.query({"user.id": "nobody"}, ["user.name", "user.txn_count[1d]"], now=ANCHOR)
    assert result.get_value("user.txn_count[1d]") == 0
    [error] = result.errors
    assert error.feature == "user.name"
    assert error.code == "resolver_error"
    assert "found no row for id='nobody'" in error.message


def test_second_query_is_served_from_the_cache(client: kr.Client) -> None:
    outputs = ["user.txn_count[1d]", "user.risk"]
    first = client.query({"user.id": "u0042"}, outputs, now=ANCHOR + timedelta(hours=1))
    again = client.query({"user.id": "u0042"}, outputs, now=ANCHOR + timedelta(hours=1, seconds=59))
    assert first.meta.cache_hits == 0
    assert again.meta.cache_hits == len(outputs)
    assert again.values == first.values
    assert all(fv.observed_at == first.meta.now for fv in again)


def test_demo_prints_values_cache_hits_and_trace(capsys: pytest.CaptureFixture[str]) -> None:
    demo.main()
    out = capsys.readouterr().out
    assert "POST /v1/query/plan" in out and "model:risk:user.risk" in out
    assert "POST /v1/models/risk/predict with u0001's inputs" in out
    assert "6 of 6 features from the cache" in out
    assert "Trace of the first query" in out
    assert "POST /v1/query/bulk: 200 users" in out and "0 errors" in out
    assert "Server stopped (kairos stopped; query log flushed)" in out
    assert re.search(r"its log on stderr has [1-9][0-9]* access lines", out)  # one a request
    assert "Read back from fraud/.kairos/query_log.db after the stop" in out
