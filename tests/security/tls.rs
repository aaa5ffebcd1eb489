//! TLS on the TCP listener: the certificate files are reread, a valid change serves new
//! handshakes while open streams go on, a bad or half-written one is refused with the old
//! certificate kept; a bad file at start stops `baton serve` with exit code 2.

use std::time::Duration;

use baton::{proto::v1::lock_service_client::LockServiceClient, security::tls::TlsFiles};
use tokio::time::Instant;

use crate::{
    certs::{Ca, server_cert, tls_channel},
    start,
    support::{
        RedisServer, baton_command,
        lease::next_renewal,
        lock::{held, hold_request},
        run_baton, wait_until,
    },
};

/// A certificate rotated on disk serves every new handshake once reread, while a Hold stream
/// opened before goes on renewing over its connection; a half-written certificate and a key
/// that does not go with the certificate are refused, and the certificate in force stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_without_dropping_streams() {
    let redis = RedisServer::start().await;
    let (old_ca, new_ca) = (Ca::new("old ca"), Ca::new("new ca"));
    let (old, new) = (old_ca.server("baton old"), new_ca.server("baton new"));
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = old.write(dir.path(), "tls");
    let files = TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: None,
    };
    let baton = start(&redis, |c| {
        c.serving.tls = Some(files);
        c.serving.credentials_reload = Duration::from_millis(50);
    })
    .await;
    let addr = baton.addr();
    let both = [&old_ca, &new_ca];
    assert_eq!(
        server_cert(addr, &both).await.expect("handshake"),
        old.der()
    );

    let mut locks = LockServiceClient::new(
        tls_channel(addr, &both, None)
            .await
            .expect("a gRPC connection over TLS"),
    );
    let (mut stream, _) = held(&mut locks, hold_request("rotated", 600, None, "")).await;
    next_renewal(&mut stream).await;

    // Half-written, then a key without its certificate: neither is put in force.
    std::fs::write(&cert, &old.cert[..old.cert.len() / 2]).expect("truncating");
    let until = Instant::now() + Duration::from_millis(400);
    while Instant::now() < until {
        let presented = server_cert(addr, &both).await.expect("handshake");
        assert_eq!(presented, old.der(), "a half-written certificate was taken");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    std::fs::write(&cert, &old.cert).expect("restoring");
    std::fs::write(&key, &new.key).expect("writing the new key first");
    let until = Instant::now() + Duration::from_millis(400);
    while Instant::now() < until {
        let presented = server_cert(addr, &both).await.expect("handshake");
        assert_eq!(
            presented,
            old.der(),
            "a key of another certificate was taken"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    std::fs::write(&cert, &new.cert).expect("writing the new certificate");
    wait_until(
        Duration::from_secs(5),
        "new handshakes to present the new certificate",
        || async {
            match server_cert(addr, &both).await {
                Ok(der) if der == new.der() => Ok(()),
                other => Err(other.map(|_| "the old certificate")),
            }
        },
    )
    .await;
    // Only the new CA is needed now, and the stream opened before goes on.
    server_cert(addr, &[&new_ca])
        .await
        .expect("trusting the new CA alone");
    for _ in 0..3 {
        next_renewal(&mut stream).await;
    }
}

/// A certificate that is not PEM and a token file that is a FIFO (read without blocking) are
/// both reported, and `baton serve` exits 2 without serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_files_at_start_exit_2() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, "not a certificate").expect("writing");
    std::fs::write(&key, "not a key").expect("writing");
    let fifo = dir.path().join("token");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let mut command = baton_command();
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .arg("--api-token-file")
        .arg(&fifo);
    let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--tls-cert") && stderr.contains("holds no certificate"),
        "{stderr}"
    );
    assert!(
        stderr.contains("--api-token-file") && stderr.contains("not a regular file"),
        "{stderr}"
    );
}

