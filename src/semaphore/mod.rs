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
//! | `PREFIX{sem:NAME}:fence` | string | last fencing token issued | ttl + [`FENCE_RETENTION`] after a grant |
//! | `PREFIX{sem:NAME}:released` | pub/sub channel | a message per release or queue move | — |
//!
//! The gRPC handler is in [`service`]; this module knows nothing of tonic.

pub mod service;

use std::{
    future::Future,
    sync::{Arc, Weak},
    time::Duration,
};

use redis::{Script, Value};
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

/// Largest limit. It bounds the holders of one semaphore, and so the work of every script.
pub const MAX_LIMIT: u32 = 10_000;
/// How long a fair waiter's place in the queue lasts unless renewed. Waiters renew it about every
/// third of this, so the place of a waiter whose Baton died is freed within this time.
pub const QUEUE_LEASE: Duration = Duration::from_secs(3);
/// Most holders `Describe` lists.
pub const MAX_LISTED_HOLDERS: u32 = 100;

/// The Redis keys and channel of one semaphore, in the order every script expects them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemaphoreKeys {
    /// Sorted set of holders by expiry.
    pub holders: String,
    /// Hash of holder records and counters.
    pub data: String,
    /// Sorted set of holders by the limit they asked for.
    pub limits: String,
    /// Sorted set of fair waiters by arrival.
    pub queue: String,
    /// Sorted set of waiters by registration expiry.
    pub waiters: String,
    /// Last fencing token issued.
    pub fence: String,
    /// Channel published on every release and queue move.
    pub channel: String,
}

impl SemaphoreKeys {
    /// The keys of semaphore `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> Self {
        // Concatenated rather than formatted: built twice per call.
        let data = [prefix, "{sem:", name, "}"].concat();
        Self {
            holders: [data.as_str(), ":holders"].concat(),
            limits: [data.as_str(), ":limits"].concat(),
            queue: [data.as_str(), ":queue"].concat(),
            waiters: [data.as_str(), ":waiters"].concat(),
            fence: [data.as_str(), ":fence"].concat(),
            channel: [data.as_str(), ":released"].concat(),
            data,
        }
    }

    fn all(&self) -> [&str; 7] {
        [
            &self.holders,
            &self.data,
            &self.limits,
            &self.queue,
            &self.waiters,
            &self.fence,
            &self.channel,
        ]
    }
}

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

/// A granted permit lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    /// The semaphore's name.
    pub name: String,
    /// The opaque token proving the lease.
    pub token: String,
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

/// The result of an acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The caller holds the permits.
    Granted(Permit),
    /// The permits stayed unavailable for the whole wait.
    Unavailable {
        /// Permits free under the strictest limit.
        available: u32,
        /// Time until the earliest holder's lease expires, if any.
        earliest_expiry: Option<Duration>,
    },
}

/// What one attempt found when the permits were not granted.
struct Busy {
    available: u32,
    earliest_expiry: Option<Duration>,
    /// When the state may change without a release message (a lease or a waiter registration
    /// ends), if ever.
    wake_in: Option<Duration>,
}

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
    /// Up to [`MAX_LISTED_HOLDERS`] unexpired leases, soonest to expire first.
    pub holders: Vec<HolderInfo>,
    /// Number of unexpired leases.
    pub holder_count: u32,
    /// Callers waiting, across every Baton.
    pub waiters: u32,
    /// The latest fencing token issued within the retention (0 when none).
    pub fencing_token: u64,
}

impl From<Busy> for Acquired {
    fn from(busy: Busy) -> Self {
        Self::Unavailable {
            available: busy.available,
            earliest_expiry: busy.earliest_expiry,
        }
    }
}

