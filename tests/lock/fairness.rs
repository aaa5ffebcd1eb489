//! Waiting and fairness (docs/guarantees.md, promise 5, "No fairness without `fair`", and "Shared
//! locks and fairness" 3-4): releases and expiries wake waiters without polling, also across
//! Batons; `fair` waiters are granted in arrival order and evenly; a release wakes only the
//! waiters that can go ahead; waiters that give up, die or fail their first try pass their turn
//! on; and what each call costs Redis.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use baton::proto::v1 as pb;
use nix::sys::signal::Signal;
use tokio::{task::JoinSet, time::Instant};
use tonic::Code;

use crate::support::{
    Baton, RedisServer,
    lease::{WAKE_BOUND, wait_for_scripts_to_settle, wait_for_waiters, wait_for_waiters_while},
    lock::{
        Ask, Client, EXCLUSIVE, FAIR, FAIR_SHARED, SHARED, acquire, acquire_request, acquired, ask,
        ask_request, describe, granted, granted_with, release, wait_for_queued,
    },
    wait_until, within,
};

/// A waiter blocked on a lock held for 30 s gets it within [`WAKE_BOUND`] of the holder's Release
/// returning: the release wakes it through pub/sub, not the holder's ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_a_waiter_at_once() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let lease = acquired(&mut client, "orders", 30_000, None, "alice").await;
    let mut waiter_client = baton.client().await;
    let mut waiter = tokio::spawn(async move {
        let response = acquire(&mut waiter_client, "orders", 30_000, Some(10_000), "bob").await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&client, "orders", 1, &mut waiter).await;

    assert!(release(&mut client, "orders", &lease.token).await.was_held);
    let released_at = Instant::now();
    let (response, woke_at) = within(Duration::from_secs(2), waiter, "the waiter to acquire")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let latency = woke_at.saturating_duration_since(released_at);
    assert!(
        latency < WAKE_BOUND,
        "the waiter got the lock {latency:?} after the release"
    );
}

/// Two Batons sharing a Redis and a key prefix act as one: a caller waiting on one is counted by
/// the other's Describe and is woken within [`WAKE_BOUND`] when the holder releases through the
/// other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_one_baton_wakes_a_waiter_on_another() {
    let redis = RedisServer::start().await;
    let first = Baton::start(&redis).await;
    let prefix = first.prefix().to_owned();
    let second = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix).await;
    let mut holder = first.client().await;

    let lease = acquired(&mut holder, "orders", 30_000, None, "alice").await;
    let mut waiter_client = second.client().await;
    let mut waiter = tokio::spawn(async move {
        let response = acquire(&mut waiter_client, "orders", 30_000, Some(10_000), "bob").await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&holder, "orders", 1, &mut waiter).await;

    assert!(release(&mut holder, "orders", &lease.token).await.was_held);
    let released_at = Instant::now();
    let (response, woke_at) = within(Duration::from_secs(2), waiter, "the waiter to acquire")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let latency = woke_at.saturating_duration_since(released_at);
    assert!(
        latency < WAKE_BOUND,
        "the waiter on the other Baton got the lock {latency:?} after the release"
    );
    assert_eq!(describe(&mut holder, "orders").await.owner, "bob");
}

/// A holder that never releases (ttl 300 ms) is noticed at its expiry: a waiter gets the lock
/// after about 300 ms, without any release published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_wakes_a_waiter() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    let started = Instant::now();
    let holder = acquired(&mut client, "orders", 300, None, "alice").await;
    let response = acquire(&mut client, "orders", 10_000, Some(5_000), "bob").await;
    let elapsed = started.elapsed();
    assert!(response.acquired, "{response:?}");
    assert!(
        elapsed >= Duration::from_millis(250) && elapsed < Duration::from_millis(1_500),
        "got a 300 ms lock after {elapsed:?}"
    );
    assert!(response.lease.expect("lease").fencing_token > holder.fencing_token);
}

