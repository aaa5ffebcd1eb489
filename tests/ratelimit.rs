//! Black-box tests of `baton.v1.RateLimitService` and of Envoy's rate limit API
//! (`envoy.service.ratelimit.v3.RateLimitService`) against a real `redis-server`, over gRPC to an
//! in-process Baton bound to port 0.

mod support;

use std::{path::PathBuf, time::Duration};

use baton::{
    config::FailureMode,
    proto::v1::{self as pb, rate_limit_service_client::RateLimitServiceClient},
    ratelimit::rules::Rules,
};
use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::{
            RateLimitDescriptor,
            rate_limit_descriptor::{Entry, RateLimitOverride},
        },
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, rate_limit::Unit},
        },
    },
    google::protobuf::{UInt64Value, value::Kind},
};
use support::{Baton, RedisServer, baton_command, ms, run_baton, std_duration, wait_until, within};
use tokio::{task::JoinSet, time::Instant};
use tonic::transport::Channel;

type Client = RateLimitServiceClient<Channel>;
type EnvoyClient = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<Channel>;

/// The rate limit timeout of tests that are not about Redis failing: long enough that a loaded
/// CI machine running tests in parallel never falls back to the failure mode.
const RELAXED_TIMEOUT: Duration = Duration::from_secs(2);

const GCRA: pb::RateLimitAlgorithm = pb::RateLimitAlgorithm::Gcra;
const FIXED: pb::RateLimitAlgorithm = pb::RateLimitAlgorithm::FixedWindow;
const SLIDING: pb::RateLimitAlgorithm = pb::RateLimitAlgorithm::SlidingWindow;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn request(
    key: &str,
    limit: u64,
    period_ms: u64,
    algorithm: pb::RateLimitAlgorithm,
    cost: Option<u64>,
) -> pb::RateLimitServiceCheckRequest {
    pb::RateLimitServiceCheckRequest {
        key: key.to_owned(),
        limit,
        period: Some(ms(period_ms)),
        cost,
        algorithm: algorithm.into(),
        burst: 0,
    }
}

async fn check(
    client: &mut Client,
    req: pb::RateLimitServiceCheckRequest,
) -> pb::RateLimitServiceCheckResponse {
    client
        .check(req.clone())
        .await
        .unwrap_or_else(|s| panic!("Check {req:?} failed: {s:?}"))
        .into_inner()
}

fn micros(d: Option<&prost_types::Duration>) -> u64 {
    d.map(|d| u64::try_from(std_duration(d).as_micros()).expect("fits"))
        .unwrap_or_else(|| panic!("a duration was expected"))
}

/// Redis's clock, in microseconds since the Unix epoch.
async fn redis_time(conn: &mut support::RedisConn) -> u64 {
    let (secs, us): (u64, u64) = redis::cmd("TIME")
        .query_async(conn)
        .await
        .expect("TIME answers");
    secs * 1_000_000 + us
}

fn rules_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/ratelimit_rules.yaml")
}

/// A Baton with the relaxed rate limit timeout.
async fn baton(redis: &RedisServer) -> Baton {
    Baton::start_with(redis, |c| c.ratelimit.timeout = RELAXED_TIMEOUT).await
}

