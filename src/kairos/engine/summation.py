"""`fsum`: `math.fsum` of a float64 array, the same correctly rounded value, vectorized.

Both ways below find the exact sum as a few doubles (or integers) without rounding, then
round once, as fsum does:

- Extraction (Rump, Ogita and Oishi's AccSum): with sigma a power of two at least
  2**M * max|x| (2**M > values + 1), q = (sigma + x) - sigma keeps the top bits of every x
  exactly, x - q is the exact rest, and the q of a chunk sum exactly in any order (they are
  multiples of ulp(sigma) / 2 below sigma). Each round takes 53 - M bits; values whose bits
  span two or three rounds (money amounts, measurements) need only those.
- One round and a bound (tried first): the q of each chunk sum exactly; the rests, small
  after one round, are summed by numpy with a rigorous error bound B (any order of m
  additions errs by at most (m - 1) u sum|rest|). When the exact sum's interval
  [S - B, S + B] rounds to one double at both ends, that double is fsum's (rounding is
  monotone): the usual case, at a third of the cost of three exact rounds.
- Per exponent (for what extraction cannot do in three rounds): each mantissa split in two
  halves, the halves of all values with the same exponent summed exactly by `np.bincount`,
  those few sums added as Python integers and divided once (CPython rounds that correctly).

>>> fsum(np.array([0.1] * 100)) == math.fsum([0.1] * 100)
True

Short arrays, NaN or inf, sums near overflow or of exactly zero (whose sign fsum decides)
are handed to `math.fsum` itself.
"""

from __future__ import annotations

import math

import numpy as np

_SHORT = 64  # below this, math.fsum over a list is as fast
_MOST = 2**26  # more values and a per-exponent float64 sum may round
_CHUNK = 16384  # values per round trip through the cache
_M = math.ceil(math.log2(_CHUNK + 2))  # bits of headroom each chunk's sum of q needs
_ROUNDS = 3
_HIGHEST_EXPONENT = 990  # a sum of < 2**26 values below 2**990 stays finite
_LOWEST_SIGMA = 2.0**-900  # extraction needs normal numbers: smaller, per exponent instead
_SPLIT = 1.5 * 2.0**26  # adding and taking it away rounds |m| < 1 to a multiple of 2**-26
_OFFSET = 1100  # frexp's exponents of doubles lie in -1073..1024
_BINS = 2 * _OFFSET


def fsum(values: np.ndarray) -> float:
    """The correctly rounded sum of a 1-d float64 array (what `math.fsum` returns)."""
    count = len(values)
    if count < _SHORT or count >= _MOST:
        return math.fsum(values.tolist())
    largest = max(float(values.max()), -float(values.min()))  # NaN if there is one
    if not math.isfinite(largest) or largest == 0.0:
        return math.fsum(values.tolist())
    top = math.frexp(largest)[1]
    if top > _HIGHEST_EXPONENT:
        return math.fsum(values.tolist())
    sigma = 2.0 ** (top + _M)
    total = _bounded(values, sigma)
    if total is None:
        parts = _extracted(values, sigma)
        total = math.fsum(parts) if parts is not None else _per_exponent(values)
    return total if total != 0.0 else math.fsum(values.tolist())


def _split(
    chunk: np.ndarray, sigma: float, high: np.ndarray, rest: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each value as q + left exactly: q its part above ulp(sigma), in `high`'s and `rest`'s
    first len(chunk) slots (no allocation per chunk)."""
    q, left = high[: len(chunk)], rest[: len(chunk)]
    np.add(chunk, sigma, out=q)
    q -= sigma
    np.subtract(chunk, q, out=left)
    return q, left


def _bounded(values: np.ndarray, sigma: float) -> float | None:
    """fsum's value from one extraction round and the rests' numpy sums with an error
    bound, or None when the bound leaves two candidate doubles."""
    if sigma * 2.0**-52 < _LOWEST_SIGMA:
        return None  # rests near the subnormals: the bound below assumes normal numbers
    parts: list[float] = []
    bound = 0.0
    high = np.empty(_CHUNK)
    rest = np.empty(_CHUNK)
    for begin in range(0, len(values), _CHUNK):
        chunk = values[begin : begin + _CHUNK]
        q, left = _split(chunk, sigma, high, rest)
        parts.append(float(q.sum()))  # exact: see the module's docstring
        parts.append(float(left.sum()))  # within `bound` of the rests' exact sum
        # |rest| <= ulp(sigma) / 2 = sigma u each; m additions in any order err by at most
        # (m - 1) u / (1 - (m - 1) u) sum|rest|, which 2 m u sum|rest| covers (m u << 1).
        bound += 2.0 * len(chunk) * 2.0**-53 * (len(chunk) * sigma * 2.0**-53)
    low = math.fsum([*parts, -bound])
    return low if low == math.fsum([*parts, bound]) else None


def _extracted(values: np.ndarray, sigma: float) -> list[float] | None:
    """Doubles whose exact sum is the values' exact sum, or None past _ROUNDS rounds."""
    parts: list[float] = []
    high = np.empty(_CHUNK)
    rest = np.empty(_CHUNK)
    for begin in range(0, len(values), _CHUNK):
        chunk = values[begin : begin + _CHUNK]
        q, left = _split(chunk, sigma, high, rest)
        scale = sigma
        for _round in range(_ROUNDS):
            parts.append(float(q.sum()))  # exact: see the module's docstring
            if not left.any():
                break
            scale *= 2.0 ** (_M - 52)  # |left| <= ulp(scale): the next sigma
            if scale < _LOWEST_SIGMA:
                return None
            np.add(left, scale, out=q)
            q -= scale
            left -= q
        else:
            return None
    return parts


def _per_exponent(values: np.ndarray) -> float:
    highs = np.zeros(_BINS)
    lows = np.zeros(_BINS)
    for begin in range(0, len(values), _CHUNK):
        mantissas, exponents = np.frexp(values[begin : begin + _CHUNK])
        high = mantissas + _SPLIT  # the high half, a multiple of 2**-26, exactly
        high -= _SPLIT
        mantissas -= high  # the low half, a multiple of 2**-53 below 2**-26, exactly
        exponents += _OFFSET
        highs += np.bincount(exponents, weights=high, minlength=_BINS)
        lows += np.bincount(exponents, weights=mantissas, minlength=_BINS)
    used = np.flatnonzero((highs != 0) | (lows != 0))
    if len(used) == 0:
        return 0.0
    base = int(used[0])
    total = 0
    high_sums, low_sums = (highs[used] * 2.0**53).tolist(), (lows[used] * 2.0**53).tolist()
    for at, high_sum, low_sum in zip(used.tolist(), high_sums, low_sums, strict=True):
        total += (int(high_sum) + int(low_sum)) << (at - base)  # integers: scaled by 2**53
    scale = base - _OFFSET - 53
    if scale >= 0:
        return float(total << scale)
    return total / (1 << -scale)  # int / int: correctly rounded, subnormals included
