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
        ..Default::default()
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
            ..Default::default()
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

async fn pttl(conn: &mut support::RedisConn, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

async fn exists(conn: &mut support::RedisConn, key: &str) -> bool {
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

    let mut conn = redis.conn().await;
    let key = baton.lock_key("orders");
    let ttl = pttl(&mut conn, &key).await;
    assert!((9_000..=10_000).contains(&ttl), "PTTL {key} = {ttl}");

    let anonymous = acquired(&mut client, "anonymous", 10_000, None, "").await;
    assert_eq!(anonymous.owner, "", "an anonymous lease has no owner");
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
    let mut conn = redis.conn().await;

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
    let mut conn = redis.conn().await;
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
                ..Default::default()
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
                ..Default::default()
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

/// The same owner acquiring three times gets hold counts 1, 2, 3 with one fencing token and a
/// token per hold; releasing each hold counts down 2, 1, 0 (a token releases its own hold once),
/// and another owner gets the lock only after the last.
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
    let mut tokens: Vec<&str> = leases.iter().map(|l| l.token.as_str()).collect();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "every hold has a token of its own");
    assert!(
        leases
            .iter()
            .all(|l| l.fencing_token == leases[0].fencing_token)
    );
    assert_eq!(describe(&mut client, "orders").await.hold_count, 3);

    for (lease, expected) in leases.iter().zip([2, 1]) {
        let released = release(&mut client, "orders", &lease.token).await;
        assert!(released.was_held);
        assert_eq!(released.remaining_holds, expected);
        let again = release(&mut client, "orders", &lease.token).await;
        assert!(!again.was_held, "a token releases its own hold only once");
        let other = acquire(&mut client, "orders", 10_000, None, "worker-2").await;
        assert!(!other.acquired, "{expected} holds left: {other:?}");
    }
    let last = release(&mut client, "orders", &leases[2].token).await;
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
        let mut conn = redis.conn().await;
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

    let mut conn = redis.conn().await;
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
    let mut redis = RedisServer::start_private().await;
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
    let mut redis = RedisServer::start_private().await;
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
    let mut redis = RedisServer::start_private().await;
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
                ..Default::default()
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
    let mut redis = RedisServer::start_private().await;
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
    let mut redis = RedisServer::start_private().await;
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
    let mut redis = RedisServer::start_private().await;
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

// ---------------------------------------------------------------------------------------------
// Fairness and shared locks
// ---------------------------------------------------------------------------------------------

/// How a test asks for a lock: fair or not, exclusive or shared.
#[derive(Debug, Clone, Copy)]
struct Ask {
    fair: bool,
    mode: pb::LockMode,
}

const EXCLUSIVE: Ask = Ask {
    fair: false,
    mode: pb::LockMode::Exclusive,
};
const SHARED: Ask = Ask {
    fair: false,
    mode: pb::LockMode::Shared,
};
const FAIR: Ask = Ask {
    fair: true,
    mode: pb::LockMode::Exclusive,
};
const FAIR_SHARED: Ask = Ask {
    fair: true,
    mode: pb::LockMode::Shared,
};

fn ask_request(
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

async fn ask(
    client: &mut Client,
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
    ask: Ask,
) -> pb::LockServiceAcquireResponse {
    client
        .acquire(ask_request(name, ttl_ms, wait_ms, owner, ask))
        .await
        .unwrap_or_else(|s| panic!("Acquire {name:?} ({ask:?}) failed: {s:?}"))
        .into_inner()
}

/// Asks and asserts the lock was granted, returning the lease.
async fn granted(
    client: &mut Client,
    name: &str,
    ttl_ms: u64,
    wait_ms: Option<u64>,
    owner: &str,
    how: Ask,
) -> pb::LockLease {
    let response = ask(client, name, ttl_ms, wait_ms, owner, how).await;
    assert!(
        response.acquired,
        "expected to acquire {name:?} ({how:?}): {response:?}"
    );
    response
        .lease
        .expect("an acquired response carries the lease")
}

fn hold_request(name: &str, ttl_ms: u64, owner: &str, how: Ask) -> pb::LockServiceHoldRequest {
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
async fn wait_for_queued(client: &Client, name: &str, n: u32) {
    let what = format!("{n} queued waiter(s) on {name:?}");
    wait_until(Duration::from_secs(5), &what, || {
        let mut client = client.clone();
        async move {
            let d = describe(&mut client, name).await;
            if d.queued == n { Ok(()) } else { Err(d) }
        }
    })
    .await;
}

/// Calls of `command` Redis ran successfully since the last `CONFIG RESETSTAT` (`INFO
/// commandstats`), leaving out failed ones such as an `EVALSHA` answered `NOSCRIPT` before its
/// script is loaded; summed over every master of a Cluster.
async fn command_calls(conn: &mut support::RedisConn, command: &str) -> u64 {
    conn.command_calls(command).await
}

async fn reset_stats(conn: &mut support::RedisConn) {
    conn.reset_stats().await;
}

/// Jain's fairness index of `counts`: 1 when every count is equal, 1/n when one takes all.
fn jain(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    sum * sum / (counts.len() as f64 * squares)
}

/// Six fair waiters, each started once the previous one is queued, get the lock in that order,
/// and a non-fair request made after them (while the lock is free between two grants, too) gets
/// it only after all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_granted_in_arrival_order() {
    const WAITERS: u32 = 6;
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let order = Arc::new(Mutex::new(Vec::new()));

    let holder = acquired(&mut client, "orders", 30_000, None, "holder").await;
    let mut tasks = JoinSet::new();
    let spawn = |tasks: &mut JoinSet<()>, id: String, how: Ask, client: Client| {
        let order = order.clone();
        tasks.spawn(async move {
            let mut client = client;
            let lease = granted(&mut client, "orders", 10_000, Some(10_000), &id, how).await;
            order.lock().expect("order").push(id);
            // Held a moment, so a later waiter could try to slip in between two grants.
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(release(&mut client, "orders", &lease.token).await.was_held);
        });
    };
    for i in 0..WAITERS {
        spawn(&mut tasks, format!("fair-{i}"), FAIR, baton.client().await);
        wait_for_queued(&client, "orders", i + 1).await;
    }
    spawn(&mut tasks, "late".into(), EXCLUSIVE, baton.client().await);
    wait_for_waiters(&client, "orders", WAITERS + 1).await;

    assert!(release(&mut client, "orders", &holder.token).await.was_held);
    within(
        Duration::from_secs(10),
        async {
            while let Some(joined) = tasks.join_next().await {
                joined.expect("a waiter task failed");
            }
        },
        "every waiter to get the lock",
    )
    .await;
    let mut expected: Vec<String> = (0..WAITERS).map(|i| format!("fair-{i}")).collect();
    expected.push("late".into());
    assert_eq!(*order.lock().expect("order"), expected);
    let d = describe(&mut client, "orders").await;
    assert_eq!((d.waiters, d.queued), (0, 0), "{d:?}");
}

/// 16 fair clients looping acquire + release on one lock share the grants evenly (Jain's index
/// of grants per client >= 0.99), and a grant costs a few script calls, not one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_contention_is_even_and_wakes_no_herd() {
    const CLIENTS: usize = 16;
    const GRANTS: u64 = 640;
    // Reads node-wide counters: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut conn = redis.conn().await;
    let total = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));

    reset_stats(&mut conn).await;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..CLIENTS {
        let mut client = baton.client().await;
        let (total, inside) = (total.clone(), inside.clone());
        tasks.spawn(async move {
            let mut mine = 0u64;
            while total.load(Ordering::SeqCst) < GRANTS {
                let lease = granted(&mut client, "hot", 5_000, Some(30_000), "", FAIR).await;
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                mine += 1;
                total.fetch_add(1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                assert!(release(&mut client, "hot", &lease.token).await.was_held);
            }
            mine
        });
    }
    let mut counts = Vec::new();
    within(
        Duration::from_secs(60),
        async {
            while let Some(joined) = tasks.join_next().await {
                counts.push(joined.expect("a client task failed"));
            }
        },
        "the contended loop to finish",
    )
    .await;
    let elapsed = started.elapsed();
    let grants: u64 = counts.iter().sum();
    let scripts = command_calls(&mut conn, "evalsha").await;
    let index = jain(&counts);
    eprintln!(
        "{grants} fair grants to {CLIENTS} clients in {elapsed:?}: per client {counts:?}, \
         Jain's index {index:.4}, {:.2} script calls per grant",
        scripts as f64 / grants as f64
    );
    assert!(index >= 0.99, "Jain's index {index} for {counts:?}");
    // Per grant: the release, the woken head's attempt, and the releaser's next try and queueing
    // (plus the odd place renewal). Waking every waiter would cost 16 more.
    assert!(
        (scripts as f64) < 6.0 * grants as f64,
        "{scripts} script calls for {grants} grants"
    );
}

