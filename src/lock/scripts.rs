//! The lock scripts and their arguments: each `.lua` file beside a builder that writes its KEYS
//! and ARGV in the script's order, once, for Baton and for tools that call the scripts directly
//! (the load generator).
//!
//! Every script is the void marks every leased primitive shares (`lease/void.lua`), the shared
//! prelude (`prelude.lua`: the key layout, leases and holds, the fair queue, wake-ups) and the
//! script itself, and takes [`LockKeys::all`] as KEYS but
//! `refresh_batch.lua`, which takes [`LockKeys::for_refresh`] per hold. Wrap each source with
//! [`Redis::script`](crate::redis::Redis::script), which defines `PUBLISH` for the topology.

use std::time::Duration;

use redis::{Script, ScriptInvocation};

use super::Mode;
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

/// `acquire.lua`: grant a hold, add one to the owner's lease, or register a waiter.
pub const ACQUIRE: &str = with_prelude!("acquire.lua");
/// `release.lua`: end one hold.
pub const RELEASE: &str = with_prelude!("release.lua");
/// `refresh.lua`: set one hold's remaining ttl.
pub const REFRESH: &str = with_prelude!("refresh.lua");
/// `refresh_batch.lua`: renew many holds, each on its own.
pub const REFRESH_BATCH: &str = with_prelude!("refresh_batch.lua");
/// `abandon.lua`: a waiter stops waiting.
pub const ABANDON: &str = with_prelude!("abandon.lua");
/// `describe.lua`: read a lock's state.
pub const DESCRIBE: &str = with_prelude!("describe.lua");

/// Most live holds one lease may have: re-entrant acquisitions past it fail `ResourceExhausted`.
/// It bounds the work of every script that reads a lease.
pub const MAX_HOLDS: u32 = 100;

/// The Redis keys and channel of one lock, all with the hash tag `{lock:NAME}`.
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
    /// Sorted set of void tokens and waiter ids (`lease/void.lua`).
    pub void: String,
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
            void: [state.as_str(), ":void"].concat(),
            state,
        }
    }

    /// Every key and the channel, in the order the scripts take them.
    pub fn all(&self) -> [&str; 8] {
        [
            &self.state,
            &self.leases,
            &self.fence,
            &self.waiters,
            &self.queue,
            &self.writers,
            &self.channel,
            &self.void,
        ]
    }

    /// One hold's KEYS in `refresh_batch.lua`: what a renewal reads and writes, and the waiters
    /// and channel it wakes when it cuts its lease's expiry short.
    pub fn for_refresh(&self) -> [&str; 4] {
        [&self.state, &self.leases, &self.waiters, &self.channel]
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
    /// The owner; empty for an anonymous caller, who never re-enters.
    pub owner: &'a str,
    /// The token of the hold to grant.
    pub token: &'a str,
    /// The hold's ttl.
    pub ttl: Duration,
    /// The waiter's id, empty when the caller does not wait.
    pub waiter: &'a str,
    /// The time left to wait.
    pub wait_left: Duration,
    /// Wait in the FIFO queue.
    pub fair: bool,
    /// Exclusive or shared.
    pub mode: Mode,
    /// The idempotency key, empty for none.
    pub idempotency_key: &'a str,
}

impl Acquire<'_> {
    /// The call of `script` (`acquire.lua`) on `keys`.
    pub fn invocation<'s>(&self, script: &'s Script, keys: &LockKeys) -> ScriptInvocation<'s> {
        let mut invocation = keys.invocation(script);
        invocation
            .arg(self.owner)
            .arg(self.token)
            .arg(millis(self.ttl))
            .arg(self.waiter)
            .arg(millis(self.wait_left))
            .arg(millis(FENCE_RETENTION))
            .arg(if self.fair { "1" } else { "0" })
            .arg(self.mode.code())
            .arg(millis(QUEUE_LEASE))
            .arg(self.idempotency_key)
            .arg(MAX_HOLDS);
        invocation
    }
}

/// `release.lua`'s arguments.
#[derive(Debug, Clone, Copy)]
pub struct Release<'a> {
    /// The hold's token.
    pub token: &'a str,
    /// For the clean-up of a grant whose caller never saw it: such a clean-up keeps a hold that
    /// a retry with its idempotency key has claimed, and may make the token void. `None` for a
    /// plain release.
    pub clean_up: Option<CleanUp>,
}

impl Release<'_> {
    /// The call of `script` (`release.lua`) on `keys`.
    pub fn invocation<'s>(&self, script: &'s Script, keys: &LockKeys) -> ScriptInvocation<'s> {
        let mut invocation = keys.invocation(script);
        invocation
            .arg(self.token)
            .arg(if self.clean_up.is_some() { "1" } else { "0" })
            .arg(self.clean_up.and_then(|c| c.void).map_or(0, void_millis));
        invocation
    }
}

/// `refresh.lua`'s arguments.
#[derive(Debug, Clone, Copy)]
pub struct Refresh<'a> {
    /// The hold's token.
    pub token: &'a str,
    /// The new ttl; `None` reuses the hold's acquisition ttl.
    pub ttl: Option<Duration>,
    /// The smallest resulting ttl accepted.
    pub min: Duration,
}

impl Refresh<'_> {
    /// The call of `script` (`refresh.lua`) on `keys`.
    pub fn invocation<'s>(&self, script: &'s Script, keys: &LockKeys) -> ScriptInvocation<'s> {
        let mut invocation = keys.invocation(script);
        invocation
            .arg(self.token)
            .arg(self.ttl.map_or(0, millis))
            .arg(millis(self.min));
        invocation
    }
}

/// Adds one hold to a call of `refresh_batch.lua`: its keys, its token and its ttl (`None`:
/// its acquisition ttl).
pub fn add_to_batch(
    invocation: &mut ScriptInvocation<'_>,
    keys: &LockKeys,
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
    keys: &LockKeys,
    waiter: &str,
    void: Option<Duration>,
) -> ScriptInvocation<'s> {
    let mut invocation = keys.invocation(script);
    invocation.arg(waiter).arg(void.map_or(0, void_millis));
    invocation
}

/// `describe.lua`'s call on `keys`.
pub fn describe<'s>(script: &'s Script, keys: &LockKeys) -> ScriptInvocation<'s> {
    keys.invocation(script)
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
            "state", "leases", "fence", "waiters", "queue", "writers", "channel", "void",
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
