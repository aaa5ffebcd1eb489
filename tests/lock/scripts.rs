//! The lock scripts' scheduling rules, each checked on a crafted Redis state by calling the
//! scripts directly through their typed builders (`baton::lock::scripts`): no Baton, no gRPC, no
//! waiting. The scripts themselves make the leases and registrations a test starts from; a
//! waiter's registration is then kept for an hour (as its Baton would keep renewing it), and one
//! that should have ended is ended by moving its expiry into the past, so nothing depends on time
//! passing. `cargo test --test lock scripts::` runs them alone, in a few seconds.

use std::time::Duration;

use baton::{
    lease::CleanUp,
    lock::{
        Description, Lock, Mode,
        scripts::{self, Acquire, LockKeys, MAX_HOLDS, Refresh, Release},
    },
    redis::{
        Redis,
        reply::{int, string},
    },
};
use redis::{Script, Value};

use crate::support::{RedisConn, RedisServer, lease::redis_time, random_token};

/// The lock every test here works on.
const NAME: &str = "orders";

/// A hold's ttl unless a test says otherwise: nothing expires while a test runs.
const TTL: Duration = Duration::from_secs(60);

/// The wait left of a request that waits: far longer than any test.
const WAIT: Duration = Duration::from_secs(10);

/// How long a waiter's registration is kept once the script registered it.
const KEPT_MS: i64 = 3_600_000;

/// How a test asks for the lock.
#[derive(Debug, Clone, Copy)]
struct Ask<'a> {
    owner: &'a str,
    mode: Mode,
    ttl: Duration,
    waiter: &'a str,
    fair: bool,
    /// The idempotency key, "" for none.
    key: &'a str,
}

/// An exclusive request of `owner` ("" for an anonymous caller) that tries once.
fn exclusive(owner: &str) -> Ask<'_> {
    Ask {
        owner,
        mode: Mode::Exclusive,
        ttl: TTL,
        waiter: "",
        fair: false,
        key: "",
    }
}

/// A shared request of `owner` ("" for an anonymous caller) that tries once.
fn shared(owner: &str) -> Ask<'_> {
    Ask {
        mode: Mode::Shared,
        ..exclusive(owner)
    }
}

impl<'a> Ask<'a> {
    /// The request waiting as `waiter`, without a place in the fair queue.
    fn waiting(self, waiter: &'a str) -> Self {
        Self { waiter, ..self }
    }

    /// The request waiting as `waiter` with a place in the fair queue.
    fn fair(self, waiter: &'a str) -> Self {
        Self {
            waiter,
            fair: true,
            ..self
        }
    }

    /// The request with a hold ttl of `ttl`.
    fn ttl(self, ttl: Duration) -> Self {
        Self { ttl, ..self }
    }

    /// The request with the idempotency key `key`.
    fn keyed(self, key: &'a str) -> Self {
        Self { key, ..self }
    }
}

/// A hold `acquire.lua` granted.
#[derive(Debug)]
struct Grant {
    token: String,
    /// The lease's id, its fencing token.
    fence: i64,
    holds: i64,
    /// The lease's mode: `x` or `s`.
    mode: String,
}

/// What `acquire.lua` answered.
#[derive(Debug)]
enum Outcome {
    Granted(Grant),
    /// Kept out: ms left on what keeps the caller out (-2: nothing known), and ms until the state
    /// may change without a message (-1: never).
    Refused {
        blocking: i64,
        change: i64,
    },
    /// Refused with a code: -1 an upgrade, -3 a lease with the most holds allowed.
    Code(i64),
}

/// Lock [`NAME`] on a Redis of the test's own, with the lock scripts loaded for it.
struct Fixture {
    _server: RedisServer,
    redis: Redis,
    conn: RedisConn,
    keys: LockKeys,
    lock: Lock,
    acquire: Script,
    release: Script,
    refresh: Script,
    abandon: Script,
}

