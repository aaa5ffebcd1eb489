//! Redis over TLS for the tests, with certificates made in the test (rcgen):
//!
//! - [`Pki`]: a CA, a server certificate for `localhost` and `127.0.0.1`, a client certificate
//!   for mutual TLS, and a second CA with its own client certificate (trusted by nobody), as PEM
//!   files in a temp dir.
//! - [`TlsRedis`]: a `redis-server` that speaks TLS only (`--port 0 --tls-port P`), asking
//!   clients for a certificate from the CA (`--tls-auth-clients yes`); as a Cluster of one
//!   master with TLS on its bus too, or a Sentinel over TLS watching it.
//!
//! Killed on drop; readiness is polled over TLS with a deadline, printing the log on failure.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use redis::{ClientTlsConfig, TlsCertificates, aio::MultiplexedConnection};
use tokio::time::Instant;

use super::{free_port, read_log};

/// How long a TLS `redis-server` may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a one-master TLS Cluster may take to report `cluster_state:ok` (Redis holds a
/// master's state back for 2 s after it starts).
const CLUSTER_READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a Sentinel may take to connect to its master.
const SENTINEL_READY_TIMEOUT: Duration = Duration::from_secs(15);

/// Test certificates as PEM files.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// Makes the CA, the server and client certificates, and the second CA and its client.
    pub fn generate() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("baton-pki-")
            .tempdir()
            .expect("a temp dir for the certificates");
        let write = |name: &str, pem: String| {
            std::fs::write(dir.path().join(name), pem).expect("writing a PEM file");
        };
        let ca = |name: &str| {
            let key = rcgen::KeyPair::generate().expect("a CA key");
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.key_usages = vec![
                rcgen::KeyUsagePurpose::KeyCertSign,
                rcgen::KeyUsagePurpose::CrlSign,
            ];
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            rcgen::CertifiedIssuer::self_signed(params, key).expect("a CA certificate")
        };
        let leaf = |issuer: &rcgen::CertifiedIssuer<'_, rcgen::KeyPair>,
                    names: &[&str],
                    cn: &str|
         -> (String, String) {
            let key = rcgen::KeyPair::generate().expect("a key");
            let mut params = rcgen::CertificateParams::new(
                names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
            )
            .expect("params");
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, cn);
            let cert = params.signed_by(&key, issuer).expect("a certificate");
            (cert.pem(), key.serialize_pem())
        };
        let main = ca("Baton test CA");
        let other = ca("Another CA");
        write("ca.pem", main.pem());
        write("other-ca.pem", other.pem());
        let (cert, key) = leaf(&main, &["localhost", "127.0.0.1"], "redis");
        write("server.pem", cert);
        write("server.key", key);
        let (cert, key) = leaf(&main, &[], "baton");
        write("client.pem", cert);
        write("client.key", key);
        let (cert, key) = leaf(&other, &[], "intruder");
        write("other-client.pem", cert);
        write("other-client.key", key);
        Self { dir }
    }

    /// The PEM file `name`: `ca.pem`, `server.pem`/`server.key`, `client.pem`/`client.key`,
    /// `other-ca.pem`, `other-client.pem`/`other-client.key`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA and the client certificate, for the tests' own connections.
    pub fn certificates(&self) -> TlsCertificates {
        let read = |name: &str| std::fs::read(self.path(name)).expect("reading a PEM file");
        TlsCertificates {
            client_tls: Some(ClientTlsConfig {
                client_cert: read("client.pem"),
                client_key: read("client.key"),
            }),
            root_cert: Some(read("ca.pem")),
        }
    }

    /// `redis-server` arguments for TLS with these certificates.
    fn server_args(&self) -> Vec<String> {
        let path = |name: &str| self.path(name).display().to_string();
        vec![
            "--tls-cert-file".into(),
            path("server.pem"),
            "--tls-key-file".into(),
            path("server.key"),
            "--tls-ca-cert-file".into(),
            path("ca.pem"),
            "--tls-auth-clients".into(),
            "yes".into(),
        ]
    }
}

