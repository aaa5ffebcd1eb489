//! Configuration: command-line flags and `BATON_*` variables, validated in one pass.
//!
//! Flags are parsed as plain strings by clap and validated here, so that every mistake is reported
//! together before Baton exits, instead of one per attempt.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};
use redis::{Client, ConnectionAddr};

use crate::cli;

mod connection;
mod serving;

pub use connection::{RedisAccess, RedisConfig, RedisTls, Topology};
pub use serving::*;

/// Default TCP address for the gRPC server.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// Default Redis URL.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Default time replicas get to acknowledge a grant when `--min-replicas-ack` is set.
pub const DEFAULT_REPLICA_ACK_TIMEOUT: Duration = Duration::from_millis(50);
/// Default namespace put in front of every Redis key Baton writes.
pub const DEFAULT_KEY_PREFIX: &str = "baton:";
/// Default time allowed to open a Redis connection.
pub const DEFAULT_REDIS_CONNECT_TIMEOUT: Duration = Duration::from_millis(300);
/// Default time allowed for one Redis command (a script call) to answer.
pub const DEFAULT_REDIS_COMMAND_TIMEOUT: Duration = Duration::from_millis(400);
/// Default number of multiplexed Redis connections in the pool.
pub const DEFAULT_REDIS_POOL_SIZE: u32 = 4;
/// Default time allowed for a graceful drain after SIGTERM or SIGINT.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time Baton keeps serving, not ready, after SIGTERM or SIGINT before it drains: none.
pub const DEFAULT_SHUTDOWN_DELAY: Duration = Duration::ZERO;
/// Longest shutdown delay accepted.
pub const MAX_SHUTDOWN_DELAY: Duration = Duration::from_secs(600);
/// Largest Redis password file accepted, in bytes.
pub const MAX_PASSWORD_FILE_BYTES: u64 = 4096;
/// Longest Redis ACL user name accepted, in bytes.
pub const MAX_REDIS_USERNAME_BYTES: usize = 256;
/// Largest `--redis-tls-*` file accepted (a CA bundle, a certificate chain, a key), in bytes:
/// a bundle of every public root is about 250 KiB.
pub const MAX_TLS_FILE_BYTES: u64 = 1024 * 1024;
/// Default silence after which Baton pings a client over HTTP/2: a live client answers, so a
/// stream's client that answers nothing for longer than its lease's ttl has stopped.
pub const DEFAULT_CLIENT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Default time a client has to answer a ping before its connection is closed.
pub const DEFAULT_CLIENT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest key prefix accepted.
pub const MAX_KEY_PREFIX_BYTES: usize = 128;
/// Default time allowed for one rate limit decision's Redis call before the failure mode answers.
pub const DEFAULT_RATELIMIT_TIMEOUT: Duration = Duration::from_millis(50);
/// Default answer of rate limit checks when Redis does not answer in time.
pub const DEFAULT_RATELIMIT_FAILURE_MODE: FailureMode = FailureMode::Open;
/// Default interval between checks of the rate limit rules file for changes.
pub const DEFAULT_RATELIMIT_CONFIG_RELOAD: Duration = Duration::from_secs(10);

/// Baton: a coordination sidecar serving distributed locks over gRPC, with state in Redis.
#[derive(Debug, Parser)]
#[command(name = "baton", version, about, after_help = cli::EXIT_CODES_HELP)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The `baton` subcommands: the server, and the command-line client ([`crate::cli`]).
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the gRPC API.
    Serve(Box<ServeArgs>),
    /// Run a command while holding a lock (its fencing token in BATON_FENCING_TOKEN).
    Lock(cli::LockArgs),
    /// Run a command while holding permits of a semaphore.
    Semaphore(cli::SemaphoreArgs),
    /// Run a command while leading an election (its term in BATON_ELECTION_TERM).
    Campaign(cli::CampaignArgs),
    /// Show who leads an election.
    Leader(cli::LeaderArgs),
    /// Print an election's state and every change of it.
    Observe(cli::ObserveArgs),
    /// Show a lock's or a semaphore's current state.
    Describe(cli::DescribeArgs),
    /// Rate limit checks.
    #[command(subcommand)]
    Ratelimit(cli::RateLimitCommand),
    /// Complete a query from an autocomplete dictionary.
    Complete(cli::CompleteArgs),
    /// Autocomplete dictionary tools: `load DICT FILE` loads a file of terms.
    #[command(subcommand)]
    Autocomplete(cli::AutocompleteCommand),
    /// Ask Baton whether it serves (readiness by default).
    Health(cli::HealthArgs),
    /// Take a lock in turns with other holders, saying each step (the Helm chart's demo app).
    Hold(cli::HoldArgs),
}

