//! A seeded randomized test of the lease promises: random sequences of Acquire, Hold, KeepAlive,
//! Refresh, Release and Describe on locks (exclusive and shared, reentrant owners, several ttls)
//! and semaphores, through two Batons sharing one real Redis, with cancelled streams, replies lost
//! to tiny deadlines and Redis frozen by SIGSTOP. After every step, what each client was told is
//! checked against a small model:
//!
//! - no two clients of different owners are entitled to a lock at once when either holds it
//!   exclusively;
//! - every lease is honoured for as long as the client was promised (`remaining_ttl` measured
//!   from when it sent the request, or the absolute expiry of a stream's last event), unless the
//!   client was told `lost` first: `Describe` shows it held, `Release` finds it held, `Refresh`
//!   finds it held, and a stream never ends without `lost`;
//! - fencing tokens never go backwards;
//! - the permits of a semaphore's entitled holders never exceed the strictest limit;
//! - `Describe` never reveals a lease token.
//!
//! `BATON_MODEL_SEED` and `BATON_MODEL_STEPS` run other or longer sequences; a failure prints the
//! seed and the trace of the steps.

mod support;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use baton::proto::v1::{
    self as pb, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event as LockHoldEvent,
    lock_service_keep_alive_response::Event as LockKeepAliveEvent,
    semaphore_service_client::SemaphoreServiceClient,
    semaphore_service_hold_response::Event as SemHoldEvent,
    semaphore_service_keep_alive_response::Event as SemKeepAliveEvent,
};
use nix::sys::signal::Signal;
use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
use support::{Baton, RedisServer, ms, std_duration};
use tokio::{task::JoinSet, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, transport::Channel};

/// The sequence CI runs.
const DEFAULT_SEED: u64 = 1;
/// Steps CI runs: about 10-20 s.
const DEFAULT_STEPS: usize = 200;
/// Slack for Redis's millisecond clock and key expiry granularity.
const TOLERANCE: Duration = Duration::from_millis(3);
/// Lock names (two, so that several locks interleave) and the semaphore name.
const LOCKS: [&str; 2] = ["l0", "l1"];
const SEMAPHORE: &str = "s0";
/// Owners shared by several clients (reentrancy); `""` is an anonymous caller.
const OWNERS: [&str; 3] = ["", "alice", "bob"];
/// Lease ttls, mixed on purpose (ms).
const TTLS: [u64; 5] = [150, 300, 700, 1500, 4000];

type Locks = LockServiceClient<Channel>;
type Sems = SemaphoreServiceClient<Channel>;

/// One grant a client was told about, and how long the client may act on it.
#[derive(Debug, Clone)]
struct Entitlement {
    /// Which resource: a lock name or the semaphore.
    resource: String,
    /// Who the client is: the lock owner, or a name of its own for an anonymous caller and for
    /// every semaphore lease.
    identity: String,
    /// Exclusive lock lease (as reported by the grant).
    exclusive: bool,
    /// Semaphore permits, and the limit the holder asked for.
    permits: u32,
    limit: u32,
    fence: u64,
    token: String,
    /// When the client sent the request that granted it.
    requested: Instant,
    /// When the client learnt of the grant.
    start: Instant,
    /// Until when the client may act on it, as far as it was told.
    end: Instant,
    /// The client stopped acting on it (released, lost, or gave the stream up).
    over: bool,
    /// Kept alive by a stream (not eligible for Release/Refresh/KeepAlive by the driver).
    streamed: bool,
    /// The ttl of the grant (for Refresh and KeepAlive without a ttl).
    ttl: u64,
}

/// Everything the clients were told, and the violations found so far.
struct World {
    t0: Instant,
    grants: Vec<Entitlement>,
    violations: Vec<String>,
    trace: Vec<String>,
}

type Shared = Arc<Mutex<World>>;

fn model(shared: &Shared) -> std::sync::MutexGuard<'_, World> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

impl World {
    fn at(&self, t: Instant) -> String {
        format!(
            "{:>7.1}ms",
            t.duration_since(self.t0).as_secs_f64() * 1000.0
        )
    }

    fn note(&mut self, line: String) {
        let now = self.at(Instant::now());
        self.trace.push(format!("{now} {line}"));
    }

    fn violation(&mut self, what: String) {
        let now = self.at(Instant::now());
        self.trace.push(format!("{now} VIOLATION {what}"));
        self.violations.push(format!("{now} {what}"));
    }

    /// Records a grant; returns its index.
    fn grant(&mut self, g: Entitlement) -> usize {
        let line = format!(
            "granted {} to {} (fence {}, {}{} permits/limit {}/{}, ends {})",
            g.resource,
            g.identity,
            g.fence,
            if g.exclusive { "x" } else { "s" },
            if g.streamed { " streamed" } else { "" },
            g.permits,
            g.limit,
            self.at(g.end)
        );
        self.note(line);
        self.grants.push(g);
        self.grants.len() - 1
    }

