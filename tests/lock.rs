//! Black-box tests of `baton.v1.LockService` against a real `redis-server`, over gRPC to an
//! in-process Baton bound to port 0 (and its Unix socket).

mod support;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use baton::proto::v1::{
    self as pb, LeaseLostReason, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event as HoldEvent,
    lock_service_keep_alive_response::Event as KeepAliveEvent,
};
use prost::Message;
use support::{
    Baton, Proxy, RedisServer, assert_code, assert_invalid, health_status, ms, random_token,
    remaining, unavailable_within_1s, wait_for_health, wait_until, within,
};
use tokio::{task::JoinSet, time::Instant};
use tonic::{Code, Status, Streaming, transport::Channel};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

type Client = LockServiceClient<Channel>;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn acquire_request(
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
    }
}

async fn acquire(
    client: &mut Client,
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
) -> pb::LockServiceAcquireResponse {
    client
        .acquire(acquire_request(name, ttl_ms, wait_ms, owner))
        .await
        .unwrap_or_else(|s| panic!("Acquire {name:?} failed: {s:?}"))
        .into_inner()
}

/// Acquires and asserts the lock was granted, returning the lease.
async fn acquired(
    client: &mut Client,
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
) -> pb::LockLease {
    let response = acquire(client, name, ttl_ms, wait_ms, owner).await;
    assert!(
        response.acquired,
        "expected to acquire {name:?}: {response:?}"
    );
    response
        .lease
        .expect("an acquired response carries the lease")
}

