//! Locks, semaphores and rate limits through Baton against the same Redis work done directly, in
//! one run, and the gRPC health check for scale.
//!
//! For each scenario and number of concurrent clients (closed loops, one call in flight each)
//! the sides run one after the other on the same Redis:
//!
//! - **direct** ([`Side::Direct`]): the scripts Baton runs, through their typed builders
//!   (`baton::lock::scripts`, `baton::semaphore::scripts`, `baton::ratelimit::scripts`), over as
//!   many multiplexed connections as Baton's pool. A client that waits does what a client library
//!   without Baton would: it keeps its own pub/sub connection subscribed to the release channel
//!   and tries again as a registered waiter on every message meant for it (a broadcast, or `@ID`
//!   addressed to it in fair mode), when the script says the state may change, and at least
//!   every third of the registration lease, then gives up with `abandon.lua` at its deadline;
//! - **polling** ([`Side::Polling`], contended lock only): try, sleep 100 ms, try again, as
//!   redis-py's `Lock` does by default;
//! - **through Baton** ([`Side::Baton`]): gRPC calls over TCP or the Unix socket, client *i* on
//!   connection *i* mod [`Options::channels`], or one connection per client.
//!
//! Every window resets Redis's command statistics first and reads them after, so script calls
//! per operation are counted by Redis itself ([`crate::probe`]).

