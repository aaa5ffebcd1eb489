//! `loadgen`: Baton's load generator and the renderer of `docs/PERFORMANCE.md`'s tables.
//!
//! ```sh
//! cargo build --release -p baton -p loadgen
//! target/release/loadgen run --out docs/perf/primitives.json          # every scenario
//! target/release/loadgen run --quick --scenario lock,leases           # a quick look
//! target/release/loadgen run --baton before=/other/checkout/target/release/baton \
//!     --baton after=target/release/baton --scenario lock --out two-builds.json
//! target/release/loadgen report docs/PERFORMANCE.md                   # rewrite its tables
//! target/release/loadgen report --check docs/PERFORMANCE.md           # fail if out of date
//! target/release/loadgen table unary docs/perf/primitives.json        # one table to stdout
//! target/release/loadgen terms --terms 1000000 --out terms.tsv        # the terms, for the CLI
//! ```
//!
//! `run` measures Baton from the `baton` binary beside `loadgen` (build both in the same
//! profile) unless `--baton` names others; progress goes to stderr.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use loadgen::{BuildSpec, Options, Scenario, Transport, report};

#[derive(Parser)]
#[command(about = "Baton's load generator: measure, write JSON, render docs/PERFORMANCE.md")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run scenarios and write what they measured as JSON.
    Run(Box<RunArgs>),
    /// Rewrite the tables between `<!-- loadgen: TABLE FILE... -->` markers of a document.
    Report {
        /// Fail (exit 1) if the document is not what its JSON files render to, without writing.
        #[arg(long)]
        check: bool,
        /// The document (its markers name JSON files relative to it).
        document: PathBuf,
    },
    /// Write the autocomplete scenario's terms as a file `baton autocomplete load` reads
    /// (`display<TAB>score<TAB>payload`, one a line), to load them through the CLI.
    Terms {
        /// How many terms (the scenario's first ones).
        #[arg(long, default_value_t = 1_000_000)]
        terms: usize,
        /// The file to write (stdout when not given).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Print one table of JSON files to stdout.
    Table {
        /// The table: run, targets, targets-measured, unary, cpu, contention, leases, leader-failover,
        /// autocomplete-load, autocomplete, autocomplete-memory, autocomplete-baseline,
        /// autocomplete-modes, autocomplete-layouts, functions, redis-failover, builds, idle.
        table: String,
        /// The runs.
        files: Vec<PathBuf>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Where the JSON goes (stdout when not given).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Scenarios, comma-separated: lock, lock-contended, lock-fair, semaphore,
    /// semaphore-contended, ratelimit, health, leases, leader-failover, autocomplete, functions,
    /// redis-failover (all when not given).
    #[arg(long, value_delimiter = ',')]
    scenario: Vec<String>,
    /// Client counts of the closed-loop scenarios, comma-separated (1,16,64).
    #[arg(long, value_delimiter = ',')]
    clients: Vec<usize>,
    /// How clients reach Baton, comma-separated: tcp, uds, tcp-own (tcp,uds).
    #[arg(long, value_delimiter = ',')]
    transport: Vec<String>,
    /// Repeats, each with a fresh Redis and Baton per build (3).
    #[arg(long)]
    repeat: Option<usize>,
    /// Seconds per measured window (2.5).
    #[arg(long)]
    seconds: Option<f64>,
    /// Seconds of warm-up before each window (0.5).
    #[arg(long)]
    warmup: Option<f64>,
    /// Leases held in the lease scenario (10000).
    #[arg(long)]
    leases: Option<usize>,
    /// Their ttl in milliseconds (10000); the window lasts one ttl.
    #[arg(long)]
    lease_ttl_ms: Option<u64>,
    /// HTTP/2 connections per transport the closed-loop clients share (4).
    #[arg(long)]
    channels: Option<usize>,
    /// Baton's Redis pool and the direct side's connections (4).
    #[arg(long)]
    pool: Option<usize>,
    /// Handoffs per side in leader-failover (2000).
    #[arg(long)]
    handoffs: Option<usize>,
    /// Candidates in leader-failover (8).
    #[arg(long)]
    candidates: Option<usize>,
    /// Terms of the autocomplete dictionary (1000000).
    #[arg(long)]
    terms: Option<usize>,
    /// Autocomplete clients (16).
    #[arg(long)]
    autocomplete_clients: Option<usize>,
    /// Seconds per autocomplete query kind (10).
    #[arg(long)]
    autocomplete_seconds: Option<f64>,
    /// Autocomplete query kinds, comma-separated: prefix-lex, health, prefix-score, automatic,
    /// word-prefix, contains-lex, contains-score, fuzzy-lex, fuzzy-score (all when not given;
    /// naming some loads the dictionary with only the features they need, and skips the other
    /// feature sets' dictionaries and RediSearch).
    #[arg(long, value_delimiter = ',')]
    autocomplete_cases: Vec<String>,
    /// After the queries, add `RANKED` to the dictionary and time its background build (with
    /// `--autocomplete-cases` naming kinds that do not need `RANKED`).
    #[arg(long)]
    autocomplete_build_ranked: bool,
    /// Failovers per Sentinel timing in redis-failover (5; Cluster: at most 3).
    #[arg(long)]
    failovers: Option<usize>,
    /// One repeat, 1 s windows, at most 2000 leases, 100,000 terms, 500 handoffs, 1 failover.
    #[arg(long)]
    quick: bool,
    /// Runs each repeat's Redis at this nice value (a negative one needs privileges): keeps the
    /// load generator and Baton from preempting Redis on the cores they share.
    #[arg(long, allow_hyphen_values = true)]
    redis_nice: Option<i32>,
    /// A Baton binary to measure, `NAME=PATH` (repeat to compare builds in one run; the last is
    /// the current one). Default: the `baton` beside this executable.
    #[arg(long)]
    baton: Vec<String>,
}

fn options(args: &RunArgs) -> Result<Options, String> {
    let mut o = Options::full();
    if args.quick {
        o = o.quick();
    }
    if !args.scenario.is_empty() {
        o.scenarios = Scenario::ALL
            .into_iter()
            .filter(|s| args.scenario.iter().any(|a| a == s.name()))
            .collect();
        if let Some(bad) = args
            .scenario
            .iter()
            .find(|a| Scenario::from_name(a).is_none())
        {
            return Err(format!("unknown scenario {bad:?}"));
        }
    }
    if !args.clients.is_empty() {
        o.clients = args.clients.iter().copied().filter(|c| *c > 0).collect();
    }
    if !args.transport.is_empty() {
        o.transports = args
            .transport
            .iter()
            .map(|t| match t.as_str() {
                "tcp" => Ok(Transport::Tcp),
                "uds" | "unix" => Ok(Transport::Uds),
                "tcp-own" => Ok(Transport::TcpOwn),
                other => Err(format!("unknown transport {other:?}")),
            })
            .collect::<Result<_, _>>()?;
    }
    let secs = |v: f64, flag: &str| {
        if v.is_finite() && v > 0.0 {
            Ok(Duration::from_secs_f64(v))
        } else {
            Err(format!("{flag} must be a positive number of seconds"))
        }
    };
    if let Some(n) = args.repeat {
        o.repeat = n.max(1);
    }
    if let Some(s) = args.seconds {
        o.window = secs(s, "--seconds")?;
    }
    if let Some(s) = args.warmup {
        o.warmup = secs(s, "--warmup")?;
    }
    if let Some(n) = args.leases {
        o.leases = n.max(1);
    }
    if let Some(ms) = args.lease_ttl_ms {
        o.lease_ttl = Duration::from_millis(ms.max(100));
    }
    if let Some(n) = args.channels {
        o.channels = n.max(1);
    }
    if let Some(n) = args.pool {
        o.pool = n.max(1);
    }
    if let Some(nice) = args.redis_nice {
        if !(-20..=19).contains(&nice) {
            return Err("--redis-nice must be from -20 to 19".to_owned());
        }
        o.redis_nice = Some(nice);
    }
    if let Some(n) = args.handoffs {
        o.handoffs = n.max(1);
    }
    if let Some(n) = args.candidates {
        o.candidates = n.max(2);
    }
    if let Some(n) = args.terms {
        o.terms = n.max(100);
    }
    if let Some(n) = args.autocomplete_clients {
        o.autocomplete_clients = n.max(1);
    }
    if let Some(s) = args.autocomplete_seconds {
        o.autocomplete_window = secs(s, "--autocomplete-seconds")?;
    }
    for name in &args.autocomplete_cases {
        if !loadgen::autocomplete::Case::ALL
            .iter()
            .any(|c| c.name() == name)
        {
            return Err(format!("unknown autocomplete query kind {name:?}"));
        }
    }
    o.autocomplete_cases.clone_from(&args.autocomplete_cases);
    o.autocomplete_build_ranked = args.autocomplete_build_ranked;
    if let Some(n) = args.failovers {
        o.failovers = n.max(1);
    }
    o.builds = if args.baton.is_empty() {
        vec![BuildSpec {
            name: String::new(),
            path: testkit::baton_bin(),
        }]
    } else {
        args.baton
            .iter()
            .map(|b| match b.split_once('=') {
                Some((name, path)) => BuildSpec {
                    name: name.to_owned(),
                    path: PathBuf::from(path),
                },
                None => BuildSpec {
                    name: String::new(),
                    path: PathBuf::from(b),
                },
            })
            .collect()
    };
    if o.builds.len() > 1 && o.builds.iter().any(|b| b.name.is_empty()) {
        return Err("name every build when comparing several: --baton NAME=PATH".into());
    }
    for b in &o.builds {
        if !b.path.is_file() {
            return Err(format!("no baton binary at {}", b.path.display()));
        }
    }
    Ok(o)
}

/// How long the tasks of a stopped run get to drop what they started.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A signal that stops a run.
struct Stop {
    /// The signal's name, for the message.
    name: &'static str,
    /// The shell's code for a process ended by the signal (128 + its number).
    exit_code: u8,
}

/// Waits for SIGINT or SIGTERM. Without them, the processes a run started would outlive it.
async fn stop_signal() -> Stop {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        eprintln!("loadgen run: cannot watch SIGINT and SIGTERM; a stopped run leaves its servers");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => Stop { name: "SIGINT", exit_code: 130 },
        _ = terminate.recv() => Stop { name: "SIGTERM", exit_code: 143 },
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let options = match options(&args) {
                Ok(o) => o,
                Err(e) => {
                    eprintln!("loadgen run: {e}");
                    return ExitCode::from(2);
                }
            };
            let command = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime");
            let label = format!("loadgen {command}");
            let outcome = runtime.block_on(async {
                tokio::select! {
                    // The signals are watched before the run starts anything.
                    biased;
                    stop = stop_signal() => Err(stop),
                    run = loadgen::run(&options, &label) => Ok(run),
                }
            });
            let run = match outcome {
                Ok(run) => run,
                Err(stop) => {
                    // The run's future is dropped, and with the runtime every task it spawned:
                    // each Redis server and Baton they started is killed as it is dropped.
                    runtime.shutdown_timeout(STOP_TIMEOUT);
                    eprintln!(
                        "loadgen run: stopped by {}; the Redis servers and Batons it started are stopped",
                        stop.name
                    );
                    return ExitCode::from(stop.exit_code);
                }
            };
            let json = run.to_json();
            match &args.out {
                Some(path) => {
                    if let Err(e) = std::fs::write(path, json) {
                        eprintln!("loadgen run: writing {}: {e}", path.display());
                        return ExitCode::FAILURE;
                    }
                    eprintln!(
                        "loadgen: {} records written to {}",
                        run.records.len(),
                        path.display()
                    );
                }
                None => print!("{json}"),
            }
            ExitCode::SUCCESS
        }
        Command::Report { check, document } => {
            let dir = document
                .parent()
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("."));
            let text = match std::fs::read_to_string(&document) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("loadgen report: reading {}: {e}", document.display());
                    return ExitCode::FAILURE;
                }
            };
            let rendered = match report::render_document(&text, &dir) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("loadgen report: {}: {e}", document.display());
                    return ExitCode::FAILURE;
                }
            };
            if check {
                if rendered != text {
                    eprintln!(
                        "loadgen report: {} is not what its JSON files render to: run `cargo run -p loadgen -- report {}`",
                        document.display(),
                        document.display()
                    );
                    return ExitCode::FAILURE;
                }
                return ExitCode::SUCCESS;
            }
            if rendered != text
                && let Err(e) = std::fs::write(&document, rendered)
            {
                eprintln!("loadgen report: writing {}: {e}", document.display());
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Command::Terms { terms, out } => {
            let mut text = String::new();
            for t in loadgen::autocomplete::terms::generate(terms, loadgen::autocomplete::SEED) {
                text.push_str(&t.display);
                text.push('\t');
                text.push_str(&t.score.to_string());
                if let Some(p) = &t.payload {
                    text.push('\t');
                    text.push_str(&String::from_utf8_lossy(p));
                }
                text.push('\n');
            }
            let written = match &out {
                Some(path) => std::fs::write(path, text),
                None => std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes()),
            };
            if let Err(e) = written {
                eprintln!("loadgen terms: {e}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Command::Table { table, files } => {
            let mut runs = Vec::new();
            for f in &files {
                match report::load(f) {
                    Ok(r) => runs.push(r),
                    Err(e) => {
                        eprintln!("loadgen table: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            match report::table_of(&table, &runs) {
                Ok(md) => {
                    print!("{md}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("loadgen table: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
