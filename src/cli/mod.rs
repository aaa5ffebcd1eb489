//! The command-line client: `baton lock`, `baton semaphore` and `baton campaign` (run a command
//! while holding a lease), one-shot calls (`describe`, `leader`, `ratelimit check`, `complete`,
//! `health`), `observe`, and `autocomplete load` (a file of terms into a dictionary), all through
//! the generated gRPC clients.
//!
//! Exit codes, so that scripts can tell the outcomes apart (Baton's own codes are in the
//! sysexits range that programs rarely use):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | the call succeeded (`lock`/`semaphore`/`campaign`: the command exited 0) |
//! | 1 | a check said no: `ratelimit check` denied, `health` not SERVING, `leader`: nobody leads |
//! | 2 | bad usage: an invalid flag or a request Baton refused (`INVALID_ARGUMENT`) |
//! | 69 | Baton is not reachable, or answered `UNAVAILABLE` after the retries |
//! | 70 | any other error from Baton |
//! | 74 | the command succeeded, but its output could not be written (a full disk: standard output to `/dev/full`); a closed pipe (`\| head -1`) is not an error |
//! | 77 | Baton refused the credentials (`UNAUTHENTICATED`): no or a wrong API token, no or a refused client certificate |
//! | 75 | not acquired: the lock or permits stayed taken (not elected) for the whole `--wait` |
//! | 76 | the lease (leadership) was lost while the command ran; the command was stopped |
//! | N | `lock`/`semaphore`/`campaign`: the command's own exit code |
//! | 128+N | the command was killed by signal N; also `baton` itself stopped by signal N before the command started |

/// `println!` that does not panic on a failed write: a closed or full standard output (`baton
/// ... | head -1`) must not skip what `baton` still has to do (stop the command, release). A
/// failure other than a closed pipe is remembered, and turns the exit code 0 into
/// [`EXIT_IOERR`]: the output asked for was lost.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            crate::cli::stdout_failed(&e);
        }
    }};
}

/// `eprintln!` that ignores a failed write, for the same reason as [`outln`].
macro_rules! noteln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

mod autocomplete;
mod credentials;
mod demo;
mod election;
mod job;
mod leased;
mod oneshot;

use std::{path::PathBuf, process::ExitCode, time::Duration};

pub use autocomplete::{AutocompleteCommand, LoadArgs};
use clap::{Args, Subcommand, ValueEnum};
use hyper_util::rt::TokioIo;
use tonic::{Code, Status, transport::Endpoint};

pub use credentials::{Connection, Credentials};

/// The address used when neither `--addr` nor `BATON_ADDR` gives one.
pub const DEFAULT_ADDR: &str = "127.0.0.1:50051";

/// The client subcommands' exit codes, as `baton --help` lists them (the table above).
pub const EXIT_CODES_HELP: &str = "\
Exit codes of the client subcommands:
  0       success (lock/semaphore/campaign: the command exited 0)
  1       a check said no (ratelimit check denied, health not SERVING, leader: nobody leads)
  2       bad usage, or a request Baton refused (INVALID_ARGUMENT)
  69      Baton not reachable, or UNAVAILABLE after the retries
  70      any other error from Baton
  74      the output could not be written (a closed pipe is no error)
  75      not acquired (not elected) within --wait
  76      the lease (leadership) was lost while the command ran; the command was stopped
  77      Baton refused the credentials (UNAUTHENTICATED): give --api-token-file, or
          --tls-cert and --tls-key
  N       lock/semaphore/campaign: the command's own exit code (128+N: killed by signal N)";

/// Exit code: a check said no.
pub const EXIT_NO: u8 = 1;
/// Exit code: bad usage, or a request Baton refused as invalid.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: Baton is not reachable or unavailable.
pub const EXIT_UNAVAILABLE: u8 = 69;
/// Exit code: any other error from Baton.
pub const EXIT_SOFTWARE: u8 = 70;
/// Exit code: the command succeeded, but its standard output could not be written.
pub const EXIT_IOERR: u8 = 74;
/// Exit code: Baton refused the credentials (`UNAUTHENTICATED`).
pub const EXIT_UNAUTHENTICATED: u8 = 77;
/// Exit code: not acquired within the wait.
pub const EXIT_NOT_ACQUIRED: u8 = 75;
/// Exit code: the lease was lost while the command ran.
pub const EXIT_LEASE_LOST: u8 = 76;

