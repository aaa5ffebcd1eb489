//! Serving-side security (docs/security.md): who may connect and call, and how much any caller
//! may take.
//!
//! - [`tls`]: TLS and mutual TLS on the TCP listener (rustls), reloaded when the files change.
//! - [`token`]: the API token every call but health's must carry.
//! - [`guard`]: the tower layer that checks the token and bounds the open lease streams.
//! - [`listen`]: accepting connections: the connection bound, TLS handshakes, the handshake and
//!   preface deadline.
//! - [`socket`]: the Unix socket, created with its final mode and group.
//! - [`files`]: credential files read with a bound and reloaded when they change.
//!
//! The health listener (`--health-listen`) and the metrics endpoint stay plaintext and need no
//! token: they answer only health and metrics.

pub mod files;
pub mod guard;
pub mod listen;
pub mod socket;
pub mod tls;
pub mod token;

use std::path::Path;

use tokio::net::{TcpListener, UnixListener, UnixStream};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::config::ServingConfig;

use self::{
    files::Source,
    guard::Guard,
    listen::{Admission, Conn, TcpConn},
    tls::{Tls, TlsFiles, TlsSource},
    token::{ApiToken, TokenSource},
};

/// A setting or a file Baton cannot run with, found at start (`baton serve` exits 2 on it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Reads and checks the credential files named by the configuration without putting them in
/// force: every problem, one line each.
pub fn check_files(tls: Option<&TlsFiles>, token: Option<&Path>) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(files) = tls {
        let read = |path: &Path| crate::files::read_bounded(path, tls::MAX_PEM_FILE_BYTES);
        let loaded = (|| {
            let cert = read(&files.cert)?;
            let key = read(&files.key)?;
            let ca = files.client_ca.as_deref().map(read).transpose()?;
            tls::server_config(files, &cert, &key, ca.as_deref()).map(|_| ())
        })();
        if let Err(e) = loaded {
            problems.push(format!("--tls-cert / --tls-key / --tls-client-ca: {e}"));
        }
    }
    if let Some(path) = token {
        let parsed =
            crate::files::read_bounded(path, token::MAX_TOKEN_FILE_BYTES).and_then(|bytes| {
                token::Tokens::parse(&bytes, &path.display().to_string()).map(|_| ())
            });
        if let Err(e) = parsed {
            problems.push(format!("--api-token-file / BATON_API_TOKEN_FILE: {e}"));
        }
    }
    problems
}

/// The serving-side security of a running Baton: the TLS configuration and the API token in
/// force (reloaded while it serves), the guard layer and the connection admission.
pub struct Serving {
    tls: Option<Tls>,
    guard: Guard,
    admission: Admission,
}

impl Serving {
    /// Loads the credential files of `config` and watches them until `shutdown`; a file that
    /// does not load is a [`Refused`] error.
    pub fn start(config: &ServingConfig, shutdown: CancellationToken) -> Result<Self, Refused> {
        let tls = config.tls.clone().map(Tls::new);
        let token = config.api_token_file.clone().map(ApiToken::new);
        let mut sources: Vec<Box<dyn Source>> = Vec::new();
        if let Some(tls) = &tls {
            sources.push(Box::new(TlsSource::new(tls.clone())));
        }
        if let Some(token) = &token {
            sources.push(Box::new(TokenSource::new(token.clone())));
        }
        files::load_and_watch(sources, config.credentials_reload, shutdown).map_err(Refused)?;
        Ok(Self {
            tls,
            guard: Guard::new(token, config.max_lease_streams),
            admission: Admission::new(config.max_connections, config.handshake_timeout),
        })
    }

    /// Whether the TCP listener serves TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The layer every API call passes first.
    pub fn guard(&self) -> Guard {
        self.guard.clone()
    }

    /// The connections of the TCP listener (over TLS if configured).
    pub fn tcp(
        &self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> ReceiverStream<std::io::Result<Conn<TcpConn>>> {
        listen::tcp(listener, self.tls.clone(), self.admission.clone(), shutdown)
    }

    /// The connections of the Unix socket.
    pub fn unix(
        &self,
        listener: UnixListener,
        shutdown: CancellationToken,
    ) -> ReceiverStream<std::io::Result<Conn<UnixStream>>> {
        listen::unix(listener, self.admission.clone(), shutdown)
    }
}
