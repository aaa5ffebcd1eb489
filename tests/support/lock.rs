//! Helpers of the LockService suite (`tests/lock/`): request builders, calls that panic naming
//! the call when it fails, and bounded waits on what Describe reports (the generic stream and
//! Describe helpers are in `lease.rs`).

use std::time::Duration;

use baton::proto::v1::{
    self as pb, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event as HoldEvent,
};
use tonic::{Status, Streaming, transport::Channel};

use super::{
    lease::{Described, next_event, wait_for_state, wait_for_state_within},
    ms,
};

/// A LockService client.
pub type Client = LockServiceClient<Channel>;

/// An Acquire request with no mode (so exclusive), not fair, waiting `wait_ms` if given.
pub fn acquire_request(
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
) -> pb::LockServiceAcquireRequest {
    pb::LockServiceAcquireRequest {
        name: name.to_owned(),
        ttl: Some(ms(ttl_ms)),
        wait_timeout: wait_ms.map(ms),
        owner: owner.to_owned(),
        ..Default::default()
    }
}

/// Sends `request`, panicking if the call fails.
pub async fn acquire_with(
    client: &mut Client,
    request: pb::LockServiceAcquireRequest,
) -> pb::LockServiceAcquireResponse {
    let name = request.name.clone();
    client
        .acquire(request)
        .await
        .unwrap_or_else(|s| panic!("Acquire {name:?} failed: {s:?}"))
        .into_inner()
}

/// Sends `request` and asserts the lock was granted, returning the lease.
pub async fn granted_with(
    client: &mut Client,
    request: pb::LockServiceAcquireRequest,
) -> pb::LockLease {
    let what = format!(
        "{:?} ({}, fair: {})",
        request.name, request.mode, request.fair
    );
    let response = acquire_with(client, request).await;
    assert!(
        response.acquired,
        "expected to acquire {what}: {response:?}"
    );
    response
        .lease
        .expect("an acquired response carries the lease")
}

/// Sends `request` and asserts the lock was refused, returning the response.
pub async fn refused_with(
    client: &mut Client,
    request: pb::LockServiceAcquireRequest,
) -> pb::LockServiceAcquireResponse {
    let name = request.name.clone();
    let response = acquire_with(client, request).await;
    assert!(
        !response.acquired,
        "expected {name:?} to be refused: {response:?}"
    );
    response
}

/// Sends [`acquire_request`], panicking if the call fails.
pub async fn acquire(
    client: &mut Client,
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
) -> pb::LockServiceAcquireResponse {
    acquire_with(client, acquire_request(name, ttl_ms, wait_ms, owner)).await
}

/// Sends [`acquire_request`] and asserts the lock was granted, returning the lease.
pub async fn acquired(
    client: &mut Client,
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
) -> pb::LockLease {
    granted_with(client, acquire_request(name, ttl_ms, wait_ms, owner)).await
}