/// An empty credential path, given as a flag or as its variable, exits 2 naming the flag: it was
/// taken as "not given", so an empty `BATON_API_TOKEN_FILE` served every call without a token
/// and empty `--tls-cert` and `--tls-key` served plain text, without a word.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_credential_paths_exit_2() {
    let flags = [
        ("--api-token-file", "BATON_API_TOKEN_FILE"),
        ("--tls-cert", "BATON_TLS_CERT"),
        ("--tls-key", "BATON_TLS_KEY"),
        ("--tls-client-ca", "BATON_TLS_CLIENT_CA"),
        ("--redis-password-file", "BATON_REDIS_PASSWORD_FILE"),
        ("--redis-tls-ca", "BATON_REDIS_TLS_CA"),
        ("--redis-tls-cert", "BATON_REDIS_TLS_CERT"),
        ("--redis-tls-key", "BATON_REDIS_TLS_KEY"),
    ];
    for by_variable in [false, true] {
        let mut command = baton_command();
        command.args(["serve", "--listen", "127.0.0.1:0"]);
        for (flag, variable) in flags {
            if by_variable {
                command.env(variable, "");
            } else {
                command.args([flag, ""]);
            }
        }
        let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
        assert_eq!(status.code(), Some(2), "{stderr}");
        for (flag, variable) in flags {
            assert!(
                stderr.contains(&format!("{flag} / {variable}: the value was empty")),
                "{flag} in {stderr}"
            );
        }
        assert!(!stderr.contains("give both"), "{stderr}");
    }
    // A blank path too, and alone.
    let mut command = baton_command();
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("BATON_API_TOKEN_FILE", " ");
    let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--api-token-file / BATON_API_TOKEN_FILE: the value was empty"),
        "{stderr}"
    );
}

/// A cut-off certificate says which end line is missing in words (it was a list of byte
/// values), and an encrypted key says that encrypted keys are not supported (it said "no items
/// found"), from `baton serve`, its Redis TLS files and the CLI alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_off_certificates_and_encrypted_keys_are_told_in_words() {
    let ca = Ca::new("ca");
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = ca.server("baton").write(dir.path(), "tls");
    let pem = std::fs::read_to_string(&cert).expect("reading");
    let cut = dir.path().join("cut.crt");
    std::fs::write(&cut, &pem[..pem.len() / 2]).expect("writing");
    let encrypted = dir.path().join("encrypted.key");
    let out = std::process::Command::new("openssl")
        .args(["pkcs8", "-topk8", "-passout", "pass:secret", "-in"])
        .arg(&key)
        .arg("-out")
        .arg(&encrypted)
        .output()
        .expect("openssl runs");
    assert!(out.status.success(), "{out:?}");
    let says_cut = "has no \"-----END CERTIFICATE-----\" line";
    let says_encrypted = "encrypted private key, which Baton does not support";
    for (args, says) in [
        (
            vec!["--tls-cert", path(&cut), "--tls-key", path(&key)],
            says_cut,
        ),
        (
            vec!["--tls-cert", path(&cert), "--tls-key", path(&encrypted)],
            says_encrypted,
        ),
        (
            vec![
                "--redis-url",
                "rediss://127.0.0.1:1",
                "--redis-tls-ca",
                path(&cut),
                "--redis-tls-cert",
                path(&cert),
                "--redis-tls-key",
                path(&encrypted),
            ],
            says_cut,
        ),
    ] {
        let mut command = baton_command();
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(&args);
        let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(says), "{says} in {stderr}");
        assert!(!stderr.contains("[67, 69"), "{stderr}");
        assert!(!stderr.contains("no items found"), "{stderr}");
        if args.contains(&"--redis-tls-key") {
            assert!(stderr.contains(says_encrypted), "{stderr}");
        }
    }
    for (cert, key, says) in [(&cut, &key, says_cut), (&cert, &encrypted, says_encrypted)] {
        let mut command = baton_command();
        command
            .args(["health", "--addr", "https://127.0.0.1:1", "--tls-cert"])
            .arg(cert)
            .arg("--tls-key")
            .arg(key);
        let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(says), "{says} in {stderr}");
    }
}

