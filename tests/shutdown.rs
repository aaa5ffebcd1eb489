//! Shutdown and startup of Baton: the real binary on SIGTERM and with a bad configuration, and
//! the in-process drain when the shutdown token is cancelled.

mod support;

use std::{process::ExitStatus, time::Duration};

use baton::proto::v1::{
    self as pb, LeaseLostReason, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event as HoldEvent,
    lock_service_keep_alive_response::Event as KeepAliveEvent,
};
use support::{
    Baton, BatonProcess, RedisServer, baton_command, lock_key, ms, run_baton, unique_prefix,
    wait_for_health, within,
};
use tokio::time::Instant;
use tonic::{Code, Streaming, transport::Channel};
use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient};

/// Sends `baton` SIGTERM and waits up to `limit` for it to exit: its status, and how long after
/// the signal it exited.
async fn sigterm_and_wait(baton: &mut BatonProcess, limit: Duration) -> (ExitStatus, Duration) {
    let signalled = Instant::now();
    baton.sigterm();
    let status = baton
        .wait_timeout(limit)
        .await
        .unwrap_or_else(|| panic!("baton still running {limit:?} after SIGTERM"));
    (status, signalled.elapsed())
}

/// How long readiness may take to change: it checks Redis every second.
const READY: Duration = Duration::from_secs(5);

type Client = LockServiceClient<Channel>;

async fn hold(
    client: &mut Client,
    name: &str,
    ttl_ms: u64,
) -> Streaming<pb::LockServiceHoldResponse> {
    let mut stream = client
        .hold(pb::LockServiceHoldRequest {
            name: name.to_owned(),
            ttl: Some(ms(ttl_ms)),
            wait_timeout: None,
            owner: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("Hold {name:?} failed: {s:?}"))
        .into_inner();
    let first = within(
        Duration::from_secs(2),
        stream.message(),
        "the acquired event",
    )
    .await
    .expect("the Hold stream")
    .expect("an event");
    assert!(
        matches!(first.event, Some(HoldEvent::Acquired(_))),
        "expected acquired, got {first:?}"
    );
    stream
}

/// The rest of a Hold stream after shutdown: its events and how it ended.
async fn rest_of_hold(
    stream: &mut Streaming<pb::LockServiceHoldResponse>,
) -> (Vec<HoldEvent>, Result<(), tonic::Status>) {
    let mut events = Vec::new();
    loop {
        // Longer than a shutdown delay (5 s) and a drain (5 s) with no renewal between them.
        match within(
            Duration::from_secs(20),
            stream.message(),
            "the Hold stream to end",
        )
        .await
        {
            Ok(Some(m)) => events.push(m.event.expect("an event with a payload")),
            Ok(None) => return (events, Ok(())),
            Err(s) => return (events, Err(s)),
        }
    }
}

/// Asserts a Hold stream ended with `lost` SHUTDOWN (after any renewals) and then closed cleanly.
fn assert_lost_for_shutdown(name: &str, events: &[HoldEvent], end: &Result<(), tonic::Status>) {
    let last = events.iter().rfind(|e| !matches!(e, HoldEvent::Renewed(_)));
    match last {
        Some(HoldEvent::Lost(lost)) => {
            assert_eq!(lost.reason(), LeaseLostReason::Shutdown, "{name}: {lost:?}")
        }
        other => panic!("{name}: expected lost SHUTDOWN, got {other:?} (events {events:?})"),
    }
    assert!(end.is_ok(), "{name}: the stream ended with {end:?}");
}

async fn lock_exists(redis: &RedisServer, key: &str) -> bool {
    let mut conn = redis.client().await;
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(&mut conn)
        .await
        .expect("EXISTS")
        == 1
}

/// SIGTERM to the real binary (drain deadline 5 s) with two Hold streams open: both get `lost`
/// SHUTDOWN, their locks are released in Redis, and the process exits with success well within
/// the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_releases_holds_and_exits_within_the_drain_deadline() {
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let url = redis.url();
    let mut baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "--drain-timeout",
        "5s",
    ])
    .await;
    let mut a = baton.client().await;
    let mut b = baton.client().await;
    let mut first = hold(&mut a, "first", 30_000).await;
    let mut second = hold(&mut b, "second", 30_000).await;
    for name in ["first", "second"] {
        assert!(
            lock_exists(&redis, &lock_key(&prefix, name)).await,
            "{name} is held"
        );
    }

    let (status, took) = sigterm_and_wait(&mut baton, Duration::from_secs(10)).await;
    assert!(
        status.success(),
        "exit status {status}; stderr:\n{}",
        baton.stderr()
    );
    assert!(
        took < Duration::from_secs(5),
        "exited {took:?} after SIGTERM, past the 5 s drain deadline"
    );

    let (events, end) = rest_of_hold(&mut first).await;
    assert_lost_for_shutdown("first", &events, &end);
    let (events, end) = rest_of_hold(&mut second).await;
    assert_lost_for_shutdown("second", &events, &end);
    for name in ["first", "second"] {
        assert!(
            !lock_exists(&redis, &lock_key(&prefix, name)).await,
            "{name} was released on shutdown"
        );
    }
    let stderr = baton.stderr();
    assert!(
        stderr.contains("SIGTERM"),
        "the log says why it stopped:\n{stderr}"
    );
}

