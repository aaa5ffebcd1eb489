"""The blocking client against a live Baton, over TCP and the Unix socket."""

import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import pytest

import baton
from baton._types import duration as t_duration
from conftest import spawn_holder, wait_until


def test_lock_holds_then_releases_on_exit(server, transport, name):
    """A lock held in a with block is Baton's to see, and free the moment the block exits."""
    with baton.Baton.connect(server.addr(transport)) as client:
        with client.lock(name, ttl=2, owner="me") as lease:
            state = client.describe_lock(name)
            assert state.held and state.owner == "me"
            assert state.fencing_token == lease.fencing_token > 0
            assert lease.held and 0 < lease.remaining <= 2
        assert not client.describe_lock(name).held


def test_lease_renewals_outlive_the_ttl(server, name):
    """A lease kept by its stream stays held past several ttls and its expiry moves forward."""
    with baton.Baton.connect(server.tcp) as client:
        # A 1 s ttl renewed every third of it: wide enough for a loaded machine (0.3 s was not).
        with client.lock(name, ttl=1) as lease:
            first = lease.expires_at
            time.sleep(2.5)
            lease.check()
            assert lease.expires_at > first
            assert client.describe_lock(name).held


def test_try_lock_gives_none_when_taken(server, name):
    """try_lock does not wait: the block gets None while someone else holds the lock."""
    with baton.Baton.connect(server.tcp) as client:
        with client.lock(name):
            with client.try_lock(name) as lease:
                assert lease is None
            with pytest.raises(baton.NotAcquired):
                with client.lock(name, wait=0.2):
                    pass


def test_shared_locks_are_held_together(server, name):
    """Two shared holders hold the lock at once; an exclusive try then gets nothing."""
    with baton.Baton.connect(server.tcp) as client:
        with client.lock(name, shared=True) as a, client.lock(name, shared=True) as b:
            assert a.shared and b.shared
            assert client.describe_lock(name).shared_holders == 2
            with client.try_lock(name) as c:
                assert c is None


def test_semaphore_permits_stop_at_the_limit(server, transport, name):
    """Permits are granted up to the limit and the next request is refused until one is freed."""
    with baton.Baton.connect(server.addr(transport)) as client:
        with client.semaphore(name, limit=3, permits=2) as a:
            assert a.permits == 2
            with client.try_semaphore(name, limit=3, permits=2) as b:
                assert b is None
            assert client.describe_semaphore(name).permits_in_use == 2
        with client.try_semaphore(name, limit=3, permits=3) as c:
            assert c is not None and c.permits == 3


