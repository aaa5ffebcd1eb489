//! Re-entrancy per owner (docs/guarantees.md, promises 2 and 4): each acquisition is a hold with a
//! token of its own, never shown by Describe; holds of one owner share a lease and its fencing
//! token, and no hold (its renewals, refresh or release) shortens another; anonymous callers never
//! re-enter, and an owner holding the lock shared cannot upgrade.

use std::time::Duration;

use baton::proto::v1::{self as pb, lock_service_keep_alive_response::Event as KeepAliveEvent};
use tokio::time::Instant;
use tonic::Code;

use crate::support::{
    Baton, RedisServer, assert_code,
    lease::next_renewal,
    lock::{
        EXCLUSIVE, FAIR, SHARED, acquire, acquire_request, acquired, ask, ask_request, describe,
        granted, granted_with, held, hold_request, refused_with, release,
    },
    ms, remaining, within,
};

/// The same owner acquiring three times gets hold counts 1, 2, 3 with one fencing token and a
/// token per hold; releasing each hold counts down 2, 1, 0 (a token releases its own hold once),
/// and another owner gets the lock only after the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_acquires_count_holds() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let mut leases = Vec::new();
    for expected in 1..=3 {
        let lease = acquired(&mut client, "orders", 10_000, None, "worker-1").await;
        assert_eq!(lease.hold_count, expected);
        assert_eq!(lease.owner, "worker-1");
        leases.push(lease);
    }
    let mut tokens: Vec<&str> = leases.iter().map(|l| l.token.as_str()).collect();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "every hold has a token of its own");
    assert!(
        leases
            .iter()
            .all(|l| l.fencing_token == leases[0].fencing_token)
    );
    assert_eq!(describe(&mut client, "orders").await.hold_count, 3);

    for (lease, expected) in leases.iter().zip([2, 1]) {
        let released = release(&mut client, "orders", &lease.token).await;
        assert!(released.was_held);
        assert_eq!(released.remaining_holds, expected);
        let again = release(&mut client, "orders", &lease.token).await;
        assert!(!again.was_held, "a token releases its own hold only once");
        let other = acquire(&mut client, "orders", 10_000, None, "worker-2").await;
        assert!(!other.acquired, "{expected} holds left: {other:?}");
    }
    let last = release(&mut client, "orders", &leases[2].token).await;
    assert!(last.was_held);
    assert_eq!(last.remaining_holds, 0);
    let other = acquired(&mut client, "orders", 10_000, None, "worker-2").await;
    assert!(other.fencing_token > leases[0].fencing_token);
    assert_eq!(other.hold_count, 1);
}

/// Without an owner every Acquire is a new owner, so a second one does not reenter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_without_owner_is_never_reentrant() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let first = acquired(&mut client, "orders", 10_000, None, "").await;
    let second = acquire(&mut client, "orders", 10_000, None, "").await;
    assert!(!second.acquired, "{second:?}");
    assert!(second.lease.is_none());
    assert_eq!(describe(&mut client, "orders").await.hold_count, 1);
    assert!(release(&mut client, "orders", &first.token).await.was_held);
}

/// Reentrancy per owner in both modes: a shared owner asking again gets one more hold (a token of
/// its own) of its own shared lease; an exclusive owner asking for it shared gets one more hold of
/// its exclusive lease (reported EXCLUSIVE); releasing each hold counts down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrancy_per_owner_in_both_modes() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let first = granted(&mut client, "shared", 10_000, None, "reader", SHARED).await;
    let other = granted(&mut client, "shared", 10_000, None, "other", SHARED).await;
    let again = granted(&mut client, "shared", 20_000, None, "reader", SHARED).await;
    assert_ne!(again.token, first.token);
    assert_eq!(again.fencing_token, first.fencing_token);
    assert_eq!(again.hold_count, 2);
    assert_eq!(again.mode(), pb::LockMode::Shared);
    assert_eq!(
        remaining(&again.remaining_ttl, "extended"),
        Duration::from_secs(20)
    );
    assert_eq!(describe(&mut client, "shared").await.shared_holders, 2);
    let r = release(&mut client, "shared", &first.token).await;
    assert_eq!((r.was_held, r.remaining_holds), (true, 1));
    let r = release(&mut client, "shared", &again.token).await;
    assert_eq!((r.was_held, r.remaining_holds), (true, 0));
    assert_eq!(describe(&mut client, "shared").await.shared_holders, 1);
    release(&mut client, "shared", &other.token).await;

    let writer = granted(&mut client, "exclusive", 10_000, None, "writer", EXCLUSIVE).await;
    let read = granted(&mut client, "exclusive", 10_000, None, "writer", SHARED).await;
    assert_ne!(read.token, writer.token);
    assert_eq!(read.fencing_token, writer.fencing_token);
    assert_eq!(read.hold_count, 2);
    assert_eq!(read.mode(), pb::LockMode::Exclusive);
    assert!(
        !ask(&mut client, "exclusive", 10_000, None, "someone", SHARED)
            .await
            .acquired
    );
    let d = describe(&mut client, "exclusive").await;
    assert_eq!(
        (d.mode(), d.hold_count, d.shared_holders),
        (pb::LockMode::Exclusive, 2, 0)
    );
    assert_eq!(
        release(&mut client, "exclusive", &writer.token)
            .await
            .remaining_holds,
        1
    );
    assert_eq!(
        release(&mut client, "exclusive", &read.token)
            .await
            .remaining_holds,
        0
    );
    assert!(!describe(&mut client, "exclusive").await.held);
}

