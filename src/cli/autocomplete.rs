//! `baton autocomplete load DICT FILE`: loads a file of terms into a dictionary through `Add`,
//! in batches, several in flight.
//!
//! The file has one term per line, UTF-8: `display`, or `display<TAB>score`, or
//! `display<TAB>score<TAB>payload` (the payload as the line's bytes, no tab in it); empty lines
//! are skipped; `-` reads standard input. A line is checked as it is read, with the limits the
//! server applies; at a bad line the load stops with `FILE:LINE: reason` and exit code 2, the
//! batches before it loaded. Scores are set, never incremented, so loading a file again (after a
//! failure, or an edit) ends with the same terms: a batch that failed `UNAVAILABLE` is sent again
//! as it is, a few times, before the load gives up with exit code 69.

use std::{
    io::{BufRead, BufReader, Read},
    path::PathBuf,
    time::{Duration, Instant},
};

use clap::{Args, Subcommand};
use futures::{StreamExt, stream::FuturesUnordered};
use serde_json::json;
use tonic::Code;

use super::{
    ClientArgs, Connection, EXIT_SOFTWARE, EXIT_USAGE, Failure, connect, oneshot::request,
};
use crate::{
    autocomplete::{MAX_ABS_SCORE, MAX_PAYLOAD_BYTES, MAX_TERMS, MAX_TEXT_BYTES, Text},
    proto::v1::{
        AutocompleteServiceAddRequest, AutocompleteServiceDescribeRequest, AutocompleteTerm,
        autocomplete_service_client::AutocompleteServiceClient,
    },
};

/// Most `Add` calls in flight.
pub const MAX_PARALLEL: usize = 16;
/// Times a batch that failed `UNAVAILABLE` is sent before the load gives up.
const ATTEMPTS: u32 = 5;
/// The pause before the first resend; it doubles each time.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Most bytes of one line of the file (a display, a score and a payload, with some room).
const MAX_LINE_BYTES: usize = 4 * (MAX_TEXT_BYTES + MAX_PAYLOAD_BYTES);

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

/// A batch read from the file: its terms and the line of its first term.
struct Batch {
    terms: Vec<AutocompleteTerm>,
    first_line: usize,
}

/// What a load did.
#[derive(Default)]
struct Totals {
    added: u64,
    updated: u64,
    batches: u64,
    resent: u64,
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
    let name = args.file.display().to_string();
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
        Box::new(file)
    };
    let channel = connect(&args.client).await?;
    let started = Instant::now();
    // The file is read on a thread of its own, a few batches ahead of the calls.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Batch, Failure>>(args.parallel);
    let batch_size = args.batch;
    let reader_name = name.clone();
    let reader = tokio::task::spawn_blocking(move || read(input, &reader_name, batch_size, &tx));
    let mut totals = Totals::default();
    let mut in_flight = FuturesUnordered::new();
    let mut stopped: Option<Failure> = None;
    let mut reading = true;
    while reading || !in_flight.is_empty() {
        tokio::select! {
            next = rx.recv(), if reading && in_flight.len() < args.parallel => match next {
                Some(Ok(batch)) => in_flight.push(send(channel.clone(), &args, batch)),
                Some(Err(failure)) => {
                    stopped = Some(failure);
                    reading = false;
                }
                None => reading = false,
            },
            Some(done) = in_flight.next() => match done {
                Ok((added, updated, resent)) => {
                    totals.added += u64::from(added);
                    totals.updated += u64::from(updated);
                    totals.batches += 1;
                    totals.resent += u64::from(resent);
                }
                Err(failure) => {
                    // Stop reading and wait for the calls in flight, then say what failed.
                    reading = false;
                    rx.close();
                    stopped.get_or_insert(failure);
                }
            },
        }
    }
    drop(rx);
    let _ = reader.await;
    let loaded = totals.added + totals.updated;
    if let Some(mut failure) = stopped {
        failure.message = format!(
            "{}; {loaded} terms were loaded into {:?} before it (loading the file again is safe)",
            failure.message, args.dictionary
        );
        return Err(failure);
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

/// Sends one batch, again after `UNAVAILABLE` (a few times, with a growing pause): its scores are
/// set, not added, so a batch applied in part or whole by a failed call ends the same. Returns the
/// terms added and updated, and how many times it was sent again.
async fn send(
    channel: Connection,
    args: &LoadArgs,
    batch: Batch,
) -> Result<(u32, u32, u32), Failure> {
    let mut api = AutocompleteServiceClient::new(channel);
    let mut backoff = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        let call = AutocompleteServiceAddRequest {
            dictionary: args.dictionary.clone(),
            terms: batch.terms.clone(),
            request_id: String::new(),
        };
        match api.add(request(call, &args.client)).await {
            Ok(answer) => {
                let a = answer.into_inner();
                return Ok((a.added, a.updated, attempt - 1));
            }
            Err(status) if status.code() == Code::Unavailable && attempt < ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(backoff).await;
                backoff *= 2;
            }
            Err(status) => {
                let mut failure = Failure::from_status(&status, &args.client.addr);
                failure.message = format!(
                    "the batch from line {} ({} terms): {}",
                    batch.first_line,
                    batch.terms.len(),
                    failure.message
                );
                return Err(failure);
            }
        }
    }
}