impl Fixture {
    async fn start() -> Self {
        let server = RedisServer::start().await;
        let redis = server.baton_redis();
        Self {
            conn: server.conn().await,
            keys: LockKeys::new(redis.key_prefix(), NAME),
            lock: Lock::new(redis.clone()),
            acquire: redis.script(scripts::ACQUIRE),
            release: redis.script(scripts::RELEASE),
            refresh: redis.script(scripts::REFRESH),
            abandon: redis.script(scripts::ABANDON),
            redis,
            _server: server,
        }
    }

    /// Runs `acquire.lua` for `ask` with a fresh token.
    async fn acquire(&self, ask: Ask<'_>) -> Outcome {
        self.acquire_as(ask, &random_token()).await
    }

    /// Runs `acquire.lua` for `ask` with the token `token`.
    async fn acquire_as(&self, ask: Ask<'_>, token: &str) -> Outcome {
        let invocation = Acquire {
            owner: ask.owner,
            token,
            ttl: ask.ttl,
            waiter: ask.waiter,
            wait_left: if ask.waiter.is_empty() {
                Duration::ZERO
            } else {
                WAIT
            },
            fair: ask.fair,
            mode: ask.mode,
            idempotency_key: ask.key,
        }
        .invocation(&self.acquire, &self.keys);
        let reply: Vec<Value> = self.redis.eval(&invocation).await.expect("acquire.lua");
        let n = |v: &Value| int(v).expect("an integer");
        if !ask.waiter.is_empty() {
            self.keep_registered(ask.waiter).await;
        }
        match reply.as_slice() {
            [granted, token, fence, _, holds, mode] if n(granted) == 1 => Outcome::Granted(Grant {
                token: string(token).expect("the token"),
                fence: n(fence),
                holds: n(holds),
                mode: string(mode).expect("the mode"),
            }),
            [_, blocking, change] => Outcome::Refused {
                blocking: n(blocking),
                change: n(change),
            },
            [code] => Outcome::Code(n(code)),
            other => panic!("acquire.lua answered {other:?}"),
        }
    }

    /// Runs `acquire.lua` for `ask`, which must be granted.
    async fn granted(&self, ask: Ask<'_>) -> Grant {
        match self.acquire(ask).await {
            Outcome::Granted(grant) => grant,
            other => panic!("expected {ask:?} to be granted, got {other:?}"),
        }
    }

    /// Runs `acquire.lua` for `ask`, which must be kept out; returns (blocking, change).
    async fn refused(&self, ask: Ask<'_>) -> (i64, i64) {
        match self.acquire(ask).await {
            Outcome::Refused { blocking, change } => (blocking, change),
            other => panic!("expected {ask:?} to be refused, got {other:?}"),
        }
    }

    /// Runs `release.lua` for `token`: (1 when it held, live holds left in its lease).
    async fn release(&self, token: &str) -> (i64, i64) {
        let invocation = Release {
            token,
            clean_up: None,
        }
        .invocation(&self.release, &self.keys);
        self.redis.eval(&invocation).await.expect("release.lua")
    }

    /// Runs `release.lua` for `token` as the clean-up of a grant nobody saw, the token then void
    /// for `void` if given.
    async fn release_with(&self, token: &str, void: Option<Duration>) -> (i64, i64) {
        let clean_up = Some(CleanUp { void });
        let invocation = Release { token, clean_up }.invocation(&self.release, &self.keys);
        self.redis.eval(&invocation).await.expect("release.lua")
    }

    /// Runs `refresh.lua` for `token`: the new remaining ms, -1 not held, -2 below `min`.
    async fn refresh(&self, token: &str, ttl: Option<Duration>, min: Duration) -> i64 {
        let invocation = Refresh { token, ttl, min }.invocation(&self.refresh, &self.keys);
        self.redis.eval(&invocation).await.expect("refresh.lua")
    }

