//! Counting semaphores with per-holder leases, weighted permits, optional FIFO fairness, and
//! waiting woken by Redis pub/sub.
//!
//! Classic Redis semaphores each have a flaw: one that timestamps holders with the client's clock
//! lets a fast clock steal a slot, one built of several commands races between its steps (two
//! acquirers exceed the limit), and both keep a crashed holder's slot until a fixed timeout. Here
//! every step is one Lua script that reads Redis's clock, reclaims expired holders and decides in
//! the same atomic call, and each holder carries its own ttl.
//!
//! # Limit semantics
//!
//! Each request carries the limit its caller believes in; the strictest one wins. A grant needs
//! `in use + permits <= min(request limit, limit of every current holder)`, so no holder ever sees
//! more permits in use than it asked for, whatever limits other callers pass.
//!
//! # Redis layout
//!
//! Every key of the semaphore `NAME` shares the hash tag `{sem:NAME}`:
//!
//! | key | type | holds | lifetime |
//! |---|---|---|---|
//! | `PREFIX{sem:NAME}` | hash | holder records, permits in use, last limit, queue counter, queued requests | last lease or wait + 60 s |
//! | `PREFIX{sem:NAME}:holders` | sorted set | token → expiry (ms) | same |
//! | `PREFIX{sem:NAME}:limits` | sorted set | token → the holder's limit | same |
//! | `PREFIX{sem:NAME}:queue` | sorted set | fair waiter → arrival number | same |
//! | `PREFIX{sem:NAME}:waiters` | sorted set | waiter → registration expiry (ms) | same |
//! | `PREFIX{sem:NAME}:fence` | string | last fencing token issued | ttl + [`FENCE_RETENTION`](crate::lease::FENCE_RETENTION) after a grant |
//! | `PREFIX{sem:NAME}:released` | pub/sub channel | a message per release or queue move | — |
//!
//! The acquisition algorithm (waiting, clean-ups, keepalive) is the shared [`lease::Engine`];
//! this module is the semaphore's key layout and scripts ([`scripts`]), its request, grant and
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
        self, CleanUp, Engine, Primitive,
        batch::Renewal,
        engine::{Acquired, Renewing},
    },
    redis::{
        Ack, Redis, Wake,
        reply::{each_on_its_own, int, ms, string, unexpected},
    },
};
use scripts::SemaphoreKeys;

/// Semaphores stored in Redis, acquired, released and kept alive by the shared lease engine.
pub type Semaphores = Engine<Semaphore>;

/// Largest limit. It bounds the holders of one semaphore, and so the work of every script.
pub const MAX_PERMITS: u32 = 10_000;

/// A request for permits, already validated.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// The semaphore's name.
    pub name: String,
    /// The limit the caller believes in.
    pub limit: u32,
    /// Permits to take, from 1 to `limit`.
    pub permits: u32,
    /// The lease's ttl.
    pub ttl: Duration,
    /// How long to wait; zero tries once.
    pub wait: Duration,
    /// The owner label; `None` for none.
    pub owner: Option<String>,
    /// Queue in arrival order.
    pub fair: bool,
    /// A retry of an acquisition that granted a lease still held gets that lease again.
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

    /// Fair waiters hold a place in the queue.
    fn renews_registration(&self) -> bool {
        self.fair
    }

    /// A release frees at least one permit: it wakes one local non-fair single-permit waiter
    /// per limit asked for (one under a limit of 1 may not fit where one under 5 does), who
    /// passes the wake on when it leaves permits over. Fair waiters and those asking for several
    /// permits (who may not fit where a single one does) wake on every message.
    fn wake<'w>(&self, _waiter: &'w str) -> Wake<'w> {
        if !self.fair && self.permits == 1 {
            Wake::Relay(u64::from(self.limit))
        } else {
            Wake::Every
        }
    }
}

