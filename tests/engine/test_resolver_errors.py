"""A resolver's exception reaches the caller as its type, message and the line of the user's
code that raised it; the traceback goes to the log (kairos.resolvers, ERROR), not the caller."""

import logging
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kairos import features, online
from tests.engine.conftest import MakeClient

NOW = datetime(2026, 1, 10, tzinfo=UTC)


@features
class Shop:
    id: str
    rating: float
    label: str


def check_row(row: str) -> float:
    raise ValueError(f"bad row {row}")  # LINE: check_row


def line_of(marker: str) -> int:
    """The line of this file holding `# LINE: marker`."""
    with open(__file__) as source:
        for number, text in enumerate(source, 1):
            if text.rstrip().endswith(f"# LINE: {marker}"):
                return number
    raise AssertionError(marker)


def test_the_message_names_the_type_the_message_and_the_resolvers_line(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    @online
    def rating(sid: Shop.id) -> Shop.rating:
        raise KeyError("rating")  # LINE: rating

    client = make_client(Shop, rating)
    with caplog.at_level(logging.ERROR, logger="kairos.resolvers"):
        result = client.query(input={Shop.id: "s1"}, output=[Shop.rating], now=NOW)

    (error,) = result.errors
    assert error.code == "resolver_error"
    where = f"test_resolver_errors.py:{line_of('rating')}"
    assert error.message == f"resolver 'rating' raised KeyError: 'rating' ({where})"
    assert "Traceback" not in error.message
    (record,) = [r for r in caplog.records if r.name == "kairos.resolvers"]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and record.exc_info[0] is KeyError
    logged = caplog.text
    assert "Traceback (most recent call last)" in logged
    assert 'raise KeyError("rating")' in logged  # the resolver's frame, with its source line


def test_the_innermost_frame_of_the_users_code_is_named_not_kairos(
    make_client: MakeClient,
) -> None:
    """A helper the resolver calls is where it raised; a library's frame below the user's
    (here float() in C, and the standard library's) is not the user's line."""

    @online
    def label(sid: Shop.id) -> Shop.label:
        return str(check_row(sid))

    @online
    def rating(sid: Shop.id) -> Shop.rating:
        return float(__import__("json").loads("{bad"))  # LINE: library

    client = make_client(Shop, label, rating)
    result = client.query(input={Shop.id: "s1"}, output=[Shop.label, Shop.rating], now=NOW)

    errors = {e.feature: e.message for e in result.errors}
    assert errors["shop.label"] == (
        "resolver 'label' raised ValueError: bad row s1 "
        f"(test_resolver_errors.py:{line_of('check_row')})"
    )
    assert errors["shop.rating"].startswith("resolver 'rating' raised JSONDecodeError: ")
    assert errors["shop.rating"].endswith(f"(test_resolver_errors.py:{line_of('library')})")


def test_a_batch_that_raises_logs_one_traceback_for_all_its_rows(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    @online(batch=True)
    def rating(sids: Shop.id) -> Shop.rating:
        raise RuntimeError("rating service down")  # LINE: batch

    client = make_client(Shop, rating)
    with caplog.at_level(logging.ERROR, logger="kairos.resolvers"):
        result = client.query_bulk(
            input={Shop.id: ["s1", "s2", "s3"]}, output=[Shop.rating], now=NOW
        )

    messages = {e.message for e in result.errors}
    assert messages == {
        "resolver 'rating' raised RuntimeError: rating service down "
        f"(test_resolver_errors.py:{line_of('batch')})"
    }
    assert len(result.errors) == 3
    assert len([r for r in caplog.records if r.name == "kairos.resolvers"]) == 1


def test_an_error_kairos_raises_names_no_line_and_logs_below_error(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch resolver's wrong count is found by kairos: no frame of the user's is where it
    was raised, so the message names none, and the traceback is logged at DEBUG only."""

    @online(batch=True)
    def rating(sids: Shop.id) -> Shop.rating:
        return [1.0]

    client = make_client(Shop, rating)
    with caplog.at_level(logging.DEBUG, logger="kairos.resolvers"):
        result = client.query_bulk(input={Shop.id: ["s1", "s2"]}, output=[Shop.rating], now=NOW)

    assert {e.message for e in result.errors} == {
        "resolver 'rating' raised ValueError: batch resolver 'rating' returned 1 results for "
        "2 entities; return one per entity, in order"
    }
    (record,) = [r for r in caplog.records if r.name == "kairos.resolvers"]
    assert record.levelno == logging.DEBUG and record.exc_info is not None


RAISING_PROJECT = """
from kairos import features, online


@features
class Shop:
    id: str
    rating: float


@online
def rating(sid: Shop.id) -> Shop.rating:
    raise ValueError("no rating yet")
"""


def test_kairos_query_prints_the_one_line_error_and_no_traceback(tmp_path: Path) -> None:
    # no logging set up (the CLI, a script): the caller has the error; nothing else is printed
    (tmp_path / "features.py").write_text(RAISING_PROJECT)
    done = subprocess.run(
        [sys.executable, "-m", "kairos.cli", "query", "--project", str(tmp_path),
         "--in", "shop.id=s1", "--out", "shop.rating"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    both = done.stdout + done.stderr
    assert "resolver 'rating' raised ValueError: no rating yet (features.py:13)" in both
    assert "Traceback" not in both, both
