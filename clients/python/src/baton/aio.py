"""The asyncio client: `async with client.lock(...) as lease:`, cancelled when the lease is lost.

    from baton.aio import Baton

    async with Baton.connect() as client:
        async with client.lock("orders", ttl=10) as lease:
            await process(lease.fencing_token)   # cancelled if the lease is lost
        async with client.campaign("scheduler", value="pod-a") as leadership:
            await schedule(leadership.term)      # once elected; cancelled if no longer leader
        async for state in client.observe("scheduler"):
            print(state.leader)

The block runs in the task that entered it; when the lease is lost (Baton says so, the stream
breaks, or `expires_at` passes on the local clock) that task is cancelled and the block exits
with `LeaseLost`; no cancellation is left pending once the block has exited (a loss that
`lease.check()` finds in the block's own task raises `LeaseLost` there). Cancelling the task from
outside releases the lease at once, also when the cancellation lands as the lease is granted.

One `Held` (what `client.lock(...)` returns) may be entered by several tasks at once, as an
`asyncio.Lock` is shared: each entry is a hold of its own, and a task leaves the one it entered
last. A closed client raises `ClientClosed`; a client used in a child process after `fork()`
raises `UsedAfterFork`.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Iterable, Optional, Sequence, Union

import grpc

from . import _types as t
from ._address import parse
from ._lease import Leadership, Lease
from ._security import aio_interceptors, token_source, tls_credentials
from ._sync import RETRIES, _Owned, retry_delay
from .errors import (BatonError, DeadlineExceeded, LeaseLost, NotAcquired, Unavailable,
                     from_rpc_error)
from .v1 import autocomplete_pb2 as ac_pb
from .v1 import autocomplete_pb2_grpc as ac_rpc
from .v1 import election_pb2 as el_pb
from .v1 import election_pb2_grpc as el_rpc
from .v1 import lock_pb2 as lock_pb
from .v1 import lock_pb2_grpc as lock_rpc
from .v1 import ratelimit_pb2_grpc as rl_rpc
from .v1 import semaphore_pb2 as sem_pb
from .v1 import semaphore_pb2_grpc as sem_rpc

__all__ = ["AsyncLeadership", "Baton", "Held", "Lease", "LeaseLost", "Observation"]


async def _first_message(call, timeout: Optional[float], give_back=None):
    """The stream's first message, or `asyncio.TimeoutError` after `timeout` seconds (None: no
    bound). Unlike `asyncio.wait_for` before Python 3.12, a cancellation that lands as the message
    arrives is raised, never swallowed for the message: `give_back(message)` (a coroutine
    function) is awaited first when the message had arrived, so that what it granted is given
    back before the cancellation goes on; the caller then closes the stream."""
    read = asyncio.ensure_future(call.read())
    try:
        done, _ = await asyncio.wait({read}, timeout=timeout)
    except BaseException:
        read.cancel()
        if (give_back is not None and read.done() and not read.cancelled()
                and read.exception() is None):
            await _despite_cancellation(give_back(read.result()))
        raise
    if not done:
        read.cancel()
        raise asyncio.TimeoutError
    return read.result()


async def _despite_cancellation(coro) -> None:
    """Awaits `coro` (bounded by its own timeout) in a task a cancellation of the caller does not
    stop; its failure is ignored. A second cancellation stops the wait, not the work."""
    task = asyncio.ensure_future(coro)
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    try:
        await asyncio.shield(task)
    except BaseException:  # noqa: BLE001 - best effort; the caller raises its own error
        pass


class Baton(_Owned):
    """An asyncio connection to Baton (see `baton.Baton` for `addr`, `timeout`, the API token
    and TLS arguments). Once closed, every call raises `ClientClosed`; in a child process after
    `fork()` every call raises `UsedAfterFork` (connect a new client there)."""

    def __init__(self, addr: Optional[str] = None, *, timeout: float = 10.0,
                 api_token: Optional[str] = None, api_token_file=None, tls_ca=None,
                 tls_cert=None, tls_key=None, tls_server_name: Optional[str] = None):
        target, options, https, unix = parse(addr)
        credentials, tls_options = tls_credentials(https, unix, tls_ca, tls_cert, tls_key,
                                                   tls_server_name)
        options = options + tls_options
        token = token_source(api_token, api_token_file)
        self.target, self.options, self.timeout = target, options, timeout
        self._pid = os.getpid()
        self._closed = False
        interceptors = aio_interceptors(token) if token is not None else None
        if credentials is None:
            self._channel = grpc.aio.insecure_channel(target, options=options,
                                                      interceptors=interceptors)
        else:
            self._channel = grpc.aio.secure_channel(target, credentials, options=options,
                                                    interceptors=interceptors)
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

    async def close(self) -> None:
        """Closes the channel; leases still held through it are released by Baton (their blocks
        see them lost, `DISCONNECTED`). Calls made afterwards raise `ClientClosed`."""
        self._closed = True
        if os.getpid() == self._pid:
            await self._channel.close()

    async def __aenter__(self) -> "Baton":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def lock(self, name: str, *, ttl: t.Seconds = 10, wait: Optional[t.Seconds] = None,
             owner: Optional[str] = None, fair: bool = False, shared: bool = False,
             cancel_on_lost: bool = True) -> "Held":
        """An async context manager holding the lock `name` (see `baton.Baton.lock`). With
        `cancel_on_lost` (the default) the block's task is cancelled when the lease is lost."""
        request = t.lock_hold_request(name, ttl, 0, owner, fair, shared)
        return Held(self, "lock", request, t.wait_seconds(wait), False, cancel_on_lost)

    def try_lock(self, name: str, *, ttl: t.Seconds = 10, owner: Optional[str] = None,
                 shared: bool = False, cancel_on_lost: bool = True) -> "Held":
        """Like `lock` without waiting: the block gets the lease, or None when the lock is taken."""
        request = t.lock_hold_request(name, ttl, 0, owner, False, shared)
        return Held(self, "lock", request, 0.0, True, cancel_on_lost)

    def semaphore(self, name: str, *, limit: int, permits: int = 1, ttl: t.Seconds = 10,
                  wait: Optional[t.Seconds] = None, owner: Optional[str] = None,
                  fair: bool = False, cancel_on_lost: bool = True) -> "Held":
        """An async context manager holding `permits` of the semaphore `name`."""
        request = t.semaphore_hold_request(name, limit, permits, ttl, 0, owner, fair)
        return Held(self, "semaphore", request, t.wait_seconds(wait), False, cancel_on_lost)

    def try_semaphore(self, name: str, *, limit: int, permits: int = 1, ttl: t.Seconds = 10,
                      owner: Optional[str] = None, cancel_on_lost: bool = True) -> "Held":
        """Like `semaphore` without waiting: the block gets the lease, or None."""
        request = t.semaphore_hold_request(name, limit, permits, ttl, 0, owner, False)
        return Held(self, "semaphore", request, 0.0, True, cancel_on_lost)

    def campaign(self, name: str, *, value: Union[str, bytes, None] = None, ttl: t.Seconds = 10,
                 wait: Optional[t.Seconds] = None, cancel_on_lost: bool = True) -> "Held":
        """An async context manager that joins the election `name` and runs its block once
        elected (see `baton.Baton.campaign`). The block gets an `AsyncLeadership`; with
        `cancel_on_lost` (the default) its task is cancelled when the leadership is lost, and the
        block exits with `LeaseLost`."""
        request = t.campaign_request(name, value, ttl)
        return Held(self, "election", request, t.wait_seconds(wait), False, cancel_on_lost)

    async def leader(self, name: str) -> t.ElectionState:
        """Who leads the election `name` now, and how many candidates wait (a snapshot)."""
        reply = await self._call(self._elections.Leader,
                                 el_pb.ElectionServiceLeaderRequest(name=name))
        return t.election_state(reply, with_candidates=True)

    def observe(self, name: str) -> "Observation":
        """The election's state now, then every change, as an async iterator of
        `ElectionState` (see `baton.Baton.observe`); `aclose()` it, or use `async with`."""
        self._usable()
        call = self._elections.Observe(el_pb.ElectionServiceObserveRequest(name=name))
        return Observation(call)

    async def _proclaim(self, name: str, token: str, value: Union[str, bytes, None]):
        request = el_pb.ElectionServiceProclaimRequest(name=name, token=token,
                                                       value=t.value_bytes(value))
        return await self._call(self._elections.Proclaim, request)

    async def acquire_lock(self, name: str, *, ttl: t.Seconds, wait: t.Seconds = 0,
                           owner: Optional[str] = None, fair: bool = False,
                           shared: bool = False) -> Optional[t.LockGrant]:
        """Takes a hold without a stream (see `baton.Baton.acquire_lock`); None if not acquired."""
        request = lock_pb.LockServiceAcquireRequest(
            name=name, ttl=t.duration(ttl, "ttl"), wait_timeout=t.duration(wait, "wait"),
            owner=owner or "", fair=fair,
            mode=lock_pb.LOCK_MODE_SHARED if shared else lock_pb.LOCK_MODE_EXCLUSIVE,
            idempotency_key=t.new_key())
        reply = await self._acquire(self._locks.Acquire, request, t.seconds(wait))
        return t.lock_grant(reply.lease) if reply.acquired else None

    async def release_lock(self, grant: t.LockGrant) -> bool:
        """Ends the hold; False when it had already expired or been released."""
        reply = await self._call(self._locks.Release, lock_pb.LockServiceReleaseRequest(
            name=grant.name, token=grant.token))
        return reply.was_held

    async def refresh_lock(self, grant: t.LockGrant, ttl: Optional[t.Seconds] = None) -> float:
        """Sets the hold's remaining ttl; raises `FailedPrecondition` when it is gone."""
        request = lock_pb.LockServiceRefreshRequest(name=grant.name, token=grant.token)
        if ttl is not None:
            request.ttl.CopyFrom(t.duration(ttl, "ttl"))
        return t.from_duration((await self._call(self._locks.Refresh, request)).remaining_ttl)

    async def describe_lock(self, name: str) -> t.LockState:
        """A snapshot of the lock `name`."""
        return t.lock_state(await self._call(self._locks.Describe,
                                             lock_pb.LockServiceDescribeRequest(name=name)))

    async def acquire_permits(self, name: str, *, limit: int, permits: int = 1, ttl: t.Seconds,
                              wait: t.Seconds = 0, owner: Optional[str] = None,
                              fair: bool = False) -> Optional[t.PermitGrant]:
        """Takes permits without a stream; None if not acquired."""
        request = sem_pb.SemaphoreServiceAcquireRequest(
            name=name, limit=limit, permits=permits, ttl=t.duration(ttl, "ttl"),
            wait_timeout=t.duration(wait, "wait"), owner=owner or "", fair=fair,
            idempotency_key=t.new_key())
        reply = await self._acquire(self._semaphores.Acquire, request, t.seconds(wait))
        return t.permit_grant(reply.permit) if reply.acquired else None

    async def release_permits(self, grant: t.PermitGrant) -> bool:
        """Gives the permits back; False when the lease had already expired."""
        reply = await self._call(self._semaphores.Release, sem_pb.SemaphoreServiceReleaseRequest(
            name=grant.name, token=grant.token))
        return reply.was_held

    async def describe_semaphore(self, name: str) -> t.SemaphoreState:
        """A snapshot of the semaphore `name`."""
        return t.semaphore_state(await self._call(
            self._semaphores.Describe, sem_pb.SemaphoreServiceDescribeRequest(name=name)))

    async def _call(self, method, request, timeout: Optional[float] = None):
        for attempt in range(1, RETRIES + 1):
            self._usable()
            try:
                return await method(request, timeout=timeout or self.timeout)
            except (grpc.RpcError, grpc.aio.UsageError) as e:
                err = self._failure(e)
                if not isinstance(err, Unavailable) or attempt == RETRIES:
                    raise err from None
                await asyncio.sleep(retry_delay(err))
        raise AssertionError("unreachable")

    async def _acquire(self, method, request, wait: float):
        timeout = wait + self.timeout
        for attempt in range(1, RETRIES + 1):
            self._usable()
            try:
                return await method(request, timeout=timeout)
            except (grpc.RpcError, grpc.aio.UsageError) as e:
                err = self._failure(e)
                if attempt == RETRIES or not isinstance(err, (Unavailable, DeadlineExceeded)):
                    raise err from None
                if isinstance(err, Unavailable):
                    await asyncio.sleep(retry_delay(err))
                request = t.with_wait(request, 0)
                timeout = self.timeout
        raise AssertionError("unreachable")

    async def _release(self, kind: str, grant) -> None:
        if kind == "election":
            return  # closing the Campaign stream resigns
        self._usable()
        if kind == "lock":
            request = lock_pb.LockServiceReleaseRequest(name=grant.name, token=grant.token)
            await self._locks.Release(request, timeout=self.timeout)
        else:
            request = sem_pb.SemaphoreServiceReleaseRequest(name=grant.name, token=grant.token)
            await self._semaphores.Release(request, timeout=self.timeout)

    async def _open_campaign(self, request, wait: Optional[float]):
        """Opens a Campaign stream and reads its first event: (call, elected), or raises
        `NotAcquired` when `wait` passes first (the stream is closed, taking the candidate out).
        `UNAVAILABLE` before the election is retried."""
        deadline = None if wait is None else time.monotonic() + wait
        failures = 0
        while True:
            self._usable()
            call = self._elections.Campaign(request)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                first = await _first_message(call, left)
            except asyncio.TimeoutError:
                call.cancel()
                raise NotAcquired(f"not elected in {request.name!r} within {wait:g}s") from None
            except (grpc.RpcError, grpc.aio.UsageError) as e:
                err: BatonError = self._failure(e)
            except BaseException:
                call.cancel()
                raise
            else:
                if first is not grpc.aio.EOF and first.WhichOneof("event") == "elected":
                    return call, first.elected
                err = Unavailable("the Campaign stream ended before its election")
            call.cancel()
            failures += 1
            # UNAVAILABLE (nothing joined) is retried within the wait, or RETRIES times without.
            over = failures >= RETRIES if deadline is None else time.monotonic() >= deadline
            if not isinstance(err, Unavailable) or over:
                raise err
            await asyncio.sleep(retry_delay(err))
            if deadline is not None and time.monotonic() >= deadline:
                raise err  # no time left to be elected in

    async def _open(self, kind: str, request, wait: Optional[float]):
        if kind == "election":
            return await self._open_campaign(request, wait)
        method = self._locks.Hold if kind == "lock" else self._semaphores.Hold
        deadline = None if wait is None else time.monotonic() + wait
        failures = 0
        while True:
            left = t.MAX_WAIT if deadline is None else max(0.0, deadline - time.monotonic())
            asked = min(left, t.MAX_WAIT)
            self._usable()
            call = method(t.with_wait(request, asked))

            async def give_back(first):
                # Cancelled as the grant arrived: released before the cancellation goes on, as
                # leaving a block does (closing the stream would release it a moment later).
                if first is not grpc.aio.EOF and first.WhichOneof("event") == "acquired":
                    await self._release(kind, first.acquired)
            try:
                # Baton answers by the end of the wait; a Baton that has not `timeout` seconds
                # after (frozen) is given up: closing the stream withdraws the request.
                first = await _first_message(call, asked + self.timeout, give_back)
            except asyncio.TimeoutError:
                call.cancel()
                raise DeadlineExceeded(
                    f"Baton did not answer the Hold of {kind} {request.name!r} within "
                    f"{asked + self.timeout:g}s (its wait and the client's timeout)",
                    grpc.StatusCode.DEADLINE_EXCEEDED) from None
            except (grpc.RpcError, grpc.aio.UsageError) as e:
                err: BatonError = self._failure(e)
            except BaseException:
                call.cancel()
                raise
            else:
                if first is grpc.aio.EOF:
                    call.cancel()
                    err = Unavailable("the Hold stream ended before its first event")
                elif first.WhichOneof("event") == "acquired":
                    return call, first.acquired
                else:
                    call.cancel()
                    if deadline is None or left > t.MAX_WAIT:
                        continue
                    missed = first.not_acquired
                    raise NotAcquired(
                        f"{kind} {request.name!r} not acquired within {wait:g}s",
                        t.optional_duration(missed, "holder_remaining_ttl")
                        if kind == "lock" else t.optional_duration(missed, "earliest_expiry"),
                        getattr(missed, "available", None))
            failures += 1
            over = deadline is None or time.monotonic() >= deadline
            if not isinstance(err, Unavailable) or (failures >= RETRIES and over):
                raise err
            await asyncio.sleep(retry_delay(err))


