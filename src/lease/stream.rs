//! The events of a kept-alive lease, in order, without a queue that a client which stops reading
//! could fill.
//!
//! A stream carries at most three items at once: its first (the grant, or why there is none),
//! the latest renewal (a newer one replaces an older one nobody has read: a renewal says how long
//! the lease lasts, and only the latest is true), and its final item (`lost`, or an error). The
//! final item replaces any unread renewal and always has room, so a stream never ends without
//! it, however slowly its reader reads; a sender dropped without a final item (its task ended
//! early: a panic) ends the stream with the item it set aside for that ([`Sender::on_drop`]),
//! never silently. Items are whatever the transport sends (for gRPC, a
//! response message or a status). An election's observers ([`crate::election::observe`]) send
//! their states through the same slots: a newer state replaces one nobody has read.

use std::{
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard},
    task::{Context, Poll, Waker},
};

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

struct State<T> {
    first: Option<T>,
    renewal: Option<T>,
    /// When the unread renewal was put in.
    renewal_since: Option<Instant>,
    last: Option<T>,
    /// The final item should the sender be dropped before it sends one.
    on_drop: Option<T>,
    /// No more items will come (the sender finished or was dropped).
    done: bool,
    waker: Option<Waker>,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Cancelled when the receiving half is dropped: the client went away.
    gone: CancellationToken,
}

impl<T> Shared<T> {
    fn state(&self) -> MutexGuard<'_, State<T>> {
        // Only plain assignments happen under this lock; a poisoned one holds consistent data.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, change: impl FnOnce(&mut State<T>)) {
        let waker = {
            let mut state = self.state();
            change(&mut state);
            state.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// The receiving half (for gRPC, the response stream handed to tonic).
pub struct Events<T> {
    shared: Arc<Shared<T>>,
    _gone: DropGuard,
}

/// The sending half, kept by the task that runs the lease.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// A new stream: its sending and receiving halves.
pub fn channel<T>() -> (Sender<T>, Events<T>) {
    let gone = CancellationToken::new();
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            first: None,
            renewal: None,
            renewal_since: None,
            last: None,
            on_drop: None,
            done: false,
            waker: None,
        }),
        gone: gone.clone(),
    });
    (
        Sender {
            shared: shared.clone(),
        },
        Events {
            shared,
            _gone: gone.drop_guard(),
        },
    )
}

impl<T> Sender<T> {
    /// Sends the stream's first item (the grant, or what ends the stream at once).
    pub fn first(&self, item: T) {
        self.shared.update(|s| s.first = Some(item));
    }

    /// Sends a renewal, replacing one the client has not read yet. Returns how long that unread
    /// one had been waiting (`None` when the client had read everything).
    pub fn renewal(&self, event: T) -> Option<std::time::Duration> {
        let now = Instant::now();
        let mut waiting = None;
        self.shared.update(|s| {
            waiting = s.renewal_since.map(|since| now.duration_since(since));
            s.renewal = Some(event);
            if s.renewal_since.is_none() {
                s.renewal_since = Some(now);
            }
        });
        waiting
    }

    /// Sets aside the final item the stream ends with should this sender be dropped before it
    /// sends one (a task that ended early), replacing any set aside before.
    pub fn on_drop(&self, item: T) {
        self.shared.update(|s| s.on_drop = Some(item));
    }

    /// Sends the final item: it replaces an unread renewal (no longer true) and the stream ends
    /// once the client has read it.
    pub fn finish(&self, item: T) {
        self.shared.update(|s| {
            s.renewal = None;
            s.renewal_since = None;
            s.last = Some(item);
            s.on_drop = None;
            s.done = true;
        });
    }

    /// Sends the final item as [`Sender::finish`] does, but the stream ends only when this
    /// sender is dropped: work done after it (a release at shutdown) keeps the stream open, and
    /// a server draining its open streams waits for that work.
    pub fn finish_later(&self, item: T) {
        self.shared.update(|s| {
            s.renewal = None;
            s.renewal_since = None;
            s.last = Some(item);
            s.on_drop = None;
        });
    }

