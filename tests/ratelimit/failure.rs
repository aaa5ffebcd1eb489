//! Redis down or frozen: the failure mode answers within the timeout, and a check it answered
//! counts nothing later.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use baton::ratelimit::{Algorithm, Rate, RateLimiter};

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
        let got = peek_decided_by_redis(
            &mut client,
            request("stalled", 10, 60_000, algorithm, Some(0)),
        )
        .await;
        assert_eq!(
            got.remaining, 10,
            "{algorithm:?}: a check answered by the failure mode was counted"
        );
    }
}

/// A TCP relay to Redis that holds what goes each way for a delay set at run time (each chunk
/// from when it was read, in order): a slow way to Redis, or back.
struct SlowWay {
    port: u16,
    to_redis_ms: Arc<AtomicU64>,
    back_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// Copies `from` to `to`, each chunk held for the delay `delay_ms` said when it was read.
fn delayed_copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_ms: Arc<AtomicU64>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (chunks, mut to_send) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            let held = Duration::from_millis(delay_ms.load(Ordering::Relaxed));
            if chunks
                .send((Instant::now() + held, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    });
    tokio::spawn(async move {
        while let Some((at, chunk)) = to_send.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&chunk).await.is_err() {
                break;
            }
        }
    });
}

impl SlowWay {
    async fn start(redis_port: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let port = listener.local_addr().expect("relay address").port();
        let to_redis_ms = Arc::new(AtomicU64::new(0));
        let back_ms = Arc::new(AtomicU64::new(0));
        let (to_delay, back_delay) = (to_redis_ms.clone(), back_ms.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", redis_port)).await
                else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                delayed_copy(client_read, server_write, to_delay.clone());
                delayed_copy(server_read, client_write, back_delay.clone());
            }
        });
        Self {
            port,
            to_redis_ms,
            back_ms,
            task,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sets the delay of the way to Redis and of the way back.
    fn delays(&self, to_redis: Duration, back: Duration) {
        let ms = |d: Duration| u64::try_from(d.as_millis()).expect("a short delay");
        self.to_redis_ms.store(ms(to_redis), Ordering::Relaxed);
        self.back_ms.store(ms(back), Ordering::Relaxed);
    }
}

impl Drop for SlowWay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A check that reaches Redis after Baton stopped waiting for it counts nothing, even when every
/// answer that taught Baton Redis's clock came over a slow way there (the clock's bound is then
/// loose by that much, and was once taken in the wrong direction: such a check counted).
#[tokio::test]
async fn a_check_that_reaches_redis_too_late_over_a_slow_way_counts_nothing() {
    // One node, whatever the suite's topology: the way to it is the test's.
    let redis = RedisServer::start_standalone().await;
    let way = SlowWay::start(redis.port()).await;
    // Opening a connection takes a few round trips over the slow way: the timeout leaves room.
    let timeout = Duration::from_millis(600);
    let relayed = way.url();
    let baton = Baton::start_with(&redis, move |c| {
        c.redis.topology = baton::config::Topology::Standalone { url: relayed };
        c.ratelimit.timeout = timeout;
        c.ratelimit.failure_mode = FailureMode::Closed;
    })
    .await;
    let mut client = baton.ratelimit_client().await;
    // From now on every answer that tells Baton Redis's clock comes over a way 60 ms long.
    way.delays(Duration::from_millis(60), Duration::ZERO);
    for i in 0..3 {
        let got = check(
            &mut client,
            request(&format!("warm{i}"), 5, 3_600_000, FIXED, Some(0)),
        )
        .await;
        assert_eq!(got.decided_by(), pb::RateLimitDecidedBy::Redis, "{got:?}");
    }
    // Now the way takes longer than the timeout: Baton answers by the failure mode, and Redis
    // runs the check once it gets there, about 40 ms after Baton stopped waiting.
    way.delays(timeout + Duration::from_millis(40), Duration::ZERO);
    let got = check(&mut client, request("late", 5, 3_600_000, FIXED, Some(5))).await;
    assert_eq!(
        got.decided_by(),
        pb::RateLimitDecidedBy::FailClosed,
        "{got:?}"
    );
    way.delays(Duration::ZERO, Duration::ZERO);
    // Well after the late check reached Redis (it was sent before this delay went to zero).
    tokio::time::sleep(timeout * 3).await;
    let got = check(&mut client, request("late", 5, 3_600_000, FIXED, Some(0))).await;
    assert_eq!(got.decided_by(), pb::RateLimitDecidedBy::Redis, "{got:?}");
    assert_eq!(
        got.remaining, 5,
        "a check that reached Redis after Baton answered by the failure mode was counted"
    );
}

/// A check judged too late only because the answers that taught Baton Redis's clock were slow to
/// come back (the bound errs early by that much) is sent again with the bound its own answer
/// gives, within the same timeout, and counts once; it is not answered by the failure mode.
#[tokio::test]
async fn a_check_judged_late_by_a_loose_clock_is_sent_again_and_counts_once() {
    // One node, whatever the suite's topology: the way to it is the test's.
    let redis = RedisServer::start_standalone().await;
    let way = SlowWay::start(redis.port()).await;
    let timeout = Duration::from_secs(3);
    let mut config = redis.redis_config();
    config.topology = baton::config::Topology::Standalone { url: way.url() };
    config.command_timeout = timeout;
    // One connection, opened below while the way is quick.
    config.pool_size = 1;
    let handle = baton::redis::Redis::new(&config).expect("a Redis handle");
    // Opens the connection over the way while it is quick; no clock is learnt from a PING. The
    // scripts are loaded beforehand, so that each call below is one round trip.
    handle.ping().await.expect("PING");
    let mut direct = redis.conn().await;
    for script in [
        baton::ratelimit::scripts::CLOCK,
        baton::ratelimit::scripts::FIXED_WINDOW,
    ] {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query_async(&mut direct)
            .await
            .expect("SCRIPT LOAD");
    }
    // A connection idle for a while is checked with a PING before it carries a call, a round
    // trip more over the slow way: PINGs every 100 ms keep it in use.
    let pings = tokio::spawn({
        let handle = handle.clone();
        async move {
            loop {
                let handle = handle.clone();
                tokio::spawn(async move { handle.ping().await });
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    let limiter = RateLimiter::new(handle, FailureMode::Closed);
    let key = format!("{}{{rl:loose}}:fixed", config.key_prefix);
    let rate =
        Rate::new(Algorithm::FixedWindow, 5, Duration::from_secs(3600), None).expect("a rate");
    // Every answer so far comes back 2 s late: Baton's bound on Redis's clock errs 2 s early.
    way.delays(Duration::ZERO, Duration::from_secs(2));
    let first = limiter.try_check(&key, &rate, 0).await.expect("a peek");
    assert_eq!(first.remaining, 5);
    // Now the way back is quick and the way there takes 1.2 s: by the loose bound the check
    // arrives too late (1 s of the 3 s timeout left by it); its answer shows it was in time.
    way.delays(Duration::from_millis(1200), Duration::ZERO);
    // What comes back keeps its order: the answers read before the change go first.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let started = Instant::now();
    let got = limiter.try_check(&key, &rate, 2).await;
    let took = started.elapsed();
    let got = got.expect("decided by Redis on the second sending");
    assert!(got.allowed, "{got:?}");
    assert_eq!(got.remaining, 3, "{got:?}");
    assert!(took < timeout, "answered after {took:?}");
    way.delays(Duration::ZERO, Duration::ZERO);
    let after = limiter.try_check(&key, &rate, 0).await.expect("a peek");
    assert_eq!(after.remaining, 3, "counted once");
    pings.abort();
}
