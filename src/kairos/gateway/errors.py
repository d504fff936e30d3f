"""Errors of the model gateway. Each carries the HTTP status and OpenAI error type it is
answered with, and `param` names the request field at fault when there is one."""

from __future__ import annotations

from kairos.errors import BackendUnavailable, KairosError, RequestError


class GatewayError(RequestError):
    """Base of the gateway's errors; `status` and `kind` shape the HTTP answer."""

    retry_after: int | None = None  # seconds until a retry can succeed (a 429's Retry-After)


class InvalidRequest(GatewayError, ValueError):
    """The request body is malformed; `param` names the field and the message the fix."""

    status = 400
    code = "invalid_request"


class InvalidKeySpec(InvalidRequest):
    """An admin request to create a key has a field of the wrong type or out of its range."""

    status = 422


class Unauthenticated(GatewayError, PermissionError):
    """No key, an unknown, revoked or expired key. The message never repeats the key."""

    status = 401
    kind = "authentication_error"
    code = "invalid_api_key"


class ModelNotAllowed(GatewayError, PermissionError):
    """The key's allow-list does not include any deployment the model could dispatch to."""

    status = 403
    kind = "permission_error"
    code = "model_not_allowed"


class UnknownModel(GatewayError, LookupError):
    """No model group or alias by that name."""

    status = 404
    kind = "invalid_request_error"
    code = "model_not_found"


class BudgetExceeded(GatewayError, PermissionError):
    """What remains of a budget cannot cover even the smallest answer."""

    status = 429
    kind = "insufficient_quota"
    code = "budget_exceeded"

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # None: a total budget, which never resets


class RateLimited(GatewayError, PermissionError):
    """The key's requests or tokens per minute are used up until the next minute."""

    status = 429
    kind = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after: int | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class PriceUnknown(GatewayError, LookupError):
    """A key with a USD budget asked for a model without a price; it cannot be budgeted."""

    status = 400
    code = "price_unknown"


class UnsupportedRoute(GatewayError, ValueError):
    """The provider of every candidate deployment cannot serve this kind of call."""

    status = 400
    code = "unsupported_route"


class UpstreamError(GatewayError, ConnectionError):
    """A provider failed; `retryable` says whether another deployment may be tried."""

    status = 502
    kind = "api_error"
    code = "upstream_error"

    def __init__(
        self,
        message: str,
        *,
        status: int = 502,
        retryable: bool = True,
        accepted: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable  # nothing was served: another deployment may be tried
        self.accepted = accepted  # the request may have reached the provider: it may bill it


class UpstreamIncomplete(UpstreamError):
    """A stream that ended without its terminal event (`data: [DONE]`, `message_stop`): the
    answer may be cut short, so it is not passed on as finished (nor logged `ok`)."""

    code = "upstream_incomplete"

    def __init__(self, message: str) -> None:
        super().__init__(message, accepted=True)  # after a 200: the provider took the call


class InternalError(GatewayError, RuntimeError):
    """A fault of the gateway's own (a bug): answered without its trace, nothing held for it."""

    status = 500
    kind = "api_error"
    code = "internal_error"


class AccountingUnavailable(GatewayError, BackendUnavailable):
    """The budget store cannot be reached: the gateway fails closed."""

    status = 503
    kind = "api_error"
    code = "accounting_unavailable"


class GatewayConfigError(KairosError, ValueError):
    """The gateway section of the configuration is wrong; the message names the setting."""
