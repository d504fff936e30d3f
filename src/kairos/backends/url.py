"""Storage URLs, read once: the scheme, the credentials, kairos' own `?options`; and every
secret in them hidden, in the URL itself and in a driver's message that quotes it.

Credentials follow libpq's reading of a URL: the user-info part ends at an `@` met before
any `/` (so `?` and `#` may be in a password). One rule more keeps an unencoded `@` or `/`
in a password hidden: several `@` before the first `/` end at the last of them, and an `@`
after a `/` that follows `user:password` (not `host:port`) ends the credentials too.

>>> redact("postgresql://app:s3cret@db:5432/bank?sslmode=require")
'postgresql://app:***@db:5432/bank?sslmode=require'
>>> parse("Postgres://app@db/bank").family
'postgresql'
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

# Query parameters (and conninfo keys) whose value is a secret.
_SECRET_WORD = r"[^=&;?/\s]*(?:password|passwd|secret|token)[^=&;?/\s]*"
_QUOTED = r"'(?:[^'\\]|\\.)*'"
_URL_SECRET = re.compile(rf"((?:^|[?&;]){_SECRET_WORD})=({_QUOTED}|[^&]*)", re.IGNORECASE)
_CONNINFO_SECRET = re.compile(rf"((?:^|\s){_SECRET_WORD}\s*=\s*)({_QUOTED}|\S*)", re.IGNORECASE)
_CONNINFO = re.compile(r"\s*[A-Za-z_]\w*\s*=")  # `host=db user=app ...`, libpq's other form
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# Schemes that name the same backend.
_FAMILIES = {"postgres": "postgresql", "rediss": "redis"}


@dataclass(frozen=True, slots=True)
class URL:
    """A storage URL split once: `scheme://rest` (`authority`) or `scheme:rest`.

    >>> url = parse("sqlite:///data/online.db?table=t")
    >>> url.scheme, url.rest, url.query
    ('sqlite', '/data/online.db?table=t', 'table=t')
    """

    text: str  # as written
    scheme: str  # lower-cased; "" when the text names none
    rest: str  # what follows `scheme://` (or `scheme:`)
    authority: bool  # written with `://`
    credentials_end: int  # index in `rest` of the `@` closing the user info; -1 if none

    @property
    def family(self) -> str:
        """The backend the scheme names: `postgres` and `postgresql` alike, `redis(s)`."""
        return _FAMILIES.get(self.scheme, self.scheme)

    @property
    def query(self) -> str:
        """What follows the first `?` after the credentials ("" when none)."""
        return self.rest.partition("?")[2] if self.credentials_end < 0 else self._after()[1]

    def _after(self) -> tuple[str, str]:
        head = self.rest[: self.credentials_end + 1]
        address, _, query = self.rest[self.credentials_end + 1 :].partition("?")
        return head + address, query

    def file_path(self) -> str:
        """What follows `scheme:///` as written ("" when the URL is not of that form):
        `sqlite:///data/a.db` names `data/a.db`, `sqlite:////srv/a.db` names `/srv/a.db`."""
        if not self.authority or not self.rest.startswith("/"):
            return ""
        return self.rest[1:]


def parse(url: str) -> URL:
    """Split `url` once; never raises (what a URL lacks shows as "" or -1)."""
    scheme, separator, rest = url.partition("://")
    if separator:
        return URL(url, scheme.lower(), rest, True, _credentials_end(rest))
    head, colon, tail = url.partition(":")
    if colon and _SCHEME.fullmatch(head):
        return URL(url, head.lower(), tail, False, -1)
    return URL(url, "", url, False, -1)


def _credentials_end(rest: str) -> int:
    slash = rest.find("/")
    if slash < 0:
        return rest.rfind("@")
    at = rest.rfind("@", 0, slash)
    if at >= 0:
        return at
    last = rest.rfind("@")
    user, colon, password = rest[:slash].partition(":")
    if last > slash and colon and "@" not in user and not password.isdigit():
        return last  # `user:pa/ss@host`: a password with an unencoded `/`
    return -1


def redact(url: str) -> str:
    """`url` (or a libpq `key=value` conninfo) with its secrets replaced by `***`: the
    password in the user info (all of the user info when it has no `:`, as a Redis URL
    may carry a password alone there; not for PostgreSQL, where libpq reads it as the user)
    and every `password`, `passwd`, `secret` or `token` option. A URL Python cannot split
    shows its scheme only.

    >>> redact("postgres://u:p@h/db?password=p2")
    'postgres://u:***@h/db?password=***'
    >>> redact("redis://s3cret@cache:6379/0")
    'redis://***@cache:6379/0'
    >>> redact("host=db password='a b' user=app")
    'host=db password=*** user=app'
    """
    if _is_conninfo(url):
        return _CONNINFO_SECRET.sub(r"\1***", url)
    if "://" in url:
        scheme, separator, rest = url.partition("://")
        try:
            urlsplit(url)
        except ValueError:  # e.g. an unclosed `[`: who knows where the password ends
            return f"{scheme}://***"
        at = _credentials_end(rest)
    else:  # no scheme: all of it may be an address with credentials
        scheme = separator = ""
        rest = url
        at = rest.rfind("@")
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        # libpq reads user info without `:` as a user name, other drivers may as a password
        alone = user if _FAMILIES.get(scheme.lower(), scheme.lower()) == "postgresql" else "***"
        head = f"{user}:***" if colon else alone
        tail = _URL_SECRET.sub(r"\1=***", rest[at + 1 :])
        return f"{scheme}{separator}{head}@{tail}"
    return scheme + separator + _URL_SECRET.sub(r"\1=***", rest)


def secrets(url: str) -> list[str]:
    """Every secret `redact` hides in `url`, as written, percent-decoded and percent-encoded
    (a driver may echo any of them), longest first.

    >>> secrets("postgresql://app:p%40ss@db/bank")
    ['p%2540ss', 'p%40ss', 'p@ss']
    """
    found: list[str] = []
    if _is_conninfo(url):
        values = [match.group(2) for match in _CONNINFO_SECRET.finditer(url)]
    else:
        rest = url.partition("://")[2] if "://" in url else url
        at = _credentials_end(rest) if "://" in url else rest.rfind("@")
        if at >= 0:
            _, colon, password = rest[:at].partition(":")
            if colon and password:
                found.append(password)
        values = [match.group(2) for match in _URL_SECRET.finditer(rest[at + 1 :])]
    for value in values:
        found.append(value)
        if len(value) >= 2 and value[0] == value[-1] == "'":
            found += [value[1:-1], re.sub(r"\\(.)", r"\1", value[1:-1])]
    found += [unquote(secret) for secret in found]
    found += [quote(secret, safe="") for secret in found]
    return sorted({secret for secret in found if secret}, key=lambda s: (-len(s), s))


def scrub(text: str, url: str) -> str:
    """`text` (a driver's message) with `url` redacted and each of its secrets, in any
    spelling, replaced by `***`.

    >>> scrub('bad "pw!" in postgres://u:pw!@h/db', "postgres://u:pw!@h/db")
    'bad "***" in postgres://u:***@h/db'
    """
    text = text.replace(url, redact(url))
    for secret in secrets(url):
        text = text.replace(secret, "***")
    return text


def _is_conninfo(text: str) -> bool:
    return "://" not in text and _CONNINFO.match(text) is not None


def take_options(url: str, names: Collection[str]) -> tuple[str, dict[str, str]]:
    """Split kairos' own `?name=value` options (percent-decoded; the last one wins) off a
    URL; the other options stay in the URL exactly as written, for the driver to read.

    >>> take_options("postgresql://h/db?pool_max=5&sslmode=require", {"pool_max"})
    ('postgresql://h/db?sslmode=require', {'pool_max': '5'})
    """
    parsed = parse(url)
    if not parsed.authority or "?" not in parsed.rest[parsed.credentials_end + 1 :]:
        return url, {}
    head, query = parsed._after()
    taken: dict[str, str] = {}
    kept: list[str] = []
    for item in query.split("&"):
        key, _, value = item.partition("=")
        if unquote(key) in names:
            taken[unquote(key)] = unquote(value)
        elif item:
            kept.append(item)
    scheme = url.partition("://")[0]
    remaining = f"{scheme}://{head}" + (f"?{'&'.join(kept)}" if kept else "")
    return remaining, taken


def option_names(url: str) -> list[str]:
    """The names of the `?options` a URL still carries, percent-decoded, in order."""
    names = [unquote(item.partition("=")[0]) for item in parse(url).query.split("&")]
    return [name for name in names if name]
