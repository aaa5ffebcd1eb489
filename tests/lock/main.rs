//! Black-box tests of `baton.v1.LockService` against a real `redis-server`, over gRPC to an
//! in-process Baton bound to port 0 (and its Unix socket). One module per group of promises in
//! docs/guarantees.md, so the test of a promise is found from the promise's name:
//!
//! - [`basics`]: Acquire, Release, Refresh, Describe, tokens, validation, keys, the server;
//! - [`reentrancy`]: holds of one owner, a token per hold, no hold shortening another;
//! - [`fairness`]: wake-ups without polling, FIFO with `fair`, what a handoff costs;
//! - [`shared`]: readers and writers;
//! - [`streams`]: `Hold` and `KeepAlive`, `lost`, batched renewals;
//! - [`faults`]: Redis down, killed or frozen, clean-ups retried, the classic failure modes;
//! - [`scripts`]: each scheduling rule of the lock scripts on a crafted Redis state, without gRPC
//!   or waiting (`cargo test --test lock scripts::`: a few seconds).
//!
//! Helpers live in `tests/support/` (`lock.rs`, and `lease.rs` for what semaphores share).

#[path = "../support/mod.rs"]
mod support;

mod basics;
mod fairness;
mod faults;
mod reentrancy;
mod scripts;
mod shared;
mod streams;
