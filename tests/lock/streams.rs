//! `Hold` and `KeepAlive` streams (docs/guarantees.md, promises 6-7): acquired then renewals with
//! their absolute expiry, `not_acquired` (also before the caller's deadline), `lost` when a lease
//! is released elsewhere and for a slow reader, a ttl of at least 100 ms, the token checked, the
//! hold released as soon as the stream goes away, and batched renewals (one broken lease failing
//! alone).

use std::time::{Duration, SystemTime};

use baton::proto::v1::{
    self as pb, LeaseLostReason, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event as HoldEvent,
    lock_service_keep_alive_response::Event as KeepAliveEvent,
    semaphore_service_hold_response::Event as SemHoldEvent,
};
use tokio::time::Instant;
use tonic::{Code, Request};

use crate::support::{
    Baton, RedisServer, assert_code, assert_invalid,
    lease::{
        expect_end, next_event, next_renewal, pttl, read_until_lost, renewals_until,
        wait_for_waiters_while,
    },
    lock::{
        SHARED, acquire, acquire_request, acquired, describe, granted, granted_with, held, hold,
        hold_request, refresh, release, wait_until_free,
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
    let lease = match next_event(&mut stream, Duration::from_secs(2), "acquired").await {
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
    match next_event(&mut stream, Duration::from_secs(1), "not_acquired").await {
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
    match next_event(&mut stream, Duration::from_millis(200), "first renewal").await {
        KeepAliveEvent::Renewed(r) => assert_eq!(
            remaining(&r.remaining_ttl, "renewed"),
            Duration::from_millis(300)
        ),
        other => panic!("expected renewed first, got {other:?}"),
    }

    let renewals = renewals_until(&mut stream, Instant::now() + Duration::from_secs(1))
        .await
        .len();
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
/// renewal and ends. The lease lives 2 s: the renewal that finds it gone (half a second in) has
/// well over a second to come back before Baton would have to say `UNCONFIRMED` on a loaded
/// machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_reports_not_held_when_released_elsewhere() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = acquired(&mut client, "orders", 2_000, None, "alice").await;
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
        next_event(&mut stream, Duration::from_secs(5), "first renewal").await,
        KeepAliveEvent::Renewed(_)
    ));
    assert!(release(&mut client, "orders", &lease.token).await.was_held);

    let (lost, _) = read_until_lost(&mut stream, Duration::from_secs(5), "lost").await;
    assert_eq!(lost.reason(), LeaseLostReason::NotHeld, "{lost:?}");
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
        next_event(&mut stream, Duration::from_secs(2), "acquired").await,
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

/// `Lock::refresh_many` renews a mix of leases in one script call: an exclusive lease and two
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
    assert!(
        locks
            .refresh_many(&[])
            .await
            .expect("empty batch")
            .is_empty()
    );
    assert_eq!(
        conn.command_calls("evalsha").await,
        0,
        "an empty batch sends nothing"
    );
}

/// A client that stops reading its Hold stream (a tiny HTTP/2 window fills at once) still gets
/// `lost` when it reads again after its lease was lost: the stream never ends without it, and
/// renewals it did not read do not pile up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_always_gets_lost() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let tiny = tonic::transport::Endpoint::from_shared(format!("http://{}", baton.addr()))
        .expect("endpoint")
        .initial_stream_window_size(Some(64))
        .connect()
        .await
        .expect("connecting");
    let mut slow = LockServiceClient::new(tiny);

    let (mut stream, lease) = held(&mut slow, hold_request("orders", 200, None, "")).await;
    // Unread for 2.5 s: about 40 renewals, far more than any buffer; then the lease is ended
    // behind the stream's back, so its next renewal finds it gone.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    release(&mut client, "orders", &lease.token).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let (_, renewals) = read_until_lost(
        &mut stream,
        Duration::from_secs(5),
        "events after the pause",
    )
    .await;
    let renewals = renewals.len();
    assert!(
        renewals < 10,
        "{renewals} stale renewals were queued for a slow reader"
    );
    let end = within(Duration::from_secs(2), stream.message(), "the end").await;
    assert!(matches!(end, Ok(None)), "{end:?}");
}

fn to_system(t: &prost_types::Timestamp) -> SystemTime {
    SystemTime::try_from(*t).expect("a valid timestamp")
}

