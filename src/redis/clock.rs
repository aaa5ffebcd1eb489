//! Redis's clock as seen from this process, per hash slot (in a Cluster each master has its own
//! clock): an upper bound of the offset between Redis's `TIME` and this process's wall clock,
//! learnt from scripts that return the `TIME` they read. It lets Baton give a script the last
//! moment, by Redis's own clock, at which it may still act: one that runs later (Redis was frozen
//! or busy, and the caller was answered without it) changes nothing.
//!
//! A script sent at local time `s` that read Redis time `r` proves the offset is at most `r - s`
//! (Redis read its clock after the script was sent). The smallest such bound seen in the last
//! second is kept: it is later than the truth by at most the round trip of that sample. A larger
//! bound replaces it at once when a script says it came too late, since the clock may have moved
//! (another master after a failover, a clock stepped). A slot not used yet borrows the bound
//! learnt on any slot (one node's clock, or a Cluster's masters' kept close by NTP).

use std::{
    sync::atomic::{AtomicI64, Ordering},
    time::{Duration, SystemTime},
};

use super::slot;

/// How long the smallest bound is kept before a larger one may replace it.
const KEEP_US: i64 = 1_000_000;

/// Unknown offset.
const UNKNOWN: i64 = i64::MIN;

/// The offsets of every hash slot. Lock-free: races between observations only lose a sample.
pub struct RedisClock {
    /// Per slot: the offset's upper bound (µs), and the local time it was learnt (µs).
    slots: Box<[(AtomicI64, AtomicI64)]>,
    /// The same over every slot, for a slot not used yet.
    any: (AtomicI64, AtomicI64),
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
            slots: (0..16_384)
                .map(|_| (AtomicI64::new(UNKNOWN), AtomicI64::new(0)))
                .collect(),
            any: (AtomicI64::new(UNKNOWN), AtomicI64::new(0)),
        }
    }

    /// This process's wall clock, in microseconds since the Unix epoch.
    pub fn local_now_us() -> i64 {
        let since = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
    }

    /// Records that a script on `key`, sent at local time `sent_us`, read Redis time
    /// `redis_us`. With `late`, the script said it came too late: its bound is taken even if
    /// larger than the one kept.
    pub fn observe(&self, key: &str, sent_us: i64, redis_us: i64, late: bool) {
        let bound = redis_us.saturating_sub(sent_us);
        let now = Self::local_now_us();
        for (offset, learnt) in [&self.slots[usize::from(slot(key))], &self.any] {
            let kept = offset.load(Ordering::Relaxed);
            let stale = now.saturating_sub(learnt.load(Ordering::Relaxed)) > KEEP_US;
            if kept == UNKNOWN || bound <= kept || stale || late {
                offset.store(bound, Ordering::Relaxed);
                learnt.store(now, Ordering::Relaxed);
            }
        }
    }

    /// The Redis time of local time `local_us` on `key`'s slot (or, for a slot not used yet, on
    /// any), if an offset was learnt: never earlier than the truth.
    pub fn to_redis(&self, key: &str, local_us: i64) -> Option<i64> {
        let mut offset = self.slots[usize::from(slot(key))].0.load(Ordering::Relaxed);
        if offset == UNKNOWN {
            offset = self.any.0.load(Ordering::Relaxed);
        }
        (offset != UNKNOWN).then(|| local_us.saturating_add(offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tightest bound is kept, a looser one only replaces it when it says the script came
    /// too late, and a slot not used yet borrows the last bound of any.
    #[test]
    fn tightest_bound_and_late_scripts() {
        let clock = RedisClock::new();
        assert_eq!(clock.to_redis("{a}", 100), None);
        clock.observe("{a}", 1_000, 6_000, false);
        assert_eq!(clock.to_redis("{a}", 100), Some(5_100));
        clock.observe("{a}", 1_000, 4_000, false);
        assert_eq!(clock.to_redis("{a}", 100), Some(3_100));
        clock.observe("{a}", 1_000, 9_000, false);
        assert_eq!(clock.to_redis("{a}", 100), Some(3_100));
        clock.observe("{a}", 1_000, 9_000, true);
        assert_eq!(clock.to_redis("{a}", 100), Some(8_100));
        assert_eq!(clock.to_redis("{b}", 100), Some(8_100));
        clock.observe("{b}", 1_000, 2_000, false);
        assert_eq!(clock.to_redis("{b}", 100), Some(1_100));
        assert_eq!(clock.to_redis("{a}", 100), Some(8_100));
    }
}
