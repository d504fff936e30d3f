"""`summation.fsum` returns math.fsum's value, to the bit and the sign, over arrays of every
kind of double: wide exponent ranges, cancellation, subnormals, zeros of both signs, NaN, inf."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kairos.engine import summation
from kairos.engine.summation import fsum

EDGES = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1e-310, 0.1, 1.0, 2.0**53,
         -(2.0**53), 1e16, -1e16, 1e300, -1e300, 1.7976931348623157e308]  # fmt: skip
doubles = st.one_of(st.sampled_from(EDGES), st.floats(allow_nan=False, allow_infinity=False))


def _same(got: float, want: float) -> bool:
    if math.isnan(want):
        return math.isnan(got)
    return got == want and math.copysign(1.0, got) == math.copysign(1.0, want)


@settings(max_examples=300, deadline=None)
@given(st.lists(doubles, min_size=0, max_size=400), st.integers(1, 40))
def test_fsum_is_math_fsum_to_the_bit(values: list[float], repeat: int) -> None:
    array = np.array(values * repeat, dtype=np.float64)  # repeats: long arrays, many chunks
    try:
        want = math.fsum(array.tolist())
    except OverflowError:
        return  # math.fsum itself refuses: the vectorized path hands such arrays to it
    assert _same(fsum(array), want)


def test_fsum_of_cancelling_and_tiny_values_and_of_many_chunks() -> None:
    rng = np.random.default_rng(7)
    big = rng.standard_normal(50_000) * 1e16
    cases = [
        np.concatenate([big, -big, [1e-300, 5e-324]]),  # everything cancels but the tiny
        rng.standard_normal(100_000) * 10.0 ** rng.integers(-300, 300, 100_000),
        np.round(rng.lognormal(3, 1, 100_000), 2),
        np.full(70_000, 0.1),
        np.array([-0.0] * 100),
    ]
    for array in cases:
        assert _same(fsum(array), math.fsum(array.tolist()))
    assert fsum(np.full(70_000, 0.1)) != float(np.sum(np.full(70_000, 0.1)))  # can fail


def test_nan_and_inf_follow_math_fsum() -> None:
    assert math.isnan(fsum(np.array([1.0] * 100 + [math.nan])))
    assert fsum(np.array([1.0] * 100 + [math.inf])) == math.inf
    overflowing = [1e308] * 100 + [-1e308] * 100
    with pytest.raises(OverflowError):
        math.fsum(overflowing)
    with pytest.raises(OverflowError):  # the same error as math.fsum: the rows engine's
        fsum(np.array(overflowing))


def test_both_ways_are_exercised_and_agree_with_math_fsum() -> None:
    rng = np.random.default_rng(11)
    money = np.round(rng.lognormal(3, 1, 40_000), 2)  # bits span two or three rounds
    wide = rng.standard_normal(40_000) * 10.0 ** rng.integers(-300, 300, 40_000)

    def sigma(values: np.ndarray) -> float:
        return 2.0 ** (math.frexp(float(np.abs(values).max()))[1] + summation._M)

    parts = summation._extracted(money, sigma(money))
    assert parts is not None and math.fsum(parts) == math.fsum(money.tolist())
    assert summation._extracted(wide, sigma(wide)) is None  # too wide: per exponent
    assert summation._per_exponent(wide) == math.fsum(wide.tolist()) == fsum(wide)
    assert summation._per_exponent(money) == math.fsum(money.tolist()) == fsum(money)


def test_one_round_with_a_bound_answers_or_declines_near_a_tie() -> None:
    rng = np.random.default_rng(13)
    money = np.round(rng.lognormal(3, 1, 100_000), 2)
    sigma = 2.0 ** (math.frexp(float(money.max()))[1] + summation._M)
    assert summation._bounded(money, sigma) == math.fsum(money.tolist())
    # 1 + 2**-53 lies exactly between two doubles: any error bound straddles the tie, so the
    # bounded way declines and the exact rounds decide (round half to even: 1.0)
    tie = np.array([1.0, 2.0**-53] + [0.0] * 100)
    assert summation._bounded(tie, 2.0 ** (1 + summation._M)) is None
    assert _same(fsum(tie), math.fsum(tie.tolist())) and fsum(tie) == 1.0
