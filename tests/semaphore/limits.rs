//! Limits (docs/guarantees.md, "Semaphores" 1, 3 and 4): never over the limit, under load and
//! across Batons; the strictest limit wins; weighted requests.

use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use baton::proto::v1 as pb;
use tokio::{task::JoinSet, time::Instant};
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::support::{
    Baton, RedisServer,
    lease::wait_for_waiters_while,
    semaphore::{Client, acquire, acquired, describe, refused, release, request, waiting},
    within,
};

/// A small xorshift generator: the tests need varied weights and delays, not cryptography. The
/// seed is printed so a failing run can be reproduced.
struct Rng(u64);

impl Rng {
    fn seeded(what: &str) -> Self {
        let seed = (uuid::Uuid::new_v4().as_u128() as u64) | 1;
        eprintln!("{what}: rng seed {seed}");
        Self(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// The largest total weight of `intervals` (start, end, weight) in force at any one instant.
/// Ends sort before starts at the same instant, since they are half-open.
fn peak_overlap(intervals: &[(Instant, Instant, u32)]) -> u32 {
    let mut events: Vec<(Instant, i64)> = Vec::with_capacity(intervals.len() * 2);
    for &(start, end, weight) in intervals {
        assert!(start <= end, "an interval ends before it starts");
        events.push((start, i64::from(weight)));
        events.push((end, -i64::from(weight)));
    }
    events.sort();
    let (mut now, mut peak) = (0i64, 0i64);
    for (_, delta) in events {
        now += delta;
        peak = peak.max(now);
    }
    u32::try_from(peak).expect("a non-negative peak")
}

/// What a load run observed.
#[derive(Debug, Default)]
struct Load {
    /// (start, end, weight) of every critical section, by this process's monotonic clock.
    intervals: Vec<(Instant, Instant, u32)>,
    /// The largest value the shared Redis counter reached.
    counter_peak: i64,
    /// Fencing tokens of every grant.
    fences: Vec<u64>,
    /// Calls answered UNAVAILABLE (Baton's Redis pool saturated on an overloaded machine) and
    /// retried, as the contract allows.
    retries: usize,
}

/// Runs `call` until it answers something other than UNAVAILABLE, which the contract says is
/// safe to retry after its hint; counts the retries in `load`.
async fn retrying<T, Fut>(load: &Mutex<Load>, mut call: impl FnMut() -> Fut) -> T
where
    Fut: Future<Output = Result<T, Status>>,
{
    loop {
        match call().await {
            Ok(value) => return value,
            Err(s) if s.code() == Code::Unavailable => {
                load.lock().expect("no poisoned mutex").retries += 1;
                let hint = s
                    .get_error_details()
                    .retry_info()
                    .and_then(|r| r.retry_delay)
                    .unwrap_or(Duration::from_millis(200));
                tokio::time::sleep(hint).await;
            }
            Err(s) => panic!("a call failed: {s:?}"),
        }
    }
}

/// Runs `rounds` acquisitions on each client (random weights 1..=`max_weight`, random hold
/// delays up to `max_hold_ms`, every other client fair) against `limit`. Inside each critical
/// section the client INCRBYs a Redis counter by its weight and DECRBYs it before leaving;
/// every INCRBY result is checked against the limit at once.
#[allow(clippy::too_many_arguments)]
async fn run_load(
    what: &str,
    clients: Vec<Client>,
    redis: &RedisServer,
    name: &str,
    counter: &str,
    limit: u32,
    max_weight: u32,
    rounds: usize,
    max_hold_ms: u64,
) -> Load {
    let load = Arc::new(Mutex::new(Load::default()));
    let mut rng = Rng::seeded(what);
    let mut tasks = JoinSet::new();
    for (i, client) in clients.into_iter().enumerate() {
        let mut conn = redis.conn().await;
        let load = load.clone();
        let (name, counter) = (name.to_owned(), counter.to_owned());
        let plan: Vec<(u32, u64)> = (0..rounds)
            .map(|_| {
                let weight = u32::try_from(rng.range(1, u64::from(max_weight))).expect("small");
                (weight, rng.range(0, max_hold_ms))
            })
            .collect();
        let fair = i % 2 == 0;
        tasks.spawn(async move {
            for (weight, hold_ms) in plan {
                let response = retrying(&load, || {
                    let mut client = client.clone();
                    let request = waiting(&name, limit, weight, 10_000, 30_000, fair);
                    async move { client.acquire(request).await }
                })
                .await
                .into_inner();
                assert!(response.acquired, "not granted within 30 s: {response:?}");
                let permit = response.permit.expect("a granted permit");
                let start = Instant::now();
                let value: i64 = redis::cmd("INCRBY")
                    .arg(&counter)
                    .arg(weight)
                    .query_async(&mut conn)
                    .await
                    .expect("INCRBY");
                assert!(
                    value <= i64::from(limit),
                    "{value} permits in use inside a critical section, over the limit {limit}"
                );
                // Holding the permits for a while IS the scenario.
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                let _: i64 = redis::cmd("DECRBY")
                    .arg(&counter)
                    .arg(weight)
                    .query_async(&mut conn)
                    .await
                    .expect("DECRBY");
                let end = Instant::now();
                {
                    let mut load = load.lock().expect("no panic while holding the mutex");
                    load.intervals.push((start, end, weight));
                    load.counter_peak = load.counter_peak.max(value);
                    load.fences.push(permit.fencing_token);
                }
                // An attempt answered UNAVAILABLE (no answer within the command timeout, on a
                // loaded machine) may have released the permit all the same: the retry then
                // finds it gone.
                let mut attempts = 0;
                let released = retrying(&load, || {
                    attempts += 1;
                    let mut client = client.clone();
                    let request = pb::SemaphoreServiceReleaseRequest {
                        name: name.clone(),
                        token: permit.token.clone(),
                    };
                    async move { client.release(request).await }
                })
                .await;
                assert!(
                    released.into_inner().was_held || attempts > 1,
                    "the permit was still held at release"
                );
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
        "every client to finish",
    )
    .await;
    Arc::try_unwrap(load)
        .map_err(|_| ())
        .expect("every task has ended")
        .into_inner()
        .expect("no poisoned mutex")
}

/// Asserts a load run stayed within `limit` by every measure and actually ran concurrently.
fn check_load(load: &Load, limit: u32, grants: usize) {
    assert_eq!(load.intervals.len(), grants);
    assert!(
        load.counter_peak <= i64::from(limit),
        "counter peak {}",
        load.counter_peak
    );
    let peak = peak_overlap(&load.intervals);
    assert!(
        peak <= limit,
        "the recorded hold intervals overlap up to {peak} permits, over {limit}"
    );
    assert!(
        peak >= limit.min(3),
        "the run should have held several permits at once, peak {peak}"
    );
    let mut fences = load.fences.clone();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), grants, "fencing tokens must never repeat");
}

/// The headline test: 32 concurrent clients (half fair) with random weights 1..=3 and random hold
/// times acquire a limit-5 semaphore 10 times each. A Redis counter INCRBY'd by the weight inside
/// each critical section never exceeds 5, and the recorded hold intervals never overlap beyond 5
/// permits at any instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_safety_under_load() {
    const CLIENTS: usize = 32;
    const ROUNDS: usize = 10;
    const LIMIT: u32 = 5;
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let counter = format!("{}in-use", baton.prefix());
    let mut clients: Vec<Client> = Vec::with_capacity(CLIENTS);
    for i in 0..CLIENTS {
        // Half the clients share a connection, half have their own.
        clients.push(if i % 2 == 0 && i > 0 {
            clients[0].clone()
        } else {
            baton.semaphore_client().await
        });
    }

    let started = Instant::now();
    let load = run_load(
        "limit_safety_under_load",
        clients,
        &redis,
        "pool",
        &counter,
        LIMIT,
        3,
        ROUNDS,
        20,
    )
    .await;
    let elapsed = started.elapsed();
    check_load(&load, LIMIT, CLIENTS * ROUNDS);
    eprintln!(
        "{} grants by {CLIENTS} clients in {elapsed:?}; peak overlap {}, counter peak {}, {} \
         UNAVAILABLE retries",
        CLIENTS * ROUNDS,
        peak_overlap(&load.intervals),
        load.counter_peak,
        load.retries
    );

    let mut client = baton.semaphore_client().await;
    let d = describe(&mut client, "pool").await;
    // A call that timed out may still have run in Redis (a grant nobody received, held until its
    // ttl), so the end state is exact only for a run without retries.
    if load.retries == 0 {
        assert_eq!(
            (d.permits_in_use, d.holder_count, d.waiters),
            (0, 0, 0),
            "{d:?}"
        );
    }
    let mut conn = redis.conn().await;
    let left: i64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(left, 0);
}

/// 16 clients spread over two Batons sharing one Redis, random weights 1..=2 against a limit of
/// 3: the Redis counter and the recorded intervals never exceed the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_batons_under_load_never_exceed_the_limit() {
    const CLIENTS: usize = 16;
    const ROUNDS: usize = 5;
    const LIMIT: u32 = 3;
    let redis = RedisServer::start().await;
    let first = Baton::start(&redis).await;
    let prefix = first.prefix().to_owned();
    let second = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix).await;
    let mut clients: Vec<Client> = Vec::with_capacity(CLIENTS);
    for i in 0..CLIENTS {
        clients.push(if i % 2 == 0 {
            first.semaphore_client().await
        } else {
            second.semaphore_client().await
        });
    }
    let counter = format!("{}in-use", first.prefix());
    let load = run_load(
        "two_batons_under_load",
        clients,
        &redis,
        "pool",
        &counter,
        LIMIT,
        2,
        ROUNDS,
        15,
    )
    .await;
    check_load(&load, LIMIT, CLIENTS * ROUNDS);
}

/// Two Batons (two in-process servers, as on two hosts) sharing one Redis and key prefix act as
/// one semaphore: interleaved acquisitions stop at the limit whichever Baton serves them, a
/// release through one frees the permit for the other, and a waiter on one is woken by a
/// release on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_batons_share_one_limit() {
    let redis = RedisServer::start().await;
    let first = Baton::start(&redis).await;
    let prefix = first.prefix().to_owned();
    let second = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix).await;
    let mut a = first.semaphore_client().await;
    let mut b = second.semaphore_client().await;

    let p1 = acquired(&mut a, request("pool", 3, 1, 10_000)).await;
    let p2 = acquired(&mut b, request("pool", 3, 1, 10_000)).await;
    let p3 = acquired(&mut a, request("pool", 3, 1, 10_000)).await;
    refused(&mut b, request("pool", 3, 1, 10_000)).await;
    refused(&mut a, request("pool", 3, 1, 10_000)).await;
    assert!(p1.fencing_token < p2.fencing_token && p2.fencing_token < p3.fencing_token);
    assert!(
        release(&mut b, "pool", &p1.token).await,
        "released through the other Baton"
    );
    acquired(&mut b, request("pool", 3, 1, 10_000)).await;
    assert_eq!(describe(&mut a, "pool").await.permits_in_use, 3);

    let mut waiter_client = b.clone();
    let mut waiter = tokio::spawn(async move {
        let response = acquire(
            &mut waiter_client,
            waiting("pool", 3, 1, 10_000, 5_000, true),
        )
        .await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&a, "pool", 1, &mut waiter).await;
    assert!(release(&mut a, "pool", &p3.token).await);
    let released_at = Instant::now();
    let (response, woke_at) = within(
        Duration::from_secs(2),
        waiter,
        "the waiter on the other Baton",
    )
    .await
    .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let latency = woke_at.saturating_duration_since(released_at);
    assert!(
        latency < Duration::from_millis(100),
        "woken {latency:?} after the release"
    );
}

