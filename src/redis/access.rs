//! How Baton proves who it is to Redis and checks who Redis is: the ACL user
//! (`--redis-username`), the password (`--redis-password-file`) and TLS (`rediss://` URLs with
//! `--redis-tls-ca`, `--redis-tls-cert`/`--redis-tls-key` for mutual TLS, or
//! `--redis-tls-insecure`).
//!
//! Every connection Baton opens (the command pools, each Cluster master's pool, the Sentinel
//! queries and the master they name, the pub/sub subscriber's connections) takes its user,
//! password and TLS settings from [`Access::snapshot`] at the moment it connects. The files are
//! looked at then (a `stat`, no read while they are unchanged) and read again when they changed,
//! so a rotated Kubernetes Secret — a new password, a renewed certificate — is used by the next
//! connection without a restart, while open connections keep what they authenticated with. A
//! changed file that cannot be used (empty, not PEM, too large, a key that does not match its
//! certificate) is refused with a warning, and the last good content stays in use.
//!
//! TLS goes through rustls with ring, no OpenSSL. Without `--redis-tls-ca` the servers'
//! certificates must chain to Mozilla's public roots, compiled into Baton (the image has no
//! system store); with it, to that bundle only.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, MutexGuard},
};

use bb8_redis::redis::{
    self, ClientTlsConfig, ConnectionAddr, ConnectionInfo, RedisError, TlsCertificates,
};
use rustls::pki_types::{CertificateDer, pem::PemObject as _};

use crate::{
    config::{MAX_PASSWORD_FILE_BYTES, MAX_TLS_FILE_BYTES, RedisAccess, RedisTls},
    files::read_bounded,
};

/// What tells a file's content changed without reading it: a rewrite in place, or a Kubernetes
/// Secret update (a symlink swapped to a new file), changes at least one of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// The stamp of the file `path` leads to (symlinks followed).
fn stamp(path: &Path) -> Result<Stamp, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(Stamp {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        ctime: (meta.ctime(), meta.ctime_nsec()),
    })
}

/// Reads a Redis password file: at most [`MAX_PASSWORD_FILE_BYTES`], UTF-8, one line (a final
/// line break is not part of the password), not empty. Errors never quote the content.
pub fn read_password(path: &Path) -> Result<String, String> {
    let bytes = read_bounded(path, MAX_PASSWORD_FILE_BYTES)?;
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
    let password = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    if password.is_empty() {
        return Err(format!("{} holds no password", path.display()));
    }
    if password.chars().any(char::is_control) {
        return Err(format!(
            "{} holds more than one line or a control character",
            path.display()
        ));
    }
    Ok(password.to_owned())
}