/// Every renewal carries an absolute expiry on this machine's clock, within the ttl from now, so
/// an event read late is recognisably stale; the acquired event carries one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_carry_an_absolute_expiry() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let before = SystemTime::now();
    let (mut stream, lease) = held(&mut client, hold_request("orders", 1_000, None, "")).await;
    let granted_until = to_system(lease.expires_at.as_ref().expect("expires_at"));
    assert!(granted_until > before && granted_until <= before + Duration::from_secs(1));
    for _ in 0..3 {
        let renewed = next_renewal(&mut stream).await;
        let now = SystemTime::now();
        let until = to_system(renewed.expires_at.as_ref().expect("expires_at"));
        assert!(
            until > now,
            "a fresh renewal expires in the future: {until:?} vs {now:?}"
        );
        assert!(
            until <= now + Duration::from_secs(1),
            "{until:?} is more than a ttl away"
        );
    }
}

/// A Hold whose wait would outlast the caller's deadline answers `not_acquired` before it, for a
/// lock and for a semaphore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_fits_its_wait_into_the_deadline() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut sems = baton.semaphore_client().await;
    granted_with(
        &mut client,
        acquire_request("orders", 60_000, None, "holder"),
    )
    .await;

    let mut request = Request::new(hold_request("orders", 1_000, Some(60_000), ""));
    request.set_timeout(Duration::from_millis(600));
    let started = Instant::now();
    let mut stream = client.hold(request).await.expect("Hold").into_inner();
    let first = stream.message().await;
    assert!(
        matches!(
            first,
            Ok(Some(pb::LockServiceHoldResponse {
                event: Some(HoldEvent::NotAcquired(_))
            }))
        ),
        "{first:?} after {:?}",
        started.elapsed()
    );

    let full = pb::SemaphoreServiceAcquireRequest {
        name: "pool".into(),
        limit: 1,
        permits: 1,
        ttl: Some(ms(60_000)),
        ..Default::default()
    };
    sems.acquire(full).await.expect("semaphore Acquire");
    let mut request = Request::new(pb::SemaphoreServiceHoldRequest {
        name: "pool".into(),
        limit: 1,
        permits: 1,
        ttl: Some(ms(1_000)),
        wait_timeout: Some(ms(60_000)),
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(600));
    let mut stream = sems
        .hold(request)
        .await
        .expect("semaphore Hold")
        .into_inner();
    let first = stream.message().await;
    assert!(
        matches!(
            first,
            Ok(Some(pb::SemaphoreServiceHoldResponse {
                event: Some(SemHoldEvent::NotAcquired(_))
            }))
        ),
        "{first:?}"
    );
}

