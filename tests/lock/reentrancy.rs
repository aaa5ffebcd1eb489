//! Re-entrancy per owner (docs/guarantees.md, promise 4): each acquisition is a hold with a token
//! of its own, holds of one owner share a lease and its fencing token, anonymous callers never
//! re-enter, and an owner holding the lock shared cannot upgrade.

use std::time::Duration;

use baton::proto::v1 as pb;
use tokio::time::Instant;
use tonic::Code;

use crate::support::{
    Baton, RedisServer, assert_code,
    lock::{
        EXCLUSIVE, FAIR, SHARED, acquire, acquired, ask, ask_request, describe, granted, release,
    },
    remaining,
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
