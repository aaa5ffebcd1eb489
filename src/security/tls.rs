//! TLS on the gRPC TCP listener, with rustls (the ring provider): the server's certificate chain
//! and key, and with a client CA, mutual TLS. The configuration in force is swapped whole when
//! the files change ([`super::files`]): handshakes after the swap use the new files, connections
//! already open keep the session they negotiated.
//!
//! Mutual TLS is checked once the handshake is done rather than during it. With TLS 1.3 a client
//! finishes its handshake before the server has checked its certificate, so a refusal during the
//! handshake reaches it as an alert after the fact, which stock clients report as a corrupted
//! record or a reset. Instead, the handshake asks for a certificate (and checks that the client
//! holds its key), then the certificate is checked against the client CA ([`Verifier::check`]):
//! a connection whose client presented none, or one that does not verify (another CA, expired),
//! is served nothing: every call on it fails `UNAUTHENTICATED` saying why
//! ([`super::guard`]).

use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
};

use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
    client::danger::HandshakeSignatureValid,
    crypto::CryptoProvider,
    server::{
        NoServerSessionStorage, WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
    sign::{CertifiedKey, SingleCertAndKey},
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime, pem::PemObject};

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

/// What is wrong with a PEM file, in words: the PEM parser shows the labels and lines it
/// quotes as lists of byte values.
pub fn pem_problem(error: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error;
    match error {
        Error::MissingSectionEnd { end_marker } => format!(
            "a section has no \"-----END {}-----\" line (is the file cut off?)",
            String::from_utf8_lossy(end_marker)
        ),
        Error::IllegalSectionStart { line } => format!(
            "a line that starts a section is malformed: {:?}",
            String::from_utf8_lossy(line)
        ),
        other => other.to_string(),
    }
}

/// Whether `pem` holds an encrypted private key: a PKCS#8 "ENCRYPTED PRIVATE KEY" block, or a
/// legacy OpenSSL one with a `Proc-Type: 4,ENCRYPTED` header.
fn encrypted_key(pem: &[u8]) -> bool {
    let has = |needle: &[u8]| pem.windows(needle.len()).any(|w| w == needle);
    has(b"-----BEGIN ENCRYPTED PRIVATE KEY-----") || has(b"Proc-Type: 4,ENCRYPTED")
}

/// The private key of a PEM key file, or why there is none, in words: an encrypted key is named
/// as such (Baton cannot decrypt it), a malformed file says what is malformed.
pub fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    if encrypted_key(pem) {
        return Err(
            "it holds an encrypted private key, which Baton does not support: give the key \
             unencrypted (e.g. `openssl pkey -in encrypted.key -out tls.key`) and protect the \
             file with its permissions"
                .to_owned(),
        );
    }
    PrivateKeyDer::from_pem_slice(pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => "it holds no private key (a PEM \
             \"PRIVATE KEY\", \"RSA PRIVATE KEY\" or \"EC PRIVATE KEY\" block)"
            .to_owned(),
        e => format!("it is not a valid PEM private key: {}", pem_problem(&e)),
    })
}

fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let mut certs = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| format!("{what} is not valid PEM: {}", pem_problem(&e)))?;
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

/// The check of client certificates against the client CA (mutual TLS).
#[derive(Debug, Clone)]
pub struct Verifier(Arc<dyn ClientCertVerifier>);

