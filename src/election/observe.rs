//! Following an election: the current state at once, then every change, in order, without a
//! queue a slow reader could fill.
//!
//! An observer subscribes to the election's `changed` channel ([`crate::redis::Notifier`]),
//! marks what it has seen, reads the whole state (one read-only script call), and sends it when
//! it is newer than what it sent last ([`Order`]); then it waits for the next message, or for the
//! leader's expiry (a leader whose client and Baton died ends without a message), and reads
//! again. A message published between the read and the wait is not missed (see
//! [`crate::redis::Notifier`]), so the last change is always read.
//!
//! Messages go through the coalescing slot of a lease stream ([`crate::lease::stream`]): a state
//! the client has not read yet is replaced by the newer one, so a client that reads slowly, or
//! not at all, costs one message of memory and holds up nobody, and always reads the newest state
//! last.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Elections, Leader, State};
use crate::{
    error::Error,
    lease::stream::{self, Events, Sender},
};

/// What an observer is sent: the election's state after a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The leader; `None` when nobody leads.
    pub leader: Option<Leader>,
    /// The leader's term, or with nobody leading the last term known; never lower than in an
    /// earlier message of the same stream.
    pub last_term: u64,
}

/// The position of a state in the election's history: the term, then the value's revision
/// within it; "nobody leads" after a term comes after every revision of that term.
type Position = (u64, u64);

/// Keeps an observer's messages in history order: a state is sent only when it comes after the
/// last one sent. States read from Redis come in order on a single master; after a failover that
/// lost writes they may not, and an older state is then skipped rather than sent.
#[derive(Debug, Default)]
pub struct Order {
    last: Option<Position>,
}

impl Order {
    /// The message for `state`, or `None` when it is not newer than the last one sent.
    pub fn next(&mut self, state: State) -> Option<Observed> {
        let (position, observed) = match state.leader {
            Some(leader) => (
                (leader.term, leader.revision),
                Observed {
                    last_term: leader.term,
                    leader: Some(leader),
                },
            ),
            None => {
                // A term the observer saw lead is known to have been issued, whatever this read
                // says of the last one.
                let term = state.last_term.max(self.last.map_or(0, |(t, _)| t));
                (
                    (term, u64::MAX),
                    Observed {
                        leader: None,
                        last_term: term,
                    },
                )
            }
        };
        if self.last.is_some_and(|last| position <= last) {
            return None;
        }
        self.last = Some(position);
        Some(observed)
    }
}

/// Follows election `name` until the client leaves (drops the returned stream), Redis fails
/// (the final item is the error) or `shutdown` (the final item is [`Error::ShuttingDown`]).
pub fn observe(
    elections: &Elections,
    name: String,
    shutdown: CancellationToken,
) -> Events<Result<Observed, Error>> {
    let (tx, rx) = stream::channel();
    let elections = elections.clone();
    tokio::spawn(async move {
        let error = tokio::select! {
            biased;
            () = shutdown.cancelled() => Error::ShuttingDown,
            () = tx.closed() => return,
            e = follow(&elections, &name, &tx) => e,
        };
        tx.finish(Err(error));
    });
    rx
}

/// Sends the state of `name`, then every newer one, until an error ends it.
async fn follow(elections: &Elections, name: &str, tx: &Sender<Result<Observed, Error>>) -> Error {
    let election = elections.primitive();
    let channel = election.keys(name).changed;
    let mut subscription = match election.notifier().subscribe(&channel).await {
        Ok(s) => s,
        Err(e) => return e,
    };
    let mut order = Order::default();
    let mut first = true;
    loop {
        subscription.arm();
        let state = match election.state(name).await {
            Ok(state) => state,
            Err(e) => return e,
        };
        // A leader that ends without resigning (its client and Baton died) sends no message:
        // read again once its lease is over. One more millisecond lets Redis's clock pass it.
        let expiry = state
            .leader
            .as_ref()
            .map(|l| Instant::now() + l.remaining + Duration::from_millis(1));
        if let Some(observed) = order.next(state) {
            if first {
                tx.first(Ok(observed));
                first = false;
            } else {
                tx.renewal(Ok(observed));
            }
        }
        let expired = async {
            match expiry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = subscription.notified() => {}
            () = expired => {}
        }
        if let Err(e) = subscription.ensure().await {
            return e;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leading(term: u64, revision: u64) -> State {
        State {
            leader: Some(Leader {
                term,
                value: format!("{term}.{revision}").into_bytes(),
                revision,
                remaining: Duration::from_secs(1),
            }),
            last_term: term,
            candidates: 0,
        }
    }

    fn nobody(last_term: u64) -> State {
        State {
            leader: None,
            last_term,
            candidates: 0,
        }
    }

    /// The first state is always sent; after it, only states later in the history.
    #[test]
    fn only_newer_states_are_sent() {
        let mut order = Order::default();
        assert_eq!(order.next(nobody(0)).map(|o| o.last_term), Some(0));
        assert!(order.next(nobody(0)).is_none(), "nothing changed");
        let sent = order.next(leading(5, 0)).expect("a new leader");
        assert_eq!(sent.leader.map(|l| l.term), Some(5));
        assert!(order.next(leading(5, 0)).is_none(), "the same state again");
        assert!(order.next(leading(5, 1)).is_some(), "a new value");
        assert!(order.next(leading(5, 0)).is_none(), "an older value");
        assert!(order.next(leading(4, 7)).is_none(), "an older term");
        let gone = order.next(nobody(5)).expect("the leader left");
        assert_eq!((gone.leader, gone.last_term), (None, 5));
        assert!(order.next(leading(5, 1)).is_none(), "the ended term again");
        assert!(order.next(nobody(5)).is_none(), "still nobody");
        assert!(order.next(leading(9, 0)).is_some(), "the next leader");
    }

    /// "Nobody leads" never reports a term below one the observer saw, even when Redis forgot it
    /// (the term key expired, or a failover lost it).
    #[test]
    fn nobody_never_takes_the_term_back() {
        let mut order = Order::default();
        order.next(leading(7, 2));
        let gone = order.next(nobody(3)).expect("the leader is gone");
        assert_eq!(gone.last_term, 7);
        assert!(order.next(nobody(0)).is_none());
        assert!(order.next(leading(7, 9)).is_none(), "term 7 has ended");
        assert_eq!(
            order
                .next(leading(8, 0))
                .and_then(|o| o.leader)
                .map(|l| l.term),
            Some(8)
        );
    }
}
