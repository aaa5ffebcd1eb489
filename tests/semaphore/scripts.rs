//! The semaphore scripts' scheduling rules, each checked on a crafted Redis state by calling the
//! scripts directly through their typed builders (`baton::semaphore::scripts`): no Baton, no gRPC,
//! no waiting. The scripts themselves make the leases and registrations a test starts from; a
//! waiter's registration is then kept for an hour (as its Baton would keep renewing it), and one
//! that should have ended is ended by moving its expiry into the past, so nothing depends on time
//! passing. `cargo test --test semaphore scripts::` runs them alone, in a few seconds.

use std::time::Duration;

use baton::{
    redis::{Redis, reply::int},
    semaphore::{
        Description, Semaphore,
        scripts::{self, Acquire, SemaphoreKeys},
    },
};
use redis::{Script, Value};

use crate::support::{RedisConn, RedisServer, lease::redis_time, random_token};

/// The semaphore every test here works on.
const NAME: &str = "pool";

/// A lease's ttl: nothing expires while a test runs.
const TTL: Duration = Duration::from_secs(60);

/// The wait left of a request that waits: far longer than any test.
const WAIT: Duration = Duration::from_secs(10);

/// How long a waiter's registration is kept once the script registered it.
const KEPT_MS: i64 = 3_600_000;

/// How a test asks for permits.
#[derive(Debug, Clone, Copy)]
struct Ask<'a> {
    permits: u32,
    limit: u32,
    waiter: &'a str,
    fair: bool,
    /// The idempotency key, "" for none.
    key: &'a str,
}

/// `permits` permits under `limit`, trying once.
fn ask(permits: u32, limit: u32) -> Ask<'static> {
    Ask {
        permits,
        limit,
        waiter: "",
        fair: false,
        key: "",
    }
}

impl<'a> Ask<'a> {
    /// The request waiting as `waiter`, without a place in the fair queue.
    fn waiting(self, waiter: &'a str) -> Self {
        Self { waiter, ..self }
    }

    /// The request with the idempotency key `key`.
    fn keyed(self, key: &'a str) -> Self {
        Self { key, ..self }
    }

    /// The request waiting as `waiter` with a place in the fair queue.
    fn fair(self, waiter: &'a str) -> Self {
        Self {
            waiter,
            fair: true,
            ..self
        }
    }
}

/// A lease `acquire.lua` granted.
#[derive(Debug)]
struct Grant {
    token: String,
    /// The limit in force: the strictest of the holders' and this request's.
    limit: i64,
    /// Permits still available under that limit.
    available: i64,
}

/// What `acquire.lua` answered.
#[derive(Debug)]
enum Outcome {
    Granted(Grant),
    /// Kept out, with the permits available under the strictest limit.
    Refused {
        available: i64,
    },
}

