//! Who leads, and when (docs/guarantees.md, "Leader election", promises 1, 2, 3 and 5): one
//! leader at a time in the order candidates joined, strictly increasing terms, takeover within
//! milliseconds of a close or of a vanished client, at the expiry of a dead Baton's leader; a
//! candidate that leaves the queue, or whose client vanishes there, gives its place up at once.

use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::{sync::watch, time::Instant};

use crate::{
    HANDOFF_BOUND, STEP, campaign, client, elected, leader, next_state, observe, summary,
    support::{Baton, BatonProcess, Proxy, RedisServer, channel, remaining, unique_prefix, within},
    wait_for_candidates, wait_for_leader,
};
use baton::proto::v1::election_service_client::ElectionServiceClient;

/// Six candidates on two Batons, each in a task of its own, joining one after another: they are
/// elected in the order they joined, one at a time (each leader's interval, from reading
/// `elected` to closing its stream, ends before the next one's begins, on one monotonic clock),
/// with strictly increasing terms, each within milliseconds of the previous leader's close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidates_lead_one_at_a_time_in_the_order_they_joined() {
    const CANDIDATES: usize = 6;
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let a = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let b = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let clients = [client(&a).await, client(&b).await];

    // Every leader leads until `go`, so that the candidates' count tells when each has joined.
    let (go_tx, go) = watch::channel(false);
    let mut tasks = Vec::new();
    for i in 0..CANDIDATES {
        let mut c = clients[i % 2].clone();
        let mut go = go.clone();
        tasks.push(tokio::spawn(async move {
            let value = format!("candidate-{i}");
            let mut stream = campaign(&mut c, "primary", &value, 2_000).await;
            let e = elected(&mut stream, Duration::from_secs(30), &value).await;
            let elected_at = Instant::now();
            let state = leader(&mut c, "primary").await;
            let led = state.leader.expect("the elected candidate leads");
            assert_eq!((led.term, led.value), (e.term, value.into_bytes()));
            go.wait_for(|go| *go).await.expect("the go signal");
            // The leader's tenure, not a synchronisation: the next election waits for its close.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let resigned_at = Instant::now();
            drop(stream);
            (i, e.term, elected_at, resigned_at)
        }));
        if i == 0 {
            wait_for_leader(&clients[0], "primary", "a leader", |s| s.leader.is_some()).await;
        } else {
            wait_for_candidates(&clients[0], "primary", u32::try_from(i).expect("small")).await;
        }
    }
    go_tx.send(true).expect("the candidates listen");

    let mut tenures = Vec::new();
    for task in tasks {
        tenures.push(
            within(Duration::from_secs(30), task, "every candidate to lead")
                .await
                .expect("the candidate task"),
        );
    }
    tenures.sort_by_key(|&(_, _, elected_at, _)| elected_at);
    let order: Vec<usize> = tenures.iter().map(|t| t.0).collect();
    assert_eq!(order, (0..CANDIDATES).collect::<Vec<_>>(), "election order");
    let mut handoffs = Vec::new();
    for pair in tenures.windows(2) {
        let ((i, term, _, resigned), (j, next_term, elected_at, _)) = (pair[0], pair[1]);
        assert!(
            elected_at > resigned,
            "candidate {j} believed it led before candidate {i} closed its stream"
        );
        assert!(next_term > term, "terms {term} then {next_term}");
        handoffs.push(elected_at - resigned);
    }
    println!("close -> next elected: {handoffs:?}");
    let slowest = handoffs.iter().max().expect("handoffs");
    // A wake-up by message, not the candidates' once-a-second renewal of their places.
    assert!(
        *slowest < HANDOFF_BOUND,
        "a takeover took {slowest:?} after the close"
    );
}

