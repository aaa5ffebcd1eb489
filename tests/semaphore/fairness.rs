//! Waiting and fairness (docs/guarantees.md, "Semaphores" 5-6): fair waiters in arrival order, a
//! large request not starved by small ones, non-fair requests never overtaking fair waiters;
//! releases waking waiters at once, as many as they freed permits; fair waiters that give up or
//! drop their stream leave the queue, and waiting ones keep their place; the order of arrival is
//! the order Redis ran the requests, also across Batons.

use std::time::Duration;

use baton::proto::v1 as pb;
use tokio::{task::JoinSet, time::Instant};

use crate::support::{
    Baton, RedisServer,
    lease::{WAKE_BOUND, wait_for_scripts_to_settle, wait_for_waiters, wait_for_waiters_while},
    ms,
    semaphore::{
        acquire, acquired, describe, hold, hold_request, refused, release, request, waiting,
    },
    wait_until, within,
};

/// Five fair waiters, each confirmed queued (Describe's waiter count) before the next starts, are
/// granted in arrival order once the holder releases (each releases as soon as it is granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_granted_in_arrival_order() {
    const WAITERS: usize = 5;
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let holder = acquired(&mut client, request("pool", 1, 1, 30_000)).await;
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let mut c = if i % 2 == 0 {
            client.clone()
        } else {
            baton.semaphore_client().await
        };
        let mut task = tokio::spawn(async move {
            let permit = acquired(&mut c, waiting("pool", 1, 1, 30_000, 10_000, true)).await;
            assert!(release(&mut c, "pool", &permit.token).await);
            (i, permit.fencing_token)
        });
        wait_for_waiters_while(
            &client,
            "pool",
            u32::try_from(i + 1).expect("small"),
            &mut task,
        )
        .await;
        tasks.push(task);
    }
    assert!(release(&mut client, "pool", &holder.token).await);
    let mut granted = Vec::new();
    for task in tasks {
        granted.push(
            within(Duration::from_secs(5), task, "a fair waiter")
                .await
                .expect("waiter task"),
        );
    }
    granted.sort_by_key(|&(_, fence)| fence);
    let order: Vec<usize> = granted.iter().map(|&(i, _)| i).collect();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "grant order by fencing token"
    );
}

