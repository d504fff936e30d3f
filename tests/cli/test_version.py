"""`kairos --version` names the installed distribution's version."""

import subprocess
import sys
from importlib import metadata

import kairos


def test_version_prints_the_installed_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kairos.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done
    assert done.stdout.strip() == f"kairos {metadata.version('kairos-inference')}"
    assert metadata.version("kairos-inference") == kairos.__version__  # one version, not two
