//! Faults (docs/guarantees.md, "Leader election", and what leadership does not promise): a
//! leader is told `lost` before its lease can expire when Redis stops answering, and nobody else
//! is elected before that; one broken leadership fails alone in a batched renewal; shutdown
//! resigns and ends every stream.

use std::time::{Duration, SystemTime};

use baton::{
    election::Election,
    lease::{Primitive, loss_margin},
    proto::v1::{self as pb, LeaseLostReason, election_service_campaign_response::Event},
    redis::{Notifier, Redis},
};
use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::{
    STEP, campaign, client, elected, leader, next_state, observe,
    support::{
        Baton, RedisServer, assert_code,
        lease::{next_event, next_renewal, read_until_lost},
        remaining, unique_prefix, within,
    },
    wait_for_candidates, wait_for_leader,
};

/// Redis stops answering (SIGSTOP) for longer than the ttl while a leader with a 1 s ttl leads
/// and a candidate waits: the leader's stream reports `lost` (UNCONFIRMED) before the expiry its
/// last event promised (`expires_at` plus the safety margin, on this machine's clock), and
/// nobody else is elected before it was told: the waiting candidate is either told UNAVAILABLE or
/// elected after that, with a higher term. Once Redis answers again a new campaign is elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_is_lost_before_expiry_when_redis_stops() {
    const TTL: Duration = Duration::from_millis(1_000);
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut c = client(&baton).await;
    let mut first = campaign(&mut c, "e", "first", 1_000).await;
    let e = elected(&mut first, STEP, "the first leader").await;
    let promised = e.expires_at.expect("expires_at");
    // Every event is read as it comes, so each is timed when Baton sent it (give or take the
    // delivery).
    let leader_task = tokio::spawn(async move {
        let mut promised = SystemTime::try_from(promised).expect("a valid timestamp");
        loop {
            match next_event(&mut first, Duration::from_secs(10), "the first leader").await {
                Event::Renewed(r) => {
                    promised = SystemTime::try_from(r.expires_at.expect("expires_at"))
                        .expect("a valid timestamp");
                }
                Event::Lost(lost) => return (SystemTime::now(), lost, promised),
                other => panic!("the first leader: {other:?}"),
            }
        }
    });
    let mut waiting = campaign(&mut c, "e", "waiting", 1_000).await;
    wait_for_candidates(&c, "e", 1).await;
    let candidate_task = tokio::spawn(async move {
        let next = within(
            Duration::from_secs(20),
            waiting.message(),
            "the waiting candidate",
        )
        .await;
        (SystemTime::now(), next)
    });

    redis.signal(Signal::SIGSTOP);
    // The fault's length: longer than any expiry a renewal can have promised.
    tokio::time::sleep(TTL + Duration::from_millis(500)).await;
    redis.signal(Signal::SIGCONT);

    let (lost_at, lost, promised) = within(Duration::from_secs(10), leader_task, "lost")
        .await
        .expect("the leader's task");
    assert_eq!(lost.reason(), LeaseLostReason::Unconfirmed, "{lost:?}");
    // `expires_at` is the expiry less the safety margin: the lease itself lasts the margin more.
    let expiry = promised + loss_margin(TTL);
    assert!(
        lost_at < expiry,
        "lost arrived {:?} after the leadership could have expired",
        lost_at.duration_since(expiry).unwrap_or_default()
    );
    let (answered_at, next) = within(Duration::from_secs(30), candidate_task, "the candidate")
        .await
        .expect("the candidate's task");
    match next {
        Ok(Some(pb::ElectionServiceCampaignResponse {
            event: Some(Event::Elected(next)),
        })) => {
            assert!(next.term > e.term);
            assert!(
                answered_at > lost_at,
                "the next leader was elected {:?} before the first was told it lost",
                lost_at.duration_since(answered_at).unwrap_or_default()
            );
        }
        Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        other => panic!("the waiting candidate: {other:?}"),
    }
    let mut again = campaign(&mut c, "e", "again", 1_000).await;
    let next = elected(
        &mut again,
        Duration::from_secs(10),
        "a campaign after Redis is back",
    )
    .await;
    assert!(next.term > e.term);
}

