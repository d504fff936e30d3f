"""Replay on the fraud example (SQLite source, SQL resolvers, windows over a has-many, a
registered model): logged decisions re-run as of their `now` see exactly what they saw, even
after the source changed under them, and a new model version gives that version's predict
on the logged inputs, row by row."""

import json
import shutil
import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import kairos as kr
import kairos.client.replay as replay_module
from examples.fraud import demo
from examples.fraud.generate import ANCHOR, generate
from kairos.cli.main import main
from kairos.cli.replay import model_pins
from kairos.errors import InvalidInput, KairosError
from kairos.stores.query_log import Search

EXAMPLE = Path(demo.__file__).parent
USERS = [f"u{i:04d}" for i in range(1, 31)]
INPUTS = [
    "user.txn_count[1d]",
    "user.txn_count[7d]",
    "user.declines[7d]",
    "user.avg_ticket[90d]",
    "user.account_age_days",
]
DERIVED = ["user.txn_count[7d]", "user.declines[7d]", "user.avg_ticket[90d]"]
READ = ["user.transactions", "user.signup_at", "user.name", "user.email"]


def pipeline(seed: int) -> Any:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(200, 5)) * [1, 3, 2, 80, 300] + [0, 3, 1, 120, 500]
    score = x @ rng.normal(size=5)
    y = (score > np.median(score)).astype(int)
    model = make_pipeline(SimpleImputer(), StandardScaler(), LogisticRegression(max_iter=500))
    return model.fit(x, y)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fraud")
    for item in EXAMPLE.iterdir():
        if item.suffix in (".py", ".sql", ".yaml"):
            shutil.copy(item, folder / item.name)
    generate(folder / "data" / "fraud.db", users=len(USERS), seed=11)
    with kr.Client(folder) as client:
        client.models.register("risk", pipeline(1), aliases=["prod"], inputs=INPUTS)
        client.models.register("risk", pipeline(2), inputs=INPUTS)
    return folder


@pytest.fixture
def client(project: Path) -> Iterator[kr.Client]:
    shutil.rmtree(project / ".kairos", ignore_errors=True)  # a fresh query log per test
    generate(project / "data" / "fraud.db", users=len(USERS), seed=11)  # and fresh data
    with kr.Client(project) as client:
        yield client


def decide(client: kr.Client, hours: int = 0) -> kr.BulkResult:
    """Every user's risk at ANCHOR - hours, computed (no cache)."""
    return client.query_bulk(
        {"user.id": USERS},
        ["user.risk", *DERIVED],
        now=ANCHOR - timedelta(hours=hours),
        staleness={name: "0s" for name in ["user.risk", *INPUTS, *READ]},
    )


def change_the_source(project: Path) -> None:
    """Rows updated and deleted after the decisions were served."""
    with sqlite3.connect(project / "data" / "fraud.db") as db:
        db.execute("update transactions set amount = amount * 10, status = 'declined'")
        db.execute("delete from transactions where rowid % 3 = 0")
        db.execute("update users set signup_at = '2020-01-01T00:00:00+00:00'")


def test_a_new_model_version_is_its_predict_on_the_logged_inputs(
    client: kr.Client, project: Path
) -> None:
    served = decide(client)
    assert served.errors == []
    change_the_source(project)  # the replay must not see this
    result = client.replay(since=ANCHOR - timedelta(days=1), models={"risk": 2})
    assert result.decisions == len(USERS)
    assert result.changed == ("user.risk",)
    assert set(result.recomputed) == {"user.risk"}
    records = {r.query_id: r for r in result.records}
    rows = [r for r in result.rows if r.feature == "user.risk"]
    assert len(rows) == len(USERS)
    matrix = np.array([[records[r.query_id].value(n) for n in INPUTS] for r in rows], float)
    expected = client.models.predict("risk", matrix, version=2)
    for row, want, record in zip(rows, expected, (records[r.query_id] for r in rows), strict=True):
        assert row.logged == record.outputs["user.risk"].value
        assert row.replayed == pytest.approx(float(want), abs=1e-12)
        assert row.changed == (row.logged != row.replayed)
    assert sum(r.changed for r in rows) > len(USERS) // 2  # a different model, other scores
    summary = result.summary()
    assert summary["decisions"] == len(USERS)
    assert summary["features"]["user.risk"]["rows"] == len(USERS)
    assert summary["features"]["user.risk"]["mean_abs_delta"] > 0
    frame = result.to_pandas()
    assert list(frame.columns) == ["query_id", "now", "feature", "logged", "replayed", "changed"]
    assert len(frame) == 4 * len(USERS)  # risk and the three aggregates the queries asked for
    # the aggregates are not downstream of the model: taken as logged, unchanged
    assert not frame[frame.feature != "user.risk"].changed.any()
    assert "user.risk" in result.to_markdown()


