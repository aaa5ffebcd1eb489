//! What running Baton as a Kubernetes sidecar relies on, checked on the real binary: the
//! health-only listener the kubelet probes, the Redis password read from a file (a mounted
//! Secret), and `baton health`, the probe command of the chart's test hook.

mod support;

use std::time::Duration;

use baton::proto::v1 as pb;
use support::{
    BatonProcess, RedisServer, baton_command, free_port, run_baton, unique_prefix, wait_for_health,
};
use tonic::Code;
use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient};

/// How long readiness may take to change: it checks Redis every second.
const READY: Duration = Duration::from_secs(5);

/// `--health-listen` serves gRPC health (liveness, readiness) and nothing else: the lock API
/// answers UNIMPLEMENTED there, while it is served on the regular listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_listener_serves_health_alone() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let health_addr = format!("127.0.0.1:{}", free_port());
    let baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &unique_prefix(),
        "--health-listen",
        &health_addr,
    ])
    .await;
    let channel = support::channel(health_addr.parse().expect("address")).await;
    let mut health = HealthClient::new(channel.clone());
    wait_for_health(&mut health, "readiness", ServingStatus::Serving, READY).await;
    wait_for_health(&mut health, "liveness", ServingStatus::Serving, READY).await;

    let request = pb::LockServiceAcquireRequest {
        name: "not-here".to_owned(),
        ttl: Some(support::ms(1_000)),
        ..Default::default()
    };
    let refused = pb::lock_service_client::LockServiceClient::new(channel)
        .acquire(request.clone())
        .await
        .expect_err("the health listener serves no lock API");
    assert_eq!(refused.code(), Code::Unimplemented, "{refused:?}");
    let served = baton
        .client()
        .await
        .acquire(request)
        .await
        .expect("the API on the regular listener");
    assert!(served.into_inner().acquired);
}

/// With `--redis-password-file` naming a file holding the password of a Redis that requires one
/// (final line break included, as `kubectl create secret --from-file` keeps it), Baton
/// authenticates: readiness turns SERVING and a lock is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_password_comes_from_a_file() {
    let redis = RedisServer::start_standalone().await;
    let password = format!("p@ss word/{}", uuid::Uuid::new_v4().simple());
    let mut conn = redis.client().await;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(&password)
        .query_async::<()>(&mut conn)
        .await
        .expect("CONFIG SET requirepass");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("password");
    std::fs::write(&file, format!("{password}\n")).expect("writing the password file");
    let url = redis.url();
    let baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &unique_prefix(),
        "--redis-password-file",
        file.to_str().expect("UTF-8 path"),
    ])
    .await;
    let mut health = HealthClient::new(support::channel(baton.addr()).await);
    wait_for_health(&mut health, "readiness", ServingStatus::Serving, READY).await;
    let got = baton
        .client()
        .await
        .acquire(pb::LockServiceAcquireRequest {
            name: "behind-a-password".to_owned(),
            ttl: Some(support::ms(5_000)),
            ..Default::default()
        })
        .await
        .expect("Acquire with the password from the file")
        .into_inner();
    assert!(got.acquired, "{got:?}");
    assert!(
        !baton.stderr().contains(&password),
        "the password is never logged"
    );
}

/// A password file that cannot be used (missing, empty, two lines, too large, a FIFO, which is
/// refused without waiting for a writer) or a URL that already carries a password stops Baton
/// with exit code 2 and a line naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_password_file_is_a_configuration_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write = |name: &str, content: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).expect("writing");
        path.to_str().expect("UTF-8 path").to_owned()
    };
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let fifo = fifo.to_str().expect("UTF-8 path").to_owned();
    let cases = [
        (
            "redis://127.0.0.1:1",
            dir.path().join("missing").to_str().unwrap().to_owned(),
            "cannot read",
        ),
        ("redis://127.0.0.1:1", write("empty", b"\n"), "no password"),
        (
            "redis://127.0.0.1:1",
            write("two", b"one\ntwo\n"),
            "more than one line",
        ),
        (
            "redis://127.0.0.1:1",
            write("big", &[b'x'; 5000]),
            "more than the 4096 bytes accepted",
        ),
        ("redis://127.0.0.1:1", fifo, "not a regular file"),
        (
            "redis://:inline@127.0.0.1:1",
            write("good", b"secret\n"),
            "already carries a password",
        ),
    ];
    for (url, file, expected) in cases {
        let mut command = baton_command();
        command.args(["serve", "--redis-url", url, "--redis-password-file", &file]);
        let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
        assert_eq!(status.code(), Some(2), "{file}: {stderr}");
        assert!(
            stderr.contains("--redis-password-file") && stderr.contains(expected),
            "{file}: expected {expected:?} in:\n{stderr}"
        );
        assert!(!stderr.contains("secret"), "the password is never shown");
    }
}

/// `baton health` answers 0 and prints SERVING for a ready Baton, over the Unix socket
/// (`unix://` address) and over TCP; 1 for a service that is not served, and 69 (unavailable)
/// naming the address where nothing listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn baton_health_reports_the_status_in_its_exit_code() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let baton = BatonProcess::spawn(&["--redis-url", &url, "--key-prefix", &unique_prefix()]).await;
    let mut health = HealthClient::new(support::channel(baton.addr()).await);
    wait_for_health(&mut health, "readiness", ServingStatus::Serving, READY).await;

    let socket = format!("unix://{}", baton.socket_path().display());
    let tcp = baton.addr().to_string();
    for addr in [&socket, &tcp] {
        let output = baton_command()
            .args(["health", "--addr", addr, "--service", "readiness"])
            .output()
            .expect("running baton health");
        assert!(output.status.success(), "{addr}: {output:?}");
        assert_eq!(
            String::from_utf8_lossy(&output.stdout),
            "readiness: SERVING\n"
        );
    }
    let unknown = baton_command()
        .args(["health", "--addr", &tcp, "--service", "nope"])
        .output()
        .expect("running baton health");
    assert_eq!(unknown.status.code(), Some(1), "{unknown:?}");
    let nobody = format!("127.0.0.1:{}", free_port());
    let down = baton_command()
        .args(["health", "--timeout", "1s"])
        .env("BATON_ADDR", &nobody)
        .output()
        .expect("running baton health");
    assert_eq!(down.status.code(), Some(69), "{down:?}");
    assert!(
        String::from_utf8_lossy(&down.stderr).contains(&nobody),
        "{down:?}"
    );
}
