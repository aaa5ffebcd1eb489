//! The caller's deadline answered as `DEADLINE_EXCEEDED`. A call whose `grpc-timeout` passes
//! before its handler answers is ended by the transport with `CANCELLED` ("Timeout expired"),
//! a code that says the caller cancelled; clients retry `DEADLINE_EXCEEDED` (whose reply may be
//! lost) and not `CANCELLED`. This layer times the same deadline from a moment earlier and is
//! polled first, so it answers before the transport would, with the code the gRPC status codes
//! give a deadline. Only the wait for the response's head is timed, as the transport does: a
//! stream once answered runs on. A handler dropped here is dropped as it would have been there
//! (see [`super::unary`] for what a grant racing it becomes).

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tonic::{Status, body::Body};
use tower_layer::Layer;
use tower_service::Service;

use super::wire::grpc_timeout;

/// The layer (see the module documentation).
#[derive(Clone, Copy, Debug, Default)]
pub struct Deadline;

impl<S> Layer<S> for Deadline {
    type Service = Deadlined<S>;

    fn layer(&self, inner: S) -> Deadlined<S> {
        Deadlined { inner }
    }
}

/// The service [`Deadline`] wraps around the router.
#[derive(Clone, Debug)]
pub struct Deadlined<S> {
    inner: S,
}

impl<S, B> Service<Request<B>> for Deadlined<S>
where
    S: Service<Request<B>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = DeadlineFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Read, and the timer started, before the transport starts its own for the same header.
        let timeout = request
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(grpc_timeout);
        let sleep = timeout.map(tokio::time::sleep);
        DeadlineFuture {
            inner: self.inner.call(request),
            sleep,
            timeout,
        }
    }
}

pin_project! {
    /// The future of a call with its deadline.
    pub struct DeadlineFuture<F> {
        #[pin]
        inner: F,
        #[pin]
        sleep: Option<Sleep>,
        timeout: Option<Duration>,
    }
}

impl<F, E> Future for DeadlineFuture<F>
where
    F: Future<Output = Result<Response<Body>, E>>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let ready @ Poll::Ready(_) = this.inner.poll(cx) {
            return ready;
        }
        match this.sleep.as_pin_mut() {
            Some(sleep) => {
                std::task::ready!(sleep.poll(cx));
                let timeout = this.timeout.unwrap_or_default();
                Poll::Ready(Ok(Status::deadline_exceeded(format!(
                    "the call's deadline ({timeout:?} from its start, its grpc-timeout) passed \
                     before Baton answered"
                ))
                .into_http()))
            }
            None => Poll::Pending,
        }
    }
}
