//! Baton: a coordination sidecar serving distributed coordination primitives over gRPC, with all
//! state in Redis.
//!
//! # Layout
//!
//! - [`config`]: flags and `BATON_*` variables, validated in one pass.
//! - [`cli`]: the command-line client (`baton lock`, `baton semaphore`, `baton describe`, ...)
//!   over the generated gRPC clients.
//! - [`server`]: [`server::serve`] builds the gRPC router (services, health, reflection) on
//!   already-bound listeners and drains on a shutdown token with a deadline.
//! - [`security`]: serving-side security: TLS and mutual TLS on the TCP listener, the API token,
//!   the Unix socket's mode and group, and the limits on connections, streams and messages.
//! - [`telemetry`]: `tracing` setup (filter from `BATON_LOG`, plain or JSON).
//! - [`metrics`]: Prometheus metrics: the registry, what the rest records, the tower layer that
//!   counts RPCs and the `/metrics` endpoint (`--metrics-listen`).
//! - [`redis`]: the topologies (standalone, Sentinel, Cluster), script calls with timeouts, and
//!   the shared pub/sub subscriber ([`redis::Notifier`]) that wakes local waiters.
//! - [`activity`]: which calls of a client connection are at work (not parked waiting for
//!   others), for the connection's write coalescing.
//! - [`wait`]: waiting without polling: subscribe, attempt, wait for a release message or a
//!   fallback deadline, attempt again. Shared by locks and semaphores.
//! - [`lease`]: keepalive streams shared by every leased primitive: renew on schedule, report
//!   loss before expiry, release when the client goes away; renewals of many leases batched into
//!   few script calls ([`lease::batch`]).
//! - [`election`]: the `baton.v1.ElectionService`: leader election on the lease engine, FIFO
//!   among candidates, terms that strictly increase, values, observers; handler, Lua scripts,
//!   domain types.
//! - [`lock`]: the `baton.v1.LockService`: its gRPC handler, its Lua scripts and its domain types.
//! - [`ratelimit`]: the `baton.v1.RateLimitService` (GCRA, fixed and sliding windows) and
//!   Envoy's `envoy.service.ratelimit.v3.RateLimitService` with rules from a YAML file.
//! - [`semaphore`]: the `baton.v1.SemaphoreService`: counting semaphores with per-holder leases,
//!   weights and FIFO fairness; handler, Lua scripts and domain types.
//! - [`autocomplete`]: the `baton.v1.AutocompleteService`: completion over dictionaries and
//!   recent lists, Unicode-normalized matching, page tokens; handler, Lua scripts, domain types.
//! - [`files`]: reading the files Baton is given (rules, passwords, certificates, the API
//!   token): regular files of bounded size only, never blocking on a FIFO.
//! - [`error`]: the domain error and its single mapping to gRPC status codes.
//! - [`proto`]: code generated from `proto/`, and the descriptor set served by reflection.
//! - [`codec`]: the protobuf codec of the generated services, with small per-call buffers.
//! - [`cli`]: the `baton` command-line client of a running Baton (`lock`, `describe`, `health`,
//!   `autocomplete load`...).

#![warn(missing_docs)]

pub mod activity;
pub mod autocomplete;
pub mod cli;
pub mod codec;
pub mod config;
pub mod election;
pub mod error;
pub mod files;
pub mod grpc;
pub mod lease;
pub mod lock;
pub mod metrics;
pub mod proto;
pub mod ratelimit;
pub mod redis;
pub mod security;
pub mod semaphore;
pub mod server;
pub mod telemetry;
pub mod wait;
