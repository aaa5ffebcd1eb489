//! Batched lease renewal: many keepalive streams, few Redis calls.
//!
//! Each keepalive stream asks for a renewal a little before it is due, saying by when it must be
//! sent at the latest. A [`Batcher`] collects the requests and sends them when the earliest of
//! those moments arrives, so every lease that entered its renewal window meanwhile rides along:
//! with 10,000 leases of 10 s, a few calls per second renew them all.
//!
//! Requests are grouped by Redis Cluster hash slot (a script may only touch one slot; on a single
//! Redis every request shares group 0) and cut into batches of at most [`MAX_BATCH`] leases, so
//! no call keeps Redis busy for long. The batches of one round are sent concurrently over the
//! multiplexed connections, which pipelines the calls bound for one node. A batch whose call
//! fails reports the error to each of its leases only; each stream then handles it as it would a
//! failed single renewal.

use std::{
    future::Future,
    pin::Pin,
    sync::{Arc, Weak},
    time::Duration,
};

use crate::error::Error;
use futures::future::join_all;
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};

/// Most leases renewed by one script call.
pub const MAX_BATCH: usize = 256;

/// The renewal of one lease: its remaining ttl, or `None` when it is no longer held.
pub type Renewal = Result<Option<Duration>, Error>;

/// Renews one batch of leases (all of one hash slot) in one script call, answering per lease in
/// order (a lease whose renewal failed inside the script fails alone).
pub type RenewMany<I> = Arc<
    dyn Fn(Vec<I>) -> Pin<Box<dyn Future<Output = Result<Vec<Renewal>, Error>> + Send>>
        + Send
        + Sync,
>;

struct Request<I> {
    item: I,
    slot: u16,
    by: Instant,
    reply: oneshot::Sender<Renewal>,
}

/// Collects renewal requests and sends them in batches. Cheap to clone.
pub struct Batcher<I> {
    tx: mpsc::UnboundedSender<Request<I>>,
}

impl<I> Clone for Batcher<I> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<I: Send + 'static> Batcher<I> {
    /// Starts the batching task, which renews through `renew_many` until the last clone of the
    /// batcher is dropped.
    pub fn start(renew_many: RenewMany<I>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(rx, renew_many));
        Self { tx }
    }

    /// Starts a batcher that renews through `renew` while `owner` lives (the service that owns
    /// the batcher, which holds it: a weak reference avoids a cycle); once `owner` is dropped,
    /// renewals fail with `ShuttingDown`.
    pub fn for_owner<T, F, Fut>(owner: &Weak<T>, renew: F) -> Self
    where
        T: Send + Sync + 'static,
        F: Fn(Arc<T>, Vec<I>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Renewal>, Error>> + Send + 'static,
    {
        let owner = owner.clone();
        Self::start(Arc::new(move |items| {
            let renewal = owner.upgrade().map(|owner| renew(owner, items));
            Box::pin(async move {
                match renewal {
                    Some(renewal) => renewal.await,
                    None => Err(Error::ShuttingDown),
                }
            })
        }))
    }

    /// Renews `item` (whose keys hash to `slot`) in a batch sent no later than `by`.
    pub async fn renew(&self, item: I, slot: u16, by: Instant) -> Renewal {
        let (reply, answer) = oneshot::channel();
        self.tx
            .send(Request {
                item,
                slot,
                by,
                reply,
            })
            .map_err(|_| Error::ShuttingDown)?;
        answer.await.map_err(|_| Error::ShuttingDown)?
    }
}

async fn run<I: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<Request<I>>,
    renew_many: RenewMany<I>,
) {
    let mut pending: Vec<Request<I>> = Vec::new();
    let mut earliest: Option<Instant> = None;
    loop {
        let fire_at = earliest.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            request = rx.recv() => {
                let Some(request) = request else { return };
                earliest = Some(earliest.map_or(request.by, |e| e.min(request.by)));
                pending.push(request);
                continue;
            }
            () = tokio::time::sleep_until(fire_at), if earliest.is_some() => {}
        }
        // Everything that asked so far goes now, whatever its own deadline.
        while let Ok(request) = rx.try_recv() {
            pending.push(request);
        }
        earliest = None;
        let round = std::mem::take(&mut pending);
        tokio::spawn(send_round(round, renew_many.clone()));
    }
}