/// Raw `baton serve` arguments, before validation.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// TCP address to serve gRPC on; an empty value disables TCP.
    #[arg(long, env = "BATON_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: String,
    /// Unix socket path to serve gRPC on as well (created with --socket-mode, 0660 by default);
    /// at most 107 bytes, the limit of a Unix socket address.
    #[arg(long, env = "BATON_SOCKET")]
    pub socket: Option<String>,
    /// TCP address serving only the gRPC health service (for probes that must reach the pod's
    /// address while the API stays on the socket or localhost); empty: none.
    #[arg(long, env = "BATON_HEALTH_LISTEN", default_value = "")]
    pub health_listen: String,
    /// Redis URL (`redis://[user:password@]host:port[/db]` or `unix:///path`); with
    /// `--redis-mode cluster` a comma-separated list of seed nodes, with `sentinel` of Sentinels.
    #[arg(long, env = "BATON_REDIS_URL", default_value = DEFAULT_REDIS_URL)]
    pub redis_url: String,
    /// Redis deployment: `standalone`, `cluster` or `sentinel`.
    #[arg(long, env = "BATON_REDIS_MODE", default_value = "standalone")]
    pub redis_mode: String,
    /// The master's name in the Sentinels' configuration (`--redis-mode sentinel` only).
    #[arg(long, env = "BATON_REDIS_SENTINEL_MASTER")]
    pub redis_sentinel_master: Option<String>,

    // --- Redis credentials and TLS (see docs/security.md) ---------------------------------
    /// Redis ACL user Baton authenticates as, on every connection (the Sentinels' too); the
    /// URLs must not name one then. Without it: the URL's user, or Redis's `default` user.
    #[arg(long, env = "BATON_REDIS_USERNAME")]
    pub redis_username: Option<String>,
    /// File holding the Redis password (one line), used for every connection as a password in
    /// the URL would be; the URLs must not carry one then. Re-read when it changes (a rotated
    /// Kubernetes Secret): new connections use the new password, open ones keep theirs. Like
    /// every `--redis-tls-*` file flag, an empty value is refused (exit 2).
    #[arg(long, env = "BATON_REDIS_PASSWORD_FILE")]
    pub redis_password_file: Option<String>,
    /// CA bundle (PEM) that Redis servers' certificates must chain to (`rediss://` URLs), in
    /// place of the public roots compiled into Baton. Re-read when it changes.
    #[arg(long, env = "BATON_REDIS_TLS_CA")]
    pub redis_tls_ca: Option<String>,
    /// Client certificate chain (PEM) shown to Redis servers that ask for one (mutual TLS);
    /// needs `--redis-tls-key`. Re-read when it changes.
    #[arg(long, env = "BATON_REDIS_TLS_CERT")]
    pub redis_tls_cert: Option<String>,
    /// Private key (PEM) of `--redis-tls-cert`. Re-read when it changes.
    #[arg(long, env = "BATON_REDIS_TLS_KEY")]
    pub redis_tls_key: Option<String>,
    /// DANGER: accept any certificate from Redis servers (`rediss://` URLs), so anyone on the
    /// network path can read and change Baton's traffic and see its password. For tests only;
    /// warned about in the log at start.
    #[arg(long, env = "BATON_REDIS_TLS_INSECURE")]
    pub redis_tls_insecure: bool,
    // --- end of Redis credentials and TLS -------------------------------------------------
    /// Replicas that must acknowledge a grant (`WAIT`) before it is confirmed; a grant they do not
    /// acknowledge in time is rolled back and reported as not acquired. 0 turns this off.
    #[arg(long, env = "BATON_MIN_REPLICAS_ACK", default_value = "0")]
    pub min_replicas_ack: String,
    /// Time the replicas get to acknowledge a grant (e.g. 50ms).
    #[arg(long, env = "BATON_MIN_REPLICAS_ACK_TIMEOUT", default_value = "50ms")]
    pub min_replicas_ack_timeout: String,
    /// Namespace put in front of every key Baton writes; must not contain `{` or `}`.
    #[arg(long, env = "BATON_KEY_PREFIX", default_value = DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,
    /// Time allowed to open a Redis connection (e.g. 300ms).
    #[arg(long, env = "BATON_REDIS_CONNECT_TIMEOUT", default_value = "300ms")]
    pub redis_connect_timeout: String,
    /// Time allowed for one Redis command to answer (e.g. 400ms).
    #[arg(long, env = "BATON_REDIS_COMMAND_TIMEOUT", default_value = "400ms")]
    pub redis_command_timeout: String,
    /// Number of multiplexed Redis connections.
    #[arg(long, env = "BATON_REDIS_POOL_SIZE", default_value_t = DEFAULT_REDIS_POOL_SIZE.to_string())]
    pub redis_pool_size: String,
    /// Time allowed for a graceful drain on SIGTERM/SIGINT before stopping hard (e.g. 10s; 0s
    /// stops hard at once: nothing is released, leases end at their ttl).
    #[arg(long, env = "BATON_DRAIN_TIMEOUT", default_value = "10s")]
    pub drain_timeout: String,
    /// Time Baton keeps serving every call, new ones too, after SIGTERM/SIGINT before the drain
    /// starts, with readiness NOT_SERVING (e.g. 5s; at most 10m); another signal cuts it short.
    #[arg(long, env = "BATON_SHUTDOWN_DELAY", default_value = "0s")]
    pub shutdown_delay: String,
    /// Silence after which Baton pings a client over HTTP/2 (e.g. 1s); 0 turns pings off. A
    /// `Hold`/`KeepAlive` stream whose client answers nothing for longer than its lease's ttl and
    /// one interval (at least two intervals) loses its lease.
    #[arg(long, env = "BATON_CLIENT_KEEPALIVE_INTERVAL", default_value = "1s")]
    pub client_keepalive_interval: String,
    /// Time a client has to answer a ping before its connection is closed (e.g. 20s).
    #[arg(long, env = "BATON_CLIENT_KEEPALIVE_TIMEOUT", default_value = "20s")]
    pub client_keepalive_timeout: String,
    /// Log output format: `plain` or `json`.
    #[arg(long, env = "BATON_LOG_FORMAT", default_value = "plain")]
    pub log_format: String,
    /// Log filter in `tracing` syntax (e.g. `info,baton=debug`).
    #[arg(long, env = "BATON_LOG", default_value = "info")]
    pub log: String,
    /// Time allowed for one rate limit decision's Redis call before the failure mode answers.
    #[arg(long, env = "BATON_RATELIMIT_TIMEOUT", default_value = "50ms")]
    pub ratelimit_timeout: String,
    /// Rate limit answer when Redis does not answer in time: `open` (allow) or `closed` (deny).
    #[arg(long, env = "BATON_RATELIMIT_FAILURE_MODE", default_value = "open")]
    pub ratelimit_failure_mode: String,
    /// Rules for Envoy's rate limit API (envoyproxy/ratelimit YAML: a file or a directory of
    /// them); Envoy's API is served only when given.
    #[arg(long, env = "BATON_RATELIMIT_CONFIG")]
    pub ratelimit_config: Option<String>,
    /// How often the rules file is checked for changes and reloaded (10ms to 1h, e.g. 10s); 0
    /// never reloads.
    #[arg(long, env = "BATON_RATELIMIT_CONFIG_RELOAD", default_value = "10s")]
    pub ratelimit_config_reload: String,
    /// TCP address to serve Prometheus metrics on (`GET /metrics`, plain HTTP), e.g.
    /// 0.0.0.0:9090; empty (the default) serves none.
    #[arg(long, env = "BATON_METRICS_LISTEN", default_value = "")]
    pub metrics_listen: String,
    /// Serving-side security: TLS, the API token, the socket's mode and group, server limits.
    #[command(flatten)]
    pub serving: ServingArgs,
}

