"""A private redis-server and real Baton processes for the package's tests.

Baton is the binary in BATON_BIN (scripts/client-tests.sh builds it), serving over TCP and a Unix
socket with a key prefix of its own; everything is stopped by pid at the end.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import grpc
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what, check, timeout=15.0):
    """Polls `check` until it returns true; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - reported if it never succeeds
            last = e
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what} (last error: {last!r})")


def redis_cli(port, *args):
    """Runs one redis-cli command against the test Redis and returns its output lines."""
    out = subprocess.run(["redis-cli", "-p", str(port), *args], check=True, capture_output=True,
                         text=True, timeout=10).stdout
    return [line for line in out.splitlines() if line]


class Redis:
    """redis-server on a free port, no persistence."""

    def __init__(self, workdir):
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", workdir, "--logfile", os.path.join(workdir, "redis.log")])
        wait_until("redis-server to answer PING", lambda: redis_cli(self.port, "PING") == ["PONG"])

    def delete_keys(self, prefix):
        """Deletes every key under `prefix`: the leases there are gone, as after data loss."""
        keys = redis_cli(self.port, "--scan", "--pattern", prefix + "*")
        if keys:
            redis_cli(self.port, "DEL", *keys)
        return keys

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class BatonServer:
    """The baton binary over TCP and a Unix socket, ready once readiness is SERVING; `extra`
    are more `baton serve` arguments (TLS, an API token)."""

    def __init__(self, redis, workdir, *extra):
        self.prefix = f"py-{uuid.uuid4().hex[:8]}:"
        self.port = free_port()
        self.socket = os.path.join(workdir, f"baton-{self.port}.sock")
        self.log_path = os.path.join(workdir, f"baton-{self.port}.log")
        self.log = open(self.log_path, "wb")
        binary = os.environ.get("BATON_BIN") or os.path.join(REPO, "target", "debug", "baton")
        self.proc = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--socket", self.socket,
             "--redis-url", f"redis://127.0.0.1:{redis.port}", "--key-prefix", self.prefix,
             *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        # Over the socket, which stays plaintext and answers health without a token whatever
        # `extra` asks of TCP.
        channel = grpc.insecure_channel(f"unix:{self.socket}")
        health = health_pb2_grpc.HealthStub(channel)
        wait_until("Baton readiness SERVING", lambda: health.Check(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=1).status == 1)
        channel.close()

    @property
    def tcp(self):
        return f"127.0.0.1:{self.port}"

    @property
    def unix(self):
        return f"unix://{self.socket}"

    def addr(self, transport):
        return self.tcp if transport == "tcp" else self.unix

    def freeze(self):
        """SIGSTOP, returning once every thread has stopped: `kill` only queues the signal, and
        until each thread has taken it one can still answer a request sent after the `kill`."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while not self._stopped():
            assert time.monotonic() < deadline, "Baton did not stop within 30 s of SIGSTOP"
            time.sleep(0.001)

    def _stopped(self):
        try:
            tasks = os.listdir(f"/proc/{self.proc.pid}/task")
        except FileNotFoundError:
            return True
        for task in tasks:
            try:
                with open(f"/proc/{self.proc.pid}/task/{task}/stat", encoding="utf-8") as f:
                    # The state follows the command's closing parenthesis: T or t once stopped.
                    if f.read().rsplit(")", 1)[1].split()[0] not in "TtZX":
                        return False
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
        return True

    def thaw(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self):
        if self.proc.poll() is None:
            self.thaw()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def workdir():
    with tempfile.TemporaryDirectory(prefix="baton-py-client-") as d:
        yield d


@pytest.fixture(scope="session")
def redis(workdir):
    r = Redis(workdir)
    yield r
    r.stop()


@pytest.fixture(scope="session")
def server(redis, workdir):
    b = BatonServer(redis, workdir)
    yield b
    b.stop()


@pytest.fixture
def own_server(redis, workdir):
    """A Baton of the test's own, for tests that freeze or stop it."""
    b = BatonServer(redis, workdir)
    yield b
    b.stop()


@pytest.fixture(params=["tcp", "unix"])
def transport(request):
    return request.param


@pytest.fixture
def name():
    """A lock or semaphore name no other test uses."""
    return f"t-{uuid.uuid4().hex[:10]}"


def spawn_holder(addr, *args):
    """Runs tests/holder.py (a second process using the package) with `args`; its stdin is a
    pipe (a line there ends a campaign)."""
    return subprocess.Popen([sys.executable, os.path.join(HERE, "holder.py"), addr, *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def read_line(proc, timeout=15.0):
    """The next line `proc` prints, waited for at most `timeout` seconds."""
    import selectors

    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"no line from pid {proc.pid} within {timeout} s")
    return proc.stdout.readline()
