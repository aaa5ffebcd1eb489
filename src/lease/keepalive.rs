//! Keepalive: a lease kept alive for as long as its client keeps its stream open.
//!
//! `Kept::run` renews a [`Renewable`] lease about every third of its ttl and reports each
//! renewal. It tracks, by this process's monotonic clock, the earliest moment the lease could
//! expire in Redis: a renewal confirmed by a reply to a call sent at `t` keeps the lease until at
//! least `t + remaining`. When no renewal has been confirmed by that moment minus a safety margin,
//! it reports the lease lost *before* it can have expired. When the client goes away it releases
//! at once; when the client stops answering its connection's pings (or its connection stops
//! taking what Baton sends) for longer than the lease's ttl it stops renewing and releases once
//! the expiry it last reported has passed; on shutdown it says so and releases. Releases are
//! retried until the lease would have expired anyway, counting renewals whose reply never came
//! as if Redis had run them (a draining server waits for them until its deadline).

use std::{
    future::Future,
    time::{Duration, SystemTime},
};

use tokio::time::Instant;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument;

use super::{
    ClientWatch, Stop, expires_at, loss_margin, retry_until,
    stream::{self, Events, Sender},
};
use crate::{
    error::Error,
    metrics::{self, Release, Renewal},
};

/// A lease that a keepalive stream can renew and release.
pub trait Renewable: Send + Sync + 'static {
    /// Renews the lease, sending the renewal no later than `by` (it may wait until then to share
    /// a call with other leases: see [`super::batch`]). `Ok(Some(remaining))` when still held,
    /// `Ok(None)` when it is not.
    fn renew(&self, by: Instant) -> impl Future<Output = Result<Option<Duration>, Error>> + Send;
    /// Releases the lease once. `Ok(true)` when it was still held.
    fn release(&self) -> impl Future<Output = Result<bool, Error>> + Send;
    /// The resource and owner the lease is of, for log lines and metrics.
    fn describe(&self) -> Described<'_>;
    /// How long a call to Redis may take before it is given up: a renewal whose reply never came
    /// may have run up to that long after it was sent.
    fn call_timeout(&self) -> Duration;
}

/// What a lease is of, as log lines name it (fields `kind`, `name`, `owner`).
#[derive(Debug, Clone, Copy)]
pub struct Described<'a> {
    /// The primitive ("lock", "semaphore").
    pub kind: &'static str,
    /// The resource's name.
    pub name: &'a str,
    /// The owner (empty for an anonymous holder, or a lease kept alive by `KeepAlive`, which
    /// names none).
    pub owner: &'a str,
}

/// Why a kept-alive lease ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// Redis no longer has the lease.
    NotHeld,
    /// No renewal could be confirmed before the safety margin ahead of expiry.
    Unconfirmed,
    /// Baton is shutting down; the lease is released right after.
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

/// How the acquisition that opens a kept-alive stream ended.
pub enum Opening<I, L> {
    /// Granted: `first` is the stream's first item; `lease` is then kept alive.
    Granted {
        /// The first item of the stream.
        first: I,
        /// The lease to keep alive.
        lease: L,
        /// The lease's nominal ttl (sets the renewal pace).
        ttl: Duration,
        /// The earliest moment the lease can expire, by this process's clock.
        valid_until: Instant,
    },
    /// Not granted within the wait: the only item of the stream.
    Refused(I),
}

