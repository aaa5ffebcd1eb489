//! Leader election: candidates campaign for an election, one at a time is its leader, in the
//! order they joined, and everyone can read or follow who leads.
//!
//! # Semantics
//!
//! - **A leadership is a lease.** An election is a fair (FIFO) exclusive lease on the shared
//!   [`lease::Engine`]: a candidate is a fair waiter, its election a grant, its leadership kept
//!   alive by its `Campaign` stream and ended at once when the stream closes (resign), by expiry
//!   when its Baton dies, or reported lost before expiry when renewals cannot be confirmed.
//! - **Terms.** Each election grant issues a term: at least one more than the last term issued
//!   and at least the Redis clock in microseconds, so terms strictly increase per election and are
//!   never reused, like lock fencing tokens. The last one is kept in a key of its own that
//!   outlives every lease by [`FENCE_RETENTION`](crate::lease::FENCE_RETENTION).
//! - **Values.** The candidate's value is written by the script that elects it; the leader
//!   changes it with [`Election::proclaim`], checked against its token in the same script. Each
//!   change within a term bumps the term's value revision.
//! - **Observers** ([`observe`]) are woken by a message on the election's `changed` channel after
//!   every change, and by the leader's expiry; they read the whole state and send it when it is
//!   newer than what they sent last, coalescing what a slow reader has not read.
//!
//! # Redis layout
//!
//! Every key of the election `NAME` shares the hash tag `{election:NAME}`, so one script only
//! ever touches one Redis Cluster slot:
//!
//! | key | type | holds | lifetime |
//! |---|---|---|---|
//! | `PREFIX{election:NAME}` | hash | the leader: token, term, value, revision, expiry, ttl | the leader's lease |
//! | `PREFIX{election:NAME}:term` | string | last term issued | ttl + [`FENCE_RETENTION`](crate::lease::FENCE_RETENTION) after each grant and renewal |
//! | `PREFIX{election:NAME}:candidates` | sorted set | candidate id → registration expiry (ms): [`QUEUE_LEASE`](crate::lease::QUEUE_LEASE), renewed | until the last registration ends |
//! | `PREFIX{election:NAME}:queue` | sorted set | candidate id → arrival number | same |
//! | `PREFIX{election:NAME}:turn` | pub/sub channel | `@ID` for the candidate whose turn it is | — |
//! | `PREFIX{election:NAME}:changed` | pub/sub channel | the term, after every change observers must see | — |
//!
//! The acquisition algorithm (waiting, clean-ups, keepalive) is the shared [`lease::Engine`];
//! this module is the election's key layout and scripts ([`scripts`]), its request, grant and
//! refusal, `Proclaim`, `Leader` and `Observe`. The gRPC handler is in [`service`]; this module
//! knows nothing of tonic.

pub mod observe;
pub mod scripts;
pub mod service;

use std::time::Duration;

use redis::{Script, Value};
use tokio::time::Instant;

use crate::{
    error::Error,
    lease::{
        self, CleanUp, Engine, Primitive, Refusal,
        batch::Renewal,
        engine::{Acquired, Renewing},
    },
    redis::{
        Ack, Notifier, Redis, Wake,
        reply::{each_on_its_own, int, ms, string, unexpected},
    },
};
use scripts::ElectionKeys;

/// Elections stored in Redis, campaigned for, resigned and kept alive by the shared lease engine.
pub type Elections = Engine<Election>;

/// Longest value a candidate or leader may publish, in bytes.
pub const MAX_VALUE_BYTES: usize = 4096;

/// How long a candidate waits to be elected: for as long as its stream is open (a year stands
/// for that; the stream's client ends it sooner).
pub const CAMPAIGN_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A candidate's campaign, already validated.
#[derive(Debug, Clone)]
pub struct CampaignRequest {
    /// The election's name.
    pub name: String,
    /// The leadership's ttl.
    pub ttl: Duration,
    /// The value written with the election.
    pub value: Vec<u8>,
    /// How long to wait for the candidate's turn.
    pub wait: Duration,
}

impl lease::Request for CampaignRequest {
    fn name(&self) -> &str {
        &self.name
    }

    fn ttl(&self) -> Duration {
        self.ttl
    }

    fn wait(&self) -> Duration {
        self.wait
    }

    /// Every candidate holds a place in the queue.
    fn renews_registration(&self) -> bool {
        true
    }

    /// Only the candidate whose turn it is is woken, by a message addressed to it.
    fn wake<'w>(&self, waiter: &'w str) -> Wake<'w> {
        Wake::EveryAnd(waiter)
    }
}

