"""The engine runs plans: concurrently, under timeouts, with per-feature errors and a trace."""

from kairos.engine.execution import Engine, RunOutcome
from kairos.engine.result import (
    BulkResult,
    ColumnData,
    FeatureError,
    FeatureValue,
    NodeTiming,
    QueryMeta,
    QueryResult,
)

__all__ = [
    "BulkResult",
    "ColumnData",
    "Engine",
    "FeatureError",
    "FeatureValue",
    "NodeTiming",
    "QueryMeta",
    "QueryResult",
    "RunOutcome",
]
