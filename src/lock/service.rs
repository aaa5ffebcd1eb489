//! The `baton.v1.LockService` gRPC handler: turns requests into [`Locks`] calls and results back
//! into responses. Validation errors name the proto field.

use std::{pin::Pin, time::Duration};

use futures::Stream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{
    AcquireRequest, Acquired, Lease, Locks, MAX_IDEMPOTENCY_KEY_BYTES, MAX_NAME_BYTES,
    MAX_OWNER_BYTES, MAX_TTL, MAX_WAIT, MIN_KEEPALIVE_TTL, MIN_TTL, MIN_WAIT, Mode,
};
use crate::{
    error::Error,
    lease::{self, ClientWatch, Event, EventMessage, Grant},
    proto::v1::{
        self as pb, lock_service_hold_response::Event as HoldEvent,
        lock_service_keep_alive_response::Event as KeepAliveEvent,
        lock_service_server::LockService,
    },
    server, wire,
};

/// The LockService implementation.
#[derive(Clone)]
pub struct LockApi {
    locks: Locks,
    shutdown: CancellationToken,
    pings: Option<Duration>,
}

impl LockApi {
    /// A handler over `locks` whose streams and waits end when `shutdown` is cancelled; `pings`
    /// is the server's HTTP/2 keepalive interval, which bounds how long a live client can seem
    /// silent.
    pub fn new(locks: Locks, shutdown: CancellationToken, pings: Option<Duration>) -> Self {
        Self {
            locks,
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

fn owner(value: &str) -> Result<Option<String>, Error> {
    let owner = wire::optional_text("owner", value, MAX_OWNER_BYTES)?;
    Ok((!owner.is_empty()).then(|| owner.to_owned()))
}

fn token(value: &str) -> Result<String, Error> {
    wire::token("token", value).map(|_| value.to_owned())
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
        expires_at: Some(lease::expires_at(lease.sent_at + lease.remaining, ttl).into()),
    }
}

fn hold_event(event: Event) -> pb::LockServiceHoldResponse {
    let event = match EventMessage::from(event) {
        EventMessage::Renewed(r) => HoldEvent::Renewed(r),
        EventMessage::Lost(l) => HoldEvent::Lost(l),
    };
    pb::LockServiceHoldResponse { event: Some(event) }
}

fn keep_alive_event(event: Event) -> pb::LockServiceKeepAliveResponse {
    let event = match EventMessage::from(event) {
        EventMessage::Renewed(r) => KeepAliveEvent::Renewed(r),
        EventMessage::Lost(l) => KeepAliveEvent::Lost(l),
    };
    pb::LockServiceKeepAliveResponse { event: Some(event) }
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
        let name = name(&req.name)?.to_owned();
        let ttl = wire::bounded("ttl", req.ttl, MIN_TTL, MAX_TTL)?;
        let wait = wire::optional_bounded("wait_timeout", req.wait_timeout, MIN_WAIT, MAX_WAIT)?
            .unwrap_or_default();
        let acquire = AcquireRequest {
            name,
            ttl,
            wait: wire::fit_wait(wait, deadline),
            owner: owner(&req.owner)?,
            fair: req.fair,
            mode: mode(req.mode)?,
            idempotency_key: wire::idempotency_key(
                "idempotency_key",
                &req.idempotency_key,
                MAX_IDEMPOTENCY_KEY_BYTES,
            )?,
        };
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown.into());
        }