/// Sends one round: a script call per slot and [`MAX_BATCH`] leases, all concurrently.
async fn send_round<I: Send + 'static>(mut round: Vec<Request<I>>, renew_many: RenewMany<I>) {
    round.sort_by_key(|r| r.slot);
    let mut batches: Vec<Vec<Request<I>>> = Vec::new();
    for request in round {
        match batches.last_mut() {
            Some(batch) if batch[0].slot == request.slot && batch.len() < MAX_BATCH => {
                batch.push(request);
            }
            _ => batches.push(vec![request]),
        }
    }
    join_all(batches.into_iter().map(|batch| {
        let renew_many = renew_many.clone();
        async move {
            let (items, replies): (Vec<I>, Vec<oneshot::Sender<Renewal>>) =
                batch.into_iter().map(|r| (r.item, r.reply)).unzip();
            let count = items.len();
            match renew_many(items).await {
                Ok(renewals) if renewals.len() == count => {
                    for (reply, renewal) in replies.into_iter().zip(renewals) {
                        let _ = reply.send(renewal);
                    }
                }
                Ok(renewals) => {
                    let e = Error::Internal(format!(
                        "a batch renewal answered {} leases out of {count}",
                        renewals.len()
                    ));
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        }
    }))
    .await;
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// The batches a test's `renew_many` was called with.
    type Calls = Arc<Mutex<Vec<Vec<(u16, u32)>>>>;

    /// Requests that arrive before the earliest deadline share one call; slots are never mixed;
    /// no batch exceeds the bound; every lease gets its own answer.
    #[tokio::test(start_paused = true)]
    async fn batches_by_deadline_and_slot() {
        let calls: Calls = Arc::default();
        let seen = calls.clone();
        let renew: RenewMany<(u16, u32)> = Arc::new(move |items: Vec<(u16, u32)>| {
            seen.lock().unwrap().push(items.clone());
            Box::pin(async move {
                Ok(items
                    .iter()
                    .map(|(_, n)| Ok((n % 7 != 0).then(|| Duration::from_millis(u64::from(*n)))))
                    .collect())
            })
        });
        let batcher = Batcher::start(renew);
        let start = Instant::now();
        let mut tasks = Vec::new();
        for n in 1..=600u32 {
            let slot = (n % 2) as u16;
            let by = start + Duration::from_millis(100 + u64::from(n % 50));
            let b = batcher.clone();
            tasks.push(tokio::spawn(async move {
                (n, b.renew((slot, n), slot, by).await)
            }));
        }
        for task in tasks {
            let (n, renewal) = task.await.unwrap();
            let expected = (n % 7 != 0).then(|| Duration::from_millis(u64::from(n)));
            assert_eq!(renewal.unwrap(), expected, "lease {n}");
        }
        // Sent at the earliest deadline (100 ms), not before.
        assert!(Instant::now() >= start + Duration::from_millis(100));
        let calls = calls.lock().unwrap();
        // 600 leases in 2 slots of 300: two batches of 256 and two of 44.
        assert_eq!(
            calls.len(),
            4,
            "{:?}",
            calls.iter().map(Vec::len).collect::<Vec<_>>()
        );
        for call in calls.iter() {
            assert!(call.len() <= MAX_BATCH);
            assert!(call.iter().all(|(slot, _)| *slot == call[0].0));
        }
    }

    /// A failed call reports the error to the leases of that batch only.
    #[tokio::test(start_paused = true)]
    async fn a_failed_batch_fails_its_leases_only() {
        let renew: RenewMany<u16> = Arc::new(|items: Vec<u16>| {
            Box::pin(async move {
                if items[0] == 1 {
                    Err(Error::Unavailable("node down".into()))
                } else {
                    Ok(vec![Ok(Some(Duration::from_secs(1))); items.len()])
                }
            })
        });
        let batcher = Batcher::start(renew);
        let by = Instant::now() + Duration::from_millis(10);
        let (a, b) = tokio::join!(batcher.renew(1, 1, by), batcher.renew(2, 2, by));
        assert!(matches!(a, Err(Error::Unavailable(_))));
        assert_eq!(b.unwrap(), Some(Duration::from_secs(1)));
    }
}
