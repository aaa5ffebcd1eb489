//! Baton's load generator: every scenario through Baton against the same Redis work done
//! directly, in one run, on one machine, written as JSON ([`record::Run`]); and the renderer of
//! `docs/PERFORMANCE.md`'s tables from that JSON ([`report`]).
//!
//! - [`run`]: the scenarios of one `loadgen run`, each repeat with a fresh `redis-server` and a
//!   fresh `baton` process per build ([`Options::builds`]: several builds alternate in one run).
//! - [`primitives`]: locks, semaphores and rate limits, uncontended and contended, and the gRPC
//!   health check; [`leases`]: thousands of leases held with keepalive; [`election`]: leader
//!   failover beside the fair lock's `Hold` handoff; [`autocomplete`]: loading a dictionary and
//!   completing from it; [`functions`]: the same scripts as Redis Functions (`FCALL`) against
//!   `EVALSHA`; [`redis_failover`]: how fast the test deployments of Redis fail over.
//! - [`probe`]: CPU time, memory and Redis's command statistics of a window; [`stats`]: latency
//!   histograms and Jain's index.
//!
//! The smoke tests (`tools/loadgen/tests/smoke.rs`) run each scenario for a few seconds and
//! check that every side makes progress and that Redis counts the script calls the scripts
//! imply.

pub mod autocomplete;
pub mod election;
pub mod functions;
pub mod leases;
pub mod names;
pub mod primitives;
pub mod probe;
pub mod record;
pub mod redis_failover;
pub mod report;
pub mod stats;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use testkit::{BatonProcess, RedisServer};
use tonic::transport::Channel;

pub use record::{Build, Record, Repeat, Run};

/// Key prefix of Baton in every scenario (the direct side writes under [`DIRECT_PREFIX`]).
pub const BATON_PREFIX: &str = "baton:";
/// Key prefix of the direct side.
pub const DIRECT_PREFIX: &str = "direct:";

/// A group of measurements `loadgen run --scenario` can select.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scenario {
    /// Lock acquire + release, each client on a name of its own.
    Lock,
    /// One lock shared by every client, non-fair.
    LockContended,
    /// One lock shared by every client, fair.
    LockFair,
    /// Semaphore (limit 5) acquire + release, each client on a name of its own.
    Semaphore,
    /// One semaphore (limit 5) shared by every client.
    SemaphoreContended,
    /// Rate limit `Check` (GCRA).
    RateLimit,
    /// The gRPC health check through Baton, which touches no Redis: the cost of a gRPC call.
    Health,
    /// Thousands of leases held with keepalive.
    Leases,
    /// Leader failover (`Campaign` close to the next `elected`) beside the fair lock handoff.
    LeaderFailover,
    /// Loading a dictionary and completing from it.
    Autocomplete,
    /// A lock cycle and a GCRA decision as Redis Functions against `EVALSHA`.
    Functions,
    /// Failover times of the Redis deployments the tests use (Sentinel, Cluster).
    RedisFailover,
}

impl Scenario {
    /// Every scenario, in the order a run measures them.
    pub const ALL: [Scenario; 12] = [
        Scenario::Lock,
        Scenario::LockContended,
        Scenario::LockFair,
        Scenario::Semaphore,
        Scenario::SemaphoreContended,
        Scenario::RateLimit,
        Scenario::Health,
        Scenario::Leases,
        Scenario::LeaderFailover,
        Scenario::Autocomplete,
        Scenario::Functions,
        Scenario::RedisFailover,
    ];

