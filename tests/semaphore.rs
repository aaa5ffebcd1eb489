//! Black-box tests of `baton.v1.SemaphoreService` against a real `redis-server`, over gRPC to an
//! in-process Baton bound to port 0.
//!
//! The headline test is [`limit_safety_under_load`]: 32 clients with random weights and random
//! hold times against a limit of 5, checked both by a Redis counter kept inside the critical
//! section and by the recorded hold intervals.

mod support;

use std::{
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use baton::proto::v1::{
    self as pb, LeaseLostReason, semaphore_service_client::SemaphoreServiceClient,
    semaphore_service_hold_response::Event as HoldEvent,
    semaphore_service_keep_alive_response::Event as KeepAliveEvent,
};
use prost::Message;
use support::{
    Baton, Proxy, RedisConn, RedisServer, assert_code, assert_invalid, ms, random_token, remaining,
    unavailable_within_1s, wait_until, within,
};
use tokio::{task::JoinSet, time::Instant};
use tonic::{Code, Status, Streaming, transport::Channel};
use tonic_types::StatusExt;

type Client = SemaphoreServiceClient<Channel>;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// An Acquire request that tries once, with no owner, not fair.
fn request(
    name: &str,
    limit: u32,
    permits: u32,
    ttl_ms: u64,
) -> pb::SemaphoreServiceAcquireRequest {
    pb::SemaphoreServiceAcquireRequest {
        name: name.to_owned(),
        limit,
        permits,
        ttl: Some(ms(ttl_ms)),
        wait_timeout: None,
        owner: String::new(),
        fair: false,
        ..Default::default()
    }
}

/// `request` waiting up to `wait_ms`, fair or not.
fn waiting(
    name: &str,
    limit: u32,
    permits: u32,
    ttl_ms: u64,
    wait_ms: u64,
    fair: bool,
) -> pb::SemaphoreServiceAcquireRequest {
    pb::SemaphoreServiceAcquireRequest {
        wait_timeout: Some(ms(wait_ms)),
        fair,
        ..request(name, limit, permits, ttl_ms)
    }
}

/// A Hold request that tries once, with no owner, not fair.
fn hold_request(
    name: &str,
    limit: u32,
    permits: u32,
    ttl_ms: u64,
) -> pb::SemaphoreServiceHoldRequest {
    pb::SemaphoreServiceHoldRequest {
        name: name.to_owned(),
        limit,
        permits,
        ttl: Some(ms(ttl_ms)),
        wait_timeout: None,
        owner: String::new(),
        fair: false,
    }
}

async fn acquire(
    client: &mut Client,
    request: pb::SemaphoreServiceAcquireRequest,
) -> pb::SemaphoreServiceAcquireResponse {
    let name = request.name.clone();
    client
        .acquire(request)
        .await
        .unwrap_or_else(|s| panic!("Acquire {name:?} failed: {s:?}"))
        .into_inner()
}

/// Acquires and asserts the permits were granted, returning the permit.
async fn acquired(
    client: &mut Client,
    request: pb::SemaphoreServiceAcquireRequest,
) -> pb::SemaphorePermit {
    let name = request.name.clone();
    let response = acquire(client, request).await;
    assert!(
        response.acquired,
        "expected to acquire {name:?}: {response:?}"
    );
    response
        .permit
        .expect("an acquired response carries the permit")
}

/// Acquires and asserts the permits were refused, returning the response.
async fn refused(
    client: &mut Client,
    request: pb::SemaphoreServiceAcquireRequest,
) -> pb::SemaphoreServiceAcquireResponse {
    let name = request.name.clone();
    let response = acquire(client, request).await;
    assert!(
        !response.acquired,
        "expected {name:?} to be refused: {response:?}"
    );
    assert!(response.permit.is_none(), "{response:?}");
    response
}

async fn release(client: &mut Client, name: &str, token: &str) -> bool {
    client
        .release(pb::SemaphoreServiceReleaseRequest {
            name: name.to_owned(),
            token: token.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Release {name:?} failed: {s:?}"))
        .into_inner()
        .was_held
}

async fn refresh(
    client: &mut Client,
    name: &str,
    token: &str,
    ttl_ms: Option<u64>,
) -> Result<pb::SemaphoreServiceRefreshResponse, Status> {
    client
        .refresh(pb::SemaphoreServiceRefreshRequest {
            name: name.to_owned(),
            token: token.to_owned(),
            ttl: ttl_ms.map(ms),
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn describe(client: &mut Client, name: &str) -> pb::SemaphoreServiceDescribeResponse {
    client
        .describe(pb::SemaphoreServiceDescribeRequest {
            name: name.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Describe {name:?} failed: {s:?}"))
        .into_inner()
}

async fn hold(
    client: &mut Client,
    request: pb::SemaphoreServiceHoldRequest,
) -> Streaming<pb::SemaphoreServiceHoldResponse> {
    let name = request.name.clone();
    client
        .hold(request)
        .await
        .unwrap_or_else(|s| panic!("Hold {name:?} failed: {s:?}"))
        .into_inner()
}

async fn keep_alive(
    client: &mut Client,
    name: &str,
    token: &str,
    ttl_ms: Option<u64>,
) -> Result<Streaming<pb::SemaphoreServiceKeepAliveResponse>, Status> {
    client
        .keep_alive(pb::SemaphoreServiceKeepAliveRequest {
            name: name.to_owned(),
            token: token.to_owned(),
            ttl: ttl_ms.map(ms),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// The next event of a Hold stream within `limit`; panics if the stream fails or ends.
async fn next_hold_event(
    stream: &mut Streaming<pb::SemaphoreServiceHoldResponse>,
    limit: Duration,
    what: &str,
) -> HoldEvent {
    within(limit, stream.message(), what)
        .await
        .unwrap_or_else(|s| panic!("{what}: the Hold stream failed: {s:?}"))
        .unwrap_or_else(|| panic!("{what}: the Hold stream ended"))
        .event
        .unwrap_or_else(|| panic!("{what}: an event without payload"))
}

/// The `acquired` event that opens a Hold stream.
async fn hold_acquired(
    stream: &mut Streaming<pb::SemaphoreServiceHoldResponse>,
) -> pb::SemaphorePermit {
    match next_hold_event(stream, Duration::from_secs(2), "acquired").await {
        HoldEvent::Acquired(permit) => permit,
        other => panic!("expected acquired, got {other:?}"),
    }
}

/// The next event of a KeepAlive stream within `limit`; panics if the stream fails or ends.
async fn next_keep_alive_event(
    stream: &mut Streaming<pb::SemaphoreServiceKeepAliveResponse>,
    limit: Duration,
    what: &str,
) -> KeepAliveEvent {
    within(limit, stream.message(), what)
        .await
        .unwrap_or_else(|s| panic!("{what}: the KeepAlive stream failed: {s:?}"))
        .unwrap_or_else(|| panic!("{what}: the KeepAlive stream ended"))
        .event
        .unwrap_or_else(|| panic!("{what}: an event without payload"))
}

/// Waits (bounded) until the stream ends cleanly.
async fn expect_end<T: std::fmt::Debug>(stream: &mut Streaming<T>, what: &str) {
    match within(Duration::from_secs(2), stream.message(), what).await {
        Ok(None) => {}
        other => panic!("{what}: expected the stream to end, got {other:?}"),
    }
}

/// Waits (bounded) until Describe satisfies `check`, returning that Describe.
async fn wait_for_state(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&pb::SemaphoreServiceDescribeResponse) -> bool,
) -> pb::SemaphoreServiceDescribeResponse {
    let check = &check;
    wait_until(Duration::from_secs(5), what, || {
        let mut client = client.clone();
        async move {
            let d = describe(&mut client, name).await;
            if check(&d) { Ok(d) } else { Err(d) }
        }
    })
    .await
}

/// Waits (bounded) until Describe reports `n` waiters on `name`.
async fn wait_for_waiters(client: &Client, name: &str, n: u32) {
    let what = format!("{n} waiter(s) on {name:?}");
    wait_for_state(client, name, &what, |d| d.waiters == n).await;
}

/// Like [`wait_for_waiters`], but fails at once with the waiter's outcome if `waiter` ends first.
async fn wait_for_waiters_while<T: std::fmt::Debug>(
    client: &Client,
    name: &str,
    n: u32,
    waiter: &mut tokio::task::JoinHandle<T>,
) {
    tokio::select! {
        () = wait_for_waiters(client, name, n) => {}
        outcome = waiter => panic!("the waiter ended before {n} waited on {name:?}: {outcome:?}"),
    }
}

/// The Redis key of semaphore `name`'s data hash; the other keys add a suffix to it.
fn sem_key(baton: &Baton, name: &str) -> String {
    format!("{}{{sem:{name}}}", baton.prefix())
}

/// Redis's clock: (milliseconds, microseconds) since the epoch.
async fn redis_time(conn: &mut RedisConn) -> (u64, u64) {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    let us = secs * 1_000_000 + micros;
    (us / 1000, us)
}

async fn zscore(conn: &mut RedisConn, key: &str, member: &str) -> Option<f64> {
    redis::cmd("ZSCORE")
        .arg(key)
        .arg(member)
        .query_async(conn)
        .await
        .expect("ZSCORE")
}

async fn zcard(conn: &mut RedisConn, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .expect("ZCARD")
}

async fn pttl(conn: &mut RedisConn, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

/// Every key under `prefix`, sorted (on every master of a Cluster).
async fn keys_under(conn: &mut RedisConn, prefix: &str) -> Vec<String> {
    conn.keys(&format!("{prefix}*")).await
}

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

// ---------------------------------------------------------------------------------------------
// Success paths of each RPC
// ---------------------------------------------------------------------------------------------

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
    let holders = format!("{}:holders", sem_key(&baton, "pool"));

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

    let end = Instant::now() + Duration::from_secs(1);
    let mut renewals = 0;
    while let Ok(message) = tokio::time::timeout_at(end, stream.message()).await {
        match message {
            Ok(Some(pb::SemaphoreServiceHoldResponse {
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
    match next_hold_event(&mut stream, Duration::from_secs(1), "not_acquired").await {
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
    match next_hold_event(&mut stream, Duration::from_secs(2), "not_acquired").await {
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
    match next_keep_alive_event(&mut stream, Duration::from_millis(200), "first renewal").await {
        KeepAliveEvent::Renewed(r) => {
            assert_eq!(
                remaining(&r.remaining_ttl, "renewed"),
                Duration::from_millis(300)
            );
        }
        other => panic!("expected renewed first, got {other:?}"),
    }
    let end = Instant::now() + Duration::from_secs(1);
    let mut renewals = 0;
    while let Ok(message) = tokio::time::timeout_at(end, stream.message()).await {
        match message {
            Ok(Some(pb::SemaphoreServiceKeepAliveResponse {
                event: Some(KeepAliveEvent::Renewed(_)),
            })) => renewals += 1,
            other => panic!("expected only renewals, got {other:?}"),
        }
    }
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
        next_keep_alive_event(&mut stream, Duration::from_millis(200), "first renewal").await,
        KeepAliveEvent::Renewed(_)
    ));
    assert!(release(&mut client, "pool", &permit.token).await);
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
    match next_keep_alive_event(&mut stream, Duration::from_millis(200), "first renewal").await {
        KeepAliveEvent::Renewed(r) => {
            assert_eq!(
                remaining(&r.remaining_ttl, "renewed"),
                Duration::from_millis(100)
            );
        }
        other => panic!("expected renewed, got {other:?}"),
    }
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

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Limit safety and limit semantics
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Clocks
// ---------------------------------------------------------------------------------------------

/// No request of the SemaphoreService (nor any message a request embeds) carries a point in time:
/// clients pass only durations, so their clocks cannot influence any outcome. The only points in
/// time are the `expires_at` Baton reports in its answers, read off its own node's clock for the
/// client's use.
#[test]
fn the_api_carries_no_client_time() {
    let set = prost_types::FileDescriptorSet::decode(baton::proto::FILE_DESCRIPTOR_SET)
        .expect("FILE_DESCRIPTOR_SET decodes");
    let file = set
        .file
        .iter()
        .find(|f| f.name() == "baton/v1/semaphore.proto")
        .expect("semaphore.proto is compiled in");
    let service = &file.service[0];
    assert_eq!(service.name(), "SemaphoreService");
    let mut reported = Vec::new();
    for message in &file.message_type {
        for field in &message.field {
            let name = field.name();
            let timelike = field.type_name() == ".google.protobuf.Timestamp"
                || ["time", "timestamp", "now", "clock", "at", "deadline"].contains(&name)
                || name.ends_with("_at")
                || name.ends_with("_time");
            if !timelike {
                continue;
            }
            assert!(
                !message.name().ends_with("Request"),
                "{}.{name} is a point in time in a request",
                message.name()
            );
            assert_eq!(
                (name, field.type_name()),
                ("expires_at", ".google.protobuf.Timestamp"),
                "{}.{name}: the only point in time is the expiry Baton reports",
                message.name()
            );
            reported.push(message.name().to_owned());
        }
    }
    assert_eq!(reported, ["SemaphorePermit"], "{reported:?}");
}

/// Expiry and fencing follow Redis TIME: a lease's expiry score lies between Redis's clock read
/// before and after the grant plus its ttl (also after a refresh), and the first fencing token
/// lies between those two clock readings in microseconds; Describe's remaining ttl is the score
/// minus Redis's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_follows_redis_time() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    let mut conn = redis.conn().await;
    let holders = format!("{}:holders", sem_key(&baton, "pool"));

    let (before_ms, before_us) = redis_time(&mut conn).await;
    let permit = acquired(&mut client, request("pool", 2, 1, 10_000)).await;
    let (after_ms, after_us) = redis_time(&mut conn).await;
    let score = zscore(&mut conn, &holders, &permit.token)
        .await
        .expect("the holder's expiry");
    assert!(
        (before_ms + 10_000) as f64 <= score && score <= (after_ms + 10_000) as f64,
        "expiry {score} outside Redis time [{before_ms}, {after_ms}] + 10 s"
    );
    assert!(
        (before_us..=after_us).contains(&permit.fencing_token),
        "the first fencing token {} is Redis TIME in µs, within [{before_us}, {after_us}]",
        permit.fencing_token
    );

    let (before_ms, _) = redis_time(&mut conn).await;
    refresh(&mut client, "pool", &permit.token, Some(30_000))
        .await
        .expect("refresh");
    let (after_ms, _) = redis_time(&mut conn).await;
    let score = zscore(&mut conn, &holders, &permit.token)
        .await
        .expect("the holder's expiry");
    assert!(
        (before_ms + 30_000) as f64 <= score && score <= (after_ms + 30_000) as f64,
        "refreshed expiry {score} outside Redis time [{before_ms}, {after_ms}] + 30 s"
    );

    let (before_ms, _) = redis_time(&mut conn).await;
    let d = describe(&mut client, "pool").await;
    let (after_ms, _) = redis_time(&mut conn).await;
    let left = remaining(&d.holders[0].remaining_ttl, "describe").as_millis() as f64;
    assert!(
        score - after_ms as f64 <= left && left <= score - before_ms as f64,
        "Describe's {left} ms is not the score minus Redis time [{before_ms}, {after_ms}]"
    );
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

// ---------------------------------------------------------------------------------------------
// Holders that go away
// ---------------------------------------------------------------------------------------------

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

/// A unary holder that never renews (ttl 300 ms) loses its permits at its ttl, and the waiter
/// behind it (non-fair, then fair) gets them then: not before the expiry, and within a second of
/// it, with no release published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_stops_renewing_loses_its_permits_at_ttl() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    for fair in [false, true] {
        let name = format!("pool-{fair}");
        let sent = Instant::now();
        let holder = acquired(&mut client, request(&name, 2, 2, 300)).await;
        let response = acquire(&mut client, waiting(&name, 2, 1, 10_000, 5_000, fair)).await;
        let elapsed = sent.elapsed();
        assert!(response.acquired, "fair={fair}: {response:?}");
        // Redis counts whole milliseconds, so the expiry can come up to 1 ms early.
        assert!(
            elapsed >= Duration::from_millis(299),
            "fair={fair}: got permits of a 300 ms lease after only {elapsed:?}"
        );
        assert!(
            elapsed < Duration::from_millis(1_300),
            "fair={fair}: got permits of a 300 ms lease only after {elapsed:?}"
        );
        assert!(response.permit.expect("permit").fencing_token > holder.fencing_token);
        assert!(
            !release(&mut client, &name, &holder.token).await,
            "the lease had expired"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Fairness
// ---------------------------------------------------------------------------------------------

/// Five fair waiters, each confirmed queued (Describe's waiter count) before the next starts, are
/// granted in arrival order once the holder releases (each releases as soon as it is granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_granted_in_arrival_order() {
    const WAITERS: usize = 5;
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let holder = acquired(&mut client, request("pool", 1, 1, 30_000)).await;
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let mut c = if i % 2 == 0 {
            client.clone()
        } else {
            baton.semaphore_client().await
        };
        let mut task = tokio::spawn(async move {
            let permit = acquired(&mut c, waiting("pool", 1, 1, 30_000, 10_000, true)).await;
            assert!(release(&mut c, "pool", &permit.token).await);
            (i, permit.fencing_token)
        });
        wait_for_waiters_while(
            &client,
            "pool",
            u32::try_from(i + 1).expect("small"),
            &mut task,
        )
        .await;
        tasks.push(task);
    }
    assert!(release(&mut client, "pool", &holder.token).await);
    let mut granted = Vec::new();
    for task in tasks {
        granted.push(
            within(Duration::from_secs(5), task, "a fair waiter")
                .await
                .expect("waiter task"),
        );
    }
    granted.sort_by_key(|&(_, fence)| fence);
    let order: Vec<usize> = granted.iter().map(|&(i, _)| i).collect();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "grant order by fencing token"
    );
}

/// A fair request for all 3 permits, queued while one is free, is not starved by a stream of
/// small fair requests arriving behind it: none of them takes the free permit meanwhile, the big
/// one is granted as soon as the holders leave, and every small one after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weighted_fair_request_is_not_starved() {
    const SMALL: usize = 12;
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let h1 = acquired(&mut client, request("pool", 3, 1, 30_000)).await;
    let h2 = acquired(&mut client, request("pool", 3, 1, 30_000)).await;
    let mut big_client = baton.semaphore_client().await;
    let mut big = tokio::spawn(async move {
        let permit = acquired(&mut big_client, waiting("pool", 3, 3, 30_000, 10_000, true)).await;
        let granted_at = Instant::now();
        // Hold the whole semaphore briefly, then give it back.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(release(&mut big_client, "pool", &permit.token).await);
        (permit.fencing_token, granted_at)
    });
    wait_for_waiters_while(&client, "pool", 1, &mut big).await;

    // Small requests keep arriving, one every 10 ms (the arrival stream is the scenario).
    let mut smalls = JoinSet::new();
    for _ in 0..SMALL {
        let mut c = client.clone();
        smalls.spawn(async move {
            let permit = acquired(&mut c, waiting("pool", 3, 1, 30_000, 10_000, true)).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(release(&mut c, "pool", &permit.token).await);
            permit.fencing_token
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let d = describe(&mut client, "pool").await;
        assert_eq!(
            d.permits_in_use, 2,
            "a small request barged past the big one: {d:?}"
        );
    }
    wait_for_waiters(&client, "pool", u32::try_from(SMALL + 1).expect("small")).await;

    assert!(release(&mut client, "pool", &h1.token).await);
    assert!(release(&mut client, "pool", &h2.token).await);
    let released_at = Instant::now();
    let (big_fence, granted_at) = within(Duration::from_secs(2), big, "the big request")
        .await
        .expect("big task");
    let latency = granted_at.saturating_duration_since(released_at);
    assert!(
        latency < Duration::from_millis(200),
        "granted {latency:?} after the holders left"
    );
    within(
        Duration::from_secs(10),
        async {
            while let Some(small) = smalls.join_next().await {
                let fence = small.expect("a small request failed");
                assert!(
                    fence > big_fence,
                    "a small request arriving later was granted first"
                );
            }
        },
        "every small request",
    )
    .await;
}

/// Non-fair requests never overtake queued fair waiters: with a fair waiter for 2 permits queued
/// and 1 free, a non-fair (and a fair) try-once is refused and a non-fair waiter does not take the
/// free permit; it is granted after the fair waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_fair_request_does_not_overtake_fair_waiters() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let holder = acquired(&mut client, request("pool", 2, 1, 30_000)).await;
    let mut fair_client = baton.semaphore_client().await;
    let mut fair = tokio::spawn(async move {
        let permit = acquired(
            &mut fair_client,
            waiting("pool", 2, 2, 30_000, 10_000, true),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(release(&mut fair_client, "pool", &permit.token).await);
        permit.fencing_token
    });
    wait_for_waiters_while(&client, "pool", 1, &mut fair).await;

    let barging = refused(&mut client, request("pool", 2, 1, 1_000)).await;
    assert_eq!(barging.available, 1, "{barging:?}");
    refused(
        &mut client,
        pb::SemaphoreServiceAcquireRequest {
            fair: true,
            ..request("pool", 2, 1, 1_000)
        },
    )
    .await;
    let mut unfair_client = baton.semaphore_client().await;
    let mut unfair = tokio::spawn(async move {
        acquired(
            &mut unfair_client,
            waiting("pool", 2, 1, 30_000, 10_000, false),
        )
        .await
        .fencing_token
    });
    wait_for_waiters_while(&client, "pool", 2, &mut unfair).await;
    let d = describe(&mut client, "pool").await;
    assert_eq!(
        d.permits_in_use, 1,
        "the non-fair waiter took the free permit: {d:?}"
    );

    assert!(release(&mut client, "pool", &holder.token).await);
    let fair_fence = within(Duration::from_secs(2), fair, "the fair waiter")
        .await
        .expect("fair task");
    let unfair_fence = within(Duration::from_secs(2), unfair, "the non-fair waiter")
        .await
        .expect("non-fair task");
    assert!(
        unfair_fence > fair_fence,
        "the non-fair waiter overtook the fair one"
    );
}

// ---------------------------------------------------------------------------------------------
// Waiting without polling
// ---------------------------------------------------------------------------------------------

/// A waiter (non-fair, then fair) blocked on a semaphore held for 30 s gets the permit within
/// 50 ms of the holder's Release returning: woken through pub/sub, not by the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_a_waiter_within_50ms() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    for fair in [false, true] {
        let name = format!("pool-{fair}");
        let holder = acquired(&mut client, request(&name, 1, 1, 30_000)).await;
        let mut waiter_client = baton.semaphore_client().await;
        let waiter_name = name.clone();
        let mut waiter = tokio::spawn(async move {
            let response = acquire(
                &mut waiter_client,
                waiting(&waiter_name, 1, 1, 30_000, 10_000, fair),
            )
            .await;
            (response, Instant::now())
        });
        wait_for_waiters_while(&client, &name, 1, &mut waiter).await;
        assert!(release(&mut client, &name, &holder.token).await);
        let released_at = Instant::now();
        let (response, woke_at) = within(Duration::from_secs(2), waiter, "the waiter to acquire")
            .await
            .expect("waiter task");
        assert!(response.acquired, "fair={fair}: {response:?}");
        let latency = woke_at.saturating_duration_since(released_at);
        assert!(
            latency < Duration::from_millis(50),
            "fair={fair}: woken {latency:?} after the release"
        );
    }
}

/// A release wakes only as many local waiters as it freed permits: with a 3-permit holder of a
/// limit-3 semaphore and five non-fair single-permit waiters on one Baton, its release lets three
/// in, each woken by the one before it, which had permits left over; Redis runs the release and
/// exactly three acquisitions, and the other two waiters are not woken at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_as_many_waiters_as_it_frees_permits() {
    const WAITERS: usize = 5;
    // Reads node-wide counters: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    let mut conn = redis.conn().await;
    let name = "cascade";

    let holder = acquired(&mut client, request(name, 3, 3, 30_000)).await;
    let (granted_tx, mut granted_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..WAITERS {
        let mut c = baton.semaphore_client().await;
        let granted = granted_tx.clone();
        waiters.spawn(async move {
            let response = acquire(&mut c, waiting(name, 3, 1, 30_000, 20_000, false)).await;
            let _ = granted.send(response.acquired);
        });
    }
    wait_for_waiters(&client, name, WAITERS as u32).await;
    // Each waiter tries once more once subscribed: let those attempts run before counting.
    let mut last = conn.command_calls("evalsha").await;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = conn.command_calls("evalsha").await;
        if now == last {
            break;
        }
        last = now;
    }

    conn.reset_stats().await;
    assert!(release(&mut client, name, &holder.token).await);
    for i in 0..3 {
        let acquired = within(Duration::from_secs(2), granted_rx.recv(), "a grant")
            .await
            .expect("a waiter's answer");
        assert!(acquired, "grant {i}");
    }
    // Anyone else woken would run its acquisition script now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        granted_rx.try_recv().is_err(),
        "only three permits were freed"
    );
    let scripts = conn.command_calls("evalsha").await;
    waiters.abort_all();
    assert_eq!(
        scripts, 4,
        "the release and three acquisitions, no waiter woken in vain"
    );
}

/// A fair waiter whose caller gives up leaves the queue: when the head (waiting for 2 permits,
/// with 1 free) is cancelled, the waiter behind it (for 1) is granted at once, with no release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_fair_waiter_leaves_the_queue() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let holder = acquired(&mut client, request("pool", 2, 1, 30_000)).await;
    let mut head_client = baton.semaphore_client().await;
    let mut head = tokio::spawn(async move {
        acquire(
            &mut head_client,
            waiting("pool", 2, 2, 30_000, 10_000, true),
        )
        .await
    });
    wait_for_waiters_while(&client, "pool", 1, &mut head).await;
    let mut next_client = baton.semaphore_client().await;
    let mut next = tokio::spawn(async move {
        let response = acquire(
            &mut next_client,
            waiting("pool", 2, 1, 30_000, 10_000, true),
        )
        .await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&client, "pool", 2, &mut next).await;
    assert_eq!(
        describe(&mut client, "pool").await.permits_in_use,
        1,
        "the second waits its turn"
    );

    head.abort();
    let cancelled_at = Instant::now();
    assert!(
        head.await.is_err_and(|e| e.is_cancelled()),
        "the head was cancelled"
    );
    let (response, granted_at) = within(Duration::from_secs(2), next, "the next fair waiter")
        .await
        .expect("next task");
    assert!(response.acquired, "{response:?}");
    let latency = granted_at.saturating_duration_since(cancelled_at);
    assert!(
        latency < Duration::from_millis(500),
        "granted {latency:?} after the head left"
    );
    let d = describe(&mut client, "pool").await;
    assert_eq!((d.permits_in_use, d.waiters), (2, 0), "{d:?}");
    assert_eq!(
        d.holders
            .iter()
            .filter(|h| h.fencing_token == holder.fencing_token)
            .count(),
        1
    );
}

/// A fair waiter keeps its place past the 3 s queue lease (it renews it while waiting): the head,
/// waiting 3.5 s for 2 permits, is still granted before a waiter that queued 2 s after it (whose
/// own place would have outlived the head's first one had the head not renewed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_keeps_its_place_past_the_queue_lease() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let holder = acquired(&mut client, request("pool", 2, 1, 30_000)).await;
    let mut head_client = baton.semaphore_client().await;
    let mut head = tokio::spawn(async move {
        let permit = acquired(
            &mut head_client,
            waiting("pool", 2, 2, 30_000, 10_000, true),
        )
        .await;
        assert!(release(&mut head_client, "pool", &permit.token).await);
        permit.fencing_token
    });
    wait_for_waiters_while(&client, "pool", 1, &mut head).await;
    let queued_at = Instant::now();
    // Time passing is the scenario: the next waiter arrives 2 s later, and the holder leaves
    // once the head has waited longer than the queue lease.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut next_client = baton.semaphore_client().await;
    let mut next = tokio::spawn(async move {
        acquired(
            &mut next_client,
            waiting("pool", 2, 2, 30_000, 10_000, true),
        )
        .await
        .fencing_token
    });
    wait_for_waiters_while(&client, "pool", 2, &mut next).await;
    tokio::time::sleep_until(queued_at + baton::lease::QUEUE_LEASE + Duration::from_millis(500))
        .await;
    assert_eq!(describe(&mut client, "pool").await.waiters, 2);
    assert!(release(&mut client, "pool", &holder.token).await);
    let head_fence = within(Duration::from_secs(2), head, "the head")
        .await
        .expect("head task");
    let next_fence = within(Duration::from_secs(2), next, "the next")
        .await
        .expect("next task");
    assert!(
        head_fence < next_fence,
        "the head lost its place in the queue"
    );
}

/// A Hold waiting in the fair queue whose client drops the stream leaves the queue: the waiter
/// behind it is granted at once, and the dropped one never holds anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_hold_that_is_dropped_leaves_the_queue() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    acquired(&mut client, request("pool", 2, 1, 30_000)).await;
    let mut hold_client = baton.semaphore_client().await;
    let stream = hold(
        &mut hold_client,
        pb::SemaphoreServiceHoldRequest {
            wait_timeout: Some(ms(10_000)),
            fair: true,
            ..hold_request("pool", 2, 2, 30_000)
        },
    )
    .await;
    wait_for_waiters(&client, "pool", 1).await;
    let mut next_client = baton.semaphore_client().await;
    let mut next = tokio::spawn(async move {
        acquire(
            &mut next_client,
            waiting("pool", 2, 1, 30_000, 10_000, true),
        )
        .await
    });
    wait_for_waiters_while(&client, "pool", 2, &mut next).await;

    drop(stream);
    let response = within(
        Duration::from_secs(1),
        next,
        "the waiter behind the dropped Hold",
    )
    .await
    .expect("next task");
    assert!(response.acquired, "{response:?}");
    let d = describe(&mut client, "pool").await;
    assert_eq!(
        (d.permits_in_use, d.holder_count, d.waiters),
        (2, 2, 0),
        "{d:?}"
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
    let lost = loop {
        match next_hold_event(&mut stream, Duration::from_secs(3), "lost").await {
            HoldEvent::Renewed(_) => continue,
            HoldEvent::Lost(lost) => break lost,
            other => panic!("expected lost, got {other:?}"),
        }
    };
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

// ---------------------------------------------------------------------------------------------
// The classic Redis semaphore scenarios
// ---------------------------------------------------------------------------------------------

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

/// Scenario "timeout reclaim": expired holders stay in Redis (reads do not write) until the next
/// acquisition reclaims their permits inside its own script and is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_timeout_reclaim() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    let mut conn = redis.conn().await;
    let data = sem_key(&baton, "pool");
    let holders = format!("{data}:holders");

    acquired(&mut client, request("pool", 2, 1, 200)).await;
    acquired(&mut client, request("pool", 2, 1, 200)).await;
    refused(&mut client, request("pool", 2, 1, 10_000)).await;
    wait_for_state(&client, "pool", "both leases to expire", |d| {
        d.permits_in_use == 0
    })
    .await;
    assert_eq!(
        zcard(&mut conn, &holders).await,
        2,
        "Describe must not reclaim"
    );

    let permit = acquired(&mut client, request("pool", 2, 2, 10_000)).await;
    assert_eq!(
        zcard(&mut conn, &holders).await,
        1,
        "the acquisition reclaimed both"
    );
    let used: u64 = redis::cmd("HGET")
        .arg(&data)
        .arg("used")
        .query_async(&mut conn)
        .await
        .expect("HGET");
    assert_eq!(used, 2, "the reclaimed permits are no longer counted");
    assert_eq!(
        describe(&mut client, "pool").await.holders[0].fencing_token,
        permit.fencing_token
    );
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

// ---------------------------------------------------------------------------------------------
// Redis outages
// ---------------------------------------------------------------------------------------------

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

    let lost = loop {
        match next_hold_event(&mut stream, Duration::from_secs(3), "lost").await {
            HoldEvent::Renewed(r) => {
                confirmed_at = Instant::now();
                valid_for = remaining(&r.remaining_ttl, "renewed");
            }
            HoldEvent::Lost(lost) => break lost,
            other => panic!("expected renewed or lost, got {other:?}"),
        }
    };
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

// ---------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------

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
    let pool = sem_key(&baton, "pool");
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
