//! Redis's clock as seen from this process: a lower bound of the offset between Redis's `TIME`
//! and this process's wall clock, learnt from scripts that return the `TIME` they read (per hash
//! slot on a Cluster, where each master has its own clock). It lets Baton give a script the last
//! moment, by Redis's own clock, at which it may still act: one that runs later (Redis was
//! frozen, busy or slow to reach, and the caller was answered without it) changes nothing.
//!
//! A script sent at local time `s` whose answer was read at local time `a` and that read Redis
//! time `r` proves the offset is at least `r - a` (Redis read its clock before the answer came
//! back) and at most `r - s`. The largest lower bound seen is kept: a moment mapped with it is
//! never later than the truth, however slow the way to Redis was, so a check told to change
//! nothing past it cannot change anything after Baton stopped waiting. The bound is loose by the
//! time the answer took to come back; the tightest answer seen sets it. An answer whose upper
//! bound is below the kept bound proves the clock moved back (another master after a failover, a
//! clock stepped): its own lower bound then replaces the kept one.

use std::{
    sync::atomic::{AtomicI64, Ordering},
    time::{Duration, SystemTime},
};

use super::slot;

/// Unknown offset.
const UNKNOWN: i64 = i64::MIN;

/// The offsets of every hash slot, or one for all of them. Lock-free.
pub struct RedisClock {
    /// Per slot on a Cluster; one entry otherwise.
    bounds: Box<[AtomicI64]>,
}

impl RedisClock {
    /// Knows nothing yet. `per_slot` keeps a bound per hash slot (a Cluster, whose masters'
    /// clocks differ); otherwise every key shares one.
    pub fn new(per_slot: bool) -> Self {
        let n = if per_slot { 16_384 } else { 1 };
        Self {
            bounds: (0..n).map(|_| AtomicI64::new(UNKNOWN)).collect(),
        }
    }

    fn bound(&self, key: &str) -> &AtomicI64 {
        if self.bounds.len() == 1 {
            &self.bounds[0]
        } else {
            &self.bounds[usize::from(slot(key))]
        }
    }

    /// This process's wall clock, in microseconds since the Unix epoch.
    pub fn local_now_us() -> i64 {
        let since = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
    }

    /// Whether an offset was learnt for `key`'s clock.
    pub fn knows(&self, key: &str) -> bool {
        self.bound(key).load(Ordering::Relaxed) != UNKNOWN
    }

    /// Records that a script on `key`, sent at local time `sent_us` and answered at local time
    /// `answered_us`, read Redis time `redis_us`.
    pub fn observe(&self, key: &str, sent_us: i64, answered_us: i64, redis_us: i64) {
        let lower = redis_us.saturating_sub(answered_us);
        let upper = redis_us.saturating_sub(sent_us);
        let bound = self.bound(key);
        let mut kept = bound.load(Ordering::Relaxed);
        loop {
            let moved_back = kept != UNKNOWN && upper < kept;
            if !(kept == UNKNOWN || lower > kept || moved_back) {
                return;
            }
            match bound.compare_exchange_weak(kept, lower, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => kept = now,
            }
        }
    }

    /// The Redis time of local time `local_us` on `key`'s clock, if an offset was learnt: never
    /// later than the truth, unless that clock moved back since (then the next answer from it
    /// teaches Baton).
    pub fn to_redis(&self, key: &str, local_us: i64) -> Option<i64> {
        let offset = self.bound(key).load(Ordering::Relaxed);
        (offset != UNKNOWN).then(|| local_us.saturating_add(offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The largest lower bound is kept, whatever the way there took; a slow way to Redis does
    /// not move the moment later; a clock that moved back is learnt from its next answer.
    #[test]
    fn largest_lower_bound_and_a_clock_moved_back() {
        let clock = RedisClock::new(false);
        assert!(!clock.knows("{a}"));
        assert_eq!(clock.to_redis("{a}", 100), None);
        // Sent at 1,000, answered at 3,000, Redis read 6,000: the offset is 3,000 to 5,000.
        clock.observe("{a}", 1_000, 3_000, 6_000);
        assert!(clock.knows("{b}"), "one clock for every key off a Cluster");
        assert_eq!(clock.to_redis("{a}", 100), Some(3_100));
        // The way to Redis took 50,000 (Redis read 56,000 and answered at once): no looser.
        clock.observe("{a}", 1_000, 53_000, 56_000);
        assert_eq!(clock.to_redis("{a}", 100), Some(3_100));
        // A quick answer tightens it.
        clock.observe("{a}", 10_000, 10_100, 14_900);
        assert_eq!(clock.to_redis("{a}", 100), Some(4_900));
        // A slower one does not loosen it.
        clock.observe("{a}", 20_000, 29_000, 25_000);
        assert_eq!(clock.to_redis("{a}", 100), Some(4_900));
        // The clock moved back (at most 1,000 ahead now): its lower bound replaces the kept one.
        clock.observe("{a}", 30_000, 30_500, 31_000);
        assert_eq!(clock.to_redis("{a}", 100), Some(600));
    }

    /// On a Cluster each slot learns its own clock, and a slot never read knows nothing.
    #[test]
    fn per_slot_clocks() {
        let clock = RedisClock::new(true);
        clock.observe("{a}", 1_000, 1_100, 9_000);
        assert!(clock.knows("{a}"));
        assert!(!clock.knows("{b}"));
        assert_eq!(clock.to_redis("{b}", 100), None);
        assert_eq!(clock.to_redis("{a}", 100), Some(8_000));
    }
}
