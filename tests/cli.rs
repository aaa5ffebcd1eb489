//! The command-line client (`baton lock`, `baton semaphore`, one-shot calls), run as the real
//! binary in a subprocess against a Baton and a redis-server of the test's own.

mod support;

use std::{
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::{Child, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use baton::proto::v1::{
    AutocompleteServiceAddRequest, AutocompleteTerm, LockServiceAcquireRequest,
    LockServiceDescribeRequest, SemaphoreServiceAcquireRequest,
    autocomplete_service_client::AutocompleteServiceClient,
    semaphore_service_client::SemaphoreServiceClient,
};
use nix::{sys::signal::Signal, unistd::Pid};
use support::{Baton, BatonProcess, RedisServer, ms, wait_until, within};

/// A `baton` client subprocess whose stdout and stderr go to files.
struct Run {
    child: Child,
    dir: tempfile::TempDir,
}

impl Run {
    /// Starts `baton ARGS...` talking to `addr`.
    fn start(addr: &str, args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = std::fs::File::create(dir.path().join("stdout")).expect("stdout file");
        let err = std::fs::File::create(dir.path().join("stderr")).expect("stderr file");
        let child = support::baton_command()
            .args(args)
            .env("BATON_ADDR", addr)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawning baton");
        Self { child, dir }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits"))
    }

    /// Waits up to `limit` for the process to exit.
    async fn exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for baton") {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!(
                    "baton did not exit within {limit:?}; stderr:\n{}",
                    self.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stdout")).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr")).unwrap_or_default()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `baton ARGS...` to completion (at most 20 s): its exit code, stdout and stderr.
async fn run(addr: &str, args: &[&str]) -> (i32, String, String) {
    let mut run = Run::start(addr, args);
    let status = run.exit(Duration::from_secs(20)).await;
    let code = status
        .code()
        .unwrap_or_else(|| panic!("baton died of a signal: {status:?}"));
    (code, run.stdout(), run.stderr())
}

fn unix_addr(path: &Path) -> String {
    format!("unix://{}", path.display())
}

/// Whether Baton says the lock `name` is held.
async fn held(baton: &Baton, name: &str) -> bool {
    baton
        .client()
        .await
        .describe(LockServiceDescribeRequest {
            name: name.to_owned(),
        })
        .await
        .expect("Describe answers")
        .into_inner()
        .held
}

/// Waits until `path` contains `line`.
async fn wait_for_line(path: &Path, line: &str) {
    wait_until(
        Duration::from_secs(15),
        &format!("{line:?} in {path:?}"),
        || {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let found = text.lines().any(|l| l == line);
            async move { if found { Ok(()) } else { Err(text) } }
        },
    )
    .await;
}

/// A shell command that writes `ready` to `file`, writes `stopped` there when SIGTERM comes,
/// and otherwise runs for a minute.
fn patient_child(file: &Path) -> String {
    let f = file.display();
    format!(
        "trap 'echo stopped >> {f}; exit 0' TERM; echo ready >> {f}; \
         i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done"
    )
}

/// The command's exit code comes back as baton's, it gets the lease's fencing token, and the
/// lock is free once the command is done (over TCP and over the Unix socket).
#[tokio::test]
async fn lock_passes_exit_code_and_fencing_token_through() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    for (addr, name) in [
        (baton.addr().to_string(), "tcp"),
        (unix_addr(baton.socket_path()), "unix"),
    ] {
        let file = dir.path().join(name);
        let script = format!("echo \"$BATON_FENCING_TOKEN\" > {}; exit 7", file.display());
        let (code, _, stderr) = run(&addr, &["lock", name, "--", "sh", "-c", &script]).await;
        assert_eq!(code, 7, "stderr: {stderr}");
        let token: u64 = std::fs::read_to_string(&file)
            .expect("the command ran")
            .trim()
            .parse()
            .expect("BATON_FENCING_TOKEN is a number");
        let state = baton
            .client()
            .await
            .describe(LockServiceDescribeRequest {
                name: name.to_owned(),
            })
            .await
            .expect("Describe answers")
            .into_inner();
        assert!(!state.held, "released once the command exited");
        assert_eq!(state.fencing_token, token);
    }
    let (code, _, _) = run(&baton.addr().to_string(), &["lock", "x", "--", "true"]).await;
    assert_eq!(code, 0);
}

