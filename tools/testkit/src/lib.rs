//! Baton's test harness, shared by the integration tests (through `tests/support/`), the
//! benchmarks in `benches/` and the load generator (`tools/loadgen`).
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
//! - [`topology`]: Redis Cluster and Sentinel deployments of several processes.
//! - [`Baton`]: an in-process Baton (`baton::server::serve`) on `127.0.0.1:0` and a Unix socket,
//!   with a key prefix of its own, and clients for it.
//! - [`BatonProcess`]: the real `baton` binary ([`baton_bin`]), for signals, exit codes and
//!   measuring its CPU time apart from the client's.
//! - Bounded waits ([`within`], [`wait_until`]) that fail with a message saying what was awaited.
//!
//! Every test gets its own `redis-server` (they start in milliseconds), so tests run in parallel;
//! a cluster takes 2-3 s to start, hence the one shared per binary in cluster mode.

mod baton;
mod redis_server;
pub mod topology;

use std::{
    fmt::Debug,
    future::Future,
    net::{SocketAddr, TcpListener as StdTcpListener},
    path::Path,
    time::Duration,
};

pub use baton::{
    BATON_BIN_VAR, Baton, BatonProcess, TEST_DRAIN_TIMEOUT, baton_bin, baton_command, run_baton,
};
pub use redis_server::{RedisConn, RedisServer, TOPOLOGY_VAR, TestTopology, read_log};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

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

/// Closes the Redis connections that `filters` select (`CLIENT KILL` with filters such as
/// `["TYPE", "normal", "SKIPME", "yes"]` or `["USER", "baton"]`), as a Redis restart or a network
/// blip would, so that Baton has to connect again; returns how many were closed.
pub async fn client_kill<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    filters: &[&str],
) -> redis::RedisResult<i64> {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg(filters)
        .query_async(conn)
        .await
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

/// An HTTP/2 client for `addr` without tonic's client-side deadline timer, and the origin to
/// give a generated client (`with_origin`): a call's `grpc-timeout` header is sent, and only
/// the server acts on it, so a test sees Baton's own answer to a deadline.
pub fn untimed_client(
    addr: SocketAddr,
) -> (
    hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        tonic::body::Body,
    >,
    tonic::codegen::http::Uri,
) {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http();
    let origin = format!("http://{addr}").parse().expect("origin");
    (client, origin)
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

/// Freezes a process with SIGSTOP and returns once every one of its threads has stopped.
/// `kill` only queues the signal: until each thread has taken it, a thread of a busy machine
/// can still answer a request sent after the `kill`. The process is thawed (SIGCONT) when the
/// guard is dropped, so that a failing test never leaves it stopped.
pub fn freeze(pid: u32) -> Frozen {
    let target = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid fits"));
    nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    wait_stopped(pid);
    Frozen(target)
}

/// A process [`freeze`] stopped; dropping it thaws the process.
#[must_use = "dropping it thaws the process at once"]
pub struct Frozen(nix::unistd::Pid);

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// Returns once every thread of `pid` is stopped (or the process is gone); panics after 30 s.
pub fn wait_stopped(pid: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        let running = tasks.flatten().any(|task| {
            std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
                // The state follows the command's closing parenthesis: T or t once stopped.
                let state = stat
                    .rsplit_once(')')
                    .map_or("", |(_, rest)| rest.trim_start());
                !matches!(state.chars().next(), Some('T' | 't' | 'Z' | 'X'))
            })
        });
        if !running {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} did not stop within 30 s of SIGSTOP"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
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
