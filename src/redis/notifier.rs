//! One shared pub/sub connection per Baton, fanned out to local waiters.
//!
//! A waiter subscribes to a channel (reference counted: the first local waiter sends `SUBSCRIBE`,
//! the last one leaving sends `UNSUBSCRIBE`), marks what it has seen with [`Subscription::arm`],
//! checks the state in Redis, and if it must wait, awaits [`Subscription::notified`]. A message
//! published between the check and the wait is not lost: it bumps a generation counter that the
//! waiter compares against what it armed.
//!
//! A message whose payload is `@` followed by a waiter id wakes only the subscription registered
//! under that id (a fair queue hands the resource to its head, and only the head needs to wake);
//! any other payload wakes every local subscription of the channel, except relay subscriptions
//! ([`Wake::Relay`]), of which it wakes one, in turn: when one waiter can take what was released
//! (an exclusive lock), waking them all would only have the others try and wait again. A relay
//! waiter that leaves with a wake it has not acted on passes it to the next.
//!
//! On a single Redis (standalone, or the master Sentinel names) this is one plain pub/sub
//! connection (`SUBSCRIBE`); on a Cluster it is one RESP3 connection per master with sharded
//! pub/sub (`SSUBSCRIBE`), opened when a channel of that master's slots is first subscribed, each
//! channel subscribed on the master owning its slot in Baton's slot map: scripts publish with
//! `SPUBLISH` there (see [`super::Redis::script`]). A master that cannot be reached fails the
//! subscriptions of its own channels only, and is not tried again for [`NODE_RETRY_AFTER`].
//!
//! When the connection drops, every waiter is woken (messages may have been missed while it was
//! down) and the connection task reconnects with a capped backoff, subscribing again to every
//! channel that still has waiters. On a Cluster, a channel whose slot moved to another node is
//! reported by the server (`sunsubscribe`), and a dropped master connection by redis-rs; then the
//! waiters are woken, check the state again, and subscribe again (on the slot's current owner,
//! through a new connection when the old one dropped).

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use bb8_redis::redis::{
    self, AsyncConnectionConfig, Client, PushInfo, PushKind, Value,
    aio::{MultiplexedConnection, PubSubSink, PubSubStream},
};
use futures::StreamExt;
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use super::{cluster::Cluster, slot, topology::Endpoint};
use crate::error::{Error, describe};

/// Shortest wait before reconnecting the pub/sub connection.
const RECONNECT_MIN: Duration = Duration::from_millis(20);
/// Longest wait before reconnecting the pub/sub connection.
const RECONNECT_MAX: Duration = Duration::from_secs(1);
/// How long a Cluster master that refused the subscriber's connection is not tried again: its
/// channels' subscriptions fail at once meanwhile, instead of holding up the others' with one
/// connection attempt each.
const NODE_RETRY_AFTER: Duration = Duration::from_millis(250);
/// Marks a message addressed to one waiter: `@` followed by its id.
pub const ADDRESSED: char = '@';

/// Which messages of a channel wake a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake<'a> {
    /// Every message not addressed to one waiter.
    Every,
    /// Every message not addressed to one waiter, and the messages addressed to this waiter id
    /// (payload `@waiter`). Waiter ids must be unique per channel.
    EveryAnd(&'a str),
    /// One message not addressed to one waiter in turn with the channel's other relay
    /// subscriptions: for waiters of which only one can go ahead per message. A relay
    /// subscription dropped before it acted on its wake (see [`Subscription::settle`]) passes it
    /// on.
    Relay,
}

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
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    timeout: Duration,
    channels: Mutex<HashMap<String, Channel>>,
    /// The live connection's command half; `None` while disconnected. Held across each
    /// subscribe and unsubscribe so that the decision and the command cannot interleave.
    sink: tokio::sync::Mutex<Option<Sink>>,
    /// Whether `sink` holds a live connection, for subscribers waiting out a reconnect.
    connected: watch::Sender<bool>,
    /// Cuts the reconnect backoff short: a subscriber is waiting for the connection.
    kick: tokio::sync::Notify,
}

