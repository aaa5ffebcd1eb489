//! Baton's Redis side of security, against real `redis-server` processes (docs/security.md):
//!
//! - [`tls`]: `rediss://` to a standalone Redis asking for client certificates (mutual TLS), to
//!   a Cluster (Baton's router and the sharded subscriber over TLS) and through Sentinels that
//!   speak TLS themselves; certificates not trusted, missing or from another CA stop Baton at
//!   start; `--redis-tls-insecure` works and says so; bad files are refused.
//! - [`acl`]: Baton as a Redis ACL user limited to its key prefix by the rules docs/security.md
//!   gives, through every service, and what that user cannot do.
//! - [`credentials`]: `--redis-username` and `--redis-password-file`: a wrong password stops
//!   Baton at start, a rotated password file is used by new connections while Baton serves,
//!   and a password changed in Redis alone is `UNAVAILABLE` with its cause, never `INTERNAL`.
//! - [`tenancy`]: two Batons with different key prefixes on one Redis share nothing.
//!
//! Certificates are made in the test (`support::tls`).

#[path = "../support/mod.rs"]
mod support;

mod acl;
mod credentials;
mod tenancy;
mod tls;

use std::{net::SocketAddr, time::Duration};

use baton::proto::v1::{
    self as pb, autocomplete_service_client::AutocompleteServiceClient,
    election_service_campaign_response::Event as CampaignEvent,
    election_service_client::ElectionServiceClient, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event as HoldEvent,
    rate_limit_service_client::RateLimitServiceClient,
    semaphore_service_client::SemaphoreServiceClient,
};
use support::{
    channel,
    lease::{next_event, next_renewal, wait_for_waiters},
    lock, ms, semaphore, within,
};

/// Gives a test Baton's rate limit decisions time for a first connection (a TLS handshake, a
/// Sentinel lookup) on a loaded machine: the default (50 ms) would have them decided by the
/// failure mode, which [`exercise`] refuses.
pub fn patient(config: &mut baton::config::ServeConfig) {
    config.ratelimit.timeout = Duration::from_secs(3);
}

/// How long a waiter may take to be granted what was released, at most: far below every ttl and
/// wait timeout used, so only a pub/sub wake-up can grant it in time.
const WAKE_UP: Duration = Duration::from_secs(5);

