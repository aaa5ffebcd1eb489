//! The unary calls and what every permit is (docs/guarantees.md, "Semaphores" 7-8): Acquire
//! trying once or waiting (timeouts, the caller's deadline), Release (retries harmless, expiry
//! reported), Refresh and Describe; every acquisition its own lease; bad input named by field and
//! writing nothing; names kept apart; every key expiring.

use std::time::Duration;

use baton::proto::v1 as pb;
use tokio::time::Instant;
use tonic::Code;

use crate::support::{
    Baton, RedisServer, assert_code, assert_invalid,
    lease::{
        keys_under, pttl, redis_time, wait_for_state, wait_for_waiters, wait_for_waiters_while,
        zscore,
    },
    ms, random_token, remaining,
    semaphore::{
        acquire, acquired, describe, hold, hold_acquired, hold_request, keep_alive, refresh,
        refused, release, request, waiting,
    },
    within,
};

/// Acquire grants a permit with a UUID token, a positive fencing token, the full ttl, the permits
/// and limit asked for, and the owner echoed (the token when empty); owners are not reentrant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_grants_a_complete_permit() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let permit = acquired(
        &mut client,
        pb::SemaphoreServiceAcquireRequest {
            owner: "alice".into(),
            ..request("pool", 5, 2, 10_000)
        },
    )
    .await;
    assert_eq!(permit.name, "pool");
    let token = uuid::Uuid::parse_str(&permit.token).expect("the token is a UUID");
    assert_eq!(token.hyphenated().to_string(), permit.token);
    assert!(permit.fencing_token > 0, "{permit:?}");
    assert_eq!(
        remaining(&permit.remaining_ttl, "permit"),
        Duration::from_secs(10)
    );
    assert_eq!(permit.permits, 2);
    assert_eq!(permit.limit, 5);
    assert_eq!(permit.owner, "alice");

    let anonymous = acquired(&mut client, request("pool", 5, 1, 10_000)).await;
    assert_eq!(
        anonymous.owner, "",
        "an empty owner stays empty, never the token"
    );
    assert!(anonymous.fencing_token > permit.fencing_token);

    // The same owner again is a new lease, not a reentrant hold.
    let again = acquired(
        &mut client,
        pb::SemaphoreServiceAcquireRequest {
            owner: "alice".into(),
            ..request("pool", 5, 2, 10_000)
        },
    )
    .await;
    assert_ne!(again.token, permit.token);
    let d = describe(&mut client, "pool").await;
    assert_eq!(d.permits_in_use, 5);
    assert_eq!(d.holder_count, 3);
    let full = refused(
        &mut client,
        pb::SemaphoreServiceAcquireRequest {
            owner: "alice".into(),
            ..request("pool", 5, 1, 10_000)
        },
    )
    .await;
    assert_eq!(full.available, 0);
    let expiry = remaining(&full.earliest_expiry, "earliest_expiry");
    assert!(
        expiry > Duration::from_secs(9) && expiry <= Duration::from_secs(10),
        "{expiry:?}"
    );
}

/// Release answers was_held=true and frees the permits; a retried release answers false and
/// does not touch the permits another holder took meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_frees_permits_and_retries_are_harmless() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let first = acquired(&mut client, request("pool", 2, 2, 10_000)).await;
    assert!(release(&mut client, "pool", &first.token).await);
    let d = describe(&mut client, "pool").await;
    assert_eq!(d.permits_in_use, 0, "{d:?}");
    assert_eq!(d.holder_count, 0);
    assert!(d.holders.is_empty());

    let second = acquired(&mut client, request("pool", 2, 2, 10_000)).await;
    assert!(
        !release(&mut client, "pool", &first.token).await,
        "a retried release"
    );
    assert!(
        !release(&mut client, "pool", &random_token()).await,
        "an unknown token"
    );
    let d = describe(&mut client, "pool").await;
    assert_eq!(
        d.permits_in_use, 2,
        "the retry must not free another holder's permits: {d:?}"
    );
    assert_eq!(d.holders[0].fencing_token, second.fencing_token);
    assert!(release(&mut client, "pool", &second.token).await);
    assert!(!release(&mut client, "never-used", &random_token()).await);
}

