//! Keepalive streams shared by every leased primitive (lock holds and semaphore permits).
//!
//! [`keep_alive`] renews a [`Renewable`] lease about every third of its ttl and reports each
//! renewal. It tracks, by this process's monotonic clock, the earliest moment the lease could
//! expire in Redis: a renewal confirmed by a reply to a call sent at `t` keeps the lease until at
//! least `t + remaining`. When no renewal has been confirmed by that moment minus a safety margin,
//! it reports the lease lost *before* it can have expired. When the client goes away, or stops
//! answering for longer than the lease's ttl, it releases at once; on shutdown it releases and
//! says so. A release that fails is tried again until the lease would have expired anyway
//! ([`release_until`]).

pub mod batch;
pub mod stream;

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime},
};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{error::Error, proto::v1 as pb};
use stream::Sender;

pub use stream::Events;

/// Longest name of a leased resource (a lock, a semaphore), in bytes.
pub const MAX_NAME_BYTES: usize = 1024;
/// Longest owner, in bytes.
pub const MAX_OWNER_BYTES: usize = 256;
/// Longest idempotency key, in bytes.
pub const MAX_IDEMPOTENCY_KEY_BYTES: usize = 128;
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
    client: ClientWatch,
    wrap: fn(Event) -> T,
    acquire: A,
) -> Events<T>
where
    T: Send + 'static,
    L: Renewable,
    A: FnOnce(Stop) -> AF + Send + 'static,
    AF: Future<Output = Result<Grant<T, L>, Error>> + Send,
{
    let (tx, rx) = stream::channel();
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let stop = stop(tx.gone().cancelled_owned(), shutdown.clone());
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
                // The hold was granted for at most its ttl from now.
                let latest = Instant::now() + ttl;
                if tx.is_closed() {
                    return release_for_departure(&lease, latest).await;
                }
                tx.first(Ok(first));
                Kept {
                    lease,
                    ttl,
                    valid_until,
                    latest,
                    tx,
                    wrap,
                    shutdown,
                    client,
                }
                .run()
                .await;
            }
            Ok(Grant::Refused(event)) => tx.first(Ok(event)),
            Err(Error::Cancelled) => {}
            Err(e) => tx.first(Err(e.into())),
        }
    });
    rx
}

/// Opens a `KeepAlive` stream: `first_renewal` renews the lease once (sent now); when it is not
/// held the call fails with `FAILED_PRECONDITION` and no stream opens. Otherwise the first event
/// reports that renewal and the lease is then kept alive, renewed with `ttl` (or, when `None`,
/// with the ttl the first renewal set: the lease's own).
pub async fn open_keep_alive<T, L>(
    shutdown: &CancellationToken,
    client: ClientWatch,
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
    let ttl = ttl.unwrap_or(remaining);
    let valid_until = sent + remaining;
    let (tx, rx) = stream::channel();
    tx.renewal(wrap(Event::Renewed {
        remaining,
        expires_at: expires_at(valid_until, ttl),
    }));
    tokio::spawn(
        Kept {
            lease,
            ttl,
            valid_until,
            latest: Instant::now() + remaining,
            tx,
            wrap,
            shutdown: shutdown.clone(),
            client,
        }
        .run(),
    );
    Ok(rx)
}

/// Largest safety margin kept between the loss report and the earliest possible expiry.
pub const MAX_LOSS_MARGIN: Duration = Duration::from_secs(2);
/// Smallest safety margin.
pub const MIN_LOSS_MARGIN: Duration = Duration::from_millis(5);
/// First pause before a failed release (or other clean-up call) is tried again; it doubles up to
/// [`RETRY_MAX`].
pub const RETRY_MIN: Duration = Duration::from_millis(20);
/// Longest pause between two tries of a failed clean-up call.
pub const RETRY_MAX: Duration = Duration::from_secs(1);
/// How long a stream ended by shutdown keeps trying to release its lease before it says it could
/// not (the drain must not wait for a Redis that is down).
const SHUTDOWN_RELEASE_WINDOW: Duration = Duration::from_secs(2);

