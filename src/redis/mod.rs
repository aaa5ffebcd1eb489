//! The Redis layer: script calls bounded by the command timeout over the configured
//! [`Topology`] (a bb8 pool of multiplexed connections to a standalone Redis or to the master the
//! Sentinels name; redis-rs's cluster connection on a Cluster), and the shared pub/sub subscriber
//! that wakes local waiters.
//!
//! Every state change Baton makes is one Lua script (a `.lua` file beside the service that owns
//! it, wrapped once in a [`Script`], called by SHA with a `NOSCRIPT` fallback). Scripts read the
//! time from Redis (`TIME`), never from this process.

mod notifier;
pub mod reply;
mod topology;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bb8_redis::{
    bb8,
    redis::{
        self, AsyncConnectionConfig, FromRedisValue, ProtocolVersion, RedisError, ScriptInvocation,
        aio::MultiplexedConnection,
        cluster::{ClusterClient, ClusterClientBuilder},
        cluster_async::ClusterConnection,
        cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr},
    },
};
use tokio::time::{Instant, timeout_at};

pub use ::redis::Script;
pub use notifier::{ADDRESSED, Notifier, Source, Subscription, Wake};
pub use topology::{Endpoint, Topology};

use crate::{config::RedisConfig, error::Error};

/// Shortest pause before redis-rs's cluster connection retries a command the cluster asked it to
/// retry (`TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`), in milliseconds.
///
/// Redis answers `TRYAGAIN` to every multi-key command, so to every Baton script, whose slot is
/// being migrated unless all its keys exist on one side: each step of a live resharding refuses
/// them for a few milliseconds. redis-rs's default pause (1.28 s at least) is longer than the
/// command timeout, so every call that met a resharding step failed `UNAVAILABLE` although the
/// slot was stable again milliseconds later; with these pauses it is retried within its timeout.
const CLUSTER_RETRY_MIN_WAIT_MS: u64 = 2;
/// Longest pause between two such retries, in milliseconds.
const CLUSTER_RETRY_MAX_WAIT_MS: u64 = 100;
/// Retry `n` pauses up to `CLUSTER_RETRY_FACTOR_MS * 2^n` milliseconds (10, 20, 40, 80, then the
/// longest), jittered from [`CLUSTER_RETRY_MIN_WAIT_MS`]. The command timeout bounds the whole.
const CLUSTER_RETRY_FACTOR_MS: u64 = 5;

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
}

impl Conn {
    fn mark_broken(&self) {
        self.broken.store(true, Ordering::Relaxed);
    }
}

/// Opens connections with Baton's connect and response timeouts.
///
/// `bb8_redis::RedisConnectionManager` opens connections with the redis crate's defaults and never
/// reports one as broken, which would keep a dead connection in the pool after Redis restarts
/// unless every checkout paid for a `PING`; this manager does neither.
pub struct Manager {
    endpoint: Endpoint,
    connect_timeout: Duration,
    config: AsyncConnectionConfig,
}

impl bb8::ManageConnection for Manager {
    type Connection = Conn;
    type Error = RedisError;

    async fn connect(&self) -> Result<Conn, RedisError> {
        // With Sentinel this asks for the current master, so a failover is followed by the next
        // connection opened after the old one broke.
        let client = self.endpoint.client(self.connect_timeout).await?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        Ok(Conn {
            conn,
            broken: Arc::new(AtomicBool::new(false)),
        })
    }

    async fn is_valid(&self, conn: &mut Conn) -> Result<(), RedisError> {
        redis::cmd("PING").query_async(&mut conn.conn).await
    }

    fn has_broken(&self, conn: &mut Conn) -> bool {
        conn.broken.load(Ordering::Relaxed)
    }
}

/// Passes the pool's connection failures to the checkouts waiting for a connection.
///
/// bb8 opens connections in the background and sends their errors to an error sink, leaving a
/// waiting `get` to run into its timeout; with this sink a refused connection fails the waiting
/// calls at once with the real cause.
#[derive(Clone)]
struct ConnectFailures(tokio::sync::broadcast::Sender<Arc<str>>);

