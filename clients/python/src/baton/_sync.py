"""The blocking client: `Baton.connect()`, `with client.lock(...) as lease:`,
`with client.campaign(...) as leadership:` and plain calls."""

from __future__ import annotations

import os
import threading
import time
from typing import Iterable, Optional, Sequence, Union

import grpc

from . import _types as t
from ._address import parse
from ._lease import Leadership, Lease
from ._security import AuthInterceptor, token_source, tls_credentials
from .errors import (BatonError, ClientClosed, DeadlineExceeded, NotAcquired, Unavailable,
                     UsedAfterFork, from_rpc_error)
from .v1 import autocomplete_pb2 as ac_pb
from .v1 import autocomplete_pb2_grpc as ac_rpc
from .v1 import election_pb2 as el_pb
from .v1 import election_pb2_grpc as el_rpc
from .v1 import lock_pb2 as lock_pb
from .v1 import lock_pb2_grpc as lock_rpc
from .v1 import ratelimit_pb2_grpc as rl_rpc
from .v1 import semaphore_pb2 as sem_pb
from .v1 import semaphore_pb2_grpc as sem_rpc

#: Attempts of a call that fails `UNAVAILABLE` (Redis slow, Baton restarting) before giving up.
RETRIES = 4
#: Delay before retrying `UNAVAILABLE` when Baton suggested none (no connection), and the most.
DEFAULT_RETRY_DELAY = 0.1
MAX_RETRY_DELAY = 2.0


def retry_delay(err: Unavailable) -> float:
    """How long to wait before retrying after `err`: Baton's `RetryInfo`, bounded."""
    return min(err.retry_after if err.retry_after is not None else DEFAULT_RETRY_DELAY,
               MAX_RETRY_DELAY)


class _Owned:
    """What every call of a client (blocking or asyncio) checks of it: it belongs to the process
    that created it (`_pid`), until it is closed (`_closed`)."""

    _pid: int
    _closed: bool

    def _usable(self) -> None:
        """Raises `UsedAfterFork` in a child process after fork, `ClientClosed` once closed."""
        if os.getpid() != self._pid:
            raise UsedAfterFork()
        if self._closed:
            raise ClientClosed()

    def _failure(self, e: Exception) -> BatonError:
        """The error to raise for `e`, a call's failure: `ClientClosed` when the client was
        closed meanwhile (gRPC raises `ValueError`, `UsageError` or `CANCELLED` then)."""
        if os.getpid() != self._pid:
            return UsedAfterFork()
        if self._closed:
            return ClientClosed()
        if isinstance(e, grpc.RpcError):
            return from_rpc_error(e)
        raise e

    def _leaving(self, lease: Lease, exc_type) -> bool:
        """For a block's exit: whether to go on and release `lease`. Not in a child process after
        fork (the hold and its stream are the parent's, left alone; a block ending normally
        raises `UsedAfterFork`). A client closed inside the block ended the lease's stream
        (Baton releases the hold): the lease is lost (`DISCONNECTED`) first."""
        if os.getpid() != self._pid:
            if exc_type is None:
                raise UsedAfterFork()
            return False
        if self._closed:
            lease._lose("DISCONNECTED", "the client was closed while the lease was held")
        return True