/// A release wakes only a waiter that can take the lock: around one handoff with four fair waiters
/// Redis runs exactly two scripts (the release and the head's acquisition) and one PUBLISH; with
/// four non-fair exclusive waiters on the same Baton, the same (the broadcast wakes one of them);
/// four shared waiters all wake and all get in. Each run ends well within a second of the first
/// registration, before any waiter renews its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_waiters_that_can_go_ahead() {
    const WAITERS: u32 = 4;
    // Reads node-wide counters: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut conn = redis.conn().await;

    // Returns the script calls and PUBLISH calls Redis ran around one handoff, or None when the
    // run took too long to rule out place renewals (about every second).
    async fn handoff(
        baton: &Baton,
        client: &mut Client,
        conn: &mut support::RedisConn,
        name: &str,
        how: Ask,
    ) -> Option<(u64, u64)> {
        let holder = acquired(client, name, 30_000, None, "holder").await;
        let first_registered = Instant::now();
        let mut waiters = JoinSet::new();
        for i in 0..WAITERS {
            let mut c = baton.client().await;
            let lock = name.to_owned();
            waiters.spawn(async move {
                ask(&mut c, &lock, 30_000, Some(10_000), &format!("w{i}"), how).await
            });
            if how.fair {
                wait_for_queued(client, name, i + 1).await;
            }
        }
        wait_for_waiters(client, name, WAITERS).await;
        // A waiter registers on its first try and tries once more once subscribed: wait until
        // every such attempt has run (no script call for 50 ms) before counting.
        let mut last = command_calls(conn, "evalsha").await;
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = command_calls(conn, "evalsha").await;
            if now == last {
                break;
            }
            last = now;
        }

        reset_stats(conn).await;
        assert!(release(client, name, &holder.token).await.was_held);
        let first = within(
            Duration::from_secs(2),
            waiters.join_next(),
            "the next holder",
        )
        .await
        .expect("a waiter")
        .expect("waiter task");
        assert!(first.acquired, "{first:?}");
        // Anyone else woken would run its acquisition script now.
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Scripts publish with SPUBLISH on a Cluster.
        let publish = conn.publish_command();
        let counts = (
            command_calls(conn, "evalsha").await,
            command_calls(conn, publish).await,
        );
        let quick = first_registered.elapsed() < Duration::from_millis(900);
        waiters.abort_all();
        let lease = first.lease.expect("lease");
        release(client, name, &lease.token).await;
        quick.then_some(counts)
    }

    let mut fair = None;
    for attempt in 0..3 {
        fair = handoff(
            &baton,
            &mut client,
            &mut conn,
            &format!("fair-{attempt}"),
            FAIR,
        )
        .await;
        if fair.is_some() {
            break;
        }
    }
    let (scripts, publishes) = fair.expect("a fair handoff measured within a second");
    assert_eq!(
        scripts, 2,
        "fair: script calls around one handoff (release + head's acquire)"
    );
    assert_eq!(publishes, 1, "fair: one message, addressed to the head");

    // Non-fair exclusive waiters of one Baton: only one of them can take the lock, and only one
    // is woken.
    let mut relay = None;
    for attempt in 0..3 {
        relay = handoff(
            &baton,
            &mut client,
            &mut conn,
            &format!("relay-{attempt}"),
            EXCLUSIVE,
        )
        .await;
        if relay.is_some() {
            break;
        }
    }
    let (scripts, publishes) = relay.expect("a non-fair handoff measured within a second");
    assert_eq!(
        scripts, 2,
        "non-fair: script calls around one handoff (release + one local waiter's acquire)"
    );
    assert_eq!(publishes, 1, "non-fair: one broadcast");

    // Shared waiters can all go ahead: one message wakes them all.
    let mut herd = None;
    for attempt in 0..3 {
        herd = handoff(
            &baton,
            &mut client,
            &mut conn,
            &format!("shared-{attempt}"),
            SHARED,
        )
        .await;
        if herd.is_some() {
            break;
        }
    }
    let (scripts, _) = herd.expect("a shared handoff measured within a second");
    assert_eq!(
        scripts,
        1 + u64::from(WAITERS),
        "shared: the release and every waiter's acquire"
    );
}

