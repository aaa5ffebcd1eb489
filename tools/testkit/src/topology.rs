//! Local Redis topologies for tests that need more than one `redis-server` (Redis 7.0 or later):
//!
//! - [`RedisCluster`]: masters and replicas started with `--cluster-enabled yes`, joined with
//!   `redis-cli --cluster create`; kill a node, restart it, reshard one slot live
//!   ([`RedisCluster::migrate_slot`], or step by step with [`RedisCluster::begin_migration`]).
//! - [`SentinelDeployment`]: a master, one replica and three Sentinels watching them; kill the
//!   master and wait for the Sentinels to promote the replica.
//!
//! Every process runs on free ports without persistence, with its working directory and log in
//! a temp dir, and is killed by pid on drop (a cluster kept in a `static`, never dropped, by a
//! [`Watchdog`] once the test process is gone). Readiness is polled from the servers' own views
//! (`CLUSTER INFO`, `CLUSTER NODES`, `SENTINEL MASTER`) with a short interval and a deadline.

use std::{
    collections::HashMap,
    ffi::OsString,
    net::{SocketAddr, TcpListener as StdTcpListener},
    ops::RangeInclusive,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use redis::{
    AsyncConnectionConfig, FromRedisValue, Value,
    aio::MultiplexedConnection,
    cluster::{ClusterClient, ClusterClientBuilder},
    cluster_async::ClusterConnection,
    sentinel::{SentinelClient, SentinelServerType},
};
use tokio::time::Instant;

use crate::{free_port, redis_server::read_log, within};

/// Hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;
/// The cluster bus of a node listens on its client port plus this (Redis's fixed offset).
const BUS_PORT_OFFSET: u16 = 10000;
/// `cluster-node-timeout` of test clusters. A node unreachable this long is flagged failing and
/// its replica may take over, so a killed master is replaced within about this plus the replica
/// election delay (0.5 to 1 s) instead of the 15 s default: measured from SIGKILL to a healthy
/// cluster on a loaded 2-core machine, 2.1-2.4 s with 1000 ms, 2.7-3.5 s with 1500 ms, 3.5-4.2 s
/// with 2000 ms. Not lower: a process on a loaded CI machine can miss pings for a few hundred
/// milliseconds, and a spurious failure flag would fail over a healthy master mid-test.
pub const CLUSTER_NODE_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long a cluster may take to start and agree on its slot map. Masters report
/// `cluster_state:ok` no sooner than 2 s after they start (Redis's `CLUSTER_WRITABLE_DELAY`), and
/// `redis-cli --cluster create` waits 1 s for the join to begin; the rest is CI headroom.
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `redis-cli --cluster create` may run.
const CLUSTER_CREATE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the nodes may take to agree on a slot's new owner once a migration is finished.
const SLOT_AGREEMENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Keys moved per `MIGRATE` call by [`RedisCluster::migrate_slot`].
pub const MIGRATE_BATCH: usize = 100;
/// The timeout `MIGRATE` is given, in milliseconds.
const MIGRATE_TIMEOUT_MS: u64 = 5000;
/// How long a spawned server may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts at starting a server on fresh ports when the picked ones were taken meanwhile.
const START_ATTEMPTS: usize = 5;
/// Connect and response timeout of the helpers' own connections.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Interval between two looks at the state of a topology while waiting for it.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How long Sentinels may take to see the master, the replica and each other. Sentinels find
/// each other through hello messages published every 2 s (fixed in Redis).
const SENTINEL_READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the replica may take to finish its first sync with the master.
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------------------------

/// A `redis-server` child (a data node or a Sentinel), killed by pid on drop.
struct Process {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    args: Vec<OsString>,
}

impl Process {
    /// Spawns `redis-server ARGS` (which must make it listen on `port`) and waits until it
    /// answers. An early exit (a port taken meanwhile) is an `Err` with the log.
    async fn spawn(port: u16, dir: PathBuf, args: Vec<OsString>) -> Result<Self, String> {
        let child = launch(port, &dir, &args).await?;
        Ok(Self {
            child: Some(child),
            port,
            dir,
            args,
        })
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL, as a crash would, and reap.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again on the same port and directory with `args` (bounded retries:
    /// the port was ours a moment ago, but the kernel may still hold it briefly).
    async fn relaunch(&mut self, args: Vec<OsString>) {
        self.kill();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match launch(self.port, &self.dir, &args).await {
                Ok(child) => {
                    self.child = Some(child);
                    self.args = args;
                    return;
                }
                Err(log) if Instant::now() >= deadline => {
                    panic!("redis-server did not restart on port {}:\n{log}", self.port)
                }
                Err(_) => tokio::time::sleep(POLL_INTERVAL).await,
            }
        }
    }

    fn log(&self) -> String {
        read_log(&self.dir)
    }

    /// The last `lines` lines of the log.
    fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Spawns `redis-server ARGS` and waits until the server answering on `port` is this child.
async fn launch(port: u16, dir: &Path, args: &[OsString]) -> Result<Child, String> {
    let mut child = Command::new("redis-server")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning redis-server (is it installed?)");
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("exited with {status}; log:\n{}", read_log(dir)));
        }
        // Make sure the server answering is this child, not another one that took the port
        // first (this child then exits with "Address already in use").
        let info = tokio::time::timeout(
            Duration::from_millis(500),
            query::<String>(port, redis::cmd("INFO").arg("server")),
        )
        .await;
        if let Ok(Ok(info)) = info {
            let pid = info_field(&info, "process_id").and_then(|p| p.parse::<u32>().ok());
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
                "no answer on port {port} within {READY_TIMEOUT:?}; log:\n{}",
                read_log(dir)
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Starts a server in a fresh subdirectory of `parent` on the port `pick` returns, trying
/// fresh ports when one was taken; `args(port, dir)` builds the command line.
async fn start_process(
    parent: &Path,
    name: &str,
    pick: impl Fn() -> u16,
    args: impl Fn(u16, &Path) -> Vec<OsString>,
) -> Process {
    let mut failures = Vec::new();
    for _ in 0..START_ATTEMPTS {
        let port = pick();
        let dir = parent.join(format!("{name}-{port}"));
        std::fs::create_dir_all(&dir).expect("creating a node directory");
        match Process::spawn(port, dir.clone(), args(port, &dir)).await {
            Ok(process) => return process,
            Err(log) => failures.push(format!("port {port}: {log}")),
        }
    }
    panic!(
        "{name} did not start in {START_ATTEMPTS} attempts:\n{}",
        failures.join("\n")
    );
}

/// The arguments shared by every data node: loopback only, no persistence, a log in `dir`.
fn base_args(port: u16, dir: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = ["--port", &port.to_string(), "--bind", "127.0.0.1"]
        .iter()
        .map(OsString::from)
        .collect();
    args.extend(["--save", "", "--appendonly", "no"].map(OsString::from));
    // Replicas sync at once instead of after the 5 s a master waits by default for more
    // replicas to share a diskless transfer.
    args.extend(["--repl-diskless-sync-delay", "0", "--dir"].map(OsString::from));
    args.push(dir.into());
    args.push("--logfile".into());
    args.push(dir.join("redis.log").into());
    args
}

/// A port that was free a moment ago whose cluster bus port (`port + 10000`, at most 65535) was
/// free too.
fn free_cluster_port() -> u16 {
    for _ in 0..200 {
        let listener = StdTcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        let Some(bus) = port.checked_add(BUS_PORT_OFFSET) else {
            continue;
        };
        if StdTcpListener::bind(("127.0.0.1", bus)).is_ok() {
            return port;
        }
    }
    panic!("found no free port whose cluster bus port (+{BUS_PORT_OFFSET}) is free too");
}

// ---------------------------------------------------------------------------------------------
// Watchdog
// ---------------------------------------------------------------------------------------------

/// Kills processes and removes a directory once the test process is gone, for a deployment kept
/// in a `static` (shared by the tests of one binary), which is never dropped.
///
/// A `sh` child reads pids, one a line, from a pipe whose only writer is the test process. When
/// that process ends (normally, by a panic or by a signal, SIGKILL included), the kernel closes
/// the pipe, `read` sees end of file, and the shell SIGKILLs every pid it was given and removes
/// the directory. Rust opens pipes close-on-exec, so no other child holds the writing end open;
/// the shell ignores the terminal's SIGINT and SIGHUP so that it outlives a Ctrl-C to clean up.
pub struct Watchdog {
    stdin: std::sync::Mutex<std::process::ChildStdin>,
    /// Never waited for: it outlives the test process on purpose.
    _child: Child,
}

impl Watchdog {
    /// Starts the shell, which will remove `dir` once the test process is gone.
    pub fn spawn(dir: &Path) -> Self {
        const SCRIPT: &str = r#"trap '' INT HUP
pids=""
while read -r pid; do pids="$pids $pid"; done
if [ -n "$pids" ]; then kill -9 $pids 2>/dev/null; fi
rm -rf -- "$0""#;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(SCRIPT)
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning the watchdog shell");
        let stdin = child.stdin.take().expect("the watchdog's stdin is piped");
        Self {
            stdin: std::sync::Mutex::new(stdin),
            _child: child,
        }
    }

    /// Adds `pid` to the processes killed once the test process is gone.
    pub fn watch(&self, pid: u32) {
        use std::io::Write as _;
        let mut stdin = self
            .stdin
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        writeln!(stdin, "{pid}")
            .and_then(|()| stdin.flush())
            .expect("telling the watchdog a pid");
    }
}

// ---------------------------------------------------------------------------------------------
// Talking to one server
// ---------------------------------------------------------------------------------------------

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// A multiplexed connection to the server on `port`, with bounded connect and response times.
async fn connect(port: u16) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url(port)).map_err(|e| e.to_string())?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(COMMAND_TIMEOUT))
        .set_response_timeout(Some(COMMAND_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| format!("connecting to 127.0.0.1:{port}: {e}"))
}

/// Runs one command on a fresh connection to the server on `port`.
async fn query<T: FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Result<T, String> {
    let mut conn = connect(port).await?;
    cmd.query_async(&mut conn)
        .await
        .map_err(|e| format!("127.0.0.1:{port}: {e}"))
}

/// A `field:value` line of an `INFO` or `CLUSTER INFO` reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(str::trim)
}