class Baton(_Owned):
    """A connection to Baton. Cheap to share between threads; close it (or use `with`) when done.

    `addr`: `host:port`, `https://host:port` or `unix:///path`; `BATON_ADDR` or
    127.0.0.1:50051 when not given.
    `timeout`: the deadline of each plain call, in seconds (waits get theirs on top).
    `api_token`: Baton's API token, sent as `authorization: Bearer <token>` on every call;
    `api_token_file`: a file whose first non-empty line is the token, checked before each call
    and read again when it changed (a rotated Secret is used without reconnecting). Without
    either, the file `BATON_API_TOKEN_FILE` names, if set. A missing or empty file raises
    `ValueError` here.
    `tls_ca`: the CA bundle (PEM, a path or bytes) Baton's certificate must chain to: connects
    with TLS, as an `https://host:port` address does (checked against the system's roots
    without `tls_ca`). `tls_cert`, `tls_key`: a client certificate and its key for mutual TLS.
    `tls_server_name`: the name Baton's certificate must carry, in place of the address's
    host. TLS with a Unix socket address raises `ValueError`.

    Once closed, every call raises `ClientClosed`. A client belongs to the process that created
    it: gRPC channels do not survive `fork()`, so in a child process every call (and leaving a
    block entered in the parent) raises `UsedAfterFork`; connect a new client there."""

    def __init__(self, addr: Optional[str] = None, *, timeout: float = 10.0,
                 api_token: Optional[str] = None, api_token_file=None, tls_ca=None,
                 tls_cert=None, tls_key=None, tls_server_name: Optional[str] = None):
        target, options, https, unix = parse(addr)
        credentials, tls_options = tls_credentials(https, unix, tls_ca, tls_cert, tls_key,
                                                   tls_server_name)
        options = options + tls_options
        token = token_source(api_token, api_token_file)
        self.target = target
        self.options = options
        self.timeout = timeout
        self._pid = os.getpid()
        self._closed = False
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, credentials, options=options)
        if token is not None:
            self._channel = grpc.intercept_channel(self._channel, AuthInterceptor(token))
        self._locks = lock_rpc.LockServiceStub(self._channel)
        self._semaphores = sem_rpc.SemaphoreServiceStub(self._channel)
        self._elections = el_rpc.ElectionServiceStub(self._channel)
        #: Rate limit checks.
        self.rate_limit = RateLimits(self, rl_rpc.RateLimitServiceStub(self._channel))
        #: Dictionaries and recent lists.
        self.autocomplete = Autocomplete(self, ac_rpc.AutocompleteServiceStub(self._channel))

    @classmethod
    def connect(cls, addr: Optional[str] = None, *, timeout: float = 10.0,
                **security) -> "Baton":
        """A client for `addr` (see the class for `timeout` and the API token and TLS
        arguments); connects lazily on the first call."""
        return cls(addr, timeout=timeout, **security)

    def close(self) -> None:
        """Closes the channel; leases still held through it are released by Baton (their blocks
        see them lost, `DISCONNECTED`). Calls made afterwards raise `ClientClosed`. In a child
        process after `fork()` it only marks this copy closed: the channel is the parent's."""
        self._closed = True
        if os.getpid() == self._pid:
            self._channel.close()

    def __enter__(self) -> "Baton":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- leases kept alive by a Hold stream --

    def lock(self, name: str, *, ttl: t.Seconds = 10, wait: Optional[t.Seconds] = None,
             owner: Optional[str] = None, fair: bool = False, shared: bool = False) -> "Held":
        """A context manager holding the lock `name` while its block runs.

        Waits up to `wait` seconds (None or inf: as long as it takes) and raises `NotAcquired`
        if the lock stays taken (`DeadlineExceeded` when Baton has not answered `timeout`
        seconds after the wait: a frozen Baton). The lease (`ttl`, at least 0.1 s) is renewed
        in the background and released the moment the block exits; a lease lost meanwhile
        raises `LeaseLost` there. `shared`: a reader's lock; `owner`: re-enter (must be unique
        per holder); `fair`: FIFO. The context manager may be shared by threads as a
        `threading.Lock` is: each entry is a hold of its own (see `Held`)."""
        request = t.lock_hold_request(name, ttl, 0, owner, fair, shared)
        return Held(self, "lock", request, t.wait_seconds(wait), try_only=False)

    def try_lock(self, name: str, *, ttl: t.Seconds = 10, owner: Optional[str] = None,
                 shared: bool = False) -> "Held":
        """Like `lock` without waiting: the block gets the lease, or None when the lock is taken."""
        request = t.lock_hold_request(name, ttl, 0, owner, False, shared)
        return Held(self, "lock", request, 0.0, try_only=True)

    def semaphore(self, name: str, *, limit: int, permits: int = 1, ttl: t.Seconds = 10,
                  wait: Optional[t.Seconds] = None, owner: Optional[str] = None,
                  fair: bool = False) -> "Held":
        """A context manager holding `permits` of the semaphore `name` (at most `limit` in use)."""
        request = t.semaphore_hold_request(name, limit, permits, ttl, 0, owner, fair)
        return Held(self, "semaphore", request, t.wait_seconds(wait), try_only=False)

    def try_semaphore(self, name: str, *, limit: int, permits: int = 1, ttl: t.Seconds = 10,
                      owner: Optional[str] = None) -> "Held":
        """Like `semaphore` without waiting: the block gets the lease, or None."""
        request = t.semaphore_hold_request(name, limit, permits, ttl, 0, owner, False)
        return Held(self, "semaphore", request, 0.0, try_only=True)

    # -- leader election --

    def campaign(self, name: str, *, value: Union[str, bytes, None] = None, ttl: t.Seconds = 10,
                 wait: Optional[t.Seconds] = None) -> "Held":
        """A context manager that joins the election `name` and runs its block once elected,
        as the leader, publishing `value` (text or bytes, up to 4096 bytes).

        Candidates are elected one at a time, in the order they joined. Entering waits up to
        `wait` seconds (None or inf: as long as it takes) and raises `NotAcquired` if not
        elected by then. The block gets a `Leadership`: its `term` (a fencing token), `lost`,
        `check()`, `proclaim(value)`. The leadership (`ttl`, at least 0.1 s) is renewed in the
        background; leaving the block resigns at once and the next candidate is elected; a
        leadership lost meanwhile raises `LeaseLost` there."""
        request = t.campaign_request(name, value, ttl)
        return Held(self, "election", request, t.wait_seconds(wait), try_only=False)

    def leader(self, name: str) -> t.ElectionState:
        """Who leads the election `name` now (`leader` is None when nobody does), and how many
        candidates wait. A snapshot: it may be stale by the time it is read."""
        reply = self._call(self._elections.Leader, el_pb.ElectionServiceLeaderRequest(name=name))
        return t.election_state(reply, with_candidates=True)

    def observe(self, name: str) -> "Observation":
        """The election's state now, then every change (a new leader, a new value, no leader),
        as an iterator of `ElectionState` that blocks for the next change. Close it (or use
        `with`) when done. States come in order; a slow reader gets the newest one, never an
        older one after it. Raises `Unavailable` when Baton cannot follow the election any
        more (Redis unreachable, Baton shutting down): observe again."""
        self._usable()
        try:
            call = self._elections.Observe(el_pb.ElectionServiceObserveRequest(name=name))
        except ValueError as e:
            raise self._failure(e) from None
        return Observation(call)

    def _proclaim(self, name: str, token: str, value: Union[str, bytes, None]):
        request = el_pb.ElectionServiceProclaimRequest(name=name, token=token,
                                                       value=t.value_bytes(value))
        return self._call(self._elections.Proclaim, request)

    # -- leases without a stream (released or refreshed by token) --

    def acquire_lock(self, name: str, *, ttl: t.Seconds, wait: t.Seconds = 0,
                     owner: Optional[str] = None, fair: bool = False,
                     shared: bool = False) -> Optional[t.LockGrant]:
        """Takes a hold that lasts `ttl` unless refreshed or released; None if not acquired.

        A fresh idempotency key makes retries after `UNAVAILABLE` or a lost reply return the
        same hold rather than take a second one."""
        request = lock_pb.LockServiceAcquireRequest(
            name=name, ttl=t.duration(ttl, "ttl"), wait_timeout=t.duration(wait, "wait"),
            owner=owner or "", fair=fair,
            mode=lock_pb.LOCK_MODE_SHARED if shared else lock_pb.LOCK_MODE_EXCLUSIVE,
            idempotency_key=t.new_key())
        reply = self._acquire(self._locks.Acquire, request, t.seconds(wait))
        return t.lock_grant(reply.lease) if reply.acquired else None

    def release_lock(self, grant: t.LockGrant) -> bool:
        """Ends the hold; False when it had already expired or been released."""
        return self._call(self._locks.Release, lock_pb.LockServiceReleaseRequest(
            name=grant.name, token=grant.token)).was_held

    def refresh_lock(self, grant: t.LockGrant, ttl: Optional[t.Seconds] = None) -> float:
        """Sets the hold's remaining ttl (its acquisition ttl when None); returns it in seconds.
        Raises `FailedPrecondition` when the hold is gone."""
        request = lock_pb.LockServiceRefreshRequest(name=grant.name, token=grant.token)
        if ttl is not None:
            request.ttl.CopyFrom(t.duration(ttl, "ttl"))
        return t.from_duration(self._call(self._locks.Refresh, request).remaining_ttl)

    def describe_lock(self, name: str) -> t.LockState:
        """A snapshot of the lock `name`."""
        return t.lock_state(self._call(self._locks.Describe,
                                       lock_pb.LockServiceDescribeRequest(name=name)))

    def acquire_permits(self, name: str, *, limit: int, permits: int = 1, ttl: t.Seconds,
                        wait: t.Seconds = 0, owner: Optional[str] = None,
                        fair: bool = False) -> Optional[t.PermitGrant]:
        """Takes permits that last `ttl` unless refreshed or released; None if not acquired."""
        request = sem_pb.SemaphoreServiceAcquireRequest(
            name=name, limit=limit, permits=permits, ttl=t.duration(ttl, "ttl"),
            wait_timeout=t.duration(wait, "wait"), owner=owner or "", fair=fair,
            idempotency_key=t.new_key())
        reply = self._acquire(self._semaphores.Acquire, request, t.seconds(wait))
        return t.permit_grant(reply.permit) if reply.acquired else None

    def release_permits(self, grant: t.PermitGrant) -> bool:
        """Gives the permits back; False when the lease had already expired."""
        return self._call(self._semaphores.Release, sem_pb.SemaphoreServiceReleaseRequest(
            name=grant.name, token=grant.token)).was_held

    def describe_semaphore(self, name: str) -> t.SemaphoreState:
        """A snapshot of the semaphore `name`."""
        return t.semaphore_state(self._call(self._semaphores.Describe,
                                            sem_pb.SemaphoreServiceDescribeRequest(name=name)))

    # -- plumbing --

    def _call(self, method, request, timeout: Optional[float] = None):
        """One unary call, retried after `UNAVAILABLE` (safe: every call retried is idempotent)."""
        for attempt in range(1, RETRIES + 1):
            self._usable()
            try:
                return method(request, timeout=timeout or self.timeout)
            except (grpc.RpcError, ValueError) as e:
                err = self._failure(e)
                if not isinstance(err, Unavailable) or attempt == RETRIES:
                    raise err from None
                time.sleep(retry_delay(err))
        raise AssertionError("unreachable")

    def _acquire(self, method, request, wait: float):
        """An Acquire with an idempotency key: `UNAVAILABLE` and a deadline that passed (whose
        reply may be lost) are retried with the same key, which returns the same grant."""
        timeout = wait + self.timeout
        for attempt in range(1, RETRIES + 1):
            self._usable()
            try:
                return method(request, timeout=timeout)
            except (grpc.RpcError, ValueError) as e:
                err = self._failure(e)
                if attempt == RETRIES or not isinstance(err, (Unavailable, DeadlineExceeded)):
                    raise err from None
                if isinstance(err, Unavailable):
                    time.sleep(retry_delay(err))
                # The retry only looks up what the key was granted (or tries once more).
                request = t.with_wait(request, 0)
                timeout = self.timeout
        raise AssertionError("unreachable")

    def _release(self, kind: str, grant) -> None:
        if kind == "election":
            return  # closing the Campaign stream resigns
        self._usable()
        if kind == "lock":
            request = lock_pb.LockServiceReleaseRequest(name=grant.name, token=grant.token)
            self._locks.Release(request, timeout=self.timeout)
        else:
            request = sem_pb.SemaphoreServiceReleaseRequest(name=grant.name, token=grant.token)
            self._semaphores.Release(request, timeout=self.timeout)

    def _open_campaign(self, request, wait: Optional[float]):
        """Opens a Campaign stream and reads its first event: (call, elected), or raises
        `NotAcquired` when `wait` passes first (the stream is then closed, which takes the
        candidate out). `UNAVAILABLE` before the election is retried."""
        deadline = None if wait is None else time.monotonic() + wait
        failures = 0
        while True:
            self._usable()
            try:
                call = self._elections.Campaign(request)
            except ValueError as e:
                raise self._failure(e) from None
            guard = threading.Lock()
            state = {"elected": False, "gave_up": False}
            timer = None
            if deadline is not None:
                def give_up(call=call, state=state, guard=guard):
                    with guard:
                        if not state["elected"]:
                            state["gave_up"] = True
                            call.cancel()
                # A Timer's longest delay is threading.TIMEOUT_MAX (centuries): a longer wait
                # is cut to it rather than overflow in the timer's thread.
                left = min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX)
                timer = threading.Timer(left, give_up)
                timer.daemon = True
                timer.start()
            try:
                first = next(call)
            except StopIteration:
                err: BatonError = Unavailable("the Campaign stream ended before its first event")
            except grpc.RpcError as e:
                err = self._failure(e)
            except BaseException:
                call.cancel()
                raise
            else:
                with guard:
                    elected = not state["gave_up"] and first.WhichOneof("event") == "elected"
                    state["elected"] = elected
                if elected:
                    return call, first.elected
                call.cancel()
                err = BatonError("the Campaign stream did not start with an election")
            finally:
                if timer is not None:
                    timer.cancel()
            call.cancel()
            if state["gave_up"]:
                raise NotAcquired(f"not elected in {request.name!r} within {wait:g}s")
            failures += 1
            # UNAVAILABLE (nothing joined) is retried within the wait, or RETRIES times without.
            over = failures >= RETRIES if deadline is None else time.monotonic() >= deadline
            if not isinstance(err, Unavailable) or over:
                raise err
            time.sleep(retry_delay(err))
            if deadline is not None and time.monotonic() >= deadline:
                raise err  # no time left to be elected in

    def _open(self, kind: str, request, wait: Optional[float]):
        """Opens a Hold stream and reads its first event: (call, grant) once acquired, or raises
        `NotAcquired`. A wait longer than Baton's longest is made of several; `UNAVAILABLE`
        before the grant (nothing is held then) is retried. Baton answers by the end of the
        wait; when it has not `timeout` seconds after (a Baton frozen), the stream is closed
        (which gives up the request) and `DeadlineExceeded` raised."""
        if kind == "election":
            return self._open_campaign(request, wait)
        method = self._locks.Hold if kind == "lock" else self._semaphores.Hold
        deadline = None if wait is None else time.monotonic() + wait
        failures = 0
        while True:
            left = t.MAX_WAIT if deadline is None else max(0.0, deadline - time.monotonic())
            asked = min(left, t.MAX_WAIT)
            self._usable()
            try:
                call = method(t.with_wait(request, asked))
            except ValueError as e:
                raise self._failure(e) from None
            guard = threading.Lock()
            state = {"answered": False, "gave_up": False}

            def give_up(call=call, state=state, guard=guard):
                with guard:
                    if not state["answered"]:
                        state["gave_up"] = True
                        call.cancel()
            timer = threading.Timer(asked + self.timeout, give_up)
            timer.daemon = True
            timer.start()
            try:
                first = next(call)
            except StopIteration:
                call.cancel()
                err: BatonError = Unavailable("the Hold stream ended before its first event")
            except grpc.RpcError as e:
                err = self._failure(e)
            except BaseException:
                call.cancel()
                raise
            else:
                with guard:
                    state["answered"] = not state["gave_up"]
                if state["gave_up"]:
                    call.cancel()
                    err = Unavailable("the Hold stream was given up")
                elif first.WhichOneof("event") == "acquired":
                    return call, first.acquired
                call.cancel()
                if deadline is None or left > t.MAX_WAIT:
                    continue
                missed = first.not_acquired
                raise NotAcquired(
                    f"{kind} {request.name!r} not acquired within {wait:g}s",
                    t.optional_duration(missed, "holder_remaining_ttl")
                    if kind == "lock" else t.optional_duration(missed, "earliest_expiry"),
                    getattr(missed, "available", None))
            finally:
                timer.cancel()
            if state["gave_up"]:
                raise DeadlineExceeded(
                    f"Baton did not answer the Hold of {kind} {request.name!r} within "
                    f"{asked + self.timeout:g}s (its wait and the client's timeout)",
                    grpc.StatusCode.DEADLINE_EXCEEDED)
            failures += 1
            # Retried until the wait is over, and at least RETRIES times.
            over = deadline is None or time.monotonic() >= deadline
            if not isinstance(err, Unavailable) or (failures >= RETRIES and over):
                raise err
            time.sleep(retry_delay(err))


