//! How Baton reports what Redis refuses, against real `redis-server` processes: every reply that
//! means "not now" (`NOREPLICAS`, `OOM`, `BUSY`, `NOAUTH`, `WRONGPASS`, `LOADING`) comes back
//! UNAVAILABLE with the cause and a retry delay, and a Redis older than 7.0 is refused with a
//! message naming its version: at start (exit code 2) or, when it only appears later, on every
//! call (FAILED_PRECONDITION) with readiness NOT_SERVING.

mod support;

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use baton::{
    config::RedisConfig,
    proto::v1::{
        self as pb, autocomplete_service_client::AutocompleteServiceClient,
        lock_service_client::LockServiceClient,
    },
    redis::Topology,
};
use support::{Baton, RedisServer, baton_command, ms, run_baton, wait_until, within};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tonic::{Code, transport::Channel};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt;

type Client = LockServiceClient<Channel>;

/// How long Redis may take to start refusing (a config change, a reconnection) or to accept
/// again; the calls are retried meanwhile.
const REFUSAL_WITHIN: Duration = Duration::from_secs(10);

/// One try at `name` (ttl 10 s, no wait): whether it was granted, or the error.
async fn try_acquire(client: &mut Client, name: &str) -> Result<bool, tonic::Status> {
    client
        .acquire(pb::LockServiceAcquireRequest {
            name: name.to_owned(),
            ttl: Some(ms(10_000)),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().acquired)
}

/// Asserts `status` is UNAVAILABLE, with RetryInfo and a message naming `cause`.
fn assert_unavailable_naming(status: &tonic::Status, cause: &str) {
    assert_eq!(status.code(), Code::Unavailable, "{cause}: {status:?}");
    assert!(
        status.message().contains(cause),
        "the message names {cause}: {:?}",
        status.message()
    );
    assert!(
        status.get_error_details().retry_info().is_some(),
        "{cause}: no RetryInfo in {status:?}"
    );
}

/// Tries fresh lock names until a call fails with a message naming `cause` (within
/// [`REFUSAL_WITHIN`]); every failure on the way must be UNAVAILABLE. Returns that failure.
async fn refused_with(client: &Client, cause: &str) -> tonic::Status {
    let mut n = 0u32;
    wait_until(
        REFUSAL_WITHIN,
        &format!("a call refused with {cause}"),
        || {
            n += 1;
            let name = format!("refused-{n}");
            let mut client = client.clone();
            async move {
                match try_acquire(&mut client, &name).await {
                    Err(s) if s.message().contains(cause) => Ok(s),
                    Err(s) if s.code() == Code::Unavailable => Err(format!("{s:?}")),
                    Err(s) => panic!("{cause}: a failure other than UNAVAILABLE: {s:?}"),
                    Ok(granted) => Err(format!("answered granted={granted}")),
                }
            }
        },
    )
    .await
}

/// Tries fresh lock names until one is granted (within [`REFUSAL_WITHIN`]).
async fn served_again(client: &Client, what: &str) {
    let mut n = 0u32;
    wait_until(REFUSAL_WITHIN, what, || {
        n += 1;
        let name = format!("again-{n}");
        let mut client = client.clone();
        async move {
            match try_acquire(&mut client, &name).await {
                Ok(true) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
}

/// Runs `CONFIG SET parameter value` on `redis`.
async fn config_set(redis: &RedisServer, parameter: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(parameter)
        .arg(value)
        .query_async(&mut redis.client().await)
        .await
        .unwrap_or_else(|e| panic!("CONFIG SET {parameter} {value}: {e}"));
}

/// With `min-replicas-to-write 1` and no replica (the guarantees recommend the option), a grant
/// is refused by Redis with `NOREPLICAS`: Baton answers UNAVAILABLE naming it, and serves again
/// once a write may succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noreplicas_is_unavailable() {
    let redis = RedisServer::start_standalone().await;
    let baton = Baton::start(&redis).await;
    let client = baton.client().await;
    config_set(&redis, "min-replicas-to-write", "1").await;
    let status = refused_with(&client, "NOREPLICAS").await;
    assert_unavailable_naming(&status, "NOREPLICAS");
    config_set(&redis, "min-replicas-to-write", "0").await;
    served_again(&client, "grants once no replica is required").await;
}

/// With `maxmemory` reached and `noeviction`, a write script whose first write needs memory is
/// refused with `OOM` (a semaphore grant, an autocomplete `Add`): UNAVAILABLE naming it, and
/// served again once memory is available. (A lock grant is not refused: its script first deletes
/// expired entries, and Redis lets a script that has written once finish its writes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oom_is_unavailable() {
    let redis = RedisServer::start_standalone().await;
    let baton = Baton::start(&redis).await;
    let mut permits = baton.semaphore_client().await;
    let mut terms = AutocompleteServiceClient::new(support::channel(baton.addr()).await);
    let permit = |name: &str| pb::SemaphoreServiceAcquireRequest {
        name: name.to_owned(),
        limit: 2,
        permits: 1,
        ttl: Some(ms(10_000)),
        ..Default::default()
    };
    let add = pb::AutocompleteServiceAddRequest {
        dictionary: "words".into(),
        terms: vec![pb::AutocompleteTerm {
            display: "baton".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    config_set(&redis, "maxmemory-policy", "noeviction").await;
    config_set(&redis, "maxmemory", "1").await;
    let refused = permits.acquire(permit("oom")).await.expect_err("no memory");
    assert_unavailable_naming(&refused, "OOM");
    let refused = terms.add(add.clone()).await.expect_err("no memory");
    assert_unavailable_naming(&refused, "OOM");
    config_set(&redis, "maxmemory", "0").await;
    let granted = permits.acquire(permit("oom")).await.expect("a grant");
    assert!(
        granted.into_inner().acquired,
        "granted once memory is available"
    );
    terms
        .add(add)
        .await
        .expect("added once memory is available");
}

/// While another client's script runs past `busy-reply-threshold`, Redis answers `BUSY`: UNAVAILABLE
/// naming it; once the script is killed, Baton serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_is_unavailable() {
    let redis = RedisServer::start_standalone().await;
    let baton = Baton::start(&redis).await;
    let client = baton.client().await;
    assert_eq!(
        try_acquire(&mut client.clone(), "warm").await.ok(),
        Some(true)
    );
    config_set(&redis, "busy-reply-threshold", "10").await;
    // A script that never ends on a connection of its own (killed below; it writes nothing).
    let mut busy = redis.client().await;
    let spin = tokio::spawn(async move {
        redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query_async::<()>(&mut busy)
            .await
    });
    let status = refused_with(&client, "BUSY").await;
    assert_unavailable_naming(&status, "BUSY");
    let killed = wait_until(REFUSAL_WITHIN, "SCRIPT KILL", || {
        let redis = &redis;
        async move {
            redis::cmd("SCRIPT")
                .arg("KILL")
                .query_async::<()>(&mut redis.client().await)
                .await
                .map_err(|e| e.to_string())
        }
    });
    killed.await;
    let ended = within(Duration::from_secs(5), spin, "the busy script to end").await;
    assert!(
        matches!(ended, Ok(Err(_))),
        "the script was killed: {ended:?}"
    );
    served_again(&client, "grants once the script is killed").await;
}

/// A password set under a running Baton (`requirepass`, a rotation Baton was not told of): once
/// its connections are gone, Redis answers `NOAUTH`, which Baton reports UNAVAILABLE naming it;
/// it serves again once the passwords agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noauth_after_a_password_appears_is_unavailable() {
    let redis = RedisServer::start_standalone().await;
    let baton = Baton::start(&redis).await;
    let client = baton.client().await;
    let mut admin = redis.client().await;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("rotated")
        .query_async(&mut admin)
        .await
        .expect("CONFIG SET requirepass");
    // Connections made before keep their authentication: drop Baton's.
    support::client_kill(&mut admin, &["TYPE", "normal", "SKIPME", "yes"])
        .await
        .expect("CLIENT KILL");
    let status = refused_with(&client, "NOAUTH").await;
    assert_unavailable_naming(&status, "NOAUTH");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("")
        .query_async(&mut admin)
        .await
        .expect("CONFIG SET requirepass");
    served_again(&client, "grants once no password is required").await;
}

/// Baton's ACL user has its password changed (a rotation): once its connections are gone, Redis
/// refuses the old password (`WRONGPASS`), which Baton reports UNAVAILABLE; it serves again once
/// the password is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrongpass_after_a_rotation_is_unavailable() {
    let redis = RedisServer::start_standalone().await;
    let mut admin = redis.client().await;
    let acl = |rules: &[&str]| {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg("baton").arg(rules);
        cmd
    };
    let _: () = acl(&["on", ">first", "~*", "&*", "+@all"])
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://baton:first@127.0.0.1:{}", redis.port());
    let baton =
        Baton::start_with(&redis, |c| c.redis.topology = Topology::Standalone { url }).await;
    let client = baton.client().await;
    assert_eq!(
        try_acquire(&mut client.clone(), "warm").await.ok(),
        Some(true)
    );
    let _: () = acl(&["resetpass", ">second"])
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    support::client_kill(&mut admin, &["USER", "baton"])
        .await
        .expect("CLIENT KILL");
    let status = refused_with(&client, "WRONGPASS").await;
    assert_unavailable_naming(&status, "WRONGPASS");
    let _: () = acl(&["resetpass", ">first"])
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    served_again(&client, "grants once the password is back").await;
}

/// Starts `redis-server` on `port` in `dir` with `args`, without waiting for it.
fn spawn_redis(port: u16, dir: &Path, args: &[&str]) -> Child {
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawning redis-server")
}

/// Kills a `redis-server` child on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `INFO persistence`'s `loading` field of the server on `port` (`None` while it does not answer).
async fn loading(port: u16) -> Option<bool> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let info = tokio::time::timeout(Duration::from_millis(500), async {
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("INFO")
            .arg("persistence")
            .query_async::<String>(&mut conn)
            .await
            .ok()
    })
    .await
    .ok()??;
    info.lines()
        .find_map(|l| l.strip_prefix("loading:"))
        .map(|v| v.trim() == "1")
}

/// A Redis restarting with a dataset to load answers `LOADING` until it is loaded (slowed here by
/// `key-load-delay`): Baton answers UNAVAILABLE naming it, readiness is NOT_SERVING meanwhile, and
/// once loaded Baton serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_is_unavailable() {
    const KEYS: usize = 20_000;
    let dir = tempfile::tempdir().expect("a temp dir");
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("address").port()
    };
    let url = format!("redis://127.0.0.1:{port}");
    let first = Killed(spawn_redis(port, dir.path(), &[]));
    wait_until(Duration::from_secs(5), "redis to start", || async move {
        loading(port).await.ok_or("no answer")
    })
    .await;
    let mut conn = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let mut fill = redis::pipe();
    for i in 0..KEYS {
        fill.cmd("SET").arg(format!("filler:{i}")).arg(i).ignore();
    }
    let _: () = fill.query_async(&mut conn).await.expect("filling");
    let _: () = redis::cmd("SAVE")
        .query_async(&mut conn)
        .await
        .expect("SAVE");

    let config = RedisConfig::with_topology(Topology::Standalone { url: url.clone() });
    let baton = Baton::start_on(config, |_| {}).await;
    let client = baton.client().await;
    assert_eq!(
        try_acquire(&mut client.clone(), "warm").await.ok(),
        Some(true)
    );
    let mut health = baton.health().await;

    // Restart with the dataset, loading one key per 200 µs (about 4 s).
    drop(first);
    let _second = Killed(spawn_redis(
        port,
        dir.path(),
        &[
            "--key-load-delay",
            "200",
            "--loading-process-events-interval-bytes",
            "1024",
        ],
    ));
    wait_until(
        Duration::from_secs(5),
        "redis to report loading",
        || async move {
            match loading(port).await {
                Some(true) => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
    let status = refused_with(&client, "LOADING").await;
    assert_unavailable_naming(&status, "LOADING");
    support::wait_for_health(
        &mut health,
        "readiness",
        ServingStatus::NotServing,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(
        loading(port).await,
        Some(true),
        "the refusals came while Redis was loading"
    );
    served_again(&client, "grants once the dataset is loaded").await;
}

// ---------------------------------------------------------------------------------------------
// A Redis older than 7.0
// ---------------------------------------------------------------------------------------------

/// What the relay rewrites in the server's replies: `INFO` then reports a Redis 6.
const VERSION_NOW: &[u8] = b"redis_version:7.";
/// Its replacement (as long, so RESP lengths stay right).
const VERSION_OLD: &[u8] = b"redis_version:6.";

/// Rewrites [`VERSION_NOW`] in `chunk` (appended to the bytes `held` back from the previous
/// chunk) and returns what can be sent on; keeps back a tail that may be the start of the
/// pattern. A complete reply ends with `\r\n`, never with such a tail, so nothing is held for
/// long.
fn rewrite(held: &mut Vec<u8>, chunk: &[u8]) -> Vec<u8> {
    held.extend_from_slice(chunk);
    let mut i = 0;
    while i + VERSION_NOW.len() <= held.len() {
        if &held[i..i + VERSION_NOW.len()] == VERSION_NOW {
            held[i..i + VERSION_NOW.len()].copy_from_slice(VERSION_OLD);
            i += VERSION_NOW.len();
        } else {
            i += 1;
        }
    }
    let keep = (1..VERSION_NOW.len())
        .rev()
        .find(|&n| held.ends_with(&VERSION_NOW[..n]))
        .unwrap_or(0);
    held.drain(..held.len() - keep).collect()
}

/// A TCP relay to a real Redis that makes it report version 6 (see [`rewrite`]); stops on drop.
struct OldRedis {
    stop: CancellationToken,
}

impl OldRedis {
    /// Relays the connections `listener` accepts to the Redis on `target`.
    fn serve(listener: TcpListener, target: u16) -> Self {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = stopped.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((client, _)) = accepted else { continue };
                let stopped = stopped.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let (mut from_client, mut to_client) = client.into_split();
                    let (mut from_server, mut to_server) = server.into_split();
                    let up = tokio::io::copy(&mut from_client, &mut to_server);
                    let down = async {
                        let mut held = Vec::new();
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = from_server.read(&mut buf).await?;
                            if n == 0 {
                                return Ok::<(), std::io::Error>(());
                            }
                            to_client.write_all(&rewrite(&mut held, &buf[..n])).await?;
                        }
                    };
                    tokio::select! {
                        () = stopped.cancelled() => {}
                        _ = up => {}
                        _ = down => {}
                    }
                });
            }
        });
        Self { stop }
    }
}

