//! TLS to Redis (`rediss://`): every connection path of every topology, verification on by
//! default and failing loudly at start, the explicit opt-out, and the files checked at start.

use std::time::Duration;

use baton::config::{RedisAccess, RedisConfig, RedisTls, Topology};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::{
    exercise,
    support::{
        Baton, BatonProcess, baton_command, lock, run_baton,
        tls::{Pki, SecretFile, TlsRedis, TlsSentinel},
        wait_for_health, wait_until,
    },
};

/// How long `baton serve` may take to give up at start.
const EXIT_LIMIT: Duration = Duration::from_secs(20);

/// Connect and command timeouts of the tests' Batons: a TLS handshake in a debug build on a
/// loaded machine can take longer than the defaults (300 ms, 400 ms).
pub const TIMEOUT: Duration = Duration::from_secs(3);
/// [`TIMEOUT`] as `baton serve` arguments.
const TIMEOUT_ARGS: [&str; 4] = [
    "--redis-connect-timeout",
    "3s",
    "--redis-command-timeout",
    "3s",
];

/// Settings for `topology` with mutual TLS (the test CA and client certificate) and
/// [`TIMEOUT`].
fn mutual_tls_config(pki: &Pki, topology: Topology) -> RedisConfig {
    let mut config = RedisConfig::with_topology(topology);
    config.access = mutual_tls(pki);
    config.connect_timeout = TIMEOUT;
    config.command_timeout = TIMEOUT;
    config
}

/// Mutual TLS with the test CA and client certificate.
fn mutual_tls(pki: &Pki) -> RedisAccess {
    RedisAccess {
        tls: RedisTls {
            ca: Some(pki.path("ca.pem")),
            cert: Some(pki.path("client.pem")),
            key: Some(pki.path("client.key")),
            insecure: false,
        },
        ..RedisAccess::default()
    }
}

/// The keys under `prefix` in `redis`, read over TLS.
async fn keys_under(redis: &TlsRedis, prefix: &str) -> Vec<String> {
    let mut admin = redis.admin().await;
    redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut admin)
        .await
        .expect("KEYS")
}

/// Every service works through a standalone Redis that accepts only TLS connections with a
/// client certificate from its CA: the command pools, the rate limit pool and the subscriber
/// all connect over mutual TLS.
#[tokio::test]
async fn a_standalone_redis_over_mutual_tls() {
    let pki = Pki::generate();
    let redis = TlsRedis::start(&pki).await;
    let config = mutual_tls_config(&pki, Topology::Standalone { url: redis.url() });
    let baton = Baton::start_on(config, crate::patient).await;
    exercise(baton.addr(), "tls").await;
    assert!(
        !keys_under(&redis, baton.prefix()).await.is_empty(),
        "Baton wrote to the TLS Redis"
    );
}

/// Baton's own Cluster router (a pool per master, `CLUSTER SLOTS`) and its sharded subscriber
/// (`SSUBSCRIBE` on the master) connect over mutual TLS to a Cluster whose bus is TLS too.
#[tokio::test]
async fn a_cluster_over_mutual_tls() {
    let pki = Pki::generate();
    let redis = TlsRedis::start_cluster(&pki).await;
    let config = mutual_tls_config(
        &pki,
        Topology::Cluster {
            seeds: vec![redis.url()],
        },
    );
    let baton = Baton::start_on(config, crate::patient).await;
    exercise(baton.addr(), "cluster-tls").await;
    assert!(!keys_under(&redis, baton.prefix()).await.is_empty());
}

/// Baton asks Sentinels that speak only TLS for the master, and reaches the master (which they
/// name by IP address) over TLS too, with its client certificate on both.
#[tokio::test]
async fn sentinels_and_their_master_over_mutual_tls() {
    let pki = Pki::generate();
    let master = TlsRedis::start(&pki).await;
    let sentinel = TlsSentinel::start(&pki, &master).await;
    let config = mutual_tls_config(
        &pki,
        Topology::Sentinel {
            sentinels: vec![sentinel.url()],
            master: TlsSentinel::MASTER.to_owned(),
            node_url: Some(sentinel.url()),
        },
    );
    let baton = Baton::start_on(config, crate::patient).await;
    exercise(baton.addr(), "sentinel-tls").await;
    assert!(!keys_under(&master, baton.prefix()).await.is_empty());
}

