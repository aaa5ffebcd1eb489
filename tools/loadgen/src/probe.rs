//! Measuring a window: CPU time of Baton (`/proc/PID/stat`), of Redis (`INFO cpu`) and of this
//! process (`/proc/self/stat`), Baton's resident memory, and Redis's own count of the commands
//! it ran (`CONFIG RESETSTAT` before, `INFO commandstats` after).

use std::collections::BTreeMap;

use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

use crate::{
    names,
    record::{CommandStat, Record},
};

/// Clock ticks per second of `/proc/PID/stat` times (`getconf CLK_TCK`; 100 if it cannot run).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// User + system CPU seconds of process `pid` (`"self"` for this one), its ended threads
/// included; 0 when it cannot be read (the process is gone).
pub fn process_cpu(pid: &str, ticks: f64) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The command name (field 2) may hold spaces; fields 14 and 15 count from the state after it.
    let Some(close) = stat.rfind(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = stat[close + 2..].split_whitespace().collect();
    let field = |n: usize| {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (field(14) + field(15)) / ticks
}

/// Resident memory of process `pid` in bytes (`VmRSS`; 0 when it cannot be read).
pub fn resident(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The load average (1, 5, 15 minutes).
pub fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut out = [0.0; 3];
    for (slot, v) in out.iter_mut().zip(text.split_whitespace()) {
        *slot = v.parse().unwrap_or(0.0);
    }
    out
}

/// `used_cpu_sys + used_cpu_user` of `INFO cpu`, seconds.
pub async fn redis_cpu(conn: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .expect("INFO cpu");
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

/// `INFO commandstats`: calls and microseconds per command (lowercase, `INFO` itself left out).
pub async fn command_stats(conn: &mut MultiplexedConnection) -> BTreeMap<String, CommandStat> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| -> Option<u64> {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))?
                    .parse()
                    .ok()
            };
            (name != "info").then(|| {
                (
                    name.to_owned(),
                    CommandStat {
                        calls: field("calls").unwrap_or(0),
                        usec: field("usec").unwrap_or(0),
                    },
                )
            })
        })
        .collect()
}

/// `used_memory` of `INFO memory`, bytes.
pub async fn used_memory(conn: &mut MultiplexedConnection) -> u64 {
    memory_field(conn, "used_memory").await
}

/// The integer field `name` of `INFO memory` (0 when absent).
pub async fn memory_field(conn: &mut MultiplexedConnection, name: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .expect("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(':')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// What a window is measured with: a connection to Redis for its statistics, and Baton's pid.
pub struct Probe {
    /// A connection of its own, for `INFO` and `CONFIG RESETSTAT`.
    pub admin: MultiplexedConnection,
    /// Baton's process, when one is measured.
    pub baton: Option<u32>,
    ticks: f64,
}

/// The clocks at the start of a window.
pub struct Mark {
    at: Instant,
    baton: f64,
    redis: f64,
    load: f64,
}

impl Probe {
    /// A probe of the Redis behind `admin` and of the Baton process `baton`.
    pub fn new(admin: MultiplexedConnection, baton: Option<u32>) -> Self {
        Self {
            admin,
            baton,
            ticks: clock_ticks(),
        }
    }

    fn baton_cpu(&self) -> f64 {
        self.baton
            .map_or(0.0, |pid| process_cpu(&pid.to_string(), self.ticks))
    }

    /// Resets Redis's command statistics and reads every CPU clock.
    pub async fn mark(&mut self) -> Mark {
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.admin)
            .await
            .expect("CONFIG RESETSTAT");
        let redis = redis_cpu(&mut self.admin).await;
        Mark {
            at: Instant::now(),
            baton: self.baton_cpu(),
            redis,
            load: process_cpu("self", self.ticks),
        }
    }

    /// Writes what the window since `mark` cost into `record`: its length, each process's CPU
    /// time, Baton's resident memory and Redis's command statistics.
    pub async fn usage(&mut self, mark: Mark, record: &mut Record) {
        record.set(names::SECS, mark.at.elapsed().as_secs_f64());
        record.set(names::BATON_CPU, self.baton_cpu() - mark.baton);
        record.set(
            names::LOADGEN_CPU,
            process_cpu("self", self.ticks) - mark.load,
        );
        record.set(
            names::REDIS_CPU,
            redis_cpu(&mut self.admin).await - mark.redis,
        );
        if let Some(pid) = self.baton {
            record.set(names::BATON_RSS, resident(pid) as f64);
        }
        record.commands = command_stats(&mut self.admin).await;
    }
}
