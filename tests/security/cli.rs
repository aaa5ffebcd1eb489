//! The `baton` command-line client against a Baton that requires an API token, TLS or mutual
//! TLS: the binary run in a subprocess, its exit codes and messages (docs/security.md,
//! "Clients").

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use baton::security::tls::TlsFiles;

use crate::{
    certs::Ca,
    start,
    support::{RedisServer, baton_command, wait_until},
};

const TOKEN: &str = "cli-token-3e9f1a7c5b2d4e60";
const NEXT_TOKEN: &str = "cli-token-next-8d2c4b6a0e1f3a59";

/// Exit code of a refused credential (`UNAUTHENTICATED`).
const EXIT_UNAUTHENTICATED: i32 = 77;
/// Exit code of bad usage.
const EXIT_USAGE: i32 = 2;
/// Exit code of an unreachable Baton.
const EXIT_UNAVAILABLE: i32 = 69;

/// Runs `baton ARGS...` with the extra environment `env` to completion (at most 20 s): its exit
/// code and standard error.
async fn baton(args: &[&str], env: &[(&str, &Path)]) -> (i32, String) {
    let mut command = tokio::process::Command::from(baton_command());
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(Duration::from_secs(20), command.output())
        .await
        .unwrap_or_else(|_| panic!("baton {args:?} did not exit within 20 s"))
        .expect("running baton");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let code = output
        .status
        .code()
        .unwrap_or_else(|| panic!("baton {args:?} died of a signal; stderr: {stderr}"));
    (code, stderr)
}

/// Asserts that `baton ARGS...` exits `code` with a standard error that says each of `says`.
async fn expect(args: &[&str], env: &[(&str, &Path)], code: i32, says: &[&str]) {
    let (got, stderr) = baton(args, env).await;
    assert_eq!(got, code, "baton {args:?} exit code; stderr: {stderr}");
    for words in says {
        assert!(
            stderr.contains(words),
            "baton {args:?}: stderr {stderr:?} does not say {words:?}"
        );
    }
}

fn write(dir: &Path, name: &str, contents: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, contents).expect("writing a file");
    path
}

/// Without a token the CLI exits 77 with Baton's reason and where to give the token; a wrong
/// token likewise; the token from `--api-token-file` or `BATON_API_TOKEN_FILE` gets in, over TCP
/// and the socket; a missing or empty token file is a usage error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_sends_the_api_token() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let server_file = write(dir.path(), "server-token", &format!("{TOKEN}\n"));
    let baton = start(&redis, |c| c.serving.api_token_file = Some(server_file)).await;
    let tcp = baton.addr().to_string();
    let unix = format!("unix://{}", baton.socket_path().display());
    let good = write(dir.path(), "good", &format!("\n  {TOKEN}  \nignored\n"));
    let wrong = write(dir.path(), "wrong", "not-the-token-at-all\n");
    let empty = write(dir.path(), "empty", "\n \n");
    let missing = dir.path().join("missing");
    let good_arg = good.display().to_string();

    for addr in [tcp.as_str(), unix.as_str()] {
        expect(
            &["lock", "--addr", addr, "--wait", "0", "t", "--", "true"],
            &[],
            EXIT_UNAUTHENTICATED,
            &[
                "Unauthenticated",
                "requires an API token",
                "--api-token-file or BATON_API_TOKEN_FILE",
            ],
        )
        .await;
        expect(
            &["describe", "lock", "t", "--addr", addr],
            &[("BATON_API_TOKEN_FILE", &wrong)],
            EXIT_UNAUTHENTICATED,
            &["not valid"],
        )
        .await;
        expect(
            &[
                "lock",
                "--addr",
                addr,
                "--api-token-file",
                &good_arg,
                "--wait",
                "0",
                "t",
                "--",
                "true",
            ],
            &[],
            0,
            &[],
        )
        .await;
        expect(
            &["describe", "lock", "t", "--addr", addr],
            &[("BATON_API_TOKEN_FILE", &good)],
            0,
            &[],
        )
        .await;
    }
    expect(
        &["describe", "lock", "t", "--addr", &tcp],
        &[("BATON_API_TOKEN_FILE", &missing)],
        EXIT_USAGE,
        &[
            "--api-token-file / BATON_API_TOKEN_FILE",
            "cannot read",
            "missing",
        ],
    )
    .await;
    expect(
        &[
            "describe",
            "lock",
            "t",
            "--addr",
            &tcp,
            "--api-token-file",
            &empty.display().to_string(),
        ],
        &[],
        EXIT_USAGE,
        &["holds no token"],
    )
    .await;
}

