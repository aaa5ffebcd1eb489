//! Prometheus metrics: one registry per process, the metric families Baton records, and the calls
//! the rest of the code makes to record them.
//!
//! Recording is cheap enough for every call: counters, gauges and histogram buckets are atomics,
//! and the label combinations of the hot paths (each RPC method, each leased primitive, each kind
//! of Redis call) are looked up once and kept, so a call pays no map lookup and no lock. Label
//! values come from fixed sets (methods, codes, results, reasons); no lock, semaphore, dictionary
//! or rate limit key name, owner or token is ever a label, so the number of series does not grow
//! with the names clients use. Every family and its buckets are listed in `docs/metrics.md`.
//!
//! [`grpc`] is the tower layer that counts every RPC; [`http`] serves the registry on
//! `--metrics-listen` in the Prometheus text format, or OpenMetrics when the scraper asks for it.
//! Recording happens whether or not the endpoint is served.

pub mod grpc;
pub mod http;

use std::{
    sync::{Arc, LazyLock, Mutex, OnceLock, Weak},
    time::Duration,
};

use fastmetrics::{
    derive::LabelSet,
    format::text::{self, TextProfile},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::{Gauge, LazyGauge},
        histogram::Histogram,
    },
    registry::{Registry, Unit},
};

use crate::lease::LostReason;

/// Upper bounds (seconds) of the RPC duration buckets: from a fast unary call (a fraction of a
/// millisecond) to the longest wait a call may ask for (an hour); longer streams land in `+Inf`.
pub const RPC_BUCKETS: [f64; 16] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 600.0,
    3600.0,
];
/// Upper bounds (seconds) of the grant wait buckets: from an immediate grant to the longest wait
/// (`MAX_WAIT`, an hour).
pub const WAIT_BUCKETS: [f64; 17] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 3600.0,
];
/// Upper bounds (seconds) of the Redis round-trip buckets: sub-millisecond on a healthy local
/// Redis, up to the longest command timeout (10 s).
pub const REDIS_BUCKETS: [f64; 16] = [
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
    10.0,
];

