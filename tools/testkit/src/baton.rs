//! Batons for tests: [`Baton`] served in-process, [`BatonProcess`] the real binary.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::Duration,
};

use baton::{
    config::{RedisConfig, ServeConfig},
    proto::v1::{
        lock_service_client::LockServiceClient, rate_limit_service_client::RateLimitServiceClient,
        semaphore_service_client::SemaphoreServiceClient,
    },
    server::{Listeners, serve},
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient as EnvoyRateLimitServiceClient;
use tokio::{task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient};

use crate::{
    RedisServer, channel, free_port, health_status, init_tracing, lock_key, uds_channel,
    unique_prefix, wait_for_health, within,
};

/// How long an in-process Baton may take to report `readiness` SERVING.
const BATON_READY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the `baton` binary may take to answer health checks.
const PROCESS_READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an in-process Baton may take to stop after its shutdown token is cancelled.
const BATON_STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// The drain deadline of in-process Batons (the default, 10 s, is longer than tests want).
pub const TEST_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// The environment variable naming the `baton` binary [`baton_bin`] returns, when set.
pub const BATON_BIN_VAR: &str = "BATON_BIN";

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
        Self::start_unready(redis, tweak).await.ready().await
    }

    /// Waits until this Baton's readiness is SERVING.
    async fn ready(self) -> Self {
        let mut health = self.health().await;
        wait_for_health(
            &mut health,
            "readiness",
            ServingStatus::Serving,
            BATON_READY_TIMEOUT,
        )
        .await;
        self
    }

    /// Starts a Baton without waiting for Redis to be reachable (readiness may be NOT_SERVING).
    pub async fn start_unready(redis: &RedisServer, tweak: impl FnOnce(&mut ServeConfig)) -> Self {
        Self::spawn(redis.redis_config(), tweak).await
    }

    /// Serves Baton in this process over the Redis of `redis`, under a fresh key prefix, after
    /// `tweak` has changed the configuration; does not wait for readiness.
    async fn spawn(redis: RedisConfig, tweak: impl FnOnce(&mut ServeConfig)) -> Self {
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
        Self::spawn(redis, tweak).await.ready().await
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

    /// Like [`BatonProcess::spawn`], running `binary` instead of [`baton_bin`]'s (another build).
    pub async fn spawn_binary(binary: &Path, args: &[&str]) -> Self {
        Self::spawn_from(&|| command_without_baton_env(binary), args, false).await
    }

    async fn spawn_with(args: &[&str], piped: bool) -> Self {
        Self::spawn_from(&baton_command, args, piped).await
    }

    async fn spawn_from(command: &dyn Fn() -> Command, args: &[&str], piped: bool) -> Self {
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
            let child = command()
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

/// The `baton` binary: the file [`BATON_BIN_VAR`] names when set, else the one Cargo built in
/// the directory of the running executable (`target/PROFILE/baton` beside a tool, or above the
/// `deps/` directory of a test or bench binary). Panics, saying how to build it, when there is
/// none.
pub fn baton_bin() -> PathBuf {
    if let Some(path) = std::env::var_os(BATON_BIN_VAR) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the path of the running executable");
    let mut dir = exe.parent().expect("the executable's directory").to_owned();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("baton");
    assert!(
        bin.is_file(),
        "no baton binary at {}: build it in the same profile first (`cargo build --bin baton`, \
         with --release for a release build), or name one in {BATON_BIN_VAR}",
        bin.display()
    );
    bin
}

/// A `Command` for the `baton` binary ([`baton_bin`]) with no `BATON_*` variable inherited from
/// the test's environment (tests never change their own environment; they only shape the
/// child's).
pub fn baton_command() -> Command {
    command_without_baton_env(&baton_bin())
}

/// A `Command` for `binary` with no `BATON_*` variable inherited from this process.
fn command_without_baton_env(binary: &Path) -> Command {
    let mut command = Command::new(binary);
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
