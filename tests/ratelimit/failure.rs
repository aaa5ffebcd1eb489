//! Redis down or frozen: the failure mode answers within the timeout, and a check it answered
//! counts nothing later.

use super::*;

// ---------------------------------------------------------------------------------------------
// Redis down: the failure mode
// ---------------------------------------------------------------------------------------------

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