    /// Runs `abandon.lua` for `waiter`: 1 when it was registered.
    async fn abandon(&self, waiter: &str) -> i64 {
        self.abandon_with(waiter, None).await
    }

    /// Runs `abandon.lua` for `waiter`, which then stays void for `void` if given.
    async fn abandon_with(&self, waiter: &str, void: Option<Duration>) -> i64 {
        let invocation = scripts::abandon(&self.abandon, &self.keys, waiter, void);
        self.redis.eval(&invocation).await.expect("abandon.lua")
    }

    /// Runs `describe.lua`.
    async fn describe(&self) -> Description {
        self.lock.describe(NAME).await.expect("describe.lua")
    }

    /// The fair queue's places (mode and waiter id), in order.
    async fn queue(&self) -> Vec<String> {
        self.zrange(&self.keys.queue).await
    }

    async fn zrange(&self, key: &str) -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn.clone())
            .await
            .expect("ZRANGE")
    }

    /// Keeps the registration of `waiter` (if it has one) for [`KEPT_MS`] from now, as its Baton
    /// would keep renewing it while it waits.
    async fn keep_registered(&self, waiter: &str) {
        let (now, _) = redis_time(&mut self.conn.clone()).await;
        for key in [&self.keys.waiters, &self.keys.writers] {
            let _: i64 = redis::cmd("ZADD")
                .arg(key)
                .arg("XX")
                .arg(now as i64 + KEPT_MS)
                .arg(waiter)
                .query_async(&mut self.conn.clone())
                .await
                .expect("ZADD");
        }
    }

    /// Moves the expiry of `member` of the sorted set `key` into the past (1 ms after the epoch).
    async fn expire(&self, key: &str, member: &str) {
        let changed: i64 = redis::cmd("ZADD")
            .arg(key)
            .arg("XX")
            .arg("CH")
            .arg(1)
            .arg(member)
            .query_async(&mut self.conn.clone())
            .await
            .expect("ZADD");
        assert_eq!(changed, 1, "{member} is not in {key}");
    }
}

/// Asserts the remaining time of a Describe entry is within `ms` (wide margins: a busy machine).
fn assert_remaining(remaining: Option<Duration>, ms: std::ops::RangeInclusive<u128>, what: &str) {
    let remaining = remaining.expect("a remaining ttl").as_millis();
    assert!(ms.contains(&remaining), "{what}: {remaining} ms left");
}

/// An exclusive lease keeps out every other exclusive or shared request; each is told the
/// holder's remaining ttl, which is also when it should look again without a message.
#[tokio::test]
async fn exclusive_keeps_out_every_other_request() {
    let f = Fixture::start().await;
    let held = f.granted(exclusive("alice")).await;
    assert_eq!((held.holds, held.mode.as_str()), (1, "x"));

    for ask in [exclusive("bob"), shared("bob"), exclusive(""), shared("")] {
        let (blocking, change) = f.refused(ask).await;
        assert!((50_000..=60_000).contains(&blocking), "{ask:?}: {blocking}");
        assert_eq!(change, blocking, "{ask:?}: it is the caller's turn");
    }
    let d = f.describe().await;
    let holder = d.holder.expect("an exclusive holder");
    assert_eq!((holder.owner.as_str(), holder.hold_count), ("alice", 1));
    assert_eq!(d.fencing_token, held.fence as u64);
}

/// Shared leases coexist, each its own lease with its own fencing token; an exclusive request is
/// kept out until the last one ends and may look again when the first one does.
#[tokio::test]
async fn shared_leases_coexist_and_keep_exclusive_out() {
    let f = Fixture::start().await;
    let long = f.granted(shared("alice")).await;
    let short = f.granted(shared("bob").ttl(Duration::from_secs(30))).await;
    assert_ne!(long.fence, short.fence);
    assert_eq!((long.mode.as_str(), short.mode.as_str()), ("s", "s"));

    let (blocking, change) = f.refused(exclusive("carol")).await;
    assert!(
        (50_000..=60_000).contains(&blocking),
        "the last: {blocking}"
    );
    assert!((20_000..=30_000).contains(&change), "the first: {change}");
    f.granted(shared("carol")).await;
    assert_eq!(f.describe().await.shared.expect("shared").count, 3);
}

