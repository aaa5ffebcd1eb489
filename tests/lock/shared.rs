//! Shared locks (docs/guarantees.md, "Shared locks and fairness" 1-2): shared holders together,
//! never with an exclusive one; shared leases that expire, stream and fence like exclusive ones;
//! a writer not starved by readers.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use baton::proto::v1::{
    self as pb, lock_service_hold_response::Event as HoldEvent,
    lock_service_keep_alive_response::Event as KeepAliveEvent,
};
use tokio::{task::JoinSet, time::Instant};
use tonic::Code;

use crate::support::{
    Baton, RedisServer, assert_code,
    lease::next_event,
    lock::{
        EXCLUSIVE, FAIR, FAIR_SHARED, SHARED, ask, ask_hold_request, describe, granted, refresh,
        release, wait_until_free,
    },
    remaining, wait_until, within,
};

/// Five shared holders hold the lock at once, each with its own lease; an exclusive request is
/// refused while any of them lives and granted once the last one is released; a shared request
/// is refused while the exclusive holder holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_holders_exclude_an_exclusive_holder_and_back() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut leases = Vec::new();
    for i in 0..5u64 {
        let lease = granted(
            &mut client,
            "doc",
            10_000 + i * 1_000,
            None,
            &format!("r{i}"),
            SHARED,
        )
        .await;
        assert_eq!(lease.mode(), pb::LockMode::Shared);
        assert_eq!(lease.hold_count, 1);
        leases.push(lease);
    }
    let tokens: std::collections::HashSet<_> = leases.iter().map(|l| l.token.clone()).collect();
    assert_eq!(tokens.len(), 5, "each shared holder has its own lease");

    let d = describe(&mut client, "doc").await;
    assert!(d.held);
    assert_eq!(d.mode(), pb::LockMode::Shared);
    assert_eq!(d.shared_holders, 5);
    assert_eq!((d.owner.as_str(), d.hold_count), ("", 0));
    assert_eq!(
        d.fencing_token, leases[4].fencing_token,
        "the latest issued"
    );
    let longest = remaining(&d.remaining_ttl, "longest shared lease");
    assert!(
        longest > Duration::from_secs(13) && longest <= Duration::from_secs(14),
        "{longest:?}"
    );
    let earliest = d
        .earliest_shared_holder
        .expect("the earliest shared holder");
    assert_eq!(earliest.owner, "r0");
    assert_eq!(earliest.hold_count, 1);
    assert_eq!(earliest.fencing_token, leases[0].fencing_token);
    assert!(remaining(&earliest.remaining_ttl, "earliest") <= Duration::from_secs(10));

    for lease in &leases[..4] {
        let refused = ask(&mut client, "doc", 10_000, None, "writer", EXCLUSIVE).await;
        assert!(!refused.acquired, "{refused:?}");
        let left = remaining(&refused.holder_remaining_ttl, "holder_remaining_ttl");
        assert!(
            left > Duration::from_secs(10),
            "the longest shared lease: {left:?}"
        );
        assert!(release(&mut client, "doc", &lease.token).await.was_held);
    }
    assert!(
        !ask(&mut client, "doc", 10_000, None, "writer", EXCLUSIVE)
            .await
            .acquired
    );
    let last = release(&mut client, "doc", &leases[4].token).await;
    assert_eq!((last.was_held, last.remaining_holds), (true, 0));

    let writer = granted(&mut client, "doc", 10_000, None, "writer", EXCLUSIVE).await;
    assert_eq!(writer.mode(), pb::LockMode::Exclusive);
    let refused = ask(&mut client, "doc", 10_000, None, "reader", SHARED).await;
    assert!(!refused.acquired, "{refused:?}");
    assert!(refused.holder_remaining_ttl.is_some());
    let d = describe(&mut client, "doc").await;
    assert_eq!((d.mode(), d.shared_holders), (pb::LockMode::Exclusive, 0));
    assert!(release(&mut client, "doc", &writer.token).await.was_held);
    granted(&mut client, "doc", 10_000, None, "reader", SHARED).await;
}

