"""The dashboard's routes in one list: sign-in and the stylesheet (app.py), then each page's.

>>> Mount("/ui", routes=dashboard_routes(UI(client)))  # doctest: +SKIP
"""

from __future__ import annotations

from starlette.routing import BaseRoute

from kairos.ui import decisions, features, gateway, live, models
from kairos.ui.app import UI


def dashboard_routes(ui: UI) -> list[BaseRoute]:
    return [
        *ui.routes(),
        *features.routes(ui),
        *decisions.routes(ui),
        *models.routes(ui),
        *live.routes(ui),
        *gateway.routes(ui),
    ]
