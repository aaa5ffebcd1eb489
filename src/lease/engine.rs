//! The acquisition algorithm of every leased primitive, written once.
//!
//! A primitive ([`Primitive`]: a lock, a semaphore) brings its key layout and its scripts: one
//! call that tries to grant (and registers a waiter), one that releases, one that removes a
//! waiter, and refreshes. The [`Engine`] brings the rest:
//!
//! - the first try, which registers a caller that will wait (so a fair one takes its place in the
//!   order its request reached Redis), and costs an uncontended acquisition one script call;
//! - the wait, woken by Redis pub/sub ([`crate::wait`]), renewing a leased registration by trying
//!   again about every third of [`QUEUE_LEASE`];
//! - a waiter that stops waiting (timeout, cancellation, an error, even on its first try) gives
//!   its place back, retried for as long as its registration could last;
//! - a grant replicas did not acknowledge (`--min-replicas-ack`) is rolled back and reported as a
//!   refusal; a grant whose reply never came (a timeout) is released; both are retried until the
//!   lease would have expired anyway, and never release a hold that a retry with its idempotency
//!   key has claimed;
//! - batched renewals of kept-alive leases ([`super::batch`]) and the handle a keepalive stream
//!   renews and releases ([`Handle`]).

use std::{
    future::Future,
    sync::{Arc, Weak},
    time::Duration,
};

use tokio::time::Instant;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::{
    QUEUE_LEASE, Renewable, VOID_RETENTION, WaitLimit,
    batch::{Batcher, Renewal},
    clean_up,
    keepalive::Described,
};
use crate::{
    error::Error,
    metrics::{self, Acquisition},
    redis::{Ack, Notifier, Redis, Wake},
    wait::{self, Attempt},
};

/// A validated acquisition request.
pub trait Request: Send + Sync + 'static {
    /// The resource's name.
    fn name(&self) -> &str;
    /// The lease's ttl.
    fn ttl(&self) -> Duration;
    /// How long to wait; zero tries once.
    fn wait(&self) -> Duration;
    /// Whether a waiting caller's registration is leased ([`QUEUE_LEASE`]) and must be renewed by
    /// trying again: a fair waiter's place in the queue, a lock's exclusive waiter.
    fn renews_registration(&self) -> bool;
    /// Which release messages wake this caller while it waits under the id `waiter`.
    fn wake<'w>(&self, waiter: &'w str) -> Wake<'w>;
}

/// A grant.
pub trait Grant: Send + 'static {
    /// The resource's name.
    fn name(&self) -> &str;
    /// The token of the grant (the hold or lease it is).
    fn token(&self) -> &str;
    /// The token the granting call proposed: [`Grant::token`] when that call made the grant,
    /// another when it got an existing grant back by its idempotency key. A clean-up of a grant
    /// whose caller never saw it names this one, so that it withdraws that call's claim only.
    fn call_token(&self) -> &str {
        self.token()
    }
    /// The owner it was granted to (empty for an anonymous caller).
    fn owner(&self) -> &str;
    /// The earliest moment it can expire, by this process's clock (when the call that granted it
    /// was sent, plus its remaining ttl).
    fn valid_until(&self) -> Instant;
    /// Whether what was released is not used up by this grant (permits left over), so the next
    /// waiter woken for it must be woken too.
    fn leaves_some(&self) -> bool {
        false
    }
}

/// What kept a request out.
pub trait Busy: Send + 'static {
    /// When the state may change without a release message (a lease or a registration ends).
    fn change_in(&self) -> Option<Duration>;
    /// The refusal reported for a grant that replicas did not acknowledge and that was rolled
    /// back: the state may change once `ack_timeout` has passed.
    fn unacknowledged(ack_timeout: Duration) -> Self;
}

/// What kept a request out of a resource that one holder (or a set of holders) has: how long
/// what kept it out has left, and when the state may change without a message. Locks and
/// elections report it; a primitive with more to say (a semaphore's free permits) has its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The remaining ttl of what kept the caller out (a holder's lease), when known.
    pub remaining: Option<Duration>,
    /// When the state may change without a message (a lease or a registration ends), if ever.
    pub change_in: Option<Duration>,
}

impl Busy for Refusal {
    fn change_in(&self) -> Option<Duration> {
        self.change_in
    }