/// Refresh sets the remaining ttl to the requested value (the holders' expiry score in Redis
/// agrees), and without a ttl goes back to the acquisition ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_sets_the_remaining_ttl() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    let mut conn = redis.conn().await;
    let holders = format!("{}:holders", baton.semaphore_key("pool"));

    let permit = acquired(&mut client, request("pool", 3, 1, 2_000)).await;
    let refreshed = refresh(&mut client, "pool", &permit.token, Some(20_000))
        .await
        .expect("refresh with a ttl");
    assert_eq!(
        remaining(&refreshed.remaining_ttl, "refresh"),
        Duration::from_secs(20)
    );
    let (now, _) = redis_time(&mut conn).await;
    let expiry = zscore(&mut conn, &holders, &permit.token)
        .await
        .expect("a holder");
    let left = expiry - now as f64;
    assert!(
        (19_000.0..=20_000.0).contains(&left),
        "expiry in {left} ms by Redis time"
    );
    let d = describe(&mut client, "pool").await;
    let left = remaining(&d.holders[0].remaining_ttl, "describe");
    assert!(
        left > Duration::from_secs(19) && left <= Duration::from_secs(20),
        "{left:?}"
    );

    let back = refresh(&mut client, "pool", &permit.token, None)
        .await
        .expect("refresh without a ttl");
    assert_eq!(
        remaining(&back.remaining_ttl, "refresh"),
        Duration::from_secs(2)
    );
    let d = describe(&mut client, "pool").await;
    let left = remaining(&d.holders[0].remaining_ttl, "describe");
    assert!(
        left > Duration::from_millis(1_500) && left <= Duration::from_secs(2),
        "{left:?}"
    );
}

/// Refresh with a well-formed token that holds nothing fails with FAILED_PRECONDITION: a stranger's
/// token, a never-used semaphore, a released lease and an expired one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refresh_without_the_lease_fails_precondition() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let held = acquired(&mut client, request("pool", 3, 1, 10_000)).await;
    assert_code(
        refresh(&mut client, "pool", &random_token(), Some(1_000)).await,
        Code::FailedPrecondition,
        "refresh with a stranger's token",
    );
    assert_code(
        refresh(&mut client, "never-used", &random_token(), None).await,
        Code::FailedPrecondition,
        "refresh on a never-used semaphore",
    );
    let released = acquired(&mut client, request("pool", 3, 1, 10_000)).await;
    assert!(release(&mut client, "pool", &released.token).await);
    assert_code(
        refresh(&mut client, "pool", &released.token, None).await,
        Code::FailedPrecondition,
        "refresh of a released lease",
    );
    let expired = acquired(&mut client, request("pool", 3, 1, 50)).await;
    wait_for_state(&client, "pool", "the 50 ms lease to expire", |d| {
        d.holder_count == 1
    })
    .await;
    assert_code(
        refresh(&mut client, "pool", &expired.token, Some(10_000)).await,
        Code::FailedPrecondition,
        "refresh of an expired lease",
    );
    let d = describe(&mut client, "pool").await;
    assert_eq!(d.permits_in_use, 1, "{d:?}");
    assert_eq!(d.holders[0].fencing_token, held.fencing_token);
}

