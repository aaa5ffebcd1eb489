//! Ordinary call sequences that once broke the lease promises of locks and semaphores, each
//! played against a real Redis through an in-process Baton: re-entrant holds with mixed ttls,
//! tokens revealed or shared, clean-ups tried once, late queue places, slow readers, deadlines.

mod support;

use std::time::{Duration, SystemTime};

use baton::proto::v1::{
    self as pb, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event as HoldEvent,
    lock_service_keep_alive_response::Event as KeepAliveEvent,
    semaphore_service_hold_response::Event as SemHoldEvent,
};
use nix::sys::signal::Signal;
use support::{Baton, RedisServer, ms, remaining, wait_until, within};
use tokio::time::Instant;
use tonic::{Code, Request, Streaming, transport::Channel};

type Locks = LockServiceClient<Channel>;

fn acquire(name: &str, ttl_ms: u64, owner: &str) -> pb::LockServiceAcquireRequest {
    pb::LockServiceAcquireRequest {
        name: name.to_owned(),
        ttl: Some(ms(ttl_ms)),
        owner: owner.to_owned(),
        ..Default::default()
    }
}

fn hold(name: &str, ttl_ms: u64, owner: &str) -> pb::LockServiceHoldRequest {
    pb::LockServiceHoldRequest {
        name: name.to_owned(),
        ttl: Some(ms(ttl_ms)),
        owner: owner.to_owned(),
        ..Default::default()
    }
}

async fn granted(client: &mut Locks, request: pb::LockServiceAcquireRequest) -> pb::LockLease {
    let what = format!("{request:?}");
    let reply = client
        .acquire(request)
        .await
        .unwrap_or_else(|s| panic!("{what}: {s:?}"))
        .into_inner();
    assert!(reply.acquired, "{what}: not acquired: {reply:?}");
    reply.lease.expect("a granted reply carries its lease")
}

async fn refused(client: &mut Locks, request: pb::LockServiceAcquireRequest) {
    let what = format!("{request:?}");
    let reply = client
        .acquire(request)
        .await
        .unwrap_or_else(|s| panic!("{what}: {s:?}"))
        .into_inner();
    assert!(!reply.acquired, "{what}: granted although held: {reply:?}");
}

async fn describe(client: &mut Locks, name: &str) -> pb::LockServiceDescribeResponse {
    client
        .describe(pb::LockServiceDescribeRequest {
            name: name.to_owned(),
        })
        .await
        .expect("Describe")
        .into_inner()
}

async fn release(client: &mut Locks, name: &str, token: &str) -> pb::LockServiceReleaseResponse {
    client
        .release(pb::LockServiceReleaseRequest {
            name: name.to_owned(),
            token: token.to_owned(),
        })
        .await
        .expect("Release")
        .into_inner()
}

/// Opens a Hold stream and returns it with its `acquired` lease.
async fn held(
    client: &mut Locks,
    request: pb::LockServiceHoldRequest,
) -> (Streaming<pb::LockServiceHoldResponse>, pb::LockLease) {
    let mut stream = client.hold(request).await.expect("Hold").into_inner();
    match next(&mut stream, "the acquired event").await {
        HoldEvent::Acquired(lease) => (stream, lease),
        other => panic!("expected acquired, got {other:?}"),
    }
}

async fn next(stream: &mut Streaming<pb::LockServiceHoldResponse>, what: &str) -> HoldEvent {
    within(Duration::from_secs(5), stream.message(), what)
        .await
        .unwrap_or_else(|s| panic!("{what}: the stream failed: {s:?}"))
        .unwrap_or_else(|| panic!("{what}: the stream ended"))
        .event
        .unwrap_or_else(|| panic!("{what}: an event without payload"))
}

/// Reads `stream` until its first renewal.
async fn first_renewal(stream: &mut Streaming<pb::LockServiceHoldResponse>) -> pb::LeaseRenewed {
    match next(stream, "a renewal").await {
        HoldEvent::Renewed(r) => r,
        other => panic!("expected a renewal, got {other:?}"),
    }
}

/// Waits until the lock is free, for at most `limit`.
async fn until_free(client: &Locks, name: &str, limit: Duration) {
    wait_until(limit, &format!("{name:?} to be free"), || {
        let mut client = client.clone();
        async move {
            let d = describe(&mut client, name).await;
            if d.held { Err(d) } else { Ok(()) }
        }
    })
    .await;
}

fn to_system(t: &prost_types::Timestamp) -> SystemTime {
    SystemTime::try_from(*t).expect("a valid timestamp")
}

