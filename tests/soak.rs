//! The soak: the real `baton` binary under steady load for a while, checked for what grows.
//!
//! Load: 1,000 open lock `Hold` streams (each renewed, none may be lost) that churn — each is
//! closed after a random 2 to 18 s and a new one opened in its place —, contended locks and
//! semaphores whose workers wait and are woken by pub/sub, and rate limit checks. Looked at every
//! two seconds: Baton's resident memory and open file descriptors and threads (`/proc/PID`), its
//! connections in Redis (`CLIENT LIST`), and its own gauges (RPCs in flight, leases held,
//! waiters, subscribed channels, pooled connections).
//!
//! Checked: after the warm-up, memory stays within 10% (at least 8 MiB) of where it was, and file
//! descriptors, threads and Redis connections do not grow; no lease is lost, no call fails, every
//! waiter is served; once every client has gone, the gauges fall to zero and Redis holds no key of
//! Baton's but the documented retention keys, each with an expiry (the last fencing token of each
//! lock, `PREFIX{lock:NAME}:fence`, kept an hour; a semaphore's keys, kept a minute after its
//! last lease; rate limit counters, kept until their window or bucket empties).
//!
//! The suite runs it for [`SUITE_SECS`] seconds (a debug build; about 40 s in all). By hand, for
//! ten minutes on a release build:
//!
//! ```text
//! BATON_SOAK_SECS=600 cargo test --release --test soak -- --ignored --nocapture
//! ```
//!
//! `BATON_SOAK_STREAMS` changes the number of `Hold` streams (1,000).

#[path = "support/mod.rs"]
mod support;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use baton::proto::v1::{
    self as pb, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event as HoldEvent,
    rate_limit_service_client::RateLimitServiceClient,
    semaphore_service_client::SemaphoreServiceClient,
};
use support::{BatonProcess, RedisServer, channel, ms, unique_prefix, wait_until, within};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// Seconds of load in the suite's run.
const SUITE_SECS: u64 = 30;
/// Seconds of load when run by hand without `BATON_SOAK_SECS`.
const DEFAULT_SECS: u64 = 600;
/// `Hold` streams kept open.
const DEFAULT_STREAMS: usize = 1000;
/// gRPC connections the streams share (HTTP/2 allows 200 streams per connection by default).
const CONNECTIONS: usize = 10;
/// Ttl of the held leases: renewed about every third of it.
const HOLD_TTL_MS: u64 = 6000;
/// Shortest and longest life of a `Hold` stream before it is replaced.
const HOLD_LIFE_MS: (u64, u64) = (2000, 18_000);
/// Contended locks, and workers taking each in turn.
const CONTENDED_LOCKS: usize = 10;
/// Semaphores of [`SEMAPHORE_LIMIT`] permits, and workers taking them.
const SEMAPHORES: usize = 5;
/// Permits of each semaphore.
const SEMAPHORE_LIMIT: u32 = 2;
/// Workers per contended lock or semaphore.
const WORKERS: usize = 4;
/// Rate limit checks per second, in all (as many as the machine allows, up to this).
const RATELIMIT_PER_SEC: u64 = 200;
/// Tasks sending them, each waiting for its answers.
const RATELIMIT_SENDERS: usize = 4;
/// How long a contended worker may wait for its turn: far longer than a turn, so a refusal
/// means a lost wake-up.
const WORKER_WAIT_MS: u64 = 20_000;
/// Interval between two looks at Baton.
const SAMPLE_EVERY: Duration = Duration::from_secs(2);
/// Growth of resident memory tolerated after the warm-up: this fraction of it, or
/// [`RSS_SLACK_MIN`] if more.
const RSS_SLACK: f64 = 0.10;
/// The least growth tolerated, in bytes (allocator arenas and the kernel's accounting move by a
/// few MiB on their own).
const RSS_SLACK_MIN: u64 = 8 << 20;
/// File descriptors (and threads) Baton may open beyond the warm-up's, e.g. a pool connection
/// being replaced at the moment of a look.
const FD_SLACK: u64 = 4;
/// How long Baton may take to drop every lease, waiter and subscription once the clients left.
const DRAIN: Duration = Duration::from_secs(30);