/// A fair waiter that gives up passes its turn on at once: an exclusive head that times out lets
/// the shared waiter it held back join the shared holder immediately; a head whose caller
/// cancels leaves the queue, so the next waiter gets the lock as soon as it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_that_gives_up_passes_the_turn_on() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    // A shared holder; an exclusive head that waits 300 ms; a shared waiter behind it.
    let reader = granted(&mut client, "timeout", 30_000, None, "reader", SHARED).await;
    let mut c = baton.client().await;
    let mut head = tokio::spawn(async move {
        let response = ask(&mut c, "timeout", 10_000, Some(300), "writer", FAIR).await;
        (response, Instant::now())
    });
    wait_for_queued(&client, "timeout", 1).await;
    let mut c = baton.client().await;
    let mut behind = tokio::spawn(async move {
        let response = ask(
            &mut c,
            "timeout",
            10_000,
            Some(10_000),
            "reader-2",
            FAIR_SHARED,
        )
        .await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&client, "timeout", 2, &mut behind).await;
    let (gave_up, gave_up_at) = within(Duration::from_secs(2), &mut head, "the head to give up")
        .await
        .expect("head task");
    assert!(!gave_up.acquired, "{gave_up:?}");
    let (response, got_at) = within(Duration::from_secs(2), &mut behind, "the shared waiter")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let after = got_at.saturating_duration_since(gave_up_at);
    assert!(
        after < Duration::from_millis(100),
        "the shared waiter got in {after:?} after the writer ahead of it gave up"
    );
    assert_eq!(describe(&mut client, "timeout").await.shared_holders, 2);
    release(&mut client, "timeout", &reader.token).await;

    // An exclusive holder; two fair waiters; the first one's caller goes away.
    let holder = acquired(&mut client, "cancel", 30_000, None, "holder").await;
    let mut c = baton.client().await;
    let first =
        tokio::spawn(
            async move { ask(&mut c, "cancel", 10_000, Some(10_000), "first", FAIR).await },
        );
    wait_for_queued(&client, "cancel", 1).await;
    let mut c = baton.client().await;
    let mut second = tokio::spawn(async move {
        let response = ask(&mut c, "cancel", 10_000, Some(10_000), "second", FAIR).await;
        (response, Instant::now())
    });
    wait_for_queued(&client, "cancel", 2).await;
    first.abort();
    wait_for_queued(&client, "cancel", 1).await;
    assert!(release(&mut client, "cancel", &holder.token).await.was_held);
    let released_at = Instant::now();
    let (response, got_at) = within(Duration::from_secs(2), &mut second, "the second waiter")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let latency = got_at.saturating_duration_since(released_at);
    assert!(
        latency < Duration::from_millis(50),
        "the second waiter got the lock {latency:?} after the release"
    );
}