/// A Baton serving Envoy's API with the test rules, and the relaxed rate limit timeout.
async fn envoy_baton(redis: &RedisServer) -> Baton {
    Baton::start_with(redis, move |c| {
        c.ratelimit.timeout = RELAXED_TIMEOUT;
        c.ratelimit.rules_path = Some(rules_path());
    })
    .await
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

fn envoy_request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

async fn should_rate_limit(baton: &Baton, req: RateLimitRequest) -> RateLimitResponse {
    baton
        .envoy_ratelimit_client()
        .await
        .should_rate_limit(req.clone())
        .await
        .unwrap_or_else(|s| panic!("ShouldRateLimit {req:?} failed: {s:?}"))
        .into_inner()
}

/// The codes of a response: overall first, then each descriptor's.
fn codes(r: &RateLimitResponse) -> (Code, Vec<Code>) {
    (
        r.overall_code(),
        r.statuses.iter().map(|s| s.code()).collect(),
    )
}

fn metadata_string(r: &RateLimitResponse, field: &str) -> Option<String> {
    match r
        .dynamic_metadata
        .as_ref()?
        .fields
        .get(field)?
        .kind
        .as_ref()?
    {
        Kind::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn metadata_list(r: &RateLimitResponse, field: &str) -> Vec<String> {
    let Some(Kind::ListValue(list)) = r
        .dynamic_metadata
        .as_ref()
        .and_then(|m| m.fields.get(field))
        .and_then(|v| v.kind.as_ref())
    else {
        return Vec::new();
    };
    list.values
        .iter()
        .filter_map(|v| match &v.kind {
            Some(Kind::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// baton.v1.RateLimitService
// ---------------------------------------------------------------------------------------------

/// GCRA of the tests: an interval model whose theoretical arrival time (TAT) is known to lie in
/// [lo, hi] because each request's Redis time is only known to lie between two TIME readings.
struct GcraModel {
    interval: u64,
    capacity: u64,
    lo: u64,
    hi: u64,
}

impl GcraModel {
    /// (allowed, remaining, retry after) at time `t` for a TAT of `tat`, `n` units (0 peeks).
    fn decide(&self, t: u64, tat: u64, n: u64) -> (bool, u64, u64) {
        let tat = tat.max(t);
        let units = n.max(1);
        let new = tat + units * self.interval;
        if new > t + self.capacity {
            let left = (t + self.capacity).saturating_sub(tat) / self.interval;
            return (false, left, new - self.capacity - t);
        }
        let after = if n == 0 { tat } else { new };
        (true, (t + self.capacity - after) / self.interval, 0)
    }
}

/// GCRA allows exactly what the analytic model allows, for a scripted sequence of requests at
/// known times (bursts, spaced requests, a peek, costs above 1), with the same remaining units
/// and retry-after.
#[tokio::test]
async fn gcra_matches_the_analytic_model() {
    let redis = RedisServer::start().await;
    let baton = baton(&redis).await;
    let mut client = baton.ratelimit_client().await;
    let mut conn = redis.conn().await;

    // 5 per second (an interval of 200 ms) with a burst of 3. Every request below is at least
    // 60 ms away from a decision boundary, so scheduling jitter cannot change a decision.
    let (limit, period_ms, burst) = (5, 1000, 3);
    let interval = period_ms * 1000 / limit;
    let schedule: [(u64, u64); 16] = [
        (0, 1),
        (0, 1),
        (0, 1),
        (0, 1),
        (100, 1),
        (300, 1),
        (320, 1),
        (500, 1),
        (700, 1),
        (1100, 0),
        (1100, 1),
        (1120, 1),
        (1130, 1),
        (1500, 1),
        (1700, 2),
        (1700, 2),
    ];
    let start = Instant::now();
    let first = redis_time(&mut conn).await;
    let mut model = GcraModel {
        interval,
        capacity: burst * interval,
        lo: first,
        hi: first,
    };
    let (mut allowed, mut denied) = (0, 0);
    for (step, (at_ms, cost)) in schedule.into_iter().enumerate() {
        tokio::time::sleep_until(start + Duration::from_millis(at_ms)).await;
        let mut req = request("model", limit, period_ms, GCRA, Some(cost));
        req.burst = burst;
        let t0 = redis_time(&mut conn).await;
        let got = check(&mut client, req).await;
        let t1 = redis_time(&mut conn).await;

        let outcomes: Vec<(bool, u64, u64)> = [
            (t0, model.lo),
            (t0, model.hi),
            (t1, model.lo),
            (t1, model.hi),
        ]
        .into_iter()
        .map(|(t, tat)| model.decide(t, tat, cost))
        .collect();
        let expected = outcomes[0].0;
        assert!(
            outcomes.iter().all(|o| o.0 == expected),
            "step {step}: request {at_ms} ms in lands within scheduling jitter of a boundary ({outcomes:?})"
        );
        assert_eq!(got.allowed, expected, "step {step} at {at_ms} ms: {got:?}");
        let remaining = outcomes.iter().map(|o| o.1);
        let (rmin, rmax) = (remaining.clone().min().unwrap(), remaining.max().unwrap());
        assert!(
            (rmin..=rmax).contains(&got.remaining),
            "step {step}: remaining {} outside the model's {rmin}..={rmax}",
            got.remaining
        );
        let retry = outcomes.iter().map(|o| o.2);
        let (wmin, wmax) = (retry.clone().min().unwrap(), retry.max().unwrap());
        let got_retry = micros(got.retry_after.as_ref());
        assert!(
            (wmin..=wmax + 1).contains(&got_retry),
            "step {step}: retry_after {got_retry} us outside the model's {wmin}..={wmax}"
        );
        assert_eq!(got.limit, limit);
        assert_eq!(got.decided_by(), pb::RateLimitDecidedBy::Redis);
        if got.allowed && cost > 0 {
            model.lo = model.lo.max(t0) + cost * interval;
            model.hi = model.hi.max(t1) + cost * interval;
            let reset = micros(got.reset_after.as_ref());
            assert!(
                (model.lo.saturating_sub(t1)..=model.hi - t0 + 1).contains(&reset),
                "step {step}: reset_after {reset} us is not the TAT"
            );
        }
        if got.allowed {
            allowed += 1;
        } else {
            denied += 1;
        }
    }
    // The schedule exercises both outcomes (11 allowed, counting the peek, and 5 denied).
    assert_eq!((allowed, denied), (11, 5));
}

/// Counts the checks allowed just before and just after the end of the window a first check
/// opened: `limit - 1` checks 400 ms before it, `limit` checks 20 ms after it; with the time from
/// the first of them to the last. `None` when the machine was too slow for the timing to mean
/// anything: the checks before the end ran past it, or those after it ran so late that the ones
/// before began to leave a sliding window.
async fn around_window_end(
    client: &mut Client,
    key: &str,
    limit: u64,
    period_ms: u64,
    algorithm: pb::RateLimitAlgorithm,
) -> Option<(u64, Duration)> {
    let period = Duration::from_millis(period_ms);
    let sent = Instant::now();
    let first = check(client, request(key, limit, period_ms, algorithm, None)).await;
    assert!(first.allowed);
    // Redis opened the window between `sent` and now.
    let (end_earliest, end_latest) = (sent + period, Instant::now() + period);
    tokio::time::sleep_until(end_earliest - Duration::from_millis(400)).await;
    let burst_start = Instant::now();
    let mut allowed = 0;
    for _ in 0..limit - 1 {
        allowed += u64::from(
            check(client, request(key, limit, period_ms, algorithm, None))
                .await
                .allowed,
        );
    }
    if Instant::now() >= end_earliest {
        return None;
    }
    tokio::time::sleep_until(end_latest + Duration::from_millis(20)).await;
    for _ in 0..limit {
        allowed += u64::from(
            check(client, request(key, limit, period_ms, algorithm, None))
                .await
                .allowed,
        );
    }
    (Instant::now() < burst_start + period).then(|| (allowed, burst_start.elapsed()))
}

/// [`around_window_end`] on fresh keys until a trial's timing holds (at most 5 trials).
async fn around_a_window_end(
    client: &mut Client,
    key: &str,
    limit: u64,
    period_ms: u64,
    algorithm: pb::RateLimitAlgorithm,
) -> (u64, Duration) {
    for trial in 0..5 {
        let key = format!("{key}-{trial}");
        if let Some(counted) = around_window_end(client, &key, limit, period_ms, algorithm).await {
            return counted;
        }
    }
    panic!("{key}: five trials around a window's end, each too slow to time");
}

/// The fixed window lets about twice the limit through around a window's end; GCRA and the
/// sliding window, asked the same way at the same moments, do not. (A trial that a busy machine
/// made too slow to time is run again: it failed the test once, 9 checks taking over 60 ms.)
#[tokio::test]
async fn fixed_window_boundary_burst_and_the_others_without_it() {
    let redis = RedisServer::start().await;
    let baton = baton(&redis).await;
    let mut client = baton.ratelimit_client().await;
    let (limit, period_ms) = (10, 2_000);

    let (fixed, span) = around_a_window_end(&mut client, "b-fixed", limit, period_ms, FIXED).await;
    assert_eq!(
        fixed,
        2 * limit - 1,
        "fixed window: {fixed} allowed within {span:?} around the window's end"
    );
    // (`around_a_window_end` times only trials whose checks all ran within one period: twice
    // the limit, less one, in less than a period.)

    let (sliding, span) =
        around_a_window_end(&mut client, "b-sliding", limit, period_ms, SLIDING).await;
    // Exactly the units that left the window (the first check) can be spent again.
    assert_eq!(
        sliding, limit,
        "sliding window: {sliding} allowed within {span:?}"
    );

    let (gcra, span) = around_a_window_end(&mut client, "b-gcra", limit, period_ms, GCRA).await;
    // A full bucket (burst = limit) plus what refills during the span at one unit per 200 ms.
    let refill = u64::try_from(span.as_millis()).unwrap() / (period_ms / limit) + 1;
    assert!(
        gcra <= limit + refill,
        "gcra: {gcra} allowed within {span:?}, more than the burst {limit} + {refill} refilled"
    );
    assert!(fixed > gcra && fixed > sliding);
}

/// 64 concurrent callers on one key never get more than the limit (the sliding and fixed
/// windows: exactly the limit; GCRA: the burst plus what refilled while they ran).
#[tokio::test]
async fn concurrent_callers_never_exceed_the_limit() {
    let redis = RedisServer::start().await;
    let baton = baton(&redis).await;
    let mut channels = Vec::new();
    for _ in 0..8 {
        channels.push(baton.ratelimit_client().await);
    }
    let limit = 50;
    let period_ms = 20_000;
    for algorithm in [GCRA, FIXED, SLIDING] {
        let key = format!("crowd-{}", algorithm.as_str_name());
        let started = Instant::now();
        let mut callers = JoinSet::new();
        for caller in 0..64 {
            let mut client = channels[caller % channels.len()].clone();
            let key = key.clone();
            callers.spawn(async move {
                let mut allowed = 0u64;
                for _ in 0..4 {
                    let got = check(
                        &mut client,
                        request(&key, limit, period_ms, algorithm, None),
                    )
                    .await;
                    assert_eq!(got.decided_by(), pb::RateLimitDecidedBy::Redis);
                    allowed += u64::from(got.allowed);
                }
                allowed
            });
        }
        let mut total = 0;
        while let Some(joined) = callers.join_next().await {
            total += joined.expect("caller task");
        }
        let elapsed = started.elapsed();
        if algorithm == GCRA {
            let refill = u64::try_from(elapsed.as_millis()).unwrap() * limit / period_ms + 1;
            assert!(
                (limit..=limit + refill).contains(&total),
                "gcra: {total} allowed in {elapsed:?}"
            );
        } else {
            assert_eq!(total, limit, "{algorithm:?}: {total} of 256 allowed");
        }
    }
}

/// Responses carry the limit, what remains, when to retry and when the limit resets; a peek
/// (cost 0) consumes nothing; a denied check consumes nothing.
#[tokio::test]
async fn check_reports_remaining_retry_and_reset() {
    let redis = RedisServer::start().await;
    let baton = baton(&redis).await;
    let mut client = baton.ratelimit_client().await;

    for algorithm in [GCRA, FIXED, SLIDING] {
        let key = format!("fields-{}", algorithm.as_str_name());
        let peek = check(&mut client, request(&key, 3, 10_000, algorithm, Some(0))).await;
        assert!(peek.allowed);
        assert_eq!(peek.remaining, 3, "{algorithm:?} peek on a fresh key");
        assert_eq!(micros(peek.reset_after.as_ref()), 0);

        let a = check(&mut client, request(&key, 3, 10_000, algorithm, Some(2))).await;
        assert!(a.allowed && a.remaining == 1, "{algorithm:?}: {a:?}");
        assert_eq!(micros(a.retry_after.as_ref()), 0);
        let reset = micros(a.reset_after.as_ref());
        assert!(
            reset > 5_000_000 && reset <= 10_000_000,
            "{algorithm:?}: reset {reset}"
        );

        // Too much for what is left: denied, nothing consumed.
        let b = check(&mut client, request(&key, 3, 10_000, algorithm, Some(2))).await;
        assert!(!b.allowed, "{algorithm:?}: {b:?}");
        assert_eq!(b.remaining, 1);
        let retry = micros(b.retry_after.as_ref());
        assert!(
            retry > 0 && retry <= 10_000_000,
            "{algorithm:?}: retry {retry}"
        );

        let c = check(&mut client, request(&key, 3, 10_000, algorithm, None)).await;
        assert!(c.allowed && c.remaining == 0, "{algorithm:?}: {c:?}");
        let peek = check(&mut client, request(&key, 3, 10_000, algorithm, Some(0))).await;
        assert!(
            !peek.allowed && peek.remaining == 0,
            "{algorithm:?}: {peek:?}"
        );
    }
}

/// Periods of any length at millisecond precision: a 250 ms sliding window frees its units
/// 250 ms after they were spent, and retry-after says when.
#[tokio::test]
async fn arbitrary_periods_and_retry_after() {
    let redis = RedisServer::start().await;
    let baton = baton(&redis).await;
    let mut client = baton.ratelimit_client().await;

    let first = check(&mut client, request("short", 2, 250, SLIDING, Some(2))).await;
    assert!(first.allowed);
    let denied = check(&mut client, request("short", 2, 250, SLIDING, None)).await;
    assert!(!denied.allowed);
    let retry = std_duration(denied.retry_after.as_ref().unwrap());
    assert!(
        retry <= Duration::from_millis(250) && retry > Duration::from_millis(150),
        "{retry:?}"
    );
    tokio::time::sleep(retry + Duration::from_millis(5)).await;
    let again = check(&mut client, request("short", 2, 250, SLIDING, None)).await;
    assert!(again.allowed, "after retry_after: {again:?}");

    // 1 per 1500 ms in GCRA: an interval of 1.5 s, not a whole second.
    let a = check(&mut client, request("odd", 1, 1500, GCRA, None)).await;
    assert!(a.allowed);
    let b = check(&mut client, request("odd", 1, 1500, GCRA, None)).await;
    let retry = std_duration(b.retry_after.as_ref().unwrap());
    assert!(
        !b.allowed && retry > Duration::from_millis(1400) && retry <= Duration::from_millis(1500),
        "{b:?}"
    );
}

/// Every key the limiter writes is under the prefix, hash-tagged by the limited key, and expires.
#[tokio::test]
async fn keys_are_tagged_and_expire() {
    // Lists every key in Redis: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = baton(&redis).await;
    let mut client = baton.ratelimit_client().await;
    for algorithm in [GCRA, FIXED, SLIDING] {
        check(
            &mut client,
            request("user:42", 10, 60_000, algorithm, Some(3)),
        )
        .await;
    }
    let mut conn = redis.conn().await;
    let keys = conn.keys("*").await;
    let p = baton.prefix();
    assert_eq!(
        keys,
        vec![
            format!("{p}{{rl:user:42}}:fw"),
            format!("{p}{{rl:user:42}}:gcra"),
            format!("{p}{{rl:user:42}}:sw"),
        ]
    );
    for key in keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert!(ttl > 0 && ttl <= 60_000, "{key} has ttl {ttl}");
    }
}

/// The very first checks of a Baton, sent while Redis is frozen, count nothing either: with no
/// estimate of Redis's clock yet, Baton reads it before checking, so no check goes out without
/// its time limit (before, every check sent ahead of Redis's first answer counted once Redis ran
/// it: here 10 units, the whole limit).
#[tokio::test]
async fn a_new_batons_first_checks_while_redis_is_frozen_count_nothing() {
    let redis = RedisServer::start_private().await;
    let timeout = Duration::from_millis(100);
    let baton = Baton::start_with(&redis, move |c| {
        c.ratelimit.timeout = timeout;
        c.ratelimit.failure_mode = FailureMode::Closed;
    })
    .await;
    let client = baton.ratelimit_client().await;
    signal(&redis, nix::sys::signal::Signal::SIGSTOP);
    let mut checks = JoinSet::new();
    for _ in 0..4 {
        let mut client = client.clone();
        checks.spawn(async move {
            check(&mut client, request("first", 10, 60_000, SLIDING, Some(10))).await
        });
    }
    while let Some(got) = checks.join_next().await {
        let got = got.expect("a check's task");
        assert_eq!(
            got.decided_by(),
            pb::RateLimitDecidedBy::FailClosed,
            "{got:?}"
        );
    }
    tokio::time::sleep(timeout * 2).await;
    signal(&redis, nix::sys::signal::Signal::SIGCONT);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut client = client.clone();
    let got = check(&mut client, request("first", 10, 60_000, SLIDING, Some(0))).await;
    assert_eq!(got.decided_by(), pb::RateLimitDecidedBy::Redis, "{got:?}");
    assert_eq!(
        got.remaining, 10,
        "a first check sent while Redis was frozen was counted"
    );
}

/// GCRA's `remaining` counts only units that could be spent now: one due in 10 s (of a unit a
/// year) is not counted, where the rounding room of a millionth of a unit (31 s here) counted
/// it.
#[tokio::test]
async fn gcra_remaining_counts_no_unit_before_it_is_due() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let key = format!("{}{{rl:due}}:gcra", support::unique_prefix());
    let (secs, us): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("TIME");
    let due = secs * 1_000_000 + us + 10_000_000;
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(format!("{due} 0"))
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .expect("SET");
    for cost in [1u64, 0] {
        let reply: Vec<i64> = redis::cmd("EVAL")
            .arg(baton::ratelimit::scripts::GCRA)
            .arg(1)
            .arg(&key)
            .arg(366u64 * 86_400 * 1_000_000)
            .arg(1)
            .arg(1)
            .arg(cost)
            .arg(0)
            .query_async(&mut conn)
            .await
            .expect("EVAL");
        assert_eq!(&reply[..2], &[0, 0], "cost {cost}: {reply:?}");
    }
}

/// A fixed window's denial always says when to retry: with under a millisecond of the window
/// left, Redis's PTTL says 0, and the denial said `retry_after` 0 (a client sleeping for it
/// would spin); it now rounds up. Limit 1 per 20 ms, checked in a loop for a second.
#[tokio::test]
async fn a_fixed_window_denial_always_says_when_to_retry() {
    let redis = RedisServer::start().await;
    let baton = baton(&redis).await;
    let mut client = baton.ratelimit_client().await;
    let until = Instant::now() + Duration::from_secs(1);
    let (mut denied, mut at_once) = (0, Vec::new());
    while Instant::now() < until {
        let got = check(&mut client, request("spinning", 1, 20, FIXED, None)).await;
        if !got.allowed {
            denied += 1;
            let retry = got.retry_after.map(|d| std_duration(&d));
            if retry.is_none_or(|r| r.is_zero())
                || got.reset_after.is_none_or(|d| std_duration(&d).is_zero())
            {
                at_once.push(got);
            }
        }
    }
    assert!(
        denied >= 10,
        "only {denied} denials: the loop proves nothing"
    );
    assert!(
        at_once.is_empty(),
        "{} of {denied} denials said to retry at once: {:?}",
        at_once.len(),
        at_once.first()
    );
}

/// GCRA never lets a unit go before it is due: three checks in one transaction (microseconds
/// apart, the second and third a unit each) on a bucket of 99 years emptied by the first leave
/// the second denied. A rounding tolerance proportional to the bucket (3 ms here) let it pass.
#[tokio::test]
async fn gcra_lets_no_unit_go_early_in_a_deep_bucket() {
    let redis = RedisServer::start().await;
    let mut conn = redis.conn().await;
    let key = format!("{}{{rl:deep}}:gcra", support::unique_prefix());
    // 1.01e10 units per 366 days, a burst of 1e12: about 99 years deep, a unit every 3.1 ms.
    let (period_us, limit, burst): (u64, u64, u64) =
        (366 * 86_400 * 1_000_000, 10_100_000_000, 1_000_000_000_000);
    let mut pipe = redis::pipe();
    pipe.atomic();
    for cost in [burst, 1, 1] {
        pipe.cmd("EVAL")
            .arg(baton::ratelimit::scripts::GCRA)
            .arg(1)
            .arg(&key)
            .arg(period_us)
            .arg(limit)
            .arg(burst)
            .arg(cost)
            .arg(0);
    }
    let replies: Vec<Vec<i64>> = pipe.query_async(&mut conn).await.expect("the transaction");
    assert_eq!(
        replies[0][0], 1,
        "the burst empties the bucket: {replies:?}"
    );
    assert_eq!(
        replies[1][0], 0,
        "a unit went microseconds after the bucket emptied: {replies:?}"
    );
    assert_eq!(replies[2][0], 0, "{replies:?}");
}

/// A fixed-window counter found without an expiry (here made by a raw INCRBY) gets the window's
/// expiry on every path, a denied check and a peek included, so it stops denying once that window
/// ends instead of never.
#[tokio::test]
async fn fixed_window_counter_without_expiry_recovers() {
    let redis = RedisServer::start().await;
    let baton = baton(&redis).await;
    let mut client = baton.ratelimit_client().await;
    let mut conn = redis.conn().await;
    for (name, cost) in [("stuck", Some(1)), ("stuck-peek", Some(0))] {
        let key = format!("{}{{rl:{name}}}:fw", baton.prefix());
        let _: i64 = redis::cmd("INCRBY")
            .arg(&key)
            .arg(5)
            .query_async(&mut conn)
            .await
            .expect("INCRBY");
        let got = check(&mut client, request(name, 5, 400, FIXED, cost)).await;
        assert!(!got.allowed, "{name}: the full counter denies: {got:?}");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert!(ttl > 0 && ttl <= 400, "{name}: the counter's ttl is {ttl}");
        wait_until(
            Duration::from_secs(10),
            "the counter to allow again",
            || {
                let mut client = client.clone();
                async move {
                    let got = check(&mut client, request(name, 5, 400, FIXED, cost)).await;
                    if got.allowed { Ok(()) } else { Err(got) }
                }
            },
        )
        .await;
    }
}

/// Bad input fails with INVALID_ARGUMENT naming the field, and writes nothing.
#[tokio::test]
async fn invalid_arguments_name_the_field_and_write_nothing() {
    let redis = RedisServer::start().await;
    let baton = baton(&redis).await;
    let mut client = baton.ratelimit_client().await;
    let ok = request("k", 10, 1000, GCRA, None);
    let cases: Vec<(pb::RateLimitServiceCheckRequest, &str)> = vec![
        (
            pb::RateLimitServiceCheckRequest {
                key: String::new(),
                ..ok.clone()
            },
            "key: ",
        ),
        (
            pb::RateLimitServiceCheckRequest {
                key: "k".repeat(1025),
                ..ok.clone()
            },
            "key: ",
        ),
        (
            pb::RateLimitServiceCheckRequest {
                limit: 0,
                ..ok.clone()
            },
            "limit: ",
        ),
        (
            pb::RateLimitServiceCheckRequest {
                limit: 1_000_000_000_001,
                ..ok.clone()
            },
            "limit: ",
        ),
        (request("k", 10_001, 1000, SLIDING, None), "limit: "),
        (
            pb::RateLimitServiceCheckRequest {
                period: None,
                ..ok.clone()
            },
            "period: ",
        ),
        (
            pb::RateLimitServiceCheckRequest {
                period: Some(ms(367 * 86_400_000)),
                ..ok.clone()
            },
            "period: ",
        ),
        (
            pb::RateLimitServiceCheckRequest {
                period: Some(prost_types::Duration {
                    seconds: -1,
                    nanos: 0,
                }),
                ..ok.clone()
            },
            "period: ",
        ),
        (
            pb::RateLimitServiceCheckRequest {
                cost: Some(11),
                ..ok.clone()
            },
            "cost: ",
        ),
        (
            pb::RateLimitServiceCheckRequest {
                burst: 2,
                cost: Some(3),
                ..ok.clone()
            },
            "cost: ",
        ),
        (request("k", 10, 1000, FIXED, Some(11)), "cost: "),
        (
            pb::RateLimitServiceCheckRequest {
                burst: 2,
                ..request("k", 10, 1000, FIXED, None)
            },
            "burst: ",
        ),
        (
            pb::RateLimitServiceCheckRequest {
                burst: 1_000_000_000_001,
                ..ok.clone()
            },
            "burst: ",
        ),
        (
            pb::RateLimitServiceCheckRequest {
                algorithm: 9,
                ..ok.clone()
            },
            "algorithm: ",
        ),
    ];
    for (req, prefix) in cases {
        let status = client
            .check(req.clone())
            .await
            .expect_err(&format!("{req:?} must be rejected"));
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{req:?}: {status:?}"
        );
        assert!(
            status.message().starts_with(prefix),
            "{req:?}: {:?} should start with {prefix:?}",
            status.message()
        );
    }
    // A sub-millisecond part rounds up to the next millisecond: 9 s + 1 ns is 9001 ms, so one unit
    // of 10 is an interval of 900.1 ms.
    let rounded = pb::RateLimitServiceCheckRequest {
        period: Some(prost_types::Duration {
            seconds: 9,
            nanos: 1,
        }),
        ..ok.clone()
    };
    let got = check(&mut client, rounded).await;
    assert!(got.allowed);
    assert_eq!(micros(got.reset_after.as_ref()), 900_100);
    let mut conn = redis.conn().await;
    let keys = conn.keys(&format!("{}*", baton.prefix())).await;
    assert_eq!(keys.len(), 1, "only the valid check wrote: {keys:?}");
}

/// A GCRA bucket deeper than the key's expiry and the script's arithmetic can hold (burst ×
/// period / limit beyond 100 years) is INVALID_ARGUMENT naming `burst` through `Check`, not an
/// error inside the script answered by the failure mode, and writes nothing; one just inside the
/// bound is decided by Redis. Through Envoy's API such a rule refuses the rules file.
#[tokio::test]
async fn gcra_bucket_deeper_than_redis_can_expire_is_refused() {
    let redis = RedisServer::start().await;
    let baton = baton(&redis).await;
    let mut client = baton.ratelimit_client().await;
    let day = 86_400_000;
    let deep = |limit, period_ms, burst| pb::RateLimitServiceCheckRequest {
        burst,
        ..request("deep", limit, period_ms, GCRA, None)
    };
    for req in [
        // Spending the whole burst would set an expiry of 3.2e22 ms, beyond Redis's 2^63.
        pb::RateLimitServiceCheckRequest {
            cost: Some(1_000_000_000_000),
            ..deep(1, 366 * day, 1_000_000_000_000)
        },
        deep(1, 366 * day, 1_000_000_000_000),
        deep(1, day, 36_600),
        deep(1_000, day, 36_600_000),
    ] {
        let status = client
            .check(req.clone())
            .await
            .expect_err(&format!("{req:?} must be refused"));
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().starts_with("burst: "),
            "{:?}",
            status.message()
        );
    }
    let mut conn = redis.conn().await;
    let keys = conn.keys(&format!("{}*", baton.prefix())).await;
    assert!(keys.is_empty(), "nothing written: {keys:?}");
    // 36 500 days of refill (100 years) is the deepest bucket; one unit sets a one-day expiry.
    let got = check(&mut client, deep(1, day, 36_500)).await;
    assert!(got.allowed, "{got:?}");
    assert_eq!(got.decided_by(), pb::RateLimitDecidedBy::Redis);
    assert_eq!(got.remaining, 36_499);

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("deep.yaml");
    std::fs::write(
        &file,
        "domain: d
descriptors:
  - key: k
    rate_limit: {unit: year, requests_per_unit: 1, algorithm: gcra, burst: 1000}
",
    )
    .expect("writing rules");
    let errors = Rules::load(&file).expect_err("a bucket of 1000 years is refused");
    let want = format!(
        "{}:4:76: domain \"d\": descriptors[0].rate_limit.burst: 1000 units at 1 per 365 days take 1000 years",
        file.display()
    );
    assert!(errors[0].starts_with(&want), "{errors:#?}");
}

// ---------------------------------------------------------------------------------------------
// Redis down: the failure mode
// ---------------------------------------------------------------------------------------------

fn signal(redis: &RedisServer, signal: nix::sys::signal::Signal) {
    redis.signal(signal);
}

/// Fail-open and fail-closed Batons each answer within their rate limit timeout, through both
/// APIs, when Redis is frozen and when it is gone, say so in the response, and decide by Redis
/// again once it is back.
#[tokio::test]
async fn redis_down_fail_open_and_fail_closed_answer_within_the_timeout() {
    let mut redis = RedisServer::start_private().await;
    let timeout = Duration::from_millis(100);
    let start = |mode| {
        Baton::start_with(&redis, move |c| {
            c.ratelimit.timeout = timeout;
            c.ratelimit.failure_mode = mode;
            c.ratelimit.rules_path = Some(rules_path());
        })
    };
    let open = start(FailureMode::Open).await;
    let closed = start(FailureMode::Closed).await;
    let mut open_client = open.ratelimit_client().await;
    let mut closed_client = closed.ratelimit_client().await;
    let req = || request("down", 5, 1000, GCRA, None);
    assert_eq!(
        check(&mut open_client, req()).await.decided_by(),
        pb::RateLimitDecidedBy::Redis
    );
    assert_eq!(
        check(&mut closed_client, req()).await.decided_by(),
        pb::RateLimitDecidedBy::Redis
    );
    let envoy = || envoy_request("edge", vec![descriptor(&[("remote_address", "10.1.1.1")])]);

    // Frozen: connections stay open but nothing answers.
    signal(&redis, nix::sys::signal::Signal::SIGSTOP);
    for round in 0..2 {
        let t = Instant::now();
        let got = check(&mut open_client, req()).await;
        let took = t.elapsed();
        assert!(got.allowed, "round {round}: {got:?}");
        assert_eq!(got.decided_by(), pb::RateLimitDecidedBy::FailOpen);
        assert!(
            took < timeout + Duration::from_millis(150),
            "fail-open took {took:?}"
        );

        let t = Instant::now();
        let got = check(&mut closed_client, req()).await;
        let took = t.elapsed();
        assert!(!got.allowed, "round {round}: {got:?}");
        assert_eq!(got.decided_by(), pb::RateLimitDecidedBy::FailClosed);
        assert!(
            took < timeout + Duration::from_millis(150),
            "fail-closed took {took:?}"
        );
        assert!(got.retry_after.is_some());

        let t = Instant::now();
        let got = should_rate_limit(&open, envoy()).await;
        assert!(t.elapsed() < timeout + Duration::from_millis(150));
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
        assert_eq!(
            metadata_string(&got, "baton.failure_mode").as_deref(),
            Some("open")
        );

        let t = Instant::now();
        let got = should_rate_limit(&closed, envoy()).await;
        assert!(t.elapsed() < timeout + Duration::from_millis(150));
        assert_eq!(codes(&got), (Code::OverLimit, vec![Code::OverLimit]));
        assert_eq!(
            metadata_string(&got, "baton.failure_mode").as_deref(),
            Some("closed")
        );
    }
    signal(&redis, nix::sys::signal::Signal::SIGCONT);

    // Gone: connections are refused at once.
    redis.kill();
    for _ in 0..2 {
        let t = Instant::now();
        let got = check(&mut open_client, req()).await;
        assert!(
            got.allowed && got.decided_by() == pb::RateLimitDecidedBy::FailOpen,
            "{got:?}"
        );
        assert!(
            t.elapsed() < timeout + Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
        let t = Instant::now();
        let got = check(&mut closed_client, req()).await;
        assert!(
            !got.allowed && got.decided_by() == pb::RateLimitDecidedBy::FailClosed,
            "{got:?}"
        );
        assert!(
            t.elapsed() < timeout + Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
    }

    // Back: decisions come from Redis again (the data is gone: nothing was persisted).
    redis.restart().await;
    for client in [&open_client, &closed_client] {
        wait_until(Duration::from_secs(5), "decisions by Redis again", || {
            let mut client = client.clone();
            async move {
                let got = check(&mut client, req()).await;
                if got.decided_by() == pb::RateLimitDecidedBy::Redis {
                    Ok(())
                } else {
                    Err(got)
                }
            }
        })
        .await;
    }
}

/// Checks answered by the failure mode while Redis was frozen count nothing when Redis runs them
/// once it runs again, in every algorithm: each carries the Redis time past which it changes
/// nothing. Before, a fail-closed Baton denied them and Redis counted them later, so a stall both
/// refused the callers and spent their limit (here all of it, for the rest of the minute).
#[tokio::test]
async fn checks_answered_by_the_failure_mode_count_nothing_later() {
    let redis = RedisServer::start_private().await;
    let timeout = Duration::from_millis(100);
    let baton = Baton::start_with(&redis, move |c| {
        c.ratelimit.timeout = timeout;
        c.ratelimit.failure_mode = FailureMode::Closed;
    })
    .await;
    let mut client = baton.ratelimit_client().await;
    let algorithms = [GCRA, FIXED, SLIDING];
    // Decided by Redis, whose answers tell Baton Redis's clock.
    for algorithm in algorithms {
        let got = check(
            &mut client,
            request("stalled", 10, 60_000, algorithm, Some(0)),
        )
        .await;
        assert_eq!(got.decided_by(), pb::RateLimitDecidedBy::Redis, "{got:?}");
        assert_eq!(got.remaining, 10, "{algorithm:?}");
    }

    signal(&redis, nix::sys::signal::Signal::SIGSTOP);
    for algorithm in algorithms {
        let got = check(
            &mut client,
            request("stalled", 10, 60_000, algorithm, Some(10)),
        )
        .await;
        assert!(!got.allowed, "{algorithm:?}: {got:?}");
        assert_eq!(
            got.decided_by(),
            pb::RateLimitDecidedBy::FailClosed,
            "{algorithm:?}"
        );
    }
    // Well past the last check's timeout (the estimate of Redis's clock may be late by a round
    // trip), then Redis runs what it was sent, and the peeks below come after that.
    tokio::time::sleep(timeout * 2).await;
    signal(&redis, nix::sys::signal::Signal::SIGCONT);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for algorithm in algorithms {
        let got = check(
            &mut client,
            request("stalled", 10, 60_000, algorithm, Some(0)),
        )
        .await;
        assert_eq!(got.decided_by(), pb::RateLimitDecidedBy::Redis, "{got:?}");
        assert_eq!(
            got.remaining, 10,
            "{algorithm:?}: a check answered by the failure mode was counted"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Envoy's rate limit API
// ---------------------------------------------------------------------------------------------

/// A matching descriptor is limited with its full status (code, limit, remaining, reset); one
/// that matches no rule is OK with no limit; a key-only rule limits each value separately.
#[tokio::test]
async fn envoy_matching_and_not_matching_descriptors() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    let ip = |ip: &str| envoy_request("edge", vec![descriptor(&[("remote_address", ip)])]);

    for expected_remaining in [1, 0] {
        let got = should_rate_limit(&baton, ip("10.0.0.1")).await;
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
        let status = &got.statuses[0];
        let limit = status
            .current_limit
            .as_ref()
            .expect("the limit is reported");
        assert_eq!(limit.requests_per_unit, 2);
        assert_eq!(limit.unit(), Unit::Hour);
        assert_eq!(status.limit_remaining, expected_remaining);
        let reset = status
            .duration_until_reset
            .as_ref()
            .expect("reset is reported");
        assert!(
            reset.seconds <= 3600 && (reset.seconds > 0 || reset.nanos > 0),
            "{reset:?}"
        );
    }
    let over = should_rate_limit(&baton, ip("10.0.0.1")).await;
    assert_eq!(codes(&over), (Code::OverLimit, vec![Code::OverLimit]));
    assert_eq!(over.statuses[0].limit_remaining, 0);
    // Another address has its own limit.
    let other = should_rate_limit(&baton, ip("10.0.0.2")).await;
    assert_eq!(codes(&other), (Code::Ok, vec![Code::Ok]));

    // No rule: OK without a limit; an unknown domain: the same.
    for req in [
        envoy_request("edge", vec![descriptor(&[("path", "/nothing")])]),
        envoy_request("edge", vec![descriptor(&[("unknown", "x")])]),
        envoy_request(
            "nowhere",
            vec![descriptor(&[("remote_address", "10.0.0.1")])],
        ),
        // More entries than the rules nest.
        envoy_request(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.1"), ("x", "y")])],
        ),
    ] {
        let got = should_rate_limit(&baton, req.clone()).await;
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]), "{req:?}");
        assert!(got.statuses[0].current_limit.is_none(), "{req:?}");
    }

    // Several descriptors: any over the limit makes the whole request over the limit, and each
    // status is its own.
    let got = should_rate_limit(
        &baton,
        envoy_request(
            "edge",
            vec![
                descriptor(&[("path", "/login")]),
                descriptor(&[("remote_address", "10.0.0.1")]),
                descriptor(&[("path", "/none")]),
            ],
        ),
    )
    .await;
    assert_eq!(
        codes(&got),
        (Code::OverLimit, vec![Code::Ok, Code::OverLimit, Code::Ok])
    );
    let login = got.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((login.name.as_str(), login.unit()), ("login", Unit::Hour));
    assert_eq!(got.statuses[0].limit_remaining, 4);

    // A domain's rules are its own.
    let got = should_rate_limit(
        &baton,
        envoy_request("other", vec![descriptor(&[("remote_address", "10.0.0.1")])]),
    )
    .await;
    assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
    assert_eq!(
        got.statuses[0].current_limit.as_ref().unwrap().unit(),
        Unit::Second
    );
}

/// Nested rules apply to the full descriptor only; wildcard prefixes, GCRA with a 1.5 s period,
/// unlimited and blocking rules, `replaces`, and limit overrides from Envoy's route config.
#[tokio::test]
async fn envoy_nested_wildcard_and_special_rules() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    let one = |entries: &[(&str, &str)]| envoy_request("edge", vec![descriptor(entries)]);

    // tenant alone has no limit; (tenant, plan=free) has a sliding window of 3 per day.
    let got = should_rate_limit(&baton, one(&[("tenant", "acme")])).await;
    assert!(got.statuses[0].current_limit.is_none());
    for remaining in [2, 1, 0] {
        let got = should_rate_limit(&baton, one(&[("tenant", "acme"), ("plan", "free")])).await;
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
        assert_eq!(got.statuses[0].limit_remaining, remaining);
        let limit = got.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.unit(), limit.requests_per_unit),
            ("free-plan", Unit::Day, 3)
        );
    }
    let got = should_rate_limit(&baton, one(&[("tenant", "acme"), ("plan", "free")])).await;
    assert_eq!(codes(&got), (Code::OverLimit, vec![Code::OverLimit]));
    // Another tenant on the same rule has its own count; gold is unlimited.
    let got = should_rate_limit(&baton, one(&[("tenant", "other"), ("plan", "free")])).await;
    assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
    for _ in 0..5 {
        let got = should_rate_limit(&baton, one(&[("tenant", "acme"), ("plan", "gold")])).await;
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
        assert_eq!(got.statuses[0].limit_remaining, u32::MAX);
    }

    // /api/* : GCRA, 3 per 1500 ms with a burst of 2; the unit is not a standard one.
    let api = |path: &str| one(&[("path", path)]);
    let a = should_rate_limit(&baton, api("/api/users")).await;
    let b = should_rate_limit(&baton, api("/api/users")).await;
    let c = should_rate_limit(&baton, api("/api/users")).await;
    assert_eq!(codes(&a).1, vec![Code::Ok]);
    assert_eq!(codes(&b).1, vec![Code::Ok]);
    assert_eq!(codes(&c).1, vec![Code::OverLimit]);
    let limit = c.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.unit(), limit.requests_per_unit),
        ("api", Unit::Unknown, 3)
    );
    // Retry after one interval (500 ms) at most.
    let retry = c.statuses[0].duration_until_reset.as_ref().unwrap();
    assert!(
        retry.seconds == 0 && retry.nanos > 0 && retry.nanos <= 500_000_000,
        "{retry:?}"
    );
    // A different path under the prefix has its own bucket.
    assert_eq!(
        codes(&should_rate_limit(&baton, api("/api/orders")).await).1,
        vec![Code::Ok]
    );

    // requests_per_unit: 0 blocks everything without touching Redis.
    let got = should_rate_limit(&baton, one(&[("banned", "1")])).await;
    assert_eq!(codes(&got), (Code::OverLimit, vec![Code::OverLimit]));

    // vip replaces the login limit when both match: the login limit is not counted.
    let got = should_rate_limit(
        &baton,
        envoy_request(
            "edge",
            vec![
                descriptor(&[("path", "/login")]),
                descriptor(&[("vip", "true")]),
            ],
        ),
    )
    .await;
    assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok, Code::Ok]));
    assert!(got.statuses[0].current_limit.is_none(), "login is replaced");
    assert_eq!(got.statuses[1].current_limit.as_ref().unwrap().name, "vip");
    let alone = should_rate_limit(&baton, one(&[("path", "/login")])).await;
    assert_eq!(
        alone.statuses[0].limit_remaining, 4,
        "the replaced request did not count"
    );

    // A limit override from Envoy's route config applies even without a rule.
    let mut d = descriptor(&[("custom", "x")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour.into(),
    });
    let req = envoy_request("edge", vec![d]);
    assert_eq!(
        codes(&should_rate_limit(&baton, req.clone()).await).1,
        vec![Code::Ok]
    );
    let got = should_rate_limit(&baton, req).await;
    assert_eq!(codes(&got).1, vec![Code::OverLimit]);
    assert_eq!(
        got.statuses[0].current_limit.as_ref().unwrap().unit(),
        Unit::Hour
    );
}

