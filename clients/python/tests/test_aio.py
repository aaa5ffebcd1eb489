"""The asyncio client against a live Baton: cancellation, lost leases, the local expiry."""

import asyncio
import time

import pytest

import baton
import baton.aio


async def test_lock_holds_then_releases_on_exit(server, transport, name):
    """A lock held in an async with block is free the moment the block exits."""
    async with baton.aio.Baton.connect(server.addr(transport)) as client:
        async with client.lock(name, ttl=2) as lease:
            state = await client.describe_lock(name)
            assert state.held and state.fencing_token == lease.fencing_token
        assert not (await client.describe_lock(name)).held


async def test_cancelling_the_task_releases_at_once(server, name):
    """A task cancelled inside its lock block releases the lock at once (ttl 30 s)."""
    async with baton.aio.Baton.connect(server.tcp) as client:
        entered = asyncio.Event()

        async def work():
            async with client.lock(name, ttl=30):
                entered.set()
                await asyncio.sleep(600)

        task = asyncio.create_task(work())
        await asyncio.wait_for(entered.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        started = time.monotonic()
        async with client.lock(name, wait=10):
            waited = time.monotonic() - started
        assert waited < 5, f"took {waited:.1f}s, the ttl is 30 s"


async def test_cancelling_a_waiter_leaves_nothing_held(server, name):
    """A task cancelled while it waits for the lock leaves nothing held behind it."""
    async with baton.aio.Baton.connect(server.tcp) as client:
        async with client.lock(name, ttl=30):
            waiter = asyncio.create_task(client.lock(name, ttl=30).__aenter__())
            await asyncio.sleep(0.3)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
        assert not (await client.describe_lock(name)).held


async def test_lost_lease_cancels_the_block(server, redis, name):
    """Keys deleted under a holder: the block's work is cancelled and it exits with
    LeaseLost(NOT_HELD), never silently."""
    async with baton.aio.Baton.connect(server.unix) as client:
        reached_end = False
        with pytest.raises(baton.LeaseLost) as raised:
            async with client.lock(name, ttl=3):
                assert redis.delete_keys(server.prefix + "{lock:" + name + "}")
                await asyncio.sleep(10)
                reached_end = True
        assert raised.value.reason == "NOT_HELD"
        assert not reached_end


async def test_frozen_baton_cancels_the_block_by_the_local_clock(own_server, name):
    """A frozen Baton sends nothing: the block is cancelled when expires_at passes locally."""
    async with baton.aio.Baton.connect(own_server.tcp) as client:
        with pytest.raises(baton.LeaseLost) as raised:
            async with client.lock(name, ttl=1):
                own_server.freeze()
                frozen = time.monotonic()
                await asyncio.sleep(10)
        took = time.monotonic() - frozen
        own_server.thaw()
    assert raised.value.reason == "EXPIRED"
    assert took <= 1.5, f"lost {took:.2f}s after the freeze, the ttl is 1 s"


async def test_a_block_whose_loop_could_not_run_past_the_expiry_raises(own_server, name):
    """Blocking work inside the block while Baton is frozen: the loop cannot run the expiry
    timer, and the block ends while Baton is still frozen (no word from it can come), yet the
    end raises LeaseLost(EXPIRED) and sets `lost`, never leaving quietly; for locks and
    semaphores, cancelling on loss or not."""
    async with baton.aio.Baton.connect(own_server.tcp, timeout=1.0) as client:
        for held in (client.lock(name, ttl=1), client.semaphore(name, limit=1, ttl=1),
                     client.lock(name + "-flag", ttl=1, cancel_on_lost=False)):
            try:
                with pytest.raises(baton.LeaseLost) as raised:
                    async with held as lease:
                        own_server.freeze()
                        time.sleep(1.5)  # blocking work: the loop does not run meanwhile
            finally:
                own_server.thaw()
            assert raised.value.reason == "EXPIRED"
            assert lease.lost.is_set() and lease.lost_reason == "EXPIRED"


async def test_an_outside_cancellation_landing_with_the_loss_goes_on(own_server, name):
    """The task is cancelled from outside in the loop turn its lease is lost in (blocking work
    past the expiry): the cancellation goes on, it is not swallowed into LeaseLost."""
    async with baton.aio.Baton.connect(own_server.tcp) as client:
        async def worker():
            async with client.lock(name, ttl=1):
                loop.call_later(0.5, task.cancel)
                own_server.freeze()
                try:
                    time.sleep(1.5)  # the expiry and the cancellation come due together
                finally:
                    own_server.thaw()
                await asyncio.sleep(10)

        loop = asyncio.get_running_loop()
        task = asyncio.create_task(worker())
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        assert task.cancelled()


async def test_entering_a_frozen_baton_gives_up_after_the_wait_and_timeout(own_server, name):
    """Entering a lock while Baton is frozen raises DeadlineExceeded after the wait and the
    client's timeout, instead of waiting for Baton forever."""
    async with baton.aio.Baton.connect(own_server.tcp, timeout=1.0) as client:
        own_server.freeze()
        try:
            started = time.monotonic()
            with pytest.raises(baton.DeadlineExceeded):
                async with client.lock(name, ttl=5, wait=0.5):
                    pass
            took = time.monotonic() - started
        finally:
            own_server.thaw()
        assert took < 5, f"gave up after {took:.1f}s"
        async with client.lock(name, ttl=5, wait=5) as lease:
            assert lease.held


async def test_a_held_entered_again_watches_its_new_lease(own_server, name):
    """The same lock object entered a second time is cancelled when its new lease is lost."""
    async with baton.aio.Baton.connect(own_server.tcp) as client:
        held = client.lock(name, ttl=1)
        async with held:
            pass
        with pytest.raises(baton.LeaseLost) as raised:
            async with held:
                own_server.freeze()
                frozen = time.monotonic()
                await asyncio.sleep(10)
        took = time.monotonic() - frozen
        own_server.thaw()
    assert raised.value.reason == "EXPIRED"
    assert took <= 1.5, f"lost {took:.2f}s after the freeze, the ttl is 1 s"


async def test_without_cancel_on_lost_the_flag_is_set(server, redis, name):
    """cancel_on_lost=False leaves the work alone; lease.lost is set and exit raises."""
    async with baton.aio.Baton.connect(server.tcp) as client:
        with pytest.raises(baton.LeaseLost):
            async with client.lock(name, ttl=3, cancel_on_lost=False) as lease:
                redis.delete_keys(server.prefix + "{lock:" + name + "}")
                await asyncio.wait_for(lease.lost.wait(), 5)
                assert lease.lost_reason == "NOT_HELD"


async def test_semaphore_and_plain_calls(server, transport, name):
    """Semaphores, rate limits and autocomplete work the same through asyncio."""
    async with baton.aio.Baton.connect(server.addr(transport)) as client:
        async with client.semaphore(name, limit=1) as lease:
            assert lease.permits == 1
            async with client.try_semaphore(name, limit=1) as other:
                assert other is None
        decision = await client.rate_limit.check(name, limit=1, period=60)
        assert decision.allowed
        await client.autocomplete.add(name, ["alpha", "beta"])
        page = await client.autocomplete.complete(name, "al")
        assert [s.display for s in page.suggestions] == ["alpha"]
        page = await client.autocomplete.complete(name, "apl", mode="fuzzy", max_edits=1)
        assert [(s.display, s.match, s.edit_distance) for s in page.suggestions] == [
            ("alpha", "fuzzy", 1)]
        assert not page.incomplete
        with pytest.raises(baton.InvalidArgument) as raised:
            await client.acquire_permits(name, limit=0, ttl=1)
        assert raised.value.field == "limit"


async def test_cancel_during_the_release_is_not_swallowed(own_server, name):
    """A task cancelled from outside while its block releases the lock (Baton frozen, so the
    Release hangs) ends cancelled at once instead of finishing as if nothing happened, and the
    lock is freed by the closed stream once Baton runs again (ttl 30 s)."""
    async with baton.aio.Baton.connect(own_server.tcp) as client:
        frozen = asyncio.Event()
        finished = []

        async def work():
            async with client.lock(name, ttl=30, cancel_on_lost=False):
                own_server.freeze()
                frozen.set()
            # The block's exit is waiting on Release from here on; nothing below may run.
            finished.append(True)

        task = asyncio.create_task(work())
        try:
            # The task ran on from `frozen.set()` into the exit's Release before this resumed.
            await asyncio.wait_for(frozen.wait(), 10)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=5)
            assert done, "the cancelled task still waits for the Release"
            assert task.cancelled(), f"the cancellation was swallowed: {task!r}"
            assert not finished
        finally:
            own_server.thaw()
        started = time.monotonic()
        async with client.lock(name, ttl=5, wait=10):
            waited = time.monotonic() - started
        assert waited < 5, f"took {waited:.1f}s, the ttl is 30 s"


