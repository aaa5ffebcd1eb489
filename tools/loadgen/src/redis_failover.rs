//! Failover times of the local Redis deployments the tests use: from SIGKILL of the master to a
//! failover a Sentinel client sees, for three Sentinel timings, and from SIGKILL of a Cluster
//! master with a replica to a healthy cluster. They bound how fast Baton can follow a failover
//! (the failover tests measure Baton itself).

use std::time::{Duration, Instant};

use testkit::topology::{CLUSTER_NODE_TIMEOUT, RedisCluster, SentinelDeployment, SentinelTimings};

use crate::{Options, Scenario, names, record::Record};

/// Time from killing the master of a fresh Sentinel deployment to a failover clients can see.
pub async fn sentinel_failover(timings: SentinelTimings) -> Duration {
    let mut sentinels = SentinelDeployment::start_with(timings).await;
    let killed_at = Instant::now();
    sentinels.kill_master();
    sentinels.wait_for_failover(Duration::from_secs(30)).await;
    killed_at.elapsed()
}

/// Time from killing a master (with a replica) of a fresh 3-master cluster to a healthy cluster.
pub async fn cluster_failover() -> Duration {
    let mut cluster = RedisCluster::start(3, 1).await;
    let master = cluster.masters().await.remove(0);
    let killed_at = Instant::now();
    cluster.kill(master.port);
    cluster.wait_healthy(Duration::from_secs(30)).await;
    killed_at.elapsed()
}

/// A record of one failover.
fn sample(case: String, side: &str, n: usize, took: Duration) -> Record {
    let mut record = Record {
        scenario: Scenario::RedisFailover.name().to_owned(),
        case,
        side: side.to_owned(),
        ..Record::default()
    };
    record.set(names::TOOK, took.as_secs_f64());
    record.set("sample", n as f64);
    record
}

/// Measures [`Options::failovers`] Sentinel failovers per timing and up to 3 Cluster failovers
/// (the smoke run: one Sentinel failover with the default timings).
pub async fn run(options: &Options, records: &mut Vec<Record>) {
    let timings = if options.smoke {
        vec![SentinelTimings::default()]
    } else {
        vec![
            SentinelTimings {
                down_after: Duration::from_millis(500),
                failover_timeout: Duration::from_millis(2000),
            },
            SentinelTimings::default(),
            SentinelTimings {
                down_after: Duration::from_millis(2000),
                failover_timeout: Duration::from_millis(5000),
            },
        ]
    };
    for timing in timings {
        let case = format!(
            "down-after {} ms, failover timeout {} ms",
            timing.down_after.as_millis(),
            timing.failover_timeout.as_millis()
        );
        for n in 0..options.failovers.max(1) {
            let took = sentinel_failover(timing).await;
            eprintln!("redis-failover sentinel {case}: {took:?}");
            records.push(sample(case.clone(), "sentinel", n, took));
        }
    }
    if options.smoke {
        return;
    }
    let case = format!("node timeout {} ms", CLUSTER_NODE_TIMEOUT.as_millis());
    for n in 0..options.failovers.clamp(1, 3) {
        let took = cluster_failover().await;
        eprintln!("redis-failover cluster {case}: {took:?}");
        records.push(sample(case.clone(), "cluster", n, took));
    }
}
