//! Which calls are at work: a count that a caller (a client connection) keeps of its calls that
//! are being answered, from which a call steps out while it waits for something else to happen
//! (a lock's release, a permit).
//!
//! The connection uses the count to decide whether an answer is worth holding for one turn of the
//! scheduler, so that the answers of its other calls leave in the same write. A call parked in
//! [`crate::wait::until`] answers only once another client releases, so it does not count. Each
//! call is a [`Call`], lent to the call's task (a tokio task-local, [`within`]), so that the wait
//! finds it without knowing of connections.
//!
//! Across all callers, the calls at work that are not waiting for a reply of their own (from
//! Redis) are counted too ([`about_to_send`]): a connection to Redis holds a write for one turn
//! while some are, so that their commands leave with it.

use std::{
    future::Future,
    sync::{
        Arc, LazyLock,
        atomic::{AtomicU8, AtomicUsize, Ordering},
    },
};

use tokio::task::futures::TaskLocalFuture;

/// The call is in its caller's count.
const AT_WORK: u8 = 0;
/// The call is out of the count, waiting for others.
const PARKED: u8 = 1;
/// The call ended: it is out of the count for good.
const ENDED: u8 = 2;
/// The call is in its caller's count, but has sent a request and waits for the reply
/// ([`sent`]): it is not about to send.
const SENT: u8 = 3;

/// The calls at work, of every caller, that have not sent a request they wait for.
static ABOUT_TO_SEND: AtomicUsize = AtomicUsize::new(0);

/// How many calls, of every caller, are at work and not waiting for a reply: those that may send
/// a command soon.
pub fn about_to_send() -> usize {
    ABOUT_TO_SEND.load(Ordering::Relaxed)
}

/// Where one call stands, shared by its [`Call`] and its [`Parked`] guard.
#[derive(Debug)]
pub struct CallState {
    count: Arc<AtomicUsize>,
    /// The count of calls about to send, of every caller ([`ABOUT_TO_SEND`] outside tests).
    senders: &'static AtomicUsize,
    state: AtomicU8,
}

tokio::task_local! {
    /// The call the current task runs.
    static CURRENT: Arc<CallState>;
}

/// The state lent to calls that no caller counts: ended, so that nothing parks.
static UNCOUNTED: LazyLock<Arc<CallState>> = LazyLock::new(|| {
    Arc::new(CallState {
        count: Arc::new(AtomicUsize::new(0)),
        senders: &ABOUT_TO_SEND,
        state: AtomicU8::new(ENDED),
    })
});

/// One call in its caller's count, from [`Call::start`] until it is dropped (or, while parked,
/// until the wait ends).
#[derive(Debug)]
pub struct Call(Arc<CallState>);

impl Call {
    /// Counts a call in `count`.
    pub fn start(count: Arc<AtomicUsize>) -> Self {
        Self::counted(count, &ABOUT_TO_SEND)
    }