/// The binary with several bad flags (and a bad `BATON_*` variable) exits with code 2 and lists
/// every problem, each naming its flag, before doing anything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_configuration_exits_2_listing_every_error() {
    let mut command = baton_command();
    command
        .args(["serve", "--listen", "nowhere"])
        .args(["--redis-url", "http://not-redis"])
        .args(["--key-prefix", "a{b"])
        .args(["--redis-command-timeout", "forever"])
        .args(["--drain-timeout", "2h"])
        .args(["--log-format", "xml"])
        .env("BATON_REDIS_POOL_SIZE", "0");
    let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(2), "stderr:\n{stderr}");
    for flag in [
        "--listen",
        "--redis-url",
        "--key-prefix",
        "--redis-command-timeout",
        "--drain-timeout",
        "--log-format",
        "BATON_REDIS_POOL_SIZE",
    ] {
        assert!(
            stderr.contains(flag),
            "{flag} is not reported in:\n{stderr}"
        );
    }
    let listed = stderr
        .lines()
        .filter(|l| l.trim_start().starts_with("- "))
        .count();
    assert_eq!(listed, 7, "one line per problem:\n{stderr}");
}

/// Cancelling `serve`'s shutdown token drains: open Hold and KeepAlive streams get `lost`
/// SHUTDOWN with their locks released, a caller waiting for a lock gets UNAVAILABLE, serve
/// returns Ok within the drain deadline, and the socket file is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_serve_drains_streams_and_waiters() {
    let redis = RedisServer::start().await;
    let mut baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut held = hold(&mut client, "held", 30_000).await;
    let acquired = client
        .acquire(pb::LockServiceAcquireRequest {
            name: "kept".into(),
            ttl: Some(ms(30_000)),
            wait_timeout: None,
            owner: String::new(),
            ..Default::default()
        })
        .await
        .expect("Acquire")
        .into_inner();
    let lease = acquired.lease.expect("acquired");
    let mut kept = client
        .keep_alive(pb::LockServiceKeepAliveRequest {
            name: "kept".into(),
            token: lease.token.clone(),
            ttl: None,
        })
        .await
        .expect("KeepAlive")
        .into_inner();
    let mut waiter_client = baton.client().await;
    let mut waiter = tokio::spawn(async move {
        waiter_client
            .acquire(pb::LockServiceAcquireRequest {
                name: "held".into(),
                ttl: Some(ms(1_000)),
                wait_timeout: Some(ms(30_000)),
                owner: String::new(),
                ..Default::default()
            })
            .await
    });
    let describer = client.clone();
    tokio::select! {
        () = support::wait_until(Duration::from_secs(5), "a waiter on \"held\"", || {
            let mut describer = describer.clone();
            async move {
                let d = describer
                    .describe(pb::LockServiceDescribeRequest { name: "held".into() })
                    .await
                    .expect("Describe")
                    .into_inner();
                if d.waiters == 1 { Ok(()) } else { Err(d) }
            }
        }) => {}
        outcome = &mut waiter => panic!("the waiter ended early: {outcome:?}"),
    }

    let started = Instant::now();
    let socket = baton.socket_path().to_owned();
    let serve = tokio::spawn(async move {
        let result = baton.shutdown().await;
        (result, baton)
    });

    let (events, end) = rest_of_hold(&mut held).await;
    assert_lost_for_shutdown("held", &events, &end);
    let mut kept_events = Vec::new();
    loop {
        match within(
            Duration::from_secs(5),
            kept.message(),
            "the KeepAlive stream to end",
        )
        .await
        {
            Ok(Some(m)) => kept_events.push(m.event.expect("an event")),
            Ok(None) => break,
            Err(s) => panic!("the KeepAlive stream failed: {s:?}"),
        }
    }
    match kept_events.last() {
        Some(KeepAliveEvent::Lost(lost)) => {
            assert_eq!(lost.reason(), LeaseLostReason::Shutdown, "{lost:?}")
        }
        other => panic!("expected lost SHUTDOWN on KeepAlive, got {other:?}"),
    }
    let waited = within(Duration::from_secs(5), waiter, "the waiter to answer")
        .await
        .expect("waiter task");
    match waited {
        Err(s) => assert_eq!(s.code(), Code::Unavailable, "{s:?}"),
        Ok(r) => panic!("a waiter during shutdown must get UNAVAILABLE, got {r:?}"),
    }

    let (result, baton) = within(Duration::from_secs(10), serve, "serve to return")
        .await
        .expect("shutdown task");
    result.expect("serve returns Ok after a drain");
    let took = started.elapsed();
    assert!(
        took < support::TEST_DRAIN_TIMEOUT,
        "the drain took {took:?}, as long as its deadline"
    );
    assert!(!socket.exists(), "the socket file is removed");
    for name in ["held", "kept"] {
        assert!(
            !lock_exists(&redis, &baton.lock_key(name)).await,
            "{name} was released on shutdown"
        );
    }
}