/// A `*` anywhere in a rule's value stands for any run of characters, none included, as in
/// envoyproxy/ratelimit: `/api/*/action`, `*.png` and `a*b*c` limit the values they match (each
/// value counted on its own) and no others, and an exact rule still comes first.
#[tokio::test]
async fn envoy_wildcards_anywhere_in_a_value() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("wild.yaml");
    std::fs::write(
        &file,
        r#"domain: wild
descriptors:
  - key: path
    value: /api/*/action
    rate_limit: {name: action, unit: hour, requests_per_unit: 1}
  - key: path
    value: "*.png"
    rate_limit: {name: png, unit: hour, requests_per_unit: 5}
  - key: path
    value: a*b*c
    rate_limit: {name: abc, unit: hour, requests_per_unit: 5}
  - key: path
    value: /api/v9/action
    rate_limit: {name: exact, unit: hour, requests_per_unit: 5}
"#,
    )
    .expect("writing rules");
    let baton = Baton::start_with(&redis, |c| {
        c.ratelimit.timeout = RELAXED_TIMEOUT;
        c.ratelimit.rules_path = Some(file);
    })
    .await;
    let ask = |path: &str| {
        should_rate_limit(
            &baton,
            envoy_request("wild", vec![descriptor(&[("path", path)])]),
        )
    };
    let limit_name = |got: &RateLimitResponse| {
        got.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.name.clone())
    };
    for (path, want) in [
        ("/api/v1/action", Some("action")),
        ("/api//action", Some("action")),
        ("/api/action", None),
        ("/api/v1/action/x", None),
        ("/api/v9/action", Some("exact")),
        ("logo.png", Some("png")),
        (".png", Some("png")),
        ("logo.png.jpg", None),
        ("abc", Some("abc")),
        ("a-b-c", Some("abc")),
        ("acb", None),
    ] {
        let got = ask(path).await;
        assert_eq!(
            limit_name(&got).as_deref(),
            want,
            "{path}: {:?}",
            got.statuses
        );
    }
    // One unit an hour for each value matched: /api/v1/action is spent, /api/v2/action is not.
    let again = ask("/api/v1/action").await;
    assert_eq!(codes(&again), (Code::OverLimit, vec![Code::OverLimit]));
    let other = ask("/api/v2/action").await;
    assert_eq!(codes(&other), (Code::Ok, vec![Code::Ok]));
}

/// `hits_addend` counts that many hits (per request, or per descriptor when it sets its own).
#[tokio::test]
async fn envoy_hits_addend() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    let mut req = envoy_request("edge", vec![descriptor(&[("path", "/login")])]);
    req.hits_addend = 3;
    let got = should_rate_limit(&baton, req.clone()).await;
    assert_eq!(codes(&got).1, vec![Code::Ok]);
    assert_eq!(got.statuses[0].limit_remaining, 2);
    let got = should_rate_limit(&baton, req).await;
    assert_eq!(codes(&got).1, vec![Code::OverLimit]);
    assert_eq!(
        got.statuses[0].limit_remaining, 2,
        "the denied hits were not counted"
    );

    // The descriptor's own hits_addend wins over the request's; 0 peeks.
    let mut d = descriptor(&[("path", "/login")]);
    d.hits_addend = Some(UInt64Value { value: 2 });
    let mut req = envoy_request("edge", vec![d.clone()]);
    req.hits_addend = 50;
    let got = should_rate_limit(&baton, req).await;
    assert_eq!(codes(&got).1, vec![Code::Ok]);
    assert_eq!(got.statuses[0].limit_remaining, 0);
    d.hits_addend = Some(UInt64Value { value: 0 });
    let got = should_rate_limit(&baton, envoy_request("edge", vec![d])).await;
    assert_eq!(
        codes(&got).1,
        vec![Code::OverLimit],
        "a peek at an exhausted limit"
    );

    // More hits than the GCRA burst of /api/* (2) can ever allow: over the limit, reporting the
    // time until the bucket is full (at most its 1 s depth), not a wait that never ends.
    let mut d = descriptor(&[("path", "/api/huge")]);
    d.hits_addend = Some(UInt64Value { value: u64::MAX });
    let got = should_rate_limit(&baton, envoy_request("edge", vec![d])).await;
    assert_eq!(codes(&got).1, vec![Code::OverLimit]);
    let reset = got.statuses[0]
        .duration_until_reset
        .as_ref()
        .map(|d| Duration::from_secs(u64::try_from(d.seconds).expect("not negative")));
    assert!(
        reset.is_some_and(|r| r <= Duration::from_secs(1)),
        "{reset:?}"
    );
}

/// Shadow mode allows over the limit but reports it, in the status's remaining count and in
/// the dynamic metadata Envoy logs.
#[tokio::test]
async fn envoy_shadow_mode_allows_but_reports() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    let req = envoy_request("edge", vec![descriptor(&[("experiment", "new-limits")])]);
    let first = should_rate_limit(&baton, req.clone()).await;
    assert_eq!(codes(&first), (Code::Ok, vec![Code::Ok]));
    assert!(first.dynamic_metadata.is_none(), "nothing to report yet");
    for _ in 0..3 {
        let got = should_rate_limit(&baton, req.clone()).await;
        assert_eq!(
            codes(&got),
            (Code::Ok, vec![Code::Ok]),
            "shadow mode never denies"
        );
        assert_eq!(got.statuses[0].limit_remaining, 0);
        assert_eq!(
            metadata_list(&got, "baton.shadow_over_limit"),
            vec!["experiment".to_owned()]
        );
    }
}

/// Malformed Envoy requests fail with INVALID_ARGUMENT; without a rules file Envoy's API is not
/// served at all.
#[tokio::test]
async fn envoy_invalid_requests_and_unconfigured() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    let mut client = baton.envoy_ratelimit_client().await;
    let mut negative = descriptor(&[("path", "/login")]);
    negative.is_negative_hits = true;
    for (req, prefix) in [
        (
            envoy_request("", vec![descriptor(&[("a", "b")])]),
            "domain: ",
        ),
        (envoy_request("edge", vec![]), "descriptors: "),
        (
            envoy_request("edge", vec![descriptor(&[])]),
            "descriptors: ",
        ),
        (
            envoy_request("edge", vec![descriptor(&[("", "b")])]),
            "descriptors: ",
        ),
        (
            envoy_request("edge", vec![descriptor(&[("a", &"v".repeat(1025))])]),
            "descriptors: ",
        ),
        (
            envoy_request("edge", vec![descriptor(&[("a", "b")]); 65]),
            "descriptors: ",
        ),
        (envoy_request("edge", vec![negative]), "descriptors: "),
    ] {
        let status = client
            .should_rate_limit(req.clone())
            .await
            .expect_err("rejected");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().starts_with(prefix), "{status:?}");
    }

    let plain = Baton::start(&redis).await;
    let status = plain
        .envoy_ratelimit_client()
        .await
        .should_rate_limit(envoy_request("edge", vec![descriptor(&[("a", "b")])]))
        .await
        .expect_err("not served");
    assert_eq!(status.code(), tonic::Code::Unimplemented);
}

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

/// Bad rate limit flags and a bad rules file are reported together, each naming its flag, the
/// file, the line and column, the domain and the setting, and the binary exits with code 2.
#[tokio::test]
async fn bad_ratelimit_configuration_is_reported_at_startup() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("rules.yaml");
    std::fs::write(
        &file,
        "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: path\n    rate_limit: {period: 2s, requests_per_unit: 5, algorithm: leaky}\n",
    )
    .expect("writing rules");
    let mut command = baton_command();
    command.args([
        "serve",
        "--ratelimit-timeout",
        "soon",
        "--ratelimit-failure-mode",
        "maybe",
        "--ratelimit-config",
    ]);
    command.arg(&file);
    let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    let at = |place: &str| format!("{}:{place}: ", file.display());
    for needle in [
        "--ratelimit-timeout / BATON_RATELIMIT_TIMEOUT".to_owned(),
        "--ratelimit-failure-mode / BATON_RATELIMIT_FAILURE_MODE".to_owned(),
        at("4:24") + "domain \"web\": descriptors[0].rate_limit.unit: \"fortnight\"",
        at("6:63") + "domain \"web\": descriptors[1].rate_limit.algorithm: \"leaky\"",
    ] {
        assert!(stderr.contains(&needle), "{needle:?} missing in:\n{stderr}");
    }

    let mut command = baton_command();
    command.args(["serve", "--ratelimit-config", "/nonexistent/rules.yaml"]);
    let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent/rules.yaml"), "{stderr}");
}

/// A directory of rules files is read whole, and the test rules file itself is valid; one of
/// them that cannot be read refuses the rules.
#[tokio::test]
async fn rules_directory_loads() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::copy(rules_path(), dir.path().join("a.yaml")).expect("copy");
    std::fs::write(dir.path().join("b.yml"), "domain: third\n").expect("write");
    std::fs::write(dir.path().join("notes.txt"), "not yaml: [").expect("write");
    let rules = within(
        Duration::from_secs(5),
        async { Rules::load(dir.path()) },
        "loading",
    )
    .await
    .expect("valid");
    assert_eq!(rules.domains(), vec!["edge", "other", "third"]);

    // A rules file that is not a readable regular file refuses the rules, naming it, instead of
    // being skipped with its domains (whose traffic would then pass unlimited after a reload).
    std::os::unix::fs::symlink(dir.path().join("gone"), dir.path().join("c.yaml")).expect("link");
    std::fs::create_dir(dir.path().join("d.yml")).expect("dir");
    let errors = Rules::load(dir.path()).expect_err("a dangling link and a directory");
    for name in ["c.yaml", "d.yml"] {
        assert!(
            errors.iter().any(|e| e.contains(name)),
            "{name} not named in {errors:?}"
        );
    }
}

/// A Baton serving Envoy's API with the rules of `file`, reread every 50 ms.
async fn reloading_baton(redis: &RedisServer, file: &std::path::Path) -> Baton {
    let path = file.to_owned();
    Baton::start_with(redis, move |c| {
        c.ratelimit.timeout = RELAXED_TIMEOUT;
        c.ratelimit.rules_path = Some(path);
        c.ratelimit.reload_interval = Duration::from_millis(50);
    })
    .await
}

/// Changed rules are put in force without a restart; invalid ones are refused and the rules in
/// force kept.
#[tokio::test]
async fn envoy_rules_reload_when_the_file_changes() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("rules.yaml");
    let write = |limit: &str| {
        std::fs::write(
            &file,
            format!("domain: live\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"),
        )
        .expect("writing rules");
    };
    write("5");
    let baton = reloading_baton(&redis, &file).await;
    let limit_now = || async {
        let got = should_rate_limit(
            &baton,
            envoy_request("live", vec![descriptor(&[("k", "v")])]),
        )
        .await;
        got.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
    };
    assert_eq!(limit_now().await, Some(5));

    write("7");
    wait_until(Duration::from_secs(5), "the new limit in force", || async {
        match limit_now().await {
            Some(7) => Ok(()),
            other => Err(other),
        }
    })
    .await;

    // An invalid file is refused: the rules in force stay, across several reload intervals.
    write("lots");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(limit_now().await, Some(7));
}

/// Fixed windows of different lengths for one descriptor count apart, as envoyproxy/ratelimit
/// counts them: a descriptor sent with and without a route's limit override spends each limit
/// once (one count for both restarted at every switch, and admitted everything), and a reload that
/// changes a rule's unit counts in windows of the new length while the old window's count stays,
/// found again when the unit changes back.
#[tokio::test]
async fn envoy_fixed_windows_of_different_lengths_count_apart() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    // The rules give remote_address 2 an hour; the override 2 a day.
    let plain = || descriptor(&[("remote_address", "10.9.9.9")]);
    let overridden = || {
        let mut d = plain();
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: Unit::Day.into(),
        });
        d
    };
    let mut allowed = (0, 0);
    for i in 0..10 {
        let (d, count) = if i % 2 == 0 {
            (plain(), &mut allowed.0)
        } else {
            (overridden(), &mut allowed.1)
        };
        let got = should_rate_limit(&baton, envoy_request("edge", vec![d])).await;
        if got.statuses[0].code() == Code::Ok {
            *count += 1;
        }
    }
    assert_eq!(allowed, (2, 2), "(the rule's hour, the override's day)");

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("rules.yaml");
    let rules = |unit: &str| {
        format!(
            "domain: live\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: 3}}\n"
        )
    };
    replace_file(&file, &rules("hour"));
    let baton = reloading_baton(&redis, &file).await;
    // A peek (hits 0) counts nothing: (the unit in force, the units left).
    let peek = || async {
        let mut d = descriptor(&[("k", "v")]);
        d.hits_addend = Some(UInt64Value { value: 0 });
        let got = should_rate_limit(&baton, envoy_request("live", vec![d])).await;
        let status = &got.statuses[0];
        (
            status.current_limit.as_ref().map(|l| l.unit()),
            status.limit_remaining,
        )
    };
    let spend = || async {
        should_rate_limit(
            &baton,
            envoy_request("live", vec![descriptor(&[("k", "v")])]),
        )
        .await
        .statuses[0]
            .code()
    };
    for _ in 0..3 {
        assert_eq!(spend().await, Code::Ok);
    }
    assert_eq!(spend().await, Code::OverLimit);
    assert_eq!(peek().await, (Some(Unit::Hour), 0));

    replace_file(&file, &rules("day"));
    wait_until(
        Duration::from_secs(5),
        "the day's rule in force",
        || async {
            match peek().await {
                (Some(Unit::Day), left) => Ok(left),
                other => Err(other),
            }
        },
    )
    .await;
    assert_eq!(peek().await, (Some(Unit::Day), 3), "a new window length");
    assert_eq!(spend().await, Code::Ok);

    replace_file(&file, &rules("hour"));
    wait_until(Duration::from_secs(5), "the hour's rule back", || async {
        match peek().await {
            (Some(Unit::Hour), _) => Ok(()),
            other => Err(other),
        }
    })
    .await;
    assert_eq!(peek().await, (Some(Unit::Hour), 0), "the hour's count kept");
    assert_eq!(spend().await, Code::OverLimit);
}

/// The positions `FILE:LINE:COLUMN:` that `text` gives for `file`, in order.
fn positions(text: &str, file: &std::path::Path) -> Vec<(u32, u32)> {
    let needle = format!("{}:", file.display());
    text.match_indices(&needle)
        .filter_map(|(at, _)| {
            let mut parts = text[at + needle.len()..].splitn(3, ':');
            let line = parts.next()?.parse().ok()?;
            let column = parts.next()?.parse().ok()?;
            Some((line, column))
        })
        .collect()
}

/// Replaces `file`'s contents at once (write beside it, then rename), so that a reload never
/// reads half a file.
fn replace_file(file: &std::path::Path, text: &str) {
    let part = file.with_extension("part");
    std::fs::write(&part, text).expect("writing the new contents");
    std::fs::rename(&part, file).expect("renaming into place");
}

/// A rules file with a YAML syntax error (an unclosed flow sequence, an unclosed quote) stops the
/// binary at once with exit code 2 and the error's line and column, instead of hanging.
#[tokio::test]
async fn malformed_rules_file_exits_2_naming_the_position() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The block entry inside the flow list; the quote that never closes.
    let cases = [
        (
            "flow.yaml",
            "domain: x\ndescriptors: [\n  - key: a\n",
            (3, 3),
        ),
        (
            "quote.yaml",
            "domain: \"x\ndescriptors:\n  - key: a\n",
            (1, 9),
        ),
    ];
    for (name, text, place) in cases {
        let file = dir.path().join(name);
        std::fs::write(&file, text).expect("writing rules");
        let mut command = baton_command();
        command.args(["serve", "--ratelimit-config"]).arg(&file);
        let started = Instant::now();
        let (status, stderr) = run_baton(command, Duration::from_secs(20)).await;
        assert_eq!(status.code(), Some(2), "{name}: {stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{name}: took {:?}",
            started.elapsed()
        );
        assert_eq!(
            positions(&stderr, &file),
            vec![place],
            "{name}: FILE:LINE:COLUMN of the error in:\n{stderr}"
        );
    }
}

/// With reloading on, a valid rules file replaced by a malformed one leaves the rules in force and
/// logs the refusal with the error's position, without the process growing; a later valid file is
/// put in force.
#[tokio::test]
async fn malformed_rules_on_reload_keep_the_rules_in_force() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("rules.yaml");
    let valid = |limit: u32| {
        format!(
            "domain: live\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
        )
    };
    replace_file(&file, &valid(5));
    let mut args = redis.baton_args();
    args.extend(
        [
            "--ratelimit-timeout",
            "2s",
            "--ratelimit-config-reload",
            "50ms",
            "--ratelimit-config",
        ]
        .map(String::from),
    );
    args.push(file.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let baton = support::BatonProcess::spawn(&args).await;
    let client = EnvoyClient::new(support::channel(baton.addr()).await);
    let limit_now = || {
        let mut client = client.clone();
        async move {
            let got = client
                .should_rate_limit(envoy_request("live", vec![descriptor(&[("k", "v")])]))
                .await
                .expect("ShouldRateLimit answers")
                .into_inner();
            got.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit)
        }
    };
    assert_eq!(limit_now().await, Some(5));

    replace_file(&file, "domain: x\ndescriptors: [\n  - key: a\n");
    wait_until(
        Duration::from_secs(10),
        "the refusal of the malformed file in the log",
        || async {
            let stderr = baton.stderr();
            if stderr.contains("keeping the rules in force")
                && !positions(&stderr, &file).is_empty()
            {
                Ok(())
            } else {
                Err(stderr)
            }
        },
    )
    .await;
    assert_eq!(limit_now().await, Some(5), "the rules in force stay");
    let rss_kib = std::fs::read_to_string(format!("/proc/{}/status", baton.pid()))
        .expect("reading the process status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS in the process status");
    assert!(rss_kib < 256 * 1024, "resident memory {rss_kib} KiB");

    replace_file(&file, &valid(7));
    wait_until(
        Duration::from_secs(10),
        "the next valid rules in force",
        || async {
            match limit_now().await {
                Some(7) => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
}

/// A rules file beyond the loader's bounds is refused quickly with a clear reason: not UTF-8 (with
/// its position), too large, not a regular file, aliases expanding past the node budget, nesting
/// too deep, too many documents, too many rules, too many files in a directory.
#[tokio::test]
async fn rules_beyond_the_bounds_are_refused_quickly() {
    use baton::ratelimit::rules::{MAX_DOCUMENTS, MAX_FILE_BYTES, MAX_FILES, MAX_RULES};
    let dir = tempfile::tempdir().expect("temp dir");
    let big = dir.path().join("big.yaml");
    let padding = usize::try_from(MAX_FILE_BYTES).expect("fits");
    std::fs::write(&big, format!("domain: d\n#{}\n", "x".repeat(padding))).expect("write");
    let crowded = dir.path().join("crowded");
    std::fs::create_dir(&crowded).expect("mkdir");
    for i in 0..=MAX_FILES {
        std::fs::write(
            crowded.join(format!("{i:04}.yaml")),
            format!("domain: d{i}\n"),
        )
        .expect("write");
    }
    let laughs = (1..8).fold(
        "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_owned(),
        |text, i| {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            format!("{text}a{i}: &a{i} [{refs}]\n")
        },
    );
    let deep = format!(
        "domain: d\ndescriptors: {}{}\n",
        "[".repeat(100),
        "]".repeat(100)
    );
    let documents = "---\ndomain: d\n".repeat(MAX_DOCUMENTS + 1);
    let rules = format!(
        "domain: d\ndescriptors: [{}]\n",
        (0..=MAX_RULES)
            .map(|i| format!("{{key: k{i}}}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let texts = [
        ("laughs.yaml", laughs),
        ("deep.yaml", deep),
        ("documents.yaml", documents),
        ("rules.yaml", rules),
    ];
    for (name, text) in texts {
        let file = dir.path().join(name);
        std::fs::write(&file, text).expect("write");
    }
    let latin1 = dir.path().join("latin1.yaml");
    std::fs::write(&latin1, b"domain: d\ndescriptors:\n  - key: caf\xe9\n").expect("write");
    let cases = [
        (
            latin1.clone(),
            "latin1.yaml:3:13: not UTF-8 text".to_owned(),
        ),
        (big.clone(), "larger than".to_owned()),
        (PathBuf::from("/dev/zero"), "not a regular file".to_owned()),
        (crowded.clone(), format!("more than {MAX_FILES}")),
        (
            dir.path().join("laughs.yaml"),
            "aliases count as copies".to_owned(),
        ),
        (dir.path().join("deep.yaml"), "nest deeper than".to_owned()),
        (
            dir.path().join("documents.yaml"),
            format!("more than {MAX_DOCUMENTS} YAML documents"),
        ),
        (
            dir.path().join("rules.yaml"),
            format!("more than {MAX_RULES} rules"),
        ),
    ];
    for (path, reason) in cases {
        let started = Instant::now();
        let loading = path.clone();
        let errors = within(
            Duration::from_secs(30),
            tokio::task::spawn_blocking(move || Rules::load(&loading)),
            "the loader to end",
        )
        .await
        .expect("the loader does not panic")
        .expect_err(&format!("{} must be refused", path.display()));
        assert!(
            errors.iter().any(|e| e.contains(&reason)),
            "{}: {reason:?} missing in {errors:#?}",
            path.display()
        );
        assert!(
            errors
                .iter()
                .all(|e| e.starts_with(&path.display().to_string())),
            "{errors:#?}"
        );
        assert!(errors.len() <= 51, "{} problems reported", errors.len());
        eprintln!("{}: refused in {:?}", path.display(), started.elapsed());
    }
}

/// Pieces that random rules texts are made of and mutations insert: YAML's indicators, flow and
/// block structure, anchors and aliases, tags, quotes, documents, odd characters, and the rules'
/// own settings.
const YAML_PIECES: &[&str] = &[
    "- ",
    ": ",
    ":",
    "[",
    "]",
    "{",
    "}",
    ", ",
    "\n",
    "  ",
    "    ",
    "\t",
    "'",
    "\"",
    "&a ",
    "*a",
    "&b ",
    "*b",
    "!!str ",
    "!t ",
    "|\n",
    ">-\n",
    "---\n",
    "...\n",
    "? ",
    "# c\n",
    "%YAML 1.2\n",
    "\\",
    "domain: d\n",
    "domain: ",
    "descriptors:\n",
    "descriptors: ",
    "key: k",
    "value: v*",
    "value: *",
    "rate_limit: {unit: second, requests_per_unit: 1}",
    "rate_limit:\n",
    "requests_per_unit: ",
    "unit: ",
    "period: 1s",
    "algorithm: gcra",
    "burst: ",
    "99999999999999999999999",
    "0",
    "~",
    "null",
    "true",
    "é",
    "\u{feff}",
    "\r\n",
    "\r",
    "@",
    "`",
    "*",
    "<<: *a",
    "\u{0}",
    "\u{85}",
    "replaces: [{name: x}]",
    "shadow_mode: true",
];

/// A text of random pieces, or a valid rules text changed by a few random edits.
fn rules_texts() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::{prelude::*, sample::Index};
    let seeds = vec![
        std::fs::read_to_string(rules_path()).expect("the test rules"),
        "domain: d\ndescriptors:\n  - key: k\n    value: a*b\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      - key: j\n        rate_limit: &r {unit: minute, requests_per_unit: 2, algorithm: gcra, burst: 3}\n      - key: i\n        rate_limit: *r\n".to_owned(),
        "domain: x\ndescriptors: [{key: a, value: '1'}, {key: b, rate_limit: {unlimited: true}}]\n---\ndomain: y\n".to_owned(),
    ];
    let edit = (0..4u8, any::<Index>(), any::<Index>(), any::<Index>());
    prop_oneof![
        prop::collection::vec(prop::sample::select(YAML_PIECES), 0..80).prop_map(|p| p.concat()),
        (
            prop::sample::select(seeds),
            prop::collection::vec(edit, 1..10)
        )
            .prop_map(|(seed, edits)| {
                let mut chars: Vec<char> = seed.chars().collect();
                for (kind, at, len, piece) in edits {
                    let at = at.index(chars.len() + 1);
                    let end = (at + len.index(16)).min(chars.len());
                    match kind {
                        0 => {
                            let piece = piece.get(YAML_PIECES);
                            chars.splice(at..at, piece.chars());
                        }
                        1 => {
                            chars.drain(at..end);
                        }
                        2 => {
                            let copy: Vec<char> = chars[at..end].to_vec();
                            chars.splice(at..at, copy);
                        }
                        _ => chars.truncate(at),
                    }
                }
                chars.into_iter().collect()
            }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: 2000,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5EED_0012),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })]

    /// Random and mutated rules texts always end the loader within a time bound, without a
    /// panic, either with rules or with problems whose first one names `FILE:LINE:COLUMN`.
    #[test]
    fn rules_loader_ends_on_any_text(text in rules_texts()) {
        let (done, answer) = std::sync::mpsc::channel();
        let input = text.clone();
        std::thread::spawn(move || {
            let _ = done.send(Rules::from_yaml("fuzz.yaml", &input).map(|r| r.domains().len()));
        });
        let result = answer
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("the loader did not answer ({e}) for {text:?}"));
        if let Err(problems) = result {
            let first = problems.first().unwrap_or_else(|| panic!("no problem given for {text:?}"));
            let place = first.strip_prefix("fuzz.yaml:").and_then(|rest| {
                let mut parts = rest.splitn(3, ':');
                let line: usize = parts.next()?.parse().ok()?;
                let column: usize = parts.next()?.parse().ok()?;
                (line >= 1 && column >= 1).then_some(())
            });
            proptest::prop_assert!(place.is_some(), "{first:?} for {text:?}");
        }
    }
}
