//! Credential files (certificates, keys, the client CA, the API token) read with a size bound,
//! and watched for changes: a [`Source`] is read again every reload interval, and applied only
//! when its contents changed and parse; a file that does not is refused with a log line and the
//! previous contents stay in force.
//!
//! Kubernetes Secrets and cert-manager replace such files in place by swapping a `..data`
//! symlink; reading the files again (their contents, not their modification times) follows the
//! swap whatever the file system reports.

use std::{path::PathBuf, time::Duration};

use tokio_util::sync::CancellationToken;

use crate::files::read_bounded;

/// A set of files applied together (a certificate with its key and client CA; a token file).
pub trait Source: Send + 'static {
    /// What the files are, for log lines ("TLS certificate", "API token").
    fn what(&self) -> &'static str;
    /// The files, in the order [`Source::apply`] gets their contents.
    fn paths(&self) -> &[PathBuf];
    /// The largest size accepted for each file.
    fn max_bytes(&self) -> u64;
    /// Parses the files' contents and puts them in force, or says why they are refused (the
    /// previous contents then stay in force).
    fn apply(&self, contents: &[Vec<u8>]) -> Result<(), String>;
}

/// A source and what was last seen of it.
struct Watched {
    source: Box<dyn Source>,
    /// The contents in force.
    applied: Vec<Vec<u8>>,
    /// The last contents refused (or the last read error), so a refusal is logged once.
    refused: Option<Result<Vec<Vec<u8>>, String>>,
}

impl Watched {
    /// Reads the files again; applies them if they changed and parse.
    fn check(&mut self) {
        let read: Result<Vec<Vec<u8>>, String> = self
            .source
            .paths()
            .iter()
            .map(|p| read_bounded(p, self.source.max_bytes()))
            .collect();
        let what = self.source.what();
        match read {
            Ok(contents) if contents == self.applied => self.refused = None,
            Ok(contents) => {
                if matches!(&self.refused, Some(Ok(seen)) if *seen == contents) {
                    return;
                }
                match self.source.apply(&contents) {
                    Ok(()) => {
                        tracing::info!(what, files = ?self.source.paths(), "reloaded changed credential files");
                        self.applied = contents;
                        self.refused = None;
                    }
                    Err(e) => {
                        tracing::warn!(what, error = %e, "refused changed credential files; the previous ones stay in force");
                        self.refused = Some(Ok(contents));
                    }
                }
            }
            Err(e) => {
                if !matches!(&self.refused, Some(Err(seen)) if *seen == e) {
                    tracing::warn!(what, error = %e, "cannot read credential files; the previous ones stay in force");
                    self.refused = Some(Err(e));
                }
            }
        }
    }
}

/// Reads every source once and applies it: an error names the first source that does not load.
/// Then, unless `interval` is zero, reads them again every `interval` (in a blocking task) until
/// `shutdown`, applying what changed.
pub fn load_and_watch(
    sources: Vec<Box<dyn Source>>,
    interval: Duration,
    shutdown: CancellationToken,
) -> Result<(), String> {
    let mut watched = Vec::with_capacity(sources.len());
    for source in sources {
        let contents = source
            .paths()
            .iter()
            .map(|p| read_bounded(p, source.max_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        source.apply(&contents)?;
        watched.push(Watched {
            source,
            applied: contents,
            refused: None,
        });
    }
    if interval.is_zero() || watched.is_empty() {
        return Ok(());
    }
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let checked = tokio::task::spawn_blocking(move || {
                for source in &mut watched {
                    source.check();
                }
                watched
            })
            .await;
            match checked {
                Ok(back) => watched = back,
                // Only a panic in a parser ends up here; nothing is reloaded after it.
                Err(e) => {
                    tracing::error!(error = %e, "the credential file watcher failed; files are no longer reloaded");
                    return;
                }
            }
        }
    });
    Ok(())
}
