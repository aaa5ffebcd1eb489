//! The Redis layer: script calls bounded by the command timeout over the configured
//! [`Topology`] (a bb8 pool of multiplexed connections to a standalone Redis or to the master the
//! Sentinels name; on a Cluster, such a pool per master, with Baton routing each script to the
//! master that owns its slot: see `cluster.rs`), and the shared pub/sub subscriber that wakes
//! local waiters.
//!
//! Every state change Baton makes is one Lua script (a `.lua` file beside the service that owns
//! it, wrapped once in a [`Script`], called by SHA with a `NOSCRIPT` fallback). Scripts read the
//! time from Redis (`TIME`), never from this process; where Baton must tell a script a moment by
//! Redis's clock (the last at which a rate limit check may still count), [`clock`] estimates it
//! from the `TIME` earlier scripts returned.
//!
//! Every connection Baton opens for commands first checks the server's version (`INFO server`):
//! a Redis older than 7.0 is refused with [`Error::FailedPrecondition`] naming it (see
//! [`version`]).

mod access;
pub mod clock;
mod cluster;
mod notifier;
pub mod reply;
mod topology;
pub mod version;

use std::{
    sync::{
        Arc, LazyLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use bb8_redis::{
    bb8,
    redis::{
        self, AsyncConnectionConfig, FromRedisValue, RedisError, ScriptInvocation,
        aio::MultiplexedConnection,
    },
};
use tokio::time::{Instant, error::Elapsed, timeout_at};

pub use crate::config::Topology;
pub use ::redis::Script;
pub use access::{Access, Snapshot, tls_failure};
pub use notifier::{ADDRESSED, Notifier, Source, Subscription, Wake};
pub use topology::Endpoint;

use crate::{
    config::RedisConfig,
    error::{Error, RETRYABLE_REDIS_CODES},
    metrics::{self, PoolRole, RedisCall},
};

/// A pooled connection not handed out for this long is checked with a `PING` before it carries a
/// call: Redis may have closed it meanwhile (its `timeout` setting closes idle clients; so do
/// `CLIENT KILL` and a restart), and a call sent on it would fail although Redis is up.
pub const IDLE_CHECK: Duration = Duration::from_millis(500);

/// When this process first used a connection: the origin of [`Conn`]'s handout times.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// A pooled multiplexed connection, marked broken after an I/O error or a timeout so that the pool
/// drops it and opens a fresh one instead of handing the dead one out again.
///
/// Calls do not hold the pool slot while they run: they clone the multiplexed handle (which
/// pipelines any number of concurrent commands) and give the slot back at once, so the pool size
/// sets how many sockets carry the load, not how many calls may be in flight.
#[derive(Clone)]
pub struct Conn {
    conn: MultiplexedConnection,
    broken: Arc<AtomicBool>,
    /// When it was last handed out, in milliseconds from [`EPOCH`].
    handed_out: Arc<AtomicU64>,
    /// The generation of the master it was opened to (see [`Endpoint::is_current`]).
    generation: u64,
}

impl Conn {
    fn new(conn: MultiplexedConnection, generation: u64) -> Self {
        Self {
            conn,
            broken: Arc::new(AtomicBool::new(false)),
            handed_out: Arc::new(AtomicU64::new(now_millis())),
            generation,
        }
    }

    fn mark_broken(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Relaxed)
    }

    /// Notes a handout; returns how long the connection was idle before it.
    fn hand_out(&self) -> Duration {
        let now = now_millis();
        let before = self.handed_out.swap(now, Ordering::Relaxed);
        Duration::from_millis(now.saturating_sub(before))
    }
}

/// Milliseconds since [`EPOCH`].
fn now_millis() -> u64 {
    u64::try_from(EPOCH.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Opens connections with Baton's connect and response timeouts, and refuses servers older than
/// Redis 7.0.
///
/// `bb8_redis::RedisConnectionManager` opens connections with the redis crate's defaults and never
/// reports one as broken, which would keep a dead connection in the pool after Redis restarts
/// unless every checkout paid for a `PING`; this manager does neither.
pub struct Manager {
    endpoint: Endpoint,
    connect_timeout: Duration,
    command_timeout: Duration,
    config: AsyncConnectionConfig,
}

impl bb8::ManageConnection for Manager {
    type Connection = Conn;
    type Error = Error;

    async fn connect(&self) -> Result<Conn, Error> {
        // With Sentinel this asks for the current master; connections to an older one are
        // dropped as soon as the Sentinels name another (see `has_broken`).
        let (client, generation) = self.endpoint.client(self.connect_timeout).await?;
        let addr = client.get_connection_info().addr().to_string();
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
            .map_err(|e| match (&self.endpoint, connect_error(e)) {
                (Endpoint::Sentinel(_), Error::Unavailable(cause)) => {
                    // The cause first: its code sorts the error (see `error_kind`).
                    Error::Unavailable(format!("{cause} (master {addr})"))
                }
                (_, e) => e,
            })?;
        let info = tokio::time::timeout(
            self.command_timeout,
            redis::cmd("INFO")
                .arg("server")
                .query_async::<String>(&mut conn),
        )
        .await
        .map_err(|_| {
            Error::Unavailable(format!(
                "{addr} did not answer INFO within {}",
                humantime::format_duration(self.command_timeout)
            ))
        })?;
        match info {
            Ok(info) => {
                if let Some(refusal) = version::refusal(&info, &addr) {
                    return Err(Error::FailedPrecondition(refusal));
                }
            }
            // A server that does not let Baton read INFO (an ACL without it) is taken as it is:
            // the calls themselves tell whether it can run Baton's scripts.
            Err(e) if e.code() == Some("NOPERM") => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Conn::new(conn, generation))
    }

    async fn is_valid(&self, conn: &mut Conn) -> Result<(), Error> {
        redis::cmd("PING")
            .query_async::<()>(&mut conn.conn)
            .await
            .map_err(Error::from)
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.is_broken() || !self.endpoint.is_current(conn.generation)
    }
}

/// Passes the pool's connection failures to the checkouts waiting for a connection.
///
/// bb8 opens connections in the background and sends their errors to an error sink, leaving a
/// waiting `get` to run into its timeout; with this sink a refused connection fails the waiting
/// calls at once with the real cause.
#[derive(Clone)]
struct ConnectFailures(tokio::sync::broadcast::Sender<Error>);

impl std::fmt::Debug for ConnectFailures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectFailures")
    }
}

impl bb8::ErrorSink<Error> for ConnectFailures {
    fn sink(&self, error: Error) {
        tracing::debug!(error = %error, "redis connection failed");
        // No receiver just means nobody is waiting for a connection right now.
        let _ = self.0.send(error);
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<Error>> {
        Box::new(self.clone())
    }
}

/// How the pools of one Baton open connections.
#[derive(Clone, Copy, Debug)]
struct PoolSettings {
    /// Connections per pool.
    size: u32,
    /// Time to open one connection.
    connect_timeout: Duration,
    /// Time for one command.
    command_timeout: Duration,
    /// Which of Baton's pools it is, for the metrics.
    role: PoolRole,
}

/// A pool of multiplexed connections to one node (a standalone Redis, the Sentinels' master, or
/// one Cluster master). Cheap to clone.
#[derive(Clone)]
struct NodePool {
    pool: bb8::Pool<Manager>,
    /// Where the pool connects: tells whether a connection still goes to the current master.
    endpoint: Endpoint,
    connect_failures: ConnectFailures,
    command_timeout: Duration,
    /// Reports the pool's connections to the metrics for as long as the pool lives.
    _watched: Arc<dyn Fn() -> metrics::PoolState + Send + Sync>,
}

impl NodePool {
    /// A pool for `endpoint` that connects only when asked for a connection.
    fn new(endpoint: Endpoint, settings: PoolSettings) -> Self {
        let manager = Manager {
            endpoint: endpoint.clone(),
            connect_timeout: settings.connect_timeout,
            command_timeout: settings.command_timeout,
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(settings.connect_timeout))
                .set_response_timeout(Some(settings.command_timeout)),
        };
        let connect_failures = ConnectFailures(tokio::sync::broadcast::channel(16).0);
        let pool = bb8::Pool::builder()
            .max_size(settings.size)
            .connection_timeout(settings.command_timeout)
            .test_on_check_out(false)
            // A refused connection is reported at once instead of being retried until the
            // timeout.
            .retry_connection(false)
            .error_sink(Box::new(connect_failures.clone()))
            .build_unchecked(manager);
        let counted = pool.clone();
        let watched: Arc<dyn Fn() -> metrics::PoolState + Send + Sync> = Arc::new(move || {
            let state = counted.state();
            (state.connections, state.idle_connections)
        });
        metrics::watch_pool(settings.role, &watched);
        Self {
            pool,
            endpoint,
            connect_failures,
            command_timeout: settings.command_timeout,
            _watched: watched,
        }
    }

    /// A handle on one of the pooled connections, by `deadline`; the pool slot itself is given
    /// back at once. A connection idle for [`IDLE_CHECK`] or more must first answer `PING`: one
    /// that Redis closed meanwhile fails it at once and is replaced by the next, so that no call
    /// is sent on it. A `PING` that gets no answer by the deadline fails the checkout as the call
    /// would have failed.
    async fn checkout(&self, deadline: Instant) -> Result<Conn, Error> {
        loop {
            let mut conn = self.checkout_any(deadline).await?;
            if !self.endpoint.is_current(conn.generation) {
                // To a master the Sentinels no longer name: dropped by the pool when given back.
                conn.mark_broken();
            }
            if conn.is_broken() {
                // Broken since the pool took it back: dropped by the pool when given back now.
                continue;
            }
            if conn.hand_out() < IDLE_CHECK {
                return Ok(conn);
            }
            let check = timeout_at(
                deadline.min(Instant::now() + self.command_timeout),
                redis::cmd("PING").query_async::<()>(&mut conn.conn),
            )
            .await;
            match check {
                Ok(Ok(())) => return Ok(conn),
                Ok(Err(e)) if breaks_connection(&e) => conn.mark_broken(),
                Ok(Err(e)) => return Err(e.into()),
                Err(_) => {
                    conn.mark_broken();
                    return Err(Error::Unavailable(format!(
                        "no answer within {}",
                        humantime::format_duration(self.command_timeout)
                    )));
                }
            }
        }
    }

    /// Sends a request (`send`, given a handle on a pooled connection) by `deadline`; returns the
    /// connection it went on and its outcome. A request that finds its connection already closed
    /// (Redis closed it: `CLIENT KILL`, its `timeout`, a restart) fails before anything is written;
    /// that connection is marked broken and the request goes on another, so that no call fails
    /// for a connection that a check of its idleness missed. A request that may have reached
    /// Redis is never sent again.
    async fn send<T, F>(
        &self,
        deadline: Instant,
        send: impl Fn(MultiplexedConnection) -> F,
    ) -> Result<(Conn, Result<Result<T, RedisError>, Elapsed>), Error>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        loop {
            let conn = self.checkout(deadline).await?;
            match timeout_at(deadline, unsent_or(send(conn.conn.clone()))).await {
                Ok(None) => conn.mark_broken(),
                Ok(Some(reply)) => return Ok((conn, Ok(reply))),
                Err(elapsed) => return Ok((conn, Err(elapsed))),
            }
        }
    }

    /// A handle on whichever pooled connection the pool gives, by `deadline`.
    async fn checkout_any(&self, deadline: Instant) -> Result<Conn, Error> {
        let mut failures = self.connect_failures.0.subscribe();
        let checkout = tokio::select! {
            r = timeout_at(deadline, self.pool.get()) => r,
            Ok(cause) = failures.recv() => return Err(cause),
        };
        match checkout {
            Ok(Ok(pooled)) => Ok(Conn::clone(&pooled)),
            Ok(Err(bb8::RunError::User(e))) => Err(e),
            Ok(Err(bb8::RunError::TimedOut)) | Err(_) => Err(Error::Unavailable(format!(
                "no connection within {}",
                humantime::format_duration(self.command_timeout)
            ))),
        }
    }
}

