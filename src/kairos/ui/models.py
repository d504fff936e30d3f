"""The Models pages: every registered model with its versions and aliases; a model's page
shows each version (framework, format, size, sha256, schema, metadata, latency and calls) and
every alias move with who made it, with forms that move an alias or roll it back.

Latency and call counts come from the decision log: the newest `WINDOW` decisions (each
model step's time in their traces, each model call in their records), read at most every
`STATS_TTL` seconds, so a page costs one bounded read however large the log is. The page says
which decisions the numbers cover."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from kairos.client.client import Client
from kairos.models.errors import UnknownModel
from kairos.models.registry import AliasChange, ModelVersion
from kairos.resolvers.model import model_features
from kairos.stores.query_log.records import LoggedQuery
from kairos.ui.app import KEY_COOKIE, UI, UIError
from kairos.ui.charts import Bars, bars
from kairos.ui.traffic import percentile

WINDOW = 500  # the newest decisions latency and calls are read from (~60 ms of decoding)
STATS_TTL = 5.0  # seconds a read of them serves the pages
HISTORY_SHOWN = 100  # alias moves listed on a model's page, newest first
MODELS_SHOWN = 1000  # models the Models page lists, by name (each is a registry read)
VERSIONS_SHOWN = 1000  # versions a model's page lists (and offers an alias), newest first


@dataclass(slots=True)
class VersionStats:
    """What one version (`risk@v2`) did in the window: the decisions that called it, the rows
    it scored, and its model steps' times (ms)."""

    decisions: int = 0
    predictions: int = 0
    times: list[float] = field(default_factory=list)

    @property
    def p50(self) -> float:
        return percentile(sorted(self.times), 50)

    @property
    def p99(self) -> float:
        return percentile(sorted(self.times), 99)


@dataclass(frozen=True, slots=True)
class Window:
    """The decisions the numbers cover: how many, logged from `first` to `last`."""

    decisions: int
    first: datetime | None
    last: datetime | None
    versions: dict[str, VersionStats]

    def of(self, label: str) -> VersionStats:
        return self.versions.get(label) or VersionStats()


def window_stats(records: Sequence[LoggedQuery]) -> Window:
    """Calls and latency per model version over decision records (newest first or not).

    A model step's time is its trace line (`model:<name>:<feature>`), attributed to the
    version the record's model call for that feature names; the rows of one bulk query share
    one trace, so each step counts once.

    >>> window_stats([]).decisions
    0
    """
    versions: dict[str, VersionStats] = {}
    seen: set[tuple[Any, ...]] = set()
    for record in records:
        by_feature: dict[str, str] = {}
        for call in record.model_calls:
            label, feature = call.get("version"), call.get("feature")
            if not isinstance(label, str) or not isinstance(feature, str):
                continue
            stats = versions.setdefault(label, VersionStats())
            stats.predictions += 1
            if feature not in by_feature:
                stats.decisions += 1
                by_feature[feature] = label
        if not by_feature:
            continue
        for step in record.trace:
            if step.get("kind") != "model":
                continue
            step_label = str(step.get("label", ""))  # model:<name>:<feature>
            found = by_feature.get(step_label.split(":", 2)[-1])
            duration = step.get("duration_ms")
            if found is None or not isinstance(duration, int | float):
                continue
            once = (record.logged_at, step_label, step.get("start_ms"), duration)
            if once not in seen:
                seen.add(once)
                versions[found].times.append(float(duration))
    times = [r.logged_at for r in records]
    return Window(len(records), min(times, default=None), max(times, default=None), versions)


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One line of the Models page."""

    name: str
    latest: ModelVersion
    versions: int
    aliases: dict[str, int]
    decisions: int
    predictions: int
    p50: float
    p99: float
    last_change: AliasChange | None


@dataclass(frozen=True, slots=True)
class VersionView:
    """One version as its model's page shows it."""

    record: ModelVersion
    stats: VersionStats
    size: str
    metadata: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Uses:
    """A `kr.predict` feature of the project that runs the model."""

    feature: str
    type: str
    pin: str  # alias=prod | version=2 | newest
    inputs: tuple[tuple[str, str], ...]  # (feature, its type) in the model's input order


