//! Redis Cluster, routed by Baton: a slot map fetched with `CLUSTER SLOTS`, a pool of connections
//! per master (the same pool a single Redis gets), and each script sent to the master owning the
//! slot of its first key.
//!
//! A master that fails stays the failure of its own slots. Nothing here is shared by the calls of
//! different masters but the slot map, which is read without waiting: a call for a slot whose
//! master does not answer fails `UNAVAILABLE` naming that master and the cause, while the calls
//! of the other masters go on. The map is refreshed in the background — one refresh at a time, at
//! most every [`MIN_REFRESH_INTERVAL`] — whenever a call meets `MOVED`, `CLUSTERDOWN`,
//! `READONLY`, a node that cannot be reached, or no answer; until the new map is in, calls use the
//! old one (a `MOVED` reply is followed at once). So a failover is picked up as soon as the
//! cluster reports it, and a dead master without a replica costs the other masters nothing.
//!
//! Within a call: `MOVED` and `ASK` are followed (at most [`MAX_REDIRECTS`] times), `TRYAGAIN`
//! (a slot being migrated), `CLUSTERDOWN`, `MASTERDOWN` and `LOADING` are retried after a short
//! pause, and `READONLY` (a master demoted by a failover) waits for the next slot map, all within
//! the call's command timeout. A command without a key (`SCRIPT LOAD` after `NOSCRIPT`, `WAIT`)
//! goes to the connection the call's previous command used.
//!
//! redis-rs's own cluster connection (1.8) is not used: one task drives the commands of every
//! node, and while it recovers (a slot refresh, or a reconnection to the seed nodes that replaces
//! every connection and the slot map) it sends nothing at all. With one master dead, any request
//! that found no connection to it asked for that reconnection, the requests failing during it
//! asked again, and the recovery restarted every few milliseconds for as long as the master was
//! down: the commands of the healthy masters timed out, their leases were lost, and readiness was
//! NOT_SERVING.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex, MutexGuard, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bb8_redis::redis::{
    self, Arg, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo, RedisError,
    RedisFuture, RedisResult, ServerErrorKind, Value, aio::ConnectionLike,
};
use futures::FutureExt;
use tokio::{
    sync::{Notify, watch},
    time::{Instant, timeout_at},
};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{
    Conn, Health, NodePool, PoolSettings, access::Access, breaks_connection, slot_of,
    topology::Endpoint, unsent_or,
};
use crate::error::{Error, describe};

/// Hash slots in a Redis Cluster.
const SLOTS: usize = 16384;
/// Marks a slot no master serves in [`SlotMap::owners`].
const UNSERVED: u16 = u16::MAX;
/// Most redirections (`MOVED`, `ASK`) one command follows.
const MAX_REDIRECTS: u32 = 5;
/// Shortest time between two slot map refreshes: the requests of a burst of failing calls are
/// folded into one refresh per interval.
const MIN_REFRESH_INTERVAL: Duration = Duration::from_millis(100);
/// Shortest pause before a command the cluster asked to retry (`TRYAGAIN`, `CLUSTERDOWN`,
/// `MASTERDOWN`, `LOADING`) is sent again.
///
/// Redis answers `TRYAGAIN` to every multi-key command, so to every Baton script, whose slot is
/// being migrated unless all its keys exist on one side: each step of a live resharding refuses
/// them for a few milliseconds, and the call is retried within its timeout.
const RETRY_MIN_WAIT: Duration = Duration::from_millis(2);
/// Longest pause between two such retries.
const RETRY_MAX_WAIT: Duration = Duration::from_millis(100);
/// Retry `n` pauses up to `RETRY_FACTOR * 2^n` (10, 20, 40, 80 ms, then the longest), jittered
/// from [`RETRY_MIN_WAIT`]. The command timeout bounds the whole.
const RETRY_FACTOR: Duration = Duration::from_millis(5);

/// One master of the cluster: its address and a pool of connections to it.
pub struct Node {
    addr: Arc<str>,
    info: ConnectionInfo,
    access: Arc<Access>,
    pool: NodePool,
}

