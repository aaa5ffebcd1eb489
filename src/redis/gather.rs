//! A socket to Redis that holds a write for one turn of the scheduler while calls that may send
//! a command soon are at work, so that their commands leave in the same write.
//!
//! The redis crate's multiplexed connection writes from a task of its own, which a call wakes by
//! queueing a command; the runtime runs that task right after the call, so each command would
//! otherwise cost a system call of its own. Held once, the task goes to the back of the run
//! queue: the calls ahead of it queue their commands, and it writes them all at once. A write is
//! held at most once in a row, and only while [`activity::about_to_send`] counts at least
//! [`GATHER_AT_LEAST`] calls, so a lone call writes at once.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::activity;

/// How many calls at work, not waiting for a reply, make a write wait one turn for them.
pub const GATHER_AT_LEAST: usize = 1;

/// A stream whose writes wait one turn for the commands of calls at work (see the module).
#[derive(Debug)]
pub struct Gathered<S> {
    inner: S,
    /// Whether the write under way was held once already; cleared by a flush.
    held: bool,
    /// The count that decides; [`activity::about_to_send`] outside tests.
    senders: fn() -> usize,
}

impl<S> Gathered<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            held: false,
            senders: activity::about_to_send,
        }
    }

    /// Whether this write waits a turn: the first of a round, while others may send. Wakes the
    /// task at once to come back.
    fn hold(&mut self, cx: &mut Context<'_>) -> bool {
        if self.held || (self.senders)() < GATHER_AT_LEAST {
            return false;
        }
        self.held = true;
        cx.waker().wake_by_ref();
        true
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Gathered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Gathered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.hold(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.hold(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.held = false;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    };

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    static OTHERS: AtomicUsize = AtomicUsize::new(0);

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct CountWakes(AtomicUsize);

    impl std::task::Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn others() -> usize {
        OTHERS.load(Ordering::Relaxed)
    }

    fn gathered<S>(inner: S) -> Gathered<S> {
        Gathered {
            inner,
            held: false,
            senders: others,
        }
    }

    /// A write waits one turn while calls may send, and only one; a flush ends the round; with
    /// nobody about to send it goes at once. What is written arrives whole and in order.
    #[tokio::test]
    async fn a_write_waits_one_turn_while_others_may_send() {
        let (near, mut far) = tokio::io::duplex(1 << 16);
        let mut near = gathered(near);
        let wakes = Arc::new(CountWakes::default());
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);

        OTHERS.store(0, Ordering::Relaxed);
        let first = Pin::new(&mut near).poll_write(&mut cx, b"a");
        assert!(matches!(first, Poll::Ready(Ok(1))), "{first:?}");

        OTHERS.store(3, Ordering::Relaxed);
        assert!(Pin::new(&mut near).poll_write(&mut cx, b"b").is_pending());
        // The held write asked to be polled again, or it would wait for good.
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1);
        let second = Pin::new(&mut near).poll_write(&mut cx, b"bc");
        assert!(matches!(second, Poll::Ready(Ok(2))), "{second:?}");
        // Still the same round: no second wait before the flush.
        let third = Pin::new(&mut near).poll_write(&mut cx, b"d");
        assert!(matches!(third, Poll::Ready(Ok(1))), "{third:?}");
        assert!(Pin::new(&mut near).poll_flush(&mut cx).is_ready());
        // A new round waits again.
        assert!(Pin::new(&mut near).poll_write(&mut cx, b"e").is_pending());

        // Through the async API the held write wakes its task and completes.
        near.write_all(b"ef").await.expect("written");
        near.flush().await.expect("flushed");
        OTHERS.store(0, Ordering::Relaxed);
        let mut got = [0u8; 6];
        far.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"abcdef");
        // Reads pass through.
        far.write_all(b"+OK\r\n").await.expect("written");
        let mut reply = [0u8; 5];
        near.read_exact(&mut reply).await.expect("read");
        assert_eq!(&reply, b"+OK\r\n");
    }
}
