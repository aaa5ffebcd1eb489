"""A candidate in an election, in a process of its own: it campaigns through a Campaign stream
and prints what it believes, with the time on the machine's monotonic clock (CLOCK_MONOTONIC,
shared by every process), as it learns it:

    ELECTED <term> <ns>     it leads from now on
    RESIGNING <ns>          told to resign (a line `resign` on stdin): it stops leading now, then
                            closes its stream
    LOST <reason> <ns>      its leadership ended
    END <ns>                the stream ended

The contract tests run several of these, tell one to resign, kill another with SIGKILL, and
check from the lines that at most one believed it led at any moment.

Usage: candidate.py ADDRESS ELECTION VALUE TTL_MS
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.environ["BATON_PY_GEN"])
sys.path.insert(0, os.path.dirname(__file__))

import grpc  # noqa: E402

from harness import ms  # noqa: E402
from baton.v1 import election_pb2 as pb  # noqa: E402
from baton.v1 import election_pb2_grpc as rpc  # noqa: E402
from baton.v1 import lease_pb2  # noqa: E402

printing = threading.Lock()


def say(*words):
    with printing:
        print(*words, time.monotonic_ns(), flush=True)


def main():
    address, name, value, ttl = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    channel = grpc.insecure_channel(address)
    elections = rpc.ElectionServiceStub(channel)
    call = elections.Campaign(pb.ElectionServiceCampaignRequest(
        name=name, value=value.encode(), ttl=ms(ttl)))

    def resign_on_request():
        for line in sys.stdin:
            if line.strip() == "resign":
                say("RESIGNING")
                call.cancel()
                return

    threading.Thread(target=resign_on_request, daemon=True).start()
    try:
        for event in call:
            kind = event.WhichOneof("event")
            if kind == "elected":
                say("ELECTED", event.elected.term)
            elif kind == "lost":
                say("LOST", lease_pb2.LeaseLostReason.Name(event.lost.reason))
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED:
            say("FAILED", e.code().name)
    say("END")


if __name__ == "__main__":
    main()