impl Node {
    /// `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// How to connect to it now: the database of the first seed URL, with the user, password
    /// and TLS settings of the moment.
    pub fn connection_info(&self) -> ConnectionInfo {
        self.access.snapshot().apply(self.info.clone())
    }
}

/// Which master serves each slot, as one node reported it.
struct SlotMap {
    /// For each slot, its master's index in `nodes`, or [`UNSERVED`].
    owners: Vec<u16>,
    /// The masters, each once.
    nodes: Vec<Arc<Node>>,
}

impl SlotMap {
    fn owner(&self, slot: u16) -> Option<&Arc<Node>> {
        let index = *self.owners.get(usize::from(slot))?;
        self.nodes.get(usize::from(index))
    }

    /// How many slots each master serves, by index in `nodes`.
    fn slot_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.nodes.len()];
        for &owner in &self.owners {
            if let Some(count) = counts.get_mut(usize::from(owner)) {
                *count += 1;
            }
        }
        counts
    }
}

/// The slot map last fetched, and how the last refresh went.
#[derive(Default)]
struct MapState {
    map: Option<Arc<SlotMap>>,
    /// Why the last refresh failed; `None` after a successful one.
    error: Option<Error>,
    /// Bumped by every refresh, successful or not.
    generation: u64,
}

/// A Redis Cluster as Baton uses it. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    /// `host:port` of each seed node.
    seeds: Vec<Arc<str>>,
    /// The first seed's connection settings (credentials, database, TLS or not), for every
    /// node.
    template: ConnectionInfo,
    /// The user, password and TLS settings of the moment, for every connection.
    access: Arc<Access>,
    settings: PoolSettings,
    /// Every node Baton has a pool for, by `host:port`.
    nodes: Mutex<HashMap<Arc<str>, Arc<Node>>>,
    state: watch::Sender<MapState>,
    /// Asks the refresher for a refresh.
    wake: Arc<Notify>,
    refresher_started: AtomicBool,
    /// Stops the refresher when the last handle goes.
    stop: CancellationToken,
    _stop_on_drop: DropGuard,
}

