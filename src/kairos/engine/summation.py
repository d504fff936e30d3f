"""`fsum`: `math.fsum` of a float64 array, the same correctly rounded value, vectorized.

Each finite double is a mantissa m (|m| < 1, 53 bits) times 2**e. Split m into a high half
(a multiple of 2**-26) and a low half (of 2**-53, below 2**-26); the halves of all values
with the same e are summed by `np.bincount` in float64, exactly (every partial sum keeps
fewer than 53 significant bits while there are fewer than 2**26 values). The few
per-exponent sums are then added as Python integers and divided once, which CPython rounds
correctly: the exact sum, rounded once, as fsum's.

>>> fsum(np.array([0.1] * 10)) == math.fsum([0.1] * 10) == 1.0
True

Arrays where that argument does not hold (NaN or inf, exponents near overflow, 2**26
values or more, a sum of exactly zero whose sign fsum decides) and short ones are handed to
`math.fsum` itself.
"""

from __future__ import annotations

import math

import numpy as np

_SHORT = 64  # below this, math.fsum over a list is as fast
_MOST = 2**26  # more values and a bin's float64 sum of 27-bit halves may round
_HIGHEST_EXPONENT = 990  # a sum of < 2**26 values below 2**990 stays finite
_SPLIT = 1.5 * 2.0**26
_OFFSET = 1100  # frexp's exponents of doubles lie in -1073..1024
_BINS = 2 * _OFFSET
_CHUNK = 8192


def fsum(values: np.ndarray) -> float:
    """The correctly rounded sum of a 1-d float64 array (what `math.fsum` returns)."""
    count = len(values)
    if count < _SHORT or count >= _MOST:
        return math.fsum(values.tolist())
    with np.errstate(over="ignore", invalid="ignore"):
        rough = float(np.sum(values))
    if not math.isfinite(rough):
        return math.fsum(values.tolist())  # NaN, inf or a sum past the largest double
    highs = np.zeros(_BINS)
    lows = np.zeros(_BINS)
    for begin in range(0, count, _CHUNK):  # chunks that stay in cache: no page faults
        mantissas, exponents = np.frexp(values[begin : begin + _CHUNK])
        # |mantissa| < 1 rounded to a multiple of 2**-26 by adding and taking away
        # 1.5 * 2**26 (whose ulp that is): the high half, exactly; the rest is the low half.
        high = mantissas + _SPLIT
        high -= _SPLIT
        mantissas -= high
        exponents += _OFFSET
        highs += np.bincount(exponents, weights=high, minlength=_BINS)
        lows += np.bincount(exponents, weights=mantissas, minlength=_BINS)
    used = np.flatnonzero((highs != 0) | (lows != 0))
    if len(used) == 0 or int(used[-1]) - _OFFSET > _HIGHEST_EXPONENT:
        return math.fsum(values.tolist())
    base = int(used[0])
    total = 0
    high_sums, low_sums = (highs[used] * 2.0**53).tolist(), (lows[used] * 2.0**53).tolist()
    for at, high_sum, low_sum in zip(
        used.tolist(), high_sums, low_sums, strict=True
    ):  # integers: the sums scaled by a power of 2
        total += (int(high_sum) + int(low_sum)) << (at - base)
    if total == 0:
        return math.fsum(values.tolist())  # 0.0 or -0.0: fsum decides the sign
    scale = base - _OFFSET - 53
    if scale >= 0:
        return float(total << scale)
    return total / (1 << -scale)  # int / int: correctly rounded, subnormals included
