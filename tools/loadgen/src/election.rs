//! Leader failover through Baton: the time from a leader closing its `Campaign` stream to the
//! next candidate reading `elected`, beside the same handoff for a fair lock held through `Hold`
//! streams, on the same Redis and the same Baton.
//!
//! [`Options::candidates`] clients, each on its own HTTP/2 connection, join one election (or
//! wait for one fair lock); whoever is elected notes the time, closes its stream at once and
//! joins again at the end of the queue, so all but one always wait. A handoff is the time from
//! the close (noted just before the stream is dropped) to the next `elected` (or `acquired`)
//! read by the next client, on this process's monotonic clock: it includes the stream's
//! cancellation reaching Baton, the resignation script, the pub/sub wake-up, the next
//! candidate's script and the event's way back.

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
use testkit::{ms, within};
use tokio::{task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::{
    Options, Scenario, Stage, names,
    probe::Probe,
    record::Record,
    stats::{self, histogram, micros},
};

/// What the clients contend for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contest {
    /// One election, through `ElectionService/Campaign`.
    Election,
    /// One fair lock, through `LockService/Hold`.
    FairLock,
}

impl Contest {
    /// The side's name in the records.
    pub fn name(self) -> &'static str {
        match self {
            Contest::Election => "campaign",
            Contest::FairLock => "fair-lock-hold",
        }
    }
}

/// What the clients of one contest share.
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

/// Measures both contests on `stage`, appending one record each.
pub async fn run(options: &Options, stage: &Stage, records: &mut Vec<Record>) {
    let mut probe = Probe::new(stage.redis.client().await, Some(stage.baton.pid()));
    for contest in [Contest::Election, Contest::FairLock] {
        let mark = probe.mark().await;
        let h = measure(
            contest,
            stage.baton.addr(),
            options.candidates.max(2),
            options.handoffs,
        )
        .await;
        let mut record = Record {
            scenario: Scenario::LeaderFailover.name().to_owned(),
            clients: options.candidates.max(2),
            side: contest.name().to_owned(),
            ..Record::default()
        };
        probe.usage(mark, &mut record).await;
        record.set(names::OPS, h.len() as f64);
        stats::latency(&mut record, &h);
        eprintln!(
            "leader-failover {:<14} {} handoffs: p50 {} us, p99 {} us, max {} us",
            contest.name(),
            h.len(),
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.max()
        );
        records.push(record);
    }
}

/// Joins the election (or waits for the lock) and returns its stream once elected (acquired).
async fn join(
    contest: Contest,
    channel: &Channel,
    name: &str,
) -> Result<Box<dyn Send>, tonic::Status> {
    match contest {
        Contest::Election => {
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
        Contest::FairLock => {
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
async fn client(contest: Contest, channel: Channel, name: String, shared: Arc<Shared>) {
    loop {
        let stream = tokio::select! {
            () = shared.done.cancelled() => return,
            joined = join(contest, &channel, &name) => joined,
        };
        let stream = stream.unwrap_or_else(|s| panic!("{contest:?}: {s:?}"));
        let elected_at = Instant::now();
        let closed_at = shared
            .closed_at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(closed_at) = closed_at {
            shared
                .samples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .saturating_record(micros(elected_at - closed_at));
            if shared.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                shared.done.cancel();
            }
        }
        *shared.closed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        drop(stream);
    }
}

/// Runs `contest` with `candidates` clients of the Baton at `addr` until `handoffs` are
/// measured; returns the handoffs in microseconds.
pub async fn measure(
    contest: Contest,
    addr: SocketAddr,
    candidates: usize,
    handoffs: usize,
) -> Histogram<u64> {
    let shared = Arc::new(Shared {
        closed_at: Mutex::new(None),
        samples: Mutex::new(histogram()),
        left: AtomicUsize::new(handoffs),
        done: CancellationToken::new(),
    });
    let name = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let mut clients = JoinSet::new();
    for _ in 0..candidates {
        let channel = testkit::channel(addr).await;
        clients.spawn(client(contest, channel, name.clone(), shared.clone()));
    }
    let limit = Duration::from_secs(60) + Duration::from_millis(20) * handoffs as u32;
    within(limit, shared.done.cancelled(), "every handoff").await;
    while let Some(joined) = clients.join_next().await {
        joined.expect("a client task");
    }
    let samples = shared.samples.lock().unwrap_or_else(|e| e.into_inner());
    samples.clone()
}