    /// The client stops acting on grant `i` at `t`.
    fn stop(&mut self, i: usize, t: Instant, why: &str) {
        let g = &mut self.grants[i];
        if !g.over {
            g.end = g.end.min(t);
            g.over = true;
            let line = format!("{} {} stops: {why}", g.resource, g.identity);
            self.note(line);
        }
    }

    /// A stream reported grant `i` lost at `t`: the client stops. `NOT_HELD` means Redis no longer
    /// has the lease, which breaks the promise if the client was still entitled.
    fn lost(&mut self, i: usize, t: Instant, lost: &pb::LeaseLost) {
        let g = &self.grants[i];
        if lost.reason() == pb::LeaseLostReason::NotHeld && !g.over && t + TOLERANCE < g.end {
            let (resource, identity, end) =
                (g.resource.clone(), g.identity.clone(), self.at(g.end));
            self.violation(format!(
                "{resource}: the lease of {identity} is gone although it was promised until {end}"
            ));
        }
        self.stop(i, t, &format!("lost {:?}", lost.reason()));
    }

    /// Grant `i` was renewed: the client may act on it until `until`.
    fn extend(&mut self, i: usize, until: Instant) {
        let g = &mut self.grants[i];
        if !g.over && until > g.end {
            g.end = until;
        }
    }

    /// Checks every promise against everything recorded so far.
    fn check(&mut self) {
        let mut found = Vec::new();
        for (i, a) in self.grants.iter().enumerate() {
            for b in &self.grants[i + 1..] {
                if a.resource != b.resource {
                    continue;
                }
                let overlap = a.start.max(b.start) + TOLERANCE < a.end.min(b.end);
                let is_lock = !a.resource.starts_with('s');
                if is_lock && overlap && a.identity != b.identity && (a.exclusive || b.exclusive) {
                    found.push(format!(
                        "{}: {} (fence {}, {}..{}) and {} (fence {}, {}..{}) both entitled, one \
                         exclusively",
                        a.resource,
                        a.identity,
                        a.fence,
                        self.at(a.start),
                        self.at(a.end),
                        b.identity,
                        b.fence,
                        self.at(b.start),
                        self.at(b.end)
                    ));
                }
                // Fencing: a new tenure requested after another grant was made has a greater
                // token; a grant that re-entered its owner's lease keeps that lease's token.
                for (x, y) in [(a, b), (b, a)] {
                    if x.start < y.requested && !self.reentered(y) && y.fence <= x.fence {
                        found.push(format!(
                            "{}: fencing went back: {} got {} after {} got {}",
                            x.resource, y.identity, y.fence, x.identity, x.fence
                        ));
                    }
                }
            }
            // Semaphore: at each grant, the permits of everyone entitled fit the limits.
            if a.resource == SEMAPHORE {
                let t = a.start;
                let live: Vec<&Entitlement> = self
                    .grants
                    .iter()
                    .filter(|g| g.resource == SEMAPHORE && g.start <= t && t + TOLERANCE < g.end)
                    .collect();
                let used: u32 = live.iter().map(|g| g.permits).sum();
                let limit = live.iter().map(|g| g.limit).min().unwrap_or(u32::MAX);
                if used > limit {
                    found.push(format!(
                        "{SEMAPHORE}: {used} permits entitled at {} under a limit of {limit}",
                        self.at(t)
                    ));
                }
            }
        }
        found.sort();
        found.dedup();
        for v in found {
            if !self.violations.iter().any(|known| known.ends_with(&v)) {
                self.violation(v);
            }
        }
    }

    /// Whether grant `y` re-entered a lease its owner already held (same owner, same fencing
    /// token, granted before `y` was asked for).
    fn reentered(&self, y: &Entitlement) -> bool {
        self.grants.iter().any(|z| {
            z.resource == y.resource
                && z.identity == y.identity
                && z.fence == y.fence
                && z.start < y.requested
        })
    }

    /// The locks that named owners are entitled to now, with the owner.
    fn held_by_owners(&self) -> Vec<(String, String)> {
        let now = Instant::now();
        self.grants
            .iter()
            .filter(|g| {
                !g.over
                    && g.end > now
                    && g.resource != SEMAPHORE
                    && OWNERS.contains(&g.identity.as_str())
            })
            .map(|g| (g.resource.clone(), g.identity.clone()))
            .collect()
    }

    /// The live, unstreamed grants the driver may release, refresh or keep alive.
    fn unary(&self, resource_is_lock: bool) -> Vec<usize> {
        let now = Instant::now();
        self.grants
            .iter()
            .enumerate()
            .filter(|(_, g)| {
                !g.over
                    && !g.streamed
                    && g.end > now
                    && resource_is_lock != (g.resource == SEMAPHORE)
            })
            .map(|(i, _)| i)
            .collect()
    }
}

