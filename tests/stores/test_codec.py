"""The value codec: what goes in comes back equal and of the same type, all the way down."""

import math
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from enum import Enum, IntEnum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kairos.errors import KairosError
from kairos.stores.codec import (
    CorruptValue,
    UnencodableValue,
    decode,
    encode,
    encode_key,
    from_micros,
    to_micros,
)


def same(a: Any, b: Any) -> bool:
    """Equal and of the same type at every level; NaN equals NaN, -0.0 is not 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, datetime | time):  # same wall time, same offset (ZoneInfo -> fixed offset)
        return bool(
            a.replace(tzinfo=None) == b.replace(tzinfo=None) and a.utcoffset() == b.utcoffset()
        )
    return bool(a == b)


# dict keys that look like the codec's own tags must stay plain keys
dict_keys = st.text(max_size=8) | st.sampled_from(["$dt", "$date", "$td", "$dict", "$", "$x"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.datetimes(timezones=st.just(UTC))
    | st.datetimes()  # naive stays naive
    | st.datetimes(timezones=st.timezones())
    | st.dates()
    | st.times()
    | st.timedeltas()
    | st.decimals(allow_nan=False)
    | st.binary(max_size=8)
)
values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(dict_keys, children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.integers(), children, max_size=3)
    ),
    max_leaves=12,
)
# has-many values: lists of rows
rows = st.lists(st.dictionaries(dict_keys, scalars, max_size=5), max_size=5)


@given(values)
def test_any_value_round_trips_exactly(value: Any) -> None:
    assert same(decode(encode(value)), value)


@given(rows)
def test_rows_round_trip_exactly(value: list[dict[str, Any]]) -> None:
    assert same(decode(encode(value)), value)


@given(st.datetimes(max_value=datetime(9999, 12, 31, 23, 59, 59), timezones=st.just(UTC)))
def test_observed_at_micros_round_trip_and_keep_order(at: datetime) -> None:
    assert from_micros(to_micros(at)) == at
    assert to_micros(at + timedelta(microseconds=1)) == to_micros(at) + 1


def test_plain_json_values_stay_plain_json() -> None:
    assert encode({"a": [1, 2.5, "x", None, True]}) == b'{"a":[1,2.5,"x",null,true]}'


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (datetime(2026, 1, 10, 12, tzinfo=UTC), b'{"$dt":"2026-01-10T12:00:00+00:00"}'),
        (date(2026, 1, 10), b'{"$date":"2026-01-10"}'),
        (timedelta(days=1, seconds=2, microseconds=3), b'{"$td":[1,2,3]}'),
        ({"$dt": 1}, b'{"$dict":{"$dt":1}}'),
        (float("nan"), b'{"$float":"nan"}'),
        (2**64, b'{"$int":"18446744073709551616"}'),
    ],
)
def test_tagged_representation(value: Any, text: bytes) -> None:
    assert encode(value) == text
    assert same(decode(text), value)


def test_a_utc_datetime_decodes_with_the_utc_timezone() -> None:
    restored = decode(encode(datetime(2026, 1, 10, tzinfo=UTC)))
    assert restored.tzinfo is UTC


def test_other_containers_round_trip() -> None:
    value = [
        {1, 2},
        frozenset({"a"}),
        Decimal("1.10"),
        b"\x00",
        time(1, 2, tzinfo=timezone(timedelta(hours=-5))),
    ]
    assert decode(encode(value)) == value
    assert [type(v) for v in decode(encode(value))] == [set, frozenset, Decimal, bytes, time]


def test_subclasses_are_kept_as_their_base_type() -> None:
    class Color(str, Enum):  # noqa: UP042 - str() of this mixin is "Color.RED", not "red"
        RED = "red"

    class Level(IntEnum):
        HIGH = 3

    assert same(decode(encode([Color.RED, Level.HIGH])), ["red", 3])


def test_keys_keep_their_type() -> None:
    assert encode_key(1) != encode_key("1")
    assert encode_key("u1") == '"u1"'
    assert encode_key(True) != encode_key(1)


def test_an_unsupported_type_is_named() -> None:
    class Point:
        pass

    with pytest.raises(UnencodableValue, match="'Point'") as raised:
        encode({"p": [Point()]})
    assert isinstance(raised.value, KairosError)
    assert isinstance(raised.value, TypeError)


def test_a_value_containing_itself_is_refused() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(UnencodableValue):
        encode(loop)


def test_a_naive_observed_at_is_refused() -> None:
    with pytest.raises(UnencodableValue, match="timezone"):
        to_micros(datetime(2026, 1, 10))


@pytest.mark.parametrize("data", [b"{not json", b'{"$nope":1}', b'{"$td":"x"}', b'{"$float":"1"}'])
def test_corrupt_bytes_raise_corrupt_value(data: bytes) -> None:
    with pytest.raises(CorruptValue):
        decode(data)
