"""Driver errors raised as kairos' own, with the driver's error dropped as the cause (a
driver's message may quote the URL, password included)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def driver_failures_as(
    is_error: Callable[[BaseException], bool], make: Callable[[Exception], Exception]
) -> Iterator[None]:
    """Raise `make(error)` for an error of the driver `is_error` recognises; other errors pass
    unchanged."""
    try:
        yield
    except Exception as error:
        if not is_error(error):
            raise
        raise make(error) from None