/// The owner of a lease asking again gets one more hold of the same lease (same fencing token,
/// a token of its own), exclusive or shared; the lease ends with its last hold.
#[tokio::test]
async fn an_owner_reenters_with_a_hold_per_acquisition() {
    let f = Fixture::start().await;
    let first = f.granted(exclusive("alice")).await;
    let second = f.granted(exclusive("alice")).await;
    let third = f.granted(shared("alice")).await;
    assert_eq!([second.fence, third.fence], [first.fence; 2]);
    assert_eq!([second.holds, third.holds], [2, 3]);
    assert_eq!(
        third.mode, "x",
        "a shared request joins the exclusive lease"
    );
    assert!(first.token != second.token && second.token != third.token);
    f.refused(exclusive("bob")).await;

    assert_eq!(f.release(&second.token).await, (1, 2));
    assert_eq!(f.describe().await.holder.expect("held").hold_count, 2);
    assert_eq!(f.release(&first.token).await, (1, 1));
    f.refused(shared("bob")).await;
    assert_eq!(f.release(&third.token).await, (1, 0));
    assert!(f.granted(exclusive("bob")).await.fence > first.fence);
}

/// An owner holding the lock shared is refused (-1) when it asks for it exclusively: an upgrade
/// would deadlock; a shared request still re-enters.
#[tokio::test]
async fn a_shared_owner_asking_exclusive_is_refused() {
    let f = Fixture::start().await;
    let lease = f.granted(shared("alice")).await;
    assert!(matches!(
        f.acquire(exclusive("alice")).await,
        Outcome::Code(-1)
    ));
    let again = f.granted(shared("alice")).await;
    assert_eq!((again.fence, again.holds), (lease.fence, 2));
}

/// An anonymous caller never re-enters: a second exclusive request waits like anyone's, and each
/// anonymous shared request gets a lease of its own.
#[tokio::test]
async fn an_anonymous_caller_never_reenters() {
    let f = Fixture::start().await;
    let held = f.granted(exclusive("")).await;
    f.refused(exclusive("")).await;
    f.release(&held.token).await;

    let a = f.granted(shared("")).await;
    let b = f.granted(shared("")).await;
    assert_ne!(a.fence, b.fence);
    assert_eq!((a.holds, b.holds), (1, 1));
    assert_eq!(f.describe().await.shared.expect("shared").count, 2);
}

/// A lease takes at most `MAX_HOLDS` holds: one more is refused (-3) until a hold is released.
#[tokio::test]
async fn a_lease_has_at_most_max_holds() {
    let f = Fixture::start().await;
    let mut last = None;
    for n in 1..=i64::from(MAX_HOLDS) {
        let hold = f.granted(exclusive("alice")).await;
        assert_eq!(hold.holds, n);
        last = Some(hold);
    }
    assert!(matches!(
        f.acquire(exclusive("alice")).await,
        Outcome::Code(-3)
    ));
    f.release(&last.expect("a hold").token).await;
    assert_eq!(
        f.granted(exclusive("alice")).await.holds,
        i64::from(MAX_HOLDS)
    );
}