/// Describe reports a never-used semaphore as empty; then the strictest limit, the permits in
/// use, each holder (owner, permits, limit, fencing token, remaining ttl; soonest expiry first),
/// the holder count, the latest fencing token and the callers waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_reports_limit_holders_and_waiters() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    assert_eq!(
        describe(&mut client, "pool").await,
        pb::SemaphoreServiceDescribeResponse::default(),
        "a semaphore never used has no limit, holders, waiters or fencing token"
    );

    let alice = acquired(
        &mut client,
        pb::SemaphoreServiceAcquireRequest {
            owner: "alice".into(),
            ..request("pool", 4, 2, 20_000)
        },
    )
    .await;
    let anonymous = acquired(&mut client, request("pool", 5, 1, 10_000)).await;
    assert_eq!(anonymous.limit, 4, "the strictest limit is in force");

    let d = describe(&mut client, "pool").await;
    assert_eq!(d.limit, 4);
    assert_eq!(d.permits_in_use, 3);
    assert_eq!(d.holder_count, 2);
    assert_eq!(d.waiters, 0);
    assert_eq!(d.fencing_token, anonymous.fencing_token);
    assert_eq!(d.holders.len(), 2);
    let (first, second) = (&d.holders[0], &d.holders[1]);
    assert_eq!(
        first.owner, "",
        "soonest expiry first, never a token: {d:?}"
    );
    assert_eq!(first.permits, 1);
    assert_eq!(first.limit, 5);
    assert_eq!(first.fencing_token, anonymous.fencing_token);
    let left = remaining(&first.remaining_ttl, "first holder");
    assert!(
        left > Duration::from_secs(9) && left <= Duration::from_secs(10),
        "{left:?}"
    );
    assert_eq!(second.owner, "alice");
    assert_eq!(second.permits, 2);
    assert_eq!(second.limit, 4);
    assert_eq!(second.fencing_token, alice.fencing_token);
    let left = remaining(&second.remaining_ttl, "second holder");
    assert!(
        left > Duration::from_secs(19) && left <= Duration::from_secs(20),
        "{left:?}"
    );

    let mut waiter_client = client.clone();
    let mut waiter = tokio::spawn(async move {
        acquire(
            &mut waiter_client,
            waiting("pool", 4, 3, 10_000, 5_000, false),
        )
        .await
    });
    wait_for_waiters_while(&client, "pool", 1, &mut waiter).await;
    assert!(release(&mut client, "pool", &alice.token).await);
    let got = within(Duration::from_secs(2), waiter, "the waiter to acquire")
        .await
        .expect("waiter task");
    assert!(got.acquired, "{got:?}");
    let d = describe(&mut client, "pool").await;
    assert_eq!(d.waiters, 0, "the waiter stopped waiting: {d:?}");
    assert_eq!(d.permits_in_use, 4);
    assert_eq!(d.holder_count, 2);
    assert_eq!(d.fencing_token, got.permit.expect("permit").fencing_token);
}

/// A wait that ends without permits answers acquired=false after about the wait, with the free
/// permits and the earliest holder expiry (not another waiter's), and leaves no waiter or queue
/// place behind: fair or not, a later fair try-once gets free permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_times_out_and_leaves_nothing_behind() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let holder = acquired(&mut client, request("pool", 3, 2, 10_000)).await;
    // Another caller waits longer, so the timed-out one is not alone in the waiter set.
    let mut other_client = client.clone();
    let mut other = tokio::spawn(async move {
        acquire(
            &mut other_client,
            waiting("pool", 3, 3, 10_000, 4_000, true),
        )
        .await
    });
    wait_for_waiters_while(&client, "pool", 1, &mut other).await;

    for fair in [false, true] {
        let started = Instant::now();
        let response = refused(&mut client, waiting("pool", 3, 2, 1_000, 200, fair)).await;
        let elapsed = started.elapsed();
        assert!(
            elapsed >= Duration::from_millis(195) && elapsed < Duration::from_millis(1_500),
            "fair={fair}: a 200 ms wait took {elapsed:?}"
        );
        assert_eq!(response.available, 1, "fair={fair}: {response:?}");
        let expiry = remaining(&response.earliest_expiry, "earliest_expiry");
        assert!(
            expiry > Duration::from_secs(8) && expiry <= Duration::from_secs(10),
            "fair={fair}: earliest_expiry is the holder's, got {expiry:?}"
        );
        assert_eq!(
            describe(&mut client, "pool").await.waiters,
            1,
            "fair={fair}"
        );
    }

    other.abort();
    wait_for_waiters(&client, "pool", 0).await;
    // No queue place is left: a fair request that does not wait gets the free permit.
    acquired(
        &mut client,
        pb::SemaphoreServiceAcquireRequest {
            fair: true,
            ..request("pool", 3, 1, 1_000)
        },
    )
    .await;
    assert!(release(&mut client, "pool", &holder.token).await);
}

