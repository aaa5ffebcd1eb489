"""The exceptions Baton's calls raise: a gRPC status mapped to a few clear classes.

Every class derives from `BatonError`, which keeps the gRPC code and message. Baton's error
details are decoded: the field an `InvalidArgument` names (`google.rpc.BadRequest`), the delay
an `Unavailable` suggests (`google.rpc.RetryInfo`), and the `google.rpc.ErrorInfo` of partial
autocomplete batches.
"""

from __future__ import annotations

from typing import Optional

import grpc
from google.rpc import error_details_pb2, status_pb2

_DETAILS_KEY = "grpc-status-details-bin"


class BatonError(Exception):
    """A call to Baton failed; `code` is the gRPC status code (None when no call was made)."""

    def __init__(self, message: str, code: Optional[grpc.StatusCode] = None):
        super().__init__(message)
        self.code = code
        self.message = message
        #: `google.rpc.ErrorInfo` reason and metadata, when Baton sent one.
        self.reason: Optional[str] = None
        self.metadata: dict = {}


class InvalidArgument(BatonError, ValueError):
    """A request field is missing, empty, too large or out of range; `field` names it."""

    def __init__(self, message: str, code=grpc.StatusCode.INVALID_ARGUMENT, field: str = ""):
        super().__init__(message, code)
        self.field = field


class Unavailable(BatonError):
    """Baton cannot be reached, or Redis did not answer in time. Nothing was acquired.

    `retry_after` is the delay Baton suggested (seconds), when it sent one."""

    def __init__(self, message: str, code=grpc.StatusCode.UNAVAILABLE,
                 retry_after: Optional[float] = None):
        super().__init__(message, code)
        self.retry_after = retry_after


class Unauthenticated(BatonError):
    """Baton refused the call's credentials: no API token or a wrong one (give `api_token`,
    `api_token_file` or `BATON_API_TOKEN_FILE`), or with mutual TLS no valid client
    certificate (`tls_cert`, `tls_key`). The message says which."""


class FailedPrecondition(BatonError):
    """The call cannot apply in the current state: a token that no longer holds, a refused
    upgrade from shared to exclusive, an idempotency key used for another acquisition."""


class DeadlineExceeded(BatonError, TimeoutError):
    """The call's deadline passed before Baton answered."""


class ResourceExhausted(BatonError):
    """A lease already has the most holds allowed."""


class NotAcquired(BatonError):
    """The lock or the permits stayed taken for the whole wait.

    `holder_remaining` is the remaining ttl (seconds) of what kept the caller out, when known;
    `available` the permits that were free (semaphores)."""

    def __init__(self, message: str, holder_remaining: Optional[float] = None,
                 available: Optional[int] = None):
        super().__init__(message, None)
        self.holder_remaining = holder_remaining
        self.available = available


class LeaseLost(BatonError):
    """The lease ended while it was held, or can no longer be vouched for: stop acting as holder.

    `reason` is Baton's `LeaseLostReason` without its prefix (`NOT_HELD`, `UNCONFIRMED`,
    `SHUTDOWN`, `CLIENT_UNRESPONSIVE`), or one of the client's own: `EXPIRED` (the lease's
    `expires_at` passed on the local clock with no newer renewal: Baton may be frozen or cut
    off) and `DISCONNECTED` (the stream broke before Baton said anything)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message, None)
        self.reason = reason


class ClientClosed(BatonError):
    """The client was closed (`close()`, or leaving its `with` block) before or during the call:
    connect a new one. A lease held through it ends with the channel (Baton releases it)."""

    def __init__(self, message: str = "the client is closed"):
        super().__init__(message, None)


class UsedAfterFork(BatonError):
    """The client was created in another process: a gRPC channel does not survive `fork()`, so
    a child process cannot use its parent's client (or leases); connect a new one there."""

    def __init__(self, message: str = "a client cannot be used in a child process after fork; "
                                      "connect a new one there"):
        super().__init__(message, None)


def _details(metadata) -> Optional[status_pb2.Status]:
    for key, value in metadata or ():
        if key == _DETAILS_KEY:
            try:
                return status_pb2.Status.FromString(value)
            except Exception:  # noqa: BLE001 - a malformed trailer only loses the details
                return None
    return None


def from_rpc_error(error: grpc.RpcError) -> BatonError:
    """The `BatonError` for a failed gRPC call (sync or asyncio)."""
    code = error.code()
    message = f"{code.name}: {error.details()}"
    status = _details(error.trailing_metadata())
    field, retry_after, info = "", None, None
    for detail in status.details if status else ():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            if bad.field_violations:
                field = bad.field_violations[0].field
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_after = retry.retry_delay.ToTimedelta().total_seconds()
        elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        err: BatonError = InvalidArgument(message, code, field)
    elif code == grpc.StatusCode.UNAVAILABLE:
        err = Unavailable(message, code, retry_after)
    elif code == grpc.StatusCode.UNAUTHENTICATED:
        err = Unauthenticated(message, code)
    elif code == grpc.StatusCode.FAILED_PRECONDITION:
        err = FailedPrecondition(message, code)
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        err = DeadlineExceeded(message, code)
    elif code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        err = ResourceExhausted(message, code)
    else:
        err = BatonError(message, code)
    if info is not None:
        err.reason = info.reason
        err.metadata = dict(info.metadata)
    return err
