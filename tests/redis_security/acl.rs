//! Baton as a Redis ACL user limited to its key prefix, by the very rules docs/security.md gives
//! (read from the page), through every service on a standalone Redis, a Cluster and a Sentinel
//! deployment; and what that user cannot do.

use std::path::Path;

use baton::{
    config::{RedisAccess, RedisConfig, RedisTls, Topology},
    proto::v1::{
        self as pb, autocomplete_service_client::AutocompleteServiceClient,
        lock_service_client::LockServiceClient, semaphore_service_client::SemaphoreServiceClient,
    },
};
use redis::aio::MultiplexedConnection;

use crate::{
    exercise,
    support::{
        Baton, RedisServer, channel, ms,
        tls::{Pki, TlsRedis, TlsSentinel},
        unique_prefix,
    },
};

/// The `ACL SETUSER` commands of docs/security.md's block marked `<!-- acl: BLOCK -->`, for
/// `user`, `password` and `prefix` in place of the page's `baton`, `CHANGE-ME` and `baton:`.
pub fn documented_rules(block: &str, user: &str, password: &str, prefix: &str) -> Vec<redis::Cmd> {
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/security.md"))
            .expect("reading docs/security.md");
    let marker = format!("<!-- acl: {block} -->");
    let after = page
        .split_once(&marker)
        .unwrap_or_else(|| panic!("docs/security.md has no {marker}"))
        .1;
    let body = after
        .trim_start()
        .strip_prefix("```\n")
        .unwrap_or_else(|| panic!("a code block follows {marker}"));
    let body = &body[..body.find("```").expect("the code block ends")];
    let commands: Vec<redis::Cmd> = body
        .lines()
        .map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(
                words[..3],
                ["ACL", "SETUSER", "baton"],
                "{block}: every line sets the user `baton`: {line}"
            );
            let mut cmd = redis::cmd("ACL");
            cmd.arg("SETUSER").arg(user);
            for word in &words[3..] {
                let word = match *word {
                    ">CHANGE-ME" => format!(">{password}"),
                    "~baton:*" => format!("~{prefix}*"),
                    "&baton:*" => format!("&{prefix}*"),
                    other => {
                        assert!(
                            !other.contains("baton:") && !other.contains("CHANGE-ME"),
                            "{block}: an unexpected pattern {other}"
                        );
                        other.to_owned()
                    }
                };
                cmd.arg(word);
            }
            cmd
        })
        .collect();
    assert!(!commands.is_empty(), "{block}: no rules");
    commands
}

/// Runs the rules of `blocks` for `user` on `conn`.
async fn create_user(
    conn: &mut MultiplexedConnection,
    blocks: &[&str],
    user: &str,
    password: &str,
    prefix: &str,
) {
    for block in blocks {
        for cmd in documented_rules(block, user, password, prefix) {
            let () = cmd
                .query_async(conn)
                .await
                .unwrap_or_else(|e| panic!("{block}: the documented rules are refused: {e}"));
        }
    }
    let () = redis::cmd("ACL")
        .arg("LOG")
        .arg("RESET")
        .query_async(conn)
        .await
        .expect("ACL LOG RESET");
}

/// Redis's record of refused commands since the user was made (`ACL LOG`): empty when the
/// documented rules gave Baton everything it asked for.
async fn acl_log(conn: &mut MultiplexedConnection) -> Vec<redis::Value> {
    redis::cmd("ACL")
        .arg("LOG")
        .query_async(conn)
        .await
        .expect("ACL LOG")
}

/// A password file holding `password`, in `dir`.
fn password_file(dir: &Path, password: &str) -> std::path::PathBuf {
    let path = dir.join("password");
    std::fs::write(&path, format!("{password}\n")).expect("writing the password file");
    path
}

/// A connection to `url` as `user`.
async fn connect_as(url: &str, user: &str, password: &str) -> MultiplexedConnection {
    let info = redis::IntoConnectionInfo::into_connection_info(url).expect("url");
    let settings = info
        .redis_settings()
        .clone()
        .set_username(user)
        .set_password(password);
    redis::Client::open(info.set_redis_settings(settings))
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("connecting as {user}: {e}"))
}

/// The error of `cmd` run as the restricted user; panics if it is allowed.
async fn refused(
    conn: &mut MultiplexedConnection,
    cmd: &redis::Cmd,
    what: &str,
) -> redis::RedisError {
    match cmd.query_async::<redis::Value>(conn).await {
        Ok(v) => panic!("{what} is allowed: {v:?}"),
        Err(e) => e,
    }
}