/// Awaits a request on a multiplexed connection: `None` when it failed with its connection closed
/// at its first poll, which it does only when the connection's writer had already stopped, so
/// that the request was never queued for the socket; its outcome otherwise.
async fn unsent_or<T>(
    request: impl Future<Output = Result<T, RedisError>>,
) -> Option<Result<T, RedisError>> {
    let mut request = std::pin::pin!(request);
    let mut first = true;
    let outcome = std::future::poll_fn(|cx| {
        let polled = request.as_mut().poll(cx);
        first &= polled.is_ready();
        polled
    })
    .await;
    match outcome {
        Err(e) if first && e.is_connection_dropped() => None,
        outcome => Some(outcome),
    }
}

/// The error of a request that was written to its connection (see [`unsent_or`]): when its
/// answer did not come in time or the connection broke before it came, [`Error::Unanswered`],
/// since Redis may have run it.
pub(crate) fn unanswered_if_lost(e: RedisError) -> Error {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        Error::Unanswered(crate::error::describe(&e))
    } else {
        e.into()
    }
}

/// A failed connection attempt as Baton reports it: a failed TLS handshake says so (with what
/// rustls found wrong), anything else as [`Error::from`] has it.
fn connect_error(e: RedisError) -> Error {
    match tls_failure(&e) {
        Some(why) => Error::Unavailable(format!("{TLS_FAILED}: {why}")),
        None => e.into(),
    }
}

