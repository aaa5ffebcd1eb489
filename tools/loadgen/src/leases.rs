//! Thousands of leases held with keepalive: Baton's `LockService/Hold` streams against a client
//! library's own renewals, counting Redis calls per second, CPU and Baton's memory.
//!
//! Baton: one `Hold` stream per lease (distinct names, no wait), spread over [`LEASE_CHANNELS`]
//! HTTP/2 connections; Baton renews each lease between a quarter and a third of the ttl after
//! its previous renewal, in batches. Direct: the load generator acquires the same leases with
//! `acquire.lua` and renews each with its own `refresh.lua` call a third of the remaining ttl
//! after the previous renewal was sent (one task per lease), as a client library without Baton
//! would (the pace of Redisson's watchdog). The window lasts one ttl once every lease is held.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use baton::{
    lock::{self, Mode, scripts::LockKeys},
    proto::v1::{self as pb, lock_service_client::LockServiceClient},
};
use redis::{Value, aio::MultiplexedConnection};
use testkit::{lock_key, ms, within};
use tokio::{
    task::JoinSet,
    time::{Instant, sleep, sleep_until},
};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::{
    BATON_PREFIX, DIRECT_PREFIX, Options, Scenario, Side, Stage, names,
    primitives::{Scripts, bounded, lease_ms, millis, token},
    probe::Probe,
    record::Record,
};

/// `Hold` streams (or direct acquisitions) opening at the same time while the leases are set up.
const LEASE_OPENING: usize = 256;
/// HTTP/2 connections the `Hold` streams are spread over: 10,000 leases over 16 make 625
/// streams each, within Baton's default `--max-concurrent-streams` of 1,024 per connection.
pub const LEASE_CHANNELS: usize = 16;

/// Measures the lease scenario on every side of `options`, appending one record per side.
pub async fn run(options: &Options, stage: &Stage, records: &mut Vec<Record>) {
    let mut probe = Probe::new(stage.redis.client().await, Some(stage.baton.pid()));
    let scripts = Arc::new(Scripts::new(&stage.redis.baton_redis()));
    let mut conns = Vec::with_capacity(options.pool);
    for _ in 0..options.pool {
        conns.push(stage.redis.client().await);
    }
    for side in options.sides_of(Scenario::Leases) {
        let mut record = match side {
            Side::Baton(t) => {
                let channels = stage.channels(t, LEASE_CHANNELS).await;
                through_baton(options, &mut probe, channels).await
            }
            _ => direct(options, &mut probe, &conns, &scripts).await,
        };
        record.side = side.name().to_owned();
        let secs = record.get(names::SECS).unwrap_or(1.0).max(1e-9);
        eprintln!(
            "leases {:<14} {} held, script calls {:.0}/s, Baton CPU {:.1} %, RSS {:.1} MiB",
            side.name(),
            record.get(names::HELD).unwrap_or(0.0),
            record.script_calls() as f64 / secs,
            100.0 * record.get(names::BATON_CPU).unwrap_or(0.0) / secs,
            record.get(names::BATON_RSS).unwrap_or(0.0) / 1_048_576.0
        );
        records.push(record);
    }
}

/// How many of the lock states `lease-0..n` still exist under `prefix`.
async fn existing_locks(conn: &mut MultiplexedConnection, prefix: &str, n: usize) -> u64 {
    let mut left = 0;
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut cmd = redis::cmd("EXISTS");
        for i in chunk {
            cmd.arg(lock_key(prefix, &format!("lease-{i}")));
        }
        left += cmd.query_async::<u64>(conn).await.expect("EXISTS");
    }
    left
}

/// What one side's window measured, before the leases are let go.
struct Window {
    record: Record,
    failures: Vec<String>,
}

/// The part both sides share: waits until all `n` leases are held (`ready` once each), counts
/// renewals and CPU over one ttl, then stops the side's tasks and collects their failures.
async fn window(
    options: &Options,
    probe: &mut Probe,
    (started, ready, n): (Instant, &mut tokio::sync::mpsc::Receiver<()>, usize),
    (tasks, stop): (&mut JoinSet<Result<(), String>>, &CancellationToken),
    counters: (&AtomicU64, &AtomicU64),
) -> Window {
    for _ in 0..n {
        within(
            Duration::from_secs(120),
            ready.recv(),
            "every lease to be held",
        )
        .await;
    }
    let open_secs = started.elapsed().as_secs_f64();
    let (acquired, renewals) = counters;
    let mark = probe.mark().await;
    let before = renewals.load(Ordering::Relaxed);
    sleep(options.lease_ttl).await;
    let received = renewals.load(Ordering::Relaxed) - before;
    let mut record = Record {
        scenario: Scenario::Leases.name().to_owned(),
        clients: n,
        ..Record::default()
    };
    probe.usage(mark, &mut record).await;
    record.set(names::HELD, acquired.load(Ordering::Relaxed) as f64);
    record.set(names::OPEN_SECS, open_secs);
    record.set(names::RENEWALS, received as f64);
    stop.cancel();
    let mut failures = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined.expect("a lease task") {
            failures.push(e);
        }
    }
    if let Some(e) = failures.first() {
        eprintln!("{} lease tasks failed, the first: {e}", failures.len());
        record.first_error = Some(e.clone());
    }
    Window { record, failures }
}

