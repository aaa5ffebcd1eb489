//! Metrics, logs and traces, seen from outside: the real `baton` binary with `--metrics-listen`,
//! real traffic, and `/metrics` scraped over HTTP after each step. Each test runs its own Baton
//! process, so the counters it reads move only with its own traffic.
//!
//! The scrape is checked by `promtool check metrics` and the alerting rules of
//! `docs/metrics.md` by `promtool check rules`. promtool comes from Debian's `prometheus`
//! package (`scripts/install-deps.sh` extracts it into `.tools/prometheus/`); without it these
//! checks fail under CI (`CI` set) and are skipped with a message elsewhere.

mod support;

use std::{
    collections::BTreeSet,
    io::Write as _,
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use baton::proto::v1::{
    self as pb, autocomplete_service_client::AutocompleteServiceClient,
    election_service_campaign_response::Event as CampaignEvent,
    election_service_client::ElectionServiceClient, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event as HoldEvent,
    rate_limit_service_client::RateLimitServiceClient,
    semaphore_service_client::SemaphoreServiceClient,
    semaphore_service_hold_response::Event as SemHoldEvent,
};
use envoy_types::pb::envoy::{
    extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
    service::ratelimit::v3::{
        RateLimitRequest, rate_limit_response::Code as EnvoyCode,
        rate_limit_service_client::RateLimitServiceClient as EnvoyClient,
    },
};
use redis::AsyncCommands;
use support::{
    BatonProcess, RedisServer, channel, free_port, h2,
    lease::{next_event, read_until_lost},
    ms, wait_until, within,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient};

/// Time allowed for one scrape.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time allowed for anything the tests wait for (a busy machine runs four suites at once).
const PATIENCE: Duration = Duration::from_secs(20);

/// A Baton process serving metrics on a port of its own, and where it serves them.
struct Served {
    baton: BatonProcess,
    metrics: SocketAddr,
}

/// Spawns `baton serve --metrics-listen 127.0.0.1:0` over `redis` with `extra` arguments, and
/// reads the metrics address from its startup log.
async fn spawn(redis: &RedisServer, extra: &[&str]) -> Served {
    let mut args: Vec<String> = redis.baton_args();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    spawn_with(&args).await
}

/// Spawns `baton serve --metrics-listen 127.0.0.1:0 ARGS`, and reads the metrics address from
/// its startup log.
async fn spawn_with(args: &[&str]) -> Served {
    let mut args = args.to_vec();
    args.extend(["--metrics-listen", "127.0.0.1:0"]);
    let baton = BatonProcess::spawn(&args).await;
    let metrics = wait_until(PATIENCE, "the metrics address in the log", || {
        let log = baton.stderr();
        async move { metrics_addr(&log).ok_or(log) }
    })
    .await;
    Served { baton, metrics }
}

/// The address of the "serving metrics" log line (plain or JSON).
fn metrics_addr(log: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains("serving metrics"))?;
    let at = line.find("127.0.0.1:")?;
    let addr: String = line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == ':')
        .collect();
    addr.parse().ok()
}