/// A fair waiter whose Baton dies (a real `baton` process, SIGKILLed while queued first) holds up
/// the queue only until its place lease (3 s) runs out: the waiter behind it, on another Baton,
/// then gets the lock without any message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_fair_waiter_drops_out_when_its_place_expires() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), baton.prefix().to_owned()]);
    let process =
        support::BatonProcess::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;

    let holder = acquired(&mut client, "orders", 30_000, None, "holder").await;
    let mut doomed = process.client().await;
    let _dead = tokio::spawn(async move {
        doomed
            .acquire(ask_request("orders", 10_000, Some(30_000), "doomed", FAIR))
            .await
    });
    wait_for_queued(&client, "orders", 1).await;
    let mut c = baton.client().await;
    let mut behind = tokio::spawn(async move {
        let response = ask(&mut c, "orders", 10_000, Some(10_000), "behind", FAIR).await;
        (response, Instant::now())
    });
    wait_for_queued(&client, "orders", 2).await;

    drop(process); // SIGKILL: the doomed waiter's place is no longer renewed.
    let killed_at = Instant::now();
    assert!(release(&mut client, "orders", &holder.token).await.was_held);
    let (response, got_at) = within(Duration::from_secs(5), &mut behind, "the waiter behind")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let after = got_at.saturating_duration_since(killed_at);
    assert!(
        after > Duration::from_millis(500) && after < Duration::from_millis(3_500),
        "the waiter behind a dead one got the lock {after:?} after the kill"
    );
    let d = describe(&mut client, "orders").await;
    assert_eq!((d.owner.as_str(), d.queued), ("behind", 0), "{d:?}");
}

/// Five shared holders hold the lock at once, each with its own lease; an exclusive request is
/// refused while any of them lives and granted once the last one is released; a shared request
/// is refused while the exclusive holder holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_holders_exclude_an_exclusive_holder_and_back() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut leases = Vec::new();
    for i in 0..5u64 {
        let lease = granted(
            &mut client,
            "doc",
            10_000 + i * 1_000,
            None,
            &format!("r{i}"),
            SHARED,
        )
        .await;
        assert_eq!(lease.mode(), pb::LockMode::Shared);
        assert_eq!(lease.hold_count, 1);
        leases.push(lease);
    }
    let tokens: std::collections::HashSet<_> = leases.iter().map(|l| l.token.clone()).collect();
    assert_eq!(tokens.len(), 5, "each shared holder has its own lease");

    let d = describe(&mut client, "doc").await;
    assert!(d.held);
    assert_eq!(d.mode(), pb::LockMode::Shared);
    assert_eq!(d.shared_holders, 5);
    assert_eq!((d.owner.as_str(), d.hold_count), ("", 0));
    assert_eq!(
        d.fencing_token, leases[4].fencing_token,
        "the latest issued"
    );
    let longest = remaining(&d.remaining_ttl, "longest shared lease");
    assert!(
        longest > Duration::from_secs(13) && longest <= Duration::from_secs(14),
        "{longest:?}"
    );
    let earliest = d
        .earliest_shared_holder
        .expect("the earliest shared holder");
    assert_eq!(earliest.owner, "r0");
    assert_eq!(earliest.hold_count, 1);
    assert_eq!(earliest.fencing_token, leases[0].fencing_token);
    assert!(remaining(&earliest.remaining_ttl, "earliest") <= Duration::from_secs(10));

    for lease in &leases[..4] {
        let refused = ask(&mut client, "doc", 10_000, None, "writer", EXCLUSIVE).await;
        assert!(!refused.acquired, "{refused:?}");
        let left = remaining(&refused.holder_remaining_ttl, "holder_remaining_ttl");
        assert!(
            left > Duration::from_secs(10),
            "the longest shared lease: {left:?}"
        );
        assert!(release(&mut client, "doc", &lease.token).await.was_held);
    }
    assert!(
        !ask(&mut client, "doc", 10_000, None, "writer", EXCLUSIVE)
            .await
            .acquired
    );
    let last = release(&mut client, "doc", &leases[4].token).await;
    assert_eq!((last.was_held, last.remaining_holds), (true, 0));

    let writer = granted(&mut client, "doc", 10_000, None, "writer", EXCLUSIVE).await;
    assert_eq!(writer.mode(), pb::LockMode::Exclusive);
    let refused = ask(&mut client, "doc", 10_000, None, "reader", SHARED).await;
    assert!(!refused.acquired, "{refused:?}");
    assert!(refused.holder_remaining_ttl.is_some());
    let d = describe(&mut client, "doc").await;
    assert_eq!((d.mode(), d.shared_holders), (pb::LockMode::Exclusive, 0));
    assert!(release(&mut client, "doc", &writer.token).await.was_held);
    granted(&mut client, "doc", 10_000, None, "reader", SHARED).await;
}