fn path(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// A P-521 key, generated for this test alone: a key type the TLS implementation cannot sign
/// with.
const P521_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIHuAgEAMBAGByqGSM49AgEGBSuBBAAjBIHWMIHTAgEBBEIAbbhTfoDFye4Ij1pK
a1JDjYaTqp3fpjh5TIje84dikmfUCzuqKs4VQWBvFXNyzs+jaU8nc62FV0pJ11PI
vio2Gt+hgYkDgYYABACAnpE7bw3MTisMLD0jfQK4q23SWcTJxz8hLDD2Wtr4US2t
t/i+cXBqPzxangRRKol1AEK603CHW35jA6qw3jjpOAE++b4DAtOGnJBOKQ0aMsT/
k7p6wvBk/ZMmv/g7HX0qndXItT0uMUGxOkT5u13KRsN6BmmoZENkXsspBHsz5d44
QA==
-----END PRIVATE KEY-----
";

/// A key of a type TLS cannot sign with and a key of another certificate are told apart, each
/// naming its files, by `baton serve` (exit 2) and by the CLI's mutual TLS (exit 2): the first
/// was reported as a mismatch, and the CLI named neither file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_and_mismatched_keys_are_told_apart() {
    let ca = Ca::new("ca");
    let (own, other) = (ca.server("baton"), ca.server("someone else"));
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, _) = own.write(dir.path(), "tls");
    let (_, other_key) = other.write(dir.path(), "other");
    let p521 = dir.path().join("p521.key");
    std::fs::write(&p521, P521_KEY).expect("writing");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, ca.pem()).expect("writing");

    for (key, says) in [
        (&p521, "cannot sign with"),
        (&other_key, "does not go with"),
    ] {
        let mut command = baton_command();
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--tls-cert"])
            .arg(&cert)
            .arg("--tls-key")
            .arg(key);
        let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(stderr.contains(&key.display().to_string()), "{stderr}");
    }
    for (key, says) in [
        (&p521, "cannot sign with"),
        (&other_key, "is not the key of its certificate"),
    ] {
        let mut command = baton_command();
        command
            .args(["health", "--addr", "https://127.0.0.1:1", "--tls-ca"])
            .arg(&ca_file)
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(key);
        let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(
            stderr.contains(&format!("--tls-key {}", key.display())),
            "{stderr}"
        );
    }
}

/// With mutual TLS, a client certificate from the client CA is served; a client presenting none,
/// one from another CA, an expired one, one for servers only or an X.509 v1 one completes its
/// handshake, but every call on its
/// connection, health's too, fails UNAUTHENTICATED saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_every_call_of_a_client_without_a_valid_certificate() {
    use tonic::Code;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let redis = RedisServer::start().await;
    let (server_ca, client_ca, other_ca) = (
        Ca::new("server ca"),
        Ca::new("client ca"),
        Ca::new("other ca"),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = server_ca.server("baton").write(dir.path(), "tls");
    let ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, client_ca.pem()).expect("writing the client CA");
    let files = TlsFiles {
        cert,
        key,
        client_ca: Some(ca_file),
    };
    let baton = start(&redis, |c| c.serving.tls = Some(files)).await;
    let addr = baton.addr();

    let good = client_ca.client("good");
    let mut locks = LockServiceClient::new(
        tls_channel(addr, &[&server_ca], Some(&good))
            .await
            .expect("a connection with a good certificate"),
    );
    held(&mut locks, hold_request("mtls", 1_000, None, "")).await;

    let stranger = other_ca.client("stranger");
    let expired = client_ca.expired_client("expired");
    // Issued by the right CA, but for servers only.
    let server_only = client_ca.server("server-only");
    // Issued by the right CA, but X.509 v1: it was refused inside the handshake, so the
    // client saw only a TLS alert.
    let v1 = client_ca.v1_client("v1");
    for (identity, says) in [
        (None, "presented none"),
        (Some(&stranger), "not issued by a CA this Baton trusts"),
        (Some(&expired), "has expired"),
        (Some(&server_only), "not for client authentication"),
        (Some(&v1), "it is X.509 v1; v3 is required"),
    ] {
        let channel = tls_channel(addr, &[&server_ca], identity)
            .await
            .expect("the handshake completes");
        let refused = LockServiceClient::new(channel.clone())
            .hold(hold_request("mtls-2", 1_000, None, ""))
            .await
            .expect_err("a call without a valid certificate");
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
        assert!(
            refused.message().contains(says),
            "{refused:?} should say {says:?}"
        );
        let health = HealthClient::new(channel)
            .check(HealthCheckRequest::default())
            .await
            .expect_err("health too");
        assert_eq!(health.code(), Code::Unauthenticated, "{health:?}");
    }
}
