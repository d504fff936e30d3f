"""Failed authentications per client, so a key cannot be guessed at the speed of the server:
after `most` failures within `window` seconds a client's next tries are refused (429 with
`Retry-After`) until its oldest failure is older than the window. The API's bearer keys and
the dashboard's sign-in share one table.

A failure is a request refused for its credential that carried one (a bearer header, a key
cookie, the sign-in form's key); a request carrying none is not a guess and a request let in
is never counted, so a client that authenticates is never slowed. A client that is locked out
is refused before its key is checked: a lock that still answered right guesses would not
slow guessing at all.

At most `clients` addresses are remembered, the least recently failing forgotten first, so
the table's memory is bounded however many addresses send. The count is per process (each of
`kairos serve --workers N` keeps its own) and per address as the server sees it (behind a
proxy, run uvicorn with `--proxy-headers` so that is the caller's).

    >>> throttle = AuthThrottle(most=2, window=60.0, clock=lambda: 0.0)
    >>> throttle.failed("10.0.0.1"); throttle.failed("10.0.0.1")
    >>> throttle.retry_after("10.0.0.1"), throttle.retry_after("10.0.0.2")
    (60, 0)
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from starlette.requests import Request

MOST_FAILURES = 10  # failed authentications a client may make within WINDOW
WINDOW = 60.0  # seconds
MOST_CLIENTS = 10_000  # addresses remembered at once


class AuthThrottle:
    """Recent failed authentications of each client address (see the module)."""

    def __init__(
        self,
        most: int = MOST_FAILURES,
        window: float = WINDOW,
        clients: int = MOST_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.most = most
        self.window = window
        self.clients = clients
        self.clock = clock  # seconds, monotonic (a test moves it)
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, client: str) -> int:
        """Whole seconds until `client` may try a key again; 0 when it may now."""
        failures = self._failures.get(client)
        if failures is None or len(failures) < self.most:
            return 0
        wait = failures[0] + self.window - self.clock()
        if wait <= 0:
            return 0
        return max(1, math.ceil(wait))

    def failed(self, client: str) -> None:
        """Count one failed authentication of `client`."""
        failures = self._failures.pop(client, None)
        if failures is None:
            failures = deque(maxlen=self.most)  # only the last `most` can lock it out
        failures.append(self.clock())
        self._failures[client] = failures  # the most recent failure last
        while len(self._failures) > self.clients:
            self._failures.popitem(last=False)

    def __len__(self) -> int:
        return len(self._failures)


def client_address(request: Request) -> str:
    """The address a request came from, as the throttle counts it."""
    return request.client.host if request.client is not None else "unknown"