async def test_add_takes_a_single_term_and_arguments_are_checked(server, name):
    """As in the blocking client: a lone string is one term, bytes displays and a mode of None
    raise errors naming the argument, and waits and ttls are checked."""
    async with baton.aio.Baton.connect(server.tcp) as client:
        ac = client.autocomplete
        assert (await ac.add(name, "world")).term_count == 1
        assert [s.display for s in (await ac.complete(name, "w")).suggestions] == ["world"]
        assert (await ac.complete(name, "o")).suggestions == []
        with pytest.raises(TypeError, match="^displays: "):
            await ac.remove_recent(name, b"abc")
        with pytest.raises(ValueError, match="^mode: None"):
            await ac.complete_recent(name, "a", mode=None)
        for wait in (float("nan"), -1):
            with pytest.raises(baton.InvalidArgument, match="^wait: "):
                async with client.campaign(name, wait=wait):
                    pass
        with pytest.raises(baton.InvalidArgument, match="^ttl: "):
            client.campaign(name, ttl=float("nan"))
        with pytest.raises(baton.InvalidArgument, match="^period: "):
            await client.rate_limit.check(name, limit=1, period=float("inf"))
        async with client.campaign(name, wait=float("inf")) as leadership:
            assert leadership.term > 0


async def test_a_cancellation_landing_with_the_first_event_is_not_swallowed():
    """The first event of a Hold or Campaign stream and a cancellation of the waiting task that
    land together end the wait cancelled: `asyncio.wait_for` before Python 3.12 returned the
    event instead, so a task cancelled while it waited entered its block as the holder."""
    loop = asyncio.get_running_loop()

    class Stream:
        def __init__(self):
            self.message = loop.create_future()

        def read(self):
            return self.message

    for timeout in (None, 5.0):
        stream = Stream()
        task = asyncio.create_task(baton.aio._first_message(stream, timeout))
        await asyncio.sleep(0)  # the task waits for the first message
        # The message arrives, its wake-up runs, and the task is cancelled before it resumes:
        # the order in which a grant and a cancellation can meet.
        stream.message.set_result("acquired")
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert stream.message.done()