/// The in-suite soak: [`SUITE_SECS`] seconds of load on a debug build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_in_the_suite() {
    soak(Duration::from_secs(SUITE_SECS), DEFAULT_STREAMS).await;
}

/// The full soak, by hand: `BATON_SOAK_SECS` seconds (ten minutes by default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "ten minutes: run by hand (see the module's documentation)"]
async fn soak_by_hand() {
    let secs = env_number("BATON_SOAK_SECS").unwrap_or(DEFAULT_SECS);
    let streams = env_number("BATON_SOAK_STREAMS").map_or(DEFAULT_STREAMS, |n| n as usize);
    soak(Duration::from_secs(secs), streams).await;
}

/// A number from the environment (read only, never set).
fn env_number(name: &str) -> Option<u64> {
    let raw = std::env::var(name).ok()?;
    Some(
        raw.parse()
            .unwrap_or_else(|_| panic!("{name}={raw:?} is not a whole number")),
    )
}

/// What the load did, counted by its tasks.
#[derive(Default)]
struct Counts {
    holds_opened: AtomicU64,
    renewals: AtomicU64,
    lock_turns: AtomicU64,
    semaphore_turns: AtomicU64,
    ratelimit_checks: AtomicU64,
    /// Everything that must not happen, each described.
    failures: std::sync::Mutex<Vec<String>>,
}

impl Counts {
    fn fail(&self, what: String) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() < 20 {
            failures.push(what);
        }
    }

    fn failures(&self) -> Vec<String> {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// One look at Baton.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    rss: u64,
    fds: u64,
    threads: u64,
    redis_clients: u64,
    in_flight: f64,
    held: f64,
    waiters: f64,
    subscriptions: f64,
}