/// Six `baton lock` processes appending a start and an end line to one file under one lock
/// never interleave.
#[tokio::test]
async fn lock_commands_serialise_appends_to_one_file() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("log");
    let script = format!(
        "echo start $$ >> {f}; sleep 0.2; echo end $$ >> {f}",
        f = file.display()
    );
    let addr = baton.addr().to_string();
    let mut runs: Vec<Run> = (0..6)
        .map(|_| Run::start(&addr, &["lock", "appends", "--", "sh", "-c", &script]))
        .collect();
    for run in &mut runs {
        let status = run.exit(Duration::from_secs(30)).await;
        assert_eq!(status.code(), Some(0), "stderr: {}", run.stderr());
    }
    let text = std::fs::read_to_string(&file).expect("the log");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 12, "{text}");
    for pair in lines.chunks(2) {
        let pid = pair[0].strip_prefix("start ").expect("a start line");
        assert_eq!(pair[1], format!("end {pid}"), "interleaved:\n{text}");
    }
}

/// A lease lost while the command runs (its keys deleted, as a Redis that lost its data) gets
/// the command SIGTERM and baton exits 76.
#[tokio::test]
async fn a_lost_lease_stops_the_command() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("events");
    let script = patient_child(&file);
    let mut run = Run::start(
        &baton.addr().to_string(),
        &[
            "lock", "doomed", "--ttl", "600ms", "--", "sh", "-c", &script,
        ],
    );
    wait_for_line(&file, "ready").await;
    let mut conn = redis.conn().await;
    let keys = conn.keys(&format!("{}*", baton.prefix())).await;
    assert!(!keys.is_empty(), "the lease's keys exist");
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let status = run.exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(76), "stderr: {}", run.stderr());
    assert!(run.stderr().contains("NOT_HELD"), "{}", run.stderr());
    wait_for_line(&file, "stopped").await;
}

/// A Baton frozen with SIGSTOP sends nothing, not even `lost`: the command is stopped when the
/// lease's expires_at passes on the local clock.
#[tokio::test]
async fn a_frozen_baton_lets_the_lease_expire_locally() {
    let redis = RedisServer::start().await;
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), support::unique_prefix()]);
    let process = BatonProcess::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("events");
    let script = patient_child(&file);
    let mut run = Run::start(
        &process.addr().to_string(),
        &["lock", "frozen", "--ttl", "1s", "--", "sh", "-c", &script],
    );
    wait_for_line(&file, "ready").await;
    let baton_pid = Pid::from_raw(i32::try_from(process.pid()).expect("pid fits"));
    nix::sys::signal::kill(baton_pid, Signal::SIGSTOP).expect("SIGSTOP");
    let frozen = Instant::now();
    let status = run.exit(Duration::from_secs(10)).await;
    let took = frozen.elapsed();
    nix::sys::signal::kill(baton_pid, Signal::SIGCONT).expect("SIGCONT");
    assert_eq!(status.code(), Some(76), "stderr: {}", run.stderr());
    assert!(run.stderr().contains("EXPIRED"), "{}", run.stderr());
    assert!(
        took < Duration::from_secs(3),
        "stopped {took:?} after the freeze; the ttl is 1 s"
    );
    wait_for_line(&file, "stopped").await;
}

/// A command that ignores SIGTERM is killed with SIGKILL once the grace period is over.
#[tokio::test]
async fn a_command_ignoring_sigterm_is_killed_after_the_grace_period() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("events");
    let script = format!(
        "trap '' TERM; echo ready >> {}; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
        file.display()
    );
    let mut run = Run::start(
        &baton.addr().to_string(),
        &[
            "lock", "stubborn", "--ttl", "600ms", "--grace", "500ms", "--", "sh", "-c", &script,
        ],
    );
    wait_for_line(&file, "ready").await;
    let mut conn = redis.conn().await;
    let keys = conn.keys(&format!("{}*", baton.prefix())).await;
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .expect("DEL");
    let status = run.exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(76), "stderr: {}", run.stderr());
}