/// A long-running `baton hold` reads its token file again for each call: once the token is
/// rotated (the new one added to Baton's file, given to the client, the old one removed from
/// Baton's file), it keeps taking its turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_follows_a_rotated_token() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let server_file = write(dir.path(), "server-token", &format!("{TOKEN}\n"));
    let baton = start(&redis, |c| {
        c.serving.api_token_file = Some(server_file.clone());
        c.serving.credentials_reload = Duration::from_millis(50);
    })
    .await;
    let client_file = write(dir.path(), "client-token", &format!("{TOKEN}\n"));
    let out = dir.path().join("hold.out");
    let mut hold = tokio::process::Command::from(baton_command());
    hold.args([
        "hold",
        "--addr",
        &baton.addr().to_string(),
        "--name",
        "rotation",
        "--owner",
        "rotating",
        "--hold-for",
        "50ms",
        "--pause",
        "50ms",
    ])
    .env("BATON_API_TOKEN_FILE", &client_file)
    .stdin(Stdio::null())
    .stdout(std::fs::File::create(&out).expect("an output file"))
    .stderr(std::fs::File::create(dir.path().join("hold.err")).expect("an error file"))
    .kill_on_drop(true);
    let mut hold = hold.spawn().expect("starting baton hold");
    let turns = || {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .matches("holds \"rotation\"")
            .count()
    };
    let running = |hold: &mut tokio::process::Child| {
        let status = hold.try_wait().expect("polling baton hold");
        let stderr = std::fs::read_to_string(dir.path().join("hold.err")).unwrap_or_default();
        assert!(status.is_none(), "baton hold exited {status:?}: {stderr}");
    };
    let at_least = |n: usize| async move {
        wait_until(
            Duration::from_secs(10),
            "more turns of baton hold",
            || async {
                let seen = turns();
                if seen >= n { Ok(()) } else { Err(seen) }
            },
        )
        .await;
    };
    at_least(2).await;

    // Baton accepts both, then the client moves to the new one, then Baton drops the old one.
    std::fs::write(&server_file, format!("{TOKEN}\n{NEXT_TOKEN}\n")).expect("adding a token");
    tokio::time::sleep(Duration::from_millis(300)).await; // three reload periods
    std::fs::write(&client_file, format!("{NEXT_TOKEN}\n")).expect("rotating the client");
    let before = turns();
    at_least(before + 2).await;
    std::fs::write(&server_file, format!("{NEXT_TOKEN}\n")).expect("dropping the old token");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = turns();
    at_least(before + 3).await;
    running(&mut hold);
    hold.start_kill().expect("stopping baton hold");
}