async fn soak(duration: Duration, streams: usize) {
    let redis = RedisServer::start_standalone().await;
    let prefix = unique_prefix();
    let url = redis.url();
    let baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "--metrics-listen",
        "127.0.0.1:0",
        // A debug build on a busy machine: no call should fail for want of a few hundred ms.
        "--redis-command-timeout",
        "2s",
        "--ratelimit-timeout",
        "2s",
    ])
    .await;
    let metrics = wait_until(
        Duration::from_secs(20),
        "the metrics address in the log",
        || {
            let log = baton.stderr();
            async move { metrics_addr(&log).ok_or(log) }
        },
    )
    .await;
    let pid = baton.pid();
    let mut admin = redis.client().await;
    let idle = look(pid, &mut admin, metrics, Duration::ZERO).await;
    println!("soak: {streams} Hold streams for {duration:?}; before the load: {idle:?}");

    let mut channels = Vec::new();
    for _ in 0..CONNECTIONS {
        channels.push(channel(baton.addr()).await);
    }
    let counts = Arc::new(Counts::default());
    let stop = CancellationToken::new();
    let started = Instant::now();
    let end = started + duration;
    let mut tasks = Vec::new();
    for slot in 0..streams {
        let client = LockServiceClient::new(channels[slot % CONNECTIONS].clone());
        // Opened over the first 5 s, not all at once.
        let delay = Duration::from_millis((slot as u64 * 5000) / streams as u64);
        tasks.push(tokio::spawn(holder(
            slot,
            client,
            delay,
            counts.clone(),
            stop.clone(),
        )));
    }
    for name in 0..CONTENDED_LOCKS {
        for worker in 0..WORKERS {
            let client = LockServiceClient::new(channels[(name + worker) % CONNECTIONS].clone());
            tasks.push(tokio::spawn(lock_worker(
                format!("contended-{name}"),
                client,
                counts.clone(),
                stop.clone(),
            )));
        }
    }
    for name in 0..SEMAPHORES {
        for worker in 0..WORKERS {
            let client =
                SemaphoreServiceClient::new(channels[(name + worker) % CONNECTIONS].clone());
            tasks.push(tokio::spawn(semaphore_worker(
                format!("pool-{name}"),
                client,
                counts.clone(),
                stop.clone(),
            )));
        }
    }
    for sender in 0..RATELIMIT_SENDERS {
        tasks.push(tokio::spawn(ratelimit_traffic(
            sender,
            RateLimitServiceClient::new(channels[sender % CONNECTIONS].clone()),
            counts.clone(),
            stop.clone(),
        )));
    }

    // Looks every two seconds; the warm-up is the first third (at least 10 s: the streams open
    // over 5 s and their first renewals follow).
    let warm_up = (duration / 3).max(Duration::from_secs(10)).min(duration);
    let mut samples = Vec::new();
    let mut next = started + SAMPLE_EVERY;
    while next <= end {
        tokio::time::sleep_until(next).await;
        let sample = look(pid, &mut admin, metrics, started.elapsed()).await;
        println!("soak: {sample:?}");
        samples.push(sample);
        next += SAMPLE_EVERY;
    }
    let failures = counts.failures();
    assert!(failures.is_empty(), "during the load: {failures:#?}");

    // Every client goes.
    stop.cancel();
    for task in tasks {
        within(Duration::from_secs(30), task, "a load task to stop")
            .await
            .expect("a load task panicked");
    }
    drop(channels);
    let failures = counts.failures();
    assert!(failures.is_empty(), "while stopping: {failures:#?}");

    // Flat after the warm-up: memory, descriptors, threads and Redis connections.
    let warm: Vec<&Sample> = samples.iter().filter(|s| s.at <= warm_up).collect();
    let steady: Vec<&Sample> = samples.iter().filter(|s| s.at > warm_up).collect();
    assert!(
        !warm.is_empty() && steady.len() >= 2,
        "too few looks: {samples:?}"
    );
    let baseline = warm.last().expect("a warm-up look");
    let rss_warm = warm.iter().map(|s| s.rss).max().unwrap_or_default();
    let rss_end = steady
        .iter()
        .rev()
        .take(2)
        .map(|s| s.rss)
        .max()
        .unwrap_or_default();
    let slack = ((rss_warm as f64 * RSS_SLACK) as u64).max(RSS_SLACK_MIN);
    let max_of = |f: fn(&Sample) -> u64| steady.iter().map(|s| f(s)).max().unwrap_or_default();
    let summary = format!(
        "RSS {:.1} MiB at the warm-up's end (max {:.1}), {:.1} MiB at the end; fds {} -> max {}; \
         threads {} -> max {}; Redis connections {} -> max {}; holds opened {}, renewals {}, \
         lock turns {}, semaphore turns {}, rate limit checks {}",
        mib(baseline.rss),
        mib(rss_warm),
        mib(rss_end),
        baseline.fds,
        max_of(|s| s.fds),
        baseline.threads,
        max_of(|s| s.threads),
        baseline.redis_clients,
        max_of(|s| s.redis_clients),
        counts.holds_opened.load(Ordering::Relaxed),
        counts.renewals.load(Ordering::Relaxed),
        counts.lock_turns.load(Ordering::Relaxed),
        counts.semaphore_turns.load(Ordering::Relaxed),
        counts.ratelimit_checks.load(Ordering::Relaxed),
    );
    println!("soak: {summary}");
    assert!(
        rss_end <= rss_warm + slack,
        "memory grew after the warm-up: {summary}"
    );
    assert!(
        max_of(|s| s.fds) <= baseline.fds + FD_SLACK,
        "file descriptors grew: {summary}"
    );
    assert!(
        max_of(|s| s.threads) <= baseline.threads + FD_SLACK,
        "threads grew: {summary}"
    );
    assert!(
        max_of(|s| s.redis_clients) <= baseline.redis_clients,
        "Redis connections grew: {summary}"
    );
    for steady in &steady {
        assert!(
            steady.held >= streams as f64 * 0.9,
            "the streams were open throughout: {steady:?}"
        );
    }
    let secs = duration.as_secs().max(1);
    assert!(
        counts.holds_opened.load(Ordering::Relaxed) > streams as u64 + secs * 10,
        "streams churned: {summary}"
    );
    assert!(
        counts.lock_turns.load(Ordering::Relaxed) > secs * 10
            && counts.semaphore_turns.load(Ordering::Relaxed) > secs * 10,
        "waiters were served: {summary}"
    );

    // Once every client has gone: nothing held, waited for or subscribed, and no key left but
    // the retention keys, each expiring.
    // The descriptors come back to their number before the load, but for the pooled Redis
    // connections opened since (the pools open theirs as calls need them).
    let drained = wait_until(
        DRAIN,
        "Baton to drop every lease, waiter, channel and client connection",
        || {
            let mut admin = admin.clone();
            async move {
                let s = look(pid, &mut admin, metrics, Duration::ZERO).await;
                let pooled = s.redis_clients.saturating_sub(idle.redis_clients);
                if s.in_flight == 0.0
                    && s.held == 0.0
                    && s.waiters == 0.0
                    && s.subscriptions == 0.0
                    && s.fds <= idle.fds + pooled
                {
                    Ok(s)
                } else {
                    Err(s)
                }
            }
        },
    )
    .await;
    assert!(
        drained.redis_clients <= baseline.redis_clients,
        "Redis connections: {drained:?}"
    );
    let left = wait_until(DRAIN, "only retention keys left", || {
        let mut admin = admin.clone();
        let prefix = prefix.clone();
        async move {
            let left = keys_left(&mut admin, &prefix).await;
            if left.values().all(|(retained, _, _)| *retained) {
                Ok(left)
            } else {
                Err(left
                    .into_iter()
                    .filter(|(_, (retained, _, _))| !retained)
                    .take(10)
                    .collect::<Vec<_>>())
            }
        }
    })
    .await;
    let mut kinds: BTreeMap<&str, (u64, i64)> = BTreeMap::new();
    for (kind, (_, count, longest)) in &left {
        let entry = kinds.entry(kind).or_default();
        entry.0 += count;
        entry.1 = entry.1.max(*longest);
    }
    println!(
        "soak: after the clients left: {drained:?}; keys left by kind (count, longest ttl ms): \
         {kinds:?}"
    );
}

