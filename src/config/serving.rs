//! Serving-side security: TLS on the TCP listener, the API token, the Unix socket's mode and
//! group, and the server's limits (src/security/, docs/security.md).

use super::*;

/// Default interval between reads of the credential files (TLS and API token) for changes.
pub const DEFAULT_CREDENTIALS_RELOAD: Duration = Duration::from_secs(10);
/// Default HTTP/2 streams (calls) one client connection may have open at once.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1024;
/// Default lease and election streams (`Hold`, `KeepAlive`, `Campaign`, `Observe`) one Baton
/// serves at once.
pub const DEFAULT_MAX_LEASE_STREAMS: usize = 16_384;
/// Default of `--max-waiters`: each waiting caller costs Redis a script call about every second
/// (a fair one renews its place), so thousands of them load it as much as a busy application.
pub const DEFAULT_MAX_WAITERS: usize = 2_048;
/// Default largest gRPC message accepted or sent, in bytes.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Largest `--max-message-size` accepted, in bytes.
pub const MAX_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Default client connections open at once, over the TCP listener and the socket together.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default time a new connection has for its TLS handshake, then for its HTTP/2 preface.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Raw serving-side security arguments of `baton serve`, before validation.
#[derive(Debug, Args)]
pub struct ServingArgs {
    /// TLS certificate chain (PEM, the server's certificate first) for the TCP listener; with
    /// --tls-key. The health listener, the metrics endpoint and the socket stay plaintext. Like
    /// every file flag, an empty value is refused (exit 2): leave it unset for plaintext.
    #[arg(long, env = "BATON_TLS_CERT")]
    pub tls_cert: Option<String>,
    /// TLS private key (PEM) going with --tls-cert.
    #[arg(long, env = "BATON_TLS_KEY")]
    pub tls_key: Option<String>,
    /// CA certificates (PEM) for mutual TLS: only clients presenting a certificate issued by one
    /// of them complete the handshake. Needs --tls-cert.
    #[arg(long, env = "BATON_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<String>,
    /// File holding the API token (one per line, to rotate without downtime): every call but
    /// health's must carry `authorization: Bearer <token>` or fails UNAUTHENTICATED. An empty
    /// value is refused (exit 2): leave it unset for no token.
    #[arg(long, env = "BATON_API_TOKEN_FILE")]
    pub api_token_file: Option<String>,
    /// How often the TLS and API token files are read again and changes put in force (10ms to
    /// 1h, e.g. 10s); 0 never rereads them.
    #[arg(long, env = "BATON_CREDENTIALS_RELOAD", default_value = "10s")]
    pub credentials_reload: String,
    /// Permission bits of the Unix socket, in octal (e.g. 0660, 0600).
    #[arg(long, env = "BATON_SOCKET_MODE", default_value = "0660")]
    pub socket_mode: String,
    /// Group of the Unix socket, by name or number (e.g. the pod's fsGroup); Baton must be a
    /// member of it. Empty: Baton's own group.
    #[arg(long, env = "BATON_SOCKET_GROUP", default_value = "")]
    pub socket_group: String,
    /// HTTP/2 streams (calls) one client connection may have open at once.
    #[arg(long, env = "BATON_MAX_CONCURRENT_STREAMS", default_value_t = DEFAULT_MAX_CONCURRENT_STREAMS.to_string())]
    pub max_concurrent_streams: String,
    /// Lease and election streams (Hold, KeepAlive, Campaign, Observe) served at once; past it
    /// a new one fails RESOURCE_EXHAUSTED.
    #[arg(long, env = "BATON_MAX_LEASE_STREAMS", default_value_t = DEFAULT_MAX_LEASE_STREAMS.to_string())]
    pub max_lease_streams: String,
    /// Callers waiting for a lock, permits or leadership at once (Acquire with a wait, Hold,
    /// Campaign); past it a new one that would wait fails RESOURCE_EXHAUSTED.
    #[arg(long, env = "BATON_MAX_WAITERS", default_value_t = DEFAULT_MAX_WAITERS.to_string())]
    pub max_waiters: String,
    /// Largest gRPC message received or sent, in bytes (larger requests fail OUT_OF_RANGE).
    #[arg(long, env = "BATON_MAX_MESSAGE_SIZE", default_value_t = DEFAULT_MAX_MESSAGE_BYTES.to_string())]
    pub max_message_size: String,
    /// Client connections open at once (TCP and socket together); past it new ones wait.
    #[arg(long, env = "BATON_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS.to_string())]
    pub max_connections: String,
    /// Time a new connection has for its TLS handshake, then for its HTTP/2 preface (e.g. 10s).
    #[arg(long, env = "BATON_HANDSHAKE_TIMEOUT", default_value = "10s")]
    pub handshake_timeout: String,
}

