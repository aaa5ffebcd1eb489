"""The RateLimitService contract, checked from Python through a client generated from proto/.

Run by scripts/python-tests.sh, which generates the client into BATON_PY_GEN and builds the
binary named by BATON_BIN. Each test class starts its own redis-server on a free port (no
persistence) and its own Baton process, and stops both by pid.
"""

import os
import shutil
import sys
import tempfile
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

from harness import Baton, Redis, ms  # noqa: E402
from baton.v1 import ratelimit_pb2 as pb  # noqa: E402
from baton.v1 import ratelimit_pb2_grpc as rpc  # noqa: E402


class RateLimitContract(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="baton-py-rl-")
        cls.redis = Redis(cls.dir)
        # A relaxed timeout: these tests are not about Redis failing.
        cls.baton = Baton(cls.redis.port, cls.dir, "--ratelimit-timeout", "2s")
        cls.limits = rpc.RateLimitServiceStub(cls.baton.channel)

    @classmethod
    def tearDownClass(cls):
        cls.baton.stop()
        cls.redis.kill()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def key(self):
        return f"{self._testMethodName}-{uuid.uuid4().hex[:6]}"

    def check(self, key, limit, period, **kw):
        return self.limits.Check(pb.RateLimitServiceCheckRequest(
            key=key, limit=limit, period=ms(period), **kw))

    def test_gcra_default_burst_then_retry_after(self):
        """GCRA is the default: a full bucket allows `limit` at once, then says when to retry."""
        key = self.key()
        got = [self.check(key, 3, 3000) for _ in range(4)]
        self.assertEqual([g.allowed for g in got], [True, True, True, False])
        self.assertEqual([g.remaining for g in got], [2, 1, 0, 0])
        self.assertTrue(all(g.limit == 3 for g in got))
        self.assertTrue(all(g.decided_by == pb.RATE_LIMIT_DECIDED_BY_REDIS for g in got))
        retry = got[3].retry_after.ToMicroseconds()
        self.assertTrue(0 < retry <= 1_000_000, retry)
        self.assertTrue(0 < got[2].reset_after.ToMicroseconds() <= 3_000_000)

    def test_cost_peek_and_algorithms(self):
        """Cost counts several units, 0 peeks without consuming, for every algorithm."""
        for algorithm in (pb.RATE_LIMIT_ALGORITHM_GCRA, pb.RATE_LIMIT_ALGORITHM_FIXED_WINDOW,
                          pb.RATE_LIMIT_ALGORITHM_SLIDING_WINDOW):
            key = self.key()
            spent = self.check(key, 5, 10_000, cost=4, algorithm=algorithm)
            self.assertTrue(spent.allowed, algorithm)
            self.assertEqual(spent.remaining, 1, algorithm)
            peek = self.check(key, 5, 10_000, cost=0, algorithm=algorithm)
            self.assertTrue(peek.allowed, algorithm)
            self.assertEqual(peek.remaining, 1, algorithm)
            too_much = self.check(key, 5, 10_000, cost=2, algorithm=algorithm)
            self.assertFalse(too_much.allowed, algorithm)
            self.assertEqual(too_much.remaining, 1, algorithm)
            self.assertTrue(self.check(key, 5, 10_000, algorithm=algorithm).allowed, algorithm)

    def test_sliding_window_frees_units_after_the_period(self):
        """An exact sliding window of 300 ms frees a unit 300 ms after it was spent."""
        key = self.key()
        sliding = pb.RATE_LIMIT_ALGORITHM_SLIDING_WINDOW
        self.assertTrue(self.check(key, 1, 300, algorithm=sliding).allowed)
        denied = self.check(key, 1, 300, algorithm=sliding)
        self.assertFalse(denied.allowed)
        time.sleep(denied.retry_after.ToMicroseconds() / 1e6 + 0.01)
        self.assertTrue(self.check(key, 1, 300, algorithm=sliding).allowed)

    def test_invalid_arguments_name_the_field(self):
        """Bad input fails with INVALID_ARGUMENT and a message starting with the field name."""
        cases = [
            (pb.RateLimitServiceCheckRequest(key="", limit=1, period=ms(1000)), "key:"),
            (pb.RateLimitServiceCheckRequest(key="k", limit=0, period=ms(1000)), "limit:"),
            (pb.RateLimitServiceCheckRequest(key="k", limit=1), "period:"),
            (pb.RateLimitServiceCheckRequest(key="k", limit=2, period=ms(1000), cost=3), "cost:"),
            (pb.RateLimitServiceCheckRequest(
                key="k", limit=2, period=ms(1000), burst=2,
                algorithm=pb.RATE_LIMIT_ALGORITHM_FIXED_WINDOW), "burst:"),
            (pb.RateLimitServiceCheckRequest(
                key="k", limit=10_001, period=ms(1000),
                algorithm=pb.RATE_LIMIT_ALGORITHM_SLIDING_WINDOW), "limit:"),
        ]
        for request, prefix in cases:
            with self.assertRaises(grpc.RpcError) as caught:
                self.limits.Check(request)
            self.assertEqual(caught.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertTrue(caught.exception.details().startswith(prefix),
                            caught.exception.details())

    def test_reflection_and_health(self):
        """Reflection lists the RateLimit service; its health follows Redis."""
        db = ProtoReflectionDescriptorDatabase(self.baton.channel)
        self.assertIn("baton.v1.RateLimitService", db.get_services())
        health = health_pb2_grpc.HealthStub(self.baton.channel)
        status = health.Check(health_pb2.HealthCheckRequest(service="baton.v1.RateLimitService"))
        self.assertEqual(status.status, health_pb2.HealthCheckResponse.SERVING)


class RateLimitFailureModes(unittest.TestCase):
    """Redis is gone: a fail-open Baton allows and a fail-closed one denies, each saying so."""

    def test_fail_open_and_fail_closed(self):
        workdir = tempfile.mkdtemp(prefix="baton-py-rl-")
        redis = Redis(workdir)
        open_ = Baton(redis.port, workdir, "--ratelimit-failure-mode", "open",
                      "--ratelimit-timeout", "100ms")
        closed = Baton(redis.port, workdir, "--ratelimit-failure-mode", "closed",
                       "--ratelimit-timeout", "100ms")
        try:
            request = pb.RateLimitServiceCheckRequest(key="k", limit=1, period=ms(60_000))
            redis.kill()
            start = time.monotonic()
            got = rpc.RateLimitServiceStub(open_.channel).Check(request)
            self.assertLess(time.monotonic() - start, 1.0)
            self.assertTrue(got.allowed)
            self.assertEqual(got.decided_by, pb.RATE_LIMIT_DECIDED_BY_FAIL_OPEN)
            start = time.monotonic()
            got = rpc.RateLimitServiceStub(closed.channel).Check(request)
            self.assertLess(time.monotonic() - start, 1.0)
            self.assertFalse(got.allowed)
            self.assertEqual(got.decided_by, pb.RATE_LIMIT_DECIDED_BY_FAIL_CLOSED)
        finally:
            open_.stop()
            closed.stop()
            redis.kill()
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(verbosity=2)