async fn release(client: &mut Client, name: &str, token: &str) -> pb::LockServiceReleaseResponse {
    client
        .release(pb::LockServiceReleaseRequest {
            name: name.to_owned(),
            token: token.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Release {name:?} failed: {s:?}"))
        .into_inner()
}

async fn refresh(
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

async fn describe(client: &mut Client, name: &str) -> pb::LockServiceDescribeResponse {
    client
        .describe(pb::LockServiceDescribeRequest {
            name: name.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Describe {name:?} failed: {s:?}"))
        .into_inner()
}

async fn hold(
    client: &mut Client,
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
) -> Streaming<pb::LockServiceHoldResponse> {
    client
        .hold(pb::LockServiceHoldRequest {
            name: name.to_owned(),
            ttl: Some(ms(ttl_ms)),
            wait_timeout: wait_ms.map(ms),
            owner: owner.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Hold {name:?} failed: {s:?}"))
        .into_inner()
}

/// The next event of a Hold stream within `limit`; panics if the stream fails or ends.
async fn next_hold_event(
    stream: &mut Streaming<pb::LockServiceHoldResponse>,
    limit: Duration,
    what: &str,
) -> HoldEvent {
    within(limit, stream.message(), what)
        .await
        .unwrap_or_else(|s| panic!("{what}: the Hold stream failed: {s:?}"))
        .unwrap_or_else(|| panic!("{what}: the Hold stream ended"))
        .event
        .unwrap_or_else(|| panic!("{what}: an event without payload"))
}

/// The next event of a KeepAlive stream within `limit`; panics if the stream fails or ends.
async fn next_keep_alive_event(
    stream: &mut Streaming<pb::LockServiceKeepAliveResponse>,
    limit: Duration,
    what: &str,
) -> KeepAliveEvent {
    within(limit, stream.message(), what)
        .await
        .unwrap_or_else(|s| panic!("{what}: the KeepAlive stream failed: {s:?}"))
        .unwrap_or_else(|| panic!("{what}: the KeepAlive stream ended"))
        .event
        .unwrap_or_else(|| panic!("{what}: an event without payload"))
}

/// Waits (bounded) until the stream ends cleanly.
async fn expect_end<T: std::fmt::Debug>(stream: &mut Streaming<T>, what: &str) {
    match within(Duration::from_secs(2), stream.message(), what).await {
        Ok(None) => {}
        other => panic!("{what}: expected the stream to end, got {other:?}"),
    }
}

/// Waits (bounded) until Describe reports `n` waiters on `name`.
async fn wait_for_waiters(client: &Client, name: &str, n: u32) {
    let what = format!("{n} waiter(s) on {name:?}");
    wait_until(Duration::from_secs(5), &what, || {
        let mut client = client.clone();
        async move {
            let d = describe(&mut client, name).await;
            if d.waiters == n { Ok(()) } else { Err(d) }
        }
    })
    .await;
}

/// Like [`wait_for_waiters`], but fails at once with the waiter's outcome if `waiter` ends first.
async fn wait_for_waiters_while<T: std::fmt::Debug>(
    client: &Client,
    name: &str,
    n: u32,
    waiter: &mut tokio::task::JoinHandle<T>,
) {
    tokio::select! {
        () = wait_for_waiters(client, name, n) => {}
        outcome = waiter => panic!("the waiter ended before waiting on {name:?}: {outcome:?}"),
    }
}

/// Waits (at most `limit`) until Describe reports `name` free.
async fn wait_until_free(client: &Client, name: &str, limit: Duration) {
    let what = format!("{name:?} to be free");
    wait_until(limit, &what, || {
        let mut client = client.clone();
        async move {
            let d = describe(&mut client, name).await;
            if d.held { Err(d) } else { Ok(()) }
        }
    })
    .await;
}

async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

async fn exists(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

// ---------------------------------------------------------------------------------------------
// Success paths of each RPC
// ---------------------------------------------------------------------------------------------

/// Acquire grants a lease with a UUID token, a positive fencing token, the full ttl, one hold and
/// the owner echoed (or generated when empty); Redis holds the lease key with that ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_grants_a_complete_lease() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = acquired(&mut client, "orders", 10_000, None, "alice").await;
    assert_eq!(lease.name, "orders");
    let token = uuid::Uuid::parse_str(&lease.token).expect("the token is a UUID");
    assert_eq!(token.hyphenated().to_string(), lease.token);
    assert!(lease.fencing_token > 0, "{lease:?}");
    let left = remaining(&lease.remaining_ttl, "lease");
    assert!(
        left > Duration::from_millis(9_500) && left <= Duration::from_secs(10),
        "{left:?}"
    );
    assert_eq!(lease.hold_count, 1);
    assert_eq!(lease.owner, "alice");

    let mut conn = redis.client().await;
    let key = baton.lock_key("orders");
    let ttl = pttl(&mut conn, &key).await;
    assert!((9_000..=10_000).contains(&ttl), "PTTL {key} = {ttl}");

    let anonymous = acquired(&mut client, "anonymous", 10_000, None, "").await;
    assert!(
        !anonymous.owner.is_empty(),
        "an empty owner is replaced by a generated one"
    );
    assert_ne!(anonymous.token, lease.token);
    assert!(uuid::Uuid::parse_str(&anonymous.token).is_ok());
}

/// Releasing the only hold answers was_held with no holds left, removes the lease from Redis,
/// and Describe then reports the lock free with the last fencing token issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_frees_the_lock() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut conn = redis.client().await;

    let lease = acquired(&mut client, "orders", 10_000, None, "alice").await;
    assert!(exists(&mut conn, &baton.lock_key("orders")).await);

    let released = release(&mut client, "orders", &lease.token).await;
    assert!(released.was_held);
    assert_eq!(released.remaining_holds, 0);
    assert!(!exists(&mut conn, &baton.lock_key("orders")).await);

    let d = describe(&mut client, "orders").await;
    assert!(!d.held, "{d:?}");
    assert_eq!(d.hold_count, 0);
    assert_eq!(d.owner, "");
    assert_eq!(d.remaining_ttl, None);
    assert_eq!(d.fencing_token, lease.fencing_token);

    let again = acquired(&mut client, "orders", 10_000, None, "bob").await;
    assert!(again.fencing_token > lease.fencing_token);
}

/// Refresh sets the remaining ttl to the requested value (Redis's PTTL agrees), and without a
/// ttl goes back to the acquisition ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_sets_the_remaining_ttl() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut conn = redis.client().await;
    let key = baton.lock_key("orders");

    let lease = acquired(&mut client, "orders", 2_000, None, "alice").await;

    let refreshed = refresh(&mut client, "orders", &lease.token, Some(20_000))
        .await
        .expect("refresh with a ttl");
    assert_eq!(
        remaining(&refreshed.remaining_ttl, "refresh"),
        Duration::from_secs(20)
    );
    let ttl = pttl(&mut conn, &key).await;
    assert!((19_000..=20_000).contains(&ttl), "PTTL {ttl}");
    let d = describe(&mut client, "orders").await;
    let left = remaining(&d.remaining_ttl, "describe");
    assert!(
        left > Duration::from_secs(19) && left <= Duration::from_secs(20),
        "{left:?}"
    );

    let back = refresh(&mut client, "orders", &lease.token, None)
        .await
        .expect("refresh without a ttl");
    assert_eq!(
        remaining(&back.remaining_ttl, "refresh"),
        Duration::from_secs(2)
    );
    let ttl = pttl(&mut conn, &key).await;
    assert!((1_500..=2_000).contains(&ttl), "PTTL {ttl}");
}

/// Describe reports a never-used lock as free with no fencing token; a held one with its owner,
/// hold count, fencing token and remaining ttl; and counts a caller waiting for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_reports_holder_and_waiters() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let d = describe(&mut client, "orders").await;
    assert_eq!(
        d,
        pb::LockServiceDescribeResponse::default(),
        "a lock never used is free, with no fencing token and no waiters"
    );

    let lease = acquired(&mut client, "orders", 10_000, None, "bob").await;
    let d = describe(&mut client, "orders").await;
    assert!(d.held);
    assert_eq!(d.owner, "bob");
    assert_eq!(d.hold_count, 1);
    assert_eq!(d.fencing_token, lease.fencing_token);
    let left = remaining(&d.remaining_ttl, "describe");
    assert!(
        left > Duration::from_secs(9) && left <= Duration::from_secs(10),
        "{left:?}"
    );
    assert_eq!(d.waiters, 0);

    let mut waiter_client = baton.client().await;
    let mut waiter = tokio::spawn(async move {
        acquire(&mut waiter_client, "orders", 10_000, Some(5_000), "carol").await
    });
    wait_for_waiters_while(&client, "orders", 1, &mut waiter).await;

    assert!(release(&mut client, "orders", &lease.token).await.was_held);
    let got = within(Duration::from_secs(2), waiter, "the waiter to acquire")
        .await
        .expect("waiter task");
    assert!(got.acquired, "{got:?}");
    let d = describe(&mut client, "orders").await;
    assert_eq!(d.owner, "carol");
    assert_eq!(d.waiters, 0, "the waiter stopped waiting: {d:?}");
    assert!(d.fencing_token > lease.fencing_token);
}

/// Hold with a 300 ms ttl sends `acquired`, then `renewed` events (about every 100 ms) that keep
/// the lock held for a second, past its ttl; dropping the stream frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_sends_acquired_then_renewals() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut stream = hold(&mut client, "orders", 300, None, "holder").await;
    let lease = match next_hold_event(&mut stream, Duration::from_secs(2), "acquired").await {
        HoldEvent::Acquired(lease) => lease,
        other => panic!("expected acquired, got {other:?}"),
    };
    assert_eq!(lease.owner, "holder");
    assert_eq!(lease.hold_count, 1);
    assert!(lease.fencing_token > 0);
    assert_eq!(
        remaining(&lease.remaining_ttl, "acquired"),
        Duration::from_millis(300)
    );

    let end = Instant::now() + Duration::from_secs(1);
    let mut renewals = 0;
    while let Ok(message) = tokio::time::timeout_at(end, stream.message()).await {
        match message {
            Ok(Some(pb::LockServiceHoldResponse {
                event: Some(HoldEvent::Renewed(r)),
            })) => {
                renewals += 1;
                assert_eq!(
                    remaining(&r.remaining_ttl, "renewed"),
                    Duration::from_millis(300)
                );
            }
            other => panic!("expected only renewals, got {other:?}"),
        }
    }
    assert!(
        renewals >= 5,
        "{renewals} renewals in 1 s with a 300 ms ttl"
    );

    let d = describe(&mut client, "orders").await;
    assert!(d.held, "the lease outlived its ttl: {d:?}");
    assert_eq!(d.fencing_token, lease.fencing_token);
    assert_eq!(d.owner, "holder");

    drop(stream);
    wait_until_free(&client, "orders", Duration::from_secs(1)).await;
}

/// KeepAlive on an acquired lease answers `renewed` at once and keeps the lease alive past its
/// ttl while open; closing the stream releases the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_keeps_an_acquired_lease_alive() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = acquired(&mut client, "orders", 300, None, "alice").await;
    let mut stream = client
        .keep_alive(pb::LockServiceKeepAliveRequest {
            name: "orders".into(),
            token: lease.token.clone(),
            ttl: None,
        })
        .await
        .expect("KeepAlive")
        .into_inner();
    match next_keep_alive_event(&mut stream, Duration::from_millis(200), "first renewal").await {
        KeepAliveEvent::Renewed(r) => assert_eq!(
            remaining(&r.remaining_ttl, "renewed"),
            Duration::from_millis(300)
        ),
        other => panic!("expected renewed first, got {other:?}"),
    }

    let end = Instant::now() + Duration::from_secs(1);
    let mut renewals = 0;
    while let Ok(message) = tokio::time::timeout_at(end, stream.message()).await {
        match message {
            Ok(Some(pb::LockServiceKeepAliveResponse {
                event: Some(KeepAliveEvent::Renewed(_)),
            })) => renewals += 1,
            other => panic!("expected only renewals, got {other:?}"),
        }
    }
    assert!(
        renewals >= 5,
        "{renewals} renewals in 1 s with a 300 ms ttl"
    );
    let d = describe(&mut client, "orders").await;
    assert!(d.held, "the lease outlived its 300 ms ttl: {d:?}");
    assert_eq!(d.fencing_token, lease.fencing_token);
    assert_eq!(d.owner, "alice");

    drop(stream);
    wait_until_free(&client, "orders", Duration::from_secs(1)).await;
}

/// A KeepAlive stream whose lease is released elsewhere reports `lost` with NOT_HELD at the next
/// renewal and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_reports_not_held_when_released_elsewhere() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = acquired(&mut client, "orders", 300, None, "alice").await;
    let mut stream = client
        .keep_alive(pb::LockServiceKeepAliveRequest {
            name: "orders".into(),
            token: lease.token.clone(),
            ttl: None,
        })
        .await
        .expect("KeepAlive")
        .into_inner();
    assert!(matches!(
        next_keep_alive_event(&mut stream, Duration::from_millis(200), "first renewal").await,
        KeepAliveEvent::Renewed(_)
    ));
    assert!(release(&mut client, "orders", &lease.token).await.was_held);

    loop {
        match next_keep_alive_event(&mut stream, Duration::from_secs(1), "lost").await {
            KeepAliveEvent::Renewed(_) => continue,
            KeepAliveEvent::Lost(lost) => {
                assert_eq!(lost.reason(), LeaseLostReason::NotHeld, "{lost:?}");
                break;
            }
        }
    }
    expect_end(&mut stream, "the KeepAlive stream after lost").await;
}

/// Hold on a lock held by someone else, without waiting, sends one `not_acquired` with the
/// holder's remaining ttl and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_on_a_held_lock_reports_not_acquired() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    acquired(&mut client, "orders", 10_000, None, "alice").await;
    let mut stream = hold(&mut client, "orders", 1_000, None, "bob").await;
    match next_hold_event(&mut stream, Duration::from_secs(1), "not_acquired").await {
        HoldEvent::NotAcquired(n) => {
            let left = remaining(&n.holder_remaining_ttl, "not_acquired");
            assert!(
                left > Duration::ZERO && left <= Duration::from_secs(10),
                "{left:?}"
            );
        }
        other => panic!("expected not_acquired, got {other:?}"),
    }
    expect_end(&mut stream, "the Hold stream after not_acquired").await;
    assert_eq!(describe(&mut client, "orders").await.owner, "alice");
}

