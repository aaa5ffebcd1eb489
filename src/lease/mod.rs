//! Keepalive streams shared by every leased primitive (lock holds and semaphore permits).
//!
//! [`keep_alive`] renews a [`Renewable`] lease about every third of its ttl and reports each
//! renewal. It tracks, by this process's monotonic clock, the earliest moment the lease could
//! expire in Redis: a renewal confirmed by a reply to a call sent at `t` keeps the lease until at
//! least `t + remaining`. When no renewal has been confirmed by that moment minus a safety margin,
//! it reports the lease lost *before* it can have expired. When the client goes away it releases
//! at once; on shutdown it releases and says so.

pub mod batch;

use std::{future::Future, pin::Pin, time::Duration};

use tokio::{sync::mpsc, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{error::Error, proto::v1 as pb};

/// Events buffered per stream before `renewed` events are dropped for a caller that does not read.
pub const STREAM_BUFFER: usize = 16;

/// Longest name of a leased resource (a lock, a semaphore), in bytes.
pub const MAX_NAME_BYTES: usize = 1024;
/// Longest owner, in bytes.
pub const MAX_OWNER_BYTES: usize = 256;
/// Shortest lease ttl.
pub const MIN_TTL: Duration = Duration::from_millis(10);
/// Shortest lease ttl for `Hold` and `KeepAlive`, which renew about every third of it.
pub const MIN_KEEPALIVE_TTL: Duration = Duration::from_millis(100);
/// Longest lease ttl.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// Shortest non-zero wait (any positive duration rounds up to it).
pub const MIN_WAIT: Duration = Duration::from_millis(1);
/// Longest wait.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);
/// How long the last fencing token is kept after the lease it was issued for ends. Tokens stay
/// increasing without it (they are floored at the Redis clock); it only serves `Describe`.
pub const FENCE_RETENTION: Duration = Duration::from_secs(3600);

/// Resolves when the caller has gone away or Baton shuts down, with the matching error; handed to
/// acquisitions so they stop waiting.
pub type Stop = Pin<Box<dyn Future<Output = Error> + Send>>;

/// One buffered stream item. Boxed so that a stream's channel costs a few hundred bytes while idle:
/// tokio allocates channel slots 32 at a time, and an unboxed `Result<_, Status>` is ~200 bytes.
type Item<T> = Box<Result<T, tonic::Status>>;
/// The sending half of a lease stream.
type Tx<T> = mpsc::Sender<Item<T>>;

/// The receiving half of a lease stream, returned to tonic as the response stream.
pub struct Events<T> {
    rx: mpsc::Receiver<Item<T>>,
}

impl<T> futures::Stream for Events<T> {
    type Item = Result<T, tonic::Status>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx).map(|item| item.map(|boxed| *boxed))
    }
}

fn events<T>() -> (Tx<T>, Events<T>) {
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    (tx, Events { rx })
}

/// The outcome of the acquisition that opens a `Hold` stream.
pub enum Grant<T, L> {
    /// Granted: `first` is the `acquired` event; `lease` is then kept alive.
    Granted {
        /// The first event of the stream.
        first: T,
        /// The lease to keep alive.
        lease: L,
        /// The lease's nominal ttl (sets the renewal pace).
        ttl: Duration,
        /// The earliest moment the lease can expire, by this process's clock.
        valid_until: Instant,
    },
    /// Not granted within the wait: `event` is the only event of the stream.
    Refused(T),
}

fn stop(gone: impl Future<Output = ()> + Send + 'static, shutdown: CancellationToken) -> Stop {
    Box::pin(async move {
        tokio::select! {
            () = gone => Error::Cancelled,
            () = shutdown.cancelled() => Error::ShuttingDown,
        }
    })
}

