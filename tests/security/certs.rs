//! Certificates made for the tests (`rcgen`), and TLS clients: a gRPC channel over TLS and a
//! bare handshake that reports the server's certificate.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};
use tonic::transport::{Channel, Endpoint};

/// A certificate authority.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM-encoded.
#[derive(Clone)]
pub struct Leaf {
    /// The certificate (PEM).
    pub cert: String,
    /// Its private key (PEM).
    pub key: String,
}

impl Leaf {
    /// The certificate in DER, as a TLS peer sends it.
    pub fn der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(self.cert.as_bytes()).expect("a PEM certificate")
    }

    /// Writes the certificate and key into `dir` as `NAME.crt` and `NAME.key`.
    pub fn write(&self, dir: &std::path::Path, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, &self.cert).expect("writing a certificate");
        std::fs::write(&key, &self.key).expect("writing a key");
        (cert, key)
    }
}

impl Ca {
    /// A new CA named `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("a CA key");
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).expect("a CA certificate"),
        }
    }

    /// The CA's certificate (PEM).
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    fn leaf(&self, name: &str, usage: ExtendedKeyUsagePurpose, expired: bool) -> Leaf {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("leaf params");
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().expect("address")));
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 2);
        }
        let key = KeyPair::generate().expect("a leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("signing");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// A server certificate for `localhost` and 127.0.0.1.
    pub fn server(&self, name: &str) -> Leaf {
        self.leaf(name, ExtendedKeyUsagePurpose::ServerAuth, false)
    }

    /// A client certificate.
    pub fn client(&self, name: &str) -> Leaf {
        self.leaf(name, ExtendedKeyUsagePurpose::ClientAuth, false)
    }

    /// An X.509 v1 client certificate (no extensions) issued by this CA, made with `openssl`
    /// (`openssl x509 -req` without extensions writes v1; rcgen writes only v3).
    pub fn v1_client(&self, name: &str) -> Leaf {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = |n: &str| dir.path().join(n);
        std::fs::write(path("ca.crt"), self.pem()).expect("writing the CA");
        std::fs::write(path("ca.key"), self.issuer.key().serialize_pem()).expect("writing");
        let openssl = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("openssl runs (it is installed on every machine of the project)");
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "v1.key",
            "-subj",
            &format!("/CN={name}"),
            "-out",
            "v1.csr",
        ]);
        openssl(&[
            "x509", "-req", "-in", "v1.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-days", "2",
            "-out", "v1.crt",
        ]);
        Leaf {
            cert: std::fs::read_to_string(path("v1.crt")).expect("the certificate"),
            key: std::fs::read_to_string(path("v1.key")).expect("the key"),
        }
    }

    /// A client certificate that expired in 2020.
    pub fn expired_client(&self, name: &str) -> Leaf {
        self.leaf(name, ExtendedKeyUsagePurpose::ClientAuth, true)
    }
}

fn client_config(roots: &[&Ca], identity: Option<&Leaf>) -> Arc<rustls::ClientConfig> {
    let mut store = rustls::RootCertStore::empty();
    for ca in roots {
        store
            .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).expect("CA PEM"))
            .expect("adding a root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(store);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        // Presented as it is, unchecked: rustls refuses to present a certificate it cannot
        // parse (an X.509 v1 one) through `with_client_auth_cert`.
        Some(leaf) => builder.with_client_cert_resolver(Arc::new(Presents(Arc::new(
            rustls::sign::CertifiedKey::new(
                vec![leaf.der()],
                rustls::crypto::ring::default_provider()
                    .key_provider
                    .load_private_key(
                        PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key PEM"),
                    )
                    .expect("a client key"),
            ),
        )))),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// A client identity presented to every server that asks for one.
#[derive(Debug)]
struct Presents(Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for Presents {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A TLS handshake with `addr` trusting `roots` (presenting `identity` if given), within 5 s.
pub async fn handshake(
    addr: SocketAddr,
    roots: &[&Ca],
    identity: Option<&Leaf>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let connector = TlsConnector::from(client_config(roots, identity));
    let attempt = async {
        let tcp = TcpStream::connect(addr).await?;
        let name = ServerName::try_from("localhost").expect("a server name");
        connector.connect(name, tcp).await
    };
    tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

/// The certificate the server at `addr` presents to a new connection (trusting `roots`).
pub async fn server_cert(
    addr: SocketAddr,
    roots: &[&Ca],
) -> std::io::Result<CertificateDer<'static>> {
    let stream = handshake(addr, roots, None).await?;
    let (_, session) = stream.get_ref();
    Ok(session
        .peer_certificates()
        .and_then(|c| c.first())
        .expect("the server presents a certificate")
        .clone()
        .into_owned())
}

/// A gRPC channel to `addr` over TLS, trusting `roots` and presenting `identity` if given.
pub async fn tls_channel(
    addr: SocketAddr,
    roots: &[&Ca],
    identity: Option<&Leaf>,
) -> Result<Channel, tonic::transport::Error> {
    let connector = TlsConnector::from(client_config(roots, identity));
    Endpoint::from_shared(format!("http://localhost:{}", addr.port()))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            async move {
                let tcp = TcpStream::connect(addr).await?;
                let name = ServerName::try_from("localhost").expect("a server name");
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
}