    /// Its name on the command line and in the records.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Lock => "lock",
            Scenario::LockContended => "lock-contended",
            Scenario::LockFair => "lock-fair",
            Scenario::Semaphore => "semaphore",
            Scenario::SemaphoreContended => "semaphore-contended",
            Scenario::RateLimit => "ratelimit",
            Scenario::Health => "health",
            Scenario::Leases => "leases",
            Scenario::LeaderFailover => "leader-failover",
            Scenario::Autocomplete => "autocomplete",
            Scenario::Functions => "functions",
            Scenario::RedisFailover => "redis-failover",
        }
    }

    /// The scenario named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether every client works on one shared name.
    pub fn contended(self) -> bool {
        matches!(
            self,
            Scenario::LockContended | Scenario::LockFair | Scenario::SemaphoreContended
        )
    }

    /// Whether it is a lock scenario of [`primitives`].
    pub fn is_lock(self) -> bool {
        matches!(
            self,
            Scenario::Lock | Scenario::LockContended | Scenario::LockFair
        )
    }

    /// Whether [`primitives`] measures it (closed-loop clients, one window per side).
    pub fn closed_loop(self) -> bool {
        matches!(
            self,
            Scenario::Lock
                | Scenario::LockContended
                | Scenario::LockFair
                | Scenario::Semaphore
                | Scenario::SemaphoreContended
                | Scenario::RateLimit
                | Scenario::Health
        )
    }

    /// Whether it needs a Baton (the others measure Redis alone).
    pub fn needs_baton(self) -> bool {
        !matches!(self, Scenario::Functions | Scenario::RedisFailover)
    }
}

/// How the load generator reaches Baton.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Transport {
    /// TCP, the clients sharing [`Options::channels`] HTTP/2 connections.
    Tcp,
    /// The Unix socket, the clients sharing [`Options::channels`] connections.
    Uds,
    /// TCP, one HTTP/2 connection per client (the shape of multi-process apps sharing a sidecar).
    TcpOwn,
}

impl Transport {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Uds => "uds",
            Transport::TcpOwn => "tcp-own",
        }
    }
}

/// Who does the work in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Side {
    /// The load generator runs Baton's scripts itself, waiting as a client library would.
    Direct,
    /// The load generator polls (try, sleep 100 ms, try again), as redis-py's `Lock` does.
    Polling,
    /// Calls through Baton.
    Baton(Transport),
}

impl Side {
    /// Its name in the records.
    pub fn name(self) -> &'static str {
        match self {
            Side::Direct => "direct",
            Side::Polling => "polling",
            Side::Baton(Transport::Tcp) => "baton-tcp",
            Side::Baton(Transport::Uds) => "baton-uds",
            Side::Baton(Transport::TcpOwn) => "baton-tcp-own",
        }
    }

    /// Whether the calls go through Baton.
    pub fn is_baton(self) -> bool {
        matches!(self, Side::Baton(_))
    }
}

/// A Baton binary to measure, by name.
#[derive(Debug, Clone)]
pub struct BuildSpec {
    /// Its name in the records (`""` when it is the only one).
    pub name: String,
    /// The binary.
    pub path: PathBuf,
}

/// What a run measures, and how long.
#[derive(Debug, Clone)]
pub struct Options {
    /// The smoke run of the test suite: tiny windows, checked by the tests rather than reported.
    pub smoke: bool,
    /// Repeats, each with a fresh Redis and Baton.
    pub repeat: usize,
    /// A measured window.
    pub window: Duration,
    /// The warm-up before each window.
    pub warmup: Duration,
    /// Client counts of the closed-loop scenarios (contended ones use those of 2 and more).
    pub clients: Vec<usize>,
    /// The scenarios, in [`Scenario::ALL`] order.
    pub scenarios: Vec<Scenario>,
    /// How the clients reach Baton.
    pub transports: Vec<Transport>,
    /// Leases held in [`Scenario::Leases`].
    pub leases: usize,
    /// Their ttl (the window lasts one ttl).
    pub lease_ttl: Duration,
    /// HTTP/2 connections per transport the closed-loop clients share.
    pub channels: usize,
    /// Baton's Redis pool and the direct side's connections.
    pub pool: usize,
    /// Handoffs measured per side in [`Scenario::LeaderFailover`].
    pub handoffs: usize,
    /// Candidates (and lock holders) in [`Scenario::LeaderFailover`].
    pub candidates: usize,
    /// Dictionary size in [`Scenario::Autocomplete`].
    pub terms: usize,
    /// Concurrent clients in [`Scenario::Autocomplete`].
    pub autocomplete_clients: usize,
    /// Measured time per query kind in [`Scenario::Autocomplete`].
    pub autocomplete_window: Duration,
    /// The query kinds [`Scenario::Autocomplete`] measures, by name (every one when empty). A run
    /// naming some declares the dictionary with only the features they need, and skips the
    /// dictionaries of other feature sets and the RediSearch baseline.
    pub autocomplete_cases: Vec<String>,
    /// After the queries of [`Scenario::Autocomplete`], add `RANKED` to the dictionary (declared
    /// without it) and time its background build.
    pub autocomplete_build_ranked: bool,
    /// Failovers per Sentinel timing in [`Scenario::RedisFailover`] (and Cluster failovers: at
    /// most 3).
    pub failovers: usize,
    /// The nice value the Redis of each repeat runs at (`None`: the load generator's own). A
    /// negative one keeps the load generator and Baton, which share Redis's cores here, from
    /// taking a core from it in the middle of a script, as they could not on a host of its own.
    pub redis_nice: Option<i32>,
    /// The Baton binaries.
    pub builds: Vec<BuildSpec>,
}

