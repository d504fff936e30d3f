"""The Features pages: every class and feature with its type, description, owner, tags,
max_staleness, ttl and what computes it; a feature's page draws its lineage (the plan DAG
that computes it from its class's primary key) as SVG."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from kairos.client.client import Client
from kairos.definitions.graph import FeatureInfo
from kairos.errors import KairosError
from kairos.planner.plan import Plan
from kairos.ui.app import UI, UIError
from kairos.ui.lineage import layout, node_kind


@dataclass(frozen=True, slots=True)
class FeatureRow:
    fqn: str
    namespace: str
    name: str
    type: str
    kind: str  # scalar | has_one | has_many
    description: str
    owner: str
    tags: tuple[str, ...]
    max_staleness: str
    ttl: str
    computed_by: str  # the producing node's label, or why there is none
    computed_kind: str  # its colour class
    role: str  # primary key, feature time, relation...


def routes(ui: UI) -> list[BaseRoute]:
    pages = FeaturePages(ui)
    return [
        Route("/features", ui.page(pages.index), methods=["GET"]),
        Route("/features/{fqn:path}", ui.page(pages.feature), methods=["GET"]),
    ]


class FeaturePages:
    def __init__(self, ui: UI) -> None:
        self.ui = ui
        self._rows: list[FeatureRow] | None = None  # definitions are immutable: built once

    def rows(self, client: Client) -> list[FeatureRow]:
        if self._rows is None:
            self._rows = [
                _row(client, info)
                for cls in client.graph.classes.values()
                for info in cls.features.values()
            ]
        return self._rows

    async def index(self, request: Request) -> Response:
        client = self.ui.client_or_404()
        text = request.query_params.get("q", "").strip().lower()
        rows = [
            r for r in self.rows(client)
            if not text or text in r.fqn.lower() or text in r.description.lower()
            or any(text in tag.lower() for tag in r.tags) or text in r.owner.lower()
        ]  # fmt: skip
        classes: dict[str, list[FeatureRow]] = {}
        for row in rows:
            classes.setdefault(row.namespace, []).append(row)
        return self.ui.render(
            request, "features.html", title="Features", classes=classes, q=text,
            total=len(self.rows(client)), shown=len(rows),
        )  # fmt: skip

    async def feature(self, request: Request) -> Response:
        client = self.ui.client_or_404()
        fqn = request.path_params["fqn"]
        row = next((r for r in self.rows(client) if r.fqn == fqn), None)
        if row is None:
            raise UIError(f"no feature {fqn!r}; pick one from the Features page", "fqn", 404)
        plan, problem = _plan(client, row)
        lineage = layout(plan, row.fqn) if plan is not None else None
        return self.ui.render(
            request, "feature.html", title=row.fqn, row=row, lineage=lineage, problem=problem,
            explain=plan.explain() if plan is not None else "",
        )  # fmt: skip


def _plan(client: Client, row: FeatureRow) -> tuple[Plan | None, str | None]:
    primary = client.graph.classes[row.namespace].primary
    try:
        return client.plan([f"{row.namespace}.{primary}"], [row.fqn]), None
    except KairosError as error:  # a relation or a feature no resolver makes: say why
        return None, str(error)


def _row(client: Client, info: FeatureInfo) -> FeatureRow:
    role = (
        "primary key" if info.is_primary
        else "feature time" if info.is_feature_time
        else f"foreign key to {info.fk_target[0]}" if info.fk_target
        else f"{info.kind.replace('_', '-')} of {info.target}" if info.target
        else ""
    )  # fmt: skip
    row = FeatureRow(
        info.fqn, info.namespace, info.name,
        str(info.type) if info.type is not None else (info.target or ""),
        info.kind, info.description or "", info.owner or "", info.tags,
        _duration(info.max_staleness), _duration(info.ttl), "", "other", role,
    )  # fmt: skip
    if info.is_primary:
        return _with(row, "the query's input", "input")
    plan, _ = _plan(client, row)
    if plan is None:  # a child's column: made with the rows of the relation that holds it
        holder = next(
            (f for cls in client.graph.classes.values() for f in cls.features.values()
             if f.kind == "has_many" and f.target == info.namespace),
            None,
        )  # fmt: skip
        if holder is None:
            return _with(row, "nothing computes it online", "other")
        return _with(row, f"rows of {holder.fqn}", "other")
    node = next((n for n in plan.nodes if n.id == plan.producer.get(info.fqn)), None)
    if node is None:
        return _with(row, "an input", "input")
    return _with(row, node.label, node_kind(node))


def _with(row: FeatureRow, computed_by: str, kind: str) -> FeatureRow:
    return replace(row, computed_by=computed_by, computed_kind=kind)


def _duration(value: timedelta | None) -> str:
    """
    >>> _duration(timedelta(minutes=1)), _duration(timedelta(0)), _duration(None)
    ('1m', '0s', '–')
    """
    if value is None:
        return "–"
    seconds = value.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
