//! `baton lock`, `baton semaphore` and `baton campaign` around a command, and `baton observe`.

use super::*;

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
    let frozen_baton = testkit::freeze(process.pid());
    let frozen = Instant::now();
    let status = run.exit(Duration::from_secs(10)).await;
    let took = frozen.elapsed();
    drop(frozen_baton);
    assert_eq!(status.code(), Some(76), "stderr: {}", run.stderr());
    assert!(run.stderr().contains("EXPIRED"), "{}", run.stderr());
    assert!(
        took < Duration::from_secs(3),
        "stopped {took:?} after the freeze; the ttl is 1 s"
    );
    wait_for_line(&file, "stopped").await;
}

/// `baton observe` through a Baton frozen with SIGSTOP ends, once its keepalive pings go
/// unanswered (10 s apart, 10 s to answer), as a broken connection (69): before, it waited
/// forever.
#[tokio::test]
async fn observe_through_a_frozen_baton_ends() {
    let redis = RedisServer::start().await;
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), support::unique_prefix()]);
    let process = BatonProcess::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let mut observer = Run::start(&process.addr().to_string(), &["observe", "frozen"]);
    wait_until(
        Duration::from_secs(15),
        "the observer's first state",
        || {
            let out = observer.stdout();
            async move { if out.is_empty() { Err(()) } else { Ok(()) } }
        },
    )
    .await;
    let frozen_baton = testkit::freeze(process.pid());
    let frozen = Instant::now();
    // 20 s of pings and their timeout, with room for a busy machine.
    let status = observer.exit(Duration::from_secs(60)).await;
    let took = frozen.elapsed();
    drop(frozen_baton);
    assert_eq!(status.code(), Some(69), "stderr: {}", observer.stderr());
    assert!(observer.stderr().contains("broke"), "{}", observer.stderr());
    assert!(
        took >= Duration::from_secs(10),
        "ended {took:?} after the freeze"
    );
}

/// `baton lock` and `baton semaphore` through a frozen Baton give up within their bounds: the
/// stream is opened within `--timeout` and the grant is due by `--wait` plus `--timeout`, for
/// each of the 4 attempts, so `--wait 1s --timeout 2s` exits 69 in about 10 s without running the
/// command, even once Baton runs again. Before, each attempt lasted until the connection's pings
/// failed (20 s), and a Baton thawed meanwhile granted the lock a minute late and ran it.
#[tokio::test]
async fn a_frozen_baton_bounds_the_wait_of_lock_and_semaphore() {
    let redis = RedisServer::start().await;
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), support::unique_prefix()]);
    let process = BatonProcess::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let ran = dir.path().join("ran");
    let script = format!("echo ran >> {}", ran.display());
    let addr = process.addr().to_string();
    let frozen_baton = support::freeze(process.pid());
    let frozen = Instant::now();
    let bounds = ["--wait", "1s", "--timeout", "2s"];
    let mut runs = [
        Run::start(
            &addr,
            &[
                &["lock", "frozen"][..],
                &bounds,
                &["--", "sh", "-c", &script],
            ]
            .concat(),
        ),
        Run::start(
            &addr,
            &[
                &["semaphore", "frozen", "--limit", "2"][..],
                &bounds,
                &["--", "sh", "-c", &script],
            ]
            .concat(),
        ),
    ];
    for run in &mut runs {
        // 4 attempts of at most 3 s and their retry delays; a busy machine may add some.
        let status = run.exit(Duration::from_secs(60)).await;
        assert_eq!(status.code(), Some(69), "stderr: {}", run.stderr());
        assert!(run.stderr().contains("--timeout"), "{}", run.stderr());
        assert!(
            run.stderr().contains("after 4 attempts"),
            "{}",
            run.stderr()
        );
    }
    let took = frozen.elapsed();
    drop(frozen_baton);
    assert!(
        took < Duration::from_secs(25),
        "gave up {took:?} after the freeze; 4 attempts of 3 s were asked"
    );
    assert!(!ran.exists(), "the command ran, yet baton said it gave up");
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