/// Runs a unary acquisition so that a grant racing the caller's cancellation (a dropped request,
/// a deadline) is handed to `orphan` to release instead of leaking until its ttl. `acquire` gets
/// a [`Stop`] that resolves when the caller leaves or Baton shuts down.
///
/// The acquisition runs in the caller's task, boxed: a caller that leaves mid-call drops this
/// future, which moves the unfinished acquisition into a task of its own, signals its `Stop`, and
/// lets it finish (a script call in flight is seen through) before handing a grant to `orphan`.
/// Calls that complete pay no task of their own.
pub async fn detached<T, A, AF, R, RF>(
    shutdown: &CancellationToken,
    acquire: A,
    orphan: R,
) -> Result<T, Error>
where
    T: Send + 'static,
    A: FnOnce(Stop) -> AF,
    AF: Future<Output = Result<T, Error>> + Send + 'static,
    R: FnOnce(T) -> RF + Send + 'static,
    RF: Future<Output = ()> + Send + 'static,
{
    let gone = CancellationToken::new();
    let stop = stop(gone.clone().cancelled_owned(), shutdown.clone());
    let mut unfinished = Unfinished {
        work: Some(Box::pin(acquire(stop))),
        orphan: Some(orphan),
        gone,
    };
    let result = std::future::poll_fn(|cx| match unfinished.work.as_mut() {
        Some(work) => work.as_mut().poll(cx),
        None => std::task::Poll::Ready(Err(Error::Internal(
            "the acquisition was polled after it ended".into(),
        ))),
    })
    .await;
    unfinished.work = None;
    result
}

/// An acquisition, boxed so that it can move to a task of its own.
type Work<T> = Pin<Box<dyn Future<Output = Result<T, Error>> + Send>>;

/// An acquisition still running in a caller's task; dropped before it ends (the caller left), it
/// finishes in a task of its own and hands a grant to its orphan handler.
struct Unfinished<T: Send + 'static, R: Orphan<T>> {
    work: Option<Work<T>>,
    orphan: Option<R>,
    gone: CancellationToken,
}

/// What to do with a grant whose caller left: release it.
trait Orphan<T>: Send + 'static {
    /// Finishes `work` in a task of its own and hands what it grants to this handler.
    fn finish(self, work: Work<T>);
}

impl<T, R, RF> Orphan<T> for R
where
    T: Send + 'static,
    R: FnOnce(T) -> RF + Send + 'static,
    RF: Future<Output = ()> + Send + 'static,
{
    fn finish(self, work: Work<T>) {
        // Without a runtime (the process is ending) the acquisition is dropped: a grant it may
        // have made ends at its ttl.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Ok(value) = work.await {
                    self(value).await;
                }
            });
        }
    }
}

impl<T: Send + 'static, R: Orphan<T>> Drop for Unfinished<T, R> {
    fn drop(&mut self) {
        if let (Some(work), Some(orphan)) = (self.work.take(), self.orphan.take()) {
            self.gone.cancel();
            orphan.finish(work);
        }
    }
}

/// Opens a `Hold` stream: runs `acquire` in its own task, sends its first event, then keeps the
/// lease alive until the caller leaves, the lease is lost, or shutdown. A grant that finds the
/// caller gone is released at once; an error before the first event ends the stream with it.
pub fn hold<T, L, A, AF>(
    shutdown: &CancellationToken,
    wrap: fn(Event) -> T,
    acquire: A,
) -> Events<T>
where
    T: Send + 'static,
    L: Renewable,
    A: FnOnce(Stop) -> AF + Send + 'static,
    AF: Future<Output = Result<Grant<T, L>, Error>> + Send,
{
    let (tx, rx) = events();
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let closed = tx.clone();
        let stop = stop(async move { closed.closed().await }, shutdown.clone());
        // Boxed so that the acquisition's state (its wait, its subscription) is freed once it
        // ends instead of staying part of this task for the life of the lease.
        let acquired = Box::pin(acquire(stop)).await;
        match acquired {
            Ok(Grant::Granted {
                first,
                lease,
                ttl,
                valid_until,
            }) => {
                if tx.send(Box::new(Ok(first))).await.is_err() {
                    return release_for_departure(&lease).await;
                }
                keep_alive(lease, ttl, valid_until, tx, wrap, shutdown).await;
            }
            Ok(Grant::Refused(event)) => {
                let _ = tx.send(Box::new(Ok(event))).await;
            }
            Err(Error::Cancelled) => {}
            Err(e) => {
                let _ = tx.send(Box::new(Err(e.into()))).await;
            }
        }
    });
    rx
}

