//! The coordination primitives through Baton against the same Redis work done directly, in one run.
//!
//! Starts a private `redis-server` (no persistence) and the real `baton` binary as a separate
//! process (its CPU time and resident memory are read from `/proc`), serving on TCP and on a Unix
//! socket. For each scenario and number of concurrent clients (closed loops, one call in flight
//! each) it runs, one after the other on the same Redis:
//!
//! - **direct**: the same `.lua` scripts Baton runs (`include_str!` from `src/`), with the same
//!   KEYS and ARGV Baton sends, through redis-rs `Script::invoke_async` (EVALSHA, loading on
//!   `NOSCRIPT`) over as many multiplexed connections as Baton's pool; clients that wait do it as a
//!   client library without Baton would: each client keeps its own pub/sub connection subscribed
//!   to the lock's (or semaphore's) release channel and tries again on every message, or when the
//!   holder's lease ends. For the contended lock it also runs a **polling** client like redis-py's
//!   default (try, sleep 100 ms, try again);
//! - **Baton over TCP** and **Baton over the Unix socket**: gRPC calls spread over a few HTTP/2
//!   connections.
//!
//! Scenarios: lock acquire + release, each client on its own name; one contended lock, non-fair and
//! fair (handoff latency from a holder's release to the next grant, grants per second, Jain's
//! fairness index over the clients' grants); semaphore (limit 5) acquire + release, uncontended and contended; rate
//! limit `Check` (GCRA); 10,000 leases held with keepalive (`LockService/Hold` streams against
//! direct refresh loops): Redis calls per second, Baton CPU and resident memory. Every measured
//! window resets Redis's command statistics first (`CONFIG RESETSTAT`) and reads them after
//! (`INFO commandstats`), so script calls per operation are counted by Redis itself; it also reads
//! the CPU time of Baton (`/proc/PID/stat`), of Redis (`INFO cpu`) and of this load generator
//! (`/proc/self/stat`). Autocomplete has its own benchmark (`benches/autocomplete.rs`).
//!
//! ```sh
//! cargo bench --bench baton                          # the full run, about 10 minutes
//! cargo bench --bench baton -- --quick               # one repeat, short windows
//! cargo bench --bench baton -- --scenario lock,leases --clients 1,64 --repeat 5 --seconds 5
//! ```
//!
//! Flags: `--repeat N` (3), `--seconds S` per measured window (2.5), `--warmup S` (0.5),
//! `--clients 1,16,64` (contended scenarios use the counts of 2 and more),
//! `--scenario lock,lock-contended,lock-fair,semaphore,semaphore-contended,ratelimit,leases`,
//! `--transport tcp,uds`, `--leases N` (10000), `--lease-ttl-ms N` (10000), `--channels N` (4),
//! `--pool N` (Baton's Redis pool and the direct side's connections, 4), `--quick` (one repeat,
//! 1 s windows, at most 2000 leases). The Markdown report goes to stdout and to `$CARGO_TARGET_DIR/bench-baton.md`
//! (`target/bench-baton.md` by default).
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it is a smoke run of a few seconds
//! that asserts every scenario makes progress on both sides and that Redis counts exactly the
//! script calls the scripts imply (one EVALSHA per acquire and one per release when uncontended).

use testkit as support;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::PathBuf,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use baton::{
    lock::{self, Mode, scripts::LockKeys},
    proto::v1::{
        self as pb, lock_service_client::LockServiceClient,
        lock_service_hold_response::Event as HoldEvent,
        rate_limit_service_client::RateLimitServiceClient,
        semaphore_service_client::SemaphoreServiceClient,
    },
    semaphore::{self, scripts::SemaphoreKeys},
};
use futures::{FutureExt, StreamExt};
use hdrhistogram::Histogram;
use redis::{Script, Value, aio::MultiplexedConnection};
use support::{BatonProcess, RedisServer, ms, within};
use tokio::{
    sync::Barrier,
    task::JoinSet,
    time::{Instant, sleep, sleep_until},
};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient};

/// Lease ttl of every acquisition in the unary scenarios (released long before it ends).
const TTL: Duration = Duration::from_secs(10);
/// Longest wait of a contended acquisition; a wait that ends without a grant counts as a timeout.
const CONTENDED_WAIT: Duration = Duration::from_secs(5);
/// The semaphores' limit.
const SEMAPHORE_LIMIT: u32 = 5;
/// The polling client's pause between tries (redis-py's `Lock(sleep=0.1)` default).
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Keys the rate limit load is spread over.
const RATELIMIT_KEYS: u64 = 1000;
/// A rate limit no key reaches, so every decision runs the whole script and writes.
const RATELIMIT_LIMIT: u64 = 1_000_000_000;
/// `Hold` streams opening at the same time while the leases are set up.
const LEASE_OPENING: usize = 256;
/// HTTP/2 connections the `Hold` streams are spread over. Baton's server sets no
/// `SETTINGS_MAX_CONCURRENT_STREAMS` (tonic passes none to hyper), so the client may open any
/// number of streams per connection.
const LEASE_CHANNELS: usize = 8;
/// Key prefix of the direct side (Baton's is the default `baton:`).
const DIRECT_PREFIX: &str = "direct:";
/// Baton's key prefix.
const BATON_PREFIX: &str = "baton:";
/// Longest time one call of the load generator may take before it counts as an error.
const CALL_LIMIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// What to run
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Lock,
    LockContended,
    LockFair,
    Semaphore,
    SemaphoreContended,
    RateLimit,
    Leases,
}

impl Kind {
    const ALL: [Kind; 7] = [
        Kind::Lock,
        Kind::LockContended,
        Kind::LockFair,
        Kind::Semaphore,
        Kind::SemaphoreContended,
        Kind::RateLimit,
        Kind::Leases,
    ];

    fn flag(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::LockContended => "lock-contended",
            Kind::LockFair => "lock-fair",
            Kind::Semaphore => "semaphore",
            Kind::SemaphoreContended => "semaphore-contended",
            Kind::RateLimit => "ratelimit",
            Kind::Leases => "leases",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Kind::Lock => "lock acquire + release, own name",
            Kind::LockContended => "lock, one name, acquire (wait) + release",
            Kind::LockFair => "fair lock, one name, acquire (wait) + release",
            Kind::Semaphore => "semaphore (limit 5) acquire + release, own name",
            Kind::SemaphoreContended => "semaphore (limit 5), one name, acquire (wait) + release",
            Kind::RateLimit => "rate limit `Check` (GCRA, 1000 keys)",
            Kind::Leases => "leases held with keepalive",
        }
    }

    fn contended(self) -> bool {
        matches!(
            self,
            Kind::LockContended | Kind::LockFair | Kind::SemaphoreContended
        )
    }

    fn is_lock(self) -> bool {
        matches!(self, Kind::Lock | Kind::LockContended | Kind::LockFair)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Transport {
    Tcp,
    Uds,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Side {
    Direct,
    Polling,
    Baton(Transport),
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Direct => "direct",
            Side::Polling => "direct, polling 100 ms",
            Side::Baton(Transport::Tcp) => "Baton, TCP",
            Side::Baton(Transport::Uds) => "Baton, Unix socket",
        }
    }

    fn is_baton(self) -> bool {
        matches!(self, Side::Baton(_))
    }
}

#[derive(Debug, Clone)]
struct Options {
    full: bool,
    repeat: usize,
    window: Duration,
    warmup: Duration,
    clients: Vec<usize>,
    kinds: Vec<Kind>,
    transports: Vec<Transport>,
    leases: usize,
    lease_ttl: Duration,
    channels: usize,
    pool: usize,
    command: String,
}

