//! The unary calls and what every lease is (docs/guarantees.md, promises 1-3, 8): Acquire trying
//! once or waiting (timeouts, the caller's deadline, cancellation), Release, Refresh and Describe;
//! only a hold's token releases or refreshes it; idempotent retries, and replies lost to
//! deadlines leaving nothing held; mutual exclusion under contention; bad input named by field and
//! changing nothing; every key expiring; the server around the service (reflection, the Unix
//! socket).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use baton::proto::v1 as pb;
use prost::Message;
use tokio::{task::JoinSet, time::Instant};
use tonic::{Code, Request};

use crate::support::{
    Baton, RedisServer, assert_code, assert_invalid,
    lease::{exists, pttl, wait_for_waiters, wait_for_waiters_while},
    lock::{
        EXCLUSIVE, FAIR, SHARED, acquire, acquire_request, acquired, ask, ask_hold_request,
        describe, granted, granted_with, refresh, release, wait_until_free,
    },
    ms, random_token, remaining, within,
};

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
    // A few seconds on an idle machine; minutes when other work loads it (60 s ran out at 10).
    within(
        Duration::from_secs(240),
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
            ..ask_hold_request("doc", 1_000, "", FAIR)
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
    let mut reflection = ServerReflectionClient::new(crate::support::channel(baton.addr()).await);

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

/// A retried Acquire with the same idempotency key gets the same hold back (its token, no second
/// hold); a key that granted one owner's hold is refused to another owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_retry_gets_the_same_grant() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let keyed = |owner: &str, key: &str| pb::LockServiceAcquireRequest {
        idempotency_key: key.to_owned(),
        ..acquire_request("orders", 10_000, None, owner)
    };

    let first = granted_with(&mut client, keyed("svc", "k-1")).await;
    let retry = granted_with(&mut client, keyed("svc", "k-1")).await;
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
    let fresh = granted_with(&mut client, keyed("svc", "k-1")).await;
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
            ..acquire_request("orders", 30_000, None, "")
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
                granted_with(&mut client, request).await.token
            }
        };
        assert!(release(&mut client, "orders", &token).await.was_held);
        wait_until_free(&client, "orders", Duration::from_secs(2)).await;
    }
    println!("{lost} of 20 replies lost to the deadline, {too_late} found too late by Baton");
}