class AsyncLeadership(Leadership):
    """The leadership of an election in `baton.aio`: a `Leadership` whose `proclaim` is a
    coroutine."""

    async def proclaim(self, value: Union[str, bytes, None]) -> int:
        """Changes the value the others see (same term); returns the value's revision. Raises
        `FailedPrecondition` when the leadership has ended."""
        reply = await self._proclaim(value)
        self._proclaimed(value, reply)
        return reply.value_revision


class Observation:
    """The async iterator `Baton.observe` returns: `ElectionState`s until closed."""

    def __init__(self, call):
        self._call = call
        self._closed = False

    def __aiter__(self) -> "Observation":
        return self

    async def __anext__(self) -> t.ElectionState:
        try:
            state = await self._call.read()
        except asyncio.CancelledError:
            if self._closed:
                raise StopAsyncIteration from None
            raise
        except grpc.RpcError as e:
            if self._closed:
                raise StopAsyncIteration from None
            raise from_rpc_error(e) from None
        if state is grpc.aio.EOF:
            if self._closed:
                raise StopAsyncIteration
            raise Unavailable("the Observe stream ended")
        return t.election_state(state, with_candidates=False)

    async def aclose(self) -> None:
        """Ends the observation."""
        self._closed = True
        self._call.cancel()

    async def __aenter__(self) -> "Observation":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()


