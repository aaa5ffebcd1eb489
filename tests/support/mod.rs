//! The harness shared by every integration test file (`mod support;`).
//!
//! - [`RedisServer`]: a real `redis-server` on a free port, without persistence, its log and
//!   working directory in a temp dir; killed on drop, restartable on the same port. With
//!   `BATON_TEST_TOPOLOGY=cluster` ([`TestTopology`]) it is a local 3-master Redis Cluster
//!   instead, and the same tests run against it: [`Baton`] is configured for the topology,
//!   [`RedisServer::conn`] gives a [`RedisConn`] that routes plain commands by key and runs
//!   node-wide ones (`KEYS`, `INFO`, `CONFIG RESETSTAT`, ...) on every master, and `kill`,
//!   `restart` and `signal` act on every node. One cluster is shared by the tests of a binary
//!   (each Baton has its own key prefix); [`RedisServer::start_private`] gives a test a cluster
//!   of its own to kill or to read node-wide counters of.
//! - [`Baton`]: an in-process Baton (`baton::server::serve`) on `127.0.0.1:0` and a Unix socket,
//!   with a key prefix of its own, and clients for it.
//! - [`BatonProcess`]: the real `baton` binary, for signals and exit codes.
//! - [`Proxy`]: a TCP relay whose connections can be cut at once, to play a client that dies.
//! - Bounded waits ([`within`], [`wait_until`]) that fail with a message saying what was awaited.
//!
//! Every test gets its own `redis-server` (they start in milliseconds), so tests run in parallel;
//! a cluster takes 2-3 s to start, hence the one shared per binary in cluster mode.

// Each test file uses a different part of the harness.
#![allow(dead_code)]

pub mod lease;
pub mod lock;
pub mod semaphore;
pub mod tls;
pub mod topology;

use std::{
    fmt::Debug,
    future::Future,
    net::{SocketAddr, TcpListener as StdTcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::Duration,
};

use baton::{
    config::{RedisConfig, ServeConfig},
    proto::v1::lock_service_client::LockServiceClient,
    proto::v1::rate_limit_service_client::RateLimitServiceClient,
    proto::v1::semaphore_service_client::SemaphoreServiceClient,
    redis::Topology,
    server::{Listeners, serve},
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient as EnvoyRateLimitServiceClient;
use redis::{FromRedisValue, cluster_async::ClusterConnection};
use tokio::{task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_types::StatusExt;
use topology::RedisCluster;

/// How long `redis-server` may take to answer `PING` after it was spawned.
const REDIS_READY_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts at starting `redis-server` on a fresh port when the picked one was taken meanwhile.
const REDIS_START_ATTEMPTS: usize = 5;
/// How long an in-process Baton may take to report `readiness` SERVING.
const BATON_READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the `baton` binary may take to answer health checks.
const PROCESS_READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an in-process Baton may take to stop after its shutdown token is cancelled.
const BATON_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The drain deadline of in-process Batons (the default, 10 s, is longer than tests want).
pub const TEST_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/// A proto duration of `n` milliseconds.
pub fn ms(n: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(n / 1000).expect("seconds fit"),
        nanos: i32::try_from((n % 1000) * 1_000_000).expect("nanos fit"),
    }
}

/// A proto duration as a std one (panics on a negative value, which Baton never sends).
pub fn std_duration(d: &prost_types::Duration) -> Duration {
    Duration::try_from(*d).unwrap_or_else(|e| panic!("{d:?} is not a valid duration: {e}"))
}

/// Awaits `fut` for at most `limit`, panicking with `what` if it takes longer.
pub async fn within<T>(limit: Duration, fut: impl Future<Output = T>, what: &str) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// Polls `check` every few milliseconds until it returns `Some`, for at most `limit`; panics with
/// `what` and the last value seen otherwise. For conditions with no event to wait on (a count in
/// Redis, a health status), never as a pause.
pub async fn wait_until<T, L, F, Fut>(limit: Duration, what: &str, mut check: F) -> T
where
    L: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, L>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let last = match check().await {
            Ok(v) => return v,
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting for {what}; last seen: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Sends Baton's logs to the test output when `BATON_TEST_LOG` holds a filter (e.g. `debug`);
/// silent otherwise. Reads the environment, never changes it.
pub fn init_tracing() {
    let Ok(filter) = std::env::var("BATON_TEST_LOG") else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_test_writer()
        .try_init();
}

/// A key prefix no other test uses.
pub fn unique_prefix() -> String {
    format!("test-{}:", uuid::Uuid::new_v4().simple())
}

/// The Redis key of lock `name`'s state under `prefix` (`PREFIX{lock:NAME}`).
pub fn lock_key(prefix: &str, name: &str) -> String {
    format!("{prefix}{{lock:{name}}}")
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    let listener = StdTcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// A gRPC channel to `addr` over TCP.
pub async fn channel(addr: SocketAddr) -> Channel {
    within(
        Duration::from_secs(5),
        Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect(),
        "a gRPC connection",
    )
    .await
    .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"))
}

/// A gRPC channel over the Unix socket at `path`.
pub async fn uds_channel(path: &Path) -> Channel {
    let path = path.to_owned();
    // The URI is required but unused: every connection goes to the socket.
    let endpoint = Endpoint::try_from("http://[::]:50051").expect("endpoint");
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_| {
        let path = path.clone();
        async move {
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                tokio::net::UnixStream::connect(path).await?,
            ))
        }
    }));
    within(
        Duration::from_secs(5),
        connect,
        "a gRPC connection over the Unix socket",
    )
    .await
    .expect("connecting over the Unix socket")
}

