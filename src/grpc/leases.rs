//! The lease calls every leased primitive serves, written once over the [`Engine`]: `Acquire`
//! (a unary call whose grant is released if its caller left or its reply would come too late),
//! `Hold` and `KeepAlive` (streams of `renewed` events ending in `lost`), and the checks of the
//! fields they share. A service's handler turns its proto request into the primitive's request
//! and its grant and refusal into messages; everything else happens here.

use std::{pin::Pin, time::Duration};

use futures::Stream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Status};

use super::{unary, wire};
use crate::{
    error::Error,
    lease::{
        self, ClientWatch, Engine, Event, Grant, LostReason, MAX_IDEMPOTENCY_KEY_BYTES,
        MAX_NAME_BYTES, MAX_OWNER_BYTES, Primitive,
        engine::Acquired,
        keepalive::{self, Opening},
    },
    proto::v1 as pb,
};

/// A server stream of lease events, as tonic sends it.
pub type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// A stream message that carries the events of a kept-alive lease (`renewed`, `lost`).
pub trait LeaseMessage: Send + 'static {
    /// The message reporting a renewal.
    fn renewed(renewed: pb::LeaseRenewed) -> Self;
    /// The message reporting the end of the lease.
    fn lost(lost: pb::LeaseLost) -> Self;
}

/// Implements [`LeaseMessage`] for stream responses whose `event` oneof (in the generated module
/// named after the message) has `Renewed` and `Lost` variants.
macro_rules! lease_messages {
    ($($message:ident in $module:ident),* $(,)?) => {$(
        impl LeaseMessage for pb::$message {
            fn renewed(renewed: pb::LeaseRenewed) -> Self {
                Self {
                    event: Some(pb::$module::Event::Renewed(renewed)),
                }
            }

            fn lost(lost: pb::LeaseLost) -> Self {
                Self {
                    event: Some(pb::$module::Event::Lost(lost)),
                }
            }
        }
    )*};
}

lease_messages! {
    LockServiceHoldResponse in lock_service_hold_response,
    LockServiceKeepAliveResponse in lock_service_keep_alive_response,
    SemaphoreServiceHoldResponse in semaphore_service_hold_response,
    SemaphoreServiceKeepAliveResponse in semaphore_service_keep_alive_response,
    ElectionServiceCampaignResponse in election_service_campaign_response,
}

/// The message of `event`.
fn message<T: LeaseMessage>(event: Event) -> Result<T, Status> {
    Ok(match event {
        Event::Renewed {
            remaining,
            expires_at,
        } => T::renewed(pb::LeaseRenewed {
            remaining_ttl: Some(wire::duration(remaining)),
            expires_at: Some(expires_at.into()),
        }),
        Event::Lost(reason, message) => T::lost(pb::LeaseLost {
            reason: match reason {
                LostReason::NotHeld => pb::LeaseLostReason::NotHeld,
                LostReason::Unconfirmed => pb::LeaseLostReason::Unconfirmed,
                LostReason::Shutdown => pb::LeaseLostReason::Shutdown,
                LostReason::ClientUnresponsive => pb::LeaseLostReason::ClientUnresponsive,
            }
            .into(),
            message,
        }),
    })
}

fn status<T>(error: Error) -> Result<T, Status> {
    Err(error.into())
}

/// The absolute expiry a grant of `ttl` reports, for its message.
pub fn expires_at(grant: &impl Grant, ttl: Duration) -> prost_types::Timestamp {
    lease::expires_at(grant.valid_until(), ttl).into()
}

/// A resource's name: 1 to [`MAX_NAME_BYTES`] bytes.
pub fn name(value: &str) -> Result<&str, Error> {
    wire::text("name", value, MAX_NAME_BYTES)
}

/// An owner, up to [`MAX_OWNER_BYTES`] bytes; `None` when empty.
pub fn owner(value: &str) -> Result<Option<String>, Error> {
    let owner = wire::optional_text("owner", value, MAX_OWNER_BYTES)?;
    Ok((!owner.is_empty()).then(|| owner.to_owned()))
}

/// A lease token as Baton issues them.
pub fn token(value: &str) -> Result<String, Error> {
    wire::token("token", value).map(|_| value.to_owned())
}

/// An idempotency key; `None` when empty.
pub fn idempotency_key(value: &str) -> Result<Option<String>, Error> {
    wire::idempotency_key("idempotency_key", value, MAX_IDEMPOTENCY_KEY_BYTES)
}

/// The lease calls of one primitive's service.
pub struct Leases<P: Primitive> {
    engine: Engine<P>,
    shutdown: CancellationToken,
    pings: Option<Duration>,
}

impl<P: Primitive> Clone for Leases<P> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            shutdown: self.shutdown.clone(),
            pings: self.pings,
        }
    }
}