/// The first element of `ROLE` (`master`, `slave` or `sentinel`).
async fn role(port: u16) -> Result<String, String> {
    let reply: Vec<Value> = query(port, &redis::cmd("ROLE")).await?;
    match reply.first() {
        Some(v) => String::from_redis_value(v.clone()).map_err(|e| e.to_string()),
        None => Err(format!("127.0.0.1:{port}: empty ROLE reply")),
    }
}

/// Polls `check` every [`POLL_INTERVAL`] until it returns `Ok`, for at most `limit`; returns the
/// last error otherwise.
async fn poll<T, F, Fut>(limit: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let last = match tokio::time::timeout_at(deadline, check()).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(last)) => last,
            Err(_) => "(the last check did not finish)".to_owned(),
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Hash slots
// ---------------------------------------------------------------------------------------------

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag, or of the whole key without one,
/// modulo 16384 — what `CLUSTER KEYSLOT` answers.
pub fn key_slot(key: &str) -> u16 {
    let hashed = baton::redis::hash_tag(key).unwrap_or(key);
    let mut crc: u16 = 0;
    for &byte in hashed.as_bytes() {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

// ---------------------------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------------------------

/// What a cluster node is, as the cluster sees it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Serves hash slots.
    Master,
    /// Replicates a master.
    Replica,
}

/// One node of a [`RedisCluster`], as the cluster describes it (`CLUSTER NODES`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// The client port (the cluster bus is on `port + 10000`).
    pub port: u16,
    /// The node id.
    pub id: String,
    /// The process id while it runs; `None` once killed.
    pub pid: Option<u32>,
    /// Master or replica.
    pub role: Role,
    /// For a replica, the id of its master.
    pub master_id: Option<String>,
    /// The hash slots a master serves, as inclusive ranges in ascending order.
    pub slots: Vec<RangeInclusive<u16>>,
    /// Whether the cluster flags the node as failing (`fail` or `fail?`).
    pub failed: bool,
}

