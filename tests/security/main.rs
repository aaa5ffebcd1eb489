//! Serving-side security (docs/security.md) against a real `redis-server`, over real TLS
//! handshakes and real sockets, to an in-process Baton (and the binary for exit codes):
//!
//! - [`tls`]: certificates reloaded when their files change, bad ones refused with the old ones
//!   kept, a bad file at start (exit 2); the Python contract tests (tests/python/test_tls.py)
//!   check TLS and mutual TLS from a stock gRPC client;
//! - [`token`]: the API token: missing, malformed, wrong, right, health without it, rotation;
//! - [`limits`]: lease streams, streams per connection, message size, connections, handshake
//!   deadline, a silent connection and a client that stops reading;
//! - [`socket`]: the Unix socket's mode and group, a stale socket replaced, anything else refused.
//!
//! Certificates are made in the test with `rcgen` ([`certs`]).

#[path = "../support/mod.rs"]
mod support;

mod certs;
mod limits;
mod socket;
mod tls;
mod token;

use std::{path::Path, time::Duration};

use baton::config::ServeConfig;
use support::{Baton, RedisServer, uds_channel, wait_for_health};
use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient};

/// Starts a Baton over `redis` changed by `tweak` (a TLS one too) and waits until readiness is
/// SERVING, asked over its Unix socket, which stays plaintext.
pub async fn start(redis: &RedisServer, tweak: impl FnOnce(&mut ServeConfig)) -> Baton {
    let baton = Baton::start_unready(redis, tweak).await;
    wait_ready(baton.socket_path()).await;
    baton
}

/// Waits (at most 10 s) until readiness is SERVING over the socket at `path`.
pub async fn wait_ready(path: &Path) {
    let mut health = HealthClient::new(uds_channel(path).await);
    wait_for_health(
        &mut health,
        "readiness",
        ServingStatus::Serving,
        Duration::from_secs(10),
    )
    .await;
}
