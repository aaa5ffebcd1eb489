//! The `baton` command. `baton serve`: parse the configuration, set up logging, bind, serve,
//! and drain on SIGTERM or SIGINT with a deadline. Every other subcommand is the command-line
//! client ([`baton::cli`], whose exit codes are listed there).
//!
//! With `--shutdown-delay`, the first signal turns readiness NOT_SERVING and Baton goes on serving
//! every call for that long before it drains; another signal during the delay starts the drain at
//! once. A signal that comes within [`REPEATED_SIGNAL`] of the one before is taken as the same
//! request: a terminal's Ctrl-C reaches the whole process group, and an init such as tini
//! forwards it again.
//!
//! Exit codes of `serve`: 0 after a drain, 2 for a configuration Baton cannot run with (invalid
//! flags, files or a socket path, or found at start: a Redis older than 7.0, refusing Baton's credentials, or a
//! failed TLS handshake), 1 for any other failure, 130 on a signal during the drain.

use std::process::ExitCode;

use baton::{
    cli,
    config::{Cli, Command, ServeArgs, ServeConfig},
    ratelimit::rules::Rules,
    redis::UnsupportedServer,
    security::Refused,
    server::{self, Listeners, Stop},
    telemetry::{self, say},
};
use clap::Parser;
use tokio::signal::unix::{Signal, SignalKind, signal};

/// jemalloc: less CPU per call than glibc's allocator at the same resident memory
/// (docs/PERFORMANCE.md, "Allocator").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Lock(args) => cli::lock(args),
        Command::Semaphore(args) => cli::semaphore(args),
        Command::Campaign(args) => cli::campaign(args),
        Command::Leader(args) => cli::leader(args),
        Command::Observe(args) => cli::observe(args),
        Command::Describe(args) => cli::describe(args),
        Command::Ratelimit(command) => cli::ratelimit(command),
        Command::Complete(args) => cli::complete(args),
        Command::Autocomplete(command) => cli::autocomplete(command),
        Command::Health(args) => cli::health(args),
        Command::Serve(args) => {
            let (config, rules) = match configure(&args) {
                Ok(configured) => configured,
                Err(errors) => {
                    say("baton: invalid configuration:");
                    for e in errors {
                        say(&format!("  - {e}"));
                    }
                    return ExitCode::from(2);
                }
            };
            // Kept to the end of `main`: dropping it writes out the queued log lines.
            let _logs = telemetry::init(config.log_format, &config.log_filter);
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    say(&format!("baton: cannot start the runtime: {e}"));
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(serve(config, rules)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.downcast_ref::<UnsupportedServer>().is_some() => {
                    tracing::error!(error = %e, "baton cannot use this Redis");
                    say(&format!("baton: {e}"));
                    ExitCode::from(2)
                }
                // A socket path or a credential file Baton cannot use, found at start.
                Err(e) if e.downcast_ref::<Refused>().is_some() => {
                    tracing::error!(error = %e, "baton cannot serve with this configuration");
                    say(&format!("baton: {e}"));
                    ExitCode::from(2)
                }
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "baton failed");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Hold(args) => cli::hold(args),
    }
}

/// The validated configuration and the rate limit rules it names, or every problem of both (the
/// rules file is read even when a flag is wrong, so that all are reported together).
fn configure(args: &ServeArgs) -> Result<(ServeConfig, Option<Rules>), Vec<String>> {
    let config = ServeConfig::from_args(args);
    let rules = match args.ratelimit_config_path() {
        None => Ok(None),
        Some(path) => Rules::load(&path).map(Some).map_err(|problems| {
            problems
                .into_iter()
                .map(|p| format!("--ratelimit-config / BATON_RATELIMIT_CONFIG: {p}"))
                .collect()
        }),
    };
    match (config, rules) {
        (Ok(config), Ok(rules)) => Ok((config, rules)),
        (config, rules) => Err(config
            .err()
            .into_iter()
            .chain(rules.err())
            .flatten()
            .collect()),
    }
}

async fn serve(config: ServeConfig, rules: Option<Rules>) -> anyhow::Result<()> {
    let listeners = Listeners::bind(&config).await?;
    let stop = Stop::default();
    let mut signals = Signals {
        terminate: signal(SignalKind::terminate())?,
        interrupt: signal(SignalKind::interrupt())?,
    };
    let trigger = stop.clone();
    let delay = config.shutdown_delay;
    // Act first, log after: a log line that cannot be written must not stop the drain.
    tokio::spawn(async move {
        let name = signals.next().await;
        let mut last = tokio::time::Instant::now();
        trigger.unready.cancel();
        if delay.is_zero() {
            trigger.drain.cancel();
            tracing::info!(signal = name, "signal received; draining");
        } else {
            tracing::info!(signal = name, delay = ?delay, "signal received; not ready, serving until the shutdown delay ends");
            let end = tokio::time::Instant::now() + delay;
            tokio::select! {
                () = tokio::time::sleep_until(end) => {
                    trigger.drain.cancel();
                    tracing::info!("shutdown delay over; draining");
                }
                name = signals.next_after(&mut last) => {
                    trigger.drain.cancel();
                    tracing::info!(signal = name, "signal received during the shutdown delay; draining now");
                }
            }
        }
        // A signal during the drain means the operator does not want to wait for it.
        signals.next_after(&mut last).await;
        // Logging cannot fail or block a task (see `telemetry`), so this line cannot keep Baton
        // alive; the process exits without waiting for the log queue (its writer may be stuck on
        // a full pipe), so the line may be lost.
        tracing::warn!(
            "another signal received during the drain; exiting now: leases not yet released end \
             at their ttl"
        );
        std::process::exit(130);
    });
    server::serve_until(config, rules, listeners, stop).await
}

/// How soon after a signal another one is taken as the same request rather than a new one.
const REPEATED_SIGNAL: std::time::Duration = std::time::Duration::from_millis(250);

/// The signals that stop Baton.
struct Signals {
    terminate: Signal,
    interrupt: Signal,
}

impl Signals {
    /// Waits for the next SIGTERM or SIGINT and names it.
    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.terminate.recv() => "SIGTERM",
            _ = self.interrupt.recv() => "SIGINT",
        }
    }

    /// Waits for the next SIGTERM or SIGINT that comes at least [`REPEATED_SIGNAL`] after the
    /// last one acted on (`last`, moved to it), and names it.
    async fn next_after(&mut self, last: &mut tokio::time::Instant) -> &'static str {
        loop {
            let name = self.next().await;
            let now = tokio::time::Instant::now();
            if now.duration_since(*last) >= REPEATED_SIGNAL {
                *last = now;
                return name;
            }
            tracing::info!(
                signal = name,
                "signal repeated within {REPEATED_SIGNAL:?} of the last one; taken as the same request"
            );
        }
    }
}
