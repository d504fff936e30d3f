"""The model gateway: one OpenAI-compatible endpoint with keys, hard budgets, failover and a
ledger. `Gateway` is the in-process API; `kairos.gateway.app` serves it over HTTP."""

from kairos.gateway.config import GatewayConfig
from kairos.gateway.errors import (
    BudgetExceeded,
    GatewayError,
    ModelNotAllowed,
    RateLimited,
    Unauthenticated,
    UpstreamError,
)
from kairos.gateway.gateway import Gateway
from kairos.gateway.keys import Budget, KeyRecord
from kairos.gateway.wire.streams import Stream

__all__ = [
    "Budget",
    "BudgetExceeded",
    "Gateway",
    "GatewayConfig",
    "GatewayError",
    "KeyRecord",
    "ModelNotAllowed",
    "RateLimited",
    "Stream",
    "Unauthenticated",
    "UpstreamError",
]
