//! The connections the gRPC listeners accept: at most `--max-connections` open at once (past it,
//! new ones wait in the kernel's backlog until one closes), TLS handshakes on the TCP listener
//! when configured, and a bound on how long a new connection may take to begin: its TLS
//! handshake, then its HTTP/2 preface, must each arrive within `--handshake-timeout`, so a
//! client that connects and says nothing does not hold a connection for ever.

use std::{
    io,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream, UnixListener, UnixStream},
    sync::{OwnedSemaphorePermit, Semaphore, mpsc},
    time::{Instant, Sleep},
};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::tls::{Tls, handshake_failure};

/// Bytes of the HTTP/2 connection preface a client sends first.
const PREFACE_LEN: usize = 24;
/// Connections accepted but not yet taken by the server.
const QUEUE: usize = 64;
/// Pause after an accept error (such as too many open files) before accepting again.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// What every accepted connection is held to.
#[derive(Clone)]
pub struct Admission {
    connections: Arc<Semaphore>,
    max_connections: usize,
    handshake_timeout: Duration,
}

impl Admission {
    /// At most `max_connections` open at once (over every listener given this admission), each
    /// beginning within `handshake_timeout`.
    pub fn new(max_connections: usize, handshake_timeout: Duration) -> Self {
        Self {
            connections: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            handshake_timeout,
        }
    }
}

/// At most one log line a second for events a client can cause at will.
struct Throttle {
    last: AtomicU64,
}

impl Throttle {
    const fn new() -> Self {
        Self {
            last: AtomicU64::new(0),
        }
    }

    fn allow(&self) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.last.swap(now, Ordering::Relaxed) != now
    }
}

static ACCEPT_ERRORS: Throttle = Throttle::new();
static HANDSHAKE_FAILURES: Throttle = Throttle::new();
static AT_LIMIT: Throttle = Throttle::new();

/// A TCP connection, in the clear or over TLS.
pub enum TcpConn {
    /// In the clear.
    Plain(TcpStream),
    /// Over TLS, its handshake done.
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// An accepted connection: it holds its place among the open connections until dropped, and
/// fails its reads if the HTTP/2 preface does not arrive in time.
pub struct Conn<IO> {
    io: IO,
    /// Why the client's certificate was refused (mutual TLS), if it was.
    refused: Option<Arc<str>>,
    _place: OwnedSemaphorePermit,
    /// Until the preface has arrived: its deadline and the bytes still awaited.
    preface: Option<(Pin<Box<Sleep>>, usize)>,
    timeout: Duration,
}

impl<IO> Conn<IO> {
    fn new(io: IO, place: OwnedSemaphorePermit, timeout: Duration) -> Self {
        Self {
            io,
            refused: None,
            _place: place,
            preface: Some((
                Box::pin(tokio::time::sleep_until(Instant::now() + timeout)),
                PREFACE_LEN,
            )),
            timeout,
        }
    }
}

impl<IO> Conn<IO> {
    /// Why the client's certificate was refused (mutual TLS), if it was: every call on the
    /// connection is then refused with it.
    pub fn refused(&self) -> Option<Arc<str>> {
        self.refused.clone()
    }
}

/// Waits for a place among the open connections, then accepts one; `None` on shutdown.
async fn next_place(
    admission: &Admission,
    shutdown: &CancellationToken,
) -> Option<OwnedSemaphorePermit> {
    if admission.connections.available_permits() == 0 && AT_LIMIT.allow() {
        tracing::warn!(
            max = admission.max_connections,
            "at the most connections allowed (--max-connections); new ones wait until one closes"
        );
    }
    tokio::select! {
        () = shutdown.cancelled() => None,
        place = admission.connections.clone().acquire_owned() => place.ok(),
    }
}

/// A listener, for [`accept_loop`].
trait Accept: Send + 'static {
    /// The accepted socket.
    type Raw: Send + 'static;
    /// The next connection.
    fn accept(&self) -> impl std::future::Future<Output = io::Result<Self::Raw>> + Send;
}