impl Cluster {
    /// Sets up the cluster from its seed URLs without connecting yet.
    pub(super) fn new(
        seeds: &[String],
        settings: PoolSettings,
        access: Arc<Access>,
    ) -> Result<Self, Error> {
        let mut template = None;
        let mut addrs = Vec::new();
        for seed in seeds {
            let info = seed.as_str().into_connection_info().map_err(|e| {
                Error::Internal(format!("redis url {:?}: {e}", crate::config::masked(seed)))
            })?;
            let (ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. }) =
                info.addr()
            else {
                return Err(Error::Internal(format!(
                    "redis url {:?}: a Cluster seed must be redis://host:port or \
                     rediss://host:port",
                    crate::config::masked(seed)
                )));
            };
            addrs.push(Arc::from(format!("{host}:{port}")));
            template.get_or_insert(info);
        }
        let template =
            template.ok_or_else(|| Error::Internal("a Cluster without seed nodes".into()))?;
        // Commands use RESP2; the subscriber asks for RESP3 itself.
        let redis = template
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP2);
        let template = template.set_redis_settings(redis);
        let stop = CancellationToken::new();
        Ok(Self {
            inner: Arc::new(Inner {
                seeds: addrs,
                template,
                access,
                settings,
                nodes: Mutex::new(HashMap::new()),
                state: watch::Sender::new(MapState::default()),
                wake: Arc::new(Notify::new()),
                refresher_started: AtomicBool::new(false),
                _stop_on_drop: stop.clone().drop_guard(),
                stop,
            }),
        })
    }

    /// A connection-like handle that routes each command of one call, by `deadline`. `home` is
    /// the slot a command without a key goes to when no command went anywhere before it.
    pub fn route(&self, deadline: Instant, home: Option<u16>) -> Routed<'_> {
        Routed {
            cluster: self,
            deadline,
            home,
            last: None,
            failure: None,
        }
    }

    fn nodes(&self) -> MutexGuard<'_, HashMap<Arc<str>, Arc<Node>>> {
        // Only pools live in this map: a panic while holding the lock leaves nothing half done.
        self.inner.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The node at `addr` (`host:port`), with a pool of its own, made on first use.
    pub fn node(&self, addr: &str) -> Result<Arc<Node>, Error> {
        if let Some(node) = self.nodes().get(addr) {
            return Ok(node.clone());
        }
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .ok_or_else(|| {
                Error::Unavailable(format!("the cluster named a bad address {addr:?}"))
            })?;
        // Every node is reached as the seeds are: over TLS when they are `rediss://` (the
        // settings of the moment are put on when a connection opens).
        let node_addr = match self.inner.template.addr() {
            ConnectionAddr::TcpTls { .. } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        let info = self.inner.template.clone().set_addr(node_addr);
        let mut nodes = self.nodes();
        let node = nodes
            .entry(Arc::from(addr))
            .or_insert_with(|| {
                let endpoint = Endpoint::Fixed {
                    info: Arc::new(info.clone()),
                    access: self.inner.access.clone(),
                };
                Arc::new(Node {
                    addr: Arc::from(addr),
                    info,
                    access: self.inner.access.clone(),
                    pool: NodePool::new(endpoint, self.inner.settings),
                })
            })
            .clone();
        Ok(node)
    }

    /// Asks for the slot map to be fetched again, in the background.
    pub fn request_refresh(&self) {
        if !self.inner.refresher_started.swap(true, Ordering::AcqRel) {
            tokio::spawn(refresher(
                Arc::downgrade(&self.inner),
                self.inner.wake.clone(),
                self.inner.stop.clone(),
            ));
        }
        self.inner.wake.notify_one();
    }

    /// The current slot map, fetching one first (by `deadline`) when there is none yet.
    async fn map(&self, deadline: Instant) -> Result<Arc<SlotMap>, Error> {
        let mut state = self.inner.state.subscribe();
        let asked_at = {
            let now = state.borrow_and_update();
            if let Some(map) = &now.map {
                return Ok(map.clone());
            }
            now.generation
        };
        self.request_refresh();
        loop {
            if timeout_at(deadline, state.changed()).await.is_err() {
                return Err(Error::Unavailable(
                    "the cluster's slot map could not be fetched in time".into(),
                ));
            }
            let now = state.borrow_and_update();
            if let Some(map) = &now.map {
                return Ok(map.clone());
            }
            if now.generation > asked_at {
                return Err(now.error.clone().unwrap_or_else(|| {
                    Error::Unavailable("the cluster's slot map is not known".into())
                }));
            }
        }
    }

    /// The master serving `slot`.
    pub async fn owner(&self, slot: u16, deadline: Instant) -> Result<Arc<Node>, Error> {
        let map = self.map(deadline).await?;
        match map.owner(slot) {
            Some(node) => Ok(node.clone()),
            None => {
                self.request_refresh();
                Err(Error::Unavailable(format!(
                    "no master of the cluster serves slot {slot}"
                )))
            }
        }
    }

    /// Waits for the next slot map after the current one (by `deadline`).
    async fn next_map(&self, deadline: Instant) {
        let mut state = self.inner.state.subscribe();
        state.borrow_and_update();
        self.request_refresh();
        let _ = timeout_at(deadline, state.changed()).await;
    }

    /// Fetches the slot map from whichever known node or seed answers `CLUSTER SLOTS` first.
    async fn fetch(&self) -> Result<SlotMap, Error> {
        let deadline = Instant::now()
            + self.inner.settings.connect_timeout
            + self.inner.settings.command_timeout;
        let mut candidates: Vec<Arc<str>> = Vec::new();
        if let Some(map) = &self.inner.state.borrow().map {
            candidates.extend(map.nodes.iter().map(|n| n.addr.clone()));
        }
        for seed in &self.inner.seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        let asks = candidates.into_iter().map(|addr| {
            async move {
                let node = self.node(&addr)?;
                let mut conn = node.pool.checkout(deadline).await.map_err(|e| match e {
                    Error::FailedPrecondition(_) => e,
                    e => Error::Unavailable(format!("{addr}: {e}")),
                })?;
                let reply = timeout_at(
                    deadline,
                    redis::cmd("CLUSTER")
                        .arg("SLOTS")
                        .query_async::<Value>(&mut conn.conn),
                )
                .await
                .map_err(|_| Error::Unavailable(format!("{addr}: no answer to CLUSTER SLOTS")))?
                .map_err(|e| {
                    if breaks_connection(&e) {
                        conn.mark_broken();
                    }
                    Error::Unavailable(format!("{addr}: {}", describe(&e)))
                })?;
                let host = addr.rsplit_once(':').map_or(&*addr, |(h, _)| h);
                parse_slots(reply, host)
                    .map_err(|e| Error::Unavailable(format!("{addr}: CLUSTER SLOTS: {e}")))
            }
            .boxed()
        });
        let (ranges, _) = futures::future::select_ok(asks)
            .await
            .map_err(|e| match e {
                // A server too old for Baton: say so, not that it did not answer.
                Error::FailedPrecondition(_) => e,
                e => Error::Unavailable(format!(
                    "no cluster node answered CLUSTER SLOTS (last: {e})"
                )),
            })?;
        let mut owners = vec![UNSERVED; SLOTS];
        let mut nodes: Vec<Arc<Node>> = Vec::new();
        for (first, last, addr) in ranges {
            let index = match nodes.iter().position(|n| *n.addr == *addr) {
                Some(i) => i,
                None => {
                    nodes.push(self.node(&addr)?);
                    nodes.len() - 1
                }
            };
            let index = u16::try_from(index).unwrap_or(UNSERVED);
            for slot in first..=last.min(SLOTS as u16 - 1) {
                owners[usize::from(slot)] = index;
            }
        }
        Ok(SlotMap { owners, nodes })
    }

    /// Installs a refresh's outcome, and forgets the pools of nodes that left the cluster.
    fn install(&self, fetched: Result<SlotMap, Error>) {
        match fetched {
            Ok(map) => {
                if let Some(previous) = &self.inner.state.borrow().map {
                    note_change(previous, &map);
                }
                let keep: HashSet<Arc<str>> = map
                    .nodes
                    .iter()
                    .map(|n| n.addr.clone())
                    .chain(self.inner.seeds.iter().cloned())
                    .collect();
                self.nodes().retain(|addr, _| keep.contains(addr));
                self.inner.state.send_modify(|s| {
                    s.map = Some(Arc::new(map));
                    s.error = None;
                    s.generation += 1;
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "the cluster's slot map could not be refreshed");
                self.inner.state.send_modify(|s| {
                    s.error = Some(e);
                    s.generation += 1;
                });
            }
        }
    }

    /// Which masters can serve, by `timeout`: each one is asked `CLUSTER INFO`, and serves when
    /// it answers with `cluster_state:ok`. Baton is ready when at least one master serves; a
    /// master that does not makes the names on its slots fail, not the others.
    pub async fn health(&self, timeout: Duration) -> Health {
        let deadline = Instant::now() + timeout;
        let map = match self.map(deadline).await {
            Ok(map) => map,
            Err(e) => return Health::Down(e),
        };
        if map.nodes.is_empty() {
            self.request_refresh();
            return Health::Down(Error::Unavailable(
                "no master of the cluster serves any slot".into(),
            ));
        }
        let checks = map.nodes.iter().map(|node| async move {
            let mut conn = node.pool.checkout(deadline).await?;
            let info = timeout_at(
                deadline,
                redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query_async::<String>(&mut conn.conn),
            )
            .await
            .map_err(|_| Error::Unavailable("no answer to CLUSTER INFO".into()))?
            .map_err(|e| {
                if breaks_connection(&e) {
                    conn.mark_broken();
                }
                Error::from(e)
            })?;
            let state = info
                .lines()
                .find_map(|l| l.strip_prefix("cluster_state:"))
                .map(str::trim);
            match state {
                Some("ok") => Ok(()),
                other => Err(Error::Unavailable(format!(
                    "reports cluster_state:{}",
                    other.unwrap_or("?")
                ))),
            }
        });
        let results = futures::future::join_all(checks).await;
        let counts = map.slot_counts();
        let down: Vec<String> = results
            .iter()
            .zip(&map.nodes)
            .zip(&counts)
            .filter_map(|((result, node), slots)| {
                result
                    .as_ref()
                    .err()
                    .map(|e| format!("{} ({slots} slots): {e}", node.addr))
            })
            .collect();
        if down.is_empty() {
            return Health::Up;
        }
        // The map may be stale (a failover promoted a replica): look again.
        self.request_refresh();
        let masters = map.nodes.len();
        let text = format!(
            "{} of {masters} masters cannot serve: {}",
            down.len(),
            down.join("; ")
        );
        if down.len() == masters {
            Health::Down(Error::Unavailable(text))
        } else {
            Health::Partial(text)
        }
    }

    /// Connects to every master by `deadline` (each connection checks the server's version);
    /// the first failure, a version refusal before anything else.
    pub async fn check_masters(&self, deadline: Instant) -> Result<(), Error> {
        let map = self.map(deadline).await?;
        let checks = map.nodes.iter().map(|node| async move {
            node.pool
                .checkout(deadline)
                .await
                .map(drop)
                .map_err(|e| match e {
                    Error::FailedPrecondition(_) => e,
                    other => Error::Unavailable(format!("cluster node {}: {other}", node.addr)),
                })
        });
        let results = futures::future::join_all(checks).await;
        if let Some(refused) = results
            .iter()
            .find(|r| matches!(r, Err(Error::FailedPrecondition(_))))
        {
            return refused.clone();
        }
        results.into_iter().collect()
    }
}

/// Counts and logs a change of the slot map: slots served by other masters (a resharding, a node
/// added), and a failover when a master left while another node took its slots.
fn note_change(previous: &SlotMap, next: &SlotMap) {
    let owner = |map: &SlotMap, slot: usize| {
        map.owners
            .get(slot)
            .and_then(|&i| map.nodes.get(usize::from(i)))
            .map(|n| n.addr.clone())
    };
    if (0..SLOTS).all(|slot| owner(previous, slot) == owner(next, slot)) {
        return;
    }
    let masters =
        |map: &SlotMap| -> HashSet<Arc<str>> { map.nodes.iter().map(|n| n.addr.clone()).collect() };
    let (before, after) = (masters(previous), masters(next));
    let gone: Vec<&str> = before.difference(&after).map(|a| &**a).collect();
    let new: Vec<&str> = after.difference(&before).map(|a| &**a).collect();
    let failover = !gone.is_empty() && !new.is_empty();
    crate::metrics::topology_change("cluster", failover);
    let mut now: Vec<&str> = after.iter().map(|a| &**a).collect();
    now.sort_unstable();
    if failover {
        tracing::warn!(masters = ?now, gone = ?gone, new = ?new, "the cluster's slot map changed: a failover");
    } else {
        tracing::info!(masters = ?now, gone = ?gone, new = ?new, "the cluster's slot map changed");
    }
}

/// Keeps the slot map fresh: one refresh per request, at most one every
/// [`MIN_REFRESH_INTERVAL`], until the cluster handle is gone.
async fn refresher(inner: Weak<Inner>, wake: Arc<Notify>, stop: CancellationToken) {
    let mut last: Option<Instant> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = wake.notified() => {}
        }
        if let Some(last) = last {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep_until(last + MIN_REFRESH_INTERVAL) => {}
            }
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        last = Some(Instant::now());
        let cluster = Cluster { inner };
        let fetched = cluster.fetch().await;
        cluster.install(fetched);
    }
}