    fn unacknowledged(ack_timeout: Duration) -> Self {
        Self {
            remaining: None,
            change_in: Some(ack_timeout),
        }
    }
}

/// The outcome of an acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired<G, B> {
    /// The caller holds what it asked for.
    Granted(G),
    /// It stayed out of reach for the whole wait.
    Refused(B),
}

/// How a release cleans up after a grant whose caller never saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CleanUp {
    /// How long the token stays void afterwards, so that the call that granted it, should Redis
    /// run it later, grants nothing (after a call whose reply never came); `None` for no mark.
    pub void: Option<Duration>,
}

/// One lease in a batched renewal: the resource's name, the token, the ttl (`None`: the ttl it
/// was acquired with).
pub type Renewing = (String, String, Option<Duration>);

/// One try's outcome as a primitive reports it: a grant or what kept the caller out, and the
/// replicas' acknowledgement of a grant.
pub type Tried<P> = (
    Acquired<<P as Primitive>::Grant, <P as Primitive>::Busy>,
    Ack,
);

/// A leased primitive: its key layout and scripts, as the [`Engine`] calls them.
pub trait Primitive: Send + Sync + Sized + 'static {
    /// A validated acquisition request.
    type Request: Request;
    /// A grant.
    type Grant: Grant;
    /// What kept a request out.
    type Busy: Busy;
    /// What a release reports.
    type Released: Send + 'static;
    /// The primitive's name in log lines ("lock", "semaphore").
    const KIND: &'static str;

    /// The Redis the primitive lives in.
    fn redis(&self) -> &Redis;
    /// The pub/sub channel a release of `name` is published on.
    fn channel(&self, name: &str) -> String;
    /// A key of `name`, whose hash slot all its scripts run on.
    fn slot_key(&self, name: &str) -> String;
    /// One try (one script call): grants to `token`, or registers the caller as the waiter
    /// `waiting.0` for the time left `waiting.1` and says what keeps it out. The reply comes with
    /// the replicas' acknowledgement of a grant.
    fn try_acquire(
        &self,
        request: &Self::Request,
        token: &str,
        waiting: Option<(&str, Duration)>,
    ) -> impl Future<Output = Result<Tried<Self>, Error>> + Send;
    /// Releases `token` of `name`. With `clean_up` (the clean-up of a grant whose caller never saw
    /// it), a grant a retry with its idempotency key has handed to its caller is kept (and
    /// reported not held), and the token may be made void.
    fn release(
        &self,
        name: &str,
        token: &str,
        clean_up: Option<CleanUp>,
    ) -> impl Future<Output = Result<Self::Released, Error>> + Send;
    /// Whether the token released held something.
    fn was_held(released: &Self::Released) -> bool;
    /// Removes the waiter `waiter` of `name`, waking those it held back; with `void`, the waiter
    /// id stays void that long (no late call can register it again).
    fn abandon(
        &self,
        name: &str,
        waiter: &str,
        void: Option<Duration>,
    ) -> impl Future<Output = Result<(), Error>> + Send;
    /// Sets the remaining ttl of `token` to `ttl` (or its acquisition ttl); `None` when it holds
    /// nothing; `InvalidArgument` on `ttl` (changing nothing) when the result is below `min`.
    fn refresh(
        &self,
        name: &str,
        token: &str,
        ttl: Option<Duration>,
        min: Duration,
    ) -> impl Future<Output = Result<Option<Duration>, Error>> + Send;
    /// Renews many leases in one script call (all in one hash slot on a Cluster), answering per
    /// lease in order.
    fn refresh_many(
        &self,
        leases: &[Renewing],
    ) -> impl Future<Output = Result<Vec<Renewal>, Error>> + Send;
}

/// Acquires, releases and keeps alive the leases of one primitive. Cheap to clone.
pub struct Engine<P: Primitive> {
    inner: Arc<Inner<P>>,
}

struct Inner<P: Primitive> {
    primitive: P,
    notifier: Notifier,
    /// Clean-ups and keepalive streams, which a draining server waits for.
    tasks: TaskTracker,
    /// Batches the renewals of keepalive streams.
    renewals: Batcher<Renewing>,
    /// Bounds the callers waiting at once (shared with the other primitives' engines).
    waiting: WaitLimit,
}