impl ClusterNode {
    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        url(self.port)
    }

    /// Whether this node serves `slot`.
    pub fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|r| r.contains(&slot))
    }

    /// How many slots this node serves.
    pub fn slot_count(&self) -> usize {
        self.slots.iter().map(|r| r.len()).sum()
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug)]
struct NodeLine {
    node: ClusterNode,
    myself: bool,
    /// Slots this node has open for migration or import (`[slot->-id]`, `[slot-<-id]`).
    open_slots: Vec<String>,
}

fn parse_cluster_nodes(text: &str) -> Result<Vec<NodeLine>, String> {
    let mut nodes = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let bad = || format!("unexpected CLUSTER NODES line: {line:?}");
        if fields.len() < 8 {
            return Err(bad());
        }
        // ip:port@cport[,hostname]
        let port = fields[1]
            .split('@')
            .next()
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse::<u16>().ok())
            .ok_or_else(bad)?;
        let flags: Vec<&str> = fields[2].split(',').collect();
        let mut slots = Vec::new();
        let mut open_slots = Vec::new();
        for s in &fields[8..] {
            if s.starts_with('[') {
                open_slots.push((*s).to_owned());
                continue;
            }
            let range = match s.split_once('-') {
                Some((a, b)) => a.parse().ok().zip(b.parse().ok()).map(|(a, b)| a..=b),
                None => s.parse().ok().map(|a| a..=a),
            };
            slots.push(range.ok_or_else(bad)?);
        }
        slots.sort_by_key(|r| *r.start());
        nodes.push(NodeLine {
            node: ClusterNode {
                port,
                id: fields[0].to_owned(),
                pid: None,
                role: if flags.contains(&"master") {
                    Role::Master
                } else {
                    Role::Replica
                },
                master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
                failed: flags.iter().any(|f| *f == "fail" || *f == "fail?"),
            },
            myself: flags.contains(&"myself"),
            open_slots,
        });
    }
    Ok(nodes)
}

/// `CLUSTER NODES` as the node on `port` sees the cluster.
async fn cluster_nodes(port: u16) -> Result<Vec<NodeLine>, String> {
    let text: String = query(port, redis::cmd("CLUSTER").arg("NODES")).await?;
    parse_cluster_nodes(&text).map_err(|e| format!("127.0.0.1:{port}: {e}"))
}

/// The slot map in a node's view: `(first, last, owner port)`, ascending, failed owners included.
fn slot_map(nodes: &[NodeLine]) -> Vec<(u16, u16, u16)> {
    let mut map: Vec<(u16, u16, u16)> = nodes
        .iter()
        .filter(|n| n.node.role == Role::Master)
        .flat_map(|n| {
            n.node
                .slots
                .iter()
                .map(|r| (*r.start(), *r.end(), n.node.port))
        })
        .collect();
    map.sort_unstable();
    map
}

/// One node in one node's view of the cluster, with its master named by port: views of
/// different nodes compare equal once they agree.
#[derive(Debug, PartialEq, Eq)]
struct NodeView {
    port: u16,
    role: Role,
    master_port: Option<u16>,
    slots: Vec<RangeInclusive<u16>>,
    failed: bool,
}

fn node_views(nodes: &[NodeLine]) -> Vec<NodeView> {
    let port_of = |id: &str| nodes.iter().find(|n| n.node.id == id).map(|n| n.node.port);
    let mut views: Vec<NodeView> = nodes
        .iter()
        .map(|n| NodeView {
            port: n.node.port,
            role: n.node.role,
            master_port: n.node.master_id.as_deref().and_then(port_of),
            slots: n.node.slots.clone(),
            failed: n.node.failed,
        })
        .collect();
    views.sort_by_key(|v| v.port);
    views
}

/// A local Redis Cluster: `masters` masters with `replicas_per_master` replicas each, all on
/// 127.0.0.1, without persistence. Every process is killed by pid on drop.
pub struct RedisCluster {
    // Declared before the temp dir: processes are killed before their directories go.
    nodes: Vec<Process>,
    dir: tempfile::TempDir,
    /// Set for a cluster that is never dropped (see [`RedisCluster::start_watched`]).
    watchdog: Option<Watchdog>,
}

impl RedisCluster {
    /// Starts the nodes, joins them with `redis-cli --cluster create`, and waits until every node
    /// reports `cluster_state:ok`, knows every other node, agrees on the slot map, and every
    /// replica's link to its master is up. `masters` must be at least 3 (Redis's minimum).
    pub async fn start(masters: usize, replicas_per_master: usize) -> Self {
        Self::launch(masters, replicas_per_master, false).await
    }

    /// Like [`RedisCluster::start`], for a cluster kept in a `static` and so never dropped: a
    /// [`Watchdog`] kills every node and removes the cluster's directory once the test process
    /// is gone, however it ends.
    pub async fn start_watched(masters: usize, replicas_per_master: usize) -> Self {
        Self::launch(masters, replicas_per_master, true).await
    }

    async fn launch(masters: usize, replicas_per_master: usize, watched: bool) -> Self {
        assert!(masters >= 3, "a Redis Cluster needs at least 3 masters");
        let dir = tempfile::Builder::new()
            .prefix("baton-cluster-")
            .tempdir()
            .expect("creating a temp dir for the cluster");
        let watchdog = watched.then(|| Watchdog::spawn(dir.path()));
        let mut nodes = Vec::new();
        for _ in 0..masters * (1 + replicas_per_master) {
            let node = start_process(dir.path(), "node", free_cluster_port, |port, dir| {
                let mut args = base_args(port, dir);
                args.extend(
                    ["--cluster-enabled", "yes", "--cluster-config-file"].map(OsString::from),
                );
                args.push(dir.join("nodes.conf").into());
                args.push("--cluster-node-timeout".into());
                args.push(CLUSTER_NODE_TIMEOUT.as_millis().to_string().into());
                args
            })
            .await;
            if let (Some(watchdog), Some(pid)) = (&watchdog, node.pid()) {
                watchdog.watch(pid);
            }
            nodes.push(node);
        }
        let cluster = Self {
            nodes,
            dir,
            watchdog,
        };
        cluster.create(replicas_per_master).await;
        if let Err(last) = cluster.health(CLUSTER_READY_TIMEOUT).await {
            panic!(
                "the cluster did not become healthy within {CLUSTER_READY_TIMEOUT:?}: {last}\n{}",
                cluster.logs()
            );
        }
        cluster
    }