/// A lease cut short is noticed at its new expiry, not the one the waiters were first told: a
/// holder of 30 s refreshing to 300 ms, and a re-entrant lease whose 30 s hold is released while
/// a 300 ms one stays. Waiters of every kind (exclusive, shared, fair, waiting 20 s) get the lock
/// within seconds, far before the 20 s their wait or the 30 s the holder first had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_cut_short_wakes_its_waiters_at_the_new_expiry() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    for (case, how) in [EXCLUSIVE, SHARED, FAIR, FAIR_SHARED]
        .into_iter()
        .enumerate()
    {
        for released in [false, true] {
            let name = format!("cut-{case}-{released}");
            let long = acquired(&mut client, &name, 30_000, None, "alice").await;
            let short = if released {
                Some(acquired(&mut client, &name, 300, None, "alice").await)
            } else {
                None
            };
            let mut waiter = {
                let mut client = client.clone();
                let name = name.clone();
                tokio::spawn(async move {
                    ask(&mut client, &name, 5_000, Some(20_000), "bob", how).await
                })
            };
            wait_for_waiters_while(&client, &name, 1, &mut waiter).await;
            let cut = Instant::now();
            if short.is_some() {
                assert!(release(&mut client, &name, &long.token).await.was_held);
            } else {
                crate::support::lock::refresh(&mut client, &name, &long.token, Some(300))
                    .await
                    .expect("Refresh");
            }
            let response = within(Duration::from_secs(30), waiter, "the waiter")
                .await
                .expect("the waiter's task");
            let after = cut.elapsed();
            assert!(response.acquired, "{name}: {response:?}");
            // At 300 ms by Redis's clock; a margin for a busy machine, far below 20 s.
            assert!(
                after < Duration::from_secs(5),
                "{name}: the waiter got the lock {after:?} after the lease was cut to 300 ms"
            );
        }
    }
}

/// A KeepAlive with a shorter ttl than the hold's cuts its lease short in its batched renewal,
/// which tells the waiters too: the holder's Baton (a real process) renews a 30 s hold at
/// 400 ms, then is SIGKILLed; a shared waiter told the 30 s expiry before gets the lock within
/// seconds, not at the end of its 20 s wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_that_cuts_a_lease_short_wakes_its_waiters() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let client = baton.client().await;
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), baton.prefix().to_owned()]);
    let process =
        crate::support::BatonProcess::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
    let mut holder = process.client().await;
    let lease = acquired(&mut holder, "orders", 30_000, None, "alice").await;
    let mut waiter = {
        let mut client = client.clone();
        tokio::spawn(
            async move { ask(&mut client, "orders", 5_000, Some(20_000), "bob", SHARED).await },
        )
    };
    wait_for_waiters_while(&client, "orders", 1, &mut waiter).await;
    let mut stream = holder
        .keep_alive(pb::LockServiceKeepAliveRequest {
            name: "orders".into(),
            token: lease.token.clone(),
            ttl: Some(crate::support::ms(400)),
        })
        .await
        .expect("KeepAlive")
        .into_inner();
    crate::support::lease::next_renewal(&mut stream).await;
    drop(process); // SIGKILL: nobody renews nor releases the hold.
    let killed = Instant::now();
    let response = within(Duration::from_secs(30), waiter, "the waiter")
        .await
        .expect("the waiter's task");
    assert!(response.acquired, "{response:?}");
    let after = killed.elapsed();
    assert!(
        after < Duration::from_secs(5),
        "the waiter got the lock {after:?} after the holder's Baton died renewing at 400 ms"
    );
}

/// Jain's fairness index of `counts`: 1 when every count is equal, 1/n when one takes all.
fn jain(counts: &[u64]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    sum * sum / (counts.len() as f64 * squares)
}

/// Six fair waiters, each started once the previous one is queued, get the lock in that order,
/// and a non-fair request made after them (while the lock is free between two grants, too) gets
/// it only after all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_granted_in_arrival_order() {
    const WAITERS: u32 = 6;
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let order = Arc::new(Mutex::new(Vec::new()));

    let holder = acquired(&mut client, "orders", 30_000, None, "holder").await;
    let mut tasks = JoinSet::new();
    let spawn = |tasks: &mut JoinSet<()>, id: String, how: Ask, client: Client| {
        let order = order.clone();
        tasks.spawn(async move {
            let mut client = client;
            let lease = granted(&mut client, "orders", 10_000, Some(10_000), &id, how).await;
            order.lock().expect("order").push(id);
            // Held a moment, so a later waiter could try to slip in between two grants.
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(release(&mut client, "orders", &lease.token).await.was_held);
        });
    };
    for i in 0..WAITERS {
        spawn(&mut tasks, format!("fair-{i}"), FAIR, baton.client().await);
        wait_for_queued(&client, "orders", i + 1).await;
    }
    spawn(&mut tasks, "late".into(), EXCLUSIVE, baton.client().await);
    wait_for_waiters(&client, "orders", WAITERS + 1).await;

    assert!(release(&mut client, "orders", &holder.token).await.was_held);
    within(
        Duration::from_secs(10),
        async {
            while let Some(joined) = tasks.join_next().await {
                joined.expect("a waiter task failed");
            }
        },
        "every waiter to get the lock",
    )
    .await;
    let mut expected: Vec<String> = (0..WAITERS).map(|i| format!("fair-{i}")).collect();
    expected.push("late".into());
    assert_eq!(*order.lock().expect("order"), expected);
    let d = describe(&mut client, "orders").await;
    assert_eq!((d.waiters, d.queued), (0, 0), "{d:?}");
}

