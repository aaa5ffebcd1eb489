//! Distributed locks, exclusive or shared, with leases, fencing tokens, reentrancy per owner,
//! optional FIFO fairness, and waiting woken by Redis pub/sub.
//!
//! # Semantics
//!
//! - **Modes.** An exclusive lease excludes every other lease; any number of shared leases may be
//!   held at once. Each shared holder has its own lease (token, ttl, fencing token, owner).
//! - **Holds and leases.** Every grant is a hold with a token, a ttl and an expiry of its own. A
//!   lease is one owner's tenure in one mode (its id is the fencing token it was granted with);
//!   it lasts as long as its longest-lived hold, so no renewal, refresh or release of one hold
//!   shortens another's.
//! - **Reentrancy per owner.** The same owner asking again in the same mode gets one more hold of
//!   the same lease. An owner holding the lock exclusively may also take it shared: that is one
//!   more hold of its exclusive lease. An owner holding it only shared asking for it exclusively
//!   is refused ([`Error::FailedPrecondition`]): an upgrade would deadlock against the other
//!   readers (or against itself). Anonymous callers (no owner) never re-enter.
//! - **Fairness.** Fair waiters take a place in a FIFO queue and are granted in arrival order: an
//!   exclusive one when it is the head, a shared one when only shared waiters are ahead of it (at
//!   most `MAX_WAKE - 1 = 63` of them, see the prelude). Nobody else is granted while anyone is
//!   queued, so a fair waiter is never overtaken; callers without `fair` take a free lock at once
//!   when nobody is queued, and race among themselves. A release wakes only the queue's head (or
//!   the run of shared waiters at its head), by a message addressed to it. A place lasts
//!   [`QUEUE_LEASE`] unless renewed (waiters renew it about every third of that), so the place of
//!   a waiter whose Baton died is dropped in time and the waiters behind wake at its expiry.
//! - **Writers are not starved.** A fair exclusive waiter holds back every later request (the
//!   queue). A non-fair exclusive waiter registers as a *writer* (a registration leased like a
//!   queue place): while one is registered, new non-fair shared requests wait too, so the shared
//!   holders drain and the writer gets in. (Fair shared waiters, which never wait behind non-fair
//!   ones, are not held back by non-fair writers: do not mix fair readers with non-fair writers.)
//!
//! # Redis layout
//!
//! Every key of the lock `NAME` shares the hash tag `{lock:NAME}`, so one script only ever
//! touches one Redis Cluster slot:
//!
//! | key | type | holds | lifetime |
//! |---|---|---|---|
//! | `PREFIX{lock:NAME}` | hash | the leases (mode, owner, holds with token, expiry, ttl), each hold's lease, each named owner's lease, the exclusive lease, idempotency keys | the last lease |
//! | `PREFIX{lock:NAME}:leases` | sorted set | lease id → the latest expiry of its holds (ms) | same |
//! | `PREFIX{lock:NAME}:fence` | string | last fencing token issued | ttl + [`FENCE_RETENTION`] after each grant (the longest so far) |
//! | `PREFIX{lock:NAME}:waiters` | sorted set | waiter id → registration expiry (ms): fair and exclusive waiters [`QUEUE_LEASE`], renewed; shared non-fair ones their wait | until the last registration ends |
//! | `PREFIX{lock:NAME}:queue` | sorted set | `x`/`s` + fair waiter id → arrival number | same |
//! | `PREFIX{lock:NAME}:writers` | sorted set | non-fair exclusive waiter id → registration expiry (ms) | same |
//! | `PREFIX{lock:NAME}:released` | pub/sub channel | a broadcast per release that frees the lock, or `@WAITER` for the fair queue's head | — |
//!
//! Expired leases, holds and registrations are dropped by the next script that changes the lock;
//! [`Locks::describe`] ignores them without writing. `prelude.lua` describes the hash's fields.
//!
//! The gRPC handler is in [`service`]; this module knows nothing of tonic.

