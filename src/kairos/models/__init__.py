"""Models: a registry of named, versioned, aliased models; artifacts content-addressed by
sha256 in safe formats; predictors that micro-batch concurrent requests."""

from kairos.models.errors import SchemaMismatch, TamperedArtifact, UnknownModel, UnsupportedModel
from kairos.models.predictor import Predictor
from kairos.models.registry import AliasChange, ModelRegistry, ModelVersion, model_registry_from_url
from kairos.models.schema import ModelSchema
from kairos.models.store import ModelStore
from kairos.models.volume import ArtifactVolume

__all__ = [
    "AliasChange",
    "ArtifactVolume",
    "ModelRegistry",
    "ModelSchema",
    "ModelStore",
    "ModelVersion",
    "Predictor",
    "SchemaMismatch",
    "TamperedArtifact",
    "UnknownModel",
    "UnsupportedModel",
    "model_registry_from_url",
]