/// A wait longer than the caller's gRPC deadline is cut short so that acquired=false arrives
/// before the deadline instead of DEADLINE_EXCEEDED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_is_cut_to_the_callers_deadline() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    acquired(&mut client, request("pool", 1, 1, 30_000)).await;
    for fair in [false, true] {
        let mut call = tonic::Request::new(waiting("pool", 1, 1, 1_000, 10_000, fair));
        call.set_timeout(Duration::from_millis(500));
        let started = Instant::now();
        let response = client
            .acquire(call)
            .await
            .expect("an answer before the deadline, not DEADLINE_EXCEEDED")
            .into_inner();
        let elapsed = started.elapsed();
        assert!(!response.acquired);
        assert!(
            elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(500),
            "fair={fair}: answered after {elapsed:?} for a 500 ms deadline"
        );
    }
    wait_for_waiters(&client, "pool", 0).await;
}

/// Scenario "refresh": refreshing every 200 ms keeps a 300 ms permit past its original ttl; others
/// are still refused at 400 ms and the holder's release reports it held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_refresh() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let started = Instant::now();
    let permit = acquired(&mut client, request("pool", 1, 1, 300)).await;
    for _ in 0..2 {
        // Time passing is the scenario.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let refreshed = refresh(&mut client, "pool", &permit.token, None)
            .await
            .expect("refresh");
        assert_eq!(
            remaining(&refreshed.remaining_ttl, "refresh"),
            Duration::from_millis(300)
        );
    }
    assert!(started.elapsed() >= Duration::from_millis(400));
    refused(&mut client, request("pool", 1, 1, 1_000)).await;
    assert!(
        release(&mut client, "pool", &permit.token).await,
        "still held past the original ttl"
    );
}

/// Scenario "release after expiry returns false": an expired lease's release answers false, whether
/// its permits were reclaimed already by another acquisition (whose permits stay held) or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_release_after_expiry_returns_false() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    // Expired, not yet reclaimed.
    let lapsed = acquired(&mut client, request("pool", 1, 1, 100)).await;
    wait_for_state(&client, "pool", "the lease to expire", |d| {
        d.permits_in_use == 0
    })
    .await;
    assert!(!release(&mut client, "pool", &lapsed.token).await);

    // Expired and reclaimed by the next holder, who keeps its permit.
    let lapsed = acquired(&mut client, request("pool", 1, 1, 100)).await;
    let next = acquired(&mut client, waiting("pool", 1, 1, 10_000, 5_000, false)).await;
    assert!(!release(&mut client, "pool", &lapsed.token).await);
    let d = describe(&mut client, "pool").await;
    assert_eq!(d.permits_in_use, 1, "{d:?}");
    assert_eq!(d.holders[0].fencing_token, next.fencing_token);
    assert!(release(&mut client, "pool", &next.token).await);
}