pub mod service;

use std::{
    future::Future,
    sync::{Arc, Weak},
    time::Duration,
};

use redis::{Script, ScriptInvocation, Value};
use tokio::time::Instant;
use uuid::Uuid;

use crate::{
    error::Error,
    lease::{
        self, Renewable,
        batch::{Batcher, Renewal},
    },
    redis::{
        Ack, Notifier, Redis, Wake,
        reply::{int, millis, ms, string, unexpected},
    },
    wait::{self, Attempt},
};

pub use crate::lease::{
    FENCE_RETENTION, MAX_IDEMPOTENCY_KEY_BYTES, MAX_NAME_BYTES, MAX_OWNER_BYTES, MAX_TTL, MAX_WAIT,
    MIN_KEEPALIVE_TTL, MIN_TTL, MIN_WAIT,
};

/// How long a waiter's registration lasts unless renewed: the place of a fair waiter in the queue,
/// and the registration of a non-fair exclusive waiter that holds new shared requests back.
/// Waiters renew it about every third of this, so the registration of a waiter whose Baton died
/// ends within this time.
pub const QUEUE_LEASE: Duration = Duration::from_secs(3);
/// Most leases [`Locks::refresh_many`] renews in one call.
pub const MAX_REFRESH_BATCH: usize = 1000;
/// Most live holds one lease may have: re-entrant acquisitions past it fail `ResourceExhausted`.
/// It bounds the work of every script that reads a lease.
pub const MAX_HOLDS: u32 = 100;

/// The full source of each lock script as Baton loads it: the shared prelude followed by the
/// script. For tools that run the scripts directly (the benchmark); like
/// [`Redis::script`](crate::redis::Redis::script), they must put `local PUBLISH = 'PUBLISH'`
/// (`'SPUBLISH'` on a Cluster) in front. Every script but `REFRESH_BATCH` takes
/// [`LockKeys::all`] as its KEYS.
pub mod source {
    macro_rules! with_prelude {
        ($file:literal) => {
            concat!(include_str!("prelude.lua"), include_str!($file))
        };
    }
    /// `acquire.lua`.
    pub const ACQUIRE: &str = with_prelude!("acquire.lua");
    /// `release.lua`.
    pub const RELEASE: &str = with_prelude!("release.lua");
    /// `refresh.lua`.
    pub const REFRESH: &str = with_prelude!("refresh.lua");
    /// `refresh_batch.lua`: KEYS [`LockKeys::for_refresh`] per hold.
    pub const REFRESH_BATCH: &str = with_prelude!("refresh_batch.lua");
    /// `abandon.lua`.
    pub const ABANDON: &str = with_prelude!("abandon.lua");
    /// `describe.lua`.
    pub const DESCRIBE: &str = with_prelude!("describe.lua");
}

/// The Redis keys and channel of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    /// Hash of the leases and their holds; expires with the last lease.
    pub state: String,
    /// Sorted set of leases by the latest expiry of their holds.
    pub leases: String,
    /// Last fencing token issued.
    pub fence: String,
    /// Sorted set of waiters by registration expiry.
    pub waiters: String,
    /// Sorted set of fair waiters by arrival.
    pub queue: String,
    /// Sorted set of non-fair exclusive waiters by registration expiry.
    pub writers: String,
    /// Channel published when a release lets waiters in.
    pub channel: String,
}

impl LockKeys {
    /// The keys of lock `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> Self {
        // Concatenated rather than formatted: built on every call.
        let state = [prefix, "{lock:", name, "}"].concat();
        Self {
            leases: [state.as_str(), ":leases"].concat(),
            fence: [state.as_str(), ":fence"].concat(),
            waiters: [state.as_str(), ":waiters"].concat(),
            queue: [state.as_str(), ":queue"].concat(),
            writers: [state.as_str(), ":writers"].concat(),
            channel: [state.as_str(), ":released"].concat(),
            state,
        }
    }

    /// Every key and the channel, in the order the scripts take them.
    pub fn all(&self) -> [&str; 7] {
        [
            &self.state,
            &self.leases,
            &self.fence,
            &self.waiters,
            &self.queue,
            &self.writers,
            &self.channel,
        ]
    }

    /// One hold's KEYS in `refresh_batch.lua`.
    pub fn for_refresh(&self) -> [&str; 2] {
        [&self.state, &self.leases]
    }
}

