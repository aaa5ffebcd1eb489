//! The `baton.v1.LockService` gRPC handler: turns requests into [`Locks`] calls and results back
//! into responses. Validation errors name the proto field.

use std::{pin::Pin, time::Duration};

use futures::Stream;
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{
    AcquireRequest, Acquired, Lease, Locks, MAX_NAME_BYTES, MAX_OWNER_BYTES, MAX_TTL, MAX_WAIT,
    MIN_KEEPALIVE_TTL, MIN_TTL,
};
use crate::{
    error::Error,
    lease::{self, Event, LostReason},
    proto::v1::{
        self as pb, lock_service_hold_response::Event as HoldEvent,
        lock_service_keep_alive_response::Event as KeepAliveEvent,
        lock_service_server::LockService,
    },
    wire,
};

/// Time kept free before the caller's deadline so that a "not acquired" answer reaches it.
const DEADLINE_MARGIN: Duration = Duration::from_millis(50);
/// Shortest non-zero wait (any positive duration rounds up to it).
const MIN_WAIT: Duration = Duration::from_millis(1);
/// Events buffered per stream before renewal events are dropped for a client that does not read.
const STREAM_BUFFER: usize = 16;

/// The LockService implementation.
#[derive(Clone)]
pub struct LockApi {
    locks: Locks,
    shutdown: CancellationToken,
}