/// The semaphore primitive. Cheap to clone.
#[derive(Clone)]
pub struct Semaphores {
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

/// One lease in a batched renewal: semaphore name, token, ttl (`None`: the acquisition ttl).
type Renewing = (String, String, Option<Duration>);

macro_rules! script {
    ($redis:expr, $file:literal) => {
        $redis.script(concat!(include_str!("prelude.lua"), include_str!($file)))
    };
}

impl Semaphores {
    /// Semaphores stored in `redis`, with waiters woken through `notifier`.
    pub fn new(redis: Redis, notifier: Notifier) -> Self {
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| {
            let renewals = Batcher::for_owner(weak, |inner, leases: Vec<Renewing>| async move {
                Semaphores { inner }.refresh_many(&leases).await
            });
            Inner {
                acquire: script!(redis, "acquire.lua"),
                release: script!(redis, "release.lua"),
                refresh: script!(redis, "refresh.lua"),
                refresh_batch: script!(redis, "refresh_batch.lua"),
                abandon: script!(redis, "abandon.lua"),
                describe: script!(redis, "describe.lua"),
                renewals,
                redis,
                notifier,
            }
        });
        Self { inner }
    }

    /// The keys of semaphore `name`.
    pub fn keys(&self, name: &str) -> SemaphoreKeys {
        SemaphoreKeys::new(self.inner.redis.key_prefix(), name)
    }