struct Channel {
    /// Bumped by every message not addressed to one waiter.
    generation: watch::Sender<u64>,
    /// Per-waiter generations, bumped by messages addressed to that waiter.
    addressed: HashMap<String, watch::Sender<u64>>,
    /// Relay subscriptions (by id) in the order they are woken: the front one next.
    relay: VecDeque<(u64, watch::Sender<u64>)>,
    /// The id of the next relay subscription.
    next_relay: u64,
    refs: usize,
    subscribed: bool,
}

impl Channel {
    /// Wakes every subscription: messages may have been missed.
    fn wake_all(&self) {
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
        for (_, tx) in &self.relay {
            tx.send_modify(|g| *g = g.wrapping_add(1));
        }
    }

    /// A message not addressed to one waiter: wakes every subscription but the relay ones, and
    /// the next relay subscription.
    fn broadcast(&mut self) {
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
        self.relay_one();
    }

    /// Wakes the front relay subscription and moves it to the back.
    fn relay_one(&mut self) {
        if let Some((id, tx)) = self.relay.pop_front() {
            tx.send_modify(|g| *g = g.wrapping_add(1));
            self.relay.push_back((id, tx));
        }
    }
}

/// A local waiter's interest in one channel. Dropping it gives the interest up.
pub struct Subscription {
    inner: Arc<Inner>,
    channel: String,
    waiter: Option<String>,
    /// Broadcast messages; `None` for a relay subscription.
    rx: Option<watch::Receiver<u64>>,
    addressed: Option<watch::Receiver<u64>>,
    /// A relay subscription's id and wakes.
    relay: Option<(u64, watch::Receiver<u64>)>,
    /// A relay subscription armed with a wake it has not settled yet.
    owes: bool,
}

/// The command half of the pub/sub connection.
enum Sink {
    Node(PubSubSink),
    Cluster(ClusterSink),
}