def test_recomputing_after_the_source_changed_gives_exactly_the_logged_values(
    client: kr.Client, project: Path
) -> None:
    served = decide(client, hours=5)
    change_the_source(project)
    again = decide(client, hours=5)  # what the changed source gives now: different
    assert again.column("user.declines[7d]") != served.column("user.declines[7d]")
    # the windowed aggregates over the logged has-many, and the model over them, recomputed
    result = client.replay(
        [f"{served.meta.query_id}-{i}" for i in range(len(USERS))],
        recompute=["user.txn_count[7d]", "user.declines[7d]", "user.avg_ticket[90d]"],
    )
    assert set(result.recomputed) >= {*DERIVED, "user.risk"}
    assert result.decisions == len(USERS)
    assert [r for r in result.rows if r.changed] == []
    by_id = {(r.query_id, r.feature): r.replayed for r in result.rows}
    for index in range(len(USERS)):
        query_id = f"{served.meta.query_id}-{index}"
        for name in ["user.risk", *DERIVED]:
            assert by_id[(query_id, name)] == served.columns[name].values[index], name


def test_nothing_changed_reproduces_every_logged_output(client: kr.Client) -> None:
    served = decide(client)
    result = client.replay(since=ANCHOR - timedelta(days=1))
    assert result.changed == () and result.recomputed == ()
    logged = {(r.query_id, r.feature): r.logged for r in result.rows}
    for index in range(len(USERS)):
        for name in ["user.risk", *DERIVED]:
            value = served.columns[name].values[index]
            assert logged[(f"{served.meta.query_id}-{index}", name)] == value
    assert not any(r.changed for r in result.rows)


def test_a_new_predict_definition_replays_with_its_inputs(client: kr.Client) -> None:
    decide(client)
    swapped = kr.predict("risk", inputs=[kr._.txn_count["7d"], kr._.txn_count["1d"],
                                         kr._.declines["7d"], kr._.avg_ticket["90d"],
                                         kr._.account_age_days], version=1)  # fmt: skip
    result = client.replay(since=ANCHOR - timedelta(days=1), features={"user.risk": swapped})
    records = {r.query_id: r for r in result.records}
    order = ["user.txn_count[7d]", "user.txn_count[1d]", *INPUTS[2:]]
    for row in (r for r in result.rows if r.feature == "user.risk"):
        vector = np.array([[records[row.query_id].value(n) for n in order]], float)
        want = client.models.predict("risk", vector, version=1)[0]
        assert row.replayed == pytest.approx(float(want), abs=1e-12)


def comparable(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in ("seconds", "decisions_per_s")}