use std::{
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use baton::{
    lock::{self, Mode, scripts::LockKeys},
    proto::v1::{
        self as pb, lock_service_client::LockServiceClient,
        rate_limit_service_client::RateLimitServiceClient,
        semaphore_service_client::SemaphoreServiceClient,
    },
    ratelimit::{self, Algorithm, Rate},
    semaphore::{self, scripts::SemaphoreKeys},
};
use futures::{FutureExt, StreamExt};
use hdrhistogram::Histogram;
use redis::{Script, Value, aio::MultiplexedConnection};
use testkit::{ms, within};
use tokio::{
    sync::Barrier,
    task::JoinSet,
    time::{Instant, sleep_until},
};
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::{
    DIRECT_PREFIX, Options, Scenario, Side, Stage, Transport, names,
    probe::Probe,
    record::Record,
    stats::{self, histogram, micros},
};

/// Lease ttl of every acquisition (released long before it ends).
pub const TTL: Duration = Duration::from_secs(10);
/// Longest wait of a contended acquisition; a wait that ends without a grant is a timeout.
pub const CONTENDED_WAIT: Duration = Duration::from_secs(5);
/// The semaphores' limit.
pub const SEMAPHORE_LIMIT: u32 = 5;
/// The polling client's pause between tries (redis-py's `Lock(sleep=0.1)` default).
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Keys the rate limit load is spread over.
pub const RATELIMIT_KEYS: u64 = 1000;
/// A rate limit no key reaches, so every decision runs the whole script and writes.
pub const RATELIMIT_LIMIT: u64 = 1_000_000_000;
/// Longest time one call may take before it counts as an error.
pub const CALL_LIMIT: Duration = Duration::from_secs(30);

/// Measures every closed-loop scenario of `options` on `stage`, appending one record per
/// scenario, client count and side.
pub async fn run(options: &Options, stage: &Stage, records: &mut Vec<Record>) {
    let scenarios: Vec<Scenario> = options
        .scenarios
        .iter()
        .copied()
        .filter(|s| s.closed_loop())
        .collect();
    if scenarios.is_empty() {
        return;
    }
    let stack = Stack::new(options, stage).await;
    let mut probe = Probe::new(stage.redis.client().await, Some(stage.baton.pid()));
    for scenario in scenarios {
        for clients in options.clients_of(scenario) {
            for side in options.sides_of(scenario) {
                let record = measure(options, &mut probe, &stack, scenario, clients, side).await;
                eprintln!(
                    "{:<20} {:>3} clients {:<14} {:>9.0} ops/s  p50 {:>6} us  p99 {:>7} us  scripts/op {:.2}  errors {}{}",
                    scenario.name(),
                    clients,
                    side.name(),
                    record.get(names::RATE).unwrap_or(0.0),
                    record.get(names::P50).unwrap_or(0.0),
                    record.get(names::P99).unwrap_or(0.0),
                    record.script_calls() as f64 / record.get(names::OPS).unwrap_or(0.0).max(1.0),
                    record.get(names::ERRORS).unwrap_or(0.0),
                    record
                        .first_error
                        .as_deref()
                        .map(|e| format!(" (first: {e})"))
                        .unwrap_or_default()
                );
                records.push(record);
            }
        }
    }
}

/// What one client saw in one window.
struct Rec {
    ops: u64,
    calls: u64,
    errors: u64,
    timeouts: u64,
    regrants: u64,
    first_error: Option<String>,
    latency: Histogram<u64>,
    handoff: Histogram<u64>,
    handoff_other: Histogram<u64>,
}

impl Rec {
    fn new() -> Self {
        Self {
            ops: 0,
            calls: 0,
            errors: 0,
            timeouts: 0,
            regrants: 0,
            first_error: None,
            latency: histogram(),
            handoff: histogram(),
            handoff_other: histogram(),
        }
    }

    fn call(&mut self, took: Duration) {
        self.calls += 1;
        self.latency.saturating_record(micros(took));
    }

    fn error(&mut self, e: String) {
        self.errors += 1;
        self.first_error.get_or_insert(e);
    }
}

/// State shared by the clients of one window.
struct Shared {
    /// When and by which client the lock was last released (set right before sending Release).
    last_release: Mutex<Option<(Instant, usize)>>,
}

impl Shared {
    fn handoff(&self, granted_at: Instant, me: usize, rec: &mut Rec) {
        let last = *self.last_release.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((released_at, by)) = last
            && granted_at > released_at
        {
            let took = micros(granted_at - released_at);
            rec.handoff.saturating_record(took);
            if by == me {
                rec.regrants += 1;
            } else {
                rec.handoff_other.saturating_record(took);
            }
        }
    }

    fn released(&self, at: Instant, me: usize) {
        *self.last_release.lock().unwrap_or_else(|e| e.into_inner()) = Some((at, me));
    }
}

/// Starts the measured window once every client has finished warming up, and ends it.
struct Gate {
    warm_until: Instant,
    paused: Barrier,
    go: Barrier,
    until: OnceLock<Instant>,
}

/// The scripts Baton runs, for the direct side, wrapped as Baton wraps them for a single Redis.
pub struct Scripts {
    /// The lock's `acquire.lua`.
    pub lock_acquire: Script,
    /// The lock's `release.lua`.
    pub lock_release: Script,
    /// The lock's `refresh.lua`.
    pub lock_refresh: Script,
    /// The lock's `abandon.lua`.
    pub lock_abandon: Script,
    sem_acquire: Script,
    sem_release: Script,
    sem_abandon: Script,
    /// `gcra.lua`.
    pub gcra: Script,
}

impl Scripts {
    /// The scripts as `redis` (Baton's handle on the Redis of the run) wraps them.
    pub fn new(redis: &baton::redis::Redis) -> Self {
        Self {
            lock_acquire: redis.script(lock::scripts::ACQUIRE),
            lock_release: redis.script(lock::scripts::RELEASE),
            lock_refresh: redis.script(lock::scripts::REFRESH),
            lock_abandon: redis.script(lock::scripts::ABANDON),
            sem_acquire: redis.script(semaphore::scripts::ACQUIRE),
            sem_release: redis.script(semaphore::scripts::RELEASE),
            sem_abandon: redis.script(semaphore::scripts::ABANDON),
            gcra: Script::new(ratelimit::scripts::GCRA),
        }
    }
}

/// Everything the windows' clients connect through.
struct Stack {
    redis_client: redis::Client,
    conns: Vec<MultiplexedConnection>,
    scripts: Arc<Scripts>,
    tcp: Vec<Channel>,
    uds: Vec<Channel>,
    baton: std::net::SocketAddr,
}

impl Stack {
    async fn new(options: &Options, stage: &Stage) -> Self {
        let mut conns = Vec::with_capacity(options.pool);
        for _ in 0..options.pool {
            conns.push(stage.redis.client().await);
        }
        Self {
            redis_client: redis::Client::open(stage.redis.url()).expect("redis url"),
            conns,
            scripts: Arc::new(Scripts::new(&stage.redis.baton_redis())),
            tcp: stage.channels(Transport::Tcp, options.channels).await,
            uds: stage.channels(Transport::Uds, options.channels).await,
            baton: stage.baton.addr(),
        }
    }
}

enum Target {
    Direct {
        conn: MultiplexedConnection,
        scripts: Arc<Scripts>,
        polling: bool,
        /// Release messages of the contended name (contended scenarios, not polling).
        messages: Option<redis::aio::PubSubStream>,
    },
    Grpc(Box<Clients>),
}

/// gRPC clients over one of the load generator's HTTP/2 connections to Baton.
struct Clients {
    lock: LockServiceClient<Channel>,
    semaphore: SemaphoreServiceClient<Channel>,
    ratelimit: RateLimitServiceClient<Channel>,
    health: HealthClient<Channel>,
}

/// The outcome of one direct acquisition attempt.
enum Try {
    Granted(String),
    /// Busy; when to look again without a message (the holder's expiry), if ever.
    Busy(Option<Duration>),
}

/// An integer reply (or a string holding one).
pub fn int(v: &Value) -> Result<i64, String> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => String::from_utf8_lossy(b)
            .parse()
            .map_err(|e| format!("not a number: {e}")),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// `d` in whole milliseconds.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A duration of `v` milliseconds, `None` when negative.
pub fn lease_ms(v: i64) -> Option<Duration> {
    u64::try_from(v).ok().map(Duration::from_millis)
}

/// A fresh lease token.
pub fn token() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

/// `call`, failing with `what` and the error, or when it takes longer than [`CALL_LIMIT`].
pub async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_LIMIT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {CALL_LIMIT:?}")),
    }
}

