"""`kairos log list`: the logged decisions of a project, newest first, as a table or JSON."""

import json
from pathlib import Path

import pytest

from kairos.cli import main


@pytest.fixture
def project(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, list[str]]:
    """A fresh `kairos init` project and the ids of three queries made on it (u1, u2, u1)."""
    folder = str(tmp_path / "proj")
    assert main(["init", folder]) == 0
    capsys.readouterr()
    made = []
    for uid in ("u1", "u2", "u1"):
        code = main(["query", "--project", folder, "--in", f"user.id={uid}",
                     "--out", "user.name", "--out", "user.available", "--json"])  # fmt: skip
        assert code == 0
        made.append(json.loads(capsys.readouterr().out)["query_id"])
    return folder, made


def listed(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    assert main(["log", "list", *args, "--json"]) == 0
    return [record["query_id"] for record in json.loads(capsys.readouterr().out)["records"]]


def test_log_list_finds_decisions_newest_first(
    project: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, (first, second, third) = project

    assert listed(capsys, "--project", folder) == [third, second, first]
    assert listed(capsys, "--project", folder, "--entity", "user.id=u1") == [third, first]
    assert listed(capsys, "--project", folder, "--entity", "user.id=u3") == []
    assert listed(capsys, "--project", folder, "--since", "1h", "--limit", "2") == [third, second]
    assert listed(capsys, "--project", folder, "--until", "1h") == []
    assert listed(capsys, "--project", folder, "--feature", "user.available") == [
        third, second, first,
    ]  # fmt: skip


def test_log_list_json_is_the_whole_record(
    project: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, made = project

    assert main(["log", "list", "--project", folder, "--entity", "user.id=u2", "--json"]) == 0
    (record,) = json.loads(capsys.readouterr().out)["records"]

    assert record["query_id"] == made[1]
    assert record["inputs"] == {"user.id": "u2"}
    assert record["outputs"]["user.name"]["value"] == "Grace"
    assert record["outputs"]["user.available"]["value"] == 20.0
    assert record["values"]["user.credit_limit"]["source"] == "user"  # intermediates too
    assert "+00:00" in record["now"]  # ISO times


def test_log_list_prints_a_table(
    project: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, (first, _, third) = project

    assert main(["log", "list", "--project", folder, "--entity", "user.id=u1"]) == 0
    lines = capsys.readouterr().out.splitlines()

    assert lines[0].split() == ["query_id", "now", "duration", "outputs"]
    assert [line.split()[0] for line in lines[2:]] == [third, first]
    assert "user.name=Ada, user.available=750" in lines[2]
    assert lines[2].split()[3] == "ms"  # the duration, "0.42 ms"


def test_log_list_says_when_nothing_matches(
    project: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    folder, _ = project

    assert main(["log", "list", "--project", folder, "--model", "risk"]) == 0
    captured = capsys.readouterr()

    assert captured.out == ""
    assert "no logged decision matches" in captured.err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--since", "bogus"], "since='bogus'"),
        (["--since", "1h", "--until", "2h"], "before until"),
        (["--entity", "user.id"], "--entity 'user.id' needs a key"),
        (["--entity", "usr.id=u1"], "usr"),
        (["--limit", "0"], "limit must be"),
    ],
)
def test_log_list_bad_arguments_are_clear_errors(
    project: tuple[str, list[str]], capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    folder, _ = project

    assert main(["log", "list", "--project", folder, *args]) == 2
    err = capsys.readouterr().err

    assert says in err
    assert "Traceback" not in err
