//! The subscriber task: the one owner of the pub/sub connection.
//!
//! Waiters never touch the connection. A waiter whose channel is not confirmed yet queues a
//! request and awaits its answer; the task takes every request waiting, sends the channels in
//! batches of up to [`BATCH`] per command (on a Cluster, a pipeline of one command per channel to
//! each master), with up to [`WINDOW`] commands in flight at once, each bounded by the command
//! timeout, and answers each waiter when Redis confirms its channel. Nothing waits behind a lock
//! while Redis answers, and one command is in flight per channel at a time, so a subscription
//! and an unsubscription of the same channel can never overtake each other.
//!
//! A command whose answer does not come in time is still carried out when Redis gets to it: the
//! task counts every channel it sent a `SUBSCRIBE` for on the live connection as subscribed in
//! Redis, confirmed or not, until it sends the channel's `UNSUBSCRIBE`, which it does once the
//! channel has no waiters. Redis carries out one connection's commands in order, so whatever
//! was answered in time or not, no channel stays subscribed once nobody waits on it.
//!
//! When the connection drops (or a command finds it broken before its stream reports the drop,
//! or, on a single node, a command goes unanswered past the timeout), every waiter is woken
//! (messages may have been missed) and the task reconnects at once, then with a capped backoff
//! that a waiting subscriber cuts short; on the new connection every channel that still has
//! waiters is subscribed again in the same batches. On a Cluster, a master connection
//! that dropped, or a channel whose slot moved, is reported by an event; the waiters concerned are
//! woken, and the channels subscribed again on the slot's current owner.

use std::{
    collections::{HashMap, HashSet, VecDeque, hash_map::Entry},
    sync::Arc,
    time::Duration,
};

use futures::{StreamExt, future::BoxFuture, stream::FuturesUnordered};
use tokio::{
    sync::{mpsc, oneshot},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use super::{
    Shared, Source,
    connection::{Connection, Event, Outcome},
};
use crate::error::Error;

/// Channels per `SUBSCRIBE` (or per pipeline to each Cluster master).
const BATCH: usize = 256;
/// Commands in flight at once; requests arriving meanwhile join the next batch.
const WINDOW: usize = 8;
/// Requests taken at once before the task looks at its connection again.
const DRAIN: usize = 4 * BATCH;
/// Shortest wait before reconnecting the pub/sub connection.
const RECONNECT_MIN: Duration = Duration::from_millis(20);
/// Longest wait before reconnecting the pub/sub connection.
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// What waiters ask of the subscriber task.
pub(super) enum Request {
    /// Subscribe `channel` (it has waiters) and answer once Redis confirms it.
    Subscribe {
        channel: String,
        reply: oneshot::Sender<Result<(), Error>>,
    },
    /// The last waiter of this channel left (the task unsubscribes it if it sent a `SUBSCRIBE`).
    Unsubscribe(String),
}

/// A command in flight, and what it got.
struct Done {
    /// The gaps reported when it was sent.
    epoch: u64,
    subscribe: bool,
    outcome: Outcome,
}

struct Subscriber {
    shared: Arc<Shared>,
    requests: mpsc::UnboundedReceiver<Request>,
    /// Waiters awaiting the confirmation of a channel that is queued or in flight.
    replies: HashMap<String, Vec<oneshot::Sender<Result<(), Error>>>>,
    /// Channels to look at, in arrival order: the task subscribes or unsubscribes each, or
    /// answers its waiters, as the registry and `sent` then say.
    queue: VecDeque<String>,
    /// Channels Redis may have subscribed on the live connection: a `SUBSCRIBE` of them was sent
    /// on it (confirmed, failed or unanswered: one that timed out is still carried out when Redis
    /// gets to it), and no `UNSUBSCRIBE` since. A channel without waiters found here is
    /// unsubscribed.
    sent: HashSet<String>,
    /// Channels with a command in flight: looked at again when it is done.
    busy: HashSet<String>,
    /// Busy channels whose subscription the server dropped meanwhile: what their command
    /// confirms may be what was dropped.
    moved: HashSet<String>,
    /// Bumped by every gap: what a command sent before confirms may be lost already.
    epoch: u64,
}

/// Keeps the pub/sub connection open and serves the waiters' requests until `shutdown`.
pub(super) async fn run(
    shared: Arc<Shared>,
    source: Source,
    requests: mpsc::UnboundedReceiver<Request>,
    shutdown: CancellationToken,
) {
    let timeout = shared.timeout;
    let mut task = Subscriber {
        shared,
        requests,
        replies: HashMap::new(),
        queue: VecDeque::new(),
        sent: HashSet::new(),
        busy: HashSet::new(),
        moved: HashSet::new(),
        epoch: 0,
    };
    let mut backoff = RECONNECT_MIN;
    loop {
        let opened = tokio::select! {
            () = shutdown.cancelled() => return,
            opened = Connection::open(&source, timeout) => opened,
        };
        let mut conn = match opened {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "pub/sub connection failed");
                if !task.pause(&shutdown, &mut backoff).await {
                    return;
                }
                continue;
            }
        };
        tracing::debug!("pub/sub connected");
        backoff = RECONNECT_MIN;
        if !task.serve(&mut conn, &shutdown).await {
            return;
        }
        let mut registry = task.shared.registry();
        if registry.channels().next().is_some() {
            tracing::warn!("pub/sub connection lost; reconnecting");
        } else {
            // Nobody waited, so no message was missed: Redis closing an idle connection (its
            // `timeout` setting closes a subscriber with no channel) is routine.
            tracing::debug!("pub/sub connection closed while no channel had waiters; reconnecting");
        }
        registry.gap();
        drop(registry);
    }
}

