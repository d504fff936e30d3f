"""Evaluation of a replay against labels: model metrics equal scikit-learn's on the same
arrays (labels keyed by query id or by entity + ts), prompt metrics and an LLM judge through
the real gateway to a scripted provider, the Markdown + PNG report, and `log.to_dataset`."""

import asyncio
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as skm
from sklearn.linear_model import LogisticRegression

import kairos as kr
from kairos import _, features, online
from kairos.client.replay import ReplayResult
from kairos.errors import InvalidInput, KairosError
from kairos.gateway import Gateway, GatewayConfig
from kairos.project.config import Config
from kairos.project.offline import OfflineResult
from kairos.stores.datasets import DatasetVersion
from tests.gateway.fake_upstream import FakeUpstream, ServerThread

T = datetime(2026, 7, 1, 9, tzinfo=UTC)
SINCE = T - timedelta(minutes=1)


# --- a scored feature: two versions of a logistic regression ------------------------------


@features
class Applicant:
    id: str
    income: float
    debt: float
    tenure: float
    approve: float = kr.predict("credit", inputs=[_.income, _.debt, _.tenure])


def profile_of(aid: str) -> tuple[float, float, float]:
    i = int(aid.removeprefix("a"))
    return 20.0 + (i * 37) % 80, float((i * 53) % 40), float((i * 7) % 11)


@online
def applicant_profile(
    aid: Applicant.id,
) -> kr.Features[Applicant.income, Applicant.debt, Applicant.tenure]:
    return profile_of(str(aid))


IDS = [f"a{i}" for i in range(40)]
X = np.array([profile_of(a) for a in IDS])
# the outcome: mostly income above debt, with some noise the models cannot see
Y = np.array([int(x[0] - x[1] + ((i * 13) % 17 - 8) * 3 > 40) for i, x in enumerate(X)])
IDS_AT = range(len(IDS))


def weak_model() -> LogisticRegression:
    """Version 1: trained on tenure alone (income and debt zeroed), so it barely ranks."""
    model = LogisticRegression(C=1e-4, max_iter=1000)
    return model.fit(np.column_stack([np.zeros(len(X)), np.zeros(len(X)), X[:, 2]]), Y)


WEAK = weak_model()
V2 = LogisticRegression(max_iter=5000).fit(X, Y)


@pytest.fixture
def scored(tmp_path: Path) -> Iterator[tuple[kr.Client, ReplayResult, str]]:
    """40 logged decisions of version 1, replayed on version 2."""
    config = Config(base_dir=tmp_path, query_log=f"sqlite:///{tmp_path / 'log.db'}")
    with kr.Client(
        definitions=[Applicant, applicant_profile], config=config, offline_store="none://"
    ) as client:
        client.models.register("credit", WEAK, inputs=["income", "debt", "tenure"])
        served = client.query_bulk({Applicant.id: IDS}, [Applicant.approve], now=T)
        assert served.errors == []
        client.models.register("credit", V2, inputs=["income", "debt", "tenure"])
        client.log.flush()
        result = client.replay(since=SINCE, models={"credit": 2})
        yield client, result, served.meta.query_id


def expected(metric: str, y: Any, p: Any) -> float:
    if metric == "accuracy":
        return float(skm.accuracy_score(y, (np.asarray(p) >= 0.5).astype(int)))
    if metric == "auc":
        return float(skm.roc_auc_score(y, p))
    if metric == "log_loss":
        return float(skm.log_loss(y, p, labels=[0, 1]))
    return float(skm.mean_absolute_error(y, p))


MODEL_METRICS = ["accuracy", "auc", "log_loss", "mae"]


def check_model_metrics(evaluation: Any, rows: list[int]) -> None:
    logged = WEAK.predict_proba(X)[:, 1]
    replayed = V2.predict_proba(X)[:, 1]
    scores = evaluation.metrics["applicant.approve"]
    assert evaluation.labeled == {"applicant.approve": len(rows)}
    for metric in MODEL_METRICS:
        before = expected(metric, Y[rows], logged[rows])
        after = expected(metric, Y[rows], replayed[rows])
        assert scores[metric]["logged"] == pytest.approx(before, rel=1e-6), metric
        assert scores[metric]["replayed"] == pytest.approx(after, rel=1e-6), metric
        assert scores[metric]["delta"] == pytest.approx(after - before, rel=1e-6, abs=1e-9)
    assert scores["auc"]["replayed"] > scores["auc"]["logged"]  # the better model shows


