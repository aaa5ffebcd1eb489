//! What the lock, semaphore and election suites share: the events of `Hold`, `KeepAlive` and
//! `Campaign` streams read within a bound, bounded waits on what Describe reports, and looks at
//! the keys a lease leaves in Redis and at Redis's clock. Each helper is generic over the
//! services.

use std::{fmt::Debug, future::Future, time::Duration};

/// How soon a waiter woken through pub/sub has what was released, with room for a busy machine:
/// well under the second after which a waiter's own retry (a fair waiter renewing its place)
/// could have found it, the only other way it could learn of a release before the holder's ttl.
/// 50 ms failed once in CI (75 ms, the machine busy with the suite itself).
pub const WAKE_BOUND: Duration = Duration::from_millis(500);

use baton::proto::v1::{
    self as pb, election_service_campaign_response, lock_service_hold_response,
    lock_service_keep_alive_response, semaphore_service_hold_response,
    semaphore_service_keep_alive_response,
};
use tokio::{task::JoinHandle, time::Instant};
use tonic::Streaming;

use super::{RedisConn, wait_until, within};

// ---------------------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------------------

/// An event of a lease stream as the tests sort it: a renewal, `lost`, or any other (`acquired`,
/// `not_acquired`).
#[derive(Debug)]
pub enum Kind<E> {
    /// A renewal confirmed by Redis.
    Renewed(pb::LeaseRenewed),
    /// The lease is lost; the stream ends after it.
    Lost(pb::LeaseLost),
    /// Any other event.
    Other(E),
}

/// A message of a `Hold` or `KeepAlive` stream, of either service: one event each.
pub trait LeaseStream: Debug {
    /// The stream's event.
    type Event: Debug;
    /// The RPC, for failure messages.
    const RPC: &'static str;
    /// The event the message carries.
    fn into_event(self) -> Option<Self::Event>;
    /// Sorts `event`.
    fn kind(event: Self::Event) -> Kind<Self::Event>;
}

/// Implements [`LeaseStream`] for a stream message whose `Event` oneof has `Renewed` and `Lost`.
macro_rules! lease_stream {
    ($message:ty, $event:ident, $rpc:literal) => {
        impl LeaseStream for $message {
            type Event = $event::Event;
            const RPC: &'static str = $rpc;

            fn into_event(self) -> Option<Self::Event> {
                self.event
            }

            #[allow(unreachable_patterns)] // KeepAlive streams have no other event
            fn kind(event: Self::Event) -> Kind<Self::Event> {
                match event {
                    $event::Event::Renewed(r) => Kind::Renewed(r),
                    $event::Event::Lost(l) => Kind::Lost(l),
                    other => Kind::Other(other),
                }
            }
        }
    };
}

lease_stream!(
    pb::LockServiceHoldResponse,
    lock_service_hold_response,
    "Hold"
);
lease_stream!(
    pb::LockServiceKeepAliveResponse,
    lock_service_keep_alive_response,
    "KeepAlive"
);
lease_stream!(
    pb::SemaphoreServiceHoldResponse,
    semaphore_service_hold_response,
    "Hold"
);
lease_stream!(
    pb::SemaphoreServiceKeepAliveResponse,
    semaphore_service_keep_alive_response,
    "KeepAlive"
);
lease_stream!(
    pb::ElectionServiceCampaignResponse,
    election_service_campaign_response,
    "Campaign"
);

/// The next event of a stream within `limit`; panics if the stream fails or ends.
pub async fn next_event<M: LeaseStream>(
    stream: &mut Streaming<M>,
    limit: Duration,
    what: &str,
) -> M::Event {
    within(limit, stream.message(), what)
        .await
        .unwrap_or_else(|s| panic!("{what}: the {} stream failed: {s:?}", M::RPC))
        .unwrap_or_else(|| panic!("{what}: the {} stream ended", M::RPC))
        .into_event()
        .unwrap_or_else(|| panic!("{what}: an event without payload"))
}

/// The next event of a stream (within 5 s), which must be a renewal.
pub async fn next_renewal<M: LeaseStream>(stream: &mut Streaming<M>) -> pb::LeaseRenewed {
    match M::kind(next_event(stream, Duration::from_secs(5), "a renewal").await) {
        Kind::Renewed(r) => r,
        other => panic!("expected a renewal, got {other:?}"),
    }
}

/// Every event of a stream until `end`, which must all be renewals (and the stream open).
pub async fn renewals_until<M: LeaseStream>(
    stream: &mut Streaming<M>,
    end: Instant,
) -> Vec<pb::LeaseRenewed> {
    let mut renewals = Vec::new();
    while let Ok(message) = tokio::time::timeout_at(end, stream.message()).await {
        match message.map(|m| m.map(|m| m.into_event().map(M::kind))) {
            Ok(Some(Some(Kind::Renewed(r)))) => renewals.push(r),
            other => panic!("expected only renewals, got {other:?}"),
        }
    }
    renewals
}