impl Options {
    /// The full run: every scenario, 1, 16 and 64 clients, TCP and the Unix socket, 3 repeats.
    pub fn full() -> Self {
        Self {
            smoke: false,
            repeat: 3,
            window: Duration::from_millis(2500),
            warmup: Duration::from_millis(500),
            clients: vec![1, 16, 64],
            scenarios: Scenario::ALL.to_vec(),
            transports: vec![Transport::Tcp, Transport::Uds],
            leases: 10_000,
            lease_ttl: Duration::from_secs(10),
            channels: 4,
            pool: usize::try_from(baton::config::DEFAULT_REDIS_POOL_SIZE).unwrap_or(4),
            handoffs: 2000,
            candidates: 8,
            terms: 1_000_000,
            autocomplete_clients: 16,
            autocomplete_window: Duration::from_secs(10),
            autocomplete_cases: Vec::new(),
            autocomplete_build_ranked: false,
            failovers: 5,
            redis_nice: None,
            builds: Vec::new(),
        }
    }

    /// The smoke run of the test suite: every scenario in a few seconds in all.
    pub fn smoke() -> Self {
        Self {
            smoke: true,
            repeat: 1,
            window: Duration::from_millis(150),
            warmup: Duration::from_millis(60),
            clients: vec![3],
            scenarios: Scenario::ALL.to_vec(),
            transports: vec![Transport::Tcp, Transport::Uds],
            leases: 100,
            // Long enough that a busy machine's stall (the suite runs two parts side by side on
            // two cores) does not cost the leases: a 300 ms ttl left about 150 ms for a renewal's
            // reply, and one CI run lost all 100 (told `UNCONFIRMED`, as Baton must be).
            lease_ttl: Duration::from_millis(1500),
            channels: 2,
            pool: 2,
            handoffs: 50,
            candidates: 4,
            terms: 2000,
            autocomplete_clients: 2,
            autocomplete_window: Duration::from_millis(100),
            autocomplete_cases: Vec::new(),
            autocomplete_build_ranked: false,
            failovers: 1,
            redis_nice: None,
            builds: Vec::new(),
        }
    }

    /// Shorter than [`Options::full`]: one repeat, 1 s windows, at most 2000 leases, 100,000
    /// terms, 2 s per query kind, 500 handoffs, one failover of each kind.
    pub fn quick(mut self) -> Self {
        self.repeat = 1;
        self.window = Duration::from_secs(1);
        self.warmup = Duration::from_millis(300);
        self.leases = self.leases.min(2000);
        self.terms = self.terms.min(100_000);
        self.autocomplete_window = self.autocomplete_window.min(Duration::from_secs(2));
        self.handoffs = self.handoffs.min(500);
        self.failovers = 1;
        self
    }

    /// Client counts of `scenario`: contended scenarios need at least two clients.
    pub fn clients_of(&self, scenario: Scenario) -> Vec<usize> {
        self.clients
            .iter()
            .copied()
            .filter(|c| !scenario.contended() || *c >= 2)
            .collect()
    }

