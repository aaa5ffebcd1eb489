"""The repository's example session (examples/python/lock_session.py) runs as its comments say."""

import os
import subprocess
import sys

from conftest import REPO


def test_example_session_runs(server, transport):
    """The example, given BATON_ADDR, prints each step with b woken after a and a higher token."""
    script = os.path.join(REPO, "examples", "python", "lock_session.py")
    env = dict(os.environ, BATON_ADDR=server.addr(transport))
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("a: holds 'reports' with fencing token "), lines
    assert lines[1] == "describe: held=True owner=session-a waiters=1", lines
    a_token = int(lines[0].split()[-1])
    b_token, _, shown_a = lines[2].split("fencing token ")[1].partition(" > ")
    assert int(shown_a) == a_token and int(b_token) > a_token, lines
    assert lines[3] == "rate limit 2/min, three calls: [True, True, False]", lines
    assert lines[4] == "complete 'STRA': ['Straße']", lines
    assert lines[5].startswith("bad ttl: InvalidArgument on field 'ttl'"), lines
