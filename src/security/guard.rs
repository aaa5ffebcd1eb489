//! The tower layer every gRPC call of the API listeners passes first: the client certificate
//! (with mutual TLS, a connection whose certificate was refused gets `UNAUTHENTICATED` for every
//! call, health's too), the API token check (`UNAUTHENTICATED` without a valid one; health is
//! exempt), then the bound on lease streams
//! open at once (`RESOURCE_EXHAUSTED` past it). A lease stream holds its place until its response
//! body is dropped: when it ends, or when its client goes away.

use std::{
    collections::HashSet,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::{HeaderName, Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Status, body::Body};
use tower_layer::Layer;
use tower_service::Service;

use super::token::ApiToken;
use crate::grpc::conn::ClientConn;

/// The services callable without the API token: probes must work without it.
const OPEN_PREFIXES: &[&str] = &["/grpc.health.v1.Health/"];

const AUTHORIZATION: HeaderName = HeaderName::from_static("authorization");

/// The streams of leases and of elections, which live as long as their client wants: the ones
/// counted against the lease stream bound.
pub const LEASE_STREAMS: &[&str] = &[
    "/baton.v1.LockService/Hold",
    "/baton.v1.LockService/KeepAlive",
    "/baton.v1.SemaphoreService/Hold",
    "/baton.v1.SemaphoreService/KeepAlive",
    "/baton.v1.ElectionService/Campaign",
    "/baton.v1.ElectionService/Observe",
];

/// The checks of [`Guard`], shared by every connection.
struct Checks {
    token: Option<ApiToken>,
    streams: Arc<Semaphore>,
    max_streams: usize,
    lease_paths: HashSet<&'static str>,
}

/// The layer (see the module documentation). Cheap to clone.
#[derive(Clone)]
pub struct Guard {
    checks: Arc<Checks>,
}

impl Guard {
    /// Checks `token` (if any) on every call but health's, and allows at most `max_streams`
    /// lease streams open at once.
    pub fn new(token: Option<ApiToken>, max_streams: usize) -> Self {
        Self {
            checks: Arc::new(Checks {
                token,
                streams: Arc::new(Semaphore::new(max_streams)),
                max_streams,
                lease_paths: LEASE_STREAMS.iter().copied().collect(),
            }),
        }
    }

    /// How many lease streams are open.
    pub fn open_streams(&self) -> usize {
        self.checks.max_streams - self.checks.streams.available_permits()
    }
}

impl<S> Layer<S> for Guard {
    type Service = Guarded<S>;

    fn layer(&self, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            checks: self.checks.clone(),
        }
    }
}

/// The service [`Guard`] wraps around the router.
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    checks: Arc<Checks>,
}

impl Checks {
    /// `Err` with the refusal's status, or `Ok` with the lease stream's place if it is one.
    fn admit<B>(&self, request: &Request<B>) -> Result<Option<OwnedSemaphorePermit>, Status> {
        let path = request.uri().path();
        if let Some(why) = request
            .extensions()
            .get::<ClientConn>()
            .and_then(|c| c.refused.as_deref())
        {
            return Err(Status::unauthenticated(why));
        }
        if let Some(token) = &self.token
            && !OPEN_PREFIXES.iter().any(|p| path.starts_with(p))
        {
            let values = request.headers().get_all(AUTHORIZATION);
            token
                .check(values.iter().map(|v| v.as_bytes()))
                .map_err(|refusal| Status::unauthenticated(refusal.message()))?;
        }
        if !self.lease_paths.contains(path) {
            return Ok(None);
        }
        match self.streams.clone().try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(_) => Err(Status::resource_exhausted(format!(
                "Baton serves at most {} lease and election streams at once (--max-lease-streams) \
                 and that many are open; retry later or end streams no longer needed",
                self.max_streams
            ))),
        }
    }
}

impl<S, B> Service<Request<B>> for Guarded<S>
where
    S: Service<Request<B>, Response = Response<Body>>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = GuardFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        match self.checks.admit(&request) {
            Ok(permit) => GuardFuture {
                state: State::Admitted {
                    inner: self.inner.call(request),
                    permit,
                },
            },
            Err(status) => GuardFuture {
                state: State::Refused {
                    response: Some(status.into_http()),
                },
            },
        }
    }
}

pin_project! {
    /// The future of a guarded call.
    pub struct GuardFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // Passed on, holding its lease stream's place if it is one.
        Admitted {
            #[pin]
            inner: F,
            permit: Option<OwnedSemaphorePermit>,
        },
        // Refused with this answer.
        Refused { response: Option<Response<Body>> },
    }
}

impl<F, E> Future for GuardFuture<F>
where
    F: Future<Output = Result<Response<Body>, E>>,
{
    type Output = Result<Response<Body>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Refused { response } => Poll::Ready(Ok(response
                .take()
                .unwrap_or_else(|| Status::internal("polled after completion").into_http()))),
            StateProj::Admitted { inner, permit } => {
                let response = std::task::ready!(inner.poll(cx))?;
                Poll::Ready(Ok(match permit.take() {
                    None => response,
                    Some(permit) => response.map(|body| {
                        Body::new(Placed {
                            inner: body,
                            _permit: permit,
                        })
                    }),
                }))
            }
        }
    }
}

pin_project! {
    /// A lease stream's body, holding its place until it is dropped.
    struct Placed {
        #[pin]
        inner: Body,
        _permit: OwnedSemaphorePermit,
    }
}

impl HttpBody for Placed {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    /// The lease streams are exactly the server-streaming methods of Baton's services: a new
    /// stream cannot escape the bound.
    #[test]
    fn every_baton_stream_is_counted() {
        let set = prost_types::FileDescriptorSet::decode(crate::proto::FILE_DESCRIPTOR_SET)
            .expect("the descriptor set decodes");
        let mut streams: Vec<String> = set
            .file
            .iter()
            .filter(|f| f.package() == "baton.v1")
            .flat_map(|f| {
                f.service.iter().flat_map(move |s| {
                    s.method
                        .iter()
                        .filter(|m| m.server_streaming())
                        .map(move |m| format!("/{}.{}/{}", f.package(), s.name(), m.name()))
                })
            })
            .collect();
        streams.sort();
        let mut counted: Vec<String> = super::LEASE_STREAMS.iter().map(|s| s.to_string()).collect();
        counted.sort();
        assert_eq!(streams, counted);
    }
}