    /// The sides of `scenario`.
    pub fn sides_of(&self, scenario: Scenario) -> Vec<Side> {
        let mut sides = Vec::new();
        if scenario != Scenario::Health {
            sides.push(Side::Direct);
        }
        if scenario == Scenario::LockContended {
            sides.push(Side::Polling);
        }
        for t in &self.transports {
            // One connection per client is a shape of unary calls; the others share connections.
            if *t == Transport::TcpOwn && (scenario.contended() || scenario == Scenario::Leases) {
                continue;
            }
            sides.push(Side::Baton(*t));
        }
        sides
    }

    /// The options as the run's JSON records them.
    pub fn describe(&self) -> BTreeMap<String, String> {
        let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            m.insert(k.to_owned(), v);
        };
        put("repeat", self.repeat.to_string());
        put("window_s", self.window.as_secs_f64().to_string());
        put("warmup_s", self.warmup.as_secs_f64().to_string());
        put("clients", list(&self.clients));
        put(
            "scenarios",
            self.scenarios
                .iter()
                .map(|s| s.name())
                .collect::<Vec<_>>()
                .join(","),
        );
        put(
            "transports",
            self.transports
                .iter()
                .map(|t| t.name())
                .collect::<Vec<_>>()
                .join(","),
        );
        put("leases", self.leases.to_string());
        put("lease_ttl_s", self.lease_ttl.as_secs_f64().to_string());
        put("channels", self.channels.to_string());
        put("pool", self.pool.to_string());
        put("handoffs", self.handoffs.to_string());
        put("candidates", self.candidates.to_string());
        put("terms", self.terms.to_string());
        put(
            "autocomplete_clients",
            self.autocomplete_clients.to_string(),
        );
        put(
            "autocomplete_window_s",
            self.autocomplete_window.as_secs_f64().to_string(),
        );
        if !self.autocomplete_cases.is_empty() {
            put("autocomplete_cases", self.autocomplete_cases.join(","));
        }
        if self.autocomplete_build_ranked {
            put("autocomplete_build_ranked", "true".to_owned());
        }
        put("failovers", self.failovers.to_string());
        if let Some(nice) = self.redis_nice {
            put("redis_nice", nice.to_string());
        }
        m
    }
}

/// A fresh `redis-server` and Baton for one repeat of one build (several builds take turns going
/// first, repeat by repeat).
pub struct Stage {
    /// The Redis every side works on.
    pub redis: RedisServer,
    /// Baton, serving on TCP and on a Unix socket.
    pub baton: BatonProcess,
    /// Baton's resident memory right after it became ready.
    pub idle_rss: u64,
}

impl Stage {
    /// Starts `redis-server` (at the nice value `redis_nice`, if given) and the `baton` binary
    /// `binary` on it (Redis pool of `pool`, a generous rate limit timeout so that no decision
    /// falls to the failure mode).
    pub async fn start(binary: &Path, pool: usize, redis_nice: Option<i32>) -> Self {
        let redis = RedisServer::start_standalone().await;
        if let Some(nice) = redis_nice {
            let pid = redis.pid().expect("a single Redis has a pid");
            let status = std::process::Command::new("renice")
                .args(["-n", &nice.to_string(), "-p", &pid.to_string()])
                .stdout(std::process::Stdio::null())
                .status()
                .expect("run renice");
            assert!(
                status.success(),
                "renice -n {nice} of Redis failed: {status}"
            );
        }
        let url = redis.url();
        let pool = pool.to_string();
        let baton = BatonProcess::spawn_binary(
            binary,
            &[
                "--redis-url",
                &url,
                "--key-prefix",
                BATON_PREFIX,
                "--redis-pool-size",
                &pool,
                "--ratelimit-timeout",
                "2s",
                "--log",
                "warn",
            ],
        )
        .await;
        let mut health = tonic_health::pb::health_client::HealthClient::new(
            testkit::channel(baton.addr()).await,
        );
        testkit::wait_for_health(
            &mut health,
            "readiness",
            tonic_health::pb::health_check_response::ServingStatus::Serving,
            Duration::from_secs(10),
        )
        .await;
        let idle_rss = probe::resident(baton.pid());
        Self {
            redis,
            baton,
            idle_rss,
        }
    }