/// How the cause of a failed TLS handshake with Redis starts.
pub(crate) const TLS_FAILED: &str = "TLS handshake with Redis failed";

/// What makes Baton exit at start (code 2) rather than serve unready: Redis answered but refused
/// Baton's credentials (`WRONGPASS`, `NOAUTH`, `NOPERM`), or the TLS handshake failed (a
/// certificate not trusted or not for this host, a client certificate refused, a server not
/// speaking TLS). Either is a setting to fix, not an outage to wait out.
fn refused_at_start(e: &Error) -> Option<String> {
    let (Error::Unavailable(cause) | Error::Internal(cause)) = e else {
        return None;
    };
    if ["WRONGPASS", "NOAUTH", "NOPERM"]
        .iter()
        .any(|code| cause.contains(code))
    {
        Some(format!(
            "Redis refused Baton's credentials (check --redis-username and \
             --redis-password-file, and the user's ACL rules): {cause}"
        ))
    } else if cause.contains(TLS_FAILED) {
        Some(format!(
            "{cause} (check the rediss:// URLs, --redis-tls-ca, --redis-tls-cert and \
             --redis-tls-key)"
        ))
    } else {
        None
    }
}

/// Whether a connection that returned `e` can no longer be trusted: an I/O error, a dropped
/// connection, a node that is no longer the master (`READONLY`), or one that no longer accepts
/// Baton's credentials (`NOAUTH`, `WRONGPASS`), which a fresh connection may.
fn breaks_connection(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || matches!(e.code(), Some("READONLY" | "NOAUTH" | "WRONGPASS"))
}