/// One leadership whose keys make its renewal fail inside Redis (its leader key replaced by a
/// value of another type) fails alone: the batched renewal script renews the other leadership of
/// the same call (it isolates each with `pcall`), and the call itself succeeds. Through the
/// streams, the broken leader is told `lost` (UNCONFIRMED) while the other keeps being renewed
/// and keeps leading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_broken_leadership_does_not_fail_its_batch() {
    let redis = RedisServer::start().await;
    // One batch is one script call, which a Cluster allows over one hash slot only.
    let [good, bad] = redis.names_in_one_slot("election", ["good", "bad"]);
    let baton = Baton::start(&redis).await;
    let mut c = client(&baton).await;
    let mut conn = redis.conn().await;
    let mut config = redis.redis_config();
    config.key_prefix = baton.prefix().to_owned();
    let backend = Redis::new(&config).expect("redis config");
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let notifier = Notifier::start(backend.pubsub_source(), Duration::from_secs(2), stop);
    let elections = Election::new(backend, notifier);

    let mut fine = campaign(&mut c, &good, "good", 1_000).await;
    let fine_elected = elected(&mut fine, STEP, "the good leader").await;
    let mut doomed = campaign(&mut c, &bad, "bad", 1_000).await;
    let doomed_elected = elected(&mut doomed, STEP, "the broken leader").await;
    let _: () = redis::cmd("SET")
        .arg(format!("{}{{election:{bad}}}", baton.prefix()))
        .arg("not a hash")
        .query_async(&mut conn)
        .await
        .expect("SET");

    let renewed = elections
        .refresh_many(&[
            (
                good.clone(),
                fine_elected.token.clone(),
                Some(Duration::from_secs(20)),
            ),
            (
                bad.clone(),
                doomed_elected.token.clone(),
                Some(Duration::from_secs(20)),
            ),
        ])
        .await
        .expect("the batch call itself succeeds");
    assert_eq!(renewed.len(), 2);
    assert_eq!(
        renewed[0].as_ref().ok(),
        Some(&Some(Duration::from_secs(20))),
        "{renewed:?}"
    );
    assert!(renewed[1].is_err(), "{renewed:?}");
    let led = leader(&mut c, &good)
        .await
        .leader
        .expect("the good leader leads");
    assert!(
        remaining(&led.remaining_ttl, "good") > Duration::from_secs(19),
        "{led:?}"
    );

    let (lost, _) = read_until_lost(&mut doomed, STEP, "the broken leader").await;
    assert_eq!(lost.reason(), LeaseLostReason::Unconfirmed, "{lost:?}");
    for _ in 0..2 {
        next_renewal(&mut fine).await;
    }
    let led = leader(&mut c, &good)
        .await
        .leader
        .expect("the good leader leads");
    assert_eq!(led.term, fine_elected.term);
}

/// On shutdown the leader's stream reports `lost` (SHUTDOWN) and the leadership is released, a
/// waiting candidate and an observer are told UNAVAILABLE, and another Baton sees nobody leading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_resigns_and_ends_every_stream() {
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let mut a = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let b = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let mut c = client(&a).await;
    let mut first = campaign(&mut c, "e", "a", 5_000).await;
    elected(&mut first, STEP, "a").await;
    let mut waiting = campaign(&mut c, "e", "b", 5_000).await;
    wait_for_candidates(&c, "e", 1).await;
    let mut observer = observe(&mut c, "e").await;
    next_state(&mut observer, "the leader").await;

    a.begin_shutdown();
    let (lost, _) = read_until_lost(&mut first, STEP, "lost on shutdown").await;
    assert_eq!(lost.reason(), LeaseLostReason::Shutdown, "{lost:?}");
    let ended = within(STEP, waiting.message(), "the waiting candidate to end").await;
    assert_code(ended, Code::Unavailable, "a waiting candidate at shutdown");
    let ended = within(STEP, observer.message(), "the observer to end").await;
    assert_code(ended, Code::Unavailable, "an observer at shutdown");
    a.shutdown().await.expect("a clean shutdown");
    wait_for_leader(&client(&b).await, "e", "nobody to lead", |s| {
        s.leader.is_none() && s.candidates == 0
    })
    .await;
}