/// A fair request for all 3 permits, queued while one is free, is not starved by a stream of
/// small fair requests arriving behind it: none of them takes the free permit meanwhile, the big
/// one is granted as soon as the holders leave, and every small one after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weighted_fair_request_is_not_starved() {
    const SMALL: usize = 12;
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let h1 = acquired(&mut client, request("pool", 3, 1, 30_000)).await;
    let h2 = acquired(&mut client, request("pool", 3, 1, 30_000)).await;
    let mut big_client = baton.semaphore_client().await;
    let mut big = tokio::spawn(async move {
        let permit = acquired(&mut big_client, waiting("pool", 3, 3, 30_000, 10_000, true)).await;
        let granted_at = Instant::now();
        // Hold the whole semaphore briefly, then give it back.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(release(&mut big_client, "pool", &permit.token).await);
        (permit.fencing_token, granted_at)
    });
    wait_for_waiters_while(&client, "pool", 1, &mut big).await;

    // Small requests keep arriving, one every 10 ms (the arrival stream is the scenario).
    let mut smalls = JoinSet::new();
    for _ in 0..SMALL {
        let mut c = client.clone();
        smalls.spawn(async move {
            let permit = acquired(&mut c, waiting("pool", 3, 1, 30_000, 10_000, true)).await;
            tokio::time::sleep(Duration::from_millis(5)).await;
            assert!(release(&mut c, "pool", &permit.token).await);
            permit.fencing_token
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let d = describe(&mut client, "pool").await;
        assert_eq!(
            d.permits_in_use, 2,
            "a small request barged past the big one: {d:?}"
        );
    }
    wait_for_waiters(&client, "pool", u32::try_from(SMALL + 1).expect("small")).await;

    assert!(release(&mut client, "pool", &h1.token).await);
    assert!(release(&mut client, "pool", &h2.token).await);
    let released_at = Instant::now();
    let (big_fence, granted_at) = within(Duration::from_secs(2), big, "the big request")
        .await
        .expect("big task");
    let latency = granted_at.saturating_duration_since(released_at);
    assert!(
        latency < WAKE_BOUND,
        "granted {latency:?} after the holders left"
    );
    within(
        Duration::from_secs(10),
        async {
            while let Some(small) = smalls.join_next().await {
                let fence = small.expect("a small request failed");
                assert!(
                    fence > big_fence,
                    "a small request arriving later was granted first"
                );
            }
        },
        "every small request",
    )
    .await;
}

/// Non-fair requests never overtake queued fair waiters: with a fair waiter for 2 permits queued
/// and 1 free, a non-fair (and a fair) try-once is refused and a non-fair waiter does not take the
/// free permit; it is granted after the fair waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_fair_request_does_not_overtake_fair_waiters() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let holder = acquired(&mut client, request("pool", 2, 1, 30_000)).await;
    let mut fair_client = baton.semaphore_client().await;
    let mut fair = tokio::spawn(async move {
        let permit = acquired(
            &mut fair_client,
            waiting("pool", 2, 2, 30_000, 10_000, true),
        )
        .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(release(&mut fair_client, "pool", &permit.token).await);
        permit.fencing_token
    });
    wait_for_waiters_while(&client, "pool", 1, &mut fair).await;

    let barging = refused(&mut client, request("pool", 2, 1, 1_000)).await;
    assert_eq!(barging.available, 1, "{barging:?}");
    refused(
        &mut client,
        pb::SemaphoreServiceAcquireRequest {
            fair: true,
            ..request("pool", 2, 1, 1_000)
        },
    )
    .await;
    let mut unfair_client = baton.semaphore_client().await;
    let mut unfair = tokio::spawn(async move {
        acquired(
            &mut unfair_client,
            waiting("pool", 2, 1, 30_000, 10_000, false),
        )
        .await
        .fencing_token
    });
    wait_for_waiters_while(&client, "pool", 2, &mut unfair).await;
    let d = describe(&mut client, "pool").await;
    assert_eq!(
        d.permits_in_use, 1,
        "the non-fair waiter took the free permit: {d:?}"
    );

    assert!(release(&mut client, "pool", &holder.token).await);
    let fair_fence = within(Duration::from_secs(2), fair, "the fair waiter")
        .await
        .expect("fair task");
    let unfair_fence = within(Duration::from_secs(2), unfair, "the non-fair waiter")
        .await
        .expect("non-fair task");
    assert!(
        unfair_fence > fair_fence,
        "the non-fair waiter overtook the fair one"
    );
}

/// A waiter (non-fair, then fair) blocked on a semaphore held for 30 s gets the permit within
/// [`WAKE_BOUND`] of the holder's Release returning: woken through pub/sub, not by the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_a_waiter_at_once() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    for fair in [false, true] {
        let name = format!("pool-{fair}");
        let holder = acquired(&mut client, request(&name, 1, 1, 30_000)).await;
        let mut waiter_client = baton.semaphore_client().await;
        let waiter_name = name.clone();
        let mut waiter = tokio::spawn(async move {
            let response = acquire(
                &mut waiter_client,
                waiting(&waiter_name, 1, 1, 30_000, 10_000, fair),
            )
            .await;
            (response, Instant::now())
        });
        wait_for_waiters_while(&client, &name, 1, &mut waiter).await;
        assert!(release(&mut client, &name, &holder.token).await);
        let released_at = Instant::now();
        let (response, woke_at) = within(Duration::from_secs(2), waiter, "the waiter to acquire")
            .await
            .expect("waiter task");
        assert!(response.acquired, "fair={fair}: {response:?}");
        let latency = woke_at.saturating_duration_since(released_at);
        assert!(
            latency < WAKE_BOUND,
            "fair={fair}: woken {latency:?} after the release"
        );
    }
}

/// A release wakes only as many local waiters as it freed permits: with a 3-permit holder of a
/// limit-3 semaphore and five non-fair single-permit waiters on one Baton, its release lets three
/// in, each woken by the one before it, which had permits left over; Redis runs the release and
/// exactly three acquisitions, and the other two waiters are not woken at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_as_many_waiters_as_it_frees_permits() {
    const WAITERS: usize = 5;
    // Reads node-wide counters: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    let mut conn = redis.conn().await;
    let name = "cascade";

    let holder = acquired(&mut client, request(name, 3, 3, 30_000)).await;
    let (granted_tx, mut granted_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..WAITERS {
        let mut c = baton.semaphore_client().await;
        let granted = granted_tx.clone();
        waiters.spawn(async move {
            let response = acquire(&mut c, waiting(name, 3, 1, 30_000, 20_000, false)).await;
            let _ = granted.send(response.acquired);
        });
    }
    wait_for_waiters(&client, name, WAITERS as u32).await;
    // Each waiter tries once more once subscribed: let those attempts run before counting.
    wait_for_scripts_to_settle(&mut conn).await;

    conn.reset_stats().await;
    assert!(release(&mut client, name, &holder.token).await);
    for i in 0..3 {
        let acquired = within(Duration::from_secs(2), granted_rx.recv(), "a grant")
            .await
            .expect("a waiter's answer");
        assert!(acquired, "grant {i}");
    }
    // Anyone else woken would run its acquisition script now.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        granted_rx.try_recv().is_err(),
        "only three permits were freed"
    );
    let scripts = conn.command_calls("evalsha").await;
    waiters.abort_all();
    assert_eq!(
        scripts, 4,
        "the release and three acquisitions, no waiter woken in vain"
    );
}

