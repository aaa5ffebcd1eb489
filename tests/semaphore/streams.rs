//! `Hold` and `KeepAlive` streams (docs/guarantees.md, promises 6-7 and "Semaphores" 2): acquired
//! then renewals, `not_acquired`, `lost` when a lease is released elsewhere or Baton shuts down,
//! a ttl of at least 100 ms, and permits freed as soon as a stream's client goes away.

use std::time::Duration;

use baton::proto::v1::{
    self as pb, LeaseLostReason, semaphore_service_hold_response::Event as HoldEvent,
    semaphore_service_keep_alive_response::Event as KeepAliveEvent,
};
use tokio::time::Instant;
use tonic::Code;

use crate::support::{
    Baton, Proxy, RedisServer, assert_code, assert_invalid,
    lease::{
        expect_end, next_event, read_until_lost, renewals_until, wait_for_state,
        wait_for_waiters_while,
    },
    ms, random_token, remaining,
    semaphore::{
        acquire, acquired, describe, hold, hold_acquired, hold_request, keep_alive, refresh,
        release, request, waiting,
    },
    within,
};

/// Hold with a 300 ms ttl sends `acquired` (the permit complete), then `renewed` events about
/// every 100 ms that keep the permits held for a second, past the ttl; dropping the stream frees
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_sends_acquired_then_renewals() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let mut stream = hold(
        &mut client,
        pb::SemaphoreServiceHoldRequest {
            owner: "holder".into(),
            ..hold_request("pool", 4, 3, 300)
        },
    )
    .await;
    let permit = hold_acquired(&mut stream).await;
    assert_eq!(permit.owner, "holder");
    assert_eq!(permit.permits, 3);
    assert_eq!(permit.limit, 4);
    assert!(permit.fencing_token > 0);
    assert!(uuid::Uuid::parse_str(&permit.token).is_ok());
    assert_eq!(
        remaining(&permit.remaining_ttl, "acquired"),
        Duration::from_millis(300)
    );

    let renewals = renewals_until(&mut stream, Instant::now() + Duration::from_secs(1)).await;
    for r in &renewals {
        assert_eq!(
            remaining(&r.remaining_ttl, "renewed"),
            Duration::from_millis(300)
        );
    }
    let renewals = renewals.len();
    assert!(
        renewals >= 5,
        "{renewals} renewals in 1 s with a 300 ms ttl"
    );

    let d = describe(&mut client, "pool").await;
    assert_eq!(d.permits_in_use, 3, "the lease outlived its ttl: {d:?}");
    assert_eq!(d.holders[0].owner, "holder");
    assert_eq!(d.holders[0].fencing_token, permit.fencing_token);

    drop(stream);
    wait_for_state(&client, "pool", "the permits to be freed", |d| {
        d.permits_in_use == 0
    })
    .await;
}

/// Hold on a full semaphore, without waiting, sends one `not_acquired` with the free permits and
/// the earliest holder expiry, then ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_on_a_full_semaphore_reports_not_acquired() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    acquired(&mut client, request("pool", 3, 2, 10_000)).await;
    let mut stream = hold(&mut client, hold_request("pool", 3, 2, 1_000)).await;
    match next_event(&mut stream, Duration::from_secs(1), "not_acquired").await {
        HoldEvent::NotAcquired(n) => {
            assert_eq!(n.available, 1);
            let left = remaining(&n.earliest_expiry, "not_acquired");
            assert!(
                left > Duration::from_secs(9) && left <= Duration::from_secs(10),
                "{left:?}"
            );
        }
        other => panic!("expected not_acquired, got {other:?}"),
    }
    expect_end(&mut stream, "the Hold stream after not_acquired").await;
    assert_eq!(describe(&mut client, "pool").await.permits_in_use, 2);

    // Waiting 200 ms first: not_acquired after the wait, and no waiter left behind.
    let started = Instant::now();
    let mut stream = hold(
        &mut client,
        pb::SemaphoreServiceHoldRequest {
            wait_timeout: Some(ms(200)),
            fair: true,
            ..hold_request("pool", 3, 2, 1_000)
        },
    )
    .await;
    match next_event(&mut stream, Duration::from_secs(2), "not_acquired").await {
        HoldEvent::NotAcquired(n) => assert_eq!(n.available, 1),
        other => panic!("expected not_acquired, got {other:?}"),
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(195) && elapsed < Duration::from_millis(1_500),
        "a 200 ms wait took {elapsed:?}"
    );
    expect_end(&mut stream, "the Hold stream after not_acquired").await;
    assert_eq!(describe(&mut client, "pool").await.waiters, 0);
}