/// Everything the user of `prefix` must not do on `url` (whose `other` prefix holds a key and
/// a channel of another tenant), each refused by Redis; and, as a control, what it may do.
pub async fn assert_confined(url: &str, user: &str, password: &str, prefix: &str, other: &str) {
    let mut conn = connect_as(url, user, password).await;
    let own: Option<String> = redis::cmd("GET")
        .arg(format!("{prefix}probe"))
        .query_async(&mut conn)
        .await
        .expect("the user reads under its own prefix");
    assert_eq!(own, None);
    let foreign = format!("{other}{{lock:x}}");
    for (what, cmd) in [
        (
            "GET of another prefix",
            redis::cmd("GET").arg(&foreign).clone(),
        ),
        (
            "SET of another prefix",
            redis::cmd("SET").arg(&foreign).arg("mine").clone(),
        ),
        (
            "DEL of another prefix",
            redis::cmd("DEL").arg(&foreign).clone(),
        ),
        (
            "HGETALL of another prefix",
            redis::cmd("HGETALL").arg(&foreign).clone(),
        ),
        ("KEYS", redis::cmd("KEYS").arg("*").clone()),
        ("SCAN", redis::cmd("SCAN").arg(0).clone()),
        ("EVAL", redis::cmd("EVAL").arg("return 1").arg(0).clone()),
        ("FLUSHALL", redis::cmd("FLUSHALL").clone()),
        (
            "CONFIG GET",
            redis::cmd("CONFIG").arg("GET").arg("*").clone(),
        ),
        (
            "CLIENT KILL",
            redis::cmd("CLIENT")
                .arg("KILL")
                .arg("USER")
                .arg("default")
                .clone(),
        ),
        ("ACL LIST", redis::cmd("ACL").arg("LIST").clone()),
        (
            "PUBLISH to another prefix",
            redis::cmd("PUBLISH")
                .arg(format!("{other}{{lock:x}}:released"))
                .arg("x")
                .clone(),
        ),
    ] {
        let e = refused(&mut conn, &cmd, what).await;
        assert_eq!(e.code(), Some("NOPERM"), "{what}: {e}");
    }
    // A script of the user's own making runs with the user's rights: another prefix's key is
    // refused whether declared or not.
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return redis.call('GET', KEYS[1])")
        .query_async(&mut conn)
        .await
        .expect("SCRIPT LOAD is allowed");
    let e = refused(
        &mut conn,
        redis::cmd("EVALSHA").arg(&sha).arg(1).arg(&foreign),
        "a script reading a declared key of another prefix",
    )
    .await;
    assert_eq!(e.code(), Some("NOPERM"), "{e}");
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(format!("return redis.call('GET', '{foreign}')"))
        .query_async(&mut conn)
        .await
        .expect("SCRIPT LOAD is allowed");
    let e = refused(
        &mut conn,
        redis::cmd("EVALSHA").arg(&sha).arg(0),
        "a script reading an undeclared key of another prefix",
    )
    .await;
    assert!(e.to_string().contains("can't access"), "{e}");
    // Subscribing to another prefix's channel is refused too.
    let info = redis::IntoConnectionInfo::into_connection_info(url).expect("url");
    let settings = info
        .redis_settings()
        .clone()
        .set_username(user)
        .set_password(password);
    let mut pubsub = redis::Client::open(info.set_redis_settings(settings))
        .expect("client")
        .get_async_pubsub()
        .await
        .expect("a pub/sub connection");
    let e = pubsub
        .subscribe(format!("{other}{{lock:x}}:released"))
        .await
        .expect_err("subscribing to another prefix's channel is refused");
    assert_eq!(e.code(), Some("NOPERM"), "{e}");
}