impl Accept for TcpListener {
    type Raw = TcpStream;
    async fn accept(&self) -> io::Result<TcpStream> {
        let (stream, _) = TcpListener::accept(self).await?;
        // Small answers go out at once rather than waiting for more to send.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

impl Accept for UnixListener {
    type Raw = UnixStream;
    async fn accept(&self) -> io::Result<UnixStream> {
        UnixListener::accept(self).await.map(|(stream, _)| stream)
    }
}

/// Accepts until `shutdown` or until the stream of connections is dropped; `begin` makes each
/// accepted socket a connection (a TLS handshake) in a task of its own and sends it on.
async fn accept_loop<L, C, F, Fut>(
    listener: L,
    admission: Admission,
    shutdown: CancellationToken,
    tx: mpsc::Sender<io::Result<Conn<C>>>,
    mut begin: F,
) where
    L: Accept,
    C: Send + 'static,
    F: FnMut(L::Raw, OwnedSemaphorePermit, mpsc::Sender<io::Result<Conn<C>>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    loop {
        let Some(place) = next_place(&admission, &shutdown).await else {
            return;
        };
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            () = tx.closed() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok(raw) => {
                tokio::spawn(begin(raw, place, tx.clone()));
            }
            Err(e) => {
                if ACCEPT_ERRORS.allow() {
                    tracing::warn!(error = %e, "accepting a connection failed");
                }
                drop(place);
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                }
            }
        }
    }
}

/// The connections of the TCP listener, over TLS when `tls` is set, as a stream for tonic.
pub fn tcp(
    listener: TcpListener,
    tls: Option<Tls>,
    admission: Admission,
    shutdown: CancellationToken,
) -> ReceiverStream<io::Result<Conn<TcpConn>>> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let timeout = admission.handshake_timeout;
    tokio::spawn(accept_loop(
        listener,
        admission,
        shutdown,
        tx,
        move |stream: TcpStream, place, tx| {
            let tls = tls.clone();
            async move {
                let (conn, refused) = match tls {
                    None => (TcpConn::Plain(stream), None),
                    Some(tls) => match handshake(&tls, stream, timeout).await {
                        Some((tls_stream, refused)) => {
                            (TcpConn::Tls(Box::new(tls_stream)), refused)
                        }
                        None => return,
                    },
                };
                let mut conn = Conn::new(conn, place, timeout);
                conn.refused = refused;
                let _ = tx.send(Ok(conn)).await;
            }
        },
    ));
    ReceiverStream::new(rx)
}

/// The connections of the Unix socket listener, as a stream for tonic.
pub fn unix(
    listener: UnixListener,
    admission: Admission,
    shutdown: CancellationToken,
) -> ReceiverStream<io::Result<Conn<UnixStream>>> {
    let (tx, rx) = mpsc::channel(QUEUE);
    let timeout = admission.handshake_timeout;
    tokio::spawn(accept_loop(
        listener,
        admission,
        shutdown,
        tx,
        move |stream: UnixStream, place, tx| async move {
            let _ = tx.send(Ok(Conn::new(stream, place, timeout))).await;
        },
    ));
    ReceiverStream::new(rx)
}

/// The TLS handshake of `stream`, within `timeout`, and with mutual TLS the check of the
/// client's certificate: `None` (logged) when the handshake fails; otherwise the stream and why
/// the certificate was refused, if it was (logged too).
async fn handshake(
    tls: &Tls,
    stream: TcpStream,
    timeout: Duration,
) -> Option<(tokio_rustls::server::TlsStream<TcpStream>, Option<Arc<str>>)> {
    let peer = stream.peer_addr().ok();
    let (acceptor, verifier) = tls.acceptor()?;
    let failure = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            let refused =
                verifier.and_then(|v| v.check(stream.get_ref().1.peer_certificates()).err());
            if let Some(why) = &refused
                && HANDSHAKE_FAILURES.allow()
            {
                tracing::info!(peer = ?peer, why = %why, "refusing every call of a connection (at most one such line a second)");
            }
            return Some((stream, refused.map(Arc::from)));
        }
        Ok(Err(e)) => handshake_failure(&e),
        Err(_) => format!(
            "the TLS handshake did not complete within {} (--handshake-timeout)",
            humantime::format_duration(timeout)
        ),
    };
    if HANDSHAKE_FAILURES.allow() {
        tracing::info!(peer = ?peer, why = %failure, "refused a connection (at most one such line a second)");
    }
    None
}

impl AsyncRead for TcpConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for TcpConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Conn<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some((deadline, _)) = &mut this.preface
            && deadline.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client sent no HTTP/2 preface within {} (--handshake-timeout)",
                    humantime::format_duration(this.timeout)
                ),
            )));
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some((_, left))) = (&read, &mut this.preface) {
            *left = left.saturating_sub(buf.filled().len() - before);
            if *left == 0 {
                this.preface = None;
            }
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Conn<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