/// An HTTP/1.1 response: status, headers (lowercase names) and body.
struct HttpResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl HttpResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` with `accept`, on a connection of its own.
async fn get(addr: SocketAddr, path: &str, accept: Option<&str>) -> HttpResponse {
    within(
        SCRAPE_TIMEOUT,
        async {
            let mut stream = tokio::net::TcpStream::connect(addr)
                .await
                .expect("connecting to the metrics port");
            let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
            let request =
                format!("GET {path} HTTP/1.1\r\nHost: baton\r\n{accept}Connection: close\r\n\r\n");
            stream
                .write_all(request.as_bytes())
                .await
                .expect("sending the request");
            let mut raw = Vec::new();
            stream
                .read_to_end(&mut raw)
                .await
                .expect("reading the response");
            let raw = String::from_utf8(raw).expect("a UTF-8 response");
            let (head, body) = raw.split_once("\r\n\r\n").expect("a response head");
            let mut lines = head.lines();
            let status = lines
                .next()
                .and_then(|l| l.split(' ').nth(1))
                .and_then(|s| s.parse().ok())
                .expect("a status line");
            let headers = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .collect();
            HttpResponse {
                status,
                headers,
                body: body.to_owned(),
            }
        },
        "a metrics scrape",
    )
    .await
}

/// One scrape in the Prometheus text format.
struct Scrape(String);

impl Scrape {
    async fn of(served: &Served) -> Self {
        let response = get(served.metrics, "/metrics", None).await;
        assert_eq!(response.status, 200, "{}", response.body);
        Self(response.body)
    }

    /// The value of the series written exactly as `series` (name and labels as Baton writes
    /// them); 0 when it is not there yet.
    fn value(&self, series: &str) -> f64 {
        self.0
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
            .map_or(0.0, |v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{series}: {v:?}: {e}"))
            })
    }

    /// Every series (name and labels) of the scrape.
    fn series(&self) -> BTreeSet<String> {
        self.0
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_owned()))
            .collect()
    }
}

/// How much each series moved between two scrapes.
fn moved(before: &Scrape, after: &Scrape, series: &str) -> f64 {
    after.value(series) - before.value(series)
}

/// promtool: on PATH, or where `scripts/install-deps.sh` puts it. `None` (with the reason
/// printed) when it is missing outside CI; a failure under CI.
fn promtool() -> Option<PathBuf> {
    let local =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".tools/prometheus/usr/bin/promtool");
    if local.is_file() {
        return Some(local);
    }
    if Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        return Some(PathBuf::from("promtool"));
    }
    let why = "promtool is missing: run scripts/install-deps.sh (it extracts Debian's prometheus package into .tools/)";
    assert!(std::env::var_os("CI").is_none(), "{why}");
    eprintln!("skipping the promtool check: {why}");
    None
}

/// Runs `promtool ARGS` with `stdin`, returning whether it passed and what it printed.
fn run_promtool(promtool: &PathBuf, args: &[&str], stdin: &str) -> (bool, String) {
    let mut child = Command::new(promtool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running promtool");
    child
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(stdin.as_bytes())
        .expect("writing to promtool");
    let out = child.wait_with_output().expect("promtool's output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

async fn lock_client(served: &Served) -> LockServiceClient<Channel> {
    LockServiceClient::new(channel(served.baton.addr()).await)
}

fn acquire(name: &str, ttl_ms: u64, wait_ms: Option<u64>) -> pb::LockServiceAcquireRequest {
    pb::LockServiceAcquireRequest {
        name: name.to_owned(),
        ttl: Some(ms(ttl_ms)),
        wait_timeout: wait_ms.map(ms),
        owner: String::new(),
        ..Default::default()
    }
}

fn token(response: &pb::LockServiceAcquireResponse) -> String {
    response
        .lease
        .as_ref()
        .map(|l| l.token.clone())
        .expect("a granted lease")
}

/// Contended locks, a lost lease and a stream closed by its client move the lease metrics by
/// exactly what happened: grants by result, the wait, waiters and held leases while they last,
/// renewals, the loss by reason, the release on close; and the RPCs by method and code.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lock_traffic_moves_the_lease_metrics() {
    let redis = RedisServer::start_standalone().await;
    let served = spawn(&redis, &["--key-prefix", "m:"]).await;
    let mut a = lock_client(&served).await;
    let before = Scrape::of(&served).await;

    // a holds; b waits for it; c tries once; d waits too briefly.
    let held = a
        .acquire(acquire("x", 10_000, None))
        .await
        .expect("a")
        .into_inner();
    assert!(held.acquired);
    let mut b = lock_client(&served).await;
    let waiting = tokio::spawn(async move { b.acquire(acquire("x", 10_000, Some(15_000))).await });
    // A waiter is counted when it starts waiting and subscribes right after: wait for both.
    let during = wait_until(PATIENCE, "b counted as a waiter, listening", || {
        let served = &served;
        async move {
            let s = Scrape::of(served).await;
            let waiters = s.value(r#"baton_lease_waiters{kind="lock"}"#);
            let subscriptions = s.value("baton_redis_subscriptions");
            if waiters == 1.0 && subscriptions >= 1.0 {
                Ok(s)
            } else {
                Err((waiters, subscriptions))
            }
        }
    })
    .await;
    assert_eq!(
        during.value(r#"baton_rpc_in_flight{service="baton.v1.LockService",method="Acquire"}"#),
        1.0,
        "b's call is in flight"
    );
    let not_acquired = a
        .acquire(acquire("x", 10_000, None))
        .await
        .expect("c")
        .into_inner();
    assert!(!not_acquired.acquired);
    let timed_out = a
        .acquire(acquire("x", 10_000, Some(50)))
        .await
        .expect("d")
        .into_inner();
    assert!(!timed_out.acquired);
    a.release(pb::LockServiceReleaseRequest {
        name: "x".into(),
        token: token(&held),
    })
    .await
    .expect("release");
    let granted = within(PATIENCE, waiting, "b's grant")
        .await
        .expect("b's task")
        .expect("b's acquire")
        .into_inner();
    assert!(granted.acquired);

    // A Hold stream whose lease disappears from Redis is lost (not held) ...
    let mut lost = a
        .hold(pb::LockServiceHoldRequest {
            name: "doomed".into(),
            ttl: Some(ms(300)),
            ..Default::default()
        })
        .await
        .expect("hold")
        .into_inner();
    let first = lost
        .message()
        .await
        .expect("first event")
        .expect("an event");
    assert!(
        matches!(first.event, Some(HoldEvent::Acquired(_))),
        "{first:?}"
    );
    let holding = Scrape::of(&served).await;
    assert_eq!(holding.value(r#"baton_leases_held{kind="lock"}"#), 1.0);
    // Renewals come every 75 ms: read a few, each as it comes (so none is replaced unread),
    // then take the lease away.
    let mut renewed = 0.0;
    while renewed < 3.0 {
        match next_event(&mut lost, PATIENCE, "a renewal").await {
            HoldEvent::Renewed(_) => renewed += 1.0,
            other => panic!("expected renewals, got {other:?}"),
        }
    }
    let mut conn = redis.client().await;
    let _: () = conn.del("m:{lock:doomed}").await.expect("DEL");
    let (end, more) = read_until_lost(&mut lost, PATIENCE, "the lost event").await;
    renewed += more.len() as f64;
    assert_eq!(end.reason(), pb::LeaseLostReason::NotHeld);

    // ... and one whose client leaves is released.
    let mut closing = a
        .hold(pb::LockServiceHoldRequest {
            name: "closing".into(),
            // No renewal before the client leaves: the first would come after 15 s.
            ttl: Some(ms(60_000)),
            ..Default::default()
        })
        .await
        .expect("hold")
        .into_inner();
    let first = closing
        .message()
        .await
        .expect("first event")
        .expect("an event");
    assert!(
        matches!(first.event, Some(HoldEvent::Acquired(_))),
        "{first:?}"
    );
    drop(closing);

    // The release is counted, then the stream's task ends and the lease stops counting as held.
    wait_until(PATIENCE, "the release on close counted", || {
        let served = &served;
        async move {
            let s = Scrape::of(served).await;
            let released =
                s.value(r#"baton_lease_releases_on_close_total{kind="lock",result="released"}"#);
            let held = s.value(r#"baton_leases_held{kind="lock"}"#);
            if released >= 1.0 && held == 0.0 {
                Ok(s)
            } else {
                Err((released, held))
            }
        }
    })
    .await;
    let lock = |labels: &str| format!("{{kind=\"lock\",{labels}}}");
    let expected = [
        (format!("baton_lease_acquisitions_total{}", lock(r#"result="acquired""#)), 4.0),
        (format!("baton_lease_acquisitions_total{}", lock(r#"result="not_acquired""#)), 1.0),
        (format!("baton_lease_acquisitions_total{}", lock(r#"result="timed_out""#)), 1.0),
        (format!("baton_lease_wait_seconds_count{}", lock(r#"result="acquired""#)), 1.0),
        (format!("baton_lease_wait_seconds_count{}", lock(r#"result="timed_out""#)), 1.0),
        (format!("baton_leases_lost_total{}", lock(r#"reason="not_held""#)), 1.0),
        (format!("baton_lease_releases_on_close_total{}", lock(r#"result="released""#)), 1.0),
        (
            r#"baton_rpc_calls_total{service="baton.v1.LockService",method="Acquire",code="OK"}"#.to_owned(),
            4.0,
        ),
        (
            r#"baton_rpc_calls_total{service="baton.v1.LockService",method="Release",code="OK"}"#.to_owned(),
            1.0,
        ),
        (
            r#"baton_rpc_calls_total{service="baton.v1.LockService",method="Hold",code="OK"}"#.to_owned(),
            1.0,
        ),
        (
            r#"baton_rpc_calls_total{service="baton.v1.LockService",method="Hold",code="CANCELLED"}"#.to_owned(),
            1.0,
        ),
    ];
    let after = scrape_until_moved(&served, &before, &expected).await;
    assert_eq!(
        moved(
            &before,
            &after,
            &format!("baton_lease_renewals_total{}", lock(r#"result="renewed""#))
        ),
        renewed,
        "one renewal counted for each renewal the client read"
    );
    assert_eq!(
        moved(
            &before,
            &after,
            &format!("baton_lease_renewals_total{}", lock(r#"result="not_held""#))
        ),
        1.0
    );
    assert_eq!(after.value(r#"baton_leases_held{kind="lock"}"#), 0.0);
    assert_eq!(after.value(r#"baton_lease_waiters{kind="lock"}"#), 0.0);
    // b waited about as long as a held the lock: more than nothing, less than its wait.
    let waited = moved(
        &before,
        &after,
        &format!(
            "baton_lease_wait_seconds_sum{}",
            lock(r#"result="acquired""#)
        ),
    );
    assert!(waited > 0.0 && waited < 15.0, "{waited}");
    assert!(
        moved(
            &before,
            &after,
            r#"baton_redis_call_duration_seconds_count{call="script"}"#
        ) >= 8.0,
        "every acquisition and release is a script call"
    );
    assert!(after.value(r#"baton_redis_pool_connections{pool="commands",state="idle"}"#) >= 1.0);
    // Calls in flight went back to zero once they ended.
    assert_eq!(
        after.value(r#"baton_rpc_in_flight{service="baton.v1.LockService",method="Acquire"}"#),
        0.0
    );
}

fn check(key: &str, limit: u64) -> pb::RateLimitServiceCheckRequest {
    pb::RateLimitServiceCheckRequest {
        key: key.to_owned(),
        limit,
        period: Some(ms(3_600_000)),
        ..Default::default()
    }
}

fn envoy(domain: &str, key: &str, value: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// Rules for Envoy's API: a limit of one an hour, a rule that blocks everything, a shadow rule.
const RULES: &str = "domain: m
descriptors:
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: banned
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: trial
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
";

/// Rate limit decisions are counted by API, answer and what decided, for Baton's API and
/// Envoy's; a Redis that stops answering makes the failure mode decide, and counts a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rate_limits_count_each_decision_and_what_decided() {
    let redis = RedisServer::start_standalone().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = dir.path().join("rules.yaml");
    std::fs::write(&rules, RULES).expect("writing the rules");
    let rules = rules.to_str().expect("a UTF-8 path").to_owned();
    let served = spawn(
        &redis,
        &["--ratelimit-config", &rules, "--ratelimit-timeout", "300ms"],
    )
    .await;
    let mut baton = RateLimitServiceClient::new(channel(served.baton.addr()).await);
    let mut envoy_api = EnvoyClient::new(channel(served.baton.addr()).await);
    let before = Scrape::of(&served).await;

    assert!(
        baton
            .check(check("k", 1))
            .await
            .expect("check")
            .into_inner()
            .allowed
    );
    assert!(
        !baton
            .check(check("k", 1))
            .await
            .expect("check")
            .into_inner()
            .allowed
    );
    let codes = [
        envoy("m", "user", "ann"),
        envoy("m", "user", "ann"),
        envoy("m", "banned", "bob"),
        envoy("m", "trial", "cy"),
        envoy("m", "trial", "cy"),
    ];
    let mut answers = Vec::new();
    for request in codes {
        let response = envoy_api
            .should_rate_limit(request)
            .await
            .expect("ShouldRateLimit");
        answers.push(response.into_inner().overall_code());
    }
    assert_eq!(
        answers,
        [
            EnvoyCode::Ok,
            EnvoyCode::OverLimit,
            EnvoyCode::OverLimit,
            EnvoyCode::Ok,
            EnvoyCode::Ok
        ]
    );

    // A frozen Redis: the failure mode (open) answers within the rate limit timeout.
    redis.signal(nix::sys::signal::Signal::SIGSTOP);
    let failed_open = baton.check(check("k", 1)).await;
    redis.signal(nix::sys::signal::Signal::SIGCONT);
    let failed_open = failed_open.expect("check").into_inner();
    assert!(failed_open.allowed);
    assert_eq!(failed_open.decided_by(), pb::RateLimitDecidedBy::FailOpen);

    let after = Scrape::of(&served).await;
    let decisions = |api: &str, decision: &str, by: &str| {
        format!(
            r#"baton_ratelimit_decisions_total{{api="{api}",decision="{decision}",decided_by="{by}"}}"#
        )
    };
    for (series, expected) in [
        (decisions("baton", "allowed", "redis"), 1.0),
        (decisions("baton", "limited", "redis"), 1.0),
        (decisions("baton", "allowed", "fail_open"), 1.0),
        (decisions("envoy", "allowed", "redis"), 2.0),
        (decisions("envoy", "limited", "redis"), 1.0),
        (decisions("envoy", "limited", "rules"), 1.0),
        (decisions("envoy", "shadow", "redis"), 1.0),
        (
            r#"baton_rpc_calls_total{service="envoy.service.ratelimit.v3.RateLimitService",method="ShouldRateLimit",code="OK"}"#.to_owned(),
            5.0,
        ),
    ] {
        assert_eq!(moved(&before, &after, &series), expected, "{series}");
    }
    assert!(
        moved(
            &before,
            &after,
            r#"baton_redis_errors_total{kind="timeout"}"#
        ) >= 1.0,
        "the frozen Redis timed out"
    );
    assert!(after.value(r#"baton_redis_pool_connections{pool="ratelimit",state="idle"}"#) >= 1.0);
}

/// Autocomplete counts queries by call and mode, and the terms its writes added, updated and
/// removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn autocomplete_counts_queries_and_terms() {
    let redis = RedisServer::start_standalone().await;
    let served = spawn(&redis, &[]).await;
    let mut client = AutocompleteServiceClient::new(channel(served.baton.addr()).await);
    let before = Scrape::of(&served).await;
    let term = |display: &str| pb::AutocompleteTerm {
        display: display.to_owned(),
        ..Default::default()
    };
    let add = |terms: Vec<pb::AutocompleteTerm>| pb::AutocompleteServiceAddRequest {
        dictionary: "cities".into(),
        terms,
        ..Default::default()
    };
    client
        .add(add(vec![term("Berlin"), term("Bern"), term("Basel")]))
        .await
        .expect("add");
    client
        .add(add(vec![term("Bern")]))
        .await
        .expect("add again");
    client
        .remove(pb::AutocompleteServiceRemoveRequest {
            dictionary: "cities".into(),
            displays: vec!["Basel".into()],
        })
        .await
        .expect("remove");
    let complete = |mode: pb::AutocompleteMatchMode| pb::AutocompleteServiceCompleteRequest {
        dictionary: "cities".into(),
        query: "ber".into(),
        mode: mode.into(),
        ..Default::default()
    };
    let found = client
        .complete(complete(pb::AutocompleteMatchMode::Prefix))
        .await
        .expect("complete")
        .into_inner();
    assert_eq!(found.suggestions.len(), 2);
    client
        .complete(complete(pb::AutocompleteMatchMode::Automatic))
        .await
        .expect("complete");
    client
        .complete_recent(pb::AutocompleteServiceCompleteRecentRequest {
            list: "recent".into(),
            query: "ber".into(),
            mode: pb::AutocompleteMatchMode::WordPrefix.into(),
            ..Default::default()
        })
        .await
        .expect("complete recent");

    let after = Scrape::of(&served).await;
    for (series, expected) in [
        (
            r#"baton_autocomplete_terms_written_total{change="added"}"#,
            3.0,
        ),
        (
            r#"baton_autocomplete_terms_written_total{change="updated"}"#,
            1.0,
        ),
        (
            r#"baton_autocomplete_terms_written_total{change="removed"}"#,
            1.0,
        ),
        (
            r#"baton_autocomplete_queries_total{call="complete",mode="prefix"}"#,
            1.0,
        ),
        (
            r#"baton_autocomplete_queries_total{call="complete",mode="automatic"}"#,
            1.0,
        ),
        (
            r#"baton_autocomplete_queries_total{call="complete_recent",mode="word_prefix"}"#,
            1.0,
        ),
    ] {
        assert_eq!(moved(&before, &after, series), expected, "{series}");
    }
}

/// A scrape is valid Prometheus text (promtool agrees), OpenMetrics when the scraper asks for
/// it, and every other path is a 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scrapes_pass_promtool_in_both_formats() {
    let redis = RedisServer::start_standalone().await;
    let served = spawn(&redis, &[]).await;
    let mut client = lock_client(&served).await;
    let held = client
        .acquire(acquire("p", 10_000, None))
        .await
        .expect("acquire")
        .into_inner();
    client
        .release(pb::LockServiceReleaseRequest {
            name: "p".into(),
            token: token(&held),
        })
        .await
        .expect("release");
    let _ = client
        .acquire(acquire("", 10_000, None))
        .await
        .expect_err("no name");

    let text = get(served.metrics, "/metrics", None).await;
    assert_eq!(text.status, 200);
    assert_eq!(
        text.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert!(
        text.body.contains("baton_build_info{version=\""),
        "{}",
        text.body
    );
    assert!(text.body.contains(
        r#"baton_rpc_calls_total{service="baton.v1.LockService",method="Acquire",code="INVALID_ARGUMENT"} 1"#
    ));
    let prometheus_accept = "application/openmetrics-text;version=1.0.0;q=0.5,\
        application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
    let open = get(served.metrics, "/metrics", Some(prometheus_accept)).await;
    assert_eq!(open.status, 200);
    assert!(
        open.header("content-type")
            .is_some_and(|t| t.starts_with("application/openmetrics-text; version=1.0.0")),
        "{:?}",
        open.headers
    );
    assert!(open.body.ends_with("# EOF\n"), "{}", open.body);
    assert!(
        open.body
            .contains("# UNIT baton_rpc_duration_seconds seconds"),
        "{}",
        open.body
    );
    let log = served.baton.stderr();
    assert!(
        !log.contains('\u{1b}'),
        "no colour codes in a log that is not a terminal:\n{log}"
    );
    for path in ["/", "/metrics/", "/healthz"] {
        assert_eq!(get(served.metrics, path, None).await.status, 404, "{path}");
    }

    if let Some(promtool) = promtool() {
        // Prometheus's own OpenMetrics parser reads the OpenMetrics scrape (as a backfill, which
        // wants a timestamp on every sample).
        let dir = tempfile::tempdir().expect("temp dir");
        let stamped: String = open
            .body
            .lines()
            .map(|l| {
                if l.starts_with('#') {
                    format!("{l}\n")
                } else {
                    format!("{l} 1700000000\n")
                }
            })
            .collect();
        let input = dir.path().join("scrape.om");
        std::fs::write(&input, stamped).expect("writing the scrape");
        let blocks = dir.path().join("blocks");
        let (ok, report) = run_promtool(
            &promtool,
            &[
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                input.to_str().expect("a UTF-8 path"),
                blocks.to_str().expect("a UTF-8 path"),
            ],
            "",
        );
        assert!(
            ok,
            "promtool could not read the OpenMetrics scrape:\n{report}\n{}",
            open.body
        );

        let (ok, report) = run_promtool(&promtool, &["check", "metrics"], &text.body);
        assert!(
            ok && report.trim().is_empty(),
            "promtool check metrics:\n{report}\n{}",
            text.body
        );
    }
}

/// Ten thousand lock names (and a thousand rate limit keys) leave the number of series as it
/// was: no name, owner or token is a label.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_lock_names_add_no_series() {
    let redis = RedisServer::start_standalone().await;
    // Generous timeouts: a decision by the failure mode on a busy machine would add its series.
    let served = spawn(
        &redis,
        &["--ratelimit-timeout", "5s", "--redis-command-timeout", "5s"],
    )
    .await;
    let channel = channel(served.baton.addr()).await;
    let round = |names: std::ops::Range<usize>| {
        let channel = channel.clone();
        async move {
            let mut tasks = tokio::task::JoinSet::new();
            for chunk in names.collect::<Vec<_>>().chunks(250) {
                let chunk = chunk.to_vec();
                let mut locks = LockServiceClient::new(channel.clone());
                let mut limits = RateLimitServiceClient::new(channel.clone());
                tasks.spawn(async move {
                    for i in chunk {
                        let name = format!("lock-{i}");
                        let held = locks
                            .acquire(acquire(&name, 10_000, None))
                            .await
                            .expect("acquire");
                        locks
                            .release(pb::LockServiceReleaseRequest {
                                name,
                                token: token(held.get_ref()),
                            })
                            .await
                            .expect("release");
                        if i % 10 == 0 {
                            limits
                                .check(check(&format!("key-{i}"), 5))
                                .await
                                .expect("check");
                        }
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.expect("a client task");
            }
        }
    };
    // The label combinations this traffic touches exist after the first round.
    within(PATIENCE, round(0..20), "the first names").await;
    let before = Scrape::of(&served).await.series();
    within(
        Duration::from_secs(300),
        round(20..10_020),
        "ten thousand names",
    )
    .await;
    let after = Scrape::of(&served).await;
    assert_eq!(
        moved(
            &Scrape(String::new()),
            &after,
            r#"baton_lease_acquisitions_total{kind="lock",result="acquired"}"#
        ),
        10_020.0
    );
    let after = after.series();
    let added: Vec<_> = after.difference(&before).collect();
    assert!(added.is_empty(), "new series: {added:?}");
    assert_eq!(before.len(), after.len());
}

/// The alerting rules of docs/metrics.md are valid Prometheus rules.
#[test]
fn documented_alert_rules_pass_promtool() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/metrics.md"))
        .expect("reading docs/metrics.md");
    let rules: Vec<&str> = docs
        .split("```yaml\n")
        .skip(1)
        .filter_map(|block| block.split_once("```").map(|(yaml, _)| yaml))
        .filter(|yaml| yaml.starts_with("groups:"))
        .collect();
    assert_eq!(rules.len(), 1, "one block of rules in docs/metrics.md");
    let Some(promtool) = promtool() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("baton-rules.yaml");
    std::fs::write(&path, rules[0]).expect("writing the rules");
    let (ok, report) = run_promtool(
        &promtool,
        &["check", "rules", path.to_str().expect("a UTF-8 path")],
        "",
    );
    assert!(
        ok && report.contains("SUCCESS"),
        "promtool check rules:\n{report}"
    );
}