/// `baton` killed outright (SIGKILL) renews nothing: the command, which ignores SIGTERM, is
/// killed with it, long before the lease (1 s) lapses and another holder can start, and not left
/// running beside the next holder. Without it the command ran on for its whole minute.
#[tokio::test]
async fn a_killed_baton_takes_its_command_with_it() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("events");
    let pid_file = dir.path().join("pid");
    let script = format!(
        "trap '' TERM; echo $$ > {}; echo ready >> {}; i=0; \
         while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done",
        pid_file.display(),
        file.display()
    );
    let mut run = Run::start(
        &baton.addr().to_string(),
        &["lock", "killed", "--ttl", "1s", "--", "sh", "-c", &script],
    );
    wait_for_line(&file, "ready").await;
    let command = pid_in(&pid_file).await;
    assert!(alive(command), "the command runs");
    nix::sys::signal::kill(run.pid(), Signal::SIGKILL).expect("SIGKILL");
    let status = run.exit(Duration::from_secs(10)).await;
    assert_eq!(status.signal(), Some(9), "baton was killed");
    wait_gone(command, "the command killed with baton").await;
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
    // A SIGINT that came while baton was reading the grant ends it before the command starts:
    // its stream's closing (not a Release) frees the lock then, a moment after baton exited.
    wait_until(
        Duration::from_secs(5),
        "the lock released, long before the 30 s ttl",
        || async {
            if held(&baton, "interrupted").await {
                Err("held")
            } else {
                Ok(())
            }
        },
    )
    .await;
}

/// SIGUSR1 to baton is passed to the command, which runs on (with the lock); SIGQUIT is passed
/// on as a stop, like SIGINT: the command ends, baton exits as it did (131) and the lock is free.
/// Uncaught, either signal ended baton at once with the command still running, its lock freed.
#[tokio::test]
async fn user_and_quit_signals_reach_the_command() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let events = dir.path().join("events");
    let script = format!(
        "trap 'echo usr1 >> {f}' USR1; echo ready >> {f}; while :; do sleep 0.1; done",
        f = events.display()
    );
    let mut run = Run::start(
        &baton.addr().to_string(),
        &[
            "lock",
            "signalled",
            "--ttl",
            "30s",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    wait_for_line(&events, "ready").await;
    nix::sys::signal::kill(run.pid(), Signal::SIGUSR1).expect("SIGUSR1");
    wait_for_line(&events, "usr1").await;
    assert!(
        held(&baton, "signalled").await,
        "the command runs on, holding the lock"
    );
    nix::sys::signal::kill(run.pid(), Signal::SIGQUIT).expect("SIGQUIT");
    let status = run.exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(128 + 3), "stderr: {}", run.stderr());
    assert!(!held(&baton, "signalled").await);
}

/// A standard error that cannot be written (`/dev/full`, a closed pipe) changes no outcome:
/// `baton` exits with its code (75, not acquired) instead of panicking (101).
#[tokio::test]
async fn an_unwritable_stderr_keeps_the_exit_codes() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    take(&baton, "taken").await;
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let mut command = support::baton_command();
    command
        .args(["lock", "taken", "--wait", "0", "--", "true"])
        .env("BATON_ADDR", baton.addr().to_string())
        .stdin(Stdio::null())
        .stderr(full);
    // Waited for off the runtime, which serves Baton meanwhile.
    let status = within(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || command.status()),
        "baton to exit",
    )
    .await
    .expect("the task")
    .expect("running baton");
    assert_eq!(status.code(), Some(75));
}