// ---------------------------------------------------------------------------------------------
// Re-entrant holds with mixed ttls
// ---------------------------------------------------------------------------------------------

/// Hold A (60 s) and a re-entrant Hold B (1 s) of the same owner: B's renewals and its close leave
/// A's promise whole; 1.5 s after B closed another owner still cannot take the lock, and A is not
/// told `lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_reentrant_hold_never_shortens_the_lease() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let (mut a, lease_a) = held(&mut client, hold("orders", 60_000, "svc")).await;
    let (mut b, lease_b) = held(&mut client, hold("orders", 1_000, "svc")).await;
    assert_eq!(lease_b.hold_count, 2, "{lease_b:?}");
    assert_eq!(lease_b.fencing_token, lease_a.fencing_token);
    assert_ne!(lease_b.token, lease_a.token, "each hold has its own token");
    first_renewal(&mut b).await;
    drop(b);
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    refused(&mut client, acquire("orders", 1_000, "other")).await;
    let d = describe(&mut client, "orders").await;
    assert_eq!((d.owner.as_str(), d.hold_count), ("svc", 1), "{d:?}");
    assert!(
        remaining(&d.remaining_ttl, "lease") > Duration::from_secs(55),
        "{d:?}"
    );
    // A's stream is quiet (its next renewal is ~15 s away): it certainly got no `lost`.
    let quiet = tokio::time::timeout(Duration::from_millis(100), a.message()).await;
    assert!(quiet.is_err(), "A heard something: {quiet:?}");
}

/// Acquire (10 s) then a re-entrant Hold (1 s) by the same owner, closed after a renewal: the
/// first caller's remaining ttl is honoured; another owner gets nothing before it runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_outlives_a_shorter_reentrant_hold() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let sent = Instant::now();
    let first = granted(&mut client, acquire("orders", 10_000, "svc")).await;
    let promised = sent + remaining(&first.remaining_ttl, "first");
    let (mut stream, _) = held(&mut client, hold("orders", 1_000, "svc")).await;
    first_renewal(&mut stream).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    refused(&mut client, acquire("orders", 1_000, "other")).await;
    let d = describe(&mut client, "orders").await;
    let left = remaining(&d.remaining_ttl, "lease");
    assert!(
        Instant::now() + left + Duration::from_millis(5) >= promised,
        "the lease ends {left:?} from now, before the {promised:?} promised: {d:?}"
    );
}

/// A re-entrant shared hold refreshed to 100 ms does not cut short the 10 s shared hold of the
/// same owner: an exclusive request still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_refresh_of_one_hold_never_cuts_another_short() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let shared = |ttl| pb::LockServiceAcquireRequest {
        mode: pb::LockMode::Shared.into(),
        ..acquire("doc", ttl, "reader")
    };

    granted(&mut client, shared(10_000)).await;
    let second = granted(&mut client, shared(5_000)).await;
    let refreshed = client
        .refresh(pb::LockServiceRefreshRequest {
            name: "doc".into(),
            token: second.token.clone(),
            ttl: Some(ms(100)),
        })
        .await
        .expect("Refresh")
        .into_inner();
    assert_eq!(
        remaining(&refreshed.remaining_ttl, "refreshed"),
        Duration::from_millis(100)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    refused(&mut client, acquire("doc", 1_000, "writer")).await;
    let d = describe(&mut client, "doc").await;
    assert_eq!(d.shared_holders, 1, "{d:?}");
    let earliest = d.earliest_shared_holder.expect("a shared holder");
    assert_eq!(
        earliest.hold_count, 1,
        "the refreshed hold expired alone: {earliest:?}"
    );
}

/// A KeepAlive without a ttl renews a hold with that hold's own ttl, not with the ttl of the first
/// hold of its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_without_a_ttl_renews_with_the_holds_own_ttl() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    granted(&mut client, acquire("orders", 500, "svc")).await;
    let long = granted(&mut client, acquire("orders", 5_000, "svc")).await;
    let mut stream = client
        .keep_alive(pb::LockServiceKeepAliveRequest {
            name: "orders".into(),
            token: long.token.clone(),
            ttl: None,
        })
        .await
        .expect("KeepAlive")
        .into_inner();
    let first = within(
        Duration::from_secs(2),
        stream.message(),
        "the first renewal",
    )
    .await
    .expect("stream")
    .and_then(|m| m.event);
    let Some(KeepAliveEvent::Renewed(renewed)) = first else {
        panic!("expected a renewal, got {first:?}");
    };
    assert_eq!(
        remaining(&renewed.remaining_ttl, "renewal"),
        Duration::from_secs(5)
    );
}

