"""The LockService contract, checked from Python through a client generated from proto/.

Run by scripts/python-tests.sh, which generates the client into BATON_PY_GEN and builds the
binary named by BATON_BIN. Each test class starts its own redis-server on a free port (no
persistence) and its own Baton process, and stops both by pid.
"""

import os
import shutil
import signal
import subprocess
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

from harness import Baton, Redis, freeze, ms, wait_until  # noqa: E402
from baton.v1 import lease_pb2  # noqa: E402
from baton.v1 import lock_pb2 as pb  # noqa: E402
from baton.v1 import lock_pb2_grpc as rpc  # noqa: E402


class LockContract(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="baton-py-")
        cls.redis = Redis(cls.dir)
        cls.baton = Baton(cls.redis.port, cls.dir)
        cls.locks = rpc.LockServiceStub(cls.baton.channel)

    @classmethod
    def tearDownClass(cls):
        cls.baton.stop()
        cls.redis.kill()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def name(self):
        return f"{self._testMethodName}-{uuid.uuid4().hex[:6]}"

    def acquire(self, name, ttl=5000, wait=0, owner=""):
        return self.locks.Acquire(pb.LockServiceAcquireRequest(
            name=name, ttl=ms(ttl), wait_timeout=ms(wait), owner=owner))

    def test_acquire_release_and_describe(self):
        """A lease comes with a token, a fencing token and its ttl; release frees the lock."""
        name = self.name()
        got = self.acquire(name, ttl=2000)
        self.assertTrue(got.acquired)
        self.assertEqual(got.lease.hold_count, 1)
        self.assertGreater(got.lease.fencing_token, 0)
        self.assertEqual(got.lease.remaining_ttl.ToMilliseconds(), 2000)
        state = self.locks.Describe(pb.LockServiceDescribeRequest(name=name))
        self.assertTrue(state.held)
        self.assertEqual(state.fencing_token, got.lease.fencing_token)
        busy = self.acquire(name)
        self.assertFalse(busy.acquired)
        self.assertGreater(busy.holder_remaining_ttl.ToMilliseconds(), 0)
        released = self.locks.Release(pb.LockServiceReleaseRequest(name=name, token=got.lease.token))
        self.assertTrue(released.was_held)
        self.assertEqual(released.remaining_holds, 0)
        again = self.locks.Release(pb.LockServiceReleaseRequest(name=name, token=got.lease.token))
        self.assertFalse(again.was_held)
        self.assertFalse(self.locks.Describe(pb.LockServiceDescribeRequest(name=name)).held)
        self.assertGreater(self.acquire(name).lease.fencing_token, got.lease.fencing_token)

    def test_reentrancy_per_owner(self):
        """The same owner re-enters: one more hold of its lease, with a token of its own; each
        release ends the hold whose token it names, once."""
        name = self.name()
        first = self.acquire(name, owner="worker-1")
        second = self.acquire(name, owner="worker-1")
        self.assertEqual(second.lease.hold_count, 2)
        self.assertNotEqual(second.lease.token, first.lease.token)
        self.assertEqual(second.lease.fencing_token, first.lease.fencing_token)
        self.assertFalse(self.acquire(name, owner="worker-2").acquired)
        r = self.locks.Release(pb.LockServiceReleaseRequest(name=name, token=first.lease.token))
        self.assertEqual(r.remaining_holds, 1)
        again = self.locks.Release(pb.LockServiceReleaseRequest(name=name, token=first.lease.token))
        self.assertFalse(again.was_held)
        self.assertFalse(self.acquire(name, owner="worker-2").acquired)
        self.locks.Release(pb.LockServiceReleaseRequest(name=name, token=second.lease.token))
        self.assertTrue(self.acquire(name, owner="worker-2").acquired)

    def test_a_frozen_holder_loses_its_lease_soon_after_its_ttl(self):
        """A client frozen with SIGSTOP while it holds a 1 s lease answers no HTTP/2 ping: Baton
        releases its lease within the ttl plus two ping intervals (1 s), not the 20 s a dead
        connection takes to notice. Woken again, the client reads the renewals it missed, each
        with an expiry already past, then `lost` (CLIENT_UNRESPONSIVE)."""
        name = self.name()
        child = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(__file__), "frozen_holder.py"),
             f"127.0.0.1:{self.baton.port}", name, "1000"],
            stdout=subprocess.PIPE, text=True)
        try:
            self.assertTrue(child.stdout.readline().startswith("EVENT acquired"))
            freeze(child.pid)
            frozen = time.monotonic()
            wait_until("the frozen holder's lease to be released", lambda: not self.locks.Describe(
                pb.LockServiceDescribeRequest(name=name)).held, timeout=15)
            held_for = time.monotonic() - frozen
            self.assertLess(held_for, 5.0, f"the lease outlived its frozen holder by {held_for:.1f} s")
            got = self.acquire(name, ttl=1000)
            self.assertTrue(got.acquired)
            os.kill(child.pid, signal.SIGCONT)
            events = []
            while True:
                line = child.stdout.readline()
                if not line or line.startswith("END"):
                    break
                events.append(line.split())
            self.assertTrue(events, "the woken client read nothing")
            *renewals, last = events
            self.assertEqual(last[1:3], ["lost", "LEASE_LOST_REASON_CLIENT_UNRESPONSIVE"], events)
            for event in renewals:
                self.assertEqual(event[1], "renewed", events)
                self.assertLess(int(event[3]), 0, f"a stale renewal looks fresh: {events}")
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=5)

    def test_invalid_arguments_name_the_field(self):
        """Bad input fails with INVALID_ARGUMENT and a message starting with the field name."""
        cases = [
            (pb.LockServiceAcquireRequest(name="", ttl=ms(1000)), "name:"),
            (pb.LockServiceAcquireRequest(name="x" * 1025, ttl=ms(1000)), "name:"),
            (pb.LockServiceAcquireRequest(name="x"), "ttl:"),
            (pb.LockServiceAcquireRequest(name="x", ttl=ms(5)), "ttl:"),
            (pb.LockServiceAcquireRequest(name="x", ttl=ms(1000), wait_timeout=ms(7_200_000)),
             "wait_timeout:"),
            (pb.LockServiceAcquireRequest(name="x", ttl=ms(1000), owner="o" * 257), "owner:"),
        ]
        for request, prefix in cases:
            with self.assertRaises(grpc.RpcError) as caught:
                self.locks.Acquire(request)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertTrue(caught.exception.details().startswith(prefix), caught.exception.details())
        with self.assertRaises(grpc.RpcError) as caught:
            self.locks.Release(pb.LockServiceReleaseRequest(name="x", token="not-a-token"))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(grpc.RpcError) as caught:
            self.locks.Refresh(pb.LockServiceRefreshRequest(name="x", token=str(uuid.uuid4())))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

    def test_hold_wakes_waiter_when_client_leaves(self):
        """Closing a Hold stream releases at once and the waiter is woken through pub/sub."""
        name = self.name()
        hold = self.locks.Hold(pb.LockServiceHoldRequest(name=name, ttl=ms(30_000)))
        self.assertEqual(next(hold).WhichOneof("event"), "acquired")
        result = {}

        def waiter():
            result["reply"] = self.acquire(name, ttl=1000, wait=10_000)
            result["at"] = time.monotonic()

        t = threading.Thread(target=waiter)
        t.start()
        wait_until("the waiter to be counted", lambda: self.locks.Describe(
            pb.LockServiceDescribeRequest(name=name)).waiters == 1)
        closed = time.monotonic()
        hold.cancel()
        t.join(timeout=10)
        self.assertTrue(result["reply"].acquired)
        self.assertLess(result["at"] - closed, 1.0, "woken long before the 30 s ttl")

    def test_hold_renews_past_ttl(self):
        """A Hold stream renews about every third of the ttl and keeps the lock past it."""
        name = self.name()
        hold = self.locks.Hold(pb.LockServiceHoldRequest(name=name, ttl=ms(900)))
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
        self.assertTrue(self.locks.Describe(pb.LockServiceDescribeRequest(name=name)).held)
        hold.cancel()

    def test_keepalive_of_acquired_lease(self):
        """KeepAlive renews a lease obtained with Acquire; a wrong token is FAILED_PRECONDITION."""
        name = self.name()
        lease = self.acquire(name, ttl=900).lease
        stream = self.locks.KeepAlive(pb.LockServiceKeepAliveRequest(name=name, token=lease.token))
        first = next(stream)
        self.assertEqual(first.WhichOneof("event"), "renewed")
        time.sleep(1.8)
        self.assertTrue(self.locks.Describe(pb.LockServiceDescribeRequest(name=name)).held)
        stream.cancel()
        wait_until("release on stream close", lambda: not self.locks.Describe(
            pb.LockServiceDescribeRequest(name=name)).held, timeout=2)
        bad = self.locks.KeepAlive(pb.LockServiceKeepAliveRequest(name=name, token=str(uuid.uuid4())))
        with self.assertRaises(grpc.RpcError) as caught:
            next(bad)
        self.assertEqual(caught.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)

    def test_mutual_exclusion_under_concurrency(self):
        """8 threads x 25 acquisitions never overlap, and fencing tokens increase in grant order."""
        name = self.name()
        inside = []
        fences = []
        overlaps = []
        guard = threading.Lock()

        def worker():
            for _ in range(25):
                got = self.acquire(name, ttl=5000, wait=20_000)
                self.assertTrue(got.acquired)
                with guard:
                    if inside:
                        overlaps.append(got.lease.fencing_token)
                    inside.append(1)
                    fences.append(got.lease.fencing_token)
                time.sleep(0.0005)
                with guard:
                    inside.pop()
                self.locks.Release(pb.LockServiceReleaseRequest(name=name, token=got.lease.token))

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        self.assertEqual(overlaps, [])
        self.assertEqual(len(fences), 200)
        self.assertEqual(fences, sorted(set(fences)))

    def test_fair_waiters_in_arrival_order(self):
        """Fair waiters get the lock in the order they queued, each woken by the release before it."""
        name = self.name()
        holder = self.acquire(name, ttl=30_000).lease
        order = []
        guard = threading.Lock()

        def waiter(i):
            got = self.locks.Acquire(pb.LockServiceAcquireRequest(
                name=name, ttl=ms(5000), wait_timeout=ms(10_000), owner=f"w{i}", fair=True))
            self.assertTrue(got.acquired)
            with guard:
                order.append(i)
            self.locks.Release(pb.LockServiceReleaseRequest(name=name, token=got.lease.token))

        threads = []
        for i in range(4):
            t = threading.Thread(target=waiter, args=(i,))
            t.start()
            threads.append(t)
            wait_until(f"waiter {i} to be queued", lambda n=i + 1: self.locks.Describe(
                pb.LockServiceDescribeRequest(name=name)).queued == n)
        self.locks.Release(pb.LockServiceReleaseRequest(name=name, token=holder.token))
        for t in threads:
            t.join(timeout=10)
        self.assertEqual(order, [0, 1, 2, 3])

    def test_shared_holders(self):
        """Shared leases coexist and keep an exclusive request out; an upgrade is refused."""
        name = self.name()
        # Distinct ttls: r0's lease is the first to expire even if the grants share a millisecond.
        shared = [self.locks.Acquire(pb.LockServiceAcquireRequest(
            name=name, ttl=ms(5000 + 1000 * i), owner=f"r{i}", mode=pb.LOCK_MODE_SHARED))
            for i in range(3)]
        self.assertTrue(all(s.acquired for s in shared))
        self.assertTrue(all(s.lease.mode == pb.LOCK_MODE_SHARED for s in shared))
        self.assertEqual(len({s.lease.token for s in shared}), 3)
        fences = [s.lease.fencing_token for s in shared]
        self.assertEqual(fences, sorted(set(fences)))
        state = self.locks.Describe(pb.LockServiceDescribeRequest(name=name))
        self.assertTrue(state.held)
        self.assertEqual(state.mode, pb.LOCK_MODE_SHARED)
        self.assertEqual(state.shared_holders, 3)
        self.assertEqual(state.earliest_shared_holder.owner, "r0")
        self.assertFalse(self.acquire(name, owner="writer").acquired)
        with self.assertRaises(grpc.RpcError) as caught:
            self.locks.Acquire(pb.LockServiceAcquireRequest(
                name=name, ttl=ms(5000), owner="r0", mode=pb.LOCK_MODE_EXCLUSIVE))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
        for s in shared:
            self.locks.Release(pb.LockServiceReleaseRequest(name=name, token=s.lease.token))
        writer = self.acquire(name, owner="writer")
        self.assertTrue(writer.acquired)
        self.assertEqual(writer.lease.mode, pb.LOCK_MODE_EXCLUSIVE)
        self.assertGreater(writer.lease.fencing_token, fences[-1])
        with self.assertRaises(grpc.RpcError) as caught:
            self.locks.Acquire(pb.LockServiceAcquireRequest(name=name, ttl=ms(1000), mode=9))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertTrue(caught.exception.details().startswith("mode:"), caught.exception.details())

    def test_reflection_and_health(self):
        """Reflection lists the Lock service; liveness and readiness are SERVING."""
        db = ProtoReflectionDescriptorDatabase(self.baton.channel)
        self.assertIn("baton.v1.LockService", db.get_services())
        health = health_pb2_grpc.HealthStub(self.baton.channel)
        for service in ["", "liveness", "readiness", "baton.v1.LockService"]:
            status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
            self.assertEqual(status, health_pb2.HealthCheckResponse.SERVING, service)


class RedisFaults(unittest.TestCase):
    """Redis dies under an open Hold: lost before expiry, UNAVAILABLE promptly, recovery."""

    def test_lost_before_expiry_and_recovery(self):
        workdir = tempfile.mkdtemp(prefix="baton-py-")
        redis = Redis(workdir)
        baton = Baton(redis.port, workdir)
        try:
            locks = rpc.LockServiceStub(baton.channel)
            hold = locks.Hold(pb.LockServiceHoldRequest(name="fault", ttl=ms(1000)))
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
                locks.Acquire(pb.LockServiceAcquireRequest(name="other", ttl=ms(1000)))
            self.assertEqual(caught.exception.code(), grpc.StatusCode.UNAVAILABLE)
            self.assertLess(time.monotonic() - start, 1.0)

            redis.start()
            wait_until("an acquire to succeed after Redis is back", lambda: locks.Acquire(
                pb.LockServiceAcquireRequest(name="other", ttl=ms(1000))).acquired)
        finally:
            baton.stop()
            if redis.proc.poll() is None:
                redis.kill()
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