/// 16 fair clients looping acquire + release on one lock share the grants evenly (Jain's index
/// of grants per client >= 0.99), and a grant costs a few script calls, not one per waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_contention_is_even_and_wakes_no_herd() {
    const CLIENTS: usize = 16;
    const GRANTS: u64 = 640;
    // Reads node-wide counters: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut conn = redis.conn().await;
    let total = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));

    conn.reset_stats().await;
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..CLIENTS {
        let mut client = baton.client().await;
        let (total, inside) = (total.clone(), inside.clone());
        tasks.spawn(async move {
            let mut mine = 0u64;
            while total.load(Ordering::SeqCst) < GRANTS {
                let lease = granted(&mut client, "hot", 5_000, Some(30_000), "", FAIR).await;
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                mine += 1;
                total.fetch_add(1, Ordering::SeqCst);
                inside.store(false, Ordering::SeqCst);
                assert!(release(&mut client, "hot", &lease.token).await.was_held);
            }
            mine
        });
    }
    let mut counts = Vec::new();
    within(
        Duration::from_secs(60),
        async {
            while let Some(joined) = tasks.join_next().await {
                counts.push(joined.expect("a client task failed"));
            }
        },
        "the contended loop to finish",
    )
    .await;
    let elapsed = started.elapsed();
    let grants: u64 = counts.iter().sum();
    let scripts = conn.command_calls("evalsha").await;
    let index = jain(&counts);
    eprintln!(
        "{grants} fair grants to {CLIENTS} clients in {elapsed:?}: per client {counts:?}, \
         Jain's index {index:.4}, {:.2} script calls per grant",
        scripts as f64 / grants as f64
    );
    assert!(index >= 0.99, "Jain's index {index} for {counts:?}");
    // Per grant: the release, the woken head's attempt, and the releaser's next try and queueing
    // (plus the odd place renewal). Waking every waiter would cost 16 more.
    assert!(
        (scripts as f64) < 6.0 * grants as f64,
        "{scripts} script calls for {grants} grants"
    );
}

/// A release wakes only a waiter that can take the lock: around one handoff with four fair waiters
/// Redis runs exactly two scripts (the release and the head's acquisition) and one PUBLISH; with
/// four non-fair exclusive waiters on the same Baton, the same (the broadcast wakes one of them);
/// four shared waiters all wake and all get in. Each run ends well within a second of the first
/// registration, before any waiter renews its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_waiters_that_can_go_ahead() {
    const WAITERS: u32 = 4;
    // Reads node-wide counters: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut conn = redis.conn().await;

    // Returns the script calls and PUBLISH calls Redis ran around one handoff, or None when the
    // run took too long to rule out place renewals (about every second).
    async fn handoff(
        baton: &Baton,
        client: &mut Client,
        conn: &mut crate::support::RedisConn,
        name: &str,
        how: Ask,
    ) -> Option<(u64, u64)> {
        let holder = acquired(client, name, 30_000, None, "holder").await;
        let first_registered = Instant::now();
        let mut waiters = JoinSet::new();
        for i in 0..WAITERS {
            let mut c = baton.client().await;
            let lock = name.to_owned();
            waiters.spawn(async move {
                ask(&mut c, &lock, 30_000, Some(10_000), &format!("w{i}"), how).await
            });
            if how.fair {
                wait_for_queued(client, name, i + 1).await;
            }
        }
        wait_for_waiters(client, name, WAITERS).await;
        // A waiter registers on its first try and tries once more once subscribed: wait until
        // every such attempt has run (no script call for 50 ms) before counting.
        wait_for_scripts_to_settle(conn).await;

        conn.reset_stats().await;
        assert!(release(client, name, &holder.token).await.was_held);
        let first = within(
            Duration::from_secs(2),
            waiters.join_next(),
            "the next holder",
        )
        .await
        .expect("a waiter")
        .expect("waiter task");
        assert!(first.acquired, "{first:?}");
        // Anyone else woken would run its acquisition script now.
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Scripts publish with SPUBLISH on a Cluster.
        let publish = conn.publish_command();
        let counts = (
            conn.command_calls("evalsha").await,
            conn.command_calls(publish).await,
        );
        let quick = first_registered.elapsed() < Duration::from_millis(900);
        waiters.abort_all();
        let lease = first.lease.expect("lease");
        release(client, name, &lease.token).await;
        quick.then_some(counts)
    }

    let mut fair = None;
    for attempt in 0..3 {
        fair = handoff(
            &baton,
            &mut client,
            &mut conn,
            &format!("fair-{attempt}"),
            FAIR,
        )
        .await;
        if fair.is_some() {
            break;
        }
    }
    let (scripts, publishes) = fair.expect("a fair handoff measured within a second");
    assert_eq!(
        scripts, 2,
        "fair: script calls around one handoff (release + head's acquire)"
    );
    assert_eq!(publishes, 1, "fair: one message, addressed to the head");

    // Non-fair exclusive waiters of one Baton: only one of them can take the lock, and only one
    // is woken.
    let mut relay = None;
    for attempt in 0..3 {
        relay = handoff(
            &baton,
            &mut client,
            &mut conn,
            &format!("relay-{attempt}"),
            EXCLUSIVE,
        )
        .await;
        if relay.is_some() {
            break;
        }
    }
    let (scripts, publishes) = relay.expect("a non-fair handoff measured within a second");
    assert_eq!(
        scripts, 2,
        "non-fair: script calls around one handoff (release + one local waiter's acquire)"
    );
    assert_eq!(publishes, 1, "non-fair: one broadcast");

    // Shared waiters can all go ahead: one message wakes them all.
    let mut herd = None;
    for attempt in 0..3 {
        herd = handoff(
            &baton,
            &mut client,
            &mut conn,
            &format!("shared-{attempt}"),
            SHARED,
        )
        .await;
        if herd.is_some() {
            break;
        }
    }
    let (scripts, _) = herd.expect("a shared handoff measured within a second");
    assert_eq!(
        scripts,
        1 + u64::from(WAITERS),
        "shared: the release and every waiter's acquire"
    );
}