// ---------------------------------------------------------------------------------------------
// Tokens stay with their holders
// ---------------------------------------------------------------------------------------------

/// Describe shows owners, never tokens: an anonymous holder's owner is empty, so nothing Describe
/// says can release it; a caller naming a holder's owner re-enters with a token of its own, whose
/// release leaves the first hold held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_never_reveals_a_token_and_owners_cannot_release_others() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut sems = baton.semaphore_client().await;

    let anonymous = granted(&mut client, acquire("orders", 10_000, "")).await;
    assert_eq!(anonymous.owner, "");
    let d = describe(&mut client, "orders").await;
    assert!(d.held);
    assert_eq!(d.owner, "", "{d:?}");

    let reader = granted(
        &mut client,
        pb::LockServiceAcquireRequest {
            mode: pb::LockMode::Shared.into(),
            ..acquire("shared", 10_000, "")
        },
    )
    .await;
    let d = describe(&mut client, "shared").await;
    let earliest = d.earliest_shared_holder.expect("a shared holder");
    assert_eq!(earliest.owner, "");
    assert_ne!(earliest.owner, reader.token);

    let first = granted(&mut client, acquire("named", 10_000, "svc")).await;
    let intruder = granted(&mut client, acquire("named", 10_000, "svc")).await;
    assert_ne!(
        intruder.token, first.token,
        "re-entering never hands out a holder's token"
    );
    assert!(
        release(&mut client, "named", &intruder.token)
            .await
            .was_held
    );
    let d = describe(&mut client, "named").await;
    assert_eq!(
        (d.held, d.hold_count),
        (true, 1),
        "the first hold is still held: {d:?}"
    );
    assert!(release(&mut client, "named", &first.token).await.was_held);

    let permit = sems
        .acquire(pb::SemaphoreServiceAcquireRequest {
            name: "pool".into(),
            limit: 2,
            permits: 1,
            ttl: Some(ms(10_000)),
            ..Default::default()
        })
        .await
        .expect("semaphore Acquire")
        .into_inner()
        .permit
        .expect("granted");
    let d = sems
        .describe(pb::SemaphoreServiceDescribeRequest {
            name: "pool".into(),
        })
        .await
        .expect("semaphore Describe")
        .into_inner();
    assert!(
        d.holders
            .iter()
            .all(|h| h.owner.is_empty() && h.owner != permit.token),
        "{d:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Clean-ups are retried
// ---------------------------------------------------------------------------------------------

/// A Hold closed while Redis is frozen cannot release at once; its release is retried, so the
/// lock is free soon after Redis resumes, not at the end of its 30 s ttl. The same for permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_meets_a_frozen_redis_is_retried() {
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut sems = baton.semaphore_client().await;

    let (stream, _) = held(&mut client, hold("orders", 30_000, "")).await;
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

    until_free(&client, "orders", Duration::from_secs(5)).await;
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

/// A fair waiter whose first try times out (Redis frozen) after Redis took its place in the queue
/// gives the place back: once the holder releases, the next fair waiter gets the lock at once,
/// not when the ghost place's 3 s lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_place_taken_by_a_failed_first_try_is_given_back() {
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let fair = |owner: &str, wait| pb::LockServiceAcquireRequest {
        fair: true,
        wait_timeout: Some(ms(wait)),
        ..acquire("orders", 10_000, owner)
    };

    let holder = granted(&mut client, acquire("orders", 10_000, "holder")).await;
    redis.signal(Signal::SIGSTOP);
    let failed = client.clone().acquire(fair("ghost", 5_000)).await;
    assert_eq!(failed.map(|_| ()).unwrap_err().code(), Code::Unavailable);
    redis.signal(Signal::SIGCONT);
    // Redis now runs the ghost's first try, which queues it; Baton takes the place back.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut next = client.clone();
    let waiter = tokio::spawn(async move {
        let asked = Instant::now();
        let reply = next.acquire(fair("next", 8_000)).await.expect("Acquire");
        (reply.into_inner(), asked)
    });
    wait_until(
        Duration::from_secs(5),
        "the next fair waiter to queue",
        || {
            let mut client = client.clone();
            async move {
                let d = describe(&mut client, "orders").await;
                if d.queued >= 1 && d.waiters >= 1 {
                    Ok(())
                } else {
                    Err(d)
                }
            }
        },
    )
    .await;
    let released = Instant::now();
    assert!(release(&mut client, "orders", &holder.token).await.was_held);
    let (reply, _) = within(Duration::from_secs(6), waiter, "the next waiter")
        .await
        .expect("waiter task");
    assert!(reply.acquired, "{reply:?}");
    let handoff = released.elapsed();
    assert!(
        handoff < Duration::from_millis(1_500),
        "the next fair waiter waited {handoff:?} behind a ghost place"
    );
}

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

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

    let (mut stream, lease) = held(&mut slow, hold("orders", 200, "")).await;
    // Unread for 2.5 s: about 40 renewals, far more than any buffer; then the lease is ended
    // behind the stream's back, so its next renewal finds it gone.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    release(&mut client, "orders", &lease.token).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let mut renewals = 0;
    loop {
        match next(&mut stream, "events after the pause").await {
            HoldEvent::Renewed(_) => renewals += 1,
            HoldEvent::Lost(_) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        renewals < 10,
        "{renewals} stale renewals were queued for a slow reader"
    );
    let end = within(Duration::from_secs(2), stream.message(), "the end").await;
    assert!(matches!(end, Ok(None)), "{end:?}");
}

