//! Logging: `tracing` with structured fields, the filter from `BATON_LOG`, plain or JSON lines on
//! standard error.
//!
//! A log line that cannot be written is dropped, never reported: when standard error is a pipe
//! whose reader went away (`baton serve … | head`), tracing's own report of the failed write
//! would go to the same closed stderr with a panicking `eprintln!`, and kill the task that
//! logged. Lines are written by a thread of their own through a bounded queue, and dropped when
//! the queue is full, so a standard error that nobody reads (a full pipe) never blocks a task.
//! Callers also act before they log, so nothing a task must do waits on a log line.

use std::io::{IsTerminal, Write};

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Most log lines queued for the writing thread; lines beyond it are dropped.
const QUEUED_LINES: usize = 64 * 1024;

/// Writes out the queued log lines when dropped, waiting at most about a second for a standard
/// error that does not take them. Keep it until the process ends.
pub struct Logs(Option<WorkerGuard>);

impl Drop for Logs {
    fn drop(&mut self) {
        // The queue's writer says so on standard output when it cannot even be told to stop (its
        // queue is full), and `println!` panics when standard output is closed: point standard
        // output at /dev/null first (`baton serve` writes nothing there).
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            let _ = nix::unistd::dup2_stdout(&null);
        }
        drop(self.0.take());
    }
}

/// Installs the global subscriber, and a panic hook that reports panics as log lines (so a
/// panicking task never blocks on a full standard error either). `filter` was validated with the
/// configuration.
///
/// Plain lines carry ANSI colours only when standard error is a terminal. JSON lines are one
/// object each: `timestamp`, `level`, `target`, `message` and the event's own fields at the top
/// level, and, in a call that carried a W3C `traceparent`, `span` with its `trace_id`, `service`
/// and `method` (see [`crate::metrics::grpc`]).
#[must_use = "queued log lines are lost when the guard is dropped"]
pub fn init(format: LogFormat, filter: &str) -> Logs {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(QUEUED_LINES)
        .thread_name("baton-log")
        .finish(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
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
    std::panic::set_hook(Box::new(|panic| {
        tracing::error!(panic = %panic, "a task panicked");
    }));
    Logs(Some(guard))
}

/// Writes `text` and a newline to standard error, ignoring a failed write (`eprintln!` would
/// panic on a closed stderr).
pub fn say(text: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "{text}");
}