/// With `--log-format json` every log line the binary writes is one JSON object with a level and
/// structured fields; the filter comes from `--log` (`BATON_LOG`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_are_one_object_per_line() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let mut baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--log-format",
        "json",
        "--log",
        "debug,h2=info,tower=info,hyper=info",
    ])
    .await;
    baton.sigterm();
    let status = within(
        Duration::from_secs(5),
        baton.wait_timeout(Duration::from_secs(5)),
        "the process to exit",
    )
    .await
    .expect("exited");
    assert!(status.success(), "{status}");
    let stderr = baton.stderr();
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(
        lines.iter().any(|l| l.contains("serving gRPC over TCP")),
        "{stderr}"
    );
    for line in &lines {
        assert!(
            line.starts_with('{') && line.ends_with('}') && line.contains("\"level\":"),
            "not a JSON log line: {line}"
        );
    }
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"level\":\"DEBUG\"") && l.contains("pub/sub connected")),
        "the debug filter applies: {stderr}"
    );
    assert!(
        lines.iter().any(|l| l.contains("\"addr\":\"127.0.0.1:")),
        "fields are structured: {stderr}"
    );
}

/// With stdout and stderr pipes whose reader has gone (as `baton serve … | head -3` leaves them),
/// readiness still follows Redis (NOT_SERVING once it dies, SERVING once it is back: each change
/// is logged to the closed stderr), and SIGTERM still stops Baton within the drain deadline with
/// exit code 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stderr_stops_neither_readiness_nor_the_drain() {
    use std::io::BufRead;
    use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient};

    let mut redis = RedisServer::start_private().await;
    let prefix = unique_prefix();
    let url = redis.url();
    let mut baton = BatonProcess::spawn_piped(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "--drain-timeout",
        "5s",
    ])
    .await;
    drop(baton.take_stdout());
    // `head`: read the first lines, up to the one saying Baton is ready, then go away.
    let stderr = baton.take_stderr();
    let head = tokio::task::spawn_blocking(move || {
        let mut seen = Vec::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let ready = line.contains("readiness is SERVING");
            seen.push(line);
            if ready {
                break;
            }
        }
        seen
    });
    let head = within(Duration::from_secs(10), head, "the first log lines")
        .await
        .expect("the reading task");
    assert!(
        head.last()
            .is_some_and(|l| l.contains("readiness is SERVING")),
        "the log said Baton is ready: {head:?}"
    );

    let mut health = HealthClient::new(support::channel(baton.addr()).await);
    let limit = Duration::from_secs(10);
    support::wait_for_health(&mut health, "readiness", ServingStatus::Serving, limit).await;
    redis.kill();
    support::wait_for_health(&mut health, "readiness", ServingStatus::NotServing, limit).await;
    redis.restart().await;
    support::wait_for_health(&mut health, "readiness", ServingStatus::Serving, limit).await;

    let mut client = baton.client().await;
    let mut held = hold(&mut client, "piped", 30_000).await;
    let (status, took) = sigterm_and_wait(&mut baton, Duration::from_secs(15)).await;
    assert!(status.success(), "exit status {status}");
    assert!(
        took < Duration::from_secs(5),
        "exited {took:?} after SIGTERM, past the 5 s drain deadline"
    );
    let (events, end) = rest_of_hold(&mut held).await;
    assert_lost_for_shutdown("piped", &events, &end);
}

/// A standard error that nobody reads (a pipe whose reader stopped, so it fills up) never stalls
/// Baton: with every call logged at length, hundreds of calls are still answered, readiness
/// stays SERVING, and SIGTERM drains and exits within the drain deadline. Log lines that do not
/// fit are dropped instead of blocking the tasks that write them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stderr_nobody_reads_never_stalls_baton() {
    use std::io::BufRead;

    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let url = redis.url();
    let mut baton = BatonProcess::spawn_piped(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "--drain-timeout",
        "5s",
        // Several kilobytes of log lines per call: the pipe (64 KiB) fills within a few calls.
        "--log",
        "trace",
    ])
    .await;
    drop(baton.take_stdout());
    // Read up to the line saying Baton is ready, then keep the pipe open and never read again.
    let mut stderr = std::io::BufReader::new(baton.take_stderr());
    let ready = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        while stderr.read_line(&mut line).is_ok_and(|n| n > 0) {
            if line.contains("readiness is SERVING") {
                return Some(stderr);
            }
            line.clear();
        }
        None
    });
    let _unread = within(Duration::from_secs(10), ready, "the ready log line")
        .await
        .expect("the reading task")
        .expect("the log said Baton is ready");

    let mut client = baton.client().await;
    within(
        Duration::from_secs(60),
        async {
            for i in 0..300 {
                let name = format!("unread-{}", i % 7);
                let granted = client
                    .acquire(pb::LockServiceAcquireRequest {
                        name: name.clone(),
                        ttl: Some(ms(10_000)),
                        ..Default::default()
                    })
                    .await
                    .unwrap_or_else(|s| panic!("Acquire {i}: {s:?}"))
                    .into_inner();
                let lease = granted
                    .lease
                    .unwrap_or_else(|| panic!("Acquire {i}: not granted"));
                client
                    .release(pb::LockServiceReleaseRequest {
                        name,
                        token: lease.token,
                    })
                    .await
                    .unwrap_or_else(|s| panic!("Release {i}: {s:?}"));
            }
        },
        "300 acquire/release pairs with a full stderr pipe",
    )
    .await;
    let mut health = HealthClient::new(support::channel(baton.addr()).await);
    wait_for_health(
        &mut health,
        "readiness",
        ServingStatus::Serving,
        Duration::from_secs(5),
    )
    .await;

    let (status, took) = sigterm_and_wait(&mut baton, Duration::from_secs(20)).await;
    assert!(status.success(), "exit status {status}");
    assert!(
        took < Duration::from_secs(8),
        "exited {took:?} after SIGTERM, past the 5 s drain deadline"
    );
}

