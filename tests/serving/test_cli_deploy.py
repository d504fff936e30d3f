"""`kairos deploy llm` in the foreground: readiness printed, served, drained on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kairos.gateway import Gateway
from kairos.project.gateway import project_gateway_config


def test_deploy_serves_until_sigterm(tiny_model: Path, tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "kairos.cli",
        "deploy",
        "llm",
        "tiny",
        "--model",
        str(tiny_model),
        "--ctx",
        "256",
        "--threads",
        "1",
        "--log-dir",
        str(tmp_path),
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while not any("serves on" in line for line in lines):
            assert time.monotonic() < deadline and process.poll() is None, "".join(lines)
            lines.append(process.stdout.readline())
        assert any("replica 0 of 'tiny' ready on" in line for line in lines)
        url = re.search(r"serves on (\S+)", lines[-1])
        assert url is not None
        body = {"model": "tiny", "prompt": "a", "max_tokens": 2, "ignore_eos": True}
        answer = httpx.post(url.group(1).rstrip(",") + "/v1/completions", json=body)
        assert answer.json()["usage"]["completion_tokens"] == 2
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=30)
        assert process.returncode == 0
        assert "stopped 'tiny'" in rest
        assert (tmp_path / "tiny-0.log").exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("pepper", ["env", "local"])
def test_deploy_with_gateway_registers_the_group_as_one_model_group(
    tiny_model: Path, tmp_path: Path, pepper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`local`: no pepper_env, so the project's .kairos/gateway.pepper hashes the keys (as
    kairos gateway keys create and the project's clients do); it used to be refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "kairos.yaml").write_text(
        "gateway:\n"
        + ("  pepper_env: TEST_DEPLOY_PEPPER\n" if pepper == "env" else "")
        + f"  registry: sqlite:///{tmp_path / 'gateway.db'}\n"
        f"  counters: sqlite:///{tmp_path / 'gateway.db'}\n"
    )
    monkeypatch.setenv("TEST_DEPLOY_PEPPER", "pepper")
    environ = dict(os.environ)
    config = project_gateway_config(tmp_path)
    local = tmp_path / ".kairos" / "gateway.pepper"
    assert config.pepper == ("pepper" if pepper == "env" else local.read_text().strip())

    async def create() -> str:
        gateway = Gateway(config)
        key, _ = await gateway.create_key(name="t", models=["tiny"])
        await gateway.close()
        return key

    key = asyncio.run(create())
    command = [
        sys.executable, "-m", "kairos.cli", "deploy", "llm", "tiny", "--model", str(tiny_model),
        "--ctx", "256", "--threads", "1", "--log-dir", str(tmp_path / "logs"),
        "--gateway", "--project", str(tmp_path), "--gateway-port", str(port),
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while not any("gateway on" in line for line in lines):
            assert time.monotonic() < deadline and process.poll() is None, "".join(lines)
            lines.append(process.stdout.readline())
        body = {"model": "tiny", "messages": [{"role": "user", "content": "a"}],
                "max_tokens": 3, "ignore_eos": True}  # fmt: skip
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 3
        refused = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
        assert refused.status_code == 401  # the gateway's keys apply to the group
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    async def ledger() -> list[tuple[str, int]]:
        gateway = Gateway(config)
        rows = await gateway.usage()
        await gateway.close()
        return [(row.model_requested, row.tokens_out) for row in rows]

    assert asyncio.run(ledger()) == [("tiny", 3)]
