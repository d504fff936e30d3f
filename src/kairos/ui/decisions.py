"""The Decisions page(s) of the dashboard."""

from __future__ import annotations

from starlette.routing import BaseRoute

from kairos.ui.app import UI


def routes(ui: UI) -> list[BaseRoute]:
    return []
