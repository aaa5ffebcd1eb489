//! The client connections Baton serves: each records when it last received anything
//! ([`Watched`]), so that keepalive streams can tell a client that stopped answering from one that
//! is merely quiet; handlers read it from the request ([`liveness`]). A connection whose client
//! certificate was refused (mutual TLS) carries why, for [`crate::security::guard`]. Each also
//! sends the answers of calls that finish together in one write ([`Coalesced`]), knowing from
//! [`CountCalls`] how many of its calls are still at work: being answered, and not parked waiting
//! for other clients ([`crate::activity`]).

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use http::Request;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;
use tower_layer::Layer;
use tower_service::Service;

use crate::{activity, lease::Liveness};

/// What Baton attaches to every request about the connection it came on.
#[derive(Debug, Clone)]
pub struct ClientConn {
    /// When the connection last received anything from the client.
    pub liveness: Liveness,
    /// Why the client's TLS certificate was refused (mutual TLS), if it was: every call on the
    /// connection fails `UNAUTHENTICATED` with it.
    pub refused: Option<Arc<str>>,
    /// How many calls of the connection are at work (counted by [`CountCalls`]).
    pub answering: Arc<AtomicUsize>,
}

/// The liveness of the connection `request` came on (absent for requests that did not come
/// through Baton's own listeners).
pub fn liveness<T>(request: &tonic::Request<T>) -> Option<Liveness> {
    request
        .extensions()
        .get::<ClientConn>()
        .map(|conn| conn.liveness.clone())
}

/// A client connection that records in its [`Liveness`] every time it receives bytes: a request,
/// a frame of a stream, an answer to one of the server's HTTP/2 pings. Its writes are
/// [`Coalesced`].
pub struct Watched<IO> {
    io: Coalesced<IO>,
    liveness: Liveness,
    refused: Option<Arc<str>>,
    /// Set once the connection's writes are shut down: it then lingers ([`LINGER`]).
    lingering: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The traffic of every connection of the server.
    traffic: Arc<Traffic>,
}

/// How long a closing connection keeps reading (and discarding) what its client still sends, until
/// the client closes its side: a socket closed while input is unread or still arriving is reset,
/// which drops the answers the kernel had not yet delivered (a slow reader's `lost` events).
pub const LINGER: Duration = Duration::from_secs(10);

/// When any client connection of a server last received bytes or wrote some: the drain closes the
/// connections still open once all have been quiet for a while.
#[derive(Debug)]
pub struct Traffic {
    /// Milliseconds from `epoch` to the last byte received or written.
    last: AtomicU64,
    epoch: tokio::time::Instant,
}

