//! The semaphore scripts and their arguments: each `.lua` file beside a builder that writes its
//! KEYS and ARGV in the script's order, once, for Baton and for tools that call the scripts
//! directly (the load generator).
//!
//! Every script is the void marks every leased primitive shares (`lease/void.lua`), the shared
//! prelude (`prelude.lua`: the key layout, holders, the fair queue) and the script itself, and takes [`SemaphoreKeys::all`] as KEYS but
//! `refresh_batch.lua`, which takes them once per lease. Wrap each source with
//! [`Redis::script`](crate::redis::Redis::script), which defines `PUBLISH` for the topology.

use std::time::Duration;

use redis::{Script, ScriptInvocation};

use crate::{
    lease::{CleanUp, FENCE_RETENTION, QUEUE_LEASE, void_millis},
    redis::reply::millis,
};

macro_rules! with_prelude {
    ($file:literal) => {
        concat!(
            include_str!("../lease/void.lua"),
            include_str!("prelude.lua"),
            include_str!($file)
        )
    };
}

/// `acquire.lua`: grant permits, or register a waiter.
pub const ACQUIRE: &str = with_prelude!("acquire.lua");
/// `release.lua`: give a lease back.
pub const RELEASE: &str = with_prelude!("release.lua");
/// `refresh.lua`: set a lease's remaining ttl.
pub const REFRESH: &str = with_prelude!("refresh.lua");
/// `refresh_batch.lua`: renew many leases, each on its own.
pub const REFRESH_BATCH: &str = with_prelude!("refresh_batch.lua");
/// `abandon.lua`: a waiter stops waiting.
pub const ABANDON: &str = with_prelude!("abandon.lua");
/// `describe.lua`: read a semaphore's state.
pub const DESCRIBE: &str = with_prelude!("describe.lua");

/// Most holders `Describe` lists.
pub const MAX_LISTED_HOLDERS: u32 = 100;

/// The Redis keys and channel of one semaphore, all with the hash tag `{sem:NAME}`.
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
    /// Sorted set of void tokens and waiter ids (`lease/void.lua`).
    pub void: String,
}

impl SemaphoreKeys {
    /// The keys of semaphore `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> Self {
        // Concatenated rather than formatted: built on every call.
        let data = [prefix, "{sem:", name, "}"].concat();
        Self {
            holders: [data.as_str(), ":holders"].concat(),
            limits: [data.as_str(), ":limits"].concat(),
            queue: [data.as_str(), ":queue"].concat(),
            waiters: [data.as_str(), ":waiters"].concat(),
            fence: [data.as_str(), ":fence"].concat(),
            channel: [data.as_str(), ":released"].concat(),
            void: [data.as_str(), ":void"].concat(),
            data,
        }
    }

    /// Every key and the channel, in the order the scripts take them.
    pub fn all(&self) -> [&str; 8] {
        [
            &self.holders,
            &self.data,
            &self.limits,
            &self.queue,
            &self.waiters,
            &self.fence,
            &self.channel,
            &self.void,
        ]
    }

    /// One lease's KEYS in `refresh_batch.lua`: all but the void marks.
    pub fn for_refresh(&self) -> [&str; 7] {
        let [holders, data, limits, queue, waiters, fence, channel, _] = self.all();
        [holders, data, limits, queue, waiters, fence, channel]
    }

    fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.prepare_invoke();
        for key in self.all() {
            invocation.key(key);
        }
        invocation
    }
}

/// `acquire.lua`'s arguments.
#[derive(Debug, Clone, Copy)]
pub struct Acquire<'a> {
    /// The token of the lease to grant.
    pub token: &'a str,
    /// The owner label, empty for none.
    pub owner: &'a str,
    /// Permits to take.
    pub permits: u32,
    /// The limit the caller believes in.
    pub limit: u32,
    /// The lease's ttl.
    pub ttl: Duration,
    /// The waiter's id, empty when the caller does not wait.
    pub waiter: &'a str,
    /// Wait in the FIFO queue.
    pub fair: bool,
    /// The time left to wait.
    pub wait_left: Duration,
    /// The idempotency key, empty for none.
    pub idempotency_key: &'a str,
}

