"""Baton's Python client: distributed locks, semaphores, leader election, rate limits and
autocomplete.

    import baton

    client = baton.Baton.connect()          # BATON_ADDR, or 127.0.0.1:50051; the API token
                                            # of BATON_API_TOKEN_FILE when it is set
    with client.lock("orders", ttl=10) as lease:
        write(fencing_token=lease.fencing_token)
        lease.check()                       # raises LeaseLost once the lease is gone
        lease.run(["./export.sh"])          # a command stopped when the lease is lost

    with client.campaign("scheduler", value="pod-a") as leadership:
        schedule(term=leadership.term)      # runs once elected

`baton.aio` has the same API for asyncio, where a lost lease cancels the block. The generated
stubs are in `baton.v1` (`baton.v1.lock_pb2_grpc`, ...).
"""

from ._address import DEFAULT_ADDR
from ._lease import Leadership, Lease
from ._sync import Autocomplete, Baton, Held, Observation, RateLimits
from ._types import (AddResult, Completions, ElectionState, Leader, LockGrant, LockState,
                     PermitGrant, RateLimitDecision, RecentItem, RecentPage, RecordResult,
                     SemaphoreHolder, SemaphoreState, SharedHolder, Suggestion, Term)
from .errors import (BatonError, ClientClosed, DeadlineExceeded, FailedPrecondition,
                     InvalidArgument, LeaseLost, NotAcquired, ResourceExhausted, Unauthenticated,
                     Unavailable, UsedAfterFork)

__all__ = [
    "DEFAULT_ADDR", "AddResult", "Autocomplete", "Baton", "BatonError", "ClientClosed",
    "Completions", "DeadlineExceeded", "ElectionState", "FailedPrecondition", "Held",
    "InvalidArgument", "Leader", "Leadership", "Lease", "LeaseLost", "LockGrant", "LockState",
    "NotAcquired", "Observation", "PermitGrant", "RateLimitDecision", "RateLimits",
    "RecentItem", "RecentPage", "RecordResult", "ResourceExhausted", "SemaphoreHolder",
    "SemaphoreState", "SharedHolder", "Suggestion", "Term", "Unauthenticated", "Unavailable",
    "UsedAfterFork",
]