/// KeepAlive on an acquired permit answers `renewed` at once and keeps it past its 300 ms ttl;
/// closing the stream releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_keeps_an_acquired_permit_alive() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let permit = acquired(&mut client, request("pool", 2, 2, 300)).await;
    let mut stream = keep_alive(&mut client, "pool", &permit.token, None)
        .await
        .expect("KeepAlive");
    match next_event(&mut stream, Duration::from_millis(200), "first renewal").await {
        KeepAliveEvent::Renewed(r) => {
            assert_eq!(
                remaining(&r.remaining_ttl, "renewed"),
                Duration::from_millis(300)
            );
        }
        other => panic!("expected renewed first, got {other:?}"),
    }
    let renewals = renewals_until(&mut stream, Instant::now() + Duration::from_secs(1))
        .await
        .len();
    assert!(
        renewals >= 5,
        "{renewals} renewals in 1 s with a 300 ms ttl"
    );
    let d = describe(&mut client, "pool").await;
    assert_eq!(
        d.permits_in_use, 2,
        "the lease outlived its 300 ms ttl: {d:?}"
    );
    assert_eq!(d.holders[0].fencing_token, permit.fencing_token);

    drop(stream);
    wait_for_state(&client, "pool", "the permits to be freed", |d| {
        d.permits_in_use == 0
    })
    .await;
    assert!(
        !release(&mut client, "pool", &permit.token).await,
        "already released on close"
    );
}

/// KeepAlive with a token that holds nothing fails with FAILED_PRECONDITION instead of opening
/// a stream; one whose lease is released elsewhere reports `lost` NOT_HELD and ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_without_the_lease() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let permit = acquired(&mut client, request("pool", 2, 1, 10_000)).await;
    assert_code(
        keep_alive(&mut client, "pool", &random_token(), Some(60_000)).await,
        Code::FailedPrecondition,
        "KeepAlive with a stranger's token",
    );
    let d = describe(&mut client, "pool").await;
    assert!(remaining(&d.holders[0].remaining_ttl, "describe") <= Duration::from_secs(10));

    let mut stream = keep_alive(&mut client, "pool", &permit.token, Some(300))
        .await
        .expect("KeepAlive");
    assert!(matches!(
        next_event(&mut stream, Duration::from_millis(200), "first renewal").await,
        KeepAliveEvent::Renewed(_)
    ));
    assert!(release(&mut client, "pool", &permit.token).await);
    let (lost, _) = read_until_lost(&mut stream, Duration::from_secs(1), "lost").await;
    assert_eq!(lost.reason(), LeaseLostReason::NotHeld, "{lost:?}");
    expect_end(&mut stream, "the KeepAlive stream after lost").await;
}

/// KeepAlive renews with at least 100 ms: an explicit shorter ttl, or none on a lease acquired
/// with less, is INVALID_ARGUMENT on `ttl` and leaves the lease as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_needs_a_ttl_of_at_least_100ms() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    // A lease acquired with 99 ms, then given 10 s once, still has a 99 ms acquisition ttl.
    let permit = acquired(&mut client, request("pool", 2, 1, 99)).await;
    refresh(&mut client, "pool", &permit.token, Some(10_000))
        .await
        .expect("refresh within the 99 ms lease");
    assert_invalid(
        keep_alive(&mut client, "pool", &permit.token, Some(50)).await,
        "ttl",
    );
    assert_invalid(
        keep_alive(&mut client, "pool", &permit.token, None).await,
        "ttl",
    );
    let d = describe(&mut client, "pool").await;
    let left = remaining(&d.holders[0].remaining_ttl, "describe");
    assert!(
        left > Duration::from_secs(9),
        "a refused KeepAlive changed the lease: {left:?} left"
    );

    // 100 ms is enough.
    let mut stream = keep_alive(&mut client, "pool", &permit.token, Some(100))
        .await
        .expect("KeepAlive with 100 ms");
    match next_event(&mut stream, Duration::from_millis(200), "first renewal").await {
        KeepAliveEvent::Renewed(r) => {
            assert_eq!(
                remaining(&r.remaining_ttl, "renewed"),
                Duration::from_millis(100)
            );
        }
        other => panic!("expected renewed, got {other:?}"),
    }
}

