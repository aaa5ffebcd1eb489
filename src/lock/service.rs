//! The `baton.v1.LockService` gRPC handler: turns requests into lock requests and lock outcomes
//! into responses. Validation errors name the proto field; the lease calls themselves are the
//! shared [`Leases`].

use std::time::Duration;

use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::{AcquireRequest, Lease, Lock, Locks, Mode, Refusal};
use crate::{
    error::Error,
    grpc::{
        leases::{self, EventStream, Leases},
        wire,
    },
    lease::{MAX_TTL, MAX_WAIT, MIN_KEEPALIVE_TTL, MIN_TTL, MIN_WAIT, engine::Acquired},
    proto::v1::{
        self as pb, lock_service_hold_response::Event as HoldEvent,
        lock_service_server::LockService,
    },
};

/// The LockService implementation.
#[derive(Clone)]
pub struct LockApi {
    leases: Leases<Lock>,
}

impl LockApi {
    /// A handler over `locks` whose streams and waits end when `shutdown` is cancelled; `pings`
    /// is the server's HTTP/2 keepalive interval.
    pub fn new(
        locks: Locks,
        shutdown: tokio_util::sync::CancellationToken,
        pings: Option<Duration>,
    ) -> Self {
        Self {
            leases: Leases::new(locks, shutdown, pings),
        }
    }
}

fn mode(value: i32) -> Result<Mode, Error> {
    match pb::LockMode::try_from(value) {
        Ok(pb::LockMode::Unspecified | pb::LockMode::Exclusive) => Ok(Mode::Exclusive),
        Ok(pb::LockMode::Shared) => Ok(Mode::Shared),
        Err(_) => Err(Error::invalid(
            "mode",
            format!("{value} is not a LockMode (0 or 1: exclusive, 2: shared)"),
        )),
    }
}

fn mode_message(mode: Mode) -> pb::LockMode {
    match mode {
        Mode::Exclusive => pb::LockMode::Exclusive,
        Mode::Shared => pb::LockMode::Shared,
    }
}

fn lease_message(lease: &Lease, ttl: Duration) -> pb::LockLease {
    pb::LockLease {
        name: lease.name.clone(),
        token: lease.token.clone(),
        fencing_token: lease.fencing_token,
        remaining_ttl: Some(wire::duration(lease.remaining)),
        hold_count: lease.hold_count,
        owner: lease.owner.clone(),
        mode: mode_message(lease.mode).into(),
        expires_at: Some(leases::expires_at(lease, ttl)),
    }
}

#[tonic::async_trait]
impl LockService for LockApi {
    async fn acquire(
        &self,
        request: Request<pb::LockServiceAcquireRequest>,
    ) -> Result<Response<pb::LockServiceAcquireResponse>, Status> {
        let arrived = Instant::now();
        // Only the caller's deadline is needed from the headers; no copy of them.
        let deadline = wire::deadline(request.metadata());
        let req = request.into_inner();
        let wait = wire::optional_bounded("wait_timeout", req.wait_timeout, MIN_WAIT, MAX_WAIT)?
            .unwrap_or_default();
        let acquire = AcquireRequest {
            name: leases::name(&req.name)?.to_owned(),
            ttl: wire::bounded("ttl", req.ttl, MIN_TTL, MAX_TTL)?,
            wait: wire::fit_wait(wait, deadline),
            owner: leases::owner(&req.owner)?,
            fair: req.fair,
            mode: mode(req.mode)?,
            idempotency_key: leases::idempotency_key(&req.idempotency_key)?,
        };
        let ttl = acquire.ttl;
        Ok(Response::new(
            match self.leases.acquire(acquire, arrived, deadline).await? {
                Acquired::Granted(lease) => pb::LockServiceAcquireResponse {
                    acquired: true,
                    lease: Some(lease_message(&lease, ttl)),
                    holder_remaining_ttl: None,
                },
                Acquired::Refused(refusal) => pb::LockServiceAcquireResponse {
                    acquired: false,
                    lease: None,
                    holder_remaining_ttl: refusal.remaining.map(wire::duration),
                },
            },
        ))
    }

