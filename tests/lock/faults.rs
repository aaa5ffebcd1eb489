//! Redis trouble and the classic lock failure modes (docs/guarantees.md, promises 6, 7 and 9):
//! calls fail fast with Redis down, streams report `lost` before expiry when Redis dies, waiters
//! are told UNAVAILABLE, waiting works again as soon as Redis is back, fencing tokens survive a
//! restart, readiness follows Redis, a release that meets a frozen Redis is retried; expired,
//! crashed, racing and stalled holders.

use std::time::Duration;

use baton::proto::v1::{
    self as pb, LeaseLostReason, lock_service_hold_response::Event as HoldEvent,
    semaphore_service_hold_response::Event as SemHoldEvent,
};
use nix::sys::signal::Signal;
use tokio::{task::JoinSet, time::Instant};
use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

use crate::support::{
    Baton, Proxy, RedisServer, assert_code, health_status,
    lease::{expect_end, next_event, read_until_lost, wait_for_waiters, wait_for_waiters_while},
    lock::{
        SHARED, acquire, acquire_request, acquired, ask_hold_request, describe, held, hold,
        hold_request, refresh, release, wait_until_free,
    },
    ms, remaining, unavailable_within_1s, wait_for_health, wait_until, within,
};

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
        match next_event(&mut stream, Duration::from_secs(2), "acquired").await {
            HoldEvent::Acquired(lease) => {
                (Instant::now(), remaining(&lease.remaining_ttl, "acquired"))
            }
            other => panic!("expected acquired, got {other:?}"),
        };
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

/// Redis killed while a shared Hold (ttl 1 s) is open: the stream reports `lost` UNCONFIRMED
/// before the shared lease could have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_hold_reports_lost_before_expiry_when_redis_dies() {
    let mut redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut stream = client
        .hold(ask_hold_request("doc", 1_000, "", SHARED))
        .await
        .expect("Hold")
        .into_inner();
    let (mut confirmed_at, mut valid_for) =
        match next_event(&mut stream, Duration::from_secs(2), "acquired").await {
            HoldEvent::Acquired(lease) => {
                (Instant::now(), remaining(&lease.remaining_ttl, "acquired"))
            }
            other => panic!("expected acquired, got {other:?}"),
        };
    redis.kill();
    let (lost, renewals) = read_until_lost(&mut stream, Duration::from_secs(3), "lost").await;
    if let Some((at, r)) = renewals.last() {
        (confirmed_at, valid_for) = (*at, remaining(&r.remaining_ttl, "renewed"));
    }
    assert_eq!(lost.reason(), LeaseLostReason::Unconfirmed, "{lost:?}");
    assert!(
        Instant::now() < confirmed_at + valid_for,
        "lost arrived after the lease could expire"
    );
    expect_end(&mut stream, "the Hold stream after lost").await;
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
    // Watch of an unknown service: SERVICE_UNKNOWN, and the call stays open (grpc.health.v1),
    // not a NOT_FOUND failure.
    let mut unknown = health
        .watch(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .expect("Watch of an unknown service opens")
        .into_inner();
    let first = within(
        Duration::from_secs(10),
        unknown.message(),
        "the first status of an unknown service",
    )
    .await
    .expect("a status")
    .expect("the first status");
    assert_eq!(first.status(), ServingStatus::ServiceUnknown);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), unknown.message())
            .await
            .is_err(),
        "the watch of an unknown service stays open"
    );

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
        next_event(&mut stream, Duration::from_secs(2), "acquired").await,
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

/// A Hold closed while Redis is frozen cannot release at once; its release is retried, so the
/// lock is free soon after Redis resumes, not at the end of its 30 s ttl. The same for permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_meets_a_frozen_redis_is_retried() {
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut sems = baton.semaphore_client().await;

    let (stream, _) = held(&mut client, hold_request("orders", 30_000, None, "")).await;
    let mut permit = sems
        .hold(pb::SemaphoreServiceHoldRequest {
            name: "pool".into(),
            limit: 1,
            permits: 1,
            ttl: Some(ms(30_000)),
            ..Default::default()
        })
        .await
        .expect("semaphore Hold")
        .into_inner();
    let first = within(Duration::from_secs(5), permit.message(), "the permit").await;
    assert!(
        matches!(
            first,
            Ok(Some(pb::SemaphoreServiceHoldResponse {
                event: Some(SemHoldEvent::Acquired(_))
            }))
        ),
        "{first:?}"
    );

    redis.signal(Signal::SIGSTOP);
    drop(stream);
    drop(permit);
    // Longer than the command timeout (400 ms): the first release attempts fail.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    redis.signal(Signal::SIGCONT);

    wait_until_free(&client, "orders", Duration::from_secs(5)).await;
    wait_until(Duration::from_secs(5), "the permit to be released", || {
        let mut sems = sems.clone();
        async move {
            let d = sems
                .describe(pb::SemaphoreServiceDescribeRequest {
                    name: "pool".into(),
                })
                .await
                .expect("semaphore Describe")
                .into_inner();
            if d.permits_in_use == 0 {
                Ok(())
            } else {
                Err(d)
            }
        }
    })
    .await;
}
