//! Time (docs/guarantees.md, "Semaphores" 1-2): no client time in the API, expiry and fencing
//! tokens by Redis's clock, each holder ending at its own ttl and its permits reclaimed by the next
//! script.

use std::time::Duration;

use prost::Message;
use tokio::time::Instant;

use crate::support::{
    Baton, RedisServer,
    lease::{redis_time, wait_for_state, zcard, zscore},
    remaining,
    semaphore::{acquire, acquired, describe, refresh, refused, release, request, waiting},
};

/// No request of the SemaphoreService (nor any message a request embeds) carries a point in time:
/// clients pass only durations, so their clocks cannot influence any outcome. The only points in
/// time are the `expires_at` Baton reports in its answers, read off its own node's clock for the
/// client's use.
#[test]
fn the_api_carries_no_client_time() {
    let set = prost_types::FileDescriptorSet::decode(baton::proto::FILE_DESCRIPTOR_SET)
        .expect("FILE_DESCRIPTOR_SET decodes");
    let file = set
        .file
        .iter()
        .find(|f| f.name() == "baton/v1/semaphore.proto")
        .expect("semaphore.proto is compiled in");
    let service = &file.service[0];
    assert_eq!(service.name(), "SemaphoreService");
    let mut reported = Vec::new();
    for message in &file.message_type {
        for field in &message.field {
            let name = field.name();
            let timelike = field.type_name() == ".google.protobuf.Timestamp"
                || ["time", "timestamp", "now", "clock", "at", "deadline"].contains(&name)
                || name.ends_with("_at")
                || name.ends_with("_time");
            if !timelike {
                continue;
            }
            assert!(
                !message.name().ends_with("Request"),
                "{}.{name} is a point in time in a request",
                message.name()
            );
            assert_eq!(
                (name, field.type_name()),
                ("expires_at", ".google.protobuf.Timestamp"),
                "{}.{name}: the only point in time is the expiry Baton reports",
                message.name()
            );
            reported.push(message.name().to_owned());
        }
    }
    assert_eq!(reported, ["SemaphorePermit"], "{reported:?}");
}

/// Expiry and fencing follow Redis TIME: a lease's expiry score lies between Redis's clock read
/// before and after the grant plus its ttl (also after a refresh), and the first fencing token
/// lies between those two clock readings in microseconds; Describe's remaining ttl is the score
/// minus Redis's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_expiry_follows_redis_time() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    let mut conn = redis.conn().await;
    let holders = format!("{}:holders", baton.semaphore_key("pool"));

    let (before_ms, before_us) = redis_time(&mut conn).await;
    let permit = acquired(&mut client, request("pool", 2, 1, 10_000)).await;
    let (after_ms, after_us) = redis_time(&mut conn).await;
    let score = zscore(&mut conn, &holders, &permit.token)
        .await
        .expect("the holder's expiry");
    assert!(
        (before_ms + 10_000) as f64 <= score && score <= (after_ms + 10_000) as f64,
        "expiry {score} outside Redis time [{before_ms}, {after_ms}] + 10 s"
    );
    assert!(
        (before_us..=after_us).contains(&permit.fencing_token),
        "the first fencing token {} is Redis TIME in µs, within [{before_us}, {after_us}]",
        permit.fencing_token
    );

    let (before_ms, _) = redis_time(&mut conn).await;
    refresh(&mut client, "pool", &permit.token, Some(30_000))
        .await
        .expect("refresh");
    let (after_ms, _) = redis_time(&mut conn).await;
    let score = zscore(&mut conn, &holders, &permit.token)
        .await
        .expect("the holder's expiry");
    assert!(
        (before_ms + 30_000) as f64 <= score && score <= (after_ms + 30_000) as f64,
        "refreshed expiry {score} outside Redis time [{before_ms}, {after_ms}] + 30 s"
    );

    let (before_ms, _) = redis_time(&mut conn).await;
    let d = describe(&mut client, "pool").await;
    let (after_ms, _) = redis_time(&mut conn).await;
    let left = remaining(&d.holders[0].remaining_ttl, "describe").as_millis() as f64;
    assert!(
        score - after_ms as f64 <= left && left <= score - before_ms as f64,
        "Describe's {left} ms is not the score minus Redis time [{before_ms}, {after_ms}]"
    );
}

/// A unary holder that never renews (ttl 300 ms) loses its permits at its ttl, and the waiter
/// behind it (non-fair, then fair) gets them then: not before the expiry, and within a second of
/// it, with no release published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_that_stops_renewing_loses_its_permits_at_ttl() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    for fair in [false, true] {
        let name = format!("pool-{fair}");
        let sent = Instant::now();
        let holder = acquired(&mut client, request(&name, 2, 2, 300)).await;
        let response = acquire(&mut client, waiting(&name, 2, 1, 10_000, 5_000, fair)).await;
        let elapsed = sent.elapsed();
        assert!(response.acquired, "fair={fair}: {response:?}");
        // Redis counts whole milliseconds, so the expiry can come up to 1 ms early.
        assert!(
            elapsed >= Duration::from_millis(299),
            "fair={fair}: got permits of a 300 ms lease after only {elapsed:?}"
        );
        assert!(
            elapsed < Duration::from_millis(1_300),
            "fair={fair}: got permits of a 300 ms lease only after {elapsed:?}"
        );
        assert!(response.permit.expect("permit").fencing_token > holder.fencing_token);
        assert!(
            !release(&mut client, &name, &holder.token).await,
            "the lease had expired"
        );
    }
}

/// Scenario "timeout reclaim": expired holders stay in Redis (reads do not write) until the next
/// acquisition reclaims their permits inside its own script and is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_timeout_reclaim() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    let mut conn = redis.conn().await;
    let data = baton.semaphore_key("pool");
    let holders = format!("{data}:holders");

    acquired(&mut client, request("pool", 2, 1, 200)).await;
    acquired(&mut client, request("pool", 2, 1, 200)).await;
    refused(&mut client, request("pool", 2, 1, 10_000)).await;
    wait_for_state(&client, "pool", "both leases to expire", |d| {
        d.permits_in_use == 0
    })
    .await;
    assert_eq!(
        zcard(&mut conn, &holders).await,
        2,
        "Describe must not reclaim"
    );

    let permit = acquired(&mut client, request("pool", 2, 2, 10_000)).await;
    assert_eq!(
        zcard(&mut conn, &holders).await,
        1,
        "the acquisition reclaimed both"
    );
    let used: u64 = redis::cmd("HGET")
        .arg(&data)
        .arg("used")
        .query_async(&mut conn)
        .await
        .expect("HGET");
    assert_eq!(used, 2, "the reclaimed permits are no longer counted");
    assert_eq!(
        describe(&mut client, "pool").await.holders[0].fencing_token,
        permit.fencing_token
    );
}