impl Sink {
    async fn subscribe(&mut self, channels: &[String]) -> Result<(), Error> {
        match self {
            Self::Node(sink) => Ok(sink.subscribe(channels).await?),
            // Channels of different slots may live on different nodes: one command each.
            Self::Cluster(sink) => {
                for channel in channels {
                    sink.subscribe(channel).await?;
                }
                Ok(())
            }
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> Result<(), Error> {
        match self {
            Self::Node(sink) => Ok(sink.unsubscribe(channel).await?),
            Self::Cluster(sink) => sink.unsubscribe(channel).await,
        }
    }

    /// Whether the channels that have waiters are subscribed again by the connection task when
    /// it connects (one command on a single node), or each by its waiters when woken (a Cluster,
    /// where a channel whose master is down must not hold up the others).
    fn resubscribes_on_connect(&self) -> bool {
        matches!(self, Self::Node(_))
    }
}

/// One subscriber connection to a Cluster master.
struct NodeConn {
    conn: MultiplexedConnection,
    /// Set when redis-rs reports the connection dropped.
    closed: Arc<std::sync::atomic::AtomicBool>,
}

/// The command half of a Cluster's subscriber: a RESP3 connection per master, all sending their
/// pushes to one channel (the message half).
///
/// RESP3 answers `SSUBSCRIBE` and `SUNSUBSCRIBE` with a push that redis-rs takes as the reply of
/// the oldest command in flight, so commands go one at a time (the notifier holds its sink lock
/// across each) with one channel each, and a reply that is not the confirmation of the command
/// sent (a `sunsubscribe` the server sent on its own as a slot moved) drops the connection.
struct ClusterSink {
    cluster: Cluster,
    timeout: Duration,
    pushes: mpsc::UnboundedSender<PushInfo>,
    conns: HashMap<Arc<str>, NodeConn>,
    /// Masters whose connection failed, until when they are not tried, and why.
    refused: HashMap<Arc<str>, (Instant, Error)>,
}

impl ClusterSink {
    /// Gives up the connection to `addr`, whose next replies cannot be trusted: the
    /// subscriptions made on it go with it, so every waiter is told to look again and subscribe
    /// afresh, as when a connection drops.
    fn discard(&mut self, addr: &str) {
        if self.conns.remove(addr).is_some() {
            let _ = self.pushes.send(PushInfo {
                kind: PushKind::Disconnection,
                data: Vec::new(),
            });
        }
    }

    /// The live subscriber connection to `node`, opened if need be.
    async fn conn(&mut self, node: &super::cluster::Node) -> Result<MultiplexedConnection, Error> {
        let addr: Arc<str> = Arc::from(node.addr());
        if let Some(c) = self.conns.get(&addr) {
            if !c.closed.load(std::sync::atomic::Ordering::Relaxed) {
                return Ok(c.conn.clone());
            }
            self.conns.remove(&addr);
        }
        if let Some((until, why)) = self.refused.get(&addr) {
            if Instant::now() < *until {
                return Err(why.clone());
            }
            self.refused.remove(&addr);
        }
        let info = node.connection_info().clone();
        let redis = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let info = info.set_redis_settings(redis);
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, pushes) = (closed.clone(), self.pushes.clone());
        let forward = move |push: PushInfo| {
            if push.kind == PushKind::Disconnection {
                flag.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            pushes.send(push)
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_push_sender(forward);
        let opened = async {
            let client = Client::open(info).map_err(|e| describe(&e))?;
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(|e| describe(&e))
        };
        match tokio::time::timeout(self.timeout, opened).await {
            Ok(Ok(conn)) => {
                self.conns.insert(
                    addr,
                    NodeConn {
                        conn: conn.clone(),
                        closed,
                    },
                );
                Ok(conn)
            }
            failed => {
                let cause = match failed {
                    Ok(Err(e)) => e,
                    _ => "timed out".to_owned(),
                };
                let why = Error::Unavailable(format!(
                    "the pub/sub connection to cluster node {addr} failed: {cause}"
                ));
                self.refused
                    .insert(addr, (Instant::now() + NODE_RETRY_AFTER, why.clone()));
                self.cluster.request_refresh();
                Err(why)
            }
        }
    }

    /// `SSUBSCRIBE channel` on the master owning its slot, following one `MOVED`.
    async fn subscribe(&mut self, channel: &str) -> Result<(), Error> {
        let deadline = Instant::now() + self.timeout;
        let mut node = self.cluster.owner(slot(channel), deadline).await?;
        for attempt in 0..2 {
            let mut conn = self.conn(&node).await?;
            let reply = tokio::time::timeout_at(
                deadline,
                redis::cmd("SSUBSCRIBE")
                    .arg(channel)
                    .query_async::<Value>(&mut conn),
            )
            .await;
            match reply {
                Ok(Ok(reply)) if confirms(&reply, PushKind::SSubscribe, channel) => return Ok(()),
                Ok(Err(e)) if attempt == 0 && e.redirect_node().is_some() => {
                    self.cluster.request_refresh();
                    let (addr, _) = e.redirect_node().unwrap_or_default();
                    node = self.cluster.node(addr)?;
                }
                other => {
                    // Not the confirmation: whatever the connection answers next is suspect.
                    self.discard(node.addr());
                    let cause = match other {
                        Ok(Ok(reply)) => format!("unexpected reply {reply:?}"),
                        Ok(Err(e)) => describe(&e),
                        Err(_) => "no answer in time".to_owned(),
                    };
                    if attempt == 0 && !cause.starts_with("MOVED") {
                        continue;
                    }
                    return Err(Error::Unavailable(format!(
                        "SSUBSCRIBE on cluster node {}: {cause}",
                        node.addr()
                    )));
                }
            }
        }
        Err(Error::Unavailable(format!(
            "SSUBSCRIBE {channel:?} was not confirmed"
        )))
    }

    /// `SUNSUBSCRIBE channel` on the master owning its slot, if a connection to it is open (a
    /// dropped one took its subscriptions with it).
    async fn unsubscribe(&mut self, channel: &str) -> Result<(), Error> {
        let deadline = Instant::now() + self.timeout;
        let node = self.cluster.owner(slot(channel), deadline).await?;
        let Some(c) = self.conns.get(node.addr()) else {
            return Ok(());
        };
        let mut conn = c.conn.clone();
        let reply = tokio::time::timeout_at(
            deadline,
            redis::cmd("SUNSUBSCRIBE")
                .arg(channel)
                .query_async::<Value>(&mut conn),
        )
        .await;
        match reply {
            Ok(Ok(reply)) if confirms(&reply, PushKind::SUnsubscribe, channel) => Ok(()),
            _ => {
                self.discard(node.addr());
                Err(Error::Unavailable(format!(
                    "SUNSUBSCRIBE on cluster node {} was not confirmed",
                    node.addr()
                )))
            }
        }
    }
}

/// Whether `reply` is the `kind` confirmation (a RESP3 push) of `channel`.
fn confirms(reply: &Value, kind: PushKind, channel: &str) -> bool {
    match reply {
        Value::Push { kind: k, data } => {
            *k == kind
                && matches!(data.first(), Some(Value::BulkString(c)) if c.as_slice() == channel.as_bytes())
        }
        _ => false,
    }
}

/// What the message half of the connection reports.
enum Event {
    /// A message on `channel`.
    Message { channel: String, payload: Vec<u8> },
    /// The server dropped the subscription of `channel` (its slot moved to another node).
    Dropped { channel: String },
    /// Messages may have been missed and subscriptions lost (a master connection dropped or
    /// was given up); the next subscription to that master opens a new one.
    Gap,
}

/// The message half of the pub/sub connection.
enum Messages {
    Node(PubSubStream),
    Cluster(mpsc::UnboundedReceiver<PushInfo>),
}

impl Messages {
    /// The next event; `None` when the connection is gone.
    async fn next(&mut self) -> Option<Event> {
        match self {
            Self::Node(stream) => {
                let msg = stream.next().await?;
                Some(Event::Message {
                    channel: msg.get_channel_name().to_owned(),
                    payload: msg.get_payload_bytes().to_vec(),
                })
            }
            Self::Cluster(rx) => loop {
                let push = rx.recv().await?;
                let text = |v: Option<&Value>| match v {
                    Some(Value::BulkString(b)) => Some(b.clone()),
                    Some(Value::SimpleString(s)) => Some(s.clone().into_bytes()),
                    _ => None,
                };
                match push.kind {
                    PushKind::SMessage | PushKind::Message => {
                        let (Some(channel), Some(payload)) =
                            (text(push.data.first()), text(push.data.get(1)))
                        else {
                            continue;
                        };
                        return Some(Event::Message {
                            channel: String::from_utf8_lossy(&channel).into_owned(),
                            payload,
                        });
                    }
                    PushKind::SUnsubscribe => {
                        let Some(channel) = text(push.data.first()) else {
                            continue;
                        };
                        return Some(Event::Dropped {
                            channel: String::from_utf8_lossy(&channel).into_owned(),
                        });
                    }
                    PushKind::Disconnection => return Some(Event::Gap),
                    _ => continue,
                }
            },
        }
    }
}

impl Notifier {
    /// Starts the connection task, which runs until `shutdown` is cancelled.
    pub fn start(source: Source, timeout: Duration, shutdown: CancellationToken) -> Self {
        let inner = Arc::new(Inner {
            source,
            timeout,
            channels: Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            connected: watch::Sender::new(false),
            kick: tokio::sync::Notify::new(),
        });
        tokio::spawn(run(inner.clone(), shutdown));
        let counted = Arc::downgrade(&inner);
        crate::metrics::watch_subscriptions(move || {
            let inner = counted.upgrade()?;
            Some(inner.channels().values().filter(|c| c.subscribed).count())
        });
        Self { inner }
    }

    /// Registers interest in `channel` and makes sure Redis has confirmed the subscription before
    /// returning, so that a message published afterwards reaches the returned subscription. It is
    /// woken by every message on the channel that is not addressed to one waiter.
    pub async fn subscribe(&self, channel: &str) -> Result<Subscription, Error> {
        self.subscribe_as(channel, Wake::Every).await
    }

    /// Like [`subscribe`](Self::subscribe), for the messages `wake` names.
    pub async fn subscribe_as(&self, channel: &str, wake: Wake<'_>) -> Result<Subscription, Error> {
        let waiter = match wake {
            Wake::EveryAnd(waiter) => Some(waiter),
            Wake::Every | Wake::Relay => None,
        };
        let (rx, addressed, relay) = {
            let mut channels = self.inner.channels();
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    generation: watch::Sender::new(0),
                    addressed: HashMap::new(),
                    relay: VecDeque::new(),
                    next_relay: 0,
                    refs: 0,
                    subscribed: false,
                });
            entry.refs += 1;
            let addressed = waiter.map(|w| {
                entry
                    .addressed
                    .entry(w.to_owned())
                    .or_insert_with(|| watch::Sender::new(0))
                    .subscribe()
            });
            let relay = (wake == Wake::Relay).then(|| {
                let id = entry.next_relay;
                entry.next_relay += 1;
                let tx = watch::Sender::new(0);
                let rx = tx.subscribe();
                entry.relay.push_back((id, tx));
                (id, rx)
            });
            let rx = (wake != Wake::Relay).then(|| entry.generation.subscribe());
            (rx, addressed, relay)
        };
        let sub = Subscription {
            inner: self.inner.clone(),
            channel: channel.to_owned(),
            waiter: waiter.map(str::to_owned),
            rx,
            addressed,
            relay,
            owes: false,
        };
        sub.ensure().await?;
        Ok(sub)
    }

    /// Number of channels with local waiters.
    pub fn channel_count(&self) -> usize {
        self.inner.channels().len()
    }
}

impl Inner {
    fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        // A panic while holding this lock leaves only counters behind, never a broken invariant
        // worth refusing service over.
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake_all(&self) {
        for ch in self.channels().values() {
            ch.wake_all();
        }
    }

