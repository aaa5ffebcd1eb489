//! The Unix socket, created with its final mode and group before anyone can connect.
//!
//! The socket is bound in a fresh directory of its own (mode 0700, beside the final path, so on
//! the same file system), given its mode and group there, then renamed into place: no process
//! can connect to it before it has both. The path is taken only if nothing is there or a stale
//! socket is (one nobody accepts on, left by a Baton that died); a socket that accepts
//! connections, a regular file, a directory or anything else is refused, and so is a path that
//! appears meanwhile (the rename never replaces).

use std::{
    io,
    os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use nix::unistd::{Gid, Group};
use tokio::net::{UnixListener, UnixStream};

use super::Refused;

/// Default mode of the socket: owner and group may connect.
pub const DEFAULT_MODE: u32 = 0o660;

/// Longest socket path a client can connect to, in bytes: a Unix socket address holds 108
/// bytes, the last of them the terminating NUL.
pub const MAX_PATH_BYTES: usize = 107;

/// Refuses a socket path longer than [`MAX_PATH_BYTES`]: no client could connect to it by that
/// path (`connect` refuses it), and a stale socket left there could not be told stale.
pub fn check_path_length(path: &Path) -> Result<(), String> {
    let len = path.as_os_str().len();
    if len > MAX_PATH_BYTES {
        return Err(format!(
            "{} is {len} bytes long, and a Unix socket path holds at most {MAX_PATH_BYTES} bytes \
             (108 with the final NUL), so no client could connect to it; choose a shorter path",
            path.display()
        ));
    }
    Ok(())
}

/// A group given by name or number (`--socket-group`), resolved to its id.
pub fn group(spec: &str) -> Result<u32, String> {
    let spec = spec.trim();
    if let Ok(gid) = spec.parse::<u32>() {
        return Ok(gid);
    }
    match Group::from_name(spec) {
        Ok(Some(group)) => Ok(group.gid.as_raw()),
        Ok(None) => Err(format!("no group is named {spec:?}")),
        Err(e) => Err(format!("cannot look up the group {spec:?}: {e}")),
    }
}

/// Parses an octal mode such as `0660` or `660` (permission bits only).
pub fn mode(spec: &str) -> Result<u32, String> {
    let digits = spec.trim().trim_start_matches("0o");
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o777 && !digits.is_empty() => Ok(mode),
        _ => Err(format!(
            "{spec:?} is not an octal permission mode like 0660"
        )),
    }
}

/// Binds the socket at `path` with `mode` and, if given, group `gid` (see the module
/// documentation). A path Baton must not take is a [`Refused`] error.
pub async fn bind(path: &Path, mode: u32, gid: Option<u32>) -> anyhow::Result<UnixListener> {
    check_path_length(path).map_err(|e| Refused(format!("--socket: {e}")))?;
    take_path(path).await?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let staging = Staging::create(&parent)?;
    let staged = staging.dir.join("s");
    // The staging path is longer than the final one when the socket's name is short: it is
    // bound through the directory's descriptor then, so a path that fits is never refused
    // for the staging directory's name.
    let dir = (staged.as_os_str().len() > MAX_PATH_BYTES)
        .then(|| std::fs::File::open(&staging.dir))
        .transpose()
        .map_err(|e| {
            Refused(format!(
                "--socket: cannot open {} to make the socket in: {e}",
                staging.dir.display()
            ))
        })?;
    let bound = match &dir {
        Some(dir) => PathBuf::from(format!(
            "/proc/self/fd/{}/s",
            std::os::fd::AsRawFd::as_raw_fd(dir)
        )),
        None => staged.clone(),
    };
    let listener = UnixListener::bind(&bound).map_err(|e| {
        Refused(format!(
            "--socket: cannot create a socket beside {}: {e}",
            path.display()
        ))
    })?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Refused(format!("--socket-mode: cannot set mode {mode:o}: {e}")))?;
    if let Some(gid) = gid {
        nix::unistd::chown(&staged, None, Some(Gid::from_raw(gid))).map_err(|e| {
            Refused(format!(
                "--socket-group: cannot give the socket group {gid} ({e}); Baton must run as \
                 a member of that group"
            ))
        })?;
    }
    nix::fcntl::renameat2(
        nix::fcntl::AT_FDCWD,
        &staged,
        nix::fcntl::AT_FDCWD,
        path,
        nix::fcntl::RenameFlags::RENAME_NOREPLACE,
    )
    .map_err(|e| match e {
        nix::errno::Errno::EEXIST => Refused(format!(
            "--socket: {} appeared while Baton was binding; refusing to replace it",
            path.display()
        )),
        e => Refused(format!(
            "--socket: cannot put the socket at {}: {e}",
            path.display()
        )),
    })?;
    Ok(listener)
}

/// A private directory (mode 0700) to bind the socket in, removed with what is left in it.
struct Staging {
    dir: PathBuf,
}

impl Staging {
    fn create(parent: &Path) -> Result<Self, Refused> {
        let name = format!(".baton-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let dir = parent.join(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                Refused(format!(
                    "--socket: cannot create a directory in {} to make the socket in: {e}",
                    parent.display()
                ))
            })?;
        Ok(Self { dir })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // The socket is still here only when it was not renamed into place.
        let _ = std::fs::remove_file(self.dir.join("s"));
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Makes room at `path`: nothing to do if nothing is there, a stale socket is removed, anything
/// else is refused.
async fn take_path(path: &Path) -> Result<(), Refused> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(Refused(format!(
                "--socket: cannot look at {}: {e}",
                path.display()
            )));
        }
    };
    let kind = meta.file_type();
    if !kind.is_socket() {
        let what = if kind.is_dir() {
            "a directory"
        } else if kind.is_file() {
            "a regular file"
        } else if kind.is_symlink() {
            "a symbolic link"
        } else {
            "not a socket"
        };
        return Err(Refused(format!(
            "--socket: {} is {what}; Baton replaces only a stale socket there (remove it or \
             choose another path)",
            path.display()
        )));
    }
    match UnixStream::connect(path).await {
        Ok(_) => Err(Refused(format!(
            "--socket: {} is the socket of a running server (it accepts connections); stop it \
             or choose another path",
            path.display()
        ))),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            tracing::info!(path = %path.display(), "replacing a stale socket");
            std::fs::remove_file(path).or_else(|e| match e.kind() {
                io::ErrorKind::NotFound => Ok(()),
                _ => Err(Refused(format!(
                    "--socket: cannot remove the stale socket {}: {e}",
                    path.display()
                ))),
            })
        }
        Err(e) => Err(Refused(format!(
            "--socket: {} is a socket Baton cannot tell stale ({e}); remove it or choose another \
             path",
            path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Modes are octal permission bits; groups are numbers or names.
    #[test]
    fn modes_and_groups_parse() {
        assert_eq!(mode("0660"), Ok(0o660));
        assert_eq!(mode("600"), Ok(0o600));
        assert_eq!(mode("0o777"), Ok(0o777));
        for bad in ["", "0999", "1777", "rw-rw----", "-1"] {
            assert!(mode(bad).is_err(), "{bad}");
        }
        assert_eq!(group("1234"), Ok(1234));
        assert_eq!(group("root"), Ok(0));
        assert!(group("no-such-group-for-baton").is_err());
    }
}
