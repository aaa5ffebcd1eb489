//! TLS on the gRPC TCP listener, with rustls (the ring provider): the server's certificate chain
//! and key, and with a client CA, mutual TLS (only clients presenting a certificate issued by
//! that CA complete the handshake). The configuration in force is swapped whole when the files
//! change ([`super::files`]): handshakes after the swap use the new files, connections already
//! open keep the session they negotiated.

use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
};

use rustls::{
    RootCertStore, ServerConfig,
    crypto::CryptoProvider,
    server::WebPkiClientVerifier,
    sign::{CertifiedKey, SingleCertAndKey},
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use super::files::Source;

/// Largest certificate, key or CA bundle file accepted, in bytes.
pub const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;
/// Most certificates accepted in a chain or a CA bundle.
pub const MAX_PEM_CERTIFICATES: usize = 1000;

/// The files of the TLS configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM), its own certificate first.
    pub cert: PathBuf,
    /// The server's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// The CA certificates (PEM) that issue the client certificates accepted; `None`: clients
    /// present none.
    pub client_ca: Option<PathBuf>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let mut certs = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("{what} is not valid PEM: {e}"))?;
        if certs.len() == MAX_PEM_CERTIFICATES {
            return Err(format!(
                "{what} holds more than {MAX_PEM_CERTIFICATES} certificates"
            ));
        }
        certs.push(cert);
    }
    if certs.is_empty() {
        return Err(format!(
            "{what} holds no certificate (a PEM \"CERTIFICATE\" block)"
        ));
    }
    Ok(certs)
}

/// Builds the server configuration from the contents of the certificate chain, the key and the
/// client CA files; every error names the file and what is wrong with it.
pub fn server_config(
    files: &TlsFiles,
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
) -> Result<ServerConfig, String> {
    let provider = provider();
    let cert_path = files.cert.display();
    let key_path = files.key.display();
    let chain = certificates(cert, &format!("the certificate file {cert_path}"))?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
        format!(
            "the key file {key_path} holds no private key (a PEM \"PRIVATE KEY\", \"RSA PRIVATE \
             KEY\" or \"EC PRIVATE KEY\" block): {e}"
        )
    })?;
    let certified = CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
        format!("the key file {key_path} does not go with the certificate file {cert_path}: {e}")
    })?;
    // `from_der` lets a key whose public half it cannot tell pass: check it here.
    certified.keys_match().map_err(|e| {
        format!("the key file {key_path} does not go with the certificate file {cert_path}: {e}")
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match (client_ca, &files.client_ca) {
        (Some(pem), Some(path)) => {
            let what = format!("the client CA file {}", path.display());
            let mut roots = RootCertStore::empty();
            for ca in certificates(pem, &what)? {
                roots
                    .add(ca)
                    .map_err(|e| format!("{what} holds a certificate that is not a CA: {e}"))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{what}: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    // gRPC runs over HTTP/2 only; clients such as grpc C-core require it negotiated.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The TLS configuration in force; cheap to clone.
#[derive(Clone)]
pub struct Tls {
    files: TlsFiles,
    /// `None` until the files were first applied ([`super::files::load_and_watch`] does before
    /// serving starts).
    current: Arc<RwLock<Option<Arc<ServerConfig>>>>,
}

impl Tls {
    /// A TLS configuration from `files`, in force once [`TlsSource`] applies them.
    pub fn new(files: TlsFiles) -> Self {
        Self {
            files,
            current: Arc::new(RwLock::new(None)),
        }
    }

    /// Whether clients must present a certificate.
    pub fn mutual(&self) -> bool {
        self.files.client_ca.is_some()
    }

    /// The acceptor of new connections, with the configuration now in force (`None` before the
    /// files were first applied).
    pub fn acceptor(&self) -> Option<tokio_rustls::TlsAcceptor> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        current.clone().map(tokio_rustls::TlsAcceptor::from)
    }

    /// The paths read, in the order [`Source::apply`] takes them.
    fn all_paths(files: &TlsFiles) -> Vec<PathBuf> {
        let mut paths = vec![files.cert.clone(), files.key.clone()];
        paths.extend(files.client_ca.clone());
        paths
    }
}

/// The TLS files as a watched [`Source`].
pub struct TlsSource {
    tls: Tls,
    paths: Vec<PathBuf>,
}

impl TlsSource {
    /// Watches the files of `tls`, putting each valid change in force.
    pub fn new(tls: Tls) -> Self {
        let paths = Tls::all_paths(&tls.files);
        Self { tls, paths }
    }
}

impl Source for TlsSource {
    fn what(&self) -> &'static str {
        "TLS certificate"
    }

    fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    fn max_bytes(&self) -> u64 {
        MAX_PEM_FILE_BYTES
    }

    fn apply(&self, contents: &[Vec<u8>]) -> Result<(), String> {
        let [cert, key, rest @ ..] = contents else {
            return Err("the certificate and key files were not read".to_owned());
        };
        let config = server_config(&self.tls.files, cert, key, rest.first().map(Vec::as_slice))?;
        *self.tls.current.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(config));
        Ok(())
    }
}

/// What a failed handshake says about the client, in words an operator can act on.
pub fn handshake_failure(error: &std::io::Error, mutual: bool) -> String {
    let Some(tls) = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    else {
        return format!("the connection failed during the TLS handshake: {error}");
    };
    match tls {
        rustls::Error::NoCertificatesPresented if mutual => {
            "the client presented no certificate; mutual TLS (--tls-client-ca) requires one"
                .to_owned()
        }
        rustls::Error::InvalidCertificate(why) => {
            format!("the client's certificate was refused: {why:?}")
        }
        other => format!("TLS handshake failed: {other}"),
    }
}