/// The health status of `service`, or the gRPC error.
pub async fn health_status(
    health: &mut HealthClient<Channel>,
    service: &str,
) -> Result<ServingStatus, tonic::Status> {
    let response = health
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await?;
    Ok(response.into_inner().status())
}

/// Waits (at most `limit`) until health reports `wanted` for `service`.
pub async fn wait_for_health(
    health: &mut HealthClient<Channel>,
    service: &str,
    wanted: ServingStatus,
    limit: Duration,
) {
    let what = format!("health of {service:?} to be {wanted:?}");
    wait_until(limit, &what, || {
        let mut health = health.clone();
        async move {
            match health_status(&mut health, service).await {
                Ok(s) if s == wanted => Ok(()),
                other => Err(other),
            }
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// redis-server
// ---------------------------------------------------------------------------------------------

/// The environment variable choosing the Redis deployment of [`RedisServer::start`]: unset (or
/// `standalone`) for one `redis-server` per test, `cluster` for a local 3-master Redis Cluster.
pub const TOPOLOGY_VAR: &str = "BATON_TEST_TOPOLOGY";

/// The Redis deployment the service suites run against, chosen by [`TOPOLOGY_VAR`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestTopology {
    /// One `redis-server` per test.
    Standalone,
    /// A Redis Cluster of 3 masters without replicas: one per test binary, shared by its tests
    /// (each Baton writes under a key prefix of its own), or one per test for the tests that
    /// ask for it with [`RedisServer::start_private`].
    Cluster,
}

impl TestTopology {
    /// The topology [`TOPOLOGY_VAR`] names; panics on a value it does not know.
    pub fn from_env() -> Self {
        match std::env::var(TOPOLOGY_VAR) {
            Err(std::env::VarError::NotPresent) => Self::Standalone,
            Ok(v) if v.is_empty() || v == "standalone" => Self::Standalone,
            Ok(v) if v == "cluster" => Self::Cluster,
            other => panic!("{TOPOLOGY_VAR}={other:?}: expected standalone or cluster"),
        }
    }
}

/// Masters of a test cluster: Redis's minimum. No replicas: the suites test Baton on a Cluster,
/// not failovers (tests/topology.rs does those).
const CLUSTER_MASTERS: usize = 3;

/// The cluster the tests of one binary share in cluster mode: started by the first test that
/// asks for it, killed by its watchdog once the binary exits.
static SHARED_CLUSTER: tokio::sync::OnceCell<RedisCluster> = tokio::sync::OnceCell::const_new();

/// The Redis a test talks to: a `redis-server` of its own, or in cluster mode
/// (`BATON_TEST_TOPOLOGY=cluster`) a local Redis Cluster. Killed on drop (the shared cluster
/// once the test binary exits).
pub struct RedisServer {
    deployment: Deployment,
}

enum Deployment {
    /// A `redis-server` of this test.
    Node {
        child: Option<Child>,
        port: u16,
        dir: tempfile::TempDir,
    },
    /// The cluster this test binary's tests share.
    SharedCluster(&'static RedisCluster),
    /// A cluster of this test.
    OwnCluster(Box<RedisCluster>),
}

impl RedisServer {
    /// Starts `redis-server` on a free port, ready to answer `PING`; in cluster mode, gives the
    /// cluster this test binary shares (started on first use). A test that kills, restarts or
    /// signals Redis, or reads or resets node-wide counters, uses [`RedisServer::start_private`].
    pub async fn start() -> Self {
        match TestTopology::from_env() {
            TestTopology::Standalone => Self::start_node().await,
            TestTopology::Cluster => Self {
                deployment: Deployment::SharedCluster(
                    SHARED_CLUSTER
                        .get_or_init(|| RedisCluster::start_watched(CLUSTER_MASTERS, 0))
                        .await,
                ),
            },
        }
    }

    /// Like [`RedisServer::start`], but in cluster mode starts a cluster for this test alone (a
    /// few seconds), which it may kill, restart, signal and read node-wide counters of.
    pub async fn start_private() -> Self {
        match TestTopology::from_env() {
            TestTopology::Standalone => Self::start_node().await,
            TestTopology::Cluster => Self {
                deployment: Deployment::OwnCluster(Box::new(
                    RedisCluster::start(CLUSTER_MASTERS, 0).await,
                )),
            },
        }
    }

    /// Starts one `redis-server` of this test's own whatever the topology the suite runs on, for
    /// tests of how Baton meets a single server's replies (its configuration changed under it).
    pub async fn start_standalone() -> Self {
        Self::start_node().await
    }

    /// Starts one `redis-server` on a free port, ready to answer `PING`.
    async fn start_node() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("baton-redis-")
            .tempdir()
            .expect("creating a temp dir for redis-server");
        let mut failures = Vec::new();
        for _ in 0..REDIS_START_ATTEMPTS {
            let port = free_port();
            match launch_redis(port, dir.path()).await {
                Ok(child) => {
                    return Self {
                        deployment: Deployment::Node {
                            child: Some(child),
                            port,
                            dir,
                        },
                    };
                }
                // Most likely the port was taken between picking and binding: try another one.
                Err(log) => failures.push(format!("port {port}:\n{log}")),
            }
        }
        panic!(
            "redis-server did not start in {REDIS_START_ATTEMPTS} attempts:\n{}",
            failures.join("\n")
        );
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        !matches!(self.deployment, Deployment::Node { .. })
    }

    /// The cluster, in cluster mode.
    pub fn cluster(&self) -> Option<&RedisCluster> {
        match &self.deployment {
            Deployment::Node { .. } => None,
            Deployment::SharedCluster(cluster) => Some(cluster),
            Deployment::OwnCluster(cluster) => Some(cluster),
        }
    }

    /// The deployment as Baton's configuration names it.
    pub fn topology(&self) -> Topology {
        match self.cluster() {
            None => Topology::Standalone { url: self.url() },
            Some(cluster) => Topology::Cluster {
                seeds: cluster.seed_urls(),
            },
        }
    }

    /// Baton's Redis settings for this deployment, every other value at its default.
    pub fn redis_config(&self) -> RedisConfig {
        RedisConfig::with_topology(self.topology())
    }

    /// Baton's Redis handle on this deployment under a key prefix of its own, for calling the
    /// scripts directly (no Baton, no gRPC).
    pub fn baton_redis(&self) -> baton::redis::Redis {
        let mut config = self.redis_config();
        config.key_prefix = unique_prefix();
        baton::redis::Redis::new(&config).expect("redis config")
    }

    /// `names` unchanged on a single Redis; on a Cluster, names whose hash tags
    /// (`{KIND:NAME}`) all fall in the first name's slot: the others get the first `-N` suffix
    /// that does. For calls a Cluster restricts to one slot (a batch over several objects).
    pub fn names_in_one_slot<const N: usize>(&self, kind: &str, names: [&str; N]) -> [String; N] {
        let slot = |name: &str| baton::redis::slot(&format!("{{{kind}:{name}}}"));
        let Some(first) = names.first().filter(|_| self.is_cluster()) else {
            return names.map(str::to_owned);
        };
        let wanted = slot(first);
        names.map(|name| {
            if slot(name) == wanted {
                return name.to_owned();
            }
            (0u32..)
                .map(|n| format!("{name}-{n}"))
                .find(|candidate| slot(candidate) == wanted)
                .expect("some suffix hashes to any slot")
        })
    }

    /// The `baton serve` arguments that select this deployment (`--redis-url URL`, or
    /// `--redis-mode cluster --redis-url SEED,SEED,...`).
    pub fn baton_args(&self) -> Vec<String> {
        match self.cluster() {
            None => vec!["--redis-url".into(), self.url()],
            Some(cluster) => vec![
                "--redis-mode".into(),
                "cluster".into(),
                "--redis-url".into(),
                cluster.seed_urls().join(","),
            ],
        }
    }

    /// `redis://127.0.0.1:PORT` of the `redis-server` (a cluster has no single URL: see
    /// [`RedisServer::topology`] and [`RedisServer::baton_args`]).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// The URL of the server that holds `key`: the `redis-server`, or on a cluster the master
    /// serving the key's slot (for commands about one key's traffic, such as `MONITOR`).
    pub async fn url_for_key(&self, key: &str) -> String {
        match self.cluster() {
            None => self.url(),
            Some(cluster) => cluster.node_for_key(key).await.url(),
        }
    }

    /// The TCP port of the `redis-server` (not for a cluster).
    pub fn port(&self) -> u16 {
        match &self.deployment {
            Deployment::Node { port, .. } => *port,
            _ => panic!("a cluster has no single port: use topology(), baton_args() or cluster()"),
        }
    }

    /// The process id of the `redis-server`, while running (not for a cluster: see
    /// [`RedisServer::pids`]).
    pub fn pid(&self) -> Option<u32> {
        match &self.deployment {
            Deployment::Node { child, .. } => child.as_ref().map(Child::id),
            _ => panic!("a cluster has no single pid: use pids()"),
        }
    }

    /// The process ids of every running server (the nodes of a cluster).
    pub fn pids(&self) -> Vec<u32> {
        match &self.deployment {
            Deployment::Node { child, .. } => child.iter().map(Child::id).collect(),
            Deployment::SharedCluster(cluster) => cluster.pids(),
            Deployment::OwnCluster(cluster) => cluster.pids(),
        }
    }

    /// Sends `signal` to every running server (each node of a cluster at once, as a stalled
    /// machine would stop them all); needs [`RedisServer::start_private`] in cluster mode.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        self.own("signalling Redis");
        for pid in self.pids() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid fits"));
            nix::sys::signal::kill(pid, signal).expect("signalling redis-server");
        }
    }

    /// Panics unless the test may disturb this Redis: anything but the shared cluster.
    fn own(&self, what: &str) {
        assert!(
            !matches!(self.deployment, Deployment::SharedCluster(_)),
            "{what} would disturb every test of this binary on the cluster they share: start \
             this test's Redis with RedisServer::start_private()"
        );
    }

    /// Kills the server (SIGKILL, as a crash would) and reaps it; on a cluster, every node (as
    /// the crash of the whole Redis deployment). Needs [`RedisServer::start_private`] in cluster
    /// mode.
    pub fn kill(&mut self) {
        self.own("killing Redis");
        match &mut self.deployment {
            Deployment::Node { child, .. } => {
                if let Some(mut child) = child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
            Deployment::OwnCluster(cluster) => cluster.kill_all(),
            Deployment::SharedCluster(_) => unreachable!("refused above"),
        }
    }

    /// Starts the server again on the same port and directory (with no data: nothing is saved);
    /// on a cluster, kills every node still running, starts each again on its port with its
    /// `nodes.conf`, and waits until the cluster is healthy. Needs
    /// [`RedisServer::start_private`] in cluster mode.
    pub async fn restart(&mut self) {
        self.kill();
        match &mut self.deployment {
            Deployment::Node { child, port, dir } => {
                // The port was ours a moment ago; another process could grab it, but only by
                // bad luck.
                let deadline = Instant::now() + REDIS_READY_TIMEOUT;
                loop {
                    match launch_redis(*port, dir.path()).await {
                        Ok(started) => {
                            *child = Some(started);
                            return;
                        }
                        Err(log) if Instant::now() >= deadline => {
                            panic!("redis-server did not restart on port {port}:\n{log}")
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            }
            Deployment::OwnCluster(cluster) => cluster.restart_killed().await,
            Deployment::SharedCluster(_) => unreachable!("refused by kill"),
        }
    }

    /// A multiplexed connection to the `redis-server` (not for a cluster: see
    /// [`RedisServer::conn`], which works on both).
    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        let client = redis::Client::open(self.url()).expect("redis url");
        within(
            Duration::from_secs(5),
            client.get_multiplexed_async_connection(),
            "a redis connection",
        )
        .await
        .expect("connecting to redis-server")
    }

    /// A connection for looking at or changing Redis directly, on either topology.
    pub async fn conn(&self) -> RedisConn {
        match &self.deployment {
            Deployment::Node { port, .. } => {
                let conn = self.client().await;
                RedisConn {
                    route: Route::Node(conn.clone()),
                    nodes: vec![(*port, conn)],
                    shared: false,
                }
            }
            Deployment::SharedCluster(cluster) => RedisConn::cluster(cluster, true).await,
            Deployment::OwnCluster(cluster) => RedisConn::cluster(cluster, false).await,
        }
    }

    /// The server's log so far (every node's, on a cluster).
    pub fn log(&self) -> String {
        match &self.deployment {
            Deployment::Node { dir, .. } => read_log(dir.path()),
            Deployment::SharedCluster(cluster) => cluster.logs(),
            Deployment::OwnCluster(cluster) => cluster.logs(),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Deployment::Node { child, .. } = &mut self.deployment
            && let Some(mut child) = child.take()
        {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Where a [`RedisConn`] sends plain commands.
#[derive(Clone)]
enum Route {
    Node(redis::aio::MultiplexedConnection),
    /// Routed by key slot, following MOVED and ASK.
    Cluster(ClusterConnection),
}

/// A connection for tests to look at or change Redis directly, on either topology. Plain
/// commands (`query_async(&mut conn)`) go to the `redis-server`, or on a cluster to the master
/// owning the command's key (keyless ones to any node); node-wide commands (`KEYS`, `INFO`,
/// `CONFIG RESETSTAT`, `DBSIZE`, `FLUSHALL`, ...) go through the methods here, which run them on
/// every master and aggregate the answers. Cheap to clone.
#[derive(Clone)]
pub struct RedisConn {
    route: Route,
    /// The `redis-server`, or every master of the cluster, by port.
    nodes: Vec<(u16, redis::aio::MultiplexedConnection)>,
    /// Whether this is the cluster the binary's tests share (node-wide counters are not ours).
    shared: bool,
}

impl RedisConn {
    async fn cluster(cluster: &RedisCluster, shared: bool) -> Self {
        let conn = cluster.client().await;
        let mut nodes = Vec::new();
        for master in cluster.masters().await {
            nodes.push((master.port, cluster.node_client(master.port).await));
        }
        Self {
            route: Route::Cluster(conn),
            nodes,
            shared,
        }
    }

    /// Whether this is a connection to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.route, Route::Cluster(_))
    }

    /// The command scripts publish wake-ups with, as `INFO commandstats` names it: `spublish`
    /// (sharded pub/sub) on a Cluster, `publish` otherwise.
    pub fn publish_command(&self) -> &'static str {
        if self.is_cluster() {
            "spublish"
        } else {
            "publish"
        }
    }

    /// Runs `cmd` on the `redis-server`, or on every master of the cluster, returning each
    /// answer (in port order). On a cluster the tests of the binary share, panics: node-wide
    /// commands read or change every test's data (start the test's Redis with
    /// [`RedisServer::start_private`]).
    pub async fn on_every_node<T: FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Vec<T> {
        assert!(
            !self.shared,
            "a node-wide command would read or change every test's data on the cluster this \
             binary's tests share: start this test's Redis with RedisServer::start_private()"
        );
        self.each_node(cmd).await
    }

    async fn each_node<T: FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Vec<T> {
        let mut answers = Vec::with_capacity(self.nodes.len());
        for (port, conn) in &mut self.nodes {
            let answer = cmd
                .query_async(conn)
                .await
                .unwrap_or_else(|e| panic!("a node-wide command on 127.0.0.1:{port}: {e}"));
            answers.push(answer);
        }
        answers
    }

    /// Every key matching `pattern` (`KEYS` on every master), sorted. On the shared cluster the
    /// pattern must stay under a test's key prefix (`test-...`).
    pub async fn keys(&mut self, pattern: &str) -> Vec<String> {
        assert!(
            !self.shared || pattern.starts_with("test-"),
            "KEYS {pattern:?} would list other tests' keys on the cluster this binary's tests \
             share: match under the test's key prefix"
        );
        let mut keys: Vec<String> = self
            .each_node::<Vec<String>>(redis::cmd("KEYS").arg(pattern))
            .await
            .into_iter()
            .flatten()
            .collect();
        keys.sort();
        keys
    }

    /// The sum over every node of the numeric `field` of `INFO section`.
    pub async fn info_sum(&mut self, section: &str, field: &str) -> u64 {
        let infos: Vec<String> = self.on_every_node(redis::cmd("INFO").arg(section)).await;
        infos
            .iter()
            .map(|info| {
                info.lines()
                    .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("no numeric {field} in INFO {section}:\n{info}"))
            })
            .sum()
    }

    /// Calls of `command` every node ran successfully since the last `CONFIG RESETSTAT` (`INFO
    /// commandstats`, summed), leaving out failed ones such as an `EVALSHA` answered `NOSCRIPT`
    /// before its script is loaded. Commands scripts call count too.
    pub async fn command_calls(&mut self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{}:", command.to_ascii_lowercase());
        let stats: Vec<String> = self
            .on_every_node(redis::cmd("INFO").arg("commandstats"))
            .await;
        stats
            .iter()
            .filter_map(|s| s.lines().find_map(|l| l.strip_prefix(&prefix)))
            .map(|line| {
                let field = |name: &str| -> u64 {
                    line.split(',')
                        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                        .map_or(0, |n| n.trim().parse().expect("a call count"))
                };
                field("calls") - field("failed_calls")
            })
            .sum()
    }

    /// `CONFIG RESETSTAT` on every node.
    pub async fn reset_stats(&mut self) {
        let _: Vec<()> = self
            .on_every_node(redis::cmd("CONFIG").arg("RESETSTAT"))
            .await;
    }

    /// Keys in the database, summed over every node (`DBSIZE`).
    pub async fn dbsize(&mut self) -> u64 {
        let sizes: Vec<u64> = self.on_every_node(&redis::cmd("DBSIZE")).await;
        sizes.into_iter().sum()
    }
}

impl redis::aio::ConnectionLike for RedisConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match &mut self.route {
            Route::Node(conn) => conn.req_packed_command(cmd),
            Route::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match &mut self.route {
            Route::Node(conn) => conn.req_packed_commands(pipeline, offset, count),
            Route::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.route {
            Route::Node(conn) => conn.get_db(),
            Route::Cluster(conn) => conn.get_db(),
        }
    }
}

fn read_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("redis.log"))
        .unwrap_or_else(|e| format!("(no redis.log: {e})"))
}

/// Spawns `redis-server` on `port` and waits until it answers `PING`. An early exit (the port is
/// taken) is an `Err` with the log; not answering within [`REDIS_READY_TIMEOUT`] panics.
async fn launch_redis(port: u16, dir: &Path) -> Result<Child, String> {
    let mut child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning redis-server (is it installed?)");
    let url = format!("redis://127.0.0.1:{port}");
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let deadline = Instant::now() + REDIS_READY_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited with {status}; log:\n{}", read_log(dir)));
        }
        // PING, and make sure the server answering is this child, not another one that took the
        // port first (this child then exits with "Address already in use").
        let ping = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut conn).await?;
            redis::cmd("INFO")
                .arg("server")
                .query_async::<String>(&mut conn)
                .await
        };
        if let Ok(Ok(info)) = tokio::time::timeout(Duration::from_millis(500), ping).await {
            let pid = info
                .lines()
                .find_map(|l| l.strip_prefix("process_id:"))
                .and_then(|p| p.trim().parse::<u32>().ok());
            if pid == Some(child.id()) {
                return Ok(child);
            }
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "port {port} is served by another redis-server (pid {pid:?}); log:\n{}",
                read_log(dir)
            ));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "redis-server on port {port} did not answer PING within {REDIS_READY_TIMEOUT:?}; log:\n{}",
                read_log(dir)
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// In-process Baton
// ---------------------------------------------------------------------------------------------