impl ServeArgs {
    /// The rate limit rules path given (`--ratelimit-config`), if any; the file itself is read by
    /// the rate limit module.
    pub fn ratelimit_config_path(&self) -> Option<PathBuf> {
        self.ratelimit_config
            .as_deref()
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// What rate limit checks answer when Redis does not answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Allow, counting nothing.
    Open,
    /// Deny.
    Closed,
}

/// Validated rate limiting settings.
#[derive(Debug, Clone)]
pub struct RateLimitConfig {
    /// Time allowed for one decision's Redis call.
    pub timeout: Duration,
    /// The answer when Redis does not answer within `timeout`.
    pub failure_mode: FailureMode,
    /// The rules file (or directory) of Envoy's rate limit API, read by the rate limit module when
    /// serving starts and reloaded when it changes; the API is served only when it is set.
    pub rules_path: Option<PathBuf>,
    /// How often the rules are checked for changes; zero never reloads.
    pub reload_interval: Duration,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_RATELIMIT_TIMEOUT,
            failure_mode: DEFAULT_RATELIMIT_FAILURE_MODE,
            rules_path: None,
            reload_interval: DEFAULT_RATELIMIT_CONFIG_RELOAD,
        }
    }
}

/// Validated settings for a serving Baton.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// TCP address to serve on, if any.
    pub listen: Option<SocketAddr>,
    /// Unix socket path to serve on, if any.
    pub socket: Option<PathBuf>,
    /// TCP address serving only the health service, if any.
    pub health_listen: Option<SocketAddr>,
    /// Redis settings.
    pub redis: RedisConfig,
    /// Time allowed for a graceful drain before stopping hard.
    pub drain_timeout: Duration,
    /// Time kept serving, not ready, between the first signal and the drain.
    pub shutdown_delay: Duration,
    /// Silence after which clients are pinged over HTTP/2; `None`: never.
    pub client_keepalive_interval: Option<Duration>,
    /// Time a client has to answer a ping before its connection is closed.
    pub client_keepalive_timeout: Duration,
    /// Log output format.
    pub log_format: LogFormat,
    /// Log filter in `tracing` syntax.
    pub log_filter: String,
    /// Rate limiting settings.
    pub ratelimit: RateLimitConfig,
    /// TCP address to serve Prometheus metrics on, if any.
    pub metrics_listen: Option<SocketAddr>,
    /// Serving-side security settings.
    pub serving: ServingConfig,
}

impl ServeConfig {
    /// Settings that serve on nothing yet and use `redis` with every other value at its default;
    /// embedders and tests bind their own listeners.
    pub fn new(redis: RedisConfig) -> Self {
        Self {
            listen: None,
            socket: None,
            health_listen: None,
            redis,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            shutdown_delay: DEFAULT_SHUTDOWN_DELAY,
            client_keepalive_interval: Some(DEFAULT_CLIENT_KEEPALIVE_INTERVAL),
            client_keepalive_timeout: DEFAULT_CLIENT_KEEPALIVE_TIMEOUT,
            log_format: LogFormat::Plain,
            log_filter: "info".to_owned(),
            ratelimit: RateLimitConfig::default(),
            metrics_listen: None,
            serving: ServingConfig::default(),
        }
    }