/// Opens a `Hold` stream: runs `acquire` in its own task on `tasks`, sends its first item, then
/// keeps the lease alive until the client leaves, the lease is lost, or shutdown. Items are made
/// by `wrap` from events, and by `fail` from an error that ends the stream before a grant. A
/// grant that finds the client gone is released at once.
pub fn hold<I, L, A, AF>(
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
    client: ClientWatch,
    wrap: fn(Event) -> I,
    fail: fn(Error) -> I,
    acquire: A,
) -> Events<I>
where
    I: Send + 'static,
    L: Renewable,
    A: FnOnce(Stop) -> AF + Send + 'static,
    AF: Future<Output = Result<Opening<I, L>, Error>> + Send,
{
    let (tx, rx) = stream::channel();
    let shutdown = shutdown.clone();
    // In the call's span (a traced call's trace id), like every log line of the stream.
    let task = async move {
        // Should this task end early (a panic), the client is told instead of seeing the stream
        // end OK.
        tx.on_drop(fail(Error::Internal(
            "the acquisition ended unexpectedly; whether it was granted is unknown".into(),
        )));
        let stop = super::stop(tx.gone().cancelled_owned(), shutdown.clone());
        // Boxed so that the acquisition's state (its wait, its subscription) is freed once it
        // ends instead of staying part of this task for the life of the lease.
        match Box::pin(acquire(stop)).await {
            Ok(Opening::Granted {
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
                if shutdown.is_cancelled() {
                    // Granted as Baton began shutting down (the wait's last attempt was already
                    // in Redis): given back before the client hears of it, and the client told
                    // Baton is going away, rather than granted and lost in one breath. The
                    // stream stays open until the release is done, so the drain waits for it.
                    return release_for_shutdown_before_grant(&lease, latest, tx, fail).await;
                }
                tx.first(first);
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
            Ok(Opening::Refused(item)) => tx.finish(item),
            Err(Error::Cancelled) => {}
            Err(e) => tx.finish(fail(e)),
        }
    };
    tasks.spawn(task.in_current_span());
    rx
}

/// Opens a `KeepAlive` stream: `first_renewal` renews the lease once (sent now); when it is not
/// held the call fails with `FailedPrecondition` and no stream opens. Otherwise the first item
/// reports that renewal and the lease is then kept alive, renewed with `ttl` (or, when `None`,
/// with the ttl the first renewal set: the lease's own).
pub async fn open_keep_alive<I, L>(
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
    client: ClientWatch,
    wrap: fn(Event) -> I,
    lease: L,
    ttl: Option<Duration>,
    first_renewal: impl Future<Output = Result<Option<Duration>, Error>>,
) -> Result<Events<I>, Error>
where
    I: Send + 'static,
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
    tasks.spawn(
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
        .run()
        .in_current_span(),
    );
    Ok(rx)
}

/// Releases `lease`, retried until `latest` (the latest moment it can expire by itself).
pub async fn release_until<L: Renewable>(lease: &L, latest: Instant) -> Result<bool, Error> {
    retry_until(latest, || lease.release()).await
}

/// Delay before retrying a renewal that failed, so a brief Redis hiccup costs few calls.
fn retry_delay(ttl: Duration) -> Duration {
    (ttl / 20).clamp(Duration::from_millis(5), Duration::from_millis(500))
}

/// A lease kept alive by a stream.
pub struct Kept<L, I> {
    lease: L,
    /// The nominal ttl: the renewal pace and the safety margin.
    ttl: Duration,
    /// The earliest moment the lease can expire, as of its acquisition or last renewal.
    valid_until: Instant,
    /// The latest moment it can expire by itself (how long a release is worth trying): renewals
    /// whose reply never came count as if Redis had run them as late as it could.
    latest: Instant,
    tx: Sender<I>,
    wrap: fn(Event) -> I,
    shutdown: CancellationToken,
    client: ClientWatch,
}

impl<L: Renewable, I: Send + 'static> Kept<L, I> {
    /// Keeps the lease alive until it is lost, the client goes away or stops answering, or
    /// shutdown. A renewal is requested a quarter of the remaining ttl after the last one and must
    /// be sent by a third of it, so renewals of many leases can share a call.
    async fn run(mut self) {
        // A stream must never end OK for a lease that may be lost: should this task end early (a
        // panic), its end says the lease can no longer be confirmed.
        self.tx.on_drop((self.wrap)(Event::Lost(
            LostReason::Unconfirmed,
            "the lease's keepalive ended unexpectedly; it is no longer renewed".into(),
        )));
        let counted = metrics::lease(self.lease.describe().kind);
        let _held = counted.kept();
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
            // Should its reply never come, this renewal may still run in Redis, as late as a call
            // sent by `by` can, and keep the lease a full ttl from then.
            let unconfirmed = by.max(sent) + self.lease.call_timeout() + self.ttl;
            let outcome = tokio::select! {
                biased;
                () = self.shutdown.cancelled() => return self.release_for_shutdown().await,
                () = self.tx.closed() => return release_for_departure(&self.lease, self.latest).await,
                r = tokio::time::timeout_at(loss_at, self.lease.renew(by.max(sent))) => r,
            };
            counted.renewal(match outcome {
                Ok(Ok(Some(_))) => Renewal::Renewed,
                Ok(Ok(None)) => Renewal::NotHeld,
                Ok(Err(_)) | Err(_) => Renewal::Failed,
            });
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
                    self.finish(
                        LostReason::NotHeld,
                        "the lease is no longer held in Redis (expired or released elsewhere)",
                    );
                    return;
                }
                Ok(Err(e)) => {
                    self.latest = self.latest.max(unconfirmed);
                    let lease = self.lease.describe();
                    tracing::warn!(kind = lease.kind, name = lease.name, owner = lease.owner, error = %e, "lease renewal failed; retrying");
                    next = Instant::now() + retry_delay(self.ttl);
                    by = next;
                }
                Err(_) => {
                    self.latest = self.latest.max(unconfirmed);
                    return self.lost_unconfirmed().await;
                }
            }
        }
    }

    /// Ends the stream with `lost`, counted and logged once with what the client is told.
    fn finish(&self, reason: LostReason, message: impl Into<String>) {
        let message = message.into();
        self.note_lost(reason, &message);
        self.tx.finish((self.wrap)(Event::Lost(reason, message)));
    }

    /// Counts and logs the loss the client is told of with `why`.
    fn note_lost(&self, reason: LostReason, why: &str) {
        let lease = self.lease.describe();
        metrics::lease(lease.kind).lost(reason);
        let (kind, name, owner) = (lease.kind, lease.name, lease.owner);
        match reason {
            LostReason::Shutdown => {
                tracing::info!(kind, name, owner, reason = ?reason, why, "lease lost")
            }
            _ => tracing::warn!(kind, name, owner, reason = ?reason, why, "lease lost"),
        }
    }

    async fn lost_unconfirmed(self) {
        self.finish(
            LostReason::Unconfirmed,
            "renewal could not be confirmed by Redis before the lease could expire",
        );
        // Free the lease for others once Redis is reachable again; harmless if it is gone.
        if let Err(e) = release_until(&self.lease, self.latest).await {
            let lease = self.lease.describe();
            tracing::debug!(kind = lease.kind, name = lease.name, owner = lease.owner, error = %e, "release after an unconfirmed renewal failed");
        }
    }

    async fn client_unresponsive(self, silent: Duration) {
        self.finish(
            LostReason::ClientUnresponsive,
            format!(
                "the client did not answer or read for {} (longer than the lease's ttl and a ping \
                 interval); the lease is no longer renewed",
                humantime::format_duration(Duration::from_millis(
                    u64::try_from(silent.as_millis()).unwrap_or(u64::MAX)
                ))
            ),
        );
        // The last renewal it may read promised the lease until `valid_until`: keep that promise,
        // then free the lease rather than let it run to its latest expiry.
        tokio::time::sleep_until(self.valid_until).await;
        if let Err(e) = release_until(&self.lease, self.latest).await {
            let lease = self.lease.describe();
            tracing::warn!(kind = lease.kind, name = lease.name, owner = lease.owner, error = %e, "release for an unresponsive client failed; the lease expires at its ttl");
        }
    }

    async fn release_for_shutdown(self) {
        // Told first, so the client stops acting as the holder before anyone else can get in;
        // the stream stays open until the release is done (`self` dropped), so the server's
        // drain waits for it instead of the process exiting in the middle of it. While Redis does
        // not answer, the release is retried until the drain's deadline ends the process.
        let why = "baton is shutting down; the lease is being released";
        self.note_lost(LostReason::Shutdown, why);
        self.tx
            .finish_later((self.wrap)(Event::Lost(LostReason::Shutdown, why.into())));
        if let Err(e) = release_until(&self.lease, self.latest).await {
            let lease = self.lease.describe();
            tracing::warn!(kind = lease.kind, name = lease.name, owner = lease.owner, error = %e, "release at shutdown failed; the lease expires at its ttl");
        }
    }
}

