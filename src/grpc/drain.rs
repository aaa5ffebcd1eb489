//! Ends the open streams of services that have no end of their own when Baton shuts down.
//!
//! Health's `Watch` and reflection's `ServerReflectionInfo` last as long as their client keeps
//! them, and the server's graceful shutdown waits for every open stream: one health watcher (as
//! gRPC's client-side health checking keeps on every connection) held every shutdown until the
//! drain deadline. [`EndAtShutdown`] wraps such a service so that, once shutdown begins, each of
//! its response streams ends with `UNAVAILABLE` ("Baton is shutting down"), after the frames it
//! already had ready, and its request streams end as if the client had closed them (so that a
//! handler still reading one lets the stream go). Baton's own streams end themselves (a `Hold`
//! says `lost` and releases).
//!
//! [`TrackCalls`] keeps every call in a [`TaskTracker`] until its answer is sent, so that the
//! drain knows when every call is answered: past that, a connection that has not closed waits
//! only for a client that no longer answers (it never acknowledges the server's goodbye), and the
//! drain does not wait for it.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio_util::{
    sync::{CancellationToken, WaitForCancellationFutureOwned},
    task::{TaskTracker, task_tracker::TaskTrackerToken},
};
use tonic::{Status, server::NamedService};
use tower_layer::Layer;
use tower_service::Service;

/// The message of the status that ends a stream at shutdown.
const MESSAGE: &str = "Baton is shutting down";

/// A service whose response streams end when `shutdown` is cancelled.
#[derive(Clone)]
pub struct EndAtShutdown<S> {
    inner: S,
    shutdown: CancellationToken,
}

impl<S> EndAtShutdown<S> {
    /// Wraps `inner`, ending its streams once `shutdown` is cancelled.
    pub fn new(inner: S, shutdown: CancellationToken) -> Self {
        Self { inner, shutdown }
    }
}

impl<S: NamedService> NamedService for EndAtShutdown<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<tonic::body::Body>> for EndAtShutdown<S>
where
    S: Service<http::Request<tonic::body::Body>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future =
        Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let shutdown = self.shutdown.clone();
        // The client's side ends too, so that a handler reading it (reflection's) finishes and
        // lets the stream go.
        let request = request.map(|body| {
            tonic::body::Body::new(Ending {
                body,
                stop: Box::pin(shutdown.clone().cancelled_owned()),
                ended: false,
                status: false,
                seen: false,
            })
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| {
                tonic::body::Body::new(Ending {
                    body,
                    stop: Box::pin(shutdown.cancelled_owned()),
                    ended: false,
                    status: true,
                    seen: false,
                })
            }))
        })
    }
}

/// A body that ends once its `stop` resolves: a response's with `UNAVAILABLE` trailers
/// (`status`), a request's as if the client had closed its side, though only after its first
/// frame, so that a call arriving during the drain (a health check) is read whole.
struct Ending {
    body: tonic::body::Body,
    stop: Pin<Box<WaitForCancellationFutureOwned>>,
    ended: bool,
    status: bool,
    /// A frame has been passed on.
    seen: bool,
}

impl Body for Ending {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(cx) {
            match frame {
                None => self.ended = true,
                Some(_) => self.seen = true,
            }
            return Poll::Ready(frame);
        }
        if (!self.status && !self.seen) || self.stop.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.ended = true;
        if !self.status {
            return Poll::Ready(None);
        }
        let mut trailers = http::HeaderMap::new();
        Status::unavailable(MESSAGE)
            .add_header(&mut trailers)
            .map_err(|_| Status::internal("encoding the shutdown status"))?;
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The layer keeping each call in a [`TaskTracker`] until its answer is sent (its response body
/// ended or dropped).
#[derive(Clone, Debug)]
pub struct TrackCalls(TaskTracker);

impl TrackCalls {
    /// Tracks calls in `calls`.
    pub fn new(calls: TaskTracker) -> Self {
        Self(calls)
    }
}

impl<S> Layer<S> for TrackCalls {
    type Service = Tracked<S>;

    fn layer(&self, inner: S) -> Tracked<S> {
        Tracked {
            inner,
            calls: self.0.clone(),
        }
    }
}

/// The service [`TrackCalls`] wraps around the router.
#[derive(Clone, Debug)]
pub struct Tracked<S> {
    inner: S,
    calls: TaskTracker,
}

impl<S, B, RB> Service<http::Request<B>> for Tracked<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = http::Response<Counted<RB>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        TrackedFuture {
            token: Some(self.calls.token()),
            inner: self.inner.call(request),
        }
    }
}

pin_project! {
    /// The response future of a tracked call, handing its place in the tracker to the body.
    pub struct TrackedFuture<F> {
        #[pin]
        inner: F,
        token: Option<TaskTrackerToken>,
    }
}

impl<F, RB, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = Result<http::Response<Counted<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx));
        let token = this.token.take();
        Poll::Ready(response.map(|response| {
            response.map(|body| Counted {
                body,
                _token: token,
            })
        }))
    }
}

pin_project! {
    /// A response body holding its call's place in the tracker until it is dropped.
    pub struct Counted<B> {
        #[pin]
        body: B,
        _token: Option<TaskTrackerToken>,
    }
}

impl<B: Body> Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