/// Waiters of different limits are woken apart: with limit 5, holders of 1 and 4 permits, and
/// two non-fair waiters of one permit on one Baton (one under a limit of 1, which cannot fit
/// while a permit is in use, one under 5), releasing the 4 permits grants the waiter under 5
/// at once; the one under 1 waits on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_of_each_limit() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    let name = "limits";
    let _one = acquired(&mut client, request(name, 5, 1, 30_000)).await;
    let four = acquired(&mut client, request(name, 5, 4, 30_000)).await;
    let mut strict = {
        let mut c = baton.semaphore_client().await;
        tokio::spawn(
            async move { acquire(&mut c, waiting(name, 1, 1, 30_000, 20_000, false)).await },
        )
    };
    wait_for_waiters_while(&client, name, 1, &mut strict).await;
    let mut loose = {
        let mut c = baton.semaphore_client().await;
        tokio::spawn(
            async move { acquire(&mut c, waiting(name, 5, 1, 30_000, 20_000, false)).await },
        )
    };
    wait_for_waiters_while(&client, name, 2, &mut loose).await;
    let released = Instant::now();
    assert!(release(&mut client, name, &four.token).await);
    let response = within(
        Duration::from_secs(30),
        loose,
        "the waiter under a limit of 5",
    )
    .await
    .expect("its task");
    assert!(response.acquired, "{response:?}");
    let after = released.elapsed();
    // At once; a margin for a busy machine, far below the 20 s of the other waiter's wait.
    assert!(
        after < Duration::from_secs(5),
        "granted {after:?} after the release"
    );
    assert!(
        !strict.is_finished(),
        "the waiter under a limit of 1 cannot fit"
    );
    strict.abort();
}

/// A lease cut short by a refresh (30 s to 300 ms) is noticed at its new expiry: a waiter told
/// the 30 s expiry gets the permit within seconds, not at the end of its 20 s wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_cut_short_wakes_its_waiters_at_the_new_expiry() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;
    for fair in [false, true] {
        let name = format!("cut-{fair}");
        let holder = acquired(&mut client, request(&name, 1, 1, 30_000)).await;
        let mut waiter = {
            let mut c = baton.semaphore_client().await;
            let name = name.clone();
            tokio::spawn(
                async move { acquire(&mut c, waiting(&name, 1, 1, 5_000, 20_000, fair)).await },
            )
        };
        wait_for_waiters_while(&client, &name, 1, &mut waiter).await;
        let cut = Instant::now();
        crate::support::semaphore::refresh(&mut client, &name, &holder.token, Some(300))
            .await
            .expect("Refresh");
        let response = within(Duration::from_secs(30), waiter, "the waiter")
            .await
            .expect("its task");
        assert!(response.acquired, "{name}: {response:?}");
        let after = cut.elapsed();
        assert!(
            after < Duration::from_secs(5),
            "{name}: granted {after:?} after the lease was cut to 300 ms"
        );
    }
}