/// Keeps a `Hold` stream on lock `hold-SLOT` open for a random while, reads its renewals, then
/// closes it and opens the next, until `stop`.
async fn holder(
    slot: usize,
    mut client: LockServiceClient<Channel>,
    delay: Duration,
    counts: Arc<Counts>,
    stop: CancellationToken,
) {
    let mut random = Random::new(slot as u64);
    tokio::select! {
        () = tokio::time::sleep(delay) => {}
        () = stop.cancelled() => return,
    }
    let name = format!("hold-{slot}");
    while !stop.is_cancelled() {
        let request = pb::LockServiceHoldRequest {
            name: name.clone(),
            ttl: Some(ms(HOLD_TTL_MS)),
            owner: format!("holder-{slot}"),
            ..Default::default()
        };
        let mut stream = match client.hold(request).await {
            Ok(s) => s.into_inner(),
            Err(status) => {
                counts.fail(format!("Hold {name}: {status:?}"));
                return;
            }
        };
        match tokio::time::timeout(Duration::from_secs(30), stream.message()).await {
            Ok(Ok(Some(m))) if matches!(m.event, Some(HoldEvent::Acquired(_))) => {
                counts.holds_opened.fetch_add(1, Ordering::Relaxed);
            }
            other => {
                counts.fail(format!("Hold {name}: no acquired event: {other:?}"));
                return;
            }
        }
        let life = Duration::from_millis(random.between(HOLD_LIFE_MS.0, HOLD_LIFE_MS.1));
        let until = Instant::now() + life;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => break,
                () = stop.cancelled() => return,
                message = stream.message() => match message {
                    Ok(Some(m)) if matches!(m.event, Some(HoldEvent::Renewed(_))) => {
                        counts.renewals.fetch_add(1, Ordering::Relaxed);
                    }
                    other => {
                        counts.fail(format!("Hold {name}: {other:?}"));
                        return;
                    }
                },
            }
        }
        // Dropping the stream releases the lease; the next one takes the same name.
    }
}