/// In JSON logs, a call that fails for a server-side cause is logged once with its service,
/// method, code and duration, and with the trace id of its `traceparent`; Redis refusing
/// Baton's credentials is logged as such and counted as an `auth` error; a startup line sums up
/// the configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failures_are_logged_with_their_trace() {
    let redis = RedisServer::start_standalone().await;
    let served = spawn(&redis, &["--log-format", "json"]).await;
    let mut client = lock_client(&served).await;
    let before = Scrape::of(&served).await;
    assert!(
        client
            .acquire(acquire("before", 1_000, None))
            .await
            .expect("acquire")
            .into_inner()
            .acquired
    );

    // Redis now wants a password Baton does not have; its connections are cut.
    let mut admin = redis.client().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("sesame")
        .query_async(&mut admin)
        .await
        .expect("CONFIG SET requirepass");
    // This connection is killed too; the command's answer is not needed.
    let _ = support::client_kill(&mut admin, &["TYPE", "normal"]).await;

    // Once readiness has met the refusal, every new connection meets it.
    let mut health = HealthClient::new(channel(served.baton.addr()).await);
    support::wait_for_health(
        &mut health,
        "readiness",
        ServingStatus::NotServing,
        PATIENCE,
    )
    .await;

    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let mut request = tonic::Request::new(acquire("after", 1_000, None));
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace}-00f067aa0ba902b7-01")
            .parse()
            .expect("metadata"),
    );
    let failed = client
        .acquire(request)
        .await
        .expect_err("Redis refuses Baton");
    assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}");

    let lines = wait_until(
        PATIENCE,
        "the failed call and the refused credentials in the log",
        || {
            let log = served.baton.stderr();
            async move {
                let lines: Vec<serde_json::Value> = log
                    .lines()
                    .map(|l| {
                        serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))
                    })
                    .collect();
                let failed = lines.iter().any(|l| l["message"] == "call failed");
                let refused = lines.iter().any(|l| {
                    l["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("refuses Baton's credentials"))
                });
                if failed && refused {
                    Ok(lines)
                } else {
                    Err(log)
                }
            }
        },
    )
    .await;
    // Logged once readiness met the refusal: counted by then.
    let refused = Scrape::of(&served).await;
    assert!(
        moved(
            &before,
            &refused,
            r#"baton_redis_errors_total{kind="auth"}"#
        ) >= 1.0,
        "Redis refusing Baton's credentials counts as an auth error"
    );
    assert_eq!(
        moved(
            &before,
            &refused,
            r#"baton_redis_errors_total{kind="timeout"}"#
        ),
        0.0,
        "a refusal is not a timeout"
    );

    let calls: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["message"] == "call failed")
        .collect();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = calls[0];
    assert_eq!(call["service"], "baton.v1.LockService");
    assert_eq!(call["method"], "Acquire");
    assert_eq!(call["code"], "UNAVAILABLE");
    assert!(
        call["duration_ms"].as_f64().is_some_and(|d| d >= 0.0),
        "{call}"
    );
    assert_eq!(call["span"]["trace_id"], trace, "{call}");
    // A pooled connection Redis cut, or a new one it refused: either way Redis's doing.
    assert!(
        call["error"]
            .as_str()
            .is_some_and(|e| e.starts_with("redis unavailable")),
        "{call}"
    );
    let start = lines
        .iter()
        .find(|l| l["message"] == "baton starting")
        .expect("a startup line");
    assert!(
        start["config"]
            .as_str()
            .is_some_and(|c| c.contains("redis_url=redis://127.0.0.1:")),
        "{start}"
    );
}