/// A lease that a keepalive stream can renew and release.
pub trait Renewable: Send + Sync + 'static {
    /// Renews the lease, sending the renewal no later than `by` (it may wait until then to share
    /// a call with other leases: see [`batch`]). `Ok(Some(remaining))` when still held,
    /// `Ok(None)` when it is not.
    fn renew(&self, by: Instant) -> impl Future<Output = Result<Option<Duration>, Error>> + Send;
    /// Releases the lease once. `Ok(true)` when it was still held.
    fn release(&self) -> impl Future<Output = Result<bool, Error>> + Send;
    /// The resource and owner the lease is of, for log lines.
    fn describe(&self) -> String;
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
    /// The client stopped answering (or reading) for longer than the lease's ttl; the lease is no
    /// longer renewed and is released once the expiry last reported to the client has passed.
    ClientUnresponsive,
}

/// What a keepalive stream reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A renewal confirmed by Redis.
    Renewed {
        /// The remaining ttl the renewal set.
        remaining: Duration,
        /// Until when, by this machine's clock, the lease is certainly held (less the safety
        /// margin).
        expires_at: SystemTime,
    },
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
            Event::Renewed {
                remaining,
                expires_at,
            } => Self::Renewed(pb::LeaseRenewed {
                remaining_ttl: Some(crate::wire::duration(remaining)),
                expires_at: Some(expires_at.into()),
            }),
            Event::Lost(reason, message) => {
                let reason = match reason {
                    LostReason::NotHeld => pb::LeaseLostReason::NotHeld,
                    LostReason::Unconfirmed => pb::LeaseLostReason::Unconfirmed,
                    LostReason::Shutdown => pb::LeaseLostReason::Shutdown,
                    LostReason::ClientUnresponsive => pb::LeaseLostReason::ClientUnresponsive,
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

/// `at` on this machine's wall clock.
pub fn wall_clock(at: Instant) -> SystemTime {
    let (now, wall) = (Instant::now(), SystemTime::now());
    if at >= now {
        wall + (at - now)
    } else {
        wall - (now - at)
    }
}

/// The absolute expiry reported for a lease of `ttl` that is held at least until `valid_until`
/// (by this process's monotonic clock): that moment less the safety margin, on the wall clock.
pub fn expires_at(valid_until: Instant, ttl: Duration) -> SystemTime {
    wall_clock(
        valid_until
            .checked_sub(loss_margin(ttl))
            .unwrap_or(valid_until),
    )
}

/// Delay before retrying a renewal that failed, so a brief Redis hiccup costs few calls.
fn retry_delay(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(500))
}

/// Runs `attempt` until it succeeds or fails with anything but [`Error::Unavailable`], pausing
/// between tries ([`RETRY_MIN`] doubling to [`RETRY_MAX`]); gives up with the last error when the
/// next try would start after `deadline` (the moment the outcome stops mattering, such as the
/// expiry of the lease being released).
pub async fn retry_until<T, F, Fut>(deadline: Instant, mut attempt: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut pause = RETRY_MIN;
    loop {
        match attempt().await {
            Err(e @ Error::Unavailable(_)) => {
                let next = Instant::now() + pause;
                if next >= deadline {
                    return Err(e);
                }
                tokio::time::sleep_until(next).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
            done => return done,
        }
    }
}

/// Runs a clean-up call (a release, a waiter's removal) in a task of its own, retried as
/// [`retry_until`] does until `deadline`; logs the outcome with `what`.
pub fn clean_up<T, F, Fut>(what: String, deadline: Instant, attempt: F)
where
    T: Send + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, Error>> + Send,
{
    tokio::spawn(async move {
        if let Err(e) = retry_until(deadline, attempt).await {
            tracing::warn!(error = %e, "{what} failed until it no longer mattered; Redis ends it at its expiry");
        }
    });
}

/// Releases `lease`, retried until `latest` (the latest moment it can expire by itself).
pub async fn release_until<L: Renewable>(lease: &L, latest: Instant) -> Result<bool, Error> {
    retry_until(latest, || lease.release()).await
}

/// What a keepalive stream knows of its client's liveness.
#[derive(Debug, Clone, Default)]
pub struct ClientWatch {
    liveness: Option<Liveness>,
    ping_interval: Option<Duration>,
}

impl ClientWatch {
    /// A client whose connection reports what it receives to `liveness`, pinged by the server
    /// after `ping_interval` of silence (`None`: no pings, so silence proves nothing).
    pub fn new(liveness: Option<Liveness>, ping_interval: Option<Duration>) -> Self {
        Self {
            liveness,
            ping_interval,
        }
    }

    /// How long the client of a lease of `ttl` may stay silent before the lease is given up: the
    /// ttl, but at least two ping intervals so a live idle client always has time to answer.
    pub fn silence_limit(&self, ttl: Duration) -> Duration {
        self.ping_interval.map_or(ttl, |p| ttl.max(2 * p))
    }

    /// How long the client has been silent, when that is longer than [`silence_limit`].
    ///
    /// [`silence_limit`]: Self::silence_limit
    fn unresponsive(&self, ttl: Duration) -> Option<Duration> {
        self.ping_interval?;
        let silent = self.liveness.as_ref()?.silent_for();
        (silent > self.silence_limit(ttl)).then_some(silent)
    }
}

/// When a client connection last sent Baton anything (a request, a ping's answer), shared by the
/// streams it carries. Cheap to clone; updated on every read from the connection.
#[derive(Debug, Clone)]
pub struct Liveness(Arc<AtomicU64>);

/// The origin of [`Liveness`] timestamps.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn millis_since_epoch() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Default for Liveness {
    fn default() -> Self {
        Self::new()
    }
}

impl Liveness {
    /// A connection heard from now.
    pub fn new() -> Self {
        Self(Arc::new(AtomicU64::new(millis_since_epoch())))
    }

    /// The connection received something now.
    pub fn heard(&self) {
        self.0.store(millis_since_epoch(), Ordering::Relaxed);
    }

    /// How long since the connection last received anything.
    pub fn silent_for(&self) -> Duration {
        let last = self.0.load(Ordering::Relaxed);
        Duration::from_millis(millis_since_epoch().saturating_sub(last))
    }
}

/// A lease kept alive by a stream.
struct Kept<L, T> {
    lease: L,
    /// The nominal ttl: the renewal pace and the safety margin.
    ttl: Duration,
    /// The earliest moment the lease can expire, as of its acquisition or last renewal.
    valid_until: Instant,
    /// The latest moment it can expire by itself (how long a release is worth trying).
    latest: Instant,
    tx: Sender<T>,
    wrap: fn(Event) -> T,
    shutdown: CancellationToken,
    client: ClientWatch,
}

impl<L: Renewable, T: Send + 'static> Kept<L, T> {
    /// Keeps the lease alive until it is lost, the client goes away or stops answering, or
    /// shutdown. A renewal is requested a quarter of the remaining ttl after the last one and must
    /// be sent by a third of it, so renewals of many leases can share a call.
    async fn run(mut self) {
        let margin = loss_margin(self.ttl);
        let start = Instant::now();
        let mut next = start + self.ttl / 4;
        let mut by = start + self.ttl / 3;
        loop {
            let Some(loss_at) = self.valid_until.checked_sub(margin) else {
                return self.lost_unconfirmed().await;
            };
            tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return self.release_for_shutdown().await,
                () = self.tx.closed() => return release_for_departure(&self.lease, self.latest).await,
                () = tokio::time::sleep_until(next.min(loss_at)) => {}
            }
            if Instant::now() >= loss_at {
                return self.lost_unconfirmed().await;
            }
            if let Some(silent) = self.client.unresponsive(self.ttl) {
                return self.client_unresponsive(silent).await;
            }

            let sent = Instant::now();
            let outcome = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return self.release_for_shutdown().await,
                () = self.tx.closed() => return release_for_departure(&self.lease, self.latest).await,
                r = tokio::time::timeout_at(loss_at, self.lease.renew(by.max(sent))) => r,
            };
            match outcome {
                Ok(Ok(Some(remaining))) => {
                    self.valid_until = sent + remaining;
                    self.latest = Instant::now() + remaining;
                    next = sent + remaining / 4;
                    by = sent + remaining / 3;
                    let event = (self.wrap)(Event::Renewed {
                        remaining,
                        expires_at: expires_at(self.valid_until, self.ttl),
                    });
                    // A renewal the client has not read for longer than it may stay silent means
                    // it stopped reading: give the lease up rather than renew it for nobody.
                    if let Some(unread) = self.tx.renewal(event)
                        && unread > self.client.silence_limit(self.ttl)
                    {
                        return self.client_unresponsive(unread).await;
                    }
                }
                Ok(Ok(None)) => {
                    tracing::info!(lease = %self.lease.describe(), "lease no longer held in Redis");
                    self.finish(
                        LostReason::NotHeld,
                        "the lease is no longer held in Redis (expired or released elsewhere)",
                    );
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(lease = %self.lease.describe(), error = %e, "lease renewal failed; retrying");
                    next = Instant::now() + retry_delay(self.ttl);
                    by = next;
                }
                Err(_) => return self.lost_unconfirmed().await,
            }
        }
    }

    fn finish(&self, reason: LostReason, message: impl Into<String>) {
        self.tx
            .finish(Ok((self.wrap)(Event::Lost(reason, message.into()))));
    }

    async fn lost_unconfirmed(self) {
        self.finish(
            LostReason::Unconfirmed,
            "renewal could not be confirmed by Redis before the lease could expire",
        );
        tracing::warn!(lease = %self.lease.describe(), "lease renewal not confirmed before the safety margin; reported lost");
        // Free the lease for others once Redis is reachable again; harmless if it is gone.
        if let Err(e) = release_until(&self.lease, self.latest).await {
            tracing::debug!(lease = %self.lease.describe(), error = %e, "release after an unconfirmed renewal failed");
        }
    }

    async fn client_unresponsive(self, silent: Duration) {
        self.finish(
            LostReason::ClientUnresponsive,
            format!(
                "the client did not answer or read for {} (longer than the lease's ttl); the \
                 lease is no longer renewed",
                humantime::format_duration(Duration::from_millis(
                    u64::try_from(silent.as_millis()).unwrap_or(u64::MAX)
                ))
            ),
        );
        tracing::warn!(lease = %self.lease.describe(), ?silent, "client stopped answering; lease given up");
        // The last renewal it may read promised the lease until `valid_until`: keep that promise,
        // then free the lease rather than let it run to its latest expiry.
        tokio::time::sleep_until(self.valid_until).await;
        if let Err(e) = release_until(&self.lease, self.latest).await {
            tracing::warn!(lease = %self.lease.describe(), error = %e, "release for an unresponsive client failed; the lease expires at its ttl");
        }
    }

    async fn release_for_shutdown(self) {
        // Told first, so the client stops acting as the holder before anyone else can get in.
        self.finish(
            LostReason::Shutdown,
            "baton is shutting down; the lease is being released",
        );
        let window = self.latest.min(Instant::now() + SHUTDOWN_RELEASE_WINDOW);
        if let Err(e) = release_until(&self.lease, window).await {
            tracing::warn!(lease = %self.lease.describe(), error = %e, "release at shutdown failed; the lease expires at its ttl");
        }
    }
}

async fn release_for_departure<L: Renewable>(lease: &L, latest: Instant) {
    match release_until(lease, latest).await {
        Ok(was_held) => {
            tracing::debug!(lease = %lease.describe(), was_held, "client left; lease released")
        }
        Err(e) => tracing::warn!(
            lease = %lease.describe(),
            error = %e,
            "client left but the release failed until the lease's expiry; Redis ends it then"
        ),
    }
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