/// A duration flag past ten years is bad usage (2), not a panic of the clock's arithmetic.
#[tokio::test]
async fn durations_past_ten_years_are_bad_usage() {
    let cases: [&[&str]; 3] = [
        &["lock", "x", "--wait", "10000000000000000000s", "--", "true"],
        &["lock", "x", "--grace", "100000000h", "--", "true"],
        &["describe", "lock", "x", "--timeout", "100000000h"],
    ];
    for args in cases {
        let (code, _, stderr) = run("127.0.0.1:1", args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(stderr.contains("longer than"), "{args:?}: {stderr}");
    }
}

/// A call deadline of zero is bad usage (exit 2, naming the flag), not a call that fails.
#[tokio::test]
async fn a_timeout_of_zero_is_bad_usage() {
    let (code, _, stderr) = run("127.0.0.1:1", &["describe", "lock", "x", "--timeout", "0s"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--timeout") && stderr.contains("no time"),
        "{stderr}"
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
    take(&baton, "taken").await;

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

/// A lease lost while the command runs stops the command's whole process group: a grandchild
/// started in the background by a shell dies with it, and one that ignores SIGTERM is killed
/// once the grace period is over, though the shell itself exited at once.
#[tokio::test]
async fn a_lost_lease_stops_the_commands_grandchildren() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    for stubborn in [false, true] {
        let name = format!("grandchildren-{stubborn}");
        let gc = dir.path().join(format!("gc-{stubborn}"));
        let events = dir.path().join(format!("events-{stubborn}"));
        let script = parent_of_grandchild(&gc, &events, stubborn);
        let mut run = Run::start(
            &baton.addr().to_string(),
            &[
                "lock", &name, "--ttl", "600ms", "--grace", "1s", "--", "sh", "-c", &script,
            ],
        );
        wait_for_line(&events, "ready").await;
        let grandchild = pid_in(&gc).await;
        assert!(alive(grandchild));
        delete_all_keys(&redis, &baton).await;
        let lost = Instant::now();
        let status = run.exit(Duration::from_secs(15)).await;
        assert_eq!(status.code(), Some(76), "stderr: {}", run.stderr());
        assert!(
            !alive(grandchild),
            "the grandchild (stubborn: {stubborn}) outlived baton"
        );
        if stubborn {
            assert!(
                lost.elapsed() >= Duration::from_secs(1),
                "killed before the grace period was over"
            );
        }
    }
}

/// SIGINT (Ctrl-C from a script or a shell's `kill -INT`) and SIGTERM to baton reach the
/// command's grandchildren too; the lock is released once they are gone.
#[tokio::test]
async fn interrupts_stop_the_commands_grandchildren_and_release() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    for (sig, code) in [(Signal::SIGINT, 130), (Signal::SIGTERM, 143)] {
        let name = format!("interrupted-{sig}");
        let gc = dir.path().join(format!("gc-{sig}"));
        let events = dir.path().join(format!("events-{sig}"));
        // A non-interactive shell starts background commands ignoring SIGINT: only the group's
        // SIGKILL after the grace period ends that grandchild.
        let script = parent_of_grandchild(&gc, &events, false);
        let mut run = Run::start(
            &baton.addr().to_string(),
            &[
                "lock", &name, "--ttl", "30s", "--grace", "1s", "--", "sh", "-c", &script,
            ],
        );
        wait_for_line(&events, "ready").await;
        let grandchild = pid_in(&gc).await;
        nix::sys::signal::kill(run.pid(), sig).expect("signal");
        let status = run.exit(Duration::from_secs(15)).await;
        assert_eq!(status.code(), Some(code), "stderr: {}", run.stderr());
        assert!(!alive(grandchild), "the grandchild outlived baton ({sig})");
        assert!(!held(&baton, &name).await, "released at once (30 s ttl)");
    }
}

/// A command whose shell exits by itself leaves its background grandchild running (as a shell
/// would), and baton passes its code through: only a loss or an interrupt stops the group.
#[tokio::test]
async fn a_command_exiting_by_itself_leaves_its_background_work_alone() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let gc = dir.path().join("gc");
    let script = format!("sleep 600 & echo $! > {}; exit 5", gc.display());
    let (code, _, stderr) = run(
        &baton.addr().to_string(),
        &["lock", "leaves", "--", "sh", "-c", &script],
    )
    .await;
    assert_eq!(code, 5, "{stderr}");
    let grandchild = pid_in(&gc).await;
    assert!(alive(grandchild));
    nix::sys::signal::kill(Pid::from_raw(grandchild), Signal::SIGKILL).expect("cleaning up");
}

/// Run by an interactive shell on a terminal, the command gets the terminal: its own process
/// group is the terminal's foreground group (it can read the terminal, and baton is not stopped
/// for handing it over), and Ctrl-C typed there reaches it, once, as a shell's job; baton passes
/// its exit code through and releases the lock.
#[tokio::test]
async fn a_command_run_from_a_terminal_gets_the_terminal() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name);
    // $PPID is baton; /proc/self/stat fields 5 and 8: the process group, the terminal's
    // foreground group.
    let command = format!(
        "echo $PPID $(cut -d' ' -f5,8 /proc/self/stat) > {ids}; read l; echo \"$l\" > {line}; \
         trap 'echo INT >> {events}; exit 3' INT; echo ready >> {events}; \
         while :; do sleep 0.1; done\n",
        ids = path("ids").display(),
        line = path("line").display(),
        events = path("events").display()
    );
    std::fs::write(path("command.sh"), command).expect("command.sh");
    // The job an interactive shell runs (with job control, as at a prompt), then its code.
    let job = format!(
        "{baton} lock terminal --ttl 30s -- sh {command}; echo $? > {code}",
        baton = env!("CARGO_BIN_EXE_baton"),
        command = path("command.sh").display(),
        code = path("code").display()
    );
    let pty = nix::pty::openpty(None, None).expect("openpty");
    let out = std::fs::File::create(path("stderr")).expect("stderr file");
    // A session of its own whose controlling terminal is the pty, as a login shell's.
    let mut setsid = std::process::Command::new("setsid");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("BATON_") {
            setsid.env_remove(key);
        }
    }
    let mut shell = setsid
        .args(["--ctty", "bash", "--norc", "--noprofile", "-i", "-c", &job])
        .env("BATON_ADDR", baton.addr().to_string())
        .stdin(Stdio::from(pty.slave))
        .stdout(Stdio::null())
        .stderr(out)
        .spawn()
        .expect("spawning bash");
    let mut master = std::fs::File::from(pty.master);
    let ids = wait_until(Duration::from_secs(15), "the command's ids", || {
        let text = std::fs::read_to_string(path("ids")).unwrap_or_default();
        async move {
            let v: Vec<i32> = text
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            if v.len() == 3 { Ok(v) } else { Err(text) }
        }
    })
    .await;
    let (baton_pid, group, foreground) = (ids[0], ids[1], ids[2]);
    assert_ne!(
        group, baton_pid,
        "the command runs in a process group of its own"
    );
    assert_eq!(
        group, foreground,
        "the command's group is the terminal's foreground group"
    );
    master.write_all(b"typed\n").expect("typing");
    wait_for_line(&path("line"), "typed").await;
    wait_for_line(&path("events"), "ready").await;
    master.write_all(&[0x03]).expect("Ctrl-C");
    wait_for_line(&path("code"), "3").await;
    let interrupts = std::fs::read_to_string(path("events")).expect("events");
    assert_eq!(interrupts.matches("INT").count(), 1, "{interrupts}");
    assert!(!held(&baton, "terminal").await);
    let deadline = Instant::now() + Duration::from_secs(10);
    while shell.try_wait().expect("waiting").is_none() {
        assert!(Instant::now() < deadline, "bash did not exit");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// `--shared`: two `baton lock --shared` commands run at once; an exclusive one waits for both.
#[tokio::test]
async fn shared_locks_run_commands_together() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = baton.addr().to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let a = dir.path().join("a");
    let script_a = format!("echo in > {}; read x", a.display());
    let mut reader = Run::start_piped(
        &addr,
        &["lock", "doc", "--shared", "--", "sh", "-c", &script_a],
    );
    wait_for_line(&a, "in").await;
    let b = dir.path().join("b");
    let script_b = format!("echo in > {}", b.display());
    let (code, _, stderr) = run(
        &addr,
        &[
            "lock", "doc", "--shared", "--wait", "5s", "--", "sh", "-c", &script_b,
        ],
    )
    .await;
    assert_eq!(code, 0, "a second reader ran beside the first: {stderr}");
    assert!(b.exists());
    let (code, _, _) = run(&addr, &["lock", "doc", "--wait", "0", "--", "true"]).await;
    assert_eq!(code, 75, "a writer is kept out while a reader holds it");
    reader.say("done");
    let status = reader.exit(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(0), "stderr: {}", reader.stderr());
    let (code, _, _) = run(&addr, &["lock", "doc", "--wait", "5s", "--", "true"]).await;
    assert_eq!(code, 0);
}