/// Calls on the health listener (`--health-listen`) are counted like those of the API's
/// listeners: its health checks by method and code, a method of the API it does not serve as
/// `UNIMPLEMENTED`. They went uncounted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_the_health_listener_are_counted() {
    let redis = RedisServer::start_standalone().await;
    let health_addr = format!("127.0.0.1:{}", free_port());
    let served = spawn(&redis, &["--health-listen", &health_addr]).await;
    let channel = channel(health_addr.parse().expect("address")).await;
    let check =
        "baton_rpc_calls_total{service=\"grpc.health.v1.Health\",method=\"Check\",code=\"OK\"}";
    let unserved = "baton_rpc_calls_total{service=\"baton.v1.LockService\",method=\"Acquire\",code=\"UNIMPLEMENTED\"}";
    let before = Scrape::of(&served).await;
    let mut health = HealthClient::new(channel.clone());
    for _ in 0..3 {
        health
            .check(tonic_health::pb::HealthCheckRequest {
                service: "liveness".to_owned(),
            })
            .await
            .expect("Check");
    }
    let refused = pb::lock_service_client::LockServiceClient::new(channel)
        .acquire(pb::LockServiceAcquireRequest {
            name: "not-here".to_owned(),
            ttl: Some(ms(1_000)),
            ..Default::default()
        })
        .await
        .expect_err("the health listener serves no lock API");
    assert_eq!(refused.code(), tonic::Code::Unimplemented, "{refused:?}");
    scrape_until_moved(
        &served,
        &before,
        &[(check.to_owned(), 3.0), (unserved.to_owned(), 1.0)],
    )
    .await;
}

