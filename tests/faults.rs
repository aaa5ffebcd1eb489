//! Redis that stops answering without closing its connections (a frozen process, a stalled
//! network): calls fail with UNAVAILABLE within the command timeout, open streams report their
//! lease lost before it can expire, and everything works again once Redis answers.

mod support;

use std::time::Duration;

use baton::proto::v1::{
    self as pb, LeaseLostReason, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event as HoldEvent,
};
use support::{Baton, RedisServer, ms, std_duration, wait_until, within};
use tokio::time::Instant;
use tonic::Code;

/// With Redis frozen under an open Hold (ttl 1 s), the stream reports `lost` UNCONFIRMED before
/// the lease could expire, a unary call fails UNAVAILABLE within about the 400 ms command
/// timeout, and once Redis is thawed a new Acquire through the same Baton succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_loses_holds_before_expiry_and_recovers() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut hold = client
        .hold(pb::LockServiceHoldRequest {
            name: "frozen".into(),
            ttl: Some(ms(1_000)),
            wait_timeout: None,
            owner: String::new(),
            ..Default::default()
        })
        .await
        .expect("Hold")
        .into_inner();
    let first = within(Duration::from_secs(2), hold.message(), "acquired")
        .await
        .expect("stream")
        .expect("event");
    let Some(HoldEvent::Acquired(lease)) = first.event else {
        panic!("expected acquired, got {first:?}");
    };
    let mut valid_until = Instant::now() + std_duration(&lease.remaining_ttl.expect("ttl"));

    let frozen = testkit::freeze(redis.pid().expect("redis is running"));
    loop {
        let event = within(Duration::from_secs(3), hold.message(), "lost")
            .await
            .expect("stream")
            .expect("an event before the stream ends");
        match event.event {
            Some(HoldEvent::Renewed(r)) => {
                valid_until = Instant::now() + std_duration(&r.remaining_ttl.expect("ttl"));
            }
            Some(HoldEvent::Lost(lost)) => {
                assert_eq!(lost.reason(), LeaseLostReason::Unconfirmed, "{lost:?}");
                let now = Instant::now();
                assert!(
                    now < valid_until,
                    "lost arrived {:?} after the lease could have expired",
                    now - valid_until
                );
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    let started = Instant::now();
    let status = client
        .acquire(pb::LockServiceAcquireRequest {
            name: "other".into(),
            ttl: Some(ms(1_000)),
            wait_timeout: None,
            owner: String::new(),
            ..Default::default()
        })
        .await
        .expect_err("Redis is frozen");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "UNAVAILABLE took {:?}",
        started.elapsed()
    );

    drop(frozen);
    wait_until(
        Duration::from_secs(5),
        "an Acquire to succeed after Redis is thawed",
        || {
            let mut client = client.clone();
            async move {
                match client
                    .acquire(pb::LockServiceAcquireRequest {
                        name: "other".into(),
                        ttl: Some(ms(1_000)),
                        wait_timeout: None,
                        owner: String::new(),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(r) if r.get_ref().acquired => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
}

/// A caller that leaves while its grant is on the way does not leave the lock held: with Redis
/// frozen, an Acquire (lease ttl 60 s) whose caller's 300 ms deadline passes while its script
/// call waits on Redis is dropped by the server; once Redis is thawed the script grants, and
/// Baton releases that orphaned grant at once (both script calls are counted), so the lock is
/// free again long before its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_caller_left_is_released() {
    let redis = RedisServer::start().await;
    // Long enough for the frozen script call to be answered rather than given up.
    let baton = Baton::start_with(&redis, |c| {
        c.redis.command_timeout = Duration::from_secs(5);
    })
    .await;
    let mut client = baton.client().await;
    let mut conn = redis.conn().await;
    let key = baton.lock_key("orphan");
    // A first call opens Baton's Redis connection, so the next one's script is sent at once.
    let warm = client
        .acquire(pb::LockServiceAcquireRequest {
            name: "warm-up".into(),
            ttl: Some(ms(1_000)),
            ..Default::default()
        })
        .await
        .expect("Acquire")
        .into_inner();
    assert!(warm.acquired);
    conn.reset_stats().await;

    let frozen = testkit::freeze(redis.pid().expect("redis is running"));
    let mut request = tonic::Request::new(pb::LockServiceAcquireRequest {
        name: "orphan".into(),
        ttl: Some(ms(60_000)),
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(300));
    // A client without tonic's own timer, whose CANCELLED ("Timeout expired") could come first.
    let (untimed, origin) = testkit::untimed_client(baton.addr());
    let status = within(
        Duration::from_secs(3),
        LockServiceClient::with_origin(untimed, origin).acquire(request),
        "the deadline",
    )
    .await
    .expect_err("the caller's deadline passes while Redis is frozen");
    // Baton's answer (the request sets only the grpc-timeout header, no client-side timer): the
    // deadline's code, which clients retry, not the transport's CANCELLED "Timeout expired".
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("deadline"), "{status:?}");
    // The server has dropped the call by now; the script is still waiting in Redis.
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(frozen);

    wait_until(
        Duration::from_secs(3),
        "the orphaned grant to be made and released",
        || {
            let mut conn = conn.clone();
            let key = key.clone();
            async move {
                let calls = conn.command_calls("evalsha").await;
                let exists: bool = redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if calls >= 2 && !exists {
                    Ok(())
                } else {
                    Err(format!("{calls} script calls, lock state exists: {exists}"))
                }
            }
        },
    )
    .await;
    let free = client
        .acquire(pb::LockServiceAcquireRequest {
            name: "orphan".into(),
            ttl: Some(ms(1_000)),
            ..Default::default()
        })
        .await
        .expect("Acquire")
        .into_inner();
    assert!(free.acquired, "the lock is free again: {free:?}");
}

/// A call sent to a Redis that stays paused for longer than the call's ttl grants nothing that
/// lasts: the Acquire (ttl 5 s) fails UNAVAILABLE, Redis stays frozen for 6 s, and when it
/// resumes it runs the script still waiting in its input buffer, with a fresh 5 s expiry. The
/// clean-up, retried until Redis answers it rather than until the ttl would have passed, frees
/// that grant about a second after Redis resumes instead of leaving a lease nobody knows of
/// for its whole ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_unanswered_past_its_ttl_leaves_nothing_held_after_redis_resumes() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let conn = redis.conn().await;
    let key = baton.lock_key("late");
    let acquire = |name: &str, ttl: u64| pb::LockServiceAcquireRequest {
        name: name.into(),
        ttl: Some(ms(ttl)),
        ..Default::default()
    };
    // A first call opens Baton's Redis connection, so the next one's script is sent at once.
    let warm = client
        .acquire(acquire("warm-up", 1_000))
        .await
        .expect("Acquire")
        .into_inner();
    assert!(warm.acquired);

    let frozen = testkit::freeze(redis.pid().expect("redis is running"));
    let since = Instant::now();
    let status = within(
        Duration::from_secs(5),
        client.acquire(acquire("late", 5_000)),
        "UNAVAILABLE",
    )
    .await
    .expect_err("Redis is frozen");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    // Longer than the ttl and the command timeout after the call: a clean-up retried only until
    // the lease would have expired has given up by now.
    tokio::time::sleep_until(since + Duration::from_secs(6)).await;
    drop(frozen);
    let thawed = Instant::now();

    wait_until(
        Duration::from_secs(10),
        "the late grant to be released",
        || {
            let mut conn = conn.clone();
            let key = key.clone();
            async move {
                let exists: bool = redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if exists {
                    Err("held".to_owned())
                } else {
                    Ok(())
                }
            }
        },
    )
    .await;
    let held = thawed.elapsed();
    // The late grant, if Redis ran it before the clean-up, lasts until the clean-up's next try
    // (at most a second apart); left alone it would last its 5 s ttl.
    assert!(
        held < Duration::from_millis(3_500),
        "a lease nobody knows of lasted {held:?} after Redis resumed"
    );
    let free = client
        .acquire(acquire("late", 1_000))
        .await
        .expect("Acquire")
        .into_inner();
    assert!(free.acquired, "the lock is free: {free:?}");
}
