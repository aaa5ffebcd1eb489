//! `Hold` and `KeepAlive` streams (docs/guarantees.md, promises 6-7): acquired then renewals,
//! `not_acquired`, `lost` when a lease is released elsewhere, a ttl of at least 100 ms, the token
//! checked, the hold released as soon as the stream goes away, and batched renewals.

use std::time::Duration;

use baton::proto::v1::{
    self as pb, LeaseLostReason, lock_service_hold_response::Event as HoldEvent,
    lock_service_keep_alive_response::Event as KeepAliveEvent,
};
use tokio::time::Instant;
use tonic::Code;

use crate::support::{
    Baton, RedisServer, assert_code, assert_invalid,
    lease::{expect_end, pttl},
    lock::{
        SHARED, acquire, acquired, describe, granted, hold, next_hold_event, next_keep_alive_event,
        refresh, release, wait_for_waiters_while, wait_until_free,
    },
    ms, random_token, remaining, wait_until, within,
};

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

/// `Locks::refresh_many` renews a mix of leases in one script call: an exclusive lease and two
/// shared ones (one with its acquisition ttl) get their new ttl; a released lease, an expired
/// shared one and an unknown token come back as not held; an empty batch sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_many_renews_a_mixed_batch_in_one_call() {
    use baton::{
        lock::Locks,
        redis::{Notifier, Redis},
    };

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
    let backend = Redis::new(&config).expect("redis config");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let notifier = Notifier::start(
        backend.pubsub_source(),
        config.command_timeout,
        shutdown.clone(),
    );
    let locks = Locks::new(backend, notifier);

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
    let batch = [
        (
            lock_a,
            exclusive.token.as_str(),
            Some(Duration::from_secs(20)),
        ),
        (lock_b, shared.token.as_str(), Some(Duration::from_secs(30))),
        (lock_b, shared_default.token.as_str(), None),
        (
            lock_c,
            released.token.as_str(),
            Some(Duration::from_secs(20)),
        ),
        (
            lock_d,
            expired.token.as_str(),
            Some(Duration::from_secs(20)),
        ),
        (lock_d, unknown.as_str(), Some(Duration::from_secs(20))),
    ];
    conn.reset_stats().await;
    let renewed: Vec<Option<Duration>> = locks
        .refresh_many(&batch)
        .await
        .expect("refresh_many")
        .into_iter()
        .map(|renewal| renewal.expect("no renewal fails in the script"))
        .collect();
    assert_eq!(conn.command_calls("evalsha").await, 1, "one script call");
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

    conn.reset_stats().await;
    let none: [(&str, &str, Option<Duration>); 0] = [];
    assert!(
        locks
            .refresh_many(&none)
            .await
            .expect("empty batch")
            .is_empty()
    );
    assert_eq!(
        conn.command_calls("evalsha").await,
        0,
        "an empty batch sends nothing"
    );
    shutdown.cancel();
}