/// A shared lease that is never released ends at its ttl: a waiting writer gets the lock about
/// 300 ms later, without any release published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_lease_expires_at_its_ttl() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let started = Instant::now();
    let reader = granted(&mut client, "doc", 300, None, "reader", SHARED).await;
    let writer = granted(&mut client, "doc", 10_000, Some(5_000), "writer", EXCLUSIVE).await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(250) && elapsed < Duration::from_millis(1_500),
        "got a lock held shared for 300 ms after {elapsed:?}"
    );
    assert!(writer.fencing_token > reader.fencing_token);
    let released = release(&mut client, "doc", &reader.token).await;
    assert!(
        !released.was_held,
        "the expired shared lease is gone: {released:?}"
    );
    assert_code(
        refresh(&mut client, "doc", &reader.token, None).await,
        Code::FailedPrecondition,
        "refresh of an expired shared lease",
    );
}

/// A writer is not starved by a stream of overlapping readers: once it waits, new shared
/// requests wait behind it, and it gets the lock as soon as the readers already in let go; the
/// readers then go on. Checked without and with fairness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_is_not_starved_by_readers() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;

    for (reading, writing) in [(SHARED, EXCLUSIVE), (FAIR_SHARED, FAIR)] {
        let name = format!("doc-{}", reading.fair);
        let stop = Arc::new(AtomicBool::new(false));
        let grants = Arc::new(Mutex::new(Vec::new()));
        // A new reader every 30 ms, each holding 120 ms: the lock never falls free by itself.
        let mut readers = JoinSet::new();
        let spawner = {
            let (stop, grants, name) = (stop.clone(), grants.clone(), name.clone());
            let client = baton.client().await;
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let (grants, name, mut c) = (grants.clone(), name.clone(), client.clone());
                    readers.spawn(async move {
                        let asked_at = Instant::now();
                        let lease = granted(&mut c, &name, 5_000, Some(5_000), "", reading).await;
                        grants
                            .lock()
                            .expect("grants")
                            .push((asked_at, Instant::now()));
                        tokio::time::sleep(Duration::from_millis(120)).await;
                        release(&mut c, &name, &lease.token).await;
                    });
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                while let Some(joined) = readers.join_next().await {
                    joined.expect("a reader task failed");
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;

        let mut w = baton.client().await;
        let asked_at = Instant::now();
        let lease = granted(&mut w, &name, 5_000, Some(5_000), "writer", writing).await;
        let got_at = Instant::now();
        let waited = got_at - asked_at;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released_at = Instant::now();
        assert!(release(&mut w, &name, &lease.token).await.was_held);
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::SeqCst);
        within(Duration::from_secs(10), spawner, "the readers to finish")
            .await
            .expect("reader spawner");

        assert!(
            waited < Duration::from_millis(600),
            "{writing:?}: the writer waited {waited:?} behind readers holding 120 ms each"
        );
        let grants = grants.lock().expect("grants");
        // Readers that asked after the writer began waiting (with a margin for its registration)
        // were granted only after it released.
        let late: Vec<_> = grants
            .iter()
            .filter(|(asked, _)| *asked > asked_at + Duration::from_millis(20))
            .collect();
        assert!(!late.is_empty(), "readers kept coming");
        for (asked, got) in late {
            assert!(
                *got >= released_at || *asked > released_at,
                "{reading:?}: a reader that asked {:?} after the writer got in {:?} before it released",
                *asked - asked_at,
                got.saturating_duration_since(asked_at)
            );
        }
    }
}

