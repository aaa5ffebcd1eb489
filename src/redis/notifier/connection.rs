//! The subscriber's connections to Redis and the commands sent on them.
//!
//! On a single Redis (standalone, or the master the Sentinels name) this is one plain pub/sub
//! connection: `SUBSCRIBE` takes a batch of channels in one command, and commands in flight are
//! pipelined on it (redis-rs's pub/sub sink matches each with its confirmations). On a Cluster it
//! is one RESP3 connection per master, opened when a channel of that master's slots is first
//! subscribed: each channel is subscribed (`SSUBSCRIBE`) on the master owning its slot in
//! Baton's slot map, one channel per command since channels of different slots cannot share one,
//! the commands of a batch sent to each master as one pipeline. A master that cannot be reached
//! fails its own channels only, and is not tried again for [`NODE_RETRY_AFTER`].
//!
//! Nothing here keeps any state about channels: the subscriber task decides what to send.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bb8_redis::redis::{
    self, AsyncConnectionConfig, Client, Msg, PushInfo, PushKind, RedisResult, Value,
    aio::{MultiplexedConnection, PubSubSink, PubSubStream},
};
use futures::{
    FutureExt, StreamExt,
    future::{BoxFuture, Shared},
};
use tokio::{sync::mpsc, time::Instant};

use super::Source;
use crate::{
    error::{Error, describe},
    redis::{
        cluster::{Cluster, Node},
        slot,
    },
};

/// How long a Cluster master that refused the subscriber's connection is not tried again: its
/// channels' subscriptions fail at once meanwhile, instead of each waiting for a connection
/// attempt.
const NODE_RETRY_AFTER: Duration = Duration::from_millis(250);

/// What each channel of a command got: confirmed on a connection, or why not.
pub(super) type Outcome = Vec<(String, Result<Live, Error>)>;

/// The connection a subscription was confirmed on, which may drop later.
#[derive(Clone, Default)]
pub(super) struct Live(Option<Arc<AtomicBool>>);

impl Live {
    /// Whether the connection dropped. A Cluster master's connection is flagged before its drop
    /// is reported ([`Event::Gap`]); the single node's connection is not flagged, as nothing
    /// sent on it is looked at after it dropped.
    pub(super) fn dropped(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|closed| closed.load(Ordering::Relaxed))
    }
}

/// The subscriber's connection: one pub/sub connection, or a Cluster's masters.
pub(super) enum Connection {
    /// One Redis server.
    Node {
        sink: PubSubSink,
        stream: PubSubStream,
        timeout: Duration,
        /// Set when a command found the connection broken (killed, reset), which its stream
        /// may not have noticed yet.
        broken: Arc<AtomicBool>,
        /// Resolves when the Sentinels name another master than the one this connection went
        /// to: the connection is then given up as if it had dropped.
        superseded: BoxFuture<'static, ()>,
    },
    /// A Redis Cluster: the connections to its masters, and the pushes they all send.
    Cluster {
        masters: Arc<Masters>,
        pushes: mpsc::UnboundedReceiver<PushInfo>,
    },
}

/// What a connection reports.
pub(super) enum Event {
    /// A message (see [`Message::parts`]).
    Message(Message),
    /// The server dropped the subscription of this channel (its slot moved to another node).
    Dropped(Vec<u8>),
    /// Messages may have been missed and subscriptions lost: a Cluster master's connection
    /// dropped or was given up (the next subscription to that master opens a new one).
    Gap,
}

/// A message as redis-rs delivered it, read in place.
pub(super) enum Message {
    Node(Msg),
    Push(PushInfo),
}

impl Message {
    /// The channel and the payload.
    pub(super) fn parts(&self) -> Option<(&str, &[u8])> {
        match self {
            Self::Node(msg) => Some((msg.get_channel_name(), msg.get_payload_bytes())),
            Self::Push(push) => {
                let channel = std::str::from_utf8(bytes(push.data.first())?).ok()?;
                Some((channel, bytes(push.data.get(1))?))
            }
        }
    }
}