/// A candidate that leaves the queue gives its place up at once: with A leading and B then C
/// waiting, B closes its stream; when A resigns, C is elected within milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_that_leaves_gives_its_place_up() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut c = client(&baton).await;
    let mut a = campaign(&mut c, "e", "a", 2_000).await;
    let a_term = elected(&mut a, STEP, "a elected").await.term;
    let b = campaign(&mut c, "e", "b", 2_000).await;
    wait_for_candidates(&c, "e", 1).await;
    let mut cc = campaign(&mut c, "e", "c", 2_000).await;
    wait_for_candidates(&c, "e", 2).await;
    drop(b);
    wait_for_candidates(&c, "e", 1).await;
    let closed_at = Instant::now();
    drop(a);
    let e = elected(&mut cc, STEP, "c elected").await;
    let took = closed_at.elapsed();
    assert!(e.term > a_term);
    assert!(took < HANDOFF_BOUND, "c was elected {took:?} later");
    let state = leader(&mut c, "e").await;
    assert_eq!(state.leader.map(|l| l.value), Some(b"c".to_vec()));
}

/// A leader whose client vanishes (its connection closes, as when its process is killed) is
/// replaced at once: the candidate waiting on another Baton is elected within milliseconds, well
/// within the leader's ttl, with a higher term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_leader_is_replaced_within_its_ttl() {
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let a = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let b = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let proxy = Proxy::start(a.addr()).await;
    let mut doomed = ElectionServiceClient::new(channel(proxy.addr()).await);
    let mut c = client(&b).await;

    let mut first = campaign(&mut doomed, "e", "doomed", 2_000).await;
    let term = elected(&mut first, STEP, "the first leader").await.term;
    let mut next = campaign(&mut c, "e", "next", 2_000).await;
    wait_for_candidates(&c, "e", 1).await;
    let cut_at = Instant::now();
    proxy.cut();
    let e = elected(&mut next, STEP, "the next leader").await;
    let took = cut_at.elapsed();
    println!("the client vanished; the next leader was elected {took:?} later");
    assert!(e.term > term);
    assert!(
        took < HANDOFF_BOUND,
        "the takeover took {took:?} (the ttl is 2 s)"
    );
}

/// A leader whose Baton is killed (SIGKILL: nobody resigns for it) is replaced when its lease
/// expires: the candidate waiting on another Baton is elected no sooner than the lease allowed,
/// within the ttl and a margin; an observer on that Baton reports the change by then, its terms
/// never going backwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_baton_dies_is_replaced_at_its_expiry() {
    const TTL_MS: u64 = 1_000;
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), prefix.clone()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let process = BatonProcess::spawn(&args).await;
    let baton = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let mut doomed = ElectionServiceClient::new(channel(process.addr()).await);
    let mut c = client(&baton).await;

    let mut first = campaign(&mut doomed, "e", "doomed", TTL_MS).await;
    let term = elected(&mut first, STEP, "the first leader").await.term;
    let mut observer = observe(&mut c, "e").await;
    assert_eq!(
        summary(&next_state(&mut observer, "the first leader").await).0,
        term
    );
    let mut next = campaign(&mut c, "e", "next", TTL_MS).await;
    wait_for_candidates(&c, "e", 1).await;

    let pid = nix::unistd::Pid::from_raw(i32::try_from(process.pid()).expect("pid"));
    nix::sys::signal::kill(pid, Signal::SIGKILL).expect("killing the baton process");
    let asked_at = Instant::now();
    let left = leader(&mut c, "e")
        .await
        .leader
        .map(|l| remaining(&l.remaining_ttl, "the dead Baton's leader"))
        .expect("the dead Baton's leader leads until its lease expires");
    let e = elected(&mut next, Duration::from_secs(10), "the next leader").await;
    let took = asked_at.elapsed();
    println!(
        "the leader's Baton was killed with {left:?} left on its lease; the next leader was \
         elected {took:?} later"
    );
    assert!(e.term > term);
    assert!(
        took + Duration::from_millis(50) >= left,
        "elected {took:?} later, before the lease's {left:?} ran out"
    );
    assert!(
        took < left + Duration::from_secs(1),
        "elected {took:?} later, long after the lease's {left:?} ran out"
    );
    let mut last = term;
    loop {
        let state = next_state(&mut observer, "the observer to see the next leader").await;
        let (t, _, value) = summary(&state);
        assert!(t >= last, "the observer went back from term {last} to {t}");
        last = t;
        if t == e.term {
            assert_eq!(value, "next");
            break;
        }
        assert!(state.leader.is_none(), "an unexpected leader: {state:?}");
    }
}