impl Acquire<'_> {
    /// The call of `script` (`acquire.lua`) on `keys`.
    pub fn invocation<'s>(&self, script: &'s Script, keys: &SemaphoreKeys) -> ScriptInvocation<'s> {
        let mut invocation = keys.invocation(script);
        invocation
            .arg(self.token)
            .arg(self.owner)
            .arg(self.permits)
            .arg(self.limit)
            .arg(millis(self.ttl))
            .arg(self.waiter)
            .arg(if self.fair { "1" } else { "0" })
            .arg(millis(self.wait_left))
            .arg(millis(QUEUE_LEASE))
            .arg(millis(FENCE_RETENTION))
            .arg(self.idempotency_key);
        invocation
    }
}

/// `release.lua`'s call for `token` on `keys`. With `clean_up` (the clean-up of a grant whose
/// caller never saw it), a lease that a retry with its idempotency key has claimed is kept, and
/// the token may be made void.
pub fn release<'s>(
    script: &'s Script,
    keys: &SemaphoreKeys,
    token: &str,
    clean_up: Option<CleanUp>,
) -> ScriptInvocation<'s> {
    let mut invocation = keys.invocation(script);
    invocation
        .arg(token)
        .arg(if clean_up.is_some() { "1" } else { "0" })
        .arg(clean_up.and_then(|c| c.void).map_or(0, void_millis));
    invocation
}

/// `refresh.lua`'s call for `token` on `keys`: the new ttl (`None`: the acquisition ttl), and the
/// smallest resulting ttl accepted.
pub fn refresh<'s>(
    script: &'s Script,
    keys: &SemaphoreKeys,
    token: &str,
    ttl: Option<Duration>,
    min: Duration,
) -> ScriptInvocation<'s> {
    let mut invocation = keys.invocation(script);
    invocation
        .arg(token)
        .arg(ttl.map_or(0, millis))
        .arg(millis(min));
    invocation
}

/// Adds one lease to a call of `refresh_batch.lua`: its keys, its token and its ttl (`None`: its
/// acquisition ttl).
pub fn add_to_batch(
    invocation: &mut ScriptInvocation<'_>,
    keys: &SemaphoreKeys,
    token: &str,
    ttl: Option<Duration>,
) {
    for key in keys.for_refresh() {
        invocation.key(key);
    }
    invocation.arg(token).arg(ttl.map_or(0, millis));
}

/// `abandon.lua`'s call for the waiter `waiter` on `keys`; with `void`, the waiter id stays void
/// that long (after a call whose reply never came).
pub fn abandon<'s>(
    script: &'s Script,
    keys: &SemaphoreKeys,
    waiter: &str,
    void: Option<Duration>,
) -> ScriptInvocation<'s> {
    let mut invocation = keys.invocation(script);
    invocation.arg(waiter).arg(void.map_or(0, void_millis));
    invocation
}

/// `describe.lua`'s call on `keys`, listing at most [`MAX_LISTED_HOLDERS`] holders.
pub fn describe<'s>(script: &'s Script, keys: &SemaphoreKeys) -> ScriptInvocation<'s> {
    let mut invocation = keys.invocation(script);
    invocation.arg(MAX_LISTED_HOLDERS);
    invocation
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

    /// The prelude reads the keys in the order [`SemaphoreKeys::all`] passes them.
    #[test]
    fn prelude_takes_the_keys_in_order() {
        let prelude = include_str!("prelude.lua");
        assert!(
            prelude.contains(
                "local H, D, L, Q, W, F, C, V =\n  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]"
            ),
            "the prelude's key order changed: update SemaphoreKeys::all"
        );
        let keys = SemaphoreKeys::new("baton:", "pool");
        assert_eq!(
            keys.all(),
            [
                keys.holders.as_str(),
                keys.data.as_str(),
                keys.limits.as_str(),
                keys.queue.as_str(),
                keys.waiters.as_str(),
                keys.fence.as_str(),
                keys.channel.as_str(),
                keys.void.as_str()
            ]
        );
    }
}
