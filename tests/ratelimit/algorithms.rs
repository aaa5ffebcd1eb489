//! `baton.v1.RateLimitService`: each algorithm against its model and at window ends, concurrent
//! callers, what a check reports, keys, and invalid arguments.

use super::*;

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
    let got =
        peek_decided_by_redis(&mut client, request("first", 10, 60_000, SLIDING, Some(0))).await;
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
