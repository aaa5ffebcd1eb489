//! The one tower layer around the gRPC router that counts every call: calls by service, method
//! and status code, their durations, and the calls and streams in flight. It also logs each call
//! that fails with a server-side cause, and gives a call that carries a W3C `traceparent` a span
//! with its trace id, so that every log line of that call names it.
//!
//! A call's status is read where gRPC puts it: in the response headers of a "trailers-only"
//! answer (most errors), otherwise in the trailers that end the response body (a unary answer,
//! or the end of a stream). A call whose client leaves before either counts as `CANCELLED`; one
//! whose deadline passes is answered `DEADLINE_EXCEEDED` by [`crate::grpc::deadline`], inside
//! this layer, and counted so unless the client's own timer reset it first. The
//! status is recorded before the frame that carries it is handed to the transport, so a client
//! that has read a status and then scrapes `/metrics` finds its call counted.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, ready},
    time::Instant,
};

use http::{HeaderMap, HeaderName, Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Span;

use super::{MethodMetrics, method_metrics};

/// gRPC status code names, by number: the values of the `code` label.
pub const CODES: [&str; 18] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
    // Anything else a response could carry.
    "OTHER",
];
const CANCELLED: usize = 1;
const UNKNOWN: usize = 2;
/// How tonic's status for a request whose body the transport failed to read begins.
const BROKEN_REQUEST: &str = "h2 protocol error";
const OTHER: usize = CODES.len() - 1;

/// Whether calls ending with `code` failed for a cause on Baton's side (or Redis's), which the
/// log reports; the others are the caller's doing (bad input, a state it must handle, leaving).
fn server_side(code: usize) -> bool {
    matches!(
        CODES[code],
        "UNKNOWN" | "DEADLINE_EXCEEDED" | "INTERNAL" | "UNAVAILABLE" | "DATA_LOSS"
    )
}

/// The header of a gRPC status, parsed once.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// The W3C trace context header, parsed once.
const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// Longest `traceparent` header read; a longer one is ignored.
const MAX_TRACEPARENT_BYTES: usize = 512;

/// The trace id of a W3C `traceparent` header (`VERSION-TRACEID-PARENTID-FLAGS`, lowercase hex),
/// when it is well formed and not all zeros.
pub fn trace_id(traceparent: &[u8]) -> Option<&str> {
    if traceparent.len() > MAX_TRACEPARENT_BYTES {
        return None;
    }
    let text = std::str::from_utf8(traceparent).ok()?;
    let mut parts = text.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let valid = hex(version, 2)
        && version != "ff"
        && hex(trace, 32)
        && trace.bytes().any(|b| b != b'0')
        && hex(parent, 16)
        && hex(flags, 2)
        // Version 00 has exactly four parts; later versions may add more.
        && (version != "00" || parts.next().is_none());
    valid.then_some(trace)
}

/// The code of a `grpc-status` header value.
fn code_of(value: &[u8]) -> usize {
    match value {
        b"0" => 0,
        _ => std::str::from_utf8(value)
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|c| *c < OTHER)
            .unwrap_or(OTHER),
    }
}

/// The methods a layer knows, by path; every other path is counted as `unknown`.
struct Methods {
    by_path: HashMap<String, Arc<MethodMetrics>>,
    unknown: Arc<MethodMetrics>,
}

/// Counts the calls of the service it wraps (see the module documentation). Cheap to clone.
#[derive(Clone)]
pub struct RpcLayer {
    methods: Arc<Methods>,
}

impl RpcLayer {
    /// A layer for the methods at `paths` (`/package.Service/Method`); calls to any other path
    /// are counted under the service and method `unknown`, so the labels stay a fixed set.
    pub fn new<'a>(paths: impl IntoIterator<Item = &'a str>) -> Self {
        let by_path = paths
            .into_iter()
            .filter_map(|path| {
                let (service, method) = path.strip_prefix('/')?.split_once('/')?;
                Some((path.to_owned(), method_metrics(service, method)))
            })
            .collect();
        Self {
            methods: Arc::new(Methods {
                by_path,
                unknown: method_metrics("unknown", "unknown"),
            }),
        }
    }
}

impl<S> Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> RpcService<S> {
        RpcService {
            inner,
            methods: self.methods.clone(),
        }
    }
}

/// The service [`RpcLayer`] wraps around the router.
#[derive(Clone)]
pub struct RpcService<S> {
    inner: S,
    methods: Arc<Methods>,
}

impl<S, B, RB> Service<Request<B>> for RpcService<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
{
    type Response = Response<RpcBody<RB>>;
    type Error = S::Error;
    type Future = RpcFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let metrics = self
            .methods
            .by_path
            .get(request.uri().path())
            .unwrap_or(&self.methods.unknown)
            .clone();
        // A span only for traced calls: the others pay nothing for it.
        let span = request
            .headers()
            .get(TRACEPARENT)
            .and_then(|v| trace_id(v.as_bytes()))
            .map(|trace_id| {
                let (service, method) = metrics.names();
                tracing::info_span!("rpc", trace_id, service, method)
            });
        let call = Call::start(metrics, span.clone());
        let inner = match &span {
            Some(span) => span.in_scope(|| self.inner.call(request)),
            None => self.inner.call(request),
        };
        RpcFuture {
            inner,
            call: Some(call),
            span,
        }
    }
}