/// A server certificate Baton cannot trust (another CA's, or not from the public roots when no
/// CA is given), or a client certificate the server refuses (missing, or from another CA):
/// `baton serve` exits with code 2 at start, saying the TLS handshake failed and why.
#[tokio::test]
async fn a_failed_tls_handshake_stops_baton_at_start() {
    let pki = Pki::generate();
    let redis = TlsRedis::start(&pki).await;
    let path = |name: &str| pki.path(name).display().to_string();
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "a server certificate from a CA Baton does not trust",
            vec![
                "--redis-url".into(),
                redis.url(),
                "--redis-tls-ca".into(),
                path("other-ca.pem"),
                "--redis-tls-cert".into(),
                path("client.pem"),
                "--redis-tls-key".into(),
                path("client.key"),
            ],
            "invalid peer certificate",
        ),
        (
            "the public roots only (no --redis-tls-ca)",
            vec![
                "--redis-url".into(),
                redis.url(),
                "--redis-tls-cert".into(),
                path("client.pem"),
                "--redis-tls-key".into(),
                path("client.key"),
            ],
            "invalid peer certificate",
        ),
        (
            "no client certificate",
            vec![
                "--redis-url".into(),
                redis.url(),
                "--redis-tls-ca".into(),
                path("ca.pem"),
            ],
            "TLS handshake with Redis failed",
        ),
        (
            "a client certificate from another CA",
            vec![
                "--redis-url".into(),
                redis.url(),
                "--redis-tls-ca".into(),
                path("ca.pem"),
                "--redis-tls-cert".into(),
                path("other-client.pem"),
                "--redis-tls-key".into(),
                path("other-client.key"),
            ],
            "TLS handshake with Redis failed",
        ),
    ];
    for (what, args, expected) in cases {
        let mut command = baton_command();
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(TIMEOUT_ARGS)
            .args(&args);
        let (status, stderr) = run_baton(command, EXIT_LIMIT).await;
        assert_eq!(status.code(), Some(2), "{what}: {status}\n{stderr}");
        assert!(
            stderr.contains("TLS handshake with Redis failed") && stderr.contains(expected),
            "{what}: the reason is said:\n{stderr}"
        );
    }
}

/// `--redis-tls-insecure` connects without verifying the server's certificate (its client
/// certificate still sent), and says so: a warning at start and `INSECURE` in the startup
/// summary.
#[tokio::test]
async fn the_insecure_opt_out_works_and_is_loud() {
    let pki = Pki::generate();
    let redis = TlsRedis::start(&pki).await;
    let cert = pki.path("client.pem").display().to_string();
    let key = pki.path("client.key").display().to_string();
    let url = redis.url();
    let baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--redis-tls-insecure",
        "--redis-tls-cert",
        &cert,
        "--redis-tls-key",
        &key,
        TIMEOUT_ARGS[0],
        TIMEOUT_ARGS[1],
        TIMEOUT_ARGS[2],
        TIMEOUT_ARGS[3],
    ])
    .await;
    let mut client = baton.client().await;
    lock::acquired(&mut client, "insecure", 10_000, None, "a").await;
    let stderr = baton.stderr();
    assert!(
        stderr.contains("--redis-tls-insecure: Redis servers' certificates are NOT verified"),
        "a warning at start:\n{stderr}"
    );
    assert!(
        stderr.contains("redis_tls=INSECURE:certificates-not-verified"),
        "the startup summary says it:\n{stderr}"
    );
}