    /// `redis-cli --cluster create` over every node.
    async fn create(&self, replicas_per_master: usize) {
        let out_path = self.dir.path().join("cluster-create.log");
        let out = std::fs::File::create(&out_path).expect("creating the redis-cli log");
        let mut command = Command::new("redis-cli");
        command.args(["--cluster", "create"]);
        command.args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        command.args(["--cluster-replicas", &replicas_per_master.to_string()]);
        command.arg("--cluster-yes");
        let mut child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("cloning a file handle"))
            .stderr(out)
            .spawn()
            .expect("spawning redis-cli (is it installed?)");
        let deadline = Instant::now() + CLUSTER_CREATE_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for redis-cli") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "redis-cli --cluster create did not finish within {CLUSTER_CREATE_TIMEOUT:?}:\n{}\n{}",
                    read_to_string(&out_path),
                    self.logs()
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        };
        assert!(
            status.success(),
            "redis-cli --cluster create failed ({status}):\n{}\n{}",
            read_to_string(&out_path),
            self.logs()
        );
    }

    /// Waits (at most `limit`) until every running node reports `cluster_state:ok`, knows every
    /// node started, agrees with the others on the slot map (all 16384 slots served), and every
    /// running replica's link to its master is up. For after [`RedisCluster::kill`] or
    /// [`RedisCluster::restart`]; panics with the nodes' logs otherwise.
    pub async fn wait_healthy(&self, limit: Duration) {
        if let Err(last) = self.health(limit).await {
            panic!(
                "the cluster did not become healthy within {limit:?}: {last}\n{}",
                self.logs()
            );
        }
    }

    async fn health(&self, limit: Duration) -> Result<(), String> {
        let total = self.nodes.len();
        let ports: Vec<u16> = self.running_ports();
        poll(limit, || {
            let ports = ports.clone();
            async move {
                let mut first: Option<(u16, Vec<NodeView>)> = None;
                for &port in &ports {
                    let info: String = query(port, redis::cmd("CLUSTER").arg("INFO")).await?;
                    let state = info_field(&info, "cluster_state").unwrap_or("?");
                    if state != "ok" {
                        return Err(format!("127.0.0.1:{port}: cluster_state:{state}"));
                    }
                    let nodes = cluster_nodes(port).await?;
                    if nodes.len() != total {
                        return Err(format!(
                            "127.0.0.1:{port} knows {} of {total} nodes",
                            nodes.len()
                        ));
                    }
                    let covered: usize = slot_map(&nodes)
                        .iter()
                        .map(|(a, b, _)| usize::from(b - a) + 1)
                        .sum();
                    if covered != usize::from(SLOTS) {
                        return Err(format!("127.0.0.1:{port} sees {covered} slots served"));
                    }
                    let view = node_views(&nodes);
                    if let Some(v) = view.iter().find(|v| v.failed == ports.contains(&v.port)) {
                        return Err(format!("127.0.0.1:{port} sees {v:?}"));
                    }
                    match &first {
                        Some((other, seen)) if *seen != view => {
                            return Err(format!(
                                "127.0.0.1:{port} and 127.0.0.1:{other} disagree: {view:?} vs \
                                 {seen:?}"
                            ));
                        }
                        Some(_) => {}
                        None => first = Some((port, view)),
                    }
                    let me = nodes.iter().find(|n| n.myself).ok_or("no myself line")?;
                    if me.node.role == Role::Replica {
                        let repl: String =
                            query(port, redis::cmd("INFO").arg("replication")).await?;
                        let link = info_field(&repl, "master_link_status").unwrap_or("?");
                        if link != "up" {
                            return Err(format!("replica 127.0.0.1:{port}: master link {link}"));
                        }
                    }
                }
                Ok(())
            }
        })
        .await
    }

    fn running_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.running())
            .map(|n| n.port)
            .collect()
    }

    fn process(&self, port: u16) -> &Process {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    fn process_mut(&mut self, port: u16) -> &mut Process {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .unwrap_or_else(|| panic!("no cluster node on port {port}"))
    }

    /// `redis://127.0.0.1:PORT` of every node started (killed ones included: clients skip seeds
    /// that do not answer).
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| url(n.port)).collect()
    }

    /// The client ports of every node started.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// Every node as the cluster sees it now (asking the first running node that answers),
    /// with the pids of the ones still running.
    pub async fn nodes(&self) -> Vec<ClusterNode> {
        let mut errors = Vec::new();
        for port in self.running_ports() {
            match cluster_nodes(port).await {
                Ok(lines) => {
                    let mut nodes: Vec<ClusterNode> = lines
                        .into_iter()
                        .map(|l| {
                            let mut node = l.node;
                            node.pid = self
                                .nodes
                                .iter()
                                .find(|p| p.port == node.port)
                                .and_then(Process::pid);
                            node
                        })
                        .collect();
                    nodes.sort_by_key(|n| n.port);
                    return nodes;
                }
                Err(e) => errors.push(e),
            }
        }
        panic!("no cluster node answered CLUSTER NODES: {errors:?}");
    }

    /// The masters not flagged as failing, in port order.
    pub async fn masters(&self) -> Vec<ClusterNode> {
        self.nodes()
            .await
            .into_iter()
            .filter(|n| n.role == Role::Master && !n.failed)
            .collect()
    }

    /// The master serving `slot`.
    pub async fn node_for_slot(&self, slot: u16) -> ClusterNode {
        let masters = self.masters().await;
        masters
            .iter()
            .find(|n| n.serves(slot))
            .cloned()
            .unwrap_or_else(|| panic!("no master serves slot {slot}: {masters:?}"))
    }

    /// The master serving `key` (its slot from [`key_slot`]).
    pub async fn node_for_key(&self, key: &str) -> ClusterNode {
        self.node_for_slot(key_slot(key)).await
    }

    /// The process id of the node on `port`, while it runs.
    pub fn pid(&self, port: u16) -> Option<u32> {
        self.process(port).pid()
    }

    /// Sets `parameter` to `value` (`CONFIG SET`) on every running node, e.g.
    /// `cluster-require-full-coverage no` so that the masters keep serving their own slots while
    /// another master is down.
    pub async fn config_set(&self, parameter: &str, value: &str) {
        for port in self.running_ports() {
            let _: () = query(
                port,
                redis::cmd("CONFIG").arg("SET").arg(parameter).arg(value),
            )
            .await
            .unwrap_or_else(|e| panic!("CONFIG SET {parameter} {value}: {e}"));
        }
    }

    /// Kills the node on `port` (SIGKILL, as a crash would).
    pub fn kill(&mut self, port: u16) {
        self.process_mut(port).kill();
    }

    /// Starts a killed node again on its port with its `nodes.conf`, so it rejoins the cluster
    /// under its old id (with no data: nothing is saved). Returns once it answers; use
    /// [`RedisCluster::wait_healthy`] to wait for the cluster to take it back.
    pub async fn restart(&mut self, port: u16) {
        let process = self.process_mut(port);
        let args = process.args.clone();
        process.relaunch(args).await;
        let pid = process.pid();
        if let (Some(watchdog), Some(pid)) = (&self.watchdog, pid) {
            watchdog.watch(pid);
        }
    }

    /// Kills every node (SIGKILL, as a crash of the whole cluster would).
    pub fn kill_all(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }

    /// Starts every killed node again (see [`RedisCluster::restart`]) and waits until the
    /// cluster is healthy again (see [`RedisCluster::wait_healthy`]); the data is gone.
    pub async fn restart_killed(&mut self) {
        let killed: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| !n.running())
            .map(|n| n.port)
            .collect();
        for port in killed {
            self.restart(port).await;
        }
        self.wait_healthy(CLUSTER_READY_TIMEOUT).await;
    }

    /// The process ids of the running nodes.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().filter_map(Process::pid).collect()
    }

    /// A multiplexed connection to the node on `port` alone (no redirections followed).
    pub async fn node_client(&self, port: u16) -> MultiplexedConnection {
        connect(port)
            .await
            .unwrap_or_else(|e| panic!("node client: {e}"))
    }

    /// A cluster client builder with every node as a seed, for clients with options (RESP3 and
    /// a push sender for pub/sub, timeouts).
    pub fn client_builder(&self) -> ClusterClientBuilder {
        ClusterClient::builder(self.seed_urls())
    }

    /// A redis-rs cluster connection (follows MOVED and ASK), for tests' own assertions.
    pub async fn client(&self) -> ClusterConnection {
        let client = self.client_builder().build().expect("cluster client");
        within(
            Duration::from_secs(5),
            client.get_async_connection(),
            "a cluster connection",
        )
        .await
        .expect("connecting to the cluster")
    }

    /// Moves `slot` and the keys in it to the master on `to_port` by a live resharding (see
    /// [`RedisCluster::begin_migration`]), [`MIGRATE_BATCH`] keys at a time; returns how many
    /// keys moved. Clients keep working meanwhile, redirected by ASK and then MOVED.
    pub async fn migrate_slot(&self, slot: u16, to_port: u16) -> usize {
        let mut migration = self.begin_migration(slot, to_port).await;
        while migration.move_keys(MIGRATE_BATCH).await > 0 {}
        migration.finish().await
    }

    /// Opens the migration of `slot` to the master on `to_port`: `CLUSTER SETSLOT IMPORTING` on
    /// the target, then `MIGRATING` on the current owner. From then on the owner answers ASK for
    /// keys it no longer has, so a test can act in the middle of a resharding.
    pub async fn begin_migration(&self, slot: u16, to_port: u16) -> SlotMigration<'_> {
        assert!(slot < SLOTS, "slot {slot} is out of range");
        let from = self.node_for_slot(slot).await;
        let masters = self.masters().await;
        let to = masters
            .iter()
            .find(|n| n.port == to_port)
            .cloned()
            .unwrap_or_else(|| panic!("no running master on port {to_port}: {masters:?}"));
        assert_ne!(from.port, to.port, "slot {slot} is already on {to_port}");
        let from_conn = self.node_client(from.port).await;
        let to_conn = self.node_client(to.port).await;
        let mut migration = SlotMigration {
            cluster: self,
            slot,
            from,
            to,
            from_conn,
            to_conn,
            moved: 0,
        };
        let (slot, from_id, to_id) = (
            migration.slot,
            migration.from.id.clone(),
            migration.to.id.clone(),
        );
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("IMPORTING")
            .arg(&from_id)
            .query_async(&mut migration.to_conn)
            .await
            .expect("CLUSTER SETSLOT IMPORTING on the target");
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("MIGRATING")
            .arg(&to_id)
            .query_async(&mut migration.from_conn)
            .await
            .expect("CLUSTER SETSLOT MIGRATING on the source");
        migration
    }

    /// Everything the nodes logged, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- node 127.0.0.1:{} ---\n{}", n.port, n.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for n in &self.nodes {
                eprintln!(
                    "--- cluster node 127.0.0.1:{} (last lines) ---\n{}",
                    n.port,
                    n.log_tail(15)
                );
            }
        }
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