    /// Validates raw arguments, returning every problem found (one line each) on failure.
    pub fn from_args(args: &ServeArgs) -> Result<Self, Vec<String>> {
        let mut errors = Vec::new();

        let listen = if args.listen.trim().is_empty() {
            None
        } else {
            match args.listen.parse::<SocketAddr>() {
                Ok(addr) => Some(addr),
                Err(e) => {
                    errors.push(format!(
                        "--listen / BATON_LISTEN: {:?} is not an address like 127.0.0.1:50051: {e}",
                        args.listen
                    ));
                    None
                }
            }
        };
        let socket = args
            .socket
            .as_deref()
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        if let Some(Err(e)) = socket
            .as_deref()
            .map(crate::security::socket::check_path_length)
        {
            errors.push(format!("--socket / BATON_SOCKET: {e}"));
        }
        if listen.is_none() && socket.is_none() && errors.is_empty() {
            errors.push("--listen / --socket: nothing to serve on; give at least one".to_owned());
        }
        let health_listen = if args.health_listen.trim().is_empty() {
            None
        } else {
            match args.health_listen.parse::<SocketAddr>() {
                Ok(addr) => Some(addr),
                Err(e) => {
                    errors.push(format!(
                        "--health-listen / BATON_HEALTH_LISTEN: {:?} is not an address like 0.0.0.0:50052: {e}",
                        args.health_listen
                    ));
                    None
                }
            }
        };

        let topology = Topology::parse(
            &args.redis_mode,
            &args.redis_url,
            args.redis_sentinel_master.as_deref(),
        )
        .unwrap_or_else(|e| {
            errors.push(e);
            Topology::Standalone {
                url: DEFAULT_REDIS_URL.to_owned(),
            }
        });
        let access = RedisAccess {
            username: args.redis_username.clone().filter(|u| !u.is_empty()),
            password_file: file_flag(
                &mut errors,
                "--redis-password-file / BATON_REDIS_PASSWORD_FILE",
                &args.redis_password_file,
            ),
            tls: RedisTls {
                ca: file_flag(
                    &mut errors,
                    "--redis-tls-ca / BATON_REDIS_TLS_CA",
                    &args.redis_tls_ca,
                ),
                cert: file_flag(
                    &mut errors,
                    "--redis-tls-cert / BATON_REDIS_TLS_CERT",
                    &args.redis_tls_cert,
                ),
                key: file_flag(
                    &mut errors,
                    "--redis-tls-key / BATON_REDIS_TLS_KEY",
                    &args.redis_tls_key,
                ),
                insecure: args.redis_tls_insecure,
            },
        };
        errors.extend(access.problems(&topology));

        let prefix = &args.key_prefix;
        if prefix.contains(['{', '}']) {
            errors.push(format!(
                "--key-prefix / BATON_KEY_PREFIX: {prefix:?} must not contain '{{' or '}}' (they would break Redis Cluster hash tags)"
            ));
        } else if prefix.len() > MAX_KEY_PREFIX_BYTES {
            errors.push(format!(
                "--key-prefix / BATON_KEY_PREFIX: {} bytes is longer than {MAX_KEY_PREFIX_BYTES}",
                prefix.len()
            ));
        }

        let connect_timeout = duration(
            &mut errors,
            "--redis-connect-timeout / BATON_REDIS_CONNECT_TIMEOUT",
            &args.redis_connect_timeout,
            Duration::from_millis(10),
            Duration::from_secs(10),
        );
        let command_timeout = duration(
            &mut errors,
            "--redis-command-timeout / BATON_REDIS_COMMAND_TIMEOUT",
            &args.redis_command_timeout,
            Duration::from_millis(10),
            Duration::from_secs(10),
        );
        let drain_timeout = duration(
            &mut errors,
            "--drain-timeout / BATON_DRAIN_TIMEOUT",
            &args.drain_timeout,
            Duration::ZERO,
            Duration::from_secs(600),
        );
        let shutdown_delay = duration(
            &mut errors,
            "--shutdown-delay / BATON_SHUTDOWN_DELAY",
            &args.shutdown_delay,
            Duration::ZERO,
            MAX_SHUTDOWN_DELAY,
        );
        let client_keepalive_interval = duration(
            &mut errors,
            "--client-keepalive-interval / BATON_CLIENT_KEEPALIVE_INTERVAL",
            &args.client_keepalive_interval,
            Duration::ZERO,
            Duration::from_secs(3600),
        );
        if !client_keepalive_interval.is_zero()
            && client_keepalive_interval < Duration::from_millis(100)
        {
            errors.push(
                "--client-keepalive-interval / BATON_CLIENT_KEEPALIVE_INTERVAL: below 100ms \
                 (0 turns pings off)"
                    .to_owned(),
            );
        }
        let client_keepalive_timeout = duration(
            &mut errors,
            "--client-keepalive-timeout / BATON_CLIENT_KEEPALIVE_TIMEOUT",
            &args.client_keepalive_timeout,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        );

        let pool_size = match args.redis_pool_size.parse::<u32>() {
            Ok(n @ 1..=256) => n,
            _ => {
                errors.push(format!(
                    "--redis-pool-size / BATON_REDIS_POOL_SIZE: {:?} is not a whole number from 1 to 256",
                    args.redis_pool_size
                ));
                DEFAULT_REDIS_POOL_SIZE
            }
        };

        let min_replicas_ack = match args.min_replicas_ack.parse::<u32>() {
            Ok(n @ 0..=16) => n,
            _ => {
                errors.push(format!(
                    "--min-replicas-ack / BATON_MIN_REPLICAS_ACK: {:?} is not a whole number from 0 to 16",
                    args.min_replicas_ack
                ));
                0
            }
        };
        let replica_ack_timeout = duration(
            &mut errors,
            "--min-replicas-ack-timeout / BATON_MIN_REPLICAS_ACK_TIMEOUT",
            &args.min_replicas_ack_timeout,
            Duration::from_millis(1),
            Duration::from_secs(5),
        );

        let log_format = match args.log_format.as_str() {
            "plain" => LogFormat::Plain,
            "json" => LogFormat::Json,
            other => {
                errors.push(format!(
                    "--log-format / BATON_LOG_FORMAT: {other:?} is neither \"plain\" nor \"json\""
                ));
                LogFormat::Plain
            }
        };

        let ratelimit_timeout = duration(
            &mut errors,
            "--ratelimit-timeout / BATON_RATELIMIT_TIMEOUT",
            &args.ratelimit_timeout,
            Duration::from_millis(1),
            Duration::from_secs(10),
        );
        let ratelimit_failure_mode = match args.ratelimit_failure_mode.as_str() {
            "open" => FailureMode::Open,
            "closed" => FailureMode::Closed,
            other => {
                errors.push(format!(
                    "--ratelimit-failure-mode / BATON_RATELIMIT_FAILURE_MODE: {other:?} is neither \"open\" nor \"closed\""
                ));
                DEFAULT_RATELIMIT_FAILURE_MODE
            }
        };
        let ratelimit_reload = reload_interval(
            &mut errors,
            "--ratelimit-config-reload / BATON_RATELIMIT_CONFIG_RELOAD",
            &args.ratelimit_config_reload,
        );
        let metrics_listen = if args.metrics_listen.trim().is_empty() {
            None
        } else {
            match args.metrics_listen.trim().parse::<SocketAddr>() {
                Ok(addr) => Some(addr),
                Err(e) => {
                    errors.push(format!(
                        "--metrics-listen / BATON_METRICS_LISTEN: {:?} is not an address like 0.0.0.0:9090: {e}",
                        args.metrics_listen
                    ));
                    None
                }
            }
        };
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&args.log) {
            errors.push(format!(
                "--log / BATON_LOG: {:?} is not a log filter: {e}",
                args.log
            ));
        }