    /// Delivers one message to the local subscriptions it is meant for.
    fn deliver(&self, channel: &str, payload: &[u8]) {
        let mut channels = self.channels();
        let Some(ch) = channels.get_mut(channel) else {
            return;
        };
        match payload.strip_prefix(&[ADDRESSED as u8]) {
            Some(waiter) => {
                let waiter = String::from_utf8_lossy(waiter);
                if let Some(w) = ch.addressed.get(waiter.as_ref()) {
                    w.send_modify(|g| *g = g.wrapping_add(1));
                }
            }
            None => ch.broadcast(),
        }
    }

    /// Opens a connection: the command half, and the message half.
    async fn connect(&self) -> Result<(Sink, Messages), String> {
        match &self.source {
            Source::Node(endpoint) => {
                let client = endpoint
                    .client(self.timeout)
                    .await
                    .map_err(|e| e.to_string())?;
                let pubsub = tokio::time::timeout(self.timeout, client.get_async_pubsub())
                    .await
                    .map_err(|_| "timed out".to_owned())?
                    .map_err(|e| e.to_string())?;
                let (sink, stream) = pubsub.split();
                Ok((Sink::Node(sink), Messages::Node(stream)))
            }
            // Master connections open as channels are subscribed: nothing to wait for here.
            Source::Cluster(cluster) => {
                let (tx, rx) = mpsc::unbounded_channel();
                let sink = ClusterSink {
                    cluster: cluster.clone(),
                    timeout: self.timeout,
                    pushes: tx,
                    conns: HashMap::new(),
                    refused: HashMap::new(),
                };
                Ok((Sink::Cluster(sink), Messages::Cluster(rx)))
            }
        }
    }
}

impl Subscription {
    /// Marks every notification so far as seen. Call before checking the state in Redis, and
    /// [`settle`](Self::settle) once the check has answered.
    pub fn arm(&mut self) {
        if let Some(rx) = self.rx.as_mut() {
            rx.borrow_and_update();
        }
        if let Some(rx) = self.addressed.as_mut() {
            rx.borrow_and_update();
        }
        if let Some((_, rx)) = self.relay.as_mut() {
            self.owes |= rx.has_changed().unwrap_or(false);
            rx.borrow_and_update();
        }
    }