/// `baton campaign`: the first candidate's command runs with its term; the second waits (as
/// `baton leader` shows) and runs once the first is done, with a higher term. `baton observe`
/// sees the first leader, then the second.
#[tokio::test]
async fn campaigns_take_turns_and_observers_see_each_leader() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = unix_addr(baton.socket_path());
    let dir = tempfile::tempdir().expect("temp dir");
    let (code, out, _) = run(&addr, &["leader", "sched", "--json"]).await;
    assert_eq!(code, 1, "nobody leads yet: {out}");
    let state: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(state["leader"], serde_json::Value::Null);

    let observer = Run::start(&addr, &["observe", "sched", "--json"]);
    let first = wait_until(
        Duration::from_secs(15),
        "the observer's first state",
        || {
            let out = observer.stdout();
            async move { out.lines().next().map(str::to_owned).ok_or(()) }
        },
    )
    .await;
    let first: serde_json::Value = serde_json::from_str(&first).expect("JSON");
    assert_eq!(
        first["leader"],
        serde_json::Value::Null,
        "the first state: nobody led"
    );
    let term_file = |who: &str| dir.path().join(format!("{who}.term"));
    let script = |who: &str, wait: bool| {
        format!(
            "echo \"$BATON_ELECTION_TERM $BATON_FENCING_TOKEN\" > {}{}",
            term_file(who).display(),
            if wait { "; read x" } else { "" }
        )
    };
    let mut a = Run::start_piped(
        &addr,
        &[
            "campaign",
            "sched",
            "--value",
            "pod-a",
            "--",
            "sh",
            "-c",
            &script("a", true),
        ],
    );
    let terms = |who: &str| {
        let file = term_file(who);
        async move {
            wait_until(Duration::from_secs(15), &format!("{file:?}"), || {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                async move {
                    let t: Vec<u64> = text
                        .split_whitespace()
                        .filter_map(|w| w.parse().ok())
                        .collect();
                    if t.len() == 2 { Ok(t) } else { Err(text) }
                }
            })
            .await
        }
    };
    let a_terms = terms("a").await;
    assert_eq!(a_terms[0], a_terms[1], "BATON_FENCING_TOKEN is the term");
    let mut b = Run::start(
        &addr,
        &[
            "campaign",
            "sched",
            "--value",
            "pod-b",
            "--",
            "sh",
            "-c",
            &script("b", false),
        ],
    );
    let leader = wait_until(Duration::from_secs(15), "b waiting behind a", || {
        let addr = addr.clone();
        async move {
            let (code, out, _) = run(&addr, &["leader", "sched", "--json"]).await;
            let state: serde_json::Value = serde_json::from_str(&out).expect("JSON");
            if code == 0 && state["candidates"] == 1 {
                Ok(state)
            } else {
                Err(out)
            }
        }
    })
    .await;
    assert_eq!(leader["leader"]["value"], "pod-a");
    assert_eq!(leader["leader"]["term"], a_terms[0]);
    assert!(!term_file("b").exists(), "b ran while a led");

    a.say("done");
    assert_eq!(
        a.exit(Duration::from_secs(10)).await.code(),
        Some(0),
        "{}",
        a.stderr()
    );
    assert_eq!(
        b.exit(Duration::from_secs(10)).await.code(),
        Some(0),
        "{}",
        b.stderr()
    );
    let b_terms = terms("b").await;
    assert!(b_terms[0] > a_terms[0], "{b_terms:?} after {a_terms:?}");

    let seen = wait_until(Duration::from_secs(15), "the observer to see pod-b", || {
        let out = observer.stdout();
        async move {
            let states: Vec<serde_json::Value> = out
                .lines()
                .map(|l| serde_json::from_str(l).expect("a JSON line"))
                .collect();
            let leaders: Vec<(String, u64)> = states
                .iter()
                .filter(|s| !s["leader"].is_null())
                .map(|s| {
                    (
                        s["leader"]["value"].as_str().expect("value").to_owned(),
                        s["leader"]["term"].as_u64().expect("term"),
                    )
                })
                .collect();
            if leaders.last().is_some_and(|(v, _)| v == "pod-b") {
                Ok((states, leaders))
            } else {
                Err(out)
            }
        }
    })
    .await;
    let (states, leaders) = seen;
    assert_eq!(
        leaders.iter().map(|(v, _)| v.as_str()).collect::<Vec<_>>(),
        ["pod-a", "pod-b"],
        "{states:?}"
    );
    assert_eq!(leaders[0].1, a_terms[0]);
    assert_eq!(leaders[1].1, b_terms[0]);
}