// ---------------------------------------------------------------------------------------------
// Failure paths
// ---------------------------------------------------------------------------------------------

/// Every malformed field is INVALID_ARGUMENT whose message starts with the field's name and whose
/// BadRequest detail names it; values at the limits are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_name_the_field() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let long_name = "n".repeat(1025);
    let long_owner = "o".repeat(257);

    let cases: Vec<(&str, pb::LockServiceAcquireRequest)> = vec![
        ("name", acquire_request("", 1_000, None, "")),
        ("name", acquire_request(&long_name, 1_000, None, "")),
        (
            "ttl",
            pb::LockServiceAcquireRequest {
                ttl: None,
                ..acquire_request("a", 1_000, None, "")
            },
        ),
        ("ttl", acquire_request("a", 5, None, "")),
        ("ttl", acquire_request("a", 2 * 3600 * 1000, None, "")),
        (
            "wait_timeout",
            acquire_request("a", 1_000, Some(2 * 3600 * 1000), ""),
        ),
        ("owner", acquire_request("a", 1_000, None, &long_owner)),
    ];
    for (field, request) in cases {
        assert_invalid(client.acquire(request).await, field);
    }
    assert_eq!(
        describe(&mut client, "a").await,
        pb::LockServiceDescribeResponse::default(),
        "no invalid request touched the lock"
    );

    // The limits themselves are valid.
    acquired(&mut client, &"n".repeat(1024), 10, None, &"o".repeat(256)).await;
    acquired(&mut client, "max", 3600 * 1000, Some(0), "").await;

    let malformed = "not-a-token";
    assert_invalid(
        client
            .release(pb::LockServiceReleaseRequest {
                name: "a".into(),
                token: malformed.into(),
            })
            .await,
        "token",
    );
    assert_invalid(
        client
            .release(pb::LockServiceReleaseRequest {
                name: "a".into(),
                token: String::new(),
            })
            .await,
        "token",
    );
    assert_invalid(
        client
            .release(pb::LockServiceReleaseRequest {
                name: String::new(),
                token: random_token(),
            })
            .await,
        "name",
    );
    assert_invalid(refresh(&mut client, "a", malformed, None).await, "token");
    assert_invalid(
        refresh(&mut client, "a", &random_token(), Some(5)).await,
        "ttl",
    );
    assert_invalid(
        client
            .keep_alive(pb::LockServiceKeepAliveRequest {
                name: "a".into(),
                token: malformed.into(),
                ttl: None,
            })
            .await,
        "token",
    );
    assert_invalid(
        client
            .hold(pb::LockServiceHoldRequest {
                name: "a".into(),
                ttl: Some(ms(50)),
                wait_timeout: None,
                owner: String::new(),
            })
            .await,
        "ttl",
    );
    assert_invalid(
        client
            .hold(pb::LockServiceHoldRequest {
                name: String::new(),
                ttl: Some(ms(1_000)),
                wait_timeout: None,
                owner: String::new(),
            })
            .await,
        "name",
    );
    assert_invalid(
        client
            .describe(pb::LockServiceDescribeRequest {
                name: String::new(),
            })
            .await,
        "name",
    );
}

/// KeepAlive renews with at least 100 ms: an explicit shorter ttl, or none on a lease acquired
/// with less, is INVALID_ARGUMENT on `ttl` and leaves the lease as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_needs_a_ttl_of_at_least_100ms() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    // A lease acquired with 99 ms, then given 10 s once, still has a 99 ms acquisition ttl.
    let lease = acquired(&mut client, "orders", 99, None, "alice").await;
    refresh(&mut client, "orders", &lease.token, Some(10_000))
        .await
        .expect("refresh within the 99 ms lease");

    let keep_alive = |ttl: Option<u64>| {
        let mut client = client.clone();
        let token = lease.token.clone();
        async move {
            client
                .keep_alive(pb::LockServiceKeepAliveRequest {
                    name: "orders".into(),
                    token,
                    ttl: ttl.map(ms),
                })
                .await
        }
    };
    assert_invalid(keep_alive(Some(50)).await, "ttl");
    assert_invalid(keep_alive(None).await, "ttl");
    let d = describe(&mut client, "orders").await;
    assert!(d.held);
    let left = remaining(&d.remaining_ttl, "describe");
    assert!(
        left > Duration::from_secs(9),
        "a refused KeepAlive must not change the lease: {left:?} left"
    );
}

/// Refresh with a well-formed token that does not hold the lock fails with FAILED_PRECONDITION:
/// someone else's lock, a free lock, and a lease already released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_with_a_wrong_token_fails_precondition() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = acquired(&mut client, "orders", 10_000, None, "alice").await;
    assert_code(
        refresh(&mut client, "orders", &random_token(), Some(1_000)).await,
        Code::FailedPrecondition,
        "refresh of someone else's lock",
    );
    assert_code(
        refresh(&mut client, "free", &random_token(), None).await,
        Code::FailedPrecondition,
        "refresh of a free lock",
    );
    release(&mut client, "orders", &lease.token).await;
    assert_code(
        refresh(&mut client, "orders", &lease.token, None).await,
        Code::FailedPrecondition,
        "refresh of a released lease",
    );
    assert!(!describe(&mut client, "orders").await.held);
}

