"""The lease a holder sees: fencing token, expiry, and whether it was lost."""

from __future__ import annotations

import datetime
import threading
import time
from typing import Callable, List, Optional

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
        self.fencing_token: int = grant.fencing_token
        #: The owner the lease belongs to ("" when anonymous).
        self.owner: str = grant.owner
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
        """Raises `LeaseLost` unless the lease is still held: call it between steps of work."""
        if not self.lost.is_set() and self.remaining <= 0:
            self._lose("EXPIRED", "the lease's expires_at passed with no newer renewal")
        if self.lost.is_set():
            raise self.error()

    def on_lost(self, callback: Callable[["Lease"], None]) -> None:
        """Runs `callback(lease)` once when the lease is lost (at once if it already is)."""
        with self._mutex:
            if self.lost_reason is None:
                self._callbacks.append(callback)
                return
        callback(self)

    def error(self) -> LeaseLost:
        """The `LeaseLost` describing the loss."""
        return LeaseLost(f"{self.kind} {self.name!r} lost ({self.lost_reason}): {self.lost_message}",
                         self.lost_reason or "")

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
