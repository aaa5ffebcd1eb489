//! The election scripts' scheduling rules, each checked on a crafted Redis state by calling the
//! scripts directly through their typed builders (`baton::election::scripts`): no Baton, no gRPC,
//! no waiting. The scripts themselves make the leaderships and registrations a test starts from;
//! a candidate's registration is then kept for an hour (as its Baton would keep renewing it), and
//! one that should have ended is ended by moving its expiry into the past, so nothing depends on
//! time passing. `cargo test --test election scripts::` runs them alone, in a few seconds.

use std::time::Duration;

use baton::{
    election::scripts::{self, Campaign, ElectionKeys, Proclaim},
    lease::FENCE_RETENTION,
    redis::{
        Notifier, Redis, Wake,
        reply::{int, string},
    },
};
use futures::FutureExt;
use redis::{Script, Value};
use tokio_util::sync::CancellationToken;

use crate::{
    STEP,
    support::{
        RedisConn, RedisServer,
        lease::{pttl, redis_time},
        random_token, unique_prefix, within,
    },
};

/// The election every test here works on.
const NAME: &str = "primary";

/// A leadership's ttl: nothing expires while a test runs.
const TTL: Duration = Duration::from_secs(60);

/// How long a candidate's registration is kept once the script registered it.
const KEPT_MS: i64 = 3_600_000;

/// What `campaign.lua` answered.
#[derive(Debug)]
enum Outcome {
    /// Elected: the token, the term, the remaining ms.
    Elected { token: String, term: u64, ttl: i64 },
    /// Kept out: ms left on the leader's lease (-2: nobody leads), and ms until the state may
    /// change without a message (-1: never).
    Refused { remaining: i64, change: i64 },
}

/// What `leader.lua` answered.
#[derive(Debug, PartialEq, Eq)]
struct State {
    /// The leader's term, value, revision and remaining ms.
    leader: Option<(u64, String, u64, i64)>,
    /// The last term issued.
    last: u64,
    /// Candidates registered.
    candidates: i64,
}

/// Election [`NAME`] on a Redis shared by the binary's tests, under a key prefix of its own, with
/// the election scripts loaded for it.
struct Fixture {
    server: RedisServer,
    redis: Redis,
    conn: RedisConn,
    keys: ElectionKeys,
    campaign: Script,
    resign: Script,
    abandon: Script,
    proclaim: Script,
    renew: Script,
    leader: Script,
}

fn number(v: &Value) -> u64 {
    u64::try_from(int(v).expect("an integer")).expect("not negative")
}

impl Fixture {
    async fn start() -> Self {
        let server = RedisServer::start().await;
        let mut config = server.redis_config();
        config.key_prefix = unique_prefix();
        let redis = Redis::new(&config).expect("redis config");
        Self {
            conn: server.conn().await,
            keys: ElectionKeys::new(redis.key_prefix(), NAME),
            campaign: redis.script(scripts::CAMPAIGN),
            resign: redis.script(scripts::RESIGN),
            abandon: redis.script(scripts::ABANDON),
            proclaim: redis.script(scripts::PROCLAIM),
            renew: redis.script(scripts::RENEW),
            leader: Script::new(scripts::LEADER),
            redis,
            server,
        }
    }

    /// The keys of another election, in the same hash slot as [`NAME`]'s on a Cluster.
    fn other_keys(&self) -> (String, ElectionKeys) {
        let [_, other] = self.server.names_in_one_slot("election", [NAME, "standby"]);
        let keys = ElectionKeys::new(self.redis.key_prefix(), &other);
        (other, keys)
    }

    /// Runs `campaign.lua` on `keys` for `candidate` ("" for a caller that does not wait) with a
    /// fresh token and `value`.
    async fn campaign_in(&self, keys: &ElectionKeys, candidate: &str, value: &str) -> Outcome {
        self.campaign_as(keys, candidate, value, random_token())
            .await
    }