/// The rate every decision is checked against: a limit no key reaches, GCRA, burst = limit.
pub fn ratelimit_rate() -> Rate {
    Rate::new(
        Algorithm::Gcra,
        RATELIMIT_LIMIT,
        Duration::from_secs(1),
        None,
    )
    .expect("a valid rate")
}

/// One closed-loop client.
struct Worker {
    id: usize,
    scenario: Scenario,
    name: String,
    lock_keys: LockKeys,
    sem_keys: SemaphoreKeys,
    shared: Arc<Shared>,
    target: Target,
    n: u64,
}

impl Worker {
    async fn new(
        id: usize,
        scenario: Scenario,
        side: Side,
        stack: &Stack,
        channel: Option<Channel>,
        shared: Arc<Shared>,
    ) -> Worker {
        let name = if scenario.contended() {
            "shared".to_owned()
        } else {
            format!("own-{id}")
        };
        let prefix = if side.is_baton() {
            crate::BATON_PREFIX
        } else {
            DIRECT_PREFIX
        };
        let lock_keys = LockKeys::new(prefix, &name);
        let sem_keys = SemaphoreKeys::new(prefix, &name);
        let target = match (side, channel) {
            (Side::Baton(_), Some(channel)) => Target::Grpc(Box::new(Clients {
                lock: LockServiceClient::new(channel.clone()),
                semaphore: SemaphoreServiceClient::new(channel.clone()),
                ratelimit: RateLimitServiceClient::new(channel.clone()),
                health: HealthClient::new(channel),
            })),
            _ => {
                let messages = if side == Side::Direct && scenario.contended() {
                    let channel = if scenario.is_lock() {
                        &lock_keys.channel
                    } else {
                        &sem_keys.channel
                    };
                    let mut pubsub = stack
                        .redis_client
                        .get_async_pubsub()
                        .await
                        .expect("a pub/sub connection");
                    pubsub.subscribe(channel).await.expect("SUBSCRIBE");
                    Some(pubsub.into_on_message())
                } else {
                    None
                };
                Target::Direct {
                    conn: stack.conns[id % stack.conns.len()].clone(),
                    scripts: Arc::clone(&stack.scripts),
                    polling: side == Side::Polling,
                    messages,
                }
            }
        };
        Worker {
            id,
            scenario,
            name,
            lock_keys,
            sem_keys,
            shared,
            target,
            n: 0,
        }
    }

