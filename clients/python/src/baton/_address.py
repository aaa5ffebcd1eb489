"""Where Baton is and how to reach it: `BATON_ADDR`, Unix sockets, channel options."""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

#: The address used when neither the caller nor `BATON_ADDR` gives one (Baton's default).
DEFAULT_ADDR = "127.0.0.1:50051"

#: Options every channel gets. Keepalive: the client pings an idle connection every 30 s so a
#: dead Baton is noticed, and never refuses Baton's own pings (Baton pings clients every second
#: of silence to tell a frozen holder from a busy one, and the client library answers them).
BASE_OPTIONS: List[Tuple[str, object]] = [
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect soon after Baton restarts (a sidecar restarts in a second or two).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]

#: The `:authority` sent over a Unix socket. grpc C-core otherwise sends the socket's path,
#: percent-encoded: Baton replaces it with this itself, but Batons older than the package reset
#: such streams, so the package sends a valid one.
UNIX_AUTHORITY = "localhost"


def resolve(addr: Optional[str]) -> Tuple[str, List[Tuple[str, object]]]:
    """The gRPC target and channel options for `addr`, `BATON_ADDR` or the default.

    Accepted forms: `host:port`, `http://host:port`, `https://host:port`, `unix:///path`,
    `unix:/path`, `/path`."""
    target, options, _, _ = parse(addr)
    return target, options


def parse(addr: Optional[str]) -> Tuple[str, List[Tuple[str, object]], bool, bool]:
    """As `resolve`, and whether the address asks for TLS (`https://`) and is a Unix socket."""
    addr = (addr or os.environ.get("BATON_ADDR") or DEFAULT_ADDR).strip()
    options = list(BASE_OPTIONS)
    if addr.startswith("unix:") or addr.startswith("/"):
        path = addr[len("unix:"):] if addr.startswith("unix:") else addr
        if path.startswith("//"):
            path = path[2:]
        if not path.startswith("/"):
            raise ValueError(f"BATON_ADDR: {addr!r}: a Unix socket path must be absolute")
        options.append(("grpc.default_authority", UNIX_AUTHORITY))
        return f"unix:{path}", options, False, True
    https = addr.startswith("https://")
    for scheme in ("http://", "https://", "dns:///"):
        if addr.startswith(scheme):
            addr = addr[len(scheme):]
    if not addr:
        raise ValueError("BATON_ADDR: empty address")
    return addr, options, https, False