    /// Runs `campaign.lua` on `keys` for `candidate` with the token `token` and `value`.
    async fn campaign_as(
        &self,
        keys: &ElectionKeys,
        candidate: &str,
        value: &str,
        token: String,
    ) -> Outcome {
        let invocation = Campaign {
            token: &token,
            ttl: TTL,
            candidate,
            wait_left: if candidate.is_empty() {
                Duration::ZERO
            } else {
                Duration::from_secs(3600)
            },
            value: value.as_bytes(),
        }
        .invocation(&self.campaign, keys);
        let reply: Vec<Value> = self.redis.eval(&invocation).await.expect("campaign.lua");
        if !candidate.is_empty() {
            self.keep_registered(candidate).await;
        }
        match reply.as_slice() {
            [elected, granted, term, ttl] if int(elected).expect("a flag") == 1 => {
                let granted = string(granted).expect("the token");
                assert_eq!(granted, token, "the grant carries the token asked for");
                Outcome::Elected {
                    token: granted,
                    term: number(term),
                    ttl: int(ttl).expect("the ttl"),
                }
            }
            [_, remaining, change] => Outcome::Refused {
                remaining: int(remaining).expect("remaining"),
                change: int(change).expect("change"),
            },
            other => panic!("campaign.lua answered {other:?}"),
        }
    }

    /// Runs `campaign.lua` on [`NAME`] for `candidate`.
    async fn campaign(&self, candidate: &str, value: &str) -> Outcome {
        self.campaign_in(&self.keys, candidate, value).await
    }

    /// Runs `campaign.lua` for `candidate`, which must be elected: (token, term).
    async fn elected(&self, candidate: &str, value: &str) -> (String, u64) {
        match self.campaign(candidate, value).await {
            Outcome::Elected { token, term, ttl } => {
                assert_eq!(ttl, 60_000, "the ttl asked for");
                (token, term)
            }
            other => panic!("expected {candidate:?} to be elected, got {other:?}"),
        }
    }

    /// Runs `campaign.lua` for `candidate`, which must be kept out: (remaining, change).
    async fn refused(&self, candidate: &str) -> (i64, i64) {
        match self.campaign(candidate, "v").await {
            Outcome::Refused { remaining, change } => (remaining, change),
            other => panic!("expected {candidate:?} to be kept out, got {other:?}"),
        }
    }

    /// Runs `resign.lua` for `token`: 1 when it led.
    async fn resign(&self, token: &str) -> i64 {
        self.resign_with(token, None).await
    }

    /// Runs `resign.lua` for `token`, as the clean-up of a leadership nobody saw when
    /// `clean_up` (the token then stays void that long).
    async fn resign_with(&self, token: &str, clean_up: Option<Duration>) -> i64 {
        let invocation = scripts::resign(&self.resign, &self.keys, token, clean_up);
        self.redis.eval(&invocation).await.expect("resign.lua")
    }

    /// Runs `abandon.lua` for `candidate`: 1 when it was registered.
    async fn abandon(&self, candidate: &str) -> i64 {
        self.abandon_with(candidate, None).await
    }

    /// Runs `abandon.lua` for `candidate`, which then stays void for `void` if given.
    async fn abandon_with(&self, candidate: &str, void: Option<Duration>) -> i64 {
        let invocation = scripts::abandon(&self.abandon, &self.keys, candidate, void);
        self.redis.eval(&invocation).await.expect("abandon.lua")
    }

    /// Runs `proclaim.lua`: (term, revision) when `token` leads.
    async fn proclaim(&self, token: &str, value: &str) -> Option<(u64, u64)> {
        let invocation = Proclaim {
            token,
            value: value.as_bytes(),
        }
        .invocation(&self.proclaim, &self.keys);
        let reply: Vec<Value> = self.redis.eval(&invocation).await.expect("proclaim.lua");
        match reply.as_slice() {
            [led, term, revision] if int(led).expect("a flag") == 1 => {
                Some((number(term), number(revision)))
            }
            [led] if int(led).expect("a flag") == 0 => None,
            other => panic!("proclaim.lua answered {other:?}"),
        }
    }