    /// Resolves when the client has gone away (the receiving half was dropped).
    pub async fn closed(&self) {
        self.shared.gone.cancelled().await;
    }

    /// A token cancelled when the client goes away.
    pub fn gone(&self) -> CancellationToken {
        self.shared.gone.clone()
    }

    /// Whether the client has gone away.
    pub fn is_closed(&self) -> bool {
        self.shared.gone.is_cancelled()
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.shared.update(|s| {
            if let Some(item) = s.on_drop.take() {
                s.renewal = None;
                s.renewal_since = None;
                s.last = Some(item);
            }
            s.done = true;
        });
    }
}

impl<T> futures::Stream for Events<T> {
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = self.shared.state();
        if let Some(item) = state.first.take() {
            return Poll::Ready(Some(item));
        }
        if let Some(event) = state.renewal.take() {
            state.renewal_since = None;
            return Poll::Ready(Some(event));
        }
        if let Some(item) = state.last.take() {
            return Poll::Ready(Some(item));
        }
        if state.done {
            return Poll::Ready(None);
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// Unread renewals are replaced by newer ones; the final event replaces an unread renewal and
    /// is always delivered, after the first event.
    #[tokio::test]
    async fn renewals_coalesce_and_the_final_event_always_fits() {
        let (tx, mut rx) = channel::<u32>();
        tx.first(1);
        assert_eq!(tx.renewal(2), None);
        assert!(
            tx.renewal(3).is_some(),
            "the unread renewal is reported waiting"
        );
        assert_eq!(rx.next().await, Some(1));
        assert_eq!(rx.next().await, Some(3));
        assert_eq!(tx.renewal(4), None, "read renewals are not waiting");
        for n in 5..1000 {
            tx.renewal(n);
        }
        tx.finish(0);
        assert_eq!(rx.next().await, Some(0));
        assert!(rx.next().await.is_none());
    }

    /// An item sent with `finish_later` is read at once, but the stream ends only when its sender
    /// is dropped.
    #[tokio::test]
    async fn a_stream_finished_later_ends_when_its_sender_is_dropped() {
        let (tx, mut rx) = channel::<u32>();
        tx.renewal(1);
        tx.finish_later(0);
        assert_eq!(
            rx.next().await,
            Some(0),
            "the final item replaces the renewal"
        );
        let pending = futures::poll!(rx.next());
        assert!(pending.is_pending(), "still open: {pending:?}");
        drop(tx);
        assert!(rx.next().await.is_none());
    }

    /// A sender dropped before its final item (a task that ended early) ends the stream with the
    /// item set aside for that, after what it sent; one that finished ends with its own.
    #[tokio::test]
    async fn a_sender_dropped_early_ends_with_its_set_aside_item() {
        let (tx, mut rx) = channel::<u32>();
        tx.on_drop(99);
        tx.first(1);
        tx.renewal(2);
        drop(tx);
        assert_eq!(rx.next().await, Some(1));
        assert_eq!(
            rx.next().await,
            Some(99),
            "the set-aside item, not a stale renewal"
        );
        assert!(rx.next().await.is_none());

        let (tx, mut rx) = channel::<u32>();
        tx.on_drop(99);
        tx.finish(0);
        drop(tx);
        assert_eq!(rx.next().await, Some(0));
        assert!(rx.next().await.is_none());
    }

    /// Dropping the receiver tells the sender the client has gone; dropping the sender ends the
    /// stream after what it sent.
    #[tokio::test]
    async fn either_side_ending_is_seen_by_the_other() {
        let (tx, rx) = channel::<u32>();
        assert!(!tx.is_closed());
        drop(rx);
        tx.closed().await;
        assert!(tx.is_closed());

        let (tx, mut rx) = channel::<u32>();
        tx.first(7);
        drop(tx);
        assert_eq!(rx.next().await, Some(7));
        assert!(rx.next().await.is_none());
    }
}