/// Reads the file into batches sent to `tx`, until its end, a bad line (sent as the failure), or
/// the receiver closing.
fn read(
    input: Box<dyn Read + Send>,
    name: &str,
    batch_size: usize,
    tx: &tokio::sync::mpsc::Sender<Result<Batch, Failure>>,
) {
    let mut lines = BufReader::new(input);
    let mut batch = Batch {
        terms: Vec::with_capacity(batch_size),
        first_line: 0,
    };
    let mut buf = Vec::new();
    let mut line_no = 0usize;
    loop {
        buf.clear();
        line_no += 1;
        let read = (&mut lines)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf);
        match read {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                let _ = tx.blocking_send(Err(Failure::new(
                    EXIT_SOFTWARE,
                    format!("{name}:{line_no}: {e}"),
                )));
                return;
            }
        }
        if buf.len() > MAX_LINE_BYTES && buf.last() != Some(&b'\n') {
            let _ = tx.blocking_send(Err(bad(
                name,
                line_no,
                &format!("longer than {MAX_LINE_BYTES} bytes"),
            )));
            return;
        }
        let line = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        match parse(line) {
            Ok(term) => {
                if batch.terms.is_empty() {
                    batch.first_line = line_no;
                }
                batch.terms.push(term);
            }
            Err(why) => {
                if !batch.terms.is_empty() {
                    let full = std::mem::replace(
                        &mut batch,
                        Batch {
                            terms: Vec::new(),
                            first_line: 0,
                        },
                    );
                    if tx.blocking_send(Ok(full)).is_err() {
                        return;
                    }
                }
                let _ = tx.blocking_send(Err(bad(name, line_no, &why)));
                return;
            }
        }
        if batch.terms.len() == batch_size {
            let full = std::mem::replace(
                &mut batch,
                Batch {
                    terms: Vec::with_capacity(batch_size),
                    first_line: 0,
                },
            );
            if tx.blocking_send(Ok(full)).is_err() {
                return;
            }
        }
    }
    if !batch.terms.is_empty() {
        let _ = tx.blocking_send(Ok(batch));
    }
}

fn bad(name: &str, line: usize, why: &str) -> Failure {
    Failure::new(EXIT_USAGE, format!("{name}:{line}: {why}"))
}

/// One line as a term, checked with the server's limits.
fn parse(line: &[u8]) -> Result<AutocompleteTerm, String> {
    let mut fields = line.splitn(3, |&b| b == b'\t');
    let display = fields.next().unwrap_or_default();
    let display =
        std::str::from_utf8(display).map_err(|_| "the display text is not UTF-8".to_owned())?;
    if display.len() > MAX_TEXT_BYTES {
        return Err(format!(
            "the display text is longer than {MAX_TEXT_BYTES} bytes"
        ));
    }
    if display.contains('\0') {
        return Err("the display text contains U+0000".to_owned());
    }
    if Text::new(display).is_none() {
        return Err("the display text is blank".to_owned());
    }
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
    let payload = match fields.next() {
        None => None,
        Some(p) if p.len() > MAX_PAYLOAD_BYTES => {
            return Err(format!(
                "the payload is longer than {MAX_PAYLOAD_BYTES} bytes"
            ));
        }
        Some(p) => Some(p.to_vec()),
    };
    Ok(AutocompleteTerm {
        display: display.to_owned(),
        score,
        increment: false,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line is a display, then optionally a score and a payload, each checked.
    #[test]
    fn lines_parse_with_the_servers_limits() {
        let t = parse(b"Anna Smith").unwrap();
        assert_eq!(
            (t.display.as_str(), t.score, t.payload),
            ("Anna Smith", None, None)
        );
        let t = parse(b"Anna Smith\t12.5").unwrap();
        assert_eq!(t.score, Some(12.5));
        let t = parse("Zoë\t3\tid-7 x".as_bytes()).unwrap();
        assert_eq!(t.payload.as_deref(), Some(&b"id-7 x"[..]));
        assert!(!t.increment);
        assert!(parse(b"   ").unwrap_err().contains("blank"));
        assert!(parse(b"a\tnope").unwrap_err().contains("not a number"));
        assert!(parse(b"a\tinf").unwrap_err().contains("1e15"));
        assert!(parse(b"a\t2e15").unwrap_err().contains("1e15"));
        assert!(parse(b"\xff\xfe").unwrap_err().contains("UTF-8"));
        assert!(parse(b"a\0b").unwrap_err().contains("U+0000"));
        assert!(parse(&[b'x'; 257]).unwrap_err().contains("256"));
        let mut long = b"a\t1\t".to_vec();
        long.extend([b'p'; 1025]);
        assert!(parse(&long).unwrap_err().contains("1024"));
    }
}