impl Verifier {
    /// Checks the certificates a client presented (`None`: it presented none): `Err` says why
    /// they are refused, in words for the client.
    pub fn check(&self, presented: Option<&[CertificateDer<'static>]>) -> Result<(), String> {
        let Some((end_entity, intermediates)) = presented.and_then(<[_]>::split_first) else {
            return Err(
                "this Baton requires a client certificate (mutual TLS) and the \
                        client presented none"
                    .to_owned(),
            );
        };
        self.0
            .verify_client_cert(end_entity, intermediates, UnixTime::now())
            .map(|_| ())
            .map_err(|e| {
                use rustls::CertificateError as Why;
                let why = match e {
                    rustls::Error::InvalidCertificate(Why::UnknownIssuer) => {
                        "it is not issued by a CA this Baton trusts".to_owned()
                    }
                    rustls::Error::InvalidCertificate(
                        Why::Expired | Why::ExpiredContext { .. },
                    ) => "it has expired".to_owned(),
                    rustls::Error::InvalidCertificate(
                        Why::NotValidYet | Why::NotValidYetContext { .. },
                    ) => "it is not valid yet".to_owned(),
                    rustls::Error::InvalidCertificate(Why::Revoked) => {
                        "it has been revoked".to_owned()
                    }
                    rustls::Error::InvalidCertificate(
                        Why::InvalidPurpose | Why::InvalidPurposeContext { .. },
                    ) => "it is not for client authentication (its extended key usage lacks \
                          clientAuth)"
                        .to_owned(),
                    rustls::Error::InvalidCertificate(
                        Why::NotValidForName | Why::NotValidForNameContext { .. },
                    ) => "it is not valid for this name".to_owned(),
                    rustls::Error::InvalidCertificate(Why::BadSignature) => {
                        "its signature does not verify".to_owned()
                    }
                    rustls::Error::InvalidCertificate(why) => {
                        match der::parse_certificate(end_entity.as_ref()).map(|c| c.version) {
                            // webpki reads only X.509 v3 certificates.
                            Some(version) if version != 3 => {
                                format!("it is X.509 v{version}; v3 is required")
                            }
                            _ => rustls::Error::InvalidCertificate(why).to_string(),
                        }
                    }
                    other => other.to_string(),
                };
                format!(
                    "the client certificate is refused ({why}): this Baton accepts only valid \
                     certificates issued by its --tls-client-ca"
                )
            })
    }
}

/// Asks clients for a certificate and checks that they hold its key, leaving the check of the
/// certificate itself to [`Verifier::check`] once the handshake is done (see the module
/// documentation).
#[derive(Debug)]
struct AskOnly {
    /// The full check, whose hints and signature checks the handshake uses.
    inner: Arc<dyn ClientCertVerifier>,
    /// The signature algorithms, for a certificate the full check cannot parse.
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl AskOnly {
    /// Checks that the client signed the handshake with the key of `cert` when the full check
    /// could not parse the certificate as it requires (an X.509 v1 one: `failed`): the key is
    /// taken from the certificate's DER, so that the handshake completes and the certificate is
    /// refused after it with a reason the client can read ([`Verifier::check`] refuses every
    /// certificate the full check cannot parse). Without a key to check, `failed` stands.
    fn signed_with_raw_key(
        &self,
        failed: rustls::Error,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
        tls13: bool,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // A signature that does not verify, or any error but one about the certificate itself,
        // stands.
        if !matches!(&failed, rustls::Error::InvalidCertificate(why)
            if *why != rustls::CertificateError::BadSignature)
        {
            return Err(failed);
        }
        let Some(spki) = der::parse_certificate(cert.as_ref()).map(|c| c.spki) else {
            return Err(failed);
        };
        // The schemes TLS 1.3 allows for a handshake signature (no PKCS#1 v1.5, no SHA-1).
        let tls13_scheme = matches!(
            dss.scheme,
            SignatureScheme::ECDSA_NISTP256_SHA256
                | SignatureScheme::ECDSA_NISTP384_SHA384
                | SignatureScheme::ECDSA_NISTP521_SHA512
                | SignatureScheme::RSA_PSS_SHA256
                | SignatureScheme::RSA_PSS_SHA384
                | SignatureScheme::RSA_PSS_SHA512
                | SignatureScheme::ED25519
                | SignatureScheme::ED448
        );
        if tls13 && !tls13_scheme {
            return Err(failed);
        }
        let Some((_, algorithms)) = self
            .algorithms
            .mapping
            .iter()
            .find(|(scheme, _)| *scheme == dss.scheme)
        else {
            return Err(failed);
        };
        // TLS 1.3 names the algorithm exactly (the first); TLS 1.2 may mean any of them.
        let algorithms = if tls13 {
            &algorithms[..algorithms.len().min(1)]
        } else {
            algorithms
        };
        let verified = algorithms
            .iter()
            .filter(|alg| alg.public_key_alg_id().as_ref() == spki.algorithm)
            .any(|alg| {
                alg.verify_signature(spki.key, message, dss.signature())
                    .is_ok()
            });
        if verified {
            Ok(HandshakeSignatureValid::assertion())
        } else {
            Err(failed)
        }
    }
}

impl ClientCertVerifier for AskOnly {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Checked after the handshake, with a refusal the client can read.
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner
            .verify_tls12_signature(message, cert, dss)
            .or_else(|e| self.signed_with_raw_key(e, message, cert, dss, false))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner
            .verify_tls13_signature(message, cert, dss)
            .or_else(|e| self.signed_with_raw_key(e, message, cert, dss, true))
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A configuration in force: the server's, and the client certificate check if mutual.
#[derive(Clone)]
pub struct InForce {
    /// The rustls server configuration.
    pub config: Arc<ServerConfig>,
    /// The check of client certificates, with mutual TLS.
    pub verifier: Option<Verifier>,
}

/// Why a private key cannot be used with a certificate chain.
#[derive(Debug)]
pub enum KeyProblem {
    /// The key is of a type or size the TLS implementation cannot sign with.
    Unusable(rustls::Error),
    /// The key is not the one the chain's first certificate names.
    Mismatch(rustls::Error),
}

impl std::fmt::Display for KeyProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unusable(e) => write!(
                f,
                "is a key Baton cannot sign with (RSA of 2048 bits or more, ECDSA P-256 or \
                 P-384, and Ed25519 work): {e}"
            ),
            Self::Mismatch(e) => write!(f, "is not the key of its certificate: {e}"),
        }
    }
}

