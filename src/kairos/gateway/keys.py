"""Gateway keys: what a key may do, how it is made and how a presented key is checked.

A key reads `kgw-<id>-<secret>`. The id is public (it names the key in lists, the ledger and
counters); only HMAC-SHA256(pepper, secret) is stored, and a presented secret is compared
with `hmac.compare_digest`. The full key is returned once, by `new_key`, and never again.

>>> plain, record = new_key("pepper", name="billing", models=("chat",))
>>> record.matches("pepper", plain)
True
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
import reprlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from kairos.gateway.bounds import MAX_MODEL_NAME, cut, shown
from kairos.gateway.errors import InvalidKeySpec

PERIODS = ("minute", "day", "month", "total")
_KEY = re.compile(r"kgw-([0-9a-f]{12})-([A-Za-z0-9_\-]{43})")
# the registry stores rpm and tpm in PostgreSQL `integer` columns
MAX_PER_MINUTE = 2**31 - 1
# budgets in micro-dollars or tokens: a counter adds a hold to at most twice this, which stays
# exact in Redis' Lua (doubles, 2**53) and far from SQLite's and PostgreSQL's 64 bits
MAX_AMOUNT = 10**15
MAX_USD = MAX_AMOUNT // 1_000_000
MOST_KEY_MODELS = 256  # model groups in one key's allow-list


@dataclass(frozen=True, slots=True)
class Budget:
    """A limit per period: USD in micro-dollars and/or tokens (input plus output)."""

    period: str  # day | month | total
    usd_micros: int | None = None
    tokens: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"period": self.period, "usd_micros": self.usd_micros, "tokens": self.tokens}


@dataclass(frozen=True, slots=True)
class KeyRecord:
    """A key as stored: everything but the secret, which is only a peppered hash."""

    id: str
    name: str
    secret_hash: str = field(repr=False)
    created_at: datetime
    models: tuple[str, ...] = ("*",)  # model groups it may dispatch to; "*" = all
    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens per minute (input bound plus max_tokens while held)
    budgets: tuple[Budget, ...] = ()
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    @property
    def caps_output(self) -> bool:
        """Whether its calls' output counts against a limit (a budget or tpm): each call is
        then sent upstream with an explicit output cap, what the hold covers."""
        return bool(self.budgets) or self.tpm is not None

    def allows(self, group: str) -> bool:
        return "*" in self.models or group in self.models

    def matches(self, pepper: str, presented: str) -> bool:
        parsed = _KEY.fullmatch(presented)
        secret = parsed.group(2) if parsed and parsed.group(1) == self.id else ""
        return hmac.compare_digest(hash_secret(pepper, secret), self.secret_hash)

    def active(self, now: datetime) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def public(self) -> dict[str, Any]:
        """What the admin API and CLI show: never the hash."""
        return {
            "id": self.id,
            "name": self.name,
            "created_at": self.created_at.isoformat(),
            "models": list(self.models),
            "rpm": self.rpm,
            "tpm": self.tpm,
            "budgets": [b.as_dict() for b in self.budgets],
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }


def hash_secret(pepper: str, secret: str) -> str:
    return hmac.new(pepper.encode(), secret.encode(), hashlib.sha256).hexdigest()


def key_id(presented: str) -> str | None:
    """The public id inside a presented key, or None when it is not shaped like one."""
    parsed = _KEY.fullmatch(presented)
    return parsed.group(1) if parsed else None


def new_key(
    pepper: str,
    *,
    name: str,
    models: Sequence[str] = ("*",),
    rpm: int | None = None,
    tpm: int | None = None,
    budgets: Sequence[Budget] = (),
    expires_at: datetime | None = None,
    now: datetime | None = None,
) -> tuple[str, KeyRecord]:
    """A fresh key: (the full key, to show once; the record to store)."""
    ident = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    record = KeyRecord(
        id=ident,
        name=name,
        secret_hash=hash_secret(pepper, secret),
        created_at=now or datetime.now(UTC),
        models=tuple(models) or ("*",),
        rpm=rpm,
        tpm=tpm,
        budgets=tuple(budgets),
        expires_at=expires_at,
    )
    return f"kgw-{ident}-{secret}", record


def revoked(record: KeyRecord, at: datetime) -> KeyRecord:
    return replace(record, revoked_at=at)


def key_spec(body: Mapping[str, Any]) -> dict[str, Any]:
    """Check an admin request (or CLI arguments) that creates a key; keyword args of new_key.
    Every error is an InvalidKeySpec (422) naming the field and its valid range.

    >>> key_spec({"name": "ops", "rpm": 60})["rpm"]
    60
    """
    unknown = set(body) - {"name", "models", "rpm", "tpm", "budgets", "expires_at"}
    if unknown:
        first = sorted(unknown)[0]
        raise InvalidKeySpec(
            f"unknown field {shown(first)}; use name, models, rpm, tpm, budgets, expires_at",
            param=cut(first),
        )
    name = body.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise InvalidKeySpec('name is a label of 1-200 characters, e.g. "billing"', param="name")
    models = body.get("models", ["*"])
    if (
        not isinstance(models, list) or not 1 <= len(models) <= MOST_KEY_MODELS
        or not all(isinstance(m, str) and 1 <= len(m) <= MAX_MODEL_NAME for m in models)
    ):  # fmt: skip
        raise InvalidKeySpec(
            f"models is a list of 1 to {MOST_KEY_MODELS} model groups, names of 1 to "
            f'{MAX_MODEL_NAME} characters, e.g. ["chat"] (["*"] for all)',
            param="models",
        )
    spec: dict[str, Any] = {"name": name.strip(), "models": tuple(models)}
    for limit in ("rpm", "tpm"):
        value = body.get(limit)
        if value is not None:
            _integer(value, limit, 1, MAX_PER_MINUTE, "per minute")
        spec[limit] = value
    budgets = body.get("budgets", [])
    if not isinstance(budgets, list):
        raise InvalidKeySpec(
            'budgets is a list, e.g. [{"period": "day", "usd": 5}]', param="budgets"
        )
    spec["budgets"] = tuple(_budget(b, f"budgets[{i}]") for i, b in enumerate(budgets))
    _distinct(spec["budgets"])
    expires = body.get("expires_at")
    if expires is not None:
        try:
            parsed = datetime.fromisoformat(expires) if isinstance(expires, str) else None
            # in UTC, as it is stored: past year 9999 (or before year 1) there, it could not
            # be read back
            if parsed is not None:
                parsed = (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).astimezone(UTC)
        except (ValueError, OverflowError):
            parsed = None
        if parsed is None:
            raise InvalidKeySpec(
                "expires_at is an ISO 8601 time from year 1 to 9999 in UTC, e.g. "
                '"2027-01-01T00:00:00Z"',
                param="expires_at",
            )
        spec["expires_at"] = parsed
    return spec


def _integer(value: Any, where: str, low: int, high: int, unit: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidKeySpec(
            f"{where} must be an integer from {low} to {high} ({unit}), got {reprlib.repr(value)}",
            param=where,
        )
    return value


def _distinct(budgets: Sequence[Budget]) -> None:
    """Refuse two budgets of one period and unit: they would share one counter."""
    seen: dict[tuple[str, str], int] = {}
    for index, budget in enumerate(budgets):
        for unit, amount in (("usd", budget.usd_micros), ("tokens", budget.tokens)):
            if amount is None:
                continue
            first = seen.setdefault((budget.period, unit), index)
            if first != index:
                raise InvalidKeySpec(
                    f"budgets[{index}] repeats the {budget.period} {unit} budget of "
                    f"budgets[{first}]; give one budget per period and unit (keep the lowest)",
                    param=f"budgets[{index}]",
                )


def _budget(raw: Any, where: str) -> Budget:
    fix = 'a budget is {"period": "day"|"month"|"total", "usd": 5.0, "tokens": 100000}'
    if not isinstance(raw, Mapping) or set(raw) - {"period", "usd", "usd_micros", "tokens"}:
        raise InvalidKeySpec(f"{where}: {fix}", param=where)
    period = raw.get("period")
    if period not in ("day", "month", "total"):
        raise InvalidKeySpec(f"{where}.period must be day, month or total", param=f"{where}.period")
    usd = raw.get("usd_micros")
    if usd is not None:
        _integer(usd, f"{where}.usd_micros", 0, MAX_AMOUNT, "micro-dollars")
    elif raw.get("usd") is not None:
        value = raw["usd"]
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
            or not 0 <= value <= MAX_USD
        ):
            raise InvalidKeySpec(
                f"{where}.usd must be a number of dollars from 0 to {MAX_USD}, "
                f"got {reprlib.repr(value)}",
                param=f"{where}.usd",
            )
        usd = round(value * 1_000_000)
    tokens = raw.get("tokens")
    if tokens is not None:
        _integer(tokens, f"{where}.tokens", 0, MAX_AMOUNT, "tokens")
    if usd is None and tokens is None:
        raise InvalidKeySpec(f"{where}: give usd and/or tokens; {fix}", param=where)
    return Budget(period, usd, tokens)