/// A granted leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leadership {
    /// The election's name.
    pub name: String,
    /// The opaque token proving this leadership.
    pub token: String,
    /// The leader's term.
    pub term: u64,
    /// Time left on the leadership when Redis answered.
    pub remaining: Duration,
    /// When the successful script call was sent: the leadership lasts at least until
    /// `sent_at + remaining` by this process's monotonic clock.
    pub sent_at: Instant,
}

impl lease::Grant for Leadership {
    fn name(&self) -> &str {
        &self.name
    }

    fn token(&self) -> &str {
        &self.token
    }

    /// Candidates are not named; their value is not a name either.
    fn owner(&self) -> &str {
        ""
    }

    fn valid_until(&self) -> Instant {
        self.sent_at + self.remaining
    }
}

/// An election's leader, as others see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's term.
    pub term: u64,
    /// Its value.
    pub value: Vec<u8>,
    /// How many times it changed its value in this term.
    pub revision: u64,
    /// Time left on its lease when Redis answered.
    pub remaining: Duration,
}

/// A snapshot of one election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// The leader; `None` when nobody leads.
    pub leader: Option<Leader>,
    /// The last term issued (kept an hour past the last lease; 0 when none is known).
    pub last_term: u64,
    /// Candidates waiting for their turn, across every Baton.
    pub candidates: u32,
}

/// What a proclamation changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proclaimed {
    /// The leader's term.
    pub term: u64,
    /// The value's revision after the call.
    pub revision: u64,
}

/// The election primitive: its scripts, on one Redis, and the subscriber observers listen with.
pub struct Election {
    redis: Redis,
    notifier: Notifier,
    campaign: Script,
    resign: Script,
    abandon: Script,
    proclaim: Script,
    renew: Script,
    leader: Script,
}

impl Election {
    /// The election scripts, loaded for `redis`; observers are woken through `notifier`.
    pub fn new(redis: Redis, notifier: Notifier) -> Self {
        Self {
            campaign: redis.script(scripts::CAMPAIGN),
            resign: redis.script(scripts::RESIGN),
            abandon: redis.script(scripts::ABANDON),
            proclaim: redis.script(scripts::PROCLAIM),
            renew: redis.script(scripts::RENEW),
            leader: Script::new(scripts::LEADER),
            redis,
            notifier,
        }
    }

    /// The keys of election `name`.
    pub fn keys(&self, name: &str) -> ElectionKeys {
        ElectionKeys::new(self.redis.key_prefix(), name)
    }

    /// The subscriber observers are woken through.
    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    /// Changes the value of the leadership `token` of `name`; `FailedPrecondition` when that
    /// token does not lead.
    pub async fn proclaim(
        &self,
        name: &str,
        token: &str,
        value: &[u8],
    ) -> Result<Proclaimed, Error> {
        let keys = self.keys(name);
        let invocation = scripts::Proclaim { token, value }.invocation(&self.proclaim, &keys);
        let reply: Vec<Value> = self.redis.eval(&invocation).await?;
        match reply.as_slice() {
            [led, term, revision] if int(led)? == 1 => Ok(Proclaimed {
                term: number(term)?,
                revision: number(revision)?,
            }),
            [_] => Err(Error::FailedPrecondition(
                "this token does not lead the election: its leadership ended (resigned, lost or \
                 expired) or it never led"
                    .into(),
            )),
            _ => Err(unexpected("proclaim reply")),
        }
    }

    /// Reads the election's state.
    pub async fn state(&self, name: &str) -> Result<State, Error> {
        let keys = self.keys(name);
        let reply: Vec<Value> = self
            .redis
            .eval(&scripts::leader(&self.leader, &keys))
            .await?;
        let [led, term, value, revision, remaining, last, candidates] = reply.as_slice() else {
            return Err(unexpected("leader reply"));
        };
        let leader = if int(led)? == 1 {
            Some(Leader {
                term: number(term)?,
                value: redis::from_redis_value_ref(value)
                    .map_err(|_| unexpected("leader value"))?,
                revision: number(revision)?,
                remaining: ms(int(remaining)?).unwrap_or_default(),
            })
        } else {
            None
        };
        Ok(State {
            leader,
            last_term: number(last)?,
            candidates: u32::try_from(int(candidates)?.max(0)).unwrap_or(u32::MAX),
        })
    }
}

