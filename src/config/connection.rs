//! The Redis side of the configuration: the deployment, its addresses, credentials and TLS.

use super::*;

/// Validated Redis connection settings.
#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// The deployment and its addresses.
    pub topology: Topology,
    /// Namespace put in front of every key.
    pub key_prefix: String,
    /// Time allowed to open a connection.
    pub connect_timeout: Duration,
    /// Time allowed for one command to answer.
    pub command_timeout: Duration,
    /// Number of pooled multiplexed connections.
    pub pool_size: u32,
    /// Replicas that must acknowledge each grant (0: none).
    pub min_replicas_ack: u32,
    /// Time the replicas get to acknowledge a grant.
    pub replica_ack_timeout: Duration,
    /// The ACL user, the password file and the TLS files of every connection.
    pub access: RedisAccess,
}

/// How Baton authenticates to Redis and secures its connections: file paths only, read (and
/// re-read when they change) by [`crate::redis::Access`]; nothing secret is kept here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisAccess {
    /// ACL user of every connection; `None`: the URL's, or Redis's `default` user.
    pub username: Option<String>,
    /// File holding the password of every connection; `None`: the URL's, if any.
    pub password_file: Option<PathBuf>,
    /// TLS settings of `rediss://` connections.
    pub tls: RedisTls,
}

/// TLS settings of `rediss://` connections.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// CA bundle (PEM) trusted in place of the compiled-in public roots.
    pub ca: Option<PathBuf>,
    /// Client certificate chain (PEM) for mutual TLS.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub key: Option<PathBuf>,
    /// Accept any server certificate (`--redis-tls-insecure`).
    pub insecure: bool,
}

impl RedisTls {
    /// Whether any TLS setting was given.
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some() || self.insecure
    }
}

impl RedisAccess {
    /// Every problem with these settings for `topology`, one line each naming its flag: the
    /// files are read and checked (see [`crate::redis::Access::load`]), and the URLs must agree
    /// with the flags (no user or password in both places, TLS settings only for `rediss://`).
    pub fn problems(&self, topology: &Topology) -> Vec<String> {
        let mut problems = Vec::new();
        let urls = topology.urls();
        let infos: Vec<redis::ConnectionInfo> = urls
            .iter()
            .filter_map(|u| redis::IntoConnectionInfo::into_connection_info(u.as_str()).ok())
            .collect();
        if let Some(user) = &self.username {
            if user.is_empty()
                || user.len() > MAX_REDIS_USERNAME_BYTES
                || user.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                problems.push(format!(
                    "--redis-username / BATON_REDIS_USERNAME: {user:?} is not a Redis user name \
                     (1 to {MAX_REDIS_USERNAME_BYTES} bytes, no spaces or control characters)"
                ));
            }
            if infos
                .iter()
                .any(|i| i.redis_settings().username().is_some())
            {
                problems.push(
                    "--redis-username / BATON_REDIS_USERNAME: a Redis URL already names a user; \
                     give it in one place"
                        .to_owned(),
                );
            }
        }
        if self.password_file.is_some()
            && infos
                .iter()
                .any(|i| i.redis_settings().password().is_some())
        {
            problems.push(
                "--redis-password-file / BATON_REDIS_PASSWORD_FILE: a Redis URL already carries a \
                 password; give it in one place"
                    .to_owned(),
            );
        }
        let tls_urls = infos
            .iter()
            .filter(|i| matches!(i.addr(), redis::ConnectionAddr::TcpTls { .. }))
            .count();
        if tls_urls > 0 && tls_urls < infos.len() {
            problems.push(
                "--redis-url / BATON_REDIS_URL: some URLs are rediss:// (TLS) and others not; \
                 Baton uses TLS for all of a deployment's connections or for none"
                    .to_owned(),
            );
        }
        if infos.iter().any(|i| {
            matches!(
                i.addr(),
                redis::ConnectionAddr::TcpTls { insecure: true, .. }
            )
        }) {
            problems.push(
                "--redis-url / BATON_REDIS_URL: the #insecure fragment turns certificate \
                 verification off unseen; use --redis-tls-insecure, which says so in the log"
                    .to_owned(),
            );
        }
        if self.tls.is_set() && tls_urls == 0 {
            problems.push(
                "--redis-tls-* / BATON_REDIS_TLS_*: TLS settings need rediss:// Redis URLs (these \
                 connect in plain text)"
                    .to_owned(),
            );
        }
        if self.tls.insecure && self.tls.ca.is_some() {
            problems.push(
                "--redis-tls-insecure / BATON_REDIS_TLS_INSECURE: verifies no certificate, so \
                 --redis-tls-ca would be ignored; give one or the other"
                    .to_owned(),
            );
        }
        if self.tls.insecure
            && self.tls.cert.is_some()
            && matches!(topology, Topology::Sentinel { .. })
        {
            problems.push(
                "--redis-tls-insecure / BATON_REDIS_TLS_INSECURE: with --redis-mode sentinel the \
                 client certificate would not reach the master (the Sentinel client checks its \
                 role without one); verify certificates with --redis-tls-ca instead"
                    .to_owned(),
            );
        }
        if let Err(more) = crate::redis::Access::load(self) {
            problems.extend(more);
        }
        problems
    }
}