/// A shared lease that is never released ends at its ttl: a waiting writer gets the lock about
/// 300 ms later, without any release published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_lease_expires_at_its_ttl() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let started = Instant::now();
    let reader = granted(&mut client, "doc", 300, None, "reader", SHARED).await;
    let writer = granted(&mut client, "doc", 10_000, Some(5_000), "writer", EXCLUSIVE).await;
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(250) && elapsed < Duration::from_millis(1_500),
        "got a lock held shared for 300 ms after {elapsed:?}"
    );
    assert!(writer.fencing_token > reader.fencing_token);
    let released = release(&mut client, "doc", &reader.token).await;
    assert!(
        !released.was_held,
        "the expired shared lease is gone: {released:?}"
    );
    assert_code(
        refresh(&mut client, "doc", &reader.token, None).await,
        Code::FailedPrecondition,
        "refresh of an expired shared lease",
    );
}

/// A writer is not starved by a stream of overlapping readers: once it waits, new shared
/// requests wait behind it, and it gets the lock as soon as the readers already in let go; the
/// readers then go on. Checked without and with fairness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_is_not_starved_by_readers() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;

    for (reading, writing) in [(SHARED, EXCLUSIVE), (FAIR_SHARED, FAIR)] {
        let name = format!("doc-{}", reading.fair);
        let stop = Arc::new(AtomicBool::new(false));
        let grants = Arc::new(Mutex::new(Vec::new()));
        // A new reader every 30 ms, each holding 120 ms: the lock never falls free by itself.
        let mut readers = JoinSet::new();
        let spawner = {
            let (stop, grants, name) = (stop.clone(), grants.clone(), name.clone());
            let client = baton.client().await;
            tokio::spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let (grants, name, mut c) = (grants.clone(), name.clone(), client.clone());
                    readers.spawn(async move {
                        let asked_at = Instant::now();
                        let lease = granted(&mut c, &name, 5_000, Some(5_000), "", reading).await;
                        grants
                            .lock()
                            .expect("grants")
                            .push((asked_at, Instant::now()));
                        tokio::time::sleep(Duration::from_millis(120)).await;
                        release(&mut c, &name, &lease.token).await;
                    });
                    tokio::time::sleep(Duration::from_millis(30)).await;
                }
                while let Some(joined) = readers.join_next().await {
                    joined.expect("a reader task failed");
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;

        let mut w = baton.client().await;
        let asked_at = Instant::now();
        let lease = granted(&mut w, &name, 5_000, Some(5_000), "writer", writing).await;
        let got_at = Instant::now();
        let waited = got_at - asked_at;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released_at = Instant::now();
        assert!(release(&mut w, &name, &lease.token).await.was_held);
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::SeqCst);
        within(Duration::from_secs(10), spawner, "the readers to finish")
            .await
            .expect("reader spawner");

        assert!(
            waited < Duration::from_millis(600),
            "{writing:?}: the writer waited {waited:?} behind readers holding 120 ms each"
        );
        let grants = grants.lock().expect("grants");
        // Readers that asked after the writer began waiting (with a margin for its registration)
        // were granted only after it released.
        let late: Vec<_> = grants
            .iter()
            .filter(|(asked, _)| *asked > asked_at + Duration::from_millis(20))
            .collect();
        assert!(!late.is_empty(), "readers kept coming");
        for (asked, got) in late {
            assert!(
                *got >= released_at || *asked > released_at,
                "{reading:?}: a reader that asked {:?} after the writer got in {:?} before it released",
                *asked - asked_at,
                got.saturating_duration_since(asked_at)
            );
        }
    }
}