/// Reentrancy per owner in both modes: a shared owner asking again gets one more hold (a token of
/// its own) of its own shared lease; an exclusive owner asking for it shared gets one more hold of
/// its exclusive lease (reported EXCLUSIVE); releasing each hold counts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrancy_per_owner_in_both_modes() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let first = granted(&mut client, "shared", 10_000, None, "reader", SHARED).await;
    let other = granted(&mut client, "shared", 10_000, None, "other", SHARED).await;
    let again = granted(&mut client, "shared", 20_000, None, "reader", SHARED).await;
    assert_ne!(again.token, first.token);
    assert_eq!(again.fencing_token, first.fencing_token);
    assert_eq!(again.hold_count, 2);
    assert_eq!(again.mode(), pb::LockMode::Shared);
    assert_eq!(
        remaining(&again.remaining_ttl, "extended"),
        Duration::from_secs(20)
    );
    assert_eq!(describe(&mut client, "shared").await.shared_holders, 2);
    let r = release(&mut client, "shared", &first.token).await;
    assert_eq!((r.was_held, r.remaining_holds), (true, 1));
    let r = release(&mut client, "shared", &again.token).await;
    assert_eq!((r.was_held, r.remaining_holds), (true, 0));
    assert_eq!(describe(&mut client, "shared").await.shared_holders, 1);
    release(&mut client, "shared", &other.token).await;

    let writer = granted(&mut client, "exclusive", 10_000, None, "writer", EXCLUSIVE).await;
    let read = granted(&mut client, "exclusive", 10_000, None, "writer", SHARED).await;
    assert_ne!(read.token, writer.token);
    assert_eq!(read.fencing_token, writer.fencing_token);
    assert_eq!(read.hold_count, 2);
    assert_eq!(read.mode(), pb::LockMode::Exclusive);
    assert!(
        !ask(&mut client, "exclusive", 10_000, None, "someone", SHARED)
            .await
            .acquired
    );
    let d = describe(&mut client, "exclusive").await;
    assert_eq!(
        (d.mode(), d.hold_count, d.shared_holders),
        (pb::LockMode::Exclusive, 2, 0)
    );
    assert_eq!(
        release(&mut client, "exclusive", &writer.token)
            .await
            .remaining_holds,
        1
    );
    assert_eq!(
        release(&mut client, "exclusive", &read.token)
            .await
            .remaining_holds,
        0
    );
    assert!(!describe(&mut client, "exclusive").await.held);
}

/// An owner holding the lock only shared that asks for it exclusively is refused at once with
/// FAILED_PRECONDITION (even with a wait: an upgrade would deadlock), and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_shared_to_exclusive_is_refused() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = granted(&mut client, "doc", 10_000, None, "reader", SHARED).await;
    for (wait, how) in [
        (None, EXCLUSIVE),
        (Some(5_000), EXCLUSIVE),
        (Some(5_000), FAIR),
    ] {
        let started = Instant::now();
        let status = assert_code(
            client
                .acquire(ask_request("doc", 10_000, wait, "reader", how))
                .await,
            Code::FailedPrecondition,
            "an upgrade",
        );
        assert!(status.message().contains("shared"), "{status:?}");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "refused at once"
        );
    }
    let d = describe(&mut client, "doc").await;
    assert_eq!(
        (d.mode(), d.shared_holders, d.waiters),
        (pb::LockMode::Shared, 1, 0),
        "{d:?}"
    );
    assert_eq!(d.earliest_shared_holder.expect("holder").hold_count, 1);
    assert!(release(&mut client, "doc", &lease.token).await.was_held);
}

/// Fencing tokens strictly increase in grant order across shared and exclusive grants, with
/// overlapping shared leases each getting their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_modes() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut tokens = Vec::new();
    let s1 = granted(&mut client, "doc", 10_000, None, "", SHARED).await;
    let s2 = granted(&mut client, "doc", 10_000, None, "", SHARED).await;
    tokens.extend([s1.fencing_token, s2.fencing_token]);
    release(&mut client, "doc", &s1.token).await;
    let s3 = granted(&mut client, "doc", 10_000, None, "", SHARED).await;
    tokens.push(s3.fencing_token);
    release(&mut client, "doc", &s2.token).await;
    release(&mut client, "doc", &s3.token).await;
    let x1 = granted(&mut client, "doc", 10_000, None, "", EXCLUSIVE).await;
    tokens.push(x1.fencing_token);
    release(&mut client, "doc", &x1.token).await;
    let s4 = granted(&mut client, "doc", 10_000, None, "", FAIR_SHARED).await;
    tokens.push(s4.fencing_token);
    release(&mut client, "doc", &s4.token).await;
    let x2 = granted(&mut client, "doc", 10_000, None, "", FAIR).await;
    tokens.push(x2.fencing_token);
    if let Some(w) = tokens.windows(2).find(|w| w[0] >= w[1]) {
        panic!("fencing tokens went {} then {}: {tokens:?}", w[0], w[1]);
    }
}

