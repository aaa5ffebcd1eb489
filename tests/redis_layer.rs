//! What Baton promises about its use of Redis: scripts survive a script-cache flush, every key it
//! writes expires, one pub/sub connection serves all local waiters, and connections Redis closed
//! while idle carry no call.

mod support;

use std::time::Duration;

use baton::{
    config::RedisConfig,
    proto::v1::{self as pb, lock_service_client::LockServiceClient},
    redis::{Endpoint, Notifier, Redis, Source, Subscription, Topology, Wake},
};
use support::{Baton, RedisServer, ms, topology::RedisCluster, wait_until, within};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

type Client = LockServiceClient<Channel>;

fn request(name: &str, ttl_ms: u64, wait_ms: Option<u64>) -> pb::LockServiceAcquireRequest {
    pb::LockServiceAcquireRequest {
        name: name.to_owned(),
        ttl: Some(ms(ttl_ms)),
        wait_timeout: wait_ms.map(ms),
        owner: String::new(),
        ..Default::default()
    }
}

async fn acquire(client: &mut Client, name: &str, ttl_ms: u64) -> pb::LockLease {
    let reply = client
        .acquire(request(name, ttl_ms, None))
        .await
        .expect("Acquire")
        .into_inner();
    assert!(reply.acquired, "{name} should be free");
    reply.lease.expect("a lease")
}

/// After `SCRIPT FLUSH` empties Redis's script cache, every RPC still works: scripts are called by
/// SHA and loaded again on `NOSCRIPT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_reload_after_script_flush() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut conn = redis.client().await;

    let lease = acquire(&mut client, "flushed", 5_000).await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("SCRIPT FLUSH");

    let refreshed = client
        .refresh(pb::LockServiceRefreshRequest {
            name: "flushed".into(),
            token: lease.token.clone(),
            ttl: Some(ms(7_000)),
        })
        .await
        .expect("Refresh after SCRIPT FLUSH")
        .into_inner();
    assert_eq!(refreshed.remaining_ttl, Some(ms(7_000)));
    let described = client
        .describe(pb::LockServiceDescribeRequest {
            name: "flushed".into(),
        })
        .await
        .expect("Describe after SCRIPT FLUSH")
        .into_inner();
    assert!(described.held);
    let released = client
        .release(pb::LockServiceReleaseRequest {
            name: "flushed".into(),
            token: lease.token,
        })
        .await
        .expect("Release after SCRIPT FLUSH")
        .into_inner();
    assert!(released.was_held);

    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("SCRIPT FLUSH");
    acquire(&mut client, "flushed", 5_000).await;

    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO commandstats");
    assert!(
        stats.contains("cmdstat_evalsha:"),
        "scripts are called by SHA:\n{stats}"
    );
}

/// Every key Baton writes carries an expiry, including the fencing counter and the waiter set,
/// whatever mix of calls made it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_written_expires() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;

    // A held lock, a released one, a reentered one, and one with a caller waiting on it.
    acquire(&mut client, "held", 60_000).await;
    let lease = acquire(&mut client, "released", 60_000).await;
    client
        .release(pb::LockServiceReleaseRequest {
            name: "released".into(),
            token: lease.token,
        })
        .await
        .expect("Release");
    for _ in 0..2 {
        client
            .acquire(pb::LockServiceAcquireRequest {
                owner: "reentrant".into(),
                ..request("reentered", 60_000, None)
            })
            .await
            .expect("Acquire");
    }
    let mut waiter = baton.client().await;
    let waiting = tokio::spawn(async move {
        waiter
            .acquire(request("held", 1_000, Some(3_000)))
            .await
            .map(|r| r.into_inner().acquired)
    });

    let mut conn = redis.client().await;
    let pattern = format!("{}*", baton.prefix());
    let keys: Vec<String> = wait_until(
        Duration::from_secs(2),
        "the waiter's entry to be written",
        || {
            let mut conn = conn.clone();
            let pattern = pattern.clone();
            async move {
                let keys: Vec<String> = redis::cmd("KEYS")
                    .arg(&pattern)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if keys.iter().any(|k| k.ends_with(":waiters")) {
                    Ok(keys)
                } else {
                    Err(format!("{keys:?}"))
                }
            }
        },
    )
    .await;
    assert!(
        keys.iter().any(|k| k.ends_with(":fence")),
        "grants left fencing counters: {keys:?}"
    );
    for key in &keys {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert!(pttl > 0, "{key} has no expiry (PTTL {pttl})");
    }
    let acquired = within(Duration::from_secs(5), waiting, "the waiter to give up")
        .await
        .expect("waiter task")
        .expect("Acquire with a wait");
    assert!(!acquired, "the lock stays held for 60 s");
    let waiters: i64 = redis::cmd("EXISTS")
        .arg(format!("{}:waiters", baton.lock_key("held")))
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert_eq!(waiters, 0, "the waiter set expires with the last wait");

    let all: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .expect("KEYS *");
    assert!(
        all.iter().all(|k| k.starts_with(baton.prefix())),
        "every key is under the key prefix: {all:?}"
    );
}