impl Traffic {
    /// Traffic of connections to come, none yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            last: AtomicU64::new(0),
            epoch: tokio::time::Instant::now(),
        })
    }

    /// Notes that a connection received or wrote bytes now.
    fn active(&self) {
        self.last.fetch_max(self.now(), Ordering::Relaxed);
    }

    /// How long every connection has been quiet: none received or wrote a byte.
    pub fn quiet_for(&self) -> Duration {
        Duration::from_millis(self.now().saturating_sub(self.last.load(Ordering::Relaxed)))
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

impl<IO> Watched<IO> {
    /// Watches `io`, heard from now, its bytes counted in `traffic`.
    pub fn new(io: IO, traffic: &Arc<Traffic>) -> Self {
        Self {
            io: Coalesced::new(io, Arc::new(AtomicUsize::new(0))),
            liveness: Liveness::new(),
            refused: None,
            lingering: None,
            traffic: traffic.clone(),
        }
    }

    /// Watches `io`, whose client certificate was refused for `refused` if given.
    pub fn refusing(io: IO, refused: Option<Arc<str>>, traffic: &Arc<Traffic>) -> Self {
        Self {
            refused,
            ..Self::new(io, traffic)
        }
    }
}

impl<IO> Connected for Watched<IO> {
    type ConnectInfo = ClientConn;

    fn connect_info(&self) -> ClientConn {
        ClientConn {
            liveness: self.liveness.clone(),
            refused: self.refused.clone(),
            answering: self.io.answering.clone(),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.liveness.heard();
            self.traffic.active();
        }
        read
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.traffic.active();
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.traffic.active();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    /// Shuts the writes down (after what is buffered), then lingers: reads and discards what the
    /// client still sends until it closes its side, an error, or [`LINGER`].
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.lingering.is_none() {
            ready!(Pin::new(&mut self.io).poll_shutdown(cx))?;
            self.lingering = Some(Box::pin(tokio::time::sleep(LINGER)));
        }
        let mut scratch = [0u8; 1024];
        loop {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.io).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => self.traffic.active(),
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        match self.lingering.as_mut() {
            Some(linger) => linger.as_mut().poll(cx).map(Ok),
            None => Poll::Ready(Ok(())),
        }
    }
}

/// Buffered bytes past which [`Coalesced`] writes them out without waiting for the flush.
const COALESCE_LIMIT: usize = 64 * 1024;

/// The buffer a connection keeps between flushes; a larger one, left by a burst, is freed.
const KEPT_CAPACITY: usize = 8 * 1024;

/// How many other calls of the connection must be at work for an answer to wait for theirs: with
/// a single one, as when a client that was just granted a lock has its next call under way, the
/// answer goes at once (a handoff must not wait a turn for one call that may not answer soon).
pub const GATHER_AT_LEAST: usize = 2;

/// A client connection whose writes wait, once per flush and only while other calls of the
/// same connection are at work, for those that are ready to answer, so that their responses
/// leave in one system call.
///
/// The HTTP/2 connection task writes and flushes as soon as one call has answered. Answers often
/// come in bursts (one read of Redis replies wakes many calls), and each call's task, when it runs,
/// wakes the connection task again: without this every answer costs a `write` of its own. Here,
/// when at least [`GATHER_AT_LEAST`] other calls of the connection are at work (being answered,
/// not parked waiting for another client: [`crate::activity`]), the first flush after a write
/// only schedules the connection task again, behind the tasks already waiting to run; the bytes
/// leave on the next flush, together with whatever those tasks answered meanwhile. The delay is
/// one turn of the scheduler's queue, and no byte waits longer: the deferred flush wakes the task
/// itself. A connection with fewer calls at work (one client alone, a connection per client,
/// lock waiters) writes at once, without copying.
pub struct Coalesced<IO> {
    io: IO,
    /// Bytes accepted and not yet written.
    pending: Vec<u8>,
    /// How many bytes of `pending` were written.
    written: usize,
    /// Whether the current flush already let the other tasks run once.
    deferred: bool,
    /// How many calls of the connection are at work.
    answering: Arc<AtomicUsize>,
}

impl<IO> Coalesced<IO> {
    /// Coalesces the writes to `io` while `answering` counts calls at work.
    pub fn new(io: IO, answering: Arc<AtomicUsize>) -> Self {
        Self {
            io,
            pending: Vec::new(),
            written: 0,
            deferred: false,
            answering,
        }
    }
}

impl<IO: AsyncWrite + Unpin> Coalesced<IO> {
    /// Writes out what is pending; ready once nothing is.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n = ready!(Pin::new(&mut self.io).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        if self.pending.capacity() > KEPT_CAPACITY {
            // A burst's buffer is not kept for the rest of the connection's life.
            self.pending = Vec::new();
        } else {
            self.pending.clear();
        }
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Coalesced<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Coalesced<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.is_empty() && this.answering.load(Ordering::Relaxed) < GATHER_AT_LEAST {
            // No flush of this write will wait: no need to copy it.
            return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        }
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if this.pending.len() + len > COALESCE_LIMIT {
            ready!(this.poll_drain(cx))?;
            if len > COALESCE_LIMIT {
                // Large writes go straight through: copying them would gain nothing.
                return Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
            }
        }
        for b in bufs {
            this.pending.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.pending.is_empty() {
            this.deferred = false;
            return Pin::new(&mut this.io).poll_flush(cx);
        }
        if !this.deferred && this.answering.load(Ordering::Relaxed) >= GATHER_AT_LEAST {
            this.deferred = true;
            // Runs again after the tasks already scheduled, which may answer calls too.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        ready!(this.poll_drain(cx))?;
        this.deferred = false;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

/// Counts, in each request's [`ClientConn`], the calls of a connection whose response is not
/// ready yet, for [`Coalesced`]. A call stops counting when its response (or, for a stream, its
/// headers) is ready, or when it is dropped, and while it is parked waiting for another client
/// (the count is lent to the call's task, [`crate::activity`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct CountCalls;

impl<S> Layer<S> for CountCalls {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted { inner }
    }
}

/// A service whose calls are counted by [`CountCalls`].
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for Counted<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = CountedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let call = request
            .extensions()
            .get::<ClientConn>()
            .map(|conn| activity::Call::start(conn.answering.clone()));
        CountedFuture {
            inner: activity::within(call.as_ref(), self.inner.call(request)),
            call,
        }
    }
}

pin_project! {
    /// The future of a counted call.
    pub struct CountedFuture<F> {
        #[pin]
        inner: activity::Within<F>,
        call: Option<activity::Call>,
    }
}