    /// Runs `renew.lua` for `leases` (keys, token, ttl) in one call: per leadership, its
    /// remaining ttl in ms, or the text of the error its renewal raised.
    async fn renew(
        &self,
        leases: &[(&ElectionKeys, &str, Option<Duration>)],
    ) -> Vec<Result<i64, String>> {
        let mut invocation = scripts::renewal(&self.renew);
        for (keys, token, ttl) in leases {
            scripts::add_to_renewal(&mut invocation, keys, token, *ttl);
        }
        let reply: Vec<Value> = self.redis.eval(&invocation).await.expect("renew.lua");
        reply
            .iter()
            .map(|entry| match entry {
                Value::Int(left) => Ok(*left),
                raised => Err(redis::from_redis_value_ref(raised).expect("an error's text")),
            })
            .collect()
    }

    /// Runs `leader.lua`.
    async fn state(&self) -> State {
        let reply: Vec<Value> = self
            .redis
            .eval(&scripts::leader(&self.leader, &self.keys))
            .await
            .expect("leader.lua");
        let [led, term, value, revision, remaining, last, candidates] = reply.as_slice() else {
            panic!("leader.lua answered {reply:?}");
        };
        State {
            leader: (int(led).expect("a flag") == 1).then(|| {
                (
                    number(term),
                    string(value).expect("the value"),
                    number(revision),
                    int(remaining).expect("remaining"),
                )
            }),
            last: number(last),
            candidates: int(candidates).expect("candidates"),
        }
    }

    /// The candidates' places, in order.
    async fn queue(&self) -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(&self.keys.queue)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn.clone())
            .await
            .expect("ZRANGE")
    }

    /// Keeps the registration of `candidate` for [`KEPT_MS`] from now, as its Baton would keep
    /// renewing it while it waits.
    async fn keep_registered(&self, candidate: &str) {
        let (now, _) = redis_time(&mut self.conn.clone()).await;
        let _: i64 = redis::cmd("ZADD")
            .arg(&self.keys.candidates)
            .arg("XX")
            .arg(i64::try_from(now).expect("a Redis time") + KEPT_MS)
            .arg(candidate)
            .query_async(&mut self.conn.clone())
            .await
            .expect("ZADD");
    }

    /// Moves the registration expiry of `candidate` into the past (1 ms after the epoch), as
    /// when its Baton stopped renewing it.
    async fn end_registration(&self, candidate: &str) {
        let changed: i64 = redis::cmd("ZADD")
            .arg(&self.keys.candidates)
            .arg("XX")
            .arg("CH")
            .arg(1)
            .arg(candidate)
            .query_async(&mut self.conn.clone())
            .await
            .expect("ZADD");
        assert_eq!(changed, 1, "{candidate} is not registered");
    }
}

/// Whether `ms` is within the last 5 s of `full` (wide margins: a busy machine).
fn about(ms: i64, full: i64) -> bool {
    (full - 5_000..=full).contains(&ms)
}

/// The first campaign of an empty election is elected at once with a term at least the Redis
/// clock in microseconds, its value at revision 0 and its ttl; the term is kept for the retention
/// past the lease; a caller that does not wait leaves no registration behind.
#[tokio::test]
async fn the_first_campaign_is_elected_with_a_term_and_its_value() {
    let f = Fixture::start().await;
    let (_, before_us) = redis_time(&mut f.conn.clone()).await;
    let (_, term) = f.elected("", "v").await;
    assert!(term >= before_us, "term {term} below the clock {before_us}");
    let state = f.state().await;
    let (led_term, value, revision, remaining) = state.leader.clone().expect("a leader");
    assert_eq!((led_term, value.as_str(), revision), (term, "v", 0));
    assert!(about(remaining, 60_000), "{remaining}");
    assert_eq!((state.last, state.candidates), (term, 0));
    let mut conn = f.conn.clone();
    let kept = i64::try_from((TTL + FENCE_RETENTION).as_millis()).expect("small");
    let term_ttl = pttl(&mut conn, &f.keys.term).await;
    assert!(about(term_ttl, kept), "the term key is kept {term_ttl} ms");
    assert!(about(pttl(&mut conn, &f.keys.leader).await, 60_000));
    assert_eq!(
        pttl(&mut conn, &f.keys.candidates).await,
        -2,
        "no registration"
    );
    assert_eq!(pttl(&mut conn, &f.keys.queue).await, -2, "no place");
}