/// A fair waiter that gives up passes its turn on at once: an exclusive head that times out lets
/// the shared waiter it held back join the shared holder immediately; a head whose caller
/// cancels leaves the queue, so the next waiter gets the lock as soon as it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_that_gives_up_passes_the_turn_on() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    // A shared holder; an exclusive head that waits 300 ms; a shared waiter behind it.
    let reader = granted(&mut client, "timeout", 30_000, None, "reader", SHARED).await;
    let mut c = baton.client().await;
    let mut head = tokio::spawn(async move {
        let response = ask(&mut c, "timeout", 10_000, Some(300), "writer", FAIR).await;
        (response, Instant::now())
    });
    wait_for_queued(&client, "timeout", 1).await;
    let mut c = baton.client().await;
    let mut behind = tokio::spawn(async move {
        let response = ask(
            &mut c,
            "timeout",
            10_000,
            Some(10_000),
            "reader-2",
            FAIR_SHARED,
        )
        .await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&client, "timeout", 2, &mut behind).await;
    let (gave_up, gave_up_at) = within(Duration::from_secs(2), &mut head, "the head to give up")
        .await
        .expect("head task");
    assert!(!gave_up.acquired, "{gave_up:?}");
    let (response, got_at) = within(Duration::from_secs(2), &mut behind, "the shared waiter")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let after = got_at.saturating_duration_since(gave_up_at);
    assert!(
        after < WAKE_BOUND,
        "the shared waiter got in {after:?} after the writer ahead of it gave up"
    );
    assert_eq!(describe(&mut client, "timeout").await.shared_holders, 2);
    release(&mut client, "timeout", &reader.token).await;

    // An exclusive holder; two fair waiters; the first one's caller goes away.
    let holder = acquired(&mut client, "cancel", 30_000, None, "holder").await;
    let mut c = baton.client().await;
    let first =
        tokio::spawn(
            async move { ask(&mut c, "cancel", 10_000, Some(10_000), "first", FAIR).await },
        );
    wait_for_queued(&client, "cancel", 1).await;
    let mut c = baton.client().await;
    let mut second = tokio::spawn(async move {
        let response = ask(&mut c, "cancel", 10_000, Some(10_000), "second", FAIR).await;
        (response, Instant::now())
    });
    wait_for_queued(&client, "cancel", 2).await;
    first.abort();
    wait_for_queued(&client, "cancel", 1).await;
    assert!(release(&mut client, "cancel", &holder.token).await.was_held);
    let released_at = Instant::now();
    let (response, got_at) = within(Duration::from_secs(2), &mut second, "the second waiter")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let latency = got_at.saturating_duration_since(released_at);
    assert!(
        latency < WAKE_BOUND,
        "the second waiter got the lock {latency:?} after the release"
    );
}