        let locks = self.locks.clone();
        let orphans = self.locks.clone();
        let outcome = lease::detached(
            &self.shutdown,
            move |stop| async move { locks.acquire(&acquire, stop).await },
            move |outcome| async move {
                if let Acquired::Granted(lease) = outcome {
                    tracing::debug!(lock = %lease.name, "caller left before the grant arrived; releasing");
                    orphans.release_in_background(&lease.name, &lease.token, ttl);
                }
            },
        )
        .await?;
        Ok(Response::new(match outcome {
            Acquired::Granted(lease) if !wire::in_time(arrived.elapsed(), deadline) => {
                // The answer would reach the caller after it gave up: it would hold a lock it
                // does not know of until the ttl ends.
                self.locks
                    .release_in_background(&lease.name, &lease.token, ttl);
                return Err(Error::DeadlineExceeded(
                    "the lock was granted too close to the caller's deadline to answer in time; \
                     the grant was released"
                        .into(),
                )
                .into());
            }
            Acquired::Granted(lease) => pb::LockServiceAcquireResponse {
                acquired: true,
                lease: Some(lease_message(&lease, ttl)),
                holder_remaining_ttl: None,
            },
            Acquired::Held { remaining } => pb::LockServiceAcquireResponse {
                acquired: false,
                lease: None,
                holder_remaining_ttl: remaining.map(wire::duration),
            },
        }))
    }

    async fn release(
        &self,
        request: Request<pb::LockServiceReleaseRequest>,
    ) -> Result<Response<pb::LockServiceReleaseResponse>, Status> {
        let req = request.into_inner();
        let name = name(&req.name)?;
        let token = token(&req.token)?;
        let released = self.locks.release(name, &token).await?;
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
        let name = name(&req.name)?;
        let token = token(&req.token)?;
        let ttl = wire::optional_bounded("ttl", req.ttl, MIN_TTL, MAX_TTL)?;
        match self.locks.refresh(name, &token, ttl).await? {
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
        let client = self.client(&request);
        let deadline = wire::deadline(request.metadata());
        let req = request.into_inner();
        let wait = wire::optional_bounded("wait_timeout", req.wait_timeout, MIN_WAIT, MAX_WAIT)?
            .unwrap_or_default();
        let acquire = AcquireRequest {
            name: name(&req.name)?.to_owned(),
            ttl: wire::bounded("ttl", req.ttl, MIN_KEEPALIVE_TTL, MAX_TTL)?,
            wait: wire::fit_wait(wait, deadline),
            owner: owner(&req.owner)?,
            fair: req.fair,
            mode: mode(req.mode)?,
            idempotency_key: None,
        };
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown.into());
        }

        let locks = self.locks.clone();
        let events = lease::hold(&self.shutdown, client, hold_event, move |stop| async move {
            Ok(match locks.acquire(&acquire, stop).await? {
                Acquired::Granted(lease) => {
                    tracing::debug!(lock = %lease.name, fencing_token = lease.fencing_token, "hold acquired");
                    Grant::Granted {
                        first: pb::LockServiceHoldResponse {
                            event: Some(HoldEvent::Acquired(lease_message(&lease, acquire.ttl))),
                        },
                        valid_until: lease.sent_at + lease.remaining,
                        ttl: acquire.ttl,
                        lease: locks.lease_handle(
                            lease.name,
                            lease.token,
                            lease.owner,
                            Some(acquire.ttl),
                        ),
                    }
                }
                Acquired::Held { remaining } => Grant::Refused(pb::LockServiceHoldResponse {
                    event: Some(HoldEvent::NotAcquired(pb::LockNotAcquired {
                        holder_remaining_ttl: remaining.map(wire::duration),
                    })),
                }),
            })
        });
        Ok(Response::new(Box::pin(events)))
    }

    type KeepAliveStream = EventStream<pb::LockServiceKeepAliveResponse>;

    async fn keep_alive(
        &self,
        request: Request<pb::LockServiceKeepAliveRequest>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        let client = self.client(&request);
        let req = request.into_inner();
        let name = name(&req.name)?.to_owned();
        let token = token(&req.token)?;
        let ttl = wire::optional_bounded("ttl", req.ttl, MIN_KEEPALIVE_TTL, MAX_TTL)?;
        let first = self
            .locks
            .refresh_at_least(&name, &token, ttl, MIN_KEEPALIVE_TTL);
        let lease = self
            .locks
            .lease_handle(name.clone(), token.clone(), String::new(), ttl);
        let events =
            lease::open_keep_alive(&self.shutdown, client, keep_alive_event, lease, ttl, first)
                .await?;
        Ok(Response::new(Box::pin(events)))
    }

    async fn describe(
        &self,
        request: Request<pb::LockServiceDescribeRequest>,
    ) -> Result<Response<pb::LockServiceDescribeResponse>, Status> {
        let req = request.into_inner();
        let d = self.locks.describe(name(&req.name)?).await?;
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
