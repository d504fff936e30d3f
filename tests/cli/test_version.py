"""`kairos --version` names the installed distribution's version."""

import subprocess
import sys
from importlib import metadata

import pytest

import kairos
from kairos.cli.main import version


def _installed() -> str:
    """The version pip installed, under the distribution's new name or its old one."""
    for name in ("kairos-inference", "kairos"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    raise AssertionError("kairos is not installed as a distribution")


def test_version_prints_the_installed_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kairos.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done
    assert done.stdout.strip() == f"kairos {_installed()}"
    assert _installed() == kairos.__version__  # one version, not two


def test_version_reads_whichever_name_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []

    def installed_as_kairos(name: str) -> str:
        asked.append(name)
        if name != "kairos":
            raise metadata.PackageNotFoundError(name)
        return "9.9.9"

    monkeypatch.setattr(metadata, "version", installed_as_kairos)
    assert version() == "9.9.9"
    assert asked == ["kairos-inference", "kairos"]
