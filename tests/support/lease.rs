//! What the lock and semaphore suites share: the end of a stream within a bound, and looks at the
//! keys a lease leaves in Redis and at Redis's clock.

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

/// Redis's clock: (milliseconds, microseconds) since the epoch.
pub async fn redis_time(conn: &mut RedisConn) -> (u64, u64) {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    let us = secs * 1_000_000 + micros;
    (us / 1000, us)
}

/// `ZSCORE key member`: `None` when the member is not there.
pub async fn zscore(conn: &mut RedisConn, key: &str, member: &str) -> Option<f64> {
    redis::cmd("ZSCORE")
        .arg(key)
        .arg(member)
        .query_async(conn)
        .await
        .expect("ZSCORE")
}

/// `ZCARD key`.
pub async fn zcard(conn: &mut RedisConn, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .expect("ZCARD")
}

/// Every key under `prefix`, sorted (on every master of a Cluster).
pub async fn keys_under(conn: &mut RedisConn, prefix: &str) -> Vec<String> {
    conn.keys(&format!("{prefix}*")).await
}