/// The bytes of a string reply.
fn bytes(value: Option<&Value>) -> Option<&[u8]> {
    match value? {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

impl Connection {
    /// Opens the connection (on a Cluster, the masters' connections open as channels are
    /// subscribed: nothing to wait for here).
    pub(super) async fn open(source: &Source, timeout: Duration) -> Result<Self, String> {
        match source {
            Source::Node(endpoint) => {
                let (client, generation) =
                    endpoint.client(timeout).await.map_err(|e| e.to_string())?;
                let superseded = endpoint.superseded(generation).boxed();
                let pubsub = tokio::time::timeout(timeout, client.get_async_pubsub())
                    .await
                    .map_err(|_| "timed out".to_owned())?
                    .map_err(|e| e.to_string())?;
                let (sink, stream) = pubsub.split();
                Ok(Self::Node {
                    sink,
                    stream,
                    timeout,
                    broken: Arc::default(),
                    superseded,
                })
            }
            Source::Cluster(cluster) => {
                let (tx, rx) = mpsc::unbounded_channel();
                Ok(Self::Cluster {
                    masters: Arc::new(Masters {
                        cluster: cluster.clone(),
                        timeout,
                        pushes: tx,
                        links: Mutex::new(HashMap::new()),
                    }),
                    pushes: rx,
                })
            }
        }
    }

    /// Subscribes `channels` (each at most once), within the command timeout. The command is
    /// sent when the returned future is first polled; it owns what it needs, so any number can
    /// be in flight at once.
    pub(super) fn subscribe(&self, channels: Vec<String>) -> BoxFuture<'static, Outcome> {
        self.command(channels, true)
    }

    /// Unsubscribes `channels`, as [`subscribe`](Self::subscribe) subscribes them.
    pub(super) fn unsubscribe(&self, channels: Vec<String>) -> BoxFuture<'static, Outcome> {
        self.command(channels, false)
    }

    /// Subscribes (`subscribe`) or unsubscribes `channels`.
    fn command(&self, channels: Vec<String>, subscribe: bool) -> BoxFuture<'static, Outcome> {
        match self {
            Self::Node {
                sink,
                timeout,
                broken,
                ..
            } => node_command(sink.clone(), *timeout, broken.clone(), channels, subscribe),
            Self::Cluster { masters, .. } => masters.clone().command(channels, subscribe).boxed(),
        }
    }

    /// Whether a command found the single node's connection broken: it is given up, and what
    /// was sent on it is sent again on the next one, instead of failing its waiters. (A Cluster
    /// master's broken connection is replaced by the command itself.)
    pub(super) fn broken(&self) -> bool {
        match self {
            Self::Node { broken, .. } => broken.load(Ordering::Relaxed),
            Self::Cluster { .. } => false,
        }
    }

    /// The next event; `None` when the connection is gone.
    pub(super) async fn next(&mut self) -> Option<Event> {
        match self {
            Self::Node {
                stream, superseded, ..
            } => tokio::select! {
                message = stream.next() => message.map(|m| Event::Message(Message::Node(m))),
                () = superseded => {
                    tracing::warn!(
                        "the pub/sub connection's master is no longer current (a Sentinel \
                         failover); reconnecting"
                    );
                    None
                }
            },
            Self::Cluster { pushes, .. } => loop {
                let push = pushes.recv().await?;
                match push.kind {
                    PushKind::SMessage | PushKind::Message => {
                        return Some(Event::Message(Message::Push(push)));
                    }
                    // Also the confirmation of Baton's own SUNSUBSCRIBE, which redis-rs copies
                    // here: the channel then has no waiters, or new ones who subscribe again.
                    PushKind::SUnsubscribe => {
                        let Some(channel) = bytes(push.data.first()) else {
                            continue;
                        };
                        return Some(Event::Dropped(channel.to_vec()));
                    }
                    PushKind::Disconnection => return Some(Event::Gap),
                    _ => continue,
                }
            },
        }
    }
}