    /// Counts a call in `count` and in `senders`.
    fn counted(count: Arc<AtomicUsize>, senders: &'static AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        senders.fetch_add(1, Ordering::Relaxed);
        Self(Arc::new(CallState {
            count,
            senders,
            state: AtomicU8::new(AT_WORK),
        }))
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // A call dropped while parked left the count already; its wait may outlive it (moved to
        // a task of its own to see a grant through) and must not come back into the count.
        match self.0.state.swap(ENDED, Ordering::Relaxed) {
            AT_WORK => {
                self.0.count.fetch_sub(1, Ordering::Relaxed);
                self.0.senders.fetch_sub(1, Ordering::Relaxed);
            }
            SENT => {
                self.0.count.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// The future of a call run [`within`] its [`Call`].
pub type Within<F> = TaskLocalFuture<Arc<CallState>, F>;

/// Runs `future` as `call`, so that a wait inside it can step out of the count ([`parked`]); with
/// no call, nothing inside it parks.
pub fn within<F: Future>(call: Option<&Call>, future: F) -> Within<F> {
    let state = call.map_or_else(|| UNCOUNTED.clone(), |c| c.0.clone());
    CURRENT.scope(state, future)
}

/// Takes the current call out of its caller's count until the guard is dropped: for a call that
/// waits for other clients. `None` outside a counted call (a spawned task, a stream's body), or
/// when the call is out already.
pub fn parked() -> Option<Parked> {
    CURRENT
        .try_with(|call| {
            call.state
                .compare_exchange(AT_WORK, PARKED, Ordering::Relaxed, Ordering::Relaxed)
                .ok()
                .map(|_| {
                    call.count.fetch_sub(1, Ordering::Relaxed);
                    call.senders.fetch_sub(1, Ordering::Relaxed);
                    Parked(call.clone())
                })
        })
        .ok()
        .flatten()
}

/// A call out of its caller's count, back in it when dropped, unless the call ended meanwhile.
#[derive(Debug)]
pub struct Parked(Arc<CallState>);

impl Drop for Parked {
    fn drop(&mut self) {
        if self
            .0
            .state
            .compare_exchange(PARKED, AT_WORK, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.0.count.fetch_add(1, Ordering::Relaxed);
            self.0.senders.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Marks the current call as waiting for the reply to a request it sent, until the guard is
/// dropped: it stays in its caller's count but leaves [`about_to_send`]. `None` outside a call at
/// work (a spawned task, a parked call, a call that sent already).
pub fn sent() -> Option<Sent> {
    CURRENT
        .try_with(|call| {
            call.state
                .compare_exchange(AT_WORK, SENT, Ordering::Relaxed, Ordering::Relaxed)
                .ok()
                .map(|_| {
                    call.senders.fetch_sub(1, Ordering::Relaxed);
                    Sent(call.clone())
                })
        })
        .ok()
        .flatten()
}

/// A call waiting for a reply; about to send again when dropped, unless the call ended meanwhile.
#[derive(Debug)]
pub struct Sent(Arc<CallState>);

impl Drop for Sent {
    fn drop(&mut self) {
        if self
            .0
            .state
            .compare_exchange(SENT, AT_WORK, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.0.senders.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(count: &AtomicUsize) -> usize {
        count.load(Ordering::Relaxed)
    }

    /// A parked call leaves the count and comes back; outside a counted call nothing parks.
    #[tokio::test]
    async fn a_parked_call_leaves_the_count_while_parked() {
        assert!(parked().is_none());
        let count = Arc::new(AtomicUsize::new(2));
        let call = Call::start(count.clone());
        assert_eq!(load(&count), 3);
        within(Some(&call), async {
            let guard = parked();
            assert!(guard.is_some());
            assert_eq!(load(&count), 2);
            // Out already: a second wait inside the first takes nothing more.
            assert!(parked().is_none());
            drop(guard);
            assert_eq!(load(&count), 3);
            // A task spawned by a call is not the call.
            tokio::spawn(async { assert!(parked().is_none()) })
                .await
                .expect("the task ran");
        })
        .await;
        drop(call);
        assert_eq!(load(&count), 2);
        within(None, async { assert!(parked().is_none()) }).await;
    }

    /// A call dropped while parked (its caller left) is out of the count for good, even when its
    /// wait ends later.
    #[tokio::test]
    async fn a_call_that_ends_while_parked_stays_out() {
        let count = Arc::new(AtomicUsize::new(0));
        let call = Call::start(count.clone());
        let guard = within(Some(&call), async { parked() })
            .await
            .expect("parked");
        assert_eq!(load(&count), 0);
        drop(call);
        assert_eq!(load(&count), 0);
        drop(guard);
        assert_eq!(load(&count), 0);
    }

    /// A call that sent leaves the count of senders (not its caller's) until the reply, and
    /// comes back unless it ended meanwhile; a parked call is out of both and sends nothing.
    #[tokio::test]
    async fn a_call_waiting_for_a_reply_is_not_about_to_send() {
        static SENDERS: AtomicUsize = AtomicUsize::new(0);
        let count = Arc::new(AtomicUsize::new(0));
        let call = Call::counted(count.clone(), &SENDERS);
        assert_eq!((load(&count), load(&SENDERS)), (1, 1));
        assert!(sent().is_none(), "outside the call");
        within(Some(&call), async {
            let guard = sent().expect("at work");
            assert_eq!((load(&count), load(&SENDERS)), (1, 0));
            assert!(sent().is_none(), "sent already");
            assert!(
                parked().is_none(),
                "a call waiting for a reply does not park"
            );
            drop(guard);
            assert_eq!((load(&count), load(&SENDERS)), (1, 1));
            let parked = parked().expect("at work");
            assert_eq!((load(&count), load(&SENDERS)), (0, 0));
            assert!(
                sent().is_none(),
                "a parked call's attempts leave the counts alone"
            );
            drop(parked);
            assert_eq!((load(&count), load(&SENDERS)), (1, 1));
        })
        .await;
        let guard = within(Some(&call), async { sent() })
            .await
            .expect("at work");
        drop(call);
        assert_eq!((load(&count), load(&SENDERS)), (0, 0));
        drop(guard);
        assert_eq!((load(&count), load(&SENDERS)), (0, 0));
    }
}