impl<P: Primitive> Leases<P> {
    /// Calls over `engine` whose streams and waits end when `shutdown` is cancelled; `pings` is
    /// the server's HTTP/2 keepalive interval, which bounds how long a live client can seem
    /// silent.
    pub fn new(engine: Engine<P>, shutdown: CancellationToken, pings: Option<Duration>) -> Self {
        Self {
            engine,
            shutdown,
            pings,
        }
    }

    /// The engine, for the calls only the primitive knows.
    pub fn engine(&self) -> &Engine<P> {
        &self.engine
    }

    /// What a stream knows of the liveness of the client `request` came from.
    pub fn client<T>(&self, request: &Request<T>) -> ClientWatch {
        ClientWatch::new(super::conn::liveness(request), self.pings)
    }

    /// Fails when Baton is shutting down.
    pub fn open(&self) -> Result<(), Status> {
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown.into());
        }
        Ok(())
    }

    /// A unary `Acquire` that `arrived` with the caller's `deadline`: a grant whose caller left
    /// is released, and so is one ready less than a margin before the deadline (the caller would
    /// not see it), which fails `DEADLINE_EXCEEDED`, and one made after shutdown began, which
    /// fails `UNAVAILABLE`.
    pub async fn acquire(
        &self,
        request: P::Request,
        arrived: Instant,
        deadline: Option<Duration>,
    ) -> Result<Acquired<P::Grant, P::Busy>, Status> {
        self.open()?;
        let ttl = lease::Request::ttl(&request);
        let (engine, orphans) = (self.engine.clone(), self.engine.clone());
        let outcome = unary::detached(
            &self.shutdown,
            move |stop| async move { engine.acquire(&request, stop).await },
            move |outcome| {
                if let Acquired::Granted(grant) = outcome {
                    tracing::debug!(kind = P::KIND, name = %grant.name(), "caller left before the grant arrived; releasing");
                    orphans.release_in_background(grant.name(), grant.call_token(), ttl, None);
                }
            },
        )
        .await?;
        match outcome {
            Acquired::Granted(grant) if !wire::in_time(arrived.elapsed(), deadline) => {
                // The answer would reach the caller after it gave up: it would hold what it does
                // not know of until the ttl ends.
                self.engine
                    .release_in_background(grant.name(), grant.call_token(), ttl, None);
                Err(Error::DeadlineExceeded(format!(
                    "the {} was granted too close to the caller's deadline to answer in time; \
                     the grant was released",
                    P::KIND
                ))
                .into())
            }
            Acquired::Granted(grant) if self.shutdown.is_cancelled() => {
                // Granted as shutdown began (often what this Baton's own holds released at
                // shutdown): passed on in Redis rather than to a caller of a Baton going away.
                self.engine
                    .release_in_background(grant.name(), grant.call_token(), ttl, None);
                Err(Error::ShuttingDown.into())
            }
            outcome => Ok(outcome),
        }
    }

    /// A `Hold` stream: acquires, then keeps the grant alive while `client` keeps the stream
    /// open. `granted` and `refused` make its first item from the outcome (given the ttl): a
    /// message, or for `refused` a status when the service has no message for a refusal.
    pub fn hold<T: LeaseMessage>(
        &self,
        request: P::Request,
        client: ClientWatch,
        granted: fn(&P::Grant, Duration) -> T,
        refused: fn(P::Busy) -> Result<T, Status>,
    ) -> Result<EventStream<T>, Status> {
        self.open()?;
        let engine = self.engine.clone();
        let events = keepalive::hold(
            &self.shutdown,
            self.engine.tasks(),
            client,
            message::<T>,
            status,
            move |stop| async move {
                let ttl = lease::Request::ttl(&request);
                Ok(match engine.acquire(&request, stop).await? {
                    Acquired::Granted(grant) => {
                        tracing::debug!(kind = P::KIND, name = %grant.name(), "hold acquired");
                        Opening::Granted {
                            first: Ok(granted(&grant, ttl)),
                            valid_until: grant.valid_until(),
                            ttl,
                            lease: engine.lease(
                                grant.name().to_owned(),
                                grant.token().to_owned(),
                                grant.owner().to_owned(),
                                Some(ttl),
                            ),
                        }
                    }
                    Acquired::Refused(busy) => Opening::Refused(refused(busy)),
                })
            },
        );
        Ok(Box::pin(events))
    }

    /// A `KeepAlive` stream for the grant `token` of `name`, renewed with `ttl` (or its own).
    pub async fn keep_alive<T: LeaseMessage>(
        &self,
        name: String,
        token: String,
        ttl: Option<Duration>,
        client: ClientWatch,
    ) -> Result<EventStream<T>, Status> {
        let first = self
            .engine
            .refresh(&name, &token, ttl, lease::MIN_KEEPALIVE_TTL);
        let lease = self
            .engine
            .lease(name.clone(), token.clone(), String::new(), ttl);
        let events = keepalive::open_keep_alive(
            &self.shutdown,
            self.engine.tasks(),
            client,
            message::<T>,
            lease,
            ttl,
            first,
        )
        .await?;
        Ok(Box::pin(events))
    }
}