/// A fair waiter whose Baton dies (a real `baton` process, SIGKILLed while queued first) holds up
/// the queue only until its place lease (3 s) runs out: the waiter behind it, on another Baton,
/// then gets the lock without any message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_fair_waiter_drops_out_when_its_place_expires() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), baton.prefix().to_owned()]);
    let process =
        crate::support::BatonProcess::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .await;

    let holder = acquired(&mut client, "orders", 30_000, None, "holder").await;
    let mut doomed = process.client().await;
    let _dead = tokio::spawn(async move {
        doomed
            .acquire(ask_request("orders", 10_000, Some(30_000), "doomed", FAIR))
            .await
    });
    wait_for_queued(&client, "orders", 1).await;
    let mut c = baton.client().await;
    let mut behind = tokio::spawn(async move {
        let response = ask(&mut c, "orders", 10_000, Some(10_000), "behind", FAIR).await;
        (response, Instant::now())
    });
    wait_for_queued(&client, "orders", 2).await;

    drop(process); // SIGKILL: the doomed waiter's place is no longer renewed.
    let killed_at = Instant::now();
    assert!(release(&mut client, "orders", &holder.token).await.was_held);
    let (response, got_at) = within(Duration::from_secs(5), &mut behind, "the waiter behind")
        .await
        .expect("waiter task");
    assert!(response.acquired, "{response:?}");
    let after = got_at.saturating_duration_since(killed_at);
    assert!(
        after > Duration::from_millis(500) && after < Duration::from_millis(3_500),
        "the waiter behind a dead one got the lock {after:?} after the kill"
    );
    let d = describe(&mut client, "orders").await;
    assert_eq!((d.owner.as_str(), d.queued), ("behind", 0), "{d:?}");
}

/// Uncontended, every mode costs one script call per acquisition (waiting allowed or not) and one
/// per release, and a release with nobody waiting publishes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_calls_cost_one_script_each_in_every_mode() {
    // Reads node-wide counters: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut conn = redis.conn().await;
    let publish = conn.publish_command();

    // Load every script once, so that no NOSCRIPT retry is counted below.
    let warm = granted(&mut client, "free", 1_000, None, "", EXCLUSIVE).await;
    release(&mut client, "free", &warm.token).await;

    for how in [EXCLUSIVE, SHARED, FAIR, FAIR_SHARED] {
        for wait in [None, Some(1_000)] {
            conn.reset_stats().await;
            let lease = granted(&mut client, "free", 1_000, wait, "", how).await;
            assert!(release(&mut client, "free", &lease.token).await.was_held);
            assert_eq!(
                conn.command_calls("evalsha").await,
                2,
                "{how:?} waiting {wait:?}: one script call to acquire, one to release"
            );
            assert_eq!(conn.command_calls(publish).await, 1, "{how:?}");
        }
    }
}

/// A fair waiter whose first try times out (Redis frozen) after Redis took its place in the queue
/// gives the place back: once the holder releases, the next fair waiter gets the lock at once,
/// not when the ghost place's 3 s lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_place_taken_by_a_failed_first_try_is_given_back() {
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let fair = |owner: &str, wait| pb::LockServiceAcquireRequest {
        fair: true,
        ..acquire_request("orders", 10_000, Some(wait), owner)
    };

    let holder = granted_with(
        &mut client,
        acquire_request("orders", 10_000, None, "holder"),
    )
    .await;
    redis.signal(Signal::SIGSTOP);
    let failed = client.clone().acquire(fair("ghost", 5_000)).await;
    assert_eq!(failed.map(|_| ()).unwrap_err().code(), Code::Unavailable);
    redis.signal(Signal::SIGCONT);
    // Redis now runs the ghost's first try, which queues it; Baton takes the place back.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut next = client.clone();
    let waiter = tokio::spawn(async move {
        let asked = Instant::now();
        let reply = next.acquire(fair("next", 8_000)).await.expect("Acquire");
        (reply.into_inner(), asked)
    });
    wait_until(
        Duration::from_secs(5),
        "the next fair waiter to queue",
        || {
            let mut client = client.clone();
            async move {
                let d = describe(&mut client, "orders").await;
                if d.queued >= 1 && d.waiters >= 1 {
                    Ok(())
                } else {
                    Err(d)
                }
            }
        },
    )
    .await;
    let released = Instant::now();
    assert!(release(&mut client, "orders", &holder.token).await.was_held);
    let (reply, _) = within(Duration::from_secs(6), waiter, "the next waiter")
        .await
        .expect("waiter task");
    assert!(reply.acquired, "{reply:?}");
    let handoff = released.elapsed();
    assert!(
        handoff < Duration::from_millis(1_500),
        "the next fair waiter waited {handoff:?} behind a ghost place"
    );
}