/// A Baton served in-process on `127.0.0.1:0` and a Unix socket, with a key prefix of its own.
/// Cancelled on drop.
pub struct Baton {
    addr: SocketAddr,
    socket_path: PathBuf,
    prefix: String,
    shutdown: CancellationToken,
    task: Option<JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Baton {
    /// Starts a Baton over `redis` with a fresh key prefix and waits until it is ready.
    pub async fn start(redis: &RedisServer) -> Self {
        Self::start_with(redis, |_| {}).await
    }

    /// Starts a Baton over `redis`, letting `tweak` change the configuration before it binds.
    pub async fn start_with(redis: &RedisServer, tweak: impl FnOnce(&mut ServeConfig)) -> Self {
        let baton = Self::start_unready(redis, tweak).await;
        let mut health = baton.health().await;
        wait_for_health(
            &mut health,
            "readiness",
            ServingStatus::Serving,
            BATON_READY_TIMEOUT,
        )
        .await;
        baton
    }

    /// Starts a Baton without waiting for Redis to be reachable (readiness may be NOT_SERVING).
    pub async fn start_unready(redis: &RedisServer, tweak: impl FnOnce(&mut ServeConfig)) -> Self {
        init_tracing();
        let dir = tempfile::Builder::new()
            .prefix("baton-sock-")
            .tempdir()
            .expect("creating a temp dir for the socket");
        let mut redis_config = redis.redis_config();
        redis_config.key_prefix = unique_prefix();
        let mut config = ServeConfig::new(redis_config);
        config.listen = Some("127.0.0.1:0".parse().expect("address"));
        config.socket = Some(dir.path().join("baton.sock"));
        config.drain_timeout = TEST_DRAIN_TIMEOUT;
        tweak(&mut config);

        let listeners = Listeners::bind(&config).await.expect("binding listeners");
        let addr = listeners
            .tcp
            .as_ref()
            .expect("the test Baton listens on TCP")
            .local_addr()
            .expect("local address");
        let socket_path = listeners
            .unix
            .as_ref()
            .map(|(_, p)| p.clone())
            .expect("the test Baton listens on a Unix socket");
        let prefix = config.redis.key_prefix.clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve(config, listeners, shutdown.clone()));
        Self {
            addr,
            socket_path,
            prefix,
            shutdown,
            task: Some(task),
            _dir: dir,
        }
    }