/// `SUBSCRIBE` or `UNSUBSCRIBE` of every channel in one command on a single node.
fn node_command(
    mut sink: PubSubSink,
    timeout: Duration,
    broken: Arc<AtomicBool>,
    channels: Vec<String>,
    subscribe: bool,
) -> BoxFuture<'static, Outcome> {
    let name = if subscribe {
        "SUBSCRIBE"
    } else {
        "UNSUBSCRIBE"
    };
    async move {
        let sent = async {
            if subscribe {
                sink.subscribe(channels.as_slice()).await
            } else {
                sink.unsubscribe(channels.as_slice()).await
            }
        };
        let result = match tokio::time::timeout(timeout, sent).await {
            Ok(Ok(())) => Ok(Live::default()),
            Ok(Err(e)) => {
                if e.is_connection_dropped() || e.is_io_error() {
                    broken.store(true, Ordering::Relaxed);
                }
                Err(Error::from(e))
            }
            Err(_) => {
                // A connection that does not answer is given up, as one that broke is: one that
                // died silently (a dropped NAT entry, a network that swallows everything) would
                // otherwise fail every subscription for good. The next connection subscribes
                // every channel with waiters; closing this one ends whatever Redis carries out of
                // its commands later.
                broken.store(true, Ordering::Relaxed);
                Err(Error::Unavailable(format!(
                    "{name} of {} channels was not confirmed in time",
                    channels.len()
                )))
            }
        };
        channels.into_iter().map(|c| (c, result.clone())).collect()
    }
    .boxed()
}

/// A connection to a Cluster master, and whether redis-rs reported it dropped.
#[derive(Clone)]
struct Opened {
    conn: MultiplexedConnection,
    closed: Arc<AtomicBool>,
}

/// A connection attempt that concurrent commands for the same master share.
type Opening = Shared<BoxFuture<'static, Result<Opened, Error>>>;

/// The subscriber's connection to one master.
enum Link {
    Open(Opened),
    Opening(Opening),
    /// Refused: not tried again until then, and why.
    Refused(Instant, Error),
}

/// The subscriber's RESP3 connections to a Cluster's masters, all sending their pushes to one
/// channel.
///
/// RESP3 answers `SSUBSCRIBE` and `SUNSUBSCRIBE` with a push that redis-rs takes as the reply of
/// the oldest command in flight, so each command names one channel (one confirmation each), and
/// a reply that is not the confirmation of the command it answers (a `sunsubscribe` the server
/// sent on its own as a slot moved) gives the connection up: its next replies cannot be trusted.
pub(super) struct Masters {
    cluster: Cluster,
    timeout: Duration,
    pushes: mpsc::UnboundedSender<PushInfo>,
    links: Mutex<HashMap<Arc<str>, Link>>,
}

/// What one channel's command got from a master.
enum Reply {
    Confirmed(Live),
    /// `MOVED` to this node.
    Moved(String),
    /// The connection broke under the command (killed, reset) before its drop was reported: a
    /// new connection to the same master may well take it.
    Lost(Error),
    Failed(Error),
}