/// KeepAlive with a token that does not hold the lock fails with FAILED_PRECONDITION instead of
/// opening a stream, and the holder keeps its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_with_a_wrong_token_fails_precondition() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = acquired(&mut client, "orders", 10_000, None, "alice").await;
    let result = client
        .keep_alive(pb::LockServiceKeepAliveRequest {
            name: "orders".into(),
            token: random_token(),
            ttl: Some(ms(60_000)),
        })
        .await;
    assert_code(
        result,
        Code::FailedPrecondition,
        "KeepAlive with a wrong token",
    );
    let d = describe(&mut client, "orders").await;
    assert_eq!(d.fencing_token, lease.fencing_token);
    assert!(
        remaining(&d.remaining_ttl, "describe") <= Duration::from_secs(10),
        "the wrong token did not extend the lease: {d:?}"
    );
}

/// Release with another token answers was_held=false and leaves the real holder's lease as it
/// was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_with_a_wrong_token_changes_nothing() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = acquired(&mut client, "orders", 10_000, None, "alice").await;
    let before = describe(&mut client, "orders").await;
    let released = release(&mut client, "orders", &random_token()).await;
    assert!(!released.was_held);
    assert_eq!(released.remaining_holds, 0);
    let after = describe(&mut client, "orders").await;
    assert!(after.held);
    assert_eq!(after.owner, "alice");
    assert_eq!(after.hold_count, before.hold_count);
    assert_eq!(after.fencing_token, lease.fencing_token);
    assert!(release(&mut client, "orders", &lease.token).await.was_held);
}

/// A retried Release is harmless: the retry answers was_held=false and does not free the lock
/// taken meanwhile by someone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_release_is_harmless() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let first = acquired(&mut client, "orders", 10_000, None, "alice").await;
    assert!(release(&mut client, "orders", &first.token).await.was_held);
    let second = acquired(&mut client, "orders", 10_000, None, "bob").await;

    let retry = release(&mut client, "orders", &first.token).await;
    assert!(!retry.was_held);
    assert_eq!(retry.remaining_holds, 0);
    let d = describe(&mut client, "orders").await;
    assert!(d.held);
    assert_eq!(d.owner, "bob");
    assert_eq!(d.fencing_token, second.fencing_token);
}

// ---------------------------------------------------------------------------------------------
// Semantics
// ---------------------------------------------------------------------------------------------

/// The same owner acquiring three times gets hold counts 1, 2, 3 with one token and one fencing
/// token; releases count down 2, 1, 0, and another owner gets the lock only after the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_acquires_count_holds() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut leases = Vec::new();
    for expected in 1..=3 {
        let lease = acquired(&mut client, "orders", 10_000, None, "worker-1").await;
        assert_eq!(lease.hold_count, expected);
        assert_eq!(lease.owner, "worker-1");
        leases.push(lease);
    }
    assert!(leases.iter().all(|l| l.token == leases[0].token));
    assert!(
        leases
            .iter()
            .all(|l| l.fencing_token == leases[0].fencing_token)
    );
    assert_eq!(describe(&mut client, "orders").await.hold_count, 3);

    let token = leases[0].token.clone();
    for expected in [2, 1] {
        let released = release(&mut client, "orders", &token).await;
        assert!(released.was_held);
        assert_eq!(released.remaining_holds, expected);
        let other = acquire(&mut client, "orders", 10_000, None, "worker-2").await;
        assert!(!other.acquired, "{expected} holds left: {other:?}");
    }
    let last = release(&mut client, "orders", &token).await;
    assert!(last.was_held);
    assert_eq!(last.remaining_holds, 0);
    let other = acquired(&mut client, "orders", 10_000, None, "worker-2").await;
    assert!(other.fencing_token > leases[0].fencing_token);
    assert_eq!(other.hold_count, 1);
}

/// Without an owner every Acquire is a new owner, so a second one does not reenter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_without_owner_is_never_reentrant() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let first = acquired(&mut client, "orders", 10_000, None, "").await;
    let second = acquire(&mut client, "orders", 10_000, None, "").await;
    assert!(!second.acquired, "{second:?}");
    assert!(second.lease.is_none());
    assert_eq!(describe(&mut client, "orders").await.hold_count, 1);
    assert!(release(&mut client, "orders", &first.token).await.was_held);
}

/// Without a wait_timeout (or with zero) Acquire on a held lock answers at once: acquired=false
/// with the holder's remaining ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_once_reports_holder_ttl() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    acquired(&mut client, "orders", 10_000, None, "alice").await;
    for wait in [None, Some(0)] {
        let started = Instant::now();
        let response = acquire(&mut client, "orders", 10_000, wait, "bob").await;
        let elapsed = started.elapsed();
        assert!(!response.acquired);
        assert!(response.lease.is_none());
        let left = remaining(&response.holder_remaining_ttl, "holder_remaining_ttl");
        assert!(
            left > Duration::ZERO && left <= Duration::from_secs(10),
            "{left:?}"
        );
        assert!(
            elapsed < Duration::from_millis(500),
            "wait {wait:?} tries once, took {elapsed:?}"
        );
    }
}

/// Waiting 200 ms on a lock held for 10 s ends with acquired=false after about 200 ms, the
/// holder's remaining ttl, and no waiter left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_times_out_with_holder_ttl() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    acquired(&mut client, "orders", 10_000, None, "alice").await;
    let started = Instant::now();
    let response = acquire(&mut client, "orders", 1_000, Some(200), "bob").await;
    let elapsed = started.elapsed();
    assert!(!response.acquired, "{response:?}");
    assert!(
        elapsed >= Duration::from_millis(150) && elapsed < Duration::from_millis(1_500),
        "a 200 ms wait took {elapsed:?}"
    );
    let left = remaining(&response.holder_remaining_ttl, "holder_remaining_ttl");
    assert!(
        left > Duration::from_secs(8) && left <= Duration::from_secs(10),
        "{left:?}"
    );
    assert_eq!(describe(&mut client, "orders").await.waiters, 0);
}

/// A wait longer than the caller's gRPC deadline is cut short so that the answer
/// (acquired=false) arrives before the deadline instead of DEADLINE_EXCEEDED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_is_cut_to_the_callers_deadline() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    acquired(&mut client, "orders", 30_000, None, "alice").await;
    let mut request = tonic::Request::new(acquire_request("orders", 1_000, Some(10_000), "bob"));
    request.set_timeout(Duration::from_millis(500));
    let started = Instant::now();
    let response = client
        .acquire(request)
        .await
        .expect("an answer before the deadline, not DEADLINE_EXCEEDED")
        .into_inner();
    let elapsed = started.elapsed();
    assert!(!response.acquired);
    assert!(response.holder_remaining_ttl.is_some());
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(500),
        "answered after {elapsed:?} for a 500 ms deadline"
    );
}

