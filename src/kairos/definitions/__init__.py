"""Definitions: feature classes, types, relations, `_` expressions and windows. No I/O."""

from kairos.definitions.expressions import Expr, _, coalesce, if_then_else
from kairos.definitions.feature import (
    Feature,
    FeatureRef,
    HasManyRef,
    feature,
    features,
    windowed,
)
from kairos.definitions.graph import FeatureInfo, Graph
from kairos.definitions.predict import ModelOptions, predict
from kairos.definitions.types import (
    DataFrame,
    Features,
    FeatureTime,
    Now,
    Primary,
    Vector,
    Windowed,
)

__all__ = [
    "DataFrame",
    "Expr",
    "Feature",
    "FeatureInfo",
    "FeatureRef",
    "FeatureTime",
    "Features",
    "Graph",
    "HasManyRef",
    "ModelOptions",
    "Now",
    "Primary",
    "Vector",
    "Windowed",
    "_",
    "coalesce",
    "feature",
    "features",
    "if_then_else",
    "predict",
    "windowed",
]