/// The leased primitives whose metrics are kept apart, by [`crate::lease::Primitive::KIND`]:
/// their series exist (at zero) from the start.
const LEASE_KINDS: [&str; 3] = ["lock", "semaphore", "election"];

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct BuildLabels {
    version: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct MethodLabels {
    service: &'static str,
    method: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct RpcLabels {
    service: &'static str,
    method: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct KindResultLabels {
    kind: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct KindReasonLabels {
    kind: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct DecisionLabels {
    api: &'static str,
    decision: &'static str,
    decided_by: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct QueryLabels {
    call: &'static str,
    mode: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct ChangeLabels {
    change: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct CallLabels {
    call: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct ErrorLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct PoolLabels {
    pool: &'static str,
    state: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, LabelSet)]
struct TopologyLabels {
    topology: &'static str,
}

/// How an acquisition ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquisition {
    /// Granted.
    Acquired,
    /// Refused on its only try (no wait was asked for).
    NotAcquired,
    /// Still refused when its wait ran out.
    TimedOut,
    /// Failed (Redis, the caller left, shutdown).
    Failed,
}

impl Acquisition {
    const ALL: [Self; 4] = [
        Self::Acquired,
        Self::NotAcquired,
        Self::TimedOut,
        Self::Failed,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::NotAcquired => "not_acquired",
            Self::TimedOut => "timed_out",
            Self::Failed => "failed",
        }
    }
}

/// How a keepalive renewal ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Redis confirmed it.
    Renewed,
    /// Redis no longer has the lease.
    NotHeld,
    /// The call failed (it is retried while the lease can still be confirmed).
    Failed,
}

impl Renewal {
    const ALL: [Self; 3] = [Self::Renewed, Self::NotHeld, Self::Failed];

    fn label(self) -> &'static str {
        match self {
            Self::Renewed => "renewed",
            Self::NotHeld => "not_held",
            Self::Failed => "failed",
        }
    }
}

/// How the release of a lease whose stream's client went away ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The lease was held and is released.
    Released,
    /// It was no longer held.
    NotHeld,
    /// Every try failed until the lease would have expired anyway.
    Failed,
}

impl Release {
    const ALL: [Self; 3] = [Self::Released, Self::NotHeld, Self::Failed];

    fn label(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::NotHeld => "not_held",
            Self::Failed => "failed",
        }
    }
}

const LOST_REASONS: [LostReason; 4] = [
    LostReason::NotHeld,
    LostReason::Unconfirmed,
    LostReason::Shutdown,
    LostReason::ClientUnresponsive,
];

fn lost_label(reason: LostReason) -> &'static str {
    match reason {
        LostReason::NotHeld => "not_held",
        LostReason::Unconfirmed => "unconfirmed",
        LostReason::Shutdown => "shutdown",
        LostReason::ClientUnresponsive => "client_unresponsive",
    }
}

/// The metrics of one leased primitive (locks, semaphores or elections), resolved once.
pub struct LeaseMetrics {
    acquisitions: [Counter; 4],
    /// By result; none for `NotAcquired`, which never waits.
    waits: [Option<Histogram>; 4],
    held: Gauge<i64>,
    waiters: Gauge<i64>,
    renewals: [Counter; 3],
    lost: [Counter; 4],
    releases_on_close: [Counter; 3],
}

/// Adds one to a gauge while it lives (a waiter waiting, a lease kept alive).
pub struct Present(Gauge<i64>);

impl Drop for Present {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl LeaseMetrics {
    /// Counts an acquisition; one that could wait (`waited` is `Some`) also records how long it
    /// took to end.
    pub fn acquisition(&self, outcome: Acquisition, waited: Option<Duration>) {
        let i = outcome as usize;
        self.acquisitions[i].inc();
        if let (Some(waited), Some(waits)) = (waited, &self.waits[i]) {
            waits.observe(waited.as_secs_f64());
        }
    }

    /// A caller waiting for a grant, counted in the waiters gauge until dropped.
    pub fn waiter(&self) -> Present {
        self.waiters.inc();
        Present(self.waiters.clone())
    }

    /// A lease kept alive by a stream, counted in the held gauge until dropped.
    pub fn kept(&self) -> Present {
        self.held.inc();
        Present(self.held.clone())
    }

    /// Counts a keepalive renewal.
    pub fn renewal(&self, outcome: Renewal) {
        self.renewals[outcome as usize].inc();
    }

    /// Counts a lease lost by a keepalive stream.
    pub fn lost(&self, reason: LostReason) {
        let i = LOST_REASONS.iter().position(|r| *r == reason).unwrap_or(0);
        self.lost[i].inc();
    }

    /// Counts the release of a lease whose stream's client went away.
    pub fn released_on_close(&self, outcome: Release) {
        self.releases_on_close[outcome as usize].inc();
    }
}

/// Which rate limit API decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `baton.v1.RateLimitService/Check`.
    Baton,
    /// Envoy's `ShouldRateLimit`, one decision per descriptor with a limit.
    Envoy,
}

/// What a rate limit decision answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    /// Allowed.
    Allowed,
    /// Over the limit.
    Limited,
    /// Over the limit of a shadow-mode rule, so allowed.
    Shadow,
}

/// What made a rate limit decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// The limiter's state in Redis.
    Redis,
    /// The failure mode `open`: Redis did not answer in time.
    FailOpen,
    /// The failure mode `closed`: Redis did not answer in time.
    FailClosed,
    /// A rule that blocks every request (a limit of zero), without asking Redis.
    Rules,
}

/// What kind of Redis call a round trip was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisCall {
    /// A Lua script (`EVALSHA`, with `SCRIPT LOAD` on `NOSCRIPT`).
    Script,
    /// The `WAIT` for replica acknowledgements after a grant.
    Wait,
    /// Any other command (reads such as `HLEN`).
    Command,
    /// A readiness check (`PING`, `CLUSTER INFO`).
    Health,
}