impl Drop for OldRedis {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The relay's rewriting: the version is replaced wherever it falls, even across chunks, and
/// nothing else changes.
#[test]
fn the_relay_rewrites_the_version_across_chunks() {
    let reply = b"$40\r\n# Server\r\nredis_version:7.0.15\r\nredis_mode:x\r\n";
    for split in 0..reply.len() {
        let mut held = Vec::new();
        let mut out = rewrite(&mut held, &reply[..split]);
        out.extend(rewrite(&mut held, &reply[split..]));
        assert!(held.is_empty(), "split at {split}: {held:?} held back");
        assert_eq!(
            out,
            b"$40\r\n# Server\r\nredis_version:6.0.15\r\nredis_mode:x\r\n".to_vec(),
            "split at {split}"
        );
    }
}

/// `baton serve` against a Redis that reports version 6 exits with code 2 and a message naming
/// the version found and the one needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_redis_at_start_exits_2() {
    let redis = RedisServer::start_standalone().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding");
    let addr = listener.local_addr().expect("address");
    let _old = OldRedis::serve(listener, redis.port());
    let mut command = baton_command();
    command.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--redis-url",
        &format!("redis://{addr}"),
    ]);
    let (status, stderr) = run_baton(command, Duration::from_secs(20)).await;
    assert_eq!(
        status.code(),
        Some(2),
        "exit status {status}; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("Redis 6.0.") && stderr.contains("7.0 or later"),
        "the message names the version found and the one needed:\n{stderr}"
    );
}