/// A resharding of one slot in progress (see [`RedisCluster::begin_migration`]). Dropping it
/// without [`SlotMigration::finish`] leaves the slot half-migrated.
pub struct SlotMigration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    from: ClusterNode,
    to: ClusterNode,
    from_conn: MultiplexedConnection,
    to_conn: MultiplexedConnection,
    moved: usize,
}

impl SlotMigration<'_> {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The master the slot is leaving.
    pub fn source(&self) -> &ClusterNode {
        &self.from
    }

    /// The master the slot is moving to.
    pub fn target(&self) -> &ClusterNode {
        &self.to
    }

    /// Moves up to `max` of the keys still on the source with one `MIGRATE`; returns how many
    /// keys it handed to `MIGRATE` (some may have been deleted or expired meanwhile), 0 once the
    /// source holds none of the slot's keys.
    pub async fn move_keys(&mut self, max: usize) -> usize {
        let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(self.slot)
            .arg(max)
            .query_async(&mut self.from_conn)
            .await
            .expect("CLUSTER GETKEYSINSLOT");
        if keys.is_empty() {
            return 0;
        }
        let reply: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.to.port)
            .arg("")
            .arg(0)
            .arg(MIGRATE_TIMEOUT_MS)
            .arg("KEYS")
            .arg(&keys)
            .query_async(&mut self.from_conn)
            .await
            .unwrap_or_else(|e| {
                panic!("MIGRATE of {} keys in slot {}: {e}", keys.len(), self.slot)
            });
        // NOKEY: every key of the batch was deleted or expired since GETKEYSINSLOT.
        assert!(reply == "OK" || reply == "NOKEY", "MIGRATE replied {reply}");
        self.moved += keys.len();
        keys.len()
    }

    /// Moves the keys still on the source whose name `moves` accepts, with one `MIGRATE`;
    /// returns how many it handed to `MIGRATE`.
    pub async fn move_keys_where(&mut self, moves: impl Fn(&str) -> bool) -> usize {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(self.slot)
            .arg(100_000)
            .query_async(&mut self.from_conn)
            .await
            .expect("CLUSTER GETKEYSINSLOT");
        let keys: Vec<String> = keys.into_iter().filter(|k| moves(k)).collect();
        if keys.is_empty() {
            return 0;
        }
        let reply: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.to.port)
            .arg("")
            .arg(0)
            .arg(MIGRATE_TIMEOUT_MS)
            .arg("KEYS")
            .arg(&keys)
            .query_async(&mut self.from_conn)
            .await
            .unwrap_or_else(|e| {
                panic!("MIGRATE of {} keys in slot {}: {e}", keys.len(), self.slot)
            });
        assert!(reply == "OK" || reply == "NOKEY", "MIGRATE replied {reply}");
        self.moved += keys.len();
        keys.len()
    }

    /// Moves the remaining keys, assigns the slot to the target (`CLUSTER SETSLOT NODE` on the
    /// target, the source, then every other master), and waits until every running node agrees
    /// that the target serves it. Returns how many keys this migration moved in all.
    pub async fn finish(mut self) -> usize {
        while self.move_keys(MIGRATE_BATCH).await > 0 {}
        let masters = self.cluster.masters().await;
        let mut order = vec![self.to.port, self.from.port];
        order.extend(
            masters
                .iter()
                .map(|m| m.port)
                .filter(|p| *p != self.to.port && *p != self.from.port),
        );
        for port in order {
            let _: () = query(
                port,
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(self.slot)
                    .arg("NODE")
                    .arg(&self.to.id),
            )
            .await
            .unwrap_or_else(|e| panic!("CLUSTER SETSLOT {} NODE: {e}", self.slot));
        }
        let (slot, target) = (self.slot, self.to.port);
        let agreed = poll(SLOT_AGREEMENT_TIMEOUT, || {
            let ports = self.cluster.running_ports();
            async move {
                for port in ports {
                    let nodes = cluster_nodes(port).await?;
                    let owner = slot_map(&nodes)
                        .into_iter()
                        .find(|(a, b, _)| (*a..=*b).contains(&slot))
                        .map(|(_, _, owner)| owner);
                    if owner != Some(target) {
                        return Err(format!("127.0.0.1:{port} says slot {slot} is on {owner:?}"));
                    }
                    if let Some(open) = nodes.iter().find(|n| !n.open_slots.is_empty()) {
                        return Err(format!(
                            "127.0.0.1:{port} sees open slots {:?} on {}",
                            open.open_slots, open.node.port
                        ));
                    }
                }
                Ok(())
            }
        })
        .await;
        if let Err(last) = agreed {
            panic!(
                "the nodes did not agree on slot {slot} moving to {target} within \
                 {SLOT_AGREEMENT_TIMEOUT:?}: {last}"
            );
        }
        self.moved
    }
}