impl Primitive for Election {
    type Request = CampaignRequest;
    type Grant = Leadership;
    type Busy = Refusal;
    type Released = bool;
    const KIND: &'static str = "election";

    fn redis(&self) -> &Redis {
        &self.redis
    }

    fn channel(&self, name: &str) -> String {
        self.keys(name).turn
    }

    fn slot_key(&self, name: &str) -> String {
        self.keys(name).leader
    }

    async fn try_acquire(
        &self,
        request: &CampaignRequest,
        token: &str,
        waiting: Option<(&str, Duration)>,
    ) -> Result<(Acquired<Leadership, Refusal>, Ack), Error> {
        let keys = self.keys(&request.name);
        let (candidate, wait_left) = waiting.unwrap_or(("", Duration::ZERO));
        let invocation = scripts::Campaign {
            token,
            ttl: request.ttl,
            candidate,
            wait_left,
            value: &request.value,
        }
        .invocation(&self.campaign, &keys);
        let sent_at = Instant::now();
        let elected = |reply: &Vec<Value>| reply.first().is_some_and(|g| int(g).ok() == Some(1));
        let (reply, ack): (Vec<Value>, Ack) = self
            .redis
            .eval_acked(&invocation, &keys.leader, elected)
            .await?;
        let outcome = match reply.as_slice() {
            [elected, token, term, remaining] if int(elected)? == 1 => {
                Acquired::Granted(Leadership {
                    name: request.name.clone(),
                    token: string(token)?,
                    term: number(term)?,
                    remaining: ms(int(remaining)?).unwrap_or(request.ttl),
                    sent_at,
                })
            }
            [_, remaining, change] => Acquired::Refused(Refusal {
                remaining: ms(int(remaining)?),
                change_in: ms(int(change)?),
            }),
            _ => return Err(unexpected("campaign reply")),
        };
        Ok((outcome, ack))
    }

    async fn release(
        &self,
        name: &str,
        token: &str,
        clean_up: Option<CleanUp>,
    ) -> Result<bool, Error> {
        // No retry of a campaign claims a leadership (streams have no idempotency key): a clean-up
        // at most voids the token.
        let keys = self.keys(name);
        let led: i64 = self
            .redis
            .eval(&scripts::resign(
                &self.resign,
                &keys,
                token,
                clean_up.and_then(|c| c.void),
            ))
            .await?;
        Ok(led == 1)
    }

    fn was_held(released: &bool) -> bool {
        *released
    }

    async fn abandon(
        &self,
        name: &str,
        candidate: &str,
        void: Option<Duration>,
    ) -> Result<(), Error> {
        let keys = self.keys(name);
        let invocation = scripts::abandon(&self.abandon, &keys, candidate, void);
        self.redis.eval::<i64>(&invocation).await.map(drop)
    }

    /// One renewal through the batched script. A campaign's own ttl is at least
    /// [`MIN_KEEPALIVE_TTL`](crate::lease::MIN_KEEPALIVE_TTL), the largest `min` asked for, so
    /// only a given `ttl` needs the check.
    async fn refresh(
        &self,
        name: &str,
        token: &str,
        ttl: Option<Duration>,
        min: Duration,
    ) -> Result<Option<Duration>, Error> {
        if ttl.is_some_and(|t| t < min) {
            return Err(Error::invalid(
                "ttl",
                format!("is below {}", humantime::format_duration(min)),
            ));
        }
        let lease = (name.to_owned(), token.to_owned(), ttl);
        self.refresh_many(std::slice::from_ref(&lease))
            .await?
            .pop()
            .unwrap_or_else(|| Err(unexpected("renewal reply")))
    }

    /// Renews many leaderships in one script call (all in one hash slot on a Cluster), each on
    /// its own. The engine's batcher keeps a batch within [`lease::batch::MAX_BATCH`] leases.
    async fn refresh_many(&self, leases: &[Renewing]) -> Result<Vec<Renewal>, Error> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = scripts::renewal(&self.renew);
        for (name, token, ttl) in leases {
            scripts::add_to_renewal(&mut invocation, &self.keys(name), token, *ttl);
        }
        let reply = self.redis.eval(&invocation).await?;
        Ok(each_on_its_own(reply, leases.len())?
            .into_iter()
            .map(|left| left.map(|left| ms(left).filter(|left| !left.is_zero())))
            .collect())
    }
}

/// A term or revision: a non-negative integer (terms come back as strings).
fn number(v: &Value) -> Result<u64, Error> {
    u64::try_from(int(v)?).map_err(|_| unexpected("negative term or revision"))
}
