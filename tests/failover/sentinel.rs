//! Redis Sentinel: a failover during contention, fencing with `--min-replicas-ack`, a leader
//! election through a failover, a manual failover that leaves the old master running, a frozen
//! first Sentinel, and errors that name the address.

use super::*;

// ---------------------------------------------------------------------------------------------
// Sentinel failover during contention
// ---------------------------------------------------------------------------------------------

/// Sentinel: four locks held through Hold streams (ttl 2 s) and two waiters on each; SIGKILL of
/// the master. Baton follows the promoted replica within a measured bound (its first successful
/// acquire trails the Sentinels' promotion by little), every Hold stream reports `lost`
/// (UNCONFIRMED or NOT_HELD) before its lease could expire, every waiter ends by its deadline
/// with the lock or a clear error, and the locks can be acquired again on the new master with
/// higher fencing tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_during_contention() {
    const LOCKS: usize = 4;
    const WAITERS: usize = 2;
    const WAIT_MS: u64 = 5_000;
    let mut sentinels = SentinelDeployment::start().await;
    let baton = Baton::start_on(sentinel_config(&sentinels), |_| {}).await;
    let client = baton.client().await;

    let names: Vec<String> = (0..LOCKS).map(|i| format!("contended-{i}")).collect();
    let mut holds = Vec::new();
    for name in &names {
        holds.push(hold_lock(&mut client.clone(), name, FAILOVER_TTL_MS).await);
    }
    let mut waiters = Vec::new();
    for name in &names {
        for _ in 0..WAITERS {
            waiters.push((name.clone(), spawn_waiter(&client, name, 2_000, WAIT_MS)));
        }
    }
    for name in &names {
        wait_until(
            Duration::from_secs(5),
            &format!("the waiters of {name} to wait"),
            || {
                let mut client = client.clone();
                let name = name.clone();
                async move {
                    match describe_lock(&mut client, &name).await {
                        Ok(d) if d.held && d.waiters as usize == WAITERS => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                }
            },
        )
        .await;
    }

    let probes: Vec<String> = (0..5_000).map(|i| format!("probe-{i}")).collect();
    let killed_at = Instant::now();
    let old = sentinels.kill_master();
    let (promoted, followed_at) = tokio::join!(
        async {
            let addr = sentinels.wait_for_failover(Duration::from_secs(20)).await;
            (addr, Instant::now())
        },
        first_acquire(&client, &probes, Duration::from_secs(20)),
    );
    let (new, promoted_at) = promoted;
    let promotion = promoted_at - killed_at;
    let follow = followed_at - killed_at;
    println!(
        "sentinel failover {old} -> {new}: a Sentinel client sees it {promotion:?} after SIGKILL; \
         Baton's first successful acquire {follow:?} after SIGKILL"
    );
    assert!(
        follow < SENTINEL_FOLLOW_BOUND,
        "Baton followed the new master only {follow:?} after the kill"
    );
    assert!(
        follow.saturating_sub(promotion) < SENTINEL_FOLLOW_LAG,
        "Baton followed {:?} after the Sentinels promoted the replica",
        follow - promotion
    );

    // Every Hold stream spoke before its lease could expire: a loss report (or, had the lease
    // survived, a renewal confirmed by the new master).
    let streams: Vec<&Watched> = holds.iter().collect();
    wait_all_spoke(
        &streams,
        killed_at,
        "every Hold stream to speak after the kill",
    )
    .await;
    for hold in &holds {
        let seen = hold.assert_spoke_in_time(killed_at);
        let margin = hold.expiry_vouched_before(killed_at) - seen.at();
        println!(
            "  {}: {} {:?} after SIGKILL, {margin:?} before the lease could expire",
            hold.name,
            seen.summary(),
            seen.at() - killed_at,
        );
    }

    // Every waiter ended by its deadline, with the lock, with `acquired = false`, or with an error
    // that says what happened.
    for (name, waiter) in waiters {
        let (outcome, took, ended_at) = within(
            Duration::from_millis(WAIT_MS) + Duration::from_secs(3),
            waiter,
            &format!("a waiter on {name} to end"),
        )
        .await
        .expect("the waiter task");
        println!(
            "  waiter on {name} (wait {WAIT_MS} ms): {outcome:?}, {:?} after SIGKILL",
            ended_at - killed_at
        );
        assert!(
            took < Duration::from_millis(WAIT_MS + 1_000),
            "a waiter on {name} ended {took:?} after it started, past its deadline"
        );
        match outcome {
            WaitOutcome::Acquired(token) => {
                let hold = holds.iter().find(|h| h.name == name).expect("its hold");
                assert!(token > hold.fencing_token, "{name}: {token}");
            }
            WaitOutcome::NotAcquired => {}
            WaitOutcome::Failed(code, message) => assert!(
                matches!(code, Code::Unavailable | Code::DeadlineExceeded),
                "a waiter on {name} failed with {code:?}: {message}"
            ),
        }
    }

    // The locks can be taken again on the new master, with higher fencing tokens.
    for hold in &holds {
        let r = client
            .clone()
            .acquire(lock_request(&hold.name, 1_000, 4_000))
            .await
            .unwrap_or_else(|s| panic!("{} after the failover: {s:?}", hold.name))
            .into_inner();
        assert!(r.acquired, "{} after the failover: {r:?}", hold.name);
        let token = r.lease.expect("lease").fencing_token;
        assert!(token > hold.fencing_token, "{}: {token}", hold.name);
    }
    assert!(
        failovers_counted("sentinel") >= 1.0,
        "the new master is counted as a failover"
    );
}