/// Strictest limit wins: beside a holder that asked for limit 2, a limit-5 request is refused
/// once in-use + permits would exceed 2; when that holder leaves, limit 5 applies; and a new
/// request with a lower limit than the holders' is refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strictest_limit_wins() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let strict = acquired(&mut client, request("pool", 2, 1, 10_000)).await;
    assert_eq!(strict.limit, 2);
    let b = acquired(&mut client, request("pool", 5, 1, 10_000)).await;
    assert_eq!(b.limit, 2, "the grant reports the limit in force");
    let over = refused(&mut client, request("pool", 5, 1, 10_000)).await;
    assert_eq!(over.available, 0, "{over:?}");
    refused(&mut client, request("pool", 5, 3, 10_000)).await;
    let d = describe(&mut client, "pool").await;
    assert_eq!((d.limit, d.permits_in_use), (2, 2), "{d:?}");

    // A limit-5 caller waiting for 3 permits gets them only once the limit-2 holder is gone.
    let mut waiter_client = client.clone();
    let mut waiter = tokio::spawn(async move {
        acquire(
            &mut waiter_client,
            waiting("pool", 5, 3, 10_000, 5_000, false),
        )
        .await
    });
    wait_for_waiters_while(&client, "pool", 1, &mut waiter).await;
    assert!(release(&mut client, "pool", &strict.token).await);
    let got = within(Duration::from_secs(2), waiter, "the limit-5 waiter")
        .await
        .expect("waiter task");
    let big = got.permit.expect("granted once the limit-2 holder left");
    assert_eq!(big.limit, 5);
    let d = describe(&mut client, "pool").await;
    assert_eq!((d.limit, d.permits_in_use), (5, 4), "{d:?}");
    let last = acquired(&mut client, request("pool", 5, 1, 10_000)).await;
    assert_eq!(last.limit, 5);
    let full = refused(&mut client, request("pool", 5, 1, 10_000)).await;
    assert_eq!(full.available, 0);

    // Lowering takes effect at once: with 5 in use, a limit-3 caller fits nowhere...
    assert!(release(&mut client, "pool", &big.token).await);
    let low = refused(&mut client, request("pool", 3, 2, 10_000)).await;
    assert_eq!(low.available, 1, "3 - 2 in use: {low:?}");
    // ...and once it holds, its limit binds the limit-5 callers too.
    let lowest = acquired(&mut client, request("pool", 3, 1, 10_000)).await;
    assert_eq!(lowest.limit, 3);
    let blocked = refused(&mut client, request("pool", 5, 1, 10_000)).await;
    assert_eq!(blocked.available, 0, "{blocked:?}");
    assert_eq!(describe(&mut client, "pool").await.limit, 3);
}

/// Scenario "basic counting semaphore": with limit 3, three acquisitions succeed and the fourth is
/// refused (0 available); after one release the fourth succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_basic_limit() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let mut permits = Vec::new();
    for _ in 0..3 {
        permits.push(acquired(&mut client, request("pool", 3, 1, 10_000)).await);
    }
    let fourth = refused(&mut client, request("pool", 3, 1, 10_000)).await;
    assert_eq!(fourth.available, 0);
    assert!(fourth.earliest_expiry.is_some());
    assert_eq!(describe(&mut client, "pool").await.permits_in_use, 3);
    assert!(release(&mut client, "pool", &permits[0].token).await);
    acquired(&mut client, request("pool", 3, 1, 10_000)).await;
    refused(&mut client, request("pool", 3, 1, 10_000)).await;
}
