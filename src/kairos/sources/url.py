"""Source URLs: fill in `${VAR}`s, hide passwords, read kairos' own `?option=` values.

Passwords follow libpq's reading of a URL: the user-info part ends at the first `@` met
before any `/`, and a `password=` query option is a password too.

>>> redact("postgresql://app:s3cret@db:5432/bank?sslmode=require")
'postgresql://app:***@db:5432/bank?sslmode=require'
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from pathlib import Path
from urllib.parse import unquote

from kairos.errors import KairosError, did_you_mean

_REFERENCE = re.compile(r"\$\{([^}]*)\}")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PASSWORD_OPTION = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
_TRUE = {"true": True, "1": True, "yes": True, "on": True}
_FALSE = {"false": False, "0": False, "no": False, "off": False}


def interpolate(text: str, environ: Mapping[str, str], *, source: str) -> str:
    """Replace every `${NAME}` in `text` by the environment variable NAME.

    >>> interpolate("postgresql://app:${PGPASS}@db/bank", {"PGPASS": "pw"}, source="bank")
    'postgresql://app:pw@db/bank'
    """

    def value(match: re.Match[str]) -> str:
        variable = match.group(1)
        if not _VARIABLE_NAME.fullmatch(variable):
            raise KairosError(
                f"source {source!r}: {match.group(0)!r} is not a variable reference; "
                "write ${NAME} with NAME made of letters, digits and underscores"
            )
        found = environ.get(variable)
        if found is None:
            # Name the variable only: the config text around it may hold other secrets.
            raise KairosError(
                f"source {source!r}: environment variable {variable!r} is not set; "
                f"export {variable}=... before starting kairos"
            )
        return found

    return _REFERENCE.sub(value, text)


def _userinfo_end(rest: str) -> int:
    """Index of the `@` closing the user-info part of what follows `scheme://`, or -1."""
    for index, char in enumerate(rest):
        if char == "@":
            return index
        if char == "/":
            return -1
    return -1


def redact(url: str) -> str:
    """The URL with its password (user-info or `password=` option) replaced by `***`.

    >>> redact("postgres://u:p@h/db?password=p2")
    'postgres://u:***@h/db?password=***'
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        return _PASSWORD_OPTION.sub(r"\1***", url)
    at = _userinfo_end(rest)
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        if colon:
            rest = f"{user}:***{rest[at:]}"
    rest = _PASSWORD_OPTION.sub(r"\1***", rest)
    return f"{scheme}://{rest}"


def _passwords(url: str) -> list[str]:
    found: list[str] = []
    rest = url.partition("://")[2]
    at = _userinfo_end(rest)
    if at >= 0:
        _, colon, password = rest[:at].partition(":")
        if colon and password:
            found.append(password)
    for match in re.finditer(r"[?&]password=([^&#]*)", url, re.IGNORECASE):
        if match.group(1):
            found.append(match.group(1))
    # A driver may echo either spelling, so hide the percent-decoded form too.
    found += [unquote(password) for password in found]
    return sorted(set(found), key=len, reverse=True)


def scrub(text: str, url: str) -> str:
    """`text` (a driver's message) with the URL redacted and its passwords replaced by `***`.

    >>> scrub('bad "pw!" in postgres://u:pw!@h/db', "postgres://u:pw!@h/db")
    'bad "***" in postgres://u:***@h/db'
    """
    text = text.replace(url, redact(url))
    for password in _passwords(url):
        text = text.replace(password, "***")
    return text


def take_options(url: str, names: Collection[str]) -> tuple[str, dict[str, str]]:
    """Split kairos' own `?name=value` options (percent-decoded) off a URL; the other
    options stay in the URL exactly as written, for the driver to read.

    >>> take_options("postgresql://h/db?pool_max=5&sslmode=require", {"pool_max"})
    ('postgresql://h/db?sslmode=require', {'pool_max': '5'})
    """
    scheme, separator, rest = url.partition("://")
    start = _userinfo_end(rest) + 1  # a password may contain '?'
    question = rest.find("?", start)
    if not separator or question < 0:
        return url, {}
    head, query = rest[:question], rest[question + 1 :]
    taken: dict[str, str] = {}
    kept: list[str] = []
    for item in query.split("&"):
        key, _, value = item.partition("=")
        if unquote(key) in names:
            taken[unquote(key)] = unquote(value)
        elif item:
            kept.append(item)
    remaining = f"{scheme}://{head}" + (f"?{'&'.join(kept)}" if kept else "")
    return remaining, taken


def reject_other_options(url: str, known: Collection[str], *, source: str) -> None:
    """Raise KairosError when `url` still carries a `?option` after kairos took its own."""
    rest = url.partition("://")[2]
    query = rest.partition("?")[2]
    for item in query.split("&"):
        key = unquote(item.partition("=")[0])
        if key:
            supported = ", ".join(sorted(known)) or "none"
            raise KairosError(
                f"source {source!r}: unknown option {key!r} in {redact(url)!r}"
                f"{did_you_mean(key, known)} (supported: {supported})"
            )


def positive_int(options: Mapping[str, str], key: str, default: int, *, source: str) -> int:
    """Option `key` as an integer >= 1."""
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise KairosError(f"source {source!r}: option {key}={raw!r} must be a whole number >= 1")
    return value


def positive_float(options: Mapping[str, str], key: str, default: float, *, source: str) -> float:
    """Option `key` as a number of seconds > 0."""
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise KairosError(f"source {source!r}: option {key}={raw!r} must be seconds > 0")
    return value


def flag(options: Mapping[str, str], key: str, default: bool, *, source: str) -> bool:
    """Option `key` as a boolean (true/false, 1/0, yes/no, on/off)."""
    raw = options.get(key)
    if raw is None:
        return default
    found = {**_TRUE, **_FALSE}.get(raw.lower())
    if found is None:
        raise KairosError(f"source {source!r}: option {key}={raw!r} must be true or false")
    return found


def file_location(url: str, base_dir: Path, *, source: str) -> str:
    """The file a `scheme:///relative` or `scheme:////absolute` URL names (options already
    taken off); relative paths are read from `base_dir`. `:memory:` passes through.

    >>> file_location("sqlite:///data/bank.db", Path("/srv/app"), source="bank")
    '/srv/app/data/bank.db'
    """
    scheme, _, rest = url.partition("://")
    rest = rest.partition("?")[0]
    if not rest.startswith("/") or rest == "/":
        raise KairosError(
            f"source {source!r}: {redact(url)!r} names no file; write "
            f"{scheme}:///relative/path (from the project folder) or {scheme}:////absolute/path"
        )
    path = unquote(rest[1:])
    if path == ":memory:":
        return path
    return str(base_dir.absolute() / path)