    /// The TCP address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The Unix socket's path.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// The key prefix this Baton writes under.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The Redis key of lock `name`'s state.
    pub fn lock_key(&self, name: &str) -> String {
        lock_key(&self.prefix, name)
    }

    /// The Redis key of semaphore `name`'s data hash (`PREFIX{sem:NAME}`); its other keys add a
    /// suffix to it.
    pub fn semaphore_key(&self, name: &str) -> String {
        format!("{}{{sem:{name}}}", self.prefix)
    }

    /// A LockService client over a new TCP connection.
    pub async fn client(&self) -> LockServiceClient<Channel> {
        LockServiceClient::new(channel(self.addr).await)
    }

    /// A SemaphoreService client over a new TCP connection.
    pub async fn semaphore_client(&self) -> SemaphoreServiceClient<Channel> {
        SemaphoreServiceClient::new(channel(self.addr).await)
    }

    /// A RateLimitService client over a new TCP connection.
    pub async fn ratelimit_client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::new(channel(self.addr).await)
    }

    /// A client of Envoy's rate limit API (`envoy.service.ratelimit.v3`) over a new TCP connection.
    pub async fn envoy_ratelimit_client(&self) -> EnvoyRateLimitServiceClient<Channel> {
        EnvoyRateLimitServiceClient::new(channel(self.addr).await)
    }

    /// A LockService client over a new Unix socket connection.
    pub async fn uds_client(&self) -> LockServiceClient<Channel> {
        LockServiceClient::new(uds_channel(&self.socket_path).await)
    }

    /// A health client over a new TCP connection.
    pub async fn health(&self) -> HealthClient<Channel> {
        HealthClient::new(channel(self.addr).await)
    }

    /// Cancels the shutdown token (as SIGTERM would) without waiting.
    pub fn begin_shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Cancels the shutdown token and waits (bounded) for `serve` to return.
    pub async fn shutdown(&mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let task = self.task.take().expect("shutdown is called once");
        within(BATON_STOP_TIMEOUT, task, "serve() to return after shutdown")
            .await
            .expect("the serve task did not panic")
    }
}

