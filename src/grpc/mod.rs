//! What every gRPC handler shares, beside the handlers (each service's `service.rs`): checking
//! request fields ([`wire`]), the client connection each request came on ([`conn`]), unary calls
//! whose caller may leave mid-way ([`unary`]), and the lease calls of every leased primitive:
//! `Acquire`, `Hold` and `KeepAlive` over the [`crate::lease::Engine`] ([`leases`]).

pub mod conn;
pub mod leases;
pub mod unary;
pub mod wire;