        let serving = ServingConfig::from_args(&args.serving, listen.is_some(), &mut errors);

        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Self {
            listen,
            socket,
            health_listen,
            redis: RedisConfig {
                topology,
                key_prefix: args.key_prefix.clone(),
                connect_timeout,
                command_timeout,
                pool_size,
                min_replicas_ack,
                replica_ack_timeout,
                access,
            },
            drain_timeout,
            shutdown_delay,
            client_keepalive_interval: (!client_keepalive_interval.is_zero())
                .then_some(client_keepalive_interval),
            client_keepalive_timeout,
            log_format,
            log_filter: args.log.clone(),
            ratelimit: RateLimitConfig {
                timeout: ratelimit_timeout,
                failure_mode: ratelimit_failure_mode,
                rules_path: args.ratelimit_config_path(),
                reload_interval: ratelimit_reload,
            },
            metrics_listen,
            serving,
        })
    }

    /// The effective configuration as `(setting, value)` pairs for the startup log line:
    /// every setting but the log's own, with the passwords of Redis URLs masked.
    pub fn summary(&self) -> Vec<(&'static str, String)> {
        let or_none = |v: Option<String>| v.unwrap_or_else(|| "none".to_owned());
        let urls = match &self.redis.topology {
            Topology::Standalone { url } => vec![url.clone()],
            Topology::Cluster { seeds } => seeds.clone(),
            Topology::Sentinel { sentinels, .. } => sentinels.clone(),
        };
        let urls: Vec<String> = urls.iter().map(|u| masked(u)).collect();
        let mut summary = vec![
            ("listen", or_none(self.listen.map(|a| a.to_string()))),
            (
                "socket",
                or_none(self.socket.as_ref().map(|p| p.display().to_string())),
            ),
            (
                "metrics_listen",
                or_none(self.metrics_listen.map(|a| a.to_string())),
            ),
            ("redis_mode", self.redis.topology.kind().to_owned()),
            ("redis_url", urls.join(",")),
        ];
        if let Topology::Sentinel { master, .. } = &self.redis.topology {
            summary.push(("redis_sentinel_master", master.clone()));
        }
        // Paths and names only: the password and the keys are never shown.
        let access = &self.redis.access;
        let file = |p: &Option<PathBuf>| or_none(p.as_ref().map(|p| p.display().to_string()));
        summary.extend([
            ("redis_username", or_none(access.username.clone())),
            ("redis_password_file", file(&access.password_file)),
            ("redis_tls", self.redis.tls_summary().to_owned()),
            ("redis_tls_ca", file(&access.tls.ca)),
            ("redis_tls_cert", file(&access.tls.cert)),
        ]);
        let show = |d: Duration| humantime::format_duration(d).to_string();
        summary.extend([
            ("key_prefix", self.redis.key_prefix.clone()),
            ("redis_pool_size", self.redis.pool_size.to_string()),
            ("redis_connect_timeout", show(self.redis.connect_timeout)),
            ("redis_command_timeout", show(self.redis.command_timeout)),
            ("min_replicas_ack", self.redis.min_replicas_ack.to_string()),
            (
                "min_replicas_ack_timeout",
                show(self.redis.replica_ack_timeout),
            ),
            ("drain_timeout", show(self.drain_timeout)),
            (
                "client_keepalive_interval",
                self.client_keepalive_interval.map_or("0s".to_owned(), show),
            ),
            (
                "client_keepalive_timeout",
                show(self.client_keepalive_timeout),
            ),
            ("ratelimit_timeout", show(self.ratelimit.timeout)),
            (
                "ratelimit_failure_mode",
                match self.ratelimit.failure_mode {
                    FailureMode::Open => "open",
                    FailureMode::Closed => "closed",
                }
                .to_owned(),
            ),
            (
                "ratelimit_config",
                or_none(
                    self.ratelimit
                        .rules_path
                        .as_ref()
                        .map(|p| p.display().to_string()),
                ),
            ),
            (
                "ratelimit_config_reload",
                show(self.ratelimit.reload_interval),
            ),
        ]);
        summary.extend(self.serving.summary());
        summary
    }
}

