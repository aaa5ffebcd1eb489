//! Which local waiters listen on which channel, and which of them a message wakes.
//!
//! Pure bookkeeping: no I/O and no Redis. The subscriber task reports here what its connection
//! delivers ([`Registry::deliver`]) and what it confirms or loses ([`Registry::confirm`],
//! [`Registry::dropped`], [`Registry::gap`]); waiters join and leave, and hold a [`Waiter`] that
//! is woken by the messages its [`Wake`] names.
//!
//! Each channel counts generations: a message not addressed to one waiter bumps the channel's
//! broadcast generation, which every plain waiter watches, and one relay waiter's own generation,
//! in turn (the front of the channel's relay queue, which then moves to the back). A message
//! addressed to a waiter id bumps that waiter's generation only. A waiter compares generations
//! with what it [armed](Waiter::arm), so a message between its check and its wait is not lost.
//!
//! A relay wake is owed until the waiter has acted on it: a relay waiter that leaves while it
//! owes one (woken and never looked, or woken and gone before its check answered) wakes the next
//! relay waiter, so one message never wakes nobody.
//!
//! Relay waiters come in classes: those of one class are interchangeable (what one cannot take,
//! none of them can), those of different classes are not (a semaphore waiter under a limit of 1
//! cannot take the permit that one under a limit of 5 can). A message wakes one relay waiter of
//! each class, and a wake is passed on within its class.

use std::collections::{HashMap, VecDeque};

use tokio::sync::watch;

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
    /// subscriptions of the same class: for waiters of which only one can go ahead per message.
    /// Waiters of one class must be interchangeable: when one of them cannot go ahead, neither
    /// can the others. A relay subscription dropped before it acted on its wake (see
    /// [`super::Subscription::settle`]) passes it on within its class.
    Relay(u64),
}

/// The waiters of every channel that has at least one.
#[derive(Default)]
pub(super) struct Registry {
    channels: HashMap<String, Channel>,
}

struct Channel {
    /// Bumped by every message not addressed to one waiter.
    generation: watch::Sender<u64>,
    /// Per-waiter generations, bumped by messages addressed to that waiter.
    addressed: HashMap<String, watch::Sender<u64>>,
    /// Relay waiters (by id) of each class, in the order they are woken: the front one next.
    relay: HashMap<u64, VecDeque<(u64, watch::Sender<u64>)>>,
    /// The id of the next relay waiter.
    next_relay: u64,
    /// Local waiters.
    waiters: usize,
    /// Whether Redis confirmed the channel's subscription on the live connection.
    subscribed: bool,
}

/// Bumps a generation counter, waking whoever watches it.
fn bump(tx: &watch::Sender<u64>) {
    tx.send_modify(|g| *g = g.wrapping_add(1));
}

impl Channel {
    /// Wakes every waiter, relay waiters included: messages may have been missed.
    fn wake_all(&self) {
        bump(&self.generation);
        for (_, tx) in self.relay.values().flatten() {
            bump(tx);
        }
    }

    /// Wakes the front relay waiter of `class` and moves it to the back.
    fn relay_one(&mut self, class: u64) {
        if let Some(queue) = self.relay.get_mut(&class)
            && let Some((id, tx)) = queue.pop_front()
        {
            bump(&tx);
            queue.push_back((id, tx));
        }
    }

    /// Wakes the front relay waiter of every class.
    fn relay_each_class(&mut self) {
        let classes: Vec<u64> = self.relay.keys().copied().collect();
        for class in classes {
            self.relay_one(class);
        }
    }
}

/// One waiter's hold on its channel: the generations it watches, and whether it owes a relay
/// wake. Made by [`Registry::join`], given back to [`Registry::leave`].
pub(super) struct Waiter {
    /// Broadcast messages; `None` for a relay waiter.
    broadcast: Option<watch::Receiver<u64>>,
    /// The waiter id messages address, and their generation.
    addressed: Option<(String, watch::Receiver<u64>)>,
    /// A relay waiter's class, id and wakes.
    relay: Option<(u64, u64, watch::Receiver<u64>)>,
    /// A relay waiter took a wake it has not settled yet.
    owes: bool,
}