/// A Baton with TLS and another with mutual TLS, reached by the CLI: `--tls-ca` (or an
/// `https://` address with it) gets in, the server name checked as given; no client certificate
/// is refused 77 saying why; another CA, a wrong server name and plaintext cannot connect (69);
/// TLS flags with the Unix socket, a certificate without its key and a CA file without a
/// certificate are usage errors (2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_over_tls_and_mutual_tls() {
    let redis = RedisServer::start().await;
    let (server_ca, client_ca, other_ca) = (
        Ca::new("server ca"),
        Ca::new("client ca"),
        Ca::new("other ca"),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = server_ca.server("baton").write(dir.path(), "server");
    let client_ca_file = write(dir.path(), "client-ca.crt", &client_ca.pem());
    let ca = write(dir.path(), "ca.crt", &server_ca.pem())
        .display()
        .to_string();
    let other = write(dir.path(), "other.crt", &other_ca.pem())
        .display()
        .to_string();
    let garbage = write(dir.path(), "garbage.crt", "not a certificate\n")
        .display()
        .to_string();
    let (client_cert, client_key) = client_ca.client("cli").write(dir.path(), "client");
    let (client_cert, client_key) = (
        client_cert.display().to_string(),
        client_key.display().to_string(),
    );

    let tls_only = start(&redis, |c| {
        c.serving.tls = Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: None,
        });
    })
    .await;
    let addr = tls_only.addr().to_string();
    let https = format!("https://{addr}");
    fn run(extra: &[&str], addr: &str) -> Vec<String> {
        ["health", "--addr", addr]
            .iter()
            .chain(extra)
            .map(|s| (*s).to_owned())
            .collect()
    }
    let expect_with = |args: Vec<String>, code: i32, says: &'static [&'static str]| async move {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        expect(&args, &[], code, says).await;
    };

    expect_with(run(&["--tls-ca", &ca], &addr), 0, &[]).await;
    expect_with(run(&["--tls-ca", &ca], &https), 0, &[]).await;
    expect_with(
        run(&["--tls-ca", &ca, "--tls-server-name", "localhost"], &addr),
        0,
        &[],
    )
    .await;
    expect_with(
        run(
            &["--tls-ca", &ca, "--tls-server-name", "baton.example"],
            &addr,
        ),
        EXIT_UNAVAILABLE,
        &["cannot reach Baton", "certificate"],
    )
    .await;
    expect_with(
        run(&["--tls-ca", &other], &addr),
        EXIT_UNAVAILABLE,
        &["cannot reach Baton", "certificate"],
    )
    .await;
    // Plaintext to a TLS listener: the handshake never starts.
    let (code, stderr) = baton(&["health", "--addr", &addr, "--timeout", "3s"], &[]).await;
    assert_eq!(code, EXIT_UNAVAILABLE, "plaintext to TLS; stderr: {stderr}");
    assert!(
        stderr.contains("cannot reach Baton") && stderr.contains("give --tls-ca"),
        "plaintext to TLS: {stderr}"
    );

    let unix = format!("unix://{}", tls_only.socket_path().display());
    expect_with(
        run(&["--tls-ca", &ca], &unix),
        EXIT_USAGE,
        &["need a TCP address", "Unix socket"],
    )
    .await;
    expect_with(
        run(&["--tls-ca", &ca, "--tls-cert", &client_cert], &addr),
        EXIT_USAGE,
        &["--tls-cert needs --tls-key"],
    )
    .await;
    expect_with(
        run(&["--tls-ca", &garbage], &addr),
        EXIT_USAGE,
        &["--tls-ca", "holds no PEM certificate"],
    )
    .await;
    drop(tls_only);

    let mutual = start(&redis, |c| {
        c.serving.tls = Some(TlsFiles {
            cert,
            key,
            client_ca: Some(client_ca_file),
        });
    })
    .await;
    let addr = mutual.addr().to_string();
    let identity = [
        "--tls-ca",
        &ca,
        "--tls-cert",
        &client_cert,
        "--tls-key",
        &client_key,
    ];
    expect_with(run(&identity, &addr), 0, &[]).await;
    let lock = ["lock", "--addr", &addr, "--wait", "0"];
    let command = ["m", "--", "true"];
    expect(
        &[&lock[..], &identity[..], &command[..]].concat(),
        &[],
        0,
        &[],
    )
    .await;
    expect_with(
        run(&["--tls-ca", &ca], &addr),
        EXIT_UNAUTHENTICATED,
        &[
            "Unauthenticated",
            "presented none",
            "--tls-cert and --tls-key",
        ],
    )
    .await;
}
