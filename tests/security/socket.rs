//! The Unix socket: its mode and group are set before it appears at its path, a stale socket is
//! replaced, and a live socket, a regular file or a directory at the path is refused (the binary
//! exits 2 saying why).

use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::Path,
    time::Duration,
};

use baton::{
    config::{RedisConfig, ServeConfig},
    security::{Refused, socket},
    server::Listeners,
};

use crate::support::{baton_command, run_baton};

fn config(path: &Path) -> ServeConfig {
    let mut config = ServeConfig::new(RedisConfig::new("redis://127.0.0.1:1"));
    config.socket = Some(path.to_owned());
    config
}

async fn bind(config: &ServeConfig) -> Result<Listeners, String> {
    Listeners::bind(config).await.map_err(|e| {
        assert!(
            e.downcast_ref::<Refused>().is_some(),
            "not a Refused error: {e:#}"
        );
        format!("{e:#}")
    })
}

/// The socket gets mode 0660 by default, or the one given, and the group given; nothing else is
/// left beside it.
#[tokio::test]
async fn the_socket_gets_its_mode_and_group() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("baton.sock");
    let listeners = bind(&config(&path)).await.expect("binding");
    let meta = std::fs::symlink_metadata(&path).expect("the socket");
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    drop(listeners);
    std::fs::remove_file(&path).expect("removing");

    let mut custom = config(&path);
    custom.serving.socket_mode = 0o600;
    // Root may give any group; anyone else, one of their own.
    let gid = if nix::unistd::geteuid().is_root() {
        65534
    } else {
        nix::unistd::getegid().as_raw()
    };
    custom.serving.socket_group = Some(gid);
    let _listeners = bind(&custom).await.expect("binding");
    let meta = std::fs::symlink_metadata(&path).expect("the socket");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.gid(), gid);
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("listing")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        left,
        ["baton.sock"],
        "the staging directory was left behind"
    );
    assert_eq!(socket::group("root"), Ok(0));
}

/// A socket nobody accepts on (left by a Baton that died) is replaced; one that accepts
/// connections, a regular file and a directory are refused and left as they were.
#[tokio::test]
async fn only_a_stale_socket_is_replaced() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("baton.sock");
    let live = tokio::net::UnixListener::bind(&path).expect("a live socket");
    let refused = bind(&config(&path))
        .await
        .expect_err("a live socket is refused");
    assert!(refused.contains("running server"), "{refused}");
    drop(live);
    let listeners = bind(&config(&path))
        .await
        .expect("a stale socket is replaced");
    let (listener, _) = listeners.unix.expect("the socket");
    let connected = tokio::net::UnixStream::connect(&path);
    let (accepted, connected) = tokio::join!(listener.accept(), connected);
    accepted.expect("accepting on the new socket");
    connected.expect("connecting to the new socket");
    drop(listener);
    std::fs::remove_file(&path).expect("removing");

    std::fs::write(&path, "data").expect("a regular file");
    let refused = bind(&config(&path)).await.expect_err("a file is refused");
    assert!(refused.contains("a regular file"), "{refused}");
    assert_eq!(std::fs::read(&path).expect("still there"), b"data");
    std::fs::remove_file(&path).expect("removing");

    std::fs::create_dir(&path).expect("a directory");
    let refused = bind(&config(&path))
        .await
        .expect_err("a directory is refused");
    assert!(refused.contains("a directory"), "{refused}");
    assert!(path.is_dir());
}

/// `baton serve --socket FILE` over a regular file exits 2, saying what is in the way.
#[tokio::test]
async fn the_binary_exits_2_on_a_path_it_must_not_take() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("baton.sock");
    std::fs::write(&path, "data").expect("a regular file");
    let mut command = baton_command();
    command
        .args(["serve", "--listen", "", "--socket"])
        .arg(&path)
        .args(["--redis-url", "redis://127.0.0.1:1"]);
    let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is a regular file"), "{stderr}");
    assert_eq!(std::fs::read(&path).expect("still there"), b"data");
}

/// A path of `len` bytes in `dir` (a folder of long names, then `name` at its end).
fn path_of_length(dir: &Path, name: &str, len: usize) -> std::path::PathBuf {
    let base = dir.display().to_string().len() + 1;
    let folder = len
        .checked_sub(base + name.len() + 1)
        .expect("room for a folder");
    let folder = dir.join("d".repeat(folder));
    std::fs::create_dir(&folder).expect("a folder");
    let path = folder.join(name);
    assert_eq!(path.as_os_str().len(), len);
    path
}

/// A socket path longer than a Unix socket address holds (107 bytes) exits 2 at start, saying
/// its length and the limit: it was bound (in a staging directory, then renamed) and announced,
/// but no client could connect to it, and after a crash the stale socket could not be told
/// stale. A path of 107 bytes with a short name, whose staging path is longer than the limit,
/// is served and reached.
#[tokio::test]
async fn a_socket_path_too_long_to_connect_to_exits_2() {
    // A long name (a short staging path, which was bound and renamed into place) and a short
    // one.
    for name in ["q".repeat(60), "baton.sock".to_owned()] {
        let dir = tempfile::tempdir().expect("temp dir");
        let long = path_of_length(dir.path(), &name, 108);
        let mut command = baton_command();
        command
            .args(["serve", "--listen", "", "--socket"])
            .arg(&long)
            .args(["--redis-url", "redis://127.0.0.1:1"]);
        let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("--socket / BATON_SOCKET")
                && stderr.contains("is 108 bytes long")
                && stderr.contains("at most 107 bytes"),
            "{stderr}"
        );
        assert!(!long.exists(), "nothing was bound");
        let refused = bind(&config(&long)).await.expect_err("too long");
        assert!(refused.contains("at most 107 bytes"), "{refused}");
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let longest = path_of_length(dir.path(), "b.sock", 107);
    let _listeners = bind(&config(&longest)).await.expect("a path that fits");
    tokio::net::UnixStream::connect(&longest)
        .await
        .expect("a client connects to the longest path");
    let left: Vec<_> = std::fs::read_dir(longest.parent().expect("its folder"))
        .expect("listing")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left, ["b.sock"], "the staging directory was left behind");
}