impl RedisCall {
    const ALL: [Self; 4] = [Self::Script, Self::Wait, Self::Command, Self::Health];

    fn label(self) -> &'static str {
        match self {
            Self::Script => "script",
            Self::Wait => "wait",
            Self::Command => "command",
            Self::Health => "health",
        }
    }
}

/// Why a Redis call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisError {
    /// No answer within the command timeout (or no connection in time).
    Timeout,
    /// The connection could not be opened, or broke.
    Connection,
    /// Redis refused Baton's credentials (`NOAUTH`, `WRONGPASS`, `NOPERM`).
    Auth,
    /// A script failed in Redis, or answered something unexpected.
    Script,
    /// Redis answered "not now": loading, busy, out of memory, read-only, a Cluster redirection
    /// or resharding Baton's retries did not get past.
    Server,
}

impl RedisError {
    const ALL: [Self; 5] = [
        Self::Timeout,
        Self::Connection,
        Self::Auth,
        Self::Script,
        Self::Server,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::Connection => "connection",
            Self::Auth => "auth",
            Self::Script => "script",
            Self::Server => "server",
        }
    }
}

/// Which of a Baton's connection pools a pool is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolRole {
    /// Locks, semaphores and autocomplete.
    Commands,
    /// Rate limit decisions (bounded by the rate limit timeout).
    RateLimit,
}

impl PoolRole {
    fn label(self) -> &'static str {
        match self {
            Self::Commands => "commands",
            Self::RateLimit => "ratelimit",
        }
    }
}

/// Connections of a pool: `(open, idle)`.
pub type PoolState = (u32, u32);

/// A pool whose connections are counted at every scrape, until it is dropped.
type PoolSource = (PoolRole, Weak<dyn Fn() -> PoolState + Send + Sync>);

/// A notifier's count of subscribed channels; `None` once the notifier is gone.
type SubscriptionSource = Box<dyn Fn() -> Option<usize> + Send + Sync>;

