"""`kairos --version` names the installed distribution's version."""

import subprocess
import sys
from importlib import metadata

import pytest

import kairos
from kairos.cli.main import DISTRIBUTION, version
from kairos.errors import KairosError


def _installed() -> str:
    """The version pip installed."""
    return metadata.version("kairos-inference")


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


def test_version_reads_the_kairos_inference_distribution(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = []

    def not_installed(name: str) -> str:
        asked.append(name)
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    with pytest.raises(KairosError, match="pip install kairos-inference"):
        version()
    assert asked == [DISTRIBUTION] == ["kairos-inference"]  # never `kairos`: another project