// ---------------------------------------------------------------------------------------------
// Sentinel
// ---------------------------------------------------------------------------------------------

/// How quickly the Sentinels of a [`SentinelDeployment`] act.
#[derive(Clone, Copy, Debug)]
pub struct SentinelTimings {
    /// `down-after-milliseconds`: how long the master may not answer before a Sentinel
    /// considers it down.
    pub down_after: Duration,
    /// `failover-timeout`: bounds each failover step, the leader election, and the wait before
    /// another failover of the same master is tried.
    pub failover_timeout: Duration,
}

impl Default for SentinelTimings {
    /// Fast but stable failover: 1 s down-after, 3 s failover timeout. From SIGKILL of the master
    /// to a Sentinel naming the promoted replica (median of 5 on a loaded 2-core machine):
    /// 2.14 s with 500 ms down-after, 2.31 s with 1 s, 3.28 s with 2 s. About 1.3 s of it is
    /// fixed by Redis (leader election, then the 1 s INFO period that sees the promotion), so
    /// 500 ms buys little and risks spurious failovers when a loaded machine stalls a process.
    /// The failover timeout bounds the election; a failed one is retried after twice this.
    fn default() -> Self {
        Self {
            down_after: Duration::from_millis(1000),
            failover_timeout: Duration::from_millis(3000),
        }
    }
}

/// A master, one replica (`--replicaof`) and three Sentinels monitoring them with quorum 2, all
/// on 127.0.0.1, without persistence. Every process is killed by pid on drop.
pub struct SentinelDeployment {
    // Declared before the temp dir: processes are killed before their directories go.
    /// The two data nodes; `master` indexes the current master among them.
    data: Vec<Process>,
    sentinels: Vec<Process>,
    master: usize,
    master_name: String,
    dir: tempfile::TempDir,
}

impl SentinelDeployment {
    /// The name the Sentinels monitor the master under.
    pub const MASTER_NAME: &'static str = "baton";

    /// Starts the deployment with [`SentinelTimings::default`].
    pub async fn start() -> Self {
        Self::start_with(SentinelTimings::default()).await
    }