/// A granted permit lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    /// The semaphore's name.
    pub name: String,
    /// The opaque token proving the lease.
    pub token: String,
    /// The token the granting call proposed ([`lease::Grant::call_token`]).
    pub call_token: String,
    /// The lease's fencing token.
    pub fencing_token: u64,
    /// Time left on the lease when Redis answered.
    pub remaining: Duration,
    /// Permits held.
    pub permits: u32,
    /// The limit in force for the grant.
    pub limit: u32,
    /// Permits still available under that limit right after the grant (others may take them).
    pub left: u32,
    /// The owner label; empty when the request gave none.
    pub owner: String,
    /// When the successful script call was sent: the lease lasts at least until
    /// `sent_at + remaining` by this process's monotonic clock.
    pub sent_at: Instant,
}

impl lease::Grant for Permit {
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

    /// Permits left over go to the next local waiter a release woke.
    fn leaves_some(&self) -> bool {
        self.left > 0
    }
}

/// What kept a request for permits out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Permits free under the strictest limit.
    pub available: u32,
    /// Time until the earliest holder's lease expires, if any.
    pub earliest_expiry: Option<Duration>,
    /// When the state may change without a release message (a lease or a waiter registration
    /// ends), if ever.
    pub wake_in: Option<Duration>,
}

impl lease::Busy for Refusal {
    fn change_in(&self) -> Option<Duration> {
        self.wake_in
    }

    fn unacknowledged(ack_timeout: Duration) -> Self {
        Self {
            available: 0,
            earliest_expiry: None,
            wake_in: Some(ack_timeout),
        }
    }
}

/// The result of an acquisition of permits.
pub type SemaphoreAcquired = Acquired<Permit, Refusal>;

/// One unexpired lease, as `describe` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderInfo {
    /// The owner label.
    pub owner: String,
    /// Permits held.
    pub permits: u32,
    /// Time left on the lease.
    pub remaining: Duration,
    /// The lease's fencing token.
    pub fencing_token: u64,
    /// The limit the holder asked for.
    pub limit: u32,
}

/// A snapshot of one semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The limit in force.
    pub limit: u32,
    /// Permits held by unexpired leases.
    pub permits_in_use: u32,
    /// Up to [`scripts::MAX_LISTED_HOLDERS`] unexpired leases, soonest to expire first.
    pub holders: Vec<HolderInfo>,
    /// Number of unexpired leases.
    pub holder_count: u32,
    /// Callers waiting, across every Baton.
    pub waiters: u32,
    /// The latest fencing token issued within the retention (0 when none).
    pub fencing_token: u64,
}

/// The semaphore primitive: its scripts, on one Redis.
pub struct Semaphore {
    redis: Redis,
    acquire: Script,
    release: Script,
    refresh: Script,
    refresh_batch: Script,
    abandon: Script,
    describe: Script,
}

impl Semaphore {
    /// The semaphore scripts, loaded for `redis`.
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

    /// The keys of semaphore `name`.
    pub fn keys(&self, name: &str) -> SemaphoreKeys {
        SemaphoreKeys::new(self.redis.key_prefix(), name)
    }

    /// Reads the semaphore's state.
    pub async fn describe(&self, name: &str) -> Result<Description, Error> {
        let keys = self.keys(name);
        let reply: Vec<Value> = self
            .redis
            .eval(&scripts::describe(&self.describe, &keys))
            .await?;
        let [limit, in_use, count, waiters, fence, listed] = reply.as_slice() else {
            return Err(unexpected("describe reply"));
        };
        let listed: Vec<Vec<Value>> =
            redis::from_redis_value_ref(listed).map_err(|_| unexpected("describe holders"))?;
        let holders = listed
            .iter()
            .map(|h| match h.as_slice() {
                [owner, permits, remaining, fence, limit] => Ok(HolderInfo {
                    owner: string(owner)?,
                    permits: u32::try_from(int(permits)?).unwrap_or(0),
                    remaining: ms(int(remaining)?).unwrap_or_default(),
                    fencing_token: u64::try_from(int(fence)?).unwrap_or(0),
                    limit: u32::try_from(int(limit)?).unwrap_or(0),
                }),
                _ => Err(unexpected("describe holder")),
            })
            .collect::<Result<_, Error>>()?;
        Ok(Description {
            limit: u32::try_from(int(limit)?).unwrap_or(0),
            permits_in_use: u32::try_from(int(in_use)?).unwrap_or(u32::MAX),
            holders,
            holder_count: u32::try_from(int(count)?).unwrap_or(u32::MAX),
            waiters: u32::try_from(int(waiters)?).unwrap_or(u32::MAX),
            fencing_token: u64::try_from(int(fence)?).unwrap_or(0),
        })
    }
}