/// A Redis that answers only after Baton started and reports version 6: every call fails
/// FAILED_PRECONDITION naming the versions, and readiness stays NOT_SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_redis_found_later_fails_calls_and_readiness() {
    let redis = RedisServer::start_standalone().await;
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        listener.local_addr().expect("address").port()
    };
    let url = format!("redis://127.0.0.1:{port}");
    let baton = Baton::start_unready(&redis, |c| {
        c.redis.topology = Topology::Standalone { url };
    })
    .await;
    let mut health = baton.health().await;
    support::wait_for_health(
        &mut health,
        "readiness",
        ServingStatus::NotServing,
        Duration::from_secs(5),
    )
    .await;
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("binding the port Baton was given");
    let _old = OldRedis::serve(listener, redis.port());

    let client = baton.client().await;
    let mut n = 0u32;
    let refused = wait_until(REFUSAL_WITHIN, "a call refused for the version", || {
        n += 1;
        let name = format!("old-{n}");
        let mut client = client.clone();
        async move {
            match try_acquire(&mut client, &name).await {
                Err(s) if s.code() == Code::FailedPrecondition => Ok(s),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert!(
        refused.message().contains("Redis 6.0.") && refused.message().contains("7.0 or later"),
        "{refused:?}"
    );
    // Readiness keeps saying no while calls are refused.
    let watch_until = Instant::now() + Duration::from_millis(2_500);
    let mut pace = tokio::time::interval(Duration::from_millis(250));
    while Instant::now() < watch_until {
        pace.tick().await;
        let status = support::health_status(&mut health, "readiness").await;
        assert!(
            matches!(status, Ok(ServingStatus::NotServing)),
            "readiness with a Redis 6: {status:?}"
        );
        let status = try_acquire(&mut client.clone(), "old-again").await;
        assert!(
            matches!(&status, Err(s) if s.code() == Code::FailedPrecondition),
            "{status:?}"
        );
    }
}

/// Connections Redis closed while Baton was idle (`CLIENT KILL`, as its `timeout` setting or a
/// restart would) carry no call: the call right after the kill is granted, not failed with
/// "broken pipe", although Baton's own background work (readiness checks) used the pool
/// meanwhile, so that no idleness check could have caught them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_right_after_redis_closed_idle_connections_succeeds() {
    let redis = RedisServer::start_standalone().await;
    let baton = Baton::start(&redis).await;
    let mut admin = redis.client().await;
    calls_after_kills(&baton, std::slice::from_mut(&mut admin)).await;
}

/// The same on a Cluster: a connection a master closed carries no call either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_right_after_cluster_masters_closed_idle_connections_succeeds() {
    let cluster = support::topology::RedisCluster::start(3, 0).await;
    let baton = Baton::start_on(
        RedisConfig::with_topology(Topology::Cluster {
            seeds: cluster.seed_urls(),
        }),
        |_| {},
    )
    .await;
    let mut admins = Vec::new();
    for port in cluster.ports() {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("a URL");
        admins.push(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("a connection to a master"),
        );
    }
    calls_after_kills(&baton, &mut admins).await;
}

/// Four rounds of: calls on several names, a pause past the idleness check, `CLIENT KILL` of
/// every normal connection on every node of `admins`, and at once a call on each name, which
/// must be granted.
async fn calls_after_kills(baton: &Baton, admins: &mut [redis::aio::MultiplexedConnection]) {
    let mut client = baton.client().await;
    for round in 0..4 {
        for n in 0..6 {
            let warm = try_acquire(&mut client, &format!("warm-{round}-{n}")).await;
            assert_eq!(warm.ok(), Some(true), "round {round}: warming {n}");
        }
        // Idleness is the scenario: nothing is polled here.
        tokio::time::sleep(baton::redis::IDLE_CHECK + Duration::from_millis(500)).await;
        let mut killed = 0;
        for admin in admins.iter_mut() {
            killed += support::client_kill(admin, &["TYPE", "normal", "SKIPME", "yes"])
                .await
                .expect("CLIENT KILL");
        }
        assert!(
            killed >= 1,
            "round {round}: Baton's connections were killed"
        );
        // The calls come 50 ms after the kill, time for Baton's side of each connection to read
        // its end (a call written before that may reach a closed socket, and is not sent again);
        // before the mend, 5 calls in 6 failed "broken pipe" this long after a kill.
        tokio::time::sleep(Duration::from_millis(50)).await;
        for n in 0..6 {
            let after = try_acquire(&mut client, &format!("after-{round}-{n}")).await;
            assert_eq!(
                after.ok(),
                Some(true),
                "round {round}: call {n} after the kill"
            );
        }
    }
}

/// A health `Watch` of readiness sees each status once: a Baton started while its Redis address
/// takes connections but answers nothing says NOT_SERVING at once, then nothing while Redis
/// stays silent (its readiness check runs every second and finds it down each time; the first
/// check, ending after the watch began, used to say NOT_SERVING a second time), then SERVING
/// once a Redis answers there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_watch_sees_each_status_once() {
    let redis = RedisServer::start_standalone().await;
    // The address Baton is given: connections are taken and left silent until `answer`, then
    // relayed to the running Redis.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding");
    let port = listener.local_addr().expect("address").port();
    let answer = CancellationToken::new();
    let target = redis.port();
    let answering = answer.clone();
    tokio::spawn(async move {
        let mut silent = Vec::new();
        while let Ok((mut inbound, _)) = listener.accept().await {
            if !answering.is_cancelled() {
                silent.push(inbound);
                continue;
            }
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    let baton = Baton::start_unready(&redis, |c| {
        c.redis.topology = Topology::Standalone {
            url: format!("redis://127.0.0.1:{port}"),
        };
    })
    .await;
    let mut watch = baton
        .health()
        .await
        .watch(tonic_health::pb::HealthCheckRequest {
            service: "readiness".into(),
        })
        .await
        .expect("Watch")
        .into_inner();
    let status = |m: Option<tonic_health::pb::HealthCheckResponse>| m.map(|m| m.status());
    let first = within(Duration::from_secs(5), watch.message(), "the first status")
        .await
        .expect("the stream");
    assert_eq!(status(first), Some(ServingStatus::NotServing));
    // Readiness checks find Redis silent (each within the command timeout): nothing new to say.
    let quiet = tokio::time::timeout(Duration::from_millis(3_200), watch.message()).await;
    assert!(
        quiet.is_err(),
        "a second status while nothing changed: {quiet:?}"
    );

    answer.cancel();
    let next = within(Duration::from_secs(10), watch.message(), "SERVING")
        .await
        .expect("the stream");
    assert_eq!(status(next), Some(ServingStatus::Serving));
    let quiet = tokio::time::timeout(Duration::from_millis(2_200), watch.message()).await;
    assert!(
        quiet.is_err(),
        "a second status while nothing changed: {quiet:?}"
    );
}
