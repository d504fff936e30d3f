"""kairos.yaml's `logging:` section: parsed and checked at load (a bad value names the field and
the values allowed), applied by `kairos serve` to every logger, uvicorn's too, as text or JSON
lines on stderr, with one access line per request."""

import io
import json
import logging
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kairos.cli.server_logging import QUIET, UVICORN, ServerHandler, configure_logging
from kairos.errors import ProjectError
from kairos.project.config import Config, LoggingConfig

KAIROS = [sys.executable, "-m", "kairos.cli"]


def write(folder: Path, text: str) -> Path:
    (folder / "kairos.yaml").write_text(text)
    return folder


def test_the_section_is_read_with_its_defaults(tmp_path: Path) -> None:
    assert Config.load(tmp_path).logging == LoggingConfig("info", "text", True, {})
    write(tmp_path, "logging: {level: WARNING, format: json, access: false, "
                    "levels: {kairos.gateway: debug}}\n")  # fmt: skip
    expected = LoggingConfig("warning", "json", False, {"kairos.gateway": "debug"})
    assert Config.load(tmp_path).logging == expected
    assert LoggingConfig.load(tmp_path) == expected  # the section alone, as the gateway reads it


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("{level: loud}", "`logging.level` is one of debug, info, warning, error, critical, "
                          "got 'loud'"),
        ("{format: xml}", "`logging.format` is one of text, json, got 'xml'"),
        ("{access: yes please}", "`logging.access` is true or false, got 'yes please'"),
        ("{levels: {kairos.gateway: chatty}}", "`logging.levels.kairos.gateway` is one of debug"),
        ("{levels: [debug]}", "`logging.levels` maps logger names to levels"),
        ("{colour: red}", "`logging` takes level, format, access, levels"),
        ("verbose", "`logging` takes level, format, access, levels"),
    ],
)  # fmt: skip
def test_a_bad_value_fails_at_load_naming_the_field(
    tmp_path: Path, section: str, message: str
) -> None:
    write(tmp_path, f"logging: {section}\n")
    with pytest.raises(ProjectError, match=r"kairos\.yaml") as raised:
        Config.load(tmp_path)
    assert message in str(raised.value)
    with pytest.raises(ProjectError) as alone:
        LoggingConfig.load(tmp_path)
    assert message in str(alone.value)


@pytest.fixture
def restored() -> Iterator[None]:
    """The process's logging as it was, after a test configures it."""
    root = logging.getLogger()
    names = [*UVICORN, *QUIET, "uvicorn.access", "kairos.access", "kairos.gateway"]
    saved = (root.level, list(root.handlers))
    loggers = {
        name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled)
        for name in names
        for lg in [logging.getLogger(name)]
    }
    yield
    for handler in [h for h in root.handlers if isinstance(h, ServerHandler)]:
        root.removeHandler(handler)
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for name, (level, handlers, propagate, disabled) in loggers.items():
        lg = logging.getLogger(name)
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.propagate, lg.disabled = propagate, disabled


@pytest.mark.usefixtures("restored")
def test_json_lines_carry_the_access_fields_and_uvicorns_lines_share_the_format() -> None:
    stream = io.StringIO()
    configure_logging(LoggingConfig(level="warning", format="json"), stream)
    logging.getLogger("kairos.access").info(
        "GET /healthz 200 0.1 ms",
        extra={"method": "GET", "path": "/healthz", "status": 200, "duration_ms": 0.1,
               "query_id": None},
    )  # fmt: skip
    logging.getLogger("uvicorn.error").warning("a uvicorn warning")
    logging.getLogger("uvicorn.error").info("below the level: not written")
    logging.getLogger("uvicorn.access").warning("uvicorn's access line: kairos.access's instead")
    logging.getLogger("kairos.engine").info("below the level: not written")
    access, uvicorn = (json.loads(line) for line in stream.getvalue().splitlines())
    assert {k: access[k] for k in ("method", "path", "status", "duration_ms", "query_id")} == {
        "method": "GET", "path": "/healthz", "status": 200, "duration_ms": 0.1, "query_id": None
    }  # fmt: skip
    assert access["level"] == "INFO" and access["logger"] == "kairos.access" and access["time"]
    assert uvicorn["logger"] == "uvicorn.error" and uvicorn["message"] == "a uvicorn warning"


