"""Plain results returned by the client, and conversions between them and the protobuf messages."""

from __future__ import annotations

import datetime
import math
import uuid
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Union

from google.protobuf.duration_pb2 import Duration

from .errors import InvalidArgument
from .v1 import autocomplete_pb2 as ac_pb
from .v1 import election_pb2 as el_pb
from .v1 import lease_pb2
from .v1 import lock_pb2 as lock_pb
from .v1 import ratelimit_pb2 as rl_pb
from .v1 import semaphore_pb2 as sem_pb

#: Seconds, as a number or a `datetime.timedelta`.
Seconds = Union[float, int, datetime.timedelta]

#: Baton's longest wait per call; longer waits are made of several.
MAX_WAIT = 3600.0


#: protobuf's longest Duration (10000 years), in seconds.
MAX_DURATION = 315_576_000_000.0

# Times are checked before anything is sent: NaN or infinity would otherwise fail deep in the
# conversion (or in a timer thread), and a negative one mean "at once". A number out of range
# raises `InvalidArgument` (a `ValueError`) whose `field` is the argument's name; a value that
# is not a number, `TypeError`.


def seconds(value: Optional[Seconds], what: str = "wait") -> Optional[float]:
    """`value` in seconds (None stays None): a number or a timedelta, not NaN nor negative."""
    if value is None:
        return None
    if isinstance(value, datetime.timedelta):
        s = value.total_seconds()
    elif isinstance(value, (str, bytes, bytearray, bool)):
        raise TypeError(f"{what}: seconds as a number or a timedelta, not {type(value).__name__}")
    else:
        try:
            s = float(value)
        except OverflowError:
            # An integer too large for a float: out of range, as infinity is.
            s = math.inf
        except (TypeError, ValueError):
            raise TypeError(f"{what}: seconds as a number or a timedelta, not "
                            f"{type(value).__name__}") from None
    if math.isnan(s) or s < 0:
        raise InvalidArgument(f"{what}: {value!r} is not a number of seconds from 0", field=what)
    return s


def wait_seconds(value: Optional[Seconds], what: str = "wait") -> Optional[float]:
    """The wait of a lock, semaphore or campaign in seconds: None (and infinity) wait as long as
    it takes, and stay None."""
    s = seconds(value, what)
    return None if s == math.inf else s


