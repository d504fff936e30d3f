"""`kairos init` writes a project whose LLM feature is answered by a local Gemma 3 270M
deployment through the gateway in process, with no hand wiring: embedded (`kr.Client(folder)`)
and under `kairos serve`, each leaving no llama.cpp worker behind; a query that asks for no LLM
feature starts nothing."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import kairos as kr
from kairos.cli.main import main
from kairos.project.gateway import FEATURES_KEY, features_key

# each starts Gemma 3 270M (seconds; more on a loaded machine)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def project(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    folder = tmp_path / "fresh"
    assert main(["init", str(folder)]) == 0
    hints = capsys.readouterr().out
    assert "--in user.id=u1 --out user.summary" in hints  # the hints show the LLM feature
    assert '"outputs": ["user.summary"]' in hints
    return folder


def workers_of(parent: int) -> list[int]:
    """The kairos llama.cpp workers a process started (they name it as --parent-pid)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if b"kairos.serving.worker" in argv and str(parent).encode() in argv:
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_embedded_client_answers_the_llm_feature_with_gemma(project: Path) -> None:
    client = kr.Client(project)
    try:
        result = client.query({"user.id": "u1"}, ["user.summary", "user.available"])
        assert result.errors == []
        answer = result.get_value("user.summary")
        assert isinstance(answer, str) and answer.strip()  # Gemma's words
        assert result.get_value("user.available") == 750.0
        (call,) = result.meta.llm
        assert call["deployment"] == "gemma-270m" and call["completion_tokens"] > 0
        assert call["exact"]  # counted with Gemma's own vocabulary, found from the deployment
        pids = client.llm.deployments.pids()
        assert pids and all(alive(pid) for pid in pids)
        assert client.llm.deployments.status()["gemma-270m"].state == "ready"
        gateway = client.llm.gateway()
        ledger = asyncio.run(gateway.usage())
        keys = asyncio.run(gateway.list_keys())
    finally:
        client.close()
    (row,) = ledger
    (key,) = keys
    assert (key.name, key.models) == (FEATURES_KEY, ("gemma-270m",))  # the allow-list
    assert [(b.period, b.tokens) for b in key.budgets] == [("day", 200000)]
    assert row.key_id == key.id and row.status == "ok"
    assert row.model_requested == "local/gemma-270m" and row.provider == "gemma-270m"
    assert (row.tokens_in, row.tokens_out) == (call["prompt_tokens"], call["completion_tokens"])
    assert row.cost_micros == 0  # a local model is free unless priced
    assert not any(alive(pid) for pid in pids)  # closed: no worker left

    with kr.Client(project) as again:  # a restart reuses the key: its budget keeps counting
        budgets = [{"period": "day", "tokens": 200000}]
        reused = asyncio.run(features_key(again.llm.gateway(), ["local/gemma-270m"], budgets))
        assert reused.id == key.id
        assert [k.id for k in asyncio.run(again.llm.gateway().list_keys())] == [key.id]


