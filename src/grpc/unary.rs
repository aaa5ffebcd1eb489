//! Unary calls whose caller may leave mid-way (a deadline, a cancellation): what they granted is
//! handed to a clean-up instead of leaking until its ttl.

use std::{future::Future, pin::Pin};

use tokio_util::sync::CancellationToken;

use crate::{
    error::Error,
    lease::{Stop, stop},
};

/// Runs a unary acquisition so that a grant racing the caller's cancellation (a dropped request,
/// a deadline) is handed to `orphan` to release instead of leaking until its ttl. `acquire` gets
/// a [`Stop`] that resolves when the caller leaves or Baton shuts down.
///
/// The acquisition runs in the caller's task, boxed: a caller that leaves mid-call drops this
/// future, which moves the unfinished acquisition into a task of its own, signals its `Stop`, and
/// lets it finish (a script call in flight is seen through) before handing a grant to `orphan`.
/// Calls that complete pay no task of their own.
pub async fn detached<T, A, AF, R>(
    shutdown: &CancellationToken,
    acquire: A,
    orphan: R,
) -> Result<T, Error>
where
    T: Send + 'static,
    A: FnOnce(Stop) -> AF,
    AF: Future<Output = Result<T, Error>> + Send + 'static,
    R: FnOnce(T) + Send + 'static,
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
struct Unfinished<T: Send + 'static, R: FnOnce(T) + Send + 'static> {
    work: Option<Work<T>>,
    orphan: Option<R>,
    gone: CancellationToken,
}

impl<T: Send + 'static, R: FnOnce(T) + Send + 'static> Drop for Unfinished<T, R> {
    fn drop(&mut self) {
        if let (Some(work), Some(orphan)) = (self.work.take(), self.orphan.take()) {
            self.gone.cancel();
            // Without a runtime (the process is ending) the acquisition is dropped: a grant it
            // may have made ends at its ttl.
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let task = async move {
                    if let Ok(value) = work.await {
                        orphan(value);
                    }
                };
                runtime.spawn(tracing::Instrument::in_current_span(task));
            }
        }
    }
}
