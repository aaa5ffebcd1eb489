//! Rate limiting: GCRA, fixed windows and an exact sliding window, each one atomic Lua script
//! timed by Redis `TIME`, with a per-Baton failure mode for when Redis does not answer in time.
//!
//! # Redis layout
//!
//! Every limiter is one key whose hash tag is the limited key, so a decision touches one Redis
//! Cluster slot. Each algorithm keeps its own state for a key:
//!
//! | key | type | holds | lifetime |
//! |---|---|---|---|
//! | `PREFIX{rl:KEY}:gcra` | string | theoretical arrival time (µs: whole and fraction) | until the bucket is full again (at most `burst` × `period` / `limit`) |
//! | `PREFIX{rl:KEY}:fw` | string | units counted in the window | the window (`period` from its first allowed unit) |
//! | `PREFIX{rl:KEY}:sw` | sorted set | one member per unit allowed in the last `period` | `period` after the last allowed unit |
//! | `PREFIX{rl-envoy:DESCRIPTOR}:ALGO` | as above, plus `aw:MS` (hash: window start, count) per window length of `MS` ms | the same for Envoy's API | the same; `aw:MS` until the aligned window ends |
//!
//! The gRPC handlers are in [`service`] (`baton.v1.RateLimitService`) and [`envoy`]
//! (`envoy.service.ratelimit.v3.RateLimitService`); the Envoy rules file is read by [`rules`],
//! through a bounded YAML reader (`yaml`); the scripts and their arguments are in [`scripts`].
//! This module knows nothing of tonic.

pub mod envoy;
pub mod rules;
pub mod scripts;
pub mod service;
mod yaml;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use redis::Script;
use tokio::time::Instant;

use crate::{
    config::{FailureMode, RateLimitConfig, RedisConfig},
    error::{Error, UNAVAILABLE_RETRY_AFTER, in_words},
    redis::{Redis, clock::RedisClock},
};
use scripts::Reply;

/// Longest limited key, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// Largest limit (and burst and cost): large enough for byte counts, small enough that counts
/// stay exact in Lua's doubles.
pub const MAX_UNITS: u64 = 1_000_000_000_000;
/// Largest limit of the sliding window, which keeps one entry per unit allowed in the window.
pub const MAX_SLIDING_LIMIT: u64 = 10_000;
/// Shortest period.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);
/// Longest period.
pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);
/// Deepest GCRA bucket: the time `burst × period / limit` a bucket takes to refill from empty,
/// which is also the longest its key lives. The script keeps the bucket's theoretical arrival
/// time as microseconds since the Unix epoch in a Lua double, exact below 2^53 µs (the year
/// 2255): now plus 100 years stays below that until the year 2155, and the key's expiry (`SET`
/// `PX`, in milliseconds) far below the 2^63 Redis accepts.
pub const MAX_GCRA_DEPTH: Duration = Duration::from_secs(100 * 365 * 86_400);
/// Shortest interval between two failure-mode warnings in the log.
const WARNING_INTERVAL: Duration = Duration::from_secs(1);

/// How a limit is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Generic cell rate algorithm: a sustained rate with bursts up to `burst`.
    Gcra,
    /// Fixed window opened by the first allowed unit (the classic INCR + EXPIRE limiter).
    FixedWindow,
    /// Fixed window aligned to multiples of the period since the Unix epoch (envoyproxy/ratelimit).
    AlignedWindow,
    /// Exact sliding window: at most `limit` in any interval of length `period`.
    SlidingWindow,
}

impl Algorithm {
    /// The suffix of this algorithm's Redis key.
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Gcra => "gcra",
            Self::FixedWindow => "fw",
            Self::AlignedWindow => "aw",
            Self::SlidingWindow => "sw",
        }
    }
}

/// Which setting of a [`Rate`] is out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateField {
    /// The number of units per period.
    Limit,
    /// The period.
    Period,
    /// The GCRA burst.
    Burst,
}

/// A validated limit: `limit` units per `period`, enforced by `algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// How the limit is enforced.
    pub algorithm: Algorithm,
    /// Units allowed per period.
    pub limit: u64,
    /// The period, a whole number of milliseconds.
    pub period: Duration,
    /// GCRA: units that may be spent at once from a full bucket; equal to `limit` otherwise.
    pub burst: u64,
}

