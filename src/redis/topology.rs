//! Which Redis deployment Baton talks to, and how a connection to the right node is found.
//!
//! - **Standalone**: one Redis (`redis://host:port` or `unix:///path`).
//! - **Sentinel**: a master found through Sentinels. Every new connection asks all of them at
//!   once for the current master (`SENTINEL MASTERS`) and takes the first named master that
//!   answers `ROLE` as master, skipping one named under an older configuration epoch. While
//!   Baton runs, it also watches the master: it listens for the failover announcements
//!   ([`EVENTS`]) on every Sentinel and asks them all every [`MASTER_POLL`] and after each
//!   announcement. When a Sentinel starts promoting a replica, or the Sentinels name another
//!   master, every connection to the old one is given up at once (see [`Endpoint::is_current`]
//!   and [`Endpoint::superseded`]); while a replica is being promoted, no master is used.
//! - **Cluster**: seed nodes of a Redis Cluster; Baton reads the slot map from them and routes
//!   each script to the master owning its slot (see `cluster.rs`).

use std::{
    collections::HashSet,
    future::Future,
    sync::{
        Arc, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bb8_redis::redis::{
    self, AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo,
    RedisConnectionInfo, RedisError, Value, aio::MultiplexedConnection,
};
use futures::{StreamExt, stream::FuturesUnordered};
use tokio::{
    sync::{Notify, watch},
    time::{Instant, timeout_at},
};
use tokio_util::sync::CancellationToken;

use super::access::{Access, Snapshot};
use crate::{
    config::{RedisAccess, Topology},
    error::{Error, describe},
    metrics,
};

/// How often the Sentinels are asked for the master's address while Baton runs in Sentinel
/// mode: the backstop for a `+switch-master` message that did not arrive.
pub const MASTER_POLL: Duration = Duration::from_millis(300);

/// How long the periodic question may wait for the Sentinels' answers; a Sentinel that has not
/// answered by then is left out of that round.
const POLL_LIMIT: Duration = Duration::from_secs(1);

/// How long a Sentinel whose pub/sub connection failed or dropped is left before Baton
/// subscribes to it again (the periodic question goes on meanwhile).
const LISTEN_RETRY: Duration = Duration::from_secs(1);

/// How long a Sentinel that refused Baton's subscription (its ACL rule lacks it) is left before
/// Baton subscribes again.
const REFUSED_RETRY: Duration = Duration::from_secs(60);

/// The Sentinel events that announce a failover: the Sentinel leading it publishes
/// `+selected-slave` when it has chosen the replica to promote (just before it sends it
/// `REPLICAOF NO ONE`), `+failover-state-wait-promotion` once it has sent it, and
/// `+promoted-slave` when it sees the replica promoted; every Sentinel publishes `+switch-master`
/// once it has moved to the new master.
const EVENTS: [&str; 4] = [
    "+selected-slave",
    "+failover-state-wait-promotion",
    "+promoted-slave",
    "+switch-master",
];

/// How long the master stays unused after a Sentinel said it was promoting a replica and no
/// Sentinel says so any more, when that Sentinel no longer answers (the failover stalled with
/// it).
const FENCE_LIMIT: Duration = Duration::from_secs(10);

/// The failover states (`SENTINEL MASTERS`'s `failover-state`) in which the Sentinel leading a
/// failover has chosen a replica to promote but still names the old master: the replica may
/// already take writes, so the old master's answers can no longer be trusted.
const PROMOTING: [&str; 5] = [
    "select_slave",
    "send_slaveof_noone",
    "wait_promotion",
    "reconf_slaves",
    "update_config",
];

/// Finds the node a non-cluster connection goes to: fixed for a standalone Redis (or one Cluster
/// master), asked of the Sentinels for every new connection otherwise. Either way the
/// connection takes the user, password and TLS settings of the moment ([`Access`]). Cheap to
/// clone.
#[derive(Clone)]
pub enum Endpoint {
    /// Always the same server.
    Fixed {
        /// Its address, database and the URL's own credentials.
        info: Arc<ConnectionInfo>,
        /// The settings of the moment, put over `info`.
        access: Arc<Access>,
    },
    /// The current master, as the Sentinels report it.
    Sentinel(Arc<Sentinels>),
}

/// The master the Sentinels named last.
#[derive(Clone, Debug, Default)]
struct Master {
    /// Its address (`host:port`); `None` before any Sentinel named one.
    addr: Option<String>,
    /// The Sentinels' configuration epoch that named it (bumped by every failover).
    epoch: u64,
    /// Bumped each time the address changes, and when a failover starts: a connection opened
    /// under an older one goes to a master that is no longer current.
    generation: u64,
    /// The Sentinel promoting a replica of this master, and when it last said so: no
    /// connection to the master is opened or used until the Sentinels name the new master, that
    /// Sentinel says the failover was given up, or none says it is promoting for
    /// [`FENCE_LIMIT`].
    fenced: Option<(String, Instant)>,
}

/// What one Sentinel said of the master.
struct Named {
    /// The Sentinel's address.
    sentinel: String,
    host: String,
    port: u16,
    /// Its configuration epoch for the master (0 when it does not say).
    epoch: u64,
    /// Whether it is promoting a replica of the master it names (see [`PROMOTING`]).
    promoting: bool,
}

impl Named {
    fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// The Sentinels of a master, and the master they named last.
pub struct Sentinels {
    /// The Sentinels' addresses (the URLs' own credentials are not used: see
    /// [`Sentinels::sentinel_info`]).
    sentinels: Vec<ConnectionInfo>,
    /// The master's name.
    master: String,
    /// The database and credentials of connections to the master (from the first URL).
    node: RedisConnectionInfo,
    /// Whether the Sentinels and the master are reached over TLS (`rediss://`).
    tls: bool,
    access: Arc<Access>,
    /// The master named last, watched by the pub/sub connection.
    known: watch::Sender<Master>,
    /// Whether the watch of the master's address was started.
    watching: AtomicBool,
    /// Asks the watch to question the Sentinels now (a Sentinel announced a failover).
    wake: Arc<Notify>,
    /// Stops the watch's tasks when these Sentinels are dropped.
    stop: CancellationToken,
    /// A connection to each Sentinel, kept between questions (see [`Sentinels::ask`]).
    links: std::sync::Mutex<Vec<Option<(u64, MultiplexedConnection)>>>,
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Sentinels {
    /// The connection settings of `sentinel`: TLS as for every connection, and the user and
    /// password given by flags, or else those of the first URL.
    fn sentinel_info(&self, snapshot: &Snapshot, sentinel: &ConnectionInfo) -> ConnectionInfo {
        let (flag_user, flag_password) = snapshot.credentials();
        let mut settings = RedisConnectionInfo::default();
        if let Some(user) = flag_user.or(self.node.username()) {
            settings = settings.set_username(user);
        }
        if let Some(password) = flag_password.or(self.node.password()) {
            settings = settings.set_password(password);
        }
        snapshot
            .apply(sentinel.clone())
            .set_redis_settings(settings)
    }

    /// The connection settings of the master at `host:port`.
    fn master_info(&self, snapshot: &Snapshot, host: &str, port: u16) -> ConnectionInfo {
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: snapshot.insecure(),
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        };
        let info = addr
            .into_connection_info()
            .expect("an address converts")
            .set_redis_settings(self.node.clone());
        snapshot.apply(info)
    }

    /// Asks `sentinel` which master it names, and its configuration epoch, by `deadline`.
    /// `Ok(None)`: it does not know the name.
    /// The connection to Sentinel `index` is kept for the next question (opened again when it
    /// failed, or when the settings of the moment changed).
    async fn ask(
        &self,
        snapshot: &Snapshot,
        index: usize,
        deadline: Instant,
    ) -> Result<Option<Named>, String> {
        let sentinel = &self.sentinels[index];
        let name = sentinel.addr().to_string();
        let kept = self.links()[index]
            .as_ref()
            .filter(|(generation, _)| *generation == snapshot.generation)
            .map(|(_, conn)| conn.clone());
        let mut conn = match kept {
            Some(conn) => conn,
            None => {
                let failed = |e: RedisError| format!("Sentinel {name}: {}", connect_cause(&e));
                let client =
                    Client::open(self.sentinel_info(snapshot, sentinel)).map_err(failed)?;
                let limit = deadline.saturating_duration_since(Instant::now());
                // Every question is bounded by its own deadline, not by a response timeout.
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(limit))
                    .set_response_timeout(None);
                let conn = timeout_at(
                    deadline,
                    client.get_multiplexed_async_connection_with_config(&config),
                )
                .await
                .map_err(|_| format!("Sentinel {name}: no connection in time"))?
                .map_err(failed)?;
                self.links()[index] = Some((snapshot.generation, conn.clone()));
                conn
            }
        };
        let answer = self.query(&mut conn, name, deadline).await;
        if answer.is_err() {
            self.links()[index] = None;
        }
        answer
    }

    /// The kept connections to the Sentinels, by index, with the settings' generation each was
    /// opened under.
    fn links(&self) -> std::sync::MutexGuard<'_, Vec<Option<(u64, MultiplexedConnection)>>> {
        // Never held across an await; a panic leaves at worst a connection to open again.
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the Sentinel `name` on `conn` which master it names, by `deadline`.
    async fn query(
        &self,
        conn: &mut MultiplexedConnection,
        name: String,
        deadline: Instant,
    ) -> Result<Option<Named>, String> {
        let late = || format!("Sentinel {name}: no answer in time");
        let failed = |e: RedisError| format!("Sentinel {name}: {}", connect_cause(&e));
        // `SENTINEL MASTERS` (the command Baton's documented ACL rules allow) gives each
        // master's address, its configuration epoch (which tells a Sentinel that has not heard of
        // the last failover from one that has) and, on the Sentinel leading a failover, its
        // state. It names the old master until the failover is over (`+switch-master`).
        let masters = timeout_at(
            deadline,
            redis::cmd("SENTINEL")
                .arg("MASTERS")
                .query_async::<Value>(conn),
        )
        .await
        .map_err(|_| late())?;
        let masters = match masters {
            Ok(masters) => masters,
            Err(e) if is_unknown_command(&e) => {
                return Err(format!(
                    "{name} is not a Sentinel (it refused the SENTINEL command: {}): \
                     --redis-url must list Sentinels in Sentinel mode",
                    describe(&e)
                ));
            }
            Err(e) => return Err(failed(e)),
        };
        let Some(fields) = entries(masters)
            .into_iter()
            .find(|fields| field(fields, "name").as_deref() == Some(self.master.as_str()))
        else {
            return Ok(None);
        };
        let (Some(host), Some(port)) = (field(&fields, "ip"), field(&fields, "port")) else {
            return Err(format!(
                "Sentinel {name} gave no address for the master {:?}",
                self.master
            ));
        };
        let port = port
            .parse()
            .map_err(|_| format!("Sentinel {name} named the master at a bad port {port:?}"))?;
        let epoch = field(&fields, "config-epoch")
            .and_then(|epoch| epoch.parse().ok())
            .unwrap_or(0);
        let promoting = field(&fields, "failover-state")
            .is_some_and(|state| PROMOTING.contains(&state.as_str()));
        Ok(Some(Named {
            sentinel: name.clone(),
            host,
            port,
            epoch,
            promoting,
        }))
    }

    /// Checks by `deadline` that `named` answers `ROLE` as a master, with the settings of
    /// `snapshot`.
    async fn check_role(
        &self,
        snapshot: &Snapshot,
        named: &Named,
        deadline: Instant,
    ) -> Result<Client, String> {
        let addr = named.addr();
        let what = || format!("master {addr} (named by Sentinel {})", named.sentinel);
        let failed = |e: RedisError| format!("{}: {}", what(), connect_cause(&e));
        let late = || format!("{}: no answer in time", what());
        let client =
            Client::open(self.master_info(snapshot, &named.host, named.port)).map_err(failed)?;
        let limit = deadline.saturating_duration_since(Instant::now());
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(limit))
            .set_response_timeout(Some(limit));
        let mut conn = timeout_at(
            deadline,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| late())?
        .map_err(failed)?;
        let role = timeout_at(deadline, redis::cmd("ROLE").query_async::<Value>(&mut conn))
            .await
            .map_err(|_| late())?
            .map_err(failed)?;
        match role {
            Value::Array(parts) if matches!(parts.first(), Some(Value::BulkString(r)) if r == b"master") => {
                Ok(client)
            }
            _ => Err(format!(
                "{} is not a master (a replica, or a failover is under way)",
                what()
            )),
        }
    }

    /// A client for the master the Sentinels name now, found by `deadline`, and the generation
    /// it belongs to. Every Sentinel is asked at once: the first named master that answers
    /// `ROLE` as a master is taken, unless a Sentinel has already named a newer one.
    async fn master(self: &Arc<Self>, limit: Duration) -> Result<(Client, u64), Error> {
        self.watch();
        let snapshot = self.access.snapshot();
        let deadline = Instant::now() + limit;
        let mut asked: FuturesUnordered<_> = (0..self.sentinels.len())
            .map(|index| self.ask(&snapshot, index, deadline))
            .collect();
        let mut failures = Vec::new();
        let mut unknown = 0;
        let mut tried = HashSet::new();
        loop {
            let answer = match timeout_at(deadline, asked.next()).await {
                Ok(Some(answer)) => answer,
                Ok(None) => break,
                Err(_) => {
                    failures.push(format!(
                        "{} of the Sentinels did not answer within {}",
                        asked.len(),
                        humantime::format_duration(limit)
                    ));
                    break;
                }
            };
            let named = match answer {
                Ok(Some(named)) => named,
                Ok(None) => {
                    unknown += 1;
                    continue;
                }
                Err(failure) => {
                    failures.push(failure);
                    continue;
                }
            };
            let known = self.known.borrow().clone();
            if named.epoch < known.epoch {
                failures.push(format!(
                    "Sentinel {} named {} of an older configuration (epoch {} < {})",
                    named.sentinel,
                    named.addr(),
                    named.epoch,
                    known.epoch
                ));
                continue;
            }
            let fenced_by = known
                .fenced
                .as_ref()
                .filter(|_| known.addr == Some(named.addr()))
                .map(|(sentinel, _)| sentinel.clone());
            if named.promoting || fenced_by.is_some() {
                // Named after the Sentinel that said it is promoting, not the one asked.
                let promoter = if named.promoting {
                    named.sentinel.clone()
                } else {
                    fenced_by.unwrap_or_default()
                };
                let failure = format!(
                    "a failover is under way: Sentinel {promoter} is promoting a replica of {}",
                    named.addr()
                );
                if !failures.contains(&failure) {
                    failures.push(failure);
                }
                continue;
            }
            if !tried.insert(named.addr()) {
                continue;
            }
            match self.check_role(&snapshot, &named, deadline).await {
                Ok(client) => match self.note(&named) {
                    Some(generation) => return Ok((client, generation)),
                    None => failures.push(format!(
                        "the Sentinels named a newer master than {} meanwhile",
                        named.addr()
                    )),
                },
                Err(failure) => failures.push(failure),
            }
        }
        if failures.is_empty() && unknown > 0 {
            return Err(Error::Unavailable(format!(
                "no Sentinel monitors a master named {:?} (--redis-sentinel-master)",
                self.master
            )));
        }
        // A refusal of Baton's credentials leads, so that it is reported as one (a setting to
        // fix rather than an outage).
        let refused = ["WRONGPASS", "NOAUTH", "NOPERM"]
            .into_iter()
            .find(|code| failures.iter().any(|f| f.contains(code)))
            .map(|code| format!("{code}: "))
            .unwrap_or_default();
        Err(Error::Unavailable(format!(
            "{refused}no usable master for {:?} from the Sentinels: {}",
            self.master,
            failures.join("; ")
        )))
    }

    /// Records that a Sentinel named `named`; returns the generation of connections to it, or
    /// `None` when a newer master is known.
    fn note(&self, named: &Named) -> Option<u64> {
        let addr = named.addr();
        let mut generation = None;
        self.known.send_if_modified(|known| {
            if known.addr.as_deref() == Some(addr.as_str()) {
                known.epoch = known.epoch.max(named.epoch);
                generation = Some(known.generation);
                return false;
            }
            if named.epoch < known.epoch {
                return false;
            }
            if let Some(previous) = &known.addr {
                metrics::topology_change("sentinel", true);
                tracing::warn!(
                    from = %previous,
                    to = %addr,
                    sentinel = %named.sentinel,
                    epoch = named.epoch,
                    "the Sentinels name a new master (failover); connections to the old one are \
                     given up"
                );
            }
            known.addr = Some(addr.clone());
            known.epoch = named.epoch;
            known.generation += 1;
            known.fenced = None;
            generation = Some(known.generation);
            true
        });
        generation
    }

    /// Asks every Sentinel for the master (each answer awaited up to [`POLL_LIMIT`]) and moves
    /// to the one named under the newest configuration epoch (the one most of them name, among
    /// several of the same epoch).
    async fn refresh(&self) {
        let snapshot = self.access.snapshot();
        let deadline = Instant::now() + POLL_LIMIT;
        let answers: Vec<Named> = (0..self.sentinels.len())
            .map(|index| self.ask(&snapshot, index, deadline))
            .collect::<FuturesUnordered<_>>()
            .filter_map(|answer| async move { answer.ok().flatten() })
            .collect()
            .await;
        let Some(epoch) = answers.iter().map(|n| n.epoch).max() else {
            return;
        };
        let current = self.known.borrow().addr.clone();
        let newest = answers.iter().filter(|n| n.epoch == epoch);
        let votes = |addr: &str| {
            answers
                .iter()
                .filter(|n| n.epoch == epoch && n.addr() == addr)
                .count()
        };
        let best = newest.max_by_key(|n| {
            let addr = n.addr();
            (votes(&addr), Some(&addr) == current.as_ref())
        });
        if let Some(best) = best
            && current.as_deref() != Some(best.addr().as_str())
        {
            self.note(best);
        }
        // A Sentinel promoting a replica of the master in use: stop using it at once, since the
        // replica may take writes before the Sentinels name it.
        let current = self.known.borrow().addr.clone();
        let promoting = answers
            .iter()
            .find(|n| n.promoting && Some(n.addr()) == current);
        self.known.send_if_modified(|known| {
            if known.addr != current {
                return false;
            }
            match (promoting, known.fenced.clone()) {
                (Some(named), fenced) => {
                    if fenced.is_none() {
                        known.generation += 1;
                        tracing::warn!(
                            master = %named.addr(),
                            sentinel = %named.sentinel,
                            "a Sentinel is promoting a replica; the master is no longer used"
                        );
                    }
                    known.fenced = Some((named.sentinel.clone(), Instant::now()));
                    fenced.is_none()
                }
                (None, Some((sentinel, since))) => {
                    let answered = answers.iter().any(|n| n.sentinel == sentinel);
                    if !answered && since.elapsed() < FENCE_LIMIT {
                        return false;
                    }
                    tracing::warn!(
                        master = ?known.addr,
                        "no Sentinel is promoting a replica any more (the failover was given \
                         up); the master is used again"
                    );
                    known.fenced = None;
                    true
                }
                (None, None) => false,
            }
        });
    }

    /// Starts the watch of the master's address, once: a task asking the Sentinels every
    /// [`MASTER_POLL`] (and at once when one announces a failover), and a task per Sentinel
    /// listening for those announcements.
    fn watch(self: &Arc<Self>) {
        if self.watching.swap(true, Ordering::SeqCst) {
            return;
        }
        tokio::spawn(poll(
            Arc::downgrade(self),
            self.wake.clone(),
            self.stop.clone(),
        ));
        for index in 0..self.sentinels.len() {
            tokio::spawn(listen(
                Arc::downgrade(self),
                index,
                self.wake.clone(),
                self.stop.clone(),
            ));
        }
    }

    /// Opens a pub/sub connection to Sentinel `index` subscribed to the failover
    /// announcements.
    async fn subscribe(&self, index: usize) -> Result<redis::aio::PubSub, String> {
        let sentinel = &self.sentinels[index];
        let name = sentinel.addr().to_string();
        let snapshot = self.access.snapshot();
        let client = Client::open(self.sentinel_info(&snapshot, sentinel))
            .map_err(|e| format!("Sentinel {name}: {}", connect_cause(&e)))?;
        let subscribed = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&EVENTS[..]).await?;
            Ok::<_, RedisError>(pubsub)
        };
        tokio::time::timeout(POLL_LIMIT, subscribed)
            .await
            .map_err(|_| format!("Sentinel {name}: no answer in time"))?
            .map_err(|e| format!("Sentinel {name}: {}", connect_cause(&e)))
    }
}

