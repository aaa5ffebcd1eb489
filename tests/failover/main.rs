//! Baton on Redis Sentinel and Redis Cluster under failure, with real processes
//! (`tests/support/topology.rs`). Every figure is printed; run with
//! `cargo test --test failover -- --nocapture` to see them.
//!
//! - [`sentinel`]: a Sentinel failover during contention, fencing with `--min-replicas-ack`, a
//!   leader election through a Sentinel failover, a manual failover that leaves the old master
//!   running, a frozen first Sentinel, and errors that name the address;
//! - [`cluster`]: a live slot migration while locks are held and waited for, a Cluster master
//!   failover, and a dead master without a replica;
//! - [`keepalive`]: the keepalive cost per Cluster node.
//!
//! This file holds what they share: the deployments, requests and watched `Hold` streams.

#[path = "../support/mod.rs"]
mod support;

mod cluster;
mod keepalive;
mod sentinel;

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use baton::{
    config::RedisConfig,
    proto::v1::{
        self as pb, LeaseLostReason, election_service_campaign_response::Event as ElectionEvent,
        election_service_client::ElectionServiceClient, lock_service_client::LockServiceClient,
        lock_service_hold_response::Event as LockEvent,
        semaphore_service_client::SemaphoreServiceClient,
        semaphore_service_hold_response::Event as SemEvent,
    },
    redis::Topology,
};
use support::{
    Baton,
    lease::read_until_lost,
    ms, std_duration,
    topology::{ClusterNode, RedisCluster, SentinelDeployment, key_slot},
    wait_until, within,
};
use tokio::{sync::mpsc, task::JoinHandle, time::Instant};
use tonic::{Code, transport::Channel};

/// Time from SIGKILL of the Sentinel master to the first acquire through Baton that succeeds.
/// Measured 2.20-2.38 s over a dozen runs on a loaded 2-core machine (the Sentinels' own
/// failover, as a Sentinel client sees it, took as long with the harness's timings); the rest is
/// CI headroom.
const SENTINEL_FOLLOW_BOUND: Duration = Duration::from_secs(8);
/// How far Baton's first successful acquire may trail the moment a Sentinel client could see the
/// promoted replica as the master. Measured -20 to +20 ms: Baton asks the Sentinels afresh for
/// every connection it opens, so it trails only by its callers' retry pace.
const SENTINEL_FOLLOW_LAG: Duration = Duration::from_millis(1500);
/// Time from SIGKILL of a Cluster master to the first acquire on its slots through Baton that
/// succeeds. Measured 2.96-3.65 s over a dozen runs, within 60 ms of the cluster reporting itself
/// healthy again (the replica's takeover with the harness's 1.5 s node timeout); the rest is CI
/// headroom.
const CLUSTER_FOLLOW_BOUND: Duration = Duration::from_secs(9);
/// ttl of the leases held through a failover: shorter than any failover, so every lease on the
/// failed node must be reported lost.
const FAILOVER_TTL_MS: u64 = 2_000;
/// How long after a lease's expiry a stream may take to have spoken, at most, before a test gives
/// up waiting for it (a stream that is silent past its expiry fails the test anyway).
const SPEAK_SLACK: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------------------------------------
// Deployments
// ---------------------------------------------------------------------------------------------

/// Baton's view of a Sentinel deployment, as `--redis-mode sentinel` builds it.
fn sentinel_config(sentinels: &SentinelDeployment) -> RedisConfig {
    let urls = sentinels.sentinel_urls();
    RedisConfig::with_topology(Topology::Sentinel {
        node_url: urls.first().cloned(),
        master: sentinels.master_name().to_owned(),
        sentinels: urls,
    })
}

/// Baton's view of a cluster, as `--redis-mode cluster` builds it.
fn cluster_config(cluster: &RedisCluster) -> RedisConfig {
    RedisConfig::with_topology(Topology::Cluster {
        seeds: cluster.seed_urls(),
    })
}

/// The Redis key of lock `name` (its hash tag decides its slot).
fn lock_key(prefix: &str, name: &str) -> String {
    format!("{prefix}{{lock:{name}}}")
}

/// The Redis key of semaphore `name`.
fn sem_key(prefix: &str, name: &str) -> String {
    format!("{prefix}{{sem:{name}}}")
}

/// The first `count` names `BASE-i` whose `{KIND:NAME}` hash tag satisfies `wanted` (by slot).
fn names_where(kind: &str, base: &str, count: usize, wanted: impl Fn(u16) -> bool) -> Vec<String> {
    (0u32..)
        .map(|i| format!("{base}-{i}"))
        .filter(|name| wanted(key_slot(&format!("{{{kind}:{name}}}"))))
        .take(count)
        .collect()
}

