//! Redis trouble (docs/guarantees.md, promises 7 and 9): calls fail fast with Redis down, streams
//! report `lost` before expiry when Redis dies, waiters are told UNAVAILABLE.

use std::time::Duration;

use baton::proto::v1::{self as pb, LeaseLostReason};
use tokio::time::Instant;

use crate::support::{
    Baton, RedisServer,
    lease::{expect_end, read_until_lost, wait_for_waiters_while},
    remaining,
    semaphore::{
        acquired, hold, hold_acquired, hold_request, keep_alive, refresh, request, waiting,
    },
    unavailable_within_1s, wait_until,
};

/// With Redis down every call answers UNAVAILABLE (with RetryInfo) within 1 s: Acquire (trying
/// once, waiting, fair), Release, Refresh, Describe, KeepAlive and Hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_fail_fast_when_redis_is_down() {
    let mut redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    let permit = acquired(&mut client, request("pool", 2, 1, 10_000)).await;
    redis.kill();

    for (what, req) in [
        ("Acquire trying once", request("x", 2, 1, 1_000)),
        ("Acquire waiting", waiting("x", 2, 1, 1_000, 5_000, false)),
        (
            "Acquire waiting fair",
            waiting("x", 2, 1, 1_000, 5_000, true),
        ),
    ] {
        let mut c = client.clone();
        unavailable_within_1s(what, async move { c.acquire(req).await }).await;
    }
    let mut c = client.clone();
    let token = permit.token.clone();
    unavailable_within_1s("Release", async move {
        c.release(pb::SemaphoreServiceReleaseRequest {
            name: "pool".into(),
            token,
        })
        .await
    })
    .await;
    let mut c = client.clone();
    let token = permit.token.clone();
    unavailable_within_1s("Refresh", async move {
        refresh(&mut c, "pool", &token, None).await
    })
    .await;
    let mut c = client.clone();
    unavailable_within_1s("Describe", async move {
        c.describe(pb::SemaphoreServiceDescribeRequest {
            name: "pool".into(),
        })
        .await
    })
    .await;
    let mut c = client.clone();
    let token = permit.token.clone();
    unavailable_within_1s("KeepAlive", async move {
        keep_alive(&mut c, "pool", &token, None).await
    })
    .await;
    // Hold answers through its stream: the error is its first item.
    let mut c = client.clone();
    unavailable_within_1s("Hold", async move {
        let mut stream = c.hold(hold_request("y", 2, 1, 1_000)).await?.into_inner();
        stream.message().await
    })
    .await;
}

/// Redis killed while a Hold (ttl 1 s) is open: the stream reports `lost` UNCONFIRMED before the
/// lease could have expired, then ends; after Redis restarts the same Baton grants permits again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_during_hold_reports_lost_before_expiry() {
    let mut redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let mut stream = hold(&mut client, hold_request("pool", 2, 2, 1_000)).await;
    let permit = hold_acquired(&mut stream).await;
    let first_fence = permit.fencing_token;
    let (mut confirmed_at, mut valid_for) =
        (Instant::now(), remaining(&permit.remaining_ttl, "acquired"));
    redis.kill();

    let (lost, renewals) = read_until_lost(&mut stream, Duration::from_secs(3), "lost").await;
    if let Some((at, r)) = renewals.last() {
        (confirmed_at, valid_for) = (*at, remaining(&r.remaining_ttl, "renewed"));
    }
    let lost_at = Instant::now();
    assert_eq!(lost.reason(), LeaseLostReason::Unconfirmed, "{lost:?}");
    let expiry = confirmed_at + valid_for;
    assert!(
        lost_at < expiry,
        "lost arrived {:?} after the lease could have expired",
        lost_at - expiry
    );
    expect_end(&mut stream, "the Hold stream after lost").await;

    let mut c = client.clone();
    unavailable_within_1s("Acquire with Redis down", async move {
        c.acquire(request("other", 2, 1, 1_000)).await
    })
    .await;

    redis.restart().await;
    let permit = wait_until(
        Duration::from_secs(5),
        "an Acquire to succeed after Redis restarted",
        || {
            let mut client = client.clone();
            async move {
                match client.acquire(request("pool", 2, 2, 10_000)).await {
                    Ok(r) if r.get_ref().acquired => Ok(r.into_inner().permit.expect("permit")),
                    other => Err(other),
                }
            }
        },
    )
    .await;
    assert_eq!(permit.permits, 2);
    assert!(
        permit.fencing_token > first_fence,
        "fencing tokens keep increasing after Redis restarted empty: {} after {first_fence}",
        permit.fencing_token
    );
}

/// Redis killed while a caller waits (fair) for a full semaphore: the waiter answers UNAVAILABLE
/// within a second instead of waiting out its 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_while_waiting_answers_unavailable() {
    let mut redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    acquired(&mut client, request("pool", 1, 1, 30_000)).await;
    let mut waiter_client = baton.semaphore_client().await;
    let mut waiter = tokio::spawn(async move {
        waiter_client
            .acquire(waiting("pool", 1, 1, 1_000, 10_000, true))
            .await
    });
    wait_for_waiters_while(&client, "pool", 1, &mut waiter).await;
    redis.kill();
    unavailable_within_1s("a waiting Acquire when Redis dies", async move {
        waiter.await.expect("waiter task")
    })
    .await;
}