impl Rate {
    /// A rate, or which setting is wrong and why. `burst` is GCRA's (`None` means `limit`); the
    /// period must be a whole number of milliseconds.
    pub fn new(
        algorithm: Algorithm,
        limit: u64,
        period: Duration,
        burst: Option<u64>,
    ) -> Result<Self, (RateField, String)> {
        let max = match algorithm {
            Algorithm::SlidingWindow => MAX_SLIDING_LIMIT,
            _ => MAX_UNITS,
        };
        if limit == 0 || limit > max {
            return Err((RateField::Limit, format!("{limit} is outside 1 to {max}")));
        }
        if period < MIN_PERIOD
            || period > MAX_PERIOD
            || !period.subsec_nanos().is_multiple_of(1_000_000)
        {
            return Err((
                RateField::Period,
                format!(
                    "{} is not a whole number of milliseconds from {} to {}",
                    humantime::format_duration(period),
                    humantime::format_duration(MIN_PERIOD),
                    humantime::format_duration(MAX_PERIOD)
                ),
            ));
        }
        let burst = match (algorithm, burst) {
            (Algorithm::Gcra, Some(b)) if b == 0 || b > MAX_UNITS => {
                return Err((RateField::Burst, format!("{b} is outside 1 to {MAX_UNITS}")));
            }
            (Algorithm::Gcra, Some(b)) => b,
            (_, Some(_)) => {
                return Err((RateField::Burst, "applies to GCRA only".to_owned()));
            }
            (_, None) => limit,
        };
        if algorithm == Algorithm::Gcra {
            // At most 10^12 × 3.2e13 µs: no overflow in u128. Only a burst above the limit can
            // make the bucket deeper than the period.
            let depth_us = u128::from(burst) * period.as_micros() / u128::from(limit);
            if depth_us > MAX_GCRA_DEPTH.as_micros() {
                // Whole years, or two decimals, so that a depth just past the bound does not
                // read as the bound.
                let year = Duration::from_secs(365 * 86_400).as_micros();
                #[allow(clippy::cast_precision_loss)] // a message: two decimals are plenty
                let years = if depth_us.is_multiple_of(year) {
                    (depth_us / year).to_string()
                } else {
                    format!("{:.2}", depth_us as f64 / year as f64)
                };
                return Err((
                    RateField::Burst,
                    format!(
                        "{burst} units at {limit} per {} take {years} years to refill; at most {} years (burst × period / limit), beyond which the key's expiry and the script's exact arithmetic end",
                        in_words(period),
                        MAX_GCRA_DEPTH.as_secs() / (365 * 86_400)
                    ),
                ));
            }
        }
        Ok(Self {
            algorithm,
            limit,
            period,
            burst,
        })
    }

    /// The largest cost that can ever be allowed at once.
    pub fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::Gcra => self.burst,
            _ => self.limit,
        }
    }
}

/// What decided an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// The limiter's state in Redis.
    Redis,
    /// Redis did not answer in time; allowed by the fail-open policy.
    FailOpen,
    /// Redis did not answer in time; denied by the fail-closed policy.
    FailClosed,
}

/// The answer to one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the cost was counted (or, for a peek, whether a cost of 1 would be).
    pub allowed: bool,
    /// The limit decided against.
    pub limit: u64,
    /// Units that could still be spent right now.
    pub remaining: u64,
    /// When denied, the time until the same check could be allowed (`None`: never, the cost is
    /// larger than the limit can ever allow).
    pub retry_after: Option<Duration>,
    /// The time until the limiter is back to its full, unused state.
    pub reset_after: Duration,
    /// What decided.
    pub decided_by: DecidedBy,
}

/// The Redis key of a limiter for `name` in `namespace` (`rl` for `Check`, `rl-envoy` for
/// Envoy descriptors) under `prefix`.
pub fn limiter_key(prefix: &str, namespace: &str, name: &str, algorithm: Algorithm) -> String {
    format!("{prefix}{{{namespace}:{name}}}:{}", algorithm.suffix())
}

/// The Redis key of the limiter enforcing `rate` for `name` in `namespace`: [`limiter_key`] for
/// its algorithm, and for an aligned window the window's length too (`:aw:MS`), so that windows of
/// different lengths for one descriptor (a rule's and a route's override, a rule before and after
/// a reload changed its unit) count apart instead of restarting each other's count.
pub fn rate_key(prefix: &str, namespace: &str, name: &str, rate: &Rate) -> String {
    let key = limiter_key(prefix, namespace, name, rate.algorithm);
    match rate.algorithm {
        Algorithm::AlignedWindow => format!("{key}:{}", rate.period.as_millis()),
        _ => key,
    }
}

/// The rate limiter. Cheap to clone.
#[derive(Clone)]
pub struct RateLimiter {
    inner: Arc<Inner>,
}

struct Inner {
    redis: Redis,
    failure_mode: FailureMode,
    gcra: Script,
    fixed_window: Script,
    aligned_window: Script,
    sliding_window: Script,
    last_warning: Mutex<Option<Instant>>,
    /// Redis's clock, to tell each check the Redis time past which it changes nothing.
    clock: RedisClock,
    /// `clock.lua`: reads Redis's clock on a key's node, until a first check has.
    read_clock: Script,
}

