//! Distributed exclusive locks with leases, fencing tokens, reentrancy per owner, and waiting
//! woken by Redis pub/sub.
//!
//! # Redis layout
//!
//! Every key of the lock `NAME` shares the hash tag `{lock:NAME}`, so one script only ever
//! touches one Redis Cluster slot:
//!
//! | key | type | holds | lifetime |
//! |---|---|---|---|
//! | `PREFIX{lock:NAME}` | hash | owner, token, hold count, fencing token, acquisition ttl | the lease's ttl |
//! | `PREFIX{lock:NAME}:fence` | string | last fencing token issued | ttl + [`FENCE_RETENTION`] after each grant |
//! | `PREFIX{lock:NAME}:waiters` | sorted set | waiter id → wait deadline (ms) | the longest current wait |
//! | `PREFIX{lock:NAME}:released` | pub/sub channel | a message per full release | — |
//!
//! The gRPC handler is in [`service`]; this module knows nothing of tonic.

pub mod service;

use std::{future::Future, sync::Arc, time::Duration};

use redis::{Script, Value};
use tokio::time::Instant;
use uuid::Uuid;

use crate::{
    error::Error,
    lease::Renewable,
    redis::{
        Notifier, Redis,
        reply::{int, millis, ms, string, unexpected},
    },
    wait::{self, Attempt},
};

pub use crate::lease::{
    FENCE_RETENTION, MAX_NAME_BYTES, MAX_OWNER_BYTES, MAX_TTL, MAX_WAIT, MIN_KEEPALIVE_TTL,
    MIN_TTL, MIN_WAIT,
};

/// The Redis keys and channel of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    /// Hash with the holder's state; expires with the lease.
    pub state: String,
    /// Last fencing token issued.
    pub fence: String,
    /// Sorted set of waiters by wait deadline.
    pub waiters: String,
    /// Channel published on every full release.
    pub channel: String,
}

impl LockKeys {
    /// The keys of lock `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> Self {
        let state = format!("{prefix}{{lock:{name}}}");
        Self {
            fence: format!("{state}:fence"),
            waiters: format!("{state}:waiters"),
            channel: format!("{state}:released"),
            state,
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
    /// The owner for reentrancy; `None` makes a new owner.
    pub owner: Option<String>,
}

/// A granted lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The lock's name.
    pub name: String,
    /// The opaque token proving the hold.
    pub token: String,
    /// The fencing token of this tenure.
    pub fencing_token: u64,
    /// Time left on the lease when Redis answered.
    pub remaining: Duration,
    /// Holds the owner has after this acquisition.
    pub hold_count: u32,
    /// The owner.
    pub owner: String,
    /// When the successful script call was sent: the lease lasts at least until
    /// `sent_at + remaining` by this process's monotonic clock.
    pub sent_at: Instant,
}

/// The result of an acquisition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The caller holds the lock.
    Granted(Lease),
    /// Someone else held the lock for the whole wait.
    Held {
        /// The holder's remaining ttl, when known.
        remaining: Option<Duration>,
    },
}

/// The result of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Released {
    /// Whether the token held the lock when the release ran.
    pub was_held: bool,
    /// Holds left after the release; zero means the lock is free.
    pub remaining_holds: u32,
}

/// A snapshot of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Description {
    /// The holder, if any.
    pub holder: Option<Holder>,
    /// The current holder's fencing token, or the latest one issued (0 when none is known).
    pub fencing_token: u64,
    /// Callers waiting, across every Baton.
    pub waiters: u32,
}

/// The current holder of a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's owner.
    pub owner: String,
    /// Reentrant holds.
    pub hold_count: u32,
    /// Time left on the lease.
    pub remaining: Option<Duration>,
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
    describe: Script,
}

impl Locks {
    /// Locks stored in `redis`, with waiters woken through `notifier`.
    pub fn new(redis: Redis, notifier: Notifier) -> Self {
        Self {
            inner: Arc::new(Inner {
                acquire: redis.script(include_str!("acquire.lua")),
                release: redis.script(include_str!("release.lua")),
                refresh: redis.script(include_str!("refresh.lua")),
                describe: redis.script(include_str!("describe.lua")),
                redis,
                notifier,
            }),
        }
    }

    /// The keys of lock `name`.
    pub fn keys(&self, name: &str) -> LockKeys {
        LockKeys::new(self.inner.redis.key_prefix(), name)
    }