def _held(client, kind, name, ttl, **more):
    if kind == "lock":
        return client.lock(name, ttl=ttl, **more)
    if kind == "semaphore":
        return client.semaphore(name, limit=1, ttl=ttl, **more)
    return client.campaign(name, ttl=ttl, **more)


@pytest.mark.parametrize("kind", ["lock", "semaphore", "election"])
async def test_a_loss_found_by_check_leaves_no_cancellation_behind(server, name, kind):
    """Blocking work past the ttl, then lease.check() in the block raises LeaseLost(EXPIRED):
    the block exits with it, and the task carries no cancellation past the block (a stray
    CancelledError came at its next await)."""
    async with baton.aio.Baton.connect(server.tcp) as client:
        with pytest.raises(baton.LeaseLost) as raised:
            async with _held(client, kind, name, 1) as lease:
                time.sleep(1.6)  # blocking: the loop runs neither the reader nor the timer
                lease.check()
        assert raised.value.reason == "EXPIRED"
        task = asyncio.current_task()
        if hasattr(task, "cancelling"):
            assert task.cancelling() == 0
        await asyncio.sleep(0.05)  # raised CancelledError
        # The same found by lease.run in a thread: the block is cancelled, exits with
        # LeaseLost, and leaves nothing pending either.
        with pytest.raises(baton.LeaseLost):
            async with _held(client, kind, name, 1) as lease:
                time.sleep(1.6)
                await asyncio.to_thread(lease.run, ["true"])
        if hasattr(task, "cancelling"):
            assert task.cancelling() == 0
        await asyncio.sleep(0.05)