/// The next event of a Hold stream, or how the stream ended, within `limit`.
async fn next_hold_event(
    stream: &mut Streaming<pb::LockServiceHoldResponse>,
    limit: Duration,
) -> Option<Result<Option<pb::LockServiceHoldResponse>, tonic::Status>> {
    tokio::time::timeout(limit, stream.message()).await.ok()
}

/// Every status a health `Watch` says until it ends, and how it ended.
async fn watch_to_end(
    watch: &mut Streaming<tonic_health::pb::HealthCheckResponse>,
) -> (Vec<ServingStatus>, Result<(), tonic::Status>) {
    let mut statuses = Vec::new();
    loop {
        match within(READY, watch.message(), "the watch's end").await {
            Ok(Some(m)) => statuses.push(m.status()),
            Ok(None) => return (statuses, Ok(())),
            Err(e) => return (statuses, Err(e)),
        }
    }
}

/// With `--shutdown-delay 5s`, SIGTERM turns readiness NOT_SERVING at once while liveness stays
/// SERVING, an open Hold stream keeps its lock and new connections and calls are served during
/// the delay; then the drain ends the stream with `lost` SHUTDOWN, no sooner than 5 s after the
/// signal, and the process exits with success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_delay_keeps_serving_while_not_ready_then_drains() {
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let url = redis.url();
    let delay = Duration::from_secs(5);
    let mut baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "--shutdown-delay",
        "5s",
        "--drain-timeout",
        "5s",
    ])
    .await;
    let mut health = HealthClient::new(support::channel(baton.addr()).await);
    wait_for_health(&mut health, "readiness", ServingStatus::Serving, READY).await;
    let mut a = baton.client().await;
    let mut held = hold(&mut a, "kept", 30_000).await;

    let signalled = Instant::now();
    baton.sigterm();
    wait_for_health(&mut health, "readiness", ServingStatus::NotServing, READY).await;
    assert!(
        signalled.elapsed() < delay,
        "readiness turned NOT_SERVING only {:?} after SIGTERM",
        signalled.elapsed()
    );
    let liveness = support::health_status(&mut health, "liveness").await;
    assert!(
        matches!(liveness, Ok(ServingStatus::Serving)),
        "liveness during the delay: {liveness:?}"
    );
    // A new connection and a new call are served while the app beside Baton winds down.
    let mut late = baton.client().await;
    let got = late
        .acquire(pb::LockServiceAcquireRequest {
            name: "taken-during-the-delay".to_owned(),
            ttl: Some(ms(10_000)),
            ..Default::default()
        })
        .await
        .expect("Acquire during the shutdown delay")
        .into_inner();
    assert!(got.acquired, "{got:?}");
    assert!(
        lock_exists(&redis, &lock_key(&prefix, "kept")).await,
        "the held lock is kept during the delay"
    );
    assert!(
        signalled.elapsed() < delay,
        "the checks above took {:?}, past the delay: the test proves nothing on this machine",
        signalled.elapsed()
    );

    let (events, end) = rest_of_hold(&mut held).await;
    let ended = signalled.elapsed();
    assert_lost_for_shutdown("kept", &events, &end);
    assert!(
        ended >= delay - Duration::from_millis(100),
        "the stream was ended {ended:?} after SIGTERM, inside the 5 s delay"
    );
    let status = baton
        .wait_timeout(Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("baton still running 10 s after the delay"));
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        baton.stderr()
    );
    let stderr = baton.stderr();
    assert!(stderr.contains("shutdown delay over"), "{stderr}");
}

