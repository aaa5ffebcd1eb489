//! What the lock and semaphore suites share: the end of a stream within a bound, and looks at the
//! keys a lease leaves in Redis.

use std::time::Duration;

use tonic::Streaming;

use super::{RedisConn, within};

/// Waits (bounded) until the stream ends cleanly.
pub async fn expect_end<T: std::fmt::Debug>(stream: &mut Streaming<T>, what: &str) {
    match within(Duration::from_secs(2), stream.message(), what).await {
        Ok(None) => {}
        other => panic!("{what}: expected the stream to end, got {other:?}"),
    }
}

/// `PTTL key`: milliseconds left, -1 without an expiry, -2 when the key does not exist.
pub async fn pttl(conn: &mut RedisConn, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

/// Whether `key` exists.
pub async fn exists(conn: &mut RedisConn, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}