/// SIGINT to baton (Ctrl-C) is passed to the command; once it is gone the lock is released at
/// once (30 s ttl) and baton exits as the command did: killed by SIGINT, 130.
#[tokio::test]
async fn ctrl_c_stops_the_command_and_releases_the_lock() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut run = Run::start(
        &baton.addr().to_string(),
        &["lock", "interrupted", "--ttl", "30s", "--", "sleep", "60"],
    );
    wait_until(Duration::from_secs(15), "the lock to be held", || async {
        if held(&baton, "interrupted").await {
            Ok(())
        } else {
            Err("free")
        }
    })
    .await;
    nix::sys::signal::kill(run.pid(), Signal::SIGINT).expect("SIGINT");
    let status = run.exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(130), "stderr: {}", run.stderr());
    assert!(
        !held(&baton, "interrupted").await,
        "released when baton exited, long before the ttl"
    );
}

/// A command killed by a signal makes baton exit 128 + the signal, like a shell.
#[tokio::test]
async fn a_command_killed_by_a_signal_gives_128_plus_the_signal() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let (code, _, stderr) = run(
        &baton.addr().to_string(),
        &["lock", "killed", "--", "sh", "-c", "kill -KILL $$"],
    )
    .await;
    assert_eq!(code, 128 + 9, "stderr: {stderr}");
    assert!(!held(&baton, "killed").await);
}

/// Not acquired within the wait, Baton unreachable, a command that does not exist and a ttl
/// Baton refuses each have their own exit code and a message.
#[tokio::test]
async fn failures_have_distinct_exit_codes() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = baton.addr().to_string();
    let holder = baton
        .client()
        .await
        .acquire(LockServiceAcquireRequest {
            name: "taken".to_owned(),
            ttl: Some(ms(30_000)),
            ..Default::default()
        })
        .await
        .expect("Acquire")
        .into_inner();
    assert!(holder.acquired);

    let (code, _, stderr) = run(&addr, &["lock", "taken", "--wait", "0", "--", "true"]).await;
    assert_eq!(code, 75, "{stderr}");
    assert!(stderr.contains("not acquired"), "{stderr}");
    let started = Instant::now();
    let (code, _, _) = run(&addr, &["lock", "taken", "--wait", "300ms", "--", "true"]).await;
    assert_eq!(code, 75);
    assert!(started.elapsed() >= Duration::from_millis(300));

    let (code, _, stderr) = run("127.0.0.1:1", &["lock", "x", "--", "true"]).await;
    assert_eq!(code, 69, "{stderr}");
    assert!(
        stderr.contains("cannot reach Baton at 127.0.0.1:1"),
        "{stderr}"
    );
    let (code, _, _) = run("127.0.0.1:1", &["health"]).await;
    assert_eq!(code, 69);

    let (code, _, stderr) = run(&addr, &["lock", "x", "--ttl", "5ms", "--", "true"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("ttl"), "{stderr}");

    let (code, _, stderr) = run(&addr, &["lock", "x", "--", "/nonexistent/command"]).await;
    assert_eq!(code, 127, "{stderr}");
    assert!(
        !held(&baton, "x").await,
        "released when the command could not start"
    );
}