/// Twenty callers waiting on ten different locks share one pub/sub connection to Redis, each lock's
/// channel has exactly one subscriber, and the subscriptions are dropped when nobody waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_subscriber_connection_for_all_waiters() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let mut client = baton.client().await;
    let mut conn = redis.client().await;

    let mut leases = Vec::new();
    for i in 0..10 {
        let name = format!("busy-{i}");
        leases.push((name.clone(), acquire(&mut client, &name, 60_000).await));
    }
    let mut waiters = JoinSet::new();
    for i in 0..20 {
        let mut c = baton.client().await;
        let name = format!("busy-{}", i % 10);
        waiters.spawn(async move {
            c.acquire(request(&name, 500, Some(20_000)))
                .await
                .map(|r| r.into_inner().acquired)
        });
    }

    let channels: Vec<String> = leases
        .iter()
        .map(|(name, _)| format!("{}:released", baton.lock_key(name)))
        .collect();
    wait_until(
        Duration::from_secs(5),
        "every lock's channel to have its subscriber",
        || {
            let mut conn = conn.clone();
            let channels = channels.clone();
            async move {
                let mut cmd = redis::cmd("PUBSUB");
                cmd.arg("NUMSUB").arg(&channels);
                let counts: Vec<(String, i64)> = cmd
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if counts.iter().all(|(_, n)| *n == 1) {
                    Ok(())
                } else {
                    Err(format!("{counts:?}"))
                }
            }
        },
    )
    .await;
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut conn)
        .await
        .expect("CLIENT LIST");
    assert_eq!(
        clients.lines().count(),
        1,
        "one pub/sub connection:\n{clients}"
    );

    for (name, lease) in &leases {
        client
            .release(pb::LockServiceReleaseRequest {
                name: name.clone(),
                token: lease.token.clone(),
            })
            .await
            .expect("Release");
    }
    // Each release wakes its lock's two waiters: one gets the lock and never releases it, so the
    // other gets it at that lease's expiry (500 ms). All twenty end acquired.
    let mut acquired = 0;
    while let Some(result) = within(
        Duration::from_secs(15),
        waiters.join_next(),
        "the waiters to finish",
    )
    .await
    {
        if result.expect("waiter task").expect("Acquire") {
            acquired += 1;
        }
    }
    assert_eq!(acquired, 20);

    wait_until(
        Duration::from_secs(5),
        "the subscriptions to be dropped once nobody waits",
        || {
            let mut conn = conn.clone();
            async move {
                let channels: Vec<String> = redis::cmd("PUBSUB")
                    .arg("CHANNELS")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                if channels.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{channels:?}"))
                }
            }
        },
    )
    .await;
}

/// A notifier of its own on `redis`, stopped when the returned guard drops.
fn notifier(redis: &RedisServer) -> (Notifier, tokio_util::sync::DropGuard) {
    notifier_within(redis, Duration::from_secs(2))
}

/// A notifier of its own on `redis` with the command timeout `timeout`, stopped when the returned
/// guard drops.
fn notifier_within(
    redis: &RedisServer,
    timeout: Duration,
) -> (Notifier, tokio_util::sync::DropGuard) {
    notifier_at(redis.url(), timeout)
}

/// A notifier of its own on the Redis at `url` with the command timeout `timeout`, stopped when
/// the returned guard drops.
fn notifier_at(url: String, timeout: Duration) -> (Notifier, tokio_util::sync::DropGuard) {
    let topology = Topology::Standalone { url };
    let endpoint = Endpoint::new(&topology)
        .expect("an endpoint")
        .expect("a single Redis has a fixed endpoint");
    let shutdown = CancellationToken::new();
    let notifier = Notifier::start(Source::Node(endpoint), timeout, shutdown.clone());
    (notifier, shutdown.drop_guard())
}

