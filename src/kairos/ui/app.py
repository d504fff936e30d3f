"""The dashboard's web layer: pages rendered on the server from Jinja2 templates, no
JavaScript. Charts and the lineage graph are SVG drawn here, so the Content-Security-Policy
can forbid every script, inline style and outside origin (`default-src 'none'`): a value that
got past escaping still could not run.

Auth: with server keys, a login form puts the key in an HttpOnly, SameSite=Strict cookie
scoped to /ui (an `Authorization: Bearer` header works too); gateway pages need the gateway's
admin key, in a cookie of its own. Without keys the server only binds loopback (`kairos
serve` refuses otherwise) and pages need no login. Every form that changes something carries a
CSRF token that must equal the `kairos_csrf` cookie (double submit, worker-independent) and,
when the browser sends one, an Origin of this host.

    >>> ui = UI(client)  # doctest: +SKIP
    >>> Mount("/ui", routes=ui.routes())  # doctest: +SKIP
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kairos.client.client import Client
from kairos.errors import KairosError
from kairos.gateway import Gateway
from kairos.http.access import log_access
from kairos.ui.throttle import AuthThrottle, client_address
from kairos.ui.traffic import Traffic

Page = Callable[[Request], Awaitable[Response]]
logger = logging.getLogger(__name__)

CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # same-origin POSTs keep their Origin header
    "Cache-Control": "no-store",
}
KEY_COOKIE, ADMIN_COOKIE, CSRF_COOKIE = "kairos_key", "kairos_admin", "kairos_csrf"
NO_GATEWAY = "this server runs no gateway: its pages are on `kairos gateway serve`"
MAX_FORM = 64 * 1024  # bytes of a form body


class UIError(KairosError):
    """A page's input is wrong: shown on the page with `status`, naming the field and fix."""

    def __init__(self, message: str, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


@dataclass
class Nav:
    """One entry of the navigation bar."""

    title: str
    path: str


@dataclass
class UI:
    """The dashboard over a client (the project's pages) and/or a gateway (its own pages).

    `keys` are the server's bearer keys; `admin_key` the gateway's admin key; `traffic` what
    the server saw recently (the Live page); `streams` the consumers' names and stats;
    `throttle` counts failed sign-ins and keys (the server's API shares it)."""

    client: Client | None = None
    keys: Sequence[str] = ()
    gateway: Gateway | None = None
    admin_key: str = ""
    traffic: Traffic = field(default_factory=Traffic)
    streams: Callable[[], Sequence[tuple[str, Any]]] = lambda: []
    throttle: AuthThrottle = field(default_factory=AuthThrottle)
    prefix: str = "/ui"

    def __post_init__(self) -> None:
        self._keys = [k.encode() for k in self.keys if k]
        self.env = Environment(
            loader=PackageLoader("kairos.ui", "templates"),
            autoescape=select_autoescape(default=True, default_for_string=True),
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(ms=fmt_ms, num=fmt_num, usd=fmt_usd, when=fmt_when, age=fmt_age)
        self.env.globals["prefix"] = self.prefix
        self._css = resources.files("kairos.ui").joinpath("static/kairos.css").read_bytes()

    # --- what this dashboard shows -------------------------------------------------------

    @property
    def nav(self) -> list[Nav]:
        pages = []
        if self.client is not None:
            pages += [
                Nav("Features", "/features"),
                Nav("Decisions", "/decisions"),
                Nav("Models", "/models"),
                Nav("Live", "/live"),
            ]
        if self.gateway is not None:
            pages.append(Nav("Gateway", "/gateway"))
        return pages

    def routes(self) -> list[BaseRoute]:
        """Login, logout and the stylesheet (the pages are in `kairos.ui.dashboard`)."""
        logged = self.logged
        return [
            Route("/", logged(self.home), methods=["GET"]),
            Route("/login", logged(self.login_form), methods=["GET"]),
            Route("/login", logged(self.login), methods=["POST"]),
            Route("/logout", logged(self.logout), methods=["POST"]),
            Route("/static/kairos.css", logged(self.stylesheet), methods=["GET"]),
        ]

    def client_or_404(self) -> Client:
        if self.client is None:
            raise UIError("this server has no feature project: run `kairos serve`", status=404)
        return self.client

    def gateway_or_404(self) -> Gateway:
        if self.gateway is None:
            raise UIError(NO_GATEWAY, status=404)
        return self.gateway

    # --- auth ------------------------------------------------------------------------------

    def signed_in(self, request: Request) -> bool:
        """May this request see the project's pages? Without keys, a request for this
        machine (see `page`); with them, a cookie or a bearer header holding one."""
        if not self._keys:
            return True
        return any(
            hmac.compare_digest(given.encode(), key)
            for given in (request.cookies.get(KEY_COOKIE), _bearer(request))
            if given
            for key in self._keys
        )

    def admin(self, request: Request) -> bool:
        """May this request see the gateway's pages (the admin key)?"""
        if not self.admin_key:
            return False
        admin = self.admin_key.encode()
        return any(
            hmac.compare_digest(given.encode(), admin)
            for given in (request.cookies.get(ADMIN_COOKIE), _bearer(request))
            if given
        )

    def foreign(self, request: Request) -> Response | None:
        """Without keys the dashboard is this machine's: a request naming another host (a
        page of some site whose name was re-pointed at 127.0.0.1) is refused."""
        if self._keys or is_loopback(request.url.hostname or ""):
            return None
        return self.render(
            request, "error.html", status=403, title="Not this host",
            message="without server.keys the dashboard answers only requests for localhost; "
            "add server.keys to kairos.yaml to serve it under another name",
        )  # fmt: skip

    def locked_out(self, request: Request) -> Response | None:
        """A 429 page for a client with too many failed keys lately (`kairos.ui.throttle`),
        or None."""
        wait = self.throttle.retry_after(client_address(request))
        if not wait:
            return None
        response = self.render(
            request, "error.html", status=429, title="Too many tries",
            message=f"{self.throttle.most} wrong keys from this address within "
            f"{self.throttle.window:.0f} s; try again in {wait} s",
        )  # fmt: skip
        response.headers["Retry-After"] = str(wait)
        return response

    def page(self, handler: Page, *, admin: bool = False) -> Page:
        """Wrap a page: auth (a redirect to the login form; a wrong key counted against the
        client, a client with too many a 429), errors shown as a page with a 4xx status
        (never a stack trace), the security headers, the time it took (a header and the
        access line)."""

        async def wrapped(request: Request) -> Response:
            started = time.perf_counter()
            refused = None if admin else self.foreign(request)  # admin pages need their key
            if refused is None and (admin or self._keys):  # a key is asked for
                refused = self.locked_out(request)
            allowed = refused is None and (
                self.admin(request) if admin else self.signed_in(request)
            )
            if refused is None and not allowed and self._presented(request, admin):
                self.throttle.failed(client_address(request))
            if refused is not None:
                response = refused
            elif admin and self.gateway is None:
                response = self.render(
                    request, "error.html", status=404, title="Gateway",
                    message=NO_GATEWAY,
                )  # fmt: skip
            elif not allowed:
                if admin and not self.admin_key:
                    response = self.render(
                        request, "error.html", status=403, title="Gateway",
                        message="the gateway has no admin key: set gateway.admin_key_env in "
                        "kairos.yaml and restart, then sign in with it",
                    )  # fmt: skip
                else:
                    response = RedirectResponse(
                        f"{self.prefix}/login?next={_return_to(request)}&admin={int(admin)}", 303
                    )
            else:
                try:
                    response = await handler(request)
                except UIError as error:
                    response = self.render(
                        request, "error.html", status=error.status, title="Error",
                        message=str(error), field=error.field,
                    )  # fmt: skip
                except KairosError as error:
                    response = self.render(
                        request, "error.html", status=400, title="Error", message=str(error),
                        field=getattr(error, "field", None),
                    )  # fmt: skip
                except Exception as error:  # never a stack trace to the browser: to the log
                    logger.exception("dashboard page %s failed", request.url.path)
                    response = self.render(
                        request, "error.html", status=500, title="Error",
                        message=f"internal error ({type(error).__name__})",
                    )  # fmt: skip
            seconds = time.perf_counter() - started
            response.headers["Server-Timing"] = f"page;dur={seconds * 1e3:.1f}"
            log_access(request.method, request.scope["path"], response.status_code, seconds)
            return response

        return wrapped

    def _presented(self, request: Request, admin: bool) -> bool:
        """Whether a request carries the key a page checks (its cookie or a bearer header),
        where there is one to check: refused, it is a failed authentication; a request with
        none is no guess."""
        if admin and not (self.admin_key and self.gateway is not None):
            return False
        cookie = request.cookies.get(ADMIN_COOKIE if admin else KEY_COOKIE)
        return bool(cookie or _bearer(request))

    def logged(self, handler: Page) -> Page:
        """Wrap a route that answers without signing in (the form, the stylesheet): its
        access line."""

        async def wrapped(request: Request) -> Response:
            started = time.perf_counter()
            response = await handler(request)
            log_access(
                request.method, request.scope["path"], response.status_code,
                time.perf_counter() - started,
            )  # fmt: skip
            return response

        return wrapped

    def render(
        self, request: Request, template: str, *, status: int = 200, **context: Any
    ) -> Response:
        """A page from `template` with the navigation, the CSRF token and the headers."""
        token = request.cookies.get(CSRF_COOKIE) or ""
        fresh = not _good_token(token)
        if fresh:
            token = secrets.token_urlsafe(32)
        context.setdefault("field", None)
        html = self.env.get_template(template).render(
            nav=self.nav,
            here=request.url.path.removeprefix(self.prefix),
            csrf=token,
            signed_in=bool(self._keys) and self.signed_in(request),
            admin_in=self.admin(request),
            **context,
        )
        response = HTMLResponse(html, status_code=status, headers=HEADERS)
        if fresh:
            self._cookie(response, request, CSRF_COOKIE, token)
        return response

    async def form(self, request: Request) -> dict[str, str]:
        """A POSTed form's fields (one value each), refused without a matching CSRF token or
        from another origin."""
        body = await _body(request)
        fields = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
            raise UIError("form posted from another site; use this dashboard's page", status=403)
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if not (_good_token(cookie) and hmac.compare_digest(fields.get("csrf", ""), cookie)):
            raise UIError(
                "the form's CSRF token is missing or stale; reload the page and submit again",
                "csrf",
                403,
            )
        return fields

    def _cookie(self, response: Response, request: Request, name: str, value: str) -> None:
        response.set_cookie(
            name, value, path=self.prefix, httponly=True, samesite="strict",
            secure=request.url.scheme == "https", max_age=12 * 3600,
        )  # fmt: skip

    # --- the routes of this module ----------------------------------------------------------

    async def home(self, request: Request) -> Response:
        first = self.nav[0].path if self.nav else "/login"
        return RedirectResponse(self.prefix + first, 303)

    async def login_form(self, request: Request) -> Response:
        admin = request.query_params.get("admin") == "1"
        return self.render(
            request, "login.html", title="Sign in", next=_next(request.query_params.get("next")),
            admin=admin, error=None,
        )  # fmt: skip

    async def login(self, request: Request) -> Response:
        locked = self.locked_out(request)  # before the key is read, let alone checked
        if locked is not None:
            return locked
        try:
            fields = await self.form(request)
        except UIError as error:
            return self.render(request, "error.html", status=error.status, title="Sign in",
                               message=str(error), field=error.field)  # fmt: skip
        key = fields.get("key", "").strip()
        target = _next(fields.get("next"))
        if not (key.isascii() and key.isprintable()):  # what a cookie (and a header) can hold
            name = ""
        elif self.admin_key and key and hmac.compare_digest(key.encode(), self.admin_key.encode()):
            name = ADMIN_COOKIE
        elif self._keys and key and any(hmac.compare_digest(key.encode(), k) for k in self._keys):
            name = KEY_COOKIE
        else:
            name = ""
        if not name:
            if key:  # a key that is none of ours; an empty form is no guess
                self.throttle.failed(client_address(request))
            return self.render(
                request, "login.html", status=401, title="Sign in", next=target,
                admin=fields.get("admin") == "1", error="that key is not one of this server's",
            )  # fmt: skip
        response = RedirectResponse(self.prefix + target, 303)
        self._cookie(response, request, name, key)
        return response

    async def logout(self, request: Request) -> Response:
        try:
            await self.form(request)
        except UIError as error:
            return self.render(request, "error.html", status=error.status, title="Sign out",
                               message=str(error), field=error.field)  # fmt: skip
        response = RedirectResponse(f"{self.prefix}/login", 303)
        for name in (KEY_COOKIE, ADMIN_COOKIE):
            response.delete_cookie(name, path=self.prefix, httponly=True, samesite="strict")
        return response

    async def stylesheet(self, request: Request) -> Response:
        return Response(
            self._css,
            media_type="text/css",
            headers={**HEADERS, "Cache-Control": "public, max-age=3600"},
        )


def is_loopback(host: str) -> bool:
    """
    >>> is_loopback("localhost"), is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("a.b")
    (True, True, True, False)
    """
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _bearer(request: Request) -> str:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _return_to(request: Request) -> str:
    """The page a sign-in returns to, as the `next` parameter's value: the page's path and
    its whole query (each `&` kept inside the value); a form's POST returns to the dashboard's
    first page, since its URL is no page to GET."""
    if request.method not in ("GET", "HEAD"):
        return "/"
    query = f"?{request.url.query}" if request.url.query else ""
    return quote(request.url.path + query, safe="/?=")


async def _body(request: Request) -> bytes:
    """A form's body, refused (413) once past `MAX_FORM` bytes, before more is read: sign-in
    and sign-out read it without a key."""
    too_large = UIError(f"form over {MAX_FORM} bytes", status=413)
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > MAX_FORM:  # not "²"
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise too_large
    return bytes(body)


def _next(target: str | None) -> str:
    """Where to go after signing in: a path inside the dashboard, never another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    path = target.removeprefix("/ui")
    return path if path.startswith("/") else "/"


def _good_token(token: str) -> bool:
    return 32 <= len(token) <= 64 and token.replace("-", "").replace("_", "").isalnum()


# --- filters the templates format numbers and times with --------------------------------


def fmt_ms(value: Any) -> str:
    """
    >>> fmt_ms(0.0123), fmt_ms(12.3), fmt_ms(1234.5)
    ('0.012 ms', '12.3 ms', '1.23 s')
    """
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "–"
    if value >= 1000:
        return f"{value / 1000:.2f} s"
    if value >= 10:
        return f"{value:.1f} ms"
    if value >= 1:
        return f"{value:.2f} ms"
    return f"{value:.3f} ms"


def fmt_num(value: Any, digits: int = 3) -> str:
    """
    >>> fmt_num(3), fmt_num(0.123456), fmt_num(None), fmt_num(1234567)
    ('3', '0.123', '–', '1,234,567')
    """
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.{digits}f}" if abs(value) < 1e15 else f"{value:.{digits}e}"
    return str(value)


def fmt_usd(value: Any) -> str:
    """
    >>> fmt_usd(0.000123), fmt_usd(12.5), fmt_usd(None)
    ('$0.000123', '$12.50', '–')
    """
    if not isinstance(value, int | float):
        return "–"
    return f"${value:,.2f}" if abs(value) >= 1 else f"${value:.6f}".rstrip("0").rstrip(".")


def fmt_when(value: Any) -> str:
    """
    >>> fmt_when(datetime(2026, 6, 1, 12, 0, 5, 123456, tzinfo=UTC))
    '2026-06-01 12:00:05.123 UTC'
    """
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return str(value)
    if not isinstance(value, datetime):
        return "–"
    moment = value.astimezone(UTC) if value.tzinfo is not None else value
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d} UTC"


def fmt_age(seconds: Any) -> str:
    """
    >>> fmt_age(0.5), fmt_age(75), fmt_age(7200), fmt_age(None)
    ('0.5 s', '1m 15s', '2h 0m', '–')
    """
    if isinstance(seconds, timedelta):
        seconds = seconds.total_seconds()
    if not isinstance(seconds, int | float) or not math.isfinite(seconds):
        return "–"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m {int(seconds % 60)}s"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h {int(seconds % 3600 // 60)}m"
    return f"{int(seconds // 86400)}d {int(seconds % 86400 // 3600)}h"