/// Releases `lease`, granted after shutdown began and not yet told to the client, then ends the
/// stream `tx` with UNAVAILABLE (shutting down).
async fn release_for_shutdown_before_grant<L: Renewable, I>(
    lease: &L,
    latest: Instant,
    tx: Sender<I>,
    fail: fn(Error) -> I,
) {
    let released = release_until(lease, latest).await;
    let d = lease.describe();
    let (kind, name, owner) = (d.kind, d.name, d.owner);
    match released {
        Ok(was_held) => {
            tracing::debug!(
                kind,
                name,
                owner,
                was_held,
                "granted at shutdown; released before the client heard of it"
            )
        }
        Err(e) => tracing::warn!(
            kind,
            name,
            owner,
            error = %e,
            "granted at shutdown, but the release failed; the lease expires at its ttl"
        ),
    }
    tx.finish(fail(Error::ShuttingDown));
}

async fn release_for_departure<L: Renewable>(lease: &L, latest: Instant) {
    let released = release_until(lease, latest).await;
    let d = lease.describe();
    let counted = metrics::lease(d.kind);
    let (kind, name, owner) = (d.kind, d.name, d.owner);
    match released {
        Ok(was_held) => {
            counted.released_on_close(if was_held {
                Release::Released
            } else {
                Release::NotHeld
            });
            tracing::debug!(kind, name, owner, was_held, "client left; lease released")
        }
        Err(e) => {
            counted.released_on_close(Release::Failed);
            tracing::warn!(
                kind,
                name,
                owner,
                error = %e,
                "client left but the release failed until the lease's expiry; Redis ends it then"
            )
        }
    }
}