def new_lease(client, kind: str, grant, request, lost_event) -> Lease:
    """The `Lease` (a `Leadership` for an election) of a grant."""
    if kind != "election":
        return Lease(kind, grant, lost_event)
    return Leadership(grant, request.value, lost_event,
                      lambda value: client._proclaim(grant.name, grant.token, value))


class Observation:
    """The iterator `Baton.observe` returns: `ElectionState`s until closed."""

    def __init__(self, call):
        self._call = call
        self._closed = False

    def __iter__(self) -> "Observation":
        return self

    def __next__(self) -> t.ElectionState:
        try:
            return t.election_state(next(self._call), with_candidates=False)
        except StopIteration:
            if self._closed:
                raise
            raise Unavailable("the Observe stream ended") from None
        except grpc.RpcError as e:
            if self._closed:
                raise StopIteration from None
            raise from_rpc_error(e) from None

    def close(self) -> None:
        """Ends the observation (from any thread); a blocked iteration stops."""
        self._closed = True
        self._call.cancel()

    def __enter__(self) -> "Observation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Entry:
    """One entry of a `Held`: its stream, grant and lease, and the event set when its block is
    left."""

    def __init__(self, call, grant, lease: Lease):
        self.call, self.grant, self.lease = call, grant, lease
        self.closing = threading.Event()
        self.cond = threading.Condition()


