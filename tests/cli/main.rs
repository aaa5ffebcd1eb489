//! The command-line client, run as the real binary in a subprocess against a Baton and a
//! redis-server of the test's own:
//!
//! - [`runners`]: `baton lock`, `baton semaphore` and `baton campaign` around a command
//!   (exit codes, signals, lost leases, frozen and killed Batons) and `baton observe`;
//! - [`oneshot`]: the one-shot calls (`describe`, `ratelimit`, `complete`, `health`), text and
//!   JSON, and output that cannot be written;
//! - [`load`]: `baton autocomplete load`.
//!
//! This file holds the helpers they share.

#[path = "../support/mod.rs"]
mod support;

mod load;
mod oneshot;
mod runners;

use std::{
    io::Write,
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ExitStatus, Stdio},
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
    /// Starts `baton ARGS...` talking to `addr`, with nothing on its standard input.
    fn start(addr: &str, args: &[&str]) -> Self {
        Self::start_with(addr, args, Stdio::null())
    }

    /// Starts `baton ARGS...` talking to `addr`, its standard input (which the command inherits)
    /// a pipe written with [`Run::say`].
    fn start_piped(addr: &str, args: &[&str]) -> Self {
        Self::start_with(addr, args, Stdio::piped())
    }

    fn start_with(addr: &str, args: &[&str], stdin: Stdio) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let out = std::fs::File::create(dir.path().join("stdout")).expect("stdout file");
        let err = std::fs::File::create(dir.path().join("stderr")).expect("stderr file");
        let child = support::baton_command()
            .args(args)
            .env("BATON_ADDR", addr)
            .stdin(stdin)
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawning baton");
        Self { child, dir }
    }

    /// Writes a line to the standard input of a [`Run::start_piped`] process.
    fn say(&mut self, line: &str) {
        let stdin: &mut ChildStdin = self.child.stdin.as_mut().expect("a piped stdin");
        writeln!(stdin, "{line}").expect("writing to baton's stdin");
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

/// Takes the lock `name` for 30 s through `baton`, so that `baton lock` finds it taken.
async fn take(baton: &Baton, name: &str) {
    let holder = baton
        .client()
        .await
        .acquire(LockServiceAcquireRequest {
            name: name.to_owned(),
            ttl: Some(ms(30_000)),
            ..Default::default()
        })
        .await
        .expect("Acquire")
        .into_inner();
    assert!(holder.acquired);
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

/// Whether process `pid` runs: it exists and is not a zombie (a dead process whose parent has not
/// reaped it yet).
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) STATE ...`: the state follows the last parenthesis.
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// The pid a command wrote to `file`.
async fn pid_in(file: &Path) -> i32 {
    wait_until(
        Duration::from_secs(15),
        &format!("a pid in {file:?}"),
        || {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            async move { text.trim().parse::<i32>().map_err(|_| text) }
        },
    )
    .await
}

/// Waits (bounded) until process `pid` has ended.
async fn wait_gone(pid: i32, what: &str) {
    wait_until(Duration::from_secs(5), what, || async move {
        if alive(pid) { Err(pid) } else { Ok(()) }
    })
    .await;
}

/// A shell command that starts a grandchild (`sleep`, which ignores SIGTERM when `stubborn`),
/// writes its pid to `gc` and `ready` to `events`, and waits for it.
fn parent_of_grandchild(gc: &Path, events: &Path, stubborn: bool) -> String {
    let grandchild = if stubborn {
        "sh -c 'trap \"\" TERM; exec sleep 600'"
    } else {
        "sleep 600"
    };
    format!(
        "{grandchild} & echo $! > {gc}; echo ready >> {events}; wait",
        gc = gc.display(),
        events = events.display()
    )
}

/// Deletes every key of `baton`'s prefix: the leases there are gone, as after data loss.
async fn delete_all_keys(redis: &RedisServer, baton: &Baton) {
    let mut conn = redis.conn().await;
    let keys = conn.keys(&format!("{}*", baton.prefix())).await;
    assert!(!keys.is_empty(), "the lease's keys exist");
    let _: () = redis::cmd("DEL")
        .arg(&keys)
        .query_async(&mut conn)
        .await
        .expect("DEL");
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

/// `baton serve` on `addr` (a child of the test, killed when dropped), once it answers.
struct Serve(Child);

impl Serve {
    async fn start(addr: &str, args: &[String]) -> Self {
        let child = support::baton_command()
            .args(["serve", "--listen", addr])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning baton serve");
        let serve = Self(child);
        let endpoint = format!("http://{addr}");
        wait_until(Duration::from_secs(10), "baton serve to answer", || {
            let endpoint = endpoint.clone();
            async move {
                let channel = tonic::transport::Endpoint::from_shared(endpoint)
                    .expect("endpoint")
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
                let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
                match support::health_status(&mut health, "readiness").await {
                    Ok(tonic_health::pb::health_check_response::ServingStatus::Serving) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        })
        .await;
        serve
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How many terms dictionary `name` has.
async fn term_count(addr: &str, name: &str) -> u64 {
    let mut client =
        AutocompleteServiceClient::new(support::channel(addr.parse().expect("an address")).await);
    within(
        Duration::from_secs(5),
        client.describe(baton::proto::v1::AutocompleteServiceDescribeRequest {
            dictionary: name.to_owned(),
        }),
        "Describe",
    )
    .await
    .expect("Describe")
    .into_inner()
    .term_count
}

/// The JSON a finished `baton ... --json` printed.
fn json_of(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}
