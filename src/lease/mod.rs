//! Leases, shared by every leased primitive (locks, semaphore permits, leaderships): the limits of a lease
//! request, the acquisition engine ([`engine`]), keepalive ([`keepalive`]) with its event stream
//! ([`stream`]) and batched renewals ([`batch`]), the liveness of a client, and clean-up calls
//! retried until they stop mattering. Nothing here knows of gRPC.
//!
//! A primitive is a key layout and its scripts ([`engine::Primitive`]); the engine runs the one
//! algorithm every primitive shares: the first try, the wait woken by pub/sub, giving a waiter's
//! place back, rolling back a grant replicas did not acknowledge, releasing a grant whose caller
//! never saw it, and the renewal of kept-alive leases.

pub mod batch;
pub mod engine;
pub mod keepalive;
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
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::error::Error;

pub use engine::{Acquired, Busy, CleanUp, Engine, Grant, Primitive, Refusal, Request};
pub use keepalive::{Described, Event, Kept, LostReason, Renewable};

/// How many callers may wait at once, over every primitive of a Baton (`--max-waiters`): each
/// waiting caller costs Redis a script call about every second, so their number is bounded like
/// everything else a client can open. Cheap to clone (the clones share the count).
#[derive(Clone, Debug)]
pub struct WaitLimit {
    permits: Arc<tokio::sync::Semaphore>,
    max: usize,
}

impl WaitLimit {
    /// At most `max` callers waiting at once.
    pub fn new(max: usize) -> Self {
        Self {
            permits: Arc::new(tokio::sync::Semaphore::new(max)),
            max,
        }
    }

    /// A place to wait, held while the caller waits; `None` when `max` callers wait already.
    fn take(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }

    /// The refusal of a caller that found the resource busy and no place to wait.
    fn refusal(&self) -> Error {
        Error::ResourceExhausted(format!(
            "{} callers already wait at this Baton, its most (--max-waiters), and the resource \
             is busy: retry later",
            self.max
        ))
    }
}

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
/// How long a waiter's registration lasts unless renewed: a fair waiter's place in the queue,
/// and a non-fair exclusive lock waiter's registration as a writer. Waiters renew it about every
/// third of this, so the registration of a waiter whose Baton died ends within this time.
pub const QUEUE_LEASE: Duration = Duration::from_secs(3);

/// How long the token and waiter id of a script call whose reply never came stay void once its
/// clean-up has run: should Redis run that call later (it sat in a paused server's input buffer),
/// it changes nothing. A call delayed longer than this could still grant a lease nobody knows of,
/// which then ends at its ttl. It is also how long such a clean-up is retried while Redis does
/// not answer it: a call sent but never answered may run whenever Redis resumes, however long
/// after its ttl, so its clean-up must still come after it.
pub const VOID_RETENTION: Duration = Duration::from_secs(300);

/// A void mark's lifetime as a clean-up script's argument (`lease/void.lua`): whole
/// milliseconds, at least 1, since 0 means no mark.
pub fn void_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Largest safety margin kept between the loss report and the earliest possible expiry.
pub const MAX_LOSS_MARGIN: Duration = Duration::from_secs(2);
/// Smallest safety margin.
pub const MIN_LOSS_MARGIN: Duration = Duration::from_millis(5);
/// First pause before a failed clean-up call (a release, a waiter's removal) is tried again; it
/// doubles up to [`RETRY_MAX`].
pub const RETRY_MIN: Duration = Duration::from_millis(20);
/// Longest pause between two tries of a failed clean-up call.
pub const RETRY_MAX: Duration = Duration::from_secs(1);

/// Resolves when the caller has gone away or Baton shuts down, with the matching error; handed to
/// acquisitions so they stop waiting.
pub type Stop = Pin<Box<dyn Future<Output = Error> + Send>>;