    async fn run(mut self, gate: Arc<Gate>) -> (usize, Rec) {
        let mut rec = Rec::new();
        while Instant::now() < gate.warm_until {
            self.step(&mut rec).await;
        }
        gate.paused.wait().await;
        gate.go.wait().await;
        let until = *gate.until.get().expect("the window is set before it opens");
        let mut rec = Rec::new();
        while Instant::now() < until {
            self.step(&mut rec).await;
        }
        (self.id, rec)
    }

    async fn step(&mut self, rec: &mut Rec) {
        match self.scenario {
            Scenario::RateLimit => self.check(rec).await,
            Scenario::Health => self.health(rec).await,
            _ => self.cycle(rec).await,
        }
    }

    /// Acquire (waiting when contended), then release at once.
    async fn cycle(&mut self, rec: &mut Rec) {
        let contended = self.scenario.contended();
        let semaphore = !self.scenario.is_lock();
        let wait = if contended {
            CONTENDED_WAIT
        } else {
            Duration::ZERO
        };
        let started = Instant::now();
        let acquired = if semaphore {
            self.semaphore_acquire(wait).await
        } else {
            self.lock_acquire(wait).await
        };
        let granted_at = Instant::now();
        rec.call(granted_at - started);
        let token = match acquired {
            Ok(Some(token)) => token,
            Ok(None) => {
                rec.timeouts += 1;
                return;
            }
            Err(e) => return rec.error(e),
        };
        if contended && !semaphore {
            self.shared.handoff(granted_at, self.id, rec);
        }
        let released_at = Instant::now();
        if contended && !semaphore {
            self.shared.released(released_at, self.id);
        }
        let released = if semaphore {
            self.semaphore_release(&token).await
        } else {
            self.lock_release(&token).await
        };
        rec.call(released_at.elapsed());
        match released {
            Ok(()) => rec.ops += 1,
            Err(e) => rec.error(e),
        }
    }

    /// One rate limit decision on one of [`RATELIMIT_KEYS`] keys.
    async fn check(&mut self, rec: &mut Rec) {
        let key = format!(
            "bench:{}",
            (u64::try_from(self.id).unwrap_or(0) * 7919 + self.n) % RATELIMIT_KEYS
        );
        self.n += 1;
        let started = Instant::now();
        let allowed = match &mut self.target {
            Target::Direct { conn, scripts, .. } => {
                let rate = ratelimit_rate();
                let redis_key = ratelimit::limiter_key(DIRECT_PREFIX, "rl", &key, Algorithm::Gcra);
                let invocation = ratelimit::scripts::Check {
                    key: &redis_key,
                    rate: &rate,
                    cost: 1,
                    not_after: 0,
                }
                .invocation(&scripts.gcra);
                bounded("gcra.lua", invocation.invoke_async::<Vec<i64>>(conn))
                    .await
                    .and_then(|r| {
                        ratelimit::scripts::decision(&rate, &r)
                            .map(|d| d.allowed)
                            .ok_or_else(|| format!("gcra.lua replied {r:?}"))
                    })
            }
            Target::Grpc(clients) => {
                let request = pb::RateLimitServiceCheckRequest {
                    key,
                    limit: RATELIMIT_LIMIT,
                    period: Some(ms(1000)),
                    cost: None,
                    algorithm: pb::RateLimitAlgorithm::Gcra.into(),
                    burst: 0,
                };
                bounded("Check", clients.ratelimit.check(request))
                    .await
                    .and_then(|r| {
                        let r = r.into_inner();
                        if r.decided_by() == pb::RateLimitDecidedBy::Redis {
                            Ok(r.allowed)
                        } else {
                            Err(format!("decided by {:?}, not Redis", r.decided_by()))
                        }
                    })
            }
        };
        rec.call(started.elapsed());
        match allowed {
            Ok(true) => rec.ops += 1,
            Ok(false) => rec.error("a check was refused".to_owned()),
            Err(e) => rec.error(e),
        }
    }