/// Opens a `KeepAlive` stream: `first_renewal` renews the lease once (sent now); when it is not
/// held the call fails with `FAILED_PRECONDITION` and no stream opens. Otherwise the first event
/// reports that renewal and the lease is then kept alive, renewed with `ttl` (or, when `None`,
/// with the ttl the first renewal set).
pub async fn open_keep_alive<T, L>(
    shutdown: &CancellationToken,
    wrap: fn(Event) -> T,
    lease: L,
    ttl: Option<Duration>,
    first_renewal: impl Future<Output = Result<Option<Duration>, Error>>,
) -> Result<Events<T>, Error>
where
    T: Send + 'static,
    L: Renewable,
{
    if shutdown.is_cancelled() {
        return Err(Error::ShuttingDown);
    }
    let sent = Instant::now();
    let remaining = first_renewal.await?.ok_or_else(|| {
        Error::FailedPrecondition("the lease is not held: it expired or was released".into())
    })?;
    let (tx, rx) = events();
    // The channel is new and empty, so the first event always fits.
    let _ = tx.try_send(Box::new(Ok(wrap(Event::Renewed(remaining)))));
    tokio::spawn(keep_alive(
        lease,
        ttl.unwrap_or(remaining),
        sent + remaining,
        tx,
        wrap,
        shutdown.clone(),
    ));
    Ok(rx)
}

/// Largest safety margin kept between the loss report and the earliest possible expiry.
pub const MAX_LOSS_MARGIN: Duration = Duration::from_secs(2);
/// Smallest safety margin.
pub const MIN_LOSS_MARGIN: Duration = Duration::from_millis(5);
/// How long a final event may wait for room in a slow client's stream.
const FINAL_EVENT_TIMEOUT: Duration = Duration::from_secs(1);

/// A lease that a keepalive stream can renew and release.
pub trait Renewable: Send + Sync + 'static {
    /// Renews the lease, sending the renewal no later than `by` (it may wait until then to share
    /// a call with other leases: see [`batch`]). `Ok(Some(remaining))` when still held,
    /// `Ok(None)` when it is not.
    fn renew(&self, by: Instant) -> impl Future<Output = Result<Option<Duration>, Error>> + Send;
    /// Releases the lease. `Ok(true)` when it was still held.
    fn release(&self) -> impl Future<Output = Result<bool, Error>> + Send;
}

/// Why a kept-alive lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// Redis no longer has the lease.
    NotHeld,
    /// No renewal could be confirmed before the safety margin ahead of expiry.
    Unconfirmed,
    /// Baton is shutting down; the lease was released.
    Shutdown,
}

/// What a keepalive stream reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A renewal confirmed by Redis, with the remaining ttl.
    Renewed(Duration),
    /// The lease ended; nothing follows.
    Lost(LostReason, String),
}

/// The proto form of an [`Event`], for the stream messages that carry one.
#[derive(Debug, Clone, PartialEq)]
pub enum EventMessage {
    /// A `LeaseRenewed` message.
    Renewed(pb::LeaseRenewed),
    /// A `LeaseLost` message.
    Lost(pb::LeaseLost),
}

impl From<Event> for EventMessage {
    fn from(event: Event) -> Self {
        match event {
            Event::Renewed(remaining) => Self::Renewed(pb::LeaseRenewed {
                remaining_ttl: Some(crate::wire::duration(remaining)),
            }),
            Event::Lost(reason, message) => {
                let reason = match reason {
                    LostReason::NotHeld => pb::LeaseLostReason::NotHeld,
                    LostReason::Unconfirmed => pb::LeaseLostReason::Unconfirmed,
                    LostReason::Shutdown => pb::LeaseLostReason::Shutdown,
                };
                Self::Lost(pb::LeaseLost {
                    reason: reason.into(),
                    message,
                })
            }
        }
    }
}

/// The safety margin for a lease of `ttl`: a tenth of it, within [`MIN_LOSS_MARGIN`] and
/// [`MAX_LOSS_MARGIN`].
pub fn loss_margin(ttl: Duration) -> Duration {
    (ttl / 10).clamp(MIN_LOSS_MARGIN, MAX_LOSS_MARGIN)
}

/// Delay before retrying a renewal that failed, so a brief Redis hiccup costs few calls.
fn retry_delay(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(500))
}