/// Asks the Sentinels for the master every [`MASTER_POLL`], and when `wake` is notified, until
/// `stop`.
async fn poll(sentinels: Weak<Sentinels>, wake: Arc<Notify>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(MASTER_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
            () = wake.notified() => {}
        }
        let Some(sentinels) = sentinels.upgrade() else {
            return;
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = sentinels.refresh() => {}
        }
    }
}

/// Listens on Sentinel `index` for the announcements of a new master of this name, and has the
/// Sentinels asked at once on each (and on every new subscription: announcements may have been
/// missed); subscribes again [`LISTEN_RETRY`] after its connection failed or dropped.
async fn listen(
    sentinels: Weak<Sentinels>,
    index: usize,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    let mut refused = false;
    loop {
        let Some(strong) = sentinels.upgrade() else {
            return;
        };
        let master = strong.master.clone();
        let subscribed = tokio::select! {
            () = stop.cancelled() => return,
            subscribed = strong.subscribe(index) => subscribed,
        };
        drop(strong);
        match subscribed {
            Ok(pubsub) => {
                wake.notify_one();
                let mut messages = pubsub.into_on_message();
                loop {
                    let message = tokio::select! {
                        () = stop.cancelled() => return,
                        message = messages.next() => message,
                    };
                    let Some(message) = message else { break };
                    let payload = String::from_utf8_lossy(message.get_payload_bytes());
                    if payload.split_whitespace().any(|word| word == master) {
                        tracing::debug!(channel = message.get_channel_name(), %payload, "a Sentinel announced a failover");
                        wake.notify_one();
                    }
                }
                tracing::debug!(index, "a Sentinel's pub/sub connection dropped");
            }
            Err(e) if e.contains("NOPERM") => {
                // The periodic question stands in for the announcements meanwhile. Asked again
                // only every REFUSED_RETRY, so as not to fill the Sentinel's ACL LOG, and warned
                // of once: a fixed ACL rule takes effect without restarting Baton.
                if !refused {
                    tracing::warn!(
                        error = %e,
                        "the Sentinel refuses Baton's subscription to its failover announcements \
                         (see the ACL rules in docs/security.md); failovers are noticed by asking \
                         it every 300 ms instead, and the subscription is tried again every minute"
                    );
                }
                refused = true;
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(REFUSED_RETRY) => {}
                }
                continue;
            }
            Err(e) => tracing::debug!(error = %e, "cannot subscribe to a Sentinel's announcements"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(LISTEN_RETRY) => {}
        }
    }
}

