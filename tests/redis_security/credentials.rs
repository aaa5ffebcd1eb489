//! `--redis-username` and `--redis-password-file`: refused credentials stop Baton at start, a
//! rotated Secret is used by new connections while Baton keeps serving (its `Hold` streams
//! included), a password changed in Redis alone is `UNAVAILABLE` with its cause and served again
//! once the file agrees, and no password ever reaches the log.

use std::time::Duration;

use baton::proto::v1::lock_service_hold_response::Event as HoldEvent;
use tonic_health::pb::{health_check_response::ServingStatus, health_client::HealthClient};

use crate::{
    acl::documented_rules,
    support::{
        BatonProcess, RedisServer, baton_command, channel, lease::next_event, lock, run_baton,
        tls::SecretFile, unique_prefix, wait_for_health, wait_until,
    },
};

/// How long Baton may take to serve again once the password file and Redis agree.
const RECOVERY: Duration = Duration::from_secs(10);

/// A password no other test uses, easy to find in a log.
fn password(what: &str) -> String {
    format!("{what}-{}", uuid::Uuid::new_v4().simple())
}

/// Makes `user` on `redis` with the standalone rules of docs/security.md for `prefix`.
async fn make_user(redis: &RedisServer, user: &str, password: &str, prefix: &str) {
    let mut admin = redis.client().await;
    for cmd in documented_rules("standalone", user, password, prefix) {
        let () = cmd.query_async(&mut admin).await.expect("ACL SETUSER");
    }
}

/// Runs `ACL SETUSER user RULES...` on `redis`.
async fn acl(redis: &RedisServer, user: &str, rules: &[&str]) {
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(user)
        .arg(rules)
        .query_async(&mut redis.client().await)
        .await
        .expect("ACL SETUSER");
}

/// Closes every connection of `user` (`CLIENT KILL USER`), as a Redis restart or a network
/// blip would, so that Baton has to connect again; returns how many there were.
async fn kill_connections(redis: &RedisServer, user: &str) -> i64 {
    crate::support::client_kill(&mut redis.client().await, &["USER", user])
        .await
        .expect("CLIENT KILL USER")
}

/// A wrong password, or a user Redis does not know, stops `baton serve` with exit code 2 and a
/// message naming the refusal, without showing any password; so does a user named twice.
#[tokio::test]
async fn refused_credentials_stop_baton_at_start() {
    let redis = RedisServer::start_standalone().await;
    let prefix = unique_prefix();
    let right = password("right");
    make_user(&redis, "baton-start", &right, &prefix).await;
    let wrong = password("wrong");
    let mut secret = SecretFile::new("password", &format!("{wrong}\n"));
    for (user, what) in [
        ("baton-start", "a wrong password"),
        ("nobody", "a user Redis does not know"),
    ] {
        let mut command = baton_command();
        command
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--redis-url",
                &redis.url(),
            ])
            .args(["--redis-username", user, "--redis-password-file"])
            .arg(secret.path());
        let (status, stderr) = run_baton(command, Duration::from_secs(20)).await;
        assert_eq!(status.code(), Some(2), "{what}: {status}\n{stderr}");
        assert!(
            stderr.contains("Redis refused Baton's credentials") && stderr.contains("WRONGPASS"),
            "{what}: the refusal is named:\n{stderr}"
        );
        assert!(
            !stderr.contains(&wrong) && !stderr.contains(&right),
            "{what}: no password is shown:\n{stderr}"
        );
    }
    secret.write(&format!("{right}\n"));
    let url = format!("redis://someone@127.0.0.1:{}", redis.port());
    let mut command = baton_command();
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--redis-url", &url])
        .args(["--redis-username", "baton-start", "--redis-password-file"])
        .arg(secret.path());
    let (status, stderr) = run_baton(command, Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(2), "{status}\n{stderr}");
    assert!(
        stderr.contains("--redis-username") && stderr.contains("already names a user"),
        "{stderr}"
    );
}

