//! Two Batons with different key prefixes on one Redis, each as an ACL user limited to its own
//! prefix: the same names give independent locks, semaphores, elections, dictionaries, recent
//! lists and rate limits; a release in one never reaches the waiters of the other; and neither
//! user can read the other's keys.

use std::time::Duration;

use baton::{
    config::{RedisAccess, RedisConfig},
    proto::v1::{
        self as pb, autocomplete_service_client::AutocompleteServiceClient,
        election_service_campaign_response::Event as CampaignEvent,
        election_service_client::ElectionServiceClient,
        rate_limit_service_client::RateLimitServiceClient,
        semaphore_service_client::SemaphoreServiceClient,
    },
};

use crate::{
    WAKE_UP,
    acl::{assert_confined, documented_rules},
    support::{
        Baton, RedisServer, channel,
        lease::{next_event, wait_for_waiters},
        lock, ms, semaphore, unique_prefix, wait_until, within,
    },
};

/// A tenant: a Baton running as its own ACL user under its own prefix.
struct Tenant {
    baton: Baton,
    user: &'static str,
    password: String,
    _dir: tempfile::TempDir,
}

impl Tenant {
    /// Makes `user` with the documented rules for a fresh prefix and starts a Baton as it.
    async fn start(redis: &RedisServer, user: &'static str) -> Self {
        let prefix = unique_prefix();
        let password = format!("pw-{user}");
        let mut admin = redis.client().await;
        for cmd in documented_rules("standalone", user, &password, &prefix) {
            let () = cmd.query_async(&mut admin).await.expect("ACL SETUSER");
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("password");
        std::fs::write(&file, &password).expect("writing the password");
        let mut config = RedisConfig::new(redis.url());
        config.access = RedisAccess {
            username: Some(user.to_owned()),
            password_file: Some(file),
            ..RedisAccess::default()
        };
        let baton = Baton::start_on(config, |c| {
            c.redis.key_prefix = prefix;
            crate::patient(c);
        })
        .await;
        Self {
            baton,
            user,
            password,
            _dir: dir,
        }
    }

    fn prefix(&self) -> &str {
        self.baton.prefix()
    }
}

/// The number of subscribers of `channel` (`PUBSUB NUMSUB`).
async fn subscribers(redis: &RedisServer, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut redis.client().await)
        .await
        .expect("PUBSUB NUMSUB");
    n
}