/// Every malformed field is INVALID_ARGUMENT whose message starts with the field's name and whose
/// BadRequest detail names it, on every RPC; nothing reaches Redis; values at the limits pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_name_the_field() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    let long_name = "n".repeat(1025);
    let long_owner = "o".repeat(257);
    let negative = prost_types::Duration {
        seconds: -1,
        nanos: 0,
    };

    let base = || request("a", 5, 1, 1_000);
    let cases: Vec<(&str, pb::SemaphoreServiceAcquireRequest)> = vec![
        ("name", request("", 5, 1, 1_000)),
        ("name", request(&long_name, 5, 1, 1_000)),
        ("limit", request("a", 0, 1, 1_000)),
        ("limit", request("a", 10_001, 1, 1_000)),
        ("limit", request("a", u32::MAX, 1, 1_000)),
        ("permits", request("a", 5, 0, 1_000)),
        ("permits", request("a", 5, 6, 1_000)),
        ("permits", request("a", 1, 2, 1_000)),
        (
            "ttl",
            pb::SemaphoreServiceAcquireRequest {
                ttl: None,
                ..base()
            },
        ),
        ("ttl", request("a", 5, 1, 5)),
        ("ttl", request("a", 5, 1, 3600 * 1000 + 1)),
        (
            "ttl",
            pb::SemaphoreServiceAcquireRequest {
                ttl: Some(negative),
                ..base()
            },
        ),
        (
            "wait_timeout",
            waiting("a", 5, 1, 1_000, 3600 * 1000 + 1, false),
        ),
        (
            "wait_timeout",
            waiting("a", 5, 1, 1_000, 2 * 3600 * 1000, true),
        ),
        (
            "wait_timeout",
            pb::SemaphoreServiceAcquireRequest {
                wait_timeout: Some(negative),
                ..base()
            },
        ),
        (
            "owner",
            pb::SemaphoreServiceAcquireRequest {
                owner: long_owner.clone(),
                ..base()
            },
        ),
    ];
    for (field, request) in cases {
        assert_invalid(client.acquire(request).await, field);
    }

    let hold_cases: Vec<(&str, pb::SemaphoreServiceHoldRequest)> = vec![
        ("name", hold_request("", 5, 1, 1_000)),
        ("limit", hold_request("a", 0, 1, 1_000)),
        ("limit", hold_request("a", 10_001, 1, 1_000)),
        ("permits", hold_request("a", 5, 0, 1_000)),
        ("permits", hold_request("a", 5, 6, 1_000)),
        ("ttl", hold_request("a", 5, 1, 50)),
        (
            "ttl",
            pb::SemaphoreServiceHoldRequest {
                ttl: None,
                ..hold_request("a", 5, 1, 1_000)
            },
        ),
        (
            "wait_timeout",
            pb::SemaphoreServiceHoldRequest {
                wait_timeout: Some(ms(3600 * 1000 + 1)),
                ..hold_request("a", 5, 1, 1_000)
            },
        ),
        (
            "owner",
            pb::SemaphoreServiceHoldRequest {
                owner: long_owner.clone(),
                ..hold_request("a", 5, 1, 1_000)
            },
        ),
    ];
    for (field, request) in hold_cases {
        assert_invalid(client.hold(request).await, field);
    }

    for malformed in [
        "not-a-token",
        "",
        &random_token().to_uppercase(),
        &random_token().replace('-', ""),
    ] {
        assert_invalid(
            client
                .release(pb::SemaphoreServiceReleaseRequest {
                    name: "a".into(),
                    token: malformed.to_owned(),
                })
                .await,
            "token",
        );
        assert_invalid(refresh(&mut client, "a", malformed, None).await, "token");
        assert_invalid(keep_alive(&mut client, "a", malformed, None).await, "token");
    }
    assert_invalid(
        client
            .release(pb::SemaphoreServiceReleaseRequest {
                name: String::new(),
                token: random_token(),
            })
            .await,
        "name",
    );
    assert_invalid(
        refresh(&mut client, &long_name, &random_token(), None).await,
        "name",
    );
    assert_invalid(
        refresh(&mut client, "a", &random_token(), Some(5)).await,
        "ttl",
    );
    assert_invalid(
        refresh(&mut client, "a", &random_token(), Some(3600 * 1000 + 1)).await,
        "ttl",
    );
    assert_invalid(
        keep_alive(&mut client, "", &random_token(), None).await,
        "name",
    );
    assert_invalid(
        keep_alive(&mut client, "a", &random_token(), Some(50)).await,
        "ttl",
    );
    for name in [String::new(), long_name.clone()] {
        assert_invalid(
            client
                .describe(pb::SemaphoreServiceDescribeRequest { name })
                .await,
            "name",
        );
    }

    let mut conn = redis.conn().await;
    assert_eq!(
        keys_under(&mut conn, baton.prefix()).await,
        Vec::<String>::new(),
        "no invalid request wrote anything"
    );

    // The limits themselves are valid.
    let big = acquired(
        &mut client,
        pb::SemaphoreServiceAcquireRequest {
            owner: "o".repeat(256),
            ..request(&"n".repeat(1024), 10_000, 10_000, 10)
        },
    )
    .await;
    assert_eq!(big.permits, 10_000);
    acquired(&mut client, waiting("max", 1, 1, 3600 * 1000, 0, false)).await;
    let mut stream = hold(&mut client, hold_request("hold-min", 1, 1, 100)).await;
    hold_acquired(&mut stream).await;
}