impl RedisConfig {
    /// How the connections are secured, for the startup summary: `off` (plain text),
    /// `verified`, `verified+client-cert` (mutual TLS), or `INSECURE` with the reason.
    pub fn tls_summary(&self) -> &'static str {
        let tls = self
            .topology
            .urls()
            .iter()
            .any(|u| u.starts_with("rediss:"));
        match (tls, &self.access.tls) {
            (false, _) => "off",
            (true, t) if t.insecure => "INSECURE:certificates-not-verified",
            (true, t) if t.cert.is_some() => "verified+client-cert",
            (true, _) => "verified",
        }
    }

    /// Settings for a standalone Redis at `url` with every other value at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self::with_topology(Topology::Standalone { url: url.into() })
    }

    /// Settings for `topology` with every other value at its default.
    pub fn with_topology(topology: Topology) -> Self {
        Self {
            topology,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            connect_timeout: DEFAULT_REDIS_CONNECT_TIMEOUT,
            command_timeout: DEFAULT_REDIS_COMMAND_TIMEOUT,
            pool_size: DEFAULT_REDIS_POOL_SIZE,
            min_replicas_ack: 0,
            replica_ack_timeout: DEFAULT_REPLICA_ACK_TIMEOUT,
            access: RedisAccess::default(),
        }
    }
}

/// The deployment named by the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// A single Redis server.
    Standalone {
        /// Its URL.
        url: String,
    },
    /// A Redis Cluster, found from any of its seed nodes.
    Cluster {
        /// Seed node URLs.
        seeds: Vec<String>,
    },
    /// A master monitored by Redis Sentinel.
    Sentinel {
        /// Sentinel URLs.
        sentinels: Vec<String>,
        /// The master's name in the Sentinels' configuration.
        master: String,
        /// Where the user, password and database of the connections to the master come from:
        /// the first Sentinel URL.
        node_url: Option<String>,
    },
}

impl Topology {
    /// Parses the `--redis-mode`, `--redis-url` (comma-separated for Cluster seeds or Sentinels)
    /// and `--redis-sentinel-master` settings, checking every URL.
    pub fn parse(mode: &str, urls: &str, sentinel_master: Option<&str>) -> Result<Self, String> {
        let list: Vec<String> = urls
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect();
        if list.is_empty() {
            return Err("--redis-url / BATON_REDIS_URL: no URL given".to_owned());
        }
        for url in &list {
            if let Err(e) = Client::open(url.as_str()) {
                return Err(format!(
                    "--redis-url / BATON_REDIS_URL: {:?} is not a Redis URL: {e}",
                    masked(url)
                ));
            }
        }
        let master = sentinel_master.map(str::trim).filter(|m| !m.is_empty());
        if mode == "cluster" {
            // Cluster nodes announce each other by host and port.
            if let Some(url) = list.iter().find(|u| {
                !matches!(
                    Client::open(u.as_str()).map(|c| c.get_connection_info().addr().clone()),
                    Ok(ConnectionAddr::Tcp(..) | ConnectionAddr::TcpTls { .. })
                )
            }) {
                return Err(format!(
                    "--redis-url / BATON_REDIS_URL: {:?}: cluster mode takes redis://host:port \
                     or rediss://host:port URLs, not a Unix socket",
                    masked(url)
                ));
            }
        }
        match mode {
            "standalone" => {
                if list.len() > 1 {
                    return Err("--redis-url / BATON_REDIS_URL: standalone mode takes one URL; use --redis-mode cluster or sentinel for a list".to_owned());
                }
                if master.is_some() {
                    return Err("--redis-sentinel-master / BATON_REDIS_SENTINEL_MASTER: only used with --redis-mode sentinel".to_owned());
                }
                Ok(Self::Standalone {
                    url: list.into_iter().next().unwrap_or_default(),
                })
            }
            "cluster" => {
                if master.is_some() {
                    return Err("--redis-sentinel-master / BATON_REDIS_SENTINEL_MASTER: only used with --redis-mode sentinel".to_owned());
                }
                Ok(Self::Cluster { seeds: list })
            }
            "sentinel" => {
                let Some(master) = master else {
                    return Err("--redis-sentinel-master / BATON_REDIS_SENTINEL_MASTER: required with --redis-mode sentinel".to_owned());
                };
                Ok(Self::Sentinel {
                    node_url: list.first().cloned(),
                    sentinels: list,
                    master: master.to_owned(),
                })
            }
            other => Err(format!(
                "--redis-mode / BATON_REDIS_MODE: {other:?} is not one of standalone, cluster, sentinel"
            )),
        }
    }

    /// Every URL of the deployment (the Sentinels' for Sentinel).
    pub fn urls(&self) -> &[String] {
        match self {
            Self::Standalone { url } => std::slice::from_ref(url),
            Self::Cluster { seeds } => seeds,
            Self::Sentinel { sentinels, .. } => sentinels,
        }
    }

    /// A short name for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Standalone { .. } => "standalone",
            Self::Cluster { .. } => "cluster",
            Self::Sentinel { .. } => "sentinel",
        }
    }
}