/// A waiting Acquire whose caller gives up leaves no waiter behind and never gets the lock later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_wait_leaves_nothing_behind() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = acquired(&mut client, "orders", 30_000, None, "alice").await;
    let mut waiter_client = baton.client().await;
    let mut waiter = tokio::spawn(async move {
        acquire(&mut waiter_client, "orders", 30_000, Some(10_000), "bob").await
    });
    wait_for_waiters_while(&client, "orders", 1, &mut waiter).await;
    waiter.abort();
    assert!(
        waiter.await.is_err_and(|e| e.is_cancelled()),
        "the waiter was cancelled"
    );
    wait_for_waiters(&client, "orders", 0).await;

    assert!(release(&mut client, "orders", &lease.token).await.was_held);
    let d = describe(&mut client, "orders").await;
    assert!(
        !d.held,
        "the cancelled waiter must not take the lock: {d:?}"
    );
}

/// 16 clients × 200 acquisitions of one lock: a non-atomic GET-then-SET of a Redis counter inside
/// the critical section loses no update, no two holders overlap, and fencing tokens strictly
/// increase in the order the lock was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_under_contention() {
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 200;
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let counter = format!("{}counter", baton.prefix());
    let fences = Arc::new(Mutex::new(Vec::with_capacity(CLIENTS * ROUNDS)));
    let inside = Arc::new(AtomicBool::new(false));

    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..CLIENTS {
        let mut client = baton.client().await;
        let mut conn = redis.client().await;
        let counter = counter.clone();
        let fences = fences.clone();
        let inside = inside.clone();
        tasks.spawn(async move {
            for _ in 0..ROUNDS {
                let lease = acquired(&mut client, "counter", 5_000, Some(30_000), "").await;
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "two holders in the critical section at once"
                );
                let value: Option<u64> = redis::cmd("GET")
                    .arg(&counter)
                    .query_async(&mut conn)
                    .await
                    .expect("GET");
                let () = redis::cmd("SET")
                    .arg(&counter)
                    .arg(value.unwrap_or(0) + 1)
                    .query_async(&mut conn)
                    .await
                    .expect("SET");
                fences
                    .lock()
                    .expect("no panic while holding the mutex")
                    .push(lease.fencing_token);
                inside.store(false, Ordering::SeqCst);
                let released = release(&mut client, "counter", &lease.token).await;
                assert!(released.was_held, "the lease was still held at release");
            }
        });
    }
    within(
        Duration::from_secs(60),
        async {
            while let Some(joined) = tasks.join_next().await {
                joined.expect("a client task failed");
            }
        },
        "every client to finish its acquisitions",
    )
    .await;
    let elapsed = started.elapsed();

    let mut conn = redis.client().await;
    let total: u64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(total, (CLIENTS * ROUNDS) as u64, "lost updates");
    let fences = fences.lock().expect("no poisoned mutex");
    assert_eq!(fences.len(), CLIENTS * ROUNDS);
    if let Some(w) = fences.windows(2).find(|w| w[0] >= w[1]) {
        panic!("fencing tokens went {} then {}", w[0], w[1]);
    }
    eprintln!(
        "{} acquisitions by {CLIENTS} clients in {elapsed:?}",
        CLIENTS * ROUNDS
    );
}

/// A waiter blocked on a lock held for 30 s gets it within 50 ms of the holder's Release
/// returning: the release wakes it through pub/sub, not the holder's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_a_waiter_at_once() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = acquired(&mut client, "orders", 30_000, None, "alice").await;
    let mut waiter_client = baton.client().await;
    let mut waiter = tokio::spawn(async move {
        let response = acquire(&mut waiter_client, "orders", 30_000, Some(10_000), "bob").await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&client, "orders", 1, &mut waiter).await;

    assert!(release(&mut client, "orders", &lease.token).await.was_held);
    let released_at = Instant::now();
    let (response, woke_at) = within(Duration::from_secs(2), waiter, "the waiter to acquire")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let latency = woke_at.saturating_duration_since(released_at);
    assert!(
        latency < Duration::from_millis(50),
        "the waiter got the lock {latency:?} after the release"
    );
}

/// Two Batons sharing a Redis and a key prefix act as one: a caller waiting on one is counted by
/// the other's Describe and is woken within 50 ms when the holder releases through the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_one_baton_wakes_a_waiter_on_another() {
    let redis = RedisServer::start().await;
    let first = Baton::start(&redis).await;
    let prefix = first.prefix().to_owned();
    let second = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix).await;
    let mut holder = first.client().await;

    let lease = acquired(&mut holder, "orders", 30_000, None, "alice").await;
    let mut waiter_client = second.client().await;
    let mut waiter = tokio::spawn(async move {
        let response = acquire(&mut waiter_client, "orders", 30_000, Some(10_000), "bob").await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&holder, "orders", 1, &mut waiter).await;

    assert!(release(&mut holder, "orders", &lease.token).await.was_held);
    let released_at = Instant::now();
    let (response, woke_at) = within(Duration::from_secs(2), waiter, "the waiter to acquire")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let latency = woke_at.saturating_duration_since(released_at);
    assert!(
        latency < Duration::from_millis(50),
        "the waiter on the other Baton got the lock {latency:?} after the release"
    );
    assert_eq!(describe(&mut holder, "orders").await.owner, "bob");
}

/// A holder that never releases (ttl 300 ms) is noticed at its expiry: a waiter gets the lock
/// after about 300 ms, without any release published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_wakes_a_waiter() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let started = Instant::now();
    let holder = acquired(&mut client, "orders", 300, None, "alice").await;
    let response = acquire(&mut client, "orders", 10_000, Some(5_000), "bob").await;
    let elapsed = started.elapsed();
    assert!(response.acquired, "{response:?}");
    assert!(
        elapsed >= Duration::from_millis(250) && elapsed < Duration::from_millis(1_500),
        "got a 300 ms lock after {elapsed:?}"
    );
    assert!(response.lease.expect("lease").fencing_token > holder.fencing_token);
}

/// A Hold client that drops its stream frees the lock at once: a waiter gets it long before the
/// 30 s ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_hold_stream_frees_the_lock() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut a = baton.client().await;
    let mut b = baton.client().await;

    let mut stream = hold(&mut a, "orders", 30_000, None, "alice").await;
    assert!(matches!(
        next_hold_event(&mut stream, Duration::from_secs(2), "acquired").await,
        HoldEvent::Acquired(_)
    ));
    let mut waiter = tokio::spawn(async move {
        let response = acquire(&mut b, "orders", 10_000, Some(10_000), "bob").await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&a, "orders", 1, &mut waiter).await;

    drop(stream);
    let dropped_at = Instant::now();
    let (response, got_at) = within(Duration::from_secs(2), waiter, "the waiter to acquire")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let after = got_at.saturating_duration_since(dropped_at);
    assert!(
        after < Duration::from_millis(500),
        "the lock was freed {after:?} after the stream was dropped"
    );
}

