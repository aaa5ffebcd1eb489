//! One shared pub/sub subscriber per Baton, fanned out to local waiters.
//!
//! A waiter subscribes to a channel (reference counted: the first local waiter has the channel
//! subscribed, the last one leaving has it unsubscribed), marks what it has seen with
//! [`Subscription::arm`], checks the state in Redis, and if it must wait, awaits
//! [`Subscription::notified`]. A message published between the check and the wait is not lost:
//! it bumps a generation counter that the waiter compares against what it armed.
//!
//! A message whose payload is `@` followed by a waiter id wakes only the subscription registered
//! under that id (a fair queue hands the resource to its head, and only the head needs to wake);
//! any other payload wakes every local subscription of the channel, except relay subscriptions
//! ([`Wake::Relay`]), of which it wakes one of each class, in turn: when one waiter can take what
//! was released (an exclusive lock), waking them all would only have the others try and wait
//! again. A relay waiter that leaves with a wake it has not acted on passes it to the next of its
//! class.
//!
//! Three parts:
//! - `registry`: which waiters listen on which channel and which of them a message wakes (the
//!   wake policies and the relay). Pure bookkeeping, unit-tested without Redis.
//! - `subscriber`: the task that owns the connection. Waiters queue their subscriptions to it
//!   and never wait behind one another: it sends them in batches (many channels per `SUBSCRIBE`,
//!   several commands in flight), answers each waiter when Redis confirms its channel, and after
//!   a reconnect subscribes every channel with waiters again in the same batches. A subscription
//!   to a channel already confirmed does not reach it at all. A `SUBSCRIBE` whose answer came too
//!   late for its waiters is still carried out by Redis, so the task unsubscribes every channel it
//!   sent one for once the channel has no waiters, confirmed or not.
//! - `connection`: the connections and their commands. On a single Redis (standalone, or the
//!   master Sentinel names) one plain pub/sub connection (`SUBSCRIBE`); on a Cluster one RESP3
//!   connection per master with sharded pub/sub (`SSUBSCRIBE`), opened when a channel of that
//!   master's slots is first subscribed, each channel subscribed on the master owning its slot in
//!   Baton's slot map: scripts publish with `SPUBLISH` there (see [`super::Redis::script`]). A
//!   master that cannot be reached fails the subscriptions of its own channels only.
//!
//! When the connection drops, every waiter is woken (messages may have been missed while it was
//! down), and the subscriber reconnects and subscribes every channel that still has waiters
//! again; a woken waiter makes sure its channel is subscribed ([`Subscription::ensure`]) before
//! it checks the state and waits again. On a Cluster, a channel whose slot moved to another node
//! is reported by the server (`sunsubscribe`), and a dropped master connection by redis-rs; then
//! the waiters concerned are woken and the channels subscribed again on the slot's current owner
//! (through a new connection when the old one dropped).

mod connection;
mod registry;
mod subscriber;

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

pub use self::registry::{ADDRESSED, Wake};
use self::{
    registry::{Registry, Waiter},
    subscriber::Request,
};
use super::{cluster::Cluster, topology::Endpoint};
use crate::error::Error;

/// Where the subscriber connects.
#[derive(Clone)]
pub enum Source {
    /// One Redis server (standalone, or the Sentinels' current master): `SUBSCRIBE`.
    Node(Endpoint),
    /// A Redis Cluster: `SSUBSCRIBE` on the master owning each channel's slot.
    Cluster(Cluster),
}

/// The shared subscriber. Cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    shared: Arc<Shared>,
}

/// What the waiters and the subscriber task share.
struct Shared {
    registry: Mutex<Registry>,
    /// To the subscriber task.
    requests: mpsc::UnboundedSender<Request>,
    /// The command timeout: how long a subscription may take to be confirmed.
    timeout: Duration,
}

impl Shared {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        // Never held across an await. A panic while holding it leaves only counters behind,
        // never a broken invariant worth refusing service over.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A local waiter's interest in one channel. Dropping it gives the interest up.
pub struct Subscription {
    shared: Arc<Shared>,
    channel: String,
    waiter: Waiter,
}

impl Notifier {
    /// Starts the subscriber task, which runs until `shutdown` is cancelled.
    pub fn start(source: Source, timeout: Duration, shutdown: CancellationToken) -> Self {
        let (requests, queued) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            registry: Mutex::new(Registry::default()),
            requests,
            timeout,
        });
        tokio::spawn(subscriber::run(shared.clone(), source, queued, shutdown));
        let counted = Arc::downgrade(&shared);
        crate::metrics::watch_subscriptions(move || {
            Some(counted.upgrade()?.registry().subscribed_count())
        });
        Self { shared }
    }

    /// Registers interest in `channel` and makes sure Redis has confirmed the subscription before
    /// returning, so that a message published afterwards reaches the returned subscription. It is
    /// woken by every message on the channel that is not addressed to one waiter.
    pub async fn subscribe(&self, channel: &str) -> Result<Subscription, Error> {
        self.subscribe_as(channel, Wake::Every).await
    }

    /// Like [`subscribe`](Self::subscribe), for the messages `wake` names.
    pub async fn subscribe_as(&self, channel: &str, wake: Wake<'_>) -> Result<Subscription, Error> {
        let waiter = self.shared.registry().join(channel, wake);
        let subscription = Subscription {
            shared: self.shared.clone(),
            channel: channel.to_owned(),
            waiter,
        };
        subscription.ensure().await?;
        Ok(subscription)
    }
}

impl Subscription {
    /// Marks every notification so far as seen. Call before checking the state in Redis, and
    /// [`settle`](Self::settle) once the check has answered.
    pub fn arm(&mut self) {
        self.waiter.arm();
    }

    /// The check armed for has answered: a relay wake it consumed was acted on (whoever was
    /// woken went ahead, or found someone else had), so dropping this subscription no longer
    /// passes it on.
    pub fn settle(&mut self) {
        self.waiter.settle();
    }

    /// What woke this relay subscription is not used up (a semaphore has permits left after its
    /// grant): dropping it wakes the next relay waiter. No effect on other subscriptions.
    pub fn pass_on(&mut self) {
        self.waiter.pass_on();
    }

    /// Waits for a notification newer than the last [`arm`](Self::arm). A relay wake this waiter
    /// takes is its to act on: leaving before the next attempt has answered passes it on (see
    /// [`settle`](Self::settle)).
    pub async fn notified(&mut self) {
        self.waiter.notified().await;
    }

    /// Makes sure Redis has confirmed this channel's subscription on the live connection,
    /// subscribing again after a reconnect. While the connection is being re-established it waits
    /// for it, up to the command timeout. A channel already confirmed costs a map lookup.
    pub async fn ensure(&self) -> Result<(), Error> {
        if self.shared.registry().subscribed(&self.channel) == Some(true) {
            return Ok(());
        }
        let (reply, confirmed) = oneshot::channel();
        let stopped = || Error::Unavailable("the pub/sub subscriber has stopped".into());
        self.shared
            .requests
            .send(Request::Subscribe {
                channel: self.channel.clone(),
                reply,
            })
            .map_err(|_| stopped())?;
        match tokio::time::timeout(self.shared.timeout, confirmed).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(stopped()),
            Err(_) => Err(Error::Unavailable(
                "the pub/sub subscription was not confirmed in time".into(),
            )),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let last = self.shared.registry().leave(&self.channel, &self.waiter);
        if last {
            // If the subscriber has stopped, so has its connection and every subscription on it.
            let channel = std::mem::take(&mut self.channel);
            let _ = self.shared.requests.send(Request::Unsubscribe(channel));
        }
    }
}
