//! Waiting without polling, shared by every primitive whose callers wait (locks, semaphores).
//!
//! [`until`] subscribes to the resource's release channel, marks what it has seen, makes one
//! attempt, and when the resource is busy waits for a release message, for the fallback the
//! attempt named (a holder's expiry), for the caller's deadline, or for `stop`, whichever comes
//! first, then tries again. A release published between the attempt and the wait is not missed.
//! The messages that wake the waiter are those its [`Wake`] names: every broadcast, messages
//! addressed to its id (a fair queue wakes only its head), or one broadcast in turn among relay
//! waiters (of which only one can take what was released).

use std::{future::Future, time::Duration};

use tokio::time::Instant;

use crate::{
    activity,
    error::Error,
    redis::{Notifier, Wake},
};

/// What one attempt found.
#[derive(Debug)]
pub enum Attempt<T> {
    /// A final answer (usually: granted).
    Done(T),
    /// A final answer that leaves some of what was released for others: a relay wake-up
    /// ([`Wake::Relay`]) goes on to the next local relay waiter.
    Passing(T),
    /// Busy: `answer` is what to return if the deadline passes first; `retry_in` is the fallback
    /// for trying again without a release message (`None`: only on a message or at the deadline).
    Busy {
        /// The answer for a wait that ends now.
        answer: T,
        /// When to try again at the latest.
        retry_in: Option<Duration>,
    },
}

/// Attempts until done, the deadline passes, or `stop` yields an error; the waiter is woken by
/// the messages of `channel` that `wake` names (see [`Notifier::subscribe_as`]).
///
/// `attempt` receives the time left before the deadline (zero for the last attempt). `stop` is
/// only raced against the waiting, never against an attempt in flight, so an attempt that grants
/// is always seen through.
pub async fn until<T, F, Fut>(
    notifier: &Notifier,
    channel: &str,
    wake: Wake<'_>,
    deadline: Instant,
    stop: impl Future<Output = Error>,
    mut attempt: F,
) -> Result<T, Error>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<Attempt<T>, Error>>,
{
    let mut subscription = notifier.subscribe_as(channel, wake).await?;
    tokio::pin!(stop);
    let mut parked = None;
    loop {
        subscription.arm();
        let left = deadline.saturating_duration_since(Instant::now());
        let outcome = attempt(left).await?;
        subscription.settle();
        let (answer, retry_in) = match outcome {
            Attempt::Done(value) => return Ok(value),
            Attempt::Passing(value) => {
                subscription.pass_on();
                return Ok(value);
            }
            Attempt::Busy { answer, retry_in } => (answer, retry_in),
        };
        let now = Instant::now();
        if now >= deadline {
            return Ok(answer);
        }
        let wake = retry_in.map_or(deadline, |r| now + r).min(deadline);
        // Waiting for others, the call is not at work, nor in the attempts after its wake-ups
        // (most of which find the resource taken again): its connection need not hold answers
        // for it. It is back at work when it returns.
        if parked.is_none() {
            parked = activity::parked();
        }
        tokio::select! {
            // A stop that came first wins over a message that arrived meanwhile: at shutdown,
            // the release Baton makes of its own holds must not hand them to its own waiters.
            biased;
            e = &mut stop => return Err(e),
            () = subscription.notified() => {}
            () = tokio::time::sleep_until(wake) => {}
        }
        subscription.ensure().await?;
    }
}