/// The kind of a failed Redis call, for the metrics: from the cause as [`Redis`] reports it (a
/// timeout or a missing connection in its own words, an error reply with Redis's code first).
pub fn error_kind(e: &Error) -> metrics::RedisError {
    match e {
        Error::Internal(_) => metrics::RedisError::Script,
        Error::Unavailable(cause) | Error::Unanswered(cause) | Error::FailedPrecondition(cause) => {
            let code = cause.split([' ', ':']).next().unwrap_or_default();
            if cause.starts_with("no answer within")
                || cause.starts_with("no connection within")
                || cause.contains("timed out")
            {
                metrics::RedisError::Timeout
            } else if matches!(code, "NOAUTH" | "WRONGPASS" | "NOPERM")
                || cause.contains(crate::error::SCRIPT_ACL_DENIAL)
            {
                metrics::RedisError::Auth
            } else if RETRYABLE_REDIS_CODES.contains(&code) {
                metrics::RedisError::Server
            } else {
                metrics::RedisError::Connection
            }
        }
        _ => metrics::RedisError::Connection,
    }
}

/// Whether Redis refused Baton's credentials (`NOAUTH`, `WRONGPASS`, `NOPERM`): a configuration
/// to fix, not a Redis that is down.
pub fn refuses_credentials(e: &Error) -> bool {
    error_kind(e) == metrics::RedisError::Auth
}

/// Records a Redis call of `kind` that started at `started` and ended with `result`.
fn observe<T>(kind: RedisCall, started: Instant, result: &Result<T, Error>) {
    metrics::redis_call(kind, started.elapsed());
    if let Err(e) = result {
        metrics::redis_error(error_kind(e));
    }
}

