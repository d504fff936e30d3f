"""The HTTP server: a thin Starlette app over a `kairos.Client`."""

from kairos.server.app import create_app

__all__ = ["create_app"]