    /// Acquires the lock, waiting up to `request.wait` for it without polling.
    ///
    /// `stop` ends the wait early with the error it yields (the caller left, or shutdown). It is
    /// only raced against the waiting, never against a script call, so a grant is never lost
    /// half-way: when this returns `Granted`, the caller owns a lease it must release.
    pub async fn acquire(
        &self,
        request: &AcquireRequest,
        stop: impl Future<Output = Error>,
    ) -> Result<Acquired, Error> {
        let keys = self.keys(&request.name);
        let token = Uuid::new_v4().hyphenated().to_string();
        let owner = request.owner.clone().unwrap_or_else(|| token.clone());
        let deadline = Instant::now() + request.wait;

        // Uncontended acquisitions cost one script call: subscribe only once the lock is held.
        let first = self
            .try_acquire(&keys, request, &owner, &token, None)
            .await?;
        if request.wait.is_zero() || matches!(first, Acquired::Granted(_)) {
            return Ok(first);
        }

        let waiter = Uuid::new_v4().simple().to_string();
        let waited = wait::until(
            &self.inner.notifier,
            &keys.channel,
            deadline,
            stop,
            |left| {
                let waiting = (!left.is_zero()).then_some((waiter.as_str(), left));
                let attempt = self.try_acquire(&keys, request, &owner, &token, waiting);
                async move {
                    Ok(match attempt.await? {
                        // The holder's expiry is the fallback when no release is published (it
                        // crashed or its lease ran out); one more millisecond lets Redis expire it.
                        Acquired::Held { remaining } => Attempt::Busy {
                            answer: Acquired::Held { remaining },
                            retry_in: remaining.map(|r| r + Duration::from_millis(1)),
                        },
                        granted => Attempt::Done(granted),
                    })
                }
            },
        )
        .await;
        if waited.is_err() {
            self.abandon_wait(&keys, &waiter).await;
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
    ) -> Result<Acquired, Error> {
        let (waiter, wait_left) = waiting.unwrap_or(("", Duration::ZERO));
        let mut invocation = self.inner.acquire.key(&keys.state);
        invocation
            .key(&keys.fence)
            .key(&keys.waiters)
            .arg(owner)
            .arg(token)
            .arg(millis(request.ttl))
            .arg(waiter)
            .arg(millis(wait_left))
            .arg(millis(FENCE_RETENTION));
        let sent_at = Instant::now();
        let reply: Vec<Value> = match self.inner.redis.eval(&invocation).await {
            Ok(reply) => reply,
            Err(e @ Error::Unavailable(_)) => {
                self.release_in_background(&request.name, token);
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        match reply.as_slice() {
            [granted, token, fence, remaining, count] if int(granted)? == 1 => {
                Ok(Acquired::Granted(Lease {
                    name: request.name.clone(),
                    token: string(token)?,
                    fencing_token: u64::try_from(int(fence)?)
                        .map_err(|_| unexpected("negative fencing token"))?,
                    remaining: ms(int(remaining)?).unwrap_or(request.ttl),
                    hold_count: u32::try_from(int(count)?).unwrap_or(u32::MAX),
                    owner: owner.to_owned(),
                    sent_at,
                }))
            }
            [_, remaining] => Ok(Acquired::Held {
                remaining: ms(int(remaining)?),
            }),
            _ => Err(unexpected("acquire reply")),
        }
    }

    /// Releases what an acquisition whose answer never came may have granted: Redis may have run
    /// the script and only the reply missed the timeout. Harmless when nothing was granted (the
    /// fresh token holds nothing); at worst the lease expires at its ttl.
    fn release_in_background(&self, name: &str, token: &str) {
        let (locks, name, token) = (self.clone(), name.to_owned(), token.to_owned());
        tokio::spawn(async move {
            if let Ok(released) = locks.release(&name, &token).await
                && released.was_held
            {
                tracing::info!(lock = %name, "released a grant whose answer arrived too late");
            }
        });
    }

    /// Drops a waiter's entry when it stops waiting early; its deadline would drop it anyway.
    async fn abandon_wait(&self, keys: &LockKeys, waiter: &str) {
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(&keys.waiters).arg(waiter);
        if let Err(e) = self.inner.redis.command::<i64>(&cmd).await {
            tracing::debug!(error = %e, "could not remove an abandoned waiter");
        }
    }

    /// Releases one hold of the lease `token` on lock `name`.
    pub async fn release(&self, name: &str, token: &str) -> Result<Released, Error> {
        let keys = self.keys(name);
        let mut invocation = self.inner.release.key(&keys.state);
        invocation.key(&keys.channel).arg(token);
        let reply: Vec<i64> = self.inner.redis.eval(&invocation).await?;
        match reply.as_slice() {
            [held, left] => Ok(Released {
                was_held: *held == 1,
                remaining_holds: u32::try_from(*left).unwrap_or(0),
            }),
            _ => Err(unexpected("release reply")),
        }
    }

    /// Sets the remaining ttl of lease `token` to `ttl` (or its acquisition ttl). Returns the new
    /// remaining ttl, or `None` when the token does not hold the lock.
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
        let mut invocation = self.inner.refresh.key(&keys.state);
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

    /// Reads the lock's state.
    pub async fn describe(&self, name: &str) -> Result<Description, Error> {
        let keys = self.keys(name);
        let mut invocation = self.inner.describe.key(&keys.state);
        invocation.key(&keys.fence).key(&keys.waiters);
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
        match reply.as_slice() {
            [held, owner, count, fence, remaining, waiters] => Ok(Description {
                holder: (int(held)? == 1)
                    .then(|| -> Result<Holder, Error> {
                        Ok(Holder {
                            owner: string(owner)?,
                            hold_count: u32::try_from(int(count)?).unwrap_or(u32::MAX),
                            remaining: ms(int(remaining)?),
                        })
                    })
                    .transpose()?,
                fencing_token: u64::try_from(int(fence)?).unwrap_or(0),
                waiters: u32::try_from(int(waiters)?).unwrap_or(u32::MAX),
            }),
            _ => Err(unexpected("describe reply")),
        }
    }

    /// A handle that renews and releases one lease, for keepalive streams.
    pub fn lease_handle(&self, name: String, token: String, ttl: Option<Duration>) -> LockLease {
        LockLease {
            locks: self.clone(),
            name,
            token,
            ttl,
        }
    }
}

/// One lease of a lock, renewable by a keepalive stream.
pub struct LockLease {
    locks: Locks,
    name: String,
    token: String,
    ttl: Option<Duration>,
}

impl Renewable for LockLease {
    async fn renew(&self, _by: Instant) -> Result<Option<Duration>, Error> {
        self.locks.refresh(&self.name, &self.token, self.ttl).await
    }

    async fn release(&self) -> Result<bool, Error> {
        Ok(self.locks.release(&self.name, &self.token).await?.was_held)
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
            assert_eq!(tag(&keys.fence), t, "{name}");
            assert_eq!(tag(&keys.waiters), t, "{name}");
            assert_eq!(tag(&keys.channel), t, "{name}");
        }
    }
}