/// Fair waiters are granted in arrival order, and only the queue's head: the others, and callers
/// without a place, are kept out of a free lock until the head's registration may end.
#[tokio::test]
async fn fair_waiters_go_in_arrival_order_head_only() {
    let f = Fixture::start().await;
    let holder = f.granted(exclusive("")).await;
    for w in ["w1", "w2", "w3"] {
        f.refused(exclusive("").fair(w)).await;
    }
    assert_eq!(f.queue().await, ["xw1", "xw2", "xw3"]);
    assert_eq!(f.release(&holder.token).await, (1, 0));

    f.refused(exclusive("").fair("w3")).await;
    f.refused(exclusive("").fair("w2")).await;
    let (blocking, change) = f.refused(exclusive("")).await;
    assert_eq!(blocking, -2, "nothing holds the lock");
    let kept = KEPT_MS - 60_000..=KEPT_MS;
    assert!(kept.contains(&change), "the head's registration: {change}");
    f.refused(shared("").waiting("r")).await;

    let first = f.granted(exclusive("").fair("w1")).await;
    assert_eq!(f.queue().await, ["xw2", "xw3"]);
    f.refused(exclusive("").fair("w3")).await;
    f.release(&first.token).await;
    f.granted(exclusive("").fair("w2")).await;
    assert_eq!(f.queue().await, ["xw3"]);
}

/// Shared waiters at the head of the fair queue go together (one need not wait for another ahead
/// of it); an exclusive waiter goes only once it is the head and every lease ended, and the
/// shared waiters behind it wait for it.
#[tokio::test]
async fn a_shared_run_at_the_head_goes_together() {
    let f = Fixture::start().await;
    let holder = f.granted(exclusive("")).await;
    f.refused(shared("").fair("a")).await;
    f.refused(shared("").fair("b")).await;
    f.refused(exclusive("").fair("c")).await;
    f.refused(shared("").fair("d")).await;
    assert_eq!(f.queue().await, ["sa", "sb", "xc", "sd"]);
    f.release(&holder.token).await;
    f.refused(exclusive("").fair("c")).await;

    let b = f.granted(shared("").fair("b")).await;
    f.refused(shared("").fair("d")).await;
    f.refused(exclusive("").fair("c")).await;
    let a = f.granted(shared("").fair("a")).await;
    assert_eq!(f.queue().await, ["xc", "sd"]);
    f.refused(exclusive("").fair("c")).await;
    f.refused(shared("").fair("d")).await;

    f.release(&a.token).await;
    f.release(&b.token).await;
    f.granted(exclusive("").fair("c")).await;
    f.refused(shared("").fair("d")).await;
    assert_eq!(f.queue().await, ["sd"]);
}

/// A waiting non-fair exclusive request (a writer) keeps later non-fair shared requests out, so
/// readers cannot starve it; abandoning its wait lets them in at once.
#[tokio::test]
async fn a_waiting_writer_keeps_later_readers_out() {
    let f = Fixture::start().await;
    f.granted(shared("")).await;
    f.refused(exclusive("").waiting("writer")).await;
    assert_eq!(f.zrange(&f.keys.writers).await, ["writer"]);

    let (blocking, change) = f.refused(shared("")).await;
    assert_eq!(blocking, -2, "no lease keeps a shared request out");
    let kept = KEPT_MS - 60_000..=KEPT_MS;
    assert!(
        kept.contains(&change),
        "the writer's registration: {change}"
    );
    f.refused(shared("").waiting("reader")).await;

    assert_eq!(f.abandon("writer").await, 1);
    assert!(f.zrange(&f.keys.writers).await.is_empty());
    f.granted(shared("")).await;
    f.granted(shared("").waiting("reader")).await;
}

/// A writer whose registration ended (its Baton stopped renewing it) no longer holds readers back.
#[tokio::test]
async fn an_ended_writer_registration_lets_readers_in() {
    let f = Fixture::start().await;
    f.granted(shared("")).await;
    f.refused(exclusive("").waiting("writer")).await;
    f.refused(shared("")).await;

    f.expire(&f.keys.writers, "writer").await;
    f.expire(&f.keys.waiters, "writer").await;
    f.granted(shared("")).await;
    assert!(f.zrange(&f.keys.writers).await.is_empty());
    assert!(f.zrange(&f.keys.waiters).await.is_empty());
}