/// A second SIGTERM during a long shutdown delay (10 minutes) starts the drain at once: the open
/// Hold stream gets `lost` SHUTDOWN and the process exits with success (a drain, not 130). A
/// readiness `Watch` sees SERVING, NOT_SERVING once (the delay's, not again at the drain), then
/// ends with `UNAVAILABLE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_cuts_the_shutdown_delay_short() {
    use tonic_health::pb::HealthCheckRequest;

    let redis = RedisServer::start().await;
    let url = redis.url();
    let mut baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &unique_prefix(),
        "--shutdown-delay",
        "10m",
    ])
    .await;
    let mut health = HealthClient::new(support::channel(baton.addr()).await);
    wait_for_health(&mut health, "readiness", ServingStatus::Serving, READY).await;
    let mut watch = health
        .watch(HealthCheckRequest {
            service: "readiness".to_owned(),
        })
        .await
        .expect("Watch")
        .into_inner();
    let mut a = baton.client().await;
    let mut held = hold(&mut a, "cut-short", 30_000).await;

    baton.sigterm();
    wait_for_health(&mut health, "readiness", ServingStatus::NotServing, READY).await;
    // Still held: the first signal only started the delay.
    match next_hold_event(&mut held, Duration::from_millis(500)).await {
        None
        | Some(Ok(Some(pb::LockServiceHoldResponse {
            event: Some(HoldEvent::Renewed(_)),
        }))) => {}
        other => panic!("the stream changed during the delay: {other:?}"),
    }
    let second = Instant::now();
    baton.sigterm();
    let (events, end) = rest_of_hold(&mut held).await;
    assert_lost_for_shutdown("cut-short", &events, &end);
    let status = baton
        .wait_timeout(Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("baton still running 10 s after the second SIGTERM"));
    assert_eq!(status.code(), Some(0), "stderr:\n{}", baton.stderr());
    assert!(
        second.elapsed() < Duration::from_secs(10),
        "{:?}",
        second.elapsed()
    );
    let stderr = baton.stderr();
    assert!(
        stderr.contains("signal received during the shutdown delay"),
        "{stderr}"
    );
    let (statuses, end) = watch_to_end(&mut watch).await;
    assert_eq!(
        statuses,
        [ServingStatus::Serving, ServingStatus::NotServing],
        "what the readiness watch saw"
    );
    let end = end.expect_err("ended by a status");
    assert_eq!(end.code(), Code::Unavailable, "{end:?}");
}

/// A signal repeated within moments of the first (a terminal's Ctrl-C reaches the whole process
/// group, and an init such as tini forwards it again) is the same request: the drain runs, the
/// holder hears `lost` SHUTDOWN, the lock is released and Baton exits 0. A second SIGTERM 1 ms
/// after the first used to exit 130 at once, the lock left held until its ttl. (The kernel may
/// merge two signals that close into one; then this test passes either way.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_signal_does_not_cut_the_drain_short() {
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let url = redis.url();
    let mut baton = BatonProcess::spawn(&["--redis-url", &url, "--key-prefix", &prefix]).await;
    let mut a = baton.client().await;
    let mut held = hold(&mut a, "twice", 30_000).await;

    baton.sigterm();
    std::thread::sleep(Duration::from_millis(1));
    baton.sigterm();
    let (events, end) = rest_of_hold(&mut held).await;
    assert_lost_for_shutdown("twice", &events, &end);
    let status = baton
        .wait_timeout(Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("baton still running 10 s after SIGTERM"));
    let stderr = baton.stderr();
    assert_eq!(status.code(), Some(0), "stderr:\n{stderr}");
    assert!(
        !lock_exists(&redis, &lock_key(&prefix, "twice")).await,
        "the lock is still held after the drain"
    );
}

/// A signal well after the one that began the drain means the operator does not want to wait:
/// with the drain held up by Redis (writes paused, the release retried) and 30 s of drain
/// timeout, Baton exits 130 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_signal_during_a_stuck_drain_exits_at_once() {
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let url = redis.url();
    let mut baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "--drain-timeout",
        "30s",
    ])
    .await;
    let mut a = baton.client().await;
    let mut held = hold(&mut a, "stuck", 60_000).await;
    let mut admin = redis.client().await;
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(20_000)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .expect("CLIENT PAUSE");

    baton.sigterm();
    // The stream says `lost` at once, and stays open while its release is retried.
    loop {
        match next_hold_event(&mut held, Duration::from_secs(5)).await {
            Some(Ok(Some(pb::LockServiceHoldResponse {
                event: Some(HoldEvent::Renewed(_)),
            }))) => {}
            Some(Ok(Some(pb::LockServiceHoldResponse {
                event: Some(HoldEvent::Lost(lost)),
            }))) => {
                assert_eq!(lost.reason(), LeaseLostReason::Shutdown, "{lost:?}");
                break;
            }
            other => panic!("expected lost SHUTDOWN, got {other:?}"),
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        baton.wait_timeout(Duration::ZERO).await.is_none(),
        "the drain ended while Redis took no writes: {}",
        baton.stderr()
    );
    let second = Instant::now();
    baton.sigterm();
    let status = baton
        .wait_timeout(Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("baton still running 10 s after the second SIGTERM"));
    assert_eq!(status.code(), Some(130), "stderr:\n{}", baton.stderr());
    assert!(
        second.elapsed() < Duration::from_secs(5),
        "exited {:?} after the second signal",
        second.elapsed()
    );
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query_async(&mut admin)
        .await
        .expect("CLIENT UNPAUSE");
}