/// A leader keeps every candidate out: the head of the queue is told the leader's remaining ttl,
/// which is also when it should look again without a message (its turn comes then); the one
/// behind it is told when the head's registration ends. Candidates queue in arrival order, and a
/// candidate trying again keeps its place.
#[tokio::test]
async fn a_leader_keeps_candidates_out_in_arrival_order() {
    let f = Fixture::start().await;
    f.elected("", "a").await;
    let (remaining, change) = f.refused("b").await;
    assert!(about(remaining, 60_000), "{remaining}");
    assert_eq!(
        change, remaining,
        "b is next: it may look again at the leader's expiry"
    );
    let (remaining, change) = f.refused("c").await;
    assert!(about(remaining, 60_000), "{remaining}");
    assert!(about(change, KEPT_MS), "c waits for b: {change}");
    f.refused("b").await;
    assert_eq!(f.queue().await, ["b", "c"]);
    assert_eq!(f.state().await.candidates, 2);
    // Neither the head nor a caller that does not wait gets in while someone leads.
    let (remaining, change) = f.refused("").await;
    assert!(
        about(remaining, 60_000) && about(change, KEPT_MS),
        "{remaining} {change}"
    );
}

/// Once nobody leads, only the head of the queue is elected: the one behind it, and a caller
/// that does not wait, are kept out with nobody leading (-2) until the head's registration
/// would end; the head is elected with a higher term and leaves the queue, and the next one is
/// then told the new leader's ttl.
#[tokio::test]
async fn only_the_head_is_elected_once_nobody_leads() {
    let f = Fixture::start().await;
    let (a, a_term) = f.elected("", "a").await;
    f.refused("b").await;
    f.refused("c").await;
    assert_eq!(f.resign(&a).await, 1);
    for candidate in ["c", ""] {
        let (remaining, change) = f.refused(candidate).await;
        assert_eq!(remaining, -2, "{candidate:?}: nobody leads");
        assert!(
            about(change, KEPT_MS),
            "{candidate:?} waits for b: {change}"
        );
    }
    let (_, b_term) = f.elected("b", "b").await;
    assert!(b_term > a_term, "terms {a_term} then {b_term}");
    assert_eq!(f.queue().await, ["c"]);
    let (remaining, change) = f.refused("c").await;
    assert!(about(remaining, 60_000), "{remaining}");
    assert_eq!(change, remaining, "c is next");
    let state = f.state().await;
    assert_eq!(
        state.leader.map(|l| (l.0, l.1)),
        Some((b_term, "b".to_owned()))
    );
}

/// A head whose registration ended (its Baton stopped renewing it) gives its place up: the next
/// candidate is elected on its own try, and the old head, trying again, queues at the end.
#[tokio::test]
async fn a_head_whose_registration_ended_gives_its_place_up() {
    let f = Fixture::start().await;
    let (a, _) = f.elected("", "a").await;
    f.refused("b").await;
    f.refused("c").await;
    assert_eq!(f.resign(&a).await, 1);
    f.end_registration("b").await;
    f.elected("c", "c").await;
    assert!(f.queue().await.is_empty());
    let (remaining, change) = f.refused("b").await;
    assert!(about(remaining, 60_000), "{remaining}");
    assert_eq!(change, remaining);
    assert_eq!(f.queue().await, ["b"]);
}