/// A fair waiter whose registration ended loses its place: the waiter behind it goes.
#[tokio::test]
async fn an_ended_queue_registration_gives_up_the_place() {
    let f = Fixture::start().await;
    let holder = f.granted(exclusive("")).await;
    f.refused(exclusive("").fair("w1")).await;
    f.refused(exclusive("").fair("w2")).await;
    f.release(&holder.token).await;
    f.refused(exclusive("").fair("w2")).await;

    f.expire(&f.keys.waiters, "w1").await;
    f.granted(exclusive("").fair("w2")).await;
    assert!(f.queue().await.is_empty());
    assert!(f.zrange(&f.keys.waiters).await.is_empty());
}

/// Refreshing one hold never shortens another hold of the same lease: the lease lasts as long as
/// its longest-lived hold; a ttl below the minimum changes nothing; 0 reuses the acquisition ttl.
#[tokio::test]
async fn refresh_never_shortens_another_hold() {
    let f = Fixture::start().await;
    let long = f.granted(exclusive("alice")).await;
    let short = f
        .granted(exclusive("alice").ttl(Duration::from_secs(10)))
        .await;
    let held = |d: Description| d.holder.expect("held");
    assert_remaining(held(f.describe().await).remaining, 50_000..=60_000, "60 s");

    assert_eq!(
        f.refresh(&long.token, Some(Duration::from_secs(1)), Duration::ZERO)
            .await,
        1_000
    );
    let holder = held(f.describe().await);
    assert_eq!(holder.hold_count, 2);
    assert_remaining(holder.remaining, 5_000..=10_000, "the other hold's 10 s");

    assert_eq!(
        f.refresh(&short.token, Some(Duration::from_secs(120)), Duration::ZERO)
            .await,
        120_000
    );
    assert_eq!(
        f.refresh(
            &short.token,
            Some(Duration::from_millis(50)),
            Duration::from_millis(100)
        )
        .await,
        -2
    );
    assert_remaining(
        held(f.describe().await).remaining,
        110_000..=120_000,
        "120 s",
    );
    assert_eq!(f.refresh(&long.token, None, Duration::ZERO).await, 60_000);
    assert_eq!(f.refresh(&random_token(), None, Duration::ZERO).await, -1);

    assert_eq!(f.release(&short.token).await, (1, 1));
    assert_remaining(
        held(f.describe().await).remaining,
        50_000..=60_000,
        "the lease lasts as long as its remaining hold",
    );
}

/// Releasing a token that holds nothing (unknown, already released, or of a lease reclaimed at
/// its expiry) answers (0, 0) and leaves the holder alone.
#[tokio::test]
async fn releasing_what_is_not_held_changes_nothing() {
    let f = Fixture::start().await;
    let held = f.granted(exclusive("alice")).await;
    assert_eq!(f.release(&random_token()).await, (0, 0));
    assert_eq!(f.describe().await.holder.expect("held").owner, "alice");
    assert_eq!(f.release(&held.token).await, (1, 0));
    assert_eq!(f.release(&held.token).await, (0, 0));
    let d = f.describe().await;
    assert!(d.holder.is_none() && d.shared.is_none(), "{d:?}");

    let expired = f.granted(exclusive("bob")).await;
    f.expire(&f.keys.leases, &expired.fence.to_string()).await;
    let next = f.granted(exclusive("carol")).await;
    assert!(next.fence > expired.fence, "fencing tokens never go back");
    assert_eq!(f.release(&expired.token).await, (0, 0));
    assert_eq!(f.describe().await.holder.expect("held").owner, "carol");
}