/// A Hold client (ttl 30 s) whose connection dies frees its permits at once: the waiter gets them
/// well under a second later; the same when a client just drops its stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_client_that_disconnects_frees_its_permits_at_once() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let b = baton.semaphore_client().await;

    // The connection dies without the stream being closed.
    let proxy = Proxy::start(baton.addr()).await;
    let mut a = proxy.semaphore_client().await;
    let mut stream = hold(&mut a, hold_request("cut", 3, 3, 30_000)).await;
    hold_acquired(&mut stream).await;
    let mut waiter_client = b.clone();
    let mut waiter = tokio::spawn(async move {
        let response = acquire(
            &mut waiter_client,
            waiting("cut", 3, 2, 10_000, 10_000, false),
        )
        .await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&b, "cut", 1, &mut waiter).await;
    proxy.cut();
    let cut_at = Instant::now();
    let (response, got_at) = within(Duration::from_secs(2), waiter, "the waiter to acquire")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let after = got_at.saturating_duration_since(cut_at);
    assert!(
        after < Duration::from_millis(500),
        "freed {after:?} after the connection died"
    );
    drop(stream);

    // The client drops its stream.
    let mut a = baton.semaphore_client().await;
    let mut stream = hold(&mut a, hold_request("dropped", 2, 2, 30_000)).await;
    hold_acquired(&mut stream).await;
    let mut waiter_client = b.clone();
    let mut waiter = tokio::spawn(async move {
        let response = acquire(
            &mut waiter_client,
            waiting("dropped", 2, 1, 10_000, 10_000, true),
        )
        .await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&b, "dropped", 1, &mut waiter).await;
    drop(stream);
    let dropped_at = Instant::now();
    let (response, got_at) = within(Duration::from_secs(2), waiter, "the waiter to acquire")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let after = got_at.saturating_duration_since(dropped_at);
    assert!(
        after < Duration::from_millis(500),
        "freed {after:?} after the stream was dropped"
    );
}

/// Shutting a Baton down ends its Hold streams with `lost` SHUTDOWN and releases their permits
/// at once (another Baton on the same Redis sees them free), and a caller waiting on it gets
/// UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_held_permits() {
    let redis = RedisServer::start().await;
    let mut stopping = Baton::start(&redis).await;
    let prefix = stopping.prefix().to_owned();
    let other = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix).await;
    let mut client = stopping.semaphore_client().await;
    let watcher = other.semaphore_client().await;

    let mut stream = hold(&mut client, hold_request("pool", 3, 2, 30_000)).await;
    hold_acquired(&mut stream).await;
    let mut waiter_client = client.clone();
    let mut waiter = tokio::spawn(async move {
        waiter_client
            .acquire(waiting("pool", 3, 2, 1_000, 10_000, true))
            .await
    });
    wait_for_waiters_while(&watcher, "pool", 1, &mut waiter).await;

    stopping.begin_shutdown();
    let (lost, _) = read_until_lost(&mut stream, Duration::from_secs(3), "lost").await;
    assert_eq!(lost.reason(), LeaseLostReason::Shutdown, "{lost:?}");
    let waited = within(Duration::from_secs(3), waiter, "the waiter to answer")
        .await
        .expect("waiter task");
    assert_code(waited, Code::Unavailable, "a wait cut by shutdown");
    // `lost` is sent before the release (so the holder stops first); the release and the
    // waiter's abandon follow within moments, well before the 30 s ttl could free anything.
    wait_for_state(&watcher, "pool", "the permits and the queue freed", |d| {
        (d.permits_in_use, d.waiters) == (0, 0)
    })
    .await;
    drop(stream);
    stopping.shutdown().await.expect("serve returns Ok");
}