/// One lease whose keys make its renewal fail inside Redis (a key of the wrong type) fails alone:
/// the other leases of the same batched script call are renewed, for locks and for semaphores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_broken_lease_does_not_fail_its_batch() {
    use baton::{lease::Primitive, lock::Lock, redis::Redis, semaphore::Semaphore};

    let redis = RedisServer::start().await;
    let [good, bad] = redis.names_in_one_slot("lock", ["good", "bad"]);
    let [pool, broken] = redis.names_in_one_slot("sem", ["pool", "broken"]);
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut sems = baton.semaphore_client().await;
    let mut conn = redis.conn().await;
    let mut config = redis.redis_config();
    config.key_prefix = baton.prefix().to_owned();
    let backend = Redis::new(&config).expect("redis config");
    let locks = Lock::new(backend.clone());
    let semaphores = Semaphore::new(backend);

    let fine = granted_with(&mut client, acquire_request(&good, 1_000, None, "")).await;
    let doomed = granted_with(&mut client, acquire_request(&bad, 1_000, None, "")).await;
    let _: () = redis::cmd("SET")
        .arg(format!("{}:leases", baton.lock_key(&bad)))
        .arg("not a sorted set")
        .query_async(&mut conn)
        .await
        .expect("SET");
    let renewed = locks
        .refresh_many(&[
            (
                good.clone(),
                fine.token.clone(),
                Some(Duration::from_secs(20)),
            ),
            (
                bad.clone(),
                doomed.token.clone(),
                Some(Duration::from_secs(20)),
            ),
        ])
        .await
        .expect("the batch call itself succeeds");
    assert_eq!(renewed.len(), 2);
    assert_eq!(
        renewed[0].as_ref().ok(),
        Some(&Some(Duration::from_secs(20)))
    );
    assert!(
        matches!(&renewed[1], Err(baton::error::Error::Internal(why)) if why.contains("WRONGTYPE")),
        "the error Redis raised is told: {renewed:?}"
    );
    let d = describe(&mut client, &good).await;
    assert!(
        remaining(&d.remaining_ttl, "good") > Duration::from_secs(19),
        "{d:?}"
    );

    let permit = |name: String| {
        let mut sems = sems.clone();
        async move {
            sems.acquire(pb::SemaphoreServiceAcquireRequest {
                name,
                limit: 2,
                permits: 1,
                ttl: Some(ms(1_000)),
                ..Default::default()
            })
            .await
            .expect("semaphore Acquire")
            .into_inner()
            .permit
            .expect("granted")
        }
    };
    let fine = permit(pool.clone()).await;
    let doomed = permit(broken.clone()).await;
    let holders = format!("{}{{sem:{broken}}}:holders", baton.prefix());
    let _: () = redis::cmd("SET")
        .arg(&holders)
        .arg("not a sorted set")
        .query_async(&mut conn)
        .await
        .expect("SET");
    let renewed = semaphores
        .refresh_many(&[
            (
                pool.clone(),
                fine.token.clone(),
                Some(Duration::from_secs(20)),
            ),
            (
                broken.clone(),
                doomed.token.clone(),
                Some(Duration::from_secs(20)),
            ),
        ])
        .await
        .expect("the batch call itself succeeds");
    assert_eq!(
        renewed[0].as_ref().ok(),
        Some(&Some(Duration::from_secs(20)))
    );
    assert!(
        matches!(&renewed[1], Err(baton::error::Error::Internal(why)) if why.contains("WRONGTYPE")),
        "the error Redis raised is told: {renewed:?}"
    );
    let d = sems
        .describe(pb::SemaphoreServiceDescribeRequest { name: pool })
        .await
        .expect("Describe")
        .into_inner();
    assert!(remaining(&d.holders[0].remaining_ttl, "pool") > Duration::from_secs(19));
}

/// Batched renewals that Redis refuses for want of memory (`maxmemory` reached) fail as the
/// unary calls do: UNAVAILABLE naming `OOM`, not an internal error blamed on a key's type; for
/// locks, semaphores and elections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_renewals_refused_for_memory_say_oom() {
    use baton::{
        election::{CampaignRequest, Election},
        error::Error,
        lease::{Acquired, Primitive},
        lock::Lock,
        redis::{Notifier, Redis},
        semaphore::Semaphore,
    };

    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut sems = baton.semaphore_client().await;
    let mut conn = redis.conn().await;
    let mut config = redis.redis_config();
    config.key_prefix = baton.prefix().to_owned();
    let backend = Redis::new(&config).expect("redis config");
    let held = granted_with(&mut client, acquire_request("oom-lock", 10_000, None, "")).await;
    let permit = crate::support::semaphore::acquired(
        &mut sems,
        crate::support::semaphore::request("oom-sem", 2, 1, 10_000),
    )
    .await;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let notifier = Notifier::start(backend.pubsub_source(), Duration::from_secs(5), shutdown);
    let elections = Election::new(backend.clone(), notifier);
    let campaign = CampaignRequest {
        name: "oom-election".to_owned(),
        ttl: Duration::from_secs(10),
        value: b"v".to_vec(),
        wait: Duration::ZERO,
    };
    let leader = "oom-leader".to_owned();
    let (elected, _) = elections
        .try_acquire(&campaign, &leader, None)
        .await
        .expect("a campaign");
    assert!(matches!(elected, Acquired::Granted(_)), "elected");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("1")
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET maxmemory");
    let renewed = [
        Lock::new(backend.clone())
            .refresh_many(&[("oom-lock".into(), held.token, None)])
            .await,
        Semaphore::new(backend.clone())
            .refresh_many(&[("oom-sem".into(), permit.token, None)])
            .await,
        elections
            .refresh_many(&[("oom-election".into(), leader, None)])
            .await,
    ];
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("0")
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET maxmemory");
    for (what, renewed) in ["lock", "semaphore", "election"].iter().zip(renewed) {
        let renewed = renewed.expect("the batch call itself succeeds");
        assert!(
            matches!(&renewed[..], [Err(Error::Unavailable(why))] if why.starts_with("OOM")),
            "{what}: {renewed:?}"
        );
    }
}
