//! The names of the figures in a [`Record`](crate::record::Record)'s `values`.

/// Length of the measured window, seconds.
pub const SECS: &str = "secs";
/// Operations completed (an acquire + release, a decision, a request, a handoff).
pub const OPS: &str = "ops";
/// Calls sent (an acquire + release is two).
pub const CALLS: &str = "calls";
/// Calls that failed.
pub const ERRORS: &str = "errors";
/// Waiting acquisitions that ended without a grant.
pub const TIMEOUTS: &str = "timeouts";
/// Operations per second.
pub const RATE: &str = "rate";
/// Call latency percentiles and mean, microseconds.
pub const P50: &str = "p50_us";
/// 90th percentile.
pub const P90: &str = "p90_us";
/// 99th percentile.
pub const P99: &str = "p99_us";
/// 99.9th percentile.
pub const P999: &str = "p999_us";
/// Largest.
pub const MAX: &str = "max_us";
/// Mean.
pub const MEAN: &str = "mean_us";
/// Handoff (release to the next grant) percentiles, microseconds.
pub const HANDOFF_P50: &str = "handoff_p50_us";
/// 99th percentile.
pub const HANDOFF_P99: &str = "handoff_p99_us";
/// Handoffs to another client than the one that released, percentiles, microseconds.
pub const OTHER_P50: &str = "handoff_other_p50_us";
/// 99th percentile.
pub const OTHER_P99: &str = "handoff_other_p99_us";
/// Share of grants that went to the client that released last.
pub const REGRANTS: &str = "regrants";
/// Jain's fairness index of the grants per client.
pub const JAIN: &str = "jain";
/// CPU seconds of Baton over the window.
pub const BATON_CPU: &str = "baton_cpu_s";
/// CPU seconds of Redis over the window.
pub const REDIS_CPU: &str = "redis_cpu_s";
/// CPU seconds of the load generator over the window.
pub const LOADGEN_CPU: &str = "loadgen_cpu_s";
/// Baton's resident memory at the end of the window, bytes.
pub const BATON_RSS: &str = "baton_rss_bytes";
/// Baton's resident memory right after it started, bytes.
pub const IDLE_RSS: &str = "idle_rss_bytes";
/// Leases held at the start of the window.
pub const HELD: &str = "held";
/// Seconds it took to open every lease.
pub const OPEN_SECS: &str = "open_secs";
/// Renewals the clients saw in the window.
pub const RENEWALS: &str = "renewals";
/// 1 when every lease was gone from Redis after its holder let go, else 0.
pub const RELEASED: &str = "released";
/// Results returned over all requests.
pub const RESULTS: &str = "results";
/// Terms loaded.
pub const TERMS: &str = "terms";
/// Redis `used_memory` growth, bytes.
pub const MEMORY: &str = "memory_bytes";
/// Seconds a failover or a load took.
pub const TOOK: &str = "took_s";
/// Keys a layout of the lex index took.
pub const KEYS: &str = "keys";
/// Of those, the keys Redis kept listpack-encoded.
pub const LISTPACK_KEYS: &str = "listpack_keys";