/// Everything recorded, and the registry that exposes it.
struct Metrics {
    registries: Registries,
    rpc_calls: Family<RpcLabels, Counter>,
    rpc_durations: Family<RpcLabels, Histogram>,
    rpc_in_flight: Family<MethodLabels, Gauge<i64>>,
    leases: Vec<(&'static str, LeaseMetrics)>,
    lease_families: LeaseFamilies,
    /// Any other primitive, created on first use (none exists today).
    other_lease: OnceLock<LeaseMetrics>,
    decisions: Family<DecisionLabels, Counter>,
    queries: Family<QueryLabels, Counter>,
    terms: Family<ChangeLabels, Counter>,
    redis_calls: [Histogram; 4],
    redis_errors: [Counter; 5],
    pools: Arc<Mutex<Vec<PoolSource>>>,
    subscriptions: Arc<Mutex<Vec<SubscriptionSource>>>,
    topology_changes: Family<TopologyLabels, Counter>,
    failovers: Family<TopologyLabels, Counter>,
}

/// The process's metrics, registered on first use.
static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The metrics twice, for the two text formats: the Prometheus format names a counter's family
/// as its samples (`baton_rpc_calls_total`), OpenMetrics names it without `_total`
/// (`baton_rpc_calls`, whose samples the encoder suffixes), which strict OpenMetrics parsers
/// require. Both hold the same metrics (clones share their values).
struct Registries {
    prometheus: Registry,
    open_metrics: Registry,
}

/// Registers `metric` under `name` in both registries (a counter's `name` ends in `_total`).
/// Names and help texts are constants checked by the unit tests, so registration cannot fail at
/// run time; a failure would only leave the metric out.
fn register<M: fastmetrics::registry::Metric + Clone>(
    registries: &mut Registries,
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    metric: M,
) {
    let family = name.strip_suffix("_total").unwrap_or(name);
    for (registry, name, metric) in [
        (&mut registries.prometheus, name, metric.clone()),
        (&mut registries.open_metrics, family, metric),
    ] {
        let registered = match unit.clone() {
            Some(unit) => registry.register_with_unit(name, help, unit, metric),
            None => registry.register(name, help, metric),
        };
        if let Err(e) = registered {
            tracing::error!(metric = name, error = %e, "a metric could not be registered");
        }
    }
}

/// The families of the lease metrics, which every leased primitive records into.
struct LeaseFamilies {
    acquisitions: Family<KindResultLabels, Counter>,
    waits: Family<KindResultLabels, Histogram>,
    held: Family<KindLabels, Gauge<i64>>,
    waiters: Family<KindLabels, Gauge<i64>>,
    renewals: Family<KindResultLabels, Counter>,
    lost: Family<KindReasonLabels, Counter>,
    releases: Family<KindResultLabels, Counter>,
}

impl LeaseFamilies {
    /// The metrics of `kind`, every series created (at zero) now.
    fn of(&self, kind: &'static str) -> LeaseMetrics {
        let counter = |family: &Family<KindResultLabels, Counter>, result: &'static str| {
            family.with_or_new(&KindResultLabels { kind, result }, Counter::clone)
        };
        LeaseMetrics {
            acquisitions: Acquisition::ALL.map(|a| counter(&self.acquisitions, a.label())),
            waits: Acquisition::ALL.map(|a| {
                let labels = KindResultLabels {
                    kind,
                    result: a.label(),
                };
                (a != Acquisition::NotAcquired)
                    .then(|| self.waits.with_or_new(&labels, Histogram::clone))
            }),
            held: self.held.with_or_new(&KindLabels { kind }, Gauge::clone),
            waiters: self.waiters.with_or_new(&KindLabels { kind }, Gauge::clone),
            renewals: Renewal::ALL.map(|r| counter(&self.renewals, r.label())),
            lost: LOST_REASONS.map(|reason| {
                let labels = KindReasonLabels {
                    kind,
                    reason: lost_label(reason),
                };
                self.lost.with_or_new(&labels, Counter::clone)
            }),
            releases_on_close: Release::ALL.map(|r| counter(&self.releases, r.label())),
        }
    }
}

impl Metrics {
    fn new() -> Self {
        // The namespace is a valid constant: the default registry is never used.
        let registry = || {
            Registry::builder()
                .with_namespace("baton")
                .build()
                .unwrap_or_default()
        };
        let mut registries = Registries {
            prometheus: registry(),
            open_metrics: registry(),
        };
        let r = &mut registries;

        let build: Family<BuildLabels, Gauge<i64>> = Family::default();
        build.with_or_new(
            &BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            },
            |g| g.set(1),
        );
        register(r, "build_info", "Baton's version; always 1.", None, build);

        let rpc_calls = Family::default();
        register(
            r,
            "rpc_calls_total",
            "gRPC calls handled, by service, method and status code (streams count when they end).",
            None,
            rpc_calls.clone(),
        );
        let rpc_durations = Family::new(|| Histogram::new(RPC_BUCKETS));
        register(
            r,
            "rpc_duration",
            "Time from a call's arrival to its status (a stream's whole life), by service, method and code.",
            Some(Unit::Seconds),
            rpc_durations.clone(),
        );
        let rpc_in_flight = Family::default();
        register(
            r,
            "rpc_in_flight",
            "gRPC calls and streams open now, by service and method.",
            None,
            rpc_in_flight.clone(),
        );

