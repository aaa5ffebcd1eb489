//! Decoding script replies and encoding durations for scripts, shared by every service.

use std::time::Duration;

use redis::Value;

use crate::error::{Error, RETRYABLE_REDIS_CODES};

/// A duration as whole milliseconds for a script argument.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A non-negative millisecond count from Redis as a duration; `None` for Redis's negative markers
/// (-1: no expiry, -2: no key).
pub fn ms(v: i64) -> Option<Duration> {
    u64::try_from(v).ok().map(Duration::from_millis)
}

/// The entries of a batch reply whose entries a script ran each on its own (`count` of them, the
/// batched renewals): an integer each, or the text of the error Redis raised for that entry
/// alone, as an error of its own: `UNAVAILABLE` for Redis's "not now" codes (`OOM` when
/// `maxmemory` is reached), `INTERNAL` otherwise.
pub fn each_on_its_own(reply: Vec<Value>, count: usize) -> Result<Vec<Result<i64, Error>>, Error> {
    if reply.len() != count {
        return Err(unexpected("batch reply"));
    }
    reply
        .iter()
        .map(|entry| match entry {
            Value::Int(n) => Ok(Ok(*n)),
            raised => {
                let text = string(raised)?;
                let code = text.split([' ', ':']).next().unwrap_or_default();
                Ok(Err(if RETRYABLE_REDIS_CODES.contains(&code) {
                    Error::Unavailable(text)
                } else {
                    Error::Internal(format!("Redis raised an error: {text}"))
                }))
            }
        })
        .collect()
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