/// Takes lock `name` in turn with the other workers (waiting to be woken), holds it a moment,
/// releases it; until `stop`.
async fn lock_worker(
    name: String,
    mut client: LockServiceClient<Channel>,
    counts: Arc<Counts>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let request = pb::LockServiceAcquireRequest {
            name: name.clone(),
            ttl: Some(ms(10_000)),
            wait_timeout: Some(ms(WORKER_WAIT_MS)),
            ..Default::default()
        };
        let acquired = tokio::select! {
            r = client.acquire(request) => r,
            () = stop.cancelled() => return,
        };
        let token = match acquired {
            Ok(r) if r.get_ref().acquired => r.into_inner().lease.map(|l| l.token),
            other => {
                counts.fail(format!("Acquire {name}: {other:?}"));
                return;
            }
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let released = client
            .release(pb::LockServiceReleaseRequest {
                name: name.clone(),
                token: token.unwrap_or_default(),
            })
            .await;
        match released {
            Ok(r) if r.get_ref().was_held => {
                counts.lock_turns.fetch_add(1, Ordering::Relaxed);
            }
            other => {
                counts.fail(format!("Release {name}: {other:?}"));
                return;
            }
        }
    }
}

/// Takes a permit of semaphore `name` (waiting when none is free), holds it a moment, releases
/// it; until `stop`.
async fn semaphore_worker(
    name: String,
    mut client: SemaphoreServiceClient<Channel>,
    counts: Arc<Counts>,
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let request = pb::SemaphoreServiceAcquireRequest {
            name: name.clone(),
            limit: SEMAPHORE_LIMIT,
            permits: 1,
            ttl: Some(ms(10_000)),
            wait_timeout: Some(ms(WORKER_WAIT_MS)),
            ..Default::default()
        };
        let acquired = tokio::select! {
            r = client.acquire(request) => r,
            () = stop.cancelled() => return,
        };
        let token = match acquired {
            Ok(r) if r.get_ref().acquired => r.into_inner().permit.map(|p| p.token),
            other => {
                counts.fail(format!("Acquire semaphore {name}: {other:?}"));
                return;
            }
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        let released = client
            .release(pb::SemaphoreServiceReleaseRequest {
                name: name.clone(),
                token: token.unwrap_or_default(),
            })
            .await;
        match released {
            Ok(r) if r.get_ref().was_held => {
                counts.semaphore_turns.fetch_add(1, Ordering::Relaxed);
            }
            other => {
                counts.fail(format!("Release semaphore {name}: {other:?}"));
                return;
            }
        }
    }
}

/// This sender's share of [`RATELIMIT_PER_SEC`] checks a second over 50 keys, each decided by
/// Redis; until `stop`.
async fn ratelimit_traffic(
    sender: usize,
    mut client: RateLimitServiceClient<Channel>,
    counts: Arc<Counts>,
    stop: CancellationToken,
) {
    let every = Duration::from_micros(1_000_000 * RATELIMIT_SENDERS as u64 / RATELIMIT_PER_SEC);
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            () = stop.cancelled() => return,
        }
        n += 1;
        let request = pb::RateLimitServiceCheckRequest {
            key: format!(
                "api-{}",
                (n * RATELIMIT_SENDERS as u64 + sender as u64) % 50
            ),
            limit: 10,
            period: Some(ms(1000)),
            algorithm: pb::RateLimitAlgorithm::Gcra.into(),
            ..Default::default()
        };
        match client.check(request).await {
            Ok(r) if r.get_ref().decided_by() == pb::RateLimitDecidedBy::Redis => {
                counts.ratelimit_checks.fetch_add(1, Ordering::Relaxed);
            }
            other => {
                counts.fail(format!("Check: {other:?}"));
                return;
            }
        }
    }
}