    /// The check armed for has answered: a relay wake it consumed was acted on (whoever was
    /// woken went ahead, or found someone else had), so dropping this subscription no longer
    /// passes it on.
    pub fn settle(&mut self) {
        self.owes = false;
    }

    /// What woke this relay subscription is not used up (a semaphore has permits left after its
    /// grant): dropping it wakes the next relay waiter. No effect on other subscriptions.
    pub fn pass_on(&mut self) {
        self.owes = self.relay.is_some();
    }

    /// Waits for a notification newer than the last [`arm`](Self::arm).
    pub async fn notified(&mut self) {
        // The senders live in the channel map for as long as this subscription exists, so
        // `changed` only fails if the map entry was torn down, which cannot happen before drop.
        let broadcast = async {
            let delivered = match self.rx.as_mut() {
                Some(rx) => rx.changed().await.is_ok(),
                None => false,
            };
            if !delivered {
                std::future::pending::<()>().await;
            }
        };
        let relay = async {
            let delivered = match self.relay.as_mut() {
                Some((_, rx)) => rx.changed().await.is_ok(),
                None => false,
            };
            if !delivered {
                std::future::pending::<()>().await;
            }
        };
        let addressed = async {
            let delivered = match self.addressed.as_mut() {
                Some(rx) => rx.changed().await.is_ok(),
                None => false,
            };
            if !delivered {
                std::future::pending::<()>().await;
            }
        };
        let relayed = tokio::select! {
            () = broadcast => false,
            () = addressed => false,
            () = relay => true,
        };
        // A relay wake this waiter consumed is its to act on: leaving before the next attempt has
        // answered passes it on (see `settle`).
        self.owes |= relayed;
    }