/// What a [`TlsRedis`] is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Node,
    Cluster,
}

/// A `redis-server` speaking TLS only, killed on drop.
pub struct TlsRedis {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    certificates: TlsCertificates,
}

impl TlsRedis {
    /// A standalone TLS Redis, ready to answer `PING` over TLS.
    pub async fn start(pki: &Pki) -> Self {
        Self::launch(pki, Kind::Node, &[]).await
    }

    /// A Redis Cluster of one master serving every slot, TLS on its client port and its bus,
    /// ready (`cluster_state:ok`).
    pub async fn start_cluster(pki: &Pki) -> Self {
        let node = Self::launch(pki, Kind::Cluster, &[]).await;
        let mut admin = node.admin().await;
        let _: () = redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(0)
            .arg(16383)
            .query_async(&mut admin)
            .await
            .expect("CLUSTER ADDSLOTSRANGE");
        let deadline = Instant::now() + CLUSTER_READY_TIMEOUT;
        loop {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut admin)
                .await
                .expect("CLUSTER INFO");
            if info.contains("cluster_state:ok") {
                return node;
            }
            assert!(
                Instant::now() < deadline,
                "the TLS cluster did not become ok within {CLUSTER_READY_TIMEOUT:?}:\n{info}\nlog:\n{}",
                node.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn launch(pki: &Pki, kind: Kind, extra: &[String]) -> Self {
        let mut failures = Vec::new();
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix("baton-tls-redis-")
                .tempdir()
                .expect("a temp dir for redis-server");
            let port = free_port();
            let mut command = Command::new("redis-server");
            command
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(pki.server_args())
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(dir.path().join("redis.log"))
                .args(extra);
            if kind == Kind::Cluster {
                command.args([
                    "--cluster-enabled",
                    "yes",
                    "--tls-cluster",
                    "yes",
                    "--cluster-config-file",
                ]);
                command.arg(dir.path().join("nodes.conf"));
            }
            let child = command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawning redis-server (is it installed?)");
            let mut redis = Self {
                child: Some(child),
                port,
                dir,
                certificates: pki.certificates(),
            };
            match redis.wait_ready().await {
                Ok(()) => return redis,
                Err(why) => failures.push(format!("port {port}: {why}\n{}", redis.log())),
            }
        }
        panic!("a TLS redis-server did not start:\n{}", failures.join("\n"));
    }

    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("exited with {status}"));
            }
            let ping = async {
                let mut conn = self.try_admin().await?;
                redis::cmd("INFO")
                    .arg("server")
                    .query_async::<String>(&mut conn)
                    .await
            };
            if let Ok(Ok(info)) = tokio::time::timeout(Duration::from_millis(1000), ping).await {
                let pid = info
                    .lines()
                    .find_map(|l| l.strip_prefix("process_id:"))
                    .and_then(|p| p.trim().parse::<u32>().ok());
                return if pid == self.pid() {
                    Ok(())
                } else {
                    Err(format!("port {} is served by another process", self.port))
                };
            }
            if Instant::now() >= deadline {
                return Err(format!("no TLS PING answer within {READY_TIMEOUT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The TLS port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `rediss://localhost:PORT` (the name the server certificate is for).
    pub fn url(&self) -> String {
        format!("rediss://localhost:{}", self.port)
    }

    async fn try_admin(&self) -> redis::RedisResult<MultiplexedConnection> {
        let client = redis::Client::build_with_tls(self.url(), self.certificates.clone())?;
        client.get_multiplexed_async_connection().await
    }

    /// A connection as Redis's `default` user, over TLS with the test client certificate.
    pub async fn admin(&self) -> MultiplexedConnection {
        tokio::time::timeout(Duration::from_secs(5), self.try_admin())
            .await
            .expect("a TLS connection in time")
            .expect("a TLS connection")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        read_log(self.dir.path())
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A Sentinel speaking TLS only, watching a [`TlsRedis`] master over TLS; killed on drop.
pub struct TlsSentinel {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl TlsSentinel {
    /// The name the Sentinel knows the master by.
    pub const MASTER: &'static str = "baton-tls";

    /// Starts a Sentinel watching `master` (quorum 1) and waits until it reports the master
    /// with no other flag.
    pub async fn start(pki: &Pki, master: &TlsRedis) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("baton-tls-sentinel-")
            .tempdir()
            .expect("a temp dir for the sentinel");
        let port = free_port();
        let path = |name: &str| pki.path(name).display().to_string();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port 0\ntls-port {port}\nbind 127.0.0.1\ntls-replication yes\n\
                 tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients yes\n\
                 dir {}\nlogfile {}\n\
                 sentinel monitor {} 127.0.0.1 {} 1\n",
                path("server.pem"),
                path("server.key"),
                path("ca.pem"),
                dir.path().display(),
                dir.path().join("redis.log").display(),
                Self::MASTER,
                master.port(),
            ),
        )
        .expect("writing sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning redis-server --sentinel");
        let sentinel = Self {
            child: Some(child),
            port,
            dir,
        };
        let client = redis::Client::build_with_tls(sentinel.url(), pki.certificates())
            .expect("a sentinel client");
        let deadline = Instant::now() + SENTINEL_READY_TIMEOUT;
        loop {
            let flags = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                let fields: Vec<String> = redis::cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(Self::MASTER)
                    .query_async(&mut conn)
                    .await?;
                Ok::<_, redis::RedisError>(
                    fields
                        .chunks(2)
                        .find(|kv| kv[0] == "flags")
                        .map(|kv| kv[1].clone()),
                )
            };
            let seen = tokio::time::timeout(Duration::from_secs(1), flags).await;
            if let Ok(Ok(Some(flags))) = &seen
                && flags == "master"
            {
                return sentinel;
            }
            assert!(
                Instant::now() < deadline,
                "the TLS sentinel did not see its master within {SENTINEL_READY_TIMEOUT:?} \
                 (last: {seen:?}); log:\n{}",
                read_log(sentinel.dir.path())
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `rediss://localhost:PORT`.
    pub fn url(&self) -> String {
        format!("rediss://localhost:{}", self.port)
    }

    /// A connection to the Sentinel as its `default` user, over TLS with the test client
    /// certificate.
    pub async fn admin(&self, pki: &Pki) -> MultiplexedConnection {
        let client = redis::Client::build_with_tls(self.url(), pki.certificates())
            .expect("a sentinel client");
        tokio::time::timeout(
            Duration::from_secs(5),
            client.get_multiplexed_async_connection(),
        )
        .await
        .expect("a TLS connection in time")
        .expect("a TLS connection")
    }
}

impl Drop for TlsSentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A file written the way the kubelet updates a mounted Secret: the content goes into a new
/// directory, and a `..data` symlink is swapped to it at once (`rename`), the file itself being a
/// symlink through `..data`. Readers never see a half-written file.
pub struct SecretFile {
    dir: tempfile::TempDir,
    name: String,
    version: u32,
}

impl SecretFile {
    /// A Secret volume holding `name` with `content`.
    pub fn new(name: &str, content: &str) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("baton-secret-")
            .tempdir()
            .expect("a temp dir for the secret");
        let mut secret = Self {
            dir,
            name: name.to_owned(),
            version: 0,
        };
        secret.write(content);
        std::os::unix::fs::symlink(Path::new("..data").join(name), secret.dir.path().join(name))
            .expect("linking the secret file");
        secret
    }

    /// The path Baton reads.
    pub fn path(&self) -> PathBuf {
        self.dir.path().join(&self.name)
    }

    /// Replaces the content atomically.
    pub fn write(&mut self, content: &str) {
        self.version += 1;
        let version = format!("..{}", self.version);
        let root = self.dir.path();
        std::fs::create_dir(root.join(&version)).expect("a secret version directory");
        std::fs::write(root.join(&version).join(&self.name), content).expect("writing the secret");
        let staged = root.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &staged).expect("staging ..data");
        std::fs::rename(&staged, root.join("..data")).expect("swapping ..data");
    }
}