/// A fair waiter whose caller gives up leaves the queue: when the head (waiting for 2 permits,
/// with 1 free) is cancelled, the waiter behind it (for 1) is granted at once, with no release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_fair_waiter_leaves_the_queue() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let holder = acquired(&mut client, request("pool", 2, 1, 30_000)).await;
    let mut head_client = baton.semaphore_client().await;
    let mut head = tokio::spawn(async move {
        acquire(
            &mut head_client,
            waiting("pool", 2, 2, 30_000, 10_000, true),
        )
        .await
    });
    wait_for_waiters_while(&client, "pool", 1, &mut head).await;
    let mut next_client = baton.semaphore_client().await;
    let mut next = tokio::spawn(async move {
        let response = acquire(
            &mut next_client,
            waiting("pool", 2, 1, 30_000, 10_000, true),
        )
        .await;
        (response, Instant::now())
    });
    wait_for_waiters_while(&client, "pool", 2, &mut next).await;
    assert_eq!(
        describe(&mut client, "pool").await.permits_in_use,
        1,
        "the second waits its turn"
    );

    head.abort();
    let cancelled_at = Instant::now();
    assert!(
        head.await.is_err_and(|e| e.is_cancelled()),
        "the head was cancelled"
    );
    let (response, granted_at) = within(Duration::from_secs(2), next, "the next fair waiter")
        .await
        .expect("next task");
    assert!(response.acquired, "{response:?}");
    let latency = granted_at.saturating_duration_since(cancelled_at);
    assert!(
        latency < Duration::from_millis(500),
        "granted {latency:?} after the head left"
    );
    let d = describe(&mut client, "pool").await;
    assert_eq!((d.permits_in_use, d.waiters), (2, 0), "{d:?}");
    assert_eq!(
        d.holders
            .iter()
            .filter(|h| h.fencing_token == holder.fencing_token)
            .count(),
        1
    );
}

/// A fair waiter keeps its place past the 3 s queue lease (it renews it while waiting): the head,
/// waiting 3.5 s for 2 permits, is still granted before a waiter that queued 2 s after it (whose
/// own place would have outlived the head's first one had the head not renewed it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fair_waiter_keeps_its_place_past_the_queue_lease() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    let holder = acquired(&mut client, request("pool", 2, 1, 30_000)).await;
    let mut head_client = baton.semaphore_client().await;
    let mut head = tokio::spawn(async move {
        let permit = acquired(
            &mut head_client,
            waiting("pool", 2, 2, 30_000, 10_000, true),
        )
        .await;
        assert!(release(&mut head_client, "pool", &permit.token).await);
        permit.fencing_token
    });
    wait_for_waiters_while(&client, "pool", 1, &mut head).await;
    let queued_at = Instant::now();
    // Time passing is the scenario: the next waiter arrives 2 s later, and the holder leaves
    // once the head has waited longer than the queue lease.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut next_client = baton.semaphore_client().await;
    let mut next = tokio::spawn(async move {
        acquired(
            &mut next_client,
            waiting("pool", 2, 2, 30_000, 10_000, true),
        )
        .await
        .fencing_token
    });
    wait_for_waiters_while(&client, "pool", 2, &mut next).await;
    tokio::time::sleep_until(queued_at + baton::lease::QUEUE_LEASE + Duration::from_millis(500))
        .await;
    assert_eq!(describe(&mut client, "pool").await.waiters, 2);
    assert!(release(&mut client, "pool", &holder.token).await);
    let head_fence = within(Duration::from_secs(2), head, "the head")
        .await
        .expect("head task");
    let next_fence = within(Duration::from_secs(2), next, "the next")
        .await
        .expect("next task");
    assert!(
        head_fence < next_fence,
        "the head lost its place in the queue"
    );
}

/// A Hold waiting in the fair queue whose client drops the stream leaves the queue: the waiter
/// behind it is granted at once, and the dropped one never holds anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_hold_that_is_dropped_leaves_the_queue() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.semaphore_client().await;

    acquired(&mut client, request("pool", 2, 1, 30_000)).await;
    let mut hold_client = baton.semaphore_client().await;
    let stream = hold(
        &mut hold_client,
        pb::SemaphoreServiceHoldRequest {
            wait_timeout: Some(ms(10_000)),
            fair: true,
            ..hold_request("pool", 2, 2, 30_000)
        },
    )
    .await;
    wait_for_waiters(&client, "pool", 1).await;
    let mut next_client = baton.semaphore_client().await;
    let mut next = tokio::spawn(async move {
        acquire(
            &mut next_client,
            waiting("pool", 2, 1, 30_000, 10_000, true),
        )
        .await
    });
    wait_for_waiters_while(&client, "pool", 2, &mut next).await;

    drop(stream);
    let response = within(
        Duration::from_secs(1),
        next,
        "the waiter behind the dropped Hold",
    )
    .await
    .expect("next task");
    assert!(response.acquired, "{response:?}");
    let d = describe(&mut client, "pool").await;
    assert_eq!(
        (d.permits_in_use, d.holder_count, d.waiters),
        (2, 2, 0),
        "{d:?}"
    );
}