/// Longest duration a client flag takes (`--wait`, `--timeout`, `--grace`, `--ttl`...): longer
/// ones would overflow the clock's arithmetic; Baton bounds its own much lower.
pub const MAX_DURATION_ARG: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Whether a call failed because its connection to Baton broke under it (Baton killed, a
/// connection reset): tonic reports that as `Unknown` with the HTTP/2 error, and it is as
/// transient as `UNAVAILABLE` (nothing was done, or a stream's lease is released with it).
pub fn connection_broke(status: &Status) -> bool {
    status.code() == Code::Unknown
        && (status.message().starts_with("h2 protocol error")
            || std::error::Error::source(status).is_some_and(|e| e.is::<hyper::Error>()))
}

/// Parses a duration flag like `300ms` or `10s`, at most [`MAX_DURATION_ARG`] (a usage error
/// past it, as any bad value). The flags take values starting with `-` (`allow_hyphen_values`),
/// so that `--ttl -1s` is refused here as negative, not taken for a flag.
fn duration_arg(raw: &str) -> Result<Duration, String> {
    if let Some(rest) = raw.trim_start().strip_prefix('-') {
        return Err(
            if rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
                format!("{raw}: durations cannot be negative")
            } else {
                // `--ttl --wait 5s`: the value was left out.
                format!("{raw:?} is not a duration (e.g. 10s)")
            },
        );
    }
    let d = humantime::parse_duration(raw).map_err(|e| e.to_string())?;
    if d > MAX_DURATION_ARG {
        return Err(format!(
            "{raw} is longer than {}",
            humantime::format_duration(MAX_DURATION_ARG)
        ));
    }
    Ok(d)
}

/// A call's deadline: a duration as [`duration_arg`] takes it, more than zero (a call with no
/// time at all could only fail).
fn timeout_arg(raw: &str) -> Result<Duration, String> {
    let d = duration_arg(raw)?;
    if d.is_zero() {
        return Err(format!("{raw} leaves no time for a call: give more than 0"));
    }
    Ok(d)
}

/// How to reach Baton, shared by every client subcommand.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Baton's address: `host:port`, `https://host:port` (TLS), or a Unix socket as
    /// `unix:///path` (or just `/path`).
    #[arg(long, env = "BATON_ADDR", default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// Deadline of each call to Baton (e.g. 5s); waits for a lock come on top. `observe`: to
    /// open the stream and get the first state. `lock`, `semaphore` and `campaign` retry a call
    /// Baton answers UNAVAILABLE, or not at all, before the lease is granted: 4 attempts (more
    /// while --wait lasts), each with this deadline, so they give up after about 4 times it.
    #[arg(long, default_value = "10s", value_parser = timeout_arg, allow_hyphen_values = true)]
    pub timeout: Duration,
    /// File holding Baton's API token (its first non-empty line), sent on every call as
    /// `authorization: Bearer <token>`; read again for each call, so a rotated token is used.
    /// Empty: none.
    #[arg(long, env = "BATON_API_TOKEN_FILE", value_name = "FILE")]
    pub api_token_file: Option<String>,
    /// CA bundle (PEM) Baton's certificate must chain to; connects with TLS. TLS is also used
    /// for an `https://` address, checked against the public roots without this flag.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate chain (PEM) for mutual TLS, with --tls-key; connects with TLS.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// The name Baton's certificate must carry, and the TLS server name sent (SNI), in place of
    /// the address's host; connects with TLS.
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
}