/// `url` with its password, if any, replaced by `***` (for log lines and errors): the password of
/// the user part, and a `pass` or `password` query parameter (how a `unix://` URL carries one).
pub fn masked(url: &str) -> String {
    let secret =
        |key: &str| key.eq_ignore_ascii_case("pass") || key.eq_ignore_ascii_case("password");
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                // Only a URL that cannot have a password refuses one; this one has one.
                let _ = parsed.set_password(Some("***"));
            }
            if parsed.query_pairs().any(|(k, _)| secret(&k)) {
                let pairs: Vec<(String, String)> = parsed
                    .query_pairs()
                    .map(|(k, v)| {
                        let v = if secret(&k) {
                            "***".to_owned()
                        } else {
                            v.into_owned()
                        };
                        (k.into_owned(), v)
                    })
                    .collect();
                parsed.query_pairs_mut().clear().extend_pairs(pairs);
            }
            parsed.to_string()
        }
        // Not a URL the parser reads: say nothing of what it holds after a user part, nor of
        // its query.
        Err(_) => {
            let url = url
                .split_once('?')
                .map_or(url.to_owned(), |(u, _)| format!("{u}?***"));
            match url.rsplit_once('@') {
                Some((_, host)) => format!("***@{host}"),
                None => url,
            }
        }
    }
}

/// The file a credential flag names, if the flag was given. An empty value (or only blanks) is
/// refused, naming the flag: taking it as "no file" would turn authentication or TLS off without
/// a word when a variable meant to hold a path is set but empty.
fn file_flag(errors: &mut Vec<String>, what: &str, raw: &Option<String>) -> Option<PathBuf> {
    let raw = raw.as_deref()?;
    if raw.trim().is_empty() {
        errors.push(format!(
            "{what}: the value was empty; give a file path, or leave the flag and the variable \
             unset"
        ));
        return None;
    }
    Some(PathBuf::from(raw))
}

/// Parses a human duration such as `300ms` within `[min, max]`, recording a problem otherwise.
fn duration(
    errors: &mut Vec<String>,
    what: &str,
    raw: &str,
    min: Duration,
    max: Duration,
) -> Duration {
    match humantime::parse_duration(raw) {
        Ok(d) if d >= min && d <= max => d,
        Ok(d) => {
            errors.push(format!(
                "{what}: {} is outside {} to {}",
                humantime::format_duration(d),
                humantime::format_duration(min),
                humantime::format_duration(max)
            ));
            min
        }
        Err(e) => {
            errors.push(format!(
                "{what}: {raw:?} is not a duration like 300ms or 10s: {e}"
            ));
            min
        }
    }
}

/// Shortest interval between two reads of a watched file (rules, credentials), other than 0:
/// a shorter one would read the files without a pause.
pub const MIN_RELOAD_INTERVAL: Duration = Duration::from_millis(10);