    /// One gRPC health check (Baton only: it touches no Redis).
    async fn health(&mut self, rec: &mut Rec) {
        let Target::Grpc(clients) = &mut self.target else {
            unreachable!("the health check runs through Baton only")
        };
        let started = Instant::now();
        let answer = bounded(
            "Health/Check",
            clients.health.check(HealthCheckRequest {
                service: "liveness".to_owned(),
            }),
        )
        .await;
        rec.call(started.elapsed());
        match answer {
            Ok(_) => rec.ops += 1,
            Err(e) => rec.error(e),
        }
    }

    // --- locks -----------------------------------------------------------------------------

    async fn lock_acquire(&mut self, wait: Duration) -> Result<Option<String>, String> {
        let fair = self.scenario == Scenario::LockFair;
        let polling = match &mut self.target {
            Target::Grpc(clients) => {
                let request = pb::LockServiceAcquireRequest {
                    name: self.name.clone(),
                    ttl: Some(ms(millis(TTL))),
                    wait_timeout: (!wait.is_zero()).then(|| ms(millis(wait))),
                    fair,
                    ..Default::default()
                };
                let response = bounded("Acquire", clients.lock.acquire(request))
                    .await?
                    .into_inner();
                return Ok(response
                    .acquired
                    .then(|| response.lease.map(|l| l.token).unwrap_or_default()));
            }
            Target::Direct { polling, .. } => *polling,
        };
        // As Baton does it: one try; when the caller waits, try again as a registered waiter on
        // every release message meant for it, when what keeps it out may change, and at least
        // every third of the registration lease (which renews it), until the deadline; a wait
        // that ends without a grant is abandoned.
        let token = token();
        let deadline = Instant::now() + wait;
        self.drain_messages();
        if let Try::Granted(t) = self.lock_try(&token, "", Duration::ZERO, fair).await? {
            return Ok(Some(t));
        }
        if wait.is_zero() {
            return Ok(None);
        }
        if polling {
            // redis-py's default: try, sleep, try again (no registration, no messages).
            loop {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(None);
                }
                sleep_until((now + POLL_INTERVAL).min(deadline)).await;
                if let Try::Granted(t) = self.lock_try(&token, "", Duration::ZERO, fair).await? {
                    return Ok(Some(t));
                }
            }
        }
        let waiter = uuid::Uuid::new_v4().simple().to_string();
        let renew_every = baton::lease::QUEUE_LEASE / 3;
        loop {
            self.drain_messages();
            let left = deadline.saturating_duration_since(Instant::now());
            let change = match self.lock_try(&token, &waiter, left, fair).await? {
                Try::Granted(t) => return Ok(Some(t)),
                Try::Busy(change) => change,
            };
            let now = Instant::now();
            if now >= deadline {
                self.lock_abandon(&waiter).await?;
                return Ok(None);
            }
            let retry_in = change.map_or(renew_every, |c| c.min(renew_every));
            let wake = (now + retry_in).min(deadline);
            let addressed = fair.then_some(waiter.as_str());
            self.wait_message(wake, addressed).await;
        }
    }

    /// One run of `acquire.lua` with the KEYS and ARGV Baton passes (exclusive, anonymous).
    async fn lock_try(
        &mut self,
        token: &str,
        waiter: &str,
        left: Duration,
        fair: bool,
    ) -> Result<Try, String> {
        let Target::Direct { conn, scripts, .. } = &mut self.target else {
            unreachable!("direct only")
        };
        let invocation = lock::scripts::Acquire {
            owner: "",
            token,
            ttl: TTL,
            waiter,
            wait_left: left,
            fair,
            mode: Mode::Exclusive,
            idempotency_key: "",
        }
        .invocation(&scripts.lock_acquire, &self.lock_keys);
        let reply: Vec<Value> = bounded("acquire.lua", invocation.invoke_async(conn)).await?;
        match reply.as_slice() {
            [granted, t, _fence, _remaining, _count, _mode] if int(granted)? == 1 => {
                Ok(Try::Granted(match t {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => token.to_owned(),
                }))
            }
            // Leases and registrations end without a message; one more millisecond lets Redis's
            // clock pass the expiry.
            [_, _remaining, change] => Ok(Try::Busy(
                lease_ms(int(change)?).map(|c| c + Duration::from_millis(1)),
            )),
            other => Err(format!("acquire.lua replied {other:?}")),
        }
    }

    /// `abandon.lua`: a waiter that stops waiting leaves, waking those it held back.
    async fn lock_abandon(&mut self, waiter: &str) -> Result<(), String> {
        let Target::Direct { conn, scripts, .. } = &mut self.target else {
            unreachable!("direct only")
        };
        let invocation =
            lock::scripts::abandon(&scripts.lock_abandon, &self.lock_keys, waiter, None);
        bounded("abandon.lua", invocation.invoke_async::<i64>(conn))
            .await
            .map(drop)
    }

    async fn lock_release(&mut self, token: &str) -> Result<(), String> {
        match &mut self.target {
            Target::Grpc(clients) => {
                let request = pb::LockServiceReleaseRequest {
                    name: self.name.clone(),
                    token: token.to_owned(),
                };
                let released = bounded("Release", clients.lock.release(request)).await?;
                if released.into_inner().was_held {
                    Ok(())
                } else {
                    Err("Release: the lease was not held".into())
                }
            }
            Target::Direct { conn, scripts, .. } => {
                let invocation = lock::scripts::Release {
                    token,
                    clean_up: None,
                }
                .invocation(&scripts.lock_release, &self.lock_keys);
                let reply: Vec<i64> = bounded("release.lua", invocation.invoke_async(conn)).await?;
                if reply.first() == Some(&1) {
                    Ok(())
                } else {
                    Err("release.lua: the lease was not held".into())
                }
            }
        }
    }

    // --- semaphores ------------------------------------------------------------------------

    async fn semaphore_acquire(&mut self, wait: Duration) -> Result<Option<String>, String> {
        if let Target::Grpc(clients) = &mut self.target {
            let response = bounded(
                "Acquire",
                clients
                    .semaphore
                    .acquire(pb::SemaphoreServiceAcquireRequest {
                        name: self.name.clone(),
                        limit: SEMAPHORE_LIMIT,
                        permits: 1,
                        ttl: Some(ms(millis(TTL))),
                        wait_timeout: (!wait.is_zero()).then(|| ms(millis(wait))),
                        ..Default::default()
                    }),
            )
            .await?
            .into_inner();
            return Ok(response
                .acquired
                .then(|| response.permit.map(|p| p.token).unwrap_or_default()));
        }
        let token = token();
        let deadline = Instant::now() + wait;
        self.drain_messages();
        if let Try::Granted(_) = self.semaphore_try(&token, "", Duration::ZERO).await? {
            return Ok(Some(token));
        }
        if wait.is_zero() {
            return Ok(None);
        }
        let waiter = uuid::Uuid::new_v4().simple().to_string();
        loop {
            self.drain_messages();
            let left = deadline.saturating_duration_since(Instant::now());
            let retry_in = match self.semaphore_try(&token, &waiter, left).await? {
                Try::Granted(_) => return Ok(Some(token)),
                Try::Busy(retry_in) => retry_in,
            };
            let now = Instant::now();
            if now >= deadline {
                let Target::Direct { conn, scripts, .. } = &mut self.target else {
                    unreachable!("direct only")
                };
                let invocation = semaphore::scripts::abandon(
                    &scripts.sem_abandon,
                    &self.sem_keys,
                    &waiter,
                    None,
                );
                bounded("abandon.lua", invocation.invoke_async::<i64>(conn)).await?;
                return Ok(None);
            }
            let wake = retry_in.map_or(deadline, |r| now + r).min(deadline);
            self.wait_message(wake, None).await;
        }
    }

    /// One run of the semaphore's `acquire.lua` with the KEYS and ARGV Baton passes.
    async fn semaphore_try(
        &mut self,
        token: &str,
        waiter: &str,
        left: Duration,
    ) -> Result<Try, String> {
        let Target::Direct { conn, scripts, .. } = &mut self.target else {
            unreachable!("direct only")
        };
        let invocation = semaphore::scripts::Acquire {
            token,
            owner: "",
            permits: 1,
            limit: SEMAPHORE_LIMIT,
            ttl: TTL,
            waiter,
            fair: false,
            wait_left: left,
            idempotency_key: "",
        }
        .invocation(&scripts.sem_acquire, &self.sem_keys);
        let reply: Vec<Value> = bounded("acquire.lua", invocation.invoke_async(conn)).await?;
        match reply.as_slice() {
            [granted, ..] if int(granted)? == 1 => Ok(Try::Granted(token.to_owned())),
            [_, _available, _expiry, wake] => Ok(Try::Busy(
                lease_ms(int(wake)?).map(|w| w + Duration::from_millis(1)),
            )),
            other => Err(format!("acquire.lua replied {other:?}")),
        }
    }

    async fn semaphore_release(&mut self, token: &str) -> Result<(), String> {
        match &mut self.target {
            Target::Grpc(clients) => {
                let released = bounded(
                    "Release",
                    clients
                        .semaphore
                        .release(pb::SemaphoreServiceReleaseRequest {
                            name: self.name.clone(),
                            token: token.to_owned(),
                        }),
                )
                .await?;
                if released.into_inner().was_held {
                    Ok(())
                } else {
                    Err("Release: the permit was not held".into())
                }
            }
            Target::Direct { conn, scripts, .. } => {
                let invocation =
                    semaphore::scripts::release(&scripts.sem_release, &self.sem_keys, token, None);
                let held: i64 = bounded("release.lua", invocation.invoke_async(conn)).await?;
                if held == 1 {
                    Ok(())
                } else {
                    Err("release.lua: the permit was not held".into())
                }
            }
        }
    }

    // --- waiting for release messages ------------------------------------------------------

    /// Forgets the messages received so far (what Baton's subscription does when it arms).
    fn drain_messages(&mut self) {
        if let Target::Direct {
            messages: Some(messages),
            ..
        } = &mut self.target
        {
            while let Some(Some(_)) = messages.next().now_or_never() {}
        }
    }

    /// Waits for a release message meant for this client, or `wake`, whichever comes first. A
    /// message `@ID` is addressed to the waiter ID alone (the fair queue's head); every other
    /// message is for everyone (what Baton's notifier does).
    async fn wait_message(&mut self, wake: Instant, waiter: Option<&str>) {
        let Target::Direct {
            messages: Some(messages),
            ..
        } = &mut self.target
        else {
            return sleep_until(wake).await;
        };
        let sleep = sleep_until(wake);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                m = messages.next() => {
                    let Some(m) = m else { return sleep.await };
                    match m.get_payload_bytes().strip_prefix(b"@") {
                        Some(to) if Some(to) != waiter.map(str::as_bytes) => continue,
                        _ => return,
                    }
                }
                () = &mut sleep => return,
            }
        }
    }
}