/// An owner holding the lock only shared that asks for it exclusively is refused at once with
/// FAILED_PRECONDITION (even with a wait: an upgrade would deadlock), and nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_from_shared_to_exclusive_is_refused() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = granted(&mut client, "doc", 10_000, None, "reader", SHARED).await;
    for (wait, how) in [
        (None, EXCLUSIVE),
        (Some(5_000), EXCLUSIVE),
        (Some(5_000), FAIR),
    ] {
        let started = Instant::now();
        let status = assert_code(
            client
                .acquire(ask_request("doc", 10_000, wait, "reader", how))
                .await,
            Code::FailedPrecondition,
            "an upgrade",
        );
        assert!(status.message().contains("shared"), "{status:?}");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "refused at once"
        );
    }
    let d = describe(&mut client, "doc").await;
    assert_eq!(
        (d.mode(), d.shared_holders, d.waiters),
        (pb::LockMode::Shared, 1, 0),
        "{d:?}"
    );
    assert_eq!(d.earliest_shared_holder.expect("holder").hold_count, 1);
    assert!(release(&mut client, "doc", &lease.token).await.was_held);
}

/// Hold A (60 s) and a re-entrant Hold B (1 s) of the same owner: B's renewals and its close leave
/// A's promise whole; 1.5 s after B closed another owner still cannot take the lock, and A is not
/// told `lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shorter_reentrant_hold_never_shortens_the_lease() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let (mut a, lease_a) = held(&mut client, hold_request("orders", 60_000, None, "svc")).await;
    let (mut b, lease_b) = held(&mut client, hold_request("orders", 1_000, None, "svc")).await;
    assert_eq!(lease_b.hold_count, 2, "{lease_b:?}");
    assert_eq!(lease_b.fencing_token, lease_a.fencing_token);
    assert_ne!(lease_b.token, lease_a.token, "each hold has its own token");
    next_renewal(&mut b).await;
    drop(b);
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    refused_with(&mut client, acquire_request("orders", 1_000, None, "other")).await;
    let d = describe(&mut client, "orders").await;
    assert_eq!((d.owner.as_str(), d.hold_count), ("svc", 1), "{d:?}");
    assert!(
        remaining(&d.remaining_ttl, "lease") > Duration::from_secs(55),
        "{d:?}"
    );
    // A's stream is quiet (its next renewal is ~15 s away): it certainly got no `lost`.
    let quiet = tokio::time::timeout(Duration::from_millis(100), a.message()).await;
    assert!(quiet.is_err(), "A heard something: {quiet:?}");
}

/// Acquire (10 s) then a re-entrant Hold (1 s) by the same owner, closed after a renewal: the
/// first caller's remaining ttl is honoured; another owner gets nothing before it runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_outlives_a_shorter_reentrant_hold() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let sent = Instant::now();
    let first = granted_with(&mut client, acquire_request("orders", 10_000, None, "svc")).await;
    let promised = sent + remaining(&first.remaining_ttl, "first");
    let (mut stream, _) = held(&mut client, hold_request("orders", 1_000, None, "svc")).await;
    next_renewal(&mut stream).await;
    drop(stream);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    refused_with(&mut client, acquire_request("orders", 1_000, None, "other")).await;
    let d = describe(&mut client, "orders").await;
    let left = remaining(&d.remaining_ttl, "lease");
    assert!(
        Instant::now() + left + Duration::from_millis(5) >= promised,
        "the lease ends {left:?} from now, before the {promised:?} promised: {d:?}"
    );
}