/// The channels `conn`'s Redis has subscribers on.
async fn subscribed_channels(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<Vec<String>, String> {
    redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())
}

/// Subscriptions that Redis confirms too late (it was frozen) fail, and once Redis answers again
/// none of their channels stays subscribed: Redis carries each `SUBSCRIBE` out all the same, and
/// the notifier unsubscribes the channels nobody waits on. Each channel has a second waiter that
/// joins while the first one's subscription is in flight, so the channel still has a waiter when
/// the command's time runs out and the failure is answered. A channel subscribed afterwards
/// works, and goes when its waiter leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_confirmed_too_late_are_given_up() {
    const CHANNELS: usize = 20;
    let redis = RedisServer::start().await;
    let timeout = Duration::from_millis(400);
    let (notifier, _stop) = notifier_within(&redis, timeout);
    let conn = redis.client().await;
    // Connected before Redis freezes.
    drop(notifier.subscribe("warm-up").await.expect("subscribe"));

    let frozen = testkit::freeze(redis.pid().expect("redis is running"));
    let mut waiters = JoinSet::new();
    for round in 0..2 {
        if round == 1 {
            tokio::time::sleep(timeout / 2).await;
        }
        for i in 0..CHANNELS {
            let notifier = notifier.clone();
            waiters.spawn(async move { notifier.subscribe(&format!("late-{i}")).await.map(drop) });
        }
    }
    let mut failed = 0;
    while let Some(result) = within(
        Duration::from_secs(10),
        waiters.join_next(),
        "the subscriptions to give up",
    )
    .await
    {
        if result.expect("waiter task").is_err() {
            failed += 1;
        }
    }
    drop(frozen);
    assert_eq!(
        failed,
        2 * CHANNELS,
        "every subscription failed while Redis was frozen"
    );

    no_channel_left(&conn, "no channel to stay subscribed once nobody waits").await;

    let mut again = notifier.subscribe("late-0").await.expect("subscribe again");
    again.arm();
    publish_once(&conn, "late-0").await;
    assert!(woken(&mut again, Duration::from_secs(5)).await, "woken");
    drop(again);
    no_channel_left(&conn, "the channel to go with its waiter").await;
}

/// A pub/sub connection that dies silently (a dropped NAT entry, a network that swallows
/// everything: no reset, no close) is given up once a subscription on it goes unconfirmed, and
/// the next connection serves: subscriptions succeed again and are woken. The connection used to
/// be kept, so every subscription failed for good while Redis itself answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pub_sub_connection_that_dies_silently_is_replaced() {
    let redis = RedisServer::start().await;
    let relay = Swallowing::start(redis.port()).await;
    let (notifier, _stop) = notifier_at(
        format!("redis://127.0.0.1:{}", relay.port),
        Duration::from_millis(400),
    );
    drop(notifier.subscribe("before").await.expect("subscribe"));

    relay.swallow_open_connections();
    assert!(
        notifier.subscribe("during").await.is_err(),
        "a subscription on the silent connection is not confirmed"
    );
    let conn = redis.client().await;
    let mut after = wait_until(
        Duration::from_secs(10),
        "a subscription to succeed on a new connection",
        || {
            let notifier = notifier.clone();
            async move { notifier.subscribe("after").await.map_err(|e| e.to_string()) }
        },
    )
    .await;
    after.arm();
    publish_once(&conn, "after").await;
    assert!(woken(&mut after, Duration::from_secs(5)).await, "woken");
}

/// A TCP relay to a local port whose open connections can be made silent: from then on they
/// pass nothing either way and stay open, as a network that swallows everything would. Later
/// connections pass everything.
struct Swallowing {
    port: u16,
    generation: tokio::sync::watch::Sender<u64>,
}

impl Swallowing {
    async fn start(target: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding");
        let port = listener.local_addr().expect("address").port();
        let (generation, _) = tokio::sync::watch::channel(0u64);
        let tx = generation.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                else {
                    continue;
                };
                let mut swallowed = tx.subscribe();
                swallowed.borrow_and_update();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = swallowed.changed() => {
                            // Silent from now on, both sockets kept open until the test ends.
                            std::future::pending::<()>().await;
                        }
                    }
                });
            }
        });
        Self { port, generation }
    }

    fn swallow_open_connections(&self) {
        self.generation.send_modify(|g| *g += 1);
    }
}

