"""The wheel as a user installs it, built once from this tree: with no extras into a fresh venv
(`import kairos`, `kairos init`, `kairos query`, `kairos serve` answering one HTTP query and the
dashboard), then once per extra, each in a venv of its own where tests/wheel_smoke.py exercises
what that extra is for. A runtime import missing from `dependencies` or from an extra fails here.

How this stays fast, and still is `pip install 'kairos-inference[extra]'` into a clean venv:
- pip resolves and installs, always from the wheel's own metadata; its files come from a
  wheelhouse (~/.cache/kairos/wheelhouse) that `pip wheel` fills for every extra at once, only
  when the wheel's requirements change: pip keeps no HTTP cache here, so each venv would
  download ~2 GB again (torch, xgboost, ...), and llama-cpp-python's build comes from pip's
  wheel cache instead of ten minutes of compiling.
- An extra's venv sees the plain venv's site-packages through a .pth file: what pip installs
  there is exactly what `[extra]` adds to the plain install (pip counts the plain install as
  already satisfied). `embeddings` stands on `torch` the same way: [embeddings] requires all
  of [torch] (a test below holds it to that), so its resolution includes torch's.
- Installs skip byte-compiling (`--no-compile`), and the extras run three at a time.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
import venv
import zipfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.wheel_smoke import SMOKES

ROOT = Path(__file__).parents[1]
pytestmark = pytest.mark.slow
PIP = [sys.executable, "-m", "pip"]
# heaviest first: the pool starts them first, and each test waits for its own extra in turn
EXTRAS = ["models", "torch", "embeddings", "llm", "ray", "eval", "polars", "pandas", "otel",
          "postgres-arrow", "streams", "vectors"]  # fmt: skip
ON = {"embeddings": "torch"}  # an extra whose venv stands on another extra's
WORKERS = 3


def run(*command: str | Path, cwd: Path | None = None, timeout: float = 600) -> str:
    done = subprocess.run(
        [str(c) for c in command], capture_output=True, text=True, timeout=timeout, cwd=cwd,
        env={**os.environ, "PYTHONPATH": ""},
    )  # fmt: skip
    assert done.returncode == 0, f"{command}: {done.stdout}\n{done.stderr}"
    return done.stdout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def extras_of_pyproject() -> dict[str, list[str]]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        extras: dict[str, list[str]] = tomllib.load(file)["project"]["optional-dependencies"]
    return {name: reqs for name, reqs in extras.items() if name not in ("dev", "demo")}


def build_wheel(into: Path) -> Path:
    """This tree's wheel, built into `into`. setuptools builds in the tree (build/, the
    egg-info under src/), so builds at once (test workers, other sessions) take turns."""
    (ROOT / "build").mkdir(exist_ok=True)
    with (ROOT / "build" / ".wheel.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run(*PIP, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", into, ROOT)
    (built,) = into.glob("kairos_inference-*.whl")
    return built


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"))


def requirements_of(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(name).decode()
    return sorted(line for line in text.splitlines() if line.startswith("Requires-Dist:"))


@pytest.fixture(scope="module")
def wheelhouse(wheel: Path) -> Path:
    """Every wheel that the plain install and each extra need, filled once per change of the
    wheel's requirements (one joint resolution against the index, pip's own)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    house = cache / "kairos" / "wheelhouse"
    house.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256("\n".join(requirements_of(wheel)).encode()).hexdigest()[:16]
    filled = house / f".filled-{digest}"
    with (house / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be filling it
        if not filled.exists():
            run(*PIP, "wheel", "-q", "-w", house, f"{wheel}[{','.join(EXTRAS)}]", timeout=1800)
            for ours in house.glob("kairos_inference-*.whl"):
                ours.unlink()  # this tree's wheel is installed from its own path
            filled.touch()
    return house


def new_venv(folder: Path, *under: Path) -> Path:
    """A venv without pip (the suite's pip installs into it), seeing the site-packages of the
    venvs `under` it after its own."""
    venv.create(folder, with_pip=False)
    (site,) = folder.glob("lib/python*/site-packages")
    lower = [str(next(u.glob("lib/python*/site-packages"))) for u in under]
    if lower:
        (site / "_kairos_layers.pth").write_text("\n".join(lower) + "\n")
    return folder / "bin" / "python"


def pip_install(python: Path, wheelhouse: Path, requirement: str) -> None:
    run(*PIP, "--python", python, "install", "-q", "--no-compile", "--no-index",
        "--find-links", wheelhouse, requirement)  # fmt: skip


@pytest.fixture(scope="module")
def plain(wheel: Path, wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The venv of `pip install kairos-inference`: the wheel and its dependencies."""
    folder = tmp_path_factory.mktemp("plain") / "venv"
    pip_install(new_venv(folder), wheelhouse, str(wheel))  # no extras: only `dependencies`
    return folder


# the first run on a machine fills the wheelhouse: minutes of downloads, once
@pytest.mark.timeout(1800)
def test_the_plain_wheel_installs_and_serves(plain: Path, tmp_path: Path) -> None:
    bin_ = plain / "bin"
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
        request = urllib.request.Request(
            f"{url}/v1/query/online", data=body, method="POST",
            headers={"Content-Type": "application/json"},  # the server reads JSON bodies only
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["values"] == {"user.name": "Ada"}
        with urllib.request.urlopen(f"{url}/ui/features", timeout=30) as response:
            assert response.status == 200 and "user.name" in response.read().decode()
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=30)  # reads and closes its pipe
    assert "kairos serving" in output


@dataclass(frozen=True)
class ExtraRun:
    install_s: float
    smoke_s: float


@pytest.fixture(scope="module")
def extra_runs(
    wheel: Path, wheelhouse: Path, plain: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Future[ExtraRun]]]:
    """Each extra installed and smoked in the background, WORKERS at a time."""
    root = tmp_path_factory.mktemp("extras")
    # the smoke runs from a folder of its own: its folder is sys.path[0], and a folder named
    # like a module there (a venv's `pandas/`) would be imported instead of the module
    smoke = root / "smoke" / "wheel_smoke.py"
    smoke.parent.mkdir()
    shutil.copy(ROOT / "tests" / "wheel_smoke.py", smoke)
    installed: dict[str, Future[Path]] = {extra: Future() for extra in EXTRAS}
    runs: dict[str, Future[ExtraRun]] = {}

    def install_and_smoke(extra: str) -> ExtraRun:
        started = time.monotonic()
        folder = root / f"with-{extra}"
        try:
            under = [installed[ON[extra]].result()] if extra in ON else []
            python = new_venv(folder / "venv", *under, plain)
            pip_install(python, wheelhouse, f"{wheel}[{extra}]")
        except BaseException as error:
            installed[extra].set_exception(error)
            raise
        installed[extra].set_result(folder / "venv")
        done = time.monotonic()
        run(python, "-m", "kairos.cli", "init", folder / "project")
        output = run(python, smoke, extra, folder / "project", cwd=folder)
        assert f"ok {extra}" in output, output
        return ExtraRun(done - started, time.monotonic() - done)

    with ThreadPoolExecutor(WORKERS, thread_name_prefix="extra") as pool:
        for extra in EXTRAS:
            runs[extra] = pool.submit(install_and_smoke, extra)
        try:
            yield runs
        finally:
            for future in runs.values():
                future.cancel()
    shutil.rmtree(root, ignore_errors=True)  # ~4 GB of venvs


# a test waits for its extra's install and smoke, which run in the background from the first
@pytest.mark.timeout(900)
@pytest.mark.parametrize("extra", EXTRAS)
def test_the_wheel_with_an_extra_does_what_the_extra_is_for(
    extra: str, extra_runs: dict[str, Future[ExtraRun]]
) -> None:
    done = extra_runs[extra].result(timeout=600)
    print(f"[{extra}] install {done.install_s:.1f} s, smoke {done.smoke_s:.1f} s")


def test_every_extra_has_a_smoke_and_a_layer_is_a_subset() -> None:
    extras = extras_of_pyproject()
    assert set(EXTRAS) == set(extras) == set(SMOKES), "give each extra a smoke in wheel_smoke.py"
    for extra, below in ON.items():
        missing = set(extras[below]) - set(extras[extra])
        assert not missing, f"[{extra}] stands on [{below}] but does not require {missing}"