/// A rotation done right, as docs/security.md describes it: Redis accepts both passwords, the
/// Secret is updated (the kubelet's atomic swap), Baton's connections are cut, then the old
/// password is removed and the connections cut again. Baton keeps serving throughout: its
/// connections come back with the new password (the only one Redis accepts at the end), a `Hold`
/// stream keeps its lease, a waiter is still woken by pub/sub, and the log says the file changed
/// without ever showing a password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_password_file_is_used_by_new_connections() {
    let redis = RedisServer::start_standalone().await;
    let prefix = unique_prefix();
    let old = password("old");
    let new = password("new");
    make_user(&redis, "baton-rot", &old, &prefix).await;
    let mut secret = SecretFile::new("password", &format!("{old}\n"));
    let file = secret.path().display().to_string();
    let url = redis.url();
    let baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "--redis-username",
        "baton-rot",
        "--redis-password-file",
        &file,
    ])
    .await;
    let mut health = HealthClient::new(channel(baton.addr()).await);
    wait_for_health(&mut health, "readiness", ServingStatus::Serving, RECOVERY).await;
    let mut client = baton.client().await;
    let (mut stream, lease) = lock::held(
        &mut client,
        lock::hold_request("kept", 3000, None, "holder"),
    )
    .await;

    acl(&redis, "baton-rot", &[&format!(">{new}")]).await;
    secret.write(&format!("{new}\n"));
    assert!(kill_connections(&redis, "baton-rot").await > 0);
    acl(&redis, "baton-rot", &[&format!("<{old}")]).await;
    // Whatever connected since uses the new password, but it goes too: from here on every
    // connection of Baton's is made with a password read from the file after the swap.
    kill_connections(&redis, "baton-rot").await;

    // New connections authenticate with the new password: calls succeed again (bounded).
    wait_until(RECOVERY, "Baton to serve with the new password", || {
        let mut client = client.clone();
        async move {
            match client
                .acquire(lock::acquire_request("after", 10_000, None, "x"))
                .await
            {
                Ok(r) if r.get_ref().acquired => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    // The lease held across the rotation is still renewed, never lost.
    for _ in 0..3 {
        match next_event(
            &mut stream,
            Duration::from_secs(5),
            "a renewal after the rotation",
        )
        .await
        {
            HoldEvent::Renewed(_) => {}
            other => panic!("the held lease through the rotation: {other:?}"),
        }
    }
    // The subscriber came back too: a waiter is woken when the stream closes.
    let waiter = {
        let mut client = client.clone();
        tokio::spawn(
            async move { lock::acquire(&mut client, "kept", 10_000, Some(20_000), "w").await },
        )
    };
    crate::support::lease::wait_for_waiters(&client, "kept", 1).await;
    drop(stream);
    let granted = crate::support::within(crate::WAKE_UP, waiter, "the waiter to be woken")
        .await
        .expect("the waiter task");
    assert!(granted.acquired, "{granted:?}");
    assert_ne!(granted.lease.map(|l| l.token), Some(lease.token));

    let stderr = baton.stderr();
    assert!(
        stderr.contains("the Redis password file changed"),
        "the change is logged:\n{stderr}"
    );
    assert!(
        stderr.contains(&format!("redis_password_file={file}")),
        "the startup line names the file:\n{stderr}"
    );
    assert!(
        !stderr.contains(&old) && !stderr.contains(&new),
        "no password is ever logged:\n{stderr}"
    );
}

/// Redis's password changes before the Secret does (a rotation in the wrong order): once Baton's
/// connections are gone, calls fail `UNAVAILABLE` naming `WRONGPASS` (never `INTERNAL`) and
/// readiness turns NOT_SERVING; as soon as the file holds the new password, Baton serves again
/// without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_changed_in_redis_alone_is_unavailable_until_the_file_agrees() {
    let redis = RedisServer::start_standalone().await;
    let prefix = unique_prefix();
    let old = password("old");
    let new = password("new");
    make_user(&redis, "baton-late", &old, &prefix).await;
    let mut secret = SecretFile::new("password", &format!("{old}\n"));
    let file = secret.path().display().to_string();
    let url = redis.url();
    let baton = BatonProcess::spawn(&[
        "--redis-url",
        &url,
        "--key-prefix",
        &prefix,
        "--redis-username",
        "baton-late",
        "--redis-password-file",
        &file,
    ])
    .await;
    let mut health = HealthClient::new(channel(baton.addr()).await);
    wait_for_health(&mut health, "readiness", ServingStatus::Serving, RECOVERY).await;
    let mut client = baton.client().await;
    lock::acquired(&mut client, "before", 10_000, None, "a").await;

    acl(&redis, "baton-late", &["resetpass", &format!(">{new}")]).await;
    kill_connections(&redis, "baton-late").await;
    let status = wait_until(RECOVERY, "a call refused for the password", || {
        let mut client = client.clone();
        async move {
            match client
                .acquire(lock::acquire_request("during", 10_000, None, "b"))
                .await
            {
                Err(status) if status.message().contains("WRONGPASS") => Ok(status),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    wait_for_health(
        &mut health,
        "readiness",
        ServingStatus::NotServing,
        RECOVERY,
    )
    .await;

    secret.write(&format!("{new}\n"));
    wait_for_health(&mut health, "readiness", ServingStatus::Serving, RECOVERY).await;
    lock::acquired(&mut client, "after", 10_000, None, "c").await;
    let stderr = baton.stderr();
    assert!(
        stderr.contains("refuses Baton's credentials"),
        "the refusal is logged:\n{stderr}"
    );
    assert!(
        !stderr.contains(&old) && !stderr.contains(&new),
        "no password is ever logged:\n{stderr}"
    );
}
