//! The unary calls and what every call shares (docs/guarantees.md, "Leader election", promises
//! 3 and 4, and "Keys, and how long they live"): `Proclaim` by the leader only, also when it
//! races a takeover, `Leader`, bad input, keys that expire.

use std::time::{Duration, SystemTime};

use baton::proto::v1 as pb;
use tonic::Code;

use crate::{
    STEP, campaign, campaign_request, client, elected, leader, next_state, observe, proclaim,
    summary,
    support::{
        Baton, RedisServer, assert_code, assert_invalid,
        lease::{keys_under, pttl},
        ms, random_token, remaining, unique_prefix, wait_until, within,
    },
    wait_for_candidates, wait_for_leader,
};

/// `Leader` reports nobody, then the leader's term, value and ttl and the waiting candidates;
/// `Proclaim` by the leader changes the value in its term (the same value changes nothing);
/// `Proclaim` with a token that no longer leads, or never did, is FAILED_PRECONDITION; after the
/// last leader resigns, `Leader` reports nobody and its term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaim_and_leader() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut c = client(&baton).await;
    let none = leader(&mut c, "e").await;
    assert_eq!((none.leader, none.last_term, none.candidates), (None, 0, 0));

    let mut a = campaign(&mut c, "e", "a", 2_000).await;
    let ea = elected(&mut a, STEP, "a").await;
    assert_eq!(ea.name, "e");
    let ttl = remaining(&ea.remaining_ttl, "elected");
    assert!(
        ttl <= Duration::from_secs(2) && ttl > Duration::from_secs(1),
        "{ttl:?}"
    );
    let expires_at = ea.expires_at.expect("expires_at");
    let expires_in = SystemTime::try_from(expires_at)
        .expect("a valid timestamp")
        .duration_since(SystemTime::now())
        .expect("expires_at is ahead");
    assert!(expires_in < Duration::from_secs(2), "{expires_in:?}");
    let state = leader(&mut c, "e").await;
    let l = state.leader.expect("a leads");
    assert_eq!(
        (l.term, l.value.as_slice(), l.value_revision),
        (ea.term, &b"a"[..], 0)
    );
    assert_eq!(state.last_term, ea.term);
    assert!(remaining(&l.remaining_ttl, "leader") <= Duration::from_secs(2));

    let p = proclaim(&mut c, "e", &ea.token, b"a2").await;
    assert_eq!((p.term, p.value_revision), (ea.term, 1));
    let p = proclaim(&mut c, "e", &ea.token, b"a2").await;
    assert_eq!(p.value_revision, 1, "the same value changes nothing");
    let l = leader(&mut c, "e").await.leader.expect("a leads");
    assert_eq!((l.value.as_slice(), l.value_revision), (&b"a2"[..], 1));

    let mut b = campaign(&mut c, "e", "b", 2_000).await;
    wait_for_candidates(&c, "e", 1).await;
    drop(a);
    let eb = elected(&mut b, STEP, "b").await;
    assert!(eb.term > ea.term);
    let stale = c
        .proclaim(pb::ElectionServiceProclaimRequest {
            name: "e".into(),
            token: ea.token.clone(),
            value: b"a3".to_vec(),
        })
        .await;
    assert_code(
        stale,
        Code::FailedPrecondition,
        "a former leader's Proclaim",
    );
    let unknown = c
        .proclaim(pb::ElectionServiceProclaimRequest {
            name: "e".into(),
            token: random_token(),
            value: b"x".to_vec(),
        })
        .await;
    assert_code(
        unknown,
        Code::FailedPrecondition,
        "an unknown token's Proclaim",
    );
    let l = leader(&mut c, "e").await.leader.expect("b leads");
    assert_eq!(
        (l.term, l.value.as_slice(), l.value_revision),
        (eb.term, &b"b"[..], 0)
    );

    drop(b);
    let gone = wait_for_leader(&c, "e", "nobody to lead", |s| s.leader.is_none()).await;
    assert_eq!((gone.last_term, gone.candidates), (eb.term, 0));
}