// ---------------------------------------------------------------------------------------------
// Redis outages
// ---------------------------------------------------------------------------------------------

/// Redis killed while a Hold (ttl 1 s) is open: the stream reports `lost` UNCONFIRMED before the
/// lease could have expired, then ends; after Redis restarts on the same port, the same Baton
/// grants locks again and readiness returns to SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_during_hold_reports_lost_before_expiry() {
    let mut redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut health = baton.health().await;

    let mut stream = hold(&mut client, "orders", 1_000, None, "alice").await;
    let (mut confirmed_at, mut valid_for) =
        match next_hold_event(&mut stream, Duration::from_secs(2), "acquired").await {
            HoldEvent::Acquired(lease) => {
                (Instant::now(), remaining(&lease.remaining_ttl, "acquired"))
            }
            other => panic!("expected acquired, got {other:?}"),
        };
    redis.kill();

    let lost = loop {
        match next_hold_event(&mut stream, Duration::from_secs(3), "lost").await {
            HoldEvent::Renewed(r) => {
                confirmed_at = Instant::now();
                valid_for = remaining(&r.remaining_ttl, "renewed");
            }
            HoldEvent::Lost(lost) => break lost,
            other => panic!("expected renewed or lost, got {other:?}"),
        }
    };
    let lost_at = Instant::now();
    assert_eq!(lost.reason(), LeaseLostReason::Unconfirmed, "{lost:?}");
    let expiry = confirmed_at + valid_for;
    assert!(
        lost_at < expiry,
        "lost arrived {:?} after the lease could have expired",
        lost_at - expiry
    );
    expect_end(&mut stream, "the Hold stream after lost").await;

    // Redis is down: a unary call fails fast instead of hanging.
    let started = Instant::now();
    let result = client
        .acquire(acquire_request("other", 1_000, None, ""))
        .await;
    let elapsed = started.elapsed();
    assert_code(result, Code::Unavailable, "Acquire with Redis down");
    assert!(
        elapsed < Duration::from_secs(1),
        "UNAVAILABLE took {elapsed:?}"
    );

    redis.restart().await;
    let lease = wait_until(
        Duration::from_secs(5),
        "an Acquire to succeed after Redis restarted",
        || {
            let mut client = client.clone();
            async move {
                match client
                    .acquire(acquire_request("orders", 10_000, None, "bob"))
                    .await
                {
                    Ok(r) if r.get_ref().acquired => Ok(r.into_inner().lease.expect("lease")),
                    other => Err(other),
                }
            }
        },
    )
    .await;
    assert_eq!(lease.owner, "bob");
    wait_for_health(
        &mut health,
        "readiness",
        ServingStatus::Serving,
        Duration::from_secs(5),
    )
    .await;
}

/// After a Redis outage of a few seconds, waiting for a lock (which needs Baton's pub/sub
/// subscription) works as soon as Redis answers again, instead of failing with UNAVAILABLE: the
/// contract reserves UNAVAILABLE for a Redis that does not answer within the command timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_works_as_soon_as_redis_is_back() {
    let mut redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut health = baton.health().await;

    redis.kill();
    wait_for_health(
        &mut health,
        "readiness",
        ServingStatus::NotServing,
        Duration::from_secs(3),
    )
    .await;
    // The outage lasts a few seconds (the scenario, not a pause): long enough for any reconnect
    // backoff to reach its cap.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    redis.restart().await;

    // Redis answers again: a holder takes the lock (no pub/sub involved)...
    let lease = acquired(&mut client, "orders", 10_000, None, "alice").await;
    // ...and a caller starts waiting for it, which needs the pub/sub subscription.
    let mut waiter_client = baton.client().await;
    let started = Instant::now();
    let mut waiter = tokio::spawn(async move {
        let response = waiter_client
            .acquire(acquire_request("orders", 10_000, Some(5_000), "bob"))
            .await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&client, "orders", 1, &mut waiter).await;
    assert!(release(&mut client, "orders", &lease.token).await.was_held);
    let released_at = Instant::now();
    let (response, woke_at) = within(Duration::from_secs(2), waiter, "the waiter to acquire")
        .await
        .expect("waiter task");
    let response = response
        .unwrap_or_else(|s| {
            panic!(
                "waiting with Redis answering failed {:?} after the call: {s:?}",
                woke_at - started
            )
        })
        .into_inner();
    assert!(response.acquired, "{response:?}");
    let latency = woke_at.saturating_duration_since(released_at);
    assert!(
        latency < Duration::from_millis(200),
        "the release woke the waiter after {latency:?}"
    );
}

/// With Redis down every call answers UNAVAILABLE (with RetryInfo) within 1 s instead of
/// hanging: Acquire (trying once and waiting), Release, Refresh, Describe, Hold and KeepAlive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_fast_when_redis_is_down() {
    let mut redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let lease = acquired(&mut client, "orders", 10_000, None, "alice").await;
    redis.kill();

    let mut c = client.clone();
    unavailable_within_1s("Acquire trying once", async move {
        c.acquire(acquire_request("x", 1_000, None, "")).await
    })
    .await;
    let mut c = client.clone();
    unavailable_within_1s("Acquire waiting", async move {
        c.acquire(acquire_request("x", 1_000, Some(5_000), ""))
            .await
    })
    .await;
    let mut c = client.clone();
    let token = lease.token.clone();
    unavailable_within_1s("Release", async move {
        c.release(pb::LockServiceReleaseRequest {
            name: "orders".into(),
            token,
        })
        .await
    })
    .await;
    let mut c = client.clone();
    let token = lease.token.clone();
    unavailable_within_1s("Refresh", async move {
        refresh(&mut c, "orders", &token, None).await
    })
    .await;
    let mut c = client.clone();
    unavailable_within_1s("Describe", async move {
        c.describe(pb::LockServiceDescribeRequest {
            name: "orders".into(),
        })
        .await
    })
    .await;
    let mut c = client.clone();
    let token = lease.token.clone();
    unavailable_within_1s("KeepAlive", async move {
        c.keep_alive(pb::LockServiceKeepAliveRequest {
            name: "orders".into(),
            token,
            ttl: None,
        })
        .await
    })
    .await;
    // Hold answers through its stream: the error is its first item.
    let mut c = client.clone();
    unavailable_within_1s("Hold", async move {
        let mut stream = c
            .hold(pb::LockServiceHoldRequest {
                name: "y".into(),
                ttl: Some(ms(1_000)),
                wait_timeout: None,
                owner: String::new(),
            })
            .await?
            .into_inner();
        stream.message().await
    })
    .await;
}

