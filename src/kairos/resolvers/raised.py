"""A resolver's exception as its caller sees it: the type, the message and the line of the
user's own code that raised (`resolver 'profile' raised ValueError: bad row (features.py:42)`).
The whole traceback goes to the server log (logger `kairos.resolvers`, ERROR), never to the
caller: a result's errors and HTTP bodies carry no stack trace.

>>> resolver_failure("profile", error)  # doctest: +SKIP
"resolver 'profile' raised ValueError: bad row (features.py:42)"
"""

from __future__ import annotations

import functools
import logging
import sysconfig
from pathlib import Path

logger = logging.getLogger("kairos.resolvers")

_KAIROS = Path(__file__).resolve().parent.parent  # this package's own folder
_LIBRARIES = tuple(
    Path(folder).resolve()
    for folder in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)


@functools.lru_cache(maxsize=1024)
def _is_user_code(filename: str) -> bool:
    """Is `filename` the project's (not kairos', the standard library's or an installed
    package's, nor a frozen or generated module's)?"""
    if filename.startswith("<"):
        return False
    path = Path(filename).resolve()
    return not any(path.is_relative_to(folder) for folder in (_KAIROS, *_LIBRARIES))


def raised_at(error: BaseException) -> str | None:
    """`file.py:line` of the innermost frame of `error`'s traceback in the project's own code
    (the resolver's line, or a helper's it called), or None when none is (a database's error
    out of a SQL resolver, say)."""
    found = None
    frame = error.__traceback__
    while frame is not None:
        code = frame.tb_frame.f_code
        if _is_user_code(code.co_filename):
            found = (code.co_filename, frame.tb_lineno)
        frame = frame.tb_next
    return None if found is None else f"{Path(found[0]).name}:{found[1]}"


def resolver_failure(label: str, error: BaseException) -> str:
    """The message of the error each output of the failed call gets. The traceback is logged
    here, once per call of this: at ERROR when the user's code raised, at DEBUG when kairos
    or a library did (a SQL resolver's missing row, a database's error: the message says
    it all, and a routine miss is no server error). With no logging set up at all (a
    script, `kairos query`), it is DEBUG too: Python's last-resort handler would print the
    traceback on stderr beside the one-line error the caller already has."""
    where = raised_at(error)
    logger.log(
        logging.DEBUG if where is None or not logger.hasHandlers() else logging.ERROR,
        "resolver %r raised %s",
        label,
        type(error).__name__,
        exc_info=error,
    )
    message = f"resolver {label!r} raised {type(error).__name__}: {error}"
    return message if where is None else f"{message} ({where})"
