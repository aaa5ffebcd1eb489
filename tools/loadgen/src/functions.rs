//! Redis Functions against scripts: the same Lua, the same KEYS and ARGV (the typed builders),
//! called as `FCALL` of a library loaded once with `FUNCTION LOAD` and as `EVALSHA`, one after the
//! other on the same Redis, no Baton: a lock acquire + release (two calls) and a GCRA decision.
//!
//! The library wraps each script's source, unchanged (prelude included, with the `PUBLISH`
//! local Baton puts in front on a single Redis), as the body of a function taking `KEYS` and `ARGV`:
//! the conversion adopting Functions would start from. Both sides build their calls with the same
//! builder and take its command apart the same way ([`Capture`]), so the load generator's work
//! per call is the same and what differs is Redis's.

use std::{sync::Arc, time::Duration};

use baton::{
    lock::{self, Mode, scripts::LockKeys},
    ratelimit::{self, Algorithm},
};
use redis::{
    Arg, Cmd, RedisFuture, Script, ScriptInvocation, Value,
    aio::{ConnectionLike, MultiplexedConnection},
};
use testkit::{RedisServer, within};
use tokio::{sync::Barrier, task::JoinSet, time::Instant};

use crate::{
    DIRECT_PREFIX, Options, Scenario, names,
    primitives::{RATELIMIT_KEYS, TTL, ratelimit_rate, token},
    probe::Probe,
    record::Record,
    stats::{self, histogram, micros},
};

/// The library's name.
pub const LIBRARY: &str = "baton_bench";

/// What each client does in a loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// Lock `acquire.lua` then `release.lua` on a name of its own: two calls.
    LockCycle,
    /// `gcra.lua` on one of [`RATELIMIT_KEYS`] keys: one call.
    Gcra,
}

impl Case {
    /// Its name in the records.
    pub fn name(self) -> &'static str {
        match self {
            Case::LockCycle => "lock-cycle",
            Case::Gcra => "gcra",
        }
    }

    /// Script calls per operation.
    pub fn calls(self) -> u64 {
        match self {
            Case::LockCycle => 2,
            Case::Gcra => 1,
        }
    }
}

/// How the scripts are called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// `EVALSHA` of the script (loaded with `SCRIPT LOAD` first).
    Evalsha,
    /// `FCALL` of the library's function.
    Fcall,
}

impl Via {
    /// Its name in the records.
    pub fn name(self) -> &'static str {
        match self {
            Via::Evalsha => "evalsha",
            Via::Fcall => "fcall",
        }
    }
}

/// The library: each script's source as the body of a function of the same name.
pub fn library(functions: &[(&str, String)]) -> String {
    let mut out = format!("#!lua name={LIBRARY}\n");
    for (name, source) in functions {
        out.push_str(&format!(
            "local function {name}(KEYS, ARGV)\n{source}\nend\nredis.register_function('{name}', {name})\n"
        ));
    }
    out
}