        let acquisitions = Family::default();
        register(
            r,
            "lease_acquisitions_total",
            "Acquisitions of locks and semaphore permits (Acquire and Hold), by kind and result.",
            None,
            acquisitions.clone(),
        );
        let waits = Family::new(|| Histogram::new(WAIT_BUCKETS));
        register(
            r,
            "lease_wait",
            "Time acquisitions that could wait took to end, by kind and result.",
            Some(Unit::Seconds),
            waits.clone(),
        );
        let held = Family::default();
        register(
            r,
            "leases_held",
            "Leases this Baton keeps alive now (open Hold and KeepAlive streams), by kind.",
            None,
            held.clone(),
        );
        let waiters = Family::default();
        register(
            r,
            "lease_waiters",
            "Callers of this Baton waiting for a grant now, by kind.",
            None,
            waiters.clone(),
        );
        let renewals = Family::default();
        register(
            r,
            "lease_renewals_total",
            "Renewals of kept-alive leases, by kind and result.",
            None,
            renewals.clone(),
        );
        let lost = Family::default();
        register(
            r,
            "leases_lost_total",
            "Kept-alive leases that ended with a lost event, by kind and reason.",
            None,
            lost.clone(),
        );
        let releases = Family::default();
        register(
            r,
            "lease_releases_on_close_total",
            "Leases released because their stream's client went away, by kind and result.",
            None,
            releases.clone(),
        );
        let families = LeaseFamilies {
            acquisitions,
            waits,
            held,
            waiters,
            renewals,
            lost,
            releases,
        };
        let leases = LEASE_KINDS
            .iter()
            .map(|kind| (*kind, families.of(kind)))
            .collect();

        let decisions = Family::default();
        register(
            r,
            "ratelimit_decisions_total",
            "Rate limit decisions, by API (baton, envoy), decision and what decided.",
            None,
            decisions.clone(),
        );
        let queries = Family::default();
        register(
            r,
            "autocomplete_queries_total",
            "Autocomplete queries, by call (complete, complete_recent) and match mode.",
            None,
            queries.clone(),
        );
        let terms = Family::default();
        register(
            r,
            "autocomplete_terms_written_total",
            "Dictionary terms written, by change (added, updated, removed).",
            None,
            terms.clone(),
        );

        let redis_call_family: Family<CallLabels, Histogram> =
            Family::new(|| Histogram::new(REDIS_BUCKETS));
        let redis_calls = RedisCall::ALL.map(|c| {
            redis_call_family.with_or_new(&CallLabels { call: c.label() }, Histogram::clone)
        });
        register(
            r,
            "redis_call_duration",
            "Redis round trips, by kind of call, from asking for a connection to the answer.",
            Some(Unit::Seconds),
            redis_call_family,
        );
        let redis_error_family: Family<ErrorLabels, Counter> = Family::default();
        let redis_errors = RedisError::ALL.map(|e| {
            redis_error_family.with_or_new(&ErrorLabels { kind: e.label() }, Counter::clone)
        });
        register(
            r,
            "redis_errors_total",
            "Failed Redis calls, by kind of error.",
            None,
            redis_error_family,
        );

        let pools: Arc<Mutex<Vec<PoolSource>>> = Arc::default();
        let pool_family: Family<PoolLabels, LazyGauge<i64>> = {
            let pools = pools.clone();
            Family::new_with_labels(move |labels: &PoolLabels| {
                let pools = pools.clone();
                let (role, state) = (labels.pool, labels.state);
                LazyGauge::new(move || pool_connections(&pools, role, state))
            })
        };
        for role in [PoolRole::Commands, PoolRole::RateLimit] {
            for state in ["in_use", "idle"] {
                let labels = PoolLabels {
                    pool: role.label(),
                    state,
                };
                pool_family.with_or_new(&labels, |_| ());
            }
        }
        register(
            r,
            "redis_pool_connections",
            "Pooled Redis connections open now, by pool (commands, ratelimit) and state (in_use, idle).",
            None,
            pool_family,
        );
        let subscriptions: Arc<Mutex<Vec<SubscriptionSource>>> = Arc::default();
        let counted = subscriptions.clone();
        register(
            r,
            "redis_subscriptions",
            "Pub/sub channels subscribed now for local waiters.",
            None,
            LazyGauge::new(move || {
                // Only counting closures live under this lock: a panic leaves nothing half done.
                let mut list = counted.lock().unwrap_or_else(|e| e.into_inner());
                let mut total = 0;
                list.retain(|count| match count() {
                    Some(n) => {
                        total += n;
                        true
                    }
                    None => false,
                });
                i64::try_from(total).unwrap_or(i64::MAX)
            }),
        );
        let topology_changes = Family::default();
        register(
            r,
            "redis_topology_changes_total",
            "Changes of the Redis nodes Baton routes to: a new Cluster slot map, a new Sentinel master.",
            None,
            topology_changes.clone(),
        );
        let failovers = Family::default();
        register(
            r,
            "redis_failovers_total",
            "Failovers seen: a master replaced by another node (a promoted replica).",
            None,
            failovers.clone(),
        );