def test_a_replay_in_chunks_is_the_replay_at_once_and_keep_holds_only_the_first_rows(
    client: kr.Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    decide(client)
    decide(client, hours=2)
    since = ANCHOR - timedelta(days=1)
    whole = client.replay(since=since, models={"risk": 2})
    reads: list[int] = []
    search = client.log.store.search

    def counted(wanted: Search) -> list[Any]:
        found = search(wanted)
        reads.append(len(found))
        return found

    monkeypatch.setattr(client.log.store, "search", counted)
    monkeypatch.setattr(replay_module, "CHUNK", 7)  # 60 decisions: 9 chunks
    chunked = client.replay(since=since, models={"risk": 2})
    assert reads == [7] * 8 + [4]
    assert chunked.rows == whole.rows and chunked.records == whole.records
    assert comparable(chunked.summary()) == comparable(whole.summary())
    assert chunked.summary()["decisions"] == 2 * len(USERS)

    kept = client.replay(since=since, models={"risk": 2}, keep=5)
    assert kept.records == [] and len(kept.rows) == 5
    assert kept.to_dict(5)["rows"] == whole.to_dict(5)["rows"]  # changed rows first
    assert comparable(kept.summary()) == comparable(whole.summary())

    newest = client.replay(since=since, models={"risk": 2}, limit=10, keep=0)
    assert newest.decisions == 10 and newest.more and newest.rows == []
    everything = client.replay(since=since, models={"risk": 2}, limit=None, keep=0)
    assert everything.decisions == 2 * len(USERS) and not everything.more


def test_bad_replay_arguments_name_the_field(client: kr.Client) -> None:
    decide(client)
    with pytest.raises(InvalidInput) as unknown_model:
        client.replay(since="1d", models={"nope": 2})
    assert unknown_model.value.field == "models"
    with pytest.raises(InvalidInput) as missing:
        client.replay(["no-such-decision"])
    assert missing.value.field == "query_ids"
    with pytest.raises(InvalidInput) as bad_since:
        client.replay(since="yesterday-ish")
    assert bad_since.value.field == "since"
    with pytest.raises(InvalidInput) as bad_feature:
        client.replay(since="1d", features={"user.risk": 3})
    assert bad_feature.value.field == "features"
    with pytest.raises(InvalidInput) as bad_limit:
        client.replay(since="1d", limit=0)
    assert bad_limit.value.field == "limit"


def test_kairos_replay_prints_and_writes_the_report(
    client: kr.Client, project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    decide(client)
    client.log.flush()
    report = project / "report.md"
    since = (ANCHOR - timedelta(days=1)).isoformat()
    code = main(["replay", "--project", str(project), "--since", since, "--model", "risk@v2",
                 "--output", str(report)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    text = report.read_text()
    assert text in printed and f"decisions: {len(USERS)}" in text
    assert "| user.risk |" in text
    assert main(["replay", "--project", str(project), "--since", since, "--json",
                 "--model", "risk@prod"]) == 0  # fmt: skip
    summary = json.loads(capsys.readouterr().out)
    assert summary["decisions"] == len(USERS) and summary["changed"] == ["user.risk"]
    assert model_pins(["risk@v2", "risk@prod", "other@v10"]) == {"risk": "prod", "other": 10}
    with pytest.raises(KairosError, match="NAME@vN"):
        model_pins(["risk"])


def test_a_decision_served_from_the_cache_says_what_it_had_to_compute(
    client: kr.Client, project: Path
) -> None:
    """A decision whose score came from the cache never computed the model's inputs: its
    record holds the cached score (with its age) and not them. A new model version needs
    them, so they are computed from the sources as of the logged `now`, and the result says
    so (`from_sources`)."""
    now = ANCHOR - timedelta(hours=2)
    client.query({"user.id": "u0002"}, ["user.risk"], now=now - timedelta(seconds=30))
    served = client.query({"user.id": "u0002"}, ["user.risk"], now=now)
    record = client.log.get(served.meta.query_id)
    assert record is not None and record.values["user.risk"].source == "cache"
    assert record.values["user.risk"].age_s == 30.0
    assert not set(INPUTS) & set(record.values)
    change_the_source(project)
    result = client.replay([served.meta.query_id], models={"risk": 2})
    [row] = result.rows
    assert row.logged == record.values["user.risk"].value
    assert result.from_sources == {name: 1 for name in INPUTS}
    assert result.summary()["from_sources"] == result.from_sources
    fresh = client.query(
        {"user.id": "u0002"}, INPUTS, now=now, staleness={n: "0s" for n in [*INPUTS, *READ]}
    )
    vector = np.array([[fresh.get_value(name, np.nan) for name in INPUTS]], float)
    want = client.models.predict("risk", vector, version=2)[0]
    assert row.replayed == pytest.approx(float(want), abs=1e-12)


def test_each_decision_is_replayed_once_however_often_it_is_named(client: kr.Client) -> None:
    served = decide(client)
    ids = [f"{served.meta.query_id}-{i}" for i in (0, 1, 0, 2, 1)]
    result = client.replay(ids, models={"risk": 2})
    assert [r.query_id for r in result.records] == [ids[0], ids[1], ids[3]]
    summary = result.summary()
    assert summary["decisions"] == 3 and summary["changed_decisions"] <= 3
    assert len(client.log.store.get_many([*ids, "never-logged"])) == 3


def test_a_recomputed_has_many_is_rows_like_the_logged_one_and_unchanged(
    client: kr.Client,
) -> None:
    served = client.query_bulk(
        {"user.id": USERS[:5]},
        ["user.transactions", "user.txn_count[7d]"],
        now=ANCHOR,
        staleness={name: "0s" for name in [*INPUTS, *READ]},
    )
    assert served.errors == []
    result = client.replay(since=ANCHOR - timedelta(days=1), recompute=["user.transactions"])
    rows = [r for r in result.rows if r.feature == "user.transactions"]
    assert len(rows) == 5 and any(r.logged for r in rows)
    for row in rows:
        assert type(row.replayed) is list  # rows as dicts, as logged and as queries return
        assert row.replayed == row.logged
    assert not any(r.changed for r in result.rows)
    json.dumps(result.summary())  # the report stays JSON