def test_the_replay_compares_the_two_versions_row_by_row(
    scored: tuple[kr.Client, ReplayResult, str],
) -> None:
    _, result, query_id = scored
    rows = {r.query_id: r for r in result.rows if r.feature == "applicant.approve"}
    assert len(rows) == len(IDS)
    for i in range(len(IDS)):
        row = rows[f"{query_id}-{i}"]
        assert row.logged == pytest.approx(WEAK.predict_proba(X[i : i + 1])[0, 1], rel=1e-9)
        assert row.replayed == pytest.approx(V2.predict_proba(X[i : i + 1])[0, 1], rel=1e-9)


def test_model_metrics_with_labels_keyed_by_query_id(
    scored: tuple[kr.Client, ReplayResult, str],
) -> None:
    client, result, query_id = scored
    labels = pd.DataFrame({"query_id": [f"{query_id}-{i}" for i in IDS_AT], "label": Y})
    evaluation = client.evaluate(result, labels, metrics=MODEL_METRICS)
    check_model_metrics(evaluation, list(range(len(IDS))))
    assert evaluation.decisions == len(IDS)
    assert evaluation.report_path is None and evaluation.plot_path is None
    # half the decisions labeled: the metrics are over those only
    half = list(range(0, len(IDS), 2))
    some = {"query_id": [f"{query_id}-{i}" for i in half], "label": [int(Y[i]) for i in half]}
    check_model_metrics(client.evaluate(result, some, metrics=MODEL_METRICS), half)


def test_model_metrics_with_labels_keyed_by_entity_and_ts(
    scored: tuple[kr.Client, ReplayResult, str],
) -> None:
    client, result, _ = scored
    rows = [{"applicant.id": a, "ts": T, "outcome": int(y)} for a, y in zip(IDS, Y, strict=True)]
    evaluation = client.evaluate(result, rows, label="outcome", metrics=MODEL_METRICS)
    check_model_metrics(evaluation, list(range(len(IDS))))
    # an outcome observed 3 days later labels the decision within a 7-day horizon
    later = pd.DataFrame(
        {"applicant.id": IDS, "ts": [T + timedelta(days=3)] * len(IDS), "label": Y}
    )
    check_model_metrics(
        client.evaluate(result, later, metrics=MODEL_METRICS, horizon="7d"),
        list(range(len(IDS))),
    )
    for horizon in (None, "1d"):  # not at the decision's now, nor within a day of it
        with pytest.raises(InvalidInput, match="match none") as error:
            client.evaluate(result, later, metrics=["auc"], horizon=horizon)
        assert error.value.field == "labels"


def test_nothing_changed_scores_the_same_twice(
    scored: tuple[kr.Client, ReplayResult, str],
) -> None:
    client, _, query_id = scored
    same = client.replay(since=SINCE)
    labels = {"query_id": [f"{query_id}-{i}" for i in IDS_AT], "label": list(Y)}
    scores = client.evaluate(same, labels, metrics=["auc", "mae"]).metrics["applicant.approve"]
    auc = expected("auc", Y, WEAK.predict_proba(X)[:, 1])
    assert scores["auc"] == {"logged": pytest.approx(auc), "replayed": pytest.approx(auc),
                             "delta": 0.0}  # fmt: skip


def test_the_report_is_markdown_and_a_png(
    scored: tuple[kr.Client, ReplayResult, str], tmp_path: Path
) -> None:
    client, result, query_id = scored
    labels = {"query_id": [f"{query_id}-{i}" for i in IDS_AT], "label": list(Y)}
    evaluation = client.evaluate(result, labels, metrics=MODEL_METRICS, report=tmp_path / "ev")
    assert evaluation.report_path == tmp_path / "ev" / "report.md"
    assert evaluation.plot_path == tmp_path / "ev" / "scores.png"
    text = evaluation.report_path.read_text()
    assert text.startswith("# Replay")  # the replay's summary first
    assert "# Evaluation" in text and "](scores.png)" in text
    auc = evaluation.metrics["applicant.approve"]["auc"]
    assert f"| applicant.approve | auc | {len(IDS)} | {auc['logged']:.6g} |" in text
    png = evaluation.plot_path.read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert evaluation.to_dict()["report_path"] == str(evaluation.report_path)


