"""How `kairos serve` and `kairos gateway serve` log: kairos.yaml's `logging:` section applied
to the standard library's loggers. One handler writes to stderr (stdout is the command's own
output), as text or as one JSON object a line (python-json-logger's orjson formatter); uvicorn's
loggers go through the same handler at the same level.

>>> configure_logging(LoggingConfig(level="info", format="json"))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.orjson import OrjsonFormatter

from kairos.project.config import LoggingConfig

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
UVICORN = ("uvicorn", "uvicorn.error", "uvicorn.asgi")
# a line per HTTP call at INFO: the replica supervisor's polls would flood the log
QUIET = {"httpx": "warning", "httpcore": "warning"}


class ServerHandler(logging.StreamHandler[TextIO]):
    """The handler `configure_logging` installs (and replaces when it is called again)."""


def formatter(form: str) -> logging.Formatter:
    """Text lines, or JSON objects with time, level, logger, message and a record's extra
    fields (an access line's method, path, status, duration_ms, query_id)."""
    if form == "json":
        return OrjsonFormatter(
            "{asctime}{levelname}{name}{message}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            reserved_attrs=[*RESERVED_ATTRS, "color_message"],  # uvicorn's terminal copy
        )
    return logging.Formatter(TEXT)


def configure_logging(config: LoggingConfig, stream: TextIO | None = None) -> None:
    """Send every logger's records at `config.level` and above to `stream` (stderr)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, ServerHandler)]:
        root.removeHandler(old)
        old.close()
    handler = ServerHandler(stream or sys.stderr)
    handler.setFormatter(formatter(config.format))
    root.addHandler(handler)
    root.setLevel(config.level.upper())
    for name in UVICORN:  # uvicorn's own handlers (if it set any) would skip the format
        uvicorn = logging.getLogger(name)
        uvicorn.handlers.clear()
        uvicorn.propagate = True
        uvicorn.setLevel(logging.NOTSET)
    uvicorn_access = logging.getLogger("uvicorn.access")  # kairos.access writes those lines
    uvicorn_access.handlers.clear()
    uvicorn_access.propagate = False
    access = logging.getLogger("kairos.access")
    access.disabled = not config.access
    access.setLevel(logging.INFO)  # access lines show at any level while `access` is on
    for name, level in {**QUIET, **config.levels}.items():
        logging.getLogger(name).setLevel(level.upper())