impl Options {
    fn parse() -> Result<Self, String> {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let full = args.iter().any(|a| a == "--bench");
        let mut o = if full {
            Options {
                full,
                repeat: 3,
                window: Duration::from_millis(2500),
                warmup: Duration::from_millis(500),
                clients: vec![1, 16, 64],
                kinds: Kind::ALL.to_vec(),
                transports: vec![Transport::Tcp, Transport::Uds],
                leases: 10_000,
                lease_ttl: Duration::from_secs(10),
                channels: 4,
                pool: usize::try_from(baton::config::DEFAULT_REDIS_POOL_SIZE).unwrap_or(4),
                command: String::new(),
            }
        } else {
            // The smoke run: a few seconds in total, every scenario on both sides.
            Options {
                full,
                repeat: 1,
                window: Duration::from_millis(150),
                warmup: Duration::from_millis(60),
                clients: vec![3],
                kinds: Kind::ALL.to_vec(),
                transports: vec![Transport::Tcp, Transport::Uds],
                leases: 100,
                lease_ttl: Duration::from_millis(300),
                channels: 2,
                pool: 2,
                command: String::new(),
            }
        };
        let list = |v: &str| -> Vec<String> { v.split(',').map(|s| s.trim().to_owned()).collect() };
        let mut shown = Vec::new();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            if arg == "--bench" {
                continue;
            }
            shown.push(arg.clone());
            if arg == "--quick" {
                o.repeat = 1;
                o.window = Duration::from_secs(1);
                o.warmup = Duration::from_millis(300);
                o.leases = o.leases.min(2000);
                continue;
            }
            let mut value = || -> Result<String, String> {
                let v = it.next().ok_or(format!("{arg} needs a value"))?;
                shown.push(v.clone());
                Ok(v.clone())
            };
            let num = |v: String| -> Result<f64, String> {
                v.parse::<f64>()
                    .map_err(|e| format!("{arg}: {v:?}: {e}"))
                    .and_then(|n| {
                        if n.is_finite() && n > 0.0 {
                            Ok(n)
                        } else {
                            Err(format!("{arg} must be positive"))
                        }
                    })
            };
            match arg.as_str() {
                "--repeat" => o.repeat = num(value()?)? as usize,
                "--seconds" => o.window = Duration::from_secs_f64(num(value()?)?),
                "--warmup" => o.warmup = Duration::from_secs_f64(num(value()?)?),
                "--leases" => o.leases = num(value()?)? as usize,
                "--lease-ttl-ms" => {
                    o.lease_ttl = Duration::from_millis((num(value()?)? as u64).max(100));
                }
                "--channels" => o.channels = (num(value()?)? as usize).max(1),
                "--pool" => o.pool = (num(value()?)? as usize).max(1),
                "--clients" => {
                    o.clients = list(&value()?)
                        .iter()
                        .map(|c| {
                            c.parse::<usize>()
                                .map_err(|e| format!("--clients {c}: {e}"))
                        })
                        .collect::<Result<_, _>>()?;
                }
                "--scenario" => {
                    o.kinds = list(&value()?)
                        .iter()
                        .map(|s| {
                            Kind::ALL
                                .into_iter()
                                .find(|k| k.flag() == s)
                                .ok_or(format!("unknown scenario {s:?}"))
                        })
                        .collect::<Result<_, _>>()?;
                }
                "--transport" => {
                    o.transports = list(&value()?)
                        .iter()
                        .map(|t| match t.as_str() {
                            "tcp" => Ok(Transport::Tcp),
                            "uds" | "unix" => Ok(Transport::Uds),
                            _ => Err(format!("unknown transport {t:?}")),
                        })
                        .collect::<Result<_, _>>()?;
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        o.repeat = o.repeat.max(1);
        o.clients.retain(|c| *c > 0);
        o.command = if shown.is_empty() {
            "cargo bench --bench baton".to_owned()
        } else {
            format!("cargo bench --bench baton -- {}", shown.join(" "))
        };
        Ok(o)
    }

    /// Client counts of `kind`: contended scenarios need at least two clients.
    fn clients_of(&self, kind: Kind) -> Vec<usize> {
        self.clients
            .iter()
            .copied()
            .filter(|c| !kind.contended() || *c >= 2)
            .collect()
    }

    fn sides_of(&self, kind: Kind) -> Vec<Side> {
        let mut sides = vec![Side::Direct];
        if kind == Kind::LockContended {
            sides.push(Side::Polling);
        }
        sides.extend(self.transports.iter().map(|t| Side::Baton(*t)));
        sides
    }

    /// The lease window: one ttl, a whole number of renewal periods for a renewal every third
    /// (the direct side) or every quarter (Baton's keepalive) of the ttl, so each lease renews a
    /// whole number of times in it.
    fn lease_window(&self) -> Duration {
        self.lease_ttl
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring: CPU, memory, Redis statistics
// ---------------------------------------------------------------------------------------------

/// Clock ticks per second of `/proc/PID/stat` times (`getconf CLK_TCK`; 100 if it cannot run).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// User + system CPU seconds of process `pid` (`"self"` for this one).
fn process_cpu(pid: &str, ticks: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/stat: {e}"));
    // The command name (field 2) may hold spaces; fields 14 and 15 count from the state after it.
    let after = &stat[stat.rfind(')').expect("a command name in /proc/PID/stat") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| fields[n - 3].parse::<f64>().expect("a tick count");
    (field(14) + field(15)) / ticks
}

/// Resident memory of process `pid` in bytes (`VmRSS`).
fn resident(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

struct Probe {
    admin: MultiplexedConnection,
    baton: u32,
    ticks: f64,
}

struct Mark {
    at: Instant,
    baton: f64,
    redis: f64,
    load: f64,
}

/// What one measured window cost.
#[derive(Debug, Clone, Default)]
struct Usage {
    secs: f64,
    baton_cpu: f64,
    redis_cpu: f64,
    load_cpu: f64,
    baton_rss: u64,
    commands: BTreeMap<String, u64>,
}

impl Usage {
    fn calls(&self, command: &str) -> u64 {
        self.commands.get(command).copied().unwrap_or(0)
    }

    /// EVALSHA + EVAL: the script calls clients sent.
    fn scripts(&self) -> u64 {
        self.calls("evalsha") + self.calls("eval")
    }
}

impl Probe {
    async fn redis_cpu(&mut self) -> f64 {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut self.admin)
            .await
            .expect("INFO cpu");
        info.lines()
            .filter_map(|l| {
                l.strip_prefix("used_cpu_sys:")
                    .or_else(|| l.strip_prefix("used_cpu_user:"))
            })
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum()
    }

    /// Resets Redis's command statistics and reads every CPU clock.
    async fn mark(&mut self) -> Mark {
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.admin)
            .await
            .expect("CONFIG RESETSTAT");
        let redis = self.redis_cpu().await;
        Mark {
            at: Instant::now(),
            baton: process_cpu(&self.baton.to_string(), self.ticks),
            redis,
            load: process_cpu("self", self.ticks),
        }
    }

    async fn usage(&mut self, mark: Mark) -> Usage {
        let secs = mark.at.elapsed().as_secs_f64();
        let baton_cpu = process_cpu(&self.baton.to_string(), self.ticks) - mark.baton;
        let load_cpu = process_cpu("self", self.ticks) - mark.load;
        let redis_cpu = self.redis_cpu().await - mark.redis;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.admin)
            .await
            .expect("INFO commandstats");
        let commands = info
            .lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest.split(',').find_map(|f| f.strip_prefix("calls="))?;
                Some((name.to_owned(), calls.parse().ok()?))
            })
            .collect();
        Usage {
            secs,
            baton_cpu,
            redis_cpu,
            load_cpu,
            baton_rss: resident(self.baton),
            commands,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Recording
// ---------------------------------------------------------------------------------------------

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 120_000_000, 3).expect("histogram bounds")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
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

// ---------------------------------------------------------------------------------------------
// The two sides
// ---------------------------------------------------------------------------------------------

/// The scripts Baton runs, for the direct side.
struct Scripts {
    lock_acquire: Script,
    lock_release: Script,
    lock_refresh: Script,
    lock_abandon: Script,
    sem_acquire: Script,
    sem_release: Script,
    sem_abandon: Script,
    gcra: Script,
}

/// A script as Baton loads it on a single Redis (`Redis::script`): wake-ups go out with `PUBLISH`.
fn script(source: &str) -> Script {
    Script::new(&format!("local PUBLISH = 'PUBLISH'\n{source}"))
}

impl Scripts {
    fn new() -> Self {
        Self {
            lock_acquire: script(lock::scripts::ACQUIRE),
            lock_release: script(lock::scripts::RELEASE),
            lock_refresh: script(lock::scripts::REFRESH),
            lock_abandon: script(lock::scripts::ABANDON),
            sem_acquire: script(semaphore::scripts::ACQUIRE),
            sem_release: script(semaphore::scripts::RELEASE),
            sem_abandon: script(semaphore::scripts::ABANDON),
            gcra: Script::new(include_str!("../src/ratelimit/gcra.lua")),
        }
    }
}

/// Everything a window's clients connect through.
struct Stack {
    redis_client: redis::Client,
    conns: Vec<MultiplexedConnection>,
    scripts: Arc<Scripts>,
    tcp: Vec<Channel>,
    uds: Vec<Channel>,
}

impl Stack {
    fn channels(&self, transport: Transport) -> &[Channel] {
        match transport {
            Transport::Tcp => &self.tcp,
            Transport::Uds => &self.uds,
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
}

/// The outcome of one direct acquisition attempt.
enum Try {
    Granted(String),
    /// Busy; when to look again without a message (the holder's expiry), if ever.
    Busy(Option<Duration>),
}

/// A call of `script` with `keys`, ready for its ARGV.
fn int(v: &Value) -> Result<i64, String> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::BulkString(b) => String::from_utf8_lossy(b)
            .parse()
            .map_err(|e| format!("not a number: {e}")),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn lease_ms(v: i64) -> Option<Duration> {
    u64::try_from(v).ok().map(Duration::from_millis)
}

fn token() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

async fn bounded<T, E: std::fmt::Display>(
    what: &str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_LIMIT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {CALL_LIMIT:?}")),
    }
}

/// An exclusive lock acquisition without an owner; `fair` waits in the FIFO queue.
/// (`..Default::default()`: fields may still be appended to the proto.)
fn lock_request(name: &str, wait: Duration, fair: bool) -> pb::LockServiceAcquireRequest {
    pb::LockServiceAcquireRequest {
        name: name.to_owned(),
        ttl: Some(ms(millis(TTL))),
        wait_timeout: (!wait.is_zero()).then(|| ms(millis(wait))),
        fair,
        ..Default::default()
    }
}

/// A lock release request (`..Default::default()`, as in [`lock_request`]).
#[allow(clippy::needless_update)]
fn release_request(name: &str, token: &str) -> pb::LockServiceReleaseRequest {
    pb::LockServiceReleaseRequest {
        name: name.to_owned(),
        token: token.to_owned(),
        ..Default::default()
    }
}

/// A `Hold` request for an exclusive lease of `ttl` that does not wait.
fn hold_request(name: String, ttl: Duration) -> pb::LockServiceHoldRequest {
    pb::LockServiceHoldRequest {
        name,
        ttl: Some(ms(millis(ttl))),
        wait_timeout: None,
        ..Default::default()
    }
}

/// One closed-loop client.
struct Worker {
    id: usize,
    kind: Kind,
    name: String,
    lock_keys: LockKeys,
    sem_keys: SemaphoreKeys,
    shared: Arc<Shared>,
    target: Target,
    n: u64,
}

impl Worker {
    async fn new(id: usize, kind: Kind, side: Side, stack: &Stack, shared: Arc<Shared>) -> Worker {
        let name = if kind.contended() {
            "shared".to_owned()
        } else {
            format!("own-{id}")
        };
        let prefix = if side.is_baton() {
            BATON_PREFIX
        } else {
            DIRECT_PREFIX
        };
        let lock_keys = LockKeys::new(prefix, &name);
        let sem_keys = SemaphoreKeys::new(prefix, &name);
        let target = match side {
            Side::Direct | Side::Polling => {
                let messages = if side == Side::Direct && kind.contended() {
                    let channel = if kind.is_lock() {
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
            Side::Baton(transport) => {
                let channels = stack.channels(transport);
                let channel = channels[id % channels.len()].clone();
                Target::Grpc(Box::new(Clients {
                    lock: LockServiceClient::new(channel.clone()),
                    semaphore: SemaphoreServiceClient::new(channel.clone()),
                    ratelimit: RateLimitServiceClient::new(channel),
                }))
            }
        };
        Worker {
            id,
            kind,
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
        match self.kind {
            Kind::Lock
            | Kind::LockContended
            | Kind::LockFair
            | Kind::Semaphore
            | Kind::SemaphoreContended => self.cycle(rec).await,
            Kind::RateLimit => self.check(rec).await,
            Kind::Leases => unreachable!("leases have their own driver"),
        }
    }

    /// Acquire (waiting when contended), then release at once.
    async fn cycle(&mut self, rec: &mut Rec) {
        let contended = self.kind.contended();
        let semaphore = !self.kind.is_lock();
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

    async fn check(&mut self, rec: &mut Rec) {
        let key = format!(
            "bench:{}",
            (u64::try_from(self.id).unwrap_or(0) * 7919 + self.n) % RATELIMIT_KEYS
        );
        self.n += 1;
        let started = Instant::now();
        let allowed = match &mut self.target {
            Target::Direct { conn, scripts, .. } => {
                let redis_key = baton::ratelimit::limiter_key(
                    DIRECT_PREFIX,
                    "rl",
                    &key,
                    baton::ratelimit::Algorithm::Gcra,
                );
                let mut invocation = scripts.gcra.key(redis_key);
                // The arguments Baton sends for `limit` per second with the default burst (= limit).
                invocation
                    .arg(1_000_000u64)
                    .arg(RATELIMIT_LIMIT)
                    .arg(RATELIMIT_LIMIT)
                    .arg(1u64);
                bounded("GCRA", invocation.invoke_async::<Vec<i64>>(conn))
                    .await
                    .map(|r| r.first() == Some(&1))
            }
            Target::Grpc(clients) => {
                let ratelimit = &mut clients.ratelimit;
                let request = pb::RateLimitServiceCheckRequest {
                    key,
                    limit: RATELIMIT_LIMIT,
                    period: Some(ms(1000)),
                    cost: None,
                    algorithm: pb::RateLimitAlgorithm::Gcra.into(),
                    burst: 0,
                };
                bounded("Check", ratelimit.check(request))
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

    // --- locks -----------------------------------------------------------------------------

    async fn lock_acquire(&mut self, wait: Duration) -> Result<Option<String>, String> {
        let fair = self.kind == Kind::LockFair;
        let polling = match &mut self.target {
            Target::Grpc(clients) => {
                let lock = &mut clients.lock;
                let request = lock_request(&self.name, wait, fair);
                let response = bounded("Acquire", lock.acquire(request)).await?;
                let response = response.into_inner();
                return Ok(response
                    .acquired
                    .then(|| response.lease.map(|l| l.token).unwrap_or_default()));
            }
            Target::Direct { polling, .. } => *polling,
        };
        // As Baton does it (`Locks::acquire`): one try; when the caller waits, try again as a
        // registered waiter on every release message meant for it, when what keeps it out may
        // change, and at least every third of the registration lease (which renews it), until the
        // deadline; a wait that ends without a grant is abandoned.
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
        let invocation = lock::scripts::abandon(&scripts.lock_abandon, &self.lock_keys, waiter);
        bounded("abandon.lua", invocation.invoke_async::<i64>(conn))
            .await
            .map(drop)
    }

    async fn lock_release(&mut self, token: &str) -> Result<(), String> {
        match &mut self.target {
            Target::Grpc(clients) => {
                let lock = &mut clients.lock;
                let released =
                    bounded("Release", lock.release(release_request(&self.name, token))).await?;
                if released.into_inner().was_held {
                    Ok(())
                } else {
                    Err("Release: the lease was not held".into())
                }
            }
            Target::Direct { conn, scripts, .. } => {
                let invocation = lock::scripts::Release {
                    token,
                    unclaimed_only: false,
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
            let semaphore = &mut clients.semaphore;
            let response = bounded(
                "Acquire",
                semaphore.acquire(pb::SemaphoreServiceAcquireRequest {
                    name: self.name.clone(),
                    limit: SEMAPHORE_LIMIT,
                    permits: 1,
                    ttl: Some(ms(millis(TTL))),
                    wait_timeout: (!wait.is_zero()).then(|| ms(millis(wait))),
                    owner: String::new(),
                    fair: false,
                    idempotency_key: String::new(),
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
        if self.semaphore_try(&token, "", Duration::ZERO).await? == Try2::Granted {
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
                Try2::Granted => return Ok(Some(token)),
                Try2::Busy(retry_in) => retry_in,
            };
            let now = Instant::now();
            if now >= deadline {
                let Target::Direct { conn, scripts, .. } = &mut self.target else {
                    unreachable!("direct only")
                };
                let invocation =
                    semaphore::scripts::abandon(&scripts.sem_abandon, &self.sem_keys, &waiter);
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
    ) -> Result<Try2, String> {
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
            [granted, ..] if int(granted)? == 1 => Ok(Try2::Granted),
            [_, _available, _expiry, wake] => Ok(Try2::Busy(
                lease_ms(int(wake)?).map(|w| w + Duration::from_millis(1)),
            )),
            other => Err(format!("acquire.lua replied {other:?}")),
        }
    }

    async fn semaphore_release(&mut self, token: &str) -> Result<(), String> {
        match &mut self.target {
            Target::Grpc(clients) => {
                let semaphore = &mut clients.semaphore;
                let released = bounded(
                    "Release",
                    semaphore.release(pb::SemaphoreServiceReleaseRequest {
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
                    semaphore::scripts::release(&scripts.sem_release, &self.sem_keys, token, false);
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

    /// Forgets the messages received so far (what Baton's `Subscription::arm` does).
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

#[derive(Debug, PartialEq, Eq)]
enum Try2 {
    Granted,
    Busy(Option<Duration>),
}

// ---------------------------------------------------------------------------------------------
// Figures
// ---------------------------------------------------------------------------------------------

/// The figures of one side of one scenario in one repeat.
#[derive(Debug, Clone, Default)]
struct Fig {
    ops: u64,
    calls: u64,
    errors: u64,
    timeouts: u64,
    first_error: Option<String>,
    rate: f64,
    p50: f64,
    p99: f64,
    handoff: Option<(f64, f64)>,
    handoff_other: Option<(f64, f64)>,
    regrants: f64,
    jain: f64,
    usage: Usage,
}

impl Fig {
    fn per_op(&self, n: u64) -> f64 {
        n as f64 / self.ops.max(1) as f64
    }

    fn scripts_per_op(&self) -> f64 {
        self.per_op(self.usage.scripts())
    }

    fn baton_us_per_call(&self) -> f64 {
        self.usage.baton_cpu * 1e6 / self.calls.max(1) as f64
    }

    fn redis_us_per_op(&self) -> f64 {
        self.usage.redis_cpu * 1e6 / self.ops.max(1) as f64
    }

    fn pct(&self, cpu: f64) -> f64 {
        100.0 * cpu / self.usage.secs.max(1e-9)
    }
}

/// Jain's fairness index of the grants per client: (Σx)² / (n·Σx²); 1 when all are equal.
fn jain(grants: &[u64]) -> f64 {
    let sum: f64 = grants.iter().map(|&x| x as f64).sum();
    let squares: f64 = grants.iter().map(|&x| (x as f64).powi(2)).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (grants.len() as f64 * squares)
}

fn quantiles(h: &Histogram<u64>) -> Option<(f64, f64)> {
    (!h.is_empty()).then(|| {
        (
            h.value_at_quantile(0.5) as f64,
            h.value_at_quantile(0.99) as f64,
        )
    })
}

fn figures(recs: Vec<Rec>, usage: Usage) -> Fig {
    let grants: Vec<u64> = recs.iter().map(|r| r.ops).collect();
    let mut all = Rec::new();
    for r in recs {
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
    let (p50, p99) = quantiles(&all.latency).unwrap_or_default();
    Fig {
        ops: all.ops,
        calls: all.calls,
        errors: all.errors,
        timeouts: all.timeouts,
        first_error: all.first_error,
        rate: all.ops as f64 / usage.secs.max(1e-9),
        p50,
        p99,
        handoff: quantiles(&all.handoff),
        handoff_other: quantiles(&all.handoff_other),
        regrants: all.regrants as f64 / all.handoff.len().max(1) as f64,
        jain: jain(&grants),
        usage,
    }
}

/// The figures of the lease scenario on one side in one repeat.
#[derive(Debug, Clone, Default)]
struct LeaseFig {
    acquired: u64,
    open_secs: f64,
    renewals: u64,
    released: bool,
    usage: Usage,
}

impl LeaseFig {
    fn per_sec(&self, n: u64) -> f64 {
        n as f64 / self.usage.secs.max(1e-9)
    }

    fn pct(&self, cpu: f64) -> f64 {
        100.0 * cpu / self.usage.secs.max(1e-9)
    }
}

// ---------------------------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------------------------

/// Everything one repeat measured.
struct Repeat {
    load_before: String,
    load_after: String,
    idle_rss: u64,
    rss_after: u64,
    figs: Vec<(Kind, usize, Side, Fig)>,
    leases: Vec<(Side, LeaseFig)>,
}

async fn measure(
    options: &Options,
    probe: &mut Probe,
    stack: &Stack,
    kind: Kind,
    clients: usize,
    side: Side,
) -> Fig {
    let shared = Arc::new(Shared {
        last_release: Mutex::new(None),
    });
    let mut workers = Vec::with_capacity(clients);
    for id in 0..clients {
        workers.push(Worker::new(id, kind, side, stack, Arc::clone(&shared)).await);
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
    let usage = probe.usage(mark).await;
    recs.sort_by_key(|(id, _)| *id);
    figures(recs.into_iter().map(|(_, r)| r).collect(), usage)
}

/// Counts how many of the lock states `names` still exist under `prefix`.
async fn existing_locks(conn: &mut MultiplexedConnection, prefix: &str, n: usize) -> u64 {
    let mut left = 0;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut cmd = redis::cmd("EXISTS");
        for i in chunk {
            cmd.arg(support::lock_key(prefix, &format!("lease-{i}")));
        }
        left += cmd.query_async::<u64>(conn).await.expect("EXISTS");
    }
    left
}

/// What one side's lease window measured.
struct LeaseWindow {
    open_secs: f64,
    renewals: u64,
    usage: Usage,
    failures: Vec<String>,
}

/// The part both lease sides share: waits until all `n` leases are held (`ready` once each),
/// counts renewals and CPU over the lease window, then stops the side's tasks and collects their
/// failures. `what`: the wait's name, a task's name and the side's leases in messages.
async fn lease_window(
    options: &Options,
    probe: &mut Probe,
    (started, ready, n): (Instant, &mut tokio::sync::mpsc::Receiver<()>, usize),
    (tasks, stop): (&mut JoinSet<Result<(), String>>, &CancellationToken),
    renewals: &AtomicU64,
    (opening, task, side): (&str, &str, &str),
) -> LeaseWindow {
    for _ in 0..n {
        within(Duration::from_secs(120), ready.recv(), opening).await;
    }
    let open_secs = started.elapsed().as_secs_f64();
    let mark = probe.mark().await;
    let before = renewals.load(Ordering::Relaxed);
    sleep(options.lease_window()).await;
    let received = renewals.load(Ordering::Relaxed) - before;
    let usage = probe.usage(mark).await;
    stop.cancel();
    let mut failures = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined.unwrap_or_else(|e| panic!("{task}: {e}")) {
            failures.push(e);
        }
    }
    if let Some(e) = failures.first() {
        eprintln!("{} {side} failed, first: {e}", failures.len());
    }
    LeaseWindow {
        open_secs,
        renewals: received,
        usage,
        failures,
    }
}

/// Holds `options.leases` locks through `Hold` streams, measures a window of renewals, then
/// drops the streams and checks Baton released them all.
async fn leases_through_baton(
    options: &Options,
    probe: &mut Probe,
    channels: Vec<Channel>,
) -> LeaseFig {
    let n = options.leases;
    let stop = CancellationToken::new();
    let acquired = Arc::new(AtomicU64::new(0));
    let renewals = Arc::new(AtomicU64::new(0));
    let opening = Arc::new(tokio::sync::Semaphore::new(LEASE_OPENING));
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(n);
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let mut client = LockServiceClient::new(channels[i % channels.len()].clone());
        let (stop, acquired, renewals, opening, ready) = (
            stop.clone(),
            Arc::clone(&acquired),
            Arc::clone(&renewals),
            Arc::clone(&opening),
            ready_tx.clone(),
        );
        let ttl = options.lease_ttl;
        tasks.spawn(async move {
            let permit = opening.acquire_owned().await.expect("open semaphore");
            let hold = client.hold(hold_request(format!("lease-{i}"), ttl));
            let mut stream = match bounded("Hold", hold).await {
                Ok(s) => s.into_inner(),
                Err(e) => {
                    let _ = ready.send(()).await;
                    return Err(e);
                }
            };
            let first = stream.message().await;
            if let Ok(Some(pb::LockServiceHoldResponse {
                event: Some(HoldEvent::Acquired(_)),
            })) = first
            {
                acquired.fetch_add(1, Ordering::Relaxed);
            }
            drop(permit);
            let _ = ready.send(()).await;
            loop {
                tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    m = stream.message() => match m {
                        Ok(Some(pb::LockServiceHoldResponse { event: Some(HoldEvent::Renewed(_)) })) => {
                            renewals.fetch_add(1, Ordering::Relaxed);
                        }
                        other => return Err(format!("the Hold stream ended: {other:?}")),
                    }
                }
            }
        });
    }
    drop(ready_tx);
    let window = lease_window(
        options,
        probe,
        (started, &mut ready_rx, n),
        (&mut tasks, &stop),
        &renewals,
        ("every Hold stream to open", "a Hold task", "Hold streams"),
    )
    .await;
    // Baton releases a lease as soon as its stream goes away.
    let released = tokio::time::timeout(Duration::from_secs(60), async {
        while existing_locks(&mut probe.admin, BATON_PREFIX, n).await > 0 {
            sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .is_ok();
    LeaseFig {
        acquired: acquired.load(Ordering::Relaxed),
        open_secs: window.open_secs,
        renewals: window.renewals,
        released,
        usage: window.usage,
    }
}

/// The same leases kept by the load generator itself, as a client library without Baton would:
/// acquire with `acquire.lua`, then refresh each one with `refresh.lua` a third of the remaining
/// ttl after the previous renewal was sent (the pace of Redisson's watchdog, and of Baton's
/// keepalive before it batched renewals), release at the end.
async fn leases_direct(options: &Options, probe: &mut Probe, stack: &Stack) -> LeaseFig {
    let n = options.leases;
    let stop = CancellationToken::new();
    let acquired = Arc::new(AtomicU64::new(0));
    let renewals = Arc::new(AtomicU64::new(0));
    let opening = Arc::new(tokio::sync::Semaphore::new(LEASE_OPENING));
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(n);
    let started = Instant::now();
    let ttl = options.lease_ttl;
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let mut conn = stack.conns[i % stack.conns.len()].clone();
        let scripts = Arc::clone(&stack.scripts);
        let (stop, acquired, renewals, opening, ready) = (
            stop.clone(),
            Arc::clone(&acquired),
            Arc::clone(&renewals),
            Arc::clone(&opening),
            ready_tx.clone(),
        );
        tasks.spawn(async move {
            let keys = LockKeys::new(DIRECT_PREFIX, &format!("lease-{i}"));
            let token = token();
            let permit = opening.acquire_owned().await.expect("open semaphore");
            let invocation = lock::scripts::Acquire {
                owner: "",
                token: &token,
                ttl,
                waiter: "",
                wait_left: Duration::ZERO,
                fair: false,
                mode: Mode::Exclusive,
                idempotency_key: "",
            }
            .invocation(&scripts.lock_acquire, &keys);
            let sent = Instant::now();
            let reply: Result<Vec<Value>, String> =
                bounded("acquire.lua", invocation.invoke_async(&mut conn)).await;
            drop(permit);
            let granted = matches!(reply.as_deref(), Ok([Value::Int(1), ..]));
            if granted {
                acquired.fetch_add(1, Ordering::Relaxed);
            }
            let _ = ready.send(()).await;
            if !granted {
                return Err(format!("not granted: {reply:?}"));
            }
            let mut next = sent + ttl / 3;
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = sleep_until(next) => {}
                }
                let sent = Instant::now();
                let invocation = lock::scripts::Refresh {
                    token: &token,
                    ttl: Some(ttl),
                    min: Duration::ZERO,
                }
                .invocation(&scripts.lock_refresh, &keys);
                let remaining: i64 =
                    bounded("refresh.lua", invocation.invoke_async(&mut conn)).await?;
                let remaining = lease_ms(remaining).ok_or("the lease was lost")?;
                renewals.fetch_add(1, Ordering::Relaxed);
                next = sent + remaining / 3;
            }
            let invocation = lock::scripts::Release {
                token: &token,
                unclaimed_only: false,
            }
            .invocation(&scripts.lock_release, &keys);
            bounded(
                "release.lua",
                invocation.invoke_async::<Vec<i64>>(&mut conn),
            )
            .await
            .map(drop)
        });
    }
    drop(ready_tx);
    let window = lease_window(
        options,
        probe,
        (started, &mut ready_rx, n),
        (&mut tasks, &stop),
        &renewals,
        (
            "every direct lease to be acquired",
            "a lease task",
            "direct leases",
        ),
    )
    .await;
    let released =
        window.failures.is_empty() && existing_locks(&mut probe.admin, DIRECT_PREFIX, n).await == 0;
    LeaseFig {
        acquired: acquired.load(Ordering::Relaxed),
        open_secs: window.open_secs,
        renewals: window.renewals,
        released,
        usage: window.usage,
    }
}

async fn connect_channels(baton: &BatonProcess, transport: Transport, n: usize) -> Vec<Channel> {
    let mut channels = Vec::with_capacity(n);
    for _ in 0..n {
        channels.push(match transport {
            Transport::Tcp => support::channel(baton.addr()).await,
            Transport::Uds => support::uds_channel(&baton.socket_path()).await,
        });
    }
    channels
}

async fn run_repeat(options: &Options, index: usize) -> Repeat {
    let load_before = load_average();
    let redis = RedisServer::start().await;
    assert!(
        !redis.is_cluster(),
        "benches/baton.rs measures one redis-server: unset {}",
        support::TOPOLOGY_VAR
    );
    let url = redis.url();
    let pool = options.pool.to_string();
    // A generous rate limit timeout: a decision by the failure mode would not be a decision by
    // Redis, and the load generator counts those as errors.
    let baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        BATON_PREFIX,
        "--redis-pool-size",
        &pool,
        "--ratelimit-timeout",
        "2s",
    ])
    .await;
    let mut health = HealthClient::new(support::channel(baton.addr()).await);
    support::wait_for_health(
        &mut health,
        "readiness",
        ServingStatus::Serving,
        Duration::from_secs(10),
    )
    .await;
    let idle_rss = resident(baton.pid());

    let redis_client = redis::Client::open(url.as_str()).expect("redis url");
    let mut conns = Vec::with_capacity(options.pool);
    for _ in 0..options.pool {
        conns.push(redis.client().await);
    }
    let stack = Stack {
        redis_client,
        conns,
        scripts: Arc::new(Scripts::new()),
        tcp: connect_channels(&baton, Transport::Tcp, options.channels).await,
        uds: connect_channels(&baton, Transport::Uds, options.channels).await,
    };
    let mut probe = Probe {
        admin: redis.client().await,
        baton: baton.pid(),
        ticks: clock_ticks(),
    };

    let mut figs = Vec::new();
    let mut leases = Vec::new();
    for kind in &options.kinds {
        if *kind == Kind::Leases {
            for side in options.sides_of(*kind) {
                let fig = match side {
                    Side::Baton(t) => {
                        let channels = connect_channels(&baton, t, LEASE_CHANNELS).await;
                        leases_through_baton(options, &mut probe, channels).await
                    }
                    _ => leases_direct(options, &mut probe, &stack).await,
                };
                eprintln!(
                    "[{}] leases {:<20} {} held, EVALSHA {:.0}/s, Baton CPU {:.1}% RSS {:.1} MiB",
                    index + 1,
                    side.label(),
                    fig.acquired,
                    fig.per_sec(fig.usage.scripts()),
                    fig.pct(fig.usage.baton_cpu),
                    fig.usage.baton_rss as f64 / 1048576.0
                );
                leases.push((side, fig));
            }
            continue;
        }
        for clients in options.clients_of(*kind) {
            for side in options.sides_of(*kind) {
                let fig = measure(options, &mut probe, &stack, *kind, clients, side).await;
                eprintln!(
                    "[{}] {:<20} {:>3} clients {:<22} {:>9.0} ops/s  p50 {:>6} us  p99 {:>7} us  scripts/op {:.2}  errors {} timeouts {}{}",
                    index + 1,
                    kind.flag(),
                    clients,
                    side.label(),
                    fig.rate,
                    fig.p50,
                    fig.p99,
                    fig.scripts_per_op(),
                    fig.errors,
                    fig.timeouts,
                    fig.first_error
                        .as_deref()
                        .map(|e| format!(" (first error: {e})"))
                        .unwrap_or_default()
                );
                figs.push((*kind, clients, side, fig));
            }
        }
    }
    let rss_after = resident(baton.pid());
    drop(baton);
    drop(redis);
    Repeat {
        load_before,
        load_after: load_average(),
        idle_rss,
        rss_after,
        figs,
        leases,
    }
}

// ---------------------------------------------------------------------------------------------
// Reporting
// ---------------------------------------------------------------------------------------------

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// `median (min–max)` of `values` formatted by `f`; just the value for a single repeat.
fn cell(values: &[f64], f: impl Fn(f64) -> String) -> String {
    if values.is_empty() {
        return "—".to_owned();
    }
    let m = f(median(values));
    if values.len() == 1 {
        return m;
    }
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = (f(lo), f(hi));
    if lo == hi {
        m
    } else {
        format!("{m} ({lo}–{hi})")
    }
}

fn grouped(v: f64) -> String {
    if !v.is_finite() {
        return "—".to_owned();
    }
    let n = v.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn fixed(decimals: usize) -> impl Fn(f64) -> String {
    move |v| {
        if v.is_finite() {
            format!("{v:.decimals$}")
        } else {
            "—".to_owned()
        }
    }
}

struct Report<'a> {
    options: &'a Options,
    repeats: &'a [Repeat],
}

impl Report<'_> {
    fn figs(&self, kind: Kind, clients: usize, side: Side) -> Vec<&Fig> {
        self.repeats
            .iter()
            .filter_map(|r| {
                r.figs
                    .iter()
                    .find(|(k, c, s, _)| *k == kind && *c == clients && *s == side)
                    .map(|(_, _, _, f)| f)
            })
            .collect()
    }

    fn values(&self, kind: Kind, clients: usize, side: Side, f: impl Fn(&Fig) -> f64) -> Vec<f64> {
        self.figs(kind, clients, side).into_iter().map(f).collect()
    }

    /// `f(side) / f(direct)` (or minus, with `diff`) within each repeat.
    fn relative(
        &self,
        kind: Kind,
        clients: usize,
        side: Side,
        f: impl Fn(&Fig) -> f64,
        diff: bool,
    ) -> Vec<f64> {
        self.repeats
            .iter()
            .filter_map(|r| {
                let get = |s: Side| {
                    r.figs
                        .iter()
                        .find(|(k, c, x, _)| *k == kind && *c == clients && *x == s)
                        .map(|(_, _, _, fig)| f(fig))
                };
                let (a, b) = (get(side)?, get(Side::Direct)?);
                Some(if diff { a - b } else { a / b })
            })
            .collect()
    }

    fn lease_values(&self, side: Side, f: impl Fn(&LeaseFig) -> f64) -> Vec<f64> {
        self.repeats
            .iter()
            .filter_map(|r| r.leases.iter().find(|(s, _)| *s == side).map(|(_, l)| f(l)))
            .collect()
    }

    fn markdown(&self, date: &str, machine: &str) -> String {
        let o = self.options;
        let mut md = String::new();
        let _ = writeln!(md, "Command: `{}`\n", o.command);
        let _ = writeln!(
            md,
            "Date: {date}. Machine: {machine}. Baton: the release binary as a separate process, default settings but `--ratelimit-timeout 2s` (Redis pool of {} connections); a private `redis-server`, no persistence. Load generator: {} HTTP/2 connections per transport to Baton (client *i* uses connection *i* mod {}), {} multiplexed Redis connections for the direct side; each measured window lasts {:.1} s after a {:.1} s warm-up; {} repeat(s), each with a fresh Redis and Baton; cells are `median (min–max)` over the repeats.\n",
            o.pool,
            o.channels,
            o.channels,
            o.pool,
            o.window.as_secs_f64(),
            o.warmup.as_secs_f64(),
            o.repeat
        );
        let _ = writeln!(
            md,
            "Load average (1, 5, 15 min) before / after each repeat:"
        );
        for (i, r) in self.repeats.iter().enumerate() {
            let _ = writeln!(md, "{}. {} / {}", i + 1, r.load_before, r.load_after);
        }
        md.push('\n');

        let unary: Vec<Kind> = o
            .kinds
            .iter()
            .copied()
            .filter(|k| matches!(k, Kind::Lock | Kind::Semaphore | Kind::RateLimit))
            .collect();
        if !unary.is_empty() {
            let _ = writeln!(md, "#### Unary calls\n");
            let _ = writeln!(
                md,
                "One operation is an acquire + release (two calls) for locks and semaphores, one `Check` for rate limits. Latency is per call. \"Added\" is the Baton figure minus the direct one in the same repeat; Baton / direct is the ratio of operations per second in the same repeat. CPU is % of one core over the window (Baton / Redis / load generator).\n"
            );
            md.push_str("| scenario | clients | side | ops/s | Baton / direct | call p50 µs | call p99 µs | added p50 µs | added p99 µs | script calls / op | Baton CPU µs / call | Redis CPU µs / op | CPU % Baton / Redis / load gen |\n");
            md.push_str("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
            for kind in unary {
                for clients in o.clients_of(kind) {
                    for side in o.sides_of(kind) {
                        let v = |f: &dyn Fn(&Fig) -> f64| self.values(kind, clients, side, f);
                        let baton = side.is_baton();
                        let _ = writeln!(
                            md,
                            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} |",
                            kind.title(),
                            clients,
                            side.label(),
                            cell(&v(&|f| f.rate), grouped),
                            if baton {
                                cell(
                                    &self.relative(kind, clients, side, |f| f.rate, false),
                                    fixed(2),
                                )
                            } else {
                                "—".into()
                            },
                            cell(&v(&|f| f.p50), grouped),
                            cell(&v(&|f| f.p99), grouped),
                            if baton {
                                cell(
                                    &self.relative(kind, clients, side, |f| f.p50, true),
                                    grouped,
                                )
                            } else {
                                "—".into()
                            },
                            if baton {
                                cell(
                                    &self.relative(kind, clients, side, |f| f.p99, true),
                                    grouped,
                                )
                            } else {
                                "—".into()
                            },
                            cell(&v(&|f| f.scripts_per_op()), fixed(2)),
                            if baton {
                                cell(&v(&|f| f.baton_us_per_call()), fixed(1))
                            } else {
                                "—".into()
                            },
                            cell(&v(&|f| f.redis_us_per_op()), fixed(1)),
                            cell(&v(&|f| f.pct(f.usage.baton_cpu)), fixed(0)),
                            cell(&v(&|f| f.pct(f.usage.redis_cpu)), fixed(0)),
                            cell(&v(&|f| f.pct(f.usage.load_cpu)), fixed(0)),
                        );
                    }
                }
            }
            md.push('\n');
        }

        let contended: Vec<Kind> = o.kinds.iter().copied().filter(|k| k.contended()).collect();
        if !contended.is_empty() {
            let _ = writeln!(md, "#### Contention\n");
            let _ = writeln!(
                md,
                "Every client loops: acquire (waiting up to {} s) → release at once. Handoff: from the moment a holder is about to send its release to the moment the next grant's reply arrives (at any client; \"to another\" leaves out grants to the client that just released). Re-grants: the share of grants that went to the client that released last. Jain's index of the grants per client: 1 is perfectly even. Non-fair: every release is one broadcast; a direct client tries again on each, a Baton wakes one of its exclusive waiters (of a semaphore's single-permit waiters, one, who wakes the next while permits are left); fair: waiters queue in arrival order and a release wakes the queue's head alone. Script calls and PUBLISH are per grant. Call latency covers both calls of each cycle, the acquisitions with their wait.\n",
                CONTENDED_WAIT.as_secs(),
            );
            md.push_str("| scenario | clients | side | grants/s | Baton / direct | call p50 µs | call p99 µs | handoff p50 µs | handoff p99 µs | handoff to another p50 / p99 µs | re-grants | Jain's index | timeouts | script calls / grant | PUBLISH / grant | CPU % Baton / Redis / load gen |\n");
            md.push_str(
                "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|\n",
            );
            for kind in contended {
                for clients in o.clients_of(kind) {
                    for side in o.sides_of(kind) {
                        let v = |f: &dyn Fn(&Fig) -> f64| self.values(kind, clients, side, f);
                        let lock = kind.is_lock();
                        let opt = |f: &dyn Fn(&Fig) -> Option<f64>| -> String {
                            if !lock {
                                return "—".into();
                            }
                            let vals: Vec<f64> = self
                                .figs(kind, clients, side)
                                .into_iter()
                                .filter_map(f)
                                .collect();
                            cell(&vals, grouped)
                        };
                        // Latency of acquisitions alone: calls alternate acquire, release; the
                        // histogram has both, so the per-call figures are shown as measured.
                        let _ = writeln!(
                            md,
                            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} / {} / {} |",
                            kind.title(),
                            clients,
                            side.label(),
                            cell(&v(&|f| f.rate), grouped),
                            if side == Side::Direct {
                                "—".into()
                            } else {
                                cell(
                                    &self.relative(kind, clients, side, |f| f.rate, false),
                                    fixed(2),
                                )
                            },
                            cell(&v(&|f| f.p50), grouped),
                            cell(&v(&|f| f.p99), grouped),
                            opt(&|f| f.handoff.map(|h| h.0)),
                            opt(&|f| f.handoff.map(|h| h.1)),
                            opt(&|f| f.handoff_other.map(|h| h.0)),
                            opt(&|f| f.handoff_other.map(|h| h.1)),
                            if lock {
                                cell(&v(&|f| 100.0 * f.regrants), |x| format!("{x:.0} %"))
                            } else {
                                "—".into()
                            },
                            cell(&v(&|f| f.jain), fixed(3)),
                            cell(&v(&|f| f.timeouts as f64), grouped),
                            cell(&v(&|f| f.scripts_per_op()), fixed(2)),
                            cell(&v(&|f| f.per_op(f.usage.calls("publish"))), fixed(2)),
                            cell(&v(&|f| f.pct(f.usage.baton_cpu)), fixed(0)),
                            cell(&v(&|f| f.pct(f.usage.redis_cpu)), fixed(0)),
                            cell(&v(&|f| f.pct(f.usage.load_cpu)), fixed(0)),
                        );
                    }
                }
            }
            md.push('\n');
        }

        if o.kinds.contains(&Kind::Leases) {
            let _ = writeln!(md, "#### {} leases held\n", grouped(o.leases as f64));
            let _ = writeln!(
                md,
                "Baton: one `LockService/Hold` stream per lease (distinct names, ttl {} s, no wait), spread over {} HTTP/2 connections; Baton renews each lease between a quarter and a third of the ttl after its previous renewal (EVALSHA/s shows how many script calls that takes). Direct: the load generator acquires the same leases with `acquire.lua` and renews each with its own `refresh.lua` call a third of the ttl after the previous one (one task per lease), as a client library without Baton would. Measured over {:.2} s (one ttl) once every lease is held; renewals seen: the `renewed` events the clients received (direct: the refresh replies); Baton's resident memory at the end of the window.\n",
                o.lease_ttl.as_secs_f64(),
                LEASE_CHANNELS,
                o.lease_window().as_secs_f64()
            );
            md.push_str("| side | held | time to open all, s | EVALSHA/s | renewals seen/s | Baton CPU % of one core | Baton RSS MiB | Redis CPU % | load gen CPU % | all released after |\n");
            md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
            for side in o.sides_of(Kind::Leases) {
                let v = |f: &dyn Fn(&LeaseFig) -> f64| self.lease_values(side, f);
                let released = v(&|l| if l.released { 1.0 } else { 0.0 });
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    side.label(),
                    cell(&v(&|l| l.acquired as f64), grouped),
                    cell(&v(&|l| l.open_secs), fixed(1)),
                    cell(&v(&|l| l.per_sec(l.usage.scripts())), grouped),
                    cell(&v(&|l| l.per_sec(l.renewals)), grouped),
                    cell(&v(&|l| l.pct(l.usage.baton_cpu)), fixed(1)),
                    if side.is_baton() {
                        cell(&v(&|l| l.usage.baton_rss as f64 / 1048576.0), fixed(1))
                    } else {
                        "—".into()
                    },
                    cell(&v(&|l| l.pct(l.usage.redis_cpu)), fixed(1)),
                    cell(&v(&|l| l.pct(l.usage.load_cpu)), fixed(1)),
                    if released.iter().all(|r| *r == 1.0) {
                        "yes"
                    } else {
                        "**no**"
                    },
                );
            }
            md.push('\n');
        }
        let idle: Vec<f64> = self
            .repeats
            .iter()
            .map(|r| r.idle_rss as f64 / 1048576.0)
            .collect();
        let after: Vec<f64> = self
            .repeats
            .iter()
            .map(|r| r.rss_after as f64 / 1048576.0)
            .collect();
        let _ = writeln!(
            md,
            "Baton resident memory: {} MiB idle after start, {} MiB after the run with nothing held.\n",
            cell(&idle, fixed(1)),
            cell(&after, fixed(1))
        );
        md.push_str(&self.targets());
        md
    }

    fn targets(&self) -> String {
        let o = self.options;
        let mut rows: Vec<(String, String, Option<bool>)> = Vec::new();
        let med = |v: Vec<f64>| (!v.is_empty()).then(|| median(&v));
        for t in &o.transports {
            let side = Side::Baton(*t);
            let tl = side.label();
            if let Some(r) = med(self.relative(Kind::Lock, 64, side, |f| f.rate, false)) {
                rows.push((
                    format!("uncontended lock, 64 clients, {tl}: ≥ 0.5× direct ops/s"),
                    format!("{r:.2}×"),
                    Some(r >= 0.5),
                ));
            }
            for kind in [Kind::Lock, Kind::Semaphore, Kind::RateLimit] {
                if let Some(us) = med(self.values(kind, 64, side, Fig::baton_us_per_call)) {
                    rows.push((
                        format!(
                            "Baton CPU per call, {}, 64 clients, {tl}: < 20 µs",
                            kind.flag()
                        ),
                        format!("{us:.1} µs"),
                        Some(us < 20.0),
                    ));
                }
            }
            for kind in [Kind::Lock, Kind::RateLimit] {
                if let Some(d) = med(self.relative(kind, 1, side, |f| f.p50, true)) {
                    rows.push((
                        format!(
                            "added p50 of one call, {}, 1 client, {tl}: < 100 µs",
                            kind.flag()
                        ),
                        format!("{d:.0} µs"),
                        Some(d < 100.0),
                    ));
                }
            }
            // Redis work per operation: exactly the direct figure for unary calls. In contended
            // scenarios it depends on how many clients are waiting when a lock is released, which
            // depends on call latency, so it is shown without a verdict.
            let mut unary = Vec::new();
            let mut worst: f64 = 0.0;
            for kind in [Kind::Lock, Kind::Semaphore, Kind::RateLimit] {
                for clients in o.clients_of(kind) {
                    let (Some(b), Some(d)) = (
                        med(self.values(kind, clients, side, Fig::scripts_per_op)),
                        med(self.values(kind, clients, Side::Direct, Fig::scripts_per_op)),
                    ) else {
                        continue;
                    };
                    worst = worst.max((b - d).abs());
                    unary.push(format!("{} × {clients}: {b:.2}", kind.flag()));
                }
            }
            if !unary.is_empty() {
                rows.push((
                    format!("script calls per operation = direct, unary scenarios, {tl}"),
                    format!("largest difference {worst:.3} ({})", unary.join(", ")),
                    Some(worst < 0.005),
                ));
            }
            let mut contended = Vec::new();
            for kind in [
                Kind::LockContended,
                Kind::LockFair,
                Kind::SemaphoreContended,
            ] {
                let (Some(b), Some(d)) = (
                    med(self.values(kind, 16, side, Fig::scripts_per_op)),
                    med(self.values(kind, 16, Side::Direct, Fig::scripts_per_op)),
                ) else {
                    continue;
                };
                contended.push(format!("{}: {b:.2} vs {d:.2}", kind.flag()));
            }
            if !contended.is_empty() {
                rows.push((
                    format!("script calls per grant, Baton vs direct, 16 clients, {tl}"),
                    contended.join(", "),
                    None,
                ));
            }
            let lease_scripts =
                |s: Side| med(self.lease_values(s, |l| l.per_sec(l.usage.scripts())));
            if let (Some(b), Some(d)) = (lease_scripts(side), lease_scripts(Side::Direct)) {
                rows.push((
                    format!(
                        "{} leases, {tl}: script calls per second ≤ direct (one per renewal batch)",
                        grouped(o.leases as f64)
                    ),
                    format!("{} vs {}", grouped(b), grouped(d)),
                    Some(b <= d),
                ));
            }
            for kind in [Kind::LockContended, Kind::LockFair] {
                let handoff: Vec<(f64, f64)> = self
                    .figs(kind, 16, side)
                    .into_iter()
                    .filter_map(|f| f.handoff)
                    .collect();
                if handoff.is_empty() {
                    continue;
                }
                let p50 = median(&handoff.iter().map(|h| h.0).collect::<Vec<_>>());
                let p99 = median(&handoff.iter().map(|h| h.1).collect::<Vec<_>>());
                rows.push((
                    format!("{}, 16 clients, {tl}: handoff p50 < 0.5 ms", kind.flag()),
                    format!("{:.2} ms", p50 / 1000.0),
                    Some(p50 < 500.0),
                ));
                rows.push((
                    format!("{}, 16 clients, {tl}: handoff p99 < 3 ms", kind.flag()),
                    format!("{:.2} ms", p99 / 1000.0),
                    Some(p99 < 3000.0),
                ));
            }
            if let Some(j) = med(self.values(Kind::LockFair, 16, side, |f| f.jain)) {
                rows.push((
                    format!("lock-fair, 16 clients, {tl}: Jain's index ≥ 0.99"),
                    format!("{j:.3}"),
                    Some(j >= 0.99),
                ));
            }
            if let Some(mib) =
                med(self.lease_values(side, |l| l.usage.baton_rss as f64 / 1048576.0))
            {
                rows.push((
                    format!(
                        "{} leases, {tl}: Baton RSS < 100 MB",
                        grouped(o.leases as f64)
                    ),
                    format!("{:.1} MB", mib * 1.048576),
                    Some(mib * 1.048576 < 100.0),
                ));
            }
            if let Some(pct) = med(self.lease_values(side, |l| l.pct(l.usage.baton_cpu))) {
                rows.push((
                    format!(
                        "{} leases, {tl}: Baton CPU for renewals < 5% of one core",
                        grouped(o.leases as f64)
                    ),
                    format!("{pct:.1} %"),
                    Some(pct < 5.0),
                ));
            }
        }
        let idle = median(
            &self
                .repeats
                .iter()
                .map(|r| r.idle_rss as f64 / 1e6)
                .collect::<Vec<_>>(),
        );
        rows.push((
            "idle Baton RSS < 20 MB".into(),
            format!("{idle:.1} MB"),
            Some(idle < 20.0),
        ));
        let mut md = String::from(
            "#### Against the targets (medians)\n\n| target | measured | met? |\n|---|---|---|\n",
        );
        for (what, measured, met) in rows {
            let met = match met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "(for information)",
            };
            let _ = writeln!(md, "| {what} | {measured} | {met} |");
        }
        md
    }
}

// ---------------------------------------------------------------------------------------------
// The smoke run's checks
// ---------------------------------------------------------------------------------------------

fn check_smoke(options: &Options, repeat: &Repeat) {
    for (kind, clients, side, fig) in &repeat.figs {
        let what = format!("{} with {clients} clients, {}", kind.flag(), side.label());
        assert!(fig.ops > 0, "{what}: no operation completed: {fig:?}");
        assert_eq!(
            fig.errors, 0,
            "{what}: {} errors, first: {:?}",
            fig.errors, fig.first_error
        );
        let scripts = fig.usage.scripts();
        match kind {
            Kind::Lock | Kind::Semaphore => {
                assert_eq!(
                    fig.timeouts, 0,
                    "{what}: uncontended acquisitions were refused"
                );
                // One EVALSHA per acquire and one per release, nothing else; at most one wake-up
                // per release.
                assert_eq!(
                    scripts,
                    2 * fig.ops,
                    "{what}: script calls {:?} for {} operations",
                    fig.usage.commands,
                    fig.ops
                );
                assert!(
                    fig.usage.calls("publish") <= fig.ops,
                    "{what}: more than one PUBLISH per release"
                );
                assert_eq!(fig.calls, 2 * fig.ops, "{what}: calls per operation");
            }
            Kind::RateLimit => {
                assert_eq!(scripts, fig.ops, "{what}: one script call per decision");
            }
            Kind::LockContended | Kind::LockFair | Kind::SemaphoreContended => {
                assert!(
                    scripts >= 2 * fig.ops,
                    "{what}: fewer script calls ({scripts}) than an acquire and a release per grant ({})",
                    fig.ops
                );
                assert!(
                    fig.jain > 0.0 && fig.jain <= 1.0 + 1e-9,
                    "{what}: Jain's index {}",
                    fig.jain
                );
                if kind.is_lock() && fig.ops > 1 {
                    assert!(fig.handoff.is_some(), "{what}: no handoff was measured");
                }
            }
            Kind::Leases => unreachable!(),
        }
        if side.is_baton() {
            assert!(
                fig.usage.baton_cpu >= 0.0 && fig.usage.baton_rss > 0,
                "{what}: Baton's /proc figures: {:?}",
                fig.usage
            );
        }
    }
    for kind in &options.kinds {
        if *kind == Kind::Leases {
            continue;
        }
        for clients in options.clients_of(*kind) {
            for side in options.sides_of(*kind) {
                assert!(
                    repeat
                        .figs
                        .iter()
                        .any(|(k, c, s, _)| k == kind && *c == clients && *s == side),
                    "{} with {clients} clients, {}: not measured",
                    kind.flag(),
                    side.label()
                );
            }
        }
    }
    if options.kinds.contains(&Kind::Leases) {
        assert_eq!(repeat.leases.len(), options.sides_of(Kind::Leases).len());
        for (side, lease) in &repeat.leases {
            let what = format!("leases, {}", side.label());
            assert_eq!(
                lease.acquired as usize, options.leases,
                "{what}: not every lease was granted"
            );
            // The direct side renews every lease three times in the window (a third of the ttl
            // apart), a script call each; Baton about as often, in fewer calls when it batches.
            let scripts = lease.usage.scripts();
            let due = 3 * options.leases as u64;
            if side.is_baton() {
                assert!(
                    (1..=due * 2).contains(&scripts),
                    "{what}: {scripts} script calls in a window where {due} renewals are due"
                );
            } else {
                assert!(
                    scripts >= due / 2 && scripts <= due * 2,
                    "{what}: {scripts} script calls in a window where {due} renewals are due: {:?}",
                    lease.usage.commands
                );
            }
            assert!(
                lease.renewals >= due / 4,
                "{what}: {} renewals seen in a window where {due} are due",
                lease.renewals
            );
            assert!(lease.renewals > 0, "{what}: no renewal reached the client");
            assert!(
                lease.released,
                "{what}: leases left behind after the streams closed"
            );
        }
    }
    assert!(repeat.idle_rss > 0, "Baton's resident memory was not read");
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let options = match Options::parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("baton bench: {e}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let started = std::time::Instant::now();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let machine = support::machine();
    eprintln!("baton bench: {machine}; load average {}", load_average());
    let mut repeats = Vec::with_capacity(options.repeat);
    for i in 0..options.repeat {
        repeats.push(runtime.block_on(run_repeat(&options, i)));
    }
    let report = Report {
        options: &options,
        repeats: &repeats,
    }
    .markdown(&date, &machine);
    println!("{report}");
    eprintln!(
        "baton bench: {:.0} s in total",
        started.elapsed().as_secs_f64()
    );
    if options.full {
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
        let path = dir.join("bench-baton.md");
        match std::fs::write(&path, &report) {
            Ok(()) => eprintln!("baton bench: report written to {}", path.display()),
            Err(e) => eprintln!("baton bench: could not write {}: {e}", path.display()),
        }
    } else {
        check_smoke(&options, &repeats[0]);
        println!(
            "(smoke run: every check passed; `cargo bench --bench baton` runs the full benchmark)"
        );
    }
}