/// The quoted words of one MONITOR line (`1700000000.1 [0 127.0.0.1:5] "EVALSHA" "..." ...`).
fn monitor_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut word = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => word.extend(chars.next()),
                '"' => break,
                c => word.push(c),
            }
        }
        words.push(word);
    }
    words
}

/// Fair semaphore waiters are served in the order their requests reached Redis, also across two
/// Batons: in each of 10 rounds two fair waiters on different Batons ask at once, and the one
/// whose first script call Redis ran first (seen with MONITOR) gets the permit first.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_semaphore_waiters_are_served_in_redis_arrival_order() {
    use futures::StreamExt;

    let redis = RedisServer::start_private().await;
    let prefix = crate::support::unique_prefix();
    let one = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let two = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let clients = [one.semaphore_client().await, two.semaphore_client().await];
    // On a Cluster, the master of the semaphore's slot runs its scripts.
    let monitor = redis::Client::open(redis.url_for_key("{sem:pool}").await)
        .expect("redis url")
        .get_async_monitor()
        .await
        .expect("MONITOR");
    let mut lines = monitor.into_on_message::<String>();
    let request = |owner: &str, wait: u64| pb::SemaphoreServiceAcquireRequest {
        name: "pool".into(),
        limit: 1,
        permits: 1,
        ttl: Some(ms(10_000)),
        wait_timeout: (wait > 0).then(|| ms(wait)),
        owner: owner.to_owned(),
        fair: true,
        ..Default::default()
    };
    // acquire.lua: "EVALSHA" sha numkeys KEYS (the holders key first) then ARGV token, owner,
    // permits, limit, ttl, waiter, ... (at least ten).
    let acquire_owner = |words: &[String]| {
        let keys: usize = words.get(2)?.parse().ok()?;
        (words.len() >= 3 + keys + 10
            && words[0].eq_ignore_ascii_case("evalsha")
            && words[3].ends_with("{sem:pool}:holders"))
        .then(|| words[3 + keys + 1].clone())
    };

    let mut mismatches = Vec::new();
    for round in 0..10 {
        let mut holder_client = clients[0].clone();
        let holder = holder_client
            .acquire(request("holder", 0))
            .await
            .expect("Acquire")
            .into_inner()
            .permit
            .expect("the holder is granted");
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let owners = [format!("a{round}"), format!("b{round}")];
        for (owner, client) in owners.iter().zip(clients.iter().cloned()) {
            let (tx, mut client, request) = (tx.clone(), client, request(owner, 5_000));
            tokio::spawn(async move {
                let reply = client.acquire(request).await.expect("Acquire").into_inner();
                let _ = tx.send(reply.permit.expect("granted"));
            });
        }
        // The first script call of each waiter, in the order Redis ran them.
        let mut arrival: Vec<String> = Vec::new();
        within(
            Duration::from_secs(5),
            async {
                while arrival.len() < 2 {
                    let line = lines.next().await.expect("MONITOR goes on");
                    if let Some(owner) = acquire_owner(&monitor_words(&line))
                        && owners.contains(&owner)
                        && !arrival.contains(&owner)
                    {
                        arrival.push(owner);
                    }
                }
            },
            "both waiters' first calls",
        )
        .await;
        wait_until(Duration::from_secs(5), "both waiters to wait", || {
            let mut c = clients[1].clone();
            async move {
                let d = c
                    .describe(pb::SemaphoreServiceDescribeRequest {
                        name: "pool".into(),
                    })
                    .await
                    .expect("Describe")
                    .into_inner();
                if d.waiters == 2 { Ok(()) } else { Err(d) }
            }
        })
        .await;
        let mut token = holder.token;
        let mut served = Vec::new();
        for _ in 0..2 {
            holder_client
                .release(pb::SemaphoreServiceReleaseRequest {
                    name: "pool".into(),
                    token,
                })
                .await
                .expect("Release");
            let permit = within(Duration::from_secs(5), rx.recv(), "the next grant")
                .await
                .expect("a grant");
            served.push(permit.owner);
            token = permit.token;
        }
        holder_client
            .release(pb::SemaphoreServiceReleaseRequest {
                name: "pool".into(),
                token,
            })
            .await
            .expect("Release");
        if served != arrival {
            mismatches.push(format!(
                "round {round}: arrived {arrival:?}, served {served:?}"
            ));
        }
    }
    assert!(mismatches.is_empty(), "{mismatches:#?}");
}