def duration(value: Seconds, what: str = "duration") -> Duration:
    """A protobuf Duration of `value` seconds (finite, from 0), rounded up to the millisecond."""
    s = seconds(value, what)
    if s > MAX_DURATION:
        raise InvalidArgument(f"{what}: {value!r} is not a finite number of seconds (at most "
                              f"{MAX_DURATION:.0f}, protobuf's longest duration)", field=what)
    ms = -(-int(round(s * 1_000_000)) // 1000)
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def from_duration(d: Duration) -> float:
    """A protobuf Duration in seconds."""
    return d.seconds + d.nanos / 1e9


def optional_duration(msg, name: str) -> Optional[float]:
    """The Duration field `name` of `msg` in seconds, or None when unset."""
    return from_duration(getattr(msg, name)) if msg.HasField(name) else None


def new_key() -> str:
    """A fresh idempotency key for one logical acquisition."""
    return str(uuid.uuid4())


def lost_reason(reason: int) -> str:
    """A `LeaseLostReason` without its prefix, e.g. `NOT_HELD`."""
    return lease_pb2.LeaseLostReason.Name(reason).replace("LEASE_LOST_REASON_", "")


@dataclass(frozen=True)
class LockGrant:
    """A hold obtained with `acquire_lock` (not kept alive): release or refresh it by its token."""

    name: str
    token: str
    fencing_token: int
    remaining: float
    expires_at: datetime.datetime
    hold_count: int
    owner: str
    shared: bool


@dataclass(frozen=True)
class PermitGrant:
    """Permits obtained with `acquire_permits` (not kept alive)."""

    name: str
    token: str
    fencing_token: int
    remaining: float
    expires_at: datetime.datetime
    permits: int
    limit: int
    owner: str


@dataclass(frozen=True)
class SharedHolder:
    """A shared lease as `describe_lock` shows it."""

    owner: str
    hold_count: int
    remaining: Optional[float]
    fencing_token: int


@dataclass(frozen=True)
class LockState:
    """A snapshot of one lock (`describe_lock`)."""

    held: bool
    mode: str  # "exclusive", "shared" or "" when free
    owner: str
    remaining: Optional[float]
    hold_count: int
    fencing_token: int
    waiters: int
    queued: int
    shared_holders: int
    earliest_shared_holder: Optional[SharedHolder]


@dataclass(frozen=True)
class SemaphoreHolder:
    """A permit lease as `describe_semaphore` shows it."""

    owner: str
    permits: int
    limit: int
    remaining: Optional[float]
    fencing_token: int


@dataclass(frozen=True)
class SemaphoreState:
    """A snapshot of one semaphore (`describe_semaphore`)."""

    limit: int
    permits_in_use: int
    holder_count: int
    holders: List[SemaphoreHolder]
    waiters: int
    fencing_token: int


@dataclass(frozen=True)
class RateLimitDecision:
    """The answer of a rate limit check."""

    allowed: bool
    limit: int
    remaining: int
    retry_after: float
    reset_after: float
    decided_by: str  # "redis", "fail_open" or "fail_closed"


@dataclass(frozen=True)
class Leader:
    """An election's leader as others see it."""

    term: int  # strictly increases with every new leader of the election
    value: bytes  # what it campaigned with, or proclaimed last
    value_revision: int  # changes of the value in this term (0 right after the election)
    remaining: Optional[float]  # seconds left on its lease when Redis answered (it is renewed)

    @property
    def text(self) -> str:
        """The value as text (invalid UTF-8 replaced)."""
        return self.value.decode("utf-8", "replace")


@dataclass(frozen=True)
class ElectionState:
    """Who leads an election (`leader`), or that nobody does (`leader` is None)."""

    leader: Optional[Leader]
    last_term: int  # the leader's term; when nobody leads, the last one issued (0: none)
    candidates: Optional[int]  # candidates waiting (`leader()` only; None from `observe()`)


@dataclass(frozen=True)
class Term:
    """A dictionary term to add: display text, optional score (added when `increment`), payload."""

    display: str
    score: Optional[float] = None
    increment: bool = False
    payload: Optional[bytes] = None


@dataclass(frozen=True)
class AddResult:
    """What an `add` did."""

    added: int
    updated: int
    scores: List[float]
    term_count: int


@dataclass(frozen=True)
class Suggestion:
    """One completion."""

    display: str
    score: float
    payload: bytes
    match: str  # "exact", "prefix", "word_prefix", "suffix", "contains" or "fuzzy"
    edit_distance: int = 0  # fuzzy mode: the fewest edits from a prefix of the term to the query


@dataclass(frozen=True)
class Completions:
    """One page of completions; pass `next_page_token` to get the next one ("" when none)."""

    suggestions: List[Suggestion]
    next_page_token: str
    # Fuzzy mode: Baton stopped at its fixed work budget, so more matches may exist.
    incomplete: bool = False


@dataclass(frozen=True)
class RecentItem:
    """One item of a recent list."""

    display: str
    payload: bytes
    recorded_at: datetime.datetime
    match: str  # "" outside complete_recent


@dataclass(frozen=True)
class RecentPage:
    """One page of a recent list."""

    items: List[RecentItem]
    next_page_token: str


@dataclass(frozen=True)
class RecordResult:
    """What `record_recent` did."""

    size: int
    evicted: int
    recorded_at: datetime.datetime


# --- requests -------------------------------------------------------------------------------

_MODES = {"prefix": 1, "word_prefix": 2, "suffix": 3, "contains": 4, "automatic": 5, "fuzzy": 6}
_ORDERS = {"lexicographic": 1, "score": 2}
_FEATURES = {"ranked": 1, "words": 2, "substring": 3}
_FEATURE_NAMES = {v: k for k, v in _FEATURES.items()}
_ALGORITHMS = {"gcra": 1, "fixed_window": 2, "sliding_window": 3}


def _enum(table, value: str, what: str) -> int:
    if isinstance(value, str) and value.lower() in table:
        return table[value.lower()]
    raise ValueError(f"{what}: {value!r} is not one of {', '.join(table)}")


def lock_hold_request(name, ttl, wait, owner, fair, shared) -> lock_pb.LockServiceHoldRequest:
    return lock_pb.LockServiceHoldRequest(
        name=name, ttl=duration(ttl, "ttl"), wait_timeout=duration(wait or 0, "wait"),
        owner=owner or "", fair=fair,
        mode=lock_pb.LOCK_MODE_SHARED if shared else lock_pb.LOCK_MODE_EXCLUSIVE)


def semaphore_hold_request(name, limit, permits, ttl, wait, owner, fair):
    return sem_pb.SemaphoreServiceHoldRequest(
        name=name, limit=limit, permits=permits, ttl=duration(ttl, "ttl"),
        wait_timeout=duration(wait or 0, "wait"), owner=owner or "", fair=fair)


def value_bytes(value: Union[str, bytes, None]) -> bytes:
    """An election value as bytes (text as UTF-8)."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    # bytes(42) would be 42 NUL bytes, not a value.
    raise TypeError(f"an election value is text or bytes, not {type(value).__name__}")


def campaign_request(name, value, ttl) -> el_pb.ElectionServiceCampaignRequest:
    return el_pb.ElectionServiceCampaignRequest(name=name, value=value_bytes(value),
                                                ttl=duration(ttl, "ttl"))


def with_wait(request, wait: float):
    """A copy of a Hold or Acquire request waiting `wait` seconds."""
    copy = type(request)()
    copy.CopyFrom(request)
    copy.wait_timeout.CopyFrom(duration(wait, "wait"))
    return copy


def check_request(key, limit, period, cost, algorithm, burst) -> rl_pb.RateLimitServiceCheckRequest:
    request = rl_pb.RateLimitServiceCheckRequest(
        key=key, limit=limit, period=duration(period, "period"),
        algorithm=_enum(_ALGORITHMS, algorithm, "algorithm"), burst=burst)
    if cost is not None:
        request.cost = cost
    return request


def _one_term(terms) -> bool:
    """Whether `terms` (an argument of `add`) is a single term rather than a collection: a
    string, a `Term`, or a (display, score...) tuple, whose second item is not a term."""
    if isinstance(terms, (str, Term)):
        return True
    return (isinstance(terms, tuple) and len(terms) >= 2 and isinstance(terms[0], str)
            and not isinstance(terms[1], (str, Term, tuple)))


def term(t: Union[str, Term, tuple]) -> ac_pb.AutocompleteTerm:
    if isinstance(t, str):
        t = Term(t)
    elif isinstance(t, tuple):
        t = Term(*t)
    elif not isinstance(t, Term):
        raise TypeError(f"terms: a term is a str, a Term or a (display, score) tuple, not "
                        f"{type(t).__name__}")
    msg = ac_pb.AutocompleteTerm(display=t.display, increment=t.increment)
    if t.score is not None:
        msg.score = t.score
    if t.payload is not None:
        msg.payload = t.payload
    return msg


def add_request(dictionary, terms: Iterable, request_id: Optional[str]):
    if _one_term(terms):
        terms = [terms]
    elif isinstance(terms, (bytes, bytearray, memoryview)):
        raise TypeError(f"terms: {type(terms).__name__} is not text: give str terms")
    return ac_pb.AutocompleteServiceAddRequest(
        dictionary=dictionary, terms=[term(t) for t in terms], request_id=request_id or new_key())


def complete_request(dictionary, query, limit, mode, order, page_token, max_edits=None):
    request = ac_pb.AutocompleteServiceCompleteRequest(
        dictionary=dictionary, query=query, limit=limit, mode=_enum(_MODES, mode, "mode"),
        order=_enum(_ORDERS, order, "order"), page_token=page_token)
    if max_edits is not None:
        if not 0 <= max_edits <= 2:
            raise ValueError(f"max_edits must be 0, 1 or 2, not {max_edits}")
        request.max_edits = max_edits
    return request


def configure_request(dictionary, features):
    return ac_pb.AutocompleteServiceConfigureRequest(
        dictionary=dictionary, features=[_enum(_FEATURES, f, "features") for f in features])


def feature_names(features) -> list:
    """Feature names ("ranked", "words", "substring") of a response's feature list."""
    return [_FEATURE_NAMES.get(f, str(f)) for f in features]


def record_request(list_name, display, payload, max_items, ttl):
    request = ac_pb.AutocompleteServiceRecordRecentRequest(
        list=list_name, display=display, max_items=max_items)
    if payload is not None:
        request.payload = payload
    if ttl is not None:
        request.ttl.CopyFrom(duration(ttl, "ttl"))
    return request


def complete_recent_request(list_name, query, limit, mode, page_token):
    return ac_pb.AutocompleteServiceCompleteRecentRequest(
        list=list_name, query=query, limit=limit, mode=_enum(_MODES, mode, "mode"),
        page_token=page_token)


# --- responses ------------------------------------------------------------------------------


def wall(ts) -> datetime.datetime:
    """A protobuf Timestamp as an aware UTC datetime."""
    return ts.ToDatetime(tzinfo=datetime.timezone.utc)


def lock_grant(lease: lock_pb.LockLease) -> LockGrant:
    return LockGrant(lease.name, lease.token, lease.fencing_token, from_duration(lease.remaining_ttl),
                     wall(lease.expires_at), lease.hold_count, lease.owner,
                     lease.mode == lock_pb.LOCK_MODE_SHARED)


def permit_grant(p: sem_pb.SemaphorePermit) -> PermitGrant:
    return PermitGrant(p.name, p.token, p.fencing_token, from_duration(p.remaining_ttl),
                       wall(p.expires_at), p.permits, p.limit, p.owner)


def lock_state(r: lock_pb.LockServiceDescribeResponse) -> LockState:
    mode = {lock_pb.LOCK_MODE_EXCLUSIVE: "exclusive", lock_pb.LOCK_MODE_SHARED: "shared"}.get(r.mode, "")
    earliest = None
    if r.HasField("earliest_shared_holder"):
        h = r.earliest_shared_holder
        earliest = SharedHolder(h.owner, h.hold_count, optional_duration(h, "remaining_ttl"),
                                h.fencing_token)
    return LockState(r.held, mode, r.owner, optional_duration(r, "remaining_ttl"), r.hold_count,
                     r.fencing_token, r.waiters, r.queued, r.shared_holders, earliest)


def semaphore_state(r: sem_pb.SemaphoreServiceDescribeResponse) -> SemaphoreState:
    holders = [SemaphoreHolder(h.owner, h.permits, h.limit, optional_duration(h, "remaining_ttl"),
                               h.fencing_token) for h in r.holders]
    return SemaphoreState(r.limit, r.permits_in_use, r.holder_count, holders, r.waiters,
                          r.fencing_token)


def leader(msg) -> Optional[Leader]:
    """The `leader` field of a Leader or Observe response, or None when unset."""
    if not msg.HasField("leader"):
        return None
    l = msg.leader
    return Leader(l.term, l.value, l.value_revision, optional_duration(l, "remaining_ttl"))


def election_state(r, with_candidates: bool) -> ElectionState:
    return ElectionState(leader(r), r.last_term, r.candidates if with_candidates else None)


def decision(r: rl_pb.RateLimitServiceCheckResponse) -> RateLimitDecision:
    decided = rl_pb.RateLimitDecidedBy.Name(r.decided_by).replace("RATE_LIMIT_DECIDED_BY_", "")
    return RateLimitDecision(r.allowed, r.limit, r.remaining, from_duration(r.retry_after),
                             from_duration(r.reset_after), decided.lower())


def _kind(kind: int) -> str:
    if kind == 0:
        return ""
    return ac_pb.AutocompleteMatchKind.Name(kind).replace("AUTOCOMPLETE_MATCH_KIND_", "").lower()


def completions(r) -> Completions:
    return Completions([Suggestion(s.display, s.score, s.payload, _kind(s.match_kind),
                                   s.edit_distance) for s in r.suggestions],
                       r.next_page_token, r.incomplete)


def recent_page(r) -> RecentPage:
    return RecentPage([RecentItem(i.display, i.payload, wall(i.recorded_at), _kind(i.match_kind))
                       for i in r.items], r.next_page_token)


def add_result(r) -> AddResult:
    return AddResult(r.added, r.updated, list(r.scores), r.term_count)


def record_result(r) -> RecordResult:
    return RecordResult(r.size, r.evicted, wall(r.recorded_at))


def as_list(values: Union[str, Sequence[str]], what: str = "displays") -> List[str]:
    """One display text or several, as a list; anything but text raises `TypeError`."""
    if isinstance(values, str):
        return [values]
    if isinstance(values, (bytes, bytearray, memoryview)):
        raise TypeError(f"{what}: a str or a sequence of str, not {type(values).__name__} "
                        "(decode it first)")
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"{what}: a str or a sequence of str, not "
                        f"{type(values).__name__}") from None
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"{what}: each display is a str, not {type(item).__name__}")
    return items
