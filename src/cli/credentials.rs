//! What the command-line client shows Baton of itself (docs/security.md, "Clients"): the API
//! token of `--api-token-file` on every call, and TLS (`--tls-ca`, `--tls-cert`/`--tls-key`,
//! `--tls-server-name`) through tonic's rustls.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use rustls_pki_types::{CertificateDer, pem::PemObject as _};
use tonic::{
    Request, Status,
    metadata::{AsciiMetadataValue, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Certificate, Channel, ClientTlsConfig, Identity},
};

use crate::{
    files::read_bounded,
    security::{tls::MAX_PEM_FILE_BYTES, token::MAX_TOKEN_FILE_BYTES},
};

use super::ClientArgs;

/// A channel to Baton that carries the API token, if one is given, on every call.
pub type Connection = InterceptedService<Channel, Credentials>;

/// Adds `authorization: Bearer <token>` to every call when `--api-token-file` is given. The
/// file is read again for each call, so a rotated token (a Kubernetes Secret updated in place)
/// is used by the next call of a long-running `baton lock` or `baton hold`; should it become
/// unreadable or empty, the last token read stays in use.
#[derive(Clone, Default)]
pub struct Credentials {
    token: Option<TokenFile>,
}

#[derive(Clone)]
struct TokenFile {
    path: PathBuf,
    header: Arc<Mutex<AsciiMetadataValue>>,
}

impl Credentials {
    /// Reads the token file of `args`, if any (an empty name is none): a missing, unreadable or
    /// empty file, or a token an HTTP header cannot carry, is an error naming the file.
    pub fn new(args: &ClientArgs) -> Result<Self, String> {
        let Some(path) = args.api_token_file.as_deref().filter(|p| !p.is_empty()) else {
            return Ok(Self::default());
        };
        let path = PathBuf::from(path);
        let header = read_token(&path)
            .map_err(|e| format!("--api-token-file / BATON_API_TOKEN_FILE: {e}"))?;
        Ok(Self {
            token: Some(TokenFile {
                path,
                header: Arc::new(Mutex::new(header)),
            }),
        })
    }
}

impl Interceptor for Credentials {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.token {
            // A poisoned lock only means another call panicked while swapping the value in: the
            // value itself is always whole.
            let mut header = token
                .header
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Ok(fresh) = read_token(&token.path) {
                *header = fresh;
            }
            request
                .metadata_mut()
                .insert("authorization", header.clone());
        }
        Ok(request)
    }
}

/// The `authorization` value for the token in `path`: its first non-empty line, trimmed.
fn read_token(path: &Path) -> Result<AsciiMetadataValue, String> {
    let bytes = read_bounded(path, MAX_TOKEN_FILE_BYTES)?;
    let text =
        std::str::from_utf8(&bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
    let token = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .ok_or_else(|| format!("{} holds no token (it is empty)", path.display()))?;
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "the token in {} holds a character that is not visible ASCII (a token must fit an \
             HTTP header)",
            path.display()
        ));
    }
    MetadataValue::try_from(format!("Bearer {token}"))
        .map_err(|e| format!("the token in {}: {e}", path.display()))
}

/// Whether any TLS option is given.
pub fn tls_asked(args: &ClientArgs) -> bool {
    args.tls_ca.is_some()
        || args.tls_cert.is_some()
        || args.tls_key.is_some()
        || args.tls_server_name.is_some()
}