class Held:
    """The context manager of `Baton.lock`, `Baton.semaphore` and `Baton.campaign` (see there).

    Each entry is a hold of its own, watched by threads of its own: the object may be entered
    again once its block is left, and entered by several threads at once (as a
    `threading.Lock` is shared), each thread then waiting for a hold of its own and leaving
    its own. Entries are kept per thread: a thread leaves the block it entered last."""

    def __init__(self, client: Baton, kind: str, request, wait: Optional[float], try_only: bool):
        self._client, self._kind, self._request = client, kind, request
        self._wait, self._try = wait, try_only
        self._mutex = threading.Lock()
        # Thread id -> the entries that thread is inside of, innermost last.
        self._entries: dict = {}
        self._last: Optional[Lease] = None

    @property
    def lease(self) -> Optional[Lease]:
        """The lease of the calling thread's innermost entry; otherwise the last one granted
        (None before any)."""
        with self._mutex:
            entries = self._entries.get(threading.get_ident())
            return entries[-1].lease if entries and entries[-1] else self._last

    def __enter__(self) -> Optional[Lease]:
        try:
            call, grant = self._client._open(self._kind, self._request, self._wait)
        except NotAcquired:
            if self._try:
                # A place on the thread's stack all the same: its exit leaves nothing.
                with self._mutex:
                    self._entries.setdefault(threading.get_ident(), []).append(None)
                return None
            raise
        lease = new_lease(self._client, self._kind, grant, self._request, threading.Event())
        entry = _Entry(call, grant, lease)
        with self._mutex:
            self._entries.setdefault(threading.get_ident(), []).append(entry)
            self._last = lease
        lease.on_lost(lambda _: self._wake(entry))
        threading.Thread(target=self._read, args=(entry,),
                         name=f"baton-{self._kind}-{grant.name}", daemon=True).start()
        threading.Thread(target=self._watch, args=(entry,),
                         name=f"baton-expiry-{grant.name}", daemon=True).start()
        return lease

    def __exit__(self, exc_type, exc, tb) -> bool:
        with self._mutex:
            entries = self._entries.get(threading.get_ident())
            if not entries:  # nothing was entered in this thread
                return False
            entry = entries.pop()
            if not entries:
                del self._entries[threading.get_ident()]
        if entry is None:  # try_lock found it taken: the block got None
            return False
        lease = entry.lease
        with entry.cond:
            entry.closing.set()
            entry.cond.notify_all()
        if not self._client._leaving(lease, exc_type):
            return False
        if not lease.lost.is_set():
            # Released before the block is left, so the next holder can go ahead; closing the
            # stream would release it too, a moment later.
            try:
                self._client._release(self._kind, entry.grant)
            except (grpc.RpcError, ValueError, BatonError):
                pass
        entry.call.cancel()
        if exc_type is None and lease.lost.is_set():
            raise lease.error()
        return False

    @staticmethod
    def _wake(entry: _Entry) -> None:
        with entry.cond:
            entry.cond.notify_all()

    def _read(self, entry: _Entry) -> None:
        call, lease, closing = entry.call, entry.lease, entry.closing
        try:
            for event in call:
                kind = event.WhichOneof("event")
                if kind == "renewed":
                    with entry.cond:
                        lease._renewed(event.renewed.expires_at)
                        entry.cond.notify_all()
                elif kind == "lost":
                    lease._lose(t.lost_reason(event.lost.reason), event.lost.message)
                    return
        except grpc.RpcError as e:
            if not closing.is_set():
                why = ("the client was closed" if self._client._closed
                       else f"the stream broke: {e.code().name}: {e.details()}")
                lease._lose("DISCONNECTED", why)
            return
        if not closing.is_set():
            lease._lose("DISCONNECTED", "the stream ended without a lost event")

    def _watch(self, entry: _Entry) -> None:
        call, lease, closing = entry.call, entry.lease, entry.closing
        with entry.cond:
            while not closing.is_set() and not lease.lost.is_set():
                left = lease.remaining
                if left <= 0:
                    break
                entry.cond.wait(left)
            if closing.is_set() or lease.lost.is_set():
                return
        if lease._lose("EXPIRED", "no renewal arrived before the lease's expires_at"):
            call.cancel()


