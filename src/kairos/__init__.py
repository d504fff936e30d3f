"""kairos: real-time inference, data path and model path planned as one query.

import kairos as kr
from kairos import features, online, DataFrame, FeatureTime, Now, _

client = kr.Client("examples/fraud")
r = client.query(input={"user.id": "u1"}, output=["user.risk"])
"""

from kairos.client import Client, RemoteClient, connect
from kairos.definitions import (
    DataFrame,
    Feature,
    FeatureRef,
    Features,
    FeatureTime,
    Now,
    Primary,
    Vector,
    Windowed,
    _,
    coalesce,
    feature,
    features,
    if_then_else,
    predict,
    windowed,
)
from kairos.definitions.completion import completion, completion_usage, embedding, message
from kairos.definitions.nearest import nearest, parent
from kairos.engine import BulkResult, FeatureError, FeatureValue, NodeTiming, QueryResult
from kairos.errors import (
    AmbiguousResolvers,
    CycleError,
    DefinitionError,
    InvalidInput,
    InvalidValue,
    KairosError,
    MissingInput,
    NoPath,
    PlanError,
    ProjectError,
    UnknownFeature,
)
from kairos.project.modules import Project
from kairos.resolvers import offline, online

__version__ = "0.1.0"

__all__ = [
    "AmbiguousResolvers",
    "BulkResult",
    "Client",
    "CycleError",
    "DataFrame",
    "DefinitionError",
    "Feature",
    "FeatureError",
    "FeatureRef",
    "FeatureTime",
    "FeatureValue",
    "Features",
    "InvalidInput",
    "InvalidValue",
    "KairosError",
    "MissingInput",
    "NoPath",
    "NodeTiming",
    "Now",
    "PlanError",
    "Primary",
    "Project",
    "ProjectError",
    "QueryResult",
    "RemoteClient",
    "UnknownFeature",
    "Vector",
    "Windowed",
    "_",
    "coalesce",
    "completion",
    "completion_usage",
    "connect",
    "embedding",
    "feature",
    "features",
    "if_then_else",
    "message",
    "nearest",
    "offline",
    "online",
    "parent",
    "predict",
    "windowed",
]