/// Redis killed while a caller waits for a held lock: the waiter answers UNAVAILABLE within a
/// second instead of waiting out its 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_while_waiting_answers_unavailable() {
    let mut redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    acquired(&mut client, "orders", 30_000, None, "alice").await;
    let mut waiter_client = baton.client().await;
    let mut waiter = tokio::spawn(async move {
        waiter_client
            .acquire(acquire_request("orders", 1_000, Some(10_000), "bob"))
            .await
    });
    wait_for_waiters_while(&client, "orders", 1, &mut waiter).await;
    redis.kill();
    unavailable_within_1s("a waiting Acquire when Redis dies", async move {
        waiter.await.expect("waiter task")
    })
    .await;
}

/// A fencing token is never reused: after Redis restarts with no data, the next grant still gets a
/// larger one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_keep_increasing_after_redis_restart() {
    let mut redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let before = acquired(&mut client, "orders", 10_000, None, "alice").await;
    redis.restart().await;
    let after = wait_until(
        Duration::from_secs(5),
        "an Acquire to succeed after Redis restarted",
        || {
            let mut client = client.clone();
            async move {
                match client
                    .acquire(acquire_request("orders", 10_000, None, "bob"))
                    .await
                {
                    Ok(r) if r.get_ref().acquired => Ok(r.into_inner().lease.expect("lease")),
                    other => Err(other),
                }
            }
        },
    )
    .await;
    assert!(
        after.fencing_token > before.fencing_token,
        "{} after {}",
        after.fencing_token,
        before.fencing_token
    );
}

// ---------------------------------------------------------------------------------------------
// Health, reflection, Unix socket
// ---------------------------------------------------------------------------------------------

/// Health answers SERVING for "" and liveness; readiness and the LockService follow Redis:
/// SERVING while it answers, NOT_SERVING within 3 s of it being killed (liveness stays SERVING).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_redis() {
    let mut redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut health = baton.health().await;

    for service in ["", "liveness", "readiness", "baton.v1.LockService"] {
        assert_eq!(
            health_status(&mut health, service).await.expect("Check"),
            ServingStatus::Serving,
            "{service:?}"
        );
    }
    let unknown = health_status(&mut health, "no.such.Service").await;
    assert_code(unknown, Code::NotFound, "an unknown service");

    let mut readiness = health
        .watch(HealthCheckRequest {
            service: "readiness".into(),
        })
        .await
        .expect("Watch")
        .into_inner();
    let first = within(
        Duration::from_secs(1),
        readiness.message(),
        "the current status",
    )
    .await
    .expect("Watch stream")
    .expect("a first status");
    assert_eq!(first.status(), ServingStatus::Serving);

    redis.kill();
    let killed_at = Instant::now();
    let next = within(
        Duration::from_secs(3),
        readiness.message(),
        "readiness to turn NOT_SERVING after Redis was killed",
    )
    .await
    .expect("Watch stream")
    .expect("a status change");
    assert_eq!(next.status(), ServingStatus::NotServing);
    eprintln!(
        "readiness NOT_SERVING {:?} after the kill",
        killed_at.elapsed()
    );
    for service in ["", "liveness"] {
        assert_eq!(
            health_status(&mut health, service).await.expect("Check"),
            ServingStatus::Serving,
            "{service:?} follows the process, not Redis"
        );
    }
    assert_eq!(
        health_status(&mut health, "baton.v1.LockService")
            .await
            .expect("Check"),
        ServingStatus::NotServing
    );

    redis.restart().await;
    let back = within(
        Duration::from_secs(5),
        readiness.message(),
        "readiness to return to SERVING after Redis restarted",
    )
    .await
    .expect("Watch stream")
    .expect("a status change");
    assert_eq!(back.status(), ServingStatus::Serving);
}

/// Server reflection lists the Lock and Health services and serves `baton/v1/lock.proto` exactly
/// as in `baton::proto::FILE_DESCRIPTOR_SET`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_serves_the_lock_service_descriptor() {
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };

    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut reflection = ServerReflectionClient::new(support::channel(baton.addr()).await);

    let requests = vec![
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "baton.v1.LockService".into(),
            )),
        },
    ];
    let mut responses = reflection
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .expect("ServerReflectionInfo")
        .into_inner();

    let listed = within(Duration::from_secs(2), responses.message(), "ListServices")
        .await
        .expect("reflection stream")
        .expect("a response");
    let Some(MessageResponse::ListServicesResponse(list)) = listed.message_response else {
        panic!("expected a service list, got {listed:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    for wanted in ["baton.v1.LockService", "grpc.health.v1.Health"] {
        assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
    }

    let file = within(
        Duration::from_secs(2),
        responses.message(),
        "FileContainingSymbol",
    )
    .await
    .expect("reflection stream")
    .expect("a response");
    let Some(MessageResponse::FileDescriptorResponse(files)) = file.message_response else {
        panic!("expected file descriptors, got {file:?}");
    };
    let served: Vec<prost_types::FileDescriptorProto> = files
        .file_descriptor_proto
        .iter()
        .map(|bytes| {
            prost_types::FileDescriptorProto::decode(bytes.as_slice()).expect("descriptor decodes")
        })
        .collect();
    let lock = served
        .iter()
        .find(|f| f.name() == "baton/v1/lock.proto")
        .expect("lock.proto is served");

    let set = prost_types::FileDescriptorSet::decode(baton::proto::FILE_DESCRIPTOR_SET)
        .expect("FILE_DESCRIPTOR_SET decodes");
    let expected = set
        .file
        .iter()
        .find(|f| f.name() == "baton/v1/lock.proto")
        .expect("lock.proto is in FILE_DESCRIPTOR_SET");
    assert_eq!(lock, expected, "reflection serves the compiled descriptor");
    let service = lock
        .service
        .iter()
        .find(|s| s.name() == "LockService")
        .expect("LockService");
    let methods: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
    assert_eq!(
        methods,
        [
            "Acquire",
            "Release",
            "Refresh",
            "Hold",
            "KeepAlive",
            "Describe"
        ]
    );
}

/// The Unix socket has mode 0660 and serves the same API: Acquire and Release over it work and
/// are seen over TCP; the socket file is removed when Baton stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_serves_the_api() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};

    let redis = RedisServer::start().await;
    let mut baton = Baton::start(&redis).await;
    let path = baton.socket_path().to_owned();
    let meta = std::fs::metadata(&path).expect("the socket file exists");
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o660,
        "socket mode {:o}",
        meta.permissions().mode()
    );

    let mut uds = baton.uds_client().await;
    let mut tcp = baton.client().await;
    let lease = acquired(&mut uds, "orders", 10_000, None, "alice").await;
    let d = describe(&mut tcp, "orders").await;
    assert!(d.held);
    assert_eq!(d.fencing_token, lease.fencing_token);
    let released = release(&mut uds, "orders", &lease.token).await;
    assert!(released.was_held);
    assert!(!describe(&mut tcp, "orders").await.held);

    drop(uds);
    drop(tcp);
    baton.shutdown().await.expect("serve returns Ok");
    assert!(!path.exists(), "the socket file is removed on shutdown");
}

// ---------------------------------------------------------------------------------------------
// The four lock failure modes
// ---------------------------------------------------------------------------------------------