/// Releases the hold of `token`, panicking if the call fails.
pub async fn release(
    client: &mut Client,
    name: &str,
    token: &str,
) -> pb::LockServiceReleaseResponse {
    client
        .release(pb::LockServiceReleaseRequest {
            name: name.to_owned(),
            token: token.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Release {name:?} failed: {s:?}"))
        .into_inner()
}

/// Refreshes the hold of `token` to `ttl_ms` (its acquisition ttl when `None`).
pub async fn refresh(
    client: &mut Client,
    name: &str,
    token: &str,
    ttl_ms: Option<u64>,
) -> Result<pb::LockServiceRefreshResponse, Status> {
    client
        .refresh(pb::LockServiceRefreshRequest {
            name: name.to_owned(),
            token: token.to_owned(),
            ttl: ttl_ms.map(ms),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Describes lock `name`, panicking if the call fails.
pub async fn describe(client: &mut Client, name: &str) -> pb::LockServiceDescribeResponse {
    client
        .describe(pb::LockServiceDescribeRequest {
            name: name.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Describe {name:?} failed: {s:?}"))
        .into_inner()
}

impl Described for Client {
    type Description = pb::LockServiceDescribeResponse;

    async fn describe_name(&mut self, name: &str) -> Self::Description {
        describe(self, name).await
    }

    fn waiters(description: &Self::Description) -> u32 {
        description.waiters
    }
}

/// A Hold request with no mode (so exclusive), not fair, waiting `wait_ms` if given.
pub fn hold_request(
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
) -> pb::LockServiceHoldRequest {
    pb::LockServiceHoldRequest {
        name: name.to_owned(),
        ttl: Some(ms(ttl_ms)),
        wait_timeout: wait_ms.map(ms),
        owner: owner.to_owned(),
        ..Default::default()
    }
}

/// Opens a Hold stream of [`hold_request`], panicking if the call fails.
pub async fn hold(
    client: &mut Client,
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
) -> Streaming<pb::LockServiceHoldResponse> {
    client
        .hold(hold_request(name, ttl_ms, wait_ms, owner))
        .await
        .unwrap_or_else(|s| panic!("Hold {name:?} failed: {s:?}"))
        .into_inner()
}

/// Opens a Hold stream of `request` and returns it with the lease of its `acquired` event (read
/// within 5 s).
pub async fn held(
    client: &mut Client,
    request: pb::LockServiceHoldRequest,
) -> (Streaming<pb::LockServiceHoldResponse>, pb::LockLease) {
    let name = request.name.clone();
    let mut stream = client
        .hold(request)
        .await
        .unwrap_or_else(|s| panic!("Hold {name:?} failed: {s:?}"))
        .into_inner();
    match next_event(&mut stream, Duration::from_secs(5), "the acquired event").await {
        HoldEvent::Acquired(lease) => (stream, lease),
        other => panic!("expected acquired, got {other:?}"),
    }
}

/// Waits (at most `limit`) until Describe reports `name` free.
pub async fn wait_until_free(client: &Client, name: &str, limit: Duration) {
    let what = format!("{name:?} to be free");
    wait_for_state_within(client, name, limit, &what, |d| !d.held).await;
}

/// How a test asks for a lock: fair or not, exclusive or shared.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    /// Whether to queue fairly.
    pub fair: bool,
    /// Exclusive or shared.
    pub mode: pb::LockMode,
}

/// Exclusive, not fair.
pub const EXCLUSIVE: Ask = Ask {
    fair: false,
    mode: pb::LockMode::Exclusive,
};

/// Shared, not fair.
pub const SHARED: Ask = Ask {
    fair: false,
    mode: pb::LockMode::Shared,
};

/// Exclusive and fair.
pub const FAIR: Ask = Ask {
    fair: true,
    mode: pb::LockMode::Exclusive,
};

/// Shared and fair.
pub const FAIR_SHARED: Ask = Ask {
    fair: true,
    mode: pb::LockMode::Shared,
};

/// [`acquire_request`] asked `how`.
pub fn ask_request(
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
    ask: Ask,
) -> pb::LockServiceAcquireRequest {
    pb::LockServiceAcquireRequest {
        fair: ask.fair,
        mode: ask.mode.into(),
        ..acquire_request(name, ttl_ms, wait_ms, owner)
    }
}

/// Sends [`ask_request`], panicking if the call fails.
pub async fn ask(
    client: &mut Client,
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
    how: Ask,
) -> pb::LockServiceAcquireResponse {
    acquire_with(client, ask_request(name, ttl_ms, wait_ms, owner, how)).await
}

/// Sends [`ask_request`] and asserts the lock was granted, returning the lease.
pub async fn granted(
    client: &mut Client,
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
    how: Ask,
) -> pb::LockLease {
    granted_with(client, ask_request(name, ttl_ms, wait_ms, owner, how)).await
}

/// A Hold request asked `how`, trying once.
pub fn ask_hold_request(
    name: &str,
    ttl_ms: u64,
    owner: &str,
    how: Ask,
) -> pb::LockServiceHoldRequest {
    pb::LockServiceHoldRequest {
        name: name.to_owned(),
        ttl: Some(ms(ttl_ms)),
        wait_timeout: None,
        owner: owner.to_owned(),
        fair: how.fair,
        mode: how.mode.into(),
    }
}

/// Waits (bounded) until Describe reports `n` waiters in the fair queue of `name`.
pub async fn wait_for_queued(client: &Client, name: &str, n: u32) {
    let what = format!("{n} queued waiter(s) on {name:?}");
    wait_for_state(client, name, &what, |d| d.queued == n).await;
}