/// Waits (bounded) for a scrape in which `check` holds, returning it.
async fn scrape_until(served: &Served, what: &str, check: impl Fn(&Scrape) -> bool) -> Scrape {
    let check = &check;
    wait_until(PATIENCE, what, || async move {
        let s = Scrape::of(served).await;
        if check(&s) { Ok(s) } else { Err(s.0) }
    })
    .await
}

/// Scrapes until every series has moved since `before` by exactly its expected amount, and
/// returns that scrape; fails with the series that did not within [`PATIENCE`]. Some counts are
/// made by a stream's task after its client already heard the end (the call's code, the lease no
/// longer held), so they are awaited, not read once; one moved too far never settles, and fails.
async fn scrape_until_moved(
    served: &Served,
    before: &Scrape,
    expected: &[(String, f64)],
) -> Scrape {
    wait_until(PATIENCE, "every count to settle", || async move {
        let s = Scrape::of(served).await;
        let off: Vec<(&str, f64, f64)> = expected
            .iter()
            .filter(|(series, want)| moved(before, &s, series) != *want)
            .map(|(series, want)| (series.as_str(), moved(before, &s, series), *want))
            .collect();
        if off.is_empty() {
            Ok(s)
        } else {
            Err(format!("(series, moved, expected): {off:?}"))
        }
    })
    .await
}

