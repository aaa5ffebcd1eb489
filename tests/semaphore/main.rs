//! Black-box tests of `baton.v1.SemaphoreService` against a real `redis-server`, over gRPC to an
//! in-process Baton bound to port 0. One module per group of promises in docs/guarantees.md
//! ("Semaphores"), so the test of a promise is found from the promise's name:
//!
//! - [`basics`]: Acquire, Release, Refresh, Describe, validation, names, keys;
//! - [`limits`]: never over the limit, the strictest limit, weights;
//! - [`fairness`]: FIFO with `fair`, wake-ups without polling, as many as permits freed;
//! - [`streams`]: `Hold` and `KeepAlive`, `lost`, clients that go away;
//! - [`faults`]: Redis down or killed;
//! - [`clocks`]: Redis time only, each holder's own ttl;
//! - [`scripts`]: each scheduling rule of the semaphore scripts on a crafted Redis state, without
//!   gRPC or waiting (`cargo test --test semaphore scripts::`: a few seconds).
//!
//! The headline test is [`limits::limit_safety_under_load`]: 32 clients with random weights and
//! random hold times against a limit of 5, checked both by a Redis counter kept inside the
//! critical section and by the recorded hold intervals.
//!
//! Helpers live in `tests/support/` (`semaphore.rs`, and `lease.rs` for what locks share).

#[path = "../support/mod.rs"]
mod support;

mod basics;
mod clocks;
mod fairness;
mod faults;
mod limits;
mod scripts;
mod streams;