impl LockApi {
    /// A handler over `locks` whose streams and waits end when `shutdown` is cancelled.
    pub fn new(locks: Locks, shutdown: CancellationToken) -> Self {
        Self { locks, shutdown }
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

fn lease_message(lease: &Lease) -> pb::LockLease {
    pb::LockLease {
        name: lease.name.clone(),
        token: lease.token.clone(),
        fencing_token: lease.fencing_token,
        remaining_ttl: Some(wire::duration(lease.remaining)),
        hold_count: lease.hold_count,
        owner: lease.owner.clone(),
    }
}

fn lost_message(reason: LostReason, message: String) -> pb::LeaseLost {
    let reason = match reason {
        LostReason::NotHeld => pb::LeaseLostReason::NotHeld,
        LostReason::Unconfirmed => pb::LeaseLostReason::Unconfirmed,
        LostReason::Shutdown => pb::LeaseLostReason::Shutdown,
    };
    pb::LeaseLost {
        reason: reason.into(),
        message,
    }
}

fn hold_event(event: Event) -> pb::LockServiceHoldResponse {
    let event = match event {
        Event::Renewed(remaining) => HoldEvent::Renewed(pb::LeaseRenewed {
            remaining_ttl: Some(wire::duration(remaining)),
        }),
        Event::Lost(reason, message) => HoldEvent::Lost(lost_message(reason, message)),
    };
    pb::LockServiceHoldResponse { event: Some(event) }
}

fn keep_alive_event(event: Event) -> pb::LockServiceKeepAliveResponse {
    let event = match event {
        Event::Renewed(remaining) => KeepAliveEvent::Renewed(pb::LeaseRenewed {
            remaining_ttl: Some(wire::duration(remaining)),
        }),
        Event::Lost(reason, message) => KeepAliveEvent::Lost(lost_message(reason, message)),
    };
    pb::LockServiceKeepAliveResponse { event: Some(event) }
}

/// Ends when the receiving side of `tx` is gone (the caller left) or on shutdown.
async fn stopped<T>(tx: &mpsc::Sender<T>, shutdown: &CancellationToken) -> Error {
    tokio::select! {
        () = tx.closed() => Error::Cancelled,
        () = shutdown.cancelled() => Error::ShuttingDown,
    }
}

#[tonic::async_trait]
impl LockService for LockApi {
    async fn acquire(
        &self,
        request: Request<pb::LockServiceAcquireRequest>,
    ) -> Result<Response<pb::LockServiceAcquireResponse>, Status> {
        let caller_deadline = wire::deadline(request.metadata());
        let req = request.into_inner();
        let name = name(&req.name)?.to_owned();
        let ttl = wire::bounded("ttl", req.ttl, MIN_TTL, MAX_TTL)?;
        let mut wait =
            wire::optional_bounded("wait_timeout", req.wait_timeout, MIN_WAIT, MAX_WAIT)?
                .unwrap_or_default();
        if let Some(deadline) = caller_deadline {
            wait = wait.min(deadline.saturating_sub(DEADLINE_MARGIN.min(deadline / 5)));
        }
        let acquire = AcquireRequest {
            name,
            ttl,
            wait,
            owner: owner(&req.owner)?,
        };
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown.into());
        }

        // The acquisition runs in its own task so that a grant racing the caller's cancellation
        // is released instead of leaking until its ttl.
        let (tx, rx) = oneshot::channel::<Result<Acquired, Error>>();
        let locks = self.locks.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut tx = tx;
            let result = {
                let stop = async {
                    tokio::select! {
                        () = tx.closed() => Error::Cancelled,
                        () = shutdown.cancelled() => Error::ShuttingDown,
                    }
                };
                locks.acquire(&acquire, stop).await
            };
            if let Err(Ok(Acquired::Granted(lease))) = tx.send(result) {
                tracing::debug!(lock = %lease.name, "caller left before the grant arrived; releasing");
                if let Err(e) = locks.release(&lease.name, &lease.token).await {
                    tracing::warn!(lock = %lease.name, error = %e, "could not release an orphaned grant");
                }
            }
        });
        let outcome = rx
            .await
            .map_err(|_| Status::internal("the acquisition task ended without an answer"))??;
        Ok(Response::new(match outcome {
            Acquired::Granted(lease) => pb::LockServiceAcquireResponse {
                acquired: true,
                lease: Some(lease_message(&lease)),
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
        let req = request.into_inner();
        let acquire = AcquireRequest {
            name: name(&req.name)?.to_owned(),
            ttl: wire::bounded("ttl", req.ttl, MIN_KEEPALIVE_TTL, MAX_TTL)?,
            wait: wire::optional_bounded("wait_timeout", req.wait_timeout, MIN_WAIT, MAX_WAIT)?
                .unwrap_or_default(),
            owner: owner(&req.owner)?,
        };
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown.into());
        }

        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let locks = self.locks.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let outcome = locks.acquire(&acquire, stopped(&tx, &shutdown)).await;
            let lease = match outcome {
                Ok(Acquired::Granted(lease)) => lease,
                Ok(Acquired::Held { remaining }) => {
                    let event = HoldEvent::NotAcquired(pb::LockNotAcquired {
                        holder_remaining_ttl: remaining.map(wire::duration),
                    });
                    let _ = tx
                        .send(Ok(pb::LockServiceHoldResponse { event: Some(event) }))
                        .await;
                    return;
                }
                Err(Error::Cancelled) => return,
                Err(e) => {
                    let _ = tx.send(Err(e.into())).await;
                    return;
                }
            };
            let handle =
                locks.lease_handle(lease.name.clone(), lease.token.clone(), Some(acquire.ttl));
            let acquired = pb::LockServiceHoldResponse {
                event: Some(HoldEvent::Acquired(lease_message(&lease))),
            };
            if tx.send(Ok(acquired)).await.is_err() {
                // The caller left while the grant was on its way.
                if let Err(e) = locks.release(&lease.name, &lease.token).await {
                    tracing::warn!(lock = %lease.name, error = %e, "could not release an orphaned hold");
                }
                return;
            }
            tracing::debug!(lock = %lease.name, fencing_token = lease.fencing_token, "hold acquired");
            let valid_until = lease.sent_at + lease.remaining;
            lease::keep_alive(handle, acquire.ttl, valid_until, tx, hold_event, shutdown).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    type KeepAliveStream = EventStream<pb::LockServiceKeepAliveResponse>;

    async fn keep_alive(
        &self,
        request: Request<pb::LockServiceKeepAliveRequest>,
    ) -> Result<Response<Self::KeepAliveStream>, Status> {
        let req = request.into_inner();
        let name = name(&req.name)?.to_owned();
        let token = token(&req.token)?;
        let ttl = wire::optional_bounded("ttl", req.ttl, MIN_KEEPALIVE_TTL, MAX_TTL)?;
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown.into());
        }
        let sent = Instant::now();
        let renewed = self
            .locks
            .refresh_at_least(&name, &token, ttl, MIN_KEEPALIVE_TTL)
            .await?;
        let Some(remaining) = renewed else {
            return Err(Error::FailedPrecondition(
                "the lease is not held: it expired or was released".into(),
            )
            .into());
        };
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        // The channel is new and empty, so the first event always fits.
        let _ = tx.try_send(Ok(keep_alive_event(Event::Renewed(remaining))));
        let handle = self.locks.lease_handle(name, token, ttl);
        let shutdown = self.shutdown.clone();
        tokio::spawn(lease::keep_alive(
            handle,
            ttl.unwrap_or(remaining),
            sent + remaining,
            tx,
            keep_alive_event,
            shutdown,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn describe(
        &self,
        request: Request<pb::LockServiceDescribeRequest>,
    ) -> Result<Response<pb::LockServiceDescribeResponse>, Status> {
        let req = request.into_inner();
        let d = self.locks.describe(name(&req.name)?).await?;
        Ok(Response::new(match d.holder {
            Some(h) => pb::LockServiceDescribeResponse {
                held: true,
                remaining_ttl: h.remaining.map(wire::duration),
                hold_count: h.hold_count,
                owner: h.owner,
                fencing_token: d.fencing_token,
                waiters: d.waiters,
            },
            None => pb::LockServiceDescribeResponse {
                held: false,
                remaining_ttl: None,
                hold_count: 0,
                owner: String::new(),
                fencing_token: d.fencing_token,
                waiters: d.waiters,
            },
        }))
    }
}
