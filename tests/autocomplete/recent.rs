//! Recent lists.

use super::*;

/// A recent list's `ttl` present but zero, negative or malformed is refused naming `ttl`, and
/// nothing is recorded; absent, the list lives 90 days.
#[tokio::test]
async fn recent_ttl_present_but_zero_is_refused() {
    let (redis, baton, mut client) = setup().await;
    let record = |ttl: Option<prost_types::Duration>| pb::AutocompleteServiceRecordRecentRequest {
        list: "l".into(),
        display: "x".into(),
        ttl,
        ..Default::default()
    };
    let bad = [
        ms(0),
        prost_types::Duration {
            seconds: -1,
            nanos: 0,
        },
        prost_types::Duration {
            seconds: 0,
            nanos: -5,
        },
        prost_types::Duration {
            seconds: 1,
            nanos: 1_000_000_000,
        },
    ];
    for ttl in bad {
        let status = client
            .record_recent(record(Some(ttl)))
            .await
            .expect_err(&format!("ttl {ttl:?} should be refused"));
        invalid(&status, "ttl");
    }
    let listed = client
        .list_recent(pb::AutocompleteServiceListRecentRequest {
            list: "l".into(),
            ..Default::default()
        })
        .await
        .expect("ListRecent")
        .into_inner();
    assert!(
        listed.items.is_empty(),
        "a refused call recorded {listed:?}"
    );
    let key = baton::autocomplete::RecentKeys::new(baton.prefix(), "l").order;
    let mut conn = redis.conn().await;
    client
        .record_recent(record(None))
        .await
        .expect("RecordRecent");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let ninety_days = 90 * 24 * 3600 * 1000;
    assert!(
        pttl > ninety_days - 60_000 && pttl <= ninety_days,
        "absent ttl: {pttl} ms"
    );
    client
        .record_recent(record(Some(ms(5000))))
        .await
        .expect("RecordRecent");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 5000, "5 s ttl: {pttl} ms");
}
