//! The harness shared by every integration test file (`mod support;`): the machinery comes from
//! the `testkit` crate (`tools/testkit`: `redis-server`, Cluster and Sentinel deployments,
//! in-process and child-process Batons, gRPC channels, bounded waits), re-exported here so tests
//! name it `support::...`; what only the service suites need is here:
//!
//! - [`lease`], [`lock`], [`semaphore`]: request builders and stream helpers of the suites;
//! - [`h2`]: raw HTTP/2 frames, for clients that must write their own;
//! - [`Proxy`]: a TCP relay whose connections can be cut at once, to play a client that dies;
//! - assertions on statuses shared by the suites.

// Each test file uses a different part of the harness.
#![allow(dead_code)]

pub mod h2;
pub mod lease;
pub mod lock;
pub mod semaphore;
pub mod tls;

use std::{future::Future, net::SocketAddr, time::Duration};

use baton::proto::v1::{
    lock_service_client::LockServiceClient, semaphore_service_client::SemaphoreServiceClient,
};
pub use testkit::*;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic_types::StatusExt;

// ---------------------------------------------------------------------------------------------
// A TCP relay that can be cut
// ---------------------------------------------------------------------------------------------

/// Relays TCP connections to a target until [`Proxy::cut`], which closes every relayed connection
/// at once and refuses new ones: to Baton, the client vanished as if its process died.
pub struct Proxy {
    addr: SocketAddr,
    cut: CancellationToken,
}

impl Proxy {
    /// Starts relaying from a fresh local port to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the proxy");
        let addr = listener.local_addr().expect("local address");
        let cut = CancellationToken::new();
        let stop = cut.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stop.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                let stop = stop.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        () = stop.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
        });
        Self { addr, cut }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A LockService client whose connection goes through the proxy.
    pub async fn client(&self) -> LockServiceClient<Channel> {
        LockServiceClient::new(channel(self.addr).await)
    }

    /// A SemaphoreService client whose connection goes through the proxy.
    pub async fn semaphore_client(&self) -> SemaphoreServiceClient<Channel> {
        SemaphoreServiceClient::new(channel(self.addr).await)
    }

    /// Closes every relayed connection and stops accepting.
    pub fn cut(&self) {
        self.cut.cancel();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut.cancel();
    }
}

// ---------------------------------------------------------------------------------------------
// Assertions shared by the service suites
// ---------------------------------------------------------------------------------------------

/// Asserts `result` is INVALID_ARGUMENT naming `field` (message prefix and BadRequest detail).
pub fn assert_invalid<T>(result: Result<T, tonic::Status>, field: &str) {
    let status = match result {
        Ok(_) => panic!("expected INVALID_ARGUMENT on {field}, got OK"),
        Err(s) => s,
    };
    assert_eq!(
        status.code(),
        tonic::Code::InvalidArgument,
        "{field}: {status:?}"
    );
    assert!(
        status.message().starts_with(&format!("{field}:")),
        "the message should start with {field:?}: {:?}",
        status.message()
    );
    let details = status.get_error_details();
    let bad = details
        .bad_request()
        .unwrap_or_else(|| panic!("{field}: no BadRequest detail in {status:?}"));
    assert!(
        bad.field_violations.iter().any(|v| v.field == field),
        "{field}: BadRequest names {:?}",
        bad.field_violations
    );
}

/// Asserts `result` failed with `code`, returning the status.
pub fn assert_code<T>(
    result: Result<T, tonic::Status>,
    code: tonic::Code,
    what: &str,
) -> tonic::Status {
    match result {
        Ok(_) => panic!("{what}: expected {code:?}, got OK"),
        Err(s) => {
            assert_eq!(s.code(), code, "{what}: {s:?}");
            s
        }
    }
}

/// Runs `call` and asserts it fails with UNAVAILABLE carrying RetryInfo, in under a second.
pub async fn unavailable_within_1s<T>(
    what: &str,
    call: impl Future<Output = Result<T, tonic::Status>>,
) {
    let started = Instant::now();
    let result = within(Duration::from_secs(5), call, what).await;
    let elapsed = started.elapsed();
    let status = assert_code(result, tonic::Code::Unavailable, what);
    assert!(
        status.get_error_details().retry_info().is_some(),
        "{what}: no RetryInfo in {status:?}"
    );
    assert!(
        elapsed < Duration::from_secs(1),
        "{what}: UNAVAILABLE took {elapsed:?}"
    );
}

/// A duration field that must be set, as a std duration.
pub fn remaining(d: &Option<prost_types::Duration>, what: &str) -> Duration {
    std_duration(
        d.as_ref()
            .unwrap_or_else(|| panic!("{what}: the duration is not set")),
    )
}

/// A well-formed lease token that holds nothing.
pub fn random_token() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}