/// Reads a stream (each event within `limit`) until its `lost` event, which it returns with the
/// renewals read on the way and when each arrived; any other event panics.
pub async fn read_until_lost<M: LeaseStream>(
    stream: &mut Streaming<M>,
    limit: Duration,
    what: &str,
) -> (pb::LeaseLost, Vec<(Instant, pb::LeaseRenewed)>) {
    let mut renewals = Vec::new();
    loop {
        match M::kind(next_event(stream, limit, what).await) {
            Kind::Renewed(r) => renewals.push((Instant::now(), r)),
            Kind::Lost(lost) => return (lost, renewals),
            Kind::Other(other) => panic!("{what}: expected renewed or lost, got {other:?}"),
        }
    }
}

/// Waits (bounded) until the stream ends cleanly.
pub async fn expect_end<T: Debug>(stream: &mut Streaming<T>, what: &str) {
    match within(Duration::from_secs(2), stream.message(), what).await {
        Ok(None) => {}
        other => panic!("{what}: expected the stream to end, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Describe
// ---------------------------------------------------------------------------------------------

/// A client of a leased primitive's service, as the waits on its Describe need it.
pub trait Described: Clone {
    /// What Describe answers.
    type Description: Debug;
    /// Describes `name`, panicking if the call fails.
    fn describe_name(&mut self, name: &str) -> impl Future<Output = Self::Description>;
    /// The callers waiting for `name`, as Describe counts them.
    fn waiters(description: &Self::Description) -> u32;
}

/// Waits (bounded, 5 s) until Describe of `name` satisfies `check`, returning that Describe.
pub async fn wait_for_state<C: Described>(
    client: &C,
    name: &str,
    what: &str,
    check: impl Fn(&C::Description) -> bool,
) -> C::Description {
    wait_for_state_within(client, name, Duration::from_secs(5), what, check).await
}

/// Waits (at most `limit`) until Describe of `name` satisfies `check`, returning that Describe.
pub async fn wait_for_state_within<C: Described>(
    client: &C,
    name: &str,
    limit: Duration,
    what: &str,
    check: impl Fn(&C::Description) -> bool,
) -> C::Description {
    let check = &check;
    wait_until(limit, what, || {
        let mut client = client.clone();
        async move {
            let d = client.describe_name(name).await;
            if check(&d) { Ok(d) } else { Err(d) }
        }
    })
    .await
}

/// Waits (bounded) until Describe reports `n` waiters on `name`.
pub async fn wait_for_waiters<C: Described>(client: &C, name: &str, n: u32) {
    let what = format!("{n} waiter(s) on {name:?}");
    // Waiters register as fast as the machine lets them (32 took more than 5 s at a load of 10);
    // nothing but registering makes them count.
    wait_for_state_within(client, name, Duration::from_secs(30), &what, |d| {
        C::waiters(d) == n
    })
    .await;
}

/// Like [`wait_for_waiters`], but fails at once with the waiter's outcome if `waiter` ends first.
pub async fn wait_for_waiters_while<C: Described, T: Debug>(
    client: &C,
    name: &str,
    n: u32,
    waiter: &mut JoinHandle<T>,
) {
    tokio::select! {
        () = wait_for_waiters(client, name, n) => {}
        outcome = waiter => panic!("the waiter ended before {n} waited on {name:?}: {outcome:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------------------------

/// Waits (bounded, 5 s) until Redis has run no script for 50 ms: the first tries and subscribed
/// retries of waiters that just registered are over, so script counts taken from now on are the
/// test's.
pub async fn wait_for_scripts_to_settle(conn: &mut RedisConn) {
    let end = Instant::now() + Duration::from_secs(5);
    let mut last = conn.command_calls("evalsha").await;
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = conn.command_calls("evalsha").await;
        if now == last {
            break;
        }
        assert!(
            Instant::now() < end,
            "scripts still running after 5 s ({now} calls)"
        );
        last = now;
    }
}

/// `PTTL key`: milliseconds left, -1 without an expiry, -2 when the key does not exist.
pub async fn pttl(conn: &mut RedisConn, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL")
}

/// Whether `key` exists.
pub async fn exists(conn: &mut RedisConn, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

/// Redis's clock: (milliseconds, microseconds) since the epoch.
pub async fn redis_time(conn: &mut RedisConn) -> (u64, u64) {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    let us = secs * 1_000_000 + micros;
    (us / 1000, us)
}

/// `ZSCORE key member`: `None` when the member is not there.
pub async fn zscore(conn: &mut RedisConn, key: &str, member: &str) -> Option<f64> {
    redis::cmd("ZSCORE")
        .arg(key)
        .arg(member)
        .query_async(conn)
        .await
        .expect("ZSCORE")
}

/// `ZCARD key`.
pub async fn zcard(conn: &mut RedisConn, key: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(conn)
        .await
        .expect("ZCARD")
}

/// Every key under `prefix`, sorted (on every master of a Cluster).
pub async fn keys_under(conn: &mut RedisConn, prefix: &str) -> Vec<String> {
    conn.keys(&format!("{prefix}*")).await
}