/// A re-entrant shared hold refreshed to 100 ms does not cut short the 10 s shared hold of the
/// same owner: an exclusive request still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_refresh_of_one_hold_never_cuts_another_short() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let shared = |ttl| ask_request("doc", ttl, None, "reader", SHARED);

    granted_with(&mut client, shared(10_000)).await;
    let second = granted_with(&mut client, shared(5_000)).await;
    let refreshed = client
        .refresh(pb::LockServiceRefreshRequest {
            name: "doc".into(),
            token: second.token.clone(),
            ttl: Some(ms(100)),
        })
        .await
        .expect("Refresh")
        .into_inner();
    assert_eq!(
        remaining(&refreshed.remaining_ttl, "refreshed"),
        Duration::from_millis(100)
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    refused_with(&mut client, acquire_request("doc", 1_000, None, "writer")).await;
    let d = describe(&mut client, "doc").await;
    assert_eq!(d.shared_holders, 1, "{d:?}");
    let earliest = d.earliest_shared_holder.expect("a shared holder");
    assert_eq!(
        earliest.hold_count, 1,
        "the refreshed hold expired alone: {earliest:?}"
    );
}

/// A KeepAlive without a ttl renews a hold with that hold's own ttl, not with the ttl of the first
/// hold of its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_without_a_ttl_renews_with_the_holds_own_ttl() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    granted_with(&mut client, acquire_request("orders", 500, None, "svc")).await;
    let long = granted_with(&mut client, acquire_request("orders", 5_000, None, "svc")).await;
    let mut stream = client
        .keep_alive(pb::LockServiceKeepAliveRequest {
            name: "orders".into(),
            token: long.token.clone(),
            ttl: None,
        })
        .await
        .expect("KeepAlive")
        .into_inner();
    let first = within(
        Duration::from_secs(2),
        stream.message(),
        "the first renewal",
    )
    .await
    .expect("stream")
    .and_then(|m| m.event);
    let Some(KeepAliveEvent::Renewed(renewed)) = first else {
        panic!("expected a renewal, got {first:?}");
    };
    assert_eq!(
        remaining(&renewed.remaining_ttl, "renewal"),
        Duration::from_secs(5)
    );
}

/// Describe shows owners, never tokens: an anonymous holder's owner is empty, so nothing Describe
/// says can release it; a caller naming a holder's owner re-enters with a token of its own, whose
/// release leaves the first hold held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_never_reveals_a_token_and_owners_cannot_release_others() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut sems = baton.semaphore_client().await;

    let anonymous = granted_with(&mut client, acquire_request("orders", 10_000, None, "")).await;
    assert_eq!(anonymous.owner, "");
    let d = describe(&mut client, "orders").await;
    assert!(d.held);
    assert_eq!(d.owner, "", "{d:?}");

    let reader = granted_with(&mut client, ask_request("shared", 10_000, None, "", SHARED)).await;
    let d = describe(&mut client, "shared").await;
    let earliest = d.earliest_shared_holder.expect("a shared holder");
    assert_eq!(earliest.owner, "");
    assert_ne!(earliest.owner, reader.token);

    let first = granted_with(&mut client, acquire_request("named", 10_000, None, "svc")).await;
    let intruder = granted_with(&mut client, acquire_request("named", 10_000, None, "svc")).await;
    assert_ne!(
        intruder.token, first.token,
        "re-entering never hands out a holder's token"
    );
    assert!(
        release(&mut client, "named", &intruder.token)
            .await
            .was_held
    );
    let d = describe(&mut client, "named").await;
    assert_eq!(
        (d.held, d.hold_count),
        (true, 1),
        "the first hold is still held: {d:?}"
    );
    assert!(release(&mut client, "named", &first.token).await.was_held);

    let permit = sems
        .acquire(pb::SemaphoreServiceAcquireRequest {
            name: "pool".into(),
            limit: 2,
            permits: 1,
            ttl: Some(ms(10_000)),
            ..Default::default()
        })
        .await
        .expect("semaphore Acquire")
        .into_inner()
        .permit
        .expect("granted");
    let d = sems
        .describe(pb::SemaphoreServiceDescribeRequest {
            name: "pool".into(),
        })
        .await
        .expect("semaphore Describe")
        .into_inner();
    assert!(
        d.holders
            .iter()
            .all(|h| h.owner.is_empty() && h.owner != permit.token),
        "{d:?}"
    );
}