        Self {
            registries,
            rpc_calls,
            rpc_durations,
            rpc_in_flight,
            leases,
            lease_families: families,
            other_lease: OnceLock::new(),
            decisions,
            queries,
            terms,
            redis_calls,
            redis_errors,
            pools,
            subscriptions,
            topology_changes,
            failovers,
        }
    }
}

fn pool_connections(pools: &Mutex<Vec<PoolSource>>, role: &str, state: &str) -> i64 {
    let live: Vec<(PoolRole, Arc<dyn Fn() -> PoolState + Send + Sync>)> = {
        // Only weak handles live under this lock: a panic while holding it leaves nothing half
        // done.
        let mut list = pools.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|(_, w)| w.strong_count() > 0);
        list.iter()
            .filter_map(|(r, w)| Some((*r, w.upgrade()?)))
            .collect()
    };
    let total: u32 = live
        .iter()
        .filter(|(r, _)| r.label() == role)
        .map(|(_, state_of)| {
            let (open, idle) = state_of();
            if state == "idle" {
                idle
            } else {
                open.saturating_sub(idle)
            }
        })
        .sum();
    i64::from(total)
}

/// The metrics of the leased primitive `kind` ([`crate::lease::Primitive::KIND`]).
pub fn lease(kind: &str) -> &'static LeaseMetrics {
    let m = &*METRICS;
    match m.leases.iter().find(|(k, _)| *k == kind) {
        Some((_, l)) => l,
        None => m.other_lease.get_or_init(|| m.lease_families.of("other")),
    }
}

/// Counts a rate limit decision.
pub fn ratelimit_decision(api: Api, decision: RateDecision, decided_by: DecidedBy) {
    let labels = DecisionLabels {
        api: match api {
            Api::Baton => "baton",
            Api::Envoy => "envoy",
        },
        decision: match decision {
            RateDecision::Allowed => "allowed",
            RateDecision::Limited => "limited",
            RateDecision::Shadow => "shadow",
        },
        decided_by: match decided_by {
            DecidedBy::Redis => "redis",
            DecidedBy::FailOpen => "fail_open",
            DecidedBy::FailClosed => "fail_closed",
            DecidedBy::Rules => "rules",
        },
    };
    METRICS.decisions.with_or_new(&labels, |c| c.inc());
}

/// Counts an autocomplete query of `call` (`complete`, `complete_recent`) in `mode` (one of a
/// fixed set of mode names).
pub fn autocomplete_query(call: &'static str, mode: &'static str) {
    METRICS
        .queries
        .with_or_new(&QueryLabels { call, mode }, |c| c.inc());
}

/// Counts dictionary terms written: `added` and `updated` by `Add`, `removed` by `Remove`.
pub fn autocomplete_terms(added: u64, updated: u64, removed: u64) {
    for (change, n) in [("added", added), ("updated", updated), ("removed", removed)] {
        if n > 0 {
            METRICS
                .terms
                .with_or_new(&ChangeLabels { change }, |c| c.inc_by(n));
        }
    }
}

/// Records a Redis round trip of `took`.
pub fn redis_call(call: RedisCall, took: Duration) {
    METRICS.redis_calls[call as usize].observe(took.as_secs_f64());
}

/// Counts a failed Redis call.
pub fn redis_error(kind: RedisError) {
    METRICS.redis_errors[kind as usize].inc();
}