/// Semaphores and elections record under their own `kind`, each by exactly what happened: a
/// contended permit (a waiter, its wait, its grant), a Hold stream's renewals and its release when
/// the client leaves; an election's two leaders (both candidacies timed, the second waiting while
/// the first led), a candidate that left the queue (`failed`), and each resignation by closing the
/// stream. Locks do not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn semaphores_and_elections_count_under_their_own_kind() {
    let redis = RedisServer::start_standalone().await;
    let served = spawn(&redis, &[]).await;
    let channel = channel(served.baton.addr()).await;
    let mut sems = SemaphoreServiceClient::new(channel.clone());
    let mut elections = ElectionServiceClient::new(channel.clone());
    let before = Scrape::of(&served).await;
    let (sem, election) = (r#"kind="semaphore""#, r#"kind="election""#);
    let series = |name: &str, kind: &str, labels: &str| {
        if labels.is_empty() {
            format!("{name}{{{kind}}}")
        } else {
            format!("{name}{{{kind},{labels}}}")
        }
    };

    // A permit of one, a second caller waiting for it, its release.
    let permit = |wait_ms: Option<u64>| pb::SemaphoreServiceAcquireRequest {
        name: "pool".into(),
        limit: 1,
        permits: 1,
        ttl: Some(ms(10_000)),
        wait_timeout: wait_ms.map(ms),
        ..Default::default()
    };
    let first = sems
        .acquire(permit(None))
        .await
        .expect("acquire")
        .into_inner()
        .permit
        .expect("granted");
    let mut waiter = sems.clone();
    let waiting = tokio::spawn(async move { waiter.acquire(permit(Some(15_000))).await });
    scrape_until(&served, "a semaphore waiter", |s| {
        s.value(&series("baton_lease_waiters", sem, "")) == 1.0
            && s.value("baton_redis_subscriptions") >= 1.0
    })
    .await;
    sems.release(pb::SemaphoreServiceReleaseRequest {
        name: "pool".into(),
        token: first.token,
    })
    .await
    .expect("release");
    let second = within(PATIENCE, waiting, "the waiter's grant")
        .await
        .expect("the waiter's task")
        .expect("the waiter's acquire")
        .into_inner()
        .permit
        .expect("granted");
    sems.release(pb::SemaphoreServiceReleaseRequest {
        name: "pool".into(),
        token: second.token,
    })
    .await
    .expect("release");

    // A Hold stream: two renewals read as they come, then the client leaves.
    let mut hold = sems
        .hold(pb::SemaphoreServiceHoldRequest {
            name: "pool".into(),
            limit: 1,
            permits: 1,
            ttl: Some(ms(400)),
            ..Default::default()
        })
        .await
        .expect("hold")
        .into_inner();
    assert!(matches!(
        next_event(&mut hold, PATIENCE, "acquired").await,
        SemHoldEvent::Acquired(_)
    ));
    for _ in 0..2 {
        assert!(matches!(
            next_event(&mut hold, PATIENCE, "a renewal").await,
            SemHoldEvent::Renewed(_)
        ));
    }
    let holding = Scrape::of(&served).await;
    assert_eq!(holding.value(&series("baton_leases_held", sem, "")), 1.0);
    drop(hold);

    // Elections: a leads, b waits, c joins and leaves, a resigns, b leads and resigns.
    let campaign = |value: &str| pb::ElectionServiceCampaignRequest {
        name: "primary".into(),
        value: value.as_bytes().to_vec(),
        ttl: Some(ms(60_000)),
    };
    let mut a = elections
        .campaign(campaign("a"))
        .await
        .expect("campaign")
        .into_inner();
    assert!(matches!(
        next_event(&mut a, PATIENCE, "a elected").await,
        CampaignEvent::Elected(_)
    ));
    let mut b = elections
        .campaign(campaign("b"))
        .await
        .expect("campaign")
        .into_inner();
    let c = elections
        .campaign(campaign("c"))
        .await
        .expect("campaign")
        .into_inner();
    let during = scrape_until(&served, "two candidates waiting", |s| {
        s.value(&series("baton_lease_waiters", election, "")) == 2.0
    })
    .await;
    assert_eq!(
        during.value(&series("baton_leases_held", election, "")),
        1.0
    );
    drop(c);
    scrape_until(&served, "the candidate that left counted", |s| {
        s.value(&series("baton_lease_waiters", election, "")) == 1.0
            && moved(
                &before,
                s,
                &series(
                    "baton_lease_acquisitions_total",
                    election,
                    r#"result="failed""#,
                ),
            ) == 1.0
    })
    .await;
    drop(a);
    assert!(matches!(
        next_event(&mut b, PATIENCE, "b elected").await,
        CampaignEvent::Elected(_)
    ));
    drop(b);

    scrape_until(&served, "every release on close counted", |s| {
        moved(
            &before,
            s,
            &series(
                "baton_lease_releases_on_close_total",
                sem,
                r#"result="released""#,
            ),
        ) == 1.0
            && moved(
                &before,
                s,
                &series(
                    "baton_lease_releases_on_close_total",
                    election,
                    r#"result="released""#,
                ),
            ) == 2.0
    })
    .await;
    let expected = [
        (series("baton_lease_acquisitions_total", sem, r#"result="acquired""#), 3.0),
        (series("baton_lease_wait_seconds_count", sem, r#"result="acquired""#), 1.0),
        (series("baton_leases_held", sem, ""), 0.0),
        (series("baton_lease_waiters", sem, ""), 0.0),
        (series("baton_lease_acquisitions_total", election, r#"result="acquired""#), 2.0),
        (series("baton_lease_acquisitions_total", election, r#"result="failed""#), 1.0),
        (series("baton_lease_wait_seconds_count", election, r#"result="acquired""#), 2.0),
        (series("baton_lease_wait_seconds_count", election, r#"result="failed""#), 1.0),
        (series("baton_leases_held", election, ""), 0.0),
        (series("baton_lease_waiters", election, ""), 0.0),
        (series("baton_lease_acquisitions_total", r#"kind="lock""#, r#"result="acquired""#), 0.0),
        (
            r#"baton_rpc_calls_total{service="baton.v1.ElectionService",method="Campaign",code="CANCELLED"}"#.to_owned(),
            3.0,
        ),
    ];
    let after = scrape_until_moved(&served, &before, &expected).await;
    // The two renewals read, and any the stream made before Baton saw the client leave (on a busy
    // machine the scrape between them can take longer than the 100 ms between renewals).
    let renewed = moved(
        &before,
        &after,
        &series("baton_lease_renewals_total", sem, r#"result="renewed""#),
    );
    assert!(renewed >= 2.0, "{renewed} renewals counted, 2 read");
    let not_held = moved(
        &before,
        &after,
        &series("baton_lease_renewals_total", sem, r#"result="not_held""#),
    );
    assert_eq!(not_held, 0.0, "renewals counted not_held");
    // b waited about as long as a led: more than nothing, far less than the test's patience.
    let waited = moved(
        &before,
        &after,
        &series(
            "baton_lease_wait_seconds_sum",
            election,
            r#"result="acquired""#,
        ),
    );
    assert!(waited > 0.0 && waited < PATIENCE.as_secs_f64(), "{waited}");
}

/// A frozen Redis, then a dead one, against a Baton with JSON logs: the lease of a Hold stream is
/// lost (`unconfirmed`) and counted once, its renewals counted as failed; its `lease lost` line
/// names the lock and the owner and carries the trace id of the call's `traceparent`; a call
/// waiting on the frozen Redis holds no pool slot (`in_use` stays 0, the connection idle); calls
/// to the dead Redis count connection errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_then_dead_redis_counts_the_loss_and_the_errors() {
    let mut redis = RedisServer::start_standalone().await;
    let served = spawn(&redis, &["--log-format", "json"]).await;
    let mut client = lock_client(&served).await;
    let before = Scrape::of(&served).await;

    let trace = "0af7651916cd43dd8448eb211c80319c";
    let mut request = tonic::Request::new(pb::LockServiceHoldRequest {
        name: "frozen".into(),
        ttl: Some(ms(1_000)),
        owner: "worker-7".into(),
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace}-b7ad6b7169203331-01")
            .parse()
            .expect("metadata"),
    );
    let mut hold = client.hold(request).await.expect("hold").into_inner();
    assert!(matches!(
        next_event(&mut hold, PATIENCE, "acquired").await,
        HoldEvent::Acquired(_)
    ));

    redis.signal(nix::sys::signal::Signal::SIGSTOP);
    let mut waiting = client.clone();
    let stuck = tokio::spawn(async move { waiting.acquire(acquire("stuck", 10_000, None)).await });
    let in_flight = wait_until(PATIENCE, "a call waiting on the frozen Redis", || {
        let served = &served;
        async move {
            let s = Scrape::of(served).await;
            let calls =
                s.value(r#"baton_rpc_in_flight{service="baton.v1.LockService",method="Acquire"}"#);
            let in_use = s.value(r#"baton_redis_pool_connections{pool="commands",state="in_use"}"#);
            if calls == 1.0 && in_use == 0.0 {
                Ok(s)
            } else {
                Err((calls, in_use))
            }
        }
    })
    .await;
    assert!(
        in_flight.value(r#"baton_redis_pool_connections{pool="commands",state="idle"}"#) >= 1.0
    );
    let (lost, _) = read_until_lost(&mut hold, PATIENCE, "lost").await;
    redis.signal(nix::sys::signal::Signal::SIGCONT);
    assert_eq!(lost.reason(), pb::LeaseLostReason::Unconfirmed, "{lost:?}");
    let _ = within(PATIENCE, stuck, "the call that waited on the frozen Redis").await;

    let thawed = Scrape::of(&served).await;
    let lock = |labels: &str| format!("{{kind=\"lock\",{labels}}}");
    assert_eq!(
        moved(
            &before,
            &thawed,
            &format!("baton_leases_lost_total{}", lock(r#"reason="unconfirmed""#))
        ),
        1.0
    );
    assert_eq!(
        moved(
            &before,
            &thawed,
            &format!("baton_leases_lost_total{}", lock(r#"reason="not_held""#))
        ),
        0.0
    );
    assert!(
        moved(
            &before,
            &thawed,
            &format!("baton_lease_renewals_total{}", lock(r#"result="failed""#))
        ) >= 1.0,
        "the renewal that Redis never answered"
    );

    let line = wait_until(PATIENCE, "the lease lost line", || {
        let log = served.baton.stderr();
        async move {
            log.lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))
                })
                .find(|l| l["message"] == "lease lost")
                .ok_or(log)
        }
    })
    .await;
    assert_eq!(line["kind"], "lock", "{line}");
    assert_eq!(line["name"], "frozen", "{line}");
    assert_eq!(line["owner"], "worker-7", "{line}");
    assert_eq!(line["reason"], "Unconfirmed", "{line}");
    assert_eq!(line["span"]["trace_id"], trace, "{line}");
    assert_eq!(line["level"], "WARN", "{line}");

    // A dead Redis: calls fail on a broken or refused connection.
    redis.kill();
    let failed = client
        .acquire(acquire("dead", 10_000, None))
        .await
        .expect_err("Redis is dead");
    assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}");
    let dead = Scrape::of(&served).await;
    assert!(
        moved(
            &thawed,
            &dead,
            r#"baton_redis_errors_total{kind="connection"}"#
        ) >= 1.0,
        "a connection error counted"
    );
    assert_eq!(
        moved(&thawed, &dead, r#"baton_redis_errors_total{kind="auth"}"#),
        0.0
    );
}

/// On shutdown a Hold stream's lease is lost (`shutdown`) and counted once, like every other
/// loss (an in-process Baton: the drain stops the metrics endpoint, so this test reads the
/// process's own registry, which only its Baton records into).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_lost_at_shutdown_is_counted() {
    let redis = RedisServer::start_standalone().await;
    let mut baton = support::Baton::start(&redis).await;
    let mut client = baton.client().await;
    let series = r#"baton_leases_lost_total{kind="lock",reason="shutdown"}"#;
    let registry =
        || Scrape(baton::metrics::encode(baton::metrics::Format::Prometheus).expect("encodes"));
    let before = registry();
    let mut hold = client
        .hold(pb::LockServiceHoldRequest {
            name: "draining".into(),
            ttl: Some(ms(10_000)),
            ..Default::default()
        })
        .await
        .expect("hold")
        .into_inner();
    assert!(matches!(
        next_event(&mut hold, PATIENCE, "acquired").await,
        HoldEvent::Acquired(_)
    ));
    baton.begin_shutdown();
    let (lost, _) = read_until_lost(&mut hold, PATIENCE, "lost at shutdown").await;
    assert_eq!(lost.reason(), pb::LeaseLostReason::Shutdown, "{lost:?}");
    baton.shutdown().await.expect("a clean shutdown");
    assert_eq!(moved(&before, &registry(), series), 1.0);
}

/// A Redis Cluster whose slot moves to another master: Baton follows the new slot map and counts
/// it as a topology change of the cluster, not as a failover (no master left). Both series exist
/// at zero before the first change.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_moved_slot_counts_a_topology_change() {
    let cluster = support::topology::RedisCluster::start(3, 0).await;
    let seeds = cluster.seed_urls().join(",");
    let served = spawn_with(&[
        "--redis-mode",
        "cluster",
        "--redis-url",
        &seeds,
        "--key-prefix",
        "t:",
    ])
    .await;
    let mut client = lock_client(&served).await;
    let held = client
        .acquire(acquire("moving", 10_000, None))
        .await
        .expect("acquire")
        .into_inner();
    let before = Scrape::of(&served).await;
    for series in [
        r#"baton_redis_topology_changes_total{topology="cluster"}"#,
        r#"baton_redis_failovers_total{topology="cluster"}"#,
    ] {
        assert!(
            before.series().contains(series),
            "{series} is missing before the first change"
        );
    }
    let slot = support::topology::key_slot("t:{lock:moving}");
    let owner = cluster.node_for_slot(slot).await;
    let to = cluster
        .masters()
        .await
        .into_iter()
        .find(|m| m.port != owner.port)
        .expect("another master");
    cluster.migrate_slot(slot, to.port).await;
    // The next call meets MOVED, and Baton reloads the slot map.
    client
        .release(pb::LockServiceReleaseRequest {
            name: "moving".into(),
            token: token(&held),
        })
        .await
        .expect("release after the move");
    let after = scrape_until(&served, "the topology change counted", |s| {
        s.value(r#"baton_redis_topology_changes_total{topology="cluster"}"#) >= 1.0
    })
    .await;
    assert!(
        moved(
            &before,
            &after,
            r#"baton_redis_topology_changes_total{topology="cluster"}"#
        ) >= 1.0
    );
    assert_eq!(
        after.value(r#"baton_redis_failovers_total{topology="cluster"}"#),
        0.0,
        "a moved slot is not a failover"
    );
    // The log writer runs on a thread of its own: the line may land after the metric moved.
    wait_until(PATIENCE, "the slot map change in the log", || {
        let log = served.baton.stderr();
        async move {
            if log.contains("the cluster's slot map changed") {
                Ok(())
            } else {
                Err(log)
            }
        }
    })
    .await;
}

/// A client whose connection breaks while it is still sending a request (killed mid-call) left:
/// the call is counted CANCELLED, as a reset stream is, not UNKNOWN, and no ERROR is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cut_off_by_its_connection_counts_cancelled() {
    let redis = RedisServer::start().await;
    let served = spawn(&redis, &[]).await;
    let before = Scrape::of(&served).await;
    let series = |code: &str| {
        format!(
            r#"baton_rpc_calls_total{{service="baton.v1.SemaphoreService",method="Acquire",code="{code}"}}"#
        )
    };
    let mut bytes = h2::PREFACE.to_vec();
    bytes.extend(h2::frame(4, 0, 0, &[]));
    bytes.extend(h2::frame(
        1,
        4,
        1,
        &h2::grpc_request_headers("/baton.v1.SemaphoreService/Acquire"),
    ));
    // A gRPC message announced as 100 bytes, of which 3 are sent.
    bytes.extend(h2::frame(0, 0, 1, &[0, 0, 0, 0, 100, 1, 2, 3]));
    let mut stream = tokio::net::TcpStream::connect(served.baton.addr())
        .await
        .expect("connecting");
    stream.write_all(&bytes).await.expect("sending");
    // The call is under way (Baton waits for the rest of its message) before the connection is
    // cut off.
    let in_flight = r#"baton_rpc_in_flight{service="baton.v1.SemaphoreService",method="Acquire"}"#;
    wait_until(PATIENCE, "the call under way", || {
        let served = &served;
        async move {
            let now = Scrape::of(served).await.value(in_flight);
            if now == 1.0 { Ok(()) } else { Err(now) }
        }
    })
    .await;
    drop(stream);
    let after = scrape_until_moved(&served, &before, &[(series("CANCELLED"), 1.0)]).await;
    assert_eq!(moved(&before, &after, &series("UNKNOWN")), 0.0);
    assert!(
        !served.baton.stderr().contains("ERROR"),
        "{}",
        served.baton.stderr()
    );
}