    /// Makes sure Redis has confirmed this channel's subscription on the live connection,
    /// subscribing again after a reconnect. While the connection is being re-established it waits
    /// for it, up to the command timeout.
    pub async fn ensure(&self) -> Result<(), Error> {
        if self.is_subscribed() {
            return Ok(());
        }
        let work = async {
            loop {
                {
                    let mut sink = self.inner.sink.lock().await;
                    if self.is_subscribed() {
                        return Ok(());
                    }
                    if let Some(sink) = sink.as_mut() {
                        sink.subscribe(std::slice::from_ref(&self.channel)).await?;
                        if let Some(ch) = self.inner.channels().get_mut(&self.channel) {
                            ch.subscribed = true;
                        }
                        return Ok(());
                    }
                }
                let mut connected = self.inner.connected.subscribe();
                // Someone is waiting: reconnect now rather than at the end of the backoff.
                self.inner.kick.notify_one();
                // The sender lives in `inner`, which this subscription keeps alive.
                let _ = connected.wait_for(|up| *up).await;
            }
        };
        match tokio::time::timeout(self.inner.timeout, work).await {
            Ok(r) => r,
            Err(_) => Err(Error::Unavailable(
                "the pub/sub subscription was not confirmed in time".into(),
            )),
        }
    }

    fn is_subscribed(&self) -> bool {
        self.inner
            .channels()
            .get(&self.channel)
            .is_some_and(|c| c.subscribed)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let was_subscribed = {
            let mut channels = self.inner.channels();
            let Some(ch) = channels.get_mut(&self.channel) else {
                return;
            };
            if let Some(waiter) = &self.waiter {
                ch.addressed.remove(waiter);
            }
            if let Some((id, rx)) = &self.relay {
                // Asked before its sender goes with the entry.
                let unseen = rx.has_changed().unwrap_or(false);
                ch.relay.retain(|(other, _)| other != id);
                // A wake this waiter got and did not act on goes to the next relay waiter.
                if self.owes || unseen {
                    ch.relay_one();
                }
            }
            ch.refs -= 1;
            if ch.refs > 0 {
                return;
            }
            let subscribed = ch.subscribed;
            channels.remove(&self.channel);
            subscribed
        };
        if !was_subscribed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.inner.clone();
        let channel = std::mem::take(&mut self.channel);
        runtime.spawn(async move {
            let mut sink = inner.sink.lock().await;
            // A new waiter may have subscribed again meanwhile; it then owns the subscription.
            if inner.channels().contains_key(&channel) {
                return;
            }
            if let Some(sink) = sink.as_mut() {
                let unsubscribe = sink.unsubscribe(&channel);
                if tokio::time::timeout(inner.timeout, unsubscribe)
                    .await
                    .is_err()
                {
                    tracing::debug!(%channel, "unsubscribe was not confirmed in time");
                }
            }
        });
    }
}

/// Keeps one pub/sub connection open, reconnecting with a capped backoff until shutdown.
async fn run(inner: Arc<Inner>, shutdown: CancellationToken) {
    let mut backoff = RECONNECT_MIN;
    loop {
        let connected = tokio::select! {
            () = shutdown.cancelled() => return,
            r = inner.connect() => r,
        };
        let (mut sink, mut messages) = match connected {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %e, "pub/sub connection failed");
                if !pause(&inner, &shutdown, &mut backoff).await {
                    return;
                }
                continue;
            }
        };