def routes(ui: UI) -> list[BaseRoute]:
    pages = ModelPages(ui)
    return [
        Route("/models", ui.page(pages.index), methods=["GET"]),
        Route("/models/{name}", ui.page(pages.model), methods=["GET"]),
        Route("/models/{name}/alias", ui.page(pages.move), methods=["POST"]),
        Route("/models/{name}/rollback", ui.page(pages.rollback), methods=["POST"]),
    ]


class ModelPages:
    def __init__(self, ui: UI) -> None:
        self.ui = ui
        self._window: tuple[float, Window] | None = None
        self._reading = asyncio.Lock()

    async def window(self, client: Client) -> Window:
        """The stats of the newest `WINDOW` decisions, read again once `STATS_TTL` old."""
        async with self._reading:
            if self._window is None or time.monotonic() - self._window[0] > STATS_TTL:
                records = await asyncio.to_thread(
                    functools.partial(client.log.recent, WINDOW, nested=False)
                )
                self._window = (time.monotonic(), window_stats(records))
            return self._window[1]

    async def index(self, request: Request) -> Response:
        client = self.ui.client_or_404()
        window = await self.window(client)
        rows, total = await asyncio.to_thread(_model_rows, client, window)
        return self.ui.render(
            request, "models.html", title="Models", rows=rows, total=total, window=window,
            limit=WINDOW,
        )  # fmt: skip

    async def model(self, request: Request) -> Response:
        client = self.ui.client_or_404()
        name = request.path_params["name"]
        window = await self.window(client)
        versions, history = await asyncio.to_thread(_read_model, client, name)
        aliases = {alias: v.version for v in versions for alias in v.aliases}
        done = request.query_params.get("moved")
        views = [
            VersionView(
                v, window.of(v.label), size_text(v.size),
                tuple((str(k), metadata_text(m)) for k, m in sorted(v.metadata.items())),
            )
            for v in list(reversed(versions))[:VERSIONS_SHOWN]
        ]  # fmt: skip
        return self.ui.render(
            request, "model.html", title=f"Model {name}", name=name,
            versions=views, version_count=len(versions), aliases=dict(sorted(aliases.items())),
            history=list(reversed(history))[:HISTORY_SHOWN], changes=len(history),
            window=window, limit=WINDOW, uses=_uses(client, name),
            latency=_latency_chart(versions, window),
            moved=done if done in aliases else None,
        )  # fmt: skip

    async def move(self, request: Request) -> Response:
        """Point an alias at a version (the form's `alias` and `version`)."""
        client = self.ui.client_or_404()
        name = request.path_params["name"]
        fields = await self.ui.form(request)
        alias = fields.get("alias", "").strip()
        text = fields.get("version", "").strip()
        if not (text.isascii() and text.isdigit() and len(text) <= 9 and int(text) >= 1):
            raise UIError(
                f"version {text!r} must be a version number (1, 2, ...); pick one of the "
                f"model's versions",
                "version",
            )
        await asyncio.to_thread(_registry_call, client.models.set_alias, name, alias,
                                int(text), by=who(self.ui, request))  # fmt: skip
        return self._back(name, alias)

    async def rollback(self, request: Request) -> Response:
        """Point an alias back where it was before its latest move (the form's `alias`)."""
        client = self.ui.client_or_404()
        name = request.path_params["name"]
        fields = await self.ui.form(request)
        alias = fields.get("alias", "").strip()
        await asyncio.to_thread(
            _registry_call, client.models.rollback, name, alias, by=who(self.ui, request)
        )
        return self._back(name, alias)

    def _back(self, name: str, alias: str) -> Response:
        target = f"{self.ui.prefix}/models/{quote(name)}?moved={quote(alias)}#history"
        return RedirectResponse(target, 303)