/// Publishes `released` on `channel`, which exactly one connection (the notifier's) subscribes.
async fn publish_once(conn: &redis::aio::MultiplexedConnection, channel: &str) {
    let receivers: u64 = redis::cmd("PUBLISH")
        .arg(channel)
        .arg("released")
        .query_async(&mut conn.clone())
        .await
        .expect("PUBLISH");
    assert_eq!(receivers, 1, "one pub/sub connection per Baton");
}

/// Waits (at most 10 s, for `what`) until Redis lists no subscribed channel.
async fn no_channel_left(conn: &redis::aio::MultiplexedConnection, what: &str) {
    wait_until(Duration::from_secs(10), what, || {
        let mut conn = conn.clone();
        async move {
            let channels = subscribed_channels(&mut conn).await?;
            if channels.is_empty() {
                Ok(())
            } else {
                Err(format!("{channels:?}"))
            }
        }
    })
    .await;
}

/// Whether `sub` is woken within `timeout`.
async fn woken(sub: &mut Subscription, timeout: Duration) -> bool {
    tokio::time::timeout(timeout, sub.notified()).await.is_ok()
}

/// A message wakes every plain subscription of its channel and one relay subscription, each in
/// turn; a relay waiter that leaves before acting on its wake passes it to the next (also one
/// woken while it waited whose check then failed), and one that acted on it (armed, checked,
/// settled) does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_wakes_one_relay_waiter_in_turn() {
    let redis = RedisServer::start().await;
    let (notifier, _stop) = notifier(&redis);
    let conn = redis.client().await;
    let publish = |channel: &'static str| publish_once(&conn, channel);
    let quiet = Duration::from_millis(200);
    // Once connected, the notifier wakes every subscription it has (messages may have been
    // missed before): let that happen before the subscriptions under test exist.
    let _connected = notifier.subscribe("warm-up").await.expect("subscribe");
    tokio::time::sleep(quiet).await;

    // Round robin: three messages wake each of three relay waiters once, and the plain
    // subscription every time.
    let mut plain = notifier.subscribe("turns").await.expect("subscribe");
    let mut relays = Vec::new();
    for _ in 0..3 {
        relays.push(
            notifier
                .subscribe_as("turns", Wake::Relay(0))
                .await
                .expect("subscribe"),
        );
    }
    let mut order = Vec::new();
    for _ in 0..3 {
        plain.arm();
        for r in &mut relays {
            r.arm();
        }
        publish("turns").await;
        assert!(woken(&mut plain, Duration::from_secs(2)).await, "plain");
        let mut this_time = Vec::new();
        for (i, r) in relays.iter_mut().enumerate() {
            if woken(r, quiet).await {
                this_time.push(i);
            }
        }
        assert_eq!(
            this_time.len(),
            1,
            "one relay waiter per message: {this_time:?}"
        );
        order.push(this_time[0]);
    }
    assert_eq!(order, [0, 1, 2], "in the order they subscribed, then again");

    // A waiter woken (the front one) that leaves without looking passes the wake on.
    let first = notifier
        .subscribe_as("pass", Wake::Relay(0))
        .await
        .expect("subscribe");
    let mut second = notifier
        .subscribe_as("pass", Wake::Relay(0))
        .await
        .expect("subscribe");
    second.arm();
    publish("pass").await;
    // The message reaches `first` alone; give it time to arrive before leaving.
    assert!(
        !woken(&mut second, quiet).await,
        "the front waiter is woken, not this one"
    );
    drop(first);
    assert!(
        woken(&mut second, Duration::from_secs(2)).await,
        "the wake of a waiter that left is passed on"
    );

    // A waiter that armed with its wake and left mid-check passes it on too; one that settled
    // (its check answered) does not.
    for settled in [false, true] {
        let channel = if settled { "settled" } else { "unsettled" };
        let mut first = notifier
            .subscribe_as(channel, Wake::Relay(0))
            .await
            .expect("subscribe");
        let mut second = notifier
            .subscribe_as(channel, Wake::Relay(0))
            .await
            .expect("subscribe");
        first.arm();
        second.arm();
        publish(channel).await;
        tokio::time::sleep(quiet).await;
        // The check starts: the wake is consumed.
        first.arm();
        if settled {
            first.settle();
        }
        drop(first);
        assert_eq!(
            woken(&mut second, quiet).await,
            !settled,
            "{channel}: the next waiter woken"
        );
    }

    // A waiter that was woken while it waited, armed for its check, and left when the check
    // failed (an error, not an answer) passes the wake on.
    let mut first = notifier
        .subscribe_as("failed", Wake::Relay(0))
        .await
        .expect("subscribe");
    let mut second = notifier
        .subscribe_as("failed", Wake::Relay(0))
        .await
        .expect("subscribe");
    first.arm();
    second.arm();
    publish("failed").await;
    assert!(
        woken(&mut first, Duration::from_secs(2)).await,
        "the front waiter"
    );
    first.arm();
    drop(first);
    assert!(
        woken(&mut second, Duration::from_secs(2)).await,
        "the wake of a waiter whose check failed is passed on"
    );
}