def test_kairos_gateway_commands_read_the_same_gateway(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The alias to the deployment's group resolves, and keys hash with the local pepper."""
    args = ["--project", str(project)]
    assert main(["gateway", "keys", "create", "--name", "ops", "--model", "gemma-270m",
                 "--json", *args]) == 0  # fmt: skip
    created = json.loads(capsys.readouterr().out)
    with kr.Client(project) as client:
        gateway = client.llm.gateway()
        record = asyncio.run(gateway.authenticate(created["key"]))  # the same pepper
        assert record.id == created["id"] and gateway.models(record) == [
            "gemma-270m", "local/gemma-270m",
        ]  # fmt: skip
    assert main(["gateway", "keys", "list", "--json", *args]) == 0
    assert [k["name"] for k in json.loads(capsys.readouterr().out)] == ["ops"]


def test_a_query_without_the_llm_feature_starts_nothing(project: Path) -> None:
    with kr.Client(project) as client:
        result = client.query({"user.id": "u2"}, ["user.name", "user.available"])
        assert result.errors == [] and result.get_value("user.available") == 20.0
        assert client.llm.deployments.status()["gemma-270m"].state == "idle"
        assert client.llm.deployments.pids() == []
        assert workers_of(os.getpid()) == []
    assert not (project / ".kairos" / "deployments").exists()
    assert not (project / ".kairos" / "gateway.db").exists()  # not even the gateway's registry


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def served(project: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    port = free_port()
    output = project.parent / "serve.out"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "kairos.cli", "serve", str(project), "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}", process, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)


def test_kairos_serve_answers_the_llm_feature_and_stops_its_workers(
    served: tuple[str, subprocess.Popen[bytes], Path],
) -> None:
    base, process, output = served
    states = set()
    deadline = time.monotonic() + 100
    while True:  # /readyz says 503 starting until Gemma serves
        assert process.poll() is None, output.read_text()
        assert time.monotonic() < deadline, output.read_text()
        try:
            ready = httpx.get(f"{base}/readyz", timeout=5)
        except httpx.TransportError:
            time.sleep(0.1)
            continue
        states.add((ready.status_code, ready.json()["status"]))
        if ready.status_code == 200:
            break
        time.sleep(0.1)
    assert ready.json() == {"status": "ready", "deployments": {"gemma-270m": "ready"}}
    assert states <= {(503, "starting"), (200, "ready")}
    (worker,) = workers_of(process.pid)  # started with the server, before any query

    body = {"inputs": {"user.id": "u3"}, "outputs": ["user.summary", "user.name"]}
    answer = httpx.post(f"{base}/v1/query/online", json=body, timeout=90).json()
    assert answer["errors"] == []
    assert isinstance(answer["values"]["user.summary"], str) and answer["values"]["user.summary"]
    assert answer["values"]["user.name"] == "Alan"
    assert answer["meta"]["llm"][0]["deployment"] == "gemma-270m"

    os.kill(process.pid, signal.SIGTERM)
    assert process.wait(timeout=60) in (0, -signal.SIGTERM), output.read_text()
    assert not alive(worker), output.read_text()
    assert workers_of(process.pid) == []
    assert "Traceback" not in output.read_text()


def test_the_llm_feature_names_the_install_when_llama_cpp_is_missing(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a plain `pip install kairos-inference` sees: the LLM feature's error names the
    extra, the other features in the same query are answered."""
    monkeypatch.setattr("kairos.project.deployments._installed", lambda module: False)
    with kr.Client(project) as client:
        result = client.query({"user.id": "u1"}, ["user.summary", "user.name"])
        assert result.get_value("user.name") == "Ada"
        (error,) = result.errors
        assert error.feature == "user.summary"
        assert "pip install 'kairos-inference[llm]'" in error.message
        assert client.llm.deployments.status()["gemma-270m"].state == "unavailable"
        assert client.llm.deployments.pids() == []


def test_kairos_gateway_serve_runs_the_deployment(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--project", str(project)]
    assert main(["gateway", "keys", "create", "--name", "app", "--json", *args]) == 0
    key = json.loads(capsys.readouterr().out)["key"]
    port = free_port()
    output = project.parent / "gateway.out"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "kairos.cli", "gateway", "serve", *args, "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        body = {
            "model": "local/gemma-270m",
            "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 4,
        }
        headers = {"Authorization": f"Bearer {key}"}
        deadline = time.monotonic() + 100
        while True:  # the gateway answers 503 until its replica serves
            assert process.poll() is None, output.read_text()
            assert time.monotonic() < deadline, output.read_text()
            try:
                reply = httpx.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json=body, headers=headers, timeout=60,
                )  # fmt: skip
            except httpx.TransportError:
                reply = None
            if reply is not None and reply.status_code == 200:
                break
            time.sleep(0.2)
        assert reply.json()["usage"]["completion_tokens"] > 0
        (worker,) = workers_of(process.pid)
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) in (0, -signal.SIGTERM), output.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    assert not alive(worker)