/// TLS files and settings that cannot work stop `baton serve` with code 2 and a line naming the
/// flag, before any connection: missing, not PEM, too large, a key that is not the
/// certificate's, a certificate without its key, TLS settings for plain `redis://` URLs, the
/// silent `#insecure` URL fragment, and a CA given with `--redis-tls-insecure`.
#[tokio::test]
async fn bad_tls_settings_are_configuration_errors() {
    let pki = Pki::generate();
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, content: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("writing");
        path.display().to_string()
    };
    let path = |name: &str| pki.path(name).display().to_string();
    let not_pem = write("not.pem", b"certainly not a certificate\n");
    let huge = write("huge.pem", &vec![b'A'; 2 * 1024 * 1024]);
    let tls = "rediss://localhost:1";
    let cases: Vec<(Vec<String>, &str, &str)> = vec![
        (
            vec![
                "--redis-tls-ca".into(),
                dir.path().join("missing.pem").display().to_string(),
            ],
            "--redis-tls-ca",
            "cannot read",
        ),
        (
            vec!["--redis-tls-ca".into(), not_pem.clone()],
            "--redis-tls-ca",
            "holds no PEM certificate",
        ),
        (
            vec!["--redis-tls-ca".into(), huge],
            "--redis-tls-ca",
            "more than the",
        ),
        (
            vec![
                "--redis-tls-cert".into(),
                path("client.pem"),
                "--redis-tls-key".into(),
                path("other-client.key"),
            ],
            "--redis-tls-key",
            "is not the key of its certificate",
        ),
        (
            vec![
                "--redis-tls-cert".into(),
                path("client.pem"),
                "--redis-tls-key".into(),
                not_pem,
            ],
            "--redis-tls-key",
            "holds no private key",
        ),
        (
            vec!["--redis-tls-cert".into(), path("client.pem")],
            "--redis-tls-cert",
            "needs --redis-tls-key",
        ),
        (
            vec![
                "--redis-tls-insecure".into(),
                "--redis-tls-ca".into(),
                path("ca.pem"),
            ],
            "--redis-tls-insecure",
            "give one or the other",
        ),
    ];
    for (args, flag, expected) in cases {
        let mut command = baton_command();
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--redis-url", tls])
            .args(&args);
        let (status, stderr) = run_baton(command, EXIT_LIMIT).await;
        assert_eq!(status.code(), Some(2), "{args:?}: {status}\n{stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(expected),
            "{args:?}: expected {flag} and {expected:?} in:\n{stderr}"
        );
    }
    for (url, args, expected) in [
        (
            "redis://localhost:1",
            vec!["--redis-tls-ca".to_owned(), path("ca.pem")],
            "TLS settings need rediss://",
        ),
        (
            "rediss://localhost:1/#insecure",
            vec![],
            "use --redis-tls-insecure",
        ),
        (
            "rediss://localhost:1,redis://localhost:2",
            vec!["--redis-mode".to_owned(), "cluster".to_owned()],
            "some URLs are rediss://",
        ),
    ] {
        let mut command = baton_command();
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--redis-url", url])
            .args(&args);
        let (status, stderr) = run_baton(command, EXIT_LIMIT).await;
        assert_eq!(status.code(), Some(2), "{url}: {status}\n{stderr}");
        assert!(
            stderr.contains(expected),
            "{url}: expected {expected:?} in:\n{stderr}"
        );
    }
}

/// The TLS files are read again when they change, like the password file: a CA bundle swapped
/// for one that does not sign the server's certificate fails the next connections (`UNAVAILABLE`
/// naming the handshake failure, readiness NOT_SERVING), and swapping the right one back makes
/// Baton serve again, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_files_are_read_again_when_they_change() {
    let pki = Pki::generate();
    let redis = TlsRedis::start(&pki).await;
    let read = |name: &str| std::fs::read_to_string(pki.path(name)).expect("reading a PEM file");
    let mut ca = SecretFile::new("ca.pem", &read("ca.pem"));
    let mut config = mutual_tls_config(&pki, Topology::Standalone { url: redis.url() });
    config.access.tls.ca = Some(ca.path());
    let baton = Baton::start_on(config, crate::patient).await;
    let client = baton.client().await;
    lock::acquired(&mut client.clone(), "before", 10_000, None, "a").await;

    ca.write(&read("other-ca.pem"));
    let mut admin = redis.admin().await;
    for kind in ["normal", "pubsub"] {
        crate::support::client_kill(&mut admin, &["TYPE", kind, "SKIPME", "yes"])
            .await
            .expect("CLIENT KILL");
    }
    let status = wait_until(TIMEOUT * 5, "a call refused for the new CA", || {
        let mut client = client.clone();
        async move {
            match client
                .acquire(lock::acquire_request("during", 10_000, None, "b"))
                .await
            {
                Err(s) if s.message().contains("TLS handshake with Redis failed") => Ok(s),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("UnknownIssuer"), "{status:?}");
    let mut health = baton.health().await;
    wait_for_health(
        &mut health,
        "readiness",
        ServingStatus::NotServing,
        TIMEOUT * 5,
    )
    .await;

    ca.write(&read("ca.pem"));
    wait_for_health(
        &mut health,
        "readiness",
        ServingStatus::Serving,
        TIMEOUT * 5,
    )
    .await;
    lock::acquired(&mut client.clone(), "after", 10_000, None, "c").await;
}