/// Baton runs every service (locks with a woken waiter, semaphores, elections, rate limits,
/// autocomplete) as an ACL user with exactly the rules docs/security.md gives for a standalone
/// Redis, none of its commands refused (`ACL LOG` stays empty); that user cannot read, write or
/// subscribe outside its prefix, even through a script of its own.
#[tokio::test]
async fn baton_runs_as_a_user_limited_to_its_prefix() {
    let redis = RedisServer::start_standalone().await;
    let mut admin = redis.client().await;
    let prefix = unique_prefix();
    let other = unique_prefix();
    let () = redis::cmd("SET")
        .arg(format!("{other}{{lock:x}}"))
        .arg("theirs")
        .query_async(&mut admin)
        .await
        .expect("another tenant's key");
    create_user(&mut admin, &["standalone"], "baton-a", "pw-a", &prefix).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = RedisConfig::new(redis.url());
    config.access = RedisAccess {
        username: Some("baton-a".to_owned()),
        password_file: Some(password_file(dir.path(), "pw-a")),
        ..RedisAccess::default()
    };
    let baton = Baton::start_on(config, |c| {
        c.redis.key_prefix = prefix.clone();
        crate::patient(c);
    })
    .await;
    exercise(baton.addr(), "acl").await;
    assert_eq!(
        acl_log(&mut admin).await,
        [],
        "no command of Baton was refused"
    );
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut admin)
        .await
        .expect("KEYS");
    assert!(!keys.is_empty(), "Baton wrote under its prefix");
    assert_confined(&redis.url(), "baton-a", "pw-a", &prefix, &other).await;
    let theirs: String = redis::cmd("GET")
        .arg(format!("{other}{{lock:x}}"))
        .query_async(&mut admin)
        .await
        .expect("GET");
    assert_eq!(theirs, "theirs", "the other tenant's key is untouched");
}

/// A standalone Redis and a Baton running as a user of the documented standalone rules
/// narrowed by `rule` (an `ACL SETUSER` rule), with the folder holding its password file.
async fn narrowed(user: &str, rule: &str) -> (RedisServer, Baton, tempfile::TempDir) {
    let redis = RedisServer::start_standalone().await;
    let mut admin = redis.client().await;
    let prefix = unique_prefix();
    create_user(&mut admin, &["standalone"], user, "pw", &prefix).await;
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(user)
        .arg(rule)
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = RedisConfig::new(redis.url());
    config.access = RedisAccess {
        username: Some(user.to_owned()),
        password_file: Some(password_file(dir.path(), "pw")),
        ..RedisAccess::default()
    };
    let baton = Baton::start_on(config, |c| {
        c.redis.key_prefix = prefix.clone();
        crate::patient(c);
    })
    .await;
    (redis, baton, dir)
}