/// Semaphore [`NAME`] on a Redis of the test's own, with the semaphore scripts loaded for it.
struct Fixture {
    _server: RedisServer,
    redis: Redis,
    conn: RedisConn,
    keys: SemaphoreKeys,
    semaphore: Semaphore,
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
            keys: SemaphoreKeys::new(redis.key_prefix(), NAME),
            semaphore: Semaphore::new(redis.clone()),
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
        self.acquire_as(ask, random_token()).await
    }

    /// Runs `acquire.lua` for `ask` with the token `token`.
    async fn acquire_as(&self, ask: Ask<'_>, token: String) -> Outcome {
        let invocation = Acquire {
            token: &token,
            owner: "",
            permits: ask.permits,
            limit: ask.limit,
            ttl: TTL,
            waiter: ask.waiter,
            fair: ask.fair,
            wait_left: if ask.waiter.is_empty() {
                Duration::ZERO
            } else {
                WAIT
            },
            idempotency_key: ask.key,
        }
        .invocation(&self.acquire, &self.keys);
        let reply: Vec<Value> = self.redis.eval(&invocation).await.expect("acquire.lua");
        if !ask.waiter.is_empty() {
            self.keep_registered(ask.waiter).await;
        }
        let n = |v: &Value| int(v).expect("an integer");
        match reply.as_slice() {
            [granted, _, _, limit, available, granted_token] if n(granted) == 1 => {
                let granted_token =
                    redis::from_redis_value_ref::<String>(granted_token).expect("the token");
                // A retry by idempotency key gets the lease its key granted; any other call,
                // a lease of its own token.
                if ask.key.is_empty() {
                    assert_eq!(granted_token, token);
                }
                Outcome::Granted(Grant {
                    token: granted_token,
                    limit: n(limit),
                    available: n(available),
                })
            }
            [refused, available, _, _] if n(refused) == 0 => Outcome::Refused {
                available: n(available),
            },
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

    /// Runs `acquire.lua` for `ask`, which must be kept out; returns the permits available.
    async fn refused(&self, ask: Ask<'_>) -> i64 {
        match self.acquire(ask).await {
            Outcome::Refused { available } => available,
            other => panic!("expected {ask:?} to be refused, got {other:?}"),
        }
    }

    /// Runs `release.lua` for `token`: 1 when the lease was held, 0 when not.
    async fn release(&self, token: &str) -> i64 {
        let invocation = scripts::release(&self.release, &self.keys, token, None);
        self.redis.eval(&invocation).await.expect("release.lua")
    }

    /// Runs `release.lua` for `token` as the clean-up of a grant nobody saw, the token then void
    /// for `void` if given.
    async fn release_with(&self, token: &str, void: Option<Duration>) -> i64 {
        let clean_up = Some(baton::lease::CleanUp { void });
        let invocation = scripts::release(&self.release, &self.keys, token, clean_up);
        self.redis.eval(&invocation).await.expect("release.lua")
    }

    /// Runs `refresh.lua` for `token`: the new remaining ms, -1 not held, -2 below `min`.
    async fn refresh(&self, token: &str, ttl: Option<Duration>, min: Duration) -> i64 {
        let invocation = scripts::refresh(&self.refresh, &self.keys, token, ttl, min);
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
        self.semaphore.describe(NAME).await.expect("describe.lua")
    }

    /// The fair queue's waiters, in order.
    async fn queue(&self) -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(&self.keys.queue)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn.clone())
            .await
            .expect("ZRANGE")
    }

    /// The expiry of `token`'s lease (ms, Redis time), `None` when it has none.
    async fn expiry(&self, token: &str) -> Option<i64> {
        redis::cmd("ZSCORE")
            .arg(&self.keys.holders)
            .arg(token)
            .query_async(&mut self.conn.clone())
            .await
            .expect("ZSCORE")
    }

    /// The permits counted in use (the `used` counter the scripts keep).
    async fn used(&self) -> i64 {
        redis::cmd("HGET")
            .arg(&self.keys.data)
            .arg("used")
            .query_async(&mut self.conn.clone())
            .await
            .expect("HGET")
    }

    /// Keeps the registration of `waiter` (if it has one) for [`KEPT_MS`] from now, as its Baton
    /// would keep renewing it while it waits.
    async fn keep_registered(&self, waiter: &str) {
        let (now, _) = redis_time(&mut self.conn.clone()).await;
        let _: i64 = redis::cmd("ZADD")
            .arg(&self.keys.waiters)
            .arg("XX")
            .arg(now as i64 + KEPT_MS)
            .arg(waiter)
            .query_async(&mut self.conn.clone())
            .await
            .expect("ZADD");
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

/// Weighted leases are granted while their permits fit under the limit, never past it: a request
/// that does not fit is refused and told how many permits are available.
#[tokio::test]
async fn weighted_permits_never_exceed_the_limit() {
    let f = Fixture::start().await;
    assert_eq!(f.granted(ask(2, 5)).await.available, 3);
    assert_eq!(f.granted(ask(2, 5)).await.available, 1);
    assert_eq!(f.refused(ask(2, 5)).await, 1);
    let last = f.granted(ask(1, 5)).await;
    assert_eq!((last.limit, last.available), (5, 0));
    assert_eq!(f.refused(ask(1, 5)).await, 0);

    let d = f.describe().await;
    assert_eq!((d.permits_in_use, d.holder_count, d.limit), (5, 3, 5));
    assert_eq!(f.used().await, 5);
}

/// The strictest limit among the holders and the caller is in force: a caller believing in a
/// higher limit gets no more than a holder's lower one allows, and a caller asking a lower one
/// than the holders' is held to its own.
#[tokio::test]
async fn the_strictest_limit_wins() {
    let f = Fixture::start().await;
    let strict = f.granted(ask(2, 3)).await;
    assert_eq!(f.refused(ask(2, 10)).await, 1);
    let loose = f.granted(ask(1, 10)).await;
    assert_eq!((loose.limit, loose.available), (3, 0));

    assert_eq!(f.release(&strict.token).await, 1);
    assert_eq!(f.refused(ask(2, 2)).await, 1);
    let stricter = f.granted(ask(1, 2)).await;
    assert_eq!((stricter.limit, stricter.available), (2, 0));
    assert_eq!(f.describe().await.limit, 2);
}

/// Fair waiters are granted in arrival order, and only the queue's head: the others, and callers
/// without a place, are kept out even while permits are free.
#[tokio::test]
async fn fair_waiters_go_in_arrival_order_head_only() {
    let f = Fixture::start().await;
    let holder = f.granted(ask(1, 1)).await;
    for w in ["a", "b", "c"] {
        f.refused(ask(1, 1).fair(w)).await;
    }
    assert_eq!(f.queue().await, ["a", "b", "c"]);
    assert_eq!(f.release(&holder.token).await, 1);

    assert_eq!(f.refused(ask(1, 1).fair("c")).await, 1, "a permit is free");
    f.refused(ask(1, 1).fair("b")).await;
    f.refused(ask(1, 1)).await;
    f.refused(ask(1, 1).waiting("other")).await;

    let a = f.granted(ask(1, 1).fair("a")).await;
    assert_eq!(f.queue().await, ["b", "c"]);
    f.release(&a.token).await;
    f.refused(ask(1, 1).fair("c")).await;
    f.granted(ask(1, 1).fair("b")).await;
    assert_eq!(f.queue().await, ["c"]);
}

/// A fair head that needs more permits than are free is not overtaken by a smaller request that
/// would fit; once it abandons its wait, the smaller request goes.
#[tokio::test]
async fn a_heavy_head_is_not_overtaken() {
    let f = Fixture::start().await;
    f.granted(ask(2, 3)).await;
    assert_eq!(f.refused(ask(2, 3).fair("heavy")).await, 1);
    assert_eq!(
        f.refused(ask(1, 3)).await,
        1,
        "one permit is free, but queued behind"
    );
    f.refused(ask(1, 3).fair("light")).await;

    assert_eq!(f.abandon("heavy").await, 1);
    assert_eq!(f.queue().await, ["light"]);
    f.granted(ask(1, 3).fair("light")).await;
    assert!(f.queue().await.is_empty());
}

/// A fair waiter whose registration ended (its Baton stopped renewing it) loses its place: the
/// waiter behind it goes, and its queue record is gone.
#[tokio::test]
async fn an_ended_queue_registration_gives_up_the_place() {
    let f = Fixture::start().await;
    let holder = f.granted(ask(1, 1)).await;
    f.refused(ask(1, 1).fair("a")).await;
    f.refused(ask(1, 1).fair("b")).await;
    f.release(&holder.token).await;
    f.refused(ask(1, 1).fair("b")).await;

    f.expire(&f.keys.waiters, "a").await;
    f.granted(ask(1, 1).fair("b")).await;
    assert!(f.queue().await.is_empty());
    let record: bool = redis::cmd("HEXISTS")
        .arg(&f.keys.data)
        .arg("q:a")
        .query_async(&mut f.conn.clone())
        .await
        .expect("HEXISTS");
    assert!(!record, "the queue record of the ended registration stays");
}

/// A lease past its expiry is reclaimed by the next acquisition: its permits are counted free
/// again and releasing its token afterwards answers 0.
#[tokio::test]
async fn an_expired_lease_gives_its_permits_back() {
    let f = Fixture::start().await;
    let expired = f.granted(ask(2, 2)).await;
    assert_eq!(f.refused(ask(1, 2)).await, 0);

    f.expire(&f.keys.holders, &expired.token).await;
    assert_eq!(f.granted(ask(2, 2)).await.available, 0);
    assert_eq!(f.used().await, 2);
    assert_eq!(f.release(&expired.token).await, 0);
    assert_eq!(
        f.used().await,
        2,
        "the live lease's permits are still counted"
    );
}

/// Refresh sets the remaining ttl of its own lease only; a ttl below the minimum changes nothing,
/// 0 reuses the acquisition ttl, and a token without a live lease answers -1.
#[tokio::test]
async fn refresh_sets_only_its_own_lease() {
    let f = Fixture::start().await;
    let mine = f.granted(ask(1, 2)).await;
    let other = f.granted(ask(1, 2)).await;
    let other_expiry = f.expiry(&other.token).await;
    let before = f.expiry(&mine.token).await.expect("an expiry");

    assert_eq!(
        f.refresh(&mine.token, Some(Duration::from_secs(1)), Duration::ZERO)
            .await,
        1_000
    );
    let shortened = f.expiry(&mine.token).await.expect("an expiry");
    assert!(shortened < before - 50_000, "{shortened} vs {before}");
    assert_eq!(
        f.refresh(
            &mine.token,
            Some(Duration::from_millis(50)),
            Duration::from_millis(100)
        )
        .await,
        -2
    );
    assert_eq!(f.expiry(&mine.token).await, Some(shortened));
    assert_eq!(f.refresh(&mine.token, None, Duration::ZERO).await, 60_000);
    assert_eq!(f.expiry(&other.token).await, other_expiry);

    assert_eq!(f.refresh(&random_token(), None, Duration::ZERO).await, -1);
    f.expire(&f.keys.holders, &other.token).await;
    assert_eq!(f.refresh(&other.token, None, Duration::ZERO).await, -1);
}

/// Releasing a token that holds nothing (unknown or already released) answers 0 and leaves the
/// holders and the permits counted in use alone.
#[tokio::test]
async fn releasing_what_is_not_held_changes_nothing() {
    let f = Fixture::start().await;
    let held = f.granted(ask(2, 3)).await;
    assert_eq!(f.release(&random_token()).await, 0);
    assert_eq!(f.used().await, 2);
    assert_eq!(f.describe().await.permits_in_use, 2);
    assert_eq!(f.release(&held.token).await, 1);
    assert_eq!(f.release(&held.token).await, 0);
    assert_eq!(f.used().await, 0);
}

/// Abandon answers whether the waiter was registered and gives up its place: the waiter behind it
/// becomes the head.
#[tokio::test]
async fn abandon_gives_up_the_place() {
    let f = Fixture::start().await;
    let holder = f.granted(ask(1, 1)).await;
    f.refused(ask(1, 1).fair("a")).await;
    f.refused(ask(1, 1).fair("b")).await;
    f.refused(ask(1, 1).waiting("c")).await;

    assert_eq!(f.abandon("a").await, 1);
    assert_eq!(f.abandon("c").await, 1, "a waiter without a place");
    assert_eq!(f.abandon("a").await, 0);
    assert_eq!(f.abandon("nobody").await, 0);
    assert_eq!(f.queue().await, ["b"]);
    assert_eq!(f.describe().await.waiters, 1);
    f.release(&holder.token).await;
    f.granted(ask(1, 1).fair("b")).await;
}

/// A call whose reply never came may run after its clean-up: once the clean-up has released its
/// token or removed its waiter, that late call takes no permit and registers nobody.
#[tokio::test]
async fn a_late_call_after_its_clean_up_changes_nothing() {
    let f = Fixture::start().await;
    let void = Some(Duration::from_secs(60));
    assert_eq!(f.release_with("late-token", void).await, 0);
    match f.acquire_as(ask(1, 3), "late-token".into()).await {
        Outcome::Refused { .. } => {}
        other => panic!("a void token was granted: {other:?}"),
    }
    assert_eq!(f.describe().await.permits_in_use, 0);

    let held = f.granted(ask(3, 3)).await;
    assert_eq!(f.abandon_with("late-waiter", void).await, 0);
    f.refused(ask(1, 3).fair("late-waiter")).await;
    assert!(f.queue().await.is_empty(), "no place for a void waiter");
    assert_eq!(f.describe().await.waiters, 0, "no registration either");
    f.release(&held.token).await;
    f.granted(ask(3, 3)).await;
}

/// A retry by idempotency key that never reached its caller either (its own clean-up names the
/// retry's token) withdraws its claim: once the granting call and every claiming retry were given
/// up, in either order, the lease is released and its permits are free; while the granting call
/// may have reached its caller, it is kept. A claim's withdrawal once kept the permits until the
/// lease's ttl, unknown to anyone.
#[tokio::test]
async fn a_retry_that_never_reached_its_caller_withdraws_its_claim() {
    let f = Fixture::start().await;
    for (key, origin_first) in [("k-origin-first", true), ("k-retry-first", false)] {
        let (origin_call, retry_call) = (random_token(), random_token());
        let Outcome::Granted(first) = f
            .acquire_as(ask(1, 1).keyed(key), origin_call.clone())
            .await
        else {
            panic!("{key}: the first call is granted");
        };
        assert_eq!(first.token, origin_call);
        let Outcome::Granted(again) = f.acquire_as(ask(1, 1).keyed(key), retry_call.clone()).await
        else {
            panic!("{key}: the retry gets the lease back");
        };
        assert_eq!(again.token, origin_call);
        let (a, b) = if origin_first {
            (&origin_call, &retry_call)
        } else {
            (&retry_call, &origin_call)
        };
        assert_eq!(f.release_with(a, None).await, -1, "{key}: kept after one");
        assert_eq!(
            f.refused(ask(1, 1)).await,
            0,
            "{key}: the permit is still held"
        );
        assert_eq!(
            f.release_with(b, None).await,
            1,
            "{key}: released after both"
        );
        let free = f.granted(ask(1, 1)).await;
        assert_eq!(f.release(&free.token).await, 1);
    }

    // A retry given up while the granting call reached its caller: kept for that caller.
    let (origin_call, retry_call) = (random_token(), random_token());
    f.acquire_as(ask(1, 1).keyed("k-seen"), origin_call.clone())
        .await;
    f.acquire_as(ask(1, 1).keyed("k-seen"), retry_call.clone())
        .await;
    assert_eq!(f.release_with(&retry_call, None).await, -1);
    assert_eq!(f.refused(ask(1, 1)).await, 0, "still held");
    assert_eq!(f.release(&origin_call).await, 1, "its caller releases it");
    let mut conn = f.conn.clone();
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(&f.keys.data)
        .query_async(&mut conn)
        .await
        .expect("HKEYS");
    assert!(
        fields
            .iter()
            .all(|k| !["c:", "r:", "R:", "x:"].iter().any(|p| k.starts_with(p))),
        "claim records left: {fields:?}"
    );
}
