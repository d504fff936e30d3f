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
    assert "user.name  User 1  user_profile" in out


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
    assert "risk_score" in capsys.readouterr().out


def test_bad_feature_is_a_clear_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["query", "--project", PROJECT, "--in", "user.id=u1", "--out", "user.rsk"])
    err = capsys.readouterr().err
    assert code == 2
    assert "did you mean 'user.risk'" in err
    assert "Traceback" not in err
