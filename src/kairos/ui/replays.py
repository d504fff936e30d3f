"""The Replay page: logged decisions re-run with another model version (or alias) or with
features recomputed, and what changed: per feature how many decisions and by how much, and the
changed rows (logged vs replayed). Also how the Decisions pages write a logged value, parse an
entity key and offer the registry's versions, since a replay's form takes the same.

    >>> Mount("/ui", routes=routes(UI(client)))  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from kairos.client.client import Client
from kairos.client.replay import ReplayResult, ReplayRow
from kairos.errors import InvalidInput, KairosError
from kairos.project.decisions import entity_keys, typed_time
from kairos.resolvers.model import model_features
from kairos.ui.app import UI, UIError

MAX_REPLAY = 1000  # decisions one replay from the page takes at most
DEFAULT_REPLAY = 100
ROWS_SHOWN = 500  # changed rows a result page lists at most
SHORT = 80  # characters of a value in a table cell
_PIN = re.compile(r"([^@\s,]+)@(v?[0-9]{1,9}|[A-Za-z_][A-Za-z0-9_.-]{0,63})")


def routes(ui: UI) -> list[BaseRoute]:
    pages = ReplayPages(ui)
    return [
        Route("/replay", ui.page(pages.form), methods=["GET"]),
        Route("/replay", ui.page(pages.run), methods=["POST"]),
    ]


# --- values as shown ---------------------------------------------------------------------


def value_text(value: Any, limit: int | None = None) -> str:
    """A logged value as the pages write it: text as is, numbers exactly (a float's shortest
    round-trip form), lists and rows as JSON (has-many rows one per line); cut at `limit`.

    >>> value_text(0.1), value_text(None), value_text(True), value_text(3), value_text("a<b")
    ('0.1', 'null', 'true', '3', 'a<b')
    >>> value_text([{"id": "t1"}, {"id": "t2"}])
    '[{"id":"t1"},\\n {"id":"t2"}]'
    >>> value_text("x" * 10, limit=4)
    'xxxx…'
    """
    if isinstance(value, str):
        text = value
    elif value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int | float):
        text = repr(value)
    elif isinstance(value, datetime):
        text = value.isoformat()
    elif (
        isinstance(value, list | tuple)
        and len(value) > 1
        and all(isinstance(v, dict) for v in value)
    ):
        text = "[" + ",\n ".join(_json(row) for row in value) + "]"
    else:
        text = _json(value)
    return text if limit is None or len(text) <= limit else text[:limit] + "…"


def _json(value: Any) -> str:
    options = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY
    try:
        return orjson.dumps(value, default=repr, option=options).decode("utf-8")
    except (TypeError, orjson.JSONEncodeError):
        return repr(value)


def number(value: Any) -> bool:
    """
    >>> number(1.5), number(True), number("1")
    (True, False, False)
    """
    return isinstance(value, int | float) and not isinstance(value, bool)


def delta_text(logged: Any, replayed: Any) -> str:
    """`replayed - logged` for two numbers, else empty.

    >>> delta_text(0.25, 0.5), delta_text("a", "b")
    ('+0.25', '')
    """
    if not (number(logged) and number(replayed)):
        return ""
    delta = float(replayed) - float(logged)
    return f"{delta:+.6g}" if math.isfinite(delta) else str(delta)


# --- what the forms take -----------------------------------------------------------------


def entity_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """Entity keys as typed (`FEATURE:KEY`, blank ones skipped) by feature.

    >>> entity_pairs(["user.id:u1", " "])
    {'user.id': 'u1'}
    """
    try:
        return entity_keys(pair.strip() for pair in pairs if pair.strip())
    except InvalidInput as error:
        raise UIError(str(error), error.field) from None


def when_text(text: str | None) -> str | None:
    """A since/until field: blank is None; an offset whose "+" became a space is repaired.

    >>> when_text(" "), when_text("2026-06-01T12:00:00 00:00"), when_text("1h")
    (None, '2026-06-01T12:00:00+00:00', '1h')
    """
    if text is None or not text.strip():
        return None
    return typed_time(text.strip())


def limit_of(text: str | None, default: int, most: int) -> int:
    """
    >>> limit_of("", 50, 500), limit_of("20", 50, 500)
    (50, 20)
    """
    if text is None or not text.strip():
        return default
    text = text.strip()
    if not (text.isascii() and text.isdigit() and len(text) <= 9 and 1 <= int(text) <= most):
        raise UIError(f"limit {text!r} must be a whole number 1..{most}", "limit")
    return int(text)


def pins_of(text: str | None) -> dict[str, int | str]:
    """Model pins as typed: `risk@v2` (a version) or `risk@prod` (an alias), comma-separated.

    >>> pins_of("risk@v2, fraud@prod")
    {'risk': 2, 'fraud': 'prod'}
    """
    pins: dict[str, int | str] = {}
    for part in (text or "").replace(",", " ").split():
        found = _PIN.fullmatch(part)
        if found is None:
            raise UIError(
                f"model {part!r}: give a version or an alias, e.g. risk@v2 or risk@prod",
                "models",
            )
        name, pin = found.groups()
        if name in pins:
            raise UIError(f"model {name!r} is pinned twice; give it once", "models")
        digits = pin.removeprefix("v")
        pins[name] = int(digits) if digits.isdigit() else pin
    return pins


def features_of(text: str | None) -> list[str]:
    """
    >>> features_of("user.risk, user.score")
    ['user.risk', 'user.score']
    """
    return list(dict.fromkeys((text or "").replace(",", " ").split()))


@dataclass(frozen=True, slots=True)
class Choice:
    value: str  # what the form sends: risk@v2, risk@prod
    text: str  # as listed: "risk@v2 (prod)"


def model_choices(client: Client) -> list[Choice]:
    """The registry's versions and aliases of every model a `kr.predict` feature calls
    (what a replay can pin), newest first; none when the registry cannot be read."""
    choices = []
    for name in sorted({options.model for _, options, _ in model_features(client.graph)}):
        try:
            versions = client.models.versions(name)
            aliases = client.models.aliases(name)
        except KairosError:  # not registered yet: nothing to pin
            continue
        for version in sorted(versions, key=lambda v: -v.version):
            named = [a for a, v in aliases.items() if v == version.version]
            extra = f" ({', '.join(sorted(named))})" if named else ""
            choices.append(Choice(version.label, version.label + extra))
        choices += [Choice(f"{name}@{a}", f"{name}@{a} (alias)") for a in sorted(aliases)]
    return choices


# --- the page ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FeatureChange:
    name: str
    rows: int
    changed: int
    errors: int
    mean_logged: float | None
    mean_replayed: float | None
    mean_abs_delta: float | None
    max_abs_delta: float | None


@dataclass(frozen=True, slots=True)
class ChangedRow:
    query_id: str
    now: datetime
    feature: str
    logged: str
    replayed: str
    delta: str
    error: str | None


@dataclass(frozen=True, slots=True)
class Outcome:
    """A replay as the page shows it."""

    summary: dict[str, Any]
    features: tuple[FeatureChange, ...]
    rows: tuple[ChangedRow, ...]
    changed_rows: int  # every changed row (more than shown when over ROWS_SHOWN)
    llm: tuple[tuple[str, str, dict[str, Any]], ...]  # (feature, logged|replayed, stats)


def outcome(result: ReplayResult, shown: int = ROWS_SHOWN) -> Outcome:
    """What changed, feature by feature, and the first `shown` changed rows."""
    summary = result.summary()
    features = tuple(
        FeatureChange(
            name, f["rows"], f["changed"], f["errors"], f.get("mean_logged"),
            f.get("mean_replayed"), f.get("mean_abs_delta"), f.get("max_abs_delta"),
        )
        for name, f in sorted(summary["features"].items(), key=_most_changed)
    )  # fmt: skip
    changed = [row for row in result.rows if row.changed]
    llm = tuple(
        (name, when, both[when]) for name, both in summary["llm"].items()
        for when in ("logged", "replayed")
    )  # fmt: skip
    return Outcome(
        summary, features, tuple(_changed(r) for r in changed[:shown]), len(changed), llm
    )


def _most_changed(item: tuple[str, dict[str, Any]]) -> tuple[int, str]:
    return -item[1]["changed"], item[0]


def _changed(row: ReplayRow) -> ChangedRow:
    return ChangedRow(
        row.query_id, row.now, row.feature, value_text(row.logged, SHORT),
        value_text(row.replayed, SHORT), delta_text(row.logged, row.replayed), row.error,
    )  # fmt: skip


class ReplayPages:
    def __init__(self, ui: UI) -> None:
        self.ui = ui

    async def form(self, request: Request) -> Response:
        client = self.ui.client_or_404()
        params = request.query_params
        fields = {name: params.get(name, "") for name in _FIELDS}
        fields["since"] = fields["since"] or "1h"
        return await self._page(request, client, fields)

    async def run(self, request: Request) -> Response:
        client = self.ui.client_or_404()
        posted = await self.ui.form(request)
        fields = {name: posted.get(name, "").strip() for name in _FIELDS}
        try:
            result = await _replay(client, fields)
        except (UIError, InvalidInput) as error:
            status = error.status if isinstance(error, UIError) else 400
            return await self._page(
                request, client, fields, error=str(error), field=error.field, status=status
            )
        return await self._page(request, client, fields, result=outcome(result))

    async def _page(
        self,
        request: Request,
        client: Client,
        fields: Mapping[str, str],
        *,
        result: Outcome | None = None,
        error: str | None = None,
        field: str | None = None,
        status: int = 200,
    ) -> Response:
        choices = await asyncio.to_thread(model_choices, client)
        return self.ui.render(
            request, "replay.html", status=status, title="Replay", fields=fields,
            choices=choices, result=result, error=error, field=field,
            most=MAX_REPLAY, shown=ROWS_SHOWN,
        )  # fmt: skip


_FIELDS = ("query_id", "since", "until", "entity", "limit", "models", "recompute")


async def _replay(client: Client, fields: Mapping[str, str]) -> ReplayResult:
    """Run the replay the form names: one decision (`query_id`) or a time range."""
    pins = pins_of(fields.get("models"))
    recompute = features_of(fields.get("recompute"))
    if not pins and not recompute:
        raise UIError(
            "say what to change: pick a model version, or name features to recompute",
            "models",
        )
    query_id = fields.get("query_id") or ""
    if query_id:
        return await client.replay_async([query_id], models=pins, recompute=recompute)
    since = when_text(fields.get("since"))
    if since is None:
        raise UIError("say which decisions: a since time or a duration back, e.g. 1h", "since")
    return await client.replay_async(
        since=since,
        until=when_text(fields.get("until")),
        entity=entity_pairs([fields.get("entity") or ""]) or None,
        limit=limit_of(fields.get("limit"), DEFAULT_REPLAY, MAX_REPLAY),
        models=pins,
        recompute=recompute,
    )