def test_bad_arguments_name_the_field(
    scored: tuple[kr.Client, ReplayResult, str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    client, result, query_id = scored
    labels = {"query_id": [f"{query_id}-0"], "label": [1]}
    with pytest.raises(InvalidInput, match="unknown metric 'acu'; did you mean 'auc'") as error:
        client.evaluate(result, labels, metrics=["acu"])
    assert error.value.field == "metrics" and "exact_match" in str(error.value)
    with pytest.raises(InvalidInput) as error:
        client.evaluate(result, {"query_id": ["nope"], "label": [1]}, metrics=["auc"])
    assert error.value.field == "labels"
    with pytest.raises(InvalidInput) as error:
        client.evaluate(result, {"query_id": [f"{query_id}-0"], "y": [1]}, metrics=["auc"])
    assert error.value.field == "label"
    with pytest.raises(InvalidInput) as error:
        client.evaluate(result, {"who": ["a1"], "label": [1]}, metrics=["auc"])
    assert error.value.field == "labels" and "applicant.id" in str(error.value)
    with pytest.raises(InvalidInput) as error:
        client.evaluate(result, labels, metrics=["judge"])
    assert error.value.field == "judge_model"
    with pytest.raises(InvalidInput) as error:
        client.evaluate(result, labels, metrics=["auc"], features=["applicant.income"])
    assert error.value.field == "features"
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if not installed
    with pytest.raises(KairosError, match=r"pip install 'kairos-inference\[eval\]'"):
        client.evaluate(result, labels, metrics=["mae"], report=tmp_path / "ev")


# --- log and wait: the values as served, as a dataset ---------------------------------------


def test_to_dataset_holds_the_values_as_served_and_saves(
    scored: tuple[kr.Client, ReplayResult, str],
) -> None:
    client, _, query_id = scored
    data = client.log.to_dataset(since=SINCE, features=[Applicant.income, Applicant.approve])
    assert isinstance(data, OfflineResult)
    assert data.table.column_names == [
        "query_id", "now", "applicant.id", "applicant.income", "applicant.approve"
    ]  # fmt: skip
    rows = {row["query_id"]: row for row in data.to_pylist()}
    assert len(rows) == len(IDS)
    for i, aid in enumerate(IDS):
        row = rows[f"{query_id}-{i}"]
        record = client.log.get(f"{query_id}-{i}")
        assert record is not None
        assert row["applicant.id"] == aid and row["now"] == T
        assert row["applicant.income"] == record.value("applicant.income") == X[i, 0]
        assert row["applicant.approve"] == record.value("applicant.approve")  # version 1's
    saved = client.log.to_dataset(since=SINCE, features=["applicant.approve"], name="served")
    assert isinstance(saved, DatasetVersion)
    assert (saved.name, saved.version, saved.rows) == ("served", 1, len(IDS))
    back = client.datasets.get("served")
    assert back.query["outputs"] == ["applicant.approve"]
    assert sorted(back.table.column("applicant.approve").to_pylist()) == sorted(
        r["applicant.approve"] for r in rows.values()
    )
    with pytest.raises(InvalidInput) as error:
        client.log.to_dataset(until=SINCE, features=["applicant.approve"])
    assert error.value.field == "features"  # no decision before SINCE
    with pytest.raises(InvalidInput) as error:
        client.log.to_dataset(features=["applicant.nope"])
    assert error.value.field == "features"


# --- prompts: exact match, contains, JSON validity and a judge ------------------------------


@features
class Guest:
    id: str
    name: str
    greeting: str = kr.completion(
        model="gpt-4", messages=[kr.message("user", "Greet {{ name }}")], max_tokens=32
    )


@online
def guest_name(gid: Guest.id) -> Guest.name:
    return f"Guest {gid}"


class Provider(FakeUpstream):
    """Streams feature answers ("Greet X" -> "Hello, X!"; a JSON prompt is echoed) and answers
    the judge unstreamed: yes when the reference is in the answer and the answer greets."""

    @property
    def judged(self) -> list[dict[str, Any]]:
        return [body for body in self.received if body["model"] == "judge-1"]

    @staticmethod
    def verdict(question: str) -> str:
        reference = question.split("Reference answer:\n", 1)[1].split("\n\nAnswer to grade:")[0]
        answer = question.split("Answer to grade:\n", 1)[1].split("\n\nIs the answer")[0]
        greets = answer.startswith("Hello")
        return "Yes." if greets and reference.casefold() in answer.casefold() else "No"

    def reply(self, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        usage = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
        prompt = body["messages"][-1]["content"]
        if body["model"] == "judge-1":
            return self.verdict(prompt), usage
        text = prompt if prompt.startswith("{") else f"Hello, {prompt.removeprefix('Greet ')}!"
        return text, usage


@pytest.fixture(scope="module")
def provider() -> Iterator[tuple[Provider, str]]:
    fake = Provider()
    with ServerThread(fake.app()) as server:
        yield fake, server.url


def llm_client(url: str, folder: Path) -> kr.Client:
    deployment = {"provider": "fake", "model": "gpt-4", "price": {"input": 1, "output": 1}}
    config = GatewayConfig.from_mapping(
        {
            "pepper_env": "PEPPER",
            "registry": f"sqlite:///{folder / 'gateway.db'}",
            "counters": f"sqlite:///{folder / 'gateway.db'}",
            "providers": {"fake": {"kind": "openai", "base_url": f"{url}/v1"}},
            "models": {
                "gpt-4": {"deployments": [deployment]},
                "judge": {"deployments": [{**deployment, "model": "judge-1"}]},
            },
        },
        base_dir=folder,
        environ={"PEPPER": "pepper"},
    )
    gateway = Gateway(config)
    plain, _ = asyncio.run(gateway.create_key(name="features", models=["gpt-4", "judge"]))
    return kr.Client(
        definitions=[Guest, guest_name],
        query_log=f"sqlite:///{folder / 'log.db'}",
        offline_store="none://",
        gateway=gateway,
        llm_key=plain,
    )


GUESTS = [f"g{i}" for i in range(6)]
# by guest: g0's label is the logged answer itself; g5 has none
LABELS = {"g0": "Hello, Guest g0!", "g1": "guest G1", "g2": "Guest g2", "g3": "someone",
          "g4": "nobody"}  # fmt: skip
JSON_PROMPT = kr.completion(
    model="gpt-4", messages=[kr.message("user", '{"name": "{{ name }}"}')], max_tokens=32
)


def test_prompt_metrics_and_an_llm_judge(provider: tuple[Provider, str], tmp_path: Path) -> None:
    fake, url = provider
    with llm_client(url, tmp_path) as client:
        served = client.query_bulk({Guest.id: GUESTS}, [Guest.greeting], now=T)
        assert served.errors == []
        assert served.column("guest.greeting")[1] == "Hello, Guest g1!"
        client.log.flush()
        result = client.replay(since=SINCE, features={Guest.greeting: JSON_PROMPT})
        replayed = {r.query_id: r.replayed for r in result.rows if r.feature == "guest.greeting"}
        assert replayed[f"{served.meta.query_id}-1"] == '{"name": "Guest g1"}'
        labels = [{"guest.id": g, "ts": T, "label": LABELS[g]} for g in GUESTS if g in LABELS]
        before = len(fake.judged)
        evaluation = client.evaluate(
            result,
            labels,
            metrics=["exact_match", "contains", "json_valid", "judge"],
            judge_model="judge",
            report=tmp_path / "ev",
        )
        judged = fake.judged[before:]
        strict = client.evaluate(
            result,
            labels,
            metrics=["json_valid"],
            schema={"type": "object", "required": ["name", "age"]},
        )
        with pytest.raises(InvalidInput) as error:
            client.evaluate(result, labels, metrics=["json_valid"], schema={"type": 12})
        assert error.value.field == "schema"
    scores = evaluation.metrics["guest.greeting"]
    assert evaluation.labeled == {"guest.greeting": 5}
    assert scores["exact_match"] == {"logged": 1 / 5, "replayed": 0.0, "delta": -1 / 5}
    # logged: g0, g1 (case-insensitive), g2; replayed JSON: g1, g2
    assert scores["contains"] == {"logged": 3 / 5, "replayed": 2 / 5,
                                  "delta": pytest.approx(-1 / 5)}  # fmt: skip
    assert scores["json_valid"] == {"logged": 0.0, "replayed": 1.0, "delta": 1.0}
    # the judge wants a greeting: only the logged answers pass, as the provider decided
    assert scores["judge"] == {"logged": 3 / 5, "replayed": 0.0, "delta": -3 / 5}
    assert evaluation.judge_calls == len(judged) == 10  # each (prompt, answer) asked once
    assert all(body["stream"] is False for body in judged)
    asked = judged[0]["messages"][-1]["content"]
    assert asked.startswith("Prompt:\nuser: ")  # the decision's rendered prompt goes along
    assert strict.metrics["guest.greeting"]["json_valid"]["replayed"] == 0.0
    assert evaluation.plot_path is not None
    assert evaluation.plot_path.read_bytes().startswith(b"\x89PNG")  # no numeric feature: bars
    assert "| guest.greeting | judge | 5 | 0.6 | 0 | -0.6 |" in evaluation.to_markdown()