impl Registry {
    /// Adds a waiter on `channel`, woken by the messages `wake` names.
    pub(super) fn join(&mut self, channel: &str, wake: Wake<'_>) -> Waiter {
        if !self.channels.contains_key(channel) {
            self.channels.insert(
                channel.to_owned(),
                Channel {
                    generation: watch::Sender::new(0),
                    addressed: HashMap::new(),
                    relay: HashMap::new(),
                    next_relay: 0,
                    waiters: 0,
                    subscribed: false,
                },
            );
        }
        let Some(ch) = self.channels.get_mut(channel) else {
            unreachable!("inserted above");
        };
        ch.waiters += 1;
        let addressed = match wake {
            Wake::EveryAnd(id) => {
                let rx = ch
                    .addressed
                    .entry(id.to_owned())
                    .or_insert_with(|| watch::Sender::new(0))
                    .subscribe();
                Some((id.to_owned(), rx))
            }
            Wake::Every | Wake::Relay(_) => None,
        };
        let relay = match wake {
            Wake::Relay(class) => {
                let id = ch.next_relay;
                ch.next_relay += 1;
                let tx = watch::Sender::new(0);
                let rx = tx.subscribe();
                ch.relay.entry(class).or_default().push_back((id, tx));
                Some((class, id, rx))
            }
            Wake::Every | Wake::EveryAnd(_) => None,
        };
        Waiter {
            broadcast: relay.is_none().then(|| ch.generation.subscribe()),
            addressed,
            relay,
            owes: false,
        }
    }

    /// Removes `waiter` from `channel`; a relay wake it owes or has not seen goes to the next
    /// relay waiter. Returns whether that was the channel's last waiter, so its subscription
    /// should be given up: Redis may hold it whether or not it was confirmed (a `SUBSCRIBE` whose
    /// answer came too late is still carried out).
    pub(super) fn leave(&mut self, channel: &str, waiter: &Waiter) -> bool {
        let Some(ch) = self.channels.get_mut(channel) else {
            return false;
        };
        if let Some((id, _)) = &waiter.addressed {
            ch.addressed.remove(id);
        }
        if let Some((class, id, rx)) = &waiter.relay {
            // Asked before its sender goes.
            let unseen = rx.has_changed().unwrap_or(false);
            if let Some(queue) = ch.relay.get_mut(class) {
                queue.retain(|(other, _)| other != id);
                if queue.is_empty() {
                    ch.relay.remove(class);
                }
            }
            if waiter.owes || unseen {
                ch.relay_one(*class);
            }
        }
        ch.waiters -= 1;
        if ch.waiters > 0 {
            return false;
        }
        self.channels.remove(channel);
        true
    }

    /// Delivers one message to the waiters it is meant for: the waiter it addresses, or every
    /// plain waiter and the next relay waiter.
    pub(super) fn deliver(&mut self, channel: &str, payload: &[u8]) {
        let Some(ch) = self.channels.get_mut(channel) else {
            return;
        };
        match payload.strip_prefix(&[ADDRESSED as u8]) {
            Some(id) => {
                let id = String::from_utf8_lossy(id);
                if let Some(tx) = ch.addressed.get(id.as_ref()) {
                    bump(tx);
                }
            }
            None => {
                bump(&ch.generation);
                ch.relay_each_class();
            }
        }
    }

    /// Whether `channel` has waiters.
    pub(super) fn contains(&self, channel: &str) -> bool {
        self.channels.contains_key(channel)
    }

    /// Whether `channel` has waiters (`Some`) and its subscription is confirmed (`Some(true)`).
    pub(super) fn subscribed(&self, channel: &str) -> Option<bool> {
        self.channels.get(channel).map(|ch| ch.subscribed)
    }

    /// Redis confirmed the subscription of `channel`; returns false if it has no waiters (any
    /// more), so nobody needs it.
    pub(super) fn confirm(&mut self, channel: &str) -> bool {
        match self.channels.get_mut(channel) {
            Some(ch) => {
                ch.subscribed = true;
                true
            }
            None => false,
        }
    }