/// The Redis servers a notifier under test subscribes on: the `redis-server`, or every master of
/// a cluster (sharded pub/sub).
struct PubSubNodes {
    conns: Vec<redis::aio::MultiplexedConnection>,
    sharded: bool,
}

/// What the nodes counted since their statistics were last reset, summed.
#[derive(Debug, Clone, Copy)]
struct Counts {
    /// `SUBSCRIBE` (or `SSUBSCRIBE`) commands run.
    commands: u64,
    /// Reads from client connections (`total_reads_processed`): a pipeline arrives in a few, a
    /// command at a time in one read each.
    reads: u64,
}

impl PubSubNodes {
    /// Runs `cmd` on every node, returning each answer.
    async fn each<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Vec<T> {
        let mut answers = Vec::new();
        for conn in &mut self.conns {
            answers.push(cmd.query_async(conn).await.expect("a node-wide command"));
        }
        answers
    }

    /// Resets every node's statistics.
    async fn reset_stats(&mut self) {
        self.each::<()>(redis::cmd("CONFIG").arg("RESETSTAT")).await;
    }

    /// What the nodes counted since the last reset.
    async fn counts(&mut self) -> Counts {
        let command = if self.sharded {
            "cmdstat_ssubscribe:calls="
        } else {
            "cmdstat_subscribe:calls="
        };
        let number = |info: &str, prefix: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .map_or(0, |rest| {
                    let n = rest.split(',').next().unwrap_or(rest).trim();
                    n.parse().unwrap_or_else(|_| panic!("{prefix}{rest}"))
                })
        };
        let infos: Vec<String> = self.each(redis::cmd("INFO").arg("all")).await;
        Counts {
            commands: infos.iter().map(|i| number(i, command)).sum(),
            reads: infos
                .iter()
                .map(|i| number(i, "total_reads_processed:"))
                .sum(),
        }
    }

    /// Channels subscribed on the nodes, summed.
    async fn channels(&mut self) -> usize {
        let mut cmd = redis::cmd("PUBSUB");
        cmd.arg(if self.sharded {
            "SHARDCHANNELS"
        } else {
            "CHANNELS"
        });
        let lists: Vec<Vec<String>> = self.each(&cmd).await;
        lists.iter().map(Vec::len).sum()
    }

    /// Kills every pub/sub connection on every node; returns how many there were.
    async fn kill_pubsub(&mut self) -> u64 {
        let killed: Vec<u64> = self
            .each(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"))
            .await;
        killed.into_iter().sum()
    }
}

/// The time a notifier under load test gets to have a subscription confirmed: many times the
/// default command timeout, for thousands of channels at once in a debug build on a busy machine
/// (2 s failed once with the machine's two cores shared by six busy threads). How many commands
/// and reads it takes is what the tests check.
const LOAD_TIMEOUT: Duration = Duration::from_secs(5);