impl std::fmt::Debug for ConnectFailures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectFailures")
    }
}

impl bb8::ErrorSink<RedisError> for ConnectFailures {
    fn sink(&self, error: RedisError) {
        tracing::debug!(error = %error, "redis connection failed");
        // No receiver just means nobody is waiting for a connection right now.
        let _ = self.0.send(error.to_string().into());
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<RedisError>> {
        Box::new(self.clone())
    }
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
    Node {
        pool: bb8::Pool<Manager>,
        connect_failures: ConnectFailures,
    },
    /// redis-rs's cluster connection: one multiplexed connection per node, routing each command
    /// by its first key's slot and following `MOVED`/`ASK`.
    Cluster { conn: ClusterConnection },
}

/// The Redis Cluster hash slot of `key` (CRC16 of its hash tag, or of the whole key, mod 16384).
pub fn slot(key: &str) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed.as_bytes()) % 16384
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
        let (backend, source) = match &config.topology {
            Topology::Cluster { seeds } => {
                let client = |protocol| {
                    ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                        .connection_timeout(config.connect_timeout)
                        .response_timeout(config.command_timeout)
                        .min_retry_wait(CLUSTER_RETRY_MIN_WAIT_MS)
                        .max_retry_wait(CLUSTER_RETRY_MAX_WAIT_MS)
                        .retry_wait_formula(CLUSTER_RETRY_FACTOR_MS, 2)
                        .use_protocol(protocol)
                        .build()
                        .map_err(|e| Error::Internal(format!("redis cluster: {e}")))
                };
                let commands: ClusterClient = client(ProtocolVersion::RESP2)?;
                let conn = commands
                    .get_pending_async_connection_with_config(redis::cluster::ClusterConfig::new());
                // Sharded pub/sub arrives as RESP3 pushes.
                let source = Source::Cluster(Box::new(client(ProtocolVersion::RESP3)?));
                (Backend::Cluster { conn }, source)
            }
            topology => {
                let endpoint = Endpoint::new(topology)?
                    .ok_or_else(|| Error::Internal("a node topology without an endpoint".into()))?;
                let manager = Manager {
                    endpoint: endpoint.clone(),
                    connect_timeout: config.connect_timeout,
                    config: AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(config.connect_timeout))
                        .set_response_timeout(Some(config.command_timeout)),
                };
                let connect_failures = ConnectFailures(tokio::sync::broadcast::channel(16).0);
                let pool = bb8::Pool::builder()
                    .max_size(config.pool_size)
                    .connection_timeout(config.command_timeout)
                    .test_on_check_out(false)
                    // A refused connection is reported at once instead of being retried until
                    // the timeout.
                    .retry_connection(false)
                    .error_sink(Box::new(connect_failures.clone()))
                    .build_unchecked(manager);
                (
                    Backend::Node {
                        pool,
                        connect_failures,
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
    /// `redis.call(PUBLISH, channel, message)`: `PUBLISH` is a local defined in front of the source,
    /// `'SPUBLISH'` on a Cluster (sharded pub/sub, delivered by the node owning the channel's
    /// slot, which is the slot of the keys the script touches) and `'PUBLISH'` otherwise.
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

    /// The time allowed to open a connection.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Runs a script (EVALSHA, loading it on `NOSCRIPT`) within the command timeout, counted from
    /// the moment a connection is requested.
    pub async fn eval<T: FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, Error> {
        let deadline = Instant::now() + self.command_timeout;
        match &self.backend {
            Backend::Node { .. } => {
                let mut conn = self.checkout(deadline).await?;
                let outcome = timeout_at(deadline, invocation.invoke_async(&mut conn.conn)).await;
                self.settle(Some(&conn), outcome)
            }
            Backend::Cluster { conn } => {
                let outcome =
                    timeout_at(deadline, invocation.invoke_async(&mut conn.clone())).await;
                self.settle(None, outcome)
            }
        }
    }

    /// Runs a script like [`eval`](Self::eval) and, when `--min-replicas-ack` is set and `wrote`
    /// says the reply reports a grant, sends `WAIT` on the same connection to the node owning
    /// `key`, so that it covers the script's writes. The caller rolls the grant back when the
    /// answer is [`Ack::Missing`].
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
        let deadline = Instant::now() + self.command_timeout;
        let wait_deadline = deadline + self.replica_ack_timeout;
        match &self.backend {
            Backend::Node { .. } => {
                let mut conn = self.checkout(deadline).await?;
                let outcome = timeout_at(deadline, invocation.invoke_async(&mut conn.conn)).await;
                let value: T = self.settle(Some(&conn), outcome)?;
                if !wrote(&value) {
                    return Ok((value, Ack::NotAsked));
                }
                let acked =
                    timeout_at(wait_deadline, wait.query_async::<i64>(&mut conn.conn)).await;
                Ok((value, self.ack(self.settle(Some(&conn), acked))))
            }
            Backend::Cluster { conn } => {
                let mut conn = conn.clone();
                let outcome = timeout_at(deadline, invocation.invoke_async(&mut conn)).await;
                let value: T = self.settle(None, outcome)?;
                if !wrote(&value) {
                    return Ok((value, Ack::NotAsked));
                }
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::new(slot(key), SlotAddr::Master),
                ));
                let acked = timeout_at(wait_deadline, conn.route_command(wait, route))
                    .await
                    .map(|r| r.and_then(|v| Ok(redis::from_redis_value::<i64>(v)?)));
                Ok((value, self.ack(self.settle(None, acked))))
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

    /// Sends one plain command within the command timeout.
    pub async fn command<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, Error> {
        let deadline = Instant::now() + self.command_timeout;
        match &self.backend {
            Backend::Node { .. } => {
                let mut conn = self.checkout(deadline).await?;
                let outcome = timeout_at(deadline, cmd.query_async(&mut conn.conn)).await;
                self.settle(Some(&conn), outcome)
            }
            Backend::Cluster { conn } => {
                let outcome = timeout_at(deadline, cmd.query_async(&mut conn.clone())).await;
                self.settle(None, outcome)
            }
        }
    }

    /// Sends `PING` within the command timeout.
    pub async fn ping(&self) -> Result<(), Error> {
        self.command::<String>(&redis::cmd("PING")).await.map(drop)
    }

    /// Turns a bounded call's outcome into a result, marking a pooled connection broken when it
    /// can no longer be trusted (an I/O error, a dropped connection, a node that is no longer the
    /// master, or no answer in time). The cluster connection repairs itself.
    fn settle<T>(
        &self,
        conn: Option<&Conn>,
        outcome: Result<Result<T, RedisError>, tokio::time::error::Elapsed>,
    ) -> Result<T, Error> {
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                let demoted =
                    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
                if e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_unrecoverable_error()
                    || demoted
                {
                    conn.map(Conn::mark_broken);
                }
                Err(e.into())
            }
            Err(_) => {
                conn.map(Conn::mark_broken);
                Err(Error::Unavailable(format!(
                    "no answer within {}",
                    humantime::format_duration(self.command_timeout)
                )))
            }
        }
    }

    /// A handle on one of the pooled connections; the pool slot itself is given back at once.
    async fn checkout(&self, deadline: Instant) -> Result<Conn, Error> {
        let Backend::Node {
            pool,
            connect_failures,
        } = &self.backend
        else {
            return Err(Error::Internal("no pool on a cluster".into()));
        };
        let mut failures = connect_failures.0.subscribe();
        let checkout = tokio::select! {
            r = timeout_at(deadline, pool.get()) => r,
            Ok(cause) = failures.recv() => return Err(Error::Unavailable(cause.to_string())),
        };
        match checkout {
            Ok(Ok(pooled)) => Ok(Conn::clone(&pooled)),
            Ok(Err(bb8::RunError::User(e))) => Err(e.into()),
            Ok(Err(bb8::RunError::TimedOut)) | Err(_) => Err(Error::Unavailable(format!(
                "no connection within {}",
                humantime::format_duration(self.command_timeout)
            ))),
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