impl<P: Primitive> Clone for Engine<P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<P: Primitive> Engine<P> {
    /// The engine of `primitive`, its waiters woken through `notifier`; its clean-ups and
    /// keepalive streams run on `tasks`, which a draining server waits for.
    pub fn new(primitive: P, notifier: Notifier, tasks: TaskTracker, waiting: WaitLimit) -> Self {
        let inner = Arc::new_cyclic(|weak: &Weak<Inner<P>>| {
            let renewals = Batcher::for_owner(weak, |inner, leases: Vec<Renewing>| async move {
                inner.primitive.refresh_many(&leases).await
            });
            Inner {
                primitive,
                notifier,
                tasks,
                renewals,
                waiting,
            }
        });
        Self { inner }
    }

    /// The primitive, for the calls only it knows (`Describe`).
    pub fn primitive(&self) -> &P {
        &self.inner.primitive
    }

    /// Where its clean-ups and keepalive streams run.
    pub fn tasks(&self) -> &TaskTracker {
        &self.inner.tasks
    }

    /// Acquires, waiting up to the request's wait without polling.
    ///
    /// `stop` ends the wait early with the error it yields (the caller left, or shutdown). It is
    /// only raced against the waiting, never against a script call, so a grant is never lost
    /// half-way: when this returns `Granted`, the caller owns a lease it must release.
    pub async fn acquire(
        &self,
        request: &P::Request,
        stop: impl Future<Output = Error>,
    ) -> Result<Acquired<P::Grant, P::Busy>, Error> {
        // Only a caller that may wait has its wait timed (a clock read costs tens of ns).
        let may_wait = !request.wait().is_zero();
        let started = may_wait.then(Instant::now);
        let outcome = self.acquire_once(request, stop).await;
        let counted = match (&outcome, may_wait) {
            (Ok(Acquired::Granted(_)), _) => Acquisition::Acquired,
            (Ok(Acquired::Refused(_)), false) => Acquisition::NotAcquired,
            (Ok(Acquired::Refused(_)), true) => Acquisition::TimedOut,
            (Err(_), _) => Acquisition::Failed,
        };
        let waited = started.map(|s| s.elapsed());
        metrics::lease(P::KIND).acquisition(counted, waited);
        outcome
    }

    /// [`Engine::acquire`], uncounted.
    async fn acquire_once(
        &self,
        request: &P::Request,
        stop: impl Future<Output = Error>,
    ) -> Result<Acquired<P::Grant, P::Busy>, Error> {
        let name = request.name();
        let token = Uuid::new_v4().hyphenated().to_string();
        let wait = request.wait();
        let deadline = Instant::now() + wait;

        // Uncontended acquisitions cost one script call: subscribe only once the resource is
        // held. A caller that will wait registers on this first try already, so a fair one takes
        // its place in the queue in the order its request reached Redis.
        // A caller that would wait beyond the most allowed to wait at once only tries.
        let place = (!wait.is_zero())
            .then(|| self.inner.waiting.take())
            .flatten();
        let waiter = Uuid::new_v4().simple().to_string();
        let first = place.is_some().then_some((waiter.as_str(), wait));
        match self.try_once(request, &token, first).await {
            Ok(Acquired::Refused(_)) if place.is_some() => {}
            Ok(Acquired::Refused(_)) if !wait.is_zero() => {
                return Err(self.inner.waiting.refusal());
            }
            Err(e) => {
                // The script may have run and registered the waiter (a fair one holds a place in
                // the queue): take it out rather than hold the queue up until it expires.
                if first.is_some() {
                    self.abandon_in_background(
                        name,
                        &waiter,
                        Some(&e).filter(|e| unknown_outcome(e)),
                    );
                }
                return Err(e);
            }
            done => return done,
        }

        let renew_every = QUEUE_LEASE / 3;
        let _waiting = metrics::lease(P::KIND).waiter();
        let waited = wait::until(
            &self.inner.notifier,
            &self.inner.primitive.channel(name),
            request.wake(&waiter),
            deadline,
            stop,
            |left| {
                let attempt = self.try_once(request, &token, Some((&waiter, left)));
                async move {
                    Ok(match attempt.await? {
                        // What was released and is left over goes to the next local waiter.
                        Acquired::Granted(grant) if grant.leaves_some() => {
                            Attempt::Passing(Acquired::Granted(grant))
                        }
                        granted @ Acquired::Granted(_) => Attempt::Done(granted),
                        Acquired::Refused(busy) => {
                            // Leases and registrations end without a message; one more
                            // millisecond lets Redis's clock pass the expiry.
                            let change = busy.change_in().map(|c| c + Duration::from_millis(1));
                            let retry_in = if request.renews_registration() {
                                Some(change.map_or(renew_every, |c| c.min(renew_every)))
                            } else {
                                change
                            };
                            Attempt::Busy {
                                answer: Acquired::Refused(busy),
                                retry_in,
                            }
                        }
                    })
                }
            },
        )
        .await;
        match &waited {
            Ok(Acquired::Granted(_)) => {}
            Ok(Acquired::Refused(_)) => self.abandon_in_background(name, &waiter, None),
            Err(e) => {
                self.abandon_in_background(name, &waiter, Some(e).filter(|e| unknown_outcome(e)))
            }
        }
        waited
    }

