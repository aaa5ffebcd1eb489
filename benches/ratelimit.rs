//! Rate limit decisions per second through Baton's `Check` RPC, against the same GCRA script
//! called directly on the same Redis (EVALSHA over redis-rs multiplexed connections), in one run;
//! and, for scale, the gRPC health check of the same Baton, which touches no Redis.
//!
//! `cargo bench --bench ratelimit` runs the full benchmark (10 s per side by default; set
//! `BATON_BENCH_SECONDS`, `BATON_BENCH_CONCURRENCY` and `BATON_BENCH_POOL_SIZE` — Baton's Redis
//! pool size, and as many direct connections; default 4 as in Baton — to change it). Without `--bench` (as
//! `cargo test --all-targets` runs it) it is a short smoke run that checks both sides decide.
//! Everything runs on this machine: a private `redis-server`, an in-process Baton, and the load
//! generator, which shares the CPU with both.

use testkit as support;

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use baton::proto::v1::{self as pb, rate_limit_service_client::RateLimitServiceClient};
use hdrhistogram::Histogram;
use support::{Baton, RedisServer, ms};
use tokio::task::JoinSet;
use tonic::transport::Channel;

/// HTTP/2 connections from the load generator to Baton.
const CHANNELS: usize = 4;
/// Keys the load is spread over.
const KEYS: usize = 1000;
/// A limit no key reaches, so every decision runs the whole script and writes.
const LIMIT: u64 = 1_000_000_000;

struct Side {
    decisions: u64,
    elapsed: Duration,
    latency: Histogram<u64>,
}

impl Side {
    fn rate(&self) -> f64 {
        self.decisions as f64 / self.elapsed.as_secs_f64()
    }

    fn quantile_us(&self, q: f64) -> u64 {
        self.latency.value_at_quantile(q)
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// Runs `concurrency` loops of `one` for `duration`, after a warm-up of a fifth of it.
async fn drive<F, Fut>(concurrency: usize, duration: Duration, one: F) -> Side
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let one = Arc::new(one);
    let warm_until = Instant::now() + duration / 5;
    let mut tasks = JoinSet::new();
    for worker in 0..concurrency {
        let one = Arc::clone(&one);
        tasks.spawn(async move {
            let mut n = 0u64;
            while Instant::now() < warm_until {
                one(worker, n).await;
                n += 1;
            }
            (n, worker)
        });
    }
    let mut counters = vec![0u64; concurrency];
    while let Some(joined) = tasks.join_next().await {
        let (n, worker) = joined.expect("warm-up task");
        counters[worker] = n;
    }

    let start = Instant::now();
    let until = start + duration;
    let mut tasks = JoinSet::new();
    for (worker, first) in counters.into_iter().enumerate() {
        let one = Arc::clone(&one);
        tasks.spawn(async move {
            let mut latency = histogram();
            let mut n = first;
            let mut done = 0u64;
            while Instant::now() < until {
                let t = Instant::now();
                one(worker, n).await;
                latency
                    .record(
                        u64::try_from(t.elapsed().as_micros())
                            .unwrap_or(u64::MAX)
                            .max(1),
                    )
                    .expect("latency in range");
                n += 1;
                done += 1;
            }
            (done, latency, worker)
        });
    }
    let mut side = Side {
        decisions: 0,
        elapsed: Duration::ZERO,
        latency: histogram(),
    };
    while let Some(joined) = tasks.join_next().await {
        let (done, latency, _) = joined.expect("load task");
        side.decisions += done;
        side.latency.add(latency).expect("histograms add");
    }
    side.elapsed = start.elapsed();
    side
}

fn key(worker: usize, n: u64) -> String {
    format!(
        "bench:{}",
        (worker * 7919 + usize::try_from(n).unwrap_or(0)) % KEYS
    )
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let env_number = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (duration, concurrency) = if full {
        (
            Duration::from_secs(env_number("BATON_BENCH_SECONDS", 10)),
            usize::try_from(env_number("BATON_BENCH_CONCURRENCY", 64)).unwrap_or(64),
        )
    } else {
        (Duration::from_millis(300), 8)
    };
    let pool = usize::try_from(env_number(
        "BATON_BENCH_POOL_SIZE",
        u64::from(baton::config::DEFAULT_REDIS_POOL_SIZE),
    ))
    .unwrap_or(4)
    .max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(full, duration, concurrency, pool));
}

