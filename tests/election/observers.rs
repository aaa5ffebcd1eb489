//! Observers (docs/guarantees.md, "Leader election", promise 6): the current state at once, then
//! every change in order, each state whole and as it was, never a lower term nor an older value
//! of a term, never missing the last change, across Batons; a slow observer holds nothing up.

use std::collections::HashMap;

use tokio::{sync::watch, time::Instant};
use tonic::transport::Endpoint;

use crate::{
    Observer, STEP, campaign, client, elected, next_state, observe, proclaim, summary,
    support::{Baton, RedisServer, unique_prefix, within},
};
use baton::proto::v1::election_service_client::ElectionServiceClient;
use std::time::Duration;

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

/// An observed state: (term, value revision, value), `u64::MAX` for the revision of "nobody
/// leads after this term" (see [`summary`]).
type Seen = (u64, u64, String);

/// Reads `observer` until it has seen the state `last` will name (nobody leading after that
/// term), returning every state read; each must come within [`STEP`].
async fn follow(mut observer: Observer, mut last: watch::Receiver<Option<u64>>) -> Vec<Seen> {
    let mut seen: Vec<Seen> = Vec::new();
    loop {
        let done = (*last.borrow_and_update())
            .is_some_and(|term| seen.last() == Some(&(term, u64::MAX, String::new())));
        if done {
            return seen;
        }
        tokio::select! {
            state = next_state(&mut observer, "an observer following the changes") => {
                seen.push(summary(&state));
            }
            _ = last.changed() => {}
        }
    }
}

/// Checks what an observer saw: states in history order (each later than the one before), each
/// leader's value the one its term had at that revision, the final state last.
fn check_history(seen: &[Seen], values: &HashMap<u64, Vec<String>>, last: u64, who: &str) {
    for pair in seen.windows(2) {
        assert!(
            (pair[1].0, pair[1].1) > (pair[0].0, pair[0].1),
            "{who} went back: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
    for (term, revision, value) in seen {
        if *revision == u64::MAX {
            assert!(value.is_empty(), "{who}: {value:?} with nobody leading");
            continue;
        }
        let written = values
            .get(term)
            .and_then(|v| v.get(usize::try_from(*revision).expect("small")));
        assert_eq!(
            written,
            Some(value),
            "{who} saw term {term} revision {revision} with a value it never had"
        );
    }
    assert_eq!(
        seen.last(),
        Some(&(last, u64::MAX, String::new())),
        "{who} missed the last change"
    );
}

/// Two Batons, two observers on each: one reads every change as it comes, one is read only once
/// the changes are over. Twenty leaders in a row, alternating between the Batons, each
/// proclaiming two values and resigning without waiting for anyone to look. Every observer sees
/// states in history order (never a lower term, never an older value of a term), each leader with
/// the value its term had at that revision, and ends on the last change (nobody leading after the
/// last term), which none misses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_on_two_batons_never_go_back_nor_miss_the_last_change() {
    const LEADERS: usize = 20;
    let redis = RedisServer::start().await;
    let prefix = unique_prefix();
    let a = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let b = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let clients = [client(&a).await, client(&b).await];
    let (last_tx, last_rx) = watch::channel(None);
    let mut readers = Vec::new();
    let mut late = Vec::new();
    for (i, c) in clients.iter().enumerate() {
        for reads in [true, false] {
            let mut observer = observe(&mut c.clone(), "e").await;
            let first = next_state(&mut observer, "the state at once").await;
            assert_eq!(summary(&first), (0, u64::MAX, String::new()), "{first:?}");
            if reads {
                let last = last_rx.clone();
                readers.push((i, tokio::spawn(follow(observer, last))));
            } else {
                late.push((i, observer));
            }
        }
    }

    let mut values: HashMap<u64, Vec<String>> = HashMap::new();
    let mut last_term = 0;
    for i in 0..LEADERS {
        let mut c = clients[i % 2].clone();
        let value = format!("leader-{i}-0");
        let mut stream = campaign(&mut c, "e", &value, 5_000).await;
        let e = elected(&mut stream, STEP, &value).await;
        assert!(e.term > last_term, "terms {last_term} then {}", e.term);
        let mut written = vec![value];
        for revision in 1..=2u64 {
            let value = format!("leader-{i}-{revision}");
            let p = proclaim(&mut c, "e", &e.token, value.as_bytes()).await;
            assert_eq!((p.term, p.value_revision), (e.term, revision));
            written.push(value);
        }
        values.insert(e.term, written);
        drop(stream);
        last_term = e.term;
    }
    last_tx.send(Some(last_term)).expect("the readers listen");

    for (i, reader) in readers {
        let seen = within(
            STEP * 2,
            reader,
            "a reading observer to see the last change",
        )
        .await
        .expect("the reader");
        println!(
            "the reading observer on Baton {i} saw {} states",
            seen.len()
        );
        check_history(
            &seen,
            &values,
            last_term,
            &format!("the reading observer on Baton {i}"),
        );
    }
    for (i, observer) in late {
        let mut rx = last_rx.clone();
        rx.mark_changed();
        let seen = follow(observer, rx).await;
        println!(
            "the late observer on Baton {i} saw {} states: {seen:?}",
            seen.len()
        );
        check_history(
            &seen,
            &values,
            last_term,
            &format!("the late observer on Baton {i}"),
        );
    }
    drop(last_tx);
}
