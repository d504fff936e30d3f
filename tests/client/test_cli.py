"""The `kairos` command line over the fraud example."""

import json
from pathlib import Path

import pytest

from examples.fraud.generate import ANCHOR, generate
from kairos.cli import main

PROJECT = str(Path(__file__).parents[2] / "examples" / "fraud")


@pytest.fixture(scope="module", autouse=True)
def data() -> None:
    generate()


def test_query_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["query", "--project", PROJECT, "--in", "user.id=u0001", "--out", "user.name",
         "--now", ANCHOR.isoformat()]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "user.name  User 1  user" in out


def test_query_json_and_explain(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["query", "--project", PROJECT, "--in", "user.id=u0002", "--out", "user.declines[7d]",
         "--json", "--now", ANCHOR.isoformat()]
    )  # fmt: skip
    body = json.loads(capsys.readouterr().out)
    assert code == 0
    assert body["features"]["user.declines[7d]"]["source"] == "expression"
    assert isinstance(body["values"]["user.declines[7d]"], int)
    assert main(["explain", "--project", PROJECT, "--in", "user.id", "--out", "user.risk"]) == 0
    assert "model:risk:user.risk" in capsys.readouterr().out


def test_bad_feature_is_a_clear_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["query", "--project", PROJECT, "--in", "user.id=u1", "--out", "user.rsk"])
    err = capsys.readouterr().err
    assert code == 2
    assert "did you mean 'user.risk'" in err
    assert "Traceback" not in err


def test_init_writes_a_project_that_answers_queries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "fresh"
    assert main(["init", str(folder)]) == 0
    capsys.readouterr()
    code = main(
        ["query", "--project", str(folder), "--in", "user.id=u2", "--out", "user.available",
         "--json"]
    )  # fmt: skip
    body = json.loads(capsys.readouterr().out)
    assert code == 0
    assert body["values"]["user.available"] == 20.0
    assert main(["init", str(folder)]) == 2  # never overwrites a project
    assert "already has" in capsys.readouterr().err


def test_log_show_reads_back_a_query(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "proj"
    main(["init", str(folder)])
    capsys.readouterr()
    main(["query", "--project", str(folder), "--in", "user.id=u1", "--out", "user.name", "--json"])
    query_id = json.loads(capsys.readouterr().out)["query_id"]
    assert main(["log", "show", query_id, "--project", str(folder), "--json"]) == 0
    logged = json.loads(capsys.readouterr().out)
    assert logged["outputs"]["user.name"]["value"] == "Ada"
    assert logged["outputs"]["user.name"]["source"] == "user"
    assert logged["values"]["user.id"]["source"] == "input"  # the whole record, as HTTP has it
    assert logged["plan"]["outputs"] == ["user.name"]
    assert main(["log", "show", query_id, "--project", str(folder)]) == 0
    shown = capsys.readouterr().out
    assert "user.name *" in shown and "user.id " in shown and "input" in shown
    assert f"plan {logged['plan']['fingerprint']}" in shown
    assert main(["log", "show", "nope", "--project", str(folder)]) == 2