/// Counts the connections of a pool at every scrape for as long as `state` (open and idle
/// connections) is alive.
pub fn watch_pool(role: PoolRole, state: &Arc<dyn Fn() -> PoolState + Send + Sync>) {
    let mut list = METRICS.pools.lock().unwrap_or_else(|e| e.into_inner());
    list.push((role, Arc::downgrade(state)));
}

/// Counts the channels a notifier subscribes, asking `count` at every scrape until it answers
/// `None` (the notifier is gone).
pub fn watch_subscriptions(count: impl Fn() -> Option<usize> + Send + Sync + 'static) {
    let mut list = METRICS
        .subscriptions
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    list.push(Box::new(count));
}

/// Creates the series of `topology` (`cluster`, `sentinel`) at zero, so that `increase()` over
/// them works before the first change. A single node has none: nothing changes under it.
pub fn topology(topology: &'static str) {
    let labels = TopologyLabels { topology };
    METRICS.topology_changes.with_or_new(&labels, |_| ());
    METRICS.failovers.with_or_new(&labels, |_| ());
}

/// Counts a change of the nodes Baton routes to in `topology` (`cluster`, `sentinel`), and a
/// failover when a master was replaced.
pub fn topology_change(topology: &'static str, failover: bool) {
    let labels = TopologyLabels { topology };
    METRICS.topology_changes.with_or_new(&labels, |c| c.inc());
    if failover {
        METRICS.failovers.with_or_new(&labels, |c| c.inc());
    }
}

/// The text formats the endpoint can answer in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4 (`text/plain`).
    Prometheus,
    /// OpenMetrics text 1.0.0.
    OpenMetrics,
    /// OpenMetrics text 0.0.1.
    OpenMetricsV0,
}

impl Format {
    fn profile(self) -> TextProfile {
        match self {
            Self::Prometheus => TextProfile::PrometheusV0_0_4,
            Self::OpenMetrics => TextProfile::OpenMetricsV1_0_0 {
                escaping_scheme: Default::default(),
            },
            Self::OpenMetricsV0 => TextProfile::OpenMetricsV0_0_1,
        }
    }

    /// The `Content-Type` of an exposition in this format.
    pub fn content_type(self) -> &'static str {
        self.profile().content_type()
    }
}

/// Every metric of the process in `format`.
pub fn encode(format: Format) -> Result<String, std::fmt::Error> {
    let mut out = String::with_capacity(16 * 1024);
    let registry = match format {
        Format::Prometheus => &METRICS.registries.prometheus,
        Format::OpenMetrics | Format::OpenMetricsV0 => &METRICS.registries.open_metrics,
    };
    text::encode(&mut out, registry, format.profile()).map_err(|_| std::fmt::Error)?;
    Ok(out)
}

/// The shared metrics of one RPC method: its in-flight gauge and, per status code, its call
/// counter and duration histogram (created on the code's first use).
pub struct MethodMetrics {
    service: &'static str,
    method: &'static str,
    in_flight: Gauge<i64>,
    by_code: [OnceLock<(Counter, Histogram)>; grpc::CODES.len()],
}

impl MethodMetrics {
    /// The service and method, as labelled.
    pub fn names(&self) -> (&'static str, &'static str) {
        (self.service, self.method)
    }

    fn started(&self) {
        self.in_flight.inc();
    }

    fn ended(&self, code: usize, took: Duration) {
        self.in_flight.dec();
        let code = code.min(grpc::CODES.len() - 1);
        let (calls, durations) = self.by_code[code].get_or_init(|| {
            let labels = RpcLabels {
                service: self.service,
                method: self.method,
                code: grpc::CODES[code],
            };
            (
                METRICS.rpc_calls.with_or_new(&labels, Counter::clone),
                METRICS.rpc_durations.with_or_new(&labels, Histogram::clone),
            )
        });
        calls.inc();
        durations.observe(took.as_secs_f64());
    }
}

