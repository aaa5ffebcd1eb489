//! The `baton.v1.SemaphoreService` gRPC handler: turns requests into [`Semaphores`] calls and
//! results back into responses. Validation errors name the proto field.

use std::{pin::Pin, time::Duration};

use futures::Stream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{
    AcquireRequest, Acquired, MAX_IDEMPOTENCY_KEY_BYTES, MAX_LIMIT, MAX_NAME_BYTES,
    MAX_OWNER_BYTES, MAX_TTL, MAX_WAIT, MIN_KEEPALIVE_TTL, MIN_TTL, MIN_WAIT, Permit, Semaphores,
};
use crate::{
    error::Error,
    lease::{self, ClientWatch, Event, EventMessage, Grant},
    proto::v1::{
        self as pb, semaphore_service_hold_response::Event as HoldEvent,
        semaphore_service_keep_alive_response::Event as KeepAliveEvent,
        semaphore_service_server::SemaphoreService,
    },
    server, wire,
};

/// The SemaphoreService implementation.
#[derive(Clone)]
pub struct SemaphoreApi {
    semaphores: Semaphores,
    shutdown: CancellationToken,
    pings: Option<Duration>,
}

impl SemaphoreApi {
    /// A handler over `semaphores` whose streams and waits end when `shutdown` is cancelled;
    /// `pings` is the server's HTTP/2 keepalive interval, which bounds how long a live client can
    /// seem silent.
    pub fn new(
        semaphores: Semaphores,
        shutdown: CancellationToken,
        pings: Option<Duration>,
    ) -> Self {
        Self {
            semaphores,
            shutdown,
            pings,
        }
    }

    fn client<T>(&self, request: &Request<T>) -> ClientWatch {
        ClientWatch::new(server::liveness(request), self.pings)
    }
}

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn name(value: &str) -> Result<&str, Error> {
    wire::text("name", value, MAX_NAME_BYTES)
}

fn token(value: &str) -> Result<String, Error> {
    wire::token("token", value).map(|_| value.to_owned())
}

/// Checks the fields every acquisition shares and builds the domain request.
#[allow(clippy::too_many_arguments)]
fn acquire_request(
    name_value: &str,
    limit: u32,
    permits: u32,
    ttl: Option<prost_types::Duration>,
    min_ttl: Duration,
    wait_timeout: Option<prost_types::Duration>,
    owner: &str,
    fair: bool,
) -> Result<AcquireRequest, Error> {
    let name = name(name_value)?.to_owned();
    if limit == 0 || limit > MAX_LIMIT {
        return Err(Error::invalid(
            "limit",
            format!("{limit} is outside 1 to {MAX_LIMIT}"),
        ));
    }
    if permits == 0 || permits > limit {
        return Err(Error::invalid(
            "permits",
            format!("{permits} is outside 1 to the limit ({limit})"),
        ));
    }
    let owner = wire::optional_text("owner", owner, MAX_OWNER_BYTES)?;
    Ok(AcquireRequest {
        name,
        limit,
        permits,
        ttl: wire::bounded("ttl", ttl, min_ttl, MAX_TTL)?,
        wait: wire::optional_bounded("wait_timeout", wait_timeout, MIN_WAIT, MAX_WAIT)?
            .unwrap_or_default(),
        owner: (!owner.is_empty()).then(|| owner.to_owned()),
        fair,
        idempotency_key: None,
    })
}

fn permit_message(permit: &Permit, ttl: Duration) -> pb::SemaphorePermit {
    pb::SemaphorePermit {
        name: permit.name.clone(),
        token: permit.token.clone(),
        fencing_token: permit.fencing_token,
        remaining_ttl: Some(wire::duration(permit.remaining)),
        permits: permit.permits,
        limit: permit.limit,
        owner: permit.owner.clone(),
        expires_at: Some(lease::expires_at(permit.sent_at + permit.remaining, ttl).into()),
    }
}

