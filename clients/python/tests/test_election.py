"""Leader election from the package, blocking and asyncio, against a live Baton."""

import asyncio
import queue
import threading
import time

import pytest

import baton
import baton.aio
from conftest import read_line, spawn_holder, wait_until


async def wait_until_async(what, read, done, timeout=15.0):
    """Awaits `read()` until `done(result)`; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = await read()
        if done(result):
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {result!r}"
        await asyncio.sleep(0.02)


def election_keys(server, name):
    return server.prefix + "{election:" + name + "}"


@pytest.mark.parametrize("mode", ["sync", "aio"])
def test_candidates_in_two_processes_take_turns(server, transport, name, mode):
    """The first candidate leads; the second waits (Leader counts it) and takes over with a
    higher term the moment the first resigns."""
    addr = server.addr(transport)
    first = spawn_holder(addr, "campaign", name, "pod-a", mode)
    second = None
    try:
        line = read_line(first)
        assert line.startswith("LEADER"), line + first.stderr.read()
        a_term = int(line.split()[1])
        with baton.Baton.connect(addr) as client:
            state = client.leader(name)
            assert state.leader is not None and state.leader.value == b"pod-a"
            assert state.leader.text == "pod-a" and state.leader.term == a_term
            second = spawn_holder(addr, "campaign", name, "pod-b", mode)
            wait_until("the second candidate to wait", lambda: client.leader(name).candidates == 1)
            first.stdin.write("resign\n")
            first.stdin.flush()
            started = time.monotonic()
            line = read_line(second)
            took = time.monotonic() - started
            assert line.startswith("LEADER"), line + second.stderr.read()
            assert int(line.split()[1]) > a_term
            assert took < 5, f"took over {took:.1f}s after the resignation (ttl 5 s)"
            state = client.leader(name)
            assert state.leader.value == b"pod-b" and state.candidates == 0
        assert first.wait(10) == 0, first.stderr.read()
    finally:
        for p in (first, second):
            if p is not None:
                p.kill()
                p.wait()


def test_leadership_block_and_proclaim(server, transport, name):
    """The block runs as leader with its term; proclaim changes the value others see; leaving
    the block resigns at once."""
    with baton.Baton.connect(server.addr(transport)) as client:
        assert client.leader(name).leader is None
        with client.campaign(name, value="pod-a", ttl=2) as leadership:
            assert isinstance(leadership, baton.Leadership)
            assert leadership.term == leadership.fencing_token > 0
            assert leadership.held and leadership.value == b"pod-a"
            assert leadership.proclaim(b"pod-a:8080") == 1
            state = client.leader(name)
            assert state.leader.value == b"pod-a:8080" and state.leader.value_revision == 1
            assert state.leader.term == leadership.term
        # Resigning is closing the stream: Baton sees it a moment later, long before the ttl.
        wait_until("the resignation", lambda: client.leader(name).leader is None, timeout=1.5)
        assert client.leader(name).last_term == leadership.term
        with pytest.raises(baton.FailedPrecondition):
            leadership.proclaim("late")


def test_wait_gives_up_when_someone_leads(server, name):
    """wait= bounds the campaign: NotAcquired after it, and the candidate left the queue."""
    with baton.Baton.connect(server.tcp) as client:
        with client.campaign(name, value="a"):
            started = time.monotonic()
            with pytest.raises(baton.NotAcquired):
                with client.campaign(name, value="b", wait=0.3):
                    pass
            assert time.monotonic() - started >= 0.3
            wait_until("the candidate to leave", lambda: client.leader(name).candidates == 0)


def test_lost_leadership_sets_lost_and_raises_on_exit(server, redis, name):
    """The election's key deleted under the leader (data loss): `lost` is set, check() raises,
    and the block's exit raises LeaseLost(NOT_HELD)."""
    with baton.Baton.connect(server.tcp) as client:
        with pytest.raises(baton.LeaseLost) as raised:
            with client.campaign(name, value="a", ttl=3) as leadership:
                assert redis.delete_keys(election_keys(server, name))
                assert leadership.lost.wait(5), "no lost event within 5 s"
                with pytest.raises(baton.LeaseLost):
                    leadership.check()
        assert raised.value.reason == "NOT_HELD"
        assert "leadership" in str(raised.value)


def test_observe_sees_each_leader(server, name):
    """An observer gets the current state (nobody), then each leader with its term, then
    nobody again after the resignation."""
    with baton.Baton.connect(server.unix) as client:
        states = queue.Queue()
        observation = client.observe(name)

        def follow():
            for state in observation:
                states.put(state)
            states.put(None)

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert states.get(timeout=10).leader is None
        terms = []
        for value in ("pod-a", "pod-b"):
            with client.campaign(name, value=value, ttl=2) as leadership:
                terms.append(leadership.term)
                state = states.get(timeout=10)
                assert (state.leader.value, state.leader.term) == (value.encode(), leadership.term)
                assert state.candidates is None
            state = states.get(timeout=10)
            assert state.leader is None and state.last_term == leadership.term
        assert terms[1] > terms[0]
        observation.close()
        assert states.get(timeout=10) is None, "close() ends the iteration"
        reader.join(10)


async def test_aio_campaign_observe_and_loss(server, redis, name):
    """asyncio: the observer sees the leader, proclaim is awaited, and a lost leadership cancels
    the block, which exits with LeaseLost."""
    async with baton.aio.Baton.connect(server.tcp) as client:
        observation = client.observe(name)
        assert (await asyncio.wait_for(observation.__anext__(), 10)).leader is None
        reached_end = False
        with pytest.raises(baton.LeaseLost) as raised:
            async with client.campaign(name, value="a", ttl=3) as leadership:
                seen = await asyncio.wait_for(observation.__anext__(), 10)
                assert seen.leader.term == leadership.term
                assert await leadership.proclaim("a2") == 1
                seen = await asyncio.wait_for(observation.__anext__(), 10)
                assert (seen.leader.value, seen.leader.value_revision) == (b"a2", 1)
                assert (await client.leader(name)).leader.value == b"a2"
                assert redis.delete_keys(election_keys(server, name))
                await asyncio.sleep(10)
                reached_end = True
        assert raised.value.reason == "NOT_HELD" and not reached_end
        await observation.aclose()
        with pytest.raises(StopAsyncIteration):
            await observation.__anext__()


async def test_aio_wait_and_cancellation(server, name):
    """asyncio: wait= gives NotAcquired; a task cancelled while it waits to be elected leaves
    the queue; one cancelled while leading resigns at once (ttl 30 s)."""
    async with baton.aio.Baton.connect(server.tcp) as client:
        entered = asyncio.Event()

        async def lead():
            async with client.campaign(name, value="a", ttl=30):
                entered.set()
                await asyncio.sleep(600)

        leader = asyncio.create_task(lead())
        await asyncio.wait_for(entered.wait(), 10)
        with pytest.raises(baton.NotAcquired):
            async with client.campaign(name, value="b", wait=0.3):
                pass
        waiter = asyncio.create_task(client.campaign(name, value="c").__aenter__())
        await wait_until_async("the candidate to wait",
                               lambda: client.leader(name), lambda s: s.candidates == 1)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        leader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leader
        started = time.monotonic()
        async with client.campaign(name, value="d", wait=10) as leadership:
            waited = time.monotonic() - started
            assert (await client.leader(name)).candidates == 0
        assert waited < 5, f"took {waited:.1f}s, the ttl is 30 s"
        assert leadership.value == b"d"
