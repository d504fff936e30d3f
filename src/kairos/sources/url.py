"""Source configs: fill in `${VAR}`s and read kairos' own `?option=` values (the URL itself
is parsed, and its secrets hidden, by kairos.backends.url).

>>> interpolate("postgresql://app:${PGPASS}@db/bank", {"PGPASS": "pw"}, source="bank")
'postgresql://app:pw@db/bank'
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from pathlib import Path
from urllib.parse import unquote

from kairos.backends.url import option_names, parse, redact
from kairos.errors import KairosError, did_you_mean

_REFERENCE = re.compile(r"\$\{([^}]*)\}")
_VARIABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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


def reject_other_options(url: str, known: Collection[str], *, source: str) -> None:
    """Raise KairosError when `url` still carries a `?option` after kairos took its own."""
    for key in option_names(url):
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
    parsed = parse(url)
    scheme = url.partition("://")[0]
    rest = parsed.rest.partition("?")[0] if parsed.authority else ""
    if not rest.startswith("/") or rest == "/":
        raise KairosError(
            f"source {source!r}: {redact(url)!r} names no file; write "
            f"{scheme}:///relative/path (from the project folder) or {scheme}:////absolute/path"
        )
    path = unquote(rest[1:])
    if path == ":memory:":
        return path
    return str(base_dir.absolute() / path)