async def test_a_loss_found_by_check_and_caught_still_cancels_the_block(server, name):
    """A block that catches the LeaseLost of check() and goes on is cancelled at its next
    await, as a lost lease cancels the block, and exits with LeaseLost; nothing is left
    pending."""
    async with baton.aio.Baton.connect(server.tcp) as client:
        reached = False
        with pytest.raises(baton.LeaseLost):
            async with client.lock(name, ttl=1) as lease:
                time.sleep(1.6)
                with pytest.raises(baton.LeaseLost):
                    lease.check()
                await asyncio.sleep(10)
                reached = True
        assert not reached
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("kind", ["lock", "semaphore", "election"])
async def test_one_lock_object_shared_by_tasks_holds_one_at_a_time(server, name, kind):
    """One `client.lock(...)` object entered by several tasks at once, as an asyncio.Lock is
    shared: never two inside together, no entry's stream closed by another's exit, a loss
    cancels the task that held it, and nothing is held after."""
    async with baton.aio.Baton.connect(server.tcp) as client:
        held = _held(client, kind, name, 5, wait=60)
        inside, most, errors, tokens = [0], [0], [], []

        async def work():
            for _ in range(4):
                try:
                    async with held as lease:
                        assert held.lease is lease
                        inside[0] += 1
                        most[0] = max(most[0], inside[0])
                        tokens.append(lease.fencing_token)
                        await asyncio.sleep(0.01)
                        assert lease.held
                        inside[0] -= 1
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))

        await asyncio.wait_for(asyncio.gather(*(work() for _ in range(6))), 120)
        assert errors == []
        assert most[0] == 1, f"{most[0]} tasks were inside at once"
        assert len(set(tokens)) == 24
        if kind == "lock":
            assert not (await client.describe_lock(name)).held
        elif kind == "semaphore":
            assert (await client.describe_semaphore(name)).permits_in_use == 0
        else:
            assert (await client.leader(name)).leader is None


async def test_a_client_closed_inside_a_block(server, name):
    """Closing the client inside a block: the block's own exception comes out of it, a block
    ending normally raises LeaseLost(DISCONNECTED), and calls afterwards raise ClientClosed."""
    class Mine(Exception):
        pass

    async with baton.aio.Baton.connect(server.tcp) as other:
        client = baton.aio.Baton.connect(server.tcp)
        with pytest.raises(Mine):
            async with client.lock(name, ttl=30, cancel_on_lost=False):
                await client.close()
                raise Mine()
        client = baton.aio.Baton.connect(server.tcp)
        with pytest.raises(baton.LeaseLost) as raised:
            async with client.lock(name, ttl=30, wait=20, cancel_on_lost=False):
                await client.close()
        assert raised.value.reason == "DISCONNECTED"
        for call in (lambda: client.describe_lock(name),
                     lambda: client.lock(name, ttl=2).__aenter__(),
                     lambda: client.campaign(name).__aenter__(),
                     lambda: client.acquire_lock(name, ttl=1)):
            with pytest.raises(baton.ClientClosed, match="the client is closed"):
                await call()
        async with other.lock(name, ttl=5, wait=20):
            pass


async def test_a_task_cancelled_as_the_grant_arrives_releases_before_it_ends(server, name):
    """The grant arrives and the task is cancelled before it resumes (before its block
    starts): the lock is released before the task ends, not left to Baton's noticing the
    closed stream a moment later (ttl 30 s)."""
    async with baton.aio.Baton.connect(server.tcp) as client, \
            baton.aio.Baton.connect(server.tcp) as other:
        hold = client._locks.Hold
        waiting: list = []

        class Call:
            """The real Hold stream, whose first read cancels the waiting task as it returns."""

            def __init__(self, call):
                self._call, self._first = call, True

            async def read(self):
                event = await self._call.read()
                if self._first:
                    self._first = False
                    waiting[0].cancel()
                return event

            def cancel(self):
                return self._call.cancel()

        client._locks.Hold = lambda request, **kw: Call(hold(request, **kw))
        for _ in range(20):
            entered = []

            async def enter():
                async with client.lock(name, ttl=30, wait=5):
                    entered.append(True)

            waiting[:] = [asyncio.create_task(enter())]
            with pytest.raises(asyncio.CancelledError):
                await waiting[0]
            assert not entered
            async with other.try_lock(name, ttl=5) as lease:
                assert lease is not None, "the lock is still held after the task ended"


async def test_a_try_lock_object_entered_inside_itself(server, name):
    """As in the blocking client: the inner entry gets None and its exit leaves the outer hold
    alone."""
    async with baton.aio.Baton.connect(server.tcp) as client:
        held = client.try_lock(name, ttl=5)
        async with held as outer:
            async with held as inner:
                assert inner is None and held.lease is outer
            assert outer.held and (await client.describe_lock(name)).held
        assert not (await client.describe_lock(name)).held