/// A candidate whose client vanishes while it waits in the queue (its connection cut, as when its
/// process is killed) gives its place up at once, not when its registration would have expired:
/// with A leading and B (through a proxy) then C waiting, B's connection is cut; B leaves the
/// queue well within its 3 s registration, and when A resigns, C is elected within milliseconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_candidate_whose_client_vanishes_gives_its_place_up() {
    /// Well below the 3 s a registration lasts unrenewed: B left because its stream ended.
    const LEFT_WITHIN: Duration = Duration::from_millis(1_500);
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let proxy = Proxy::start(baton.addr()).await;
    let mut c = client(&baton).await;
    let mut doomed = ElectionServiceClient::new(channel(proxy.addr()).await);

    let mut a = campaign(&mut c, "e", "a", 5_000).await;
    let a_term = elected(&mut a, STEP, "a elected").await.term;
    let _b = campaign(&mut doomed, "e", "b", 5_000).await;
    wait_for_candidates(&c, "e", 1).await;
    let mut cc = campaign(&mut c, "e", "c", 5_000).await;
    wait_for_candidates(&c, "e", 2).await;

    proxy.cut();
    let cut_at = Instant::now();
    wait_for_candidates(&c, "e", 1).await;
    let left = cut_at.elapsed();
    assert!(
        left < LEFT_WITHIN,
        "the vanished candidate left the queue {left:?} after its connection was cut"
    );
    let closed_at = Instant::now();
    drop(a);
    let e = elected(&mut cc, STEP, "c elected").await;
    let took = closed_at.elapsed();
    assert!(e.term > a_term);
    assert!(
        took < HANDOFF_BOUND,
        "c was elected {took:?} after a resigned"
    );
    let state = leader(&mut c, "e").await;
    assert_eq!(state.leader.map(|l| l.value), Some(b"c".to_vec()));
    assert_eq!(state.candidates, 0);
}

/// The leader and the head of the queue close their streams at the same moment, five times over:
/// whether the head was elected just before its close was seen (its grant then finds its client
/// gone and resigns at once) or left the queue first, the next candidate is elected within
/// milliseconds with a higher term, and nobody is left leading or queued for a closed stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_and_the_head_leaving_together_hand_over_to_the_next() {
    /// Two script calls in a row (the resignation, then the departed head's), each waking the
    /// next by message: well below the candidates' one-second retry.
    const BOUND: Duration = Duration::from_millis(2 * HANDOFF_BOUND.as_millis() as u64);
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let a = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let b = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let mut ca = client(&a).await;
    let mut cb = client(&b).await;
    for round in 0..5 {
        let name = format!("e{round}");
        let mut first = campaign(&mut ca, &name, "first", 5_000).await;
        let term = elected(&mut first, STEP, "the first leader").await.term;
        let head = campaign(&mut cb, &name, "head", 5_000).await;
        wait_for_candidates(&ca, &name, 1).await;
        let mut next = campaign(&mut ca, &name, "next", 5_000).await;
        wait_for_candidates(&ca, &name, 2).await;

        let closed_at = Instant::now();
        drop(first);
        drop(head);
        let e = elected(&mut next, STEP, "the next candidate").await;
        let took = closed_at.elapsed();
        assert!(e.term > term, "round {round}: terms {term} then {}", e.term);
        assert!(
            took < BOUND,
            "round {round}: the next candidate was elected {took:?} after the closes"
        );
        let state = leader(&mut cb, &name).await;
        let led = state.leader.clone().expect("the next candidate leads");
        assert_eq!((led.term, led.value.as_slice()), (e.term, &b"next"[..]));
        assert_eq!(state.candidates, 0, "round {round}: {state:?}");
    }
}
