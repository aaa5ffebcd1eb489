//! [`RedisServer`]: the Redis a test talks to, a `redis-server` of its own or a local Redis
//! Cluster, and [`RedisConn`], a connection that works on both.

use std::{
    ffi::OsString,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use baton::{config::RedisConfig, redis::Topology};
use redis::{FromRedisValue, cluster_async::ClusterConnection};
use tokio::time::Instant;

use crate::{free_port, topology::RedisCluster, unique_prefix, within};

/// How long `redis-server` may take to answer after it was spawned.
const REDIS_READY_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts at starting `redis-server` on a fresh port when the picked one was taken meanwhile.
const REDIS_START_ATTEMPTS: usize = 5;

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
    /// machine would stop them all), returning once SIGSTOP has stopped them; needs
    /// [`RedisServer::start_private`] in cluster mode.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        self.own("signalling Redis");
        for pid in self.pids() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid fits"));
            nix::sys::signal::kill(pid, signal).expect("signalling redis-server");
        }
        if signal == nix::sys::signal::Signal::SIGSTOP {
            // Frozen means frozen before the test goes on: every thread has taken the signal.
            for pid in self.pids() {
                crate::wait_stopped(pid);
            }
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
    /// Its replies may take 5 s (the crate's default is 500 ms): a Redis busy with a test's load
    /// on a loaded machine answers a bookkeeping command late, not never.
    pub async fn client(&self) -> redis::aio::MultiplexedConnection {
        let client = redis::Client::open(self.url()).expect("redis url");
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        within(
            Duration::from_secs(5),
            client.get_multiplexed_async_connection_with_config(&config),
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

/// The log of the `redis-server` that runs in `dir`, or why there is none.
pub fn read_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("redis.log"))
        .unwrap_or_else(|e| format!("(no redis.log: {e})"))
}

/// Spawns a standalone `redis-server` on `port`, without persistence, logging to `dir`, and
/// waits until it answers (see [`spawn_server`]).
async fn launch_redis(port: u16, dir: &Path) -> Result<Child, String> {
    let mut args: Vec<OsString> = ["--port", &port.to_string(), "--bind", "127.0.0.1"]
        .into_iter()
        .chain(["--save", "", "--appendonly", "no", "--dir"])
        .map(OsString::from)
        .collect();
    args.push(dir.into());
    args.push("--logfile".into());
    args.push(dir.join("redis.log").into());
    spawn_server(port, dir, &args, REDIS_READY_TIMEOUT).await
}

/// Spawns `redis-server` with `args` (which put it on `port` and its log in `dir/redis.log`) and
/// waits until the server answering on `port` is this very process, not another one that took
/// the port first (this one then exits with "Address already in use"). An early exit, another
/// server on the port, or no answer within `ready` is an `Err` with the log.
pub(crate) async fn spawn_server(
    port: u16,
    dir: &Path,
    args: &[OsString],
    ready: Duration,
) -> Result<Child, String> {
    let mut child = Command::new("redis-server")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning redis-server (is it installed?)");
    let url = format!("redis://127.0.0.1:{port}");
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let deadline = Instant::now() + ready;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited with {status}; log:\n{}", read_log(dir)));
        }
        let info = async {
            let mut conn = client.get_multiplexed_async_connection().await?;
            redis::cmd("INFO")
                .arg("server")
                .query_async::<String>(&mut conn)
                .await
        };
        if let Ok(Ok(info)) = tokio::time::timeout(Duration::from_millis(500), info).await {
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
            return Err(format!(
                "no answer on port {port} within {ready:?}; log:\n{}",
                read_log(dir)
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