    /// `n` new HTTP/2 connections to Baton over `transport`.
    pub async fn channels(&self, transport: Transport, n: usize) -> Vec<Channel> {
        let mut channels = Vec::with_capacity(n);
        for _ in 0..n {
            channels.push(match transport {
                Transport::Tcp | Transport::TcpOwn => testkit::channel(self.baton.addr()).await,
                Transport::Uds => testkit::uds_channel(&self.baton.socket_path()).await,
            });
        }
        channels
    }
}

/// Runs `options` and returns what it measured; `command` is recorded as given. Progress goes
/// to stderr.
pub async fn run(options: &Options, command: &str) -> Run {
    let started = std::time::Instant::now();
    let builds: Vec<Build> = options
        .builds
        .iter()
        .map(|b| Build {
            name: b.name.clone(),
            path: b.path.display().to_string(),
            commit: commit_of(b.path.parent().unwrap_or(Path::new("."))),
        })
        .collect();
    let machine = testkit::machine();
    eprintln!(
        "loadgen: {machine}; load average {:?}",
        probe::load_average()
    );
    let mut out = Run {
        format: record::FORMAT,
        command: command.to_owned(),
        started: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        seconds: 0.0,
        machine,
        commit: commit_of(Path::new(".")),
        builds,
        options: options.describe(),
        repeats: Vec::new(),
        records: Vec::new(),
    };
    let wants = |s: Scenario| options.scenarios.contains(&s);
    for repeat in 0..options.repeat {
        // Builds take turns going first, repeat by repeat.
        let mut builds: Vec<&BuildSpec> = options.builds.iter().collect();
        let first = repeat % builds.len().max(1);
        builds.rotate_left(first);
        for build in builds {
            let load_before = probe::load_average();
            let mut records = Vec::new();
            if options.scenarios.iter().any(|s| s.needs_baton()) {
                let stage = Stage::start(&build.path, options.pool, options.redis_nice).await;
                let mut baton_records = Vec::new();
                primitives::run(options, &stage, &mut baton_records).await;
                if wants(Scenario::Leases) {
                    leases::run(options, &stage, &mut baton_records).await;
                }
                if wants(Scenario::LeaderFailover) {
                    election::run(options, &stage, &mut baton_records).await;
                }
                if wants(Scenario::Autocomplete) {
                    autocomplete::run(options, &stage, &mut baton_records).await;
                }
                let mut idle = Record {
                    scenario: "idle".to_owned(),
                    side: "baton".to_owned(),
                    ..Record::default()
                };
                idle.set(names::IDLE_RSS, stage.idle_rss as f64);
                idle.set(names::BATON_RSS, probe::resident(stage.baton.pid()) as f64);
                baton_records.push(idle);
                for r in &mut baton_records {
                    r.build = build.name.clone();
                }
                records.extend(baton_records);
            }
            out.repeats.push(Repeat {
                repeat,
                build: build.name.clone(),
                load_before,
                load_after: probe::load_average(),
            });
            for r in &mut records {
                r.repeat = repeat;
            }
            out.records.extend(records);
        }
        // Redis alone: once per repeat whatever the builds.
        let mut records = Vec::new();
        if wants(Scenario::Functions) {
            functions::run(options, repeat, &mut records).await;
        }
        if wants(Scenario::RedisFailover) {
            redis_failover::run(options, &mut records).await;
        }
        for r in &mut records {
            r.repeat = repeat;
        }
        out.records.extend(records);
    }
    out.seconds = started.elapsed().as_secs_f64();
    out
}

/// `git rev-parse --short HEAD` in `dir`, with `+` when the checkout has uncommitted changes;
/// empty outside a checkout.
pub fn commit_of(dir: &Path) -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let Some(head) = git(&["rev-parse", "--short", "HEAD"]) else {
        return String::new();
    };
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head}+") } else { head }
}