impl RateLimiter {
    /// A limiter over its own pool of Redis connections whose command timeout is the rate limit
    /// timeout, so that a slow Redis costs a decision at most that long.
    pub fn connect(redis: &RedisConfig, config: &RateLimitConfig) -> Result<Self, Error> {
        let mut redis = redis.clone();
        redis.command_timeout = config.timeout;
        let redis = Redis::with_role(&redis, crate::metrics::PoolRole::RateLimit)?;
        Ok(Self::new(redis, config.failure_mode))
    }

    /// A limiter over `redis`, answering by `failure_mode` when Redis does not answer.
    pub fn new(redis: Redis, failure_mode: FailureMode) -> Self {
        let clock = RedisClock::new(redis.is_cluster());
        Self {
            inner: Arc::new(Inner {
                redis,
                failure_mode,
                gcra: Script::new(scripts::GCRA),
                fixed_window: Script::new(scripts::FIXED_WINDOW),
                aligned_window: Script::new(scripts::ALIGNED_WINDOW),
                sliding_window: Script::new(scripts::SLIDING_WINDOW),
                last_warning: Mutex::new(None),
                clock,
                read_clock: Script::new(scripts::CLOCK),
            }),
        }
    }

    /// The namespace put in front of every key.
    pub fn key_prefix(&self) -> &str {
        self.inner.redis.key_prefix()
    }

    /// What this limiter answers when Redis does not.
    pub fn failure_mode(&self) -> FailureMode {
        self.inner.failure_mode
    }

    /// Decides one check of `cost` units (0 peeks) against `rate` on the limiter stored at `key`
    /// (from [`limiter_key`]). When Redis does not answer in time, the answer follows the failure
    /// mode and says so.
    pub async fn check(&self, key: &str, rate: &Rate, cost: u64) -> Decision {
        match self.try_check(key, rate, cost).await {
            Ok(decision) => decision,
            Err(e) => self.failed(rate, &e),
        }
    }

    /// The answer of the failure mode after `error`.
    pub fn failed(&self, rate: &Rate, error: &Error) -> Decision {
        self.warn(error);
        let open = self.inner.failure_mode == FailureMode::Open;
        Decision {
            allowed: open,
            limit: rate.limit,
            remaining: 0,
            retry_after: (!open).then_some(UNAVAILABLE_RETRY_AFTER),
            reset_after: Duration::ZERO,
            decided_by: if open {
                DecidedBy::FailOpen
            } else {
                DecidedBy::FailClosed
            },
        }
    }

    /// Logs a failure-mode decision, at most once per [`WARNING_INTERVAL`].
    fn warn(&self, error: &Error) {
        let now = Instant::now();
        let due = match self.inner.last_warning.lock() {
            Ok(mut last) => {
                let due = last.is_none_or(|at| now.duration_since(at) >= WARNING_INTERVAL);
                if due {
                    *last = Some(now);
                }
                due
            }
            // A panic elsewhere while holding this lock only costs a log line.
            Err(_) => true,
        };
        if due {
            tracing::warn!(
                error = %error,
                failure_mode = ?self.inner.failure_mode,
                "rate limit decided by the failure mode: redis gave no decision"
            );
        }
    }

