"""Source URLs: `${VAR}`s filled in, passwords hidden, kairos' own options split off."""

from __future__ import annotations

import pytest

from kairos.errors import KairosError
from kairos.sources.url import interpolate, redact, scrub, take_options


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://app:s3cret@db:5432/bank", "postgresql://app:***@db:5432/bank"),
        (
            "postgres://app:s3cret@db/bank?sslmode=require",
            "postgres://app:***@db/bank?sslmode=require",
        ),
        # libpq ends the user info at the first '@' before any '/': '?' and '#' may be in it.
        ("postgresql://app:pa?ss#wd@db/bank", "postgresql://app:***@db/bank"),
        (
            "postgresql://app@db/bank?password=s3cret&x=1",
            "postgresql://app@db/bank?password=***&x=1",
        ),
        ("postgresql://app:@db/bank", "postgresql://app:***@db/bank"),
        ("postgresql://db/bank?application_name=a@b", "postgresql://db/bank?application_name=a@b"),
        ("postgresql://app@db/bank", "postgresql://app@db/bank"),
        ("sqlite:///data/bank.db", "sqlite:///data/bank.db"),
        ("duckdb:////srv/a:b@c.duckdb", "duckdb:////srv/a:b@c.duckdb"),
        ("host=db password=s3cret", "host=db password=s3cret"),  # not a URL: left alone
    ],
)
def test_redact_hides_the_password(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_scrub_hides_passwords_a_driver_echoes() -> None:
    url = "postgresql://app:p%40ss@db/bank?password=other"
    message = f'bad token "p%40ss", then "p@ss", then "other", in {url}'

    assert scrub(message, url) == (
        'bad token "***", then "***", then "***", in postgresql://app:***@db/bank?password=***'
    )


def test_take_options_keeps_the_drivers_options_as_written() -> None:
    url = "postgresql://app:pw?x@db/bank?pool_max=5&options=-csearch_path%3Dx&pool_timeout=2.5"

    assert take_options(url, {"pool_max", "pool_timeout"}) == (
        "postgresql://app:pw?x@db/bank?options=-csearch_path%3Dx",
        {"pool_max": "5", "pool_timeout": "2.5"},
    )
    assert take_options("sqlite:///bank.db", {"pool_max"}) == ("sqlite:///bank.db", {})


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
