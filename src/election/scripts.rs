//! The election scripts and their arguments: each `.lua` file beside a builder that writes its
//! KEYS and ARGV in the script's order, once.
//!
//! Every script is the void marks every leased primitive shares (`lease/void.lua`), the shared
//! prelude (`prelude.lua`: the key layout, the leader, the queue of candidates, wake-ups) and the
//! script itself, and takes [`ElectionKeys::all`] as KEYS
//! but `renew.lua`, which takes [`ElectionKeys::for_renewal`] per leadership. Wrap each source
//! with [`Redis::script`](crate::redis::Redis::script), which defines `PUBLISH` for the topology,
//! except [`LEADER`], a read-only script that publishes nothing (wrap it with
//! [`redis::Script::new`]).

use std::time::Duration;

use redis::{Script, ScriptInvocation};

use crate::{
    lease::{FENCE_RETENTION, QUEUE_LEASE, void_millis},
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

/// `campaign.lua`: elect a candidate whose turn it is, or register it in the queue.
pub const CAMPAIGN: &str = with_prelude!("campaign.lua");
/// `resign.lua`: end a leadership.
pub const RESIGN: &str = with_prelude!("resign.lua");
/// `abandon.lua`: a candidate stops waiting.
pub const ABANDON: &str = with_prelude!("abandon.lua");
/// `proclaim.lua`: the leader changes its value.
pub const PROCLAIM: &str = with_prelude!("proclaim.lua");
/// `renew.lua`: renew many leaderships, each on its own.
pub const RENEW: &str = with_prelude!("renew.lua");
/// `leader.lua`: read an election's state. Declared `no-writes` (Redis then runs it even when
/// `maxmemory` is reached); `PUBLISH` is left undefined, as it never publishes.
pub const LEADER: &str = concat!(
    "#!lua flags=no-writes\nlocal PUBLISH = nil\n",
    include_str!("prelude.lua"),
    include_str!("leader.lua")
);

/// The Redis keys and channels of one election, all with the hash tag `{election:NAME}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectionKeys {
    /// Hash of the leader's lease (token, term, value, revision, expiry, ttl); expires with it.
    pub leader: String,
    /// Last term issued; kept [`FENCE_RETENTION`] past every lease.
    pub term: String,
    /// Sorted set of waiting candidates by registration expiry.
    pub candidates: String,
    /// Sorted set of waiting candidates by arrival.
    pub queue: String,
    /// Channel on which the candidate whose turn it is is woken (`@ID`).
    pub turn: String,
    /// Channel on which observers are told of every change.
    pub changed: String,
    /// Sorted set of void tokens and candidate ids (`lease/void.lua`).
    pub void: String,
}

impl ElectionKeys {
    /// The keys of election `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> Self {
        // Concatenated rather than formatted: built on every call.
        let leader = [prefix, "{election:", name, "}"].concat();
        Self {
            term: [leader.as_str(), ":term"].concat(),
            candidates: [leader.as_str(), ":candidates"].concat(),
            queue: [leader.as_str(), ":queue"].concat(),
            turn: [leader.as_str(), ":turn"].concat(),
            changed: [leader.as_str(), ":changed"].concat(),
            void: [leader.as_str(), ":void"].concat(),
            leader,
        }
    }

    /// Every key and channel, in the order the scripts take them.
    pub fn all(&self) -> [&str; 7] {
        [
            &self.leader,
            &self.term,
            &self.candidates,
            &self.queue,
            &self.turn,
            &self.changed,
            &self.void,
        ]
    }

    /// One leadership's KEYS in `renew.lua`.
    pub fn for_renewal(&self) -> [&str; 2] {
        [&self.leader, &self.term]
    }

    fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.prepare_invoke();
        for key in self.all() {
            invocation.key(key);
        }
        invocation
    }
}

/// `campaign.lua`'s arguments.
#[derive(Debug, Clone, Copy)]
pub struct Campaign<'a> {
    /// The token of the leadership to grant.
    pub token: &'a str,
    /// The leadership's ttl.
    pub ttl: Duration,
    /// The candidate's id, empty when it does not wait.
    pub candidate: &'a str,
    /// The time left to wait.
    pub wait_left: Duration,
    /// The value written with the election.
    pub value: &'a [u8],
}