impl Primitive for Semaphore {
    type Request = AcquireRequest;
    type Grant = Permit;
    type Busy = Refusal;
    type Released = bool;
    const KIND: &'static str = "semaphore";

    fn redis(&self) -> &Redis {
        &self.redis
    }

    fn channel(&self, name: &str) -> String {
        self.keys(name).channel
    }

    fn slot_key(&self, name: &str) -> String {
        self.keys(name).holders
    }

    async fn try_acquire(
        &self,
        request: &AcquireRequest,
        token: &str,
        waiting: Option<(&str, Duration)>,
    ) -> Result<(SemaphoreAcquired, Ack), Error> {
        let keys = self.keys(&request.name);
        let (waiter, wait_left) = waiting.unwrap_or(("", Duration::ZERO));
        let owner = request.owner.as_deref().unwrap_or("");
        let call_token = token;
        let invocation = scripts::Acquire {
            token,
            owner,
            permits: request.permits,
            limit: request.limit,
            ttl: request.ttl,
            waiter,
            fair: request.fair,
            wait_left,
            idempotency_key: request.idempotency_key.as_deref().unwrap_or(""),
        }
        .invocation(&self.acquire, &keys);
        let sent_at = Instant::now();
        let granted = |reply: &Vec<Value>| reply.first().is_some_and(|g| int(g).ok() == Some(1));
        let (reply, ack): (Vec<Value>, Ack) = self
            .redis
            .eval_acked(&invocation, &keys.holders, granted)
            .await?;
        let outcome = match reply.as_slice() {
            [granted, fence, remaining, limit, left, token] if int(granted)? == 1 => {
                Acquired::Granted(Permit {
                    name: request.name.clone(),
                    token: string(token)?,
                    call_token: call_token.to_owned(),
                    fencing_token: u64::try_from(int(fence)?)
                        .map_err(|_| unexpected("negative fencing token"))?,
                    remaining: ms(int(remaining)?).unwrap_or(request.ttl),
                    permits: request.permits,
                    limit: u32::try_from(int(limit)?).unwrap_or(request.limit),
                    left: u32::try_from(int(left)?).unwrap_or(0),
                    owner: owner.to_owned(),
                    sent_at,
                })
            }
            [_, available, expiry, wake] => Acquired::Refused(Refusal {
                available: u32::try_from(int(available)?).unwrap_or(0),
                earliest_expiry: ms(int(expiry)?),
                wake_in: ms(int(wake)?),
            }),
            [refused] if int(refused)? == -4 => {
                return Err(Error::FailedPrecondition(
                    "idempotency_key: this key granted a different request (other permits, \
                     limit or owner); use a fresh key per acquisition"
                        .into(),
                ));
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
    ) -> Result<bool, Error> {
        let keys = self.keys(name);
        let invocation = scripts::release(&self.release, &keys, token, clean_up);
        Ok(self.redis.eval::<i64>(&invocation).await? == 1)
    }

    fn was_held(released: &bool) -> bool {
        *released
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
        let invocation = scripts::refresh(&self.refresh, &keys, token, ttl, min);
        match self.redis.eval::<i64>(&invocation).await? {
            -2 => Err(Error::invalid(
                "ttl",
                format!(
                    "the lease's acquisition ttl is below {}; pass a longer ttl",
                    humantime::format_duration(min)
                ),
            )),
            reply => Ok(ms(reply)),
        }
    }

    /// Renews several leases in one script call, each on its own: a lease whose renewal fails
    /// inside the script fails alone. The engine's batcher keeps a batch within
    /// [`lease::batch::MAX_BATCH`] leases and, on a Cluster, within one hash slot.
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
            .map(|left| left.map(ms))
            .collect())
    }
}