/// Holds the leases through `Hold` streams, measures a window of renewals, then drops the
/// streams and checks Baton released them all.
async fn through_baton(options: &Options, probe: &mut Probe, channels: Vec<Channel>) -> Record {
    let n = options.leases;
    let stop = CancellationToken::new();
    let acquired = Arc::new(AtomicU64::new(0));
    let renewals = Arc::new(AtomicU64::new(0));
    let opening = Arc::new(tokio::sync::Semaphore::new(LEASE_OPENING));
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(n);
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let mut client = LockServiceClient::new(channels[i % channels.len()].clone());
        let (stop, acquired, renewals, opening, ready) = (
            stop.clone(),
            Arc::clone(&acquired),
            Arc::clone(&renewals),
            Arc::clone(&opening),
            ready_tx.clone(),
        );
        let ttl = options.lease_ttl;
        tasks.spawn(async move {
            let permit = opening.acquire_owned().await.expect("open semaphore");
            let hold = client.hold(pb::LockServiceHoldRequest {
                name: format!("lease-{i}"),
                ttl: Some(ms(millis(ttl))),
                wait_timeout: None,
                ..Default::default()
            });
            let mut stream = match bounded("Hold", hold).await {
                Ok(s) => s.into_inner(),
                Err(e) => {
                    let _ = ready.send(()).await;
                    return Err(e);
                }
            };
            use pb::lock_service_hold_response::Event;
            let first = stream.message().await;
            drop(permit);
            let _ = ready.send(()).await;
            match first {
                Ok(Some(pb::LockServiceHoldResponse {
                    event: Some(Event::Acquired(_)),
                })) => acquired.fetch_add(1, Ordering::Relaxed),
                other => return Err(format!("the Hold stream's first message: {other:?}")),
            };
            loop {
                tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    m = stream.message() => match m {
                        Ok(Some(pb::LockServiceHoldResponse { event: Some(Event::Renewed(_)) })) => {
                            renewals.fetch_add(1, Ordering::Relaxed);
                        }
                        other => return Err(format!("the Hold stream ended: {other:?}")),
                    }
                }
            }
        });
    }
    drop(ready_tx);
    let Window { mut record, .. } = window(
        options,
        probe,
        (started, &mut ready_rx, n),
        (&mut tasks, &stop),
        (&acquired, &renewals),
    )
    .await;
    // Baton releases a lease as soon as its stream goes away.
    let released = tokio::time::timeout(Duration::from_secs(60), async {
        while existing_locks(&mut probe.admin, BATON_PREFIX, n).await > 0 {
            sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .is_ok();
    record.set(names::RELEASED, if released { 1.0 } else { 0.0 });
    record
}

/// The same leases kept by the load generator itself, as a client library without Baton would:
/// acquire with `acquire.lua`, refresh each with `refresh.lua` a third of the remaining ttl after
/// the previous renewal was sent, release at the end.
async fn direct(
    options: &Options,
    probe: &mut Probe,
    conns: &[MultiplexedConnection],
    scripts: &Arc<Scripts>,
) -> Record {
    let n = options.leases;
    let stop = CancellationToken::new();
    let acquired = Arc::new(AtomicU64::new(0));
    let renewals = Arc::new(AtomicU64::new(0));
    let opening = Arc::new(tokio::sync::Semaphore::new(LEASE_OPENING));
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(n);
    let started = Instant::now();
    let ttl = options.lease_ttl;
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let mut conn = conns[i % conns.len()].clone();
        let scripts = Arc::clone(scripts);
        let (stop, acquired, renewals, opening, ready) = (
            stop.clone(),
            Arc::clone(&acquired),
            Arc::clone(&renewals),
            Arc::clone(&opening),
            ready_tx.clone(),
        );
        tasks.spawn(async move {
            let keys = LockKeys::new(DIRECT_PREFIX, &format!("lease-{i}"));
            let token = token();
            let permit = opening.acquire_owned().await.expect("open semaphore");
            let invocation = lock::scripts::Acquire {
                owner: "",
                token: &token,
                ttl,
                waiter: "",
                wait_left: Duration::ZERO,
                fair: false,
                mode: Mode::Exclusive,
                idempotency_key: "",
            }
            .invocation(&scripts.lock_acquire, &keys);
            let sent = Instant::now();
            let reply: Result<Vec<Value>, String> =
                bounded("acquire.lua", invocation.invoke_async(&mut conn)).await;
            drop(permit);
            let granted = matches!(reply.as_deref(), Ok([Value::Int(1), ..]));
            if granted {
                acquired.fetch_add(1, Ordering::Relaxed);
            }
            let _ = ready.send(()).await;
            if !granted {
                return Err(format!("not granted: {reply:?}"));
            }
            let mut next = sent + ttl / 3;
            loop {
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = sleep_until(next) => {}
                }
                let sent = Instant::now();
                let invocation = lock::scripts::Refresh {
                    token: &token,
                    ttl: Some(ttl),
                    min: Duration::ZERO,
                }
                .invocation(&scripts.lock_refresh, &keys);
                let remaining: i64 =
                    bounded("refresh.lua", invocation.invoke_async(&mut conn)).await?;
                let remaining = lease_ms(remaining).ok_or("the lease was lost")?;
                renewals.fetch_add(1, Ordering::Relaxed);
                next = sent + remaining / 3;
            }
            let invocation = lock::scripts::Release {
                token: &token,
                clean_up: None,
            }
            .invocation(&scripts.lock_release, &keys);
            bounded(
                "release.lua",
                invocation.invoke_async::<Vec<i64>>(&mut conn),
            )
            .await
            .map(drop)
        });
    }
    drop(ready_tx);
    let Window {
        mut record,
        failures,
    } = window(
        options,
        probe,
        (started, &mut ready_rx, n),
        (&mut tasks, &stop),
        (&acquired, &renewals),
    )
    .await;
    let released =
        failures.is_empty() && existing_locks(&mut probe.admin, DIRECT_PREFIX, n).await == 0;
    record.set(names::RELEASED, if released { 1.0 } else { 0.0 });
    record
}
