"""Errors of the LLM layer: the worker's request errors carry the HTTP status and the field."""

from __future__ import annotations

from kairos.errors import KairosError, RequestError


class LLMRequestError(RequestError, ValueError):
    """A request to an LLM worker is malformed; `param` names the field, the message the fix."""


class ContextOverflow(LLMRequestError):
    """The prompt leaves no room in the model's context for even one generated token."""

    code = "context_length_exceeded"


class UnknownLLM(LLMRequestError, LookupError):
    """The request names a model this worker does not serve."""

    status = 404
    code = "model_not_found"


class EngineNotReady(KairosError, RuntimeError):
    """The model is still loading (or failed to load); the worker answers 503."""


class DeploymentError(KairosError, RuntimeError):
    """A deployment cannot start, a replica never became ready, or its engine is missing."""
