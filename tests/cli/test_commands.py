"""The `kairos` command tree: help on every option and argument, `--project` wherever a
project folder is read, a mistyped flag or subcommand answered with the closest one, errors in
one line, and colour and progress bars on a terminal only (piped output is plain text)."""

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kairos.cli.main import cli, main

# the module (kairos.cli's `main` attribute is the function)
main_module = importlib.import_module("kairos.cli.main")
KAIROS = [sys.executable, "-m", "kairos.cli"]
ESC = "\x1b["  # how every ANSI colour, style and cursor move starts
# what can make rich treat captured output as a terminal, or turn colour off
TERMINAL_ENV = ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS", "TERM")

USERS = """
from kairos import features, online


@features
class User:
    id: str
    name: str


@online
def user_name(uid: User.id) -> User.name:
    return {"u1": "Ada", "u2": "Grace"}.get(str(uid), "?")
"""
METERS = """
from kairos import Now, features, online


@features
class Meter:
    id: str
    reading: float


@online
def reading(mid: Meter.id, now: Now) -> Meter.reading:
    return now.hour + int(str(mid)[1:])
"""


def walk(command: click.Command, path: str = "kairos") -> Iterator[tuple[str, click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from walk(sub, f"{path} {name}")


@pytest.fixture
def plain_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TERMINAL_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def project(tmp_path: Path, plain_env: None) -> Path:
    folder = tmp_path / "proj"
    folder.mkdir()
    (folder / "features.py").write_text(USERS)
    (folder / "kairos.yaml").write_text("query_log: sqlite:///.kairos/query_log.db\n")
    return folder


def test_every_option_and_argument_of_every_command_has_help() -> None:
    missing = []
    for path, command in walk(cli):
        assert command.help, f"{path} has no help text"
        for param in command.params:
            if not param.help:
                missing.append(f"{path} {param.name}")
    assert missing == []


def test_the_help_lists_arguments_with_their_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "alias", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "Positional arguments:" in shown and "the version it points at from now" in shown
    assert "--project PATH" in shown and "the project folder" in shown


def test_every_command_that_reads_a_project_takes_project() -> None:
    leaves = {path: command for path, command in walk(cli) if not isinstance(command, click.Group)}
    without = {
        path
        for path, command in leaves.items()
        if not any("--project" in param.opts for param in command.params)
    }
    assert without == {"kairos init"}  # init writes a folder; it reads none
    for path, command in leaves.items():
        if path != "kairos init":
            (option,) = [p for p in command.params if "--project" in p.opts]
            assert option.metavar == "PATH", path


@pytest.mark.parametrize(
    ("argv", "usage", "says"),
    [
        (["serve", "--prot", "1"], "Usage: kairos serve",
         "No such option: --prot. Did you mean --port?"),
        (["query", "--otu", "x"], "Usage: kairos query",
         "No such option: --otu. Did you mean --out?"),
        (["qurey"], "Usage: kairos [OPTIONS] COMMAND",
         "No such command: qurey. Did you mean query?"),
        (["models", "lst"], "Usage: kairos models", "No such command: lst. Did you mean list?"),
        (["gateway", "keys", "revok", "k1"], "Usage: kairos gateway keys", "Did you mean revoke?"),
        (["zzz"], "Usage: kairos", "No such command: zzz."),
    ],
)  # fmt: skip
def test_a_mistyped_flag_or_command_shows_usage_and_the_closest_name(
    capsys: pytest.CaptureFixture[str], argv: list[str], usage: str, says: str
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage), err
    assert says in err
    assert "Traceback" not in err


def test_no_close_name_suggests_none(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--zzzzzz"]) == 2
    err = capsys.readouterr().err
    assert "No such option: --zzzzzz." in err and "Did you mean" not in err


def test_no_command_shows_the_commands_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "Usage: kairos" in err and "materialize" in err and "gateway" in err


def test_serve_takes_the_project_as_path_or_as_project(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    served: list[tuple[Any, ...]] = []

    def serve(*args: Any) -> int:  # stands in for the server: what the command line asked
        served.append(args)
        return 0

    monkeypatch.setattr(main_module, "serve", serve)
    assert main(["serve", "a", "--port", "9001"]) == 0
    assert main(["serve", "--project", "b", "--host", "0.0.0.0", "--workers", "2"]) == 0
    assert main(["serve"]) == 0
    assert main(["serve", "c", "--project", "c"]) == 0  # the same folder twice is no clash
    assert main(["serve", "d", "--project", "./d/"]) == 0  # spelled two ways, one folder
    assert served == [
        ("a", None, 9001, 1),
        ("b", "0.0.0.0", None, 2),
        (".", None, None, 1),
        ("c", None, None, 1),
        ("d", None, None, 1),
    ]
    assert main(["serve", "a", "--project", "b"]) == 2
    err = capsys.readouterr().err
    assert "Usage: kairos serve" in err
    assert "PATH 'a' or --project 'b', not both" in err
    assert len(served) == 5


def test_a_kairos_error_is_one_line_on_stderr(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["query", "--project", str(project), "--in", "user.id=u1", "--out", "user.nme"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("kairos: ") and "did you mean 'user.name'" in captured.err
    assert captured.err.count("\n") == 1 and ESC not in captured.err


@pytest.mark.parametrize(
    "argv",
    [["serve", "--port", "70000"], ["serve", "--port", "0"], ["gateway", "serve", "--port", "-1"]],
)
def test_a_port_no_socket_can_bind_is_a_usage_error(
    argv: list[str], project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: 70000 reached bind() as an OverflowError traceback, 0 became the configured
    port (8000) without a word."""
    assert main([*argv, "--project", str(project)]) == 2
    err = capsys.readouterr().err
    assert "Invalid value for '--port'" in err and "1<=x<=65535" in err
    assert "Traceback" not in err


def _run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in TERMINAL_ENV}
    return subprocess.run(
        [*KAIROS, *argv], capture_output=True, text=True, timeout=90, env={**clean, **env}
    )


def test_piped_output_is_plain_text_and_a_terminal_gets_colour(project: Path) -> None:
    query = ["query", "--project", str(project), "--in", "user.id=u1", "--out", "user.name"]
    piped = _run(*query)
    assert piped.returncode == 0, piped.stderr
    assert ESC not in piped.stdout and ESC not in piped.stderr
    lines = piped.stdout.splitlines()
    assert lines[0].split() == ["feature", "value", "source", "observed_at"]
    assert lines[1].startswith("---------  -----")  # the plain grid scripts read
    assert lines[2].split()[:2] == ["user.name", "Ada"]
    listed = _run("log", "list", "--project", str(project))
    assert listed.returncode == 0 and ESC not in listed.stdout + listed.stderr
    assert listed.stdout.splitlines()[0].split() == ["query_id", "now", "duration", "outputs"]
    failed = _run("query", "--project", str(project), "--out", "user.nope")
    assert failed.returncode == 2 and failed.stderr.startswith("kairos: ")
    assert ESC not in failed.stderr

    # the control: told it is a terminal (as rich reads FORCE_COLOR), the same table is styled
    coloured = _run(*query, FORCE_COLOR="1", TERM="xterm-256color", COLUMNS="120")
    assert coloured.returncode == 0, coloured.stderr
    assert ESC in coloured.stdout and "Ada" in coloured.stdout
    # NO_COLOR wins: no styles at all, still a terminal's table
    uncoloured = _run(*query, FORCE_COLOR="1", NO_COLOR="1", TERM="xterm-256color")
    assert uncoloured.returncode == 0 and ESC not in uncoloured.stdout
    assert "user.name" in uncoloured.stdout and "Ada" in uncoloured.stdout


def test_json_output_is_never_styled(project: Path) -> None:
    done = _run(
        "query", "--project", str(project), "--in", "user.id=u2", "--out", "user.name", "--json",
        FORCE_COLOR="1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["values"]["user.name"] == "Grace"


def test_progress_bars_only_on_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    plain_env: None,
) -> None:  # fmt: skip
    folder = tmp_path / "meters"
    folder.mkdir()
    (folder / "features.py").write_text(METERS)
    spine, out = tmp_path / "spine.parquet", tmp_path / "out.parquet"
    t0 = datetime(2026, 4, 1, tzinfo=UTC)
    pq.write_table(pa.table({"meter.id": ["m1", "m2", "m3"], "ts": [t0] * 3}), spine)
    offline = ["offline", "--project", str(folder), "--spine", str(spine), "--out",
               "meter.reading", "--output", str(out)]  # fmt: skip
    materialize = ["materialize", "meter.reading", "--project", str(folder), "--keys", "m1,m2",
                   "--start", t0.isoformat(), "--end", (t0 + timedelta(hours=2)).isoformat(),
                   "--every", "1h"]  # fmt: skip

    assert main(offline) == 0
    captured = capsys.readouterr()
    assert captured.out == f"wrote 3 rows to {out} (0 feature errors)\n"
    assert captured.err == ""  # captured output is no terminal: no bar
    assert main(materialize) == 0
    captured = capsys.readouterr()
    assert "backfilled 6 rows" in captured.out and captured.err == ""

    monkeypatch.setenv("FORCE_COLOR", "1")  # rich: a terminal
    monkeypatch.setenv("TERM", "xterm-256color")
    assert main(offline) == 0
    captured = capsys.readouterr()
    assert "offline" in captured.err and "100%" in captured.err and "3/3" in captured.err
    assert captured.out == f"wrote 3 rows to {out} (0 feature errors)\n"  # stdout untouched
    assert main(materialize) == 0
    captured = capsys.readouterr()
    assert "materialize" in captured.err and "100%" in captured.err
    assert pq.read_table(out).column("meter.reading").to_pylist() == [1.0, 2.0, 3.0]
