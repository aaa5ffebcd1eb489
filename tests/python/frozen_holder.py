"""A client that holds a lock through a Hold stream and prints every event as it reads it:
`EVENT <kind> <reason> <expires_at - now in ms>`. The contract tests run it as a child process
and freeze it with SIGSTOP, as a debugger, a stopped VM or a long GC pause would.

Usage: frozen_holder.py ADDRESS LOCK TTL_MS
"""

import os
import sys
import time

sys.path.insert(0, os.environ["BATON_PY_GEN"])
sys.path.insert(0, os.path.dirname(__file__))

import grpc  # noqa: E402

from harness import ms  # noqa: E402
from baton.v1 import lease_pb2  # noqa: E402
from baton.v1 import lock_pb2 as pb  # noqa: E402
from baton.v1 import lock_pb2_grpc as rpc  # noqa: E402


def main():
    address, name, ttl = sys.argv[1], sys.argv[2], int(sys.argv[3])
    channel = grpc.insecure_channel(address)
    locks = rpc.LockServiceStub(channel)
    for event in locks.Hold(pb.LockServiceHoldRequest(name=name, ttl=ms(ttl))):
        kind = event.WhichOneof("event")
        if kind == "acquired":
            expires = event.acquired.expires_at
            reason = "-"
        elif kind == "renewed":
            expires = event.renewed.expires_at
            reason = "-"
        elif kind == "lost":
            expires = None
            reason = lease_pb2.LeaseLostReason.Name(event.lost.reason)
        else:
            expires, reason = None, "-"
        left = "-" if expires is None else str(int(expires.ToMilliseconds() - time.time() * 1000))
        print(f"EVENT {kind} {reason} {left}", flush=True)
    print("END", flush=True)


if __name__ == "__main__":
    main()