impl<F: Future> Future for CountedFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let output = ready!(this.inner.poll(cx));
        this.call.take();
        Poll::Ready(output)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::future::poll_fn;

    /// An inner connection that records each write it is asked for.
    #[derive(Default)]
    struct Recorder {
        writes: Vec<Vec<u8>>,
        flushes: usize,
        shut: bool,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.writes.push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.flushes += 1;
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            self.shut = true;
            Poll::Ready(Ok(()))
        }
    }

    fn write(c: &mut Coalesced<Recorder>, cx: &mut Context<'_>, bytes: &[u8]) {
        let n = Pin::new(&mut *c).poll_write(cx, bytes);
        assert!(matches!(n, Poll::Ready(Ok(k)) if k == bytes.len()));
    }

    /// Flushes, asserting that the bytes left without waiting a turn.
    fn flush_at_once(c: &mut Coalesced<Recorder>, cx: &mut Context<'_>) {
        assert!(matches!(
            Pin::new(&mut *c).poll_flush(cx),
            Poll::Ready(Ok(()))
        ));
    }

    fn coalesced(answering: usize) -> Coalesced<Recorder> {
        Coalesced::new(Recorder::default(), Arc::new(AtomicUsize::new(answering)))
    }

    /// While other calls are being answered, writes before a flush leave together, after one
    /// turn of the scheduler, and in order.
    #[tokio::test]
    async fn writes_before_a_flush_leave_in_one_write() {
        let mut c = coalesced(GATHER_AT_LEAST);
        poll_fn(|cx| {
            write(&mut c, cx, b"one ");
            write(&mut c, cx, b"two ");
            // The first flush lets the other tasks run and has the task polled again.
            assert!(Pin::new(&mut c).poll_flush(cx).is_pending());
            assert!(c.io.writes.is_empty());
            write(&mut c, cx, b"three");
            flush_at_once(&mut c, cx);
            Poll::Ready(())
        })
        .await;
        assert_eq!(c.io.writes, vec![b"one two three".to_vec()]);
        assert_eq!(c.io.flushes, 1);
        assert!(c.pending.is_empty());
    }

    /// A burst's buffer is freed once written; a small one is kept for the next answers.
    #[tokio::test]
    async fn a_burst_buffer_is_not_kept() {
        for (size, kept) in [(KEPT_CAPACITY * 2, false), (100, true)] {
            let mut c = coalesced(GATHER_AT_LEAST);
            let bytes = vec![1u8; size];
            poll_fn(|cx| {
                write(&mut c, cx, &bytes);
                assert!(Pin::new(&mut c).poll_flush(cx).is_pending());
                flush_at_once(&mut c, cx);
                Poll::Ready(())
            })
            .await;
            assert_eq!(c.io.writes, vec![bytes.clone()]);
            assert_eq!(c.pending.capacity() > 0, kept, "{size} bytes");
            assert!(c.pending.capacity() <= KEPT_CAPACITY);
        }
    }

    /// With no other call under way, or fewer than [`GATHER_AT_LEAST`], a flush writes at once.
    #[tokio::test]
    async fn a_lone_answer_leaves_at_once() {
        for others in 0..GATHER_AT_LEAST {
            let mut c = coalesced(others);
            poll_fn(|cx| {
                write(&mut c, cx, b"alone");
                flush_at_once(&mut c, cx);
                Poll::Ready(())
            })
            .await;
            assert_eq!(
                c.io.writes,
                vec![b"alone".to_vec()],
                "{others} others at work"
            );
        }
    }

    /// A call parked waiting for another client leaves its connection's count, so the answers of
    /// the others do not wait for it.
    #[tokio::test]
    async fn a_parked_call_does_not_hold_answers_back() {
        let answering = Arc::new(AtomicUsize::new(GATHER_AT_LEAST - 1));
        let mut c = Coalesced::new(Recorder::default(), answering.clone());
        let call = activity::Call::start(answering);
        let parked = activity::within(Some(&call), async { activity::parked() }).await;
        assert!(parked.is_some());
        poll_fn(|cx| {
            write(&mut c, cx, b"granted");
            flush_at_once(&mut c, cx);
            Poll::Ready(())
        })
        .await;
        assert_eq!(c.io.writes, vec![b"granted".to_vec()]);
        drop(parked);
        assert_eq!(c.answering.load(Ordering::Relaxed), GATHER_AT_LEAST);
    }

    /// The deferred flush wakes its task, so no byte waits for another write or flush.
    #[tokio::test]
    async fn a_deferred_flush_completes_by_itself() {
        let mut c = coalesced(3);
        poll_fn(|cx| {
            write(&mut c, cx, b"alone");
            Poll::Ready(())
        })
        .await;
        let flushed = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            poll_fn(|cx| Pin::new(&mut c).poll_flush(cx)),
        )
        .await;
        assert!(matches!(flushed, Ok(Ok(()))), "the flush never completed");
        assert_eq!(c.io.writes, vec![b"alone".to_vec()]);
    }

    /// A write larger than the limit goes straight through, after what was pending; shutting
    /// down writes out what is pending first.
    #[tokio::test]
    async fn large_writes_pass_through_and_shutdown_drains() {
        let mut c = coalesced(GATHER_AT_LEAST);
        let large = vec![7u8; COALESCE_LIMIT + 1];
        poll_fn(|cx| {
            write(&mut c, cx, b"small");
            write(&mut c, cx, &large);
            write(&mut c, cx, b"tail");
            assert!(matches!(
                Pin::new(&mut c).poll_shutdown(cx),
                Poll::Ready(Ok(()))
            ));
            Poll::Ready(())
        })
        .await;
        assert_eq!(
            c.io.writes,
            vec![b"small".to_vec(), large.clone(), b"tail".to_vec()]
        );
        assert!(c.io.shut);
    }
}
