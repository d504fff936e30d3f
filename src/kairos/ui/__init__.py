"""The web dashboard at /ui: features and their lineage, decisions and their traces, models,
the gateway's spend, and what the server is doing now. Server-rendered HTML and SVG, no
JavaScript, packaged in the wheel (templates/ and static/)."""

from kairos.ui.app import UI
from kairos.ui.dashboard import dashboard_routes
from kairos.ui.traffic import Traffic

__all__ = ["UI", "Traffic", "dashboard_routes"]