/// How a lock is held or requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// One holder at a time, and no shared holder meanwhile.
    #[default]
    Exclusive,
    /// Any number of shared holders at once, and no exclusive holder meanwhile.
    Shared,
}

impl Mode {
    fn code(self) -> &'static str {
        match self {
            Self::Exclusive => "x",
            Self::Shared => "s",
        }
    }

    fn from_code(code: &str) -> Result<Self, Error> {
        match code {
            "x" => Ok(Self::Exclusive),
            "s" => Ok(Self::Shared),
            _ => Err(unexpected("lock mode")),
        }
    }
}

/// A request to acquire a lock, already validated.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// The lock's name.
    pub name: String,
    /// The lease's ttl.
    pub ttl: Duration,
    /// How long to wait for a held lock; zero tries once.
    pub wait: Duration,
    /// The owner for reentrancy; `None` is an anonymous caller, which never re-enters.
    pub owner: Option<String>,
    /// Wait in arrival order.
    pub fair: bool,
    /// Exclusive or shared.
    pub mode: Mode,
    /// A retry of an acquisition that granted a hold still held gets that hold again.
    pub idempotency_key: Option<String>,
}

/// A granted lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The lock's name.
    pub name: String,
    /// The opaque token proving this hold.
    pub token: String,
    /// The fencing token of this tenure (the lease's id).
    pub fencing_token: u64,
    /// Time left on this hold when Redis answered.
    pub remaining: Duration,
    /// Live holds of the lease after this acquisition.
    pub hold_count: u32,
    /// The owner; empty for an anonymous caller.
    pub owner: String,
    /// The lease's mode (exclusive when a shared request re-entered the owner's exclusive lease).
    pub mode: Mode,
    /// When the successful script call was sent: the lease lasts at least until
    /// `sent_at + remaining` by this process's monotonic clock.
    pub sent_at: Instant,
}

/// The result of an acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The caller holds the lock.
    Granted(Lease),
    /// The lock stayed unavailable for the whole wait.
    Held {
        /// The remaining ttl of what kept the caller out (the exclusive holder, or the longest
        /// shared lease for an exclusive request), when known.
        remaining: Option<Duration>,
    },
}

/// What one attempt found when the lock was not granted.
struct Busy {
    remaining: Option<Duration>,
    /// When the state may change without a message (a lease or a registration ends), if ever.
    change_in: Option<Duration>,
}

impl From<Busy> for Acquired {
    fn from(busy: Busy) -> Self {
        Self::Held {
            remaining: busy.remaining,
        }
    }
}

/// The result of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Whether the token held the lock when the release ran.
    pub was_held: bool,
    /// Live holds left on the lease after the release; zero means the lease ended.
    pub remaining_holds: u32,
}

/// A snapshot of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The exclusive holder, if any.
    pub holder: Option<Holder>,
    /// The shared holders, if any.
    pub shared: Option<SharedHolders>,
    /// The exclusive holder's fencing token, or the latest one issued (0 when none is known).
    pub fencing_token: u64,
    /// Callers waiting, across every Baton.
    pub waiters: u32,
    /// The waiters with a place in the fair queue.
    pub queued: u32,
}

/// The exclusive holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's owner; empty for an anonymous caller.
    pub owner: String,
    /// Live holds of its lease.
    pub hold_count: u32,
    /// Time left on the lease.
    pub remaining: Option<Duration>,
}