@pytest.mark.usefixtures("restored")
def test_access_off_and_a_loggers_own_level() -> None:
    stream = io.StringIO()
    configure_logging(LoggingConfig(access=False, levels={"kairos.gateway": "debug"}), stream)
    configure_logging(LoggingConfig(access=False, levels={"kairos.gateway": "debug"}), stream)
    assert len([h for h in logging.getLogger().handlers if isinstance(h, ServerHandler)]) == 1
    assert not logging.getLogger("kairos.access").isEnabledFor(logging.INFO)
    logging.getLogger("kairos.gateway").debug("routing %s", "chat")
    logging.getLogger("kairos.models").debug("not at debug: not written")
    logging.getLogger("httpx").info("HTTP Request: GET http://127.0.0.1:1/v1/load: quieted")
    (line,) = stream.getvalue().splitlines()
    assert line.endswith(" DEBUG kairos.gateway: routing chat")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "2"])
def test_kairos_serve_writes_json_lines_to_stderr(tmp_path: Path, workers: str) -> None:
    """In one process and in each of --workers 2 (which configure their logging again)."""
    project = tmp_path / "project"
    subprocess.run([*KAIROS, "init", str(project)], check=True, capture_output=True)
    with (project / "kairos.yaml").open("a") as yaml:
        yaml.write("\nlogging: {format: json}\n")
    port = free_port()
    err = tmp_path / "serve.err"
    with err.open("wb") as sink:
        process = subprocess.Popen(
            [*KAIROS, "serve", str(project), "--port", str(port), "--workers", workers],
            stdout=subprocess.DEVNULL, stderr=sink, cwd=project,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, err.read_text()
            try:
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline, err.read_text()
                time.sleep(0.2)
        answer = httpx.post(
            f"{url}/v1/query/online?token=hidden",
            json={"inputs": {"user.id": "u1"}, "outputs": ["user.name"]},
            headers={"Authorization": "Bearer hidden"},
        )
        assert answer.status_code == 200, answer.text
    finally:
        process.send_signal(signal.SIGINT)  # as Ctrl-C: the interpreter exits, finalizing
        process.wait(timeout=30)
    text = err.read_text()
    assert process.returncode in (0, 130), text  # 130: stopped by Ctrl-C
    records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    access = [r for r in records if r["logger"] == "kairos.access"]
    assert [(r["method"], r["path"], r["status"]) for r in access] == [
        ("GET", "/healthz", 200),
        ("POST", "/v1/query/online", 200),
    ]
    assert access[-1]["query_id"] == answer.json()["query_id"]
    uvicorn = [r for r in records if r["logger"].startswith("uvicorn")]
    assert uvicorn and all("color_message" not in r for r in uvicorn), text  # JSON as well
    assert not [r for r in uvicorn if r["logger"] == "uvicorn.access"]  # kairos.access's instead
    assert "hidden" not in text
    # the heap frozen for the server's life is unfrozen at exit: DuckDB's objects are freed
    assert "nanobind" not in text and "leaked" not in text


@pytest.mark.slow
def test_a_cli_query_on_a_duckdb_source_exits_without_leak_reports(tmp_path: Path) -> None:
    project = tmp_path / "project"
    subprocess.run([*KAIROS, "init", str(project)], check=True, capture_output=True)
    with sqlite3.connect(project / "data" / "app.db") as db:
        rows = db.execute("select id, name, credit_limit, spent from users").fetchall()
    names = ["id", "name", "credit_limit", "spent"]
    pq.write_table(
        pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)}),
        project / "data" / "users.parquet",
    )
    yaml = project / "kairos.yaml"
    yaml.write_text(
        yaml.read_text().replace("sqlite:///data/app.db", "duckdb:///data/users.parquet")
    )
    done = subprocess.run(
        [*KAIROS, "query", "--project", str(project), "--in", "user.id=u1",
         "--out", "user.available", "--out", "user.name"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Ada" in done.stdout
    assert "nanobind" not in done.stderr and "leaked" not in done.stderr