impl Drop for Baton {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Baton {
    /// Starts a Baton over any Redis deployment, for tests that build the deployment themselves
    /// (a [`topology::SentinelDeployment`], a private [`topology::RedisCluster`]): `redis` is its
    /// configuration (e.g. `RedisConfig::with_topology(Topology::Sentinel { .. })`), given a fresh
    /// key prefix; `tweak` may change anything before Baton binds. Waits until it is ready.
    pub async fn start_on(redis: RedisConfig, tweak: impl FnOnce(&mut ServeConfig)) -> Self {
        init_tracing();
        let dir = tempfile::Builder::new()
            .prefix("baton-sock-")
            .tempdir()
            .expect("creating a temp dir for the socket");
        let mut redis = redis;
        redis.key_prefix = unique_prefix();
        let mut config = ServeConfig::new(redis);
        config.listen = Some("127.0.0.1:0".parse().expect("address"));
        config.socket = Some(dir.path().join("baton.sock"));
        config.drain_timeout = TEST_DRAIN_TIMEOUT;
        tweak(&mut config);

        let listeners = Listeners::bind(&config).await.expect("binding listeners");
        let addr = listeners
            .tcp
            .as_ref()
            .expect("the test Baton listens on TCP")
            .local_addr()
            .expect("local address");
        let socket_path = listeners
            .unix
            .as_ref()
            .map(|(_, p)| p.clone())
            .expect("the test Baton listens on a Unix socket");
        let prefix = config.redis.key_prefix.clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(serve(config, listeners, shutdown.clone()));
        let baton = Self {
            addr,
            socket_path,
            prefix,
            shutdown,
            task: Some(task),
            _dir: dir,
        };
        let mut health = baton.health().await;
        wait_for_health(
            &mut health,
            "readiness",
            ServingStatus::Serving,
            BATON_READY_TIMEOUT,
        )
        .await;
        baton
    }
}

// ---------------------------------------------------------------------------------------------
// The baton binary
// ---------------------------------------------------------------------------------------------

/// A `baton` child process serving on a free TCP port; killed on drop. Its stderr goes to a
/// temp file, printed when the test fails.
pub struct BatonProcess {
    child: Option<Child>,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl BatonProcess {
    /// Runs `baton serve --listen 127.0.0.1:PORT --socket DIR/baton.sock` followed by `args`, and
    /// waits until it answers gRPC health checks.
    pub async fn spawn(args: &[&str]) -> Self {
        Self::spawn_with(args, false).await
    }

    /// Like [`BatonProcess::spawn`], with stdout and stderr pipes the test reads (and may close)
    /// through [`BatonProcess::take_stderr`] and [`BatonProcess::take_stdout`].
    pub async fn spawn_piped(args: &[&str]) -> Self {
        Self::spawn_with(args, true).await
    }

    /// The reading end of the process's stderr pipe (see [`BatonProcess::spawn_piped`]).
    pub fn take_stderr(&mut self) -> std::process::ChildStderr {
        self.child
            .as_mut()
            .and_then(|c| c.stderr.take())
            .expect("spawned with piped stderr")
    }

    /// The reading end of the process's stdout pipe (see [`BatonProcess::spawn_piped`]).
    pub fn take_stdout(&mut self) -> std::process::ChildStdout {
        self.child
            .as_mut()
            .and_then(|c| c.stdout.take())
            .expect("spawned with piped stdout")
    }

    async fn spawn_with(args: &[&str], piped: bool) -> Self {
        let mut failures = Vec::new();
        for _ in 0..3 {
            let dir = tempfile::Builder::new()
                .prefix("baton-proc-")
                .tempdir()
                .expect("creating a temp dir");
            let addr: SocketAddr = format!("127.0.0.1:{}", free_port())
                .parse()
                .expect("address");
            let socket = dir.path().join("baton.sock");
            let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr file");
            let (stdout, stderr) = if piped {
                (Stdio::piped(), Stdio::piped())
            } else {
                (Stdio::null(), Stdio::from(stderr))
            };
            let child = baton_command()
                .args(["serve", "--listen", &addr.to_string(), "--socket"])
                .arg(&socket)
                .args(args)
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .spawn()
                .expect("spawning the baton binary");
            let mut process = Self {
                child: Some(child),
                addr,
                dir,
            };
            match process.wait_ready().await {
                Ok(()) => return process,
                // Most likely the port was taken meanwhile: try another one (dropping kills it).
                Err(why) => failures.push(format!("{addr}: {why}\nstderr:\n{}", process.stderr())),
            }
        }
        panic!(
            "the baton binary did not become ready:\n{}",
            failures.join("\n")
        );
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + PROCESS_READY_TIMEOUT;
        let endpoint = Endpoint::from_shared(format!("http://{}", self.addr)).expect("endpoint");
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("exited early with {status}"));
            }
            if let Ok(Ok(channel)) =
                tokio::time::timeout(Duration::from_millis(500), endpoint.connect()).await
            {
                let mut health = HealthClient::new(channel);
                if let Ok(Ok(ServingStatus::Serving)) = tokio::time::timeout(
                    Duration::from_millis(500),
                    health_status(&mut health, "liveness"),
                )
                .await
                {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no SERVING liveness within {PROCESS_READY_TIMEOUT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The TCP address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The Unix socket it serves on.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.path().join("baton.sock")
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the process was spawned").id()
    }

    /// A LockService client over a new TCP connection.
    pub async fn client(&self) -> LockServiceClient<Channel> {
        LockServiceClient::new(channel(self.addr).await)
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).expect("pid fits"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("sending SIGTERM");
    }

    /// Waits up to `limit` for the process to exit; `None` if it is still running.
    pub async fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut().expect("the process was spawned");
        loop {
            if let Some(status) = child.try_wait().expect("waiting for baton") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log"))
            .unwrap_or_else(|e| format!("(no stderr: {e})"))
    }
}

impl Drop for BatonProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- baton stderr ---\n{}--- end ---", self.stderr());
        }
    }
}