/// The shared holders of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedHolders {
    /// How many shared leases are held.
    pub count: u32,
    /// Time left on the shared lease that ends last.
    pub longest_remaining: Option<Duration>,
    /// The shared lease that ends first.
    pub earliest: SharedHolder,
}

/// One shared lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedHolder {
    /// The holder's owner; empty for an anonymous caller.
    pub owner: String,
    /// Live holds of this lease.
    pub hold_count: u32,
    /// Time left on the lease.
    pub remaining: Option<Duration>,
    /// The lease's fencing token.
    pub fencing_token: u64,
}

/// The lock primitive. Cheap to clone.
#[derive(Clone)]
pub struct Locks {
    inner: Arc<Inner>,
}

struct Inner {
    redis: Redis,
    notifier: Notifier,
    acquire: Script,
    release: Script,
    refresh: Script,
    refresh_batch: Script,
    abandon: Script,
    describe: Script,
    /// Batches the renewals of keepalive streams (see [`crate::lease::batch`]).
    renewals: Batcher<Renewing>,
}

/// One lease in a batched renewal: lock name, token, ttl (`None`: the acquisition ttl).
type Renewing = (String, String, Option<Duration>);

fn invocation<'a>(script: &'a Script, keys: &[&str]) -> ScriptInvocation<'a> {
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(*key);
    }
    invocation
}

fn fence(v: &Value) -> Result<u64, Error> {
    u64::try_from(int(v)?).map_err(|_| unexpected("negative fencing token"))
}

fn count(v: &Value) -> Result<u32, Error> {
    Ok(u32::try_from(int(v)?.max(0)).unwrap_or(u32::MAX))
}