/// Parses a `CLUSTER SLOTS` reply into `(first, last, master host:port)` ranges. An empty host
/// means the node that answered (`asked`); a range whose master has no known endpoint (`?`) is
/// left out.
fn parse_slots(reply: Value, asked: &str) -> Result<Vec<(u16, u16, String)>, String> {
    let Value::Array(entries) = reply else {
        return Err(format!("unexpected reply {reply:?}"));
    };
    let mut ranges = Vec::new();
    for entry in entries {
        let Value::Array(fields) = entry else {
            return Err(format!("unexpected range {entry:?}"));
        };
        let int = |v: Option<&Value>| match v {
            Some(Value::Int(n)) => u16::try_from(*n).ok(),
            _ => None,
        };
        let (Some(first), Some(last)) = (int(fields.first()), int(fields.get(1))) else {
            return Err(format!("unexpected range bounds {fields:?}"));
        };
        let Some(Value::Array(master)) = fields.get(2) else {
            return Err(format!("a range without a master: {fields:?}"));
        };
        let host = match master.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err(format!("a master without a host: {master:?}")),
        };
        let Some(port) = int(master.get(1)) else {
            return Err(format!("a master without a port: {master:?}"));
        };
        let host = match host.as_str() {
            "?" => continue,
            "" => asked.to_owned(),
            _ => host,
        };
        ranges.push((first, last, format!("{host}:{port}")));
    }
    Ok(ranges)
}