/// `baton lock`: run a command while holding a lock.
#[derive(Debug, Args)]
pub struct LockArgs {
    /// How to reach Baton.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The lock's name.
    pub name: String,
    /// The lease's ttl, renewed every third of it while the command runs: how soon the lock
    /// frees itself should this `baton` and its Baton both die (100ms to 1h).
    #[arg(long, default_value = "10s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub ttl: Duration,
    /// How long to wait for the lock; 0 tries once. Without it, waits as long as it takes.
    #[arg(long, value_parser = duration_arg, allow_hyphen_values = true)]
    pub wait: Option<Duration>,
    /// Take the lock shared (readers), instead of exclusive.
    #[arg(long)]
    pub shared: bool,
    /// Wait in arrival order (FIFO).
    #[arg(long)]
    pub fair: bool,
    /// The owner shown by `describe` (unique per holder: it re-enters the lease).
    #[arg(long, default_value = "")]
    pub owner: String,
    /// Time the command and the processes it started (its process group) get to exit after
    /// SIGTERM (lease lost) or a signal passed on to them, before SIGKILL to the group.
    #[arg(long, default_value = "10s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub grace: Duration,
    /// The command and its arguments, after `--`.
    #[arg(required = true, last = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// `baton semaphore`: run a command while holding permits of a semaphore.
#[derive(Debug, Args)]
pub struct SemaphoreArgs {
    /// How to reach Baton.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The semaphore's name.
    pub name: String,
    /// The most permits in use at once.
    #[arg(long)]
    pub limit: u32,
    /// Permits this command takes.
    #[arg(long, default_value_t = 1)]
    pub permits: u32,
    /// The lease's ttl, as for `baton lock`.
    #[arg(long, default_value = "10s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub ttl: Duration,
    /// How long to wait for the permits; 0 tries once. Without it, as long as it takes.
    #[arg(long, value_parser = duration_arg, allow_hyphen_values = true)]
    pub wait: Option<Duration>,
    /// Wait in arrival order (FIFO).
    #[arg(long)]
    pub fair: bool,
    /// A label shown by `describe`.
    #[arg(long, default_value = "")]
    pub owner: String,
    /// Time the command's process group gets to exit after SIGTERM before SIGKILL, as for
    /// `baton lock`.
    #[arg(long, default_value = "10s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub grace: Duration,
    /// The command and its arguments, after `--`.
    #[arg(required = true, last = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// `baton campaign`: run a command while leading an election.
#[derive(Debug, Args)]
pub struct CampaignArgs {
    /// How to reach Baton.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The election's name.
    pub name: String,
    /// What `baton leader` and observers show of this candidate once it leads (an address, a
    /// pod's name; up to 4096 bytes).
    #[arg(long, default_value = "")]
    pub value: String,
    /// The leadership's ttl, renewed every third of it while the command runs: how soon another
    /// candidate takes over should this `baton` and its Baton both die (100ms to 1h).
    #[arg(long, default_value = "10s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub ttl: Duration,
    /// How long to wait to be elected; without it, as long as it takes.
    #[arg(long, value_parser = duration_arg, allow_hyphen_values = true)]
    pub wait: Option<Duration>,
    /// Time the command's process group gets to exit after SIGTERM before SIGKILL, as for
    /// `baton lock`.
    #[arg(long, default_value = "10s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub grace: Duration,
    /// The command and its arguments, after `--`.
    #[arg(required = true, last = true, num_args = 1..)]
    pub command: Vec<String>,
}

/// `baton leader`: who leads an election; exits 0 when someone does, 1 when nobody does.
#[derive(Debug, Args)]
pub struct LeaderArgs {
    /// How to reach Baton.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The election's name.
    pub name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `baton observe`: print an election's state, then every change, one line each.
#[derive(Debug, Args)]
pub struct ObserveArgs {
    /// How to reach Baton.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The election's name.
    pub name: String,
    /// Exit 0 after printing this many states (the first is the current one); without it, runs
    /// until interrupted, the stream fails, or standard output's reader is gone (exit 0: `|
    /// head -1` ends it at once).
    #[arg(long)]
    pub count: Option<u64>,
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What `baton describe` describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DescribeKind {
    /// A lock.
    Lock,
    /// A semaphore.
    Semaphore,
}

/// `baton describe`: a lock's or semaphore's current state.
#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// How to reach Baton.
    #[command(flatten)]
    pub client: ClientArgs,
    /// `lock` or `semaphore`.
    pub kind: DescribeKind,
    /// Its name.
    pub name: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `baton ratelimit`: rate limit calls.
#[derive(Debug, Subcommand)]
pub enum RateLimitCommand {
    /// Count one action (or `--cost`) against a limit; exits 0 when allowed, 1 when denied.
    Check(RateLimitCheckArgs),
}

/// A rate limit algorithm on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Algorithm {
    /// Generic cell rate algorithm (smooth, with a burst).
    Gcra,
    /// Fixed window (INCR + EXPIRE).
    FixedWindow,
    /// Exact sliding window.
    SlidingWindow,
}

/// `baton ratelimit check`.
#[derive(Debug, Args)]
pub struct RateLimitCheckArgs {
    /// How to reach Baton.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The limited key.
    pub key: String,
    /// Units allowed per period.
    #[arg(long)]
    pub limit: u64,
    /// The period the limit applies to (e.g. 1m).
    #[arg(long, value_parser = duration_arg, allow_hyphen_values = true)]
    pub period: Duration,
    /// Units this action spends; 0 peeks.
    #[arg(long)]
    pub cost: Option<u64>,
    /// The algorithm.
    #[arg(long, value_enum, default_value = "gcra")]
    pub algorithm: Algorithm,
    /// GCRA only: how many units may be spent at once (default: the limit).
    #[arg(long, default_value_t = 0)]
    pub burst: u64,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// How `baton complete` matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MatchMode {
    /// The term starts with the query.
    Prefix,
    /// A word of the term starts with the query.
    WordPrefix,
    /// The term ends with the query.
    Suffix,
    /// The term contains the query.
    Contains,
    /// Exact, then prefix, word-prefix and substring matches.
    Automatic,
    /// Prefixes within 1 edit of the query (from 3 characters) or 2 (from 7).
    Fuzzy,
}

/// `baton complete`: complete a query from a dictionary.
#[derive(Debug, Args)]
pub struct CompleteArgs {
    /// How to reach Baton.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The dictionary.
    pub dictionary: String,
    /// What the user typed.
    pub query: String,
    /// How the query must match.
    #[arg(long, value_enum, default_value = "prefix")]
    pub mode: MatchMode,
    /// Most results (1 to 1000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
    /// Sort by score (highest first) instead of lexicographically.
    #[arg(long)]
    pub by_score: bool,
    /// `--mode fuzzy` only: the most edits a match may need (0 to 2; default: what the query's
    /// length allows).
    #[arg(long)]
    pub max_edits: Option<u32>,
    /// The page after an earlier answer's `next_page_token` (printed with `--json`, or on
    /// standard error).
    #[arg(long, default_value = "", allow_hyphen_values = true)]
    pub page_token: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `baton health`: ask Baton whether it serves; exits 0 when SERVING, 1 otherwise.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// How to reach Baton.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The health service to ask about: `readiness` (Redis answers), `liveness`, or a service
    /// name such as `baton.v1.LockService`.
    #[arg(long, default_value = "readiness")]
    pub service: String,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `baton hold`: take a lock in turns with other holders, saying each step (the Helm chart's demo
/// application).
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// How to reach Baton.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The lock to take.
    #[arg(long, default_value = "demo")]
    pub name: String,
    /// Who holds it, as `Describe` shows it: unique per peer, since peers with one owner would
    /// re-enter each other's lease (a pod's name by default; without `HOSTNAME`, this host's
    /// name and the process id).
    #[arg(long, env = "HOSTNAME", default_value = "")]
    pub owner: String,
    /// The lease's ttl, renewed while the lock is held (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub ttl: Duration,
    /// How long each turn holds the lock (e.g. 5s).
    #[arg(long, default_value = "5s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub hold_for: Duration,
    /// Pause between releasing the lock and asking for it again (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = duration_arg, allow_hyphen_values = true)]
    pub pause: Duration,
}

/// Runs `baton hold` until a signal (ending the process closes the stream, which releases the
/// lock), standard output's reader is gone (exit 0), or a failure.
pub fn hold(args: HoldArgs) -> ExitCode {
    block_on(async move {
        let interrupted = |e: std::io::Error| Failure::new(EXIT_SOFTWARE, format!("signals: {e}"));
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(interrupted)?;
        tokio::select! {
            r = demo::hold(args) => r,
            // Nobody reads the steps any more (`| head -1`): stop, which releases the lock.
            () = stdout_gone() => Ok(0),
            _ = terminate.recv() => Ok(0),
            r = tokio::signal::ctrl_c() => r.map(|()| 0).map_err(interrupted),
        }
    })
}

/// Runs `baton lock`.
pub fn lock(args: LockArgs) -> ExitCode {
    block_on(leased::lock(args))
}

/// Runs `baton semaphore`.
pub fn semaphore(args: SemaphoreArgs) -> ExitCode {
    block_on(leased::semaphore(args))
}

/// Runs `baton campaign`.
pub fn campaign(args: CampaignArgs) -> ExitCode {
    block_on(leased::campaign(args))
}

/// Runs `baton leader`.
pub fn leader(args: LeaderArgs) -> ExitCode {
    block_on(election::leader(args))
}

/// Runs `baton observe`.
pub fn observe(args: ObserveArgs) -> ExitCode {
    block_on(election::observe(args))
}

/// Runs `baton describe`.
pub fn describe(args: DescribeArgs) -> ExitCode {
    block_on(oneshot::describe(args))
}

/// Runs `baton ratelimit ...`.
pub fn ratelimit(command: RateLimitCommand) -> ExitCode {
    match command {
        RateLimitCommand::Check(args) => block_on(oneshot::ratelimit_check(args)),
    }
}

/// Runs `baton complete`.
pub fn complete(args: CompleteArgs) -> ExitCode {
    block_on(oneshot::complete(args))
}

/// Runs `baton autocomplete ...`.
pub fn autocomplete(command: AutocompleteCommand) -> ExitCode {
    block_on(autocomplete::run(command))
}

/// Runs `baton health`.
pub fn health(args: HealthArgs) -> ExitCode {
    block_on(oneshot::health(args))
}

/// Why a write to standard output failed, other than a closed pipe: the first such failure.
static STDOUT_FAILURE: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Whether a write to standard output failed, a closed pipe included: a subcommand that prints as
/// it goes (`observe`, `hold`) stops then, since nothing it prints can be read any more.
static STDOUT_LOST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Remembers a failed write to standard output. A closed pipe (`| head -1`: the reader has what
/// it wanted) is no failure of the exit code, but, as any failure, ends a subcommand that prints
/// as it goes.
pub(crate) fn stdout_failed(e: &std::io::Error) {
    STDOUT_LOST.store(true, std::sync::atomic::Ordering::Relaxed);
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        return;
    }
    if let Ok(mut failure) = STDOUT_FAILURE.lock() {
        failure.get_or_insert_with(|| e.to_string());
    }
}

/// Whether a write to standard output failed ([`stdout_failed`]), a closed pipe included.
pub(crate) fn stdout_lost() -> bool {
    STDOUT_LOST.load(std::sync::atomic::Ordering::Relaxed)
}

/// Resolves once standard output's reader is gone, without writing to it: a pipe whose reader
/// closed (poll reports `POLLERR` for its write end) or a terminal or socket hung up (`POLLHUP`),
/// as `tail -f` notices it. A subcommand that prints only on a change (`observe`) would otherwise
/// run on, unread, until the next change, or for ever. Standard output that cannot be watched
/// (a regular file, `/dev/null`) never resolves.
pub(crate) async fn stdout_gone() {
    use tokio::io::{Interest, unix::AsyncFd};
    // Errors and hang-ups are reported whatever the interest; the write end of a pipe never
    // reports input. The descriptor is not made non-blocking and nothing is read from it. A
    // failed registration (a regular file) watches nothing.
    let interest = Interest::ERROR | Interest::READABLE;
    // SAFETY: descriptor 1 stays open and names the same file description while the client runs
    // (nothing in the client closes or replaces it), which outlives this registration.
    let registered = unsafe { AsyncFd::register_with_interest(std::io::stdout(), interest) };
    let Ok(stdout) = registered else {
        return std::future::pending().await;
    };
    loop {
        let Ok(mut guard) = stdout.ready(interest).await else {
            return std::future::pending().await;
        };
        let ready = guard.ready();
        if ready.is_error() || ready.is_read_closed() || ready.is_write_closed() {
            return;
        }
        // Input on a terminal that is also standard output: nothing to do with it.
        guard.clear_ready();
    }
}

fn block_on(run: impl Future<Output = Result<u8, Failure>>) -> ExitCode {
    // A client needs no more than a thread: it waits on one stream and one child.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            noteln!("baton: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_SOFTWARE);
        }
    };
    match runtime.block_on(run) {
        Ok(code) => {
            if let Err(e) = std::io::Write::flush(&mut std::io::stdout()) {
                stdout_failed(&e);
            }
            let failure = STDOUT_FAILURE.lock().ok().and_then(|f| f.clone());
            match failure {
                Some(e) if code == 0 => {
                    noteln!("baton: cannot write standard output: {e}");
                    ExitCode::from(EXIT_IOERR)
                }
                _ => ExitCode::from(code),
            }
        }
        Err(failure) => {
            noteln!("baton: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}

/// Why a command failed: the message for stderr and the exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// What to tell the user.
    pub message: String,
}

impl Failure {
    /// A failure with `code` and `message`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The failure for a gRPC error of a call to Baton at `addr`.
    pub fn from_status(status: &Status, addr: &str) -> Self {
        if connection_broke(status) {
            return Self::new(
                EXIT_UNAVAILABLE,
                format!(
                    "the connection to Baton at {addr} broke: {}",
                    status.message()
                ),
            );
        }
        // The connection failed under the call (Baton gone, or a TLS listener spoken to in the
        // clear): tonic reports it as Unknown with the transport error as its source.
        if let Some(transport) = std::error::Error::source(status)
            .and_then(|e| e.downcast_ref::<tonic::transport::Error>())
        {
            return Self::new(
                EXIT_UNAVAILABLE,
                unreachable(
                    addr,
                    &format!(
                        "{} (if it serves TLS, give --tls-ca or an https:// address)",
                        error_chain(transport)
                    ),
                ),
            );
        }
        let code = match status.code() {
            Code::InvalidArgument => EXIT_USAGE,
            Code::Unavailable => EXIT_UNAVAILABLE,
            Code::Unauthenticated => EXIT_UNAUTHENTICATED,
            _ => EXIT_SOFTWARE,
        };
        let message = if status.code() == Code::Unavailable && status.message().is_empty() {
            format!("Baton at {addr} is unavailable")
        } else if status.code() == Code::Unauthenticated {
            format!(
                "Baton at {addr} refused the credentials (Unauthenticated): {} (give its API \
                 token with --api-token-file or BATON_API_TOKEN_FILE, a client certificate with \
                 --tls-cert and --tls-key)",
                status.message()
            )
        } else {
            format!("{:?}: {}", status.code(), status.message())
        };
        Self::new(code, message)
    }
}

/// Where Baton listens, as `--addr` gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A TCP `host:port`.
    Tcp(String),
    /// A TCP `host:port` given as `https://host:port`: TLS.
    Https(String),
    /// A Unix socket path.
    Unix(PathBuf),
}

impl Address {
    /// Parses `unix:///path`, `unix:/path`, `/path`, `http://host:port`, `https://host:port`
    /// or `host:port`.
    pub fn parse(addr: &str) -> Result<Self, String> {
        let addr = addr.trim();
        let path = addr
            .strip_prefix("unix://")
            .or_else(|| addr.strip_prefix("unix:"))
            .or_else(|| addr.starts_with('/').then_some(addr));
        if let Some(path) = path {
            if !path.starts_with('/') {
                return Err(format!(
                    "--addr / BATON_ADDR: {addr:?}: a Unix socket path must be absolute"
                ));
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        let (hostport, tls) = match addr.strip_prefix("https://") {
            Some(hostport) => (hostport, true),
            None => (addr.strip_prefix("http://").unwrap_or(addr), false),
        };
        if hostport.is_empty() || !hostport.contains(':') {
            return Err(format!(
                "--addr / BATON_ADDR: {addr:?} is not host:port, https://host:port or \
                 unix:///path"
            ));
        }
        Ok(if tls {
            Self::Https(hostport.to_owned())
        } else {
            Self::Tcp(hostport.to_owned())
        })
    }
}

/// Opens a channel to Baton that carries the API token of `--api-token-file` (if given), over
/// TLS when asked, failing with [`EXIT_UNAVAILABLE`] and a clear message when it cannot be
/// reached, or [`EXIT_USAGE`] for an address, a TLS option or a file that makes no sense.
pub async fn connect(args: &ClientArgs) -> Result<Connection, Failure> {
    let address = Address::parse(&args.addr).map_err(|e| Failure::new(EXIT_USAGE, e))?;
    let credentials = Credentials::new(args).map_err(|e| Failure::new(EXIT_USAGE, e))?;
    let unreachable =
        |e: &dyn std::fmt::Display| Failure::new(EXIT_UNAVAILABLE, unreachable(&args.addr, e));
    let connect_timeout = args.timeout.min(Duration::from_secs(5));
    let channel = match address {
        Address::Tcp(ref hostport) | Address::Https(ref hostport) => {
            let tls = matches!(address, Address::Https(_)) || credentials::tls_asked(args);
            let scheme = if tls { "https" } else { "http" };
            let mut endpoint = Endpoint::from_shared(format!("{scheme}://{hostport}"))
                .map_err(|e| Failure::new(EXIT_USAGE, format!("--addr {hostport:?}: {e}")))?;
            if tls {
                let config =
                    credentials::tls_config(args).map_err(|e| Failure::new(EXIT_USAGE, e))?;
                endpoint = endpoint
                    .tls_config(config)
                    .map_err(|e| Failure::new(EXIT_USAGE, format!("TLS: {}", error_chain(&e))))?;
            }
            keepalive(endpoint)
                .connect_timeout(connect_timeout)
                .tcp_nodelay(true)
                .connect()
                .await
                .map_err(|e| unreachable(&error_chain(&e)))
        }
        Address::Unix(_) if credentials::tls_asked(args) => Err(Failure::new(
            EXIT_USAGE,
            format!(
                "--tls-ca / --tls-cert / --tls-key / --tls-server-name need a TCP address \
                 (host:port or https://host:port), not the Unix socket {}: Baton serves its \
                 socket in the clear, confined by the file's permissions",
                args.addr
            ),
        )),
        Address::Unix(path) => {
            // The URI only names the `:authority` (a valid one); every connection goes to the
            // socket.
            let endpoint = keepalive(Endpoint::from_static("http://localhost"))
                .connect_timeout(connect_timeout);
            endpoint
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await
                .map_err(|e| unreachable(&error_chain(&e)))
        }
    }?;
    Ok(tonic::service::interceptor::InterceptedService::new(
        channel,
        credentials,
    ))
}

/// How often a connection is pinged, and how long the answer may take:
/// a stream (`baton observe`, a lease's) through a Baton that stopped answering (frozen, its
/// host gone) ends as a broken connection after at most the sum, instead of waiting forever.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// `endpoint` pinging as [`KEEPALIVE_INTERVAL`] says, idle or not: with pings only while calls
/// are under way (hyper's `keep_alive_while_idle(false)`), `baton observe` through a frozen Baton
/// was never pinged and waited forever.
fn keepalive(endpoint: Endpoint) -> Endpoint {
    endpoint
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
}

fn unreachable(addr: &str, e: &dyn std::fmt::Display) -> String {
    format!("cannot reach Baton at {addr}: {e} (is it running? set --addr or BATON_ADDR)")
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        // Layers often repeat their cause's words; say each once.
        let said = cause.to_string();
        if !out.contains(&said) {
            out.push_str(": ");
            out.push_str(&said);
        }
        source = cause.source();
    }
    out
}

/// A protobuf Duration from a std one, rounded up to the millisecond as Baton counts.
fn proto_duration(d: Duration) -> prost_types::Duration {
    let ms = d.as_nanos().div_ceil(1_000_000);
    prost_types::Duration {
        seconds: i64::try_from(ms / 1000).unwrap_or(i64::MAX),
        nanos: i32::try_from(ms % 1000).unwrap_or(0) * 1_000_000,
    }
}

/// A protobuf Duration as a std one (negative ones as zero).
fn std_duration(d: Option<&prost_types::Duration>) -> Option<Duration> {
    d.map(|d| {
        Duration::from_secs(u64::try_from(d.seconds).unwrap_or(0))
            + Duration::from_nanos(u64::try_from(d.nanos).unwrap_or(0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every address form `BATON_ADDR` documents parses, and nonsense is refused.
    #[test]
    fn addresses_parse() {
        let unix = |p: &str| Ok(Address::Unix(PathBuf::from(p)));
        assert_eq!(
            Address::parse("unix:///run/baton.sock"),
            unix("/run/baton.sock")
        );
        assert_eq!(
            Address::parse("unix:/run/baton.sock"),
            unix("/run/baton.sock")
        );
        assert_eq!(Address::parse("/run/baton.sock"), unix("/run/baton.sock"));
        assert_eq!(
            Address::parse("127.0.0.1:50051"),
            Ok(Address::Tcp("127.0.0.1:50051".into()))
        );
        assert_eq!(
            Address::parse("http://localhost:50051"),
            Ok(Address::Tcp("localhost:50051".into()))
        );
        assert_eq!(
            Address::parse("https://baton.example:443"),
            Ok(Address::Https("baton.example:443".into()))
        );
        assert!(Address::parse("unix:relative.sock").is_err());
        assert!(Address::parse("localhost").is_err());
        assert!(Address::parse("").is_err());
    }

    /// Durations go to Baton rounded up to the millisecond, as it rounds them.
    #[test]
    fn durations_round_up_to_the_millisecond() {
        let d = proto_duration(Duration::from_micros(1_500_001));
        assert_eq!((d.seconds, d.nanos), (1, 501_000_000));
        assert_eq!(std_duration(Some(&d)), Some(Duration::from_millis(1501)));
    }
}