/// Subscribes `channels` at once, kills the notifier's pub/sub connections, and checks that every
/// waiter is woken once, that every channel is subscribed again within `bound`, and that a fresh
/// publish on each channel wakes its waiter. Returns what the nodes counted for the first
/// subscription and for the resubscription.
async fn resubscribe_after_kill(
    notifier: &Notifier,
    nodes: &mut PubSubNodes,
    publisher: &(impl redis::aio::ConnectionLike + Clone),
    channels: usize,
    bound: Duration,
) -> (Counts, Counts) {
    use futures::{FutureExt, future::join_all};

    let names: Vec<String> = (0..channels)
        .map(|i| format!("{{many-{i}}}:released"))
        .collect();
    // The first connection is open before the counts start.
    drop(notifier.subscribe("warm-up").await.expect("subscribe"));
    nodes.reset_stats().await;

    let started = tokio::time::Instant::now();
    let mut subs: Vec<Subscription> = join_all(names.iter().map(|n| notifier.subscribe(n)))
        .await
        .into_iter()
        .zip(&names)
        .map(|(r, n)| r.unwrap_or_else(|e| panic!("subscribing {n}: {e}")))
        .collect();
    let first = nodes.counts().await;
    eprintln!(
        "{channels} channels subscribed in {:?}: {first:?}",
        started.elapsed()
    );
    assert_eq!(nodes.channels().await, channels, "every channel subscribed");

    for s in &mut subs {
        s.arm();
    }
    nodes.reset_stats().await;
    let killed_at = tokio::time::Instant::now();
    assert!(nodes.kill_pubsub().await >= 1, "the notifier's connection");
    within(
        bound,
        async {
            for s in &mut subs {
                s.notified().await;
            }
        },
        "every waiter to be woken after the connection dropped",
    )
    .await;
    // What a woken waiter does before it waits again: make sure its channel is subscribed.
    let resubscribed = within(
        bound,
        join_all(subs.iter().map(Subscription::ensure)),
        "every channel to be subscribed again",
    )
    .await;
    for (r, n) in resubscribed.iter().zip(&names) {
        if let Err(e) = r {
            panic!("resubscribing {n}: {e}");
        }
    }
    let took = killed_at.elapsed();
    let again = nodes.counts().await;
    eprintln!("{channels} channels subscribed again in {took:?}: {again:?}");
    assert!(took < bound, "resubscribed in {took:?}");
    // On a Cluster each master's drop is reported on its own: one reported after a channel was
    // confirmed again has it subscribed once more (its waiters woken again), so the count is
    // awaited, not read once. It was read once, and a busy machine once saw 2650 of 3000.
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let n = nodes.channels().await;
        if n == channels {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "every channel subscribed again: {n} of {channels}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Woken once: nothing more arrives until a message does.
    for s in &mut subs {
        s.arm();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut woken_again = 0;
    for s in &mut subs {
        if s.notified().now_or_never().is_some() {
            woken_again += 1;
        }
    }
    assert_eq!(woken_again, 0, "waiters woken twice for one gap");

    let publish = if nodes.sharded { "SPUBLISH" } else { "PUBLISH" };
    for chunk in names.chunks(500) {
        // Concurrent commands (a Cluster pipeline must stay within one slot).
        let receivers: Vec<u64> = join_all(chunk.iter().map(|n| {
            let mut publisher = publisher.clone();
            async move {
                redis::cmd(publish)
                    .arg(n)
                    .arg("released")
                    .query_async::<u64>(&mut publisher)
                    .await
                    .expect("publish")
            }
        }))
        .await;
        assert!(receivers.iter().all(|r| *r == 1), "one subscriber each");
    }
    within(
        bound,
        async {
            for s in &mut subs {
                s.notified().await;
            }
        },
        "every waiter to be woken by a fresh publish",
    )
    .await;
    (first, again)
}

/// A pooled connection that Redis closed while it was idle (its `timeout` setting, `CLIENT
/// KILL`, a restart) carries no call: the connections idle for `IDLE_CHECK` or more answer a
/// `PING` first, and a closed one is replaced, so every call after the kill succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_after_redis_closed_idle_connections_succeed() {
    let redis = RedisServer::start_standalone().await;
    let backend = Redis::new(&redis.redis_config()).expect("redis config");
    let mut admin = redis.client().await;
    for round in 0..3 {
        // Several calls at once, so that the pool opens more than one connection.
        let calls = (0..8).map(|_| backend.ping());
        for answered in futures::future::join_all(calls).await {
            answered.expect("PING through the pool");
        }
        // Idleness is what the check looks for: this wait is the scenario, not a poll.
        tokio::time::sleep(baton::redis::IDLE_CHECK + Duration::from_millis(100)).await;
        let killed = support::client_kill(&mut admin, &["TYPE", "normal", "SKIPME", "yes"])
            .await
            .expect("CLIENT KILL");
        assert!(
            killed >= 1,
            "round {round}: Baton's connections were killed"
        );
        for n in 0..10 {
            backend
                .ping()
                .await
                .unwrap_or_else(|e| panic!("round {round}, call {n} after the kill: {e}"));
        }
    }
}

/// 5,000 waiters on as many channels subscribe at once, confirmed in batched SUBSCRIBE commands
/// (at most 250); when the pub/sub connection is killed, every waiter is woken once, every
/// channel is subscribed again in at most 50 commands within a bound, and a fresh publish wakes
/// each waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_channels_resubscribe_in_batches() {
    const CHANNELS: usize = 5_000;
    let redis = RedisServer::start_standalone().await;
    let backend = Redis::new(&redis.redis_config()).expect("redis config");
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let notifier = Notifier::start(backend.pubsub_source(), LOAD_TIMEOUT, shutdown);
    let conn = redis.client().await;
    let mut nodes = PubSubNodes {
        conns: vec![conn.clone()],
        sharded: false,
    };
    let (first, again) = resubscribe_after_kill(
        &notifier,
        &mut nodes,
        &conn,
        CHANNELS,
        Duration::from_secs(10),
    )
    .await;
    assert!(
        first.commands <= (CHANNELS / 20) as u64,
        "{first:?} for {CHANNELS} new channels"
    );
    assert!(
        again.commands <= (CHANNELS / 100) as u64,
        "{again:?} to subscribe {CHANNELS} channels again"
    );
}