/// The slot of a script call's first key (`EVALSHA`/`EVAL` with at least one key); `None` for
/// any other command.
fn script_slot(cmd: &Cmd) -> Option<u16> {
    let mut args = cmd.args_iter().map(|a| match a {
        Arg::Simple(bytes) => bytes,
        _ => &[][..],
    });
    let name = args.next()?;
    let is_script = [&b"EVALSHA"[..], b"EVAL", b"EVALSHA_RO", b"EVAL_RO"]
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n));
    if !is_script {
        return None;
    }
    let _script = args.next()?;
    let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
    if keys == 0 {
        return None;
    }
    Some(slot_of(args.next()?))
}

/// The pause before retry number `n` (from 0) of a command the cluster asked to retry.
fn retry_pause(n: u32) -> Duration {
    let ceiling = RETRY_FACTOR
        .saturating_mul(1u32 << n.min(16))
        .clamp(RETRY_MIN_WAIT, RETRY_MAX_WAIT);
    // Jitter without a random source: spread by the sub-millisecond part of the clock.
    let spread = ceiling.saturating_sub(RETRY_MIN_WAIT).as_micros().max(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    RETRY_MIN_WAIT + Duration::from_micros((u128::from(nanos) % spread) as u64)
}

/// Where the next attempt of a command goes.
enum Target {
    /// The master serving this slot in the current map.
    Slot(u16),
    /// This node (a redirection, or the node the call's previous command went to).
    Node(Arc<Node>),
    /// Any master that answers.
    Any,
}

/// The commands of one call, routed over the cluster: a [`ConnectionLike`] for redis-rs's script
/// and command helpers.
pub struct Routed<'a> {
    cluster: &'a Cluster,
    deadline: Instant,
    home: Option<u16>,
    /// The node and connection the latest command went to.
    last: Option<(Arc<Node>, Conn)>,
    /// Why the latest command failed, when Baton's routing (not Redis) failed it.
    failure: Option<Error>,
}

