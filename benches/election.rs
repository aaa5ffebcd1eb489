//! Leader failover through Baton: the time from a leader closing its `Campaign` stream to the next
//! candidate reading `elected`, next to the same handoff for a fair lock held through `Hold`
//! streams (the lock handoff figure), on the same Redis and the same Baton.
//!
//! Starts a private `redis-server` (no persistence) and the real `baton` binary as a separate
//! process. In each scenario `--candidates` clients (each on its own HTTP/2 connection) join one
//! election (or one fair lock); whoever is elected notes the time, closes its stream at once and
//! joins again at the end of the queue, so `--candidates - 1` always wait. A handoff is the time
//! from the close (noted just before the stream is dropped) to the next `elected` (or `acquired`)
//! read by the next client, both on this process's monotonic clock: it includes the client's
//! stream cancellation reaching Baton, the resignation script, the pub/sub wake-up, the next
//! candidate's script, and the event's way back.
//!
//! ```sh
//! cargo bench --bench election                                   # 2000 handoffs per scenario
//! cargo bench --bench election -- --handoffs 5000 --candidates 16
//! ```
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it is a smoke run of 50 handoffs per
//! scenario that asserts each scenario hands over every time, within a second.

use testkit as support;

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use baton::proto::v1::{
    self as pb, election_service_campaign_response::Event as CampaignEvent,
    election_service_client::ElectionServiceClient, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event as HoldEvent,
};
use hdrhistogram::Histogram;
use support::{BatonProcess, RedisServer, ms, within};
use tokio::{task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// What the clients contend for.
#[derive(Debug, Clone, Copy)]
enum Scenario {
    /// One election, through `ElectionService/Campaign`.
    Election,
    /// One fair lock, through `LockService/Hold`.
    FairLock,
}

/// What the clients of one scenario share.
struct Shared {
    /// When the current leader (holder) closed its stream; taken by the next one.
    closed_at: Mutex<Option<Instant>>,
    /// Handoffs, in microseconds.
    samples: Mutex<Histogram<u64>>,
    /// Handoffs still to measure.
    left: AtomicUsize,
    /// Cancelled once every handoff is measured.
    done: CancellationToken,
}

/// Joins the election (or waits for the lock) and returns its stream once elected (acquired).
async fn join(
    scenario: Scenario,
    channel: &Channel,
    name: &str,
) -> Result<Box<dyn Send>, tonic::Status> {
    match scenario {
        Scenario::Election => {
            let mut stream = ElectionServiceClient::new(channel.clone())
                .campaign(pb::ElectionServiceCampaignRequest {
                    name: name.to_owned(),
                    value: b"bench".to_vec(),
                    ttl: Some(ms(10_000)),
                })
                .await?
                .into_inner();
            match stream.message().await? {
                Some(pb::ElectionServiceCampaignResponse {
                    event: Some(CampaignEvent::Elected(_)),
                }) => Ok(Box::new(stream)),
                other => Err(tonic::Status::internal(format!(
                    "expected elected, got {other:?}"
                ))),
            }
        }
        Scenario::FairLock => {
            let mut stream = LockServiceClient::new(channel.clone())
                .hold(pb::LockServiceHoldRequest {
                    name: name.to_owned(),
                    ttl: Some(ms(10_000)),
                    wait_timeout: Some(ms(3_600_000)),
                    fair: true,
                    ..Default::default()
                })
                .await?
                .into_inner();
            match stream.message().await? {
                Some(pb::LockServiceHoldResponse {
                    event: Some(HoldEvent::Acquired(_)),
                }) => Ok(Box::new(stream)),
                other => Err(tonic::Status::internal(format!(
                    "expected acquired, got {other:?}"
                ))),
            }
        }
    }
}

/// One client: joins, notes the handoff that made it leader, resigns at once, joins again.
async fn client(scenario: Scenario, channel: Channel, name: String, shared: Arc<Shared>) {
    loop {
        let stream = tokio::select! {
            () = shared.done.cancelled() => return,
            joined = join(scenario, &channel, &name) => joined,
        };
        let stream = stream.unwrap_or_else(|s| panic!("{scenario:?}: {s:?}"));
        let elected_at = Instant::now();
        let closed_at = shared
            .closed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(closed_at) = closed_at {
            let micros = u64::try_from((elected_at - closed_at).as_micros()).unwrap_or(u64::MAX);
            shared
                .samples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(micros.max(1))
                .expect("a handoff within the histogram's bounds");
            if shared.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                shared.done.cancel();
            }
        }
        *shared.closed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        drop(stream);
    }
}

/// Runs `scenario` with `candidates` clients of Baton at `addr` until `handoffs` are measured.
async fn run(
    scenario: Scenario,
    addr: SocketAddr,
    candidates: usize,
    handoffs: usize,
) -> Histogram<u64> {
    let shared = Arc::new(Shared {
        closed_at: Mutex::new(None),
        samples: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 3).expect("bounds")),
        left: AtomicUsize::new(handoffs),
        done: CancellationToken::new(),
    });
    let name = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let mut clients = JoinSet::new();
    for _ in 0..candidates {
        let channel = support::channel(addr).await;
        clients.spawn(client(scenario, channel, name.clone(), shared.clone()));
    }
    let limit = Duration::from_secs(60) + Duration::from_millis(20) * handoffs as u32;
    within(limit, shared.done.cancelled(), "every handoff").await;
    while let Some(joined) = clients.join_next().await {
        joined.expect("a client task");
    }
    let samples = shared.samples.lock().unwrap_or_else(|e| e.into_inner());
    samples.clone()
}

/// `--name value` from the command line, or `default`.
fn flag(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number, not {v:?}"))
        })
        .unwrap_or(default)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let handoffs = if full { flag("--handoffs", 2_000) } else { 50 };
    let candidates = flag("--candidates", 8).max(2);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let redis = RedisServer::start_standalone().await;
        let mut args = redis.baton_args();
        args.extend(["--log".to_owned(), "warn".to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let baton = BatonProcess::spawn(&args).await;
        println!("election bench: {}", support::machine());
        for scenario in [Scenario::Election, Scenario::FairLock] {
            let started = Instant::now();
            let h = run(scenario, baton.addr(), candidates, handoffs).await;
            let what = match scenario {
                Scenario::Election => "Campaign close -> next elected",
                Scenario::FairLock => "fair lock Hold close -> next acquired",
            };
            println!(
                "{what}: {} handoffs, {candidates} clients, {:.1} s: p50 {} µs, p99 {} µs, \
                 max {} µs, mean {:.0} µs",
                h.len(),
                started.elapsed().as_secs_f64(),
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.max(),
                h.mean()
            );
            assert_eq!(h.len(), handoffs as u64, "{what}: every handoff measured");
            if !full {
                assert!(h.max() < 1_000_000, "{what}: a handoff took {} µs", h.max());
            }
        }
    });
}