/// A waiting `Hold` whose try is already in Redis when shutdown begins, and is granted there
/// after it, is never told it holds the lock: the grant is given back and the stream ends
/// UNAVAILABLE. The waiter tries again when the holder's lease (a unary `Acquire` of 1.5 s)
/// expires; Redis is paused (`CLIENT PAUSE`) from before that moment to after shutdown begins,
/// so that the try waits in Redis (Baton's command timeout is longer than the pause) while Baton
/// starts shutting down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_granted_as_shutdown_begins_is_given_back_unheard() {
    granted_as_shutdown_begins(true).await;
}

/// As above, for a waiting unary `Acquire`: it fails UNAVAILABLE and the grant is given back.
/// (It once returned the grant: a Baton's waiter could take what that Baton's own holds released
/// at shutdown, and hold it through a Baton going away.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_granted_as_shutdown_begins_is_given_back_unheard() {
    granted_as_shutdown_begins(false).await;
}

/// The two tests above: the waiter waits in a `Hold` stream (`hold`) or a unary `Acquire`.
async fn granted_as_shutdown_begins(hold: bool) {
    let redis = RedisServer::start().await;
    // Commands may wait out the pause below instead of timing out.
    let mut baton = Baton::start_with(&redis, |c| {
        c.redis.command_timeout = Duration::from_secs(3);
    })
    .await;
    let mut client = baton.client().await;
    let acquired = client
        .acquire(pb::LockServiceAcquireRequest {
            name: "contended".into(),
            ttl: Some(ms(1_500)),
            wait_timeout: None,
            owner: String::new(),
            ..Default::default()
        })
        .await
        .expect("Acquire")
        .into_inner();
    let held_at = Instant::now();
    assert!(acquired.lease.is_some(), "{acquired:?}");
    let mut waiting = client.clone();
    let waiter = tokio::spawn(async move {
        if hold {
            let mut stream = waiting
                .hold(pb::LockServiceHoldRequest {
                    name: "contended".into(),
                    ttl: Some(ms(10_000)),
                    wait_timeout: Some(ms(30_000)),
                    owner: String::new(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            stream.message().await.map(|m| format!("{m:?}"))
        } else {
            waiting
                .acquire(pb::LockServiceAcquireRequest {
                    name: "contended".into(),
                    ttl: Some(ms(10_000)),
                    wait_timeout: Some(ms(30_000)),
                    owner: String::new(),
                    ..Default::default()
                })
                .await
                .map(|r| format!("{:?}", r.into_inner()))
        }
    });
    // Redis answers nothing from 1.2 s to 2.0 s after the grant: the waiter's try at the
    // lease's expiry (1.5 s) waits in Redis, and shutdown begins at 1.7 s.
    tokio::time::sleep_until(held_at + Duration::from_millis(1_200)).await;
    let mut admin = redis.client().await;
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(800)
        .arg("ALL")
        .query_async(&mut admin)
        .await
        .expect("CLIENT PAUSE");
    tokio::time::sleep_until(held_at + Duration::from_millis(1_700)).await;
    baton.begin_shutdown();
    let first = within(Duration::from_secs(10), waiter, "the waiter's answer")
        .await
        .expect("the waiter's task");
    match first {
        Err(s) => assert_eq!(s.code(), Code::Unavailable, "{s:?}"),
        Ok(m) => panic!("a waiter granted as shutdown began must get UNAVAILABLE, got {m}"),
    }
    let key = baton.lock_key("contended");
    support::wait_until(Duration::from_secs(5), "the grant to be given back", || {
        let redis = &redis;
        let key = key.clone();
        async move {
            if lock_exists(redis, &key).await {
                Err("still held")
            } else {
                Ok(())
            }
        }
    })
    .await;
    within(Duration::from_secs(10), baton.shutdown(), "the drain")
        .await
        .expect("a clean shutdown");
}

/// Health's `Watch` and a reflection stream have no end of their own: on SIGTERM the watch says
/// NOT_SERVING and ends with `UNAVAILABLE`, the reflection stream ends, and Baton exits at once
/// rather than at the drain deadline (10 s here), which one health watcher used to hold every
/// shutdown to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_streams_do_not_hold_the_shutdown() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest,
    };

    let redis = RedisServer::start().await;
    let url = redis.url();
    let prefix = unique_prefix();
    let mut baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "--drain-timeout",
        "10s",
    ])
    .await;
    let channel = support::channel(baton.addr()).await;
    let mut watch = HealthClient::new(channel.clone())
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("Watch")
        .into_inner();
    let first = within(READY, watch.message(), "the first health status")
        .await
        .expect("the watch")
        .expect("a status");
    assert_eq!(first.status(), ServingStatus::Serving);

    // A reflection stream whose client keeps its side open.
    let (requests, rx) = tokio::sync::mpsc::channel(1);
    requests
        .send(ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        })
        .await
        .expect("queued");
    let mut reflection = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("ServerReflectionInfo")
        .into_inner();
    within(READY, reflection.message(), "the service list")
        .await
        .expect("the reflection stream")
        .expect("a response");

    let (status, took) = sigterm_and_wait(&mut baton, Duration::from_secs(20)).await;
    assert!(status.success(), "exit status {status}");
    assert!(
        took < Duration::from_secs(5),
        "exited {took:?} after SIGTERM; the drain deadline is 10 s"
    );
    let stderr = baton.stderr();
    assert!(!stderr.contains("drain deadline passed"), "{stderr}");

    // The watch said NOT_SERVING, then ended with UNAVAILABLE.
    let (statuses, end) = watch_to_end(&mut watch).await;
    assert_eq!(
        statuses.last(),
        Some(&ServingStatus::NotServing),
        "{statuses:?}"
    );
    let end = end.expect_err("ended by a status");
    assert_eq!(end.code(), Code::Unavailable, "{end:?}");
    assert!(end.message().contains("shutting down"), "{end:?}");
    // Its handler saw the client's side end, and ended it (or the shutdown's status did).
    match within(READY, reflection.message(), "the reflection stream's end").await {
        Ok(None) => {}
        Err(end) => assert_eq!(end.code(), Code::Unavailable, "{end:?}"),
        Ok(Some(m)) => panic!("a message after the shutdown: {m:?}"),
    }
    drop(requests);
}

