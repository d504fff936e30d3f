"""The Gateway page (admin only): spend and tokens per key over time, budgets used against
their limits, errors, failovers and time to first token per model group, and the keys (their
public fields, never a secret or a hash) with a revoke button.

Everything is read from the ledger in SQL over one time range (`?since=24h`), from the
ledger's index by key and time that also holds the usage columns (the table itself is not
read), aggregated by the database, two statements at once: a page's time grows with the calls
in the range, not with the ledger (about 125 ms for 100k calls on SQLite, 340 ms for 300k).
TTFT percentiles come from the newest `TTFT_SAMPLE` calls of the range. The ledger is read on
connections of its own (the SQLite file read-only, or PostgreSQL sessions), never the
gateway's writer.

`with_dashboard(app, ui)` puts these pages in front of `kairos gateway serve`'s own app.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from kairos.backends import parse, postgres
from kairos.gateway import Gateway, KeyRecord
from kairos.gateway.accounting.prices import Price
from kairos.gateway.store.pg import split_prefix
from kairos.gateway.store.registry_postgres import PostgresRegistry
from kairos.gateway.store.registry_sqlite import SQLiteRegistry
from kairos.ui.app import UI, UIError
from kairos.ui.charts import Bars, Series, bars, series
from kairos.ui.traffic import percentile

Statement = tuple[str, Sequence[Any]]  # a select written with ?, and its parameters
BUCKETS = 48  # points of each line chart over the range
TTFT_SAMPLE = 20_000  # the newest calls of the range whose TTFT the percentiles are of
RANGE = re.compile(r"(\d{1,4})([mhd])")
UNITS = {"m": 60, "h": 3600, "d": 86400}
RANGES = ("1h", "6h", "24h", "7d", "30d")  # offered in the range picker (any NNm/h/d works)
PERIODS = ("day", "month", "total")  # a budget's (kairos.gateway.keys)
NOT_ERRORS = ("ok", "pending")  # pending: in flight (or its process died: recovery marks it)


@dataclass(slots=True)
class KeyUsage:
    """One key's calls over the range."""

    requests: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_micros: int = 0
    errors: int = 0


@dataclass(slots=True)
class GroupStats:
    """One model group's calls over the range (the group served, else the one asked for)."""

    model: str
    calls: int = 0
    errors: int = 0
    failovers: int = 0  # calls that took more than one attempt
    statuses: dict[str, int] = field(default_factory=dict)
    cost_micros: int = 0
    tokens: int = 0
    ttft: list[float] = field(default_factory=list)

    @property
    def ttft_p50(self) -> float:
        return percentile(self.ttft, 50)

    @property
    def ttft_p99(self) -> float:
        return percentile(self.ttft, 99)

    @property
    def error_kinds(self) -> list[tuple[str, int]]:
        return sorted(
            ((s, n) for s, n in self.statuses.items() if s not in NOT_ERRORS),
            key=lambda item: -item[1],
        )


@dataclass(frozen=True, slots=True)
class BudgetUse:
    """One budget of a key: what the ledger says its calls used this period, what the
    counters hold now (that adds calls in flight and budget shares reserved unused)."""

    key: KeyRecord
    period: str
    unit: str  # usd | tokens
    limit: int  # micro-dollars or tokens
    used: int
    charged: int | None

    @property
    def fraction(self) -> float:
        return self.used / self.limit if self.limit else 1.0


@dataclass(frozen=True, slots=True)
class Summary:
    since: datetime
    until: datetime
    keys: dict[str, KeyUsage]
    groups: list[GroupStats]
    spend: list[float]  # USD per bucket, of the selected key or all
    tokens: list[float]
    ttft_sampled: int


def parse_range(text: str | None) -> timedelta:
    """`?since=`: a duration back from now, 5m to 400d.

    >>> parse_range("24h"), parse_range(None)
    (datetime.timedelta(days=1), datetime.timedelta(days=1))
    """
    found = RANGE.fullmatch((text or "24h").strip())
    span = timedelta(seconds=int(found[1]) * UNITS[found[2]]) if found else None
    if span is None or not timedelta(minutes=5) <= span <= timedelta(days=400):
        raise UIError(
            f"since={text!r} must be a duration back from now, 5m to 400d: e.g. 1h, 24h, 7d",
            "since",
        )
    return span