/// A `Command` for the `baton` binary with no `BATON_*` variable inherited from the test's
/// environment (tests never change their own environment; they only shape the child's).
pub fn baton_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_baton"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("BATON_") {
            command.env_remove(key);
        }
    }
    command
}

/// Runs the `baton` binary to completion (at most `limit`), returning its status and stderr.
pub async fn run_baton(mut command: Command, limit: Duration) -> (ExitStatus, String) {
    let dir = tempfile::tempdir().expect("creating a temp dir");
    let stderr_path = dir.path().join("stderr.log");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawning the baton binary");
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for baton") {
            let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            return (status, stderr);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            panic!("baton did not exit within {limit:?}; stderr:\n{stderr}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// A TCP relay that can be cut
// ---------------------------------------------------------------------------------------------

/// Relays TCP connections to a target until [`Proxy::cut`], which closes every relayed connection
/// at once and refuses new ones: to Baton, the client vanished as if its process died.
pub struct Proxy {
    addr: SocketAddr,
    cut: CancellationToken,
}

impl Proxy {
    /// Starts relaying from a fresh local port to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the proxy");
        let addr = listener.local_addr().expect("local address");
        let cut = CancellationToken::new();
        let stop = cut.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stop.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                let stop = stop.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        () = stop.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    }
                });
            }
        });
        Self { addr, cut }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A LockService client whose connection goes through the proxy.
    pub async fn client(&self) -> LockServiceClient<Channel> {
        LockServiceClient::new(channel(self.addr).await)
    }

    /// A SemaphoreService client whose connection goes through the proxy.
    pub async fn semaphore_client(&self) -> SemaphoreServiceClient<Channel> {
        SemaphoreServiceClient::new(channel(self.addr).await)
    }

    /// Closes every relayed connection and stops accepting.
    pub fn cut(&self) {
        self.cut.cancel();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut.cancel();
    }
}

