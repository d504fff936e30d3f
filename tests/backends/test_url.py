"""One parser and one redactor for every storage URL: each form the three redactors it
replaced handled (sources' `redact`, the online store's and the query log's `redact_url`,
the offline store's conninfo masking) gives what its caller showed, or, where they differed,
what the one that masked the most showed."""

from __future__ import annotations

import pytest

from kairos.backends.url import option_names, parse, redact, scrub, secrets, take_options


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # user:password@ user info
        ("postgresql://app:s3cret@db:5432/bank", "postgresql://app:***@db:5432/bank"),
        (
            "postgres://app:s3cret@db/bank?sslmode=require",
            "postgres://app:***@db/bank?sslmode=require",
        ),
        ("redis://app:s3cret@cache:6379/0", "redis://app:***@cache:6379/0"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("postgresql://app:@db/bank", "postgresql://app:***@db/bank"),
        ("mysql://bob:s3cret@db.example/prod", "mysql://bob:***@db.example/prod"),
        ("redis://app:hunter2@cache:notaport/0", "redis://app:***@cache:notaport/0"),
        # user info without ':' is a password to Redis and the like, a user to libpq
        ("redis://s3cret@cache:6379/0", "redis://***@cache:6379/0"),
        ("postgresql://app@db/bank", "postgresql://app@db/bank"),
        # libpq ends the user info at an '@' before any '/': '?' and '#' may be in it
        ("postgresql://app:pa?ss#wd@db/bank", "postgresql://app:***@db/bank"),
        # an unencoded '@' or '/' in a password stays hidden (sources' redactor showed 'ss@'
        # and 'pa/ss', the online store's hid them)
        ("postgresql://app:p@ss@db/bank", "postgresql://app:***@db/bank"),
        ("postgresql://app:pa/ss@db/bank", "postgresql://app:***@db/bank"),
        # an '@' after the path is not user info
        ("postgresql://db/bank?application_name=a@b", "postgresql://db/bank?application_name=a@b"),
        ("postgresql://db:5432/bank?x=a@b", "postgresql://db:5432/bank?x=a@b"),
        (
            "postgresql://app:pw@db/bank?application_name=a@b",
            "postgresql://app:***@db/bank?application_name=a@b",
        ),
        ("duckdb:////srv/a:b@c.duckdb", "duckdb:////srv/a:b@c.duckdb"),
        # secret query parameters: password, passwd, secret, token (any case, in any name)
        (
            "postgresql://app@db/bank?password=s3cret&x=1",
            "postgresql://app@db/bank?password=***&x=1",
        ),
        ("postgres://u:p@h/db?password=p2", "postgres://u:***@h/db?password=***"),
        (
            "postgresql://db/x?sslmode=require&password=s3cret",
            "postgresql://db/x?sslmode=require&password=***",
        ),
        ("postgresql://h/db?PassWord=abc", "postgresql://h/db?PassWord=***"),
        ("postgresql://h/db?passwd=abc", "postgresql://h/db?passwd=***"),
        ("postgresql://h/db?sslpassword=abc", "postgresql://h/db?sslpassword=***"),
        ("redis://cache/0?token=abc&x=1", "redis://cache/0?token=***&x=1"),
        # a value runs to the next '&' (the online store's stopped at ';' and '#' too)
        ("redis://cache/0?client_secret=abc;x=1", "redis://cache/0?client_secret=***"),
        ("postgresql://h/db?password=ab#c", "postgresql://h/db?password=***"),
        ("postgresql://h/db?password='a&b'", "postgresql://h/db?password=***"),
        ("sqlite:///.kairos/tokens.db?table=t", "sqlite:///.kairos/tokens.db?table=t"),
        # libpq key=value conninfo strings, quoted passwords included
        ("host=db password=s3cret", "host=db password=***"),
        (
            "host=127.0.0.1 dbname=x user=x password=s3cret-pw",
            "host=127.0.0.1 dbname=x user=x password=***",
        ),
        ("host=db password='s3 cr\\'et' user=x", "host=db password=*** user=x"),
        ("host=db password = 'x y'", "host=db password = ***"),
        # no scheme: all of it may be an address with credentials
        ("app:s3cret@cache:6379", "app:***@cache:6379"),
        ("db/x?password=s3cret", "db/x?password=***"),
        # a URL Python cannot split shows its scheme only
        ("postgresql://app:pa[ss@db/x", "postgresql://***"),
        # nothing secret: unchanged
        ("sqlite:///data/bank.db", "sqlite:///data/bank.db"),
        ("redis://cache:6379/0?prefix=p", "redis://cache:6379/0?prefix=p"),
        ("memory://", "memory://"),
        ("none://", "none://"),
        ("query_log.db", "query_log.db"),
    ],
)
def test_redact_hides_every_secret(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_scrub_hides_passwords_a_driver_echoes_in_any_spelling() -> None:
    url = "postgresql://app:p%40ss@db/bank?password=other"
    message = f'bad token "p%40ss", then "p@ss", then "other", in {url}'

    assert scrub(message, url) == (
        'bad token "***", then "***", then "***", in postgresql://app:***@db/bank?password=***'
    )


def test_scrub_hides_a_decoded_password_percent_encoded() -> None:
    url = "postgresql://kairos:p@ss w0rd@db/prod"  # as the query log's redactor read it

    assert scrub("failed for p%40ss%20w0rd and p@ss w0rd", url) == "failed for *** and ***"


def test_scrub_hides_a_conninfo_password_quoted_or_not() -> None:
    conninfo = "host=db user=x password='s3 cr\\'et'"
    message = f"cannot connect with s3 cr'et ('s3 cr\\'et') using {conninfo}"

    assert (
        scrub(message, conninfo)
        == "cannot connect with *** (***) using host=db user=x password=***"
    )
    assert scrub("no s3cret-pw here", "host=db password=s3cret-pw") == "no *** here"


def test_secrets_are_listed_longest_first_in_every_spelling() -> None:
    assert secrets("postgresql://app:p%40ss@db/bank") == ["p%2540ss", "p%40ss", "p@ss"]
    assert secrets("redis://cache/0?token=t0k&x=1") == ["t0k"]
    assert secrets("postgresql://app@db/bank") == []


def test_parse_normalises_the_scheme_once() -> None:
    url = parse("Postgres://app:pw?x@db/bank?pool_max=5")

    assert (url.scheme, url.family, url.query) == ("postgres", "postgresql", "pool_max=5")
    assert parse("rediss://cache/0").family == "redis"
    assert parse("memory:").scheme == "memory"  # no '//': the online store takes it
    assert parse("online.db").scheme == ""
    assert parse("sqlite:///data/a.db").file_path() == "data/a.db"
    assert parse("sqlite:////srv/a.db").file_path() == "/srv/a.db"
    assert parse("sqlite:/a.db").file_path() == ""


def test_take_options_keeps_the_drivers_options_as_written() -> None:
    url = "postgresql://app:pw?x@db/bank?pool_max=5&options=-csearch_path%3Dx&pool_timeout=2.5"

    assert take_options(url, {"pool_max", "pool_timeout"}) == (
        "postgresql://app:pw?x@db/bank?options=-csearch_path%3Dx",
        {"pool_max": "5", "pool_timeout": "2.5"},
    )
    assert take_options("sqlite:///bank.db", {"pool_max"}) == ("sqlite:///bank.db", {})
    assert take_options("postgresql://h/db?prefix=a&prefix=b", {"prefix"}) == (
        "postgresql://h/db",
        {"prefix": "b"},
    )


def test_option_names_lists_what_is_left() -> None:
    assert option_names("sqlite:///a.db?x=1&y&%7A=2") == ["x", "y", "z"]
    assert option_names("sqlite:///a.db") == []