class LedgerReader:
    """Aggregates of the gateway's ledger in SQL, on a read-only connection of its own."""

    def __init__(self, gateway: Gateway) -> None:
        registry, url = gateway.registry, gateway.config.registry
        self._path: str | None = None
        self._conninfo: str | None = None
        if isinstance(registry, SQLiteRegistry):
            self._path = parse(url).file_path()
            self.ledger, self.keys, self._mark = "gateway_ledger", "gateway_keys", "?"
        elif isinstance(registry, PostgresRegistry):
            self._conninfo = split_prefix(url)[0]
            self.ledger, self.keys, self._mark = registry.ledger_table, registry.keys_table, "%s"
        else:
            raise UIError(
                f"the Gateway page reads a SQLite or PostgreSQL registry; this gateway's is a "
                f"{type(registry).__name__}",
                status=501,
            )
        if self._path == ":memory:":
            raise UIError(
                "the gateway's registry is in memory, which only the gateway's own connection "
                "sees; give gateway.registry a file (sqlite:///.kairos/gateway.db)",
                status=501,
            )

    async def run(self, *statements: Statement) -> list[list[tuple[Any, ...]]]:
        """The rows of each `select` (written with `?` and `{ledger}`, `{keys}`): on SQLite
        at once, each on a read-only connection of its own in a thread; on PostgreSQL one
        after the other in one session (its own aggregation is quick)."""
        texts = [
            (sql.format(ledger=self.ledger, keys=self.keys).replace("?", self._mark), params)
            for sql, params in statements
        ]
        if self._path is not None:
            return list(
                await asyncio.gather(*(asyncio.to_thread(self._sqlite, *text) for text in texts))
            )
        try:
            connection = await postgres.connect_async(
                self._conninfo or "", autocommit=True, connect_timeout=postgres.CONNECT_TIMEOUT
            )
            async with connection:
                found = []
                for text, params in texts:
                    cursor = await connection.execute(text, tuple(params))
                    found.append(list(await cursor.fetchall()))
                return found
        except Exception as error:
            if postgres.is_error(error):  # never the driver's text: it may quote the URL
                raise UIError(
                    f"cannot read the gateway ledger ({type(error).__name__}); retry shortly",
                    status=503,
                ) from None
            raise

    def _sqlite(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        try:
            db = sqlite3.connect(f"file:{self._path}?mode=ro", uri=True, timeout=5)
            try:
                return list(db.execute(sql, tuple(params)).fetchall())
            finally:
                db.close()
        except sqlite3.Error as error:
            raise UIError(f"cannot read the gateway ledger ({error})", status=503) from None


async def summarize(
    reader: LedgerReader, since: datetime, until: datetime, key: str | None
) -> Summary:
    """Per key and per model group totals over [since, until), and the spend and tokens of
    `key` (None: every key) in `BUCKETS` buckets.

    Two statements (at once, on SQLite): one pass over the range's rows grouped by key,
    bucket, model group and status (a few thousand groups, summed here into the per key and
    per group totals: one scan of the rows instead of one per total), and the newest TTFTs."""
    start, end = _micros(since), _micros(until)
    width = max(1, (end - start) // BUCKETS)
    scope = "key_id in (select id from {keys}) and created_at >= ? and created_at < ?"
    grouped, ttft = await reader.run(
        (
            "select key_id, (created_at - ?) / ?, coalesce(model_dispatched, model_requested), "
            "status, count(*), sum(tokens_in), sum(tokens_out), sum(cost_micros), "
            "sum(case when attempts > 1 then 1 else 0 end) "
            f"from {{ledger}} where {scope} group by 1, 2, 3, 4",
            (start, width, start, end),
        ),
        (
            "select coalesce(model_dispatched, model_requested), ttft_ms from {ledger} "
            f"where {scope} and ttft_ms is not null order by created_at desc limit ?",
            (start, end, TTFT_SAMPLE),
        ),
    )
    keys: dict[str, KeyUsage] = {}
    groups: dict[str, GroupStats] = {}
    spend, used = [0.0] * BUCKETS, [0.0] * BUCKETS
    for ident, bucket, model, status, n, tokens_in, tokens_out, cost, failovers in grouped:
        n, cost = int(n), int(cost or 0)
        tokens = int(tokens_in or 0) + int(tokens_out or 0)
        failed = status not in NOT_ERRORS
        usage = keys.setdefault(str(ident), KeyUsage())
        usage.requests += n
        usage.tokens_in += int(tokens_in or 0)
        usage.tokens_out += int(tokens_out or 0)
        usage.cost_micros += cost
        usage.errors += n if failed else 0
        if key is None or ident == key:
            index = min(BUCKETS - 1, max(0, int(bucket)))
            spend[index] += cost / 1e6
            used[index] += tokens
        group = groups.setdefault(str(model), GroupStats(str(model)))
        group.calls += n
        group.statuses[str(status)] = group.statuses.get(str(status), 0) + n
        group.errors += n if failed else 0
        group.failovers += int(failovers or 0)
        group.cost_micros += cost
        group.tokens += tokens
    for model, value in ttft:
        groups.setdefault(str(model), GroupStats(str(model))).ttft.append(float(value))
    for group in groups.values():
        group.ttft.sort()
    ordered = sorted(groups.values(), key=lambda g: (-g.calls, g.model))
    return Summary(since, until, keys, ordered, spend, used, len(ttft))


async def budgets(
    gateway: Gateway, reader: LedgerReader, keys: Sequence[KeyRecord], now: datetime
) -> list[BudgetUse]:
    """Each budget of each active key: used this period (the ledger; one statement over each
    key's index range since its earliest period began) and charged (the counters; one read).
    """
    budgeted = [key for key in keys if key.budgets and key.active(now)]
    if not budgeted:
        return []
    starts = {period: _micros(_period_start(period, now)) for period in PERIODS}
    counters = [
        line.counter
        for key in budgeted
        for line in gateway.accountant.lines(key, Price(0, 0), 0, 0)
        if ":usd:" in line.counter or ":tok:" in line.counter
    ]
    try:
        charged = dict(zip(counters, await gateway.counters.spent(counters), strict=True))
    except Exception:  # the counters store is down: the ledger's numbers still show
        charged = {}
    sums = ", ".join(
        f"sum(case when created_at >= ? then {column} else 0 end)"
        for _ in PERIODS
        for column in ("cost_micros", "tokens_in + tokens_out")
    )
    ranges = " or ".join("(key_id = ? and created_at >= ?)" for _ in budgeted)
    params: list[Any] = [starts[period] for period in PERIODS for _ in range(2)]
    for key in budgeted:
        params += [key.id, min(starts[budget.period] for budget in key.budgets)]
    [rows] = await reader.run(
        (f"select key_id, {sums} from {{ledger}} where {ranges} group by key_id", params)
    )
    used = {str(row[0]): [int(value or 0) for value in row[1:]] for row in rows}
    uses = []
    for key in budgeted:
        for budget in key.budgets:
            index = 2 * PERIODS.index(budget.period)
            cost, tokens = used.get(key.id, [0] * 2 * len(PERIODS))[index : index + 2]
            for unit, limit, amount, tag in (
                ("usd", budget.usd_micros, cost, "usd"),
                ("tokens", budget.tokens, tokens, "tok"),
            ):
                if limit is None:
                    continue
                prefix = f"{key.id}:{tag}:{budget.period}:"
                counter = next((c for c in charged if c.startswith(prefix)), None)
                uses.append(
                    BudgetUse(key, budget.period, unit, limit, amount,
                              None if counter is None else charged[counter])
                )  # fmt: skip
    return uses


def budget_chart(uses: Sequence[BudgetUse]) -> Bars | None:
    """Budgets as the share of their limit used (the dashed line: 100%)."""
    if not uses:
        return None
    items = [  # the share in the label: a bar past the limit leaves no room after it
        (f"{u.key.name} {u.period} {u.unit} {u.fraction * 100:.1f}%", u.fraction * 100, "")
        for u in uses
    ]
    kinds = ["over" if u.fraction >= 1 else "near" if u.fraction >= 0.8 else "bar" for u in uses]
    return bars(items, limit=100.0, kinds=kinds)


def routes(ui: UI) -> list[BaseRoute]:
    pages = GatewayPages(ui)
    return [
        Route("/gateway", ui.page(pages.index, admin=True), methods=["GET"]),
        Route("/gateway/keys/{key_id}/revoke", ui.page(pages.revoke, admin=True), methods=["POST"]),
    ]


class GatewayPages:
    def __init__(self, ui: UI) -> None:
        self.ui = ui
        self._reader: LedgerReader | None = None

    def reader(self, gateway: Gateway) -> LedgerReader:
        if self._reader is None:
            self._reader = LedgerReader(gateway)
        return self._reader

    async def index(self, request: Request) -> Response:
        gateway = self.ui.gateway_or_404()
        params = request.query_params
        span = parse_range(params.get("since"))
        keys = await gateway.list_keys()  # opens the registry (its tables) if nothing did
        chosen = params.get("key") or None
        if chosen is not None and chosen not in {k.id for k in keys}:
            raise UIError(f"no key {chosen!r}; pick one from the list below", "key", 404)
        await gateway.ledger.flush()  # rows this process buffered are read too
        reader = self.reader(gateway)
        now = datetime.now(UTC)
        summary = await summarize(reader, now - span, now, chosen)
        uses = await budgets(gateway, reader, keys, now)
        total = KeyUsage()
        for usage in summary.keys.values():
            for name in ("requests", "tokens_in", "tokens_out", "cost_micros", "errors"):
                setattr(total, name, getattr(total, name) + getattr(usage, name))
        names = {k.id: k.name for k in keys}
        label = f"key {names[chosen]} ({chosen})" if chosen else "all keys"
        first, last = _when(summary.since), _when(summary.until)
        revoked = params.get("revoked")
        return self.ui.render(
            request, "gateway.html", title="Gateway", since=params.get("since") or "24h",
            ranges=RANGES, chosen=chosen, label=label, keys=keys, names=names,
            summary=summary, total=total, budgets=uses, budget_chart=budget_chart(uses),
            failovers=sum(g.failovers for g in summary.groups),
            spend=_line(summary.spend, compact(max(summary.spend, default=0.0)), first, last),
            tokens=_line(summary.tokens, compact(max(summary.tokens, default=0.0)), first, last),
            bucket=_duration(span / BUCKETS),
            ttft_sample=TTFT_SAMPLE, public=[k.public() for k in keys],
            revoked=revoked if revoked in names else None,
        )  # fmt: skip

    async def revoke(self, request: Request) -> Response:
        gateway = self.ui.gateway_or_404()
        ident = request.path_params["key_id"]
        await self.ui.form(request)
        if not await gateway.revoke_key(ident):
            raise UIError(
                f"no active key {ident!r}: it is revoked already or was never made; pick one "
                "from the Gateway page",
                "key",
                404,
            )
        return RedirectResponse(f"{self.ui.prefix}/gateway?revoked={quote(ident)}#keys", 303)


def with_dashboard(app: ASGIApp, ui: UI) -> ASGIApp:
    """`app` with the dashboard at /ui: requests under /ui go to the dashboard's routes (sign
    in, the stylesheet and the Gateway page), everything else, lifespan included, to `app`
    unchanged.

    (The routes are `ui.routes()` and this module's, what `dashboard_routes` gives a UI with
    only a gateway; importing kairos.ui.dashboard here would import this module back.)

    >>> serve(with_dashboard(create_gateway_app(gateway), UI(gateway=gateway)))  # doctest: +SKIP
    """
    dashboard = Starlette(routes=[Mount("/ui", routes=[*ui.routes(), *routes(ui)])])

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] in ("http", "websocket") else ""
        target: Callable[[Scope, Receive, Send], Awaitable[None]] = app
        if path == "/ui" or path.startswith("/ui/"):
            target = dashboard
        await target(scope, receive, send)

    return route


def _micros(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000)


def _period_start(period: str, now: datetime) -> datetime:
    """Where a budget's period began (UTC), as the counters' stamps cut them.

    >>> _period_start("month", datetime(2026, 6, 9, 12, tzinfo=UTC)).isoformat()
    '2026-06-01T00:00:00+00:00'
    """
    if period == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "month":
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return datetime(1970, 1, 1, tzinfo=UTC)


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%m-%d %H:%M")


def compact(value: float) -> str:
    """A chart axis' top value in at most 6 characters.

    >>> compact(0.000193), compact(0.5), compact(12.5), compact(1234.0), compact(2.5e6)
    ('1.9e-4', '0.5', '12.5', '1.23k', '2.5M')
    """
    if value == 0:
        return "0"
    if value < 0.01:
        mantissa, exponent = f"{value:.1e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def _duration(span: timedelta) -> str:
    """
    >>> _duration(timedelta(minutes=30)), _duration(timedelta(hours=3.5))
    ('30 min', '3.5 h')
    """
    seconds = span.total_seconds()
    if seconds < 3600:
        return f"{seconds / 60:.3g} min"
    if seconds < 86400:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} d"


def _line(values: Sequence[float], top: str, first: str, last: str) -> Series:
    return series(values, top_text=top, first=first, last=last)
