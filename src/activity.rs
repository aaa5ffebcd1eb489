//! Which calls are at work: a count that a caller (a client connection) keeps of its calls that
//! are being answered, lent to each call's task, from which a call steps out while it waits for
//! something else to happen (a lock's release, a permit).
//!
//! The connection uses the count to decide whether an answer is worth holding for one turn of the
//! scheduler, so that the answers of its other calls leave in the same write. A call parked in
//! [`crate::wait::until`] answers only once another client releases, so it does not count.

use std::{
    future::Future,
    sync::{
        Arc, LazyLock,
        atomic::{AtomicUsize, Ordering},
    },
};

use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    /// The count of the caller whose call the current task runs.
    static AT_WORK: Arc<AtomicUsize>;
}

/// The count of calls that came from no counting caller.
static UNCOUNTED: LazyLock<Arc<AtomicUsize>> = LazyLock::new(|| Arc::new(AtomicUsize::new(0)));

/// Runs `call` with `count` as its caller's count (the count itself is raised and lowered by the
/// caller, around the whole call), or with none when `count` is `None`.
pub fn within<F: Future>(
    count: Option<Arc<AtomicUsize>>,
    call: F,
) -> TaskLocalFuture<Arc<AtomicUsize>, F> {
    AT_WORK.scope(count.unwrap_or_else(|| UNCOUNTED.clone()), call)
}

/// Takes the current call out of its caller's count until the guard is dropped: for a call that
/// waits for other clients. `None` outside a counted call (a spawned task, a stream's body).
pub fn parked() -> Option<Parked> {
    AT_WORK
        .try_with(|count| {
            count.fetch_sub(1, Ordering::Relaxed);
            Parked(count.clone())
        })
        .ok()
}

/// A call out of its caller's count, back in it when dropped.
#[derive(Debug)]
pub struct Parked(Arc<AtomicUsize>);

impl Drop for Parked {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parked call leaves the count and comes back; outside a counted call nothing counts.
    #[tokio::test]
    async fn a_parked_call_leaves_the_count_while_parked() {
        assert!(parked().is_none());
        let count = Arc::new(AtomicUsize::new(3));
        let seen = count.clone();
        within(Some(count.clone()), async move {
            let guard = parked();
            assert!(guard.is_some());
            assert_eq!(seen.load(Ordering::Relaxed), 2);
            drop(guard);
            assert_eq!(seen.load(Ordering::Relaxed), 3);
        })
        .await;
        assert_eq!(count.load(Ordering::Relaxed), 3);
        // A task spawned by a call is not the call.
        within(Some(count.clone()), async {
            tokio::spawn(async { assert!(parked().is_none()) })
                .await
                .expect("the task ran");
        })
        .await;
    }
}