/// On a Cluster, 3,000 waiters on as many channels (in different slots of three masters)
/// subscribe at once, one SSUBSCRIBE each, pipelined (at most one read per ten commands); when
/// every master's pub/sub connection is killed, every waiter is woken once, every channel is
/// subscribed again the same way within a bound, and a fresh publish wakes each waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_sharded_channels_resubscribe_pipelined() {
    const CHANNELS: usize = 3_000;
    let cluster = RedisCluster::start(3, 0).await;
    let config = RedisConfig::with_topology(Topology::Cluster {
        seeds: cluster.seed_urls(),
    });
    let backend = Redis::new(&config).expect("redis config");
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let notifier = Notifier::start(backend.pubsub_source(), LOAD_TIMEOUT, shutdown);
    let mut nodes = PubSubNodes {
        conns: Vec::new(),
        sharded: true,
    };
    for master in cluster.masters().await {
        nodes.conns.push(cluster.node_client(master.port).await);
    }
    let publisher = cluster.client().await;
    let (first, again) = resubscribe_after_kill(
        &notifier,
        &mut nodes,
        &publisher,
        CHANNELS,
        Duration::from_secs(10),
    )
    .await;
    for (what, counts) in [("new", first), ("resubscribed", again)] {
        assert!(
            counts.commands >= CHANNELS as u64,
            "one SSUBSCRIBE per {what} channel: {counts:?}"
        );
        assert!(
            counts.reads <= (CHANNELS / 10) as u64,
            "{what} channels' SSUBSCRIBEs pipelined: {counts:?}"
        );
    }
}

/// Holds 600 subscriptions, then 20 times kills the notifier's pub/sub connections on `nodes`
/// while 30 new channels subscribe, waits for every held waiter to be woken by the drop and has
/// each held channel subscribed again: every subscription and resubscription must succeed.
/// Each round races the kill against the notifier noticing it.
async fn subscriptions_race_kills(notifier: &Notifier, nodes: &mut PubSubNodes) {
    use futures::future::join_all;

    const ROUNDS: usize = 20;
    const HELD: usize = 600;
    const PER_ROUND: usize = 30;
    // Channels in many slots: on a Cluster, a connection to every master.
    let held_names: Vec<String> = (0..HELD)
        .map(|i| format!("{{held-{i}}}:released"))
        .collect();
    let mut held: Vec<Subscription> = join_all(held_names.iter().map(|n| notifier.subscribe(n)))
        .await
        .into_iter()
        .map(|r| r.expect("a held subscription"))
        .collect();
    let bound = LOAD_TIMEOUT * 4;
    let mut killed = 0;
    for round in 1..=ROUNDS {
        for s in &mut held {
            s.arm();
        }
        let names: Vec<String> = (0..PER_ROUND)
            .map(|i| format!("{{race-{round}-{i}}}:released"))
            .collect();
        let (n, subscribed) = within(
            bound,
            futures::future::join(
                nodes.kill_pubsub(),
                join_all(names.iter().map(|n| notifier.subscribe(n))),
            ),
            "the subscriptions racing the kill",
        )
        .await;
        killed += n;
        for (r, n) in subscribed.iter().zip(&names) {
            if let Err(e) = r {
                panic!("round {round}: subscribing {n}: {e}");
            }
        }
        within(
            bound,
            async {
                for s in &mut held {
                    s.notified().await;
                }
            },
            "every held waiter to be woken by the drop",
        )
        .await;
        let again = within(
            bound,
            join_all(held.iter().map(Subscription::ensure)),
            "every held channel to be subscribed again",
        )
        .await;
        for (r, n) in again.iter().zip(&held_names) {
            if let Err(e) = r {
                panic!("round {round}: resubscribing {n}: {e}");
            }
        }
    }
    assert!(killed >= ROUNDS as u64, "{killed} connections killed");
}