// ---------------------------------------------------------------------------------------------
// Assertions shared by the service suites
// ---------------------------------------------------------------------------------------------

/// Asserts `result` is INVALID_ARGUMENT naming `field` (message prefix and BadRequest detail).
pub fn assert_invalid<T>(result: Result<T, tonic::Status>, field: &str) {
    let status = match result {
        Ok(_) => panic!("expected INVALID_ARGUMENT on {field}, got OK"),
        Err(s) => s,
    };
    assert_eq!(
        status.code(),
        tonic::Code::InvalidArgument,
        "{field}: {status:?}"
    );
    assert!(
        status.message().starts_with(&format!("{field}:")),
        "the message should start with {field:?}: {:?}",
        status.message()
    );
    let details = status.get_error_details();
    let bad = details
        .bad_request()
        .unwrap_or_else(|| panic!("{field}: no BadRequest detail in {status:?}"));
    assert!(
        bad.field_violations.iter().any(|v| v.field == field),
        "{field}: BadRequest names {:?}",
        bad.field_violations
    );
}

/// Asserts `result` failed with `code`, returning the status.
pub fn assert_code<T>(
    result: Result<T, tonic::Status>,
    code: tonic::Code,
    what: &str,
) -> tonic::Status {
    match result {
        Ok(_) => panic!("{what}: expected {code:?}, got OK"),
        Err(s) => {
            assert_eq!(s.code(), code, "{what}: {s:?}");
            s
        }
    }
}