/// A Redis Baton cannot use as configured, found at start: one older than 7.0, one that refuses
/// Baton's credentials, or a failed TLS handshake. `baton serve` exits with code 2 and this
/// message (which never holds a password).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct UnsupportedServer(pub String);

/// What a readiness check found.
#[derive(Debug, Clone)]
pub enum Health {
    /// Every node Baton uses answers.
    Up,
    /// Some masters of the Cluster answer and serve their slots; the others, named in the text
    /// with their cause, do not, and calls for the names on their slots fail `UNAVAILABLE`.
    Partial(String),
    /// Baton cannot serve: no node answers, or the server cannot run Baton.
    Down(Error),
}

/// The hash tag Redis Cluster hashes `key` by: what lies between the first `{` and the first `}`
/// after it, when that is not empty; `None` when the whole key is hashed. Keys that must share a
/// slot (everything one script touches) must share a tag.
pub fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let len = key[open + 1..].find('}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// How commands reach Redis.
#[derive(Clone)]
enum Backend {
    /// A pool of multiplexed connections to one node (standalone, or the Sentinels' master).
    Node { pool: NodePool },
    /// A pool per master, each script sent to the master owning its slot.
    Cluster { cluster: cluster::Cluster },
}

/// The Redis Cluster hash slot of `key` (CRC16 of its hash tag, or of the whole key, mod 16384).
pub fn slot(key: &str) -> u16 {
    slot_of(key.as_bytes())
}

/// [`slot`] of a key given as bytes.
fn slot_of(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let len = rest.iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &rest[..len])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % 16384
}

/// Whether replicas acknowledged a write (`--min-replicas-ack`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// No acknowledgement was asked for (the option is off, or the call wrote nothing).
    NotAsked,
    /// Enough replicas acknowledged the write.
    Acked,
    /// Only `replicas` acknowledged it in time.
    Missing {
        /// Replicas that did acknowledge it.
        replicas: u32,
    },
}

/// Handle to Redis shared by every service: cheap to clone.
#[derive(Clone)]
pub struct Redis {
    backend: Backend,
    min_replicas_ack: u32,
    replica_ack_timeout: Duration,
    source: Source,
    publish: &'static str,
    command_timeout: Duration,
    connect_timeout: Duration,
    key_prefix: Arc<str>,
}

impl Redis {
    /// Sets up the connections without connecting yet, so Baton starts (and reports not ready)
    /// while Redis is down.
    pub fn new(config: &RedisConfig) -> Result<Self, Error> {
        if config.access.tls.insecure {
            tracing::warn!(
                "--redis-tls-insecure: Redis servers' certificates are NOT verified; anyone on \
                 the network path can read and change Baton's Redis traffic, its password \
                 included"
            );
        }
        Self::with_role(config, PoolRole::Commands)
    }

    /// [`Redis::new`] for the pool `role` (which the metrics report its connections under).
    pub fn with_role(config: &RedisConfig, role: PoolRole) -> Result<Self, Error> {
        let settings = PoolSettings {
            size: config.pool_size,
            connect_timeout: config.connect_timeout,
            command_timeout: config.command_timeout,
            role,
        };
        let access = Arc::new(
            Access::load(&config.access)
                .map_err(|problems| Error::Internal(problems.join("; ")))?,
        );
        match &config.topology {
            Topology::Cluster { .. } => metrics::topology("cluster"),
            Topology::Sentinel { .. } => metrics::topology("sentinel"),
            Topology::Standalone { .. } => {}
        }
        let (backend, source) = match &config.topology {
            Topology::Cluster { seeds } => {
                let cluster = cluster::Cluster::new(seeds, settings, access)?;
                (
                    Backend::Cluster {
                        cluster: cluster.clone(),
                    },
                    Source::Cluster(cluster),
                )
            }
            topology => {
                let endpoint = Endpoint::with_access(topology, access)?
                    .ok_or_else(|| Error::Internal("a node topology without an endpoint".into()))?;
                (
                    Backend::Node {
                        pool: NodePool::new(endpoint.clone(), settings),
                    },
                    Source::Node(endpoint),
                )
            }
        };
        let publish = match backend {
            Backend::Cluster { .. } => "SPUBLISH",
            Backend::Node { .. } => "PUBLISH",
        };
        Ok(Self {
            backend,
            min_replicas_ack: config.min_replicas_ack,
            replica_ack_timeout: config.replica_ack_timeout,
            source,
            publish,
            command_timeout: config.command_timeout,
            connect_timeout: config.connect_timeout,
            key_prefix: config.key_prefix.as_str().into(),
        })
    }