/// A client connection that stops answering (a frozen or busy client: it never acknowledges the
/// server's goodbye) does not hold the shutdown up once every call is answered: Baton exits well
/// before its drain deadline, and says nothing of a deadline passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_answering_does_not_hold_the_shutdown() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let redis = RedisServer::start().await;
    let url = redis.url();
    let mut baton = BatonProcess::spawn(&["--redis-url", &url, "--drain-timeout", "10s"]).await;
    // An HTTP/2 connection whose client sends its preface and settings, reads Baton's, and then
    // neither reads nor writes again.
    let mut mute = tokio::net::TcpStream::connect(baton.addr())
        .await
        .expect("connecting");
    let settings = [0, 0, 0, 4, 0, 0, 0, 0, 0];
    mute.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("the preface");
    mute.write_all(&settings).await.expect("SETTINGS");
    let mut head = [0u8; 9];
    within(READY, mute.read_exact(&mut head), "Baton's SETTINGS")
        .await
        .expect("Baton's SETTINGS");
    // A live call on another connection, answered before the signal.
    let mut client = LockServiceClient::new(support::channel(baton.addr()).await);
    let held = client
        .acquire(pb::LockServiceAcquireRequest {
            name: "x".to_owned(),
            ttl: Some(ms(10_000)),
            ..Default::default()
        })
        .await
        .expect("Acquire")
        .into_inner();
    assert!(held.acquired);

    let (status, took) = sigterm_and_wait(&mut baton, Duration::from_secs(20)).await;
    assert!(status.success(), "exit status {status}");
    assert!(
        took < Duration::from_secs(5),
        "exited {took:?} after SIGTERM; the drain deadline is 10 s"
    );
    let stderr = baton.stderr();
    assert!(!stderr.contains("drain deadline passed"), "{stderr}");
    drop(mute);
}