/// Runs one window of `scenario` with `clients` clients on `side`.
async fn measure(
    options: &Options,
    probe: &mut Probe,
    stack: &Stack,
    scenario: Scenario,
    clients: usize,
    side: Side,
) -> Record {
    let shared = Arc::new(Shared {
        last_release: Mutex::new(None),
    });
    let mut workers = Vec::with_capacity(clients);
    for id in 0..clients {
        let channel = match side {
            Side::Baton(Transport::Tcp) => Some(stack.tcp[id % stack.tcp.len()].clone()),
            Side::Baton(Transport::Uds) => Some(stack.uds[id % stack.uds.len()].clone()),
            // A connection of its own for each client.
            Side::Baton(Transport::TcpOwn) => Some(testkit::channel(stack.baton).await),
            Side::Direct | Side::Polling => None,
        };
        workers.push(Worker::new(id, scenario, side, stack, channel, Arc::clone(&shared)).await);
    }
    let gate = Arc::new(Gate {
        warm_until: Instant::now() + options.warmup,
        paused: Barrier::new(clients + 1),
        go: Barrier::new(clients + 1),
        until: OnceLock::new(),
    });
    let mut tasks = JoinSet::new();
    for worker in workers {
        tasks.spawn(worker.run(Arc::clone(&gate)));
    }
    within(
        options.warmup + Duration::from_secs(60),
        gate.paused.wait(),
        "the clients to finish warming up",
    )
    .await;
    *shared
        .last_release
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = None;
    let mark = probe.mark().await;
    gate.until
        .set(Instant::now() + options.window)
        .expect("the window is set once");
    gate.go.wait().await;
    let mut recs: Vec<(usize, Rec)> = Vec::with_capacity(clients);
    while let Some(joined) = within(
        options.window + Duration::from_secs(60),
        tasks.join_next(),
        "the clients to finish the window",
    )
    .await
    {
        recs.push(joined.expect("a client task"));
    }
    let mut record = Record {
        scenario: scenario.name().to_owned(),
        clients,
        side: side.name().to_owned(),
        ..Record::default()
    };
    probe.usage(mark, &mut record).await;
    recs.sort_by_key(|(id, _)| *id);
    let grants: Vec<u64> = recs.iter().map(|(_, r)| r.ops).collect();
    let mut all = Rec::new();
    for (_, r) in recs {
        all.ops += r.ops;
        all.calls += r.calls;
        all.errors += r.errors;
        all.timeouts += r.timeouts;
        all.regrants += r.regrants;
        if all.first_error.is_none() {
            all.first_error = r.first_error;
        }
        all.latency.add(&r.latency).expect("histograms add");
        all.handoff.add(&r.handoff).expect("histograms add");
        all.handoff_other
            .add(&r.handoff_other)
            .expect("histograms add");
    }
    let secs = record.get(names::SECS).unwrap_or(1.0).max(1e-9);
    record.set(names::OPS, all.ops as f64);
    record.set(names::CALLS, all.calls as f64);
    record.set(names::ERRORS, all.errors as f64);
    record.set(names::TIMEOUTS, all.timeouts as f64);
    record.set(names::RATE, all.ops as f64 / secs);
    stats::latency(&mut record, &all.latency);
    if scenario.contended() {
        record.set(names::JAIN, stats::jain(&grants));
    }
    if !all.handoff.is_empty() {
        record.set(
            names::HANDOFF_P50,
            all.handoff.value_at_quantile(0.5) as f64,
        );
        record.set(
            names::HANDOFF_P99,
            all.handoff.value_at_quantile(0.99) as f64,
        );
        record.set(
            names::REGRANTS,
            all.regrants as f64 / all.handoff.len() as f64,
        );
    }
    if !all.handoff_other.is_empty() {
        record.set(
            names::OTHER_P50,
            all.handoff_other.value_at_quantile(0.5) as f64,
        );
        record.set(
            names::OTHER_P99,
            all.handoff_other.value_at_quantile(0.99) as f64,
        );
    }
    record.first_error = all.first_error;
    record
}