/// Bad input gets INVALID_ARGUMENT naming the field, and writes nothing to Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_precise_statuses() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut c = client(&baton).await;
    let long_name = "n".repeat(1025);
    let big = vec![b'v'; 4097];

    let mut request = campaign_request("", "v", 1_000);
    assert_invalid(c.campaign(request.clone()).await, "name");
    request.name = long_name.clone();
    assert_invalid(c.campaign(request.clone()).await, "name");
    request.name = "e".into();
    request.ttl = None;
    assert_invalid(c.campaign(request.clone()).await, "ttl");
    request.ttl = Some(ms(99));
    assert_invalid(c.campaign(request.clone()).await, "ttl");
    request.ttl = Some(ms(3_600_001));
    assert_invalid(c.campaign(request.clone()).await, "ttl");
    request.ttl = Some(prost_types::Duration {
        seconds: -1,
        nanos: 0,
    });
    assert_invalid(c.campaign(request.clone()).await, "ttl");
    request.ttl = Some(ms(1_000));
    request.value = big.clone();
    assert_invalid(c.campaign(request).await, "value");

    let proclaim = |name: &str, token: &str, value: &[u8]| pb::ElectionServiceProclaimRequest {
        name: name.to_owned(),
        token: token.to_owned(),
        value: value.to_vec(),
    };
    assert_invalid(
        c.proclaim(proclaim("", &random_token(), b"v")).await,
        "name",
    );
    assert_invalid(c.proclaim(proclaim("e", "", b"v")).await, "token");
    assert_invalid(
        c.proclaim(proclaim("e", "not-a-token", b"v")).await,
        "token",
    );
    assert_invalid(
        c.proclaim(proclaim("e", &random_token(), &big)).await,
        "value",
    );
    let name_only = |name: &str| pb::ElectionServiceLeaderRequest {
        name: name.to_owned(),
    };
    assert_invalid(c.leader(name_only("")).await, "name");
    assert_invalid(c.leader(name_only(&long_name)).await, "name");
    let observe_request = |name: &str| pb::ElectionServiceObserveRequest {
        name: name.to_owned(),
    };
    assert_invalid(c.observe(observe_request("")).await, "name");
    assert_invalid(c.observe(observe_request(&long_name)).await, "name");

    let mut conn = redis.conn().await;
    let keys = keys_under(&mut conn, baton.prefix()).await;
    assert!(keys.is_empty(), "bad input wrote {keys:?}");

    // The largest value allowed goes through whole, bytes that are not UTF-8 included.
    let mut request = campaign_request("e", "", 1_000);
    request.value = (0..=255u8).cycle().take(4096).collect();
    let mut stream = c
        .campaign(request.clone())
        .await
        .expect("Campaign")
        .into_inner();
    elected(&mut stream, STEP, "the largest value").await;
    let l = leader(&mut c, "e").await.leader.expect("a leader");
    assert_eq!(l.value, request.value);
}

/// Every key an election writes expires: with a leader, a proclaimed value and candidates
/// waiting, each has a ttl; once everyone left, only the last term is kept, for an hour past the
/// ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_expires() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut c = client(&baton).await;
    let mut conn = redis.conn().await;
    let mut first = campaign(&mut c, "e", "a", 2_000).await;
    let e = elected(&mut first, STEP, "a").await;
    proclaim(&mut c, "e", &e.token, b"a2").await;
    let waiting = campaign(&mut c, "e", "b", 2_000).await;
    wait_for_candidates(&c, "e", 1).await;
    let keys = keys_under(&mut conn, baton.prefix()).await;
    assert_eq!(keys.len(), 4, "leader, term, candidates, queue: {keys:?}");
    for key in &keys {
        let left = pttl(&mut conn, key).await;
        assert!(left > 0, "{key} has no ttl ({left})");
        assert!(left <= 3_600_000 + 2_000, "{key}: {left} ms");
    }
    drop(waiting);
    drop(first);
    let term_key = format!("{}{{election:e}}:term", baton.prefix());
    wait_until(STEP, "only the term key to be left", || {
        let mut conn = conn.clone();
        let term_key = term_key.clone();
        let prefix = baton.prefix().to_owned();
        async move {
            let keys = keys_under(&mut conn, &prefix).await;
            if keys == [term_key] {
                Ok(())
            } else {
                Err(keys)
            }
        }
    })
    .await;
    let left = pttl(&mut conn, &term_key).await;
    // Set to an hour past the 2 s ttl at the last grant or renewal, a few moments ago.
    assert!(
        left > 3_590_000 && left <= 3_600_000 + 2_000,
        "the term key is kept {left} ms"
    );
}