impl Locks {
    /// Locks stored in `redis`, with waiters woken through `notifier`.
    pub fn new(redis: Redis, notifier: Notifier) -> Self {
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| {
            let renewals = Batcher::for_owner(weak, |inner, leases: Vec<Renewing>| async move {
                Locks { inner }.refresh_many(&leases).await
            });
            Inner {
                acquire: redis.script(source::ACQUIRE),
                release: redis.script(source::RELEASE),
                refresh: redis.script(source::REFRESH),
                refresh_batch: redis.script(source::REFRESH_BATCH),
                abandon: redis.script(source::ABANDON),
                describe: redis.script(source::DESCRIBE),
                renewals,
                redis,
                notifier,
            }
        });
        Self { inner }
    }

    /// The keys of lock `name`.
    pub fn keys(&self, name: &str) -> LockKeys {
        LockKeys::new(self.inner.redis.key_prefix(), name)
    }

    /// Acquires the lock, waiting up to `request.wait` for it without polling (waiters with a
    /// leased registration, fair or exclusive, renew it about every third of [`QUEUE_LEASE`]).
    ///
    /// `stop` ends the wait early with the error it yields (the caller left, or shutdown). It is
    /// only raced against the waiting, never against a script call, so a grant is never lost
    /// half-way: when this returns `Granted`, the caller owns a hold it must release. Fails with
    /// `FailedPrecondition` when the owner holds the lock shared and asks for it exclusively.
    pub async fn acquire(
        &self,
        request: &AcquireRequest,
        stop: impl Future<Output = Error>,
    ) -> Result<Acquired, Error> {
        let keys = self.keys(&request.name);
        let token = Uuid::new_v4().hyphenated().to_string();
        let owner = request.owner.as_deref().unwrap_or("");
        let deadline = Instant::now() + request.wait;

        // Uncontended acquisitions cost one script call: subscribe only once the lock is held. A
        // caller that will wait registers on this first try already, so a fair one takes its
        // place in the queue in the order its request reached Redis.
        let waiter = Uuid::new_v4().simple().to_string();
        let first = (!request.wait.is_zero()).then_some((waiter.as_str(), request.wait));
        match self.try_acquire(&keys, request, owner, &token, first).await {
            Ok(Ok(lease)) => return Ok(Acquired::Granted(lease)),
            Ok(Err(busy)) if request.wait.is_zero() => return Ok(busy.into()),
            Ok(Err(_)) => {}
            Err(e) => {
                // The script may have run and registered the waiter (a fair one holds a place in
                // the queue): take it out rather than hold the queue up until it expires.
                if first.is_some() {
                    self.abandon_in_background(&request.name, &waiter);
                }
                return Err(e);
            }
        }

        // Fair waiters hold a place in the queue, exclusive ones a writer registration: both are
        // leased and renewed by trying again. Fair waiters are woken by messages addressed to
        // them; a release wakes one local non-fair exclusive waiter (only one can take the lock)
        // and every shared one.
        let leased = request.fair || request.mode == Mode::Exclusive;
        let renew_every = QUEUE_LEASE / 3;
        let wake = if request.fair {
            Wake::EveryAnd(&waiter)
        } else if request.mode == Mode::Exclusive {
            Wake::Relay
        } else {
            Wake::Every
        };
        let waited = wait::until_as(
            &self.inner.notifier,
            &keys.channel,
            wake,
            deadline,
            stop,
            |left| {
                let attempt =
                    self.try_acquire(&keys, request, owner, &token, Some((&waiter, left)));
                async move {
                    Ok(match attempt.await? {
                        Ok(lease) => Attempt::Done(Acquired::Granted(lease)),
                        Err(busy) => {
                            // Leases and registrations end without a message; one more
                            // millisecond lets Redis's clock pass the expiry.
                            let change = busy.change_in.map(|c| c + Duration::from_millis(1));
                            let retry_in = if leased {
                                Some(change.map_or(renew_every, |c| c.min(renew_every)))
                            } else {
                                change
                            };
                            Attempt::Busy {
                                answer: busy.into(),
                                retry_in,
                            }
                        }
                    })
                }
            },
        )
        .await;
        if !matches!(waited, Ok(Acquired::Granted(_))) {
            self.abandon_in_background(&request.name, &waiter);
        }
        waited
    }

    async fn try_acquire(
        &self,
        keys: &LockKeys,
        request: &AcquireRequest,
        owner: &str,
        token: &str,
        waiting: Option<(&str, Duration)>,
    ) -> Result<Result<Lease, Busy>, Error> {
        let (waiter, wait_left) = waiting.unwrap_or(("", Duration::ZERO));
        let mut invocation = invocation(&self.inner.acquire, &keys.all());
        invocation
            .arg(owner)
            .arg(token)
            .arg(millis(request.ttl))
            .arg(waiter)
            .arg(millis(wait_left))
            .arg(millis(FENCE_RETENTION))
            .arg(if request.fair { "1" } else { "0" })
            .arg(request.mode.code())
            .arg(millis(QUEUE_LEASE))
            .arg(request.idempotency_key.as_deref().unwrap_or(""))
            .arg(MAX_HOLDS);
        let sent_at = Instant::now();
        let granted = |reply: &Vec<Value>| reply.first().is_some_and(|g| int(g).ok() == Some(1));
        let acked = self
            .inner
            .redis
            .eval_acked(&invocation, &keys.state, granted)
            .await;
        let reply: Vec<Value> = match acked {
            Ok((reply, Ack::Missing { replicas })) => {
                // Not confirmed by enough replicas: undo this hold and report it as not made.
                tracing::warn!(lock = %request.name, replicas, "grant not acknowledged by enough replicas; rolled back");
                if let [_, granted, ..] = reply.as_slice() {
                    self.release_in_background(&request.name, &string(granted)?, request.ttl);
                }
                return Ok(Err(Busy {
                    remaining: None,
                    change_in: Some(self.inner.redis.replica_ack_timeout()),
                }));
            }
            Ok((reply, _)) => reply,
            Err(e @ Error::Unavailable(_)) => {
                // Redis may have run the script and only the reply missed the timeout.
                self.release_in_background(&request.name, token, request.ttl);
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        match reply.as_slice() {
            [granted, token, fencing, remaining, holds, mode] if int(granted)? == 1 => {
                Ok(Ok(Lease {
                    name: request.name.clone(),
                    token: string(token)?,
                    fencing_token: fence(fencing)?,
                    remaining: ms(int(remaining)?).unwrap_or(request.ttl),
                    hold_count: count(holds)?,
                    owner: owner.to_owned(),
                    mode: Mode::from_code(&string(mode)?)?,
                    sent_at,
                }))
            }
            [_, remaining, change] => Ok(Err(Busy {
                remaining: ms(int(remaining)?),
                change_in: ms(int(change)?),
            })),
            [refused] => match int(refused)? {
                -1 => Err(Error::FailedPrecondition(
                    "the owner holds this lock shared; it cannot also take it exclusively (an \
                     upgrade would deadlock against the other shared holders): release the \
                     shared lease first"
                        .into(),
                )),
                -3 => Err(Error::ResourceExhausted(format!(
                    "the owner's lease of this lock already has {MAX_HOLDS} holds; release some \
                     first"
                ))),
                -4 => Err(Error::FailedPrecondition(
                    "idempotency_key: this key granted a hold to another owner or in the other \
                     mode; use a fresh key per acquisition"
                        .into(),
                )),
                _ => Err(unexpected("acquire reply")),
            },
            _ => Err(unexpected("acquire reply")),
        }
    }

    /// Releases the hold `token` of lock `name` in a task of its own, retried until it would have
    /// expired anyway (`ttl` from now): for grants whose caller will never see them (an answer
    /// that came too late, a caller that left, a grant replicas did not acknowledge). Harmless
    /// when the token holds nothing; a hold that its caller's retry with the same idempotency key
    /// has claimed meanwhile is left alone.
    pub fn release_in_background(&self, name: &str, token: &str, ttl: Duration) {
        let (locks, name, token) = (self.clone(), name.to_owned(), token.to_owned());
        lease::clean_up(
            format!("releasing an unused hold of lock {name:?}"),
            Instant::now() + ttl,
            move || {
                let (locks, name, token) = (locks.clone(), name.clone(), token.clone());
                async move {
                    if locks.release_as(&name, &token, true).await?.was_held {
                        tracing::info!(lock = %name, "released a hold whose caller never saw it");
                    }
                    Ok(())
                }
            },
        );
    }

    /// Removes a waiter that stopped waiting, waking those it held back; retried in the
    /// background for as long as its registration could last ([`QUEUE_LEASE`]).
    fn abandon_in_background(&self, name: &str, waiter: &str) {
        let (locks, name, waiter) = (self.clone(), name.to_owned(), waiter.to_owned());
        lease::clean_up(
            format!("removing a waiter of lock {name:?}"),
            Instant::now() + QUEUE_LEASE,
            move || {
                let (locks, name, waiter) = (locks.clone(), name.clone(), waiter.clone());
                async move {
                    let keys = locks.keys(&name);
                    let mut invocation = invocation(&locks.inner.abandon, &keys.all());
                    invocation.arg(&waiter);
                    locks.inner.redis.eval::<i64>(&invocation).await.map(drop)
                }
            },
        );
    }

    /// Ends the hold `token` (exclusive or shared) of lock `name`.
    pub async fn release(&self, name: &str, token: &str) -> Result<Released, Error> {
        self.release_as(name, token, false).await
    }

    /// [`release`](Self::release), that with `unclaimed_only` keeps (and reports not held) a
    /// hold that a retry with its idempotency key has handed to its caller.
    async fn release_as(
        &self,
        name: &str,
        token: &str,
        unclaimed_only: bool,
    ) -> Result<Released, Error> {
        let keys = self.keys(name);
        let mut invocation = invocation(&self.inner.release, &keys.all());
        invocation
            .arg(token)
            .arg(if unclaimed_only { "1" } else { "0" });
        let reply: Vec<i64> = self.inner.redis.eval(&invocation).await?;
        match reply.as_slice() {
            [held, left] => Ok(Released {
                was_held: *held == 1,
                remaining_holds: u32::try_from(*left).unwrap_or(0),
            }),
            _ => Err(unexpected("release reply")),
        }
    }

    /// Sets the remaining ttl of the hold `token` (exclusive or shared) to `ttl` (or its
    /// acquisition ttl). Returns the new remaining ttl, or `None` when the token holds nothing.
    pub async fn refresh(
        &self,
        name: &str,
        token: &str,
        ttl: Option<Duration>,
    ) -> Result<Option<Duration>, Error> {
        self.refresh_at_least(name, token, ttl, Duration::ZERO)
            .await
    }

    /// Like [`refresh`](Self::refresh), but changes nothing and fails with `InvalidArgument` on
    /// `ttl` when the resulting ttl would be below `min`.
    pub async fn refresh_at_least(
        &self,
        name: &str,
        token: &str,
        ttl: Option<Duration>,
        min: Duration,
    ) -> Result<Option<Duration>, Error> {
        let keys = self.keys(name);
        let mut invocation = invocation(&self.inner.refresh, &keys.all());
        invocation
            .arg(token)
            .arg(ttl.map_or(0, millis))
            .arg(millis(min));
        match self.inner.redis.eval::<i64>(&invocation).await? {
            -2 => Err(Error::invalid(
                "ttl",
                format!(
                    "the hold's acquisition ttl is below {}; pass a longer ttl",
                    humantime::format_duration(min)
                ),
            )),
            reply => Ok(ms(reply)),
        }
    }

    /// Renews many holds (exclusive or shared) in one script call: each `(name, token, ttl)`
    /// gets `ttl` (or, when `None`, its acquisition ttl). Returns, in the same order, each hold's
    /// new remaining ttl, `None` when its token no longer holds the lock, or an error for a hold
    /// whose renewal failed inside the script (the others are renewed regardless).
    ///
    /// The caller keeps each batch to at most [`MAX_REFRESH_BATCH`] holds (more is an `Internal`
    /// error, and nothing is sent) and, on a Redis Cluster, to names whose keys share one hash
    /// slot (`{lock:NAME}` is hashed; a batch spanning slots fails with Redis's `CROSSSLOT`).
    /// Unlike [`refresh_at_least`](Self::refresh_at_least) it does not check a minimum ttl.
    pub async fn refresh_many<N, T>(
        &self,
        leases: &[(N, T, Option<Duration>)],
    ) -> Result<Vec<Renewal>, Error>
    where
        N: AsRef<str>,
        T: AsRef<str>,
    {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        if leases.len() > MAX_REFRESH_BATCH {
            return Err(Error::Internal(format!(
                "a refresh batch of {} leases is over the {MAX_REFRESH_BATCH} allowed",
                leases.len()
            )));
        }
        let mut invocation = self.inner.refresh_batch.prepare_invoke();
        for (name, token, ttl) in leases {
            let keys = self.keys(name.as_ref());
            for key in keys.for_refresh() {
                invocation.key(key);
            }
            invocation.arg(token.as_ref()).arg(ttl.map_or(0, millis));
        }
        let reply: Vec<i64> = self.inner.redis.eval(&invocation).await?;
        if reply.len() != leases.len() {
            return Err(unexpected("refresh batch reply"));
        }
        Ok(reply.into_iter().map(renewal).collect())
    }

    /// Reads the lock's state.
    pub async fn describe(&self, name: &str) -> Result<Description, Error> {
        let keys = self.keys(name);
        let invocation = invocation(&self.inner.describe, &keys.all());
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
        let [
            mode,
            owner,
            holds,
            fencing,
            remaining,
            waiters,
            shared_count,
            queued,
            earliest,
        ] = reply.as_slice()
        else {
            return Err(unexpected("describe reply"));
        };
        let earliest: Vec<Value> =
            redis::from_redis_value_ref(earliest).map_err(|_| unexpected("describe holder"))?;
        let (holder, shared) = match string(mode)?.as_str() {
            "x" => (
                Some(Holder {
                    owner: string(owner)?,
                    hold_count: count(holds)?,
                    remaining: ms(int(remaining)?),
                }),
                None,
            ),
            "s" => {
                let [e_owner, e_holds, e_remaining, e_fence] = earliest.as_slice() else {
                    return Err(unexpected("describe shared holder"));
                };
                let shared = SharedHolders {
                    count: count(shared_count)?,
                    longest_remaining: ms(int(remaining)?),
                    earliest: SharedHolder {
                        owner: string(e_owner)?,
                        hold_count: count(e_holds)?,
                        remaining: ms(int(e_remaining)?),
                        fencing_token: u64::try_from(int(e_fence)?).unwrap_or(0),
                    },
                };
                (None, Some(shared))
            }
            _ => (None, None),
        };
        Ok(Description {
            holder,
            shared,
            fencing_token: u64::try_from(int(fencing)?).unwrap_or(0),
            waiters: count(waiters)?,
            queued: count(queued)?,
        })
    }

    /// A handle that renews and releases one hold (exclusive or shared), for keepalive streams;
    /// `owner` only names it in log lines.
    pub fn lease_handle(
        &self,
        name: String,
        token: String,
        owner: String,
        ttl: Option<Duration>,
    ) -> LockLease {
        LockLease {
            locks: self.clone(),
            name,
            token,
            owner,
            ttl,
        }
    }
}

/// Reads one entry of a batched renewal's reply (see `refresh_batch.lua`).
fn renewal(left: i64) -> Renewal {
    match left {
        0 => Ok(None),
        left if left > 0 => Ok(ms(left)),
        _ => Err(Error::Internal(
            "the renewal of this lease failed in Redis (a key of the wrong type?)".into(),
        )),
    }
}

/// One hold of a lock, renewable by a keepalive stream.
pub struct LockLease {
    locks: Locks,
    name: String,
    token: String,
    owner: String,
    ttl: Option<Duration>,
}

impl Renewable for LockLease {
    async fn renew(&self, by: Instant) -> Result<Option<Duration>, Error> {
        let inner = &self.locks.inner;
        let group = inner.redis.batch_group(&self.locks.keys(&self.name).state);
        let lease = (self.name.clone(), self.token.clone(), self.ttl);
        inner.renewals.renew(lease, group, by).await
    }

    async fn release(&self) -> Result<bool, Error> {
        Ok(self.locks.release(&self.name, &self.token).await?.was_held)
    }

    fn describe(&self) -> String {
        format!("lock {:?} owner {:?}", self.name, self.owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::hash_tag;

    /// Every key of a lock carries the same non-empty hash tag, whatever the name contains.
    #[test]
    fn keys_share_one_hash_tag() {
        for name in ["orders", "}", "{}", "a}b{c", "ünïcødé", ""] {
            let keys = LockKeys::new("baton:", name);
            let tag = |k: &str| {
                hash_tag(k)
                    .unwrap_or_else(|| panic!("{k} has no hash tag"))
                    .to_owned()
            };
            let t = tag(&keys.state);
            for key in keys.all() {
                assert_eq!(tag(key), t, "{name}: {key}");
            }
        }
    }

    /// The prelude names the keys in the order [`LockKeys::all`] passes them.
    #[test]
    fn prelude_takes_the_keys_in_order() {
        let prelude = include_str!("prelude.lua");
        let names = [
            "state", "leases", "fence", "waiters", "queue", "writers", "channel",
        ];
        let keys = LockKeys::new("baton:", "orders");
        for (i, (name, key)) in names.iter().zip(keys.all()).enumerate() {
            assert!(
                prelude.contains(&format!("{name} = KEYS[{}]", i + 1)),
                "the prelude reads {name} from KEYS[{}]",
                i + 1
            );
            assert!(key.starts_with(&keys.state), "{key}");
        }
    }
}
