"""Durations as users write them, and their canonical spelling."""

from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kairos import DefinitionError
from kairos.definitions.durations import INFINITY, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("5m", timedelta(minutes=5)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("7d", timedelta(days=7)),
        ("1w", timedelta(days=7)),
        ("1.5h", timedelta(minutes=90)),
        ("250ms", timedelta(milliseconds=250)),
        ("1s500ms", timedelta(seconds=1, milliseconds=500)),
        ("1d2h3m4s", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        (" 5M ", timedelta(minutes=5)),
        ("0s", timedelta(0)),
    ],
)
def test_parse_duration_reads_unit_strings(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["infinity", "inf", "forever", "Infinity"])
def test_parse_duration_infinity_is_timedelta_max(text: str) -> None:
    assert parse_duration(text) == INFINITY == timedelta.max


def test_parse_duration_passes_timedelta_through() -> None:
    value = timedelta(minutes=3)
    assert parse_duration(value) is value


@pytest.mark.parametrize(
    ("number", "expected"),
    [(90, timedelta(seconds=90)), (1.5, timedelta(seconds=1.5)), (0, timedelta(0))],
)
def test_parse_duration_reads_numbers_as_seconds(number: float, expected: timedelta) -> None:
    assert parse_duration(number) == expected


@pytest.mark.parametrize(
    "bad",
    ["", "   ", "5x", "-5m", "5 m", "1h 30m", "m", "90", "5mm", "one day", None, True, [1]],
)
def test_parse_duration_rejects_bad_input(bad: object) -> None:
    with pytest.raises(DefinitionError, match="is not a duration"):
        parse_duration(bad)  # type: ignore[arg-type]


def test_parse_duration_rejects_negative_numbers() -> None:
    with pytest.raises(DefinitionError, match=r"duration=-1 is negative"):
        parse_duration(-1)


def test_parse_duration_error_names_the_field_value_and_the_fix() -> None:
    with pytest.raises(DefinitionError) as info:
        parse_duration("5x", field="max_staleness")
    message = str(info.value)
    assert "max_staleness='5x'" in message
    assert "'1h30m'" in message and "'infinity'" in message


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_parse_duration_rejects_non_finite_numbers(number: float) -> None:
    with pytest.raises(DefinitionError, match=r"is not a finite number of seconds"):
        parse_duration(number, field="window")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (timedelta(days=7), "7d"),
        (timedelta(hours=24), "1d"),
        (timedelta(minutes=90), "1h30m"),
        (timedelta(seconds=1.5), "1s500ms"),
        (timedelta(days=1, hours=1, minutes=1, seconds=1), "1d1h1m1s"),
        (timedelta(days=400), "400d"),
        (timedelta(0), "0s"),
        (timedelta.max, "infinity"),
    ],
)
def test_format_duration_is_the_shortest_canonical_spelling(
    value: timedelta, expected: str
) -> None:
    assert format_duration(value) == expected


@given(st.integers(min_value=0, max_value=10**12).map(lambda ms: timedelta(milliseconds=ms)))
def test_format_then_parse_round_trips(value: timedelta) -> None:
    assert parse_duration(format_duration(value)) == value


@pytest.mark.parametrize("text", ["24h", "1440m", "86400s", "1d", "0.5d12h"])
def test_equal_durations_share_one_spelling(text: str) -> None:
    assert format_duration(parse_duration(text)) == "1d"
