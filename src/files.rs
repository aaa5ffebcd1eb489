//! Reading the files Baton is given (rate limit rules, Redis passwords, certificates and keys,
//! the API token): regular files only, of bounded size, opened without ever blocking. A FIFO, a
//! device or a directory is refused, also when a symlink is swapped to one between a check and
//! the read (the checks are made on the file opened, not on its path).

use std::{fmt, fs::File, io::Read as _, os::unix::fs::OpenOptionsExt as _, path::Path};

/// Why a file was not read.
#[derive(Debug)]
pub enum FileError {
    /// Opening or reading it failed (missing, no permission, ...).
    Io(std::io::Error),
    /// It is not a regular file once symlinks are followed (a FIFO, a device, a directory).
    NotRegular,
    /// It holds more than the bound, in bytes.
    TooLarge(u64),
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "cannot be read: {e}"),
            Self::NotRegular => f.write_str("is not a regular file"),
            Self::TooLarge(max) => write!(f, "is more than the {max} bytes accepted"),
        }
    }
}

/// The content of `path`: a regular file (after symlinks) of at most `max` bytes.
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, FileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        // A FIFO would block the open until a writer comes; it is refused below instead.
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(FileError::Io)?;
    let meta = file.metadata().map_err(FileError::Io)?;
    if !meta.is_file() {
        return Err(FileError::NotRegular);
    }
    if meta.len() > max {
        return Err(FileError::TooLarge(max));
    }
    read_at_most(file, max)
}

fn read_at_most(file: File, max: u64) -> Result<Vec<u8>, FileError> {
    let mut bytes = Vec::new();
    // The file may grow between the size check and the read: never read past the bound.
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(FileError::Io)?;
    if bytes.len() as u64 > max {
        return Err(FileError::TooLarge(max));
    }
    Ok(bytes)
}

/// [`read_regular`], its error as a sentence naming the file ("/path is not a regular file").
pub fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    read_regular(path, max).map_err(|e| match e {
        FileError::Io(e) => format!("cannot read {}: {e}", path.display()),
        e => format!("{} {e}", path.display()),
    })
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