/// Every renewal carries an absolute expiry on this machine's clock, within the ttl from now, so
/// an event read late is recognisably stale; the acquired event carries one too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_carry_an_absolute_expiry() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let before = SystemTime::now();
    let (mut stream, lease) = held(&mut client, hold("orders", 1_000, "")).await;
    let granted_until = to_system(lease.expires_at.as_ref().expect("expires_at"));
    assert!(granted_until > before && granted_until <= before + Duration::from_secs(1));
    for _ in 0..3 {
        let renewed = first_renewal(&mut stream).await;
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
    granted(&mut client, acquire("orders", 60_000, "holder")).await;

    let mut request = Request::new(pb::LockServiceHoldRequest {
        wait_timeout: Some(ms(60_000)),
        ..hold("orders", 1_000, "")
    });
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

// ---------------------------------------------------------------------------------------------
// Replies lost to deadlines
// ---------------------------------------------------------------------------------------------

/// A retried Acquire with the same idempotency key gets the same hold back (its token, no second
/// hold); a key that granted one owner's hold is refused to another owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_gets_the_same_grant() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let keyed = |owner: &str, key: &str| pb::LockServiceAcquireRequest {
        idempotency_key: key.to_owned(),
        ..acquire("orders", 10_000, owner)
    };

    let first = granted(&mut client, keyed("svc", "k-1")).await;
    let retry = granted(&mut client, keyed("svc", "k-1")).await;
    assert_eq!(retry.token, first.token);
    assert_eq!(retry.hold_count, 1, "no second hold: {retry:?}");
    assert_eq!(describe(&mut client, "orders").await.hold_count, 1);
    let other = client.acquire(keyed("someone", "k-1")).await;
    assert_eq!(
        other.map(|_| ()).unwrap_err().code(),
        Code::FailedPrecondition
    );
    let bad = client.acquire(keyed("svc", "not a key")).await;
    assert_eq!(bad.map(|_| ()).unwrap_err().code(), Code::InvalidArgument);
    assert!(release(&mut client, "orders", &first.token).await.was_held);
    let fresh = granted(&mut client, keyed("svc", "k-1")).await;
    assert_ne!(
        fresh.token, first.token,
        "a released hold is not handed out again"
    );
}

/// Acquires with 1-5 ms deadlines often lose their reply; retried with their idempotency key they
/// recover the grant or get a fresh one, and once released the lock is free: no hold is ever left
/// behind that nobody knows of. A grant Baton itself finds too late to answer leaves nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_lost_to_deadlines_leave_nothing_behind() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let (mut lost, mut too_late) = (0, 0);
    for round in 0..20 {
        let key = format!("round-{round}");
        let request = pb::LockServiceAcquireRequest {
            idempotency_key: key.clone(),
            ..acquire("orders", 30_000, "")
        };
        let mut call = Request::new(request.clone());
        call.set_timeout(Duration::from_millis(1 + round % 5));
        let token = match client.acquire(call).await {
            Ok(reply) => reply.into_inner().lease.expect("granted").token,
            Err(status) => {
                lost += 1;
                if status.code() == Code::DeadlineExceeded
                    && status
                        .message()
                        .contains("too close to the caller's deadline")
                {
                    too_late += 1;
                }
                granted(&mut client, request).await.token
            }
        };
        assert!(release(&mut client, "orders", &token).await.was_held);
        until_free(&client, "orders", Duration::from_secs(2)).await;
    }
    println!("{lost} of 20 replies lost to the deadline, {too_late} found too late by Baton");
}

