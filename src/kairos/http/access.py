"""The access log: one line per answered request on the `kairos.access` logger, written by
the route wrappers of `kairos serve` (its routes and the dashboard's) and of the gateway's app.

A line holds the method, the path (never the query string, a header or a body: they can carry
keys), the status, the time taken and the query id when the answer has one. As text:
`POST /v1/query/online 200 3.1 ms query_id=q_1`; the JSON formatter writes the same as the
fields method, path, status, duration_ms and query_id.

>>> log_access("POST", "/v1/query/online", 200, 0.0031, "q_1")  # doctest: +SKIP
"""

from __future__ import annotations

import logging

ACCESS = logging.getLogger("kairos.access")
_INFO = logging.INFO


def log_access(
    method: str, path: str, status: int, seconds: float, query_id: str | None = None
) -> None:
    """One access line; nothing is built when the access log is off."""
    if not ACCESS.isEnabledFor(_INFO):
        return
    ms = round(seconds * 1e3, 3)
    fields = {
        "method": method,
        "path": path,
        "status": status,
        "duration_ms": ms,
        "query_id": query_id,
    }
    if query_id is None:
        ACCESS.info("%s %s %d %.2f ms", method, path, status, ms, extra=fields)
    else:
        ACCESS.info(
            "%s %s %d %.2f ms query_id=%s", method, path, status, ms, query_id, extra=fields
        )