/// `Hold` and `KeepAlive` streams of shared leases: two shared Holds (ttl 300 ms) stay held past
/// their ttl side by side; a KeepAlive keeps a shared lease from `Acquire` alive; closing each
/// stream releases its lease at once and leaves the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_leases_in_hold_and_keep_alive_streams() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut streams = Vec::new();
    for owner in ["a", "b"] {
        let mut stream = client
            .hold(hold_request("doc", 300, owner, SHARED))
            .await
            .expect("Hold")
            .into_inner();
        match next_hold_event(&mut stream, Duration::from_secs(2), "acquired").await {
            HoldEvent::Acquired(lease) => {
                assert_eq!(lease.mode(), pb::LockMode::Shared);
                assert_eq!(lease.owner, owner);
            }
            other => panic!("expected acquired, got {other:?}"),
        }
        streams.push(stream);
    }
    let lease = granted(&mut client, "doc", 300, None, "c", SHARED).await;
    let mut kept = client
        .keep_alive(pb::LockServiceKeepAliveRequest {
            name: "doc".into(),
            token: lease.token.clone(),
            ttl: None,
        })
        .await
        .expect("KeepAlive")
        .into_inner();
    assert!(matches!(
        next_keep_alive_event(&mut kept, Duration::from_millis(200), "first renewal").await,
        KeepAliveEvent::Renewed(_)
    ));

    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        for stream in &mut streams {
            assert!(matches!(
                next_hold_event(stream, Duration::from_millis(300), "a renewal").await,
                HoldEvent::Renewed(_)
            ));
        }
        assert!(matches!(
            next_keep_alive_event(&mut kept, Duration::from_millis(300), "a renewal").await,
            KeepAliveEvent::Renewed(_)
        ));
    }
    let d = describe(&mut client, "doc").await;
    assert_eq!(
        (d.mode(), d.shared_holders),
        (pb::LockMode::Shared, 3),
        "held past the ttl: {d:?}"
    );
    assert!(
        !ask(&mut client, "doc", 1_000, None, "writer", EXCLUSIVE)
            .await
            .acquired
    );

    drop(kept);
    let shared_holders = |n: u32| {
        let client = client.clone();
        async move {
            wait_until(
                Duration::from_secs(1),
                &format!("{n} shared holders"),
                || {
                    let mut client = client.clone();
                    async move {
                        let d = describe(&mut client, "doc").await;
                        if d.shared_holders == n {
                            Ok(())
                        } else {
                            Err(d)
                        }
                    }
                },
            )
            .await;
        }
    };
    shared_holders(2).await;
    streams.pop();
    shared_holders(1).await;
    streams.pop();
    wait_until_free(&client, "doc", Duration::from_secs(1)).await;
    granted(&mut client, "doc", 1_000, None, "writer", EXCLUSIVE).await;
}

/// Redis killed while a shared Hold (ttl 1 s) is open: the stream reports `lost` UNCONFIRMED
/// before the shared lease could have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_hold_reports_lost_before_expiry_when_redis_dies() {
    let mut redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut stream = client
        .hold(hold_request("doc", 1_000, "", SHARED))
        .await
        .expect("Hold")
        .into_inner();
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
    assert_eq!(lost.reason(), LeaseLostReason::Unconfirmed, "{lost:?}");
    assert!(
        Instant::now() < confirmed_at + valid_for,
        "lost arrived after the lease could expire"
    );
    expect_end(&mut stream, "the Hold stream after lost").await;
}

/// Every key a lock writes expires, with shared holders, a fair queue, a waiting writer and
/// waiting readers all present at once; and they are all gone once nothing is held or waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_key_expires() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut conn = redis.conn().await;

    let reader = granted(&mut client, "doc", 30_000, None, "reader", SHARED).await;
    let mut waiting = JoinSet::new();
    // The writer first: once it waits, the second reader waits too. The writer waits longest:
    // were it to give up first, the second reader would join the first.
    for (n, (owner, how, wait)) in [
        ("writer", EXCLUSIVE, 4_000),
        ("reader-2", SHARED, 2_000),
        ("fair", FAIR, 2_000),
    ]
    .into_iter()
    .enumerate()
    {
        let mut c = baton.client().await;
        waiting.spawn(async move { ask(&mut c, "doc", 1_000, Some(wait), owner, how).await });
        wait_for_waiters(&client, "doc", u32::try_from(n).expect("small") + 1).await;
    }
    let pattern = format!("{}*", baton.prefix());
    let keys = conn.keys(&pattern).await;
    for suffix in [":fence", ":leases", ":waiters", ":queue", ":writers"] {
        assert!(
            keys.iter().any(|k| k.ends_with(suffix)),
            "no {suffix} key among {keys:?}"
        );
    }
    for key in &keys {
        let ttl = pttl(&mut conn, key).await;
        assert!(ttl > 0, "{key} has no expiry (PTTL {ttl})");
    }
    within(
        Duration::from_secs(10),
        async {
            while let Some(joined) = waiting.join_next().await {
                let response = joined.expect("waiter task");
                assert!(!response.acquired, "{response:?}");
            }
        },
        "the waiters to give up",
    )
    .await;
    assert!(release(&mut client, "doc", &reader.token).await.was_held);
    let left = conn.keys(&pattern).await;
    assert!(
        left.iter().all(|k| k.ends_with(":fence")),
        "only the fencing counter outlives the lock's use: {left:?}"
    );
}

/// The new fields are checked: a mode that is not a LockMode is INVALID_ARGUMENT naming `mode`,
/// for Acquire and Hold, and touches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_mode_is_invalid() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    for bad in [3, -1, 99] {
        let request = pb::LockServiceAcquireRequest {
            mode: bad,
            ..acquire_request("doc", 1_000, None, "")
        };
        assert_invalid(client.acquire(request).await, "mode");
        let request = pb::LockServiceHoldRequest {
            mode: bad,
            ..hold_request("doc", 1_000, "", FAIR)
        };
        assert_invalid(client.hold(request).await, "mode");
    }
    assert_eq!(
        describe(&mut client, "doc").await,
        pb::LockServiceDescribeResponse::default()
    );
    // Unspecified is exclusive.
    let lease = acquired(&mut client, "doc", 1_000, None, "").await;
    assert_eq!(lease.mode(), pb::LockMode::Exclusive);
}

