"""The lease a holder sees: fencing token, expiry, and whether it was lost."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, List, Optional, Sequence, Union

from .errors import LeaseLost


class Lease:
    """A lock or permits held through a `Hold` stream, kept alive in the background.

    `lost` is set (and callbacks registered with `on_lost` run) when Baton reports the lease lost,
    when the stream breaks, or when the newest `expires_at` passes on the local clock without a
    newer renewal (a frozen or partitioned Baton sends nothing at all). From then on, stop acting
    as the holder: `check()` raises `LeaseLost`, and leaving the `with` block raises it too.
    """

    def __init__(self, kind: str, grant, lost_event):
        self.kind = kind
        #: The lock's or semaphore's name.
        self.name: str = grant.name
        #: Strictly increases per name: pass it with every write the lease protects.
        self.fencing_token: int = grant.term if kind == "election" else grant.fencing_token
        #: The owner the lease belongs to ("" when anonymous).
        self.owner: str = getattr(grant, "owner", "")
        #: Permits held (semaphores; 0 for locks).
        self.permits: int = getattr(grant, "permits", 0)
        #: True for a shared lock lease.
        self.shared: bool = kind == "lock" and grant.mode == 2
        #: Set when the lease is lost (`threading.Event`, or `asyncio.Event` in `baton.aio`).
        self.lost = lost_event
        #: Why it was lost: see `LeaseLost.reason`.
        self.lost_reason: Optional[str] = None
        #: Baton's words about the loss.
        self.lost_message: str = ""
        self._expires_at = grant.expires_at.ToNanoseconds() / 1e9
        self._callbacks: List[Callable[["Lease"], None]] = []
        self._mutex = threading.Lock()

    @property
    def expires_at(self) -> datetime.datetime:
        """Until when the lease is held for certain (Baton's clock, less a safety margin)."""
        return datetime.datetime.fromtimestamp(self._expires_at, tz=datetime.timezone.utc)

    @property
    def remaining(self) -> float:
        """Seconds until `expires_at` by the local clock (negative once passed)."""
        return self._expires_at - time.time()

    @property
    def held(self) -> bool:
        """True while the lease is neither lost nor past its `expires_at` on the local clock."""
        return not self.lost.is_set() and self.remaining > 0

    def check(self) -> None:
        """Raises `LeaseLost` unless the lease is still held.

        Blocking code cannot be interrupted from outside: call it between steps of work (before
        each write the lease protects), or run the work in a subprocess with
        `baton.run_while_held`."""
        if not self.lost.is_set() and self.remaining <= 0:
            self._lose("EXPIRED", "the lease's expires_at passed with no newer renewal")
        if self.lost.is_set():
            raise self.error()

    def run(self, args: Union[str, Sequence[str]], *, grace: float = 10.0,
            env: Optional[dict] = None, input=None, capture_output: bool = False,
            timeout: Optional[float] = None, check: bool = False,
            **popen_kwargs) -> subprocess.CompletedProcess:
        """Runs a command while the lease is held, and stops it when the lease is lost: the way
        to bound blocking work that cannot call `check()` itself.

        `subprocess.run` bound to the lease: `input=`, `capture_output=`, `timeout=` and
        `check=` work as there, and the other keyword arguments (`stdout=`, `text=`, `cwd=`,
        ...) are passed on to `subprocess.Popen`. The fencing token is in `BATON_FENCING_TOKEN`
        (and an election's term in `BATON_ELECTION_TERM`). The command runs in a process group
        of its own; when the lease is lost, the whole group gets SIGTERM, then SIGKILL once
        `grace` seconds have passed (if the command or anything it started is still running),
        and `LeaseLost` is raised. Past `timeout` seconds the group is killed and
        `subprocess.TimeoutExpired` raised; with `check`, a non-zero exit raises
        `subprocess.CalledProcessError`. Otherwise returns the `CompletedProcess`. An exception
        in the calling thread (KeyboardInterrupt) kills the group and is raised again.
        Blocking: from asyncio, call it through `asyncio.to_thread`."""
        if input is not None:
            if popen_kwargs.get("stdin") is not None:
                raise ValueError("stdin and input arguments may not both be used.")
            popen_kwargs["stdin"] = subprocess.PIPE
        if capture_output:
            if popen_kwargs.get("stdout") is not None or popen_kwargs.get("stderr") is not None:
                raise ValueError("stdout and stderr arguments may not be used "
                                 "with capture_output.")
            popen_kwargs["stdout"] = popen_kwargs["stderr"] = subprocess.PIPE
        for own in ("process_group", "start_new_session", "preexec_fn"):
            if own in popen_kwargs:
                raise TypeError(f"run() does not take {own}=: the command runs in a process "
                                f"group of its own, which a lost lease stops")
        self.check()
        environ = dict(os.environ if env is None else env)
        environ["BATON_FENCING_TOKEN"] = str(self.fencing_token)
        if self.kind == "election":
            environ["BATON_ELECTION_TERM"] = str(self.fencing_token)
        # process_group needs Python 3.11; a new session (no controlling terminal) before.
        group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
        proc = subprocess.Popen(args, env=environ, **group, **popen_kwargs)
        guard = threading.Lock()
        state = {"done": False, "lost_at": None}

        def kill_if_running():
            with guard:
                if not state["done"] and proc.poll() is None:
                    _signal_group(proc.pid, signal.SIGKILL)

        def stop(_lease):
            with guard:
                if state["done"]:
                    return
                state["lost_at"] = time.monotonic()
                _signal_group(proc.pid, signal.SIGTERM)
            timer = threading.Timer(grace, kill_if_running)
            timer.daemon = True
            timer.start()

        self.on_lost(stop)
        timed_out: Optional[subprocess.TimeoutExpired] = None
        try:
            stdout, stderr = proc.communicate(input, timeout)
        except subprocess.TimeoutExpired as e:
            # As subprocess.run: killed (here its whole group), its output read to the end.
            with guard:
                _signal_group(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            timed_out = e
        except BaseException:
            with guard:
                state["done"] = True
                _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        with guard:
            lost_at = state["lost_at"]
            state["done"] = lost_at is None
        if lost_at is not None:
            # The command is gone; what else of its group is left gets the rest of the grace.
            # Those processes are not this one's children: nothing tells when they end.
            while _group_alive(proc.pid) and time.monotonic() < lost_at + grace:
                time.sleep(0.01)
            with guard:
                state["done"] = True
                if _group_alive(proc.pid):
                    _signal_group(proc.pid, signal.SIGKILL)
            raise self.error()
        if timed_out is not None:
            raise subprocess.TimeoutExpired(proc.args, timed_out.timeout, output=stdout,
                                            stderr=stderr)
        if check and proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, output=stdout,
                                                stderr=stderr)
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    def on_lost(self, callback: Callable[["Lease"], None]) -> None:
        """Runs `callback(lease)` once when the lease is lost (at once if it already is)."""
        with self._mutex:
            if self.lost_reason is None:
                self._callbacks.append(callback)
                return
        callback(self)

    def error(self) -> LeaseLost:
        """The `LeaseLost` describing the loss."""
        return LeaseLost(f"{self._what()} lost ({self.lost_reason}): {self.lost_message}",
                         self.lost_reason or "")

    def _what(self) -> str:
        return f"{self.kind} {self.name!r}"

    # -- for the stream readers --

    def _renewed(self, expires_at) -> None:
        self._expires_at = expires_at.ToNanoseconds() / 1e9

    def _lose(self, reason: str, message: str) -> bool:
        """Marks the lease lost; False when it already was."""
        with self._mutex:
            if self.lost_reason is not None:
                return False
            self.lost_reason, self.lost_message = reason, message
            callbacks, self._callbacks = self._callbacks, []
        self.lost.set()
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # noqa: BLE001 - a failing callback must not stop the others
                pass
        return True

    def __repr__(self) -> str:
        state = "held" if self.held else f"lost ({self.lost_reason})"
        return f"<Lease {self.kind} {self.name!r} fencing_token={self.fencing_token} {state}>"


def _signal_group(pgid: int, sig: int) -> None:
    """Sends `sig` to the process group `pgid` (and SIGCONT, so a stopped group acts on it)."""
    for s in (sig, signal.SIGCONT) if sig != signal.SIGKILL else (sig,):
        try:
            os.killpg(pgid, s)
        except ProcessLookupError:
            return
        except PermissionError:
            pass


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group `pgid` is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Leadership(Lease):
    """The leadership of an election, kept alive by a `Campaign` stream: a `Lease` whose fencing
    token is the leader's `term`.

    `lost`, `check()`, `on_lost()` and the exit raising `LeaseLost` work as for locks; `proclaim`
    changes the value the others see (`baton.Baton.proclaim` through the client)."""

    def __init__(self, elected, value: bytes, lost_event, proclaim):
        super().__init__("election", elected, lost_event)
        self._token = elected.token
        self._proclaim = proclaim
        #: The value others see as this leader's (the last one proclaimed).
        self.value: bytes = value
        #: How many times the value changed in this term (0 right after the election).
        self.value_revision: int = 0

    def proclaim(self, value: Union[str, bytes, None]) -> int:
        """Changes the value the others see (same term); returns the value's revision. Raises
        `FailedPrecondition` when the leadership has ended."""
        reply = self._proclaim(value)
        self._proclaimed(value, reply)
        return reply.value_revision

    def _proclaimed(self, value, reply) -> None:
        self.value = value.encode("utf-8") if isinstance(value, str) else bytes(value or b"")
        self.value_revision = reply.value_revision

    @property
    def term(self) -> int:
        """The leader's term: strictly increases with every new leader of the election. Pass it
        along with every write the leader makes (it is the `fencing_token`)."""
        return self.fencing_token

    def _what(self) -> str:
        return f"the leadership of election {self.name!r}"

    def __repr__(self) -> str:
        state = "leading" if self.held else f"lost ({self.lost_reason})"
        return f"<Leadership {self.name!r} term={self.term} value={self.value!r} {state}>"