/// The entries of a `SENTINEL MASTERS` reply, each as a flat list of names and values (a list
/// of lists over RESP2, of maps over RESP3).
fn entries(reply: Value) -> Vec<Vec<Value>> {
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|entry| match entry {
            Value::Array(fields) => Some(fields),
            Value::Map(pairs) => Some(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect()),
            _ => None,
        })
        .collect()
}

/// The field `name` of a `SENTINEL MASTERS` entry (a flat list of names and values).
fn field(fields: &[Value], name: &str) -> Option<String> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    fields
        .chunks(2)
        .find(|pair| text(&pair[0]).as_deref() == Some(name))
        .and_then(|pair| pair.get(1).and_then(text))
}

/// Whether a server refused a command as unknown (a plain Redis given as a Sentinel).
fn is_unknown_command(e: &RedisError) -> bool {
    e.code() == Some("ERR") && describe(e).contains("unknown command")
}

/// The cause of a failed connection or command, a failed TLS handshake said as such.
fn connect_cause(e: &RedisError) -> String {
    match super::tls_failure(e) {
        Some(why) => format!("{}: {why}", super::TLS_FAILED),
        None => describe(e),
    }
}

impl Endpoint {
    /// The endpoint of a standalone or Sentinel topology, with the URLs' own credentials and
    /// no TLS settings; `None` for a Cluster.
    pub fn new(topology: &Topology) -> Result<Option<Self>, Error> {
        let access = Access::load(&RedisAccess::default())
            .map_err(|problems| Error::Internal(problems.join("; ")))?;
        Self::with_access(topology, Arc::new(access))
    }