/// A leader proclaims new values in a tight loop while its stream closes and the candidate
/// waiting on another Baton takes over: every `Proclaim` either changes the value in the old term
/// (revisions one after another) or fails FAILED_PRECONDITION, none succeeds after one failed,
/// and the new leader's value is never overwritten: `Leader` and an observer show the new term
/// with the new leader's own value at revision 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaim_racing_a_takeover_never_touches_the_next_leader() {
    /// Proclamations that went through before the old leader closes its stream.
    const BEFORE: u64 = 10;
    /// Refusals the proclaiming task waits for after the takeover.
    const REFUSALS: usize = 20;
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let a = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let b = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let mut ca = client(&a).await;
    let mut cb = client(&b).await;
    let mut old = campaign(&mut ca, "e", "old", 5_000).await;
    let e = elected(&mut old, STEP, "the old leader").await;
    let mut next = campaign(&mut cb, "e", "new", 5_000).await;
    wait_for_candidates(&ca, "e", 1).await;
    let mut observer = observe(&mut cb, "e").await;

    let (started_tx, started) = tokio::sync::oneshot::channel();
    let mut pc = ca.clone();
    let token = e.token.clone();
    let proclaimer = tokio::spawn(async move {
        let mut started_tx = Some(started_tx);
        let mut outcomes = Vec::new();
        let mut refusals = 0;
        for i in 1u64.. {
            let outcome = pc
                .proclaim(pb::ElectionServiceProclaimRequest {
                    name: "e".into(),
                    token: token.clone(),
                    value: format!("old-{i}").into_bytes(),
                })
                .await;
            match outcome {
                Ok(p) => outcomes.push(Some(p.into_inner())),
                Err(status) => {
                    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
                    outcomes.push(None);
                    refusals += 1;
                }
            }
            if i == BEFORE {
                started_tx.take().map(|tx| tx.send(()));
            }
            if refusals == REFUSALS {
                break;
            }
        }
        outcomes
    });
    within(STEP, started, "the first proclamations")
        .await
        .expect("the proclaiming task");
    drop(old);
    let ne = elected(&mut next, STEP, "the new leader").await;
    assert!(ne.term > e.term);
    let outcomes = within(STEP, proclaimer, "the proclamations to be refused")
        .await
        .expect("the proclaiming task");

    let went_through = outcomes.iter().take_while(|o| o.is_some()).count();
    assert!(
        went_through >= usize::try_from(BEFORE).expect("small"),
        "{outcomes:?}"
    );
    assert!(
        outcomes[went_through..].iter().all(Option::is_none),
        "a Proclaim went through after one was refused: {outcomes:?}"
    );
    for (i, p) in outcomes.iter().flatten().enumerate() {
        let revision = u64::try_from(i).expect("small") + 1;
        assert_eq!(
            (p.term, p.value_revision),
            (e.term, revision),
            "{outcomes:?}"
        );
    }
    let state = leader(&mut cb, "e").await;
    let led = state.leader.expect("the new leader leads");
    assert_eq!(
        (led.term, led.value.as_slice(), led.value_revision),
        (ne.term, &b"new"[..], 0)
    );
    loop {
        let state = next_state(&mut observer, "the observer to see the new leader").await;
        let (term, revision, value) = summary(&state);
        if term < ne.term {
            assert!(
                value.is_empty() || value == "old" || value.starts_with("old-"),
                "{value}"
            );
            continue;
        }
        assert_eq!((term, revision, value.as_str()), (ne.term, 0, "new"));
        break;
    }
}