    /// The server dropped the subscription of `channel` (its slot moved): its waiters are woken
    /// to look again and subscribe afresh.
    pub(super) fn dropped(&mut self, channel: &str) {
        if let Some(ch) = self.channels.get_mut(channel) {
            ch.subscribed = false;
            ch.wake_all();
        }
    }

    /// Messages may have been missed and subscriptions lost (a connection dropped): every
    /// channel is unsubscribed and every waiter woken.
    pub(super) fn gap(&mut self) {
        for ch in self.channels.values_mut() {
            ch.subscribed = false;
            ch.wake_all();
        }
    }

    /// How many channels have a confirmed subscription.
    pub(super) fn subscribed_count(&self) -> usize {
        self.channels.values().filter(|ch| ch.subscribed).count()
    }

    /// The channels that have waiters.
    pub(super) fn channels(&self) -> impl Iterator<Item = &str> {
        self.channels.keys().map(String::as_str)
    }
}

impl Waiter {
    /// Marks every wake so far as seen, before a check of the state in Redis; a relay wake seen
    /// here is owed until [`settle`](Self::settle).
    pub(super) fn arm(&mut self) {
        if let Some(rx) = self.broadcast.as_mut() {
            rx.borrow_and_update();
        }
        if let Some((_, rx)) = self.addressed.as_mut() {
            rx.borrow_and_update();
        }
        if let Some((_, _, rx)) = self.relay.as_mut() {
            self.owes |= rx.has_changed().unwrap_or(false);
            rx.borrow_and_update();
        }
    }

    /// The check armed for has answered: the relay wake it consumed was acted on.
    pub(super) fn settle(&mut self) {
        self.owes = false;
    }

    /// What woke this relay waiter is not used up: leaving wakes the next relay waiter.
    pub(super) fn pass_on(&mut self) {
        self.owes = self.relay.is_some();
    }