/// Names that differ only by braces or key-like suffixes are separate semaphores: filling one
/// leaves the others empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn look_alike_names_are_separate_semaphores() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let names = [
        "a",
        "a}",
        "{a}",
        "a}:holders",
        "a:holders",
        "a}:fence",
        "}",
        "ünï",
    ];
    for name in names {
        acquired(&mut client, request(name, 1, 1, 10_000)).await;
        refused(&mut client, request(name, 1, 1, 10_000)).await;
    }
    for name in names {
        let d = describe(&mut client, name).await;
        assert_eq!(
            (d.permits_in_use, d.holder_count),
            (1, 1),
            "{name:?}: {d:?}"
        );
    }
}

/// After a mix of calls (grants, releases, refreshes, fair and non-fair waits that time out, a
/// Hold, a KeepAlive, reads of unused names) every key under the prefix has a ttl, within the
/// documented lifetime: the last lease or wait plus 60 s, and the fence ttl + 1 h.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_written_expires() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    let mut conn = redis.conn().await;

    let kept = acquired(&mut client, request("pool", 2, 1, 10_000)).await;
    let gone = acquired(&mut client, request("pool", 2, 1, 5_000)).await;
    refresh(&mut client, "pool", &kept.token, Some(20_000))
        .await
        .expect("refresh");
    assert!(release(&mut client, "pool", &gone.token).await);
    acquired(&mut client, request("pool", 2, 1, 10_000)).await;
    refused(&mut client, waiting("pool", 2, 1, 1_000, 100, true)).await;
    refused(&mut client, waiting("pool", 2, 1, 1_000, 100, false)).await;
    let mut held = hold(&mut client, hold_request("streamed", 3, 1, 3_000)).await;
    hold_acquired(&mut held).await;
    let to_keep = acquired(&mut client, request("kept-alive", 1, 1, 2_000)).await;
    let _alive = keep_alive(&mut client, "kept-alive", &to_keep.token, None)
        .await
        .expect("KeepAlive");
    let expired = acquired(&mut client, request("expired", 1, 1, 20)).await;
    wait_for_state(&client, "expired", "the 20 ms lease to expire", |d| {
        d.permits_in_use == 0
    })
    .await;
    assert!(!release(&mut client, "expired", &expired.token).await);
    describe(&mut client, "never-used").await;
    assert!(!release(&mut client, "never-released", &random_token()).await);
    assert_code(
        refresh(&mut client, "never-refreshed", &random_token(), None).await,
        Code::FailedPrecondition,
        "refresh on an unused name",
    );

    let keys = keys_under(&mut conn, baton.prefix()).await;
    assert!(
        keys.iter().all(|k| !k.contains("never-")),
        "reads and no-op writes created keys: {keys:?}"
    );
    let pool = baton.semaphore_key("pool");
    for wanted in [
        pool.clone(),
        format!("{pool}:holders"),
        format!("{pool}:limits"),
        format!("{pool}:fence"),
    ] {
        assert!(keys.contains(&wanted), "{wanted} missing from {keys:?}");
    }
    for key in &keys {
        let ttl = pttl(&mut conn, key).await;
        assert!(ttl > 0, "{key} has PTTL {ttl}");
        let most = if key.ends_with(":fence") {
            20_000 + 3_600_000
        } else {
            20_000 + 60_000
        };
        assert!(
            ttl <= most,
            "{key} lives {ttl} ms, more than documented ({most} ms)"
        );
    }
    // The pool's keys live until its longest lease (20 s) ends, plus 60 s.
    let ttl = pttl(&mut conn, &format!("{pool}:holders")).await;
    assert!(
        ttl > 75_000,
        "the holders outlive the longest lease by 60 s: PTTL {ttl}"
    );
}
