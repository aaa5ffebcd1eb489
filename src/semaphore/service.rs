//! The `baton.v1.SemaphoreService` gRPC handler: turns requests into semaphore requests and
//! outcomes into responses. Validation errors name the proto field; the lease calls themselves
//! are the shared [`Leases`].

use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::{AcquireRequest, MAX_PERMITS, Permit, Refusal, Semaphore, Semaphores};
use crate::{
    error::Error,
    grpc::{
        leases::{self, EventStream, Leases},
        wire,
    },
    lease::{MAX_TTL, MAX_WAIT, MIN_KEEPALIVE_TTL, MIN_TTL, MIN_WAIT, engine::Acquired},
    proto::v1::{
        self as pb, semaphore_service_hold_response::Event as HoldEvent,
        semaphore_service_server::SemaphoreService,
    },
};

/// The SemaphoreService implementation.
#[derive(Clone)]
pub struct SemaphoreApi {
    leases: Leases<Semaphore>,
}

impl SemaphoreApi {
    /// A handler over `semaphores` whose streams and waits end when `shutdown` is cancelled;
    /// `pings` is the server's HTTP/2 keepalive interval.
    pub fn new(
        semaphores: Semaphores,
        shutdown: tokio_util::sync::CancellationToken,
        pings: Option<Duration>,
    ) -> Self {
        Self {
            leases: Leases::new(semaphores, shutdown, pings),
        }
    }
}

/// The fields `Acquire` and `Hold` share, as their messages carry them.
struct Asked<'a> {
    name: &'a str,
    limit: u32,
    permits: u32,
    ttl: Option<prost_types::Duration>,
    wait_timeout: Option<prost_types::Duration>,
    owner: &'a str,
    fair: bool,
}

impl Asked<'_> {
    /// Checks the fields and builds the domain request, with ttls from `min_ttl` and the wait cut
    /// to fit the caller's `deadline`.
    fn request(
        &self,
        min_ttl: Duration,
        deadline: Option<Duration>,
    ) -> Result<AcquireRequest, Error> {
        let name = leases::name(self.name)?.to_owned();
        let (limit, permits) = (self.limit, self.permits);
        if limit == 0 || limit > MAX_PERMITS {
            return Err(Error::invalid(
                "limit",
                format!("{limit} is outside 1 to {MAX_PERMITS}"),
            ));
        }
        if permits == 0 || permits > limit {
            return Err(Error::invalid(
                "permits",
                format!("{permits} is outside 1 to the limit ({limit})"),
            ));
        }
        let wait = wire::optional_bounded("wait_timeout", self.wait_timeout, MIN_WAIT, MAX_WAIT)?
            .unwrap_or_default();
        Ok(AcquireRequest {
            name,
            limit,
            permits,
            ttl: wire::bounded("ttl", self.ttl, min_ttl, MAX_TTL)?,
            wait: wire::fit_wait(wait, deadline),
            owner: leases::owner(self.owner)?,
            fair: self.fair,
            idempotency_key: None,
        })
    }
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
        expires_at: Some(leases::expires_at(permit, ttl)),
    }
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
        let mut acquire = Asked {
            name: &req.name,
            limit: req.limit,
            permits: req.permits,
            ttl: req.ttl,
            wait_timeout: req.wait_timeout,
            owner: &req.owner,
            fair: req.fair,
        }
        .request(MIN_TTL, deadline)?;
        acquire.idempotency_key = leases::idempotency_key(&req.idempotency_key)?;
        let ttl = acquire.ttl;
        Ok(Response::new(
            match self.leases.acquire(acquire, arrived, deadline).await? {
                Acquired::Granted(permit) => pb::SemaphoreServiceAcquireResponse {
                    acquired: true,
                    permit: Some(permit_message(&permit, ttl)),
                    available: 0,
                    earliest_expiry: None,
                },
                Acquired::Refused(refusal) => pb::SemaphoreServiceAcquireResponse {
                    acquired: false,
                    permit: None,
                    available: refusal.available,
                    earliest_expiry: refusal.earliest_expiry.map(wire::duration),
                },
            },
        ))
    }

    async fn release(
        &self,
        request: Request<pb::SemaphoreServiceReleaseRequest>,
    ) -> Result<Response<pb::SemaphoreServiceReleaseResponse>, Status> {
        let req = request.into_inner();
        let name = leases::name(&req.name)?;
        let token = leases::token(&req.token)?;
        let was_held = self.leases.engine().release(name, &token).await?;
        Ok(Response::new(pb::SemaphoreServiceReleaseResponse {
            was_held,
        }))
    }

    async fn refresh(
        &self,
        request: Request<pb::SemaphoreServiceRefreshRequest>,
    ) -> Result<Response<pb::SemaphoreServiceRefreshResponse>, Status> {
        let req = request.into_inner();
        let name = leases::name(&req.name)?;
        let token = leases::token(&req.token)?;
        let ttl = wire::optional_bounded("ttl", req.ttl, MIN_TTL, MAX_TTL)?;
        match self
            .leases
            .engine()
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
        let client = self.leases.client(&request);
        let deadline = wire::deadline(request.metadata());
        let req = request.into_inner();
        let acquire = Asked {
            name: &req.name,
            limit: req.limit,
            permits: req.permits,
            ttl: req.ttl,
            wait_timeout: req.wait_timeout,
            owner: &req.owner,
            fair: req.fair,
        }
        .request(MIN_KEEPALIVE_TTL, deadline)?;
        let granted = |permit: &Permit, ttl| pb::SemaphoreServiceHoldResponse {
            event: Some(HoldEvent::Acquired(permit_message(permit, ttl))),
        };
        let refused = |refusal: Refusal| {
            Ok(pb::SemaphoreServiceHoldResponse {
                event: Some(HoldEvent::NotAcquired(pb::SemaphoreNotAcquired {
                    available: refusal.available,
                    earliest_expiry: refusal.earliest_expiry.map(wire::duration),
                })),
            })
        };
        let events = self.leases.hold(acquire, client, granted, refused)?;
        Ok(Response::new(events))
    }

    type KeepAliveStream = EventStream<pb::SemaphoreServiceKeepAliveResponse>;

    async fn keep_alive(
        &self,
        request: Request<pb::SemaphoreServiceKeepAliveRequest>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        let client = self.leases.client(&request);
        let req = request.into_inner();
        let name = leases::name(&req.name)?.to_owned();
        let token = leases::token(&req.token)?;
        let ttl = wire::optional_bounded("ttl", req.ttl, MIN_KEEPALIVE_TTL, MAX_TTL)?;
        let events = self.leases.keep_alive(name, token, ttl, client).await?;
        Ok(Response::new(events))
    }

    async fn describe(
        &self,
        request: Request<pb::SemaphoreServiceDescribeRequest>,
    ) -> Result<Response<pb::SemaphoreServiceDescribeResponse>, Status> {
        let req = request.into_inner();
        let d = self
            .leases
            .engine()
            .primitive()
            .describe(leases::name(&req.name)?)
            .await?;
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