/// `baton semaphore` runs the command with permits and passes its exit code through; with the
/// permits taken it does not run it.
#[tokio::test]
async fn semaphore_runs_the_command_with_permits() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = unix_addr(baton.socket_path());
    let (code, _, stderr) = run(
        &addr,
        &[
            "semaphore",
            "pool",
            "--limit",
            "2",
            "--permits",
            "2",
            "--",
            "sh",
            "-c",
            "exit 4",
        ],
    )
    .await;
    assert_eq!(code, 4, "{stderr}");
    let mut semaphores = SemaphoreServiceClient::new(support::channel(baton.addr()).await);
    let taken = semaphores
        .acquire(SemaphoreServiceAcquireRequest {
            name: "pool".to_owned(),
            limit: 2,
            permits: 1,
            ttl: Some(ms(30_000)),
            ..Default::default()
        })
        .await
        .expect("Acquire")
        .into_inner();
    assert!(taken.acquired);
    let dir = tempfile::tempdir().expect("temp dir");
    let marker: PathBuf = dir.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let (code, _, _) = run(
        &addr,
        &[
            "semaphore",
            "pool",
            "--limit",
            "2",
            "--permits",
            "2",
            "--wait",
            "0",
            "--",
            "sh",
            "-c",
            &touch,
        ],
    )
    .await;
    assert_eq!(code, 75);
    assert!(
        !marker.exists(),
        "the command did not run without its permits"
    );
}

/// describe, ratelimit check, complete and health print text, or JSON with --json, and exit 0
/// (1 for a denied check).
#[tokio::test]
async fn one_shot_commands_print_text_and_json() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = baton.addr().to_string();

    let (code, out, _) = run(&addr, &["health"]).await;
    assert_eq!((code, out.trim()), (0, "readiness: SERVING"));

    let (code, out, _) = run(&addr, &["describe", "lock", "nothing", "--json"]).await;
    assert_eq!(code, 0);
    let state: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(state["held"], false);
    let (code, out, _) = run(&addr, &["describe", "semaphore", "nothing"]).await;
    assert_eq!(code, 0);
    assert!(
        out.starts_with("semaphore \"nothing\": 0 of 0 permits"),
        "{out}"
    );

    let check = [
        "ratelimit",
        "check",
        "api",
        "--limit",
        "1",
        "--period",
        "1m",
        "--json",
    ];
    let (code, out, _) = run(&addr, &check).await;
    assert_eq!(code, 0);
    let first: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(first["allowed"], true);
    let (code, out, _) = run(&addr, &check).await;
    assert_eq!(code, 1);
    let second: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(second["allowed"], false);
    assert!(second["retry_after"].as_f64().expect("a number") > 0.0);

    let mut autocomplete = AutocompleteServiceClient::new(support::channel(baton.addr()).await);
    let terms = ["Anna Smith", "Annabel", "Bob"].map(|display| AutocompleteTerm {
        display: display.to_owned(),
        ..Default::default()
    });
    within(
        Duration::from_secs(5),
        autocomplete.add(AutocompleteServiceAddRequest {
            dictionary: "people".to_owned(),
            terms: terms.to_vec(),
            ..Default::default()
        }),
        "Add",
    )
    .await
    .expect("Add");
    let (code, out, _) = run(&addr, &["complete", "people", "ANN"]).await;
    assert_eq!((code, out.as_str()), (0, "Anna Smith\nAnnabel\n"));
    let (code, out, _) = run(
        &addr,
        &[
            "complete",
            "people",
            "smi",
            "--mode",
            "word-prefix",
            "--json",
        ],
    )
    .await;
    assert_eq!(code, 0);
    let page: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(page["suggestions"][0]["display"], "Anna Smith");
    assert_eq!(page["suggestions"][0]["match"], "word_prefix");
}

/// SIGTERM to baton is passed to the command, which traps it and exits 0: baton waits for it,
/// releases the lock and exits 0 too, rather than dying of the signal itself.
#[tokio::test]
async fn sigterm_is_forwarded_to_the_command() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("events");
    let script = patient_child(&file);
    let mut run = Run::start(
        &baton.addr().to_string(),
        &["lock", "terminated", "--", "sh", "-c", &script],
    );
    wait_for_line(&file, "ready").await;
    nix::sys::signal::kill(run.pid(), Signal::SIGTERM).expect("SIGTERM");
    let status = run.exit(Duration::from_secs(10)).await;
    assert_eq!(
        status.code(),
        Some(0),
        "the command trapped SIGTERM and exited 0"
    );
    assert!(status.signal().is_none());
    wait_for_line(&file, "stopped").await;
    assert!(!held(&baton, "terminated").await);
}