/// `Locks::refresh_many` renews a mix of leases in one script call: an exclusive lease and two
/// shared ones (one with its acquisition ttl) get their new ttl; a released lease, an expired
/// shared one and an unknown token come back as not held; an empty batch sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_many_renews_a_mixed_batch_in_one_call() {
    use baton::{lease::Primitive, lock::Lock, redis::Redis};

    // Reads node-wide counters: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    // One batch is one script call, which a Cluster allows over one hash slot only.
    let names = redis.names_in_one_slot("lock", ["a", "b", "c", "d"]);
    let [lock_a, lock_b, lock_c, lock_d] = names.each_ref().map(String::as_str);
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut conn = redis.conn().await;
    let mut config = redis.redis_config();
    config.key_prefix = baton.prefix().to_owned();
    let locks = Lock::new(Redis::new(&config).expect("redis config"));

    let exclusive = acquired(&mut client, lock_a, 1_000, None, "").await;
    let shared = granted(&mut client, lock_b, 1_000, None, "", SHARED).await;
    let shared_default = granted(&mut client, lock_b, 2_000, None, "", SHARED).await;
    let released = acquired(&mut client, lock_c, 1_000, None, "").await;
    release(&mut client, lock_c, &released.token).await;
    let expired = granted(&mut client, lock_d, 10, None, "", SHARED).await;
    let still = granted(&mut client, lock_d, 10_000, None, "", SHARED).await;
    wait_until(
        Duration::from_secs(1),
        "the 10 ms shared lease to expire",
        || {
            let mut client = client.clone();
            async move {
                let d = describe(&mut client, lock_d).await;
                if d.shared_holders == 1 {
                    Ok(())
                } else {
                    Err(d)
                }
            }
        },
    )
    .await;

    let unknown = random_token();
    let hold = |name: &str, token: &str, ttl: Option<u64>| {
        (
            name.to_owned(),
            token.to_owned(),
            ttl.map(Duration::from_secs),
        )
    };
    let batch = [
        hold(lock_a, &exclusive.token, Some(20)),
        hold(lock_b, &shared.token, Some(30)),
        hold(lock_b, &shared_default.token, None),
        hold(lock_c, &released.token, Some(20)),
        hold(lock_d, &expired.token, Some(20)),
        hold(lock_d, &unknown, Some(20)),
    ];
    reset_stats(&mut conn).await;
    let renewed: Vec<Option<Duration>> = locks
        .refresh_many(&batch)
        .await
        .expect("refresh_many")
        .into_iter()
        .map(|renewal| renewal.expect("no renewal fails in the script"))
        .collect();
    assert_eq!(
        command_calls(&mut conn, "evalsha").await,
        1,
        "one script call"
    );
    assert_eq!(
        renewed,
        [
            Some(Duration::from_secs(20)),
            Some(Duration::from_secs(30)),
            Some(Duration::from_secs(2)),
            None,
            None,
            None,
        ]
    );
    let ttl = pttl(&mut conn, &baton.lock_key(lock_a)).await;
    assert!((19_000..=20_000).contains(&ttl), "PTTL {ttl}");
    let d = describe(&mut client, lock_b).await;
    let longest = remaining(&d.remaining_ttl, "longest shared lease");
    assert!(longest > Duration::from_secs(29), "{longest:?}");
    let earliest = d.earliest_shared_holder.expect("earliest");
    assert!(remaining(&earliest.remaining_ttl, "earliest") <= Duration::from_secs(2));
    assert_eq!(describe(&mut client, lock_d).await.shared_holders, 1);
    assert!(release(&mut client, lock_d, &still.token).await.was_held);

    reset_stats(&mut conn).await;
    assert!(
        locks
            .refresh_many(&[])
            .await
            .expect("empty batch")
            .is_empty()
    );
    assert_eq!(
        command_calls(&mut conn, "evalsha").await,
        0,
        "an empty batch sends nothing"
    );
}

/// Uncontended, every mode costs one script call per acquisition (waiting allowed or not) and one
/// per release, and a release with nobody waiting publishes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_calls_cost_one_script_each_in_every_mode() {
    // Reads node-wide counters: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut conn = redis.conn().await;
    let publish = conn.publish_command();

    // Load every script once, so that no NOSCRIPT retry is counted below.
    let warm = granted(&mut client, "free", 1_000, None, "", EXCLUSIVE).await;
    release(&mut client, "free", &warm.token).await;

    for how in [EXCLUSIVE, SHARED, FAIR, FAIR_SHARED] {
        for wait in [None, Some(1_000)] {
            reset_stats(&mut conn).await;
            let lease = granted(&mut client, "free", 1_000, wait, "", how).await;
            assert!(release(&mut client, "free", &lease.token).await.was_held);
            assert_eq!(
                command_calls(&mut conn, "evalsha").await,
                2,
                "{how:?} waiting {wait:?}: one script call to acquire, one to release"
            );
            assert_eq!(command_calls(&mut conn, publish).await, 1, "{how:?}");
        }
    }
}