pin_project! {
    /// The response future of a counted call: runs in the call's span, if it has one.
    pub struct RpcFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
        span: Option<Span>,
    }
}

impl<F, RB, E> Future for RpcFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<RpcBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _entered = this.span.as_ref().map(Span::enter);
        let outcome = ready!(this.inner.poll(cx));
        let mut call = this.call.take();
        Poll::Ready(outcome.map(|response| {
            // A trailers-only answer carries its status in the headers, and its body is empty.
            if let Some(status) = response.headers().get(GRPC_STATUS)
                && let Some(mut call) = call.take()
            {
                call.finish(code_of(status.as_bytes()), Some(response.headers()));
            }
            response.map(|inner| RpcBody { inner, call })
        }))
    }
}

pin_project! {
    /// The response body of a counted call: records the status found in its trailers.
    pub struct RpcBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }
}

impl<B: Body> Body for RpcBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let Some(mut call) = this.call.take() {
            match &frame {
                Some(Ok(frame)) => match frame.trailers_ref() {
                    Some(trailers) => {
                        let code = trailers
                            .get("grpc-status")
                            .map_or(UNKNOWN, |v| code_of(v.as_bytes()));
                        call.finish(code, Some(trailers));
                    }
                    None => *this.call = Some(call),
                },
                // The body failed: the client sees the stream reset.
                Some(Err(_)) => call.finish(UNKNOWN, None),
                // Ended without a status.
                None => call.finish(UNKNOWN, None),
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One call being counted; counted as `CANCELLED` if dropped before its status was seen.
pub struct Call {
    metrics: Arc<MethodMetrics>,
    started: Instant,
    done: bool,
    /// The span of a traced call, which its failure's log line is written in.
    span: Option<Span>,
}

impl Call {
    fn start(metrics: Arc<MethodMetrics>, span: Option<Span>) -> Self {
        metrics.started();
        Self {
            metrics,
            started: Instant::now(),
            done: false,
            span,
        }
    }

    /// Records the call's end with `code`; `headers` (the trailers, or a trailers-only answer's
    /// headers) give the message of a failure.
    fn finish(&mut self, code: usize, headers: Option<&HeaderMap>) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let took = self.started.elapsed();
        let message = headers
            .and_then(tonic::Status::from_header_map)
            .map(|s| s.message().to_owned())
            .unwrap_or_default();
        // tonic answers UNKNOWN when the request's body could not be read because the client's
        // connection broke under it: the caller left, as a reset stream says.
        let code = if code == UNKNOWN && message.starts_with(BROKEN_REQUEST) {
            CANCELLED
        } else {
            code
        };
        self.metrics.ended(code, took);
        if server_side(code) {
            let _entered = self.span.as_ref().map(Span::enter);
            let (service, method) = self.metrics.names();
            let duration_ms = took.as_secs_f64() * 1000.0;
            if matches!(CODES[code], "UNAVAILABLE" | "DEADLINE_EXCEEDED") {
                tracing::warn!(service, method, code = CODES[code], duration_ms, error = %message, "call failed");
            } else {
                tracing::error!(service, method, code = CODES[code], duration_ms, error = %message, "call failed");
            }
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(CANCELLED, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Well-formed `traceparent` headers give their trace id; malformed ones give none.
    #[test]
    fn traceparent_is_checked() {
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        assert_eq!(
            trace_id(format!("00-{id}-00f067aa0ba902b7-01").as_bytes()),
            Some(id)
        );
        assert_eq!(
            trace_id(format!("01-{id}-00f067aa0ba902b7-01-extra").as_bytes()),
            Some(id)
        );
        for bad in [
            format!("00-{id}-00f067aa0ba902b7-01-extra"),
            format!("ff-{id}-00f067aa0ba902b7-01"),
            format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32)),
            format!("00-{}-00f067aa0ba902b7-01", id.to_uppercase()),
            "00-abc-def-01".to_owned(),
            String::new(),
            "x".repeat(2000),
        ] {
            assert_eq!(trace_id(bad.as_bytes()), None, "{bad}");
        }
    }

    /// Status codes map to their names; anything else is OTHER.
    #[test]
    fn status_codes_are_bounded() {
        assert_eq!(CODES[code_of(b"0")], "OK");
        assert_eq!(CODES[code_of(b"14")], "UNAVAILABLE");
        assert_eq!(CODES[code_of(b"16")], "UNAUTHENTICATED");
        assert_eq!(CODES[code_of(b"17")], "OTHER");
        assert_eq!(CODES[code_of(b"nope")], "OTHER");
    }
}
