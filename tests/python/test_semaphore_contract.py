"""The SemaphoreService contract, checked from Python through a client generated from proto/.

Run by scripts/python-tests.sh, which generates the client into BATON_PY_GEN and builds the
binary named by BATON_BIN. Each test class starts its own redis-server on a free port (no
persistence) and its own Baton process, and stops both by pid. The critical-section counter of
the limit-safety test is kept in the same Redis through a few lines of RESP over a socket, so no
Redis client library is needed.
"""

import os
import random
import shutil
import socket
import sys
import tempfile
import threading
import time
import unittest
import uuid

sys.path.insert(0, os.environ["BATON_PY_GEN"])
sys.path.insert(0, os.path.dirname(__file__))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (  # noqa: E402
    ProtoReflectionDescriptorDatabase,
)

from harness import Baton, Redis, ms, wait_until  # noqa: E402
from baton.v1 import lease_pb2  # noqa: E402
from baton.v1 import semaphore_pb2 as pb  # noqa: E402
from baton.v1 import semaphore_pb2_grpc as rpc  # noqa: E402


def peak_overlap(intervals):
    """The largest total weight of (start, end, weight) intervals in force at one instant."""
    events = []
    for start, end, weight in intervals:
        events.append((start, 0, weight))
        events.append((end, -1, -weight))
    # At equal times ends (-1) sort before starts (0): the intervals are half-open.
    events.sort(key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, _, delta in events:
        now += delta
        peak = max(peak, now)
    return peak


class Resp:
    """Just enough of the Redis protocol for INCRBY/DECRBY/GET on one connection."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.reader = self.sock.makefile("rb")

    def call(self, *args):
        parts = [f"*{len(args)}\r\n".encode()]
        for a in args:
            b = str(a).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(parts))
        line = self.reader.readline()
        if line.startswith(b":"):
            return int(line[1:])
        if line.startswith(b"$-1"):
            return None
        if line.startswith(b"$"):
            return self.reader.readline().rstrip(b"\r\n").decode()
        raise AssertionError(f"redis answered {line!r}")

    def close(self):
        self.reader.close()
        self.sock.close()


class SemaphoreContract(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="baton-py-")
        cls.redis = Redis(cls.dir)
        cls.baton = Baton(cls.redis.port, cls.dir)
        cls.sems = rpc.SemaphoreServiceStub(cls.baton.channel)

    @classmethod
    def tearDownClass(cls):
        cls.baton.stop()
        cls.redis.kill()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def name(self):
        return f"{self._testMethodName}-{uuid.uuid4().hex[:6]}"

    def acquire(self, name, limit, permits=1, ttl=5000, wait=0, fair=False, owner=""):
        return self.sems.Acquire(pb.SemaphoreServiceAcquireRequest(
            name=name, limit=limit, permits=permits, ttl=ms(ttl), wait_timeout=ms(wait),
            fair=fair, owner=owner))

    def release(self, name, token):
        return self.sems.Release(pb.SemaphoreServiceReleaseRequest(name=name, token=token)).was_held

    def describe(self, name):
        return self.sems.Describe(pb.SemaphoreServiceDescribeRequest(name=name))

    def test_acquire_release_and_describe(self):
        """A permit comes with a token, a fencing token, its weight, limit and ttl."""
        name = self.name()
        got = self.acquire(name, limit=3, permits=2, ttl=2000, owner="py")
        self.assertTrue(got.acquired)
        self.assertEqual(got.permit.permits, 2)
        self.assertEqual(got.permit.limit, 3)
        self.assertEqual(got.permit.owner, "py")
        self.assertGreater(got.permit.fencing_token, 0)
        self.assertEqual(got.permit.remaining_ttl.ToMilliseconds(), 2000)
        state = self.describe(name)
        self.assertEqual((state.limit, state.permits_in_use, state.holder_count), (3, 2, 1))
        self.assertEqual(state.holders[0].owner, "py")
        self.assertEqual(state.holders[0].fencing_token, got.permit.fencing_token)
        busy = self.acquire(name, limit=3, permits=2)
        self.assertFalse(busy.acquired)
        self.assertEqual(busy.available, 1)
        self.assertGreater(busy.earliest_expiry.ToMilliseconds(), 0)
        self.assertTrue(self.release(name, got.permit.token))
        self.assertFalse(self.release(name, got.permit.token), "a retried release is harmless")
        self.assertEqual(self.describe(name).permits_in_use, 0)
        with self.assertRaises(grpc.RpcError) as caught:
            self.sems.Refresh(pb.SemaphoreServiceRefreshRequest(name=name, token=got.permit.token))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

    def test_limit_safety_under_concurrency(self):
        """8 threads with random weights 1..3 never hold more than the limit of 5 together."""
        name = self.name()
        limit = 5
        counter = f"py-counter-{uuid.uuid4().hex}"
        intervals, fences, errors = [], [], []
        guard = threading.Lock()
        rng = random.Random()

        def worker(index, plan):
            redis = Resp(self.redis.port)
            try:
                for weight, hold in plan:
                    got = self.acquire(name, limit=limit, permits=weight, ttl=10_000,
                                       wait=30_000, fair=index % 2 == 0)
                    if not got.acquired:
                        errors.append(f"not acquired: {got}")
                        return
                    start = time.monotonic()
                    value = redis.call("INCRBY", counter, weight)
                    if value > limit:
                        errors.append(f"{value} permits in use")
                    time.sleep(hold)
                    redis.call("DECRBY", counter, weight)
                    end = time.monotonic()
                    with guard:
                        intervals.append((start, end, weight))
                        fences.append(got.permit.fencing_token)
                    if not self.release(name, got.permit.token):
                        errors.append("a permit expired while held")
            except Exception as e:  # noqa: BLE001 - reported by the main thread
                errors.append(repr(e))
            finally:
                redis.close()

        threads = []
        for i in range(8):
            plan = [(rng.randint(1, 3), rng.uniform(0, 0.01)) for _ in range(10)]
            threads.append(threading.Thread(target=worker, args=(i, plan)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        self.assertEqual(errors, [])
        self.assertEqual(len(intervals), 80)
        peak = peak_overlap(intervals)
        self.assertLessEqual(peak, limit)
        self.assertGreaterEqual(peak, 3, "the threads should have held several permits at once")
        self.assertEqual(len(set(fences)), 80, "fencing tokens never repeat")
        state = self.describe(name)
        self.assertEqual((state.permits_in_use, state.waiters), (0, 0))
        redis = Resp(self.redis.port)
        self.assertEqual(redis.call("GET", counter), "0")
        redis.close()

    def test_fair_waiters_in_arrival_order(self):
        """Fair waiters, each queued before the next arrives, are granted in arrival order."""
        name = self.name()
        holder = self.acquire(name, limit=1, ttl=30_000)
        results = {}

        def waiter(i):
            got = self.acquire(name, limit=1, ttl=30_000, wait=10_000, fair=True)
            results[i] = got.permit.fencing_token if got.acquired else None
            if got.acquired:
                self.release(name, got.permit.token)

        threads = []
        for i in range(4):
            t = threading.Thread(target=waiter, args=(i,))
            t.start()
            threads.append(t)
            wait_until(f"waiter {i} to queue", lambda n=i + 1: self.describe(name).waiters == n)
        self.assertTrue(self.release(name, holder.permit.token))
        for t in threads:
            t.join(timeout=10)
        self.assertNotIn(None, results.values())
        order = sorted(results, key=results.get)
        self.assertEqual(order, [0, 1, 2, 3])

    def test_weighted_fair_request_not_starved(self):
        """A fair request for every permit is not overtaken by small fair ones arriving later."""
        name = self.name()
        h1 = self.acquire(name, limit=3, ttl=30_000)
        h2 = self.acquire(name, limit=3, ttl=30_000)
        fences = {}

        def request(key, permits):
            got = self.acquire(name, limit=3, permits=permits, ttl=30_000, wait=10_000, fair=True)
            fences[key] = got.permit.fencing_token if got.acquired else None
            if got.acquired:
                time.sleep(0.005)
                self.release(name, got.permit.token)

        big = threading.Thread(target=request, args=("big", 3))
        big.start()
        wait_until("the big request to queue", lambda: self.describe(name).waiters == 1)
        smalls = []
        for i in range(5):
            t = threading.Thread(target=request, args=(i, 1))
            t.start()
            smalls.append(t)
            time.sleep(0.01)
            self.assertEqual(self.describe(name).permits_in_use, 2, "a small request barged")
        wait_until("the small requests to queue", lambda: self.describe(name).waiters == 6)
        self.release(name, h1.permit.token)
        self.release(name, h2.permit.token)
        for t in [big] + smalls:
            t.join(timeout=10)
        self.assertNotIn(None, fences.values())
        for i in range(5):
            self.assertGreater(fences[i], fences["big"])

    def test_strictest_limit_wins(self):
        """Beside a limit-2 holder a limit-5 request fits only under 2; then limit 5 applies."""
        name = self.name()
        strict = self.acquire(name, limit=2)
        self.assertEqual(self.acquire(name, limit=5).permit.limit, 2)
        self.assertFalse(self.acquire(name, limit=5).acquired)
        self.assertTrue(self.release(name, strict.permit.token))
        got = self.acquire(name, limit=5, permits=3)
        self.assertTrue(got.acquired)
        self.assertEqual(got.permit.limit, 5)
        self.assertEqual(self.describe(name).permits_in_use, 4)

    def test_invalid_arguments_name_the_field(self):
        """Bad input fails with INVALID_ARGUMENT and a message starting with the field name."""
        def req(**kw):
            fields = dict(name="x", limit=3, permits=1, ttl=ms(1000))
            fields.update(kw)
            return pb.SemaphoreServiceAcquireRequest(**fields)

        cases = [
            (req(name=""), "name:"),
            (req(name="x" * 1025), "name:"),
            (req(limit=0), "limit:"),
            (req(limit=10_001), "limit:"),
            (req(permits=0), "permits:"),
            (req(permits=4), "permits:"),
            (pb.SemaphoreServiceAcquireRequest(name="x", limit=3, permits=1), "ttl:"),
            (req(ttl=ms(5)), "ttl:"),
            (req(wait_timeout=ms(7_200_000)), "wait_timeout:"),
            (req(owner="o" * 257), "owner:"),
        ]
        for request, prefix in cases:
            with self.assertRaises(grpc.RpcError) as caught:
                self.sems.Acquire(request)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT, prefix)
            self.assertTrue(caught.exception.details().startswith(prefix), caught.exception.details())
        with self.assertRaises(grpc.RpcError) as caught:
            self.sems.Release(pb.SemaphoreServiceReleaseRequest(name="x", token="not-a-token"))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(caught.exception.details().startswith("token:"))
        hold = self.sems.Hold(pb.SemaphoreServiceHoldRequest(name="x", limit=1, permits=1, ttl=ms(50)))
        with self.assertRaises(grpc.RpcError) as caught:
            next(hold)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(caught.exception.details().startswith("ttl:"))

    def test_hold_frees_permits_when_client_leaves(self):
        """Closing a Hold stream frees its permits at once and the waiter gets them."""
        name = self.name()
        hold = self.sems.Hold(pb.SemaphoreServiceHoldRequest(
            name=name, limit=2, permits=2, ttl=ms(30_000)))
        self.assertEqual(next(hold).WhichOneof("event"), "acquired")
        result = {}

        def waiter():
            result["reply"] = self.acquire(name, limit=2, ttl=1000, wait=10_000)
            result["at"] = time.monotonic()

        t = threading.Thread(target=waiter)
        t.start()
        wait_until("the waiter to be counted", lambda: self.describe(name).waiters == 1)
        closed = time.monotonic()
        hold.cancel()
        t.join(timeout=10)
        self.assertTrue(result["reply"].acquired)
        self.assertLess(result["at"] - closed, 1.0, "woken long before the 30 s ttl")

    def test_hold_renews_past_ttl(self):
        """A Hold stream renews about every third of the ttl and keeps the permits past it."""
        name = self.name()
        hold = self.sems.Hold(pb.SemaphoreServiceHoldRequest(
            name=name, limit=1, permits=1, ttl=ms(900)))
        self.assertEqual(next(hold).WhichOneof("event"), "acquired")
        start = time.monotonic()
        renewals = 0
        # Past twice the ttl. (A 300 ms ttl left a renewal too little time on a loaded machine.)
        for event in hold:
            self.assertEqual(event.WhichOneof("event"), "renewed")
            renewals += 1
            if time.monotonic() - start > 2.0:
                break
        self.assertGreaterEqual(renewals, 3)
        self.assertEqual(self.describe(name).permits_in_use, 1)
        hold.cancel()

    def test_keepalive_of_acquired_permit(self):
        """KeepAlive renews a permit from Acquire; a wrong token is FAILED_PRECONDITION."""
        name = self.name()
        permit = self.acquire(name, limit=1, ttl=900).permit
        stream = self.sems.KeepAlive(pb.SemaphoreServiceKeepAliveRequest(name=name, token=permit.token))
        self.assertEqual(next(stream).WhichOneof("event"), "renewed")
        time.sleep(1.8)
        self.assertEqual(self.describe(name).permits_in_use, 1)
        stream.cancel()
        wait_until("release on stream close", lambda: self.describe(name).permits_in_use == 0, timeout=2)
        bad = self.sems.KeepAlive(pb.SemaphoreServiceKeepAliveRequest(name=name, token=str(uuid.uuid4())))
        with self.assertRaises(grpc.RpcError) as caught:
            next(bad)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

    def test_expired_holder_is_reclaimed_at_ttl(self):
        """A holder that never renews loses its permit at its ttl; the waiter gets it then."""
        name = self.name()
        sent = time.monotonic()
        holder = self.acquire(name, limit=1, ttl=300)
        got = self.acquire(name, limit=1, ttl=1000, wait=5000)
        elapsed = time.monotonic() - sent
        self.assertTrue(got.acquired)
        self.assertGreaterEqual(elapsed, 0.29)
        # Well before the 5 s wait runs out, with room for a loaded machine.
        self.assertLess(elapsed, 3.0)
        self.assertFalse(self.release(name, holder.permit.token), "released after expiry")

    def test_reflection_and_health(self):
        """Reflection lists the Semaphore service and its health follows readiness."""
        db = ProtoReflectionDescriptorDatabase(self.baton.channel)
        self.assertIn("baton.v1.SemaphoreService", db.get_services())
        health = health_pb2_grpc.HealthStub(self.baton.channel)
        status = health.Check(health_pb2.HealthCheckRequest(service="baton.v1.SemaphoreService")).status
        self.assertEqual(status, health_pb2.HealthCheckResponse.SERVING)


class SemaphoreRedisFaults(unittest.TestCase):
    """Redis dies under open Holds: lost before expiry, the limit kept, UNAVAILABLE, recovery."""

    def test_limit_holds_across_a_redis_outage(self):
        """Hold clients (ttl 300 ms) keep a limit of 3 across a 1 s Redis outage.

        Each of 6 threads holds 1 or 2 permits through a Hold stream, mostly for 20-80 ms and
        sometimes for longer than the ttl (thread 0, started first, holds for 3 s so that someone
        holds when Redis dies), and counts itself out of the critical section when it leaves,
        when it reads `lost`, or when the stream fails. Redis restarts empty, so the only thing that keeps old and new holders
        apart is `lost` arriving before a lease could expire: no instant may see more than 3
        permits in use by the recorded intervals.
        """
        workdir = tempfile.mkdtemp(prefix="baton-py-")
        redis = Redis(workdir)
        baton = Baton(redis.port, workdir)
        limit = 3
        intervals, errors, lost = [], [], []
        guard = threading.Lock()
        stop = threading.Event()
        first_grant = threading.Event()

        def worker(seed):
            rng = random.Random(seed)
            sems = rpc.SemaphoreServiceStub(baton.channel)
            while not stop.is_set():
                weight = rng.randint(1, 2)
                stream = sems.Hold(pb.SemaphoreServiceHoldRequest(
                    name="pool", limit=limit, permits=weight, ttl=ms(300),
                    wait_timeout=ms(1000), fair=seed % 2 == 0))
                try:
                    first = next(stream)
                except grpc.RpcError:
                    time.sleep(0.05)  # Redis is down: try again shortly.
                    continue
                if first.WhichOneof("event") != "acquired":
                    continue
                start = time.monotonic()
                first_grant.set()
                left = {}
                if seed == 0:
                    hold_for = 3.0
                elif rng.random() < 0.2:
                    hold_for = rng.uniform(0.4, 0.8)
                else:
                    hold_for = rng.uniform(0.02, 0.08)

                def leave(stream=stream, left=left):
                    left["at"] = time.monotonic()
                    stream.cancel()

                timer = threading.Timer(hold_for, leave)
                timer.start()
                end = None
                try:
                    for event in stream:
                        kind = event.WhichOneof("event")
                        if kind == "lost":
                            end = time.monotonic()
                            with guard:
                                lost.append(event.lost.reason)
                            break
                        if kind != "renewed":
                            errors.append(f"unexpected event {event}")
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.CANCELLED:
                        end = time.monotonic()
                timer.cancel()
                timer.join()
                if end is None:
                    end = left.get("at", time.monotonic())
                with guard:
                    intervals.append((start, end, weight))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        try:
            threads[0].start()
            self.assertTrue(first_grant.wait(timeout=5), "the first holder got its permit")
            for t in threads[1:]:
                t.start()
            time.sleep(1.0)  # The load runs for a while (the scenario).
            redis.kill()
            killed = time.monotonic()
            time.sleep(1.0)  # The outage lasts longer than the ttl (the scenario).
            redis.start()
            restarted = time.monotonic()
            time.sleep(1.5)
            stop.set()
            for t in threads:
                t.join(timeout=10)
        finally:
            stop.set()
            baton.stop()
            if redis.proc.poll() is None:
                redis.kill()
            shutil.rmtree(workdir, ignore_errors=True)
        self.assertEqual(errors, [])
        self.assertLessEqual(peak_overlap(intervals), limit, "the limit was exceeded")
        self.assertTrue(any(s < killed for s, _, _ in intervals), "grants before the outage")
        self.assertTrue(any(s > restarted for s, _, _ in intervals), "grants after the outage")
        self.assertIn(lease_pb2.LEASE_LOST_REASON_UNCONFIRMED, lost,
                      "holders at the time of the kill were told their lease was lost")

    def test_lost_before_expiry_and_recovery(self):
        workdir = tempfile.mkdtemp(prefix="baton-py-")
        redis = Redis(workdir)
        baton = Baton(redis.port, workdir)
        try:
            sems = rpc.SemaphoreServiceStub(baton.channel)
            hold = sems.Hold(pb.SemaphoreServiceHoldRequest(
                name="fault", limit=2, permits=2, ttl=ms(1000)))
            event = next(hold)
            self.assertEqual(event.WhichOneof("event"), "acquired")
            valid_until = time.monotonic() + event.acquired.remaining_ttl.ToMilliseconds() / 1000
            redis.kill()
            for event in hold:
                kind = event.WhichOneof("event")
                if kind == "renewed":
                    valid_until = time.monotonic() + event.renewed.remaining_ttl.ToMilliseconds() / 1000
                    continue
                self.assertEqual(kind, "lost")
                self.assertEqual(event.lost.reason, lease_pb2.LEASE_LOST_REASON_UNCONFIRMED)
                self.assertLess(time.monotonic(), valid_until, "lost must arrive before expiry")
                break
            else:
                self.fail("the stream ended without a lost event")

            start = time.monotonic()
            with self.assertRaises(grpc.RpcError) as caught:
                sems.Acquire(pb.SemaphoreServiceAcquireRequest(
                    name="other", limit=1, permits=1, ttl=ms(1000)))
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertLess(time.monotonic() - start, 1.0)

            redis.start()
            wait_until("an acquire to succeed after Redis is back", lambda: sems.Acquire(
                pb.SemaphoreServiceAcquireRequest(
                    name="fault", limit=2, permits=2, ttl=ms(1000))).acquired)
        finally:
            baton.stop()
            if redis.proc.poll() is None:
                redis.kill()
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
