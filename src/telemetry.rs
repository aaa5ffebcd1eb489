//! Logging: `tracing` with structured fields, the filter from `BATON_LOG`, plain or JSON lines on
//! standard error.
//!
//! A log line that cannot be written is dropped, never reported: when standard error is a pipe
//! whose reader went away (`baton serve … | head`), tracing's own report of the failed write
//! would go to the same closed stderr with a panicking `eprintln!`, and kill the task that
//! logged. Callers also act before they log, so nothing a task must do waits on a log line.

use std::io::{IsTerminal, Write};

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. `filter` was validated with the configuration.
///
/// Plain lines carry ANSI colours only when standard error is a terminal. JSON lines are one
/// object each: `timestamp`, `level`, `target`, `message` and the event's own fields at the top
/// level, and, in a call that carried a W3C `traceparent`, `span` with its `trace_id`, `service`
/// and `method` (see [`crate::metrics::grpc`]).
pub fn init(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}

/// Writes `text` and a newline to standard error, ignoring a failed write (`eprintln!` would
/// panic on a closed stderr).
pub fn say(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{text}");
}
