//! The rate limit scripts and their arguments: each `.lua` file beside a builder that writes its
//! KEYS and ARGV in the script's order, once, for Baton and for tools that call the scripts
//! directly (the load generator).
//!
//! Every algorithm is one script on one key ([`limiter_key`](super::limiter_key)) that answers
//! `{allowed (0/1; 2: too late, nothing done), remaining, retry after µs (-1: never), reset after
//! µs, Redis time µs}`: [`Check`] writes the call, [`reply`] reads the answer. A check carries the
//! Redis time past which it changes nothing (`not_after`), so that one answered by the failure
//! mode, while Redis was frozen or busy, counts nothing when Redis runs it later.

use std::time::Duration;

use redis::{Script, ScriptInvocation};

use super::{Algorithm, DecidedBy, Decision, Rate};
use crate::redis::reply::millis;

/// `gcra.lua`: generic cell rate algorithm.
pub const GCRA: &str = include_str!("gcra.lua");
/// `fixed_window.lua`: a window opened by the first allowed unit.
pub const FIXED_WINDOW: &str = include_str!("fixed_window.lua");
/// `aligned_window.lua`: a window aligned to multiples of the period since the Unix epoch.
pub const ALIGNED_WINDOW: &str = include_str!("aligned_window.lua");
/// `sliding_window.lua`: an exact sliding window.
pub const SLIDING_WINDOW: &str = include_str!("sliding_window.lua");
/// `clock.lua`: Redis's `TIME` in µs, on the node of the key it is given (which it does not
/// touch); read before Baton's first check, to learn Redis's clock.
pub const CLOCK: &str = include_str!("clock.lua");

/// The script of `algorithm`.
pub fn source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::Gcra => GCRA,
        Algorithm::FixedWindow => FIXED_WINDOW,
        Algorithm::AlignedWindow => ALIGNED_WINDOW,
        Algorithm::SlidingWindow => SLIDING_WINDOW,
    }
}

/// One decision: `cost` units (0 peeks) against `rate` on the limiter stored at `key`.
#[derive(Debug, Clone, Copy)]
pub struct Check<'a> {
    /// The limiter's key, from [`limiter_key`](super::limiter_key) for `rate.algorithm`.
    pub key: &'a str,
    /// The limit, which also picks the script.
    pub rate: &'a Rate,
    /// Units to spend; 0 asks whether one unit would be allowed, spending nothing.
    pub cost: u64,
    /// The Redis time (µs since the Unix epoch) past which the check changes nothing and answers
    /// too late; 0 for none.
    pub not_after: i64,
}

impl Check<'_> {
    /// The call of `script`, the script of `self.rate.algorithm` ([`source`]).
    pub fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let rate = self.rate;
        let period_ms = millis(rate.period);
        let period_us = period_ms.saturating_mul(1000);
        let mut invocation = script.key(self.key);
        match rate.algorithm {
            // ARGV: period µs, limit, burst, cost, not after.
            Algorithm::Gcra => invocation
                .arg(period_us)
                .arg(rate.limit)
                .arg(rate.burst)
                .arg(self.cost),
            // ARGV: limit, period ms, cost, not after.
            Algorithm::FixedWindow | Algorithm::AlignedWindow => {
                invocation.arg(rate.limit).arg(period_ms).arg(self.cost)
            }
            // ARGV: limit, period µs, period ms, cost, not after.
            Algorithm::SlidingWindow => invocation
                .arg(rate.limit)
                .arg(period_us)
                .arg(period_ms)
                .arg(self.cost),
        };
        invocation.arg(self.not_after);
        invocation
    }
}

/// What a script answered.
#[derive(Debug, Clone, Copy)]
pub enum Reply {
    /// Decided by Redis at Redis time `now` (µs since the Unix epoch).
    Decided {
        /// The decision.
        decision: Decision,
        /// The Redis time the script read.
        now: i64,
    },
    /// Run past its `not_after`, at Redis time `now`: it changed nothing.
    TooLate {
        /// The Redis time the script read.
        now: i64,
    },
}

/// What a script's reply says for `rate`, or `None` if the reply is not one.
pub fn reply(rate: &Rate, reply: &[i64]) -> Option<Reply> {
    match *reply {
        [2, _, _, _, now] => Some(Reply::TooLate { now }),
        [allowed @ (0 | 1), remaining, retry, reset, now] => Some(Reply::Decided {
            decision: Decision {
                allowed: allowed == 1,
                limit: rate.limit,
                remaining: u64::try_from(remaining).unwrap_or(0),
                retry_after: u64::try_from(retry).ok().map(Duration::from_micros),
                reset_after: Duration::from_micros(u64::try_from(reset).unwrap_or(0)),
                decided_by: DecidedBy::Redis,
            },
            now,
        }),
        _ => None,
    }
}

/// The decision a script's reply says for `rate`, or `None` if the reply is not one (or came
/// too late).
pub fn decision(rate: &Rate, reply_values: &[i64]) -> Option<Decision> {
    match reply(rate, reply_values)? {
        Reply::Decided { decision, .. } => Some(decision),
        Reply::TooLate { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each script's header documents the ARGV order [`Check::invocation`] writes.
    #[test]
    fn scripts_take_the_arguments_in_order() {
        for (algorithm, header) in [
            (
                Algorithm::Gcra,
                "ARGV[1] period us   ARGV[2] limit (units per period)   ARGV[3] burst   ARGV[4] cost (0 peeks)\n-- ARGV[5] not after",
            ),
            (
                Algorithm::FixedWindow,
                "ARGV[1] limit   ARGV[2] period ms   ARGV[3] cost (0 peeks)\n-- ARGV[4] not after",
            ),
            (
                Algorithm::AlignedWindow,
                "ARGV[1] limit   ARGV[2] period ms   ARGV[3] cost (0 peeks)\n-- ARGV[4] not after",
            ),
            (
                Algorithm::SlidingWindow,
                "ARGV[1] limit   ARGV[2] period us   ARGV[3] period ms   ARGV[4] cost (0 peeks)\n-- ARGV[5] not after",
            ),
        ] {
            assert!(
                source(algorithm).contains(header),
                "{algorithm:?}: the header should read {header:?}"
            );
        }
    }

    /// A reply of five integers is a decision by Redis, or says it came too late; anything else
    /// is not a decision.
    #[test]
    fn replies() {
        let rate = Rate::new(Algorithm::Gcra, 10, Duration::from_secs(1), None).unwrap();
        let d = decision(&rate, &[0, 3, -1, 2_000_000, 7]).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.remaining, 3);
        assert_eq!(d.retry_after, None);
        assert_eq!(d.reset_after, Duration::from_secs(2));
        assert_eq!(d.decided_by, DecidedBy::Redis);
        assert_eq!(
            decision(&rate, &[1, 9, 0, 100, 7]).unwrap().retry_after,
            Some(Duration::ZERO)
        );
        assert!(matches!(
            reply(&rate, &[2, 0, 0, 0, 7]),
            Some(Reply::TooLate { now: 7 })
        ));
        assert!(decision(&rate, &[2, 0, 0, 0, 7]).is_none());
        assert!(decision(&rate, &[1, 2, 3, 4]).is_none());
    }
}