/// Parses how often watched files are read again: 0 (never), or [`MIN_RELOAD_INTERVAL`] to 1 h.
fn reload_interval(errors: &mut Vec<String>, what: &str, raw: &str) -> Duration {
    if humantime::parse_duration(raw).is_ok_and(|d| d.is_zero()) {
        return Duration::ZERO;
    }
    duration(
        errors,
        what,
        raw,
        MIN_RELOAD_INTERVAL,
        Duration::from_secs(3600),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> ServeArgs {
        let mut argv = vec!["baton", "serve"];
        argv.extend_from_slice(list);
        match Cli::try_parse_from(argv).expect("arguments parse").command {
            Command::Serve(a) => *a,
            other => panic!("`baton serve` parsed as {other:?}"),
        }
    }

    /// Defaults validate and match the documented constants.
    #[test]
    fn defaults_are_valid() {
        let cfg = ServeConfig::from_args(&args(&[])).expect("defaults are valid");
        assert_eq!(cfg.listen, Some(DEFAULT_LISTEN.parse().unwrap()));
        assert_eq!(cfg.redis.command_timeout, DEFAULT_REDIS_COMMAND_TIMEOUT);
        assert_eq!(cfg.redis.connect_timeout, DEFAULT_REDIS_CONNECT_TIMEOUT);
        assert_eq!(cfg.redis.key_prefix, DEFAULT_KEY_PREFIX);
        assert_eq!(cfg.drain_timeout, DEFAULT_DRAIN_TIMEOUT);
    }

    /// `--shutdown-delay` defaults to none and is bounded by 10 minutes; `--health-listen` is an
    /// address or nothing.
    #[test]
    fn shutdown_delay_and_health_listen_are_checked() {
        let cfg = ServeConfig::from_args(&args(&[])).expect("defaults are valid");
        assert_eq!(cfg.shutdown_delay, Duration::ZERO);
        assert_eq!(cfg.health_listen, None);
        let cfg = ServeConfig::from_args(&args(&[
            "--shutdown-delay",
            "10m",
            "--health-listen",
            "0.0.0.0:50052",
        ]))
        .expect("valid");
        assert_eq!(cfg.shutdown_delay, MAX_SHUTDOWN_DELAY);
        assert_eq!(cfg.health_listen, Some("0.0.0.0:50052".parse().unwrap()));
        let errors = ServeConfig::from_args(&args(&[
            "--shutdown-delay",
            "11m",
            "--health-listen",
            "everywhere",
        ]))
        .expect_err("invalid");
        assert_eq!(errors.len(), 2, "{errors:#?}");
        assert!(errors[0].starts_with("--health-listen"), "{errors:#?}");
        assert!(errors[1].starts_with("--shutdown-delay"), "{errors:#?}");
    }

    /// How often watched files are read again: 0 (never) or 10 ms to 1 h; a shorter interval
    /// would read them without a pause.
    #[test]
    fn reload_intervals_are_bounded() {
        for ok in ["0", "10ms", "10s", "1h"] {
            let cfg = ServeConfig::from_args(&args(&[
                "--ratelimit-config-reload",
                ok,
                "--credentials-reload",
                ok,
            ]))
            .unwrap_or_else(|e| panic!("{ok}: {e:#?}"));
            assert_eq!(
                cfg.serving.credentials_reload,
                cfg.ratelimit.reload_interval
            );
        }
        for bad in ["1ns", "9ms", "61m"] {
            let errors = ServeConfig::from_args(&args(&[
                "--ratelimit-config-reload",
                bad,
                "--credentials-reload",
                bad,
            ]))
            .expect_err(bad);
            assert_eq!(errors.len(), 2, "{bad}: {errors:#?}");
            assert!(
                errors.iter().all(|e| e.contains("outside 10ms to 1h")),
                "{errors:#?}"
            );
        }
    }

    /// A metrics address is optional, and a bad one is reported with its flag.
    #[test]
    fn metrics_listen_is_checked() {
        let cfg = ServeConfig::from_args(&args(&[])).expect("defaults are valid");
        assert_eq!(cfg.metrics_listen, None, "off by default");
        let cfg =
            ServeConfig::from_args(&args(&["--metrics-listen", "0.0.0.0:9090"])).expect("valid");
        assert_eq!(cfg.metrics_listen, Some("0.0.0.0:9090".parse().unwrap()));
        let errors = ServeConfig::from_args(&args(&["--metrics-listen", "9090"]))
            .expect_err("not an address");
        assert!(
            errors[0].starts_with("--metrics-listen / BATON_METRICS_LISTEN"),
            "{errors:?}"
        );
    }

    /// The startup summary names every setting and never shows a Redis password.
    #[test]
    fn summary_masks_passwords() {
        let cfg = ServeConfig::from_args(&args(&[
            "--redis-mode",
            "cluster",
            "--redis-url",
            "redis://admin:s3cret@10.0.0.1:7000,redis://:other-secret@10.0.0.2:7000",
        ]))
        .expect("valid");
        let summary = format!("{:?}", cfg.summary());
        assert!(
            !summary.contains("s3cret") && !summary.contains("other-secret"),
            "{summary}"
        );
        assert!(
            summary.contains("redis://admin:***@10.0.0.1:7000"),
            "{summary}"
        );
        assert_eq!(masked("unix:///run/redis.sock"), "unix:///run/redis.sock");
        // A Unix socket URL's password is a query parameter.
        for (url, shown) in [
            (
                "unix:///run/redis.sock?pass=s3cret",
                "unix:///run/redis.sock?pass=***",
            ),
            (
                "redis+unix:///run/redis.sock?user=u&password=s3cret&db=2",
                "redis+unix:///run/redis.sock?user=u&password=***&db=2",
            ),
        ] {
            assert_eq!(masked(url), shown);
        }
        // URLs that do not parse say nothing after a user part or of a query.
        assert_eq!(masked("redis://u:s3cret@redis:99999"), "***@redis:99999");
        assert_eq!(
            masked("rediss://redis:99999?pass=s3cret"),
            "rediss://redis:99999?***"
        );
        for bad in [
            "redis://baton:s3cret@redis:99999",
            "redi://baton:s3cret@redis:6379",
            "redis://baton:s3cret@redis:6379/notadb",
        ] {
            let err = Topology::parse("standalone", bad, None).expect_err(bad);
            assert!(!err.contains("s3cret"), "{err}");
        }
        let err = Topology::parse("cluster", "unix:///r.sock?pass=s3cret", None).expect_err("unix");
        assert!(!err.contains("s3cret"), "{err}");
        assert_eq!(
            masked("redis://127.0.0.1:6379/2"),
            "redis://127.0.0.1:6379/2"
        );
    }

    /// The serving-side flags default to the documented constants; TLS needs its certificate,
    /// its key and a TCP listener; every bad value is reported with its flag.
    #[test]
    fn serving_flags_are_checked() {
        let cfg = ServeConfig::from_args(&args(&[])).expect("defaults are valid");
        assert!(cfg.serving.tls.is_none() && cfg.serving.api_token_file.is_none());
        assert_eq!(cfg.serving.socket_mode, 0o660);
        assert_eq!(cfg.serving.max_lease_streams, DEFAULT_MAX_LEASE_STREAMS);
        assert_eq!(cfg.serving.max_message_bytes, DEFAULT_MAX_MESSAGE_BYTES);
        assert_eq!(cfg.serving.credentials_reload, DEFAULT_CREDENTIALS_RELOAD);
        let errors = ServeConfig::from_args(&args(&[
            "--tls-cert",
            "/nonexistent/tls.crt",
            "--socket-mode",
            "999",
            "--socket-group",
            "no-such-group-for-baton",
            "--max-lease-streams",
            "0",
            "--max-message-size",
            "10",
            "--handshake-timeout",
            "1ms",
        ]))
        .expect_err("invalid");
        for flag in [
            "--tls-cert / --tls-key",
            "--socket-mode",
            "--socket-group",
            "--max-lease-streams",
            "--max-message-size",
            "--handshake-timeout",
        ] {
            assert!(
                errors.iter().any(|e| e.starts_with(flag)),
                "{flag} missing in {errors:#?}"
            );
        }
        assert_eq!(errors.len(), 6, "{errors:#?}");
        let errors = ServeConfig::from_args(&args(&[
            "--listen",
            "",
            "--socket",
            "/tmp/baton.sock",
            "--tls-cert",
            "/nonexistent/tls.crt",
            "--tls-key",
            "/nonexistent/tls.key",
        ]))
        .expect_err("TLS without TCP, files missing");
        assert!(
            errors.iter().any(|e| e.contains("--listen is empty")),
            "{errors:#?}"
        );
        assert!(
            errors
                .iter()
                .any(|e| e.contains("cannot read /nonexistent/tls.crt")),
            "{errors:#?}"
        );
    }

    /// The Redis user, password file and TLS files reach the Redis settings; the startup
    /// summary names the files and the TLS mode but never shows the password; a user or a
    /// password given both in a URL and by a flag is refused.
    #[test]
    fn redis_access_flags_are_checked() {
        let dir = tempfile::tempdir().expect("temp dir");
        let password = dir.path().join("password");
        std::fs::write(&password, "hunter2-not-shown\n").expect("writing");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec!["redis".to_owned()])
            .expect("params")
            .self_signed(&key)
            .expect("certificate");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, cert.pem()).expect("writing");
        let client_key = dir.path().join("client.key");
        std::fs::write(&client_key, key.serialize_pem()).expect("writing");
        let path = |p: &std::path::Path| p.display().to_string();
        let cfg = ServeConfig::from_args(&args(&[
            "--redis-url",
            "rediss://redis.example:6380",
            "--redis-username",
            "baton",
            "--redis-password-file",
            &path(&password),
            "--redis-tls-ca",
            &path(&ca),
            "--redis-tls-cert",
            &path(&ca),
            "--redis-tls-key",
            &path(&client_key),
        ]))
        .expect("valid");
        assert_eq!(cfg.redis.access.username.as_deref(), Some("baton"));
        assert_eq!(
            cfg.redis.access.password_file.as_deref(),
            Some(password.as_path())
        );
        let summary = format!("{:?}", cfg.summary());
        assert!(!summary.contains("hunter2"), "{summary}");
        for shown in [
            "\"redis_username\", \"baton\"".to_owned(),
            format!("\"redis_password_file\", {:?}", path(&password)),
            "\"redis_tls\", \"verified+client-cert\"".to_owned(),
            format!("\"redis_tls_ca\", {:?}", path(&ca)),
        ] {
            assert!(summary.contains(&shown), "{shown} in {summary}");
        }
        let errors = ServeConfig::from_args(&args(&[
            "--redis-url",
            "redis://someone:inline@127.0.0.1:6379",
            "--redis-username",
            "baton",
            "--redis-password-file",
            &path(&password),
        ]))
        .expect_err("given twice");
        assert_eq!(errors.len(), 2, "{errors:#?}");
        assert!(errors[0].starts_with("--redis-username"), "{errors:#?}");
        assert!(
            errors[1].starts_with("--redis-password-file"),
            "{errors:#?}"
        );
        assert!(!format!("{errors:?}").contains("hunter2"), "{errors:#?}");
    }

    /// Cluster nodes are reached by host and port: a Unix socket URL among the seeds is a
    /// configuration error, not a failure at startup (it was an internal error, exit 1).
    #[test]
    fn cluster_seeds_are_tcp() {
        for (mode, urls, master) in [
            ("cluster", "unix:///run/redis.sock", None),
            ("cluster", "redis://a:7000,unix:///run/redis.sock", None),
        ] {
            let err = Topology::parse(mode, urls, master).expect_err(urls);
            assert!(
                err.starts_with("--redis-url") && err.contains("not a Unix socket"),
                "{err}"
            );
        }
        assert!(Topology::parse("cluster", "redis://a:7000,rediss://b:7001", None).is_ok());
        assert!(Topology::parse("standalone", "unix:///run/redis.sock", None).is_ok());
        // A Sentinel may listen on a socket; the master it names is reached by host and port.
        assert!(Topology::parse("sentinel", "unix:///run/sentinel.sock", Some("m")).is_ok());
    }

    /// Every bad value is reported in one pass, each naming its flag.
    #[test]
    fn all_errors_reported_together() {
        let errors = ServeConfig::from_args(&args(&[
            "--listen",
            "nowhere",
            "--redis-url",
            "http://x",
            "--key-prefix",
            "a{b",
            "--redis-command-timeout",
            "forever",
            "--redis-pool-size",
            "0",
            "--log-format",
            "xml",
        ]))
        .expect_err("invalid arguments");
        assert_eq!(errors.len(), 6, "{errors:#?}");
        for flag in [
            "--listen",
            "--redis-url",
            "--key-prefix",
            "--redis-command-timeout",
            "--redis-pool-size",
            "--log-format",
        ] {
            assert!(
                errors.iter().any(|e| e.starts_with(flag)),
                "{flag} missing in {errors:#?}"
            );
        }
    }
}