/// A leader whose lease expired (its Baton died) no longer leads: `Leader` reports nobody and
/// the last term, its token proclaims, renews and resigns nothing, and the next campaign is
/// elected with a higher term.
#[tokio::test]
async fn an_expired_leader_no_longer_leads() {
    let f = Fixture::start().await;
    let (a, a_term) = f.elected("", "a").await;
    let _: () = redis::cmd("HSET")
        .arg(&f.keys.leader)
        .arg("expiry")
        .arg(1)
        .query_async(&mut f.conn.clone())
        .await
        .expect("HSET");
    let state = f.state().await;
    assert_eq!((state.leader, state.last), (None, a_term));
    assert_eq!(f.proclaim(&a, "a2").await, None);
    assert_eq!(f.renew(&[(&f.keys, a.as_str(), None)]).await, [Ok(0)]);
    assert_eq!(f.resign(&a).await, 0);
    let (_, b_term) = f.elected("", "b").await;
    assert!(b_term > a_term);
}

/// Terms never go backwards: when the last term was forgotten (its key expired, or Redis
/// restarted from an older snapshot), the Redis clock in microseconds still puts the next one
/// above every earlier one; a last term ahead of the clock is followed by the next integer.
#[tokio::test]
async fn terms_never_go_backwards() {
    let f = Fixture::start().await;
    let (a, a_term) = f.elected("", "a").await;
    assert_eq!(f.resign(&a).await, 1);
    let _: () = redis::cmd("DEL")
        .arg(&f.keys.term)
        .query_async(&mut f.conn.clone())
        .await
        .expect("DEL");
    assert_eq!(f.state().await.last, 0, "the last term is forgotten");
    let (b, b_term) = f.elected("", "b").await;
    assert!(b_term > a_term, "terms {a_term} then {b_term}");
    assert_eq!(f.resign(&b).await, 1);
    let ahead = b_term + 1_000_000_000_000;
    let _: () = redis::cmd("SET")
        .arg(&f.keys.term)
        .arg(ahead)
        .query_async(&mut f.conn.clone())
        .await
        .expect("SET");
    let (_, c_term) = f.elected("", "c").await;
    assert_eq!(c_term, ahead + 1);
}

/// Only the leader's token proclaims or resigns: another token changes nothing; the leader's
/// `Proclaim` bumps the revision when the value changes (not when it is the same); its
/// resignation leaves nobody leading and the last term kept, and a second one does nothing.
#[tokio::test]
async fn only_the_leaders_token_proclaims_or_resigns() {
    let f = Fixture::start().await;
    let (a, term) = f.elected("", "a").await;
    let stranger = random_token();
    assert_eq!(f.proclaim(&stranger, "x").await, None);
    assert_eq!(f.resign(&stranger).await, 0);
    assert_eq!(f.proclaim(&a, "a2").await, Some((term, 1)));
    assert_eq!(
        f.proclaim(&a, "a2").await,
        Some((term, 1)),
        "the same value"
    );
    assert_eq!(f.proclaim(&a, "a3").await, Some((term, 2)));
    let state = f.state().await;
    let (_, value, revision, _) = state.leader.expect("a leads");
    assert_eq!((value.as_str(), revision), ("a3", 2));
    assert_eq!(f.resign(&a).await, 1);
    assert_eq!(f.resign(&a).await, 0);
    let state = f.state().await;
    assert_eq!((state.leader, state.last), (None, term));
    assert_eq!(pttl(&mut f.conn.clone(), &f.keys.leader).await, -2);
}

