"""Errors of the model registry, each also the builtin that fits."""

from __future__ import annotations

from kairos.errors import InvalidInput, KairosError


class UnknownModel(KairosError, KeyError):
    """A model name, version or alias that the registry does not hold."""

    def __init__(self, message: str, *, field: str = "model") -> None:
        super().__init__(message)
        self.field = field

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class UnsupportedModel(KairosError, TypeError):
    """An object kairos cannot save safely (an unknown framework, or pickle not allowed)."""


class TamperedArtifact(KairosError, ValueError):
    """An artifact whose bytes no longer hash to the sha256 recorded when it was registered."""


class SchemaMismatch(InvalidInput):
    """Rows sent to a model whose columns or types do not match the model's input schema."""
