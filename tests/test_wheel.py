"""The wheel as a user installs it: built from this tree, installed with no extras into a fresh
venv, then `import kairos`, `kairos init`, `kairos query` and `kairos serve` answering one
HTTP query and the dashboard. A runtime import missing from `dependencies` fails here."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.slow


def run(*command: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=600, cwd=cwd
    )
    assert done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
    return done.stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_plain_wheel_installs_and_serves(tmp_path: Path) -> None:
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
        "-w", tmp_path / "dist", ROOT)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("kairos-*.whl")
    venv.create(tmp_path / "venv", with_pip=True)
    bin_ = tmp_path / "venv" / "bin"
    run(bin_ / "pip", "install", "-q", wheel)  # no extras: only `dependencies`
    assert run(bin_ / "python", "-c", "import kairos; print(kairos.__version__)").strip()
    project = tmp_path / "project"
    run(bin_ / "kairos", "init", project)
    answer = run(bin_ / "kairos", "query", "--project", project, "--in", "user.id=u1",
                 "--out", "user.name")  # fmt: skip
    assert "Ada" in answer
    port = free_port()
    server = subprocess.Popen(
        [bin_ / "kairos", "serve", project, "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=5):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.2)
        body = json.dumps({"inputs": {"user.id": "u1"}, "outputs": ["user.name"]}).encode()
        request = urllib.request.Request(f"{url}/v1/query/online", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["values"] == {"user.name": "Ada"}
        with urllib.request.urlopen(f"{url}/ui/features", timeout=30) as response:
            assert response.status == 200 and "user.name" in response.read().decode()
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)  # reads and closes its pipe
    assert "kairos serving" in output
