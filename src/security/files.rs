//! Credential files (certificates, keys, the client CA, the API token) read with a size bound,
//! and watched for changes: a [`Source`] is read again every reload interval, and applied only
//! when its contents changed and parse; a file that does not is refused with a log line and the
//! previous contents stay in force.
//!
//! Kubernetes Secrets and cert-manager replace such files in place by swapping a `..data`
//! symlink; reading the files again (their contents, not their modification times) follows the
//! swap whatever the file system reports.

use std::{
    fs::File,
    io::Read as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use tokio_util::sync::CancellationToken;

/// Reads `path`: a regular file (after symlinks) of at most `max` bytes. A FIFO, a device or a
/// directory is refused without blocking on it.
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        // A FIFO would block the open until a writer comes; refused below instead.
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if meta.len() > max {
        return Err(format!(
            "{} is {} bytes, more than the {max} accepted",
            path.display(),
            meta.len()
        ));
    }
    read_at_most(file, path, max)
}

fn read_at_most(file: File, path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    // The file may grow between the size check and the read: never read past the bound.
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > max {
        return Err(format!(
            "{} is more than the {max} bytes accepted",
            path.display()
        ));
    }
    Ok(bytes)
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// A file over the bound, a directory and a FIFO are refused at once, without blocking.
    #[test]
    fn only_small_regular_files_are_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let small = dir.path().join("small");
        std::fs::write(&small, b"abc").expect("write");
        assert_eq!(read_bounded(&small, 3).expect("fits"), b"abc");
        let e = read_bounded(&small, 2).expect_err("too big");
        assert!(e.contains("more than the 2"), "{e}");
        let e = read_bounded(dir.path(), 100).expect_err("a directory");
        assert!(e.contains("not a regular file"), "{e}");
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        let e = read_bounded(&fifo, 100).expect_err("a FIFO");
        assert!(e.contains("not a regular file"), "{e}");
        let e = read_bounded(&dir.path().join("missing"), 100).expect_err("missing");
        assert!(e.contains("cannot read"), "{e}");
    }
}