    /// The endpoint of a standalone or Sentinel topology, its connections set up by `access`;
    /// `None` for a Cluster.
    pub fn with_access(topology: &Topology, access: Arc<Access>) -> Result<Option<Self>, Error> {
        let parse = |url: &str| {
            url.into_connection_info()
                .map_err(|e| Error::Internal(format!("redis url: {e}")))
        };
        match topology {
            Topology::Standalone { url } => Ok(Some(Self::Fixed {
                info: Arc::new(parse(url)?),
                access,
            })),
            Topology::Cluster { .. } => Ok(None),
            Topology::Sentinel {
                sentinels,
                master,
                node_url,
            } => {
                let sentinels = sentinels
                    .iter()
                    .map(|u| parse(u))
                    .collect::<Result<Vec<_>, _>>()?;
                let node = match node_url {
                    Some(url) => parse(url)?.redis_settings().clone(),
                    None => RedisConnectionInfo::default(),
                };
                let tls = sentinels
                    .iter()
                    .any(|i| matches!(i.addr(), redis::ConnectionAddr::TcpTls { .. }));
                let links = std::sync::Mutex::new(vec![None; sentinels.len()]);
                Ok(Some(Self::Sentinel(Arc::new(Sentinels {
                    sentinels,
                    links,
                    master: master.clone(),
                    node,
                    tls,
                    access,
                    known: watch::Sender::new(Master::default()),
                    watching: AtomicBool::new(false),
                    wake: Arc::new(Notify::new()),
                    stop: CancellationToken::new(),
                }))))
            }
        }
    }