def who(ui: UI, request: Request) -> str:
    """Who moves an alias from the dashboard, for its history: `dashboard key:` and the first
    8 hex digits of the signed-in key's sha256 (never the key), or `dashboard` on a server
    without keys.

    >>> who(UI(), request)  # doctest: +SKIP
    'dashboard'
    """
    if not ui.keys:
        return "dashboard"
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    key = request.cookies.get(KEY_COOKIE) or (token.strip() if scheme.lower() == "bearer" else "")
    return f"dashboard key:{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def _registry_call(method: Any, *args: Any, **kwargs: Any) -> Any:
    """A registry call whose unknown model is a 404 page and unknown version or alias a 400,
    each naming its field."""
    try:
        return method(*args, **kwargs)
    except UnknownModel as error:
        field_name = error.field or "model"
        raise UIError(str(error), field_name, 404 if field_name == "model" else 400) from None


def _model_rows(client: Client, window: Window) -> tuple[list[ModelRow], int]:
    """The Models page's rows, the first MODELS_SHOWN models by name, and how many there are."""
    models = client.models
    rows = []
    names = models.names()
    for name in names[:MODELS_SHOWN]:
        versions = models.versions(name)
        history = models.history(name)
        stats = [window.of(v.label) for v in versions]
        times = sorted(t for s in stats for t in s.times)
        rows.append(
            ModelRow(
                name, versions[-1], len(versions),
                {alias: v.version for v in versions for alias in v.aliases},
                sum(s.decisions for s in stats), sum(s.predictions for s in stats),
                percentile(times, 50), percentile(times, 99),
                history[-1] if history else None,
            )
        )  # fmt: skip
    return rows, len(names)


def _read_model(client: Client, name: str) -> tuple[list[ModelVersion], list[AliasChange]]:
    versions = _registry_call(client.models.versions, name)
    return versions, client.models.history(name)


def _uses(client: Client, name: str) -> list[Uses]:
    graph = client.graph
    found = []
    for output, options, inputs in model_features(graph):
        if options.model != name:
            continue
        pin = (
            f"alias={options.alias}" if options.alias
            else f"version={options.version}" if options.version
            else "newest"
        )  # fmt: skip
        found.append(
            Uses(
                output.fqn, _type(graph, output), pin,
                tuple((ref.fqn, _type(graph, ref)) for ref in inputs),
            )
        )  # fmt: skip
    return found


def _type(graph: Any, ref: Any) -> str:
    try:
        kind = graph.info(ref).type
    except Exception:  # a ref the graph cannot walk: shown without a type
        return ""
    return "" if kind is None else str(kind)


def _latency_chart(versions: Sequence[ModelVersion], window: Window) -> Bars | None:
    items = []
    for version in reversed(versions):
        stats = window.of(version.label)
        if stats.times:
            # the time in the label: the longest bar leaves no room after it
            items.append((f"v{version.version} p50 {stats.p50:.3f} ms", stats.p50, ""))
            items.append((f"v{version.version} p99 {stats.p99:.3f} ms", stats.p99, ""))
    if not items:
        return None
    kinds = ["bar" if i % 2 == 0 else "p99" for i in range(len(items))]
    return bars(items, left=170, kinds=kinds)


def metadata_text(value: Any) -> str:
    """A metadata value as shown: text as is, anything else as JSON.

    >>> metadata_text("team a"), metadata_text({"auc": 0.91})
    ('team a', '{"auc": 0.91}')
    """
    return value if isinstance(value, str) else json.dumps(value, default=str)


def size_text(size: int) -> str:
    """
    >>> size_text(512), size_text(2048), size_text(3 * 1024 * 1024)
    ('512 B', '2.0 KiB', '3.0 MiB')
    """
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{size / 1024:.1f} KiB"
    return f"{size / 1024 / 1024:.1f} MiB"