/// Same names, independent state: each Baton grants its own lock, semaphore permit and
/// leadership of the same name at once, keeps its own dictionary, recent list and rate limit
/// count; a release in one Baton publishes on a channel the other's waiter does not listen to,
/// and leaves that waiter waiting until its own Baton's release wakes it. Every key lies under
/// its Baton's prefix, and each Baton's user is refused the other's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_batons_on_one_redis_share_nothing() {
    let redis = RedisServer::start_standalone().await;
    let a = Tenant::start(&redis, "tenant-a").await;
    let b = Tenant::start(&redis, "tenant-b").await;
    let (channel_a, channel_b) = (channel(a.baton.addr()).await, channel(b.baton.addr()).await);

    // Locks: the same name held in both at once; the holders are each Baton's own.
    let (mut locks_a, mut locks_b) = (a.baton.client().await, b.baton.client().await);
    let lease_a = lock::acquired(&mut locks_a, "shared", 30_000, None, "owner-a").await;
    let lease_b = lock::acquired(&mut locks_b, "shared", 30_000, None, "owner-b").await;
    assert_ne!(lease_a.token, lease_b.token);
    assert_eq!(
        lock::describe(&mut locks_a, "shared").await.owner,
        "owner-a"
    );
    assert_eq!(
        lock::describe(&mut locks_b, "shared").await.owner,
        "owner-b"
    );

    // No cross wake-ups: B's waiter listens on B's channel only; A's release publishes on A's.
    let waiter = {
        let mut locks_b = locks_b.clone();
        tokio::spawn(async move {
            lock::acquire(&mut locks_b, "shared", 30_000, Some(20_000), "waiter-b").await
        })
    };
    wait_for_waiters(&locks_b, "shared", 1).await;
    let released = |prefix: &str| format!("{prefix}{{lock:shared}}:released");
    assert_eq!(subscribers(&redis, &released(a.prefix())).await, 0);
    assert_eq!(subscribers(&redis, &released(b.prefix())).await, 1);
    assert!(
        lock::release(&mut locks_a, "shared", &lease_a.token)
            .await
            .was_held
    );
    assert!(!lock::describe(&mut locks_a, "shared").await.held);
    let still = lock::describe(&mut locks_b, "shared").await;
    assert!(
        still.held && still.owner == "owner-b" && still.waiters == 1,
        "A's release changed nothing in B: {still:?}"
    );
    assert!(
        !waiter.is_finished(),
        "B's waiter was not granted by A's release"
    );
    assert!(
        lock::release(&mut locks_b, "shared", &lease_b.token)
            .await
            .was_held
    );
    let granted = within(WAKE_UP, waiter, "B's waiter to be woken by B's release")
        .await
        .expect("the waiter task");
    assert!(granted.acquired, "{granted:?}");

    // Semaphores: one permit of the same name in each.
    let mut sem_a = SemaphoreServiceClient::new(channel_a.clone());
    let mut sem_b = SemaphoreServiceClient::new(channel_b.clone());
    semaphore::acquired(&mut sem_a, semaphore::request("pool", 1, 1, 30_000)).await;
    semaphore::acquired(&mut sem_b, semaphore::request("pool", 1, 1, 30_000)).await;
    semaphore::refused(&mut sem_a, semaphore::request("pool", 1, 1, 30_000)).await;

    // Elections: each Baton elects its own leader of the same name at once.
    let campaign = |value: &[u8]| pb::ElectionServiceCampaignRequest {
        name: "leader".to_owned(),
        value: value.to_vec(),
        ttl: Some(ms(10_000)),
    };
    let mut elections_a = ElectionServiceClient::new(channel_a.clone());
    let mut elections_b = ElectionServiceClient::new(channel_b.clone());
    let mut leaders = Vec::new();
    for (elections, value) in [(&mut elections_a, b"a"), (&mut elections_b, b"b")] {
        let mut stream = elections
            .campaign(campaign(value))
            .await
            .expect("Campaign")
            .into_inner();
        match next_event(&mut stream, Duration::from_secs(5), "an election").await {
            CampaignEvent::Elected(_) => {}
            other => panic!("expected elected, got {other:?}"),
        }
        leaders.push(stream);
    }
    for (elections, value) in [(&mut elections_a, b"a"), (&mut elections_b, b"b")] {
        let leader = elections
            .leader(pb::ElectionServiceLeaderRequest {
                name: "leader".to_owned(),
            })
            .await
            .expect("Leader")
            .into_inner();
        assert_eq!(
            leader.leader.map(|l| l.value),
            Some(value.to_vec()),
            "each Baton's own leader"
        );
    }

    // Dictionaries and recent lists of the same name hold each Baton's own terms.
    let mut ac_a = AutocompleteServiceClient::new(channel_a.clone());
    let mut ac_b = AutocompleteServiceClient::new(channel_b.clone());
    for (ac, display) in [(&mut ac_a, "Paris"), (&mut ac_b, "Berlin")] {
        ac.add(pb::AutocompleteServiceAddRequest {
            dictionary: "cities".to_owned(),
            terms: vec![pb::AutocompleteTerm {
                display: display.to_owned(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect("Add");
        ac.record_recent(pb::AutocompleteServiceRecordRecentRequest {
            list: "recent".to_owned(),
            display: display.to_owned(),
            max_items: 10,
            ttl: Some(ms(60_000)),
            ..Default::default()
        })
        .await
        .expect("RecordRecent");
    }
    for (ac, own, other) in [(&mut ac_a, "Paris", "be"), (&mut ac_b, "Berlin", "pa")] {
        let found = ac
            .complete(pb::AutocompleteServiceCompleteRequest {
                dictionary: "cities".to_owned(),
                query: other.to_owned(),
                limit: 10,
                ..Default::default()
            })
            .await
            .expect("Complete")
            .into_inner();
        assert!(found.suggestions.is_empty(), "{own}'s Baton: {found:?}");
        let count = ac
            .describe(pb::AutocompleteServiceDescribeRequest {
                dictionary: "cities".to_owned(),
            })
            .await
            .expect("Describe")
            .into_inner()
            .term_count;
        assert_eq!(count, 1, "{own}'s dictionary");
        let recent = ac
            .list_recent(pb::AutocompleteServiceListRecentRequest {
                list: "recent".to_owned(),
                limit: 10,
                ..Default::default()
            })
            .await
            .expect("ListRecent")
            .into_inner();
        let items: Vec<_> = recent.items.iter().map(|i| i.display.as_str()).collect();
        assert_eq!(items, [own]);
    }

    // A change of a dictionary's features (its indexes dropped, then built again in the
    // background) runs with the documented rights too.
    for features in [vec![], vec![pb::AutocompleteFeature::Words]] {
        ac_a.configure(pb::AutocompleteServiceConfigureRequest {
            dictionary: "cities".to_owned(),
            features: features.iter().map(|f| i32::from(*f)).collect(),
        })
        .await
        .expect("Configure");
        wait_until(
            Duration::from_secs(10),
            "the features change to end",
            || {
                let mut ac = ac_a.clone();
                async move {
                    let d = ac
                        .describe(pb::AutocompleteServiceDescribeRequest {
                            dictionary: "cities".to_owned(),
                        })
                        .await
                        .map_err(|s| format!("{s:?}"))?
                        .into_inner();
                    if d.change.is_none() {
                        Ok(d)
                    } else {
                        Err(format!("{d:?}"))
                    }
                }
            },
        )
        .await;
    }
    let found = ac_a
        .complete(pb::AutocompleteServiceCompleteRequest {
            dictionary: "cities".to_owned(),
            query: "par".to_owned(),
            limit: 10,
            mode: pb::AutocompleteMatchMode::WordPrefix.into(),
            ..Default::default()
        })
        .await
        .expect("Complete by word prefix after the rebuild")
        .into_inner();
    assert_eq!(found.suggestions.len(), 1, "{found:?}");

    // Rate limits: the same key counts separately.
    let check = || pb::RateLimitServiceCheckRequest {
        key: "api".to_owned(),
        limit: 1,
        period: Some(ms(60_000)),
        algorithm: pb::RateLimitAlgorithm::FixedWindow.into(),
        ..Default::default()
    };
    let rl_a = RateLimitServiceClient::new(channel_a);
    let rl_b = RateLimitServiceClient::new(channel_b);
    let mut decisions = Vec::new();
    for mut rl in [rl_a.clone(), rl_a, rl_b] {
        let answer = rl.check(check()).await.expect("Check").into_inner();
        assert_eq!(
            answer.decided_by(),
            pb::RateLimitDecidedBy::Redis,
            "{answer:?}"
        );
        decisions.push(answer.allowed);
    }
    assert_eq!(
        decisions,
        [true, false, true],
        "A's count does not spend B's"
    );

    // Every key lies under one of the two prefixes, and both Batons wrote.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut redis.client().await)
        .await
        .expect("KEYS");
    let (under_a, under_b) = (
        keys.iter().filter(|k| k.starts_with(a.prefix())).count(),
        keys.iter().filter(|k| k.starts_with(b.prefix())).count(),
    );
    assert!(under_a > 0 && under_b > 0, "{keys:?}");
    assert_eq!(
        under_a + under_b,
        keys.len(),
        "a key outside both prefixes: {keys:?}"
    );

    // Each user is refused the other's keys (B's lock `x` exists while A's user tries it).
    lock::acquired(&mut locks_b, "x", 30_000, None, "owner-b").await;
    lock::acquired(&mut locks_a, "x", 30_000, None, "owner-a").await;
    assert_confined(&redis.url(), a.user, &a.password, a.prefix(), b.prefix()).await;
    assert_confined(&redis.url(), b.user, &b.password, b.prefix(), a.prefix()).await;
    drop(leaders);
}