impl Masters {
    fn links(&self) -> MutexGuard<'_, HashMap<Arc<str>, Link>> {
        // Only connection handles live here: a panic while holding the lock leaves nothing
        // half done.
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `SSUBSCRIBE` (or `SUNSUBSCRIBE`) of each channel on the master owning its slot, one
    /// pipeline per master, following one `MOVED`. Unsubscribing needs no connection to a
    /// master that has none open: a dropped one took its subscriptions with it.
    async fn command(self: Arc<Self>, channels: Vec<String>, subscribe: bool) -> Outcome {
        let deadline = Instant::now() + self.timeout;
        let mut outcome = Vec::with_capacity(channels.len());
        let mut groups: Vec<(Arc<Node>, Vec<String>)> = Vec::new();
        for channel in channels {
            match self.cluster.owner(slot(&channel), deadline).await {
                Ok(node) => match groups.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &node)) {
                    Some((_, group)) => group.push(channel),
                    None => groups.push((node, vec![channel])),
                },
                Err(e) => outcome.push((channel, Err(e))),
            }
        }
        for attempt in 0..2 {
            let sent = groups.drain(..).map(|(node, group)| async {
                let replies = self
                    .pipeline(node.clone(), group, subscribe, deadline)
                    .await;
                (node, replies)
            });
            let replies = futures::future::join_all(sent).await;
            for (node, channel, reply) in replies.into_iter().flat_map(|(node, replies)| {
                replies.into_iter().map(move |(c, r)| (node.clone(), c, r))
            }) {
                match reply {
                    Reply::Confirmed(live) => outcome.push((channel, Ok(live))),
                    // A dropped connection took its subscriptions with it.
                    Reply::Lost(_) if !subscribe => outcome.push((channel, Ok(Live::default()))),
                    Reply::Lost(_) if attempt == 0 => {
                        match groups.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &node)) {
                            Some((_, group)) => group.push(channel),
                            None => groups.push((node, vec![channel])),
                        }
                    }
                    Reply::Lost(e) => outcome.push((channel, Err(e))),
                    Reply::Moved(addr) if attempt == 0 => {
                        self.cluster.request_refresh();
                        match self.cluster.node(&addr) {
                            Ok(node) => {
                                match groups.iter_mut().find(|(n, _)| Arc::ptr_eq(n, &node)) {
                                    Some((_, group)) => group.push(channel),
                                    None => groups.push((node, vec![channel])),
                                }
                            }
                            Err(e) => outcome.push((channel, Err(e))),
                        }
                    }
                    Reply::Moved(addr) => outcome.push((
                        channel,
                        Err(Error::Unavailable(format!(
                            "the subscription moved twice, last to cluster node {addr}"
                        ))),
                    )),
                    Reply::Failed(e) => outcome.push((channel, Err(e))),
                }
            }
            if groups.is_empty() {
                break;
            }
        }
        outcome
    }

    /// One command per channel to `node`, as one pipeline.
    async fn pipeline(
        &self,
        node: Arc<Node>,
        channels: Vec<String>,
        subscribe: bool,
        deadline: Instant,
    ) -> Vec<(String, Reply)> {
        let (name, kind) = if subscribe {
            ("SSUBSCRIBE", PushKind::SSubscribe)
        } else {
            ("SUNSUBSCRIBE", PushKind::SUnsubscribe)
        };
        let opened = if subscribe {
            self.connect(&node).await.map(Some)
        } else {
            Ok(self.open_link(node.addr()))
        };
        let mut opened = match opened {
            Ok(Some(opened)) => opened,
            Ok(None) => {
                return channels
                    .into_iter()
                    .map(|c| (c, Reply::Confirmed(Live::default())))
                    .collect();
            }
            Err(e) => {
                return channels
                    .into_iter()
                    .map(|c| (c, Reply::Failed(e.clone())))
                    .collect();
            }
        };
        let mut pipe = redis::pipe();
        for channel in &channels {
            pipe.cmd(name).arg(channel);
        }
        pipe.ignore_errors();
        let answered = tokio::time::timeout_at(
            deadline,
            pipe.query_async::<Vec<RedisResult<Value>>>(&mut opened.conn),
        )
        .await;
        // Whether the connection broke under the commands, rather than answered wrongly or late.
        let mut lost = false;
        let cause = match answered {
            Ok(Ok(replies)) if replies.len() == channels.len() => {
                let replies: Vec<(String, Reply)> = channels
                    .into_iter()
                    .zip(replies)
                    .map(|(channel, reply)| {
                        let reply = match reply {
                            Ok(v) if confirms(&v, kind.clone(), &channel) => {
                                Reply::Confirmed(Live(Some(opened.closed.clone())))
                            }
                            Err(e) if e.redirect_node().is_some() => {
                                let (addr, _) = e.redirect_node().unwrap_or_default();
                                Reply::Moved(addr.to_owned())
                            }
                            other => Reply::Failed(Error::Unavailable(format!(
                                "{name} on cluster node {}: unexpected reply {other:?}",
                                node.addr()
                            ))),
                        };
                        (channel, reply)
                    })
                    .collect();
                if !replies.iter().any(|(_, r)| matches!(r, Reply::Failed(_))) {
                    return replies;
                }
                // Not the confirmations of these commands: whatever the connection answers
                // next is suspect, so nothing it confirmed can be relied on either.
                self.discard(node.addr(), &opened);
                return replies
                    .into_iter()
                    .map(|(channel, reply)| match reply {
                        Reply::Failed(e) => (channel, Reply::Failed(e)),
                        _ => (
                            channel,
                            Reply::Failed(Error::Unavailable(format!(
                                "{name} on cluster node {}: the connection answered out of turn",
                                node.addr()
                            ))),
                        ),
                    })
                    .collect();
            }
            Ok(Ok(replies)) => format!("{} replies to {} commands", replies.len(), channels.len()),
            Ok(Err(e)) => {
                lost = e.is_connection_dropped() || e.is_io_error();
                describe(&e)
            }
            Err(_) => "no answer in time".to_owned(),
        };
        self.discard(node.addr(), &opened);
        let why = Error::Unavailable(format!("{name} on cluster node {}: {cause}", node.addr()));
        channels
            .into_iter()
            .map(|c| {
                let why = why.clone();
                (
                    c,
                    if lost {
                        Reply::Lost(why)
                    } else {
                        Reply::Failed(why)
                    },
                )
            })
            .collect()
    }

    /// The live connection to `addr`, if one is open.
    fn open_link(&self, addr: &str) -> Option<Opened> {
        match self.links().get(addr) {
            Some(Link::Open(opened)) if !opened.closed.load(Ordering::Relaxed) => {
                Some(opened.clone())
            }
            _ => None,
        }
    }

    /// The live connection to `node`, opened if need be (once, however many commands wait for
    /// it).
    async fn connect(&self, node: &Node) -> Result<Opened, Error> {
        let opening = {
            let mut links = self.links();
            match links.get(node.addr()) {
                Some(Link::Open(opened)) if !opened.closed.load(Ordering::Relaxed) => {
                    return Ok(opened.clone());
                }
                Some(Link::Refused(until, why)) if Instant::now() < *until => {
                    return Err(why.clone());
                }
                Some(Link::Opening(opening)) => opening.clone(),
                _ => {
                    let opening = self.open(node).boxed().shared();
                    links.insert(Arc::from(node.addr()), Link::Opening(opening.clone()));
                    opening
                }
            }
        };
        let opened = opening.clone().await;
        let mut links = self.links();
        // The first of the waiting commands to get here records how it went.
        if let Some(Link::Opening(current)) = links.get(node.addr())
            && current.ptr_eq(&opening)
        {
            let link = match &opened {
                Ok(opened) => Link::Open(opened.clone()),
                Err(why) => {
                    self.cluster.request_refresh();
                    Link::Refused(Instant::now() + NODE_RETRY_AFTER, why.clone())
                }
            };
            links.insert(Arc::from(node.addr()), link);
        }
        opened
    }

    /// Opens a RESP3 connection to `node` that sends its pushes to the subscriber.
    fn open(&self, node: &Node) -> impl Future<Output = Result<Opened, Error>> + Send + 'static {
        let addr = node.addr().to_owned();
        let info = node.connection_info();
        let redis = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let info = info.set_redis_settings(redis);
        let closed = Arc::new(AtomicBool::new(false));
        let (flag, pushes) = (closed.clone(), self.pushes.clone());
        let forward = move |push: PushInfo| {
            if push.kind == PushKind::Disconnection {
                flag.store(true, Ordering::Relaxed);
            }
            pushes.send(push)
        };
        let timeout = self.timeout;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_push_sender(forward);
        async move {
            let opened = async {
                let client = Client::open(info).map_err(|e| describe(&e))?;
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map_err(|e| describe(&e))
            };
            match tokio::time::timeout(timeout, opened).await {
                Ok(Ok(conn)) => Ok(Opened { conn, closed }),
                failed => {
                    let cause = match failed {
                        Ok(Err(e)) => e,
                        _ => "timed out".to_owned(),
                    };
                    Err(Error::Unavailable(format!(
                        "the pub/sub connection to cluster node {addr} failed: {cause}"
                    )))
                }
            }
        }
    }

    /// Gives up the connection `opened` to `addr`, whose next replies cannot be trusted: the
    /// subscriptions made on it go with it, so every waiter is told to look again and subscribe
    /// afresh, as when a connection drops.
    fn discard(&self, addr: &str, opened: &Opened) {
        opened.closed.store(true, Ordering::Relaxed);
        let mut links = self.links();
        if let Some(Link::Open(current)) = links.get(addr)
            && Arc::ptr_eq(&current.closed, &opened.closed)
        {
            links.remove(addr);
            drop(links);
            let _ = self.pushes.send(PushInfo {
                kind: PushKind::Disconnection,
                data: Vec::new(),
            });
        }
    }
}

/// Whether `reply` is the `kind` confirmation (a RESP3 push) of `channel`.
fn confirms(reply: &Value, kind: PushKind, channel: &str) -> bool {
    match reply {
        Value::Push { kind: k, data } => {
            *k == kind && bytes(data.first()) == Some(channel.as_bytes())
        }
        _ => false,
    }
}
