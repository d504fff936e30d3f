"""`kairos deploy llm` in the foreground: readiness printed, served, drained on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


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