/// A Redis user missing a command a script needs (here `ZMSCORE`, called by the autocomplete
/// scripts): the call fails `UNAVAILABLE` naming the refusal, not `INTERNAL`.
#[tokio::test]
async fn a_rule_too_narrow_is_unavailable_with_its_cause() {
    let (_redis, baton, _dir) = narrowed("narrow", "-zmscore").await;
    let mut autocomplete = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let status = autocomplete
        .add(pb::AutocompleteServiceAddRequest {
            dictionary: "d".to_owned(),
            terms: vec![pb::AutocompleteTerm {
                display: "Paris".to_owned(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect_err("the script cannot run ZMSCORE");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("can't run this command"),
        "{status:?}"
    );
}

/// A Redis user without rights on Baton's pub/sub channels (Redis 7's default for a new user):
/// grants and releases still work and say what they did (a release made answers `was_held`, not
/// UNAVAILABLE after the script's writes), and a call that would wait fails UNAVAILABLE naming
/// NOPERM at once, changing nothing.
#[tokio::test]
async fn a_user_without_channels_releases_and_refuses_to_wait() {
    let (_redis, baton, _dir) = narrowed("mute", "resetchannels").await;
    let channel = channel(baton.addr()).await;
    let mut locks = LockServiceClient::new(channel.clone());
    let acquire = |wait_ms: u64| pb::LockServiceAcquireRequest {
        name: "x".to_owned(),
        ttl: Some(ms(10_000)),
        wait_timeout: Some(ms(wait_ms)),
        ..Default::default()
    };
    let held = locks
        .acquire(acquire(0))
        .await
        .expect("a grant")
        .into_inner();
    assert!(held.acquired, "{held:?}");
    let status = locks
        .acquire(acquire(5_000))
        .await
        .expect_err("a wait cannot subscribe");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("NOPERM"), "{status:?}");
    let token = held.lease.expect("a lease").token;
    let released = locks
        .release(pb::LockServiceReleaseRequest {
            name: "x".to_owned(),
            token,
        })
        .await
        .expect("a release whose wake-up is refused still answers")
        .into_inner();
    assert!(released.was_held, "{released:?}");
    let again = locks
        .acquire(acquire(0))
        .await
        .expect("a grant")
        .into_inner();
    assert!(
        again.acquired,
        "the lock is free after the release: {again:?}"
    );

    let mut semaphores = SemaphoreServiceClient::new(channel);
    let permit = semaphores
        .acquire(pb::SemaphoreServiceAcquireRequest {
            name: "s".to_owned(),
            limit: 1,
            permits: 1,
            ttl: Some(ms(10_000)),
            ..Default::default()
        })
        .await
        .expect("a permit")
        .into_inner();
    assert!(permit.acquired, "{permit:?}");
    let released = semaphores
        .release(pb::SemaphoreServiceReleaseRequest {
            name: "s".to_owned(),
            token: permit.permit.expect("a permit").token,
        })
        .await
        .expect("a release whose wake-up is refused still answers")
        .into_inner();
    assert!(released.was_held, "{released:?}");
}

/// On a Cluster (over mutual TLS), the standalone rules plus the Cluster line of
/// docs/security.md are all Baton's router and sharded subscriber need: every service works and
/// nothing is refused; the user stays confined to its prefix.
#[tokio::test]
async fn the_cluster_rules_are_enough_over_tls() {
    let pki = Pki::generate();
    let redis = TlsRedis::start_cluster(&pki).await;
    let mut admin = redis.admin().await;
    let prefix = unique_prefix();
    create_user(
        &mut admin,
        &["standalone", "cluster"],
        "baton-c",
        "pw-c",
        &prefix,
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = RedisConfig::with_topology(Topology::Cluster {
        seeds: vec![redis.url()],
    });
    config.access = RedisAccess {
        username: Some("baton-c".to_owned()),
        password_file: Some(password_file(dir.path(), "pw-c")),
        tls: tls(&pki),
    };
    config.connect_timeout = crate::tls::TIMEOUT;
    config.command_timeout = crate::tls::TIMEOUT;
    let baton = Baton::start_on(config, |c| {
        c.redis.key_prefix = prefix.clone();
        crate::patient(c);
    })
    .await;
    exercise(baton.addr(), "acl-cluster").await;
    assert_eq!(
        acl_log(&mut admin).await,
        [],
        "no command of Baton was refused"
    );
}

/// With Sentinel (over mutual TLS), the standalone rules plus `+role` on the master and the
/// Sentinel rules on the Sentinel are all Baton needs: every service works and nothing is
/// refused on either.
#[tokio::test]
async fn the_sentinel_rules_are_enough_over_tls() {
    let pki = Pki::generate();
    let master = TlsRedis::start(&pki).await;
    let sentinel = TlsSentinel::start(&pki, &master).await;
    let prefix = unique_prefix();
    let mut admin = master.admin().await;
    create_user(
        &mut admin,
        &["standalone", "sentinel"],
        "baton-s",
        "pw-s",
        &prefix,
    )
    .await;
    let mut sentinel_admin = sentinel.admin(&pki).await;
    create_user(
        &mut sentinel_admin,
        &["sentinel-node"],
        "baton-s",
        "pw-s",
        &prefix,
    )
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = RedisConfig::with_topology(Topology::Sentinel {
        sentinels: vec![sentinel.url()],
        master: TlsSentinel::MASTER.to_owned(),
        node_url: Some(sentinel.url()),
    });
    config.access = RedisAccess {
        username: Some("baton-s".to_owned()),
        password_file: Some(password_file(dir.path(), "pw-s")),
        tls: tls(&pki),
    };
    config.connect_timeout = crate::tls::TIMEOUT;
    config.command_timeout = crate::tls::TIMEOUT;
    let baton = Baton::start_on(config, |c| {
        c.redis.key_prefix = prefix.clone();
        crate::patient(c);
    })
    .await;
    exercise(baton.addr(), "acl-sentinel").await;
    assert_eq!(
        acl_log(&mut admin).await,
        [],
        "nothing refused on the master"
    );
    assert_eq!(
        acl_log(&mut sentinel_admin).await,
        [],
        "nothing refused on the Sentinel"
    );
}

/// Mutual TLS with the test CA and client certificate.
fn tls(pki: &Pki) -> RedisTls {
    RedisTls {
        ca: Some(pki.path("ca.pem")),
        cert: Some(pki.path("client.pem")),
        key: Some(pki.path("client.key")),
        insecure: false,
    }
}