@pytest.mark.parametrize("mode", ["sync", "aio"])
def test_two_processes_take_turns(server, name, tmp_path, mode):
    """Two processes appending under one lock never interleave their start/end lines."""
    path = tmp_path / "log"
    procs = [spawn_holder(server.tcp, "append", name, str(path), mode) for _ in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
    lines = path.read_text().splitlines()
    assert len(lines) == 20
    for start, end in zip(lines[::2], lines[1::2]):
        assert start.startswith("start ") and end == "end " + start.split()[1], lines


@pytest.mark.parametrize("mode", ["sync", "aio"])
def test_killed_holder_frees_the_lock_at_once(server, name, mode):
    """A holder killed with SIGKILL frees its 30 s lock at once: its stream closed."""
    holder = spawn_holder(server.unix, "hold", name, mode)
    try:
        assert holder.stdout.readline().startswith("HELD"), holder.stderr.read()
        with baton.Baton.connect(server.tcp) as client:
            assert client.describe_lock(name).held
            os.kill(holder.pid, signal.SIGKILL)
            started = time.monotonic()
            with client.lock(name, wait=10):
                waited = time.monotonic() - started
        assert waited < 5, f"took {waited:.1f}s, the ttl is 30 s"
    finally:
        holder.kill()
        holder.wait()


def test_lost_lease_sets_lost_and_raises_on_exit(server, redis, name):
    """Keys deleted under a holder (data loss) make Baton report the lease lost: `lost` is set,
    check() raises, and leaving the block raises LeaseLost(NOT_HELD)."""
    with baton.Baton.connect(server.tcp) as client:
        with pytest.raises(baton.LeaseLost) as raised:
            with client.lock(name, ttl=3) as lease:
                seen = []
                lease.on_lost(lambda lost: seen.append(lost.lost_reason))
                assert redis.delete_keys(server.prefix + "{lock:" + name + "}")
                assert lease.lost.wait(5), "no lost event within 5 s"
                with pytest.raises(baton.LeaseLost):
                    lease.check()
        assert raised.value.reason == "NOT_HELD"
        assert seen == ["NOT_HELD"]


def test_frozen_baton_loses_the_lease_by_the_local_clock(own_server, name):
    """A Baton frozen with SIGSTOP sends nothing: the lease is lost when its expires_at passes
    on the local clock, not never."""
    with baton.Baton.connect(own_server.tcp) as client:
        with pytest.raises(baton.LeaseLost) as raised:
            with client.lock(name, ttl=1) as lease:
                own_server.freeze()
                frozen = time.monotonic()
                assert lease.lost.wait(5), "the lease outlived its expires_at"
                took = time.monotonic() - frozen
                assert not lease.held
        own_server.thaw()
    assert raised.value.reason == "EXPIRED"
    assert took <= 1.0 + 0.5, f"lost {took:.2f}s after the freeze, the ttl is 1 s"


def test_entering_a_frozen_baton_gives_up_after_the_wait_and_timeout(own_server, name):
    """Entering a lock while Baton is frozen does not wait for Baton forever: after the wait and
    the client's timeout it raises DeadlineExceeded (a TimeoutError), try_lock too."""
    with baton.Baton.connect(own_server.tcp, timeout=1.0) as client:
        own_server.freeze()
        try:
            waits = (lambda: client.lock(name, ttl=5, wait=0.5),
                     lambda: client.try_lock(name, ttl=5))
            for enter in waits:
                started = time.monotonic()
                with pytest.raises(baton.DeadlineExceeded):
                    with enter():
                        pass
                took = time.monotonic() - started
                # The wait (0.5 s or 0) and the 1 s timeout; a margin for a busy machine.
                assert took < 5, f"gave up after {took:.1f}s"
        finally:
            own_server.thaw()
        with client.lock(name, ttl=5, wait=5) as lease:
            assert lease.held


def test_a_held_entered_again_watches_its_new_lease(own_server, name):
    """The same lock object entered a second time is a new hold watched as the first was: a
    frozen Baton makes it lost at its expires_at, not only when the block ends."""
    with baton.Baton.connect(own_server.tcp) as client:
        held = client.lock(name, ttl=1)
        with held:
            pass
        with pytest.raises(baton.LeaseLost) as raised:
            with held as lease:
                own_server.freeze()
                frozen = time.monotonic()
                assert lease.lost.wait(5), "the second lease outlived its expires_at"
                took = time.monotonic() - frozen
        own_server.thaw()
    assert raised.value.reason == "EXPIRED"
    assert took <= 1.0 + 0.5, f"lost {took:.2f}s after the freeze, the ttl is 1 s"


def test_an_election_value_is_text_or_bytes(server, name):
    """A value of another type is refused, not turned into NUL bytes (bytes(42))."""
    with baton.Baton.connect(server.tcp) as client:
        with pytest.raises(TypeError):
            with client.campaign(name, value=42, ttl=2):
                pass


def test_acquire_release_with_tokens(server, transport, name):
    """acquire_lock/release_lock: a second acquisition fails while held; release frees it once."""
    with baton.Baton.connect(server.addr(transport)) as client:
        grant = client.acquire_lock(name, ttl=5)
        assert grant is not None and grant.fencing_token > 0
        assert client.acquire_lock(name, ttl=5) is None
        assert client.refresh_lock(grant, ttl=8) == pytest.approx(8, abs=0.1)
        assert client.release_lock(grant) is True
        assert client.release_lock(grant) is False
        permits = client.acquire_permits(name, limit=1, ttl=5)
        assert permits is not None and client.release_permits(permits)


def test_invalid_input_names_the_field(server, name):
    """A ttl Baton refuses raises InvalidArgument (a ValueError) naming the field."""
    with baton.Baton.connect(server.tcp) as client:
        with pytest.raises(baton.InvalidArgument) as raised:
            client.acquire_lock(name, ttl=0.005)
        assert raised.value.field == "ttl"
        assert isinstance(raised.value, ValueError)
        with pytest.raises(baton.InvalidArgument):
            with client.lock(name, ttl=0.05):
                pass


def test_unreachable_baton_raises_unavailable():
    """Nothing listening: calls raise Unavailable after their retries, quickly."""
    client = baton.Baton.connect("127.0.0.1:1")
    started = time.monotonic()
    with pytest.raises(baton.Unavailable):
        client.describe_lock("x")
    with pytest.raises(baton.Unavailable):
        with client.lock("x", wait=0):
            pass
    with pytest.raises(baton.Unavailable):
        with client.campaign("x", wait=0.3):
            pass
    assert time.monotonic() - started < 10
    client.close()


def test_rate_limit_check(server, name):
    """Checks are plain calls returning a decision; the limit denies the third of two."""
    with baton.Baton.connect(server.tcp) as client:
        answers = [client.rate_limit.check(name, limit=2, period=60) for _ in range(3)]
        assert [a.allowed for a in answers] == [True, True, False]
        assert answers[2].retry_after > 0 and answers[0].decided_by == "redis"


def test_autocomplete(server, transport, name):
    """Add, complete (Unicode-folded), recent lists: plain calls with dataclass results."""
    with baton.Baton.connect(server.addr(transport)) as client:
        added = client.autocomplete.add(name, ["Straße", ("Stroud", 5.0), baton.Term("Zoë")])
        assert added.added == 3 and added.term_count == 3
        page = client.autocomplete.complete(name, "STRA")
        assert [s.display for s in page.suggestions] == ["Straße"]
        assert page.suggestions[0].match == "prefix"
        assert client.autocomplete.size(name) == 3
        # Typos: "stre" is one substitution from "stra..." and "stro...", and "Zoë" is left out.
        page = client.autocomplete.complete(name, "stre", mode="fuzzy")
        assert [(s.display, s.match, s.edit_distance) for s in page.suggestions] == [
            ("Straße", "fuzzy", 1), ("Stroud", "fuzzy", 1)]
        assert not page.incomplete and page.next_page_token == ""
        page = client.autocomplete.complete(name, "stre", mode="fuzzy", order="score")
        assert [s.display for s in page.suggestions] == ["Stroud", "Straße"]
        assert client.autocomplete.complete(name, "stre", mode="fuzzy", max_edits=0).suggestions == []
        with pytest.raises(ValueError):
            client.autocomplete.complete(name, "stre", mode="fuzzy", max_edits=3)
        with pytest.raises(baton.InvalidArgument) as raised:
            client.autocomplete.complete(name, "stra", max_edits=1)
        assert raised.value.field == "max_edits"
        # Pages: the token of one page asks for the next.
        first = client.autocomplete.complete(name, "str", limit=1)
        assert [s.display for s in first.suggestions] == ["Straße"] and first.next_page_token
        second = client.autocomplete.complete(name, "str", limit=1, page_token=first.next_page_token)
        assert [s.display for s in second.suggestions] == ["Stroud"]
        assert client.autocomplete.remove(name, "Zoë") == 1
        client.autocomplete.record_recent(name, "alice")
        client.autocomplete.record_recent(name, "bob")
        assert [i.display for i in client.autocomplete.recent(name).items] == ["bob", "alice"]
        assert [i.display for i in client.autocomplete.complete_recent(name, "al").items] == ["alice"]


def test_autocomplete_features(server, name):
    """A dictionary declared with some features serves their modes and refuses the others; the
    default is every feature, and features added to a dictionary with terms are built in the
    background (served once built)."""
    with baton.Baton.connect(server.tcp) as client:
        assert client.autocomplete.features(name) == ["ranked", "words", "substring"]
        assert client.autocomplete.configure(name, ["words"]) == ["words"]
        client.autocomplete.add(name, ["Anna Smith", "Andy Smithson"])
        page = client.autocomplete.complete(name, "smi", mode="word_prefix")
        assert [s.display for s in page.suggestions] == ["Andy Smithson", "Anna Smith"]
        assert client.autocomplete.features(name) == ["words"]
        with pytest.raises(baton.FailedPrecondition, match="AUTOCOMPLETE_FEATURE_RANKED"):
            client.autocomplete.complete(name, "an", order="score")
        # RANKED added to a dictionary with terms is built in the background, served once built.
        assert client.autocomplete.configure(name, ["ranked", "words"]) in (
            ["words"],
            ["ranked", "words"],
        )
        with pytest.raises(ValueError):
            client.autocomplete.configure(name, ["fast"])


def test_stock_grpcio_reaches_the_unix_socket(server, name):
    """Stock grpcio over Baton's socket sends the socket path, percent-encoded, as :authority;
    Baton serves it all the same (several calls on one connection, a Hold stream included), and
    the package's own channel works too."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from baton.v1 import lock_pb2, lock_pb2_grpc

    stock = grpc.insecure_channel(server.unix)
    health = health_pb2_grpc.HealthStub(stock).Check(health_pb2.HealthCheckRequest(service=""),
                                                      timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    locks = lock_pb2_grpc.LockServiceStub(stock)
    hold = locks.Hold(lock_pb2.LockServiceHoldRequest(name=name, ttl=t_duration(5)), timeout=10)
    assert next(hold).WhichOneof("event") == "acquired"
    assert locks.Describe(lock_pb2.LockServiceDescribeRequest(name=name), timeout=5).held
    hold.cancel()
    stock.close()
    with baton.Baton.connect(server.unix) as client:
        wait_until("the lock freed by the closed stream",
                   lambda: not client.describe_lock(name).held, timeout=10)


def alive(pid):
    """Whether process `pid` runs (a zombie whose parent has not reaped it yet does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(") ", 1)[1][0]
    except FileNotFoundError:
        return False
    return state not in "ZX"


def test_run_stops_the_command_when_the_lease_is_lost(server, redis, name, tmp_path):
    """lease.run: the command gets the fencing token; a loss stops its whole process group (a
    grandchild included) and raises LeaseLost, well within the grace period."""
    with baton.Baton.connect(server.tcp) as client:
        with client.lock(name, ttl=5) as lease:
            done = lease.run([sys.executable, "-c", "import os; print(os.environ['BATON_FENCING_TOKEN'])"],
                             stdout=subprocess.PIPE, text=True)
            assert done.returncode == 0 and int(done.stdout) == lease.fencing_token
        gc = tmp_path / "gc"
        ready = tmp_path / "ready"
        script = f"sleep 600 & echo $! > {gc}; touch {ready}; wait"
        deleter = threading.Thread(target=lambda: (
            wait_until("the command to start", ready.exists),
            redis.delete_keys(server.prefix + "{lock:" + name + "}")), daemon=True)
        with pytest.raises(baton.LeaseLost):
            with client.lock(name, ttl=3) as lease:
                deleter.start()
                started = time.monotonic()
                with pytest.raises(baton.LeaseLost) as raised:
                    lease.run(["sh", "-c", script], grace=5)
                took = time.monotonic() - started
        assert raised.value.reason == "NOT_HELD"
        assert took < 5, f"run() returned {took:.1f}s after it started; SIGTERM ends sh and sleep"
        assert not alive(int(gc.read_text())), "the grandchild outlived the lease"


def test_run_kills_a_command_ignoring_sigterm_after_the_grace(server, redis, name, tmp_path):
    """lease.run: a command ignoring SIGTERM is killed once the grace period is over."""
    ready = tmp_path / "ready"
    with baton.Baton.connect(server.tcp) as client:
        with pytest.raises(baton.LeaseLost):
            with client.lock(name, ttl=3) as lease:
                threading.Thread(target=lambda: (
                    wait_until("the command to start", ready.exists),
                    redis.delete_keys(server.prefix + "{lock:" + name + "}")),
                    daemon=True).start()
                started = time.monotonic()
                with pytest.raises(baton.LeaseLost):
                    lease.run(["sh", "-c", f"trap '' TERM; touch {ready}; sleep 600"], grace=1)
                took = time.monotonic() - started
        assert 1 <= took < 10, f"{took:.1f}s"


def test_add_takes_a_single_term_as_one_term(server, name):
    """A lone string (or Term, or (display, score) tuple) is one term, as `remove` takes a lone
    display: "hello" is not five one-letter terms."""
    with baton.Baton.connect(server.tcp) as client:
        ac = client.autocomplete
        assert ac.add(name, "hello").term_count == 1
        assert ac.add(name, ("world", 2.0)).term_count == 2
        assert ac.add(name, baton.Term("zoë")).term_count == 3
        assert ac.add(name, ("alpha", "beta")).term_count == 5  # a tuple of terms is several
        assert [s.display for s in ac.complete(name, "h").suggestions] == ["hello"]
        assert ac.complete(name, "l").suggestions == []
        assert ac.remove(name, "hello") == 1
        with pytest.raises(TypeError, match="^terms: "):
            ac.add(name, b"bytes")
        with pytest.raises(TypeError, match="^terms: "):
            ac.add(name, [42])


def test_recent_arguments_of_the_wrong_kind_name_the_argument(server, name):
    """Bytes where displays are expected, and a mode of None, raise errors naming the argument."""
    with baton.Baton.connect(server.tcp) as client:
        ac = client.autocomplete
        ac.record_recent(name, "abc")
        with pytest.raises(TypeError, match="^displays: .*bytes"):
            ac.remove_recent(name, b"abc")
        with pytest.raises(TypeError, match="^displays: "):
            ac.remove_recent(name, ["abc", 1])
        with pytest.raises(ValueError, match="^mode: None is not one of prefix"):
            ac.complete_recent(name, "a", mode=None)
        with pytest.raises(ValueError, match="^order: 'bogus' is not one of"):
            ac.complete(name, "a", order="bogus")
        assert ac.remove_recent(name, "abc") == 1


def test_a_campaign_waiting_without_end_is_elected_later(server, name):
    """wait=inf waits as long as it takes (as for locks), without a timer thread failing."""
    failures = []
    hook = threading.excepthook
    threading.excepthook = lambda args: failures.append(args.exc_value)
    try:
        with baton.Baton.connect(server.tcp) as client:
            with client.campaign(name, wait=float("inf")) as first:
                elected = []

                def second():
                    with client.campaign(name, wait=float("inf")) as leadership:
                        elected.append(leadership.term)
                thread = threading.Thread(target=second)
                thread.start()
                wait_until("the second candidate to queue",
                           lambda: client.leader(name).candidates == 1)
                time.sleep(0.3)
                assert elected == []
            thread.join(10)
            assert elected and elected[0] > first.term
            with client.lock(name, wait=float("inf")) as lease:
                assert lease.held
    finally:
        threading.excepthook = hook
    assert failures == []


@pytest.mark.parametrize("kind", ["campaign", "lock", "semaphore"])
def test_a_nan_or_negative_wait_raises_naming_it(server, name, kind):
    """wait=nan or a negative wait is refused before anything is sent, not given up at once."""
    with baton.Baton.connect(server.tcp) as client:
        extra = {"limit": 1} if kind == "semaphore" else {}
        for wait in (float("nan"), -1):
            with pytest.raises(baton.InvalidArgument, match="^wait: ") as raised:
                with getattr(client, kind)(name, wait=wait, **extra):
                    pass
            assert raised.value.field == "wait" and isinstance(raised.value, ValueError)
        for wait in (float("nan"), -1, float("inf")):
            with pytest.raises(ValueError, match="^wait: "):
                client.acquire_lock(name, ttl=5, wait=wait)


def test_nan_and_infinite_times_raise_naming_the_argument(server, name):
    """NaN or infinite ttls and periods raise ValueError (InvalidArgument) naming the argument, as
    does an integer too large for a float (not OverflowError)."""
    with baton.Baton.connect(server.tcp) as client:
        for bad in (float("nan"), float("inf"), -1, 10 ** 400):
            for call in (lambda: client.campaign(name, ttl=bad),
                         lambda: client.lock(name, ttl=bad),
                         lambda: client.acquire_permits(name, limit=2, ttl=bad),
                         lambda: client.autocomplete.record_recent(name, "a", ttl=bad)):
                with pytest.raises(baton.InvalidArgument, match="^ttl: ") as raised:
                    call()
                assert raised.value.field == "ttl"
            with pytest.raises(baton.InvalidArgument, match="^period: ") as raised:
                client.rate_limit.check(name, limit=5, period=bad)
            assert raised.value.field == "period"
        with pytest.raises(TypeError, match="^period: "):
            client.rate_limit.check(name, limit=5, period="1")
        # Fractions of a millisecond are rounded up, as before.
        assert client.rate_limit.check(name, limit=5, period=1 / 3).allowed


def test_run_takes_the_arguments_of_subprocess_run(server, name, tmp_path):
    """lease.run takes subprocess.run's own arguments: capture_output, input, check and timeout
    (which kills the command's whole group), as well as Popen's."""
    script = "cat; echo $BATON_FENCING_TOKEN; echo oops >&2; exit 3"
    with baton.Baton.connect(server.tcp) as client:
        with client.lock(name, ttl=5) as lease:
            done = lease.run(["sh", "-c", script], capture_output=True, input=b"hi\n")
            assert done.returncode == 3
            assert done.stdout == f"hi\n{lease.fencing_token}\n".encode()
            assert done.stderr == b"oops\n"
            done = lease.run(["sh", "-c", script], input="x\n", stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True)
            assert done.stdout == f"x\n{lease.fencing_token}\n"
            with pytest.raises(subprocess.CalledProcessError) as failed:
                lease.run(["sh", "-c", script], input=b"", capture_output=True, check=True)
            assert failed.value.returncode == 3 and failed.value.stderr == b"oops\n"
            gc = tmp_path / "gc"
            started = time.monotonic()
            with pytest.raises(subprocess.TimeoutExpired) as late:
                lease.run(["sh", "-c", f"echo early; sleep 600 & echo $! > {gc}; wait"],
                          stdout=subprocess.PIPE, timeout=1)
            assert time.monotonic() - started < 30
            assert late.value.output == b"early\n"
            wait_until("the timed out command's group to be killed",
                       lambda: not alive(int(gc.read_text())))
            with pytest.raises(ValueError):
                lease.run(["true"], capture_output=True, stdout=subprocess.PIPE)
            with pytest.raises(TypeError, match="process group"):
                lease.run(["true"], start_new_session=True)
            assert lease.held


def test_one_lock_object_shared_by_threads_holds_one_at_a_time(server, name):
    """One `client.lock(...)` object entered by several threads at once, as a threading.Lock
    is shared: each entry is a hold of its own, never two inside together, each thread leaves
    its own, and nothing is held after. Semaphores and campaigns alike."""
    with baton.Baton.connect(server.tcp) as client:
        for kind, held in (("lock", client.lock(name, ttl=5, wait=60)),
                           ("semaphore", client.semaphore(name, limit=1, ttl=5, wait=60)),
                           ("election", client.campaign(name, ttl=5, wait=60))):
            mutex = threading.Lock()
            inside, most, errors, tokens = [0], [0], [], []

            def work():
                for _ in range(4):
                    try:
                        with held as lease:
                            assert held.lease is lease
                            with mutex:
                                inside[0] += 1
                                most[0] = max(most[0], inside[0])
                                tokens.append(lease.fencing_token)
                            time.sleep(0.01)
                            assert lease.held
                            with mutex:
                                inside[0] -= 1
                    except Exception as e:  # noqa: BLE001 - reported below
                        errors.append(repr(e))

            threads = [threading.Thread(target=work) for _ in range(6)]
            for th in threads:
                th.start()
            for th in threads:
                th.join(120)
            assert not any(th.is_alive() for th in threads), f"{kind}: a thread hangs"
            assert errors == [], f"{kind}: {errors[:3]}"
            assert most[0] == 1, f"{kind}: {most[0]} threads were inside at once"
            assert len(set(tokens)) == 24, f"{kind}: {len(set(tokens))} distinct holds of 24"
        assert not client.describe_lock(name).held
        assert client.describe_semaphore(name).permits_in_use == 0
        assert client.leader(name).leader is None


def test_a_client_closed_inside_a_block(server, name):
    """Closing the client inside a block: the block's own exception comes out of it (not a
    gRPC ValueError), a block ending normally raises LeaseLost(DISCONNECTED), Baton frees the
    lock, and every call afterwards raises ClientClosed."""
    class Mine(Exception):
        pass

    with baton.Baton.connect(server.tcp) as other:
        client = baton.Baton.connect(server.tcp)
        with pytest.raises(Mine):
            with client.lock(name, ttl=30):
                client.close()
                raise Mine()
        client = baton.Baton.connect(server.tcp)
        with pytest.raises(baton.LeaseLost) as raised:
            with client.lock(name, ttl=30, wait=20):
                client.close()
        assert raised.value.reason == "DISCONNECTED"
        for call in (lambda: client.describe_lock(name),
                     lambda: client.lock(name, ttl=2).__enter__(),
                     lambda: client.campaign(name).__enter__(),
                     lambda: client.acquire_lock(name, ttl=1),
                     lambda: client.rate_limit.check(name, limit=1, period=1),
                     lambda: client.observe(name)):
            with pytest.raises(baton.ClientClosed, match="the client is closed"):
                call()
        with other.lock(name, ttl=5, wait=20):
            pass


FORK_CHILD = """
import os, signal, sys, time, baton
client = baton.Baton.connect(sys.argv[1])
client.describe_lock(sys.argv[2])
with client.lock(sys.argv[2], ttl=2) as lease:
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)  # a hang ends the child; the parent sees no line for it
        for what, call in (("describe", lambda: client.describe_lock(sys.argv[2])),
                           ("try_lock", lambda: client.try_lock(sys.argv[2] + "-c").__enter__())):
            try:
                call()
                print(what, "returned", flush=True)
            except baton.UsedAfterFork as e:
                print(what, "UsedAfterFork", e, flush=True)
            except BaseException as e:
                print(what, "other", type(e).__name__, e, flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(2.5)  # past the ttl: the parent's lease is still renewed
    print("parent held", lease.held, flush=True)
print("after", client.describe_lock(sys.argv[2]).held, flush=True)
"""


def test_a_client_used_after_fork_raises_in_the_child(server, name):
    """A client used in a child process after fork() raises UsedAfterFork at once (a gRPC
    channel does not survive fork: the calls hung there), and the parent's lease is untouched."""
    out = subprocess.run([sys.executable, "-c", FORK_CHILD, server.tcp, name], text=True,
                         capture_output=True, timeout=90).stdout.splitlines()
    assert out[:2] == [
        "describe UsedAfterFork a client cannot be used in a child process after fork; "
        "connect a new one there",
        "try_lock UsedAfterFork a client cannot be used in a child process after fork; "
        "connect a new one there"], out
    assert out[2:] == ["parent held True", "after False"], out


def test_a_try_lock_object_entered_inside_itself(server, name):
    """A try_lock object entered again inside its own block gets None there, and leaving that
    inner block leaves the outer hold alone."""
    with baton.Baton.connect(server.tcp) as client:
        held = client.try_lock(name, ttl=5)
        with held as outer:
            with held as inner:
                assert inner is None and held.lease is outer
            assert outer.held and client.describe_lock(name).held
        assert not client.describe_lock(name).held