/// The metrics of `/service/method`, shared by every layer of the process. Each distinct
/// service and method name is kept once for the life of the process: callers pass only the
/// methods Baton serves (and one name for every unknown path).
fn method_metrics(service: &str, method: &str) -> Arc<MethodMetrics> {
    type Interned = Mutex<Vec<Arc<MethodMetrics>>>;
    static INTERNED: LazyLock<Interned> = LazyLock::new(Interned::default);
    let mut interned = INTERNED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(m) = interned
        .iter()
        .find(|m| m.service == service && m.method == method)
    {
        return m.clone();
    }
    let service: &'static str = Box::leak(service.to_owned().into_boxed_str());
    let method: &'static str = Box::leak(method.to_owned().into_boxed_str());
    let in_flight = METRICS
        .rpc_in_flight
        .with_or_new(&MethodLabels { service, method }, Gauge::clone);
    let m = Arc::new(MethodMetrics {
        service,
        method,
        in_flight,
        by_code: std::array::from_fn(|_| OnceLock::new()),
    });
    interned.push(m.clone());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family registers (no name or help text is refused) and encodes in both formats.
    #[test]
    fn every_family_registers_and_encodes() {
        lease("lock").acquisition(Acquisition::Acquired, Some(Duration::from_millis(3)));
        let method = method_metrics("test.v1.TestService", "Call");
        method.started();
        method.ended(0, Duration::from_millis(1));
        ratelimit_decision(Api::Baton, RateDecision::Allowed, DecidedBy::Redis);
        let text = encode(Format::Prometheus).expect("encodes");
        for name in [
            "baton_build_info",
            "baton_rpc_calls_total",
            "baton_rpc_duration_seconds",
            "baton_rpc_in_flight",
            "baton_lease_acquisitions_total",
            "baton_lease_wait_seconds",
            "baton_leases_held",
            "baton_lease_waiters",
            "baton_lease_renewals_total",
            "baton_leases_lost_total",
            "baton_lease_releases_on_close_total",
            "baton_ratelimit_decisions_total",
            "baton_redis_call_duration_seconds",
            "baton_redis_errors_total",
            "baton_redis_pool_connections",
            "baton_redis_subscriptions",
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{name} missing in:\n{text}"
            );
        }
        for kind in LEASE_KINDS {
            for series in [
                format!("baton_leases_held{{kind=\"{kind}\"}} "),
                format!("baton_lease_acquisitions_total{{kind=\"{kind}\",result=\"acquired\"}} "),
                format!("baton_leases_lost_total{{kind=\"{kind}\",reason=\"unconfirmed\"}} "),
            ] {
                assert!(text.contains(&series), "{series} missing in:\n{text}");
            }
        }
        let open = encode(Format::OpenMetrics).expect("encodes");
        assert!(open.ends_with("# EOF\n"), "{open}");
        // OpenMetrics names a counter's family without `_total` and its samples with it (strict
        // parsers refused a family named `baton_rpc_calls_total`); the same counters as above.
        let counters: Vec<&str> = open
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
            .collect();
        assert!(counters.contains(&"baton_rpc_calls"), "{open}");
        for family in &counters {
            assert!(!family.ends_with("_total"), "{family} in:\n{open}");
            assert!(
                text.contains(&format!("# TYPE {family}_total counter")),
                "{family} in the Prometheus format"
            );
        }
        for sample in open.lines().filter(|l| !l.starts_with('#')) {
            let name = sample.split(['{', ' ']).next().unwrap_or_default();
            if let Some(family) = counters.iter().find(|f| {
                name.strip_prefix(**f)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
            }) {
                assert!(
                    name == format!("{family}_total") || name == format!("{family}_created"),
                    "{sample}"
                );
            }
        }
    }

    /// Buckets increase strictly, as histograms require.
    #[test]
    fn buckets_increase() {
        for buckets in [&RPC_BUCKETS[..], &WAIT_BUCKETS, &REDIS_BUCKETS] {
            assert!(buckets.windows(2).all(|w| w[0] < w[1]), "{buckets:?}");
        }
    }
}
