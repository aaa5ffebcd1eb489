//! Which calls are at work: a count that a caller (a client connection) keeps of its calls that
//! are being answered, from which a call steps out while it waits for something else to happen
//! (a lock's release, a permit).
//!
//! The connection uses the count to decide whether an answer is worth holding for one turn of the
//! scheduler, so that the answers of its other calls leave in the same write. A call parked in
//! [`crate::wait::until`] answers only once another client releases, so it does not count. Each
//! call is a [`Call`], lent to the call's task (a tokio task-local, [`within`]), so that the wait
//! finds it without knowing of connections.

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

/// Where one call stands, shared by its [`Call`] and its [`Parked`] guard.
#[derive(Debug)]
pub struct CallState {
    count: Arc<AtomicUsize>,
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
        count.fetch_add(1, Ordering::Relaxed);
        Self(Arc::new(CallState {
            count,
            state: AtomicU8::new(AT_WORK),
        }))
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // A call dropped while parked left the count already; its wait may outlive it (moved to
        // a task of its own to see a grant through) and must not come back into the count.
        if self.0.state.swap(ENDED, Ordering::Relaxed) == AT_WORK {
            self.0.count.fetch_sub(1, Ordering::Relaxed);
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
}