class _Entry:
    """One entry of a `Held`: its stream, grant and lease, the task that entered, the reader and
    expiry timer watching the lease, and whether the package cancelled the task."""

    def __init__(self, call, grant, lease: Lease, task: Optional[asyncio.Task]):
        self.call, self.grant, self.lease, self.task = call, grant, lease, task
        self.loop = asyncio.get_running_loop()
        self.reader: Optional[asyncio.Task] = None
        self.timer: Optional[asyncio.TimerHandle] = None
        self.cancelled_by_us = False
        self.closing = False


class Held:
    """The async context manager of `Baton.lock`, `Baton.semaphore` and `Baton.campaign`.

    Each entry is a hold of its own: the object may be entered again once its block is left,
    and by several tasks at once (as an `asyncio.Lock` is shared), each task then waiting for a
    hold of its own and leaving its own. Entries are kept per task: a task leaves the block it
    entered last."""

    def __init__(self, client: Baton, kind: str, request, wait: Optional[float], try_only: bool,
                 cancel_on_lost: bool):
        self._client, self._kind, self._request = client, kind, request
        self._wait, self._try, self._cancel_on_lost = wait, try_only, cancel_on_lost
        # Task -> the entries that task is inside of, innermost last.
        self._entries: dict = {}
        self._last: Optional[Lease] = None

    @property
    def lease(self) -> Optional[Lease]:
        """The lease of the current task's innermost entry; otherwise the last one granted
        (None before any)."""
        try:
            entries = self._entries.get(asyncio.current_task())
        except RuntimeError:  # no running loop
            entries = None
        return entries[-1].lease if entries and entries[-1] else self._last

    async def __aenter__(self) -> Optional[Lease]:
        try:
            call, grant = await self._client._open(self._kind, self._request, self._wait)
        except NotAcquired:
            if self._try:
                # A place on the task's stack all the same: its exit leaves nothing.
                self._entries.setdefault(asyncio.current_task(), []).append(None)
                return None
            raise
        if self._kind == "election":
            client, name, token = self._client, grant.name, grant.token
            lease: Lease = AsyncLeadership(grant, self._request.value, asyncio.Event(),
                                           lambda value: client._proclaim(name, token, value))
        else:
            lease = Lease(self._kind, grant, asyncio.Event())
        task = asyncio.current_task()
        entry = _Entry(call, grant, lease, task)
        self._entries.setdefault(task, []).append(entry)
        self._last = lease
        lease.on_lost(lambda _lease: self._on_lost(entry))
        entry.reader = entry.loop.create_task(self._read(entry))
        self._arm(entry)
        return lease

    def _pop(self) -> Optional[_Entry]:
        """The current task's innermost entry, taken off its stack (None for a try that found
        it taken). An entry made by another task (`__aenter__` awaited as a task of its own) is
        taken when it is the only one."""
        key = asyncio.current_task()
        entries = self._entries.get(key)
        if not entries:
            if len(self._entries) != 1:
                return None
            key, entries = next(iter(self._entries.items()))
            if len(entries) != 1:
                return None
        entry = entries.pop()
        if not entries:
            del self._entries[key]
        return entry

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        entry = self._pop()
        if entry is None:
            # try_lock found it taken (the block got None), or nothing was entered here.
            return False
        entry.closing = True
        if entry.timer is not None:
            entry.timer.cancel()
        lease = entry.lease
        if not self._client._leaving(lease, exc_type):
            return False
        # The loop may not have run the expiry timer in time (blocking work, a frozen process):
        # the lease expired inside the block all the same, and the block's end says so below.
        # It may still be held (its renewals only went unread): it is released all the same.
        expired = not lease.lost.is_set() and lease.remaining <= 0
        cancelled: Optional[asyncio.CancelledError] = None
        if not lease.lost.is_set():
            # Released before the block is left, so the next holder can go ahead; closing the
            # stream releases it too, a moment later. A cancellation from outside while the
            # release is under way is not swallowed: the stream is closed (which releases) and
            # the cancellation goes on once the stream is closed.
            try:
                await self._client._release(self._kind, entry.grant)
            except (grpc.RpcError, grpc.aio.UsageError, BatonError):
                pass
            except asyncio.CancelledError as e:
                cancelled = e
        entry.call.cancel()
        if entry.reader is not None:
            entry.reader.cancel()
        if expired:
            lease._lose("EXPIRED", "no renewal arrived before the lease's expires_at")
        if cancelled is not None:
            raise cancelled
        if entry.cancelled_by_us:
            if exc_type is None or not issubclass(exc_type, asyncio.CancelledError):
                # The cancellation the loss asked for may not have reached the block (it left
                # first, or turned it into another exception): taken here, so that none is left
                # pending for the task's next await. One from outside is counted, and goes on.
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    pass
            # The cancellation was ours (the lease was lost): turn it into LeaseLost, unless the
            # task was cancelled from outside too (in the same turn of the loop): that
            # cancellation goes on, never swallowed.
            uncancel = getattr(entry.task, "uncancel", None)
            if uncancel is not None and uncancel() > 0:
                if exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
                    return False
                raise asyncio.CancelledError()
            if exc_type is None or issubclass(exc_type, asyncio.CancelledError):
                raise lease.error() from None
            return False
        if exc_type is None and lease.lost.is_set():
            raise lease.error()
        return False

    def _arm(self, entry: _Entry) -> None:
        """(Re)schedules the local expiry check at the lease's `expires_at`."""
        if entry.timer is not None:
            entry.timer.cancel()
        entry.timer = entry.loop.call_later(max(0.0, entry.lease.remaining),
                                            self._expired, entry)

    def _expired(self, entry: _Entry) -> None:
        if entry.closing or entry.lease.lost.is_set():
            return
        if entry.lease.remaining > 0:  # a renewal moved it meanwhile
            self._arm(entry)
            return
        if entry.lease._lose("EXPIRED", "no renewal arrived before the lease's expires_at"):
            entry.call.cancel()

    def _on_lost(self, entry: _Entry) -> None:
        """The lease's loss callback: cancels the block's task (`cancel_on_lost`). Called in
        the loop's thread from another task or a callback, the task is cancelled at once. Called
        from the block's own task (`lease.check()` found the loss, and raises `LeaseLost`), or
        from another thread (`lease.run` through `asyncio.to_thread`), the cancellation is
        scheduled on the loop instead: a task cancelled while it runs keeps the cancellation
        pending past the block's end."""
        if entry.closing or not self._cancel_on_lost or entry.task is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        try:
            if running is not entry.loop:
                entry.loop.call_soon_threadsafe(self._cancel, entry)
            elif asyncio.current_task() is entry.task:
                entry.loop.call_soon(self._cancel, entry)
            else:
                self._cancel(entry)
        except RuntimeError:  # the loop is closed
            pass

    @staticmethod
    def _cancel(entry: _Entry) -> None:
        if entry.closing or entry.task.done():
            return
        entry.cancelled_by_us = True
        entry.task.cancel(msg="baton: lease lost")

    async def _read(self, entry: _Entry) -> None:
        lease, call = entry.lease, entry.call
        try:
            while True:
                # read(), not `async for`: grpc.aio does not allow mixing the two on one call.
                event = await call.read()
                if event is grpc.aio.EOF:
                    break
                kind = event.WhichOneof("event")
                if kind == "renewed":
                    lease._renewed(event.renewed.expires_at)
                    self._arm(entry)
                elif kind == "lost":
                    lease._lose(t.lost_reason(event.lost.reason), event.lost.message)
                    return
        except asyncio.CancelledError:
            return
        except (grpc.RpcError, grpc.aio.UsageError) as e:
            if not entry.closing:
                why = ("the client was closed" if self._client._closed else
                       f"the stream broke: {e.code().name}: {e.details()}"
                       if isinstance(e, grpc.RpcError) else f"the stream broke: {e}")
                lease._lose("DISCONNECTED", why)
            return
        except Exception as e:  # noqa: BLE001 - whatever stops the reader loses the lease
            if not entry.closing:
                lease._lose("DISCONNECTED", f"reading the stream failed: {e!r}")
            raise
        if not entry.closing:
            lease._lose("DISCONNECTED", "the stream ended without a lost event")