/// A leadership lost while the command runs (the election's keys deleted) stops the command and
/// its grandchildren, and baton exits 76; a campaign not elected within `--wait` exits 75.
#[tokio::test]
async fn a_lost_leadership_stops_the_command() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = baton.addr().to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let gc = dir.path().join("gc");
    let events = dir.path().join("events");
    let script = parent_of_grandchild(&gc, &events, false);
    let mut run_ = Run::start(
        &addr,
        &[
            "campaign", "doomed", "--ttl", "600ms", "--", "sh", "-c", &script,
        ],
    );
    wait_for_line(&events, "ready").await;
    let grandchild = pid_in(&gc).await;

    let started = Instant::now();
    let (code, _, stderr) = run(
        &addr,
        &["campaign", "doomed", "--wait", "300ms", "--", "true"],
    )
    .await;
    assert_eq!(code, 75, "{stderr}");
    assert!(stderr.contains("not elected"), "{stderr}");
    assert!(started.elapsed() >= Duration::from_millis(300));

    delete_all_keys(&redis, &baton).await;
    let status = run_.exit(Duration::from_secs(15)).await;
    assert_eq!(status.code(), Some(76), "stderr: {}", run_.stderr());
    assert!(run_.stderr().contains("leadership"), "{}", run_.stderr());
    wait_gone(grandchild, "the grandchild to die with the leadership").await;
}