// ---------------------------------------------------------------------------------------------
// Fencing with --min-replicas-ack 1
// ---------------------------------------------------------------------------------------------

/// Every grant made by one loop: its fencing token and when it arrived, and why the other
/// attempts were not granted.
#[derive(Default)]
struct Grants {
    granted: Vec<(Instant, u64)>,
    refused: Vec<(Instant, String)>,
    /// Grants whose release failed (the master died meanwhile): token and fencing token.
    unreleased: Vec<(String, u64)>,
}

/// Acquires and releases one permit of `name` every 20 ms until `stop`.
fn grant_loop(
    client: &SemaphoreServiceClient<Channel>,
    name: &str,
    stop: Arc<AtomicBool>,
) -> (JoinHandle<()>, Arc<Mutex<Grants>>) {
    let grants: Arc<Mutex<Grants>> = Arc::default();
    let log = grants.clone();
    let mut client = client.clone();
    let name = name.to_owned();
    let task = tokio::spawn(async move {
        let mut pace = tokio::time::interval(Duration::from_millis(20));
        while !stop.load(Ordering::Relaxed) {
            pace.tick().await;
            let attempt = tokio::time::timeout(
                Duration::from_secs(3),
                client.acquire(permit_request(&name, 100, 10_000, 0)),
            )
            .await;
            let at = Instant::now();
            match attempt {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    match r.permit {
                        Some(permit) if r.acquired => {
                            log.lock().unwrap().granted.push((at, permit.fencing_token));
                            let released = client
                                .release(pb::SemaphoreServiceReleaseRequest {
                                    name: name.clone(),
                                    token: permit.token.clone(),
                                })
                                .await;
                            if released.is_err() {
                                log.lock()
                                    .unwrap()
                                    .unreleased
                                    .push((permit.token, permit.fencing_token));
                            }
                        }
                        _ => log
                            .lock()
                            .unwrap()
                            .refused
                            .push((at, "not acquired".into())),
                    }
                }
                Ok(Err(s)) => {
                    println!("{name}: Acquire failed: {s:?}");
                    log.lock()
                        .unwrap()
                        .refused
                        .push((at, format!("{:?}", s.code())));
                }
                Err(_) => log.lock().unwrap().refused.push((at, "no answer".into())),
            }
        }
    });
    (task, grants)
}

/// Stops a [`grant_loop`] (after the attempt in flight) and returns what it recorded.
async fn stop_grants(task: JoinHandle<()>, log: Arc<Mutex<Grants>>, stop: &AtomicBool) -> Grants {
    stop.store(true, Ordering::Relaxed);
    within(Duration::from_secs(5), task, "the grant loop to stop")
        .await
        .expect("the grant loop");
    std::mem::take(&mut *log.lock().unwrap())
}