class RateLimits:
    """Rate limit checks (`client.rate_limit`)."""

    def __init__(self, client: Baton, stub):
        self._client, self._stub = client, stub

    def check(self, key: str, *, limit: int, period: t.Seconds, cost: Optional[int] = None,
              algorithm: str = "gcra", burst: int = 0) -> t.RateLimitDecision:
        """Counts `cost` (default 1; 0 peeks) against `limit` per `period` seconds on `key`.
        `algorithm`: "gcra", "fixed_window" or "sliding_window"."""
        request = t.check_request(key, limit, period, cost, algorithm, burst)
        return t.decision(self._client._call(self._stub.Check, request))


class Autocomplete:
    """Dictionaries and recent lists (`client.autocomplete`)."""

    def __init__(self, client: Baton, stub):
        self._client, self._stub = client, stub

    def add(self, dictionary: str,
            terms: Union[str, t.Term, tuple, Iterable[Union[str, t.Term, tuple]]],
            request_id: Optional[str] = None) -> t.AddResult:
        """Adds or updates terms (strings, `Term`s or (display, score) tuples; one of them
        alone is one term, as a single display is for `remove`). A request id
        (made up when not given) makes the retries after `UNAVAILABLE` apply each entry once."""
        request = t.add_request(dictionary, terms, request_id)
        return t.add_result(self._client._call(self._stub.Add, request))

    def remove(self, dictionary: str, displays: Union[str, Sequence[str]]) -> int:
        """Removes terms by display text; returns how many were there."""
        request = ac_pb.AutocompleteServiceRemoveRequest(dictionary=dictionary,
                                                         displays=t.as_list(displays))
        return self._client._call(self._stub.Remove, request).removed

    def size(self, dictionary: str) -> int:
        """How many terms the dictionary has."""
        request = ac_pb.AutocompleteServiceDescribeRequest(dictionary=dictionary)
        return self._client._call(self._stub.Describe, request).term_count

    def configure(self, dictionary: str, features: Sequence[str]) -> list:
        """Declares the indexes the dictionary keeps, and so the modes it serves: any of "ranked"
        (score order), "words" (word prefix), "substring" (suffix, contains, automatic; needs
        "words"). Lexicographic prefix and fuzzy completion are always served; a dictionary that
        never called this has every feature. On a dictionary with terms, features added are built
        (and dropped ones deleted) in the background, each served once built
        (`FailedPrecondition` while a change to other features is under way). Returns the
        features it serves now."""
        request = t.configure_request(dictionary, features)
        return t.feature_names(self._client._call(self._stub.Configure, request).features)

    def features(self, dictionary: str) -> list:
        """The dictionary's features (every one unless `configure` said otherwise)."""
        request = ac_pb.AutocompleteServiceDescribeRequest(dictionary=dictionary)
        return t.feature_names(self._client._call(self._stub.Describe, request).features)

    def complete(self, dictionary: str, query: str, *, limit: int = 10, mode: str = "prefix",
                 order: str = "lexicographic", page_token: str = "",
                 max_edits: Optional[int] = None) -> t.Completions:
        """One page of terms matching `query`. `mode`: "prefix", "word_prefix", "suffix",
        "contains", "automatic" or "fuzzy" (typos: one page, `max_edits` 0 to 2 lowers the edits
        the query's length allows); `order`: "lexicographic" or "score"."""
        request = t.complete_request(dictionary, query, limit, mode, order, page_token, max_edits)
        return t.completions(self._client._call(self._stub.Complete, request))

    def record_recent(self, list_name: str, display: str, *, payload: Optional[bytes] = None,
                      max_items: int = 0, ttl: Optional[t.Seconds] = None) -> t.RecordResult:
        """Moves `display` to the front of the recent list, keeping at most `max_items`."""
        request = t.record_request(list_name, display, payload, max_items, ttl)
        return t.record_result(self._client._call(self._stub.RecordRecent, request))

    def remove_recent(self, list_name: str, displays: Union[str, Sequence[str]]) -> int:
        """Removes items from a recent list; returns how many were there."""
        request = ac_pb.AutocompleteServiceRemoveRecentRequest(list=list_name,
                                                               displays=t.as_list(displays))
        return self._client._call(self._stub.RemoveRecent, request).removed

    def recent(self, list_name: str, *, limit: int = 0, page_token: str = "") -> t.RecentPage:
        """One page of the recent list, most recent first."""
        request = ac_pb.AutocompleteServiceListRecentRequest(list=list_name, limit=limit,
                                                             page_token=page_token)
        return t.recent_page(self._client._call(self._stub.ListRecent, request))

    def complete_recent(self, list_name: str, query: str, *, limit: int = 10,
                        mode: str = "prefix", page_token: str = "") -> t.RecentPage:
        """One page of the recent list's items matching `query`, most recent first (every mode
        but "fuzzy", which is for dictionaries)."""
        request = t.complete_recent_request(list_name, query, limit, mode, page_token)
        return t.recent_page(self._client._call(self._stub.CompleteRecent, request))