/// A [`Stop`] that resolves with `Cancelled` when `gone` resolves, or with `ShuttingDown` on
/// shutdown.
pub fn stop(gone: impl Future<Output = ()> + Send + 'static, shutdown: CancellationToken) -> Stop {
    Box::pin(async move {
        tokio::select! {
            () = gone => Error::Cancelled,
            () = shutdown.cancelled() => Error::ShuttingDown,
        }
    })
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

/// Runs `attempt` until it succeeds or fails with anything but [`Error::Unavailable`] or
/// [`Error::Unanswered`], pausing between tries ([`RETRY_MIN`] doubling to [`RETRY_MAX`]); gives
/// up with the last error when the next try would start after `deadline` (the moment the outcome
/// stops mattering, such as the expiry of the lease being released).
pub async fn retry_until<T, F, Fut>(deadline: Instant, mut attempt: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let mut pause = RETRY_MIN;
    loop {
        match attempt().await {
            Err(e @ (Error::Unavailable(_) | Error::Unanswered(_))) => {
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

/// Runs a clean-up call (a release, a waiter's removal) in a task of its own on `tasks` (which a
/// draining server waits for), retried as [`retry_until`] does until `deadline`; logs a failure
/// with `what`.
pub fn clean_up<T, F, Fut>(tasks: &TaskTracker, what: String, deadline: Instant, attempt: F)
where
    T: Send + 'static,
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, Error>> + Send,
{
    // A clean-up given a single try (its deadline already reached) fails quietly: that is every
    // call failing during an outage, each telling its own caller.
    let once = deadline <= Instant::now();
    let task = async move {
        match retry_until(deadline, attempt).await {
            Err(e) if once => tracing::debug!(error = %e, "{what} failed"),
            Err(e) => {
                tracing::warn!(error = %e, "{what} failed until it no longer mattered; Redis ends it at its expiry")
            }
            Ok(_) => {}
        }
    };
    // In the span of the call it cleans up after (a traced call's trace id), if any.
    tasks.spawn(tracing::Instrument::in_current_span(task));
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
    /// ttl plus one ping interval, and at least two ping intervals. An idle client is heard
    /// only when it answers a ping, a ping interval after it was last heard, so a client paused
    /// for less than the ttl may have been silent for up to a ping interval more.
    pub fn silence_limit(&self, ttl: Duration) -> Duration {
        self.ping_interval.map_or(ttl, |p| p + ttl.max(p))
    }

    /// How long the client has been silent, when that is longer than [`silence_limit`].
    ///
    /// [`silence_limit`]: Self::silence_limit
    pub fn unresponsive(&self, ttl: Duration) -> Option<Duration> {
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

    /// A client may stay silent for the lease's ttl, and for two ping intervals at least.
    #[test]
    fn silence_limit_covers_two_pings() {
        let watch = ClientWatch::new(None, Some(Duration::from_secs(1)));
        assert_eq!(
            watch.silence_limit(Duration::from_millis(300)),
            Duration::from_secs(2)
        );
        assert_eq!(
            watch.silence_limit(Duration::from_secs(60)),
            Duration::from_secs(61)
        );
        assert_eq!(
            watch.unresponsive(Duration::from_secs(1)),
            None,
            "nothing to watch"
        );
        let unpinged = ClientWatch::new(Some(Liveness::new()), None);
        assert_eq!(
            unpinged.unresponsive(Duration::ZERO),
            None,
            "silence proves nothing"
        );
    }

    /// A failed clean-up is tried again until the deadline, an answer ends it.
    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_the_deadline_or_an_answer() {
        let start = Instant::now();
        let mut tries = 0;
        let result: Result<(), Error> = retry_until(start + Duration::from_secs(2), || {
            tries += 1;
            async { Err(Error::Unavailable("down".into())) }
        })
        .await;
        assert!(result.is_err());
        // 20, 40, 80, 160, 320, 640 ms pauses fit in 2 s, the next (1 s) does not.
        assert_eq!(tries, 7);
        let mut tries = 0;
        let result = retry_until(start + Duration::from_secs(60), || {
            tries += 1;
            let n = tries;
            async move {
                if n < 3 {
                    Err(Error::Unavailable("down".into()))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(result.unwrap(), 3);
    }
}