class RateLimits:
    """Rate limit checks (`client.rate_limit`)."""

    def __init__(self, client: Baton, stub):
        self._client, self._stub = client, stub

    async def check(self, key: str, *, limit: int, period: t.Seconds, cost: Optional[int] = None,
                    algorithm: str = "gcra", burst: int = 0) -> t.RateLimitDecision:
        """Counts `cost` against `limit` per `period` seconds on `key` (see `baton.Baton`)."""
        request = t.check_request(key, limit, period, cost, algorithm, burst)
        return t.decision(await self._client._call(self._stub.Check, request))


class Autocomplete:
    """Dictionaries and recent lists (`client.autocomplete`), as in `baton.Baton`."""

    def __init__(self, client: Baton, stub):
        self._client, self._stub = client, stub

    async def add(self, dictionary: str,
                  terms: Union[str, t.Term, tuple, Iterable[Union[str, t.Term, tuple]]],
                  request_id: Optional[str] = None) -> t.AddResult:
        """Adds or updates terms (one alone is one term); retries apply each entry once."""
        request = t.add_request(dictionary, terms, request_id)
        return t.add_result(await self._client._call(self._stub.Add, request))

    async def remove(self, dictionary: str, displays: Union[str, Sequence[str]]) -> int:
        """Removes terms by display text; returns how many were there."""
        request = ac_pb.AutocompleteServiceRemoveRequest(dictionary=dictionary,
                                                         displays=t.as_list(displays))
        return (await self._client._call(self._stub.Remove, request)).removed

    async def size(self, dictionary: str) -> int:
        """How many terms the dictionary has."""
        request = ac_pb.AutocompleteServiceDescribeRequest(dictionary=dictionary)
        return (await self._client._call(self._stub.Describe, request)).term_count

    async def configure(self, dictionary: str, features: Sequence[str]) -> list:
        """Declares the indexes the dictionary keeps, and so the modes it serves: any of "ranked"
        (score order), "words" (word prefix), "substring" (suffix, contains, automatic; needs
        "words"). Lexicographic prefix and fuzzy completion are always served; a dictionary that
        never called this has every feature. On a dictionary with terms, features added are built
        (and dropped ones deleted) in the background, each served once built
        (`FailedPrecondition` while a change to other features is under way). Returns the
        features it serves now."""
        request = t.configure_request(dictionary, features)
        return t.feature_names((await self._client._call(self._stub.Configure, request)).features)

    async def features(self, dictionary: str) -> list:
        """The dictionary's features (every one unless `configure` said otherwise)."""
        request = ac_pb.AutocompleteServiceDescribeRequest(dictionary=dictionary)
        return t.feature_names((await self._client._call(self._stub.Describe, request)).features)

    async def complete(self, dictionary: str, query: str, *, limit: int = 10,
                       mode: str = "prefix", order: str = "lexicographic",
                       page_token: str = "", max_edits: Optional[int] = None) -> t.Completions:
        """One page of terms matching `query` (as `baton.Baton`'s `complete`)."""
        request = t.complete_request(dictionary, query, limit, mode, order, page_token, max_edits)
        return t.completions(await self._client._call(self._stub.Complete, request))

    async def record_recent(self, list_name: str, display: str, *,
                            payload: Optional[bytes] = None, max_items: int = 0,
                            ttl: Optional[t.Seconds] = None) -> t.RecordResult:
        """Moves `display` to the front of the recent list."""
        request = t.record_request(list_name, display, payload, max_items, ttl)
        return t.record_result(await self._client._call(self._stub.RecordRecent, request))

    async def remove_recent(self, list_name: str, displays: Union[str, Sequence[str]]) -> int:
        """Removes items from a recent list."""
        request = ac_pb.AutocompleteServiceRemoveRecentRequest(list=list_name,
                                                               displays=t.as_list(displays))
        return (await self._client._call(self._stub.RemoveRecent, request)).removed

    async def recent(self, list_name: str, *, limit: int = 0,
                     page_token: str = "") -> t.RecentPage:
        """One page of the recent list, most recent first."""
        request = ac_pb.AutocompleteServiceListRecentRequest(list=list_name, limit=limit,
                                                             page_token=page_token)
        return t.recent_page(await self._client._call(self._stub.ListRecent, request))

    async def complete_recent(self, list_name: str, query: str, *, limit: int = 10,
                              mode: str = "prefix", page_token: str = "") -> t.RecentPage:
        """One page of the recent list's items matching `query`."""
        request = t.complete_recent_request(list_name, query, limit, mode, page_token)
        return t.recent_page(await self._client._call(self._stub.CompleteRecent, request))
