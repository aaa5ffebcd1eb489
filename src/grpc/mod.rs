//! What every gRPC handler shares, beside the handlers (each service's `service.rs`): checking
//! request fields ([`wire`]), the client connection each request came on ([`conn`]) and the valid
//! `:authority` every Unix-socket client's requests get ([`authority`]), the caller's deadline
//! answered as `DEADLINE_EXCEEDED` ([`deadline`]), unary calls
//! whose caller may leave mid-way ([`unary`]), and the lease calls of every leased primitive:
//! `Acquire`, `Hold` and `KeepAlive` over the [`crate::lease::Engine`] ([`leases`]), and the end
//! at shutdown of the streams of health and reflection ([`drain`]).

pub mod authority;
pub mod conn;
pub mod deadline;
pub mod drain;
pub mod health;
pub mod leases;
pub mod unary;
pub mod wire;