    /// Waits for a wake newer than the last [`arm`](Self::arm). A relay wake taken here is owed
    /// until the next check settles.
    pub(super) async fn notified(&mut self) {
        // The senders live in the registry for as long as this waiter is in it, so `changed`
        // only fails for a waiter that has left, which then waits forever.
        async fn changed(rx: Option<&mut watch::Receiver<u64>>) {
            let delivered = match rx {
                Some(rx) => rx.changed().await.is_ok(),
                None => false,
            };
            if !delivered {
                std::future::pending::<()>().await;
            }
        }
        let relayed = tokio::select! {
            () = changed(self.broadcast.as_mut()) => false,
            () = changed(self.addressed.as_mut().map(|(_, rx)| rx)) => false,
            () = changed(self.relay.as_mut().map(|(_, _, rx)| rx)) => true,
        };
        self.owes |= relayed;
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::{Registry, Waiter, Wake};

    /// Whether `waiter` has a wake newer than its last arm (taking it, as a wait would).
    fn woken(waiter: &mut Waiter) -> bool {
        waiter.notified().now_or_never().is_some()
    }

    /// Joins `n` waiters of `wake` on `channel`, each armed.
    fn join(registry: &mut Registry, channel: &str, wake: Wake<'_>, n: usize) -> Vec<Waiter> {
        (0..n)
            .map(|_| {
                let mut w = registry.join(channel, wake);
                w.arm();
                w
            })
            .collect()
    }

    /// A broadcast wakes one relay waiter of each class, and a wake passed on stays in its
    /// class: the waiters of one class cannot take what those of another can.
    #[test]
    fn relay_waiters_are_woken_one_per_class() {
        let mut r = Registry::default();
        let mut ones = join(&mut r, "c", Wake::Relay(1), 2);
        let mut fives = join(&mut r, "c", Wake::Relay(5), 2);
        r.deliver("c", b"released");
        let woken_ones: Vec<usize> = (0..2).filter(|&i| woken(&mut ones[i])).collect();
        let woken_fives: Vec<usize> = (0..2).filter(|&i| woken(&mut fives[i])).collect();
        assert_eq!(woken_ones.len(), 1, "one waiter of class 1");
        assert_eq!(woken_fives.len(), 1, "one waiter of class 5");
        // The woken waiter of class 1 leaves without acting on its wake: the other one of
        // class 1 gets it, and no waiter of class 5 does.
        let gone = ones.remove(woken_ones[0]);
        assert!(!r.leave("c", &gone));
        assert!(woken(&mut ones[0]), "passed on within the class");
        for w in &mut fives {
            assert!(!woken(w), "not passed to another class");
        }
    }

    /// A broadcast wakes every plain waiter (with or without an id) each time, and one relay
    /// waiter per message, in the order they joined, round and round.
    #[test]
    fn a_broadcast_wakes_every_plain_waiter_and_one_relay_in_turn() {
        let mut r = Registry::default();
        let mut plain = r.join("c", Wake::Every);
        let mut named = r.join("c", Wake::EveryAnd("w1"));
        let mut relays = join(&mut r, "c", Wake::Relay(0), 3);
        let mut order = Vec::new();
        for _ in 0..6 {
            plain.arm();
            named.arm();
            r.deliver("c", b"released");
            assert!(woken(&mut plain) && woken(&mut named), "plain waiters");
            let this_time: Vec<usize> = (0..3).filter(|&i| woken(&mut relays[i])).collect();
            assert_eq!(this_time.len(), 1, "one relay waiter per message");
            order.push(this_time[0]);
            for w in &mut relays {
                w.arm();
                w.settle();
            }
        }
        assert_eq!(order, [0, 1, 2, 0, 1, 2]);
        assert!(!woken(&mut plain), "one wake per message");
    }

    /// A message addressed to a waiter id wakes that waiter only: no plain waiter, no other id,
    /// no relay waiter; one to an id nobody has, or on a channel nobody waits on, wakes nobody.
    #[test]
    fn an_addressed_message_wakes_only_its_waiter() {
        let mut r = Registry::default();
        let mut head = r.join("c", Wake::EveryAnd("head"));
        let mut other = r.join("c", Wake::EveryAnd("other"));
        let mut plain = r.join("c", Wake::Every);
        let mut relay = r.join("c", Wake::Relay(0));
        let mut elsewhere = r.join("d", Wake::EveryAnd("head"));
        for w in [
            &mut head,
            &mut other,
            &mut plain,
            &mut relay,
            &mut elsewhere,
        ] {
            w.arm();
        }
        r.deliver("c", b"@head");
        assert!(woken(&mut head));
        assert!(!woken(&mut other) && !woken(&mut plain) && !woken(&mut relay));
        assert!(!woken(&mut elsewhere), "the same id on another channel");
        r.deliver("c", b"@nobody");
        r.deliver("e", b"released");
        assert!(!woken(&mut head) && !woken(&mut other) && !woken(&mut plain));
        assert!(!woken(&mut relay) && !woken(&mut elsewhere));
        // Once its waiter left, its id wakes nobody.
        assert!(!r.leave("c", &head), "others remain");
        r.deliver("c", b"@head");
        assert!(!woken(&mut other) && !woken(&mut plain) && !woken(&mut relay));
    }

    /// A relay waiter that leaves owing its wake passes it on: woken and gone without looking,
    /// or armed with it (its check started) and gone before the check answered; one that settled
    /// (its check answered) does not.
    #[test]
    fn a_relay_waiter_that_leaves_owing_passes_its_wake_on() {
        for (armed, settled, passed) in [
            (false, false, true),
            (true, false, true),
            (true, true, false),
        ] {
            let mut r = Registry::default();
            let mut first = r.join("c", Wake::Relay(0));
            let mut second = r.join("c", Wake::Relay(0));
            first.arm();
            second.arm();
            r.deliver("c", b"released");
            assert!(!woken(&mut second), "the front waiter gets it");
            if armed {
                first.arm();
            }
            if settled {
                first.settle();
            }
            assert!(!r.leave("c", &first));
            assert_eq!(
                woken(&mut second),
                passed,
                "armed {armed}, settled {settled}: passed on"
            );
        }
    }

    /// A relay waiter woken while it waited, then armed for its check, passes the wake on when it
    /// leaves because the check failed (an error, not an answer).
    #[test]
    fn a_relay_waiter_whose_check_failed_passes_its_wake_on() {
        let mut r = Registry::default();
        let mut first = r.join("c", Wake::Relay(0));
        let mut second = r.join("c", Wake::Relay(0));
        first.arm();
        second.arm();
        r.deliver("c", b"released");
        assert!(woken(&mut first), "the front waiter");
        first.arm();
        // The check fails: no settle.
        assert!(!r.leave("c", &first));
        assert!(woken(&mut second), "the next relay waiter");
    }

    /// A relay waiter whose grant leaves some of the resource (`pass_on`) wakes the next one when
    /// it leaves, even after its check settled; a plain waiter's `pass_on` does nothing.
    #[test]
    fn pass_on_wakes_the_next_relay_waiter() {
        let mut r = Registry::default();
        let mut plain = r.join("c", Wake::Every);
        let mut first = r.join("c", Wake::Relay(0));
        let mut second = r.join("c", Wake::Relay(0));
        for w in [&mut plain, &mut first, &mut second] {
            w.arm();
        }
        r.deliver("c", b"released");
        assert!(woken(&mut first));
        assert!(woken(&mut plain));
        first.arm();
        first.settle();
        first.pass_on();
        assert!(!r.leave("c", &first));
        assert!(woken(&mut second), "passed on");
        plain.pass_on();
        assert!(!r.leave("c", &plain));
        second.arm();
        assert!(!woken(&mut second), "a plain waiter passes nothing");
    }

    /// After a gap (a dropped connection) every waiter is woken, relay waiters and waiters with
    /// an id included, and every channel needs subscribing again; a channel the server dropped
    /// wakes its own waiters only.
    #[test]
    fn wake_all_after_a_gap() {
        let mut r = Registry::default();
        let mut on_c = vec![r.join("c", Wake::Every), r.join("c", Wake::EveryAnd("x"))];
        on_c.extend(join(&mut r, "c", Wake::Relay(0), 3));
        let mut on_d = r.join("d", Wake::Relay(0));
        for w in on_c.iter_mut().chain([&mut on_d]) {
            w.arm();
        }
        assert!(r.confirm("c") && r.confirm("d"));
        r.dropped("c");
        assert_eq!(r.subscribed("c"), Some(false));
        assert_eq!(r.subscribed("d"), Some(true));
        assert!(
            on_c.iter_mut().all(woken),
            "every waiter of the dropped channel"
        );
        assert!(!woken(&mut on_d), "another channel");

        for w in on_c.iter_mut().chain([&mut on_d]) {
            w.arm();
        }
        assert!(r.confirm("c"));
        r.gap();
        assert!(on_c.iter_mut().all(woken), "every waiter of c");
        assert!(woken(&mut on_d), "and of d");
        assert_eq!(
            (r.subscribed("c"), r.subscribed("d")),
            (Some(false), Some(false))
        );
        let mut channels: Vec<&str> = r.channels().collect();
        channels.sort_unstable();
        assert_eq!(channels, ["c", "d"]);
    }

    /// A channel lives while it has waiters: the last one to leave says to unsubscribe it,
    /// confirmed or not (a subscription whose confirmation came too late may still be in Redis),
    /// and a channel joined again starts unsubscribed with fresh counters.
    #[test]
    fn channels_are_reference_counted() {
        let mut r = Registry::default();
        let a = r.join("c", Wake::Every);
        let b = r.join("c", Wake::Relay(0));
        assert_eq!(r.subscribed("c"), Some(false));
        assert!(r.confirm("c"));
        assert!(!r.leave("c", &a), "one waiter remains");
        assert_eq!(r.subscribed("c"), Some(true));
        assert!(r.leave("c", &b), "the last one leaves a confirmed channel");
        assert!(!r.contains("c"));
        assert!(!r.confirm("c"), "nobody needs it any more");
        assert!(!r.leave("c", &b), "leaving twice changes nothing");

        let mut again = r.join("c", Wake::Relay(0));
        again.arm();
        assert_eq!(r.subscribed("c"), Some(false), "subscribed afresh");
        r.deliver("c", b"released");
        assert!(woken(&mut again), "the only relay waiter");
        assert!(
            r.leave("c", &again),
            "never confirmed, yet perhaps subscribed: the last one leaves"
        );
        assert!(!r.contains("c"));
    }
}
