//! Decoding script replies and encoding durations for scripts, shared by every service.

use std::time::Duration;

use redis::Value;

use crate::error::Error;

/// A duration as whole milliseconds for a script argument.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A non-negative millisecond count from Redis as a duration; `None` for Redis's negative markers
/// (-1: no expiry, -2: no key).
pub fn ms(v: i64) -> Option<Duration> {
    u64::try_from(v).ok().map(Duration::from_millis)
}

/// The error for a reply that does not have the shape the script promises.
pub fn unexpected(what: &str) -> Error {
    Error::Internal(format!("unexpected {what} from Redis"))
}

/// An integer reply (or a bulk string holding one, as fencing tokens are returned).
pub fn int(v: &Value) -> Result<i64, Error> {
    redis::from_redis_value_ref(v).map_err(|_| unexpected("integer"))
}

/// A string reply.
pub fn string(v: &Value) -> Result<String, Error> {
    redis::from_redis_value_ref(v).map_err(|_| unexpected("string"))
}