/// Runs `call` and asserts it fails with UNAVAILABLE carrying RetryInfo, in under a second.
pub async fn unavailable_within_1s<T>(
    what: &str,
    call: impl Future<Output = Result<T, tonic::Status>>,
) {
    let started = Instant::now();
    let result = within(Duration::from_secs(5), call, what).await;
    let elapsed = started.elapsed();
    let status = assert_code(result, tonic::Code::Unavailable, what);
    assert!(
        status.get_error_details().retry_info().is_some(),
        "{what}: no RetryInfo in {status:?}"
    );
    assert!(
        elapsed < Duration::from_secs(1),
        "{what}: UNAVAILABLE took {elapsed:?}"
    );
}

/// A duration field that must be set, as a std duration.
pub fn remaining(d: &Option<prost_types::Duration>, what: &str) -> Duration {
    std_duration(
        d.as_ref()
            .unwrap_or_else(|| panic!("{what}: the duration is not set")),
    )
}

/// A well-formed lease token that holds nothing.
pub fn random_token() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

/// The machine a benchmark ran on, for its report: cores, CPU model, memory, kernel, Redis and
/// rustc versions.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or_else(String::new, |kb| format!(", {:.0} GiB", kb / 1048576.0));
    let output = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    let redis = output("redis-server", &["--version"]);
    let redis = redis
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or("?")
        .to_owned();
    format!(
        "{cores} cores ({cpu}){memory}, Linux {}, Redis {redis}, {}",
        output("uname", &["-r"]),
        output("rustc", &["--version"])
    )
}