    /// One try, with what the engine does for every primitive around it: a grant replicas did
    /// not acknowledge is rolled back and reported refused; a call whose reply never came may
    /// have granted, so that is released.
    async fn try_once(
        &self,
        request: &P::Request,
        token: &str,
        waiting: Option<(&str, Duration)>,
    ) -> Result<Acquired<P::Grant, P::Busy>, Error> {
        let primitive = &self.inner.primitive;
        match primitive.try_acquire(request, token, waiting).await {
            Ok((Acquired::Granted(_), Ack::Missing { replicas })) => {
                tracing::warn!(
                    kind = P::KIND,
                    name = %request.name(),
                    replicas,
                    "grant not acknowledged by enough replicas; rolled back"
                );
                // Released before the answer, so that "not acquired" leaves no lease in Redis for
                // others to meet; should that fail, it is retried in the background.
                // Named by the call's own token: a retry's claim is withdrawn, not the grant.
                let released = primitive
                    .release(request.name(), token, Some(CleanUp::default()))
                    .await;
                if released.is_err() {
                    self.release_in_background(request.name(), token, request.ttl(), None);
                }
                let wait = primitive.redis().replica_ack_timeout();
                Ok(Acquired::Refused(P::Busy::unacknowledged(wait)))
            }
            Ok((outcome, _)) => Ok(outcome),
            Err(e) if unknown_outcome(&e) => {
                // Redis may have run the script and only the reply missed the timeout, or may
                // still run it: release what it granted, and void its token.
                self.release_in_background(request.name(), token, request.ttl(), Some(&e));
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Releases `token` of `name` in a task of its own, retried until it would have expired
    /// anyway (`ttl` from now; after a failed call, see below): for grants whose caller will
    /// never see them (a reply that came too late, a caller that left, a grant replicas did not
    /// acknowledge, a call whose reply never came). `token` is the one the call proposed ([`Grant::call_token`]): the grant's
    /// own when the call made it, a retry's when the call got it again by its idempotency key,
    /// whose claim is withdrawn. The grant is released once its own call and every retry that
    /// claimed it were given up so; while one of them may have reached its caller, it is left
    /// alone. Harmless when the token holds nothing. With `unknown`, the failure of a call
    /// whose reply never came (which Redis may still run), the token is void for
    /// [`VOID_RETENTION`], so that call cannot grant with it; the release is then retried for
    /// [`VOID_RETENTION`] after [`Error::Unanswered`] (the call may run whenever Redis resumes),
    /// and tried once after any other failure (Redis was not reached, or refused the call).
    pub fn release_in_background(
        &self,
        name: &str,
        token: &str,
        ttl: Duration,
        unknown: Option<&Error>,
    ) {
        let how = CleanUp {
            void: unknown.is_some().then_some(VOID_RETENTION),
        };
        let (engine, name, token) = (self.clone(), name.to_owned(), token.to_owned());
        clean_up(
            &self.inner.tasks,
            format!("releasing an unused grant of {} {name:?}", P::KIND),
            clean_up_deadline(unknown, ttl, true),
            move || {
                let (engine, name, token) = (engine.clone(), name.clone(), token.clone());
                async move {
                    let released = engine
                        .inner
                        .primitive
                        .release(&name, &token, Some(how))
                        .await?;
                    if P::was_held(&released) {
                        tracing::info!(kind = P::KIND, %name, "released a grant whose caller never saw it");
                    }
                    Ok(())
                }
            },
        );
    }

    /// Removes a waiter that stopped waiting, waking those it held back; retried in the
    /// background for as long as its registration could last ([`QUEUE_LEASE`]). After a call
    /// whose reply never came (`unknown`, its failure), the waiter id is void, so that call,
    /// should Redis run it later, cannot register the waiter again, and the removal is retried
    /// as [`clean_up_deadline`] says.
    fn abandon_in_background(&self, name: &str, waiter: &str, unknown: Option<&Error>) {
        let void = unknown.is_some().then_some(VOID_RETENTION);
        let (engine, name, waiter) = (self.clone(), name.to_owned(), waiter.to_owned());
        clean_up(
            &self.inner.tasks,
            format!("removing a waiter of {} {name:?}", P::KIND),
            clean_up_deadline(unknown, QUEUE_LEASE, false),
            move || {
                let (engine, name, waiter) = (engine.clone(), name.clone(), waiter.clone());
                async move { engine.inner.primitive.abandon(&name, &waiter, void).await }
            },
        );
    }

    /// Releases `token` of `name`.
    pub async fn release(&self, name: &str, token: &str) -> Result<P::Released, Error> {
        self.inner.primitive.release(name, token, None).await
    }

    /// Sets the remaining ttl of `token` of `name` (see [`Primitive::refresh`]).
    pub async fn refresh(
        &self,
        name: &str,
        token: &str,
        ttl: Option<Duration>,
        min: Duration,
    ) -> Result<Option<Duration>, Error> {
        self.inner.primitive.refresh(name, token, ttl, min).await
    }

    /// The handle a keepalive stream renews (with `ttl`, or the lease's own when `None`) and
    /// releases; `owner` names it in log lines.
    pub fn lease(
        &self,
        name: String,
        token: String,
        owner: String,
        ttl: Option<Duration>,
    ) -> Handle<P> {
        Handle {
            engine: self.clone(),
            name,
            token,
            owner,
            ttl,
        }
    }
}

/// One lease of a primitive, renewable by a keepalive stream.
pub struct Handle<P: Primitive> {
    engine: Engine<P>,
    name: String,
    token: String,
    owner: String,
    ttl: Option<Duration>,
}

impl<P: Primitive> Renewable for Handle<P> {
    async fn renew(&self, by: Instant) -> Result<Option<Duration>, Error> {
        let inner = &self.engine.inner;
        let key = inner.primitive.slot_key(&self.name);
        let group = inner.primitive.redis().batch_group(&key);
        let lease = (self.name.clone(), self.token.clone(), self.ttl);
        inner.renewals.renew(lease, group, by).await
    }

    async fn release(&self) -> Result<bool, Error> {
        let released = self.engine.release(&self.name, &self.token).await?;
        Ok(P::was_held(&released))
    }

    fn describe(&self) -> Described<'_> {
        Described {
            kind: P::KIND,
            name: &self.name,
            owner: &self.owner,
        }
    }

    fn call_timeout(&self) -> Duration {
        self.engine.inner.primitive.redis().command_timeout()
    }
}

/// Whether a call that failed with `e` may have changed something in Redis that nobody will
/// hear of: [`Error::Unanswered`] (sent, and no reply came), and any other `UNAVAILABLE` too,
/// since a refusal Redis raised inside a script (an ACL denial) may come after the script's
/// first writes.
fn unknown_outcome(e: &Error) -> bool {
    matches!(e, Error::Unavailable(_) | Error::Unanswered(_))
}

/// Until when the clean-up after a call that failed with `failure` is retried: `normally` from
/// now, with two exceptions.
/// - A call sent and never answered ([`Error::Unanswered`]) may still run whenever Redis
///   resumes, past any ttl (a server paused for longer than that runs it then, with a fresh
///   expiry): its clean-up is retried for [`VOID_RETENTION`], so that it comes after it and
///   frees what it granted, or voids it first.
/// - After any other `UNAVAILABLE` (`once`), Redis either was not reached (nothing to clean up)
///   or answered with its refusal (and answers the clean-up too): one try, so that calls failing
///   during an outage leave no clean-ups retrying behind them.
fn clean_up_deadline(failure: Option<&Error>, normally: Duration, once: bool) -> Instant {
    let retried = match failure {
        Some(Error::Unanswered(_)) => normally.max(VOID_RETENTION),
        Some(_) if once => Duration::ZERO,
        _ => normally,
    };
    Instant::now() + retried
}