    /// Runs the algorithm's script: one Redis round trip. The script is told the Redis time at
    /// which Baton stops waiting for it (the rate limit timeout after sending it, mapped to
    /// Redis's clock never later than the truth): run later, the caller was answered by the
    /// failure mode, so it changes nothing. Only a check that Redis began in time but whose
    /// answer came back after the timeout still counts.
    pub async fn try_check(&self, key: &str, rate: &Rate, cost: u64) -> Result<Decision, Error> {
        let inner = &self.inner;
        let script = match rate.algorithm {
            Algorithm::Gcra => &inner.gcra,
            Algorithm::FixedWindow => &inner.fixed_window,
            Algorithm::AlignedWindow => &inner.aligned_window,
            Algorithm::SlidingWindow => &inner.sliding_window,
        };
        let timeout = inner.redis.command_timeout();
        let timeout_us = i64::try_from(timeout.as_micros()).unwrap_or(i64::MAX);
        if !inner.clock.knows(key) {
            // Nothing tells this key's clock yet: read it first (once), so that even the first
            // checks carry their time limit. Redis not answering is the failure mode's to answer,
            // and nothing was sent that counts.
            let sent = RedisClock::local_now_us();
            let now: i64 = inner.redis.eval(&inner.read_clock.key(key)).await?;
            inner
                .clock
                .observe(key, sent, RedisClock::local_now_us(), now);
        }
        let started = Instant::now();
        let first_sent = RedisClock::local_now_us();
        let deadline = first_sent.saturating_add(timeout_us);
        let mut sent = first_sent;
        let mut retried = false;
        loop {
            let not_after = inner.clock.to_redis(key, deadline).unwrap_or(0);
            let invocation = scripts::Check {
                key,
                rate,
                cost,
                not_after,
            }
            .invocation(script);
            let reply: Vec<i64> = if !retried {
                inner.redis.eval(&invocation).await?
            } else {
                // Within what is left of the first attempt's timeout.
                let left = timeout.saturating_sub(started.elapsed());
                match tokio::time::timeout(left, inner.redis.eval(&invocation)).await {
                    Ok(reply) => reply?,
                    Err(_) => {
                        return Err(Error::Unavailable(format!(
                            "no answer within {}",
                            humantime::format_duration(timeout)
                        )));
                    }
                }
            };
            let answered = RedisClock::local_now_us();
            match scripts::reply(rate, &reply) {
                Some(Reply::Decided { decision, now }) => {
                    inner.clock.observe(key, sent, answered, now);
                    return Ok(decision);
                }
                Some(Reply::TooLate { now }) => {
                    inner.clock.observe(key, sent, answered, now);
                    // Judged late by a bound this very answer shows too loose (Baton's own
                    // reading of the clock was slow to come back): the check changed nothing,
                    // so it is sent once more with the tighter bound, if time is left.
                    let in_time = inner
                        .clock
                        .to_redis(key, deadline)
                        .is_some_and(|limit| now <= limit);
                    if !retried && in_time && answered < deadline {
                        retried = true;
                        sent = RedisClock::local_now_us();
                        continue;
                    }
                    return Err(Error::Unavailable(
                        "redis ran the check after the rate limit timeout".to_owned(),
                    ));
                }
                None => {
                    return Err(Error::Internal(
                        "unexpected rate limit reply from Redis".to_owned(),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key's hash tag is the same non-empty tag whatever the limited key contains.
    #[test]
    fn keys_have_one_hash_tag() {
        for name in ["user:1", "}", "{}", "a}b{c", ""] {
            let key = limiter_key("baton:", "rl", name, Algorithm::Gcra);
            assert!(crate::redis::hash_tag(&key).is_some(), "{key}");
            assert!(key.starts_with("baton:{rl:"), "{key}");
        }
    }

    /// Rates are bounded, the burst belongs to GCRA only, and GCRA's bucket depth is bounded.
    #[test]
    fn rate_bounds() {
        let s = Duration::from_secs(1);
        assert!(Rate::new(Algorithm::Gcra, 10, s, None).is_ok());
        assert_eq!(Rate::new(Algorithm::Gcra, 10, s, None).unwrap().burst, 10);
        assert_eq!(
            Rate::new(Algorithm::Gcra, 0, s, None).unwrap_err().0,
            RateField::Limit
        );
        assert_eq!(
            Rate::new(Algorithm::SlidingWindow, MAX_SLIDING_LIMIT + 1, s, None)
                .unwrap_err()
                .0,
            RateField::Limit
        );
        assert_eq!(
            Rate::new(Algorithm::Gcra, 1, Duration::from_micros(1500), None)
                .unwrap_err()
                .0,
            RateField::Period
        );
        assert_eq!(
            Rate::new(Algorithm::Gcra, 1, MAX_PERIOD + s, None)
                .unwrap_err()
                .0,
            RateField::Period
        );
        assert_eq!(
            Rate::new(Algorithm::FixedWindow, 1, s, Some(2))
                .unwrap_err()
                .0,
            RateField::Burst
        );
        assert_eq!(
            Rate::new(Algorithm::Gcra, 1, s, Some(0)).unwrap_err().0,
            RateField::Burst
        );
        // The bucket's depth, burst × period / limit, is at most MAX_GCRA_DEPTH.
        let day = Duration::from_secs(86_400);
        assert!(Rate::new(Algorithm::Gcra, 1, day, Some(36_500)).is_ok());
        assert_eq!(
            Rate::new(Algorithm::Gcra, 1, day, Some(36_501))
                .unwrap_err()
                .0,
            RateField::Burst
        );
        assert!(Rate::new(Algorithm::Gcra, MAX_UNITS, MAX_PERIOD, Some(MAX_UNITS)).is_ok());
        assert_eq!(
            Rate::new(Algorithm::Gcra, 1, MAX_PERIOD, Some(MAX_UNITS))
                .unwrap_err()
                .0,
            RateField::Burst
        );
    }
}
