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
//!   [`QUEUE_LEASE`](crate::lease::QUEUE_LEASE) unless renewed (waiters renew it about every third of that), so the place of
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
//! | `PREFIX{lock:NAME}:fence` | string | last fencing token issued | ttl + [`FENCE_RETENTION`](crate::lease::FENCE_RETENTION) after each grant (the longest so far) |
//! | `PREFIX{lock:NAME}:waiters` | sorted set | waiter id → registration expiry (ms): fair and exclusive waiters [`QUEUE_LEASE`](crate::lease::QUEUE_LEASE), renewed; shared non-fair ones their wait | until the last registration ends |
//! | `PREFIX{lock:NAME}:queue` | sorted set | `x`/`s` + fair waiter id → arrival number | same |
//! | `PREFIX{lock:NAME}:writers` | sorted set | non-fair exclusive waiter id → registration expiry (ms) | same |
//! | `PREFIX{lock:NAME}:released` | pub/sub channel | a broadcast per release that frees the lock, or `@WAITER` for the fair queue's head | — |
//!
//! Expired leases, holds and registrations are dropped by the next script that changes the lock;
//! [`Lock::describe`] ignores them without writing. `prelude.lua` describes the hash's fields.
//!
//! The acquisition algorithm (waiting, clean-ups, keepalive) is the shared [`lease::Engine`];
//! this module is the lock's key layout and scripts ([`scripts`]), its request, grant and
//! refusal, and `Describe`. The gRPC handler is in [`service`]; this module knows nothing of
//! tonic.

pub mod scripts;
pub mod service;

use std::time::Duration;

use redis::{Script, Value};
use tokio::time::Instant;

use crate::{
    error::Error,
    lease::{
        self, CleanUp, Engine, Primitive, Refusal,
        batch::Renewal,
        engine::{Acquired, Renewing},
    },
    redis::{
        Ack, Redis, Wake,
        reply::{each_on_its_own, int, ms, string, unexpected},
    },
};
use scripts::{LockKeys, MAX_HOLDS};

/// Locks stored in Redis, acquired, released and kept alive by the shared lease engine.
pub type Locks = Engine<Lock>;

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
    /// The mode as the scripts write it.
    pub fn code(self) -> &'static str {
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
    /// The hold's ttl.
    pub ttl: Duration,
    /// How long to wait for a held lock; zero tries once.
    pub wait: Duration,
    /// The owner for re-entrancy; `None` is an anonymous caller, which never re-enters.
    pub owner: Option<String>,
    /// Wait in arrival order.
    pub fair: bool,
    /// Exclusive or shared.
    pub mode: Mode,
    /// A retry of an acquisition that granted a hold still held gets that hold again.
    pub idempotency_key: Option<String>,
}

impl lease::Request for AcquireRequest {
    fn name(&self) -> &str {
        &self.name
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn wait(&self) -> Duration {
        self.wait
    }

    /// Fair waiters hold a place in the queue, exclusive ones a writer registration.
    fn renews_registration(&self) -> bool {
        self.fair || self.mode == Mode::Exclusive
    }

    /// Fair waiters are woken by messages addressed to them; a release wakes one local non-fair
    /// exclusive waiter (only one can take the lock) and every shared one.
    fn wake<'w>(&self, waiter: &'w str) -> Wake<'w> {
        if self.fair {
            Wake::EveryAnd(waiter)
        } else if self.mode == Mode::Exclusive {
            Wake::Relay(0)
        } else {
            Wake::Every
        }
    }
}

/// A granted hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The lock's name.
    pub name: String,
    /// The opaque token proving this hold.
    pub token: String,
    /// The token the granting call proposed ([`lease::Grant::call_token`]).
    pub call_token: String,
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
    /// When the successful script call was sent: the hold lasts at least until
    /// `sent_at + remaining` by this process's monotonic clock.
    pub sent_at: Instant,
}

impl lease::Grant for Lease {
    fn name(&self) -> &str {
        &self.name
    }

    fn token(&self) -> &str {
        &self.token
    }

    fn call_token(&self) -> &str {
        &self.call_token
    }

    fn owner(&self) -> &str {
        &self.owner
    }

    fn valid_until(&self) -> Instant {
        self.sent_at + self.remaining
    }
}

/// The result of a lock acquisition.
pub type LockAcquired = Acquired<Lease, Refusal>;

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

/// The lock primitive: its scripts, on one Redis.
pub struct Lock {
    redis: Redis,
    acquire: Script,
    release: Script,
    refresh: Script,
    refresh_batch: Script,
    abandon: Script,
    describe: Script,
}

impl Lock {
    /// The lock scripts, loaded for `redis`.
    pub fn new(redis: Redis) -> Self {
        Self {
            acquire: redis.script(scripts::ACQUIRE),
            release: redis.script(scripts::RELEASE),
            refresh: redis.script(scripts::REFRESH),
            refresh_batch: redis.script(scripts::REFRESH_BATCH),
            abandon: redis.script(scripts::ABANDON),
            describe: redis.script(scripts::DESCRIBE),
            redis,
        }
    }

    /// The keys of lock `name`.
    pub fn keys(&self, name: &str) -> LockKeys {
        LockKeys::new(self.redis.key_prefix(), name)
    }