impl Routed<'_> {
    /// Moves the deadline of the commands still to come (a `WAIT` gets longer than a script).
    pub fn extend(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }

    /// Turns a bounded call's outcome into a result: the routing's own failure when it had one,
    /// the Redis error otherwise; no answer in time marks the connection broken and has the slot
    /// map looked at again (the node may be gone).
    pub fn settle<T>(
        &mut self,
        outcome: Result<RedisResult<T>, tokio::time::error::Elapsed>,
    ) -> Result<T, Error> {
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self
                .failure
                .take()
                .unwrap_or_else(|| super::unanswered_if_lost(e))),
            Err(_) => {
                self.cluster.request_refresh();
                let node = match &self.last {
                    Some((node, conn)) => {
                        conn.mark_broken();
                        format!(" from cluster node {}", node.addr)
                    }
                    None => String::new(),
                };
                Err(Error::Unanswered(format!(
                    "no answer within {}{node}",
                    humantime::format_duration(self.cluster.inner.settings.command_timeout)
                )))
            }
        }
    }

    /// Records a routing failure and hands redis-rs an error that it passes straight back.
    fn fail(&mut self, e: Error) -> RedisError {
        self.failure = Some(e);
        RedisError::from((ErrorKind::Io, "cluster routing failed"))
    }

    /// A connection to `node`: the call's previous one when it went there too.
    async fn connection(&mut self, node: &Arc<Node>) -> Result<Conn, Error> {
        if let Some((last, conn)) = &self.last
            && Arc::ptr_eq(last, node)
            && !conn.is_broken()
        {
            return Ok(conn.clone());
        }
        node.pool.checkout(self.deadline).await
    }

    async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        self.failure = None;
        let slot = script_slot(cmd);
        let mut target = match (slot, &self.last, self.home) {
            (Some(slot), _, _) => Target::Slot(slot),
            (None, Some((node, _)), _) => Target::Node(node.clone()),
            (None, None, Some(home)) => Target::Slot(home),
            (None, None, None) => Target::Any,
        };
        let mut asking = false;
        let mut redirects = 0;
        let mut retries = 0;
        loop {
            let node = match &target {
                Target::Slot(slot) => self
                    .cluster
                    .owner(*slot, self.deadline)
                    .await
                    .map_err(|e| self.fail(e))?,
                Target::Node(node) => node.clone(),
                Target::Any => {
                    let map = self
                        .cluster
                        .map(self.deadline)
                        .await
                        .map_err(|e| self.fail(e))?;
                    // The first master that gives a connection.
                    let mut found = None;
                    let mut last = Error::Unavailable("the cluster has no master".into());
                    for node in &map.nodes {
                        match node.pool.checkout(self.deadline).await {
                            Ok(conn) => {
                                self.last = Some((node.clone(), conn));
                                found = Some(node.clone());
                                break;
                            }
                            Err(e) => last = e,
                        }
                    }
                    match found {
                        Some(node) => node,
                        None => return Err(self.fail(last)),
                    }
                }
            };
            let conn = match self.connection(&node).await {
                Ok(conn) => conn,
                Err(e) => {
                    // The map may be stale (the master failed over): look again.
                    self.cluster.request_refresh();
                    let e = match e {
                        Error::Unavailable(cause) => Error::Unavailable(format!(
                            "cluster node {} is unreachable: {cause}",
                            node.addr
                        )),
                        other => other,
                    };
                    return Err(self.fail(e));
                }
            };
            self.last = Some((node.clone(), conn.clone()));
            let mut sender = conn.conn.clone();
            let sent = unsent_or(async {
                if asking {
                    let mut pipe = redis::pipe();
                    pipe.cmd("ASKING").add_command(cmd.clone());
                    sender
                        .req_packed_commands(&pipe, 1, 1)
                        .await
                        .and_then(|mut values| values.pop().ok_or_else(no_reply))
                } else {
                    sender.req_packed_command(cmd).await
                }
            })
            .await;
            let Some(reply) = sent else {
                // The node had closed this connection before the command was written: the
                // command goes on another.
                conn.mark_broken();
                continue;
            };
            let reply = reply.and_then(Value::extract_error);
            let e = match reply {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            match e.kind() {
                ErrorKind::Server(kind @ (ServerErrorKind::Moved | ServerErrorKind::Ask))
                    if redirects < MAX_REDIRECTS =>
                {
                    let Some((addr, _)) = e.redirect_node() else {
                        return Err(e);
                    };
                    redirects += 1;
                    asking = kind == ServerErrorKind::Ask;
                    if !asking {
                        self.cluster.request_refresh();
                    }
                    target = Target::Node(self.cluster.node(addr).map_err(|e| self.fail(e))?);
                }
                ErrorKind::Server(
                    kind @ (ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::BusyLoading),
                ) => {
                    if kind != ServerErrorKind::TryAgain {
                        self.cluster.request_refresh();
                    }
                    let resume = Instant::now() + retry_pause(retries);
                    if resume >= self.deadline {
                        return Err(e);
                    }
                    retries += 1;
                    // A new attempt: its redirections are counted afresh. A script on keys that
                    // exist on neither side of a half-moved slot meets ASK on the owner and
                    // TRYAGAIN on the target every time, until the migration ends or the
                    // command timeout does.
                    redirects = 0;
                    tokio::time::sleep_until(resume).await;
                    if let Some(slot) = slot {
                        target = Target::Slot(slot);
                        asking = false;
                    }
                }
                ErrorKind::Server(ServerErrorKind::ReadOnly) if slot.is_some() => {
                    // A master demoted by a failover: route again by the next slot map.
                    conn.mark_broken();
                    self.cluster.next_map(self.deadline).await;
                    if Instant::now() >= self.deadline {
                        return Err(e);
                    }
                    target = Target::Slot(slot.unwrap_or_default());
                    asking = false;
                }
                _ => {
                    if breaks_connection(&e) {
                        conn.mark_broken();
                        self.cluster.request_refresh();
                        if e.is_io_error() || e.is_connection_dropped() {
                            // Written before the connection broke: Redis may have run it.
                            let cause = Error::Unanswered(format!(
                                "cluster node {}: {}",
                                node.addr,
                                describe(&e)
                            ));
                            return Err(self.fail(cause));
                        }
                    }
                    return Err(e);
                }
            }
        }
    }
}

