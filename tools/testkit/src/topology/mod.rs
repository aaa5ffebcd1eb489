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

use crate::{
    free_port,
    redis_server::{read_log, spawn_server},
    within,
};

mod cluster;
mod sentinel;

pub use cluster::{ClusterNode, RedisCluster, Role, SlotMigration, key_slot};
pub use sentinel::{SentinelDeployment, SentinelTimings};

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
/// Response timeout of the connections tests make their assertions on: a node busy with a test's
/// load on a loaded machine answers a `KEYS` over the shared cluster late, not never.
const ASSERTION_TIMEOUT: Duration = Duration::from_secs(30);
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

/// Spawns `redis-server` with `args` and waits until it answers on `port` as this process.
async fn launch(port: u16, dir: &Path, args: &[OsString]) -> Result<Child, String> {
    spawn_server(port, dir, args, READY_TIMEOUT).await
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
    connect_for(port, COMMAND_TIMEOUT).await
}

/// A connection to the server on `port` whose replies may take up to `patience`.
async fn connect_for(port: u16, patience: Duration) -> Result<MultiplexedConnection, String> {
    let client = redis::Client::open(url(port)).map_err(|e| e.to_string())?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(COMMAND_TIMEOUT))
        .set_response_timeout(Some(patience));
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

/// The text of the file at `path`, or why it cannot be read.
fn read_to_string(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()))
}
