"""A short Baton session with the Python package (clients/python).

Install the package, then run this against a serving Baton (BATON_ADDR, or 127.0.0.1:50051):

    python3 -m venv .venv && .venv/bin/pip install ./clients/python
    .venv/bin/python examples/python/lock_session.py

Caller a holds a lock in a `with` block (a Hold stream keeps it alive); caller b waits for it and
is woken the moment a's block ends, with a higher fencing token; then a rate limit, a completion,
and the error a bad ttl gets.
"""

import os
import threading
import time

import baton


def main():
    client = baton.Baton.connect()
    b_result = {}

    def second_caller():
        started = time.monotonic()
        with client.lock("reports", ttl=10, wait=10, owner="session-b") as lease:
            b_result["at"] = time.monotonic()
            b_result["fencing_token"] = lease.fencing_token
            b_result["waited"] = b_result["at"] - started

    with client.lock("reports", ttl=3, owner="session-a") as a:
        print(f"a: holds 'reports' with fencing token {a.fencing_token}")
        b = threading.Thread(target=second_caller)
        b.start()
        deadline = time.monotonic() + 5
        while client.describe_lock("reports").waiters == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        state = client.describe_lock("reports")
        print(f"describe: held={state.held} owner={state.owner} waiters={state.waiters}")
        a.check()  # raises baton.LeaseLost if the lease was lost
        released_at = time.monotonic()
    b.join()
    print(f"b: acquired {1000 * (b_result['at'] - released_at):.1f} ms after a's block ended, "
          f"fencing token {b_result['fencing_token']} > {a.fencing_token}")

    key = f"session:api:{os.getpid()}"
    answers = [client.rate_limit.check(key, limit=2, period=60).allowed for _ in range(3)]
    print(f"rate limit 2/min, three calls: {answers}")

    client.autocomplete.add("session:cities", ["Straße", "Stroud", "Zürich"])
    page = client.autocomplete.complete("session:cities", "STRA")
    print(f"complete 'STRA': {[s.display for s in page.suggestions]}")

    try:
        client.acquire_lock("reports", ttl=0.005)
    except baton.InvalidArgument as e:
        print(f"bad ttl: InvalidArgument on field {e.field!r}: {e}")
    client.close()


if __name__ == "__main__":
    main()