    /// Starts the master, then the replica, waits for their first sync, starts the Sentinels,
    /// and waits until every Sentinel sees the master up, the replica with its link up, and the
    /// two other Sentinels.
    pub async fn start_with(timings: SentinelTimings) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("baton-sentinel-")
            .tempdir()
            .expect("creating a temp dir for the sentinel deployment");
        let master = start_process(dir.path(), "master", free_port, base_args).await;
        let master_port = master.port;
        let replica = start_process(dir.path(), "replica", free_port, |port, dir| {
            let mut args = base_args(port, dir);
            args.extend(["--replicaof", "127.0.0.1", &master_port.to_string()].map(OsString::from));
            args
        })
        .await;
        let replica_port = replica.port;
        let mut deployment = Self {
            data: vec![master, replica],
            sentinels: Vec::new(),
            master: 0,
            master_name: Self::MASTER_NAME.to_owned(),
            dir,
        };
        // Sentinels learn about replicas from the master's INFO, which they read when they
        // connect and then only every 10 s: start them once the replica is attached.
        deployment
            .wait_replica_linked(replica_port, master_port, REPLICATION_TIMEOUT)
            .await;
        for _ in 0..3 {
            let name = deployment.master_name.clone();
            let sentinel =
                start_process(deployment.dir.path(), "sentinel", free_port, |port, dir| {
                    let conf = dir.join("sentinel.conf");
                    let text = format!(
                        "port {port}\n\
                     bind 127.0.0.1\n\
                     dir {dir}\n\
                     logfile {log}\n\
                     sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {name} {down}\n\
                     sentinel failover-timeout {name} {failover}\n\
                     sentinel parallel-syncs {name} 1\n",
                        dir = dir.display(),
                        log = dir.join("redis.log").display(),
                        down = timings.down_after.as_millis(),
                        failover = timings.failover_timeout.as_millis(),
                    );
                    std::fs::write(&conf, text).expect("writing sentinel.conf");
                    vec![conf.into(), "--sentinel".into()]
                })
                .await;
            deployment.sentinels.push(sentinel);
        }
        deployment.wait_sentinels_ready().await;
        deployment
    }

    /// Waits until the replica on `replica_port` reports its link to `master_port` up.
    async fn wait_replica_linked(&self, replica_port: u16, master_port: u16, limit: Duration) {
        let linked = poll(limit, || async move {
            let repl: String = query(replica_port, redis::cmd("INFO").arg("replication")).await?;
            let master = info_field(&repl, "master_port").unwrap_or("?");
            let link = info_field(&repl, "master_link_status").unwrap_or("?");
            if master == master_port.to_string() && link == "up" {
                Ok(())
            } else {
                Err(format!(
                    "replica 127.0.0.1:{replica_port}: master_port:{master} link:{link}"
                ))
            }
        })
        .await;
        if let Err(last) = linked {
            panic!(
                "the replica did not sync with 127.0.0.1:{master_port} within {limit:?}: \
                 {last}\n{}",
                self.logs()
            );
        }
    }

    async fn wait_sentinels_ready(&self) {
        let name = self.master_name.clone();
        let master_port = self.data[self.master].port;
        let ports: Vec<u16> = self.sentinels.iter().map(|s| s.port).collect();
        let others = ports.len() - 1;
        let ready = poll(SENTINEL_READY_TIMEOUT, || {
            let (name, ports) = (name.clone(), ports.clone());
            async move {
                for port in ports {
                    let master: HashMap<String, String> =
                        query(port, redis::cmd("SENTINEL").arg("MASTER").arg(&name)).await?;
                    let field = |f: &str| master.get(f).map_or("?", String::as_str);
                    if field("flags") != "master"
                        || field("port") != master_port.to_string()
                        || field("num-slaves") != "1"
                        || field("num-other-sentinels") != others.to_string()
                    {
                        return Err(format!(
                            "sentinel 127.0.0.1:{port}: flags {} port {} num-slaves {} \
                             num-other-sentinels {}",
                            field("flags"),
                            field("port"),
                            field("num-slaves"),
                            field("num-other-sentinels")
                        ));
                    }
                    let replicas: Vec<HashMap<String, String>> =
                        query(port, redis::cmd("SENTINEL").arg("REPLICAS").arg(&name)).await?;
                    let healthy = replicas.iter().any(|r| {
                        r.get("flags").map(String::as_str) == Some("slave")
                            && r.get("master-link-status").map(String::as_str) == Some("ok")
                    });
                    if !healthy {
                        return Err(format!("sentinel 127.0.0.1:{port}: replicas {replicas:?}"));
                    }
                }
                Ok(())
            }
        })
        .await;
        if let Err(last) = ready {
            panic!(
                "the sentinels did not see the master, the replica and each other within \
                 {SENTINEL_READY_TIMEOUT:?}: {last}\n{}",
                self.logs()
            );
        }
    }

    /// `redis://127.0.0.1:PORT` of each Sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| url(s.port)).collect()
    }

    /// The name the Sentinels monitor the master under.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The master's address: the first one a Sentinel gives (`SENTINEL
    /// GET-MASTER-ADDR-BY-NAME`) whose server answers `ROLE` as a master, as a Sentinel-aware
    /// client finds it. Right after a failover some Sentinels may still name the old master.
    pub async fn master_addr(&self) -> SocketAddr {
        let mut errors = Vec::new();
        for sentinel in self.sentinels.iter().filter(|s| s.running()) {
            let addr = match addr_from(sentinel.port, &self.master_name).await {
                Ok(addr) => addr,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            match role(addr.port()).await {
                Ok(r) if r == "master" => return addr,
                other => errors.push(format!(
                    "sentinel {}: {addr} has role {other:?}",
                    sentinel.port
                )),
            }
        }
        panic!("no sentinel named a reachable master: {errors:?}");
    }

    /// The process id of the current master (as last seen by [`Self::wait_for_failover`]).
    pub fn master_pid(&self) -> Option<u32> {
        self.data[self.master].pid()
    }

    /// The process id of the data node that is not the current master.
    pub fn replica_pid(&self) -> Option<u32> {
        self.data[1 - self.master].pid()
    }

    /// The process ids of the running Sentinels.
    pub fn sentinel_pids(&self) -> Vec<u32> {
        self.sentinels.iter().filter_map(Process::pid).collect()
    }

    /// The process ids of every running process of the deployment.
    pub fn pids(&self) -> Vec<u32> {
        self.data
            .iter()
            .chain(&self.sentinels)
            .filter_map(Process::pid)
            .collect()
    }

    /// Kills the current master (SIGKILL, as a crash would); returns its address.
    pub fn kill_master(&mut self) -> SocketAddr {
        let master = &mut self.data[self.master];
        assert!(master.running(), "the master was already killed");
        master.kill();
        SocketAddr::from(([127, 0, 0, 1], master.port))
    }

    /// Polls the Sentinels (at most `limit`) until the failover is over as a Sentinel-aware
    /// client sees it: a Sentinel's `SENTINEL MASTER` names a new address, not flagged down (the
    /// check redis-rs's `SentinelClient` makes), and the server there answers `ROLE` as a
    /// master. Returns that address; panics with the logs otherwise.
    ///
    /// `GET-MASTER-ADDR-BY-NAME` names the promoted replica a little earlier, while the leader
    /// Sentinel is still reconfiguring replicas; `SENTINEL MASTER` (and redis-rs) only once the
    /// leader announces `+switch-master`.
    pub async fn wait_for_failover(&mut self, limit: Duration) -> SocketAddr {
        let old = self.data[self.master].port;
        let name = self.master_name.clone();
        let ports: Vec<u16> = self
            .sentinels
            .iter()
            .filter(|s| s.running())
            .map(|s| s.port)
            .collect();
        let found = poll(limit, || {
            let (name, ports) = (name.clone(), ports.clone());
            async move {
                let mut seen = Vec::new();
                for port in ports {
                    let master: HashMap<String, String> =
                        match query(port, redis::cmd("SENTINEL").arg("MASTER").arg(&name)).await {
                            Ok(master) => master,
                            Err(e) => {
                                seen.push(e);
                                continue;
                            }
                        };
                    let field = |f: &str| master.get(f).map_or("?", String::as_str);
                    let flags = field("flags");
                    let addr: Option<SocketAddr> =
                        format!("{}:{}", field("ip"), field("port")).parse().ok();
                    let Some(addr) = addr.filter(|a| a.port() != old) else {
                        seen.push(format!("sentinel {port}: still {old} ({flags})"));
                        continue;
                    };
                    if !flags.split(',').any(|f| f == "master")
                        || flags.contains("s_down")
                        || flags.contains("o_down")
                    {
                        seen.push(format!("sentinel {port}: {addr} flagged {flags}"));
                        continue;
                    }
                    match role(addr.port()).await {
                        Ok(r) if r == "master" => return Ok(addr),
                        other => seen.push(format!("sentinel {port}: {addr} has role {other:?}")),
                    }
                }
                Err(seen.join("; "))
            }
        })
        .await;
        let addr = found
            .unwrap_or_else(|last| panic!("no failover within {limit:?}: {last}\n{}", self.logs()));
        self.master = self
            .data
            .iter()
            .position(|d| d.port == addr.port())
            .unwrap_or_else(|| panic!("the sentinels promoted {addr}, which is not ours"));
        addr
    }

    /// Restarts the killed data node on its old port as a replica of the current master (with
    /// no data: nothing is saved), and waits until it has synced and every Sentinel lists it as
    /// a replica that is not down.
    pub async fn restart_old_master_as_replica(&mut self) {
        let old = 1 - self.master;
        let master_port = self.data[self.master].port;
        assert!(
            !self.data[old].running(),
            "the old master is still running: kill it and wait for the failover first"
        );
        let process = &mut self.data[old];
        let mut args = base_args(process.port, &process.dir);
        args.extend(["--replicaof", "127.0.0.1", &master_port.to_string()].map(OsString::from));
        process.relaunch(args).await;
        let replica_port = process.port;
        self.wait_replica_linked(replica_port, master_port, REPLICATION_TIMEOUT)
            .await;
        let name = self.master_name.clone();
        let ports: Vec<u16> = self.sentinels.iter().map(|s| s.port).collect();
        let seen = poll(SENTINEL_READY_TIMEOUT, || {
            let (name, ports) = (name.clone(), ports.clone());
            async move {
                for port in ports {
                    let replicas: Vec<HashMap<String, String>> =
                        query(port, redis::cmd("SENTINEL").arg("REPLICAS").arg(&name)).await?;
                    let listed = replicas.iter().any(|r| {
                        r.get("port") == Some(&replica_port.to_string())
                            && r.get("flags").map(String::as_str) == Some("slave")
                    });
                    if !listed {
                        return Err(format!("sentinel {port}: replicas {replicas:?}"));
                    }
                }
                Ok(())
            }
        })
        .await;
        if let Err(last) = seen {
            panic!(
                "the sentinels did not see 127.0.0.1:{replica_port} back as a replica within \
                 {SENTINEL_READY_TIMEOUT:?}: {last}\n{}",
                self.logs()
            );
        }
    }

    /// A multiplexed connection to the current master (its address asked of a Sentinel).
    pub async fn master_client(&self) -> MultiplexedConnection {
        let addr = self.master_addr().await;
        connect(addr.port())
            .await
            .unwrap_or_else(|e| panic!("master client: {e}"))
    }

    /// A redis-rs Sentinel client for the master, as an application would connect.
    pub fn sentinel_client(&self) -> SentinelClient {
        SentinelClient::build(
            self.sentinel_urls(),
            self.master_name.clone(),
            None,
            SentinelServerType::Master,
        )
        .expect("sentinel client")
    }

    /// Everything the processes logged, for failure messages.
    pub fn logs(&self) -> String {
        self.data
            .iter()
            .chain(&self.sentinels)
            .map(|p| format!("--- 127.0.0.1:{} ---\n{}", p.port, p.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for SentinelDeployment {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for p in self.data.iter().chain(&self.sentinels) {
                eprintln!(
                    "--- sentinel deployment 127.0.0.1:{} (last lines) ---\n{}",
                    p.port,
                    p.log_tail(15)
                );
            }
        }
        for p in self.sentinels.iter_mut().chain(self.data.iter_mut()) {
            p.kill();
        }
    }
}

/// The master address the Sentinel on `sentinel_port` gives for `name`.
async fn addr_from(sentinel_port: u16, name: &str) -> Result<SocketAddr, String> {
    let reply: Option<(String, u16)> = query(
        sentinel_port,
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(name),
    )
    .await?;
    let (ip, port) =
        reply.ok_or_else(|| format!("sentinel {sentinel_port} does not know {name}"))?;
    format!("{ip}:{port}")
        .parse()
        .map_err(|e| format!("sentinel {sentinel_port}: address {ip}:{port}: {e}"))
}

fn read_to_string(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()))
}