/// The TLS configuration of `args`: Baton's certificate checked against `--tls-ca` (or, without
/// it, the public roots compiled into baton), the client certificate of `--tls-cert` and
/// `--tls-key` for mutual TLS, the name checked `--tls-server-name` (or the address's host).
/// Every file is read and parsed here, so a bad one is an error naming it.
pub fn tls_config(args: &ClientArgs) -> Result<ClientTlsConfig, String> {
    let mut config = ClientTlsConfig::new().assume_http2(true);
    match &args.tls_ca {
        Some(path) => {
            let pem = read_pem(path, "--tls-ca")?;
            let certs =
                certificates(&pem).map_err(|e| format!("--tls-ca {}: {e}", path.display()))?;
            if certs == 0 {
                return Err(format!(
                    "--tls-ca {}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                    path.display()
                ));
            }
            config = config.ca_certificate(Certificate::from_pem(pem));
        }
        None => config = config.with_webpki_roots(),
    }
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert_path), Some(key_path)) => {
            let cert = read_pem(cert_path, "--tls-cert")?;
            match certificates(&cert) {
                Ok(0) => {
                    return Err(format!(
                        "--tls-cert {}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                        cert_path.display()
                    ));
                }
                Ok(_) => {}
                Err(e) => return Err(format!("--tls-cert {}: {e}", cert_path.display())),
            }
            let key = read_pem(key_path, "--tls-key")?;
            let parsed = crate::security::tls::private_key(&key)
                .map_err(|e| format!("--tls-key {}: {e}", key_path.display()))?;
            // Checked now, as the handshake would, so that the error names the files.
            let chain = CertificateDer::pem_slice_iter(&cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| {
                    format!(
                        "--tls-cert {}: {}",
                        cert_path.display(),
                        crate::security::tls::pem_problem(&e)
                    )
                })?;
            crate::security::tls::certified_key(chain, parsed).map_err(|e| {
                format!(
                    "--tls-key {} {e} (--tls-cert {})",
                    key_path.display(),
                    cert_path.display()
                )
            })?;
            config = config.identity(Identity::from_pem(cert, key));
        }
        (None, None) => {}
        (Some(_), None) => return Err("--tls-cert needs --tls-key (its private key)".to_owned()),
        (None, Some(_)) => return Err("--tls-key needs --tls-cert (its certificate)".to_owned()),
    }
    if let Some(name) = &args.tls_server_name {
        if rustls_pki_types::ServerName::try_from(name.as_str()).is_err() {
            return Err(format!(
                "--tls-server-name {name:?} is not a DNS name or an IP address"
            ));
        }
        config = config.domain_name(name.clone());
    }
    Ok(config)
}

fn read_pem(path: &Path, flag: &str) -> Result<Vec<u8>, String> {
    read_bounded(path, MAX_PEM_FILE_BYTES).map_err(|e| format!("{flag}: {e}"))
}

/// How many PEM certificates `pem` holds, or why it does not parse.
fn certificates(pem: &[u8]) -> Result<usize, String> {
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| {
            format!(
                "not a PEM certificate bundle ({})",
                crate::security::tls::pem_problem(&e)
            )
        })?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(contents: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("token");
        std::fs::write(&path, contents).expect("writing the token");
        (dir, path)
    }

    /// The token is the first non-empty line, trimmed; an empty file, a token no header can
    /// carry and a missing file are refused naming the file.
    #[test]
    fn the_token_is_the_first_non_empty_line() {
        let (_dir, path) = file("\n  \n  first-token \nsecond\n");
        assert_eq!(
            read_token(&path).expect("a token").to_str().ok(),
            Some("Bearer first-token")
        );
        let (_dir, path) = file("\n \n");
        assert!(read_token(&path).unwrap_err().contains("holds no token"));
        let (_dir, path) = file("two words\n");
        assert!(read_token(&path).unwrap_err().contains("not visible ASCII"));
        let (dir, _) = file("");
        let missing = dir.path().join("missing");
        assert!(
            read_token(&missing)
                .unwrap_err()
                .contains(&missing.display().to_string())
        );
    }

    /// A token file changed on disk is used by the next call; one emptied keeps the last token.
    #[test]
    fn the_token_file_is_read_for_each_call() {
        let (_dir, path) = file("old-token\n");
        let header = |c: &mut Credentials| {
            let request = c.call(Request::new(())).expect("never refused");
            request
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let mut credentials = Credentials {
            token: Some(TokenFile {
                path: path.clone(),
                header: Arc::new(Mutex::new(read_token(&path).expect("a token"))),
            }),
        };
        assert_eq!(
            header(&mut credentials).as_deref(),
            Some("Bearer old-token")
        );
        std::fs::write(&path, "new-token\n").expect("rotating");
        assert_eq!(
            header(&mut credentials).as_deref(),
            Some("Bearer new-token")
        );
        std::fs::write(&path, "").expect("emptying");
        assert_eq!(
            header(&mut credentials).as_deref(),
            Some("Bearer new-token")
        );
        assert_eq!(header(&mut Credentials::default()), None);
    }
}