/// Abandon answers whether the waiter was registered and gives up its place: the waiter behind
/// it becomes the head.
#[tokio::test]
async fn abandon_gives_up_the_place() {
    let f = Fixture::start().await;
    let holder = f.granted(exclusive("")).await;
    f.refused(exclusive("").fair("w1")).await;
    f.refused(exclusive("").fair("w2")).await;

    assert_eq!(f.abandon("w1").await, 1);
    assert_eq!(f.queue().await, ["xw2"]);
    assert_eq!(f.abandon("w1").await, 0);
    assert_eq!(f.abandon("nobody").await, 0);
    f.release(&holder.token).await;
    f.granted(exclusive("").fair("w2")).await;
    assert_eq!(f.describe().await.waiters, 0);
}

/// A call whose reply never came may run after its clean-up (a paused Redis, another
/// connection): once the clean-up has released its token or removed its waiter, that late call
/// grants nothing and registers nobody, and the void marks expire.
#[tokio::test]
async fn a_late_call_after_its_clean_up_changes_nothing() {
    let f = Fixture::start().await;
    let void = Some(Duration::from_secs(60));

    // The clean-up runs first: the token held nothing yet.
    assert_eq!(f.release_with("late-token", void).await, (0, 0));
    match f.acquire_as(exclusive("alice"), "late-token").await {
        Outcome::Refused { .. } => {}
        other => panic!("a void token was granted: {other:?}"),
    }
    assert!(f.describe().await.holder.is_none(), "nothing is held");

    // The same for a waiter: its removal first, then the late call that would register it.
    let held = f.granted(exclusive("bob")).await;
    assert_eq!(f.abandon_with("late-waiter", void).await, 0);
    f.refused(exclusive("carol").fair("late-waiter")).await;
    assert!(f.queue().await.is_empty(), "no place for a void waiter");
    assert!(
        f.zrange(&f.keys.waiters).await.is_empty(),
        "no registration for a void waiter"
    );
    f.refused(exclusive("dave").waiting("late-writer")).await;
    assert_eq!(f.zrange(&f.keys.writers).await, ["late-writer"]);

    // Other tokens and waiters are untouched, and the marks expire with the set.
    f.release(&held.token).await;
    f.granted(exclusive("erin")).await;
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&f.keys.void)
        .query_async(&mut f.conn.clone())
        .await
        .expect("PTTL");
    assert!((1..=60_000).contains(&ttl), "void marks expire: {ttl}");
}

/// A retry by idempotency key that never reached its caller either (its own clean-up names the
/// retry's token) withdraws its claim: once the granting call and every claiming retry were given
/// up, the hold is released, in either order of the clean-ups and however often each is retried;
/// while the granting call (or a retry) may have reached its caller, it is kept. A claim's
/// withdrawal once kept the hold until its ttl, unknown to anyone.
#[tokio::test]
async fn a_retry_that_never_reached_its_caller_withdraws_its_claim() {
    let f = Fixture::start().await;
    for (key, origin_first) in [("k-origin-first", true), ("k-retry-first", false)] {
        let origin_call = random_token();
        let retry_call = random_token();
        let first = match f
            .acquire_as(exclusive("carol").keyed(key), &origin_call)
            .await
        {
            Outcome::Granted(g) => g,
            other => panic!("{other:?}"),
        };
        assert_eq!(first.token, origin_call, "the first call made the hold");
        match f
            .acquire_as(exclusive("carol").keyed(key), &retry_call)
            .await
        {
            Outcome::Granted(g) => assert_eq!(g.token, first.token, "the retry got it back"),
            other => panic!("{other:?}"),
        }
        let (a, b) = if origin_first {
            (&origin_call, &retry_call)
        } else {
            (&retry_call, &origin_call)
        };
        // The first clean-up, twice (a retried clean-up whose reply was lost): kept.
        assert_eq!(
            f.release_with(a, None).await,
            (-1, 1),
            "{key}: kept after one"
        );
        // Once more, the granting call's is still a clean-up of the kept hold; the retry's finds
        // its claim already withdrawn, and nothing its token holds.
        let again = if origin_first { (-1, 1) } else { (0, 0) };
        assert_eq!(
            f.release_with(a, None).await,
            again,
            "{key}: kept, once more"
        );
        assert!(f.describe().await.holder.is_some(), "{key}");
        // The other: every call was given up, so the hold is released.
        assert_eq!(f.release_with(b, None).await, (1, 0), "{key}: released");
        assert!(f.describe().await.holder.is_none(), "{key}");
    }

    // A retry given up while the granting call reached its caller: kept for that caller.
    let origin_call = random_token();
    let retry_call = random_token();
    f.acquire_as(exclusive("dave").keyed("k-seen"), &origin_call)
        .await;
    f.acquire_as(exclusive("dave").keyed("k-seen"), &retry_call)
        .await;
    assert_eq!(f.release_with(&retry_call, None).await, (-1, 1));
    assert_eq!(f.describe().await.holder.expect("held").owner, "dave");
    assert_eq!(
        f.release(&origin_call).await,
        (1, 0),
        "its caller releases it"
    );
    // Nothing is left of the claims once the hold is gone.
    let mut conn = f.conn.clone();
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&f.keys.state)
        .query_async(&mut conn)
        .await
        .expect("HKEYS");
    assert!(
        fields.iter().all(|k| !k.starts_with("c:")),
        "claim records left: {fields:?}"
    );
}