fn count_by_reason(refused: &[(Instant, String)]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for (_, reason) in refused {
        *counts.entry(reason.clone()).or_default() += 1;
    }
    counts
}

/// With `--min-replicas-ack 1` over Sentinel: a grant the replica cannot acknowledge (the
/// replica frozen by SIGSTOP, then a new master without a replica) is rolled back and reported as
/// not acquired, leaving no lease in Redis; the grants acknowledged before the master is killed
/// survive the failover (holders and the last fencing token are on the new master), and the
/// fencing tokens issued after the failover are greater than every token issued before it.
/// (Semaphores only: the lock service does not use `eval_acked` yet.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_fencing_with_replica_acks() {
    let mut sentinels = SentinelDeployment::start().await;
    let baton = Baton::start_on(sentinel_config(&sentinels), |c| {
        c.redis.min_replicas_ack = 1;
        // Generous for a loaded CI machine: a healthy replica acknowledges in well under 1 ms.
        c.redis.replica_ack_timeout = Duration::from_millis(250);
    })
    .await;
    let client = baton.semaphore_client().await;
    let prefix = baton.prefix().to_owned();

    // Rollback: the replica is frozen, so neither a unary acquire nor a Hold is granted, and
    // nothing is left in Redis.
    {
        let _frozen = testkit::freeze(sentinels.replica_pid().expect("the replica runs"));
        let started = Instant::now();
        let (mut c1, mut c2) = (client.clone(), client.clone());
        let (unary, hold) = tokio::join!(
            c1.acquire(permit_request("rollback", 3, 10_000, 0)),
            c2.hold(pb::SemaphoreServiceHoldRequest {
                name: "rollback".into(),
                limit: 3,
                permits: 1,
                ttl: Some(ms(10_000)),
                ..Default::default()
            }),
        );
        let took = started.elapsed();
        let unary = unary.expect("Acquire answers").into_inner();
        assert!(!unary.acquired, "granted without a replica ack: {unary:?}");
        let first = hold
            .expect("Hold answers")
            .into_inner()
            .message()
            .await
            .expect("a Hold event")
            .expect("a Hold event");
        assert!(
            matches!(first.event, Some(SemEvent::NotAcquired(_))),
            "{first:?}"
        );
        println!("replica frozen: acquire and Hold reported not acquired in {took:?}");
    }
    let d = describe_semaphore(&mut client.clone(), "rollback")
        .await
        .expect("Describe");
    assert_eq!((d.holder_count, d.permits_in_use), (0, 0), "{d:?}");
    let mut master = sentinels.master_client().await;
    let holders: u64 = redis::cmd("ZCARD")
        .arg(format!("{}:holders", sem_key(&prefix, "rollback")))
        .query_async(&mut master)
        .await
        .expect("ZCARD");
    assert_eq!(holders, 0, "a rolled-back lease was left in Redis");

    // The replica is back: grants are acknowledged again.
    wait_until(
        Duration::from_secs(5),
        "an acknowledged grant once the replica is thawed",
        || {
            let mut client = client.clone();
            async move {
                match client.acquire(permit_request("kept", 5, 30_000, 0)).await {
                    Ok(r) if r.get_ref().acquired => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await;
    let kept = client
        .clone()
        .acquire(permit_request("kept", 5, 30_000, 0))
        .await
        .expect("Acquire")
        .into_inner();
    assert!(kept.acquired, "{kept:?}");

    // Grants, then SIGKILL of the master while they go on.
    let stop = Arc::new(AtomicBool::new(false));
    let (task, log) = grant_loop(&client, "fenced", stop.clone());
    wait_until(Duration::from_secs(5), "grants before the kill", || {
        let n = log.lock().unwrap().granted.len();
        async move { if n >= 10 { Ok(()) } else { Err(n) } }
    })
    .await;
    sentinels.kill_master();
    let before = stop_grants(task, log, &stop).await;
    sentinels.wait_for_failover(Duration::from_secs(20)).await;

    // What was acknowledged survived: the first call on the new master (a read) finds the last
    // fencing token issued before the kill, and the two holders of "kept".
    let fenced = wait_until(
        Duration::from_secs(5),
        "Describe through Baton on the new master",
        || {
            let mut client = client.clone();
            async move {
                describe_semaphore(&mut client, "fenced")
                    .await
                    .map_err(|s| format!("{s:?}"))
            }
        },
    )
    .await;
    let last_before = before
        .granted
        .iter()
        .map(|(_, t)| *t)
        .max()
        .expect("grants before the kill");
    // A grant that ran and was acknowledged by the replica but whose answer the kill cut off
    // can leave a later token there; an acknowledged one is never missing.
    assert!(
        fenced.fencing_token == last_before
            || (fenced.fencing_token > last_before && !before.refused.is_empty()),
        "the new master's last fencing token {} is not the last one acknowledged before the kill \
         ({last_before}; attempts without a grant: {:?})",
        fenced.fencing_token,
        count_by_reason(&before.refused)
    );
    let kept_now = describe_semaphore(&mut client.clone(), "kept")
        .await
        .expect("Describe");
    assert_eq!(
        kept_now.holder_count, 2,
        "acknowledged leases lost: {kept_now:?}"
    );
    // Who holds "fenced" on the new master: grants whose release the kill cut off, at most the
    // last grant before the kill, whose release Redis answered before the replica had it (a
    // release is not waited for; every earlier release reached the replica before the next
    // grant's acknowledgement did), and at most the grant in flight at the kill, acknowledged
    // but unanswered (Baton releases it in the background). Those are held until their ttl at
    // worst: safe, never over the limit.
    let allowed: Vec<u64> = before
        .unreleased
        .iter()
        .map(|(_, fencing)| *fencing)
        .chain([last_before])
        .collect();
    let unanswered = !before.refused.is_empty();
    for holder in &fenced.holders {
        assert!(
            allowed.contains(&holder.fencing_token)
                || (unanswered && holder.fencing_token > last_before),
            "a holder that was never granted, or whose release was acknowledged by the replica: \
             {holder:?} (allowed {allowed:?}, or a later token after an attempt without an \
             answer: {unanswered})"
        );
    }
    assert!(
        fenced.holder_count as usize <= before.unreleased.len() + 1 + usize::from(unanswered),
        "{fenced:?}"
    );
    let mut still_held = 0;
    for (token, _) in &before.unreleased {
        let r = client
            .clone()
            .release(pb::SemaphoreServiceReleaseRequest {
                name: "fenced".into(),
                token: token.clone(),
            })
            .await
            .expect("Release")
            .into_inner();
        still_held += usize::from(r.was_held);
    }
    let cut_off = fenced
        .holders
        .iter()
        .filter(|h| before.unreleased.iter().any(|(_, f)| *f == h.fencing_token))
        .count();
    assert_eq!(
        still_held, cut_off,
        "a release found a different set of holders than Describe"
    );

    // The new master has no replica: grants cannot be acknowledged, so they are rolled back and
    // reported as not acquired. On a loaded machine an attempt may also fail UNAVAILABLE (the
    // Sentinels still settling, a command timeout; the grant loop prints each one): never
    // granted, and at least five rollbacks are seen.
    stop.store(false, Ordering::Relaxed);
    let (task, log) = grant_loop(&client, "fenced", stop.clone());
    wait_until(
        Duration::from_secs(10),
        "attempts on the new master without a replica",
        || {
            let n = log
                .lock()
                .unwrap()
                .refused
                .iter()
                .filter(|(_, r)| r == "not acquired")
                .count();
            async move { if n >= 5 { Ok(()) } else { Err(n) } }
        },
    )
    .await;
    let alone = stop_grants(task, log, &stop).await;
    assert!(
        alone.granted.is_empty(),
        "granted without a replica: {:?}",
        alone.granted
    );
    assert!(
        alone
            .refused
            .iter()
            .all(|(_, r)| r == "not acquired" || r == "Unavailable"),
        "{:?}",
        count_by_reason(&alone.refused)
    );
    let d = describe_semaphore(&mut client.clone(), "fenced")
        .await
        .expect("Describe");
    assert_eq!(
        (d.holder_count, d.permits_in_use),
        (0, 0),
        "a rolled-back lease was left in Redis: {d:?}"
    );

    // The old master comes back as the replica: grants go on, with higher tokens.
    let rejoined = Instant::now();
    sentinels.restart_old_master_as_replica().await;
    println!("old master back as a replica in {:?}", rejoined.elapsed());
    stop.store(false, Ordering::Relaxed);
    let (task, log) = grant_loop(&client, "fenced", stop.clone());
    wait_until(Duration::from_secs(5), "grants after the failover", || {
        let n = log.lock().unwrap().granted.len();
        async move { if n >= 10 { Ok(()) } else { Err(n) } }
    })
    .await;
    let after = stop_grants(task, log, &stop).await;

    let tokens: Vec<u64> = before
        .granted
        .iter()
        .chain(&after.granted)
        .map(|(_, t)| *t)
        .collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens went backwards: {tokens:?}"
    );
    let first_after = after.granted.first().expect("grants after").1;
    println!(
        "fencing: {} grants acknowledged before the kill (last token {last_before}; the new \
         master's last token at promotion {}; {} holders there, {} releases cut off by the kill); \
         without a replica {} attempts rolled back; {} grants after the failover (first token \
         {first_after})",
        before.granted.len(),
        fenced.fencing_token,
        fenced.holder_count,
        before.unreleased.len(),
        alone.refused.len(),
        after.granted.len(),
    );
    assert!(first_after > last_before);
}

// ---------------------------------------------------------------------------------------------
// Leader election through a Sentinel failover
// ---------------------------------------------------------------------------------------------

/// The next event of a `Campaign` stream within `limit`, which must be `elected`.
async fn elected(
    stream: &mut tonic::Streaming<pb::ElectionServiceCampaignResponse>,
    limit: Duration,
) -> pb::ElectionElected {
    match within(limit, stream.message(), "elected").await {
        Ok(Some(pb::ElectionServiceCampaignResponse {
            event: Some(ElectionEvent::Elected(e)),
        })) => e,
        other => panic!("expected elected, got {other:?}"),
    }
}

/// Sentinel: a leader (ttl 2 s) and an observer; SIGKILL of the master. The leader's stream
/// reports `lost` before its leadership could have expired; once the replica is promoted, a
/// campaign through the same Baton is elected with a term greater than the old leader's (terms
/// are floored at the Redis clock, so this holds even if the replica missed the last term), and
/// an observer sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_elects_again_with_a_higher_term() {
    let mut sentinels = SentinelDeployment::start().await;
    let baton = Baton::start_on(sentinel_config(&sentinels), |_| {}).await;
    let mut client = ElectionServiceClient::new(support::channel(baton.addr()).await);
    let request = |value: &str| pb::ElectionServiceCampaignRequest {
        name: "primary".into(),
        value: value.as_bytes().to_vec(),
        ttl: Some(ms(FAILOVER_TTL_MS)),
    };
    let mut old = client
        .campaign(request("old"))
        .await
        .expect("Campaign")
        .into_inner();
    let first = elected(&mut old, Duration::from_secs(5)).await;
    let (mut confirmed_at, mut valid_for) = (Instant::now(), ms_of(&first.remaining_ttl));

    let killed_at = Instant::now();
    sentinels.kill_master();
    let (lost, renewals) =
        read_until_lost(&mut old, Duration::from_secs(5), "the old leader's lost").await;
    let lost_at = Instant::now();
    if let Some((at, r)) = renewals.last() {
        (confirmed_at, valid_for) = (*at, ms_of(&r.remaining_ttl));
    }
    println!(
        "old leader: {:?} {:?} after SIGKILL, {:?} before it could have expired",
        lost.reason(),
        lost_at - killed_at,
        (confirmed_at + valid_for).saturating_duration_since(lost_at)
    );
    assert!(
        lost_at < confirmed_at + valid_for,
        "lost came after the leadership could have expired"
    );

    // Candidates told UNAVAILABLE while Baton follows the failover campaign again.
    let deadline = Instant::now() + SENTINEL_FOLLOW_BOUND;
    let next = loop {
        assert!(
            Instant::now() < deadline,
            "no election within {SENTINEL_FOLLOW_BOUND:?} of the kill"
        );
        let mut stream = client
            .campaign(request("new"))
            .await
            .expect("Campaign opens its stream")
            .into_inner();
        match within(SENTINEL_FOLLOW_BOUND, stream.message(), "a campaign").await {
            Ok(Some(pb::ElectionServiceCampaignResponse {
                event: Some(ElectionEvent::Elected(e)),
            })) => break (e, stream),
            Err(status) if status.code() == Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("a campaign during the failover: {other:?}"),
        }
    };
    let (next, _leading) = next;
    println!(
        "elected again {:?} after SIGKILL, term {} > {}",
        killed_at.elapsed(),
        next.term,
        first.term
    );
    assert!(next.term > first.term);
    let mut observer = client
        .observe(pb::ElectionServiceObserveRequest {
            name: "primary".into(),
        })
        .await
        .expect("Observe")
        .into_inner();
    let seen = within(Duration::from_secs(5), observer.message(), "the observer")
        .await
        .expect("Observe")
        .expect("a state");
    let leader = seen.leader.expect("a leader");
    assert_eq!((leader.term, leader.value), (next.term, b"new".to_vec()));
}

/// A proto duration as a std one.
fn ms_of(d: &Option<prost_types::Duration>) -> Duration {
    std_duration(d.as_ref().expect("a duration"))
}

// ---------------------------------------------------------------------------------------------
// Manual failover: the old master keeps running
// ---------------------------------------------------------------------------------------------

/// How long after the promotion the second Baton keeps trying to take the lock: past the moment
/// the Sentinels turn the old master into a replica (their next `INFO` of it, up to 10 s later),
/// so that a Baton still talking to the old master is caught.
const MANUAL_FAILOVER_WATCH: Duration = Duration::from_secs(12);

/// Sentinel: `SENTINEL FAILOVER` while a Hold stream (ttl 2 s) is open on Baton A. The old master
/// keeps running and says it is the master until the Sentinels reconfigure it, up to 10 s later;
/// A must move to the promoted replica meanwhile. Its stream either keeps the lease there (the
/// key is on the new master) or reports `lost` before the lease could expire, and Baton C,
/// started after the failover, never acquires the lock while A's stream vouches for its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_manual_failover_leaves_the_old_master() {
    const NAME: &str = "manual";
    let mut sentinels = SentinelDeployment::start().await;
    let a = Baton::start_on(sentinel_config(&sentinels), |_| {}).await;
    let hold = hold_lock(&mut a.client().await, NAME, FAILOVER_TTL_MS).await;
    let granted_at = hold.granted.0;
    wait_until(Duration::from_secs(5), "a first renewal", || {
        let renewed = hold.renewed_after(granted_at);
        async move { if renewed { Ok(()) } else { Err("none") } }
    })
    .await;

    let failover_at = Instant::now();
    let old = sentinels.manual_failover().await;
    let new = sentinels.wait_for_failover(Duration::from_secs(20)).await;
    let promoted_at = Instant::now();
    println!(
        "manual failover {old} -> {new}: seen {:?} after SENTINEL FAILOVER",
        promoted_at - failover_at
    );

    let c = Baton::start_on(sentinel_config(&sentinels), |tweak| {
        tweak.redis.key_prefix = a.prefix().to_owned();
    })
    .await;
    let mut other = c.client().await;
    let mut pace = tokio::time::interval(Duration::from_millis(100));
    let mut attempts = 0;
    let mut taken = None;
    while promoted_at.elapsed() < MANUAL_FAILOVER_WATCH {
        pace.tick().await;
        let sent = Instant::now();
        let attempt = tokio::time::timeout(
            Duration::from_secs(3),
            other.acquire(lock_request(NAME, 1_000, 0)),
        )
        .await;
        attempts += 1;
        if let Ok(Ok(r)) = attempt
            && r.get_ref().acquired
        {
            taken = Some((sent, Instant::now()));
            break;
        }
    }
    let events = hold.events();
    let lost_at = events.iter().find_map(|e| match e {
        Seen::Lost { at, .. } | Seen::Failed { at, .. } | Seen::Ended { at } => Some(*at),
        Seen::Renewed { .. } => None,
    });
    println!("A's stream: {events:?}; C's attempts: {attempts}, taken: {taken:?}");

    match taken {
        Some((sent, answered)) => {
            // A's stream must no longer vouch for its lease when C was granted it.
            let vouched = hold.expiry_vouched_before(sent);
            assert!(
                lost_at.is_some_and(|lost| lost < answered) || vouched < answered,
                "Baton C acquired {NAME} {:?} after the promotion while Baton A's stream still \
                 held it ({:?} of its lease left, no `lost` before): two holders of one lock \
                 (A's events: {events:?})",
                answered - promoted_at,
                vouched - answered,
            );
        }
        None => {
            // A kept the lease: on the new master, where its renewals went.
            hold.assert_kept();
            assert!(
                hold.renewed_after(promoted_at + Duration::from_secs(3)),
                "A's stream stopped renewing: {events:?}"
            );
            let mut conn = redis::Client::open(format!("redis://{new}"))
                .expect("a client")
                .get_multiplexed_async_connection()
                .await
                .expect("a connection to the new master");
            let pttl: i64 = redis::cmd("PTTL")
                .arg(a.lock_key(NAME))
                .query_async(&mut conn)
                .await
                .expect("PTTL");
            assert!(
                pttl > 0,
                "A's stream says it holds {NAME}, but its key is not on the new master {new} \
                 (PTTL {pttl})"
            );
        }
    }
    // Any `lost` came before the lease could have expired.
    if let Some(Seen::Lost { at, .. }) = events.iter().find(|e| matches!(e, Seen::Lost { .. })) {
        assert!(
            *at < hold.expiry_vouched_before(*at),
            "A reported `lost` only after its lease could have expired: {events:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// A frozen Sentinel
// ---------------------------------------------------------------------------------------------

/// How soon a Baton whose first Sentinel is frozen must serve: it asks every Sentinel at once,
/// so the frozen one costs nothing but its own answer. Generous for a loaded machine.
const FROZEN_SENTINEL_BOUND: Duration = Duration::from_secs(4);

/// Sentinel: the first-listed Sentinel frozen (SIGSTOP: its port accepts connections and never
/// answers). A fresh Baton still finds the master through the two others and serves within a
/// couple of seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_frozen_first_sentinel_does_not_hide_the_others() {
    let sentinels = SentinelDeployment::start().await;
    let first = sentinels.sentinel_pids()[0];
    let _frozen = support::freeze(first);
    let started = Instant::now();
    let baton = Baton::start_on(sentinel_config(&sentinels), |_| {}).await;
    let probes: Vec<String> = (0..200).map(|i| format!("frozen-probe-{i}")).collect();
    let served = first_acquire(&baton.client().await, &probes, Duration::from_secs(10)).await;
    let took = served - started;
    println!("with the first Sentinel frozen, Baton served {took:?} after it started");
    assert!(
        took < FROZEN_SENTINEL_BOUND,
        "Baton served only {took:?} after it started"
    );
}

// ---------------------------------------------------------------------------------------------
// Errors that say what is wrong
// ---------------------------------------------------------------------------------------------

/// Sentinel mode's failures name the address and what was expected there: a plain Redis given
/// as a Sentinel, and Sentinels that are all down, each answer UNAVAILABLE saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_errors_name_the_address() {
    let plain = support::RedisServer::start_standalone().await;
    let Topology::Standalone { url } = plain.topology() else {
        panic!("a standalone server")
    };
    let down = format!("127.0.0.1:{}", support::free_port());
    for (sentinels, expected) in [
        (vec![url.clone()], "is not a Sentinel"),
        (vec![format!("redis://{down}")], "Sentinel 127.0.0.1:"),
    ] {
        let baton = Baton::start_unready(&plain, |config| {
            config.redis.topology = Topology::Sentinel {
                sentinels: sentinels.clone(),
                master: "baton".into(),
                node_url: None,
            };
        })
        .await;
        let status = baton
            .client()
            .await
            .acquire(lock_request("misconfigured", 1_000, 0))
            .await
            .expect_err("no master to serve from");
        println!("{sentinels:?}: {:?} {}", status.code(), status.message());
        let address = sentinels[0].trim_start_matches("redis://");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(
            status.message().contains(expected) && status.message().contains(address),
            "{sentinels:?}: {}",
            status.message()
        );
    }
}