/// A client that reads slowly (a small socket buffer, 512 bytes at a time) and holds many `Hold`
/// streams on one connection, pinging as it reads as a live client may, still reads every `lost`
/// SHUTDOWN at SIGTERM: Baton keeps the closing connection until the client has read it all and
/// closed, instead of closing a socket whose unread answers the kernel drops (resets) once the
/// client's next frame arrives. Raw HTTP/2 frames, so that the client's writes are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_hears_every_shutdown() {
    use prost::Message;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const STREAMS: u32 = 600;
    let redis = RedisServer::start().await;
    let url = redis.url();
    // Redis timeouts for a busy machine: every stream must be granted before the signal, and a
    // connection the pool opens for the burst may take longer than 300 ms to set up there (a
    // failed one fails the calls waiting for a connection).
    let mut baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--drain-timeout",
        "20s",
        "--redis-command-timeout",
        "5s",
        "--redis-connect-timeout",
        "5s",
    ])
    .await;
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let mut tcp = socket.connect(baton.addr()).await.expect("connecting");
    // Windows of 16 MiB (SETTINGS_INITIAL_WINDOW_SIZE, and the connection's), so that flow
    // control never holds Baton's answers back: only the socket does.
    let frame = support::h2::frame;
    let fields = support::h2::grpc_request_headers("/baton.v1.LockService/Hold");
    let mut out = support::h2::PREFACE.to_vec();
    out.extend(frame(4, 0, 0, &[0, 4, 1, 0, 0, 0]));
    out.extend(frame(8, 0, 0, &(16u32 << 20).to_be_bytes()));
    for n in 0..STREAMS {
        let request = pb::LockServiceHoldRequest {
            name: format!("slow-{n}"),
            ttl: Some(ms(30_000)),
            ..Default::default()
        }
        .encode_to_vec();
        let mut message = vec![0];
        message.extend(u32::try_from(request.len()).expect("small").to_be_bytes());
        message.extend(request);
        let id = 2 * n + 1;
        out.extend(frame(1, 4, id, &fields));
        out.extend(frame(0, 1, id, &message));
    }
    tcp.write_all(&out).await.expect("the streams");

    // Reads frames: answers Baton's pings and SETTINGS, and keeps each stream's last event.
    let mut last: std::collections::HashMap<u32, Option<HoldEvent>> = Default::default();
    let mut pending = Vec::new();
    let mut acquired = 0;
    let mut ended_early = 0;
    let mut signalled = false;
    let mut chunk = [0u8; 512];
    let started = Instant::now();
    loop {
        assert!(
            signalled || started.elapsed() < Duration::from_secs(60),
            "{acquired} of {STREAMS} streams granted in a minute"
        );
        let read = within(
            Duration::from_secs(30),
            tcp.read(&mut chunk),
            "Baton's frames",
        )
        .await
        .unwrap_or(0);
        if read == 0 {
            break;
        }
        pending.extend_from_slice(&chunk[..read]);
        let mut replies = Vec::new();
        while pending.len() >= 9 {
            let len = usize::from(pending[0]) << 16
                | usize::from(pending[1]) << 8
                | usize::from(pending[2]);
            if pending.len() < 9 + len {
                break;
            }
            let (kind, flags) = (pending[3], pending[4]);
            let id =
                u32::from_be_bytes([pending[5], pending[6], pending[7], pending[8]]) & !(1 << 31);
            let payload = pending[9..9 + len].to_vec();
            pending.drain(..9 + len);
            match (kind, flags) {
                // DATA: one gRPC message per frame, as Baton sends them.
                (0, _) if payload.len() > 5 => {
                    let event = pb::LockServiceHoldResponse::decode(&payload[5..])
                        .expect("a Hold event")
                        .event;
                    if matches!(event, Some(HoldEvent::Acquired(_))) {
                        acquired += 1;
                    }
                    last.insert(id, event);
                }
                // Trailers (HEADERS ending the stream) before the signal: a stream that failed.
                (1, f) if f & 1 == 1 && !signalled => {
                    ended_early += 1;
                    eprintln!(
                        "stream {id} ended before the signal; its last event: {:?}",
                        last.get(&id)
                    );
                }
                (4, 0) => replies.extend(frame(4, 1, 0, &[])),
                (6, 0) => replies.extend(frame(6, 1, 0, &payload)),
                _ => {}
            }
        }
        assert_eq!(ended_early, 0, "a Hold stream failed before the signal");
        if acquired == STREAMS && !signalled {
            baton.sigterm();
            signalled = true;
        }
        if signalled {
            // A ping of the client's own after each read, and a slow pace.
            replies.extend(frame(6, 0, 0, &[0; 8]));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if !replies.is_empty() && tcp.write_all(&replies).await.is_err() {
            break;
        }
    }
    assert!(
        signalled,
        "only {acquired} of {STREAMS} streams were granted"
    );
    let told = last
        .values()
        .filter(
            |e| matches!(e, Some(HoldEvent::Lost(l)) if l.reason() == LeaseLostReason::Shutdown),
        )
        .count();
    assert_eq!(told, STREAMS as usize, "every holder read `lost` SHUTDOWN");
    let status = baton
        .wait_timeout(Duration::from_secs(30))
        .await
        .expect("Baton exits");
    assert!(status.success(), "exit status {status}");
}

/// Calls that fail while Redis is down leave nothing to retry behind them: 200 Acquires (ttl
/// 1 h) fail UNAVAILABLE against a killed Redis, each never sent, and SIGTERM then stops Baton
/// at once. Each such failure used to leave a release retried until its ttl, which held the
/// drain to its deadline (and, through a long outage, kept Baton connecting about a thousand
/// times a second for 6,000 failed calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_failed_during_an_outage_leave_no_retries_behind() {
    let mut redis = RedisServer::start_private().await;
    let url = redis.url();
    let mut baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &unique_prefix(),
        "--drain-timeout",
        "10s",
    ])
    .await;
    let client = baton.client().await;
    redis.kill();
    let mut failing = tokio::task::JoinSet::new();
    for i in 0..200 {
        let mut client = client.clone();
        failing.spawn(async move {
            client
                .acquire(pb::LockServiceAcquireRequest {
                    name: format!("outage-{i}"),
                    ttl: Some(ms(3_600_000)),
                    ..Default::default()
                })
                .await
        });
    }
    while let Some(done) = failing.join_next().await {
        let status = done.expect("the call's task").expect_err("Redis is down");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    }
    drop(client);

    let (status, took) = sigterm_and_wait(&mut baton, Duration::from_secs(20)).await;
    assert!(
        status.success(),
        "exit status {status}; stderr:\n{}",
        baton.stderr()
    );
    assert!(
        took < Duration::from_secs(5),
        "exited {took:?} after SIGTERM: clean-ups were still being retried\n{}",
        baton.stderr()
    );
}