/// Uses every service of the Baton at `addr` with names starting with `tag`, checking each
/// answer: a lock held by a `Hold` stream (renewed, then released by closing the stream) with a
/// waiter woken by its release; a semaphore's waiter woken by a release; an election whose
/// second candidate is elected when the leader resigns; rate limit decisions made by Redis (not
/// by the failure mode); an autocomplete dictionary and a recent list.
pub async fn exercise(addr: SocketAddr, tag: &str) {
    let channel = channel(addr).await;

    // A lock: held by a stream, renewed, then a waiter woken when the stream closes.
    let mut locks = LockServiceClient::new(channel.clone());
    let name = format!("{tag}-lock");
    let (mut stream, _lease) =
        lock::held(&mut locks, lock::hold_request(&name, 1500, None, "a")).await;
    next_renewal(&mut stream).await;
    let waiter = {
        let mut locks = locks.clone();
        let name = name.clone();
        tokio::spawn(
            async move { lock::acquire(&mut locks, &name, 30_000, Some(20_000), "b").await },
        )
    };
    wait_for_waiters(&locks, &name, 1).await;
    drop(stream);
    let granted = within(WAKE_UP, waiter, "the lock waiter to be woken")
        .await
        .expect("the waiter task");
    assert!(granted.acquired, "the lock waiter: {granted:?}");
    let token = granted.lease.expect("a lease").token;
    assert!(lock::release(&mut locks, &name, &token).await.was_held);

    // A semaphore of one permit: a waiter woken by a release.
    let mut semaphores = SemaphoreServiceClient::new(channel.clone());
    let name = format!("{tag}-semaphore");
    let permit =
        semaphore::acquired(&mut semaphores, semaphore::request(&name, 1, 1, 30_000)).await;
    let waiter = {
        let mut semaphores = semaphores.clone();
        let request = semaphore::waiting(&name, 1, 1, 30_000, 20_000, false);
        tokio::spawn(async move { semaphore::acquire(&mut semaphores, request).await })
    };
    wait_for_waiters(&semaphores, &name, 1).await;
    assert!(semaphore::release(&mut semaphores, &name, &permit.token).await);
    let granted = within(WAKE_UP, waiter, "the semaphore waiter to be woken")
        .await
        .expect("the waiter task");
    assert!(granted.acquired, "the semaphore waiter: {granted:?}");

    // An election: the second candidate takes over when the leader's stream closes.
    let mut elections = ElectionServiceClient::new(channel.clone());
    let name = format!("{tag}-election");
    let campaign = |value: &'static [u8]| pb::ElectionServiceCampaignRequest {
        name: name.clone(),
        value: value.to_vec(),
        ttl: Some(ms(10_000)),
    };
    let mut first = elections
        .campaign(campaign(b"first"))
        .await
        .expect("Campaign")
        .into_inner();
    let term = match next_event(&mut first, Duration::from_secs(5), "the first election").await {
        CampaignEvent::Elected(elected) => elected.term,
        other => panic!("expected elected, got {other:?}"),
    };
    let mut second = elections
        .campaign(campaign(b"second"))
        .await
        .expect("Campaign")
        .into_inner();
    let leader = elections
        .leader(pb::ElectionServiceLeaderRequest { name: name.clone() })
        .await
        .expect("Leader")
        .into_inner();
    assert_eq!(
        leader.leader.as_ref().map(|l| (l.term, l.value.as_slice())),
        Some((term, &b"first"[..])),
        "{leader:?}"
    );
    assert!(leader.candidates >= 1, "{leader:?}");
    drop(first);
    match next_event(&mut second, WAKE_UP, "the second candidate's election").await {
        CampaignEvent::Elected(elected) => assert!(elected.term > term, "{elected:?}"),
        other => panic!("expected elected, got {other:?}"),
    }
    drop(second);

    // Rate limits, decided by Redis.
    let mut limits = RateLimitServiceClient::new(channel.clone());
    let check = || pb::RateLimitServiceCheckRequest {
        key: format!("{tag}-api"),
        limit: 2,
        period: Some(ms(60_000)),
        algorithm: pb::RateLimitAlgorithm::Gcra.into(),
        ..Default::default()
    };
    let mut allowed = Vec::new();
    for _ in 0..3 {
        let answer = limits.check(check()).await.expect("Check").into_inner();
        assert_eq!(
            answer.decided_by(),
            pb::RateLimitDecidedBy::Redis,
            "a decision Redis made: {answer:?}"
        );
        allowed.push(answer.allowed);
    }
    assert_eq!(allowed, [true, true, false]);

    // Autocomplete: a dictionary and a recent list.
    let mut autocomplete = AutocompleteServiceClient::new(channel);
    let dictionary = format!("{tag}-cities");
    let term = |display: &str| pb::AutocompleteTerm {
        display: display.to_owned(),
        ..Default::default()
    };
    let added = autocomplete
        .add(pb::AutocompleteServiceAddRequest {
            dictionary: dictionary.clone(),
            terms: vec![term("Paris"), term("Pau"), term("Lyon")],
            ..Default::default()
        })
        .await
        .expect("Add")
        .into_inner();
    assert_eq!(added.added, 3, "{added:?}");
    let found = autocomplete
        .complete(pb::AutocompleteServiceCompleteRequest {
            dictionary,
            query: "pa".to_owned(),
            limit: 10,
            ..Default::default()
        })
        .await
        .expect("Complete")
        .into_inner();
    let mut displays: Vec<_> = found
        .suggestions
        .iter()
        .map(|s| s.display.as_str())
        .collect();
    displays.sort_unstable();
    assert_eq!(displays, ["Paris", "Pau"]);
    let list = format!("{tag}-recent");
    autocomplete
        .record_recent(pb::AutocompleteServiceRecordRecentRequest {
            list: list.clone(),
            display: "Lyon".to_owned(),
            max_items: 10,
            ttl: Some(ms(60_000)),
            ..Default::default()
        })
        .await
        .expect("RecordRecent");
    let recent = autocomplete
        .list_recent(pb::AutocompleteServiceListRecentRequest {
            list,
            limit: 10,
            ..Default::default()
        })
        .await
        .expect("ListRecent")
        .into_inner();
    assert_eq!(
        recent
            .items
            .iter()
            .map(|i| i.display.as_str())
            .collect::<Vec<_>>(),
        ["Lyon"]
    );
}

/// Reads the `acquired` event of a lock `Hold` stream (within 5 s).
pub async fn hold_acquired(
    stream: &mut tonic::Streaming<pb::LockServiceHoldResponse>,
    what: &str,
) -> pb::LockLease {
    match next_event(stream, Duration::from_secs(5), what).await {
        HoldEvent::Acquired(lease) => lease,
        other => panic!("{what}: expected acquired, got {other:?}"),
    }
}
