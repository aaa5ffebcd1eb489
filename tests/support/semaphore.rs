//! Helpers of the SemaphoreService suite (`tests/semaphore/`): request builders and calls that
//! panic naming the call when it fails (the generic stream and Describe helpers are in
//! `lease.rs`).

use std::time::Duration;

use baton::proto::v1::{
    self as pb, semaphore_service_client::SemaphoreServiceClient,
    semaphore_service_hold_response::Event as HoldEvent,
};
use tonic::{Status, Streaming, transport::Channel};

use super::{
    lease::{Described, next_event},
    ms,
};

/// A SemaphoreService client.
pub type Client = SemaphoreServiceClient<Channel>;

/// An Acquire request that tries once, with no owner, not fair.
pub fn request(
    name: &str,
    limit: u32,
    permits: u32,
    ttl_ms: u64,
) -> pb::SemaphoreServiceAcquireRequest {
    pb::SemaphoreServiceAcquireRequest {
        name: name.to_owned(),
        limit,
        permits,
        ttl: Some(ms(ttl_ms)),
        wait_timeout: None,
        owner: String::new(),
        fair: false,
        ..Default::default()
    }
}

/// `request` waiting up to `wait_ms`, fair or not.
pub fn waiting(
    name: &str,
    limit: u32,
    permits: u32,
    ttl_ms: u64,
    wait_ms: u64,
    fair: bool,
) -> pb::SemaphoreServiceAcquireRequest {
    pb::SemaphoreServiceAcquireRequest {
        wait_timeout: Some(ms(wait_ms)),
        fair,
        ..request(name, limit, permits, ttl_ms)
    }
}

/// A Hold request that tries once, with no owner, not fair.
pub fn hold_request(
    name: &str,
    limit: u32,
    permits: u32,
    ttl_ms: u64,
) -> pb::SemaphoreServiceHoldRequest {
    pb::SemaphoreServiceHoldRequest {
        name: name.to_owned(),
        limit,
        permits,
        ttl: Some(ms(ttl_ms)),
        wait_timeout: None,
        owner: String::new(),
        fair: false,
    }
}

/// Sends `request`, panicking if the call fails.
pub async fn acquire(
    client: &mut Client,
    request: pb::SemaphoreServiceAcquireRequest,
) -> pb::SemaphoreServiceAcquireResponse {
    let name = request.name.clone();
    client
        .acquire(request)
        .await
        .unwrap_or_else(|s| panic!("Acquire {name:?} failed: {s:?}"))
        .into_inner()
}

/// Acquires and asserts the permits were granted, returning the permit.
pub async fn acquired(
    client: &mut Client,
    request: pb::SemaphoreServiceAcquireRequest,
) -> pb::SemaphorePermit {
    let name = request.name.clone();
    let response = acquire(client, request).await;
    assert!(
        response.acquired,
        "expected to acquire {name:?}: {response:?}"
    );
    response
        .permit
        .expect("an acquired response carries the permit")
}

/// Acquires and asserts the permits were refused, returning the response.
pub async fn refused(
    client: &mut Client,
    request: pb::SemaphoreServiceAcquireRequest,
) -> pb::SemaphoreServiceAcquireResponse {
    let name = request.name.clone();
    let response = acquire(client, request).await;
    assert!(
        !response.acquired,
        "expected {name:?} to be refused: {response:?}"
    );
    assert!(response.permit.is_none(), "{response:?}");
    response
}

/// Releases the lease of `token`, returning `was_held`; panics if the call fails.
pub async fn release(client: &mut Client, name: &str, token: &str) -> bool {
    client
        .release(pb::SemaphoreServiceReleaseRequest {
            name: name.to_owned(),
            token: token.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Release {name:?} failed: {s:?}"))
        .into_inner()
        .was_held
}

/// Refreshes the lease of `token` to `ttl_ms` (its acquisition ttl when `None`).
pub async fn refresh(
    client: &mut Client,
    name: &str,
    token: &str,
    ttl_ms: Option<u64>,
) -> Result<pb::SemaphoreServiceRefreshResponse, Status> {
    client
        .refresh(pb::SemaphoreServiceRefreshRequest {
            name: name.to_owned(),
            token: token.to_owned(),
            ttl: ttl_ms.map(ms),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Describes semaphore `name`, panicking if the call fails.
pub async fn describe(client: &mut Client, name: &str) -> pb::SemaphoreServiceDescribeResponse {
    client
        .describe(pb::SemaphoreServiceDescribeRequest {
            name: name.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Describe {name:?} failed: {s:?}"))
        .into_inner()
}

impl Described for Client {
    type Description = pb::SemaphoreServiceDescribeResponse;

    async fn describe_name(&mut self, name: &str) -> Self::Description {
        describe(self, name).await
    }

    fn waiters(description: &Self::Description) -> u32 {
        description.waiters
    }
}

/// Opens a Hold stream, panicking if the call fails.
pub async fn hold(
    client: &mut Client,
    request: pb::SemaphoreServiceHoldRequest,
) -> Streaming<pb::SemaphoreServiceHoldResponse> {
    let name = request.name.clone();
    client
        .hold(request)
        .await
        .unwrap_or_else(|s| panic!("Hold {name:?} failed: {s:?}"))
        .into_inner()
}

/// Opens a KeepAlive stream for the lease of `token`, renewing with `ttl_ms` if given.
pub async fn keep_alive(
    client: &mut Client,
    name: &str,
    token: &str,
    ttl_ms: Option<u64>,
) -> Result<Streaming<pb::SemaphoreServiceKeepAliveResponse>, Status> {
    client
        .keep_alive(pb::SemaphoreServiceKeepAliveRequest {
            name: name.to_owned(),
            token: token.to_owned(),
            ttl: ttl_ms.map(ms),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// The `acquired` event that opens a Hold stream.
pub async fn hold_acquired(
    stream: &mut Streaming<pb::SemaphoreServiceHoldResponse>,
) -> pb::SemaphorePermit {
    match next_event(stream, Duration::from_secs(2), "acquired").await {
        HoldEvent::Acquired(permit) => permit,
        other => panic!("expected acquired, got {other:?}"),
    }
}
