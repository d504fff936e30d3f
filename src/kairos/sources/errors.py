"""The error a source raises when it cannot run a query, and the names of its threads (in
thread dumps, and how tests find what a closed source still holds)."""

from __future__ import annotations

from kairos.errors import BackendUnavailable


class SourceError(BackendUnavailable):
    """A source could not connect or run a query; the message names the source and carries
    the driver's message with any password replaced by `***`."""


def closed(source: str) -> SourceError:
    """The error a closed source answers with."""
    return SourceError(f"source {source!r} is closed; open a new one")


def source_thread(source: str) -> str:
    """The name prefix of a source's threads (visible in thread dumps and tests)."""
    return f"kairos-source-{source}"
