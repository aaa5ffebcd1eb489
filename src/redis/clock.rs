//! Redis's clock as seen from this process, per hash slot (in a Cluster each master has its own
//! clock): an upper bound of the offset between Redis's `TIME` and this process's wall clock,
//! learnt from scripts that return the `TIME` they read. It lets Baton give a script the last
//! moment, by Redis's own clock, at which it may still act: one that runs later (Redis was frozen
//! or busy, and the caller was answered without it) changes nothing.
//!
//! A script sent at local time `s` that read Redis time `r` proves the offset is at most `r - s`
//! (Redis read its clock after the script was sent); the bound is loose by the time the script
//! took to reach Redis. The smallest bound seen is kept, per slot and over every slot: a slot
//! uses the smaller of the two, so that one slow answer on a slot does not loosen it. Only a
//! script that says it came too late replaces a bound by a larger one, since the clock moved
//! (another master after a failover, a clock stepped or drifting): its slot then uses its own
//! bound for [`PIN_US`], so that a master whose clock is ahead of the others' is not judged by
//! theirs.

use std::{
    sync::atomic::{AtomicI64, Ordering},
    time::{Duration, SystemTime},
};

use super::slot;

/// How long a slot whose script came too late uses its own bound alone.
pub const PIN_US: i64 = 10_000_000;

/// Unknown offset.
const UNKNOWN: i64 = i64::MIN;

/// A slot's bound, and until when it is used alone (local µs).
struct Bound {
    offset: AtomicI64,
    pinned_until: AtomicI64,
}

impl Bound {
    fn new() -> Self {
        Self {
            offset: AtomicI64::new(UNKNOWN),
            pinned_until: AtomicI64::new(0),
        }
    }

    /// Keeps `bound` if it is tighter, or whatever it is if `late`.
    fn learn(&self, bound: i64, late: bool) {
        let kept = self.offset.load(Ordering::Relaxed);
        if kept == UNKNOWN || bound < kept || late {
            self.offset.store(bound, Ordering::Relaxed);
        }
    }

    fn get(&self) -> Option<i64> {
        let offset = self.offset.load(Ordering::Relaxed);
        (offset != UNKNOWN).then_some(offset)
    }
}

/// The offsets of every hash slot. Lock-free: races between observations only lose a sample.
pub struct RedisClock {
    /// Per slot.
    slots: Box<[Bound]>,
    /// Over every slot: for a slot not used yet, and to tighten a slot's own.
    any: Bound,
}

impl Default for RedisClock {
    fn default() -> Self {
        Self::new()
    }
}

impl RedisClock {
    /// Knows nothing yet.
    pub fn new() -> Self {
        Self {
            slots: (0..16_384).map(|_| Bound::new()).collect(),
            any: Bound::new(),
        }
    }

    /// This process's wall clock, in microseconds since the Unix epoch.
    pub fn local_now_us() -> i64 {
        let since = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
    }

    /// Whether any offset was learnt yet.
    pub fn knows(&self) -> bool {
        self.any.get().is_some()
    }

    /// Records that a script on `key`, sent at local time `sent_us`, read Redis time
    /// `redis_us`. With `late`, the script said it came too late: its bound is taken even if
    /// larger than the one kept, and its slot uses its own for [`PIN_US`].
    pub fn observe(&self, key: &str, sent_us: i64, redis_us: i64, late: bool) {
        let bound = redis_us.saturating_sub(sent_us);
        let own = &self.slots[usize::from(slot(key))];
        own.learn(bound, late);
        self.any.learn(bound, late);
        if late {
            own.pinned_until.store(
                Self::local_now_us().saturating_add(PIN_US),
                Ordering::Relaxed,
            );
        }
    }

    /// The Redis time of local time `local_us` on `key`'s slot, if an offset was learnt: never
    /// earlier than the truth, unless a master's clock moved ahead since (then one script
    /// says it came too late, and its slot learns).
    pub fn to_redis(&self, key: &str, local_us: i64) -> Option<i64> {
        let own = &self.slots[usize::from(slot(key))];
        let offset = match (own.get(), self.any.get()) {
            (Some(own_offset), _)
                if Self::local_now_us() < own.pinned_until.load(Ordering::Relaxed) =>
            {
                own_offset
            }
            (Some(a), Some(b)) => a.min(b),
            (one, other) => one.or(other)?,
        };
        Some(local_us.saturating_add(offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tightest bound is kept and shared: a slot uses the smaller of its own and every
    /// slot's; a larger one replaces it only when a script came too late, and that slot then
    /// uses its own alone.
    #[test]
    fn tightest_bound_and_late_scripts() {
        let clock = RedisClock::new();
        assert!(!clock.knows());
        assert_eq!(clock.to_redis("{a}", 100), None);
        clock.observe("{a}", 1_000, 6_000, false);
        assert_eq!(clock.to_redis("{a}", 100), Some(5_100));
        // Another slot, never used, borrows it; a slow answer there does not loosen it.
        assert_eq!(clock.to_redis("{b}", 100), Some(5_100));
        clock.observe("{b}", 1_000, 40_000, false);
        assert_eq!(clock.to_redis("{b}", 100), Some(5_100));
        clock.observe("{a}", 1_000, 4_000, false);
        assert_eq!(clock.to_redis("{a}", 100), Some(3_100));
        assert_eq!(clock.to_redis("{b}", 100), Some(3_100));
        clock.observe("{a}", 1_000, 9_000, false);
        assert_eq!(clock.to_redis("{a}", 100), Some(3_100));
        // Too late on {c}: its master's clock is ahead; {c} uses its own, the others the least.
        clock.observe("{c}", 1_000, 90_000, true);
        assert_eq!(clock.to_redis("{c}", 100), Some(89_100));
        clock.observe("{c}", 1_000, 80_000, false);
        assert_eq!(clock.to_redis("{c}", 100), Some(79_100));
        clock.observe("{a}", 1_000, 2_000, false);
        assert_eq!(clock.to_redis("{a}", 100), Some(1_100));
        assert_eq!(clock.to_redis("{c}", 100), Some(79_100));
    }
}