    async fn release(
        &self,
        request: Request<pb::LockServiceReleaseRequest>,
    ) -> Result<Response<pb::LockServiceReleaseResponse>, Status> {
        let req = request.into_inner();
        let name = leases::name(&req.name)?;
        let token = leases::token(&req.token)?;
        let released = self.leases.engine().release(name, &token).await?;
        Ok(Response::new(pb::LockServiceReleaseResponse {
            was_held: released.was_held,
            remaining_holds: released.remaining_holds,
        }))
    }

    async fn refresh(
        &self,
        request: Request<pb::LockServiceRefreshRequest>,
    ) -> Result<Response<pb::LockServiceRefreshResponse>, Status> {
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
            Some(remaining) => Ok(Response::new(pb::LockServiceRefreshResponse {
                remaining_ttl: Some(wire::duration(remaining)),
            })),
            None => Err(Error::FailedPrecondition(
                "the lease is not held: it expired or was released".into(),
            )
            .into()),
        }
    }

    type HoldStream = EventStream<pb::LockServiceHoldResponse>;

    async fn hold(
        &self,
        request: Request<pb::LockServiceHoldRequest>,
    ) -> Result<Response<Self::HoldStream>, Status> {
        let client = self.leases.client(&request);
        let deadline = wire::deadline(request.metadata());
        let req = request.into_inner();
        let wait = wire::optional_bounded("wait_timeout", req.wait_timeout, MIN_WAIT, MAX_WAIT)?
            .unwrap_or_default();
        let acquire = AcquireRequest {
            name: leases::name(&req.name)?.to_owned(),
            ttl: wire::bounded("ttl", req.ttl, MIN_KEEPALIVE_TTL, MAX_TTL)?,
            wait: wire::fit_wait(wait, deadline),
            owner: leases::owner(&req.owner)?,
            fair: req.fair,
            mode: mode(req.mode)?,
            idempotency_key: None,
        };
        let granted = |lease: &Lease, ttl| pb::LockServiceHoldResponse {
            event: Some(HoldEvent::Acquired(lease_message(lease, ttl))),
        };
        let refused = |refusal: Refusal| {
            Ok(pb::LockServiceHoldResponse {
                event: Some(HoldEvent::NotAcquired(pb::LockNotAcquired {
                    holder_remaining_ttl: refusal.remaining.map(wire::duration),
                })),
            })
        };
        let events = self.leases.hold(acquire, client, granted, refused)?;
        Ok(Response::new(events))
    }

    type KeepAliveStream = EventStream<pb::LockServiceKeepAliveResponse>;

    async fn keep_alive(
        &self,
        request: Request<pb::LockServiceKeepAliveRequest>,
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
        request: Request<pb::LockServiceDescribeRequest>,
    ) -> Result<Response<pb::LockServiceDescribeResponse>, Status> {
        let req = request.into_inner();
        let d = self
            .leases
            .engine()
            .primitive()
            .describe(leases::name(&req.name)?)
            .await?;
        let mut response = pb::LockServiceDescribeResponse {
            fencing_token: d.fencing_token,
            waiters: d.waiters,
            queued: d.queued,
            ..Default::default()
        };
        if let Some(h) = d.holder {
            response.held = true;
            response.mode = pb::LockMode::Exclusive.into();
            response.remaining_ttl = h.remaining.map(wire::duration);
            response.hold_count = h.hold_count;
            response.owner = h.owner;
        } else if let Some(shared) = d.shared {
            response.held = true;
            response.mode = pb::LockMode::Shared.into();
            response.remaining_ttl = shared.longest_remaining.map(wire::duration);
            response.shared_holders = shared.count;
            response.earliest_shared_holder = Some(pb::LockSharedHolder {
                owner: shared.earliest.owner,
                hold_count: shared.earliest.hold_count,
                remaining_ttl: shared.earliest.remaining.map(wire::duration),
                fencing_token: shared.earliest.fencing_token,
            });
        }
        Ok(Response::new(response))
    }
}
