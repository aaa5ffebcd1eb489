"""A short Baton lock session from a Python client generated from proto/.

Generate the client, then run this against a serving Baton:

    python3 -m pip install grpcio grpcio-tools
    python3 -m grpc_tools.protoc -I proto --python_out=examples/python/gen \
        --grpc_python_out=examples/python/gen proto/baton/v1/*.proto
    python3 examples/python/lock_session.py [127.0.0.1:50051]

It holds a lock through a Hold stream, shows a second caller waiting and being woken the moment
the stream is closed, then releases.
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "gen"))

import grpc  # noqa: E402
from google.protobuf.duration_pb2 import Duration  # noqa: E402

from baton.v1 import lock_pb2 as pb  # noqa: E402
from baton.v1 import lock_pb2_grpc as rpc  # noqa: E402


def ms(n):
    return Duration(seconds=n // 1000, nanos=(n % 1000) * 1_000_000)


def main(target):
    locks = rpc.LockServiceStub(grpc.insecure_channel(target))

    # Hold: acquire and keep the lease alive for as long as the stream is open.
    hold = locks.Hold(pb.LockServiceHoldRequest(name="reports", ttl=ms(3000), owner="session-a"))
    first = next(hold)
    lease = first.acquired
    print(f"a: holds 'reports' with fencing token {lease.fencing_token}")

    waited = {}

    def second_caller():
        start = time.monotonic()
        reply = locks.Acquire(pb.LockServiceAcquireRequest(
            name="reports", ttl=ms(10000), wait_timeout=ms(10000), owner="session-b"))
        waited["reply"], waited["at"] = reply, time.monotonic()
        waited["waited"] = waited["at"] - start

    b = threading.Thread(target=second_caller)
    b.start()
    time.sleep(0.5)
    state = locks.Describe(pb.LockServiceDescribeRequest(name="reports"))
    print(f"describe: held={state.held} owner={state.owner} waiters={state.waiters}")

    renewal = next(hold)
    print(f"a: lease renewed, {renewal.renewed.remaining_ttl.ToMilliseconds()} ms left")

    closed_at = time.monotonic()
    hold.cancel()  # closing the stream releases the lock at once
    b.join()
    reply = waited["reply"]
    print(f"b: acquired={reply.acquired} {1000 * (waited['at'] - closed_at):.1f} ms after a closed its "
          f"stream, fencing token {reply.lease.fencing_token} > {lease.fencing_token}")

    released = locks.Release(pb.LockServiceReleaseRequest(name="reports", token=reply.lease.token))
    print(f"b: released, was_held={released.was_held}")
    again = locks.Release(pb.LockServiceReleaseRequest(name="reports", token=reply.lease.token))
    print(f"b: released again, was_held={again.was_held} (harmless)")

    try:
        locks.Acquire(pb.LockServiceAcquireRequest(name="reports", ttl=ms(5)))
    except grpc.RpcError as e:
        print(f"bad ttl: {e.code().name}: {e.details()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051")
