//! The client connections Baton serves: each records when it last received anything
//! ([`Watched`]), so that keepalive streams can tell a client that stopped answering from one that
//! is merely quiet; handlers read it from the request ([`liveness`]). A connection whose client
//! certificate was refused (mutual TLS) carries why, for [`crate::security::guard`].

use std::{
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

use crate::lease::Liveness;

/// What Baton attaches to every request about the connection it came on.
#[derive(Debug, Clone)]
pub struct ClientConn {
    /// When the connection last received anything from the client.
    pub liveness: Liveness,
    /// Why the client's TLS certificate was refused (mutual TLS), if it was: every call on the
    /// connection fails `UNAUTHENTICATED` with it.
    pub refused: Option<Arc<str>>,
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
/// a frame of a stream, an answer to one of the server's HTTP/2 pings.
pub struct Watched<IO> {
    io: IO,
    liveness: Liveness,
    refused: Option<Arc<str>>,
}

impl<IO> Watched<IO> {
    /// Watches `io`, heard from now.
    pub fn new(io: IO) -> Self {
        Self {
            io,
            liveness: Liveness::new(),
            refused: None,
        }
    }

    /// Watches `io`, whose client certificate was refused for `refused` if given.
    pub fn refusing(io: IO, refused: Option<Arc<str>>) -> Self {
        Self {
            refused,
            ..Self::new(io)
        }
    }
}

impl<IO> Connected for Watched<IO> {
    type ConnectInfo = ClientConn;

    fn connect_info(&self) -> ClientConn {
        ClientConn {
            liveness: self.liveness.clone(),
            refused: self.refused.clone(),
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
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