/// An idempotency key whose hold expired inside a lease its owner still holds takes a new hold
/// on its next retry, and later retries get that new hold back: the expired hold's clean-up
/// leaves the key naming the new one. It dropped the key's entry, so the next retry took a
/// third hold, and the second stayed until its ttl, unknown to anyone.
#[tokio::test]
async fn a_key_whose_hold_expired_names_its_new_hold() {
    let f = Fixture::start().await;
    let keep = f.granted(exclusive("erin")).await;
    let short = Duration::from_millis(100);
    let first = f.granted(exclusive("erin").keyed("k").ttl(short)).await;
    assert_eq!(first.fence, keep.fence, "a hold of the same lease");
    // The scenario: the keyed hold expires while the lease lives on through `keep`.
    tokio::time::sleep(short + Duration::from_millis(50)).await;
    let second = f.granted(exclusive("erin").keyed("k")).await;
    assert_ne!(
        second.token, first.token,
        "the expired hold is not given back"
    );
    let third = f.granted(exclusive("erin").keyed("k")).await;
    assert_eq!(
        third.token, second.token,
        "the live hold the key took is given back"
    );
    assert_eq!(third.holds, 2, "keep and the key's hold, no third");
}

/// The clean-up of a grant whose caller never saw it releases that grant and voids its token,
/// but keeps a grant that a retry with its idempotency key has claimed.
#[tokio::test]
async fn a_clean_up_releases_an_unclaimed_grant_and_keeps_a_claimed_one() {
    let f = Fixture::start().await;
    let void = Some(Duration::from_secs(60));
    let unseen = f.granted(exclusive("alice")).await;
    assert_eq!(f.release_with(&unseen.token, void).await, (1, 0));
    assert!(f.describe().await.holder.is_none());
    match f.acquire_as(exclusive("alice"), &unseen.token).await {
        Outcome::Refused { .. } => {}
        other => panic!("a released clean-up token granted again: {other:?}"),
    }

    let first = f.granted(exclusive("bob").keyed("k1")).await;
    let retried = f.granted(exclusive("bob").keyed("k1")).await;
    assert_eq!(
        (retried.token.as_str(), retried.fence),
        (first.token.as_str(), first.fence)
    );
    assert_eq!(
        f.release_with(&first.token, None).await,
        (-1, 1),
        "a claimed grant is kept by a clean-up"
    );
    let holder = f.describe().await.holder.expect("still held");
    assert_eq!(holder.owner, "bob");
    assert_eq!(
        f.release(&first.token).await,
        (1, 0),
        "its owner releases it"
    );
}