/// Looks at Baton (`pid`) in `/proc`, its connections in Redis, and its gauges.
async fn look(
    pid: u32,
    admin: &mut redis::aio::MultiplexedConnection,
    metrics: SocketAddr,
    at: Duration,
) -> Sample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/PID/fd")
        .count() as u64;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(admin)
        .await
        .expect("CLIENT LIST");
    // Every connection but this one.
    let redis_clients = clients
        .lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .count() as u64;
    let text = scrape(metrics).await;
    Sample {
        at,
        rss: field("VmRSS:") * 1024,
        fds,
        threads: field("Threads:"),
        redis_clients,
        in_flight: family_sum(&text, "baton_rpc_in_flight"),
        held: family_sum(&text, "baton_leases_held"),
        waiters: family_sum(&text, "baton_lease_waiters"),
        subscriptions: family_sum(&text, "baton_redis_subscriptions"),
    }
}

/// The sum of every sample of metric `family` in a Prometheus text exposition.
fn family_sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(family)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The body of `GET /metrics`.
async fn scrape(addr: SocketAddr) -> String {
    within(
        Duration::from_secs(10),
        async {
            let mut stream = tokio::net::TcpStream::connect(addr)
                .await
                .expect("connecting to the metrics port");
            stream
                .write_all(b"GET /metrics HTTP/1.1\r\nHost: baton\r\nConnection: close\r\n\r\n")
                .await
                .expect("sending the request");
            let mut raw = Vec::new();
            stream
                .read_to_end(&mut raw)
                .await
                .expect("reading the response");
            let raw = String::from_utf8(raw).expect("a UTF-8 response");
            raw.split_once("\r\n\r\n")
                .map(|(_, body)| body.to_owned())
                .expect("a response body")
        },
        "a metrics scrape",
    )
    .await
}

/// The address of the "serving metrics" log line.
fn metrics_addr(log: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains("serving metrics"))?;
    let at = line.find("127.0.0.1:")?;
    let addr: String = line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    addr.parse().ok()
}

/// Baton's keys left under `prefix`, by kind: whether the kind is a documented retention key
/// with an expiry, how many, and the longest time to live (ms).
async fn keys_left(
    admin: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
) -> BTreeMap<String, (bool, u64, i64)> {
    let mut left: BTreeMap<String, (bool, u64, i64)> = BTreeMap::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(admin)
            .await
            .expect("SCAN");
        for key in keys {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(admin)
                .await
                .expect("PTTL");
            let kind = kind_of(&key[prefix.len()..]);
            // A retention key must expire, and within its documented bound.
            let bound = match kind.as_str() {
                "lock:fence" => Some(HOLD_TTL_MS.max(10_000) as i64 + 3_600_000),
                "sem" | "sem:holders" | "sem:limits" | "sem:fence" | "sem:queue"
                | "sem:waiters" => Some(3_600_000 + 10_000),
                "rl:gcra" => Some(2000),
                _ => None,
            };
            let retained = ttl > 0 && bound.is_some_and(|b| ttl <= b);
            let entry = left.entry(kind).or_insert((retained, 0, 0));
            entry.0 &= retained;
            entry.1 += 1;
            entry.2 = entry.2.max(ttl);
        }
        if next == 0 {
            return left;
        }
        cursor = next;
    }
}

/// `lock:fence` for `{lock:hold-1}:fence`, `sem` for `{sem:pool-0}`: the service and the
/// suffix of a key, without the name.
fn kind_of(key: &str) -> String {
    let Some(rest) = key.strip_prefix('{') else {
        return key.to_owned();
    };
    let Some((tag, suffix)) = rest.split_once('}') else {
        return key.to_owned();
    };
    let service = tag.split_once(':').map_or(tag, |(s, _)| s);
    format!("{service}{suffix}")
}

/// Bytes as MiB.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// A small deterministic generator (xorshift), seeded per task.
struct Random(u64);

impl Random {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A number in `[low, high]`.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        low + self.0 % (high - low + 1)
    }
}