/// A field of an `INFO` reply, as a number (0 when absent).
fn info_number(info: &str, field: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `count=N` of `errorstat_TRYAGAIN` (commands refused because their slot was half-moved) on the
/// node on `port`.
async fn tryagain_errors(cluster: &RedisCluster, port: u16) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("errorstats")
        .query_async(&mut cluster.node_client(port).await)
        .await
        .expect("INFO errorstats");
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_TRYAGAIN:count="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Subscribers of a shard channel on the node on `port` (`PUBSUB SHARDNUMSUB`).
async fn shard_subscribers(cluster: &RedisCluster, port: u16, channel: &str) -> i64 {
    let reply: (String, i64) = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query_async(&mut cluster.node_client(port).await)
        .await
        .expect("PUBSUB SHARDNUMSUB");
    reply.1
}

// ---------------------------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------------------------

fn lock_request(name: &str, ttl_ms: u64, wait_ms: u64) -> pb::LockServiceAcquireRequest {
    pb::LockServiceAcquireRequest {
        name: name.to_owned(),
        ttl: Some(ms(ttl_ms)),
        wait_timeout: (wait_ms > 0).then(|| ms(wait_ms)),
        ..Default::default()
    }
}

fn permit_request(
    name: &str,
    limit: u32,
    ttl_ms: u64,
    wait_ms: u64,
) -> pb::SemaphoreServiceAcquireRequest {
    pb::SemaphoreServiceAcquireRequest {
        name: name.to_owned(),
        limit,
        permits: 1,
        ttl: Some(ms(ttl_ms)),
        wait_timeout: (wait_ms > 0).then(|| ms(wait_ms)),
        ..Default::default()
    }
}

async fn describe_lock(
    client: &mut LockServiceClient<Channel>,
    name: &str,
) -> Result<pb::LockServiceDescribeResponse, tonic::Status> {
    client
        .describe(pb::LockServiceDescribeRequest {
            name: name.to_owned(),
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn describe_semaphore(
    client: &mut SemaphoreServiceClient<Channel>,
    name: &str,
) -> Result<pb::SemaphoreServiceDescribeResponse, tonic::Status> {
    client
        .describe(pb::SemaphoreServiceDescribeRequest {
            name: name.to_owned(),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Tries to acquire a fresh lock (one name per attempt from `names`) every few milliseconds until
/// one is granted; returns when. Measures how long Baton takes to serve again after a failure.
async fn first_acquire(
    client: &LockServiceClient<Channel>,
    names: &[String],
    limit: Duration,
) -> Instant {
    let mut next = names.iter();
    wait_until(limit, "an acquire through Baton to succeed", || {
        let name = next.next().expect("enough probe names").clone();
        let mut client = client.clone();
        async move {
            let attempt = tokio::time::timeout(
                Duration::from_secs(2),
                client.acquire(lock_request(&name, 1_000, 0)),
            )
            .await;
            match attempt {
                Ok(Ok(r)) if r.get_ref().acquired => Ok(Instant::now()),
                Ok(Ok(_)) => Err(format!("{name}: not acquired")),
                Ok(Err(status)) => Err(format!("{name}: {:?} {}", status.code(), status.message())),
                Err(_) => Err(format!("{name}: no answer in 2 s")),
            }
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------------
// Watched Hold streams
// ---------------------------------------------------------------------------------------------

/// One event of a Hold stream, protocol-neutral.
#[derive(Debug)]
enum Ev {
    Acquired {
        fencing_token: u64,
        remaining: Duration,
    },
    NotAcquired,
    Renewed(Duration),
    Lost(LeaseLostReason, String),
}

fn lock_ev(m: pb::LockServiceHoldResponse) -> Ev {
    match m.event {
        Some(LockEvent::Acquired(l)) => Ev::Acquired {
            fencing_token: l.fencing_token,
            remaining: std_duration(&l.remaining_ttl.expect("remaining_ttl")),
        },
        Some(LockEvent::NotAcquired(_)) => Ev::NotAcquired,
        Some(LockEvent::Renewed(r)) => {
            Ev::Renewed(std_duration(&r.remaining_ttl.expect("remaining_ttl")))
        }
        Some(LockEvent::Lost(l)) => Ev::Lost(l.reason(), l.message),
        None => panic!("a Hold event without an event"),
    }
}

fn sem_ev(m: pb::SemaphoreServiceHoldResponse) -> Ev {
    match m.event {
        Some(SemEvent::Acquired(p)) => Ev::Acquired {
            fencing_token: p.fencing_token,
            remaining: std_duration(&p.remaining_ttl.expect("remaining_ttl")),
        },
        Some(SemEvent::NotAcquired(_)) => Ev::NotAcquired,
        Some(SemEvent::Renewed(r)) => {
            Ev::Renewed(std_duration(&r.remaining_ttl.expect("remaining_ttl")))
        }
        Some(SemEvent::Lost(l)) => Ev::Lost(l.reason(), l.message),
        None => panic!("a Hold event without an event"),
    }
}

/// What a watched stream said after its grant, stamped with the moment the test received it.
#[derive(Clone, Debug)]
enum Seen {
    Renewed {
        at: Instant,
        remaining: Duration,
    },
    Lost {
        at: Instant,
        reason: LeaseLostReason,
        message: String,
    },
    /// The stream failed with a gRPC status instead of ending with `lost`.
    Failed {
        at: Instant,
        status: String,
    },
    /// The stream ended without `lost`.
    Ended {
        at: Instant,
    },
}

impl Seen {
    /// A short description for the printed figures.
    fn summary(&self) -> String {
        match self {
            Self::Renewed { remaining, .. } => format!("renewed ({remaining:?} left)"),
            Self::Lost {
                reason, message, ..
            } => format!("lost {reason:?} ({message})"),
            Self::Failed { status, .. } => format!("failed: {status}"),
            Self::Ended { .. } => "ended".to_owned(),
        }
    }

    fn at(&self) -> Instant {
        match self {
            Self::Renewed { at, .. }
            | Self::Lost { at, .. }
            | Self::Failed { at, .. }
            | Self::Ended { at } => *at,
        }
    }
}

/// A granted `Hold` stream read by a task of its own, which records every event. Dropping it
/// drops the stream, and Baton releases the lease at once.
struct Watched {
    name: String,
    fencing_token: u64,
    /// When the grant arrived, and the remaining ttl it reported.
    granted: (Instant, Duration),
    log: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watched {
    /// Waits for the grant on `stream`, then records its events in the background.
    async fn start<T: Send + 'static>(
        name: &str,
        mut stream: tonic::Streaming<T>,
        ev: fn(T) -> Ev,
    ) -> Self {
        let first = within(
            Duration::from_secs(5),
            stream.message(),
            &format!("{name}: the grant"),
        )
        .await
        .unwrap_or_else(|s| panic!("{name}: {s:?}"))
        .unwrap_or_else(|| panic!("{name}: the stream ended without an event"));
        let Ev::Acquired {
            fencing_token,
            remaining,
        } = ev(first)
        else {
            panic!("{name}: not granted")
        };
        let granted = (Instant::now(), remaining);
        let log: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let task = tokio::spawn(Self::record(stream, ev, log.clone()));
        Self {
            name: name.to_owned(),
            fencing_token,
            granted,
            log,
            task,
        }
    }

    async fn record<T>(
        mut stream: tonic::Streaming<T>,
        ev: fn(T) -> Ev,
        log: Arc<Mutex<Vec<Seen>>>,
    ) {
        loop {
            let message = stream.message().await;
            let at = Instant::now();
            let seen = match message {
                Ok(Some(m)) => match ev(m) {
                    Ev::Renewed(remaining) => Seen::Renewed { at, remaining },
                    Ev::Lost(reason, message) => Seen::Lost {
                        at,
                        reason,
                        message,
                    },
                    other => Seen::Failed {
                        at,
                        status: format!("unexpected {other:?}"),
                    },
                },
                Ok(None) => Seen::Ended { at },
                Err(status) => Seen::Failed {
                    at,
                    status: format!("{:?}: {}", status.code(), status.message()),
                },
            };
            let last = !matches!(seen, Seen::Renewed { .. });
            log.lock().unwrap().push(seen);
            if last {
                return;
            }
        }
    }

    fn events(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }

    /// The latest moment the lease can have expired in Redis as of the confirmations received
    /// before `t`: the last one's arrival plus the remaining ttl it reported (an upper bound,
    /// since Baton counts from when it sent the call).
    fn expiry_vouched_before(&self, t: Instant) -> Instant {
        let (at, remaining) = self
            .events()
            .iter()
            .filter_map(|e| match e {
                Seen::Renewed { at, remaining } if *at < t => Some((*at, *remaining)),
                _ => None,
            })
            .next_back()
            .unwrap_or(self.granted);
        at + remaining
    }

    /// The first event received at or after `t`.
    fn first_after(&self, t: Instant) -> Option<Seen> {
        self.events().into_iter().find(|e| e.at() >= t)
    }

    /// When the last confirmation (the grant or a renewal) arrived.
    fn last_confirmation(&self) -> Instant {
        self.events()
            .iter()
            .filter_map(|e| match e {
                Seen::Renewed { at, .. } => Some(*at),
                _ => None,
            })
            .next_back()
            .unwrap_or(self.granted.0)
    }

    fn renewed_after(&self, t: Instant) -> bool {
        self.events()
            .iter()
            .any(|e| matches!(e, Seen::Renewed { at, .. } if *at >= t))
    }

    /// Panics if the stream reported anything but renewals.
    fn assert_kept(&self) {
        let events = self.events();
        if let Some(bad) = events.iter().find(|e| !matches!(e, Seen::Renewed { .. })) {
            panic!(
                "{}: the lease was not kept: {bad:?} (all: {events:?})",
                self.name
            );
        }
    }

    /// Asserts the stream did not stay silent past its lease's expiry after the failure at `t`:
    /// its first event after `t` came before the expiry its last confirmation vouched for, and is
    /// either a renewal (Redis confirmed the lease) or `lost` (UNCONFIRMED or NOT_HELD). Returns
    /// that event.
    fn assert_spoke_in_time(&self, t: Instant) -> Seen {
        let expiry = self.expiry_vouched_before(t);
        let first = self
            .first_after(t)
            .unwrap_or_else(|| panic!("{}: silent since the failure", self.name));
        match &first {
            Seen::Renewed { at, .. } => assert!(*at < expiry, "{}: {first:?}", self.name),
            Seen::Lost { at, reason, .. } => {
                assert!(
                    matches!(
                        reason,
                        LeaseLostReason::Unconfirmed | LeaseLostReason::NotHeld
                    ),
                    "{}: {first:?}",
                    self.name
                );
                assert!(
                    *at < expiry,
                    "{}: `lost` arrived {:?} after the lease could have expired",
                    self.name,
                    *at - expiry
                );
            }
            other => panic!("{}: {other:?} instead of `lost`", self.name),
        }
        first
    }
}

async fn hold_lock(client: &mut LockServiceClient<Channel>, name: &str, ttl_ms: u64) -> Watched {
    let stream = client
        .hold(pb::LockServiceHoldRequest {
            name: name.to_owned(),
            ttl: Some(ms(ttl_ms)),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("Hold {name}: {s:?}"))
        .into_inner();
    Watched::start(name, stream, lock_ev).await
}

async fn hold_permit(
    client: &mut SemaphoreServiceClient<Channel>,
    name: &str,
    limit: u32,
    ttl_ms: u64,
) -> Watched {
    let stream = client
        .hold(pb::SemaphoreServiceHoldRequest {
            name: name.to_owned(),
            limit,
            permits: 1,
            ttl: Some(ms(ttl_ms)),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("Hold {name}: {s:?}"))
        .into_inner();
    Watched::start(name, stream, sem_ev).await
}

/// Waits until every stream of `streams` has said something since `t` (bounded by the lease
/// expiry plus [`SPEAK_SLACK`]).
async fn wait_all_spoke(streams: &[&Watched], t: Instant, what: &str) {
    let limit = Duration::from_millis(FAILOVER_TTL_MS) + SPEAK_SLACK;
    wait_until(limit, what, || {
        let silent: Vec<String> = streams
            .iter()
            .filter(|w| w.first_after(t).is_none())
            .map(|w| w.name.clone())
            .collect();
        async move {
            if silent.is_empty() {
                Ok(())
            } else {
                Err(silent)
            }
        }
    })
    .await;
}

/// How a waiting Acquire ended.
#[derive(Debug)]
enum WaitOutcome {
    Acquired(u64),
    NotAcquired,
    Failed(Code, String),
}

/// Starts an Acquire that waits up to `wait_ms`; resolves to its outcome and how long it took.
fn spawn_waiter(
    client: &LockServiceClient<Channel>,
    name: &str,
    ttl_ms: u64,
    wait_ms: u64,
) -> JoinHandle<(WaitOutcome, Duration, Instant)> {
    let mut client = client.clone();
    let request = lock_request(name, ttl_ms, wait_ms);
    tokio::spawn(async move {
        let started = Instant::now();
        let outcome = match client.acquire(request).await {
            Ok(r) => {
                let r = r.into_inner();
                match r.lease {
                    Some(lease) if r.acquired => WaitOutcome::Acquired(lease.fencing_token),
                    _ => WaitOutcome::NotAcquired,
                }
            }
            Err(s) => WaitOutcome::Failed(s.code(), s.message().to_owned()),
        };
        (outcome, started.elapsed(), Instant::now())
    })
}

/// Failovers of `topology` counted by this process's metrics so far (by every test of this
/// binary: the registry is the process's).
fn failovers_counted(topology: &str) -> f64 {
    let scrape = baton::metrics::encode(baton::metrics::Format::Prometheus).expect("a scrape");
    let series = format!("baton_redis_failovers_total{{topology=\"{topology}\"}} ");
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .map_or(0.0, |v| v.parse().expect("a number"))
}
