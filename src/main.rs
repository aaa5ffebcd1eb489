//! The `baton` command. `baton serve`: parse the configuration, set up logging, bind, serve,
//! and drain on SIGTERM or SIGINT with a deadline. Every other subcommand is the command-line
//! client ([`baton::cli`], whose exit codes are listed there).
//!
//! Exit codes of `serve`: 0 after a drain, 2 for a configuration Baton cannot run with (invalid
//! flags, or a Redis older than 7.0 found at start), 1 for any other failure, 130 on a second
//! signal.

use std::process::ExitCode;

use baton::{
    cli,
    config::{Cli, Command, ServeArgs, ServeConfig},
    ratelimit::rules::Rules,
    redis::UnsupportedServer,
    server::{self, Listeners},
    telemetry::{self, say},
};
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// jemalloc: less CPU per call than glibc's allocator at the same resident memory
/// (docs/PERFORMANCE.md, "Allocator").
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Lock(args) => cli::lock(args),
        Command::Semaphore(args) => cli::semaphore(args),
        Command::Describe(args) => cli::describe(args),
        Command::Ratelimit(command) => cli::ratelimit(command),
        Command::Complete(args) => cli::complete(args),
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
            telemetry::init(config.log_format, &config.log_filter);
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
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "baton failed");
                    ExitCode::FAILURE
                }
            }
        }
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
    let shutdown = CancellationToken::new();
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let trigger = shutdown.clone();
    // Act first, log after: a log line that cannot be written must not stop the drain.
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        trigger.cancel();
        tracing::info!(signal = name, "signal received; draining");
        // A second signal means the operator does not want to wait for the drain.
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        // Logging cannot fail a task (see `telemetry`), so this line cannot keep Baton alive.
        tracing::warn!("second signal received; exiting without draining");
        std::process::exit(130);
    });
    server::serve_with_rules(config, rules, listeners, shutdown).await
}