/// Keeps `lease` alive until it is lost, the client goes away (`tx` closes) or `shutdown`.
///
/// `valid_until` is the earliest moment the lease can expire as of its acquisition or last
/// renewal; `ttl` is the lease's nominal ttl, which sets the renewal pace and the safety margin.
/// A renewal is requested a quarter of the remaining ttl after the last one and must be sent by a
/// third of it, so renewals of many leases can share a call. Each event is mapped to the stream's
/// message type by `wrap`.
pub async fn keep_alive<L, T>(
    lease: L,
    ttl: Duration,
    mut valid_until: Instant,
    tx: Tx<T>,
    wrap: fn(Event) -> T,
    shutdown: CancellationToken,
) where
    L: Renewable,
    T: Send + 'static,
{
    let margin = loss_margin(ttl);
    let start = Instant::now();
    let mut next = start + ttl / 4;
    let mut by = start + ttl / 3;
    loop {
        let Some(loss_at) = valid_until.checked_sub(margin) else {
            return lost_unconfirmed(&lease, &tx, wrap).await;
        };
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return release_for_shutdown(&lease, &tx, wrap).await,
            () = tx.closed() => return release_for_departure(&lease).await,
            () = tokio::time::sleep_until(next.min(loss_at)) => {}
        }
        if Instant::now() >= loss_at {
            return lost_unconfirmed(&lease, &tx, wrap).await;
        }

        let sent = Instant::now();
        let outcome = tokio::select! {
            biased;
            () = shutdown.cancelled() => return release_for_shutdown(&lease, &tx, wrap).await,
            () = tx.closed() => return release_for_departure(&lease).await,
            r = tokio::time::timeout_at(loss_at, lease.renew(by.max(sent))) => r,
        };
        match outcome {
            Ok(Ok(Some(remaining))) => {
                valid_until = sent + remaining;
                next = sent + remaining / 4;
                by = sent + remaining / 3;
                // A client that does not read its stream misses renewal events rather than
                // holding renewals up; the lease itself is still renewed.
                if let Err(mpsc::error::TrySendError::Closed(_)) =
                    tx.try_send(Box::new(Ok(wrap(Event::Renewed(remaining)))))
                {
                    return release_for_departure(&lease).await;
                }
            }
            Ok(Ok(None)) => {
                tracing::info!("lease no longer held in Redis");
                send_final(
                    &tx,
                    wrap(Event::Lost(
                        LostReason::NotHeld,
                        "the lease is no longer held in Redis (expired or released elsewhere)"
                            .into(),
                    )),
                )
                .await;
                return;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "lease renewal failed; retrying");
                next = Instant::now() + retry_delay(ttl);
                by = next;
            }
            Err(_) => return lost_unconfirmed(&lease, &tx, wrap).await,
        }
    }
}

async fn lost_unconfirmed<L: Renewable, T>(lease: &L, tx: &Tx<T>, wrap: fn(Event) -> T) {
    tracing::warn!("lease renewal not confirmed before the safety margin; reporting it lost");
    send_final(
        tx,
        wrap(Event::Lost(
            LostReason::Unconfirmed,
            "renewal could not be confirmed by Redis before the lease could expire".into(),
        )),
    )
    .await;
    // Free the lock for others if Redis is reachable again; harmless if the lease is gone.
    if let Err(e) = lease.release().await {
        tracing::debug!(error = %e, "release after an unconfirmed renewal failed");
    }
}

async fn release_for_departure<L: Renewable>(lease: &L) {
    match lease.release().await {
        Ok(was_held) => tracing::debug!(was_held, "client left; lease released"),
        Err(e) => {
            tracing::warn!(error = %e, "client left but the release failed; the lease will expire at its ttl")
        }
    }
}

async fn release_for_shutdown<L: Renewable, T>(lease: &L, tx: &Tx<T>, wrap: fn(Event) -> T) {
    let message = match lease.release().await {
        Ok(_) => "baton is shutting down; the lease was released".to_owned(),
        Err(e) => format!(
            "baton is shutting down; the release failed ({e}) so the lease expires at its ttl"
        ),
    };
    send_final(tx, wrap(Event::Lost(LostReason::Shutdown, message))).await;
}

async fn send_final<T>(tx: &Tx<T>, event: T) {
    let _ = tokio::time::timeout(FINAL_EVENT_TIMEOUT, tx.send(Box::new(Ok(event)))).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The margin is a tenth of the ttl, clamped.
    #[test]
    fn margin_is_clamped() {
        assert_eq!(loss_margin(Duration::from_millis(10)), MIN_LOSS_MARGIN);
        assert_eq!(
            loss_margin(Duration::from_secs(1)),
            Duration::from_millis(100)
        );
        assert_eq!(loss_margin(Duration::from_secs(3600)), MAX_LOSS_MARGIN);
    }
}