/// Starts `baton ARGS...` with its standard output a pipe, reads its first line, closes the
/// pipe's reading end (as `| head -1` does) and returns that line and the process.
async fn first_line_then_close(addr: &str, args: &[&str]) -> (String, Child) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    let child = support::baton_command()
        .args(args)
        .env("BATON_ADDR", addr)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning baton");
    let line = within(
        Duration::from_secs(15),
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(reader), &mut line)
                .expect("reading baton's first line");
            // The reader is dropped here: the pipe has no reader any more.
            line
        }),
        "baton's first line",
    )
    .await
    .expect("the reading task");
    (line, child)
}

/// Waits up to `limit` for `child` to exit (killing it past that) and returns its exit code.
async fn exit_code_within(child: &mut Child, limit: Duration, what: &str) -> Option<i32> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for baton") {
            return status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not exit within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `baton observe X | head -1` and `baton hold | head -1` end (exit 0, a closed pipe being no
/// error) once the reader is gone, though nothing changes and they write nothing more: they
/// watch standard output for the closed pipe, as `tail -f` does. `hold` releases its lock as it
/// ends. A pipe closed before the first line ends them at that line's write. Before, both ran
/// on for ever, unread, and `hold` kept taking the lock.
#[tokio::test]
async fn observe_and_hold_end_once_their_reader_is_gone() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = baton.addr().to_string();

    let (line, mut observer) = first_line_then_close(&addr, &["observe", "unread"]).await;
    assert!(line.starts_with("no leader"), "{line:?}");
    let code = exit_code_within(&mut observer, Duration::from_secs(15), "baton observe").await;
    assert_eq!(code, Some(0));

    let (line, mut holder) = first_line_then_close(
        &addr,
        &[
            "hold",
            "--name",
            "unread",
            "--owner",
            "me",
            "--hold-for",
            "10m",
        ],
    )
    .await;
    // It held the lock (and may already have released it: the reader is gone).
    assert!(line.starts_with("me: holds"), "{line:?}");
    let code = exit_code_within(&mut holder, Duration::from_secs(15), "baton hold").await;
    assert_eq!(code, Some(0));
    wait_until(Duration::from_secs(10), "the lock released", || {
        let baton = &baton;
        async move {
            if held(baton, "unread").await {
                Err(())
            } else {
                Ok(())
            }
        }
    })
    .await;

    // The reader gone before the first line.
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    let mut observer = support::baton_command()
        .args(["observe", "unread"])
        .env("BATON_ADDR", &addr)
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning baton");
    let code = exit_code_within(&mut observer, Duration::from_secs(15), "baton observe").await;
    assert_eq!(code, Some(0));
}

