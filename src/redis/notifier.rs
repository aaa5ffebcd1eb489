//! One shared pub/sub connection per Baton, fanned out to local waiters.
//!
//! A waiter subscribes to a channel (reference counted: the first local waiter sends `SUBSCRIBE`,
//! the last one leaving sends `UNSUBSCRIBE`), marks what it has seen with [`Subscription::arm`],
//! checks the state in Redis, and if it must wait, awaits [`Subscription::notified`]. A message
//! published between the check and the wait is not lost: it bumps a generation counter that the
//! waiter compares against what it armed.
//!
//! When the connection drops, every waiter is woken (messages may have been missed while it was
//! down) and the connection task reconnects with a capped backoff, subscribing again to every
//! channel that still has waiters.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use bb8_redis::redis::{Client, aio::PubSubSink};
use futures::StreamExt;
use tokio::{sync::watch, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::error::Error;

/// Shortest wait before reconnecting the pub/sub connection.
const RECONNECT_MIN: Duration = Duration::from_millis(20);
/// Longest wait before reconnecting the pub/sub connection.
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// The shared subscriber. Cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    timeout: Duration,
    channels: Mutex<HashMap<String, Channel>>,
    /// The live connection's command half; `None` while disconnected. Held across each
    /// `SUBSCRIBE`/`UNSUBSCRIBE` so that the decision and the command cannot interleave.
    sink: tokio::sync::Mutex<Option<PubSubSink>>,
    /// Whether `sink` holds a live connection, for subscribers waiting out a reconnect.
    connected: watch::Sender<bool>,
    /// Cuts the reconnect backoff short: a subscriber is waiting for the connection.
    kick: tokio::sync::Notify,
}

struct Channel {
    generation: watch::Sender<u64>,
    refs: usize,
    subscribed: bool,
}

/// A local waiter's interest in one channel. Dropping it gives the interest up.
pub struct Subscription {
    inner: Arc<Inner>,
    channel: String,
    rx: watch::Receiver<u64>,
}

impl Notifier {
    /// Starts the connection task, which runs until `shutdown` is cancelled.
    pub fn start(client: Client, timeout: Duration, shutdown: CancellationToken) -> Self {
        let inner = Arc::new(Inner {
            client,
            timeout,
            channels: Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            connected: watch::Sender::new(false),
            kick: tokio::sync::Notify::new(),
        });
        tokio::spawn(run(inner.clone(), shutdown));
        Self { inner }
    }

    /// Registers interest in `channel` and makes sure Redis has confirmed the subscription before
    /// returning, so that a message published afterwards reaches the returned subscription.
    pub async fn subscribe(&self, channel: &str) -> Result<Subscription, Error> {
        let rx = {
            let mut channels = self.inner.channels();
            let entry = channels
                .entry(channel.to_owned())
                .or_insert_with(|| Channel {
                    generation: watch::Sender::new(0),
                    refs: 0,
                    subscribed: false,
                });
            entry.refs += 1;
            entry.generation.subscribe()
        };
        let sub = Subscription {
            inner: self.inner.clone(),
            channel: channel.to_owned(),
            rx,
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
            ch.generation.send_modify(|g| *g = g.wrapping_add(1));
        }
    }
}

impl Subscription {
    /// Marks every notification so far as seen. Call before checking the state in Redis.
    pub fn arm(&mut self) {
        self.rx.borrow_and_update();
    }

    /// Waits for a notification newer than the last [`arm`](Self::arm).
    pub async fn notified(&mut self) {
        // The sender lives in the channel map for as long as this subscription exists, so
        // `changed` only fails if the map entry was torn down, which cannot happen before drop.
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
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
                        sink.subscribe(&self.channel).await?;
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
                    tracing::debug!(%channel, "UNSUBSCRIBE was not confirmed in time");
                }
            }
        });
    }
}

/// Keeps one pub/sub connection open, reconnecting with a capped backoff until shutdown.
async fn run(inner: Arc<Inner>, shutdown: CancellationToken) {
    let mut backoff = RECONNECT_MIN;
    loop {
        let connect = tokio::time::timeout(inner.timeout, inner.client.get_async_pubsub());
        let pubsub = tokio::select! {
            () = shutdown.cancelled() => return,
            r = connect => r,
        };
        let (mut sink, mut stream) = match pubsub {
            Ok(Ok(p)) => p.split(),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "pub/sub connection failed");
                if !pause(&inner, &shutdown, &mut backoff).await {
                    return;
                }
                continue;
            }
            Err(_) => {
                tracing::warn!("pub/sub connection timed out");
                if !pause(&inner, &shutdown, &mut backoff).await {
                    return;
                }
                continue;
            }
        };

        {
            let mut live = inner.sink.lock().await;
            let wanted: Vec<String> = inner.channels().keys().cloned().collect();
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
            let msg = tokio::select! {
                () = shutdown.cancelled() => return,
                msg = stream.next() => msg,
            };
            let Some(msg) = msg else { break };
            let name = msg.get_channel_name();
            if let Some(ch) = inner.channels().get(name) {
                ch.generation.send_modify(|g| *g = g.wrapping_add(1));
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
