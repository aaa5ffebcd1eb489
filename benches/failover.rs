//! Failover times of the local Redis deployments the tests use: from SIGKILL of the master to a
//! failover a Sentinel client sees (5 fresh deployments per Sentinel timing), and to a healthy
//! cluster after a master with a replica is killed (3 fresh clusters). These bound how fast
//! Baton can follow a failover (tests/failover.rs measures Baton itself).
//!
//! `cargo bench --bench failover` runs the measurement (about 90 s). Without `--bench` (as
//! `cargo test --all-targets` runs it) it measures one Sentinel failover with the default timings
//! and checks it completes within 8 s.

use testkit as support;

use std::time::{Duration, Instant};

use support::topology::{CLUSTER_NODE_TIMEOUT, RedisCluster, SentinelDeployment, SentinelTimings};

/// The median of `samples`.
fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Time from killing the master of a fresh Sentinel deployment to a failover clients can see.
async fn sentinel_failover(timings: SentinelTimings) -> Duration {
    let mut sentinels = SentinelDeployment::start_with(timings).await;
    let killed_at = Instant::now();
    sentinels.kill_master();
    sentinels.wait_for_failover(Duration::from_secs(30)).await;
    killed_at.elapsed()
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if !std::env::args().any(|a| a == "--bench") {
        let took = runtime.block_on(sentinel_failover(SentinelTimings::default()));
        println!("failover smoke: Sentinel failover in {took:?}");
        assert!(took < Duration::from_secs(8), "failover took {took:?}");
        return;
    }
    runtime.block_on(async {
        for timings in [
            SentinelTimings {
                down_after: Duration::from_millis(500),
                failover_timeout: Duration::from_millis(2000),
            },
            SentinelTimings::default(),
            SentinelTimings {
                down_after: Duration::from_millis(2000),
                failover_timeout: Duration::from_millis(5000),
            },
        ] {
            let mut samples = Vec::new();
            for _ in 0..5 {
                samples.push(sentinel_failover(timings).await);
            }
            println!(
                "sentinel {timings:?}: failover median {:?} of {samples:?}",
                median(samples.clone())
            );
        }
        let mut samples = Vec::new();
        for _ in 0..3 {
            let mut cluster = RedisCluster::start(3, 1).await;
            let master = cluster.masters().await.remove(0);
            let killed_at = Instant::now();
            cluster.kill(master.port);
            cluster.wait_healthy(Duration::from_secs(30)).await;
            samples.push(killed_at.elapsed());
        }
        println!(
            "cluster (node timeout {CLUSTER_NODE_TIMEOUT:?}): failover median {:?} of {samples:?}",
            median(samples.clone())
        );
    });
}