    /// Wraps a script's source for this topology. Scripts publish wake-ups with
    /// `redis.pcall(PUBLISH, channel, message)`: `PUBLISH` is a local defined in front of the
    /// source, `'SPUBLISH'` on a Cluster (sharded pub/sub, delivered by the node owning the
    /// channel's slot, which is the slot of the keys the script touches) and `'PUBLISH'`
    /// otherwise. A refused publish (an ACL user without rights on the channel) does not fail
    /// the script: it comes after the script's writes, which Redis does not undo, and a Baton
    /// whose user may not use the channels has no waiters on them to wake.
    pub fn script(&self, source: &str) -> Script {
        Script::new(&format!("local PUBLISH = '{}'\n{source}", self.publish))
    }

    /// Where the shared subscriber connects.
    pub fn pubsub_source(&self) -> Source {
        self.source.clone()
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.backend, Backend::Cluster { .. })
    }

    /// The group a batch of calls must stay within: `key`'s hash slot on a Cluster, where a
    /// script may only touch one slot; 0 on a single Redis, where one call may touch any keys.
    pub fn batch_group(&self, key: &str) -> u16 {
        if self.is_cluster() { slot(key) } else { 0 }
    }

    /// The namespace put in front of every key.
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// The time allowed for one command.
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The time replicas get to acknowledge a grant (`--min-replicas-ack-timeout`).
    pub fn replica_ack_timeout(&self) -> Duration {
        self.replica_ack_timeout
    }

    /// Runs a script (EVALSHA, loading it on `NOSCRIPT`) within the command timeout, counted from
    /// the moment a connection is requested. On a Cluster it goes to the master owning the slot
    /// of its first key, following `MOVED` and `ASK` and retrying `TRYAGAIN` within that time.
    pub async fn eval<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, Error> {
        let started = Instant::now();
        let result = self.eval_once(invocation, started).await;
        observe(RedisCall::Script, started, &result);
        result
    }

    /// [`Redis::eval`], unrecorded, for a call that started at `started`.
    async fn eval_once<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        started: Instant,
    ) -> Result<T, Error> {
        let deadline = started + self.command_timeout;
        match &self.backend {
            Backend::Node { pool } => {
                let (conn, outcome) = pool
                    .send(deadline, |mut c| async move {
                        invocation.invoke_async(&mut c).await
                    })
                    .await?;
                self.settle(&conn, outcome)
            }
            Backend::Cluster { cluster } => {
                let mut routed = cluster.route(deadline, None);
                let outcome = timeout_at(deadline, invocation.invoke_async(&mut routed)).await;
                routed.settle(outcome)
            }
        }
    }

    /// Runs a script like [`eval`](Self::eval) and, when `--min-replicas-ack` is set and `wrote`
    /// says the reply reports a grant, sends `WAIT` on the same connection (to the node that ran
    /// the script, which owns `key`), so that it covers the script's writes. The caller rolls the
    /// grant back when the answer is [`Ack::Missing`].
    ///
    /// `WAIT` holds up the other calls multiplexed on that connection for up to the ack timeout.
    pub async fn eval_acked<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        key: &str,
        wrote: impl FnOnce(&T) -> bool,
    ) -> Result<(T, Ack), Error> {
        if self.min_replicas_ack == 0 {
            return Ok((self.eval(invocation).await?, Ack::NotAsked));
        }
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.min_replicas_ack)
            .arg(self.replica_ack_timeout.as_millis() as u64);
        let started = Instant::now();
        let deadline = started + self.command_timeout;
        let wait_deadline = deadline + self.replica_ack_timeout;
        match &self.backend {
            Backend::Node { pool } => {
                let sent = pool
                    .send(deadline, |mut c| async move {
                        invocation.invoke_async(&mut c).await
                    })
                    .await;
                let (mut conn, outcome) = match sent {
                    Ok(sent) => sent,
                    Err(e) => {
                        observe::<()>(RedisCall::Script, started, &Err(e.clone()));
                        return Err(e);
                    }
                };
                let value = self.settle(&conn, outcome);
                observe(RedisCall::Script, started, &value);
                let value: T = value?;
                if !wrote(&value) {
                    return Ok((value, Ack::NotAsked));
                }
                let waited = Instant::now();
                let acked =
                    timeout_at(wait_deadline, wait.query_async::<i64>(&mut conn.conn)).await;
                let acked = self.settle(&conn, acked);
                observe(RedisCall::Wait, waited, &acked);
                Ok((value, self.ack(acked)))
            }
            Backend::Cluster { cluster } => {
                let mut routed = cluster.route(deadline, Some(slot(key)));
                let outcome = timeout_at(deadline, invocation.invoke_async(&mut routed)).await;
                let value = routed.settle(outcome);
                observe(RedisCall::Script, started, &value);
                let value: T = value?;
                if !wrote(&value) {
                    return Ok((value, Ack::NotAsked));
                }
                // WAIT names no key: it follows the script to the connection that ran it.
                routed.extend(wait_deadline);
                let waited = Instant::now();
                let acked = timeout_at(wait_deadline, wait.query_async::<i64>(&mut routed)).await;
                let acked = routed.settle(acked);
                observe(RedisCall::Wait, waited, &acked);
                Ok((value, self.ack(acked)))
            }
        }
    }

    /// Reads `WAIT`'s answer; a failed `WAIT` counts as no acknowledgement.
    fn ack(&self, acked: Result<i64, Error>) -> Ack {
        match acked {
            Ok(n) if n >= i64::from(self.min_replicas_ack) => Ack::Acked,
            Ok(n) => Ack::Missing {
                replicas: u32::try_from(n).unwrap_or(0),
            },
            Err(e) => {
                tracing::warn!(error = %e, "WAIT for replica acknowledgement failed");
                Ack::Missing { replicas: 0 }
            }
        }
    }

    /// Sends one plain command within the command timeout (on a Cluster: a command with a key
    /// to the master owning it, one without to any master that answers).
    pub async fn command<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, Error> {
        self.command_as(RedisCall::Command, cmd).await
    }

    /// [`Redis::command`], recorded as a call of `kind`.
    async fn command_as<T: FromRedisValue>(
        &self,
        kind: RedisCall,
        cmd: &redis::Cmd,
    ) -> Result<T, Error> {
        let started = Instant::now();
        let result = self.command_once(cmd, started).await;
        observe(kind, started, &result);
        result
    }

    /// [`Redis::command`], unrecorded, for a call that started at `started`.
    async fn command_once<T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        started: Instant,
    ) -> Result<T, Error> {
        let deadline = started + self.command_timeout;
        match &self.backend {
            Backend::Node { pool } => {
                let (conn, outcome) = pool
                    .send(
                        deadline,
                        |mut c| async move { cmd.query_async(&mut c).await },
                    )
                    .await?;
                self.settle(&conn, outcome)
            }
            Backend::Cluster { cluster } => {
                let mut routed = cluster.route(deadline, None);
                let outcome = timeout_at(deadline, cmd.query_async(&mut routed)).await;
                routed.settle(outcome)
            }
        }
    }

    /// Sends `PING` within the command timeout.
    pub async fn ping(&self) -> Result<(), Error> {
        self.command_as::<String>(RedisCall::Health, &redis::cmd("PING"))
            .await
            .map(drop)
    }

    /// Whether Baton can serve, within the command timeout: on a single node, whether it answers
    /// `PING`; on a Cluster, which masters answer `CLUSTER INFO` with `cluster_state:ok`.
    pub async fn health(&self) -> Health {
        match &self.backend {
            Backend::Node { .. } => match self.ping().await {
                Ok(()) => Health::Up,
                Err(e) => Health::Down(e),
            },
            Backend::Cluster { cluster } => {
                let started = Instant::now();
                let health = cluster.health(self.command_timeout).await;
                let result = match &health {
                    Health::Down(e) => Err(e.clone()),
                    _ => Ok(()),
                };
                observe(RedisCall::Health, started, &result);
                health
            }
        }
    }

    /// Checks at start that the server answers, accepts Baton's credentials and TLS, and is
    /// recent enough, within the connect and command timeouts: `Err(UnsupportedServer)` for a
    /// Redis Baton cannot use as configured (older than 7.0, refusing the credentials, a failed
    /// TLS handshake); `Ok(Err(why))` when it does not answer now (Baton starts anyway and
    /// reports not ready; the check is made again on every connection).
    pub async fn check_server(&self) -> Result<Result<(), Error>, UnsupportedServer> {
        let deadline = Instant::now() + self.connect_timeout + self.command_timeout;
        let checked = match &self.backend {
            Backend::Node { pool } => pool.checkout(deadline).await.map(drop),
            Backend::Cluster { cluster } => cluster.check_masters(deadline).await,
        };
        match checked {
            Err(Error::FailedPrecondition(refusal)) => Err(UnsupportedServer(refusal)),
            Err(e) => match refused_at_start(&e) {
                Some(refusal) => Err(UnsupportedServer(refusal)),
                None => Ok(Err(e)),
            },
            Ok(()) => Ok(Ok(())),
        }
    }

    /// Turns a bounded call's outcome on a pooled connection into a result, marking the
    /// connection broken when it can no longer be trusted (see [`breaks_connection`]) or gave no
    /// answer in time.
    fn settle<T>(
        &self,
        conn: &Conn,
        outcome: Result<Result<T, RedisError>, tokio::time::error::Elapsed>,
    ) -> Result<T, Error> {
        match outcome {
            Ok(Ok(value)) => {
                // An answer read after the Sentinels named another master came from the old one,
                // which no longer counts: what it granted or renewed may be gone from the new
                // master. It is taken as the connection failing, so the caller does not trust it.
                if let Backend::Node { pool } = &self.backend
                    && !pool.endpoint.is_current(conn.generation)
                {
                    conn.mark_broken();
                    return Err(Error::Unanswered(
                        "the Sentinels named a new master before the old one's answer was read"
                            .into(),
                    ));
                }
                Ok(value)
            }
            Ok(Err(e)) => {
                if breaks_connection(&e) {
                    conn.mark_broken();
                }
                Err(unanswered_if_lost(e))
            }
            Err(_) => {
                conn.mark_broken();
                Err(Error::Unanswered(format!(
                    "no answer within {}",
                    humantime::format_duration(self.command_timeout)
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::hash_tag;

    /// Slots match Redis's `CLUSTER KEYSLOT` (values checked against Redis 7).
    #[test]
    fn slot_matches_redis() {
        assert_eq!(super::slot("foo"), 12182);
        assert_eq!(super::slot("{user1000}.following"), super::slot("user1000"));
        assert_eq!(super::slot("123456789"), 0x31C3);
    }

    /// Failed calls are sorted by their cause as Baton reports it.
    #[test]
    fn errors_have_kinds() {
        use crate::{error::Error, metrics::RedisError as Kind};
        let unavailable = |cause: &str| Error::Unavailable(cause.to_owned());
        for (e, kind) in [
            (unavailable("no answer within 400ms"), Kind::Timeout),
            (unavailable("no connection within 400ms"), Kind::Timeout),
            (unavailable("NOAUTH Authentication required."), Kind::Auth),
            (
                unavailable("WRONGPASS: Redis refused Baton's user name and password"),
                Kind::Auth,
            ),
            (
                unavailable("LOADING Redis is loading the dataset in memory"),
                Kind::Server,
            ),
            (
                unavailable("Connection refused (os error 111)"),
                Kind::Connection,
            ),
            (
                Error::Internal("ERR Error running script".to_owned()),
                Kind::Script,
            ),
        ] {
            assert_eq!(super::error_kind(&e), kind, "{e}");
        }
        assert!(super::refuses_credentials(&unavailable(
            "NOAUTH Authentication required."
        )));
    }

    /// The tag follows Redis's rule: first `{`, first `}` after it, not empty.
    #[test]
    fn hash_tag_follows_redis() {
        assert_eq!(hash_tag("a{b}c"), Some("b"));
        assert_eq!(hash_tag("a{b}{c}"), Some("b"));
        assert_eq!(hash_tag("a{{b}c"), Some("{b"));
        assert_eq!(hash_tag("a{}b"), None);
        assert_eq!(hash_tag("a}b{c"), None);
        assert_eq!(hash_tag("plain"), None);
    }
}