/// The quoted words of one MONITOR line (`1700000000.1 [0 127.0.0.1:5] "EVALSHA" "..." ...`).
fn monitor_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => word.extend(chars.next()),
                '"' => break,
                c => word.push(c),
            }
        }
        words.push(word);
    }
    words
}

/// Fair semaphore waiters are served in the order their requests reached Redis, also across two
/// Batons: in each of 10 rounds two fair waiters on different Batons ask at once, and the one
/// whose first script call Redis ran first (seen with MONITOR) gets the permit first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_semaphore_waiters_are_served_in_redis_arrival_order() {
    use futures::StreamExt;

    let redis = RedisServer::start_private().await;
    let prefix = support::unique_prefix();
    let one = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let two = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let clients = [one.semaphore_client().await, two.semaphore_client().await];
    let monitor = redis::Client::open(redis.url())
        .expect("redis url")
        .get_async_monitor()
        .await
        .expect("MONITOR");
    let mut lines = monitor.into_on_message::<String>();
    let request = |owner: &str, wait: u64| pb::SemaphoreServiceAcquireRequest {
        name: "pool".into(),
        limit: 1,
        permits: 1,
        ttl: Some(ms(10_000)),
        wait_timeout: (wait > 0).then(|| ms(wait)),
        owner: owner.to_owned(),
        fair: true,
        ..Default::default()
    };
    // acquire.lua: "EVALSHA" sha "7" KEYS[7] (the holders key first) then ARGV token, owner,
    // permits, limit, ttl, waiter, ... (at least ten).
    let acquire_owner = |words: &[String]| {
        (words.len() >= 3 + 7 + 10
            && words[0].eq_ignore_ascii_case("evalsha")
            && words[3].ends_with("{sem:pool}:holders"))
        .then(|| words[11].clone())
    };

    let mut mismatches = Vec::new();
    for round in 0..10 {
        let mut holder_client = clients[0].clone();
        let holder = holder_client
            .acquire(request("holder", 0))
            .await
            .expect("Acquire")
            .into_inner()
            .permit
            .expect("the holder is granted");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let owners = [format!("a{round}"), format!("b{round}")];
        for (owner, client) in owners.iter().zip(clients.iter().cloned()) {
            let (tx, mut client, request) = (tx.clone(), client, request(owner, 5_000));
            tokio::spawn(async move {
                let reply = client.acquire(request).await.expect("Acquire").into_inner();
                let _ = tx.send(reply.permit.expect("granted"));
            });
        }
        // The first script call of each waiter, in the order Redis ran them.
        let mut arrival: Vec<String> = Vec::new();
        within(
            Duration::from_secs(5),
            async {
                while arrival.len() < 2 {
                    let line = lines.next().await.expect("MONITOR goes on");
                    if let Some(owner) = acquire_owner(&monitor_words(&line))
                        && owners.contains(&owner)
                        && !arrival.contains(&owner)
                    {
                        arrival.push(owner);
                    }
                }
            },
            "both waiters' first calls",
        )
        .await;
        wait_until(Duration::from_secs(5), "both waiters to wait", || {
            let mut c = clients[1].clone();
            async move {
                let d = c
                    .describe(pb::SemaphoreServiceDescribeRequest {
                        name: "pool".into(),
                    })
                    .await
                    .expect("Describe")
                    .into_inner();
                if d.waiters == 2 { Ok(()) } else { Err(d) }
            }
        })
        .await;
        let mut token = holder.token;
        let mut served = Vec::new();
        for _ in 0..2 {
            holder_client
                .release(pb::SemaphoreServiceReleaseRequest {
                    name: "pool".into(),
                    token,
                })
                .await
                .expect("Release");
            let permit = within(Duration::from_secs(5), rx.recv(), "the next grant")
                .await
                .expect("a grant");
            served.push(permit.owner);
            token = permit.token;
        }
        holder_client
            .release(pb::SemaphoreServiceReleaseRequest {
                name: "pool".into(),
                token,
            })
            .await
            .expect("Release");
        if served != arrival {
            mismatches.push(format!(
                "round {round}: arrived {arrival:?}, served {served:?}"
            ));
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");
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

    let fine = granted(&mut client, acquire(&good, 1_000, "")).await;
    let doomed = granted(&mut client, acquire(&bad, 1_000, "")).await;
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
    assert!(renewed[1].is_err(), "{renewed:?}");
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
    assert!(renewed[1].is_err(), "{renewed:?}");
    let d = sems
        .describe(pb::SemaphoreServiceDescribeRequest { name: pool })
        .await
        .expect("Describe")
        .into_inner();
    assert!(remaining(&d.holders[0].remaining_ttl, "pool") > Duration::from_secs(19));
}