    /// A client for the node to connect to now, found within `limit`, with the user, password
    /// and TLS settings of the moment, and the generation of the master it goes to (0 for a
    /// fixed server): see [`is_current`](Self::is_current).
    pub async fn client(&self, limit: Duration) -> Result<(Client, u64), Error> {
        match self {
            Self::Fixed { info, access } => {
                let client = Client::open(access.snapshot().apply(ConnectionInfo::clone(info)))?;
                Ok((client, 0))
            }
            Self::Sentinel(sentinels) => sentinels.master(limit).await,
        }
    }

    /// Whether a connection opened under `generation` still goes to the current master: false
    /// once the Sentinels named another one. Always true for a fixed server.
    pub fn is_current(&self, generation: u64) -> bool {
        match self {
            Self::Fixed { .. } => true,
            Self::Sentinel(sentinels) => sentinels.known.borrow().generation == generation,
        }
    }

    /// Resolves once a connection opened under `generation` no longer goes to the current master
    /// (never for a fixed server).
    pub fn superseded(&self, generation: u64) -> impl Future<Output = ()> + Send + 'static {
        let mut known = match self {
            Self::Fixed { .. } => None,
            Self::Sentinel(sentinels) => Some(sentinels.known.subscribe()),
        };
        async move {
            match known.as_mut() {
                Some(known) => {
                    // The sender lives as long as the endpoint that gave this generation.
                    let _ = known.wait_for(|m| m.generation != generation).await;
                }
                None => std::future::pending().await,
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::{Topology, Value, field};

    /// `SENTINEL MASTER`'s flat list of names and values is read by name.
    #[test]
    fn sentinel_master_fields() {
        let reply: Vec<Value> = ["name", "baton", "config-epoch", "3", "failover-state"]
            .into_iter()
            .chain(["wait_promotion"])
            .map(|s| Value::BulkString(s.as_bytes().to_vec()))
            .collect();
        assert_eq!(field(&reply, "config-epoch").as_deref(), Some("3"));
        assert_eq!(
            field(&reply, "failover-state").as_deref(),
            Some("wait_promotion")
        );
        assert_eq!(field(&reply, "baton"), None);
        assert_eq!(field(&reply[..5], "failover-state"), None);
    }

    /// Each mode takes the URLs it needs and refuses the others' settings.
    #[test]
    fn modes_parse() {
        assert_eq!(
            Topology::parse("standalone", "redis://a:1", None),
            Ok(Topology::Standalone {
                url: "redis://a:1".into()
            })
        );
        assert_eq!(
            Topology::parse("cluster", "redis://a:1, redis://b:2", None),
            Ok(Topology::Cluster {
                seeds: vec!["redis://a:1".into(), "redis://b:2".into()]
            })
        );
        assert!(matches!(
            Topology::parse("sentinel", "redis://s:26379", Some("main")),
            Ok(Topology::Sentinel { master, .. }) if master == "main"
        ));
        assert!(Topology::parse("sentinel", "redis://s:26379", None).is_err());
        assert!(Topology::parse("standalone", "redis://a:1,redis://b:2", None).is_err());
        assert!(Topology::parse("standalone", "redis://a:1", Some("m")).is_err());
        assert!(Topology::parse("cluster", "nope://x", None).is_err());
        assert!(Topology::parse("mesh", "redis://a:1", None).is_err());
        assert!(Topology::parse("cluster", " , ", None).is_err());
    }
}