/// Fencing tokens strictly increase in grant order across shared and exclusive grants, with
/// overlapping shared leases each getting their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_modes() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut tokens = Vec::new();
    let s1 = granted(&mut client, "doc", 10_000, None, "", SHARED).await;
    let s2 = granted(&mut client, "doc", 10_000, None, "", SHARED).await;
    tokens.extend([s1.fencing_token, s2.fencing_token]);
    release(&mut client, "doc", &s1.token).await;
    let s3 = granted(&mut client, "doc", 10_000, None, "", SHARED).await;
    tokens.push(s3.fencing_token);
    release(&mut client, "doc", &s2.token).await;
    release(&mut client, "doc", &s3.token).await;
    let x1 = granted(&mut client, "doc", 10_000, None, "", EXCLUSIVE).await;
    tokens.push(x1.fencing_token);
    release(&mut client, "doc", &x1.token).await;
    let s4 = granted(&mut client, "doc", 10_000, None, "", FAIR_SHARED).await;
    tokens.push(s4.fencing_token);
    release(&mut client, "doc", &s4.token).await;
    let x2 = granted(&mut client, "doc", 10_000, None, "", FAIR).await;
    tokens.push(x2.fencing_token);
    if let Some(w) = tokens.windows(2).find(|w| w[0] >= w[1]) {
        panic!("fencing tokens went {} then {}: {tokens:?}", w[0], w[1]);
    }
}

/// `Hold` and `KeepAlive` streams of shared leases: two shared Holds (ttl 300 ms) stay held past
/// their ttl side by side; a KeepAlive keeps a shared lease from `Acquire` alive; closing each
/// stream releases its lease at once and leaves the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_leases_in_hold_and_keep_alive_streams() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut streams = Vec::new();
    for owner in ["a", "b"] {
        let mut stream = client
            .hold(ask_hold_request("doc", 300, owner, SHARED))
            .await
            .expect("Hold")
            .into_inner();
        match next_event(&mut stream, Duration::from_secs(2), "acquired").await {
            HoldEvent::Acquired(lease) => {
                assert_eq!(lease.mode(), pb::LockMode::Shared);
                assert_eq!(lease.owner, owner);
            }
            other => panic!("expected acquired, got {other:?}"),
        }
        streams.push(stream);
    }
    let lease = granted(&mut client, "doc", 300, None, "c", SHARED).await;
    let mut kept = client
        .keep_alive(pb::LockServiceKeepAliveRequest {
            name: "doc".into(),
            token: lease.token.clone(),
            ttl: None,
        })
        .await
        .expect("KeepAlive")
        .into_inner();
    assert!(matches!(
        next_event(&mut kept, Duration::from_millis(200), "first renewal").await,
        KeepAliveEvent::Renewed(_)
    ));

    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        for stream in &mut streams {
            assert!(matches!(
                next_event(stream, Duration::from_millis(300), "a renewal").await,
                HoldEvent::Renewed(_)
            ));
        }
        assert!(matches!(
            next_event(&mut kept, Duration::from_millis(300), "a renewal").await,
            KeepAliveEvent::Renewed(_)
        ));
    }
    let d = describe(&mut client, "doc").await;
    assert_eq!(
        (d.mode(), d.shared_holders),
        (pb::LockMode::Shared, 3),
        "held past the ttl: {d:?}"
    );
    assert!(
        !ask(&mut client, "doc", 1_000, None, "writer", EXCLUSIVE)
            .await
            .acquired
    );

    drop(kept);
    let shared_holders = |n: u32| {
        let client = client.clone();
        async move {
            wait_until(
                Duration::from_secs(1),
                &format!("{n} shared holders"),
                || {
                    let mut client = client.clone();
                    async move {
                        let d = describe(&mut client, "doc").await;
                        if d.shared_holders == n {
                            Ok(())
                        } else {
                            Err(d)
                        }
                    }
                },
            )
            .await;
        }
    };
    shared_holders(2).await;
    streams.pop();
    shared_holders(1).await;
    streams.pop();
    wait_until_free(&client, "doc", Duration::from_secs(1)).await;
    granted(&mut client, "doc", 1_000, None, "writer", EXCLUSIVE).await;
}