/// The scripts measured, by function name, as Baton sends them to a single Redis (the lock's
/// with the `PUBLISH` local in front).
fn sources() -> [(&'static str, String); 3] {
    let publish = |source: &str| format!("local PUBLISH = 'PUBLISH'\n{source}");
    [
        ("lock_acquire", publish(lock::scripts::ACQUIRE)),
        ("lock_release", publish(lock::scripts::RELEASE)),
        ("gcra", ratelimit::scripts::GCRA.to_owned()),
    ]
}

/// A connection that keeps the command it is asked to send instead of sending it: the `EVALSHA`
/// a [`ScriptInvocation`] writes, taken apart to send it as it is or as an `FCALL`.
#[derive(Default)]
pub struct Capture(Option<Cmd>);

impl ConnectionLike for Capture {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.0 = Some(cmd.clone());
        Box::pin(async { Ok(Value::Nil) })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _: &'a redis::Pipeline,
        _: usize,
        _: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// The command calling `invocation` via `via` (`function`: the function's name in the library).
pub async fn command(invocation: &ScriptInvocation<'_>, via: Via, function: &str) -> Cmd {
    let mut capture = Capture::default();
    let _: Value = invocation
        .invoke_async(&mut capture)
        .await
        .expect("a captured call");
    let evalsha = capture.0.expect("the invocation sends one command");
    match via {
        Via::Evalsha => evalsha,
        Via::Fcall => {
            let mut fcall = redis::cmd("FCALL");
            fcall.arg(function);
            // EVALSHA sha numkeys KEYS... ARGV...: everything after the hash is the same.
            for arg in evalsha.args_iter().skip(2) {
                if let Arg::Simple(bytes) = arg {
                    fcall.arg(bytes);
                }
            }
            fcall
        }
    }
}

/// Scripts of [`sources`], wrapped as Baton wraps them on a single Redis.
struct Scripts {
    acquire: Script,
    release: Script,
    gcra: Script,
}

/// Measures both cases via both sides for each client count, appending the records; `repeat`
/// (the repeat's number) picks which side goes first.
pub async fn run(options: &Options, repeat: usize, records: &mut Vec<Record>) {
    let redis = RedisServer::start_standalone().await;
    let mut admin = redis.client().await;
    let source = library(&sources());
    let loaded: Result<String, _> = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&source)
        .query_async(&mut admin)
        .await;
    assert_eq!(
        loaded.as_deref().ok(),
        Some(LIBRARY),
        "FUNCTION LOAD: {loaded:?}"
    );
    let baton_redis = redis.baton_redis();
    let scripts = Arc::new(Scripts {
        acquire: baton_redis.script(lock::scripts::ACQUIRE),
        release: baton_redis.script(lock::scripts::RELEASE),
        gcra: Script::new(ratelimit::scripts::GCRA),
    });
    for script in [&scripts.acquire, &scripts.release, &scripts.gcra] {
        script.load_async(&mut admin).await.expect("SCRIPT LOAD");
    }
    let mut conns = Vec::with_capacity(options.pool);
    for _ in 0..options.pool {
        conns.push(redis.client().await);
    }
    let mut probe = Probe::new(admin, None);
    for case in [Case::LockCycle, Case::Gcra] {
        for &clients in &options.clients {
            // Alternate which side goes first (by client count and repeat), so that neither
            // always runs on a warmer Redis.
            let order = if (clients + repeat).is_multiple_of(2) {
                [Via::Evalsha, Via::Fcall]
            } else {
                [Via::Fcall, Via::Evalsha]
            };
            for via in order {
                let record =
                    measure(options, &mut probe, &conns, &scripts, case, via, clients).await;
                eprintln!(
                    "functions {:<10} {:>3} clients {:<8} {:>9.0} ops/s  Redis CPU {:.1} us/call",
                    case.name(),
                    clients,
                    via.name(),
                    record.get(names::RATE).unwrap_or(0.0),
                    record.get(names::REDIS_CPU).unwrap_or(0.0) * 1e6
                        / record.script_calls().max(1) as f64
                );
                records.push(record);
            }
        }
    }
}

/// One operation of `case` via `via` by client `id`, its `n`th.
async fn operation(
    case: Case,
    via: Via,
    id: usize,
    n: u64,
    conn: &mut MultiplexedConnection,
    scripts: &Scripts,
) -> Result<(), String> {
    let send = |cmd: Cmd, mut conn: MultiplexedConnection| async move {
        cmd.query_async::<Value>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    };
    match case {
        Case::LockCycle => {
            let keys = LockKeys::new(DIRECT_PREFIX, &format!("fn-{id}"));
            let token = token();
            let acquire = lock::scripts::Acquire {
                owner: "",
                token: &token,
                ttl: TTL,
                waiter: "",
                wait_left: Duration::ZERO,
                fair: false,
                mode: Mode::Exclusive,
                idempotency_key: "",
            }
            .invocation(&scripts.acquire, &keys);
            let granted = send(command(&acquire, via, "lock_acquire").await, conn.clone()).await?;
            if !matches!(&granted, Value::Array(v) if v.first() == Some(&Value::Int(1))) {
                return Err(format!("acquire: {granted:?}"));
            }
            let release = lock::scripts::Release {
                token: &token,
                clean_up: None,
            }
            .invocation(&scripts.release, &keys);
            let released = send(command(&release, via, "lock_release").await, conn.clone()).await?;
            match &released {
                Value::Array(v) if v.first() == Some(&Value::Int(1)) => Ok(()),
                other => Err(format!("release: {other:?}")),
            }
        }
        Case::Gcra => {
            let key = format!(
                "fn-{}",
                (u64::try_from(id).unwrap_or(0) * 7919 + n) % RATELIMIT_KEYS
            );
            let key = ratelimit::limiter_key(DIRECT_PREFIX, "rl", &key, Algorithm::Gcra);
            let rate = ratelimit_rate();
            let check = ratelimit::scripts::Check {
                key: &key,
                rate: &rate,
                cost: 1,
                not_after: 0,
            }
            .invocation(&scripts.gcra);
            match send(command(&check, via, "gcra").await, conn.clone()).await? {
                Value::Array(v) if v.first() == Some(&Value::Int(1)) => Ok(()),
                other => Err(format!("gcra: {other:?}")),
            }
        }
    }
}

/// One window of `clients` closed loops of `case` via `via`.
async fn measure(
    options: &Options,
    probe: &mut Probe,
    conns: &[MultiplexedConnection],
    scripts: &Arc<Scripts>,
    case: Case,
    via: Via,
    clients: usize,
) -> Record {
    let warm_until = Instant::now() + options.warmup;
    let paused = Arc::new(Barrier::new(clients + 1));
    let go = Arc::new(Barrier::new(clients + 1));
    let until = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut tasks = JoinSet::new();
    for id in 0..clients {
        let mut conn = conns[id % conns.len()].clone();
        let scripts = Arc::clone(scripts);
        let (paused, go, until) = (Arc::clone(&paused), Arc::clone(&go), Arc::clone(&until));
        tasks.spawn(async move {
            let mut n = 0;
            while Instant::now() < warm_until {
                let _ = operation(case, via, id, n, &mut conn, &scripts).await;
                n += 1;
            }
            paused.wait().await;
            go.wait().await;
            let until = *until.get().expect("the window is set before it opens");
            let mut latency = histogram();
            let (mut ops, mut errors, mut first_error) = (0u64, 0u64, None);
            while Instant::now() < until {
                let sent = Instant::now();
                match operation(case, via, id, n, &mut conn, &scripts).await {
                    Ok(()) => {
                        latency.saturating_record(micros(sent.elapsed()));
                        ops += 1;
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e);
                    }
                }
                n += 1;
            }
            (latency, ops, errors, first_error)
        });
    }
    within(
        options.warmup + Duration::from_secs(60),
        paused.wait(),
        "the clients to warm up",
    )
    .await;
    let mark = probe.mark().await;
    until
        .set(Instant::now() + options.window)
        .expect("the window is set once");
    go.wait().await;
    let mut all = histogram();
    let (mut ops, mut errors, mut first_error) = (0u64, 0u64, None);
    while let Some(done) = within(
        options.window + Duration::from_secs(60),
        tasks.join_next(),
        "the clients to finish the window",
    )
    .await
    {
        let (h, o, e, f) = done.expect("a client task");
        all.add(&h).expect("histograms add");
        ops += o;
        errors += e;
        if first_error.is_none() {
            first_error = f;
        }
    }
    let mut record = Record {
        scenario: Scenario::Functions.name().to_owned(),
        case: case.name().to_owned(),
        clients,
        side: via.name().to_owned(),
        ..Record::default()
    };
    probe.usage(mark, &mut record).await;
    let secs = record.get(names::SECS).unwrap_or(1.0).max(1e-9);
    record.set(names::OPS, ops as f64);
    record.set(names::CALLS, (ops * case.calls()) as f64);
    record.set(names::ERRORS, errors as f64);
    record.set(names::RATE, ops as f64 / secs);
    stats::latency(&mut record, &all);
    record.first_error = first_error;
    record
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A script's call becomes the function's call with the same KEYS and ARGV.
    #[tokio::test]
    async fn fcall_keeps_keys_and_arguments() {
        let script = Script::new("return 1");
        let mut invocation = script.prepare_invoke();
        invocation.key("k1").key("k2").arg("a").arg(7);
        let fcall = command(&invocation, Via::Fcall, "f").await;
        let args: Vec<Vec<u8>> = fcall
            .args_iter()
            .filter_map(|a| match a {
                Arg::Simple(b) => Some(b.to_vec()),
                _ => None,
            })
            .collect();
        let expected: Vec<&[u8]> = vec![b"FCALL", b"f", b"2", b"k1", b"k2", b"a", b"7"];
        assert_eq!(args, expected);
        let evalsha = command(&invocation, Via::Evalsha, "f").await;
        assert_eq!(
            evalsha.args_iter().next().map(|a| match a {
                Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            }),
            Some(b"EVALSHA".to_vec())
        );
    }

    /// The library names itself and registers each function once.
    #[test]
    fn library_registers_each_function() {
        let text = library(&sources());
        assert!(text.starts_with(&format!("#!lua name={LIBRARY}\n")));
        for (name, _) in sources() {
            assert_eq!(
                text.matches(&format!("redis.register_function('{name}'"))
                    .count(),
                1
            );
        }
    }
}