/// The certificates of a PEM file: at least one, each well formed.
fn read_certificates(path: &Path) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), String> {
    let pem = read_bounded(path, MAX_TLS_FILE_BYTES)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            format!(
                "{} is not a PEM certificate file: {}",
                path.display(),
                crate::security::tls::pem_problem(&e)
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok((pem, certs))
}

/// The TLS material read from the `--redis-tls-*` files, checked as rustls will use it.
#[derive(Clone)]
struct TlsMaterial {
    /// The PEM files, as the redis crate's Sentinel client takes them.
    certificates: TlsCertificates,
    /// A `rediss://` address carrying the parsed parameters, whose `tls_params` every TLS
    /// address gets (the redis crate does not name their type).
    template: ConnectionAddr,
}

/// Reads and checks the CA bundle and the client certificate and key of `tls`; `None` when
/// neither is given (the compiled-in roots, no client certificate). Each problem names its flag.
fn read_tls(tls: &RedisTls) -> Result<Option<TlsMaterial>, Vec<String>> {
    let mut problems = Vec::new();
    let mut roots = rustls::RootCertStore::empty();
    let root_cert = match &tls.ca {
        None => None,
        Some(path) => match read_certificates(path) {
            Ok((pem, certs)) => {
                for cert in certs {
                    if let Err(e) = roots.add(cert) {
                        problems.push(format!(
                            "--redis-tls-ca / BATON_REDIS_TLS_CA: {} holds a certificate that \
                             cannot be a trust anchor: {e}",
                            path.display()
                        ));
                        break;
                    }
                }
                Some(pem)
            }
            Err(e) => {
                problems.push(format!("--redis-tls-ca / BATON_REDIS_TLS_CA: {e}"));
                None
            }
        },
    };
    let client_tls = match (&tls.cert, &tls.key) {
        (None, None) => None,
        (Some(_), None) => {
            problems.push(
                "--redis-tls-cert / BATON_REDIS_TLS_CERT: needs --redis-tls-key, its private key"
                    .to_owned(),
            );
            None
        }
        (None, Some(_)) => {
            problems.push(
                "--redis-tls-key / BATON_REDIS_TLS_KEY: needs --redis-tls-cert, the certificate \
                 it is the key of"
                    .to_owned(),
            );
            None
        }
        (Some(cert_path), Some(key_path)) => {
            let chain = read_certificates(cert_path).map_err(|e| {
                problems.push(format!("--redis-tls-cert / BATON_REDIS_TLS_CERT: {e}"));
            });
            let key = read_bounded(key_path, MAX_TLS_FILE_BYTES)
                .and_then(|pem| {
                    let key = crate::security::tls::private_key(&pem)
                        .map_err(|e| format!("{}: {e}", key_path.display()))?;
                    Ok((pem, key))
                })
                .map_err(|e| problems.push(format!("--redis-tls-key / BATON_REDIS_TLS_KEY: {e}")));
            match (chain, key) {
                (Ok((cert_pem, chain)), Ok((key_pem, key))) => {
                    // The checks rustls makes when a connection is set up, made now: a key it
                    // cannot use, or one that is not the certificate's.
                    match crate::security::tls::certified_key(chain, key) {
                        Ok(_) => Some(ClientTlsConfig {
                            client_cert: cert_pem,
                            client_key: key_pem,
                        }),
                        Err(e) => {
                            problems.push(format!(
                                "--redis-tls-key / BATON_REDIS_TLS_KEY: {} {e} (--redis-tls-cert \
                                 {})",
                                key_path.display(),
                                cert_path.display()
                            ));
                            None
                        }
                    }
                }
                _ => None,
            }
        }
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    if root_cert.is_none() && client_tls.is_none() {
        return Ok(None);
    }
    let certificates = TlsCertificates {
        client_tls,
        root_cert,
    };
    let template = redis::Client::build_with_tls("rediss://localhost", certificates.clone())
        .map_err(|e| vec![format!("--redis-tls-* / BATON_REDIS_TLS_*: {e}")])?
        .get_connection_info()
        .addr()
        .clone();
    Ok(Some(TlsMaterial {
        certificates,
        template,
    }))
}

/// A file's content as last read, and the stamp it had then.
struct Watched<T> {
    stamps: Vec<Option<Stamp>>,
    value: T,
    /// The stamps of the last change refused, so that it is warned about once.
    refused: Option<Vec<Option<Stamp>>>,
}

/// The settings every connection takes, as of one moment. Cheap to clone.
#[derive(Clone)]
pub struct Snapshot {
    /// Bumped each time a file's new content is taken: a Sentinel client built from an older
    /// snapshot is built again.
    pub generation: u64,
    username: Option<Arc<str>>,
    password: Option<Arc<str>>,
    tls: Option<TlsMaterial>,
    insecure: bool,
}

impl Snapshot {
    /// `info` with this snapshot's user and password (when given: a URL's own are kept
    /// otherwise) and, for a `rediss://` address, its TLS parameters.
    pub fn apply(&self, info: ConnectionInfo) -> ConnectionInfo {
        let mut redis = info.redis_settings().clone();
        if let Some(user) = &self.username {
            redis = redis.set_username(&**user);
        }
        if let Some(password) = &self.password {
            redis = redis.set_password(&**password);
        }
        let addr = match info.addr().clone() {
            ConnectionAddr::TcpTls { host, port, .. } => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: self.insecure,
                tls_params: match self.tls.as_ref().map(|t| &t.template) {
                    Some(ConnectionAddr::TcpTls { tls_params, .. }) => tls_params.clone(),
                    _ => None,
                },
            },
            other => other,
        };
        info.set_addr(addr).set_redis_settings(redis)
    }

    /// The user and password given by flags, for the Sentinels; `None` for each not given.
    pub fn credentials(&self) -> (Option<&str>, Option<&str>) {
        (self.username.as_deref(), self.password.as_deref())
    }

    /// The PEM files of `--redis-tls-ca` and `--redis-tls-cert`/`--redis-tls-key`, if given.
    pub fn certificates(&self) -> Option<&TlsCertificates> {
        self.tls.as_ref().map(|t| &t.certificates)
    }

    /// Whether server certificates go unverified (`--redis-tls-insecure`).
    pub fn insecure(&self) -> bool {
        self.insecure
    }
}

/// The user, password and TLS settings of every connection, re-read when their files change.
pub struct Access {
    password_file: Option<PathBuf>,
    tls_files: [Option<PathBuf>; 3],
    state: Mutex<State>,
}

struct State {
    current: Snapshot,
    password: Option<Watched<Arc<str>>>,
    tls: Option<Watched<Option<TlsMaterial>>>,
}

impl Access {
    /// Reads and checks every file of `config` now; each problem names its flag. Also makes
    /// ring rustls's crypto provider for the process.
    pub fn load(config: &RedisAccess) -> Result<Self, Vec<String>> {
        // Another part of Baton may have installed the same provider first.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut problems = Vec::new();
        let password = match &config.password_file {
            None => None,
            Some(path) => match stamp(path).and_then(|s| Ok((s, read_password(path)?))) {
                Ok((stamp, password)) => Some(Watched {
                    stamps: vec![Some(stamp)],
                    value: Arc::<str>::from(password),
                    refused: None,
                }),
                Err(e) => {
                    problems.push(format!(
                        "--redis-password-file / BATON_REDIS_PASSWORD_FILE: {e}"
                    ));
                    None
                }
            },
        };
        let tls_files = [
            config.tls.ca.clone(),
            config.tls.cert.clone(),
            config.tls.key.clone(),
        ];
        let stamps: Vec<Option<Stamp>> = tls_files
            .iter()
            .map(|f| f.as_deref().and_then(|p| stamp(p).ok()))
            .collect();
        let tls = match read_tls(&config.tls) {
            Ok(material) => Some(Watched {
                stamps,
                value: material,
                refused: None,
            }),
            Err(more) => {
                problems.extend(more);
                None
            }
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        let current = Snapshot {
            generation: 0,
            username: config.username.as_deref().map(Arc::from),
            password: password.as_ref().map(|w| w.value.clone()),
            tls: tls.as_ref().and_then(|w| w.value.clone()),
            insecure: config.tls.insecure,
        };
        Ok(Self {
            password_file: config.password_file.clone(),
            tls_files,
            state: Mutex::new(State {
                current,
                password,
                tls,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Only whole values are swapped under this lock: a panic leaves nothing half done.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The settings for a connection opened now, after taking the new content of any file that
    /// changed (and can be used).
    pub fn snapshot(&self) -> Snapshot {
        let mut state = self.state();
        let mut changed = false;
        if let (Some(path), Some(watched)) = (&self.password_file, state.password.as_mut()) {
            let stamps = vec![stamp(path).ok()];
            if stamps != watched.stamps {
                match read_password(path) {
                    Ok(password) => {
                        watched.value = Arc::from(password);
                        watched.stamps = stamps;
                        watched.refused = None;
                        changed = true;
                        tracing::info!(file = %path.display(), "the Redis password file changed; new Redis connections use the new password");
                    }
                    Err(e) if watched.refused.as_ref() != Some(&stamps) => {
                        watched.refused = Some(stamps);
                        tracing::warn!(error = %e, "the Redis password file changed but cannot be used; new Redis connections keep the last password read");
                    }
                    Err(_) => {}
                }
            }
        }
        if let Some(watched) = state.tls.as_mut() {
            let stamps: Vec<Option<Stamp>> = self
                .tls_files
                .iter()
                .map(|f| f.as_deref().and_then(|p| stamp(p).ok()))
                .collect();
            if stamps != watched.stamps {
                let tls = RedisTls {
                    ca: self.tls_files[0].clone(),
                    cert: self.tls_files[1].clone(),
                    key: self.tls_files[2].clone(),
                    insecure: false,
                };
                match read_tls(&tls) {
                    Ok(material) => {
                        watched.value = material;
                        watched.stamps = stamps;
                        watched.refused = None;
                        changed = true;
                        tracing::info!(
                            "the Redis TLS files changed; new Redis connections use them"
                        );
                    }
                    Err(problems) if watched.refused.as_ref() != Some(&stamps) => {
                        watched.refused = Some(stamps);
                        tracing::warn!(error = %problems.join("; "), "the Redis TLS files changed but cannot be used; new Redis connections keep the last ones read");
                    }
                    Err(_) => {}
                }
            }
        }
        if changed {
            let password = state.password.as_ref().map(|w| w.value.clone());
            let tls = state.tls.as_ref().and_then(|w| w.value.clone());
            let current = &mut state.current;
            current.generation += 1;
            current.password = password;
            current.tls = tls;
        }
        state.current.clone()
    }
}

/// Why a connection failed in its TLS handshake (a certificate not trusted, not for this host,
/// expired, refused by the server, or a server not speaking TLS), from the rustls error under
/// `e`; `None` for any other failure.
pub fn tls_failure(e: &RedisError) -> Option<String> {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    // The redis crate keeps the I/O error behind an `Arc`, and an I/O error does not give the
    // error it wraps as its `source`: both are unwrapped by hand.
    fn tls<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(shared) = err.downcast_ref::<Shared>() {
            return tls(&**shared);
        }
        err.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .and_then(|inner| tls(inner))
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(found) = tls(err) {
            return Some(found.to_string());
        }
        source = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(url: &str) -> ConnectionInfo {
        redis::IntoConnectionInfo::into_connection_info(url).expect("a Redis URL")
    }

    fn access(dir: &Path, password: &str, username: Option<&str>) -> Access {
        let file = dir.join("password");
        std::fs::write(&file, format!("{password}\n")).expect("writing the password");
        Access::load(&RedisAccess {
            username: username.map(str::to_owned),
            password_file: Some(file),
            tls: RedisTls::default(),
        })
        .expect("valid settings")
    }

    /// The password of the file and the user of the flag reach a TCP, a TLS and a Unix socket
    /// connection alike, the database and the address kept.
    #[test]
    fn credentials_reach_every_kind_of_connection() {
        let dir = tempfile::tempdir().expect("temp dir");
        let password = "p@ss:w/rd %?&=";
        let access = access(dir.path(), password, Some("baton"));
        let snapshot = access.snapshot();
        for url in [
            "redis://10.0.0.1:7000/3",
            "rediss://redis.example:6380/3",
            "unix:///tmp/r.sock?db=3",
        ] {
            let applied = snapshot.apply(info(url));
            assert_eq!(applied.redis_settings().password(), Some(password), "{url}");
            assert_eq!(applied.redis_settings().username(), Some("baton"), "{url}");
            assert_eq!(applied.redis_settings().db(), 3, "{url}");
            assert_eq!(applied.addr(), info(url).addr(), "{url}");
        }
        // Without flags, the URL's own user and password stay.
        let none = Access::load(&RedisAccess::default()).expect("no settings");
        let applied = none.snapshot().apply(info("redis://u:p@h:1"));
        assert_eq!(applied.redis_settings().username(), Some("u"));
        assert_eq!(applied.redis_settings().password(), Some("p"));
    }

    /// A rewritten password file is read again (once), a bad rewrite is refused and the last
    /// good password kept, and a Kubernetes-style swap (rename over the file) is seen.
    #[test]
    fn a_changed_password_file_is_read_again() {
        let dir = tempfile::tempdir().expect("temp dir");
        let access = access(dir.path(), "first", None);
        let url = info("redis://h:1");
        let first = access.snapshot();
        assert_eq!(
            first.apply(url.clone()).redis_settings().password(),
            Some("first")
        );
        assert_eq!(
            access.snapshot().generation,
            first.generation,
            "unchanged: not re-read"
        );

        let staged = dir.path().join("staged");
        std::fs::write(&staged, "second\n").expect("staging");
        std::fs::rename(&staged, dir.path().join("password")).expect("swapping");
        let second = access.snapshot();
        assert_eq!(
            second.apply(url.clone()).redis_settings().password(),
            Some("second")
        );
        assert_eq!(second.generation, first.generation + 1);

        std::fs::write(dir.path().join("password"), "").expect("emptying");
        let kept = access.snapshot();
        assert_eq!(
            kept.apply(url.clone()).redis_settings().password(),
            Some("second")
        );
        assert_eq!(kept.generation, second.generation);

        std::fs::remove_file(dir.path().join("password")).expect("removing");
        let kept = access.snapshot();
        assert_eq!(kept.apply(url).redis_settings().password(), Some("second"));
    }

    /// A failed TLS handshake is told from other connection failures however the redis crate
    /// wraps the I/O error that carries it.
    #[test]
    fn tls_failures_are_recognised() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let wrapped = RedisError::from(std::io::Error::new(std::io::ErrorKind::InvalidData, tls));
        assert_eq!(
            tls_failure(&wrapped).as_deref(),
            Some("invalid peer certificate: UnknownIssuer")
        );
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(tls_failure(&refused), None);
    }

    /// A FIFO in `dir`, which a blocking open would wait on until a writer comes.
    fn fifo(dir: &std::path::Path) -> std::path::PathBuf {
        let path = dir.join("fifo");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        path
    }

    /// Password files that cannot be used are refused, naming the file, never quoting it; a
    /// FIFO is refused without blocking on it.
    #[test]
    fn bad_password_files_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, content: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, content).expect("writing");
            path
        };
        for (path, expected) in [
            (write("empty", b"\n"), "holds no password"),
            (
                write("two-lines", b"secret\nsecret\n"),
                "more than one line",
            ),
            (write("huge", &[b'x'; 5000]), "more than the"),
            (write("binary", &[0xff, 0xfe]), "not UTF-8"),
            (dir.path().join("missing"), "cannot read"),
            (dir.path().to_owned(), "not a regular file"),
            (fifo(dir.path()), "not a regular file"),
        ] {
            let e = read_password(&path).expect_err("refused");
            assert!(e.contains(expected), "{}: {e}", path.display());
            assert!(!e.contains("secret"), "{e}");
        }
    }

    /// TLS files are checked at load: missing, not PEM, empty of certificates, a key without its
    /// certificate, or a key that is not the certificate's.
    #[test]
    fn bad_tls_files_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, content: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, content).expect("writing");
            Some(path)
        };
        let key_a = rcgen::KeyPair::generate().expect("key");
        let key_b = rcgen::KeyPair::generate().expect("key");
        let cert_a = rcgen::CertificateParams::new(vec!["baton".to_owned()])
            .expect("params")
            .self_signed(&key_a)
            .expect("certificate");
        let good_cert = write("cert.pem", cert_a.pem().as_bytes());
        let good_key = write("key.pem", key_a.serialize_pem().as_bytes());
        let other_key = write("other.pem", key_b.serialize_pem().as_bytes());
        let load = |tls: RedisTls| {
            Access::load(&RedisAccess {
                tls,
                ..RedisAccess::default()
            })
            .map(drop)
            .expect_err("refused")
            .join("\n")
        };
        let cases = [
            (
                RedisTls {
                    ca: Some(dir.path().join("nope.pem")),
                    ..RedisTls::default()
                },
                "--redis-tls-ca / BATON_REDIS_TLS_CA: cannot read",
            ),
            (
                RedisTls {
                    ca: write("text.pem", b"hello"),
                    ..RedisTls::default()
                },
                "holds no PEM certificate",
            ),
            (
                RedisTls {
                    ca: write("huge.pem", &vec![b'-'; 2 * 1024 * 1024]),
                    ..RedisTls::default()
                },
                "more than the",
            ),
            (
                RedisTls {
                    ca: Some(fifo(dir.path())),
                    ..RedisTls::default()
                },
                "not a regular file",
            ),
            (
                RedisTls {
                    cert: good_cert.clone(),
                    ..RedisTls::default()
                },
                "needs --redis-tls-key",
            ),
            (
                RedisTls {
                    cert: good_cert.clone(),
                    key: good_cert.clone(),
                    ..RedisTls::default()
                },
                "holds no private key",
            ),
            (
                RedisTls {
                    cert: good_cert.clone(),
                    key: other_key,
                    ..RedisTls::default()
                },
                "is not the key of its certificate",
            ),
        ];
        for (tls, expected) in cases {
            let problems = load(tls.clone());
            assert!(problems.contains(expected), "{tls:?}: {problems}");
        }
        Access::load(&RedisAccess {
            tls: RedisTls {
                ca: good_cert.clone(),
                cert: good_cert,
                key: good_key,
                insecure: false,
            },
            ..RedisAccess::default()
        })
        .map(drop)
        .expect("a CA, a certificate and its key are accepted");
    }
}
