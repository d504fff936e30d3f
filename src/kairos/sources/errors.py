"""The error a source raises when it cannot run a query."""

from __future__ import annotations

from kairos.errors import BackendUnavailable


class SourceError(BackendUnavailable):
    """A source could not connect or run a query; the message names the source and carries
    the driver's message with any password replaced by `***`."""