impl Subscriber {
    /// Serves requests on `conn` until it drops (true) or shutdown (false).
    async fn serve(&mut self, conn: &mut Connection, shutdown: &CancellationToken) -> bool {
        let mut in_flight: FuturesUnordered<BoxFuture<'static, Done>> = FuturesUnordered::new();
        // A new connection has no subscriptions: every channel with waiters is subscribed, and
        // what was queued for the old one is moot.
        self.queue.clear();
        self.sent.clear();
        self.busy.clear();
        self.moved.clear();
        self.requeue_all();
        loop {
            self.send(conn, &mut in_flight);
            tokio::select! {
                () = shutdown.cancelled() => return false,
                request = self.requests.recv() => {
                    // `shared` holds a sender, so the channel never closes.
                    let Some(request) = request else { return false };
                    self.take(request);
                    for _ in 0..DRAIN {
                        let Ok(request) = self.requests.try_recv() else { break };
                        self.take(request);
                    }
                }
                Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                    if conn.broken() {
                        // A command found the connection broken before its stream noticed: give
                        // it up. Its channels' waiters are not answered with its error: the next
                        // connection subscribes every channel with waiters and answers them.
                        return true;
                    }
                    self.done(done);
                }
                event = conn.next() => match event {
                    None => return true,
                    Some(Event::Message(message)) => {
                        if let Some((channel, payload)) = message.parts() {
                            self.shared.registry().deliver(channel, payload);
                        }
                    }
                    Some(Event::Dropped(channel)) => {
                        // The slot moved: subscribe again on its new owner, and have the waiters
                        // look again (a release may have gone to the new owner meanwhile).
                        let channel = String::from_utf8_lossy(&channel).into_owned();
                        self.shared.registry().dropped(&channel);
                        if self.busy.contains(&channel) {
                            self.moved.insert(channel.clone());
                        }
                        self.queue.push_back(channel);
                    }
                    Some(Event::Gap) => {
                        // A Cluster master's connection dropped (a failover, a restart, a dead
                        // master) or was given up. Which channels it carried is not tracked, so
                        // every channel is subscribed afresh (a repeated SSUBSCRIBE is harmless;
                        // one on a dead master fails that master's channels only) and every
                        // waiter checks the state again.
                        self.epoch += 1;
                        self.shared.registry().gap();
                        self.requeue_all();
                    }
                },
            }
        }
    }

    /// Waits out the reconnect backoff (doubling it) unless a subscriber is waiting for the
    /// connection; returns false on shutdown.
    async fn pause(&mut self, shutdown: &CancellationToken, backoff: &mut Duration) -> bool {
        let until = Instant::now() + *backoff;
        *backoff = (*backoff * 2).min(RECONNECT_MAX);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep_until(until) => return true,
                request = self.requests.recv() => {
                    let Some(request) = request else { return false };
                    let waiting = matches!(request, Request::Subscribe { .. });
                    self.take(request);
                    if waiting {
                        return true;
                    }
                }
            }
        }
    }

    /// Queues what `request` asks for.
    fn take(&mut self, request: Request) {
        match request {
            Request::Subscribe { channel, reply } => {
                if self.shared.registry().subscribed(&channel) == Some(true) {
                    let _ = reply.send(Ok(()));
                    return;
                }
                match self.replies.entry(channel) {
                    // Queued or in flight already.
                    Entry::Occupied(mut waiting) => waiting.get_mut().push(reply),
                    Entry::Vacant(new) => {
                        self.queue.push_back(new.key().clone());
                        new.insert(vec![reply]);
                    }
                }
            }
            Request::Unsubscribe(channel) => self.queue.push_back(channel),
        }
    }

    /// Queues every channel that has waiters, and forgets the replies of channels that have
    /// none any more.
    fn requeue_all(&mut self) {
        let registry = self.shared.registry();
        self.queue.extend(registry.channels().map(str::to_owned));
        self.replies.retain(|channel, _| registry.contains(channel));
    }

    /// Sends what the queue asks for, in batches, while the window has room.
    fn send(
        &mut self,
        conn: &Connection,
        in_flight: &mut FuturesUnordered<BoxFuture<'static, Done>>,
    ) {
        while in_flight.len() < WINDOW && !self.queue.is_empty() {
            let mut subscribe = Vec::new();
            let mut unsubscribe = Vec::new();
            {
                let registry = self.shared.registry();
                while subscribe.len() < BATCH && unsubscribe.len() < BATCH {
                    let Some(channel) = self.queue.pop_front() else {
                        break;
                    };
                    // Looked at again when its command is done.
                    if self.busy.contains(&channel) {
                        continue;
                    }
                    match registry.subscribed(&channel) {
                        Some(true) => answer(self.replies.remove(&channel), &Ok(())),
                        Some(false) => {
                            self.busy.insert(channel.clone());
                            self.sent.insert(channel.clone());
                            subscribe.push(channel);
                        }
                        None => {
                            // Its waiters left; it may be subscribed in Redis all the same.
                            self.replies.remove(&channel);
                            if self.sent.remove(&channel) {
                                self.busy.insert(channel.clone());
                                unsubscribe.push(channel);
                            }
                        }
                    }
                }
            }
            let epoch = self.epoch;
            if !subscribe.is_empty() {
                let command = conn.subscribe(subscribe);
                in_flight.push(Box::pin(async move {
                    Done {
                        epoch,
                        subscribe: true,
                        outcome: command.await,
                    }
                }));
            }
            if !unsubscribe.is_empty() {
                let command = conn.unsubscribe(unsubscribe);
                in_flight.push(Box::pin(async move {
                    Done {
                        epoch,
                        subscribe: false,
                        outcome: command.await,
                    }
                }));
            }
        }
    }

    /// Records what a command got, answers the waiters, and queues what is left to do.
    fn done(&mut self, done: Done) {
        let mut registry = self.shared.registry();
        for (channel, result) in done.outcome {
            self.busy.remove(&channel);
            let moved = self.moved.remove(&channel);
            if !done.subscribe {
                // New waiters may have come meanwhile. An unsubscription that failed or was not
                // answered in time is still carried out, or went with its connection.
                if registry.contains(&channel) || self.replies.contains_key(&channel) {
                    self.queue.push_back(channel);
                }
                continue;
            }
            if !registry.contains(&channel) {
                // Subscribed for waiters that have left, or perhaps subscribed (no answer in
                // time): unsubscribe unless new waiters need it by then.
                self.replies.remove(&channel);
                self.queue.push_back(channel);
                continue;
            }
            match result {
                // A connection reported dropped since this command was sent may have been the
                // one that confirmed it (unless it is still up) or that failed it, and a
                // subscription the server dropped meanwhile may be this one: try again.
                Ok(live) if moved || (done.epoch != self.epoch && live.dropped()) => {
                    self.queue.push_back(channel);
                }
                Err(_) if done.epoch != self.epoch => self.queue.push_back(channel),
                Ok(_) => {
                    registry.confirm(&channel);
                    answer(self.replies.remove(&channel), &Ok(()));
                }
                Err(e) => {
                    // The waiters asking now fail; the others ask again when they next wait.
                    // Redis may still carry the command out: the channel stays in `sent`, and is
                    // unsubscribed when its last waiter leaves.
                    tracing::debug!(%channel, error = %e, "pub/sub subscription failed");
                    answer(self.replies.remove(&channel), &Err(e));
                }
            }
        }
    }
}

/// Answers the waiters of one channel.
fn answer(replies: Option<Vec<oneshot::Sender<Result<(), Error>>>>, result: &Result<(), Error>) {
    for reply in replies.into_iter().flatten() {
        let _ = reply.send(result.clone());
    }
}