    /// Reads the lock's state.
    pub async fn describe(&self, name: &str) -> Result<Description, Error> {
        let keys = self.keys(name);
        let reply: Vec<Value> = self
            .redis
            .eval(&scripts::describe(&self.describe, &keys))
            .await?;
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
}

impl Primitive for Lock {
    type Request = AcquireRequest;
    type Grant = Lease;
    type Busy = Refusal;
    type Released = Released;
    const KIND: &'static str = "lock";

    fn redis(&self) -> &Redis {
        &self.redis
    }

    fn channel(&self, name: &str) -> String {
        self.keys(name).channel
    }

    fn slot_key(&self, name: &str) -> String {
        self.keys(name).state
    }

    async fn try_acquire(
        &self,
        request: &AcquireRequest,
        token: &str,
        waiting: Option<(&str, Duration)>,
    ) -> Result<(LockAcquired, Ack), Error> {
        let keys = self.keys(&request.name);
        let (waiter, wait_left) = waiting.unwrap_or(("", Duration::ZERO));
        let owner = request.owner.as_deref().unwrap_or("");
        let call_token = token;
        let invocation = scripts::Acquire {
            owner,
            token,
            ttl: request.ttl,
            waiter,
            wait_left,
            fair: request.fair,
            mode: request.mode,
            idempotency_key: request.idempotency_key.as_deref().unwrap_or(""),
        }
        .invocation(&self.acquire, &keys);
        let sent_at = Instant::now();
        let granted = |reply: &Vec<Value>| reply.first().is_some_and(|g| int(g).ok() == Some(1));
        let (reply, ack): (Vec<Value>, Ack) = self
            .redis
            .eval_acked(&invocation, &keys.state, granted)
            .await?;
        let outcome = match reply.as_slice() {
            [granted, token, fencing, remaining, holds, mode] if int(granted)? == 1 => {
                Acquired::Granted(Lease {
                    name: request.name.clone(),
                    token: string(token)?,
                    call_token: call_token.to_owned(),
                    fencing_token: fence(fencing)?,
                    remaining: ms(int(remaining)?).unwrap_or(request.ttl),
                    hold_count: count(holds)?,
                    owner: owner.to_owned(),
                    mode: Mode::from_code(&string(mode)?)?,
                    sent_at,
                })
            }
            [_, remaining, change] => Acquired::Refused(Refusal {
                remaining: ms(int(remaining)?),
                change_in: ms(int(change)?),
            }),
            [refused] => {
                return Err(match int(refused)? {
                    -1 => Error::FailedPrecondition(
                        "the owner holds this lock shared; it cannot also take it exclusively \
                         (an upgrade would deadlock against the other shared holders): release \
                         the shared lease first"
                            .into(),
                    ),
                    -3 => Error::ResourceExhausted(format!(
                        "the owner's lease of this lock already has {MAX_HOLDS} holds; release \
                         some first"
                    )),
                    -4 => Error::FailedPrecondition(
                        "idempotency_key: this key granted a hold to another owner or in the \
                         other mode; use a fresh key per acquisition"
                            .into(),
                    ),
                    _ => unexpected("acquire reply"),
                });
            }
            _ => return Err(unexpected("acquire reply")),
        };
        Ok((outcome, ack))
    }

    async fn release(
        &self,
        name: &str,
        token: &str,
        clean_up: Option<CleanUp>,
    ) -> Result<Released, Error> {
        let keys = self.keys(name);
        let invocation = scripts::Release { token, clean_up }.invocation(&self.release, &keys);
        let reply: Vec<i64> = self.redis.eval(&invocation).await?;
        match reply.as_slice() {
            [held, left] => Ok(Released {
                was_held: *held == 1,
                remaining_holds: u32::try_from(*left).unwrap_or(0),
            }),
            _ => Err(unexpected("release reply")),
        }
    }

    fn was_held(released: &Released) -> bool {
        released.was_held
    }

    async fn abandon(&self, name: &str, waiter: &str, void: Option<Duration>) -> Result<(), Error> {
        let keys = self.keys(name);
        let invocation = scripts::abandon(&self.abandon, &keys, waiter, void);
        self.redis.eval::<i64>(&invocation).await.map(drop)
    }

    async fn refresh(
        &self,
        name: &str,
        token: &str,
        ttl: Option<Duration>,
        min: Duration,
    ) -> Result<Option<Duration>, Error> {
        let keys = self.keys(name);
        let invocation = scripts::Refresh { token, ttl, min }.invocation(&self.refresh, &keys);
        match self.redis.eval::<i64>(&invocation).await? {
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

    /// Renews many holds (exclusive or shared) in one script call, each on its own: a hold whose
    /// renewal fails inside the script fails alone. The engine's batcher keeps a batch within
    /// [`lease::batch::MAX_BATCH`] holds and, on a Cluster, within one hash slot.
    async fn refresh_many(&self, leases: &[Renewing]) -> Result<Vec<Renewal>, Error> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = self.refresh_batch.prepare_invoke();
        for (name, token, ttl) in leases {
            scripts::add_to_batch(&mut invocation, &self.keys(name), token, *ttl);
        }
        let reply = self.redis.eval(&invocation).await?;
        Ok(each_on_its_own(reply, leases.len())?
            .into_iter()
            .map(|left| left.map(|left| ms(left).filter(|left| !left.is_zero())))
            .collect())
    }
}

fn fence(v: &Value) -> Result<u64, Error> {
    u64::try_from(int(v)?).map_err(|_| unexpected("negative fencing token"))
}

fn count(v: &Value) -> Result<u32, Error> {
    Ok(u32::try_from(int(v)?.max(0)).unwrap_or(u32::MAX))
}