fn no_reply() -> RedisError {
    RedisError::from((ErrorKind::Io, "no reply to a redirected command"))
}

impl ConnectionLike for Routed<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.send(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a redis::Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async {
            Err(RedisError::from((
                ErrorKind::Client,
                "Baton sends no pipelines over a Cluster",
            )))
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `CLUSTER SLOTS` reply becomes master ranges; an empty host is the node asked, and a
    /// range whose master has no known endpoint is left out.
    #[test]
    fn parses_cluster_slots() {
        let master = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                master("10.0.0.1", 7000),
                master("10.0.0.4", 7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(10922), master("", 7001)]),
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(16383),
                master("?", 7002),
            ]),
        ]);
        assert_eq!(
            parse_slots(reply, "10.0.0.9").expect("parsed"),
            vec![
                (0, 5460, "10.0.0.1:7000".to_owned()),
                (5461, 10922, "10.0.0.9:7001".to_owned())
            ]
        );
        assert!(parse_slots(Value::Int(1), "h").is_err());
    }

    /// A script call is routed by its first key's slot; other commands have none.
    #[test]
    fn script_calls_route_by_first_key() {
        let mut eval = redis::cmd("EVALSHA");
        eval.arg("abc")
            .arg(2)
            .arg("{user1000}.a")
            .arg("{user1000}.b")
            .arg("x");
        assert_eq!(script_slot(&eval), Some(super::super::slot("user1000")));
        let mut keyless = redis::cmd("evalsha");
        keyless.arg("abc").arg(0).arg("x");
        assert_eq!(script_slot(&keyless), None);
        assert_eq!(script_slot(redis::cmd("SCRIPT").arg("LOAD").arg("x")), None);
        assert_eq!(script_slot(&redis::cmd("PING")), None);
    }

    /// Retry pauses stay within their bounds and grow with the attempt.
    #[test]
    fn retry_pauses_are_bounded() {
        for n in 0..40 {
            let pause = retry_pause(n);
            assert!(
                pause >= RETRY_MIN_WAIT && pause <= RETRY_MAX_WAIT,
                "{n}: {pause:?}"
            );
        }
        assert!(retry_pause(0) <= RETRY_FACTOR.max(RETRY_MIN_WAIT));
    }
}
