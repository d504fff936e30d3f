"""The "HTTP endpoints" section of docs/server.md lists every route `kairos serve` and `kairos
gateway serve` answer, with its method: a route added without a line there fails here."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route

from kairos.gateway import Gateway, GatewayConfig
from kairos.gateway.app import create_gateway_app
from kairos.ui.app import UI
from kairos.ui.gateway import routes as gateway_routes

SERVER_DOC = Path(__file__).parents[2] / "docs" / "server.md"


def _section() -> str:
    return SERVER_DOC.read_text().split("\n## HTTP endpoints\n", 1)[1].split("\n## ", 1)[0]


def _listed(text: str) -> set[tuple[str, str]]:
    """Every `METHOD /path` the text names, path parameters as `{}`."""
    found = re.findall(r"`(GET|POST|PUT|DELETE|PATCH) (/[^`\s]*)`", text)
    return {(method, re.sub(r"\{[^}]*\}", "{}", path)) for method, path in found}


def _walk(routes: Iterable[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    for route in routes:
        if isinstance(route, Mount):
            yield from _walk(route.routes, prefix + route.path)
        elif isinstance(route, Route):
            for method in sorted((route.methods or set()) - {"HEAD"}):
                yield method, re.sub(r"\{[^}]*\}", "{}", prefix + route.path)


def _server_part(section: str) -> str:
    return section.split("`kairos gateway serve`", 1)[0]


def _gateway_part(section: str) -> str:
    return section.split("`kairos gateway serve`", 1)[1]


def test_every_route_of_kairos_serve_is_listed(app: Starlette) -> None:
    routes = set(_walk(app.routes))
    assert len(routes) > 30  # the walk reached the models' routes and the dashboard's
    missing = routes - _listed(_server_part(_section()))
    assert not missing, f"routes of kairos serve missing from docs/server.md: {missing}"


@pytest.mark.anyio
async def test_every_route_of_kairos_gateway_serve_is_listed(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'gateway.db'}"
    config = GatewayConfig.from_mapping(
        {"pepper_env": "PEPPER", "registry": db, "counters": db},
        base_dir=tmp_path,
        environ={"PEPPER": "a test pepper"},
    )
    gateway = Gateway(config)
    try:
        app = create_gateway_app(gateway)
        routes = {(method, path) for path, methods in app.routes.items() for method in methods}
        routes |= {(method, "/admin/keys/{}") for method in app.revoke}  # matched by prefix
        routes |= {(method, "/v1/models/{}") for method in app.model}
        routes |= set(_walk(gateway_routes(UI(gateway=gateway)), "/ui"))
    finally:
        await gateway.close()
    assert ("POST", "/v1/chat/completions") in routes and ("GET", "/ui/gateway") in routes
    missing = routes - _listed(_gateway_part(_section()))
    assert not missing, f"gateway routes missing from docs/server.md: {missing}"