        {
            let mut live = inner.sink.lock().await;
            let wanted: Vec<String> = if sink.resubscribes_on_connect() {
                inner.channels().keys().cloned().collect()
            } else {
                Vec::new()
            };
            if !wanted.is_empty() {
                match tokio::time::timeout(inner.timeout, sink.subscribe(&wanted)).await {
                    Ok(Ok(())) => {
                        let mut channels = inner.channels();
                        for name in &wanted {
                            if let Some(ch) = channels.get_mut(name) {
                                ch.subscribed = true;
                            }
                        }
                    }
                    _ => {
                        drop(live);
                        tracing::warn!("pub/sub resubscribe failed");
                        if !pause(&inner, &shutdown, &mut backoff).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            *live = Some(sink);
            inner.connected.send_replace(true);
        }
        tracing::debug!("pub/sub connected");
        backoff = RECONNECT_MIN;
        // Anything may have happened while we were not listening.
        inner.wake_all();

        loop {
            let event = tokio::select! {
                () = shutdown.cancelled() => return,
                event = messages.next() => event,
            };
            match event {
                None => break,
                Some(Event::Message { channel, payload }) => inner.deliver(&channel, &payload),
                Some(Event::Dropped { channel }) => {
                    // The slot moved: subscribe again (on its new owner) before waiting again.
                    if let Some(ch) = inner.channels().get_mut(&channel) {
                        ch.subscribed = false;
                        ch.wake_all();
                    }
                }
                Some(Event::Gap) => {
                    // A master connection dropped (a failover, a restart, a dead master) or was
                    // given up. Which channels it carried is not tracked, so every waiter
                    // subscribes afresh (a repeated SSUBSCRIBE is harmless; one on a dead master
                    // fails that waiter only) and checks the state again.
                    for ch in inner.channels().values_mut() {
                        ch.subscribed = false;
                    }
                    inner.wake_all();
                }
            }
        }

        tracing::warn!("pub/sub connection lost; reconnecting");
        {
            let mut live = inner.sink.lock().await;
            *live = None;
            inner.connected.send_replace(false);
            for ch in inner.channels().values_mut() {
                ch.subscribed = false;
            }
        }
        inner.wake_all();
    }
}

/// Waits out the reconnect backoff (doubling it) unless a subscriber is waiting for the
/// connection; returns false on shutdown.
async fn pause(inner: &Inner, shutdown: &CancellationToken, backoff: &mut Duration) -> bool {
    let until = Instant::now() + *backoff;
    *backoff = (*backoff * 2).min(RECONNECT_MAX);
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep_until(until) => true,
        () = inner.kick.notified() => true,
    }
}
