//! `baton autocomplete load DICT FILE`: loads a file of terms into a dictionary through `Add`,
//! in batches, several in flight.
//!
//! The file has one term per line, UTF-8: `display`, or `display<TAB>score`, or
//! `display<TAB>score<TAB>payload` (the payload as the line's bytes, no tab in it); empty lines
//! are skipped, a UTF-8 byte order mark starting the file too; `-` reads standard input. A line
//! is checked as it is read, with the server's own checks; at a bad line the load stops with
//! `FILE:LINE: reason` and exit code 2, every line before it loaded and none after. Scores are
//! set, never incremented, so loading a file again (after a failure, or an edit) ends with the
//! same terms. Each batch carries a request id of its own: a batch that failed `UNAVAILABLE`, or
//! whose connection failed under it (Baton restarting), is sent again with the same id, a few
//! times, before the load gives up with exit code 69; Baton applies only what the earlier
//! attempts did not, and answers as one application would, so the counts stay right. A batch
//! holding a term that a batch still in flight holds waits for it: the last line naming a term
//! wins, whatever `--parallel`. A regular file truncated or replaced while it is read (checked
//! once its end is read) fails the load with exit code 70, saying how many terms were loaded.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read},
    path::PathBuf,
    time::{Duration, Instant},
};

use clap::{Args, Subcommand};
use futures::{StreamExt, stream::FuturesUnordered};
use serde_json::json;
use tonic::{Code, Status};

use super::{
    ClientArgs, Connection, EXIT_SOFTWARE, EXIT_UNAVAILABLE, EXIT_USAGE, Failure, connect,
    connection_broke, error_chain, oneshot::request,
};
use crate::{
    autocomplete::{MAX_ABS_SCORE, MAX_PAYLOAD_BYTES, MAX_TERMS, MAX_TEXT_BYTES, service},
    error::Error,
    proto::v1::{
        AutocompleteServiceAddRequest, AutocompleteServiceDescribeRequest, AutocompleteTerm,
        autocomplete_service_client::AutocompleteServiceClient,
    },
};

/// Most `Add` calls in flight.
pub const MAX_PARALLEL: usize = 16;
/// Times a batch that failed `UNAVAILABLE` (or lost its connection) is sent before the load
/// gives up.
const ATTEMPTS: u32 = 5;
/// The pause before the first resend; it doubles each time.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Most bytes of one line of the file (a display, a score and a payload, with some room).
const MAX_LINE_BYTES: usize = 4 * (MAX_TEXT_BYTES + MAX_PAYLOAD_BYTES);
/// The UTF-8 byte order mark, skipped at the start of the file.
const BOM: &[u8] = b"\xef\xbb\xbf";

/// `baton autocomplete ...`: dictionary tools.
#[derive(Debug, Subcommand)]
pub enum AutocompleteCommand {
    /// Load a file of terms into a dictionary, one per line: `display`, `display<TAB>score`
    /// or `display<TAB>score<TAB>payload` (`-` for standard input).
    Load(LoadArgs),
}

/// `baton autocomplete load`.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// How to reach Baton.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The dictionary.
    pub dictionary: String,
    /// The file of terms; `-` for standard input.
    pub file: PathBuf,
    /// Terms per `Add` call (1 to 1000).
    #[arg(long, default_value_t = MAX_TERMS)]
    pub batch: usize,
    /// `Add` calls in flight (1 to 16).
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `baton autocomplete ...`.
pub async fn run(command: AutocompleteCommand) -> Result<u8, Failure> {
    match command {
        AutocompleteCommand::Load(args) => load(args).await,
    }
}

/// Why the file's reading stopped before its end was read whole.
enum Stop {
    /// A line that cannot be loaded, or a read that failed: its `FILE:LINE: reason`.
    Bad(Failure),
    /// The file was truncated or replaced while it was read: what changed.
    Changed(String),
}