/// On a Cluster, subscriptions sent the moment the notifier's master connections are killed,
/// before each drop is reported, are made on new connections instead of failing: a waiter never
/// sees an error for a connection Baton could replace at once. The first drop reported has every
/// held channel subscribed again on the masters whose drop is not reported yet; every one must
/// succeed too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_subscriptions_racing_a_killed_connection_succeed() {
    let cluster = RedisCluster::start(3, 0).await;
    let config = RedisConfig::with_topology(Topology::Cluster {
        seeds: cluster.seed_urls(),
    });
    let backend = Redis::new(&config).expect("redis config");
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let notifier = Notifier::start(backend.pubsub_source(), LOAD_TIMEOUT, shutdown);
    let mut nodes = PubSubNodes {
        conns: Vec::new(),
        sharded: true,
    };
    for master in cluster.masters().await {
        nodes.conns.push(cluster.node_client(master.port).await);
    }
    subscriptions_race_kills(&notifier, &mut nodes).await;
}

/// On a single Redis, subscriptions sent the moment the notifier's pub/sub connection is killed,
/// before the drop is noticed, are made on the next connection instead of failing, as on a
/// Cluster (above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_racing_a_killed_connection_succeed() {
    let redis = RedisServer::start_standalone().await;
    let backend = Redis::new(&redis.redis_config()).expect("redis config");
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let notifier = Notifier::start(backend.pubsub_source(), LOAD_TIMEOUT, shutdown);
    let mut nodes = PubSubNodes {
        conns: vec![redis.client().await],
        sharded: false,
    };
    subscriptions_race_kills(&notifier, &mut nodes).await;
}

/// A wait whose stop has fired ends with the stop's error even when a message arrived
/// meanwhile: at shutdown, what Baton releases of its own holds must not go to its own waiters.
/// Each round publishes on the channel during the attempt, so that at the wait both the stop and
/// the message are ready; one more attempt would mean the message won. Twenty rounds, where a
/// wait that picked either at random would pass all with a chance of one in a million.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fired_stop_wins_over_a_message_that_came_meanwhile() {
    use baton::{error::Error, wait};
    let redis = RedisServer::start_standalone().await;
    let (notifier, _stop) = notifier(&redis);
    let publisher = redis.client().await;
    for round in 0..20 {
        let channel = format!("{{stop-{round}}}:released");
        let attempts = std::sync::atomic::AtomicUsize::new(0);
        let outcome = within(
            Duration::from_secs(10),
            wait::until(
                &notifier,
                &channel,
                Wake::Every,
                tokio::time::Instant::now() + Duration::from_secs(5),
                std::future::ready(Error::ShuttingDown),
                |_| {
                    attempts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let mut publisher = publisher.clone();
                    let channel = channel.clone();
                    async move {
                        let receivers: u64 = redis::cmd("PUBLISH")
                            .arg(&channel)
                            .arg("released")
                            .query_async(&mut publisher)
                            .await
                            .expect("PUBLISH");
                        assert_eq!(receivers, 1, "the waiter is subscribed");
                        // Time for the message to reach the waiter before the attempt answers.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok(wait::Attempt::Busy {
                            answer: (),
                            retry_in: None,
                        })
                    }
                },
            ),
            "the wait",
        )
        .await;
        assert!(
            matches!(outcome, Err(Error::ShuttingDown)),
            "round {round}: {outcome:?}"
        );
        assert_eq!(
            attempts.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "round {round}: the message won over the stop"
        );
    }
}