/// Validated serving-side security settings.
#[derive(Debug, Clone)]
pub struct ServingConfig {
    /// TLS files of the TCP listener; `None`: plaintext.
    pub tls: Option<crate::security::tls::TlsFiles>,
    /// The API token file; `None`: calls need no token.
    pub api_token_file: Option<PathBuf>,
    /// Interval between reads of the credential files; zero never rereads them.
    pub credentials_reload: Duration,
    /// Permission bits of the Unix socket.
    pub socket_mode: u32,
    /// Group id of the Unix socket; `None`: Baton's own.
    pub socket_group: Option<u32>,
    /// HTTP/2 streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Lease and election streams served at once.
    pub max_lease_streams: usize,
    /// Callers waiting at once.
    pub max_waiters: usize,
    /// Largest gRPC message received or sent, in bytes.
    pub max_message_bytes: usize,
    /// Client connections open at once.
    pub max_connections: usize,
    /// Time a new connection has for its TLS handshake, then for its HTTP/2 preface.
    pub handshake_timeout: Duration,
}

impl Default for ServingConfig {
    fn default() -> Self {
        Self {
            tls: None,
            api_token_file: None,
            credentials_reload: DEFAULT_CREDENTIALS_RELOAD,
            socket_mode: crate::security::socket::DEFAULT_MODE,
            socket_group: None,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            max_lease_streams: DEFAULT_MAX_LEASE_STREAMS,
            max_waiters: DEFAULT_MAX_WAITERS,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

/// A whole number within `range`, recording a problem otherwise.
fn count<T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy>(
    errors: &mut Vec<String>,
    what: &str,
    raw: &str,
    range: std::ops::RangeInclusive<T>,
    default: T,
) -> T {
    match raw.trim().parse::<T>() {
        Ok(n) if range.contains(&n) => n,
        _ => {
            errors.push(format!(
                "{what}: {raw:?} is not a whole number from {} to {}",
                range.start(),
                range.end()
            ));
            default
        }
    }
}

impl ServingConfig {
    /// Validates the raw arguments (reading the TLS and token files), recording every problem
    /// in `errors`; `tcp` says whether Baton listens on TCP (TLS needs it).
    pub fn from_args(args: &ServingArgs, tcp: bool, errors: &mut Vec<String>) -> Self {
        let (cert, key, client_ca) = (
            file_flag(errors, "--tls-cert / BATON_TLS_CERT", &args.tls_cert),
            file_flag(errors, "--tls-key / BATON_TLS_KEY", &args.tls_key),
            file_flag(
                errors,
                "--tls-client-ca / BATON_TLS_CLIENT_CA",
                &args.tls_client_ca,
            ),
        );
        // An empty TLS flag is reported above; it does not also count as a missing one.
        let empty = |v: &Option<String>| v.as_deref().is_some_and(|v| v.trim().is_empty());
        let any_empty = empty(&args.tls_cert) || empty(&args.tls_key) || empty(&args.tls_client_ca);
        let tls = match (cert, key) {
            (Some(cert), Some(key)) => Some(crate::security::tls::TlsFiles {
                cert,
                key,
                client_ca,
            }),
            _ if any_empty => None,
            (None, None) => {
                if client_ca.is_some() {
                    errors.push(
                        "--tls-client-ca / BATON_TLS_CLIENT_CA: mutual TLS needs --tls-cert and \
                         --tls-key too"
                            .to_owned(),
                    );
                }
                None
            }
            _ => {
                errors.push(
                    "--tls-cert / --tls-key: give both (the certificate chain and its key) or \
                     neither"
                        .to_owned(),
                );
                None
            }
        };
        if tls.is_some() && !tcp {
            errors.push(
                "--tls-cert / BATON_TLS_CERT: TLS is served on the TCP listener, and --listen is \
                 empty"
                    .to_owned(),
            );
        }
        let api_token_file = file_flag(
            errors,
            "--api-token-file / BATON_API_TOKEN_FILE",
            &args.api_token_file,
        );
        errors.extend(crate::security::check_files(
            tls.as_ref(),
            api_token_file.as_deref(),
        ));
        let credentials_reload = reload_interval(
            errors,
            "--credentials-reload / BATON_CREDENTIALS_RELOAD",
            &args.credentials_reload,
        );
        let socket_mode = crate::security::socket::mode(&args.socket_mode).unwrap_or_else(|e| {
            errors.push(format!("--socket-mode / BATON_SOCKET_MODE: {e}"));
            crate::security::socket::DEFAULT_MODE
        });
        let socket_group = match args.socket_group.trim() {
            "" => None,
            spec => match crate::security::socket::group(spec) {
                Ok(gid) => Some(gid),
                Err(e) => {
                    errors.push(format!("--socket-group / BATON_SOCKET_GROUP: {e}"));
                    None
                }
            },
        };
        let max_concurrent_streams = count(
            errors,
            "--max-concurrent-streams / BATON_MAX_CONCURRENT_STREAMS",
            &args.max_concurrent_streams,
            1..=1_000_000,
            DEFAULT_MAX_CONCURRENT_STREAMS,
        );
        let max_lease_streams = count(
            errors,
            "--max-lease-streams / BATON_MAX_LEASE_STREAMS",
            &args.max_lease_streams,
            1..=1_000_000,
            DEFAULT_MAX_LEASE_STREAMS,
        );
        let max_waiters = count(
            errors,
            "--max-waiters / BATON_MAX_WAITERS",
            &args.max_waiters,
            1..=1_000_000,
            DEFAULT_MAX_WAITERS,
        );
        let max_message_bytes = count(
            errors,
            "--max-message-size / BATON_MAX_MESSAGE_SIZE",
            &args.max_message_size,
            1024..=MAX_MAX_MESSAGE_BYTES,
            DEFAULT_MAX_MESSAGE_BYTES,
        );
        let max_connections = count(
            errors,
            "--max-connections / BATON_MAX_CONNECTIONS",
            &args.max_connections,
            1..=1_000_000,
            DEFAULT_MAX_CONNECTIONS,
        );
        let handshake_timeout = duration(
            errors,
            "--handshake-timeout / BATON_HANDSHAKE_TIMEOUT",
            &args.handshake_timeout,
            Duration::from_millis(100),
            Duration::from_secs(600),
        );
        Self {
            tls,
            api_token_file,
            credentials_reload,
            socket_mode,
            socket_group,
            max_concurrent_streams,
            max_lease_streams,
            max_waiters,
            max_message_bytes,
            max_connections,
            handshake_timeout,
        }
    }

    /// The settings as `(setting, value)` pairs for the startup log line (paths, never
    /// contents).
    pub fn summary(&self) -> Vec<(&'static str, String)> {
        let path =
            |p: Option<&std::path::Path>| p.map_or("none".to_owned(), |p| p.display().to_string());
        let show = |d: Duration| humantime::format_duration(d).to_string();
        vec![
            (
                "tls_cert",
                path(self.tls.as_ref().map(|t| t.cert.as_path())),
            ),
            (
                "tls_client_ca",
                path(self.tls.as_ref().and_then(|t| t.client_ca.as_deref())),
            ),
            ("api_token_file", path(self.api_token_file.as_deref())),
            ("credentials_reload", show(self.credentials_reload)),
            ("socket_mode", format!("{:04o}", self.socket_mode)),
            (
                "socket_group",
                self.socket_group
                    .map_or("none".to_owned(), |g| g.to_string()),
            ),
            (
                "max_concurrent_streams",
                self.max_concurrent_streams.to_string(),
            ),
            ("max_lease_streams", self.max_lease_streams.to_string()),
            ("max_waiters", self.max_waiters.to_string()),
            ("max_message_size", self.max_message_bytes.to_string()),
            ("max_connections", self.max_connections.to_string()),
            ("handshake_timeout", show(self.handshake_timeout)),
        ]
    }
}
