//! Black-box tests of `baton.v1.ElectionService` against a real `redis-server`, over gRPC to
//! in-process Batons (and the `baton` binary, where a Baton must die): who leads and in which
//! order, terms, takeover after a resignation, a vanished client or a dead Baton, loss before
//! expiry when Redis stops answering, observers, `Proclaim` and `Leader`, bad input, keys and
//! shutdown. With `BATON_TEST_TOPOLOGY=cluster` the same tests run on a local Redis Cluster.
//! Candidates in separate processes are in `tests/python/test_election_contract.py`.

mod support;

use std::time::{Duration, SystemTime};

use baton::proto::v1::{
    self as pb, LeaseLostReason, election_service_campaign_response::Event,
    election_service_client::ElectionServiceClient,
};
use nix::sys::signal::Signal;
use support::{
    Baton, BatonProcess, Proxy, RedisServer, assert_code, assert_invalid, channel,
    lease::{expect_end, keys_under, next_event, pttl, read_until_lost},
    ms, random_token, remaining, unique_prefix, wait_until, within,
};
use tokio::{sync::watch, time::Instant};
use tonic::{
    Code, Streaming,
    transport::{Channel, Endpoint},
};

/// An ElectionService client.
type Client = ElectionServiceClient<Channel>;

/// The events of a `Campaign` stream.
type Campaign = Streaming<pb::ElectionServiceCampaignResponse>;

/// The states of an `Observe` stream.
type Observer = Streaming<pb::ElectionServiceObserveResponse>;

/// How long any one step may take on a loaded machine before a test gives up on it.
const STEP: Duration = Duration::from_secs(5);

/// The longest a takeover may take after the leader's stream closed: measured 1-2 ms; waiting
/// candidates that missed their wake-up would instead try again at their next renewal, a second
/// later.
const HANDOFF_BOUND: Duration = Duration::from_millis(200);

/// An ElectionService client of `baton` over a new TCP connection.
async fn client(baton: &Baton) -> Client {
    ElectionServiceClient::new(channel(baton.addr()).await)
}

/// A Campaign request.
fn campaign_request(name: &str, value: &str, ttl_ms: u64) -> pb::ElectionServiceCampaignRequest {
    pb::ElectionServiceCampaignRequest {
        name: name.to_owned(),
        value: value.as_bytes().to_vec(),
        ttl: Some(ms(ttl_ms)),
    }
}

/// Joins election `name` with `value`, panicking if the call fails.
async fn campaign(client: &mut Client, name: &str, value: &str, ttl_ms: u64) -> Campaign {
    client
        .campaign(campaign_request(name, value, ttl_ms))
        .await
        .unwrap_or_else(|s| panic!("Campaign {name:?} ({value}) failed: {s:?}"))
        .into_inner()
}

/// The next event of a campaign, which must be `elected`, within `limit`.
async fn elected(stream: &mut Campaign, limit: Duration, what: &str) -> pb::ElectionElected {
    match next_event(stream, limit, what).await {
        Event::Elected(e) => e,
        other => panic!("{what}: expected elected, got {other:?}"),
    }
}