/// The batched renewal renews each leadership on its own: with the ttl asked for or the
/// campaign's own, extending the term key's retention past it; a token that does not lead gets
/// 0, and a leadership whose keys make Redis raise an error (a key of another type) gets -1
/// without failing the others of the call.
#[tokio::test]
async fn renewal_renews_each_leadership_on_its_own() {
    let f = Fixture::start().await;
    let (other, other_keys) = f.other_keys();
    let (a, _) = f.elected("", "a").await;
    let standby = match f.campaign_in(&other_keys, "", "s").await {
        Outcome::Elected { token, .. } => token,
        refused => panic!("{other}: {refused:?}"),
    };
    let longer = Duration::from_secs(120);
    let renewed = f
        .renew(&[
            (&f.keys, a.as_str(), Some(longer)),
            (&other_keys, standby.as_str(), None),
            (&f.keys, random_token().as_str(), None),
        ])
        .await;
    assert_eq!(renewed, [Ok(120_000), Ok(60_000), Ok(0)]);
    let mut conn = f.conn.clone();
    assert!(about(pttl(&mut conn, &f.keys.leader).await, 120_000));
    let kept = i64::try_from((longer + FENCE_RETENTION).as_millis()).expect("small");
    let term_ttl = pttl(&mut conn, &f.keys.term).await;
    assert!(about(term_ttl, kept), "the term key is kept {term_ttl} ms");

    let _: () = redis::cmd("SET")
        .arg(&other_keys.leader)
        .arg("not a hash")
        .query_async(&mut conn)
        .await
        .expect("SET");
    let renewed = f
        .renew(&[
            (&other_keys, standby.as_str(), None),
            (&f.keys, a.as_str(), None),
        ])
        .await;
    assert!(
        matches!(&renewed[..], [Err(why), Ok(60_000)] if why.starts_with("WRONGTYPE")),
        "the broken leadership fails alone, saying why: {renewed:?}"
    );
}

/// A candidate that stops waiting gives its place up; when it was the head and nobody leads, the
/// next candidate is woken at once by a message addressed to it (a resignation wakes the head
/// the same way, and only it).
#[tokio::test]
async fn abandon_gives_up_the_place_and_wakes_the_next() {
    let f = Fixture::start().await;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let notifier = Notifier::start(f.redis.pubsub_source(), Duration::from_secs(2), stop);
    let mut b_woken = notifier
        .subscribe_as(&f.keys.turn, Wake::EveryAnd("b"))
        .await
        .expect("subscribing b");
    let mut c_woken = notifier
        .subscribe_as(&f.keys.turn, Wake::EveryAnd("c"))
        .await
        .expect("subscribing c");
    b_woken.arm();
    c_woken.arm();

    let (a, _) = f.elected("", "a").await;
    f.refused("b").await;
    f.refused("c").await;
    assert_eq!(f.resign(&a).await, 1);
    within(
        STEP,
        b_woken.notified(),
        "the head woken by the resignation",
    )
    .await;
    assert!(
        c_woken.notified().now_or_never().is_none(),
        "the resignation woke a candidate that is not the head"
    );
    assert_eq!(f.abandon("b").await, 1);
    assert_eq!(f.abandon("b").await, 0, "b is no longer registered");
    assert_eq!(f.queue().await, ["c"]);
    within(STEP, c_woken.notified(), "the next head woken when b left").await;
    f.elected("c", "c").await;
    assert_eq!(f.state().await.candidates, 0);
}

/// A call whose reply never came may run after its clean-up: once the clean-up has resigned its
/// token or removed its candidate, that late call elects nobody and queues nobody.
#[tokio::test]
async fn a_late_call_after_its_clean_up_changes_nothing() {
    let f = Fixture::start().await;
    let void = Some(Duration::from_secs(60));
    assert_eq!(f.resign_with("late-token", void).await, 0);
    match f
        .campaign_as(&f.keys, "", "late", "late-token".into())
        .await
    {
        Outcome::Refused { .. } => {}
        other => panic!("a void token was elected: {other:?}"),
    }
    let (token, _) = f.elected("", "leader").await;
    assert_eq!(f.abandon_with("late-candidate", void).await, 0);
    f.refused("late-candidate").await;
    assert_eq!(f.resign(&token).await, 1);
    f.elected("next", "next").await;
}