/// Failure mode 1: a holder whose lease expired cannot release the lock someone else took since;
/// its release answers was_held=false and its refresh and keepalive fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_mode_1_expired_holder_cannot_release_anothers_lock() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut a = baton.client().await;
    let mut b = baton.client().await;

    let stale = acquired(&mut a, "orders", 200, None, "alice").await;
    // B waits for A's lease to run out.
    let current = acquired(&mut b, "orders", 10_000, Some(5_000), "bob").await;

    let released = release(&mut a, "orders", &stale.token).await;
    assert!(!released.was_held, "{released:?}");
    assert_eq!(released.remaining_holds, 0);
    assert_code(
        refresh(&mut a, "orders", &stale.token, None).await,
        Code::FailedPrecondition,
        "refresh by the expired holder",
    );
    assert_code(
        a.keep_alive(pb::LockServiceKeepAliveRequest {
            name: "orders".into(),
            token: stale.token.clone(),
            ttl: None,
        })
        .await,
        Code::FailedPrecondition,
        "keepalive by the expired holder",
    );
    let d = describe(&mut b, "orders").await;
    assert!(d.held);
    assert_eq!(d.owner, "bob");
    assert_eq!(d.fencing_token, current.fencing_token);
    assert!(release(&mut b, "orders", &current.token).await.was_held);
}

/// Failure mode 2: a crashed holder frees the lock promptly. A Hold client whose connection dies
/// frees it at once; a unary holder that dies frees it at its ttl, and the waiter is woken then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_mode_2_crashed_holder_frees_lock_promptly() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut b = baton.client().await;

    // A Hold client (ttl 30 s) whose connection dies without closing its stream.
    let proxy = Proxy::start(baton.addr()).await;
    let mut a = proxy.client().await;
    let mut stream = hold(&mut a, "streamed", 30_000, None, "alice").await;
    assert!(matches!(
        next_hold_event(&mut stream, Duration::from_secs(2), "acquired").await,
        HoldEvent::Acquired(_)
    ));
    let mut waiter_client = b.clone();
    let mut waiter = tokio::spawn(async move {
        let response = acquire(&mut waiter_client, "streamed", 10_000, Some(10_000), "bob").await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&b, "streamed", 1, &mut waiter).await;
    proxy.cut();
    let crashed_at = Instant::now();
    let (response, got_at) = within(Duration::from_secs(2), waiter, "the waiter to acquire")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let after = got_at.saturating_duration_since(crashed_at);
    assert!(
        after < Duration::from_millis(500),
        "a dead Hold client's lock was freed {after:?} after its connection died"
    );
    drop(stream);

    // A unary holder (ttl 400 ms) that dies: the lock is free at its ttl, not before.
    let proxy = Proxy::start(baton.addr()).await;
    let mut a = proxy.client().await;
    let acquired_at = Instant::now();
    let lease = acquired(&mut a, "unary", 400, None, "alice").await;
    proxy.cut();
    let response = acquire(&mut b, "unary", 10_000, Some(5_000), "bob").await;
    let elapsed = acquired_at.elapsed();
    assert!(response.acquired, "{response:?}");
    assert!(
        elapsed >= Duration::from_millis(350) && elapsed < Duration::from_millis(1_500),
        "a dead unary holder's 400 ms lock was taken after {elapsed:?}"
    );
    assert!(response.lease.expect("lease").fencing_token > lease.fencing_token);
}

/// Failure mode 3: when a lock expires under 32 concurrent waiting acquirers, exactly one gets
/// it; the others answer acquired=false with the winner's remaining ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_mode_3_many_acquirers_after_expiry_only_one_wins() {
    const ACQUIRERS: u32 = 32;
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let holder = acquired(&mut client, "orders", 500, None, "alice").await;
    let mut tasks = JoinSet::new();
    for i in 0..ACQUIRERS {
        let mut c = if i % 2 == 0 {
            client.clone()
        } else {
            baton.client().await
        };
        tasks.spawn(async move { acquire(&mut c, "orders", 10_000, Some(2_000), "").await });
    }
    wait_for_waiters(&client, "orders", ACQUIRERS).await;

    let mut winners = Vec::new();
    let mut losers = 0;
    within(
        Duration::from_secs(10),
        async {
            while let Some(joined) = tasks.join_next().await {
                let response = joined.expect("acquirer task");
                if response.acquired {
                    winners.push(response.lease.expect("lease"));
                } else {
                    losers += 1;
                    let left = remaining(&response.holder_remaining_ttl, "loser");
                    assert!(
                        left > Duration::from_secs(5) && left <= Duration::from_secs(10),
                        "a loser sees the winner's ttl, got {left:?}"
                    );
                }
            }
        },
        "every acquirer to answer",
    )
    .await;
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    assert_eq!(losers, ACQUIRERS - 1);
    assert!(winners[0].fencing_token > holder.fencing_token);
    let d = describe(&mut client, "orders").await;
    assert_eq!(d.owner, winners[0].owner);
    assert_eq!(d.hold_count, 1);
}

/// A protected resource that remembers the highest fencing token it has seen and rejects writes
/// carrying a lower one.
#[derive(Default)]
struct FencedResource {
    highest: u64,
    value: String,
}

impl FencedResource {
    fn write(&mut self, fencing_token: u64, value: &str) -> Result<(), String> {
        if fencing_token < self.highest {
            return Err(format!(
                "stale fencing token {fencing_token} < {}",
                self.highest
            ));
        }
        self.highest = fencing_token;
        value.clone_into(&mut self.value);
        Ok(())
    }
}

/// Failure mode 4: a holder that stalls past its lease is fenced. B gets the lock after A's lease
/// expired with a larger fencing token; A's late write is rejected by the resource, and A's
/// release neither succeeds nor frees B's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_mode_4_stale_holder_is_fenced() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut a = baton.client().await;
    let mut b = baton.client().await;
    let mut resource = FencedResource::default();

    let lease_a = acquired(&mut a, "orders", 200, None, "alice").await;
    resource
        .write(lease_a.fencing_token, "a1")
        .expect("A writes while it holds the lock");

    // A stalls (a GC pause, a slow disk); B waits and gets the lock when A's lease runs out.
    let lease_b = acquired(&mut b, "orders", 10_000, Some(5_000), "bob").await;
    assert!(
        lease_b.fencing_token > lease_a.fencing_token,
        "B's fencing token {} must exceed A's {}",
        lease_b.fencing_token,
        lease_a.fencing_token
    );
    resource
        .write(lease_b.fencing_token, "b1")
        .expect("B writes with the newer token");

    // A resumes, unaware, and writes: the resource rejects it.
    assert!(resource.write(lease_a.fencing_token, "a2").is_err());
    assert_eq!(resource.value, "b1");

    let released = release(&mut a, "orders", &lease_a.token).await;
    assert!(!released.was_held);
    let d = describe(&mut b, "orders").await;
    assert!(d.held, "A's release must not free B's lock: {d:?}");
    assert_eq!(d.owner, "bob");
    assert_eq!(d.fencing_token, lease_b.fencing_token);
}