impl Campaign<'_> {
    /// The call of `script` (`campaign.lua`) on `keys`.
    pub fn invocation<'s>(&self, script: &'s Script, keys: &ElectionKeys) -> ScriptInvocation<'s> {
        let mut invocation = keys.invocation(script);
        invocation
            .arg(self.token)
            .arg(millis(self.ttl))
            .arg(self.candidate)
            .arg(millis(self.wait_left))
            .arg(millis(QUEUE_LEASE))
            .arg(millis(FENCE_RETENTION))
            .arg(self.value);
        invocation
    }
}

/// `resign.lua`'s call for the leadership `token` on `keys`; with `void` (after a call whose reply
/// never came), the token stays void that long.
pub fn resign<'s>(
    script: &'s Script,
    keys: &ElectionKeys,
    token: &str,
    void: Option<Duration>,
) -> ScriptInvocation<'s> {
    let mut invocation = keys.invocation(script);
    invocation.arg(token).arg(void.map_or(0, void_millis));
    invocation
}

/// `abandon.lua`'s call for the candidate `candidate` on `keys`; with `void`, the candidate id
/// stays void that long (after a call whose reply never came).
pub fn abandon<'s>(
    script: &'s Script,
    keys: &ElectionKeys,
    candidate: &str,
    void: Option<Duration>,
) -> ScriptInvocation<'s> {
    let mut invocation = keys.invocation(script);
    invocation.arg(candidate).arg(void.map_or(0, void_millis));
    invocation
}

/// `proclaim.lua`'s arguments.
#[derive(Debug, Clone, Copy)]
pub struct Proclaim<'a> {
    /// The leadership's token.
    pub token: &'a str,
    /// The new value.
    pub value: &'a [u8],
}

impl Proclaim<'_> {
    /// The call of `script` (`proclaim.lua`) on `keys`.
    pub fn invocation<'s>(&self, script: &'s Script, keys: &ElectionKeys) -> ScriptInvocation<'s> {
        let mut invocation = keys.invocation(script);
        invocation.arg(self.token).arg(self.value);
        invocation
    }
}

/// A call of `script` (`renew.lua`) without leaderships yet: add them with [`add_to_renewal`].
pub fn renewal(script: &Script) -> ScriptInvocation<'_> {
    let mut invocation = script.prepare_invoke();
    invocation.arg(millis(FENCE_RETENTION));
    invocation
}

/// Adds one leadership to a call of `renew.lua`: its keys, its token and its ttl (`None`: its
/// campaign's).
pub fn add_to_renewal(
    invocation: &mut ScriptInvocation<'_>,
    keys: &ElectionKeys,
    token: &str,
    ttl: Option<Duration>,
) {
    for key in keys.for_renewal() {
        invocation.key(key);
    }
    invocation.arg(token).arg(ttl.map_or(0, millis));
}

/// `leader.lua`'s call on `keys`.
pub fn leader<'s>(script: &'s Script, keys: &ElectionKeys) -> ScriptInvocation<'s> {
    keys.invocation(script)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redis::hash_tag;

    /// Every key of an election carries the same non-empty hash tag, whatever the name contains.
    #[test]
    fn keys_share_one_hash_tag() {
        for name in ["leader", "}", "{}", "a}b{c", "ünïcødé", ""] {
            let keys = ElectionKeys::new("baton:", name);
            let tag = |k: &str| {
                hash_tag(k)
                    .unwrap_or_else(|| panic!("{k} has no hash tag"))
                    .to_owned()
            };
            let t = tag(&keys.leader);
            for key in keys.all() {
                assert_eq!(tag(key), t, "{name}: {key}");
            }
        }
    }

    /// The prelude names the keys in the order [`ElectionKeys::all`] passes them.
    #[test]
    fn prelude_takes_the_keys_in_order() {
        let prelude = include_str!("prelude.lua");
        let names = [
            "leader",
            "term",
            "candidates",
            "queue",
            "turn",
            "changed",
            "void",
        ];
        let keys = ElectionKeys::new("baton:", "e");
        for (i, (name, key)) in names.iter().zip(keys.all()).enumerate() {
            assert!(
                prelude.contains(&format!("{name} = KEYS[{}]", i + 1)),
                "the prelude reads {name} from KEYS[{}]",
                i + 1
            );
            assert!(key.starts_with(&keys.leader), "{key}");
        }
    }
}
