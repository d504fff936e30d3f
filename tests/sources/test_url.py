"""Source configs: `${VAR}`s filled in (URL parsing and redaction: tests/backends/test_url.py)."""

from __future__ import annotations

import pytest

from kairos.errors import KairosError
from kairos.sources.url import interpolate


def test_interpolate_fills_every_reference() -> None:
    environ = {"USER_": "app", "PASSWORD": "s3cret", "HOST": "db"}
    text = "postgresql://${USER_}:${PASSWORD}@${HOST}/bank?x=$HOME"

    assert interpolate(text, environ, source="bank") == "postgresql://app:s3cret@db/bank?x=$HOME"


def test_interpolate_names_a_missing_variable() -> None:
    with pytest.raises(KairosError) as raised:
        interpolate("postgresql://app:${BANK_PASSWORD}@db/bank", {}, source="bank")

    assert str(raised.value) == (
        "source 'bank': environment variable 'BANK_PASSWORD' is not set; "
        "export BANK_PASSWORD=... before starting kairos"
    )


def test_interpolate_rejects_a_malformed_reference() -> None:
    with pytest.raises(KairosError, match=r"'\$\{1PASS\}' is not a variable reference"):
        interpolate("postgresql://app:${1PASS}@db/bank", {"1PASS": "x"}, source="bank")