/// The expiry a stream event promises: its absolute expiry when it carries one, by this machine's
/// clock, turned into this test's monotonic clock.
fn event_end(received: Instant, renewed: &pb::LeaseRenewed) -> Instant {
    let expires_at = renewed
        .expires_at
        .as_ref()
        .expect("a renewal carries its absolute expiry");
    let at = SystemTime::UNIX_EPOCH
        + Duration::new(
            u64::try_from(expires_at.seconds).expect("expiry after 1970"),
            u32::try_from(expires_at.nanos).expect("nanos"),
        );
    match at.duration_since(SystemTime::now()) {
        Ok(left) => Instant::now() + left,
        Err(past) => received.min(Instant::now() - past.duration()),
    }
}

/// The absolute expiry of a grant sent in a stream's first event, as [`event_end`].
fn grant_end(received: Instant, expires_at: Option<&prost_types::Timestamp>) -> Instant {
    event_end(
        received,
        &pb::LeaseRenewed {
            remaining_ttl: None,
            expires_at: expires_at.copied(),
        },
    )
}

/// What the driver can do at each step.
struct Driver {
    rng: Xoshiro256PlusPlus,
    world: Shared,
    redis: RedisServer,
    locks: [Locks; 2],
    sems: [Sems; 2],
    /// Cancels the open streams, one each.
    streams: Vec<CancellationToken>,
    tasks: JoinSet<()>,
    anon: usize,
}