fn hold_event(event: Event) -> pb::SemaphoreServiceHoldResponse {
    let event = match EventMessage::from(event) {
        EventMessage::Renewed(r) => HoldEvent::Renewed(r),
        EventMessage::Lost(l) => HoldEvent::Lost(l),
    };
    pb::SemaphoreServiceHoldResponse { event: Some(event) }
}

fn keep_alive_event(event: Event) -> pb::SemaphoreServiceKeepAliveResponse {
    let event = match EventMessage::from(event) {
        EventMessage::Renewed(r) => KeepAliveEvent::Renewed(r),
        EventMessage::Lost(l) => KeepAliveEvent::Lost(l),
    };
    pb::SemaphoreServiceKeepAliveResponse { event: Some(event) }
}

#[tonic::async_trait]
impl SemaphoreService for SemaphoreApi {
    async fn acquire(
        &self,
        request: Request<pb::SemaphoreServiceAcquireRequest>,
    ) -> Result<Response<pb::SemaphoreServiceAcquireResponse>, Status> {
        let arrived = Instant::now();
        // Only the caller's deadline is needed from the headers; no copy of them.
        let deadline = wire::deadline(request.metadata());
        let req = request.into_inner();
        let mut acquire = acquire_request(
            &req.name,
            req.limit,
            req.permits,
            req.ttl,
            MIN_TTL,
            req.wait_timeout,
            &req.owner,
            req.fair,
        )?;
        acquire.wait = wire::fit_wait(acquire.wait, deadline);
        acquire.idempotency_key = wire::idempotency_key(
            "idempotency_key",
            &req.idempotency_key,
            MAX_IDEMPOTENCY_KEY_BYTES,
        )?;
        let ttl = acquire.ttl;
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown.into());
        }
        let semaphores = self.semaphores.clone();
        let orphans = self.semaphores.clone();
        let outcome = lease::detached(
            &self.shutdown,
            move |stop| async move { semaphores.acquire(&acquire, stop).await },
            move |outcome| async move {
                if let Acquired::Granted(permit) = outcome {
                    tracing::debug!(semaphore = %permit.name, "caller left before the grant arrived; releasing");
                    orphans.release_in_background(&permit.name, &permit.token, ttl);
                }
            },
        )
        .await?;
        Ok(Response::new(match outcome {
            Acquired::Granted(permit) if !wire::in_time(arrived.elapsed(), deadline) => {
                // The answer would reach the caller after it gave up: it would hold permits it
                // does not know of until the ttl ends.
                self.semaphores
                    .release_in_background(&permit.name, &permit.token, ttl);
                return Err(Error::DeadlineExceeded(
                    "the permits were granted too close to the caller's deadline to answer in \
                     time; the grant was released"
                        .into(),
                )
                .into());
            }
            Acquired::Granted(permit) => pb::SemaphoreServiceAcquireResponse {
                acquired: true,
                permit: Some(permit_message(&permit, ttl)),
                available: 0,
                earliest_expiry: None,
            },
            Acquired::Unavailable {
                available,
                earliest_expiry,
            } => pb::SemaphoreServiceAcquireResponse {
                acquired: false,
                permit: None,
                available,
                earliest_expiry: earliest_expiry.map(wire::duration),
            },
        }))
    }

    async fn release(
        &self,
        request: Request<pb::SemaphoreServiceReleaseRequest>,
    ) -> Result<Response<pb::SemaphoreServiceReleaseResponse>, Status> {
        let req = request.into_inner();
        let name = name(&req.name)?;
        let token = token(&req.token)?;
        let was_held = self.semaphores.release(name, &token).await?;
        Ok(Response::new(pb::SemaphoreServiceReleaseResponse {
            was_held,
        }))
    }

    async fn refresh(
        &self,
        request: Request<pb::SemaphoreServiceRefreshRequest>,
    ) -> Result<Response<pb::SemaphoreServiceRefreshResponse>, Status> {
        let req = request.into_inner();
        let name = name(&req.name)?;
        let token = token(&req.token)?;
        let ttl = wire::optional_bounded("ttl", req.ttl, MIN_TTL, MAX_TTL)?;
        match self
            .semaphores
            .refresh(name, &token, ttl, Duration::ZERO)
            .await?
        {
            Some(remaining) => Ok(Response::new(pb::SemaphoreServiceRefreshResponse {
                remaining_ttl: Some(wire::duration(remaining)),
            })),
            None => Err(Error::FailedPrecondition(
                "the permit lease is not held: it expired or was released".into(),
            )
            .into()),
        }
    }

    type HoldStream = EventStream<pb::SemaphoreServiceHoldResponse>;

    async fn hold(
        &self,
        request: Request<pb::SemaphoreServiceHoldRequest>,
    ) -> Result<Response<Self::HoldStream>, Status> {
        let client = self.client(&request);
        let deadline = wire::deadline(request.metadata());
        let req = request.into_inner();
        let mut acquire = acquire_request(
            &req.name,
            req.limit,
            req.permits,
            req.ttl,
            MIN_KEEPALIVE_TTL,
            req.wait_timeout,
            &req.owner,
            req.fair,
        )?;
        acquire.wait = wire::fit_wait(acquire.wait, deadline);
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown.into());
        }
        let semaphores = self.semaphores.clone();
        let events = lease::hold(&self.shutdown, client, hold_event, move |stop| async move {
            Ok(match semaphores.acquire(&acquire, stop).await? {
                Acquired::Granted(permit) => Grant::Granted {
                    first: pb::SemaphoreServiceHoldResponse {
                        event: Some(HoldEvent::Acquired(permit_message(&permit, acquire.ttl))),
                    },
                    valid_until: permit.sent_at + permit.remaining,
                    ttl: acquire.ttl,
                    lease: semaphores.lease_handle(
                        permit.name,
                        permit.token,
                        permit.owner,
                        Some(acquire.ttl),
                    ),
                },
                Acquired::Unavailable {
                    available,
                    earliest_expiry,
                } => Grant::Refused(pb::SemaphoreServiceHoldResponse {
                    event: Some(HoldEvent::NotAcquired(pb::SemaphoreNotAcquired {
                        available,
                        earliest_expiry: earliest_expiry.map(wire::duration),
                    })),
                }),
            })
        });
        Ok(Response::new(Box::pin(events)))
    }

    type KeepAliveStream = EventStream<pb::SemaphoreServiceKeepAliveResponse>;

    async fn keep_alive(
        &self,
        request: Request<pb::SemaphoreServiceKeepAliveRequest>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        let client = self.client(&request);
        let req = request.into_inner();
        let name = name(&req.name)?.to_owned();
        let token = token(&req.token)?;
        let ttl = wire::optional_bounded("ttl", req.ttl, MIN_KEEPALIVE_TTL, MAX_TTL)?;
        let first = self
            .semaphores
            .refresh(&name, &token, ttl, MIN_KEEPALIVE_TTL);
        let lease = self
            .semaphores
            .lease_handle(name.clone(), token.clone(), String::new(), ttl);
        let events =
            lease::open_keep_alive(&self.shutdown, client, keep_alive_event, lease, ttl, first)
                .await?;
        Ok(Response::new(Box::pin(events)))
    }

    async fn describe(
        &self,
        request: Request<pb::SemaphoreServiceDescribeRequest>,
    ) -> Result<Response<pb::SemaphoreServiceDescribeResponse>, Status> {
        let req = request.into_inner();
        let d = self.semaphores.describe(name(&req.name)?).await?;
        Ok(Response::new(pb::SemaphoreServiceDescribeResponse {
            limit: d.limit,
            permits_in_use: d.permits_in_use,
            holders: d
                .holders
                .into_iter()
                .map(|h| pb::SemaphoreHolder {
                    owner: h.owner,
                    permits: h.permits,
                    remaining_ttl: Some(wire::duration(h.remaining)),
                    fencing_token: h.fencing_token,
                    limit: h.limit,
                })
                .collect(),
            holder_count: d.holder_count,
            waiters: d.waiters,
            fencing_token: d.fencing_token,
        }))
    }
}