/// The chain and its key as TLS uses them, checked as a handshake would: a key that can sign,
/// whose public half is the first certificate's.
pub fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, KeyProblem> {
    let signing = provider()
        .key_provider
        .load_private_key(key)
        .map_err(KeyProblem::Unusable)?;
    let certified = CertifiedKey::new(chain, signing);
    // A key whose public half cannot be told is refused too.
    certified.keys_match().map_err(KeyProblem::Mismatch)?;
    Ok(certified)
}

/// Builds the server configuration from the contents of the certificate chain, the key and the
/// client CA files; every error names the file and what is wrong with it.
pub fn server_config(
    files: &TlsFiles,
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
) -> Result<InForce, String> {
    let provider = provider();
    let cert_path = files.cert.display();
    let key_path = files.key.display();
    let chain = certificates(cert, &format!("the certificate file {cert_path}"))?;
    let key = private_key(key).map_err(|e| format!("the key file {key_path}: {e}"))?;
    let certified = certified_key(chain, key).map_err(|e| match e {
        KeyProblem::Mismatch(e) => format!(
            "the key file {key_path} does not go with the certificate file {cert_path}: {e}"
        ),
        unusable => format!("the key file {key_path} {unusable}"),
    })?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let mut verifier = None;
    let builder = match (client_ca, &files.client_ca) {
        (Some(pem), Some(path)) => {
            let what = format!("the client CA file {}", path.display());
            let mut roots = RootCertStore::empty();
            for ca in certificates(pem, &what)? {
                roots
                    .add(ca)
                    .map_err(|e| format!("{what} holds a certificate that is not a CA: {e}"))?;
            }
            let algorithms = provider.signature_verification_algorithms;
            let inner = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{what}: {e}"))?;
            let checking = verifier.insert(Verifier(inner)).0.clone();
            builder.with_client_cert_verifier(Arc::new(AskOnly {
                inner: checking,
                algorithms,
            }))
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    // gRPC runs over HTTP/2 only; clients such as grpc C-core require it negotiated.
    config.alpn_protocols = vec![b"h2".to_vec()];
    // No resumed sessions: every connection presents its certificate, checked then.
    config.session_storage = Arc::new(NoServerSessionStorage {});
    Ok(InForce {
        config: Arc::new(config),
        verifier,
    })
}

/// The TLS configuration in force; cheap to clone.
#[derive(Clone)]
pub struct Tls {
    files: TlsFiles,
    /// `None` until the files were first applied ([`super::files::load_and_watch`] does before
    /// serving starts).
    current: Arc<RwLock<Option<InForce>>>,
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

    /// The acceptor of new connections, with the configuration now in force and its client
    /// certificate check (`None` before the files were first applied).
    pub fn acceptor(&self) -> Option<(tokio_rustls::TlsAcceptor, Option<Verifier>)> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        current
            .clone()
            .map(|c| (tokio_rustls::TlsAcceptor::from(c.config), c.verifier))
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
        *self.tls.current.write().unwrap_or_else(|e| e.into_inner()) = Some(config);
        Ok(())
    }
}

/// What a failed handshake says, in words an operator can act on.
pub fn handshake_failure(error: &std::io::Error) -> String {
    match error
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
    {
        Some(tls) => format!("TLS handshake failed: {tls}"),
        None => format!("the connection failed during the TLS handshake: {error}"),
    }
}

/// Just enough DER to read a certificate the full check cannot parse (an X.509 v1 one): its
/// version and its public key.
mod der {
    /// What is read of a certificate.
    pub struct Certificate<'a> {
        /// The X.509 version: 1, 2 or 3.
        pub version: u64,
        /// The subject's public key.
        pub spki: Spki<'a>,
    }

    /// A SubjectPublicKeyInfo.
    pub struct Spki<'a> {
        /// The contents of its AlgorithmIdentifier (the OID and parameters, without the
        /// SEQUENCE header), as signature algorithms name the key type they take.
        pub algorithm: &'a [u8],
        /// The key (the BIT STRING's bits).
        pub key: &'a [u8],
    }

    /// One element: its tag, its contents and what follows it.
    fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = input.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = match first {
            0..=0x7f => (usize::from(first), rest),
            0x81..=0x84 => {
                let n = usize::from(first & 0x7f);
                let (bytes, rest) = (rest.get(..n)?, rest.get(n..)?);
                (
                    bytes
                        .iter()
                        .fold(0usize, |len, &b| (len << 8) | usize::from(b)),
                    rest,
                )
            }
            _ => return None,
        };
        Some((tag, rest.get(..len)?, rest.get(len..)?))
    }

    /// The contents of an element with tag `tag`, and what follows it.
    fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
        let (found, contents, rest) = element(input)?;
        (found == tag).then_some((contents, rest))
    }

    const SEQUENCE: u8 = 0x30;
    const INTEGER: u8 = 0x02;
    const BIT_STRING: u8 = 0x03;
    const VERSION: u8 = 0xa0;

    /// Reads a DER certificate, or `None` if it is not one.
    pub fn parse_certificate(der: &[u8]) -> Option<Certificate<'_>> {
        let (certificate, _) = expect(der, SEQUENCE)?;
        let (tbs, _) = expect(certificate, SEQUENCE)?;
        // The version is explicit only for v2 and v3 (0 means v1).
        let (version, tbs) = match expect(tbs, VERSION) {
            Some((explicit, rest)) => {
                let (value, _) = expect(explicit, INTEGER)?;
                let number = match value {
                    [n @ 0..=2] => u64::from(*n) + 1,
                    _ => return None,
                };
                (number, rest)
            }
            None => (1, tbs),
        };
        let (_serial, tbs) = expect(tbs, INTEGER)?;
        let (_signature, tbs) = expect(tbs, SEQUENCE)?;
        let (_issuer, tbs) = expect(tbs, SEQUENCE)?;
        let (_validity, tbs) = expect(tbs, SEQUENCE)?;
        let (_subject, tbs) = expect(tbs, SEQUENCE)?;
        let (spki, _) = expect(tbs, SEQUENCE)?;
        let (algorithm, spki) = expect(spki, SEQUENCE)?;
        let (bits, _) = expect(spki, BIT_STRING)?;
        let key = match bits.split_first()? {
            (0, key) => key,
            _ => return None,
        };
        Some(Certificate {
            version,
            spki: Spki { algorithm, key },
        })
    }
}