/// `baton observe --timeout 2s` through a frozen Baton gives up after `--timeout` (exit 69,
/// naming it), as every other call does: opening the stream and its first state are one call.
/// Before, it waited for the connection's pings to fail, 20 s.
#[tokio::test]
async fn observe_through_a_frozen_baton_keeps_to_the_timeout() {
    let redis = RedisServer::start().await;
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), support::unique_prefix()]);
    let process = BatonProcess::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let frozen_baton = support::freeze(process.pid());
    let frozen = Instant::now();
    let (code, out, stderr) = run(
        &process.addr().to_string(),
        &["observe", "frozen", "--timeout", "2s"],
    )
    .await;
    let took = frozen.elapsed();
    drop(frozen_baton);
    assert_eq!(code, 69, "{stderr}");
    assert!(out.is_empty(), "{out}");
    assert!(stderr.contains("--timeout"), "{stderr}");
    assert!(
        took < Duration::from_secs(10),
        "gave up {took:?} after the freeze; --timeout was 2 s"
    );
}

/// A negative duration is bad usage (2) saying so, for every duration flag, written either way
/// (`--ttl -1s`, `--ttl=-1s`): before, `-1s` was taken for a flag (with a tip to write `-- -1`,
/// wrong for `lock`, whose `--` starts the command) or refused as "expected number at 0".
#[tokio::test]
async fn negative_durations_are_bad_usage() {
    let cases: [&[&str]; 7] = [
        &["lock", "x", "--ttl", "-1s", "--", "true"],
        &["lock", "x", "--ttl=-1s", "--", "true"],
        &["lock", "x", "--wait", "-5ms", "--", "true"],
        &[
            "semaphore",
            "x",
            "--limit",
            "1",
            "--grace",
            "-1s",
            "--",
            "true",
        ],
        &["describe", "lock", "x", "--timeout", "-2s"],
        &["ratelimit", "check", "k", "--limit", "1", "--period", "-1m"],
        &["hold", "--pause", "-1s"],
    ];
    for args in cases {
        let (code, _, stderr) = run("127.0.0.1:1", args).await;
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(
            stderr.contains("durations cannot be negative"),
            "{args:?}: {stderr}"
        );
    }
}

/// `--limit` of `baton complete` outside 1 to 1000 is bad usage (2), as its help says.
#[tokio::test]
async fn a_complete_limit_outside_its_range_is_bad_usage() {
    for limit in ["0", "1001"] {
        let (code, _, stderr) = run("127.0.0.1:1", &["complete", "d", "a", "--limit", limit]).await;
        assert_eq!(code, 2, "--limit {limit}: {stderr}");
        assert!(stderr.contains("1..=1000"), "--limit {limit}: {stderr}");
    }
}

/// `--help` says that `--timeout` bounds each attempt and that `lock`, `semaphore` and
/// `campaign` make 4 of them.
#[tokio::test]
async fn the_timeout_help_tells_of_the_retries() {
    for command in ["lock", "semaphore", "campaign", "observe"] {
        let (code, out, stderr) = run("127.0.0.1:1", &[command, "--help"]).await;
        assert_eq!(code, 0, "{stderr}");
        let help = out.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(help.contains("4 attempts"), "{command}: {out}");
        assert!(help.contains("each with this deadline"), "{command}: {out}");
    }
}
