"""What `kairos serve` refuses before any route runs: requests a browser can be made to send
for another site. A page anywhere can make a browser POST a `text/plain` body, a form or
nothing to 127.0.0.1 without asking first (a "simple" request), and DNS rebinding points
another site's name at 127.0.0.1 so that its scripts read what comes back. So, composed once
around the route table (`Middleware(RequestGuard, ...)`):

- a `/v1` request with a body (any method but GET, HEAD, OPTIONS) declares the route's type,
  JSON unless the route takes another (an artifact's bytes, an Arrow stream): anything else,
  or no type (a bodiless POST too), is a 415. With keys or without: one contract.
- without `server.keys` (the server is this machine's, and nothing a browser sends by itself
  proves who sent it), on every route: a Host other than loopback (127.0.0.1, localhost,
  [::1]) or `server.host` is a 403, and so is an Origin of another site or
  `Sec-Fetch-Site: cross-site`, except a link followed (a top-level GET navigation: its answer
  is shown to the user, never to the page that linked).

With keys, a request needs `Authorization: Bearer`, which no page of another site can make a
browser send; the dashboard's cookie is SameSite=Strict and its forms carry a CSRF token.

    >>> Middleware(RequestGuard, routes=routes, local=True, hosts=("127.0.0.1",))  # doctest: +SKIP
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kairos.http.access import log_access
from kairos.server.bodies import HTTPProblem, problem_response
from kairos.ui.app import is_loopback

JSON = "application/json"
SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})  # bind addresses, never a Host
_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


class RequestGuard:
    """ASGI middleware refusing what the module describes; `bodies` maps a route's path
    template to the content types its body may have (JSON when it is not there), `local`
    says the server has no keys, `hosts` are the names it answers besides loopback."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        routes: Sequence[BaseRoute],
        bodies: Mapping[str, tuple[str, ...]] | None = None,
        local: bool,
        hosts: Collection[str] = (),
    ) -> None:
        self.app = app
        self.routes = [r for r in routes if isinstance(r, Route) and r.path.startswith("/v1/")]
        self.bodies = dict(bodies or {})
        self.local = local
        self.hosts = {h.strip("[]").lower() for h in hosts if h not in WILDCARDS}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        problem = self.refusal(scope)
        if problem is None:
            await self.app(scope, receive, send)
            return
        await problem_response(problem)(scope, receive, send)
        log_access(scope["method"], scope["path"], problem.status, time.perf_counter() - started)

    def refusal(self, scope: Scope) -> HTTPProblem | None:
        """Why this request is refused, or None."""
        headers = Headers(scope=scope)
        if self.local:
            problem = self.foreign(scope, headers)
            if problem is not None:
                return problem
        if scope["method"] in SAFE:
            return None
        allowed = self.body_types(scope)
        if allowed is None:  # no route takes it: the router's 404 or 405
            return None
        given = headers.get("content-type", "").partition(";")[0].strip().lower()
        if given in allowed:
            return None
        said = f"Content-Type {given!r}" if given else "no Content-Type"
        return HTTPProblem(
            415, "unsupported_media_type",
            f"this route reads {' or '.join(allowed)}, and the request has {said}; send the "
            f"body with `Content-Type: {allowed[0]}`",
            "Content-Type",
        )  # fmt: skip

    def foreign(self, scope: Scope, headers: Headers) -> HTTPProblem | None:
        """Without keys: a request for another host, or sent by a page of another site."""
        host = headers.get("host", "")
        if not self.ours(host):
            return HTTPProblem(
                403, "forbidden_host",
                f"Host {host!r} is not this machine: without server.keys kairos answers only "
                f"requests for {', '.join(self.names())}; add server.keys to kairos.yaml to "
                "serve it under another name",
                "Host",
            )  # fmt: skip
        origin = headers.get("origin")
        if origin is not None and not same_origin(origin, host, scope.get("scheme", "http")):
            return HTTPProblem(
                403, "cross_origin",
                f"a page of {origin!r} may not call this server: without server.keys it "
                "answers only its own pages and clients that send no Origin (curl, kairos' "
                "client); add server.keys to serve other sites",
                "Origin",
            )  # fmt: skip
        navigation = (  # a link followed: its answer is shown to the user, not to the page
            scope["method"] in ("GET", "HEAD")
            and headers.get("sec-fetch-mode") == "navigate"
            and headers.get("sec-fetch-dest") == "document"
        )
        if headers.get("sec-fetch-site") == "cross-site" and not navigation:
            return HTTPProblem(
                403, "cross_origin",
                "a page of another site may not call this server (Sec-Fetch-Site: "
                "cross-site); add server.keys to serve other sites",
                "Sec-Fetch-Site",
            )  # fmt: skip
        return None

    def ours(self, host: str) -> bool:
        """Whether a Host header names this machine (loopback, or `server.host`)."""
        name = _hostname(host)
        return name is not None and (is_loopback(name) or name in self.hosts)

    def names(self) -> list[str]:
        return ["127.0.0.1", "localhost", "[::1]", *sorted(self.hosts - {"127.0.0.1", "::1"})]

    def body_types(self, scope: Scope) -> tuple[str, ...] | None:
        """The content types the /v1 route this request reaches reads, or None for none."""
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return self.bodies.get(route.path, (JSON,))
        return None


def same_origin(origin: str, host: str, scheme: str) -> bool:
    """Whether an Origin header names the site a request was sent to (its Host).

    >>> same_origin("http://127.0.0.1:8000", "127.0.0.1:8000", "http")
    True
    >>> same_origin("http://localhost", "localhost:80", "http"), same_origin("null", "a", "http")
    (True, False)
    """
    try:
        parts, asked = urlsplit(origin), urlsplit(f"//{host}")
        ours = (asked.hostname, asked.port or _PORTS.get(scheme))
        theirs = (parts.hostname, parts.port or _PORTS.get(parts.scheme))
    except ValueError:  # a port that is no number
        return False
    return parts.scheme in _PORTS and theirs[0] is not None and theirs == ours


def _hostname(host: str) -> str | None:
    """The name in a Host header (`[::1]:8000` -> `::1`), or None for a malformed one."""
    try:
        parts = urlsplit(f"//{host}")
        parts.port  # noqa: B018 - raises on a port that is no number
    except ValueError:
        return None
    if parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    return parts.hostname or None
