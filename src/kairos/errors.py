"""Every error kairos raises on purpose: one base, and the builtin that fits as a second base.

Messages name the object, the offending value and the fix, and suggest near matches.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class KairosError(Exception):
    """Base of every error kairos raises on purpose."""


class RequestError(KairosError):
    """A request refused with an HTTP answer: `status`, `kind` (the OpenAI error type) and
    `code` shape it, `param` names the request field at fault when there is one."""

    status = 400
    kind = "invalid_request_error"
    code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class DefinitionError(KairosError, TypeError):
    """A feature class, expression or resolver is declared wrongly."""


class ProjectError(KairosError, ImportError):
    """A project folder cannot be loaded (missing, a syntax error, an import that fails)."""


class UnknownFeature(KairosError, KeyError):
    """A feature name that no feature class declares."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class InvalidInput(KairosError, ValueError):
    """A query input has the wrong type, shape or value; `field` names the part at fault."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidValue(KairosError, ValueError):
    """A value does not fit its feature's declared type, nullability or range."""


class BackendUnavailable(KairosError, RuntimeError):
    """A database, store or log kairos depends on failed; the request itself was fine."""


class OnlineStoreUnavailable(BackendUnavailable, ConnectionError):
    """The online store cannot answer right now: its server cannot be reached, or its windows
    are being reloaded from the offline store (a Redis that restarted empty). Retry shortly."""


class PlanError(KairosError, ValueError):
    """The requested outputs cannot be computed from the given inputs."""


class NoPath(PlanError):
    """No resolver, expression or relation reaches a feature from the inputs."""


class MissingInput(NoPath):
    """A primary key the query needs was not passed."""


class AmbiguousResolvers(PlanError):
    """More than one resolver could produce a feature from the same inputs."""


class CycleError(PlanError):
    """Features depend on each other in a loop."""


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Return "; did you mean 'x'?" for the closest candidate, or "" when none is close."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