impl Driver {
    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.rng.random_range(0..from.len())]
    }

    fn identity(&mut self, owner: &str) -> String {
        if owner.is_empty() {
            self.anon += 1;
            format!("anon{}", self.anon)
        } else {
            owner.to_owned()
        }
    }

    async fn step(&mut self) {
        match self.rng.random_range(0..100) {
            0..=15 => self.lock_acquire(false).await,
            16..=18 => self.lock_acquire(true).await,
            19..=29 => self.lock_hold(),
            30..=35 => self.lock_release().await,
            36..=42 => self.lock_refresh().await,
            43..=46 => self.lock_keep_alive(),
            47..=51 => self.close_stream(),
            52..=63 => {
                for name in LOCKS {
                    self.lock_describe(name).await;
                }
            }
            64..=70 => self.sem_acquire().await,
            71..=75 => self.sem_hold(),
            76..=79 => self.sem_release().await,
            80..=82 => self.sem_refresh().await,
            83..=84 => self.sem_keep_alive(),
            85..=86 => self.pause_redis().await,
            _ => {
                let pause = self.rng.random_range(20..400);
                model(&self.world).note(format!("time passes: {pause} ms"));
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }
    }

    /// A lock request: often by an owner that holds a lock already, re-entering it (with another
    /// ttl, as nested code would), otherwise for any lock by any owner.
    fn lock_request(&mut self) -> (pb::LockServiceAcquireRequest, String) {
        let held = model(&self.world).held_by_owners();
        let (name, owner) = if !held.is_empty() && self.rng.random_bool(0.4) {
            let (name, owner) = held[self.rng.random_range(0..held.len())].clone();
            (name, owner)
        } else {
            (self.pick(&LOCKS).to_owned(), self.pick(&OWNERS).to_owned())
        };
        let owner = owner.as_str();
        let ttl = self.pick(&TTLS);
        let wait = if self.rng.random_bool(0.5) {
            0
        } else {
            self.rng.random_range(1..600)
        };
        let shared = self.rng.random_bool(0.3);
        let request = pb::LockServiceAcquireRequest {
            name,
            ttl: Some(ms(ttl)),
            wait_timeout: (wait > 0).then(|| ms(wait)),
            owner: owner.to_owned(),
            fair: self.rng.random_bool(0.3),
            mode: if shared {
                pb::LockMode::Shared
            } else {
                pb::LockMode::Exclusive
            }
            .into(),
            ..Default::default()
        };
        let identity = self.identity(owner);
        (request, identity)
    }

    /// Acquire, waiting or not; with `tiny_deadline` the reply is likely lost to the caller's
    /// deadline, and the caller then holds nothing.
    async fn lock_acquire(&mut self, tiny_deadline: bool) {
        let (mut request, identity) = self.lock_request();
        // A caller whose reply may be lost often carries an idempotency key, and retries with it
        // (without the tiny deadline) when the reply is lost: it must get the grant that went
        // through, or a fresh one, never two.
        let retry = tiny_deadline && self.rng.random_bool(0.6);
        if retry {
            request.idempotency_key = format!("key-{}", self.rng.random::<u64>());
        }
        let mut client = self.locks[self.rng.random_range(0..2)].clone();
        let world = self.world.clone();
        let deadline = Duration::from_millis(self.rng.random_range(1..6));
        let ttl = request
            .ttl
            .as_ref()
            .map_or(0, |d| std_duration(d).as_millis() as u64);
        world_note(
            &world,
            format!(
                "acquire {} as {identity} ttl {ttl} wait {:?} {}{}{}",
                request.name,
                request.wait_timeout.map(|d| std_duration(&d)),
                if request.mode == pb::LockMode::Shared as i32 {
                    "shared"
                } else {
                    "exclusive"
                },
                if tiny_deadline {
                    format!(" deadline {deadline:?}")
                } else {
                    String::new()
                },
                if retry { " retried with its key" } else { "" }
            ),
        );
        let work = async move {
            let name = request.name.clone();
            let mut call = Request::new(request.clone());
            if tiny_deadline {
                call.set_timeout(deadline);
            }
            let mut requested = Instant::now();
            let mut reply = client.acquire(call).await;
            if retry
                && let Err(status) = &reply
                // tonic's client answers its own timer with CANCELLED ("Timeout expired").
                && matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled)
            {
                world_note(&world, format!("{name}: {identity} retries with its key"));
                requested = Instant::now();
                reply = client.acquire(Request::new(request)).await;
            }
            let received = Instant::now();
            let mut w = model(&world);
            match reply {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    let Some(lease) = reply.lease.filter(|_| reply.acquired) else {
                        w.note(format!("{name}: not acquired by {identity}"));
                        return;
                    };
                    let remaining = std_duration(&lease.remaining_ttl.unwrap_or_default());
                    if w.grants.iter().any(|g| g.token == lease.token) {
                        w.violation(format!(
                            "{name}: {identity} was handed a token another grant already has"
                        ));
                    }
                    w.grant(Entitlement {
                        resource: name,
                        identity,
                        exclusive: lease.mode == pb::LockMode::Exclusive as i32,
                        permits: 0,
                        limit: 0,
                        fence: lease.fencing_token,
                        token: lease.token,
                        requested,
                        start: received,
                        end: requested + remaining,
                        over: false,
                        streamed: false,
                        ttl,
                    });
                    w.check();
                }
                Err(status) => w.note(format!(
                    "{name}: acquire by {identity}: {:?}",
                    status.code()
                )),
            }
        };
        self.tasks.spawn(work);
        // Give short calls a chance to finish before the next step.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    fn lock_hold(&mut self) {
        let (acquire, identity) = self.lock_request();
        let ttl = self.pick(&TTLS[1..]);
        let request = pb::LockServiceHoldRequest {
            name: acquire.name,
            ttl: Some(ms(ttl)),
            wait_timeout: acquire.wait_timeout,
            owner: acquire.owner,
            fair: acquire.fair,
            mode: acquire.mode,
        };
        let mut client = self.locks[self.rng.random_range(0..2)].clone();
        let world = self.world.clone();
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        world_note(
            &world,
            format!("hold {} as {identity} ttl {ttl}", request.name),
        );
        self.tasks.spawn(async move {
            let name = request.name.clone();
            let requested = Instant::now();
            let mut stream = match client.hold(request).await {
                Ok(s) => s.into_inner(),
                Err(status) => {
                    world_note(
                        &world,
                        format!("{name}: hold by {identity}: {:?}", status.code()),
                    );
                    return;
                }
            };
            let mut current = None;
            loop {
                let message = tokio::select! {
                    () = stop.cancelled() => {
                        if let Some(i) = current {
                            model(&world).stop(i, Instant::now(), "closes its Hold stream");
                        }
                        return;
                    }
                    m = stream.message() => m,
                };
                let received = Instant::now();
                let mut w = model(&world);
                match message {
                    Ok(Some(pb::LockServiceHoldResponse { event: Some(event) })) => match event {
                        LockHoldEvent::Acquired(lease) => {
                            let end = grant_end(received, lease.expires_at.as_ref());
                            let i = w.grant(Entitlement {
                                resource: name.clone(),
                                identity: identity.clone(),
                                exclusive: lease.mode == pb::LockMode::Exclusive as i32,
                                permits: 0,
                                limit: 0,
                                fence: lease.fencing_token,
                                token: lease.token,
                                requested,
                                start: received,
                                end,
                                over: false,
                                streamed: true,
                                ttl,
                            });
                            current = Some(i);
                            w.check();
                        }
                        LockHoldEvent::NotAcquired(_) => {
                            w.note(format!("{name}: hold by {identity} not acquired"));
                        }
                        LockHoldEvent::Renewed(renewed) => {
                            if let Some(i) = current {
                                w.extend(i, event_end(received, &renewed));
                            }
                        }
                        LockHoldEvent::Lost(lost) => {
                            if let Some(i) = current {
                                w.lost(i, received, &lost);
                            }
                        }
                    },
                    Ok(Some(_)) => w.violation(format!("{name}: an event without payload")),
                    Ok(None) => {
                        if let Some(i) = current
                            && !w.grants[i].over
                        {
                            w.violation(format!(
                                "{name}: the Hold stream of {identity} ended without `lost`"
                            ));
                            w.stop(i, received, "stream ended");
                        }
                        return;
                    }
                    Err(status) => {
                        if let Some(i) = current {
                            w.stop(i, received, &format!("stream failed {:?}", status.code()));
                        }
                        return;
                    }
                }
            }
        });
        self.streams.push(cancel);
    }

    async fn lock_release(&mut self) {
        let live = model(&self.world).unary(true);
        if live.is_empty() {
            return;
        }
        let i = self.pick(&live);
        let (name, token, end) = {
            let mut w = model(&self.world);
            let now = Instant::now();
            w.stop(i, now, "releases");
            let g = &w.grants[i];
            (g.resource.clone(), g.token.clone(), g.end)
        };
        let mut client = self.locks[self.rng.random_range(0..2)].clone();
        let reply = client
            .release(pb::LockServiceReleaseRequest {
                name: name.clone(),
                token,
            })
            .await;
        let mut w = model(&self.world);
        match reply {
            Ok(r) if !r.get_ref().was_held && Instant::now() + TOLERANCE < end => {
                w.violation(format!(
                    "{name}: a release found the lease gone while promised"
                ));
            }
            Ok(r) => w.note(format!(
                "{name}: released, was_held {}",
                r.get_ref().was_held
            )),
            Err(s) => w.note(format!("{name}: release failed {:?}", s.code())),
        }
    }

    async fn lock_refresh(&mut self) {
        let live = model(&self.world).unary(true);
        if live.is_empty() {
            return;
        }
        let i = self.pick(&live);
        let ttl = self.rng.random_bool(0.5).then(|| self.pick(&TTLS));
        let requested = Instant::now();
        let (name, token, end) = {
            let mut w = model(&self.world);
            let g = &mut w.grants[i];
            let new = ttl.unwrap_or(g.ttl);
            // A prudent client acts only until the shorter of both while the refresh is in flight.
            g.end = g.end.min(requested + Duration::from_millis(new));
            let out = (g.resource.clone(), g.token.clone(), g.end);
            w.note(format!("refresh {} ttl {ttl:?}", out.0));
            out
        };
        let mut client = self.locks[self.rng.random_range(0..2)].clone();
        let reply = client
            .refresh(pb::LockServiceRefreshRequest {
                name: name.clone(),
                token,
                ttl: ttl.map(ms),
            })
            .await;
        let mut w = model(&self.world);
        match reply {
            Ok(r) => {
                let remaining = std_duration(&r.into_inner().remaining_ttl.unwrap_or_default());
                let g = &mut w.grants[i];
                if !g.over {
                    g.end = requested + remaining;
                }
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                if requested + TOLERANCE < end {
                    w.violation(format!(
                        "{name}: a refresh found the lease gone while promised"
                    ));
                }
                w.stop(i, Instant::now(), "refresh: not held");
            }
            Err(s) => w.note(format!("{name}: refresh failed {:?}", s.code())),
        }
    }

    fn lock_keep_alive(&mut self) {
        let live = model(&self.world).unary(true);
        if live.is_empty() {
            return;
        }
        let i = self.pick(&live);
        let ttl = self.rng.random_bool(0.5).then(|| self.pick(&TTLS[1..]));
        let (name, token) = {
            let mut w = model(&self.world);
            let g = &mut w.grants[i];
            g.streamed = true;
            let out = (g.resource.clone(), g.token.clone());
            w.note(format!("keep alive {} ttl {ttl:?}", out.0));
            out
        };
        let mut client = self.locks[self.rng.random_range(0..2)].clone();
        let world = self.world.clone();
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        self.tasks.spawn(async move {
            let mut stream = match client
                .keep_alive(pb::LockServiceKeepAliveRequest {
                    name: name.clone(),
                    token,
                    ttl: ttl.map(ms),
                })
                .await
            {
                Ok(s) => s.into_inner(),
                Err(status) => {
                    let mut w = model(&world);
                    w.note(format!("{name}: keep alive refused {:?}", status.code()));
                    // Refused: the client falls back to what it knew.
                    w.grants[i].streamed = false;
                    return;
                }
            };
            loop {
                let message = tokio::select! {
                    () = stop.cancelled() => {
                        model(&world).stop(i, Instant::now(), "closes its KeepAlive stream");
                        return;
                    }
                    m = stream.message() => m,
                };
                let received = Instant::now();
                let mut w = model(&world);
                match message {
                    Ok(Some(pb::LockServiceKeepAliveResponse { event: Some(event) })) => {
                        match event {
                            LockKeepAliveEvent::Renewed(r) => w.extend(i, event_end(received, &r)),
                            LockKeepAliveEvent::Lost(l) => {
                                w.lost(i, received, &l);
                            }
                        }
                    }
                    Ok(Some(_)) => w.violation(format!("{name}: an event without payload")),
                    Ok(None) => {
                        if !w.grants[i].over {
                            w.violation(format!("{name}: a KeepAlive stream ended without `lost`"));
                            w.stop(i, received, "stream ended");
                        }
                        return;
                    }
                    Err(status) => {
                        w.stop(i, received, &format!("stream failed {:?}", status.code()));
                        return;
                    }
                }
            }
        });
        self.streams.push(cancel);
    }

    fn close_stream(&mut self) {
        if self.streams.is_empty() {
            return;
        }
        let k = self.rng.random_range(0..self.streams.len());
        let cancel = self.streams.swap_remove(k);
        model(&self.world).note("a client closes a stream".to_owned());
        cancel.cancel();
    }

    async fn lock_describe(&mut self, name: &str) {
        let mut client = self.locks[self.rng.random_range(0..2)].clone();
        let requested = Instant::now();
        let reply = client
            .describe(pb::LockServiceDescribeRequest {
                name: name.to_owned(),
            })
            .await;
        let received = Instant::now();
        let Ok(d) = reply.map(tonic::Response::into_inner) else {
            return;
        };
        let mut w = model(&self.world);
        let owners = [
            d.owner.as_str(),
            d.earliest_shared_holder
                .as_ref()
                .map_or("", |h| h.owner.as_str()),
        ];
        if owners
            .iter()
            .any(|o| !o.is_empty() && w.grants.iter().any(|g| g.token == *o))
        {
            w.violation(format!(
                "{name}: Describe revealed a lease token as an owner"
            ));
        }
        let entitled: Vec<Entitlement> = w
            .grants
            .iter()
            .filter(|g| g.resource == name && g.start <= requested && received + TOLERANCE < g.end)
            .cloned()
            .collect();
        for g in entitled {
            let exclusive = d.mode == pb::LockMode::Exclusive as i32;
            let ok = d.held
                && if g.exclusive {
                    exclusive && (g.identity.starts_with("anon") || d.owner == g.identity)
                } else {
                    true
                };
            if !ok {
                let until = w.at(g.end);
                w.violation(format!(
                    "{name}: {} is entitled ({}, until {until}) but Describe says {d:?}",
                    g.identity,
                    if g.exclusive { "exclusive" } else { "shared" },
                ));
            }
        }
    }

    fn sem_request(&mut self) -> (pb::SemaphoreServiceAcquireRequest, String) {
        let limit = self.rng.random_range(2..5);
        let permits = self.rng.random_range(1..=limit.min(2));
        let wait = if self.rng.random_bool(0.5) {
            0
        } else {
            self.rng.random_range(1..600)
        };
        let identity = self.identity("");
        let request = pb::SemaphoreServiceAcquireRequest {
            name: SEMAPHORE.to_owned(),
            limit,
            permits,
            ttl: Some(ms(self.pick(&TTLS))),
            wait_timeout: (wait > 0).then(|| ms(wait)),
            owner: String::new(),
            fair: self.rng.random_bool(0.3),
            ..Default::default()
        };
        (request, identity)
    }

    async fn sem_acquire(&mut self) {
        let (request, identity) = self.sem_request();
        let mut client = self.sems[self.rng.random_range(0..2)].clone();
        let world = self.world.clone();
        let ttl = request
            .ttl
            .as_ref()
            .map_or(0, |d| std_duration(d).as_millis() as u64);
        world_note(
            &world,
            format!(
                "sem acquire as {identity} {}/{} ttl {ttl} wait {:?}",
                request.permits,
                request.limit,
                request.wait_timeout.map(|d| std_duration(&d))
            ),
        );
        let asked = request.limit;
        self.tasks.spawn(async move {
            let requested = Instant::now();
            let reply = client.acquire(request).await;
            let received = Instant::now();
            let mut w = model(&world);
            match reply {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    let Some(p) = reply.permit.filter(|_| reply.acquired) else {
                        return;
                    };
                    let remaining = std_duration(&p.remaining_ttl.unwrap_or_default());
                    w.grant(Entitlement {
                        resource: SEMAPHORE.to_owned(),
                        identity,
                        exclusive: false,
                        permits: p.permits,
                        limit: asked,
                        fence: p.fencing_token,
                        token: p.token,
                        requested,
                        start: received,
                        end: requested + remaining,
                        over: false,
                        streamed: false,
                        ttl,
                    });
                    w.check();
                }
                Err(status) => w.note(format!("sem acquire: {:?}", status.code())),
            }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    fn sem_hold(&mut self) {
        let (acquire, identity) = self.sem_request();
        let ttl = self.pick(&TTLS[1..]);
        let request = pb::SemaphoreServiceHoldRequest {
            name: acquire.name,
            limit: acquire.limit,
            permits: acquire.permits,
            ttl: Some(ms(ttl)),
            wait_timeout: acquire.wait_timeout,
            owner: String::new(),
            fair: acquire.fair,
        };
        let mut client = self.sems[self.rng.random_range(0..2)].clone();
        let world = self.world.clone();
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let asked = request.limit;
        world_note(&world, format!("sem hold as {identity} ttl {ttl}"));
        self.tasks.spawn(async move {
            let requested = Instant::now();
            let mut stream = match client.hold(request).await {
                Ok(s) => s.into_inner(),
                Err(_) => return,
            };
            let mut index = None;
            loop {
                let message = tokio::select! {
                    () = stop.cancelled() => {
                        if let Some(i) = index {
                            model(&world).stop(i, Instant::now(), "closes its Hold stream");
                        }
                        return;
                    }
                    m = stream.message() => m,
                };
                let received = Instant::now();
                let mut w = model(&world);
                match message {
                    Ok(Some(pb::SemaphoreServiceHoldResponse { event: Some(event) })) => {
                        match event {
                            SemHoldEvent::Acquired(p) => {
                                let end = grant_end(received, p.expires_at.as_ref());
                                index = Some(w.grant(Entitlement {
                                    resource: SEMAPHORE.to_owned(),
                                    identity: identity.clone(),
                                    exclusive: false,
                                    permits: p.permits,
                                    limit: asked,
                                    fence: p.fencing_token,
                                    token: p.token,
                                    requested,
                                    start: received,
                                    end,
                                    over: false,
                                    streamed: true,
                                    ttl,
                                }));
                                w.check();
                            }
                            SemHoldEvent::NotAcquired(_) => {}
                            SemHoldEvent::Renewed(r) => {
                                if let Some(i) = index {
                                    w.extend(i, event_end(received, &r));
                                }
                            }
                            SemHoldEvent::Lost(l) => {
                                if let Some(i) = index {
                                    w.lost(i, received, &l);
                                }
                            }
                        }
                    }
                    Ok(Some(_)) => w.violation("an event without payload".to_owned()),
                    Ok(None) => {
                        if let Some(i) = index
                            && !w.grants[i].over
                        {
                            w.violation(format!(
                                "{SEMAPHORE}: the Hold stream of {identity} ended without `lost`"
                            ));
                            w.stop(i, received, "stream ended");
                        }
                        return;
                    }
                    Err(status) => {
                        if let Some(i) = index {
                            w.stop(i, received, &format!("stream failed {:?}", status.code()));
                        }
                        return;
                    }
                }
            }
        });
        self.streams.push(cancel);
    }

    async fn sem_release(&mut self) {
        let live = model(&self.world).unary(false);
        if live.is_empty() {
            return;
        }
        let i = self.pick(&live);
        let (token, end) = {
            let mut w = model(&self.world);
            w.stop(i, Instant::now(), "releases");
            (w.grants[i].token.clone(), w.grants[i].end)
        };
        let mut client = self.sems[self.rng.random_range(0..2)].clone();
        let reply = client
            .release(pb::SemaphoreServiceReleaseRequest {
                name: SEMAPHORE.to_owned(),
                token,
            })
            .await;
        let mut w = model(&self.world);
        if let Ok(r) = reply
            && !r.get_ref().was_held
            && Instant::now() + TOLERANCE < end
        {
            w.violation(format!(
                "{SEMAPHORE}: a release found the lease gone while promised"
            ));
        }
    }

    async fn sem_refresh(&mut self) {
        let live = model(&self.world).unary(false);
        if live.is_empty() {
            return;
        }
        let i = self.pick(&live);
        let ttl = self.rng.random_bool(0.5).then(|| self.pick(&TTLS));
        let requested = Instant::now();
        let (token, end) = {
            let mut w = model(&self.world);
            let g = &mut w.grants[i];
            let new = ttl.unwrap_or(g.ttl);
            g.end = g.end.min(requested + Duration::from_millis(new));
            (g.token.clone(), g.end)
        };
        let mut client = self.sems[self.rng.random_range(0..2)].clone();
        let reply = client
            .refresh(pb::SemaphoreServiceRefreshRequest {
                name: SEMAPHORE.to_owned(),
                token,
                ttl: ttl.map(ms),
            })
            .await;
        let mut w = model(&self.world);
        match reply {
            Ok(r) => {
                let remaining = std_duration(&r.into_inner().remaining_ttl.unwrap_or_default());
                let g = &mut w.grants[i];
                if !g.over {
                    g.end = requested + remaining;
                }
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                if requested + TOLERANCE < end {
                    w.violation(format!(
                        "{SEMAPHORE}: a refresh found the lease gone while promised"
                    ));
                }
                w.stop(i, Instant::now(), "refresh: not held");
            }
            Err(_) => {}
        }
    }

    fn sem_keep_alive(&mut self) {
        let live = model(&self.world).unary(false);
        if live.is_empty() {
            return;
        }
        let i = self.pick(&live);
        let ttl = self.rng.random_bool(0.5).then(|| self.pick(&TTLS[1..]));
        let token = {
            let mut w = model(&self.world);
            w.grants[i].streamed = true;
            w.grants[i].token.clone()
        };
        let mut client = self.sems[self.rng.random_range(0..2)].clone();
        let world = self.world.clone();
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        self.tasks.spawn(async move {
            let mut stream = match client
                .keep_alive(pb::SemaphoreServiceKeepAliveRequest {
                    name: SEMAPHORE.to_owned(),
                    token,
                    ttl: ttl.map(ms),
                })
                .await
            {
                Ok(s) => s.into_inner(),
                Err(_) => {
                    model(&world).grants[i].streamed = false;
                    return;
                }
            };
            loop {
                let message = tokio::select! {
                    () = stop.cancelled() => {
                        model(&world).stop(i, Instant::now(), "closes its KeepAlive stream");
                        return;
                    }
                    m = stream.message() => m,
                };
                let received = Instant::now();
                let mut w = model(&world);
                match message {
                    Ok(Some(pb::SemaphoreServiceKeepAliveResponse { event: Some(event) })) => {
                        match event {
                            SemKeepAliveEvent::Renewed(r) => w.extend(i, event_end(received, &r)),
                            SemKeepAliveEvent::Lost(l) => {
                                w.lost(i, received, &l);
                            }
                        }
                    }
                    Ok(Some(_)) => w.violation("an event without payload".to_owned()),
                    Ok(None) => {
                        if !w.grants[i].over {
                            w.violation(format!(
                                "{SEMAPHORE}: a KeepAlive stream ended without `lost`"
                            ));
                            w.stop(i, received, "stream ended");
                        }
                        return;
                    }
                    Err(status) => {
                        w.stop(i, received, &format!("stream failed {:?}", status.code()));
                        return;
                    }
                }
            }
        });
        self.streams.push(cancel);
    }

    /// Freezes Redis (SIGSTOP) for a while, as a stalled machine or a long fork would.
    async fn pause_redis(&mut self) {
        let pause = Duration::from_millis(self.rng.random_range(100..800));
        model(&self.world).note(format!("redis frozen for {pause:?}"));
        self.redis.signal(Signal::SIGSTOP);
        tokio::time::sleep(pause).await;
        self.redis.signal(Signal::SIGCONT);
        model(&self.world).note("redis resumes".to_owned());
    }
}

fn world_note(shared: &Shared, line: String) {
    model(shared).note(line);
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Random call sequences across two Batons on one Redis keep every lease promise.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn random_sequences_keep_every_lease_promise() {
    let seed: u64 = env_or("BATON_MODEL_SEED", DEFAULT_SEED);
    let steps: usize = env_or("BATON_MODEL_STEPS", DEFAULT_STEPS);
    let redis = RedisServer::start_private().await;
    let prefix = support::unique_prefix();
    let first = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let second = Baton::start_with(&redis, |c| c.redis.key_prefix = prefix.clone()).await;
    let shared: Shared = Arc::new(Mutex::new(World {
        t0: Instant::now(),
        grants: Vec::new(),
        violations: Vec::new(),
        trace: Vec::new(),
    }));
    let mut driver = Driver {
        rng: Xoshiro256PlusPlus::seed_from_u64(seed),
        world: shared.clone(),
        redis,
        locks: [first.client().await, second.client().await],
        sems: [
            first.semaphore_client().await,
            second.semaphore_client().await,
        ],
        streams: Vec::new(),
        tasks: JoinSet::new(),
        anon: 0,
    };
    for step in 0..steps {
        model(&shared).note(format!("-- step {step}"));
        driver.step().await;
        model(&shared).check();
        // Reap finished tasks so that a panic in one surfaces now.
        while let Some(done) = driver.tasks.try_join_next() {
            done.expect("a client task panicked");
        }
    }
    // Let everything in flight settle: waits end, streams are closed, leases run out.
    for cancel in driver.streams.drain(..) {
        cancel.cancel();
    }
    support::within(
        Duration::from_secs(30),
        async {
            while let Some(done) = driver.tasks.join_next().await {
                done.expect("a client task panicked");
            }
        },
        "the clients to finish",
    )
    .await;
    let mut w = model(&shared);
    w.check();
    let grants = w.grants.len();
    if !w.violations.is_empty() {
        let path = std::env::temp_dir().join(format!("baton-model-seed-{seed}.txt"));
        let written = std::fs::write(&path, w.trace.join("\n")).map_or_else(
            |e| format!("(not written: {e})"),
            |()| path.display().to_string(),
        );
        let start = w.trace.len().saturating_sub(200);
        panic!(
            "seed {seed}, {steps} steps: {} violation(s):\n{}\n\nwhole trace: {written}; its last \
             200 lines:\n{}",
            w.violations.len(),
            w.violations.join("\n"),
            w.trace[start..].join("\n")
        );
    }
    assert!(
        grants >= steps / 20,
        "seed {seed}: only {grants} grants in {steps} steps: the test exercised too little"
    );
    println!("seed {seed}: {steps} steps, {grants} grants, no violation");
}