/// A regular file being loaded, as it was opened: checked once its end was read, since a file
/// truncated meanwhile ends early (its lines after that point never read, the load otherwise
/// successful) and one replaced is no longer the file named.
struct Watched {
    file: std::fs::File,
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Watched {
    /// Watches `file`, opened from `path`, when it is a regular file (a pipe or a device has no
    /// size to check).
    fn new(file: &std::fs::File, path: &std::path::Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = file.metadata().ok()?;
        if !meta.is_file() {
            return None;
        }
        Some(Self {
            file: file.try_clone().ok()?,
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// What changed, once `read` bytes were read to the file's end: it is shorter than what was
    /// read (truncated), or its path names another file (replaced, or removed).
    fn changed(&self, read: u64) -> Option<String> {
        use std::os::unix::fs::MetadataExt as _;
        let name = self.path.display();
        let size = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        if size < read {
            return Some(format!(
                "{name} changed while it was read: truncated to {size} bytes after {read} were read"
            ));
        }
        match std::fs::metadata(&self.path) {
            Ok(now) if (now.dev(), now.ino()) == (self.dev, self.ino) => None,
            Ok(_) => Some(format!(
                "{name} changed while it was read: replaced by another file after {read} bytes \
                 of the first were read"
            )),
            Err(e) => Some(format!(
                "{name} changed while it was read: {e} after {read} bytes were read"
            )),
        }
    }
}

/// A batch read from the file: its terms, the line of each, and the identity of each (its
/// display text in NFC, as Baton keys terms).
#[derive(Default)]
struct Batch {
    terms: Vec<AutocompleteTerm>,
    lines: Vec<usize>,
    ids: Vec<String>,
}

/// The terms of the batches in flight, each with how many of them hold it: a batch holding one
/// of them waits, so that the batches naming a term are applied in the file's order.
#[derive(Default)]
struct Busy(HashMap<String, usize>);

impl Busy {
    /// Whether `batch` holds a term of a batch in flight.
    fn blocks(&self, batch: &Batch) -> bool {
        batch.ids.iter().any(|id| self.0.contains_key(id))
    }

    /// `batch` is sent.
    fn hold(&mut self, batch: &Batch) {
        for id in &batch.ids {
            *self.0.entry(id.clone()).or_default() += 1;
        }
    }

    /// `batch` was answered.
    fn release(&mut self, batch: &Batch) {
        for id in &batch.ids {
            if let Some(n) = self.0.get_mut(id) {
                *n -= 1;
                if *n == 0 {
                    self.0.remove(id);
                }
            }
        }
    }
}

/// What the calls of a batch did.
#[derive(Default, Clone, Copy)]
struct Counts {
    added: u64,
    updated: u64,
    resent: u64,
}

/// What a load did.
#[derive(Default)]
struct Totals {
    added: u64,
    updated: u64,
    batches: u64,
    resent: u64,
}

/// A batch that failed: what it loaded still, and why it failed. `line` is the line Baton
/// refused, when it refused one.
struct Failed {
    counts: Counts,
    failure: Failure,
    line: Option<usize>,
}

async fn load(args: LoadArgs) -> Result<u8, Failure> {
    if !(1..=MAX_TERMS).contains(&args.batch) {
        return Err(Failure::new(
            EXIT_USAGE,
            format!("--batch must be 1 to {MAX_TERMS}"),
        ));
    }
    if !(1..=MAX_PARALLEL).contains(&args.parallel) {
        return Err(Failure::new(
            EXIT_USAGE,
            format!("--parallel must be 1 to {MAX_PARALLEL}"),
        ));
    }
    if let Err(e) = service::name("dictionary", &args.dictionary) {
        return Err(Failure::new(
            EXIT_USAGE,
            format!("the dictionary name {}", reason(e)),
        ));
    }
    let name = args.file.display().to_string();
    let mut watched = None;
    let input: Box<dyn Read + Send> = if name == "-" {
        Box::new(std::io::stdin())
    } else {
        let file = std::fs::File::open(&args.file)
            .map_err(|e| Failure::new(EXIT_USAGE, format!("{name}: {e}")))?;
        // A directory opens on Unix, and fails only at its first read.
        if file.metadata().is_ok_and(|m| m.is_dir()) {
            return Err(Failure::new(
                EXIT_USAGE,
                format!("{name}: a directory, not a file of terms"),
            ));
        }
        watched = Watched::new(&file, &args.file);
        Box::new(file)
    };
    let channel = connect(&args.client).await?;
    let started = Instant::now();
    // The file is read on a thread of its own, a few batches ahead of the calls. Not a task of
    // the runtime: a load that failed must not wait for a read that may never end (standard
    // input from a producer still running), and the process exits without it.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Batch, Stop>>(args.parallel);
    let batch_size = args.batch;
    let reader_name = name.clone();
    std::thread::Builder::new()
        .name("baton-load-reader".to_owned())
        .spawn(move || read(input, watched, &reader_name, batch_size, &tx))
        .map_err(|e| Failure::new(EXIT_SOFTWARE, format!("cannot start a thread: {e}")))?;
    let mut totals = Totals::default();
    let mut in_flight = FuturesUnordered::new();
    // The terms of the batches in flight (how many hold each), and a batch read that waits for
    // one of them because it holds one of their terms.
    let mut busy = Busy::default();
    let mut waiting: Option<Batch> = None;
    // The line the file is bad at (the load stops there, once the batches before it are
    // loaded), and the failure of a call (the load stops at once).
    let mut bad_line: Option<Stop> = None;
    let mut failed: Option<Failed> = None;
    // The first line and size of every batch loaded, to tell what loaded after a failed line.
    let mut loaded_batches: Vec<(usize, usize)> = Vec::new();
    let mut reading = true;
    loop {
        if failed.is_some() {
            waiting = None;
        }
        if let Some(batch) = waiting.take() {
            if busy.blocks(&batch) {
                waiting = Some(batch);
            } else {
                busy.hold(&batch);
                in_flight.push(send(channel.clone(), &args, &name, batch));
            }
        }
        if !reading && waiting.is_none() && in_flight.is_empty() {
            break;
        }
        tokio::select! {
            next = rx.recv(), if reading && waiting.is_none() && in_flight.len() < args.parallel => {
                match next {
                    Some(Ok(batch)) => waiting = Some(batch),
                    Some(Err(failure)) => {
                        bad_line = Some(failure);
                        reading = false;
                    }
                    None => reading = false,
                }
            }
            Some((batch, result)) = in_flight.next() => {
                busy.release(&batch);
                let counts = match result {
                    Ok(counts) => {
                        totals.batches += 1;
                        loaded_batches.push((batch.lines[0], batch.terms.len()));
                        counts
                    }
                    Err(f) => {
                        // Stop reading and wait for the calls in flight, then say what failed.
                        reading = false;
                        rx.close();
                        let counts = f.counts;
                        if failed.is_none() {
                            failed = Some(f);
                        }
                        counts
                    }
                };
                totals.added += counts.added;
                totals.updated += counts.updated;
                totals.resent += counts.resent;
            }
        }
    }
    drop(rx);
    let loaded = totals.added + totals.updated;
    if let Some(Failed { failure, line, .. }) = failed {
        let mut message = failure.message;
        if let Some(line) = line {
            // Baton refused a line the checks here let through: the batches sent before its
            // answer came may hold lines after it.
            let after: usize = loaded_batches
                .iter()
                .filter(|(first, _)| *first > line)
                .map(|(_, n)| n)
                .sum();
            message = format!(
                "{message}; every line before it was loaded into {:?}, and {after} lines after \
                 it, sent before Baton refused it",
                args.dictionary
            );
        } else {
            message = format!(
                "{message}; {loaded} terms were loaded into {:?} before it (loading the file \
                 again is safe)",
                args.dictionary
            );
        }
        return Err(Failure::new(failure.code, message));
    }
    if let Some(Stop::Changed(why)) = bad_line {
        return Err(Failure::new(
            EXIT_SOFTWARE,
            format!(
                "{why}; the {loaded} terms read were loaded into {:?}: load it again once it is \
                 written whole (write a new file and rename it over the old one)",
                args.dictionary
            ),
        ));
    }
    if let Some(Stop::Bad(failure)) = bad_line {
        return Err(Failure::new(
            failure.code,
            format!(
                "{}; every line before it was loaded into {:?} ({loaded} terms), none after",
                failure.message, args.dictionary
            ),
        ));
    }
    let term_count = AutocompleteServiceClient::new(channel)
        .describe(request(
            AutocompleteServiceDescribeRequest {
                dictionary: args.dictionary.clone(),
            },
            &args.client,
        ))
        .await
        .map_err(|s| Failure::from_status(&s, &args.client.addr))?
        .into_inner()
        .term_count;
    let secs = started.elapsed().as_secs_f64();
    if args.json {
        outln!(
            "{}",
            json!({
                "dictionary": args.dictionary,
                "loaded": loaded,
                "added": totals.added,
                "updated": totals.updated,
                "batches": totals.batches,
                "resent": totals.resent,
                "term_count": term_count,
                "seconds": (secs * 1000.0).round() / 1000.0,
            })
        );
    } else {
        outln!(
            "loaded {loaded} terms ({} added, {} updated) into {:?} in {secs:.1} s; it has {term_count} terms",
            totals.added,
            totals.updated,
            args.dictionary
        );
    }
    Ok(0)
}

/// Whether a failed call is worth sending again: `UNAVAILABLE`, or its connection failed (Baton
/// killed or restarting: the connection closed or reset under the call, or refused while it
/// starts), which tonic reports with the transport error (as `UNKNOWN` for a connection that
/// failed under the call).
fn transient(status: &Status) -> bool {
    status.code() == Code::Unavailable || connection_failed(status)
}

/// Whether the connection under a call failed, rather than Baton answering.
fn connection_failed(status: &Status) -> bool {
    if timed_out(status) {
        return false;
    }
    if connection_broke(status) {
        return true;
    }
    let transport = std::iter::successors(std::error::Error::source(status), |e| e.source())
        .any(|e| e.is::<tonic::transport::Error>() || e.is::<std::io::Error>());
    if transport {
        return true;
    }
    let message = status.message().to_ascii_lowercase();
    status.code() == Code::Unknown
        && [
            "transport error",
            "connection refused",
            "connection reset",
            "connection closed",
            "broken pipe",
        ]
        .iter()
        .any(|m| message.contains(m))
}

/// Whether the call's own deadline (`--timeout`) passed: Baton answers `UNAVAILABLE` before it
/// when it can, so this is a Baton that stopped answering, not sent again.
fn timed_out(status: &Status) -> bool {
    status.code() == Code::DeadlineExceeded
        || std::iter::successors(std::error::Error::source(status), |e| e.source())
            .any(|e| e.to_string().contains("Timeout expired"))
        || status.message().contains("Timeout expired")
}

/// What failed, for a call whose resends ran out: the connection to a Baton this load reached
/// before is no TLS question, so it is said plainly.
fn failure(status: &Status, addr: &str, timeout: Duration) -> Failure {
    if timed_out(status) {
        return Failure::new(
            EXIT_UNAVAILABLE,
            format!(
                "Baton at {addr} did not answer within --timeout {}",
                humantime::format_duration(timeout)
            ),
        );
    }
    if connection_failed(status) {
        let source = std::error::Error::source(status)
            .map(error_chain)
            .unwrap_or_default();
        let why = if source.is_empty() || status.message().contains(&source) {
            status.message().to_owned()
        } else if status.message().is_empty() || source.contains(status.message()) {
            source
        } else {
            format!("{}: {source}", status.message())
        };
        return Failure::new(
            EXIT_UNAVAILABLE,
            format!("the connection to Baton at {addr} failed: {why}"),
        );
    }
    Failure::from_status(status, addr)
}

/// The index of the entry an `INVALID_ARGUMENT` names (`terms[3].display: ...`), and the reason.
fn refused_entry(status: &Status) -> Option<(usize, &str)> {
    let rest = status.message().strip_prefix("terms[")?;
    let (index, rest) = rest.split_once(']')?;
    Some((index.parse().ok()?, rest.strip_prefix('.').unwrap_or(rest)))
}

/// Sends one batch, with a request id of its own, again with the same id after `UNAVAILABLE` or
/// a failed connection (a few times, with a growing pause): Baton applies only the entries no
/// earlier attempt applied, and answers as one application would. A line Baton refuses
/// (`INVALID_ARGUMENT` on `terms[i]`) fails as `FILE:LINE`, once the lines before it in the batch
/// are loaded. Returns the batch back, with what it did.
async fn send(
    channel: Connection,
    args: &LoadArgs,
    name: &str,
    batch: Batch,
) -> (Batch, Result<Counts, Failed>) {
    let mut api = AutocompleteServiceClient::new(channel);
    let result = add(&mut api, args, &batch.terms).await;
    let result = match result {
        Ok(counts) => Ok(counts),
        Err((status, resent)) => {
            if status.code() == Code::InvalidArgument
                && let Some((index, why)) = refused_entry(&status)
                && let Some(&line) = batch.lines.get(index)
            {
                let why = why.to_owned();
                let before = add(&mut api, args, &batch.terms[..index]).await;
                match before {
                    Ok(mut counts) => {
                        counts.resent += resent;
                        Err(Failed {
                            counts,
                            failure: Failure::new(EXIT_USAGE, format!("{name}:{line}: {why}")),
                            line: Some(line),
                        })
                    }
                    Err((status, _)) => Err(Failed {
                        counts: Counts::default(),
                        failure: batch_failure(&status, args, &batch, name),
                        line: None,
                    }),
                }
            } else {
                Err(Failed {
                    counts: Counts {
                        resent,
                        ..Counts::default()
                    },
                    failure: batch_failure(&status, args, &batch, name),
                    line: None,
                })
            }
        }
    };
    (batch, result)
}

fn batch_failure(status: &Status, args: &LoadArgs, batch: &Batch, name: &str) -> Failure {
    let failure = failure(status, &args.client.addr, args.client.timeout);
    Failure::new(
        failure.code,
        format!(
            "{name}: the batch from line {} ({} terms): {}",
            batch.lines.first().copied().unwrap_or_default(),
            batch.terms.len(),
            failure.message
        ),
    )
}

/// Adds `terms` under a request id of their own, sending them again with it as [`send`] says.
/// An empty slice adds nothing.
async fn add(
    api: &mut AutocompleteServiceClient<Connection>,
    args: &LoadArgs,
    terms: &[AutocompleteTerm],
) -> Result<Counts, (Status, u64)> {
    if terms.is_empty() {
        return Ok(Counts::default());
    }
    let request_id = format!("load-{}", uuid::Uuid::new_v4());
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        let call = AutocompleteServiceAddRequest {
            dictionary: args.dictionary.clone(),
            terms: terms.to_vec(),
            request_id: request_id.clone(),
        };
        match api.add(request(call, &args.client)).await {
            Ok(answer) => {
                let a = answer.into_inner();
                return Ok(Counts {
                    added: u64::from(a.added),
                    updated: u64::from(a.updated),
                    resent: u64::from(attempt - 1),
                });
            }
            Err(status) if transient(&status) && attempt < ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            Err(status) => return Err((status, u64::from(attempt - 1))),
        }
    }
}

/// Reads the file into batches sent to `tx`, until its end, a bad line (sent as the failure), or
/// the receiver closing.
fn read(
    input: Box<dyn Read + Send>,
    watched: Option<Watched>,
    name: &str,
    batch_size: usize,
    tx: &tokio::sync::mpsc::Sender<Result<Batch, Stop>>,
) {
    let mut lines = BufReader::new(input);
    let mut batch = Batch::default();
    let mut buf = Vec::new();
    let mut line_no = 0usize;
    let mut bytes_read = 0u64;
    loop {
        buf.clear();
        line_no += 1;
        let read = (&mut lines)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf);
        match read {
            Ok(0) => break,
            Ok(n) => bytes_read += n as u64,
            Err(e) => {
                let _ = tx.blocking_send(Err(Stop::Bad(Failure::new(
                    EXIT_SOFTWARE,
                    format!("{name}:{line_no}: {e}"),
                ))));
                return;
            }
        }
        if buf.len() > MAX_LINE_BYTES && buf.last() != Some(&b'\n') {
            let _ = tx.blocking_send(Err(Stop::Bad(bad(
                name,
                line_no,
                &format!("longer than {MAX_LINE_BYTES} bytes"),
            ))));
            return;
        }
        let mut line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        line = line.strip_suffix(b"\r").unwrap_or(line);
        if line_no == 1 {
            line = line.strip_prefix(BOM).unwrap_or(line);
        }
        if line.is_empty() {
            continue;
        }
        match parse(line) {
            Ok((term, id)) => {
                batch.terms.push(term);
                batch.lines.push(line_no);
                batch.ids.push(id);
            }
            Err(why) => {
                if !batch.terms.is_empty()
                    && tx.blocking_send(Ok(std::mem::take(&mut batch))).is_err()
                {
                    return;
                }
                let _ = tx.blocking_send(Err(Stop::Bad(bad(name, line_no, &why))));
                return;
            }
        }
        if batch.terms.len() == batch_size
            && tx.blocking_send(Ok(std::mem::take(&mut batch))).is_err()
        {
            return;
        }
    }
    if !batch.terms.is_empty() && tx.blocking_send(Ok(batch)).is_err() {
        return;
    }
    if let Some(changed) = watched.and_then(|w| w.changed(bytes_read)) {
        let _ = tx.blocking_send(Err(Stop::Changed(changed)));
    }
}

fn bad(name: &str, line: usize, why: &str) -> Failure {
    Failure::new(EXIT_USAGE, format!("{name}:{line}: {why}"))
}

/// The reason of a check that failed.
fn reason(e: Error) -> String {
    match e {
        Error::InvalidArgument { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// One line as a term and its identity, checked with the server's own checks.
fn parse(line: &[u8]) -> Result<(AutocompleteTerm, String), String> {
    let mut fields = line.splitn(3, |&b| b == b'\t');
    let display = fields.next().unwrap_or_default();
    let display =
        std::str::from_utf8(display).map_err(|_| "the display text is not UTF-8".to_owned())?;
    let text = service::display("display", display)
        .map_err(|e| format!("the display text {}", reason(e)))?;
    let score = match fields.next() {
        None => None,
        Some(s) => {
            let s = std::str::from_utf8(s).map_err(|_| "the score is not a number".to_owned())?;
            let score: f64 = s
                .trim()
                .parse()
                .map_err(|_| format!("the score {s:?} is not a number"))?;
            if !score.is_finite() || score.abs() > MAX_ABS_SCORE {
                return Err(format!("the score {s} is not within ±1e15"));
            }
            Some(score)
        }
    };
    let payload = service::payload("payload", fields.next().map(<[u8]>::to_vec))
        .map_err(|e| format!("the payload {}", reason(e)))?;
    Ok((
        AutocompleteTerm {
            display: display.to_owned(),
            score,
            increment: false,
            payload,
        },
        text.id,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line is a display, then optionally a score and a payload, each checked.
    #[test]
    fn lines_parse_with_the_servers_limits() {
        let (t, id) = parse(b"Anna Smith").unwrap();
        assert_eq!(
            (t.display.as_str(), t.score, t.payload, id.as_str()),
            ("Anna Smith", None, None, "Anna Smith")
        );
        let (t, _) = parse(b"Anna Smith\t12.5").unwrap();
        assert_eq!(t.score, Some(12.5));
        let (t, _) = parse("Zoë\t3\tid-7 x".as_bytes()).unwrap();
        assert_eq!(t.payload.as_deref(), Some(&b"id-7 x"[..]));
        assert!(!t.increment);
        // Canonically equivalent displays are one term.
        assert_eq!(parse("Zoe\u{308}".as_bytes()).unwrap().1, "Zoë");
        assert!(parse(b"   ").unwrap_err().contains("whitespace"));
        assert!(parse(b"\t1").unwrap_err().contains("empty"));
        assert!(parse(b"a\tnope").unwrap_err().contains("not a number"));
        assert!(parse(b"a\tinf").unwrap_err().contains("1e15"));
        assert!(parse(b"a\t2e15").unwrap_err().contains("1e15"));
        assert!(parse(b"\xff\xfe").unwrap_err().contains("UTF-8"));
        assert!(parse(b"a\0b").unwrap_err().contains("U+0000"));
        assert!(parse(&[b'x'; 257]).unwrap_err().contains("256"));
        let mut long = b"a\t1\t".to_vec();
        long.extend([b'p'; 1025]);
        assert!(parse(&long).unwrap_err().contains("1024"));
        // 255 bytes that grow past 1024 once normalized (U+FDFA is 18 characters in NFKC).
        let grows = "\u{FDFA}".repeat(85);
        assert!(
            parse(grows.as_bytes())
                .unwrap_err()
                .contains("grows past 1024 bytes when normalized")
        );
    }

    /// A batch naming a term of a batch in flight waits until that batch is answered; others
    /// go at once.
    #[test]
    fn batches_naming_a_term_in_flight_wait() {
        let batch = |lines: &[&str]| {
            let mut b = Batch::default();
            for (i, line) in lines.iter().enumerate() {
                let (term, id) = parse(line.as_bytes()).unwrap();
                b.terms.push(term);
                b.lines.push(i + 1);
                b.ids.push(id);
            }
            b
        };
        let first = batch(&["Zoë\t1", "Anna\t1"]);
        let second = batch(&["Bob\t2", "Zoe\u{308}\t2"]);
        let third = batch(&["Carl\t3"]);
        let mut busy = Busy::default();
        assert!(!busy.blocks(&first));
        busy.hold(&first);
        assert!(busy.blocks(&second));
        assert!(!busy.blocks(&third));
        busy.hold(&third);
        busy.release(&first);
        assert!(!busy.blocks(&second));
        busy.release(&third);
        assert!(busy.0.is_empty());
    }

    /// The entry an `INVALID_ARGUMENT` names is found in its message.
    #[test]
    fn refused_entries_are_found() {
        let status = Status::invalid_argument("terms[12].display: must not be empty");
        assert_eq!(
            refused_entry(&status),
            Some((12, "display: must not be empty"))
        );
        assert_eq!(
            refused_entry(&Status::invalid_argument("dictionary: must not be empty")),
            None
        );
    }

    /// A refused connection and a connection that closed under a call are sent again, as
    /// `UNAVAILABLE` is; other failures are not.
    #[test]
    fn transport_failures_are_transient() {
        assert!(transient(&Status::unavailable("")));
        assert!(transient(&Status::unknown(
            "transport error: operation was canceled: connection closed"
        )));
        assert!(!transient(&Status::unknown("something else")));
        assert!(!transient(&Status::invalid_argument("connection refused")));
        assert!(!transient(&Status::internal("x")));
    }
}