/// The election's state, panicking if the call fails.
async fn leader(client: &mut Client, name: &str) -> pb::ElectionServiceLeaderResponse {
    client
        .leader(pb::ElectionServiceLeaderRequest {
            name: name.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Leader {name:?} failed: {s:?}"))
        .into_inner()
}

/// Waits (bounded) until `Leader` of `name` satisfies `check`, returning that answer.
async fn wait_for_leader(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&pb::ElectionServiceLeaderResponse) -> bool,
) -> pb::ElectionServiceLeaderResponse {
    let check = &check;
    wait_until(STEP, what, || {
        let mut client = client.clone();
        async move {
            let state = leader(&mut client, name).await;
            if check(&state) { Ok(state) } else { Err(state) }
        }
    })
    .await
}

/// Waits (bounded) until `n` candidates wait in election `name`.
async fn wait_for_candidates(client: &Client, name: &str, n: u32) {
    let what = format!("{n} candidate(s) waiting in {name:?}");
    wait_for_leader(client, name, &what, |s| s.candidates == n).await;
}

/// Changes the leader's value, panicking if the call fails.
async fn proclaim(
    client: &mut Client,
    name: &str,
    token: &str,
    value: &[u8],
) -> pb::ElectionServiceProclaimResponse {
    client
        .proclaim(pb::ElectionServiceProclaimRequest {
            name: name.to_owned(),
            token: token.to_owned(),
            value: value.to_vec(),
        })
        .await
        .unwrap_or_else(|s| panic!("Proclaim {name:?} failed: {s:?}"))
        .into_inner()
}

/// Follows election `name`, panicking if the call fails.
async fn observe(client: &mut Client, name: &str) -> Observer {
    client
        .observe(pb::ElectionServiceObserveRequest {
            name: name.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Observe {name:?} failed: {s:?}"))
        .into_inner()
}

/// The next state of an observer, within [`STEP`]; panics if the stream fails or ends.
async fn next_state(observer: &mut Observer, what: &str) -> pb::ElectionServiceObserveResponse {
    within(STEP, observer.message(), what)
        .await
        .unwrap_or_else(|s| panic!("{what}: the Observe stream failed: {s:?}"))
        .unwrap_or_else(|| panic!("{what}: the Observe stream ended"))
}

/// An observed state in a form that is quick to compare: (term, revision, value), or for nobody
/// leading (last term, `u64::MAX`, empty).
fn summary(state: &pb::ElectionServiceObserveResponse) -> (u64, u64, String) {
    match &state.leader {
        Some(l) => {
            assert_eq!(
                state.last_term, l.term,
                "last_term is the leader's: {state:?}"
            );
            (
                l.term,
                l.value_revision,
                String::from_utf8_lossy(&l.value).into_owned(),
            )
        }
        None => (state.last_term, u64::MAX, String::new()),
    }
}

// ---------------------------------------------------------------------------------------------
// Who leads, and when
// ---------------------------------------------------------------------------------------------

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

/// Redis stops answering (SIGSTOP) while a leader with a 1 s ttl leads and a candidate waits:
/// the leader's stream reports `lost` (UNCONFIRMED) before its lease could have expired, so it
/// stops believing it leads before anyone else can be elected; the waiting candidate is either
/// told UNAVAILABLE or elected after that, with a higher term; once Redis answers again a new
/// campaign is elected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_is_lost_before_expiry_when_redis_stops() {
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut c = client(&baton).await;
    let mut first = campaign(&mut c, "e", "first", 1_000).await;
    let e = elected(&mut first, STEP, "the first leader").await;
    let (mut confirmed_at, mut valid_for) = (Instant::now(), remaining(&e.remaining_ttl, "ttl"));
    let mut waiting = campaign(&mut c, "e", "waiting", 1_000).await;
    wait_for_candidates(&c, "e", 1).await;

    redis.signal(Signal::SIGSTOP);
    let (lost, renewals) = read_until_lost(&mut first, Duration::from_secs(3), "lost").await;
    let lost_at = Instant::now();
    if let Some((at, r)) = renewals.last() {
        (confirmed_at, valid_for) = (*at, remaining(&r.remaining_ttl, "renewed"));
    }
    assert_eq!(lost.reason(), LeaseLostReason::Unconfirmed, "{lost:?}");
    let expiry = confirmed_at + valid_for;
    assert!(
        lost_at < expiry,
        "lost arrived {:?} after the leadership could have expired",
        lost_at - expiry
    );
    expect_end(&mut first, "the first leader's stream after lost").await;
    redis.signal(Signal::SIGCONT);

    match within(
        Duration::from_secs(10),
        waiting.message(),
        "the waiting candidate",
    )
    .await
    {
        Ok(Some(pb::ElectionServiceCampaignResponse {
            event: Some(Event::Elected(next)),
        })) => {
            assert!(next.term > e.term);
            assert!(lost_at.elapsed() > Duration::ZERO);
        }
        Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        other => panic!("the waiting candidate: {other:?}"),
    }
    drop(waiting);
    let mut again = campaign(&mut c, "e", "again", 1_000).await;
    let next = elected(
        &mut again,
        Duration::from_secs(10),
        "a campaign after Redis is back",
    )
    .await;
    assert!(next.term > e.term);
}

// ---------------------------------------------------------------------------------------------
// Observers
// ---------------------------------------------------------------------------------------------

/// An observer opened before anyone campaigns sees, in order and each exactly once: nobody, then
/// for each of three leaders its election, its proclaimed value and its resignation (each change
/// waits until the observer has seen the one before); an observer opened midway gets the current
/// state at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_see_every_change_in_order() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut c = client(&baton).await;
    let mut observer = observe(&mut c, "e").await;
    let first = next_state(&mut observer, "the state at once").await;
    assert_eq!(summary(&first), (0, u64::MAX, String::new()), "{first:?}");

    let mut last_term = 0;
    for k in 0..3 {
        let value = format!("leader-{k}");
        let mut stream = campaign(&mut c, "e", &value, 2_000).await;
        let e = elected(&mut stream, STEP, &value).await;
        assert!(e.term > last_term);
        let seen = next_state(&mut observer, "the new leader").await;
        assert_eq!(summary(&seen), (e.term, 0, value.clone()));

        let moved = format!("{value}-moved");
        let p = proclaim(&mut c, "e", &e.token, moved.as_bytes()).await;
        assert_eq!((p.term, p.value_revision), (e.term, 1));
        let seen = next_state(&mut observer, "the new value").await;
        assert_eq!(summary(&seen), (e.term, 1, moved.clone()));

        if k == 1 {
            let mut late = observe(&mut client(&baton).await, "e").await;
            let now = next_state(&mut late, "the late observer's first state").await;
            assert_eq!(summary(&now), (e.term, 1, moved.clone()));
        }

        drop(stream);
        let seen = next_state(&mut observer, "nobody leading").await;
        assert_eq!(summary(&seen), (e.term, u64::MAX, String::new()));
        last_term = e.term;
    }
}

/// A leader proclaims 1000 values of 4 KiB in a row while one observer reads and another, whose
/// connection has a small HTTP/2 window, reads nothing: the reading observer sees the last value
/// within a second of its proclamation; the idle one, read afterwards, gets a few states, in
/// order, the newest last (the ones it could not take were replaced, not queued).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_observer_holds_nothing_up() {
    const VALUES: u64 = 1_000;
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut c = client(&baton).await;
    let mut stream = campaign(&mut c, "e", "v0", 5_000).await;
    let e = elected(&mut stream, STEP, "the leader").await;

    let small_window = Endpoint::from_shared(format!("http://{}", baton.addr()))
        .expect("endpoint")
        .initial_stream_window_size(Some(65_535))
        .initial_connection_window_size(Some(65_535))
        .connect()
        .await
        .expect("a connection with a small window");
    let mut idle = observe(&mut ElectionServiceClient::new(small_window), "e").await;
    let mut reading = observe(&mut client(&baton).await, "e").await;
    assert_eq!(summary(&next_state(&mut reading, "first").await).1, 0);
    let reader = tokio::spawn(async move {
        let mut last = (e.term, 0);
        loop {
            let state = next_state(&mut reading, "the reading observer").await;
            let (term, revision, _) = summary(&state);
            assert!((term, revision) > last, "{last:?} then {term}/{revision}");
            last = (term, revision);
            if revision == VALUES {
                return Instant::now();
            }
        }
    });

    let padding = "x".repeat(4_000);
    let mut proclaimed_at = Instant::now();
    for i in 1..=VALUES {
        let value = format!("v{i}-{padding}");
        let p = proclaim(&mut c, "e", &e.token, value.as_bytes()).await;
        assert_eq!(p.value_revision, i);
        proclaimed_at = Instant::now();
    }
    let seen_at = within(STEP, reader, "the reading observer to see the last value")
        .await
        .expect("the reader");
    let lag = seen_at.saturating_duration_since(proclaimed_at);
    println!("the reading observer saw the last of {VALUES} values {lag:?} after it");
    assert!(
        lag < Duration::from_secs(1),
        "the reading observer lagged {lag:?}"
    );

    let mut states = Vec::new();
    loop {
        let state = next_state(&mut idle, "the idle observer").await;
        let (_, revision, value) = summary(&state);
        states.push(revision);
        if revision == VALUES {
            assert!(value.starts_with(&format!("v{VALUES}-")));
            break;
        }
    }
    println!("the idle observer read {} states: {states:?}", states.len());
    assert_eq!(states[0], 0, "the state when it opened comes first");
    assert!(
        states.windows(2).all(|w| w[0] < w[1]),
        "in order: {states:?}"
    );
    assert!(
        states.len() < 100,
        "{} of {VALUES} states were queued for the idle observer",
        states.len()
    );
}

// ---------------------------------------------------------------------------------------------
// Proclaim, Leader, bad input, keys, shutdown
// ---------------------------------------------------------------------------------------------

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