async fn run(full: bool, duration: Duration, concurrency: usize, pool: usize) {
    let redis = RedisServer::start().await;
    // A generous rate limit timeout: a decision that falls back to the failure mode would not be
    // a decision by Redis, and the run checks there are none.
    let baton = Baton::start_with(&redis, |c| {
        c.ratelimit.timeout = Duration::from_secs(2);
        c.redis.pool_size = u32::try_from(pool).unwrap_or(4);
    })
    .await;
    println!(
        "rate limit benchmark: GCRA Check, {concurrency} concurrent callers, {:?} per side, {KEYS} keys, {pool} Redis connections per side",
        duration
    );
    println!("machine: {}", support::machine());

    // Direct: the same script on the same Redis, over as many multiplexed connections as Baton's
    // pool, with the same arguments Baton sends.
    let mut conns = Vec::new();
    for _ in 0..pool {
        conns.push(redis.client().await);
    }
    let script = Arc::new(redis::Script::new(include_str!(
        "../src/ratelimit/gcra.lua"
    )));
    let prefix = format!("{}direct:", baton.prefix());
    let direct = drive(concurrency, duration, move |worker, n| {
        let mut conn = conns[worker % pool].clone();
        let script = Arc::clone(&script);
        let key = baton::ratelimit::limiter_key(
            &prefix,
            "rl",
            &key(worker, n),
            baton::ratelimit::Algorithm::Gcra,
        );
        async move {
            let reply: Vec<i64> = script
                .key(key)
                .arg(1_000_000u64)
                .arg(LIMIT)
                .arg(LIMIT)
                .arg(1u64)
                .invoke_async(&mut conn)
                .await
                .expect("direct EVALSHA");
            assert_eq!(reply[0], 1, "allowed");
        }
    })
    .await;

    // Through Baton: gRPC Check over a few HTTP/2 connections.
    let mut clients: Vec<RateLimitServiceClient<Channel>> = Vec::new();
    for _ in 0..CHANNELS {
        clients.push(baton.ratelimit_client().await);
    }
    let through = drive(concurrency, duration, move |worker, n| {
        let mut client = clients[worker % CHANNELS].clone();
        let request = pb::RateLimitServiceCheckRequest {
            key: key(worker, n),
            limit: LIMIT,
            period: Some(ms(1000)),
            cost: None,
            algorithm: pb::RateLimitAlgorithm::Gcra.into(),
            burst: 0,
        };
        async move {
            let got = client
                .check(request)
                .await
                .expect("Check through Baton")
                .into_inner();
            assert!(got.allowed, "allowed");
            assert_eq!(
                got.decided_by(),
                pb::RateLimitDecidedBy::Redis,
                "decided by Redis, not the failure mode"
            );
        }
    })
    .await;

    // The floor of any gRPC call on this machine: the health check, which touches no Redis.
    let mut health = Vec::new();
    for _ in 0..CHANNELS {
        health.push(baton.health().await);
    }
    let grpc_floor = drive(concurrency, duration, move |worker, _| {
        let mut client = health[worker % CHANNELS].clone();
        async move {
            client
                .check(tonic_health::pb::HealthCheckRequest {
                    service: "readiness".to_owned(),
                })
                .await
                .expect("health check");
        }
    })
    .await;

    println!(
        "{:<30} {:>10} {:>9} {:>9} {:>9}",
        "side", "calls/s", "p50 us", "p99 us", "p99.9 us"
    );
    for (name, side) in [
        ("redis EVALSHA (direct)", &direct),
        ("baton Check (gRPC)", &through),
        ("gRPC health check (no Redis)", &grpc_floor),
    ] {
        println!(
            "{:<30} {:>10.0} {:>9} {:>9} {:>9}",
            name,
            side.rate(),
            side.quantile_us(0.5),
            side.quantile_us(0.99),
            side.quantile_us(0.999)
        );
    }
    println!(
        "baton / direct throughput ratio: {:.2}",
        through.rate() / direct.rate()
    );
    println!(
        "baton Check / gRPC health check throughput ratio: {:.2}",
        through.rate() / grpc_floor.rate()
    );
    assert!(direct.decisions > 0 && through.decisions > 0);
    if !full {
        println!("(smoke run; `cargo bench --bench ratelimit` runs the full benchmark)");
    }
}