    fn invocation<'a>(
        &'a self,
        script: &'a Script,
        keys: &SemaphoreKeys,
    ) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.prepare_invoke();
        for key in keys.all() {
            invocation.key(key);
        }
        invocation
    }

    /// Acquires permits, waiting up to `request.wait` without polling (fair waiters renew their
    /// place in the queue about every third of [`QUEUE_LEASE`]).
    ///
    /// `stop` ends the wait early with the error it yields; it is never raced against a script
    /// call, so a returned `Granted` is always a lease the caller must release.
    pub async fn acquire(
        &self,
        request: &AcquireRequest,
        stop: impl Future<Output = Error>,
    ) -> Result<Acquired, Error> {
        let keys = self.keys(&request.name);
        let token = Uuid::new_v4().hyphenated().to_string();
        let owner = request.owner.as_deref().unwrap_or("");
        let deadline = Instant::now() + request.wait;

        // Uncontended acquisitions cost one script call: subscribe only when they must wait. A
        // caller that will wait registers on this first try already, so a fair one takes its
        // place in the queue in the order its request reached Redis.
        let waiter = Uuid::new_v4().simple().to_string();
        let first = (!request.wait.is_zero()).then_some((waiter.as_str(), request.wait));
        match self.try_acquire(&keys, request, owner, &token, first).await {
            Ok(Ok(permit)) => return Ok(Acquired::Granted(permit)),
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

        let renew_place = QUEUE_LEASE / 3;
        // A release frees at least one permit: it wakes one local non-fair single-permit waiter,
        // who passes the wake on when it leaves permits over. Fair waiters and those asking for
        // several permits (who may not fit where a single one does) wake on every message.
        let wake = if !request.fair && request.permits == 1 {
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
                        // Permits left over go to the next local waiter a release woke.
                        Ok(permit) if permit.left > 0 => {
                            Attempt::Passing(Acquired::Granted(permit))
                        }
                        Ok(permit) => Attempt::Done(Acquired::Granted(permit)),
                        Err(busy) => {
                            // Leases and registrations end without a message; one more
                            // millisecond lets Redis's clock pass the expiry.
                            let wake = busy.wake_in.map(|w| w + Duration::from_millis(1));
                            // Fair waiters also renew their place in the queue.
                            let retry_in = if request.fair {
                                Some(wake.map_or(renew_place, |w| w.min(renew_place)))
                            } else {
                                wake
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
        keys: &SemaphoreKeys,
        request: &AcquireRequest,
        owner: &str,
        token: &str,
        waiting: Option<(&str, Duration)>,
    ) -> Result<Result<Permit, Busy>, Error> {
        let (waiter, wait_left) = waiting.unwrap_or(("", Duration::ZERO));
        let mut invocation = self.invocation(&self.inner.acquire, keys);
        invocation
            .arg(token)
            .arg(owner)
            .arg(request.permits)
            .arg(request.limit)
            .arg(millis(request.ttl))
            .arg(waiter)
            .arg(if request.fair { "1" } else { "0" })
            .arg(millis(wait_left))
            .arg(millis(QUEUE_LEASE))
            .arg(millis(FENCE_RETENTION))
            .arg(request.idempotency_key.as_deref().unwrap_or(""));
        let sent_at = Instant::now();
        let granted = |reply: &Vec<Value>| reply.first().is_some_and(|g| int(g).ok() == Some(1));
        let acked = self
            .inner
            .redis
            .eval_acked(&invocation, &keys.holders, granted)
            .await;
        let reply: Vec<Value> = match acked {
            Ok((reply, Ack::Missing { replicas })) => {
                // Not confirmed by enough replicas: undo the grant and report it as not made.
                tracing::warn!(semaphore = %request.name, replicas, "grant not acknowledged by enough replicas; rolled back");
                let granted = match reply.get(5) {
                    Some(granted) => string(granted)?,
                    None => token.to_owned(),
                };
                self.release_in_background(&request.name, &granted, request.ttl);
                return Ok(Err(Busy {
                    available: 0,
                    earliest_expiry: None,
                    wake_in: Some(self.inner.redis.replica_ack_timeout()),
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
            [granted, fence, remaining, limit, left, token] if int(granted)? == 1 => {
                Ok(Ok(Permit {
                    name: request.name.clone(),
                    token: string(token)?,
                    fencing_token: u64::try_from(int(fence)?)
                        .map_err(|_| unexpected("negative fencing token"))?,
                    remaining: ms(int(remaining)?).unwrap_or(request.ttl),
                    permits: request.permits,
                    limit: u32::try_from(int(limit)?).unwrap_or(request.limit),
                    left: u32::try_from(int(left)?).unwrap_or(0),
                    owner: owner.to_owned(),
                    sent_at,
                }))
            }
            [_, available, expiry, wake] => Ok(Err(Busy {
                available: u32::try_from(int(available)?).unwrap_or(0),
                earliest_expiry: ms(int(expiry)?),
                wake_in: ms(int(wake)?),
            })),
            [refused] if int(refused)? == -4 => Err(Error::FailedPrecondition(
                "idempotency_key: this key granted a different request (other permits, limit or \
                 owner); use a fresh key per acquisition"
                    .into(),
            )),
            _ => Err(unexpected("acquire reply")),
        }
    }

    /// Releases the lease `token` of semaphore `name` in a task of its own, retried until it
    /// would have expired anyway (`ttl` from now): for grants whose caller will never see them.
    /// Harmless when the token holds nothing; a lease that its caller's retry with the same
    /// idempotency key has claimed meanwhile is left alone.
    pub fn release_in_background(&self, name: &str, token: &str, ttl: Duration) {
        let (semaphores, name, token) = (self.clone(), name.to_owned(), token.to_owned());
        lease::clean_up(
            format!("releasing an unused lease of semaphore {name:?}"),
            Instant::now() + ttl,
            move || {
                let (semaphores, name, token) = (semaphores.clone(), name.clone(), token.clone());
                async move {
                    if semaphores.release_as(&name, &token, true).await? {
                        tracing::info!(semaphore = %name, "released a lease whose caller never saw it");
                    }
                    Ok(())
                }
            },
        );
    }

    /// Removes a waiter that stopped waiting, waking those queued behind it; retried in the
    /// background for as long as its registration could last ([`QUEUE_LEASE`]).
    fn abandon_in_background(&self, name: &str, waiter: &str) {
        let (semaphores, name, waiter) = (self.clone(), name.to_owned(), waiter.to_owned());
        lease::clean_up(
            format!("removing a waiter of semaphore {name:?}"),
            Instant::now() + QUEUE_LEASE,
            move || {
                let (semaphores, name, waiter) = (semaphores.clone(), name.clone(), waiter.clone());
                async move {
                    let keys = semaphores.keys(&name);
                    let mut invocation = semaphores.invocation(&semaphores.inner.abandon, &keys);
                    invocation.arg(&waiter);
                    semaphores
                        .inner
                        .redis
                        .eval::<i64>(&invocation)
                        .await
                        .map(drop)
                }
            },
        );
    }

    /// Gives the lease `token` back. Returns whether it was still held (false when it had
    /// already expired or is unknown).
    pub async fn release(&self, name: &str, token: &str) -> Result<bool, Error> {
        self.release_as(name, token, false).await
    }

    /// [`release`](Self::release), that with `unclaimed_only` keeps (and reports not held) a
    /// lease that a retry with its idempotency key has handed to its caller.
    async fn release_as(
        &self,
        name: &str,
        token: &str,
        unclaimed_only: bool,
    ) -> Result<bool, Error> {
        let keys = self.keys(name);
        let mut invocation = self.invocation(&self.inner.release, &keys);
        invocation
            .arg(token)
            .arg(if unclaimed_only { "1" } else { "0" });
        Ok(self.inner.redis.eval::<i64>(&invocation).await? == 1)
    }

    /// Sets the remaining ttl of lease `token` to `ttl` (or its acquisition ttl), refusing with
    /// `InvalidArgument` on `ttl` a result below `min`. Returns the new remaining ttl, or `None`
    /// when the token holds no unexpired lease.
    pub async fn refresh(
        &self,
        name: &str,
        token: &str,
        ttl: Option<Duration>,
        min: Duration,
    ) -> Result<Option<Duration>, Error> {
        let keys = self.keys(name);
        let mut invocation = self.invocation(&self.inner.refresh, &keys);
        invocation
            .arg(token)
            .arg(ttl.map_or(0, millis))
            .arg(millis(min));
        match self.inner.redis.eval::<i64>(&invocation).await? {
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

    /// Renews several leases (name, token, ttl; `None` reuses the acquisition ttl) in one script
    /// call, answering per lease the remaining ttl or `None` when it is no longer held. The
    /// caller keeps the batch within [`crate::lease::batch::MAX_BATCH`] leases and, on a Cluster,
    /// within one hash slot.
    pub async fn refresh_many(&self, leases: &[Renewing]) -> Result<Vec<Renewal>, Error> {
        let mut invocation = self.inner.refresh_batch.prepare_invoke();
        for (name, token, ttl) in leases {
            for key in self.keys(name).all() {
                invocation.key(key);
            }
            invocation.arg(token).arg(ttl.map_or(0, millis));
        }
        let replies: Vec<i64> = self.inner.redis.eval(&invocation).await?;
        if replies.len() != leases.len() {
            return Err(unexpected("refresh_batch reply"));
        }
        Ok(replies
            .into_iter()
            .map(|left| match left {
                -3 => Err(Error::Internal(
                    "the renewal of this lease failed in Redis (a key of the wrong type?)".into(),
                )),
                left => Ok(ms(left)),
            })
            .collect())
    }

    /// Reads the semaphore's state.
    pub async fn describe(&self, name: &str) -> Result<Description, Error> {
        let keys = self.keys(name);
        let mut invocation = self.invocation(&self.inner.describe, &keys);
        invocation.arg(MAX_LISTED_HOLDERS);
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
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

    /// A handle that renews and releases one lease, for keepalive streams; `owner` only names it
    /// in log lines.
    pub fn lease_handle(
        &self,
        name: String,
        token: String,
        owner: String,
        ttl: Option<Duration>,
    ) -> PermitLease {
        PermitLease {
            semaphores: self.clone(),
            name,
            token,
            owner,
            ttl,
        }
    }
}

/// One permit lease, renewable by a keepalive stream.
pub struct PermitLease {
    semaphores: Semaphores,
    name: String,
    token: String,
    owner: String,
    ttl: Option<Duration>,
}

impl Renewable for PermitLease {
    async fn renew(&self, by: Instant) -> Result<Option<Duration>, Error> {
        let inner = &self.semaphores.inner;
        let group = inner
            .redis
            .batch_group(&self.semaphores.keys(&self.name).holders);
        let lease = (self.name.clone(), self.token.clone(), self.ttl);
        inner.renewals.renew(lease, group, by).await
    }

    async fn release(&self) -> Result<bool, Error> {
        self.semaphores.release(&self.name, &self.token).await
    }

    fn describe(&self) -> String {
        format!("semaphore {:?} owner {:?}", self.name, self.owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::hash_tag;

    /// Every key of a semaphore carries the same non-empty hash tag, whatever the name contains.
    #[test]
    fn keys_share_one_hash_tag() {
        for name in ["pool", "}", "{}", "a}b{c", "ünïcødé", ""] {
            let keys = SemaphoreKeys::new("baton:", name);
            let tag = |k: &str| {
                hash_tag(k)
                    .unwrap_or_else(|| panic!("{k} has no hash tag"))
                    .to_owned()
            };
            let t = tag(&keys.data);
            for key in keys.all() {
                assert_eq!(tag(key), t, "{name}: {key}");
            }
        }
    }
}
