//! Markdown tables from the JSON of runs ([`Run`]), and the renderer that writes them into a
//! document between markers, so that every figure in `docs/PERFORMANCE.md` comes from a
//! committed run:
//!
//! ```text
//! <!-- loadgen: unary perf/primitives.json -->
//! (generated: the table of the unary scenarios of that run)
//! <!-- /loadgen -->
//! ```
//!
//! A marker, at the start of a line, names a table ([`TABLES`]) and the JSON files it reads,
//! relative to the document.
//! Cells over several repeats are `median (min–max)`; a ratio against direct Redis is taken
//! within each repeat first.

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use crate::{
    autocomplete::{ADD_RETRIED, COMMAND_MAX, SCRIPT_MAX, SLOW_1MS, SLOW_5MS},
    names,
    record::{FORMAT, Record, Run},
    stats::median,
};

/// The tables a marker may name.
pub const TABLES: [&str; 18] = [
    "run",
    "targets",
    "targets-measured",
    "unary",
    "cpu",
    "contention",
    "leases",
    "leader-failover",
    "autocomplete-load",
    "autocomplete",
    "autocomplete-memory",
    "autocomplete-baseline",
    "autocomplete-modes",
    "autocomplete-layouts",
    "functions",
    "redis-failover",
    "builds",
    "idle",
];

/// Reads the run in `path`.
pub fn load(path: &Path) -> Result<Run, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let run: Run =
        serde_json::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))?;
    if run.format != FORMAT {
        return Err(format!(
            "{}: format {} (this loadgen reads {FORMAT})",
            path.display(),
            run.format
        ));
    }
    Ok(run)
}

/// `document` with every marked section rendered anew from its JSON files (relative to `dir`).
pub fn render_document(document: &str, dir: &Path) -> Result<String, String> {
    const OPEN: &str = "<!-- loadgen: ";
    const CLOSE: &str = "<!-- /loadgen -->";
    let mut out = String::with_capacity(document.len());
    let mut rest = document;
    // A marker starts a line (the same text inside a sentence is prose about markers).
    let next_marker = |text: &str| {
        text.match_indices(OPEN)
            .map(|(i, _)| i)
            .find(|i| *i == 0 || text.as_bytes()[i - 1] == b'\n')
    };
    while let Some(start) = next_marker(rest) {
        let header_end = rest[start..]
            .find("-->")
            .map(|i| start + i + 3)
            .ok_or("a marker without its closing `-->`")?;
        let header = rest[start + OPEN.len()..header_end - 3].trim();
        let body_end = rest[header_end..]
            .find(CLOSE)
            .map(|i| header_end + i)
            .ok_or_else(|| format!("no {CLOSE} after <!-- loadgen: {header} -->"))?;
        let mut words = header.split_whitespace();
        let table = words.next().ok_or("a marker without a table")?;
        let files: Vec<PathBuf> = words.map(|f| dir.join(f)).collect();
        let mut runs = Vec::with_capacity(files.len());
        for f in &files {
            runs.push(load(f)?);
        }
        let rendered = table_of(table, &runs)?;
        out.push_str(&rest[..header_end]);
        out.push('\n');
        out.push_str(rendered.trim_end());
        out.push('\n');
        out.push_str(CLOSE);
        rest = &rest[body_end + CLOSE.len()..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The Markdown of `table` over `runs`.
pub fn table_of(table: &str, runs: &[Run]) -> Result<String, String> {
    let one = || -> Result<&Run, String> {
        match runs {
            [run] => Ok(run),
            _ => Err(format!("table {table} reads one run, not {}", runs.len())),
        }
    };
    Ok(match table {
        "run" => run_table(runs),
        "targets" => crate::report::targets::table(runs, false),
        "targets-measured" => crate::report::targets::table(runs, true),
        "unary" => unary(one()?),
        "cpu" => cpu(one()?),
        "contention" => contention(one()?),
        "leases" => leases(one()?),
        "leader-failover" => leader_failover(one()?),
        "autocomplete-load" => autocomplete_load(one()?),
        "autocomplete" => autocomplete(one()?),
        "autocomplete-memory" => autocomplete_memory(one()?),
        "autocomplete-baseline" => autocomplete_baseline(one()?),
        "autocomplete-modes" => autocomplete_modes(one()?),
        "autocomplete-layouts" => crate::report::layouts::table(one()?),
        "functions" => functions(one()?),
        "redis-failover" => redis_failover(one()?),
        "builds" => builds(one()?),
        "idle" => idle(one()?),
        other => return Err(format!("unknown table {other:?}; known: {TABLES:?}")),
    })
}

// ---------------------------------------------------------------------------------------------
// Cells
// ---------------------------------------------------------------------------------------------

/// `median (min–max)` of `values` formatted by `f`; just the value when they all format alike.
pub fn cell(values: &[f64], f: impl Fn(f64) -> String) -> String {
    let values: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if values.is_empty() {
        return "—".to_owned();
    }
    let m = f(median(&values));
    let lo = f(values.iter().copied().fold(f64::INFINITY, f64::min));
    let hi = f(values.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    if lo == hi {
        m
    } else {
        format!("{m} ({lo}–{hi})")
    }
}

/// A whole number with thousands separators.
pub fn grouped(v: f64) -> String {
    if !v.is_finite() {
        return "—".to_owned();
    }
    let n = v.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// A number with `decimals` decimals.
pub fn fixed(decimals: usize) -> impl Fn(f64) -> String {
    move |v| {
        if v.is_finite() {
            format!("{v:.decimals$}")
        } else {
            "—".to_owned()
        }
    }
}

/// How a side reads in a table.
pub fn side_label(side: &str) -> &str {
    match side {
        "direct" => "direct",
        "polling" => "direct, polling 100 ms",
        "baton-tcp" => "Baton, TCP",
        "baton-uds" => "Baton, Unix socket",
        "baton-tcp-own" => "Baton, TCP, a connection per client",
        "campaign" => "`ElectionService/Campaign`: close → next `elected`",
        "fair-lock-hold" => "fair lock `LockService/Hold`: close → next `acquired`",
        "zrange" => "raw `ZRANGE … BYLEX LIMIT 0 10`",
        "evalsha" => "`EVALSHA`",
        "fcall" => "`FCALL`",
        other => other,
    }
}

/// How a scenario reads in a table.
pub fn scenario_label(scenario: &str) -> &str {
    match scenario {
        "lock" => "lock acquire + release, own name",
        "lock-contended" => "lock, one name, acquire (wait) + release",
        "lock-fair" => "fair lock, one name, acquire (wait) + release",
        "semaphore" => "semaphore (limit 5) acquire + release, own name",
        "semaphore-contended" => "semaphore (limit 5), one name, acquire (wait) + release",
        "ratelimit" => "rate limit `Check` (GCRA, 1000 keys)",
        "health" => "gRPC health check (no Redis)",
        other => other,
    }
}

/// Per-record derived figures.
pub mod fig {
    use crate::{names, record::Record};

    fn get(r: &Record, name: &str) -> f64 {
        r.get(name).unwrap_or(f64::NAN)
    }

    /// The window's length, seconds.
    pub fn secs(r: &Record) -> f64 {
        get(r, names::SECS).max(1e-9)
    }

    /// Operations per second.
    pub fn rate(r: &Record) -> f64 {
        get(r, names::RATE)
    }

    /// Script calls per operation.
    pub fn scripts_per_op(r: &Record) -> f64 {
        r.script_calls() as f64 / get(r, names::OPS).max(1.0)
    }

    /// Calls of `command` per operation.
    pub fn per_op(r: &Record, command: &str) -> f64 {
        r.calls(command) as f64 / get(r, names::OPS).max(1.0)
    }

    /// Baton's CPU microseconds per call.
    pub fn baton_us_per_call(r: &Record) -> f64 {
        get(r, names::BATON_CPU) * 1e6 / get(r, names::CALLS).max(1.0)
    }

    /// Redis's CPU microseconds per operation.
    pub fn redis_us_per_op(r: &Record) -> f64 {
        get(r, names::REDIS_CPU) * 1e6 / get(r, names::OPS).max(1.0)
    }

    /// Redis's CPU microseconds per script call.
    pub fn redis_us_per_script(r: &Record) -> f64 {
        get(r, names::REDIS_CPU) * 1e6 / (r.script_calls().max(1) as f64)
    }

    /// `cpu` seconds as a percentage of one core over the window.
    pub fn pct(r: &Record, cpu: &str) -> f64 {
        100.0 * get(r, cpu) / secs(r)
    }

    /// CPU microseconds of `cpu` per operation.
    pub fn us_per_op(r: &Record, cpu: &str) -> f64 {
        get(r, cpu) * 1e6 / get(r, names::OPS).max(1.0)
    }

    /// Script calls per second.
    pub fn scripts_per_sec(r: &Record) -> f64 {
        r.script_calls() as f64 / secs(r)
    }

    /// Mebibytes of `bytes`.
    pub fn mib(r: &Record, bytes: &str) -> f64 {
        get(r, bytes) / 1_048_576.0
    }

    /// Microseconds Redis spent in the script calls (or, without any, in every command) per
    /// operation, by its own `INFO commandstats`.
    pub fn command_us_per_op(r: &Record) -> f64 {
        let scripts: u64 = ["evalsha", "eval", "fcall"]
            .iter()
            .filter_map(|c| r.commands.get(*c))
            .map(|c| c.usec)
            .sum();
        let usec = if scripts > 0 {
            scripts
        } else {
            r.commands.values().map(|c| c.usec).sum()
        };
        usec as f64 / get(r, names::OPS).max(1.0)
    }
}

/// Records of `run` matching `pick`.
fn select(run: &Run, pick: impl Fn(&Record) -> bool) -> Vec<&Record> {
    run.records.iter().filter(|r| pick(r)).collect()
}

/// The distinct `key`s of `records`, in first-seen order.
fn distinct<T: PartialEq + Clone>(records: &[&Record], key: impl Fn(&Record) -> T) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for r in records {
        let k = key(r);
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out
}

/// `f(record) / f(the same scenario's direct record)` (or minus, with `diff`) within each repeat
/// and build.
fn relative(
    run: &Run,
    r: &[&Record],
    against: &str,
    f: impl Fn(&Record) -> f64,
    diff: bool,
) -> Vec<f64> {
    r.iter()
        .filter_map(|x| {
            let base = run.records.iter().find(|b| {
                b.scenario == x.scenario
                    && b.case == x.case
                    && b.clients == x.clients
                    && b.build == x.build
                    && b.repeat == x.repeat
                    && b.side == against
            })?;
            let (a, b) = (f(x), f(base));
            Some(if diff { a - b } else { a / b })
        })
        .collect()
}

fn values(r: &[&Record], f: impl Fn(&Record) -> f64) -> Vec<f64> {
    r.iter().map(|x| f(x)).collect()
}

fn get(name: &'static str) -> impl Fn(&Record) -> f64 {
    move |r| r.get(name).unwrap_or(f64::NAN)
}

fn build_label(build: &str) -> String {
    if build.is_empty() {
        String::new()
    } else {
        format!(" ({build})")
    }
}

// ---------------------------------------------------------------------------------------------
// Tables
// ---------------------------------------------------------------------------------------------

/// The command, date, machine, commit and load of each run.
fn run_table(runs: &[Run]) -> String {
    let mut md = String::new();
    for run in runs {
        let _ = writeln!(md, "- Command: `{}`", run.command);
        let _ = writeln!(
            md,
            "- Started {} and took {:.0} s; checkout {}; {}",
            run.started,
            run.seconds,
            if run.commit.is_empty() {
                "(none)"
            } else {
                &run.commit
            },
            run.machine
        );
        for b in &run.builds {
            if !b.name.is_empty() {
                let _ = writeln!(md, "- Build `{}`: {} (commit {})", b.name, b.path, b.commit);
            }
        }
        if !run.repeats.is_empty() {
            let loads: Vec<String> = run
                .repeats
                .iter()
                .map(|r| {
                    format!(
                        "{}{}: {:.2} → {:.2}",
                        r.repeat + 1,
                        build_label(&r.build),
                        r.load_before[0],
                        r.load_after[0]
                    )
                })
                .collect();
            let _ = writeln!(
                md,
                "- Load average (1 min) before → after each repeat: {}",
                loads.join("; ")
            );
        }
    }
    md
}

/// Whether the run measured several builds (a build column is shown).
fn several_builds(run: &Run) -> bool {
    run.builds.len() > 1
}

/// The unary scenarios: one operation is an acquire + release (two calls) for locks and
/// semaphores, a `Check` for rate limits, a health check.
fn unary(run: &Run) -> String {
    let records = select(run, |r| {
        matches!(
            r.scenario.as_str(),
            "lock" | "semaphore" | "ratelimit" | "health"
        )
    });
    let builds = several_builds(run);
    let mut md = String::from(
        "| scenario | clients | side | ops/s | Baton / direct | call p50 µs | call p99 µs | added p50 µs | script calls / op | Baton CPU µs / call | Redis CPU µs / op | CPU µs / op, all three | CPU % Baton / Redis / load gen |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for (scenario, clients, side, build) in distinct(&records, |r| {
        (
            r.scenario.clone(),
            r.clients,
            r.side.clone(),
            r.build.clone(),
        )
    }) {
        let r: Vec<&Record> = records
            .iter()
            .copied()
            .filter(|r| {
                r.scenario == scenario && r.clients == clients && r.side == side && r.build == build
            })
            .collect();
        let baton = side.starts_with("baton");
        let has_direct = baton && scenario != "health";
        let _ = writeln!(
            md,
            "| {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} / {} |",
            scenario_label(&scenario),
            clients,
            side_label(&side),
            if builds {
                build_label(&build)
            } else {
                String::new()
            },
            cell(&values(&r, fig::rate), grouped),
            if has_direct {
                cell(&relative(run, &r, "direct", fig::rate, false), fixed(2))
            } else {
                "—".into()
            },
            cell(&values(&r, get(names::P50)), grouped),
            cell(&values(&r, get(names::P99)), grouped),
            if has_direct {
                cell(&relative(run, &r, "direct", get(names::P50), true), grouped)
            } else {
                "—".into()
            },
            cell(&values(&r, fig::scripts_per_op), fixed(2)),
            if baton {
                cell(&values(&r, fig::baton_us_per_call), fixed(1))
            } else {
                "—".into()
            },
            cell(&values(&r, fig::redis_us_per_op), fixed(1)),
            cell(
                &values(&r, |x| fig::us_per_op(x, names::BATON_CPU)
                    + fig::us_per_op(x, names::REDIS_CPU)
                    + fig::us_per_op(x, names::LOADGEN_CPU)),
                fixed(1)
            ),
            cell(&values(&r, |x| fig::pct(x, names::BATON_CPU)), fixed(0)),
            cell(&values(&r, |x| fig::pct(x, names::REDIS_CPU)), fixed(0)),
            cell(&values(&r, |x| fig::pct(x, names::LOADGEN_CPU)), fixed(0)),
        );
    }
    md
}

/// Baton's CPU per call beside Redis's CPU per script call in the same window, for each unary
/// scenario that calls Redis, through Baton.
fn cpu(run: &Run) -> String {
    let records = select(run, |r| {
        matches!(r.scenario.as_str(), "lock" | "semaphore" | "ratelimit")
            && r.side.starts_with("baton")
    });
    let builds = several_builds(run);
    let mut md = String::from(
        "| scenario | clients | side | Baton CPU µs / call | Redis CPU µs / script call | Baton ÷ Redis | Baton / direct ops/s | Baton ≤ Redis? |\n|---|---:|---|---:|---:|---:|---:|---|\n",
    );
    for (scenario, clients, side, build) in distinct(&records, |r| {
        (
            r.scenario.clone(),
            r.clients,
            r.side.clone(),
            r.build.clone(),
        )
    }) {
        let r: Vec<&Record> = records
            .iter()
            .copied()
            .filter(|r| {
                r.scenario == scenario && r.clients == clients && r.side == side && r.build == build
            })
            .collect();
        let ratios = values(&r, |x| {
            fig::baton_us_per_call(x) / fig::redis_us_per_script(x)
        });
        let finite: Vec<f64> = ratios.iter().copied().filter(|v| v.is_finite()).collect();
        let met = if finite.is_empty() {
            "—"
        } else if median(&finite) <= 1.0 {
            "yes"
        } else {
            "**no**"
        };
        let _ = writeln!(
            md,
            "| {} | {} | {}{} | {} | {} | {} | {} | {} |",
            scenario_label(&scenario),
            clients,
            side_label(&side),
            if builds {
                build_label(&build)
            } else {
                String::new()
            },
            cell(&values(&r, fig::baton_us_per_call), fixed(1)),
            cell(&values(&r, fig::redis_us_per_script), fixed(1)),
            cell(&ratios, fixed(2)),
            cell(&relative(run, &r, "direct", fig::rate, false), fixed(2)),
            met,
        );
    }
    md
}

/// The contended scenarios.
fn contention(run: &Run) -> String {
    let records = select(run, |r| {
        matches!(
            r.scenario.as_str(),
            "lock-contended" | "lock-fair" | "semaphore-contended"
        )
    });
    let builds = several_builds(run);
    let mut md = String::from(
        "| scenario | clients | side | grants/s | Baton / direct | call p50 µs | call p99 µs | handoff p50 µs | handoff p99 µs | to another p50 / p99 µs | re-grants | Jain's index | timeouts | script calls / grant | PUBLISH / grant | CPU % Baton / Redis / load gen |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|\n",
    );
    for (scenario, clients, side, build) in distinct(&records, |r| {
        (
            r.scenario.clone(),
            r.clients,
            r.side.clone(),
            r.build.clone(),
        )
    }) {
        let r: Vec<&Record> = records
            .iter()
            .copied()
            .filter(|r| {
                r.scenario == scenario && r.clients == clients && r.side == side && r.build == build
            })
            .collect();
        let lock = scenario.starts_with("lock");
        let opt = |name: &'static str| {
            if lock {
                cell(&values(&r, get(name)), grouped)
            } else {
                "—".into()
            }
        };
        let _ = writeln!(
            md,
            "| {} | {} | {}{} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} | {} | {} / {} / {} |",
            scenario_label(&scenario),
            clients,
            side_label(&side),
            if builds {
                build_label(&build)
            } else {
                String::new()
            },
            cell(&values(&r, fig::rate), grouped),
            if side == "direct" {
                "—".into()
            } else {
                cell(&relative(run, &r, "direct", fig::rate, false), fixed(2))
            },
            cell(&values(&r, get(names::P50)), grouped),
            cell(&values(&r, get(names::P99)), grouped),
            opt(names::HANDOFF_P50),
            opt(names::HANDOFF_P99),
            opt(names::OTHER_P50),
            opt(names::OTHER_P99),
            if lock {
                cell(&values(&r, |x| 100.0 * get(names::REGRANTS)(x)), |v| {
                    format!("{v:.0} %")
                })
            } else {
                "—".into()
            },
            cell(&values(&r, get(names::JAIN)), fixed(3)),
            cell(&values(&r, get(names::TIMEOUTS)), grouped),
            cell(&values(&r, fig::scripts_per_op), fixed(2)),
            cell(&values(&r, |x| fig::per_op(x, "publish")), fixed(2)),
            cell(&values(&r, |x| fig::pct(x, names::BATON_CPU)), fixed(0)),
            cell(&values(&r, |x| fig::pct(x, names::REDIS_CPU)), fixed(0)),
            cell(&values(&r, |x| fig::pct(x, names::LOADGEN_CPU)), fixed(0)),
        );
    }
    md
}

/// Leases held with keepalive.
fn leases(run: &Run) -> String {
    let records = select(run, |r| r.scenario == "leases");
    let builds = several_builds(run);
    let mut md = String::from(
        "| leases | side | held | time to open all, s | script calls/s | renewals seen/s | Baton CPU % of one core | Baton RSS MiB | Redis CPU % | load gen CPU % | all released after |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for (clients, side, build) in
        distinct(&records, |r| (r.clients, r.side.clone(), r.build.clone()))
    {
        let r: Vec<&Record> = records
            .iter()
            .copied()
            .filter(|r| r.clients == clients && r.side == side && r.build == build)
            .collect();
        let released = r.iter().all(|x| x.get(names::RELEASED) == Some(1.0));
        let _ = writeln!(
            md,
            "| {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            grouped(clients as f64),
            side_label(&side),
            if builds {
                build_label(&build)
            } else {
                String::new()
            },
            cell(&values(&r, get(names::HELD)), grouped),
            cell(&values(&r, get(names::OPEN_SECS)), fixed(1)),
            cell(&values(&r, fig::scripts_per_sec), grouped),
            cell(
                &values(&r, |x| get(names::RENEWALS)(x) / fig::secs(x)),
                grouped
            ),
            cell(&values(&r, |x| fig::pct(x, names::BATON_CPU)), fixed(1)),
            if side.starts_with("baton") {
                cell(&values(&r, |x| fig::mib(x, names::BATON_RSS)), fixed(1))
            } else {
                "—".into()
            },
            cell(&values(&r, |x| fig::pct(x, names::REDIS_CPU)), fixed(1)),
            cell(&values(&r, |x| fig::pct(x, names::LOADGEN_CPU)), fixed(1)),
            if released { "yes" } else { "**no**" },
        );
    }
    md
}

/// Baton's memory idle and after the run.
fn idle(run: &Run) -> String {
    let records = select(run, |r| r.scenario == "idle");
    let mut md =
        String::from("| build | idle RSS MiB | RSS after the run MiB |\n|---|---:|---:|\n");
    for build in distinct(&records, |r| r.build.clone()) {
        let r: Vec<&Record> = records
            .iter()
            .copied()
            .filter(|r| r.build == build)
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            if build.is_empty() {
                "this build"
            } else {
                &build
            },
            cell(&values(&r, |x| fig::mib(x, names::IDLE_RSS)), fixed(1)),
            cell(&values(&r, |x| fig::mib(x, names::BATON_RSS)), fixed(1)),
        );
    }
    md
}

/// Leader failover beside the fair lock handoff.
fn leader_failover(run: &Run) -> String {
    let records = select(run, |r| r.scenario == "leader-failover");
    let mut md = String::from(
        "| handoff | candidates | handoffs | p50 µs | p99 µs | max µs | mean µs | Baton CPU µs / handoff |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (side, clients, build) in
        distinct(&records, |r| (r.side.clone(), r.clients, r.build.clone()))
    {
        let r: Vec<&Record> = records
            .iter()
            .copied()
            .filter(|r| r.side == side && r.clients == clients && r.build == build)
            .collect();
        let _ = writeln!(
            md,
            "| {}{} | {} | {} | {} | {} | {} | {} | {} |",
            side_label(&side),
            build_label(&build),
            clients,
            cell(&values(&r, get(names::OPS)), grouped),
            cell(&values(&r, get(names::P50)), grouped),
            cell(&values(&r, get(names::P99)), grouped),
            cell(&values(&r, get(names::MAX)), grouped),
            cell(&values(&r, get(names::MEAN)), grouped),
            cell(
                &values(&r, |x| fig::us_per_op(x, names::BATON_CPU)),
                fixed(1)
            ),
        );
    }
    md
}

/// Loading the dictionary.
fn autocomplete_load(run: &Run) -> String {
    let r = select(run, |r| r.scenario == "autocomplete" && r.case == "load");
    let mut md = String::from(
        "| terms | load time, s | terms/s | script calls | longest script, ms | scripts ≥ 1 ms | scripts ≥ 5 ms | longest command in a script, ms | `Add`s sent again | Redis CPU, s | Baton CPU, s | load gen CPU, s | Redis `used_memory` growth, MiB | bytes per term |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    if r.is_empty() {
        return md;
    }
    let terms = |x: &Record| get(names::TERMS)(x).max(1.0);
    let _ = writeln!(
        md,
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        cell(&values(&r, get(names::TERMS)), grouped),
        cell(&values(&r, get(names::TOOK)), fixed(1)),
        cell(&values(&r, |x| terms(x) / get(names::TOOK)(x)), grouped),
        cell(&values(&r, |x| x.script_calls() as f64), grouped),
        cell(
            &values(&r, |x| x.get(SCRIPT_MAX).unwrap_or(f64::NAN) / 1000.0),
            fixed(1)
        ),
        cell(
            &values(&r, |x| x.get(SLOW_1MS).unwrap_or(f64::NAN)),
            grouped
        ),
        cell(
            &values(&r, |x| x.get(SLOW_5MS).unwrap_or(f64::NAN)),
            grouped
        ),
        cell(
            &values(&r, |x| x.get(COMMAND_MAX).unwrap_or(f64::NAN) / 1000.0),
            fixed(1)
        ),
        cell(
            &values(&r, |x| x.get(ADD_RETRIED).unwrap_or(f64::NAN)),
            grouped
        ),
        cell(&values(&r, get(names::REDIS_CPU)), fixed(1)),
        cell(&values(&r, get(names::BATON_CPU)), fixed(1)),
        cell(&values(&r, get(names::LOADGEN_CPU)), fixed(1)),
        cell(&values(&r, |x| fig::mib(x, names::MEMORY)), fixed(0)),
        cell(&values(&r, |x| get(names::MEMORY)(x) / terms(x)), grouped),
    );
    md
}

/// What each query kind reads in a table.
fn case_label(case: &str) -> &str {
    match case {
        "prefix-lex" => "prefix of 1-5 characters, lexicographic",
        "prefix-score" => "prefix of 1-5 characters, by score",
        "automatic" => "automatic mode, 1-5 characters",
        "word-prefix" => "word prefix of 2-4 characters",
        "contains-lex" => "contains 3-5 characters, lexicographic",
        "contains-score" => "contains 3-5 characters, by score",
        "fuzzy-lex" => "fuzzy: prefix of 3-9 characters with 1-2 typos, lexicographic",
        "fuzzy-score" => "fuzzy: the same, by score",
        "health" => "gRPC health check (no Redis)",
        other => other,
    }
}

/// Completion latency per query kind and side.
fn autocomplete(run: &Run) -> String {
    let records = select(run, |r| {
        r.scenario == "autocomplete"
            && !matches!(
                r.case.as_str(),
                "load" | "memory" | "memory-features" | "baseline" | "layout" | "build-ranked"
            )
    });
    let mut md = String::from(
        "| query | side | requests/s | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | results / request | Redis µs / request (commands) | longest script, ms | CPU µs / request: load gen | Baton | Redis |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (case, side) in distinct(&records, |r| (r.case.clone(), r.side.clone())) {
        let r: Vec<&Record> = records
            .iter()
            .copied()
            .filter(|r| r.case == case && r.side == side)
            .collect();
        let side_text = match side.as_str() {
            "baton-tcp" if case == "health" => "Baton",
            "baton-tcp" => "Baton `Complete`",
            "direct" if case == "prefix-score" => "direct `ranked.lua`",
            "direct" => "direct `prefix.lua`",
            other => side_label(other),
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            case_label(&case),
            side_text,
            cell(&values(&r, fig::rate), grouped),
            cell(&values(&r, get(names::P50)), grouped),
            cell(&values(&r, get(names::P90)), grouped),
            cell(&values(&r, get(names::P99)), grouped),
            cell(&values(&r, get(names::P999)), grouped),
            cell(&values(&r, get(names::MAX)), grouped),
            cell(
                &values(&r, |x| get(names::RESULTS)(x) / get(names::OPS)(x).max(1.0)),
                fixed(1)
            ),
            cell(&values(&r, fig::command_us_per_op), fixed(1)),
            cell(
                &values(&r, |x| x.get(SCRIPT_MAX).unwrap_or(f64::NAN) / 1000.0),
                fixed(1)
            ),
            cell(
                &values(&r, |x| fig::us_per_op(x, names::LOADGEN_CPU)),
                fixed(1)
            ),
            if side.starts_with("baton") {
                cell(
                    &values(&r, |x| fig::us_per_op(x, names::BATON_CPU)),
                    fixed(1),
                )
            } else {
                "—".into()
            },
            cell(
                &values(&r, |x| fig::us_per_op(x, names::REDIS_CPU)),
                fixed(1)
            ),
        );
    }
    md
}

/// The dictionary beside the baselines loaded in the same run: Baton through `Add`, the lex
/// members alone in one sorted set by raw `ZADD`s, and RediSearch's `FT.SUGADD` when measured.
fn autocomplete_baseline(run: &Run) -> String {
    let records = select(run, |r| {
        r.scenario == "autocomplete" && matches!(r.case.as_str(), "load" | "baseline")
    });
    let mut md = String::from(
        "| what | server | load time, s | terms/s | `used_memory` growth, MiB | bytes per term |\n|---|---|---:|---:|---:|---:|\n",
    );
    for (case, side) in distinct(&records, |r| (r.case.clone(), r.side.clone())) {
        let r: Vec<&Record> = records
            .iter()
            .copied()
            .filter(|r| r.case == case && r.side == side)
            .collect();
        let (what, server) = match (case.as_str(), side.split_once(' ')) {
            ("load", _) => (
                "Baton `Add`, batches of 1000, 4 in flight",
                "the run's Redis",
            ),
            (_, None) => (
                "one bare sorted set, raw `ZADD`s of 1000, 4 in flight",
                "the run's Redis",
            ),
            (_, Some(("zadd", server))) => (
                "one bare sorted set, raw `ZADD`s of 1000, 4 in flight",
                server,
            ),
            (_, Some((_, server))) => (
                "RediSearch `FT.SUGADD`, pipelines of 1000, 4 in flight",
                server,
            ),
        };
        let terms = |x: &Record| get(names::TERMS)(x).max(1.0);
        let _ = writeln!(
            md,
            "| {what} | {server} | {} | {} | {} | {} |",
            cell(&values(&r, get(names::TOOK)), fixed(1)),
            cell(&values(&r, |x| terms(x) / get(names::TOOK)(x)), grouped),
            cell(&values(&r, |x| fig::mib(x, names::MEMORY)), fixed(0)),
            cell(&values(&r, |x| get(names::MEMORY)(x) / terms(x)), grouped),
        );
    }
    md
}

/// Memory per term of the indexes each set of match modes reads (sums of `MEMORY USAGE` by kind
/// of key), beside the baselines of the same terms.
fn autocomplete_modes(run: &Run) -> String {
    let declared = select(run, |r| {
        r.scenario == "autocomplete" && r.case == "memory-features"
    });
    if declared.is_empty() {
        return autocomplete_modes_by_key(run);
    }
    let mut md = String::from(
        "| dictionary declared with | serves | keys | load time, s | bytes per term (`MEMORY USAGE`) | bytes per term (`used_memory` growth) |\n|---|---|---|---:|---:|---:|\n",
    );
    for side in distinct(&declared, |r| r.side.clone()) {
        let r: Vec<&Record> = declared
            .iter()
            .copied()
            .filter(|r| r.side == side)
            .collect();
        let (features, serves, keys) = match side.as_str() {
            "none" => (
                "no feature",
                "prefix (lexicographic), exact, fuzzy",
                "`l:XX`, `data`, `h`",
            ),
            "ranked" => (
                "`RANKED`",
                "… and by score",
                "… and `b:XX`, `r:P`, `t:P`, `top`",
            ),
            "ranked+words" => ("`RANKED`, `WORDS`", "… and word prefix", "… and `w:W`, `v`"),
            "ranked+words+substring" => (
                "`RANKED`, `WORDS`, `SUBSTRING`",
                "… and suffix, contains, automatic",
                "… and `vg:G`",
            ),
            other => (other, "", ""),
        };
        let per_term = |x: &Record| {
            x.values
                .iter()
                .filter(|(k, _)| k.starts_with("bytes:"))
                .map(|(_, v)| *v)
                .sum::<f64>()
                / get(names::TERMS)(x).max(1.0)
        };
        let _ = writeln!(
            md,
            "| {features} | {serves} | {keys} | {} | {} | {} |",
            cell(&values(&r, get(names::TOOK)), |v| format!("{v:.1}")),
            cell(&values(&r, per_term), grouped),
            cell(
                &values(&r, |x| get(names::MEMORY)(x)
                    / get(names::TERMS)(x).max(1.0)),
                grouped
            ),
        );
    }
    let baselines = select(run, |r| {
        r.scenario == "autocomplete" && r.case == "baseline"
    });
    for side in distinct(&baselines, |r| r.side.clone()) {
        let r: Vec<&Record> = baselines
            .iter()
            .copied()
            .filter(|r| r.side == side)
            .collect();
        let what = match side.split_once(' ') {
            None => "one bare sorted set of lex members, the run's Redis".to_owned(),
            Some(("zadd", server)) => format!("one bare sorted set of lex members, {server}"),
            Some((_, server)) => format!("RediSearch `FT.SUGADD`, {server}"),
        };
        let _ = writeln!(
            md,
            "| {what} | prefix | — | {} | — | {} |",
            cell(&values(&r, get(names::TOOK)), |v| format!("{v:.1}")),
            cell(
                &values(&r, |x| get(names::MEMORY)(x)
                    / get(names::TERMS)(x).max(1.0)),
                grouped
            ),
        );
    }
    md
}

/// Memory per set of modes as per-key sums of one dictionary with every index (runs made before
/// dictionaries could declare their features).
fn autocomplete_modes_by_key(run: &Run) -> String {
    let memory = select(run, |r| r.scenario == "autocomplete" && r.case == "memory");
    let mut md = String::from("| what | keys | bytes per term |\n|---|---|---:|\n");
    let rows: [(&str, &str, &[&str]); 4] = [
        (
            "prefix, lexicographic (and exact)",
            "`l:XX`, `data`, `h`",
            &["l", "data", "h"],
        ),
        (
            "prefix, lexicographic and by score",
            "… and `b:XX`, `r:P`, `t:P`, `top`",
            &["l", "data", "h", "b", "r", "t", "top"],
        ),
        (
            "… and word prefix",
            "… and `w:W`, `v`",
            &["l", "data", "h", "b", "r", "t", "top", "w", "v"],
        ),
        (
            "every mode (suffix, contains, automatic)",
            "… and `vg:G`",
            &["l", "data", "h", "b", "r", "t", "top", "w", "v", "vg"],
        ),
    ];
    for (what, keys, kinds) in rows {
        let _ = writeln!(
            md,
            "| Baton: {what} | {keys} | {} |",
            cell(
                &values(&memory, |x| {
                    kinds
                        .iter()
                        .map(|k| x.get(&format!("bytes:{k}")).unwrap_or(0.0))
                        .sum::<f64>()
                        / get(names::TERMS)(x).max(1.0)
                }),
                grouped
            ),
        );
    }
    let baselines = select(run, |r| {
        r.scenario == "autocomplete" && r.case == "baseline"
    });
    for side in distinct(&baselines, |r| r.side.clone()) {
        let r: Vec<&Record> = baselines
            .iter()
            .copied()
            .filter(|r| r.side == side)
            .collect();
        let what = match side.split_once(' ') {
            None => "one bare sorted set of lex members (`used_memory` growth), the run's Redis"
                .to_owned(),
            Some(("zadd", server)) => {
                format!("one bare sorted set of lex members (`used_memory` growth), {server}")
            }
            Some((_, server)) => {
                format!("RediSearch `FT.SUGADD` (`used_memory` growth), {server}")
            }
        };
        let _ = writeln!(
            md,
            "| {what} | — | {} |",
            cell(
                &values(&r, |x| get(names::MEMORY)(x)
                    / get(names::TERMS)(x).max(1.0)),
                grouped
            ),
        );
    }
    md
}

/// Memory per kind of key.
fn autocomplete_memory(run: &Run) -> String {
    let r = select(run, |r| r.scenario == "autocomplete" && r.case == "memory");
    let mut md = String::from("| keys | count | MiB | bytes per term |\n|---|---:|---:|---:|\n");
    let kinds: BTreeSet<String> = r
        .iter()
        .flat_map(|x| x.values.keys())
        .filter_map(|k| k.strip_prefix("bytes:").map(str::to_owned))
        .collect();
    let label = |k: &str| -> String {
        match k {
            "l" => "`l:XX`: every term in lexicographic order, by first byte".into(),
            "data" => "`data`: scores, display texts, payloads".into(),
            "h" => "`h`: which ranked sets exist".into(),
            "b" => "`b:XX`: ranked sets of first bytes".into(),
            "t" => "`t:P`: deep sets of 3-character prefixes".into(),
            "top" => "`top`: the best-ranked terms".into(),
            "r" => "`r:P`: ranked sets of short prefixes".into(),
            "w" => "`w:W`: the terms of each word".into(),
            "v" => "`v`: the vocabulary".into(),
            "vg" => "`vg:G`: vocabulary words of each gram".into(),
            other => format!("`{other}`"),
        }
    };
    let mut total = Vec::new();
    for kind in &kinds {
        let bytes = values(&r, |x| x.get(&format!("bytes:{kind}")).unwrap_or(f64::NAN));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            label(kind),
            cell(
                &values(&r, |x| x.get(&format!("keys:{kind}")).unwrap_or(f64::NAN)),
                grouped
            ),
            cell(
                &bytes.iter().map(|b| b / 1_048_576.0).collect::<Vec<_>>(),
                fixed(1)
            ),
            cell(
                &values(&r, |x| x.get(&format!("bytes:{kind}")).unwrap_or(f64::NAN)
                    / get(names::TERMS)(x).max(1.0)),
                grouped
            ),
        );
        total.push(kind.clone());
    }
    let sum = |x: &Record| -> f64 {
        total
            .iter()
            .filter_map(|k| x.get(&format!("bytes:{k}")))
            .sum()
    };
    let _ = writeln!(
        md,
        "| all | | {} | {} |",
        cell(&values(&r, |x| sum(x) / 1_048_576.0), fixed(1)),
        cell(
            &values(&r, |x| sum(x) / get(names::TERMS)(x).max(1.0)),
            grouped
        ),
    );
    md
}

/// Redis Functions against `EVALSHA`.
fn functions(run: &Run) -> String {
    let records = select(run, |r| r.scenario == "functions");
    let mut md = String::from(
        "| operation | clients | called as | ops/s | `FCALL` / `EVALSHA` ops/s | call p50 µs | call p99 µs | Redis CPU µs / script call | Redis µs / script call (commandstats) | script calls counted / op |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for (case, clients, side) in distinct(&records, |r| (r.case.clone(), r.clients, r.side.clone()))
    {
        let r: Vec<&Record> = records
            .iter()
            .copied()
            .filter(|r| r.case == case && r.clients == clients && r.side == side)
            .collect();
        let what = match case.as_str() {
            "lock-cycle" => "lock acquire + release (2 calls)",
            "gcra" => "GCRA decision (1 call)",
            other => other,
        };
        let per_call = |x: &Record| {
            let (calls, usec) = ["evalsha", "fcall"]
                .iter()
                .filter_map(|c| x.commands.get(*c))
                .fold((0u64, 0u64), |(n, u), c| (n + c.calls, u + c.usec));
            usec as f64 / calls.max(1) as f64
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            what,
            clients,
            side_label(&side),
            cell(&values(&r, fig::rate), grouped),
            if side == "fcall" {
                cell(&relative(run, &r, "evalsha", fig::rate, false), fixed(2))
            } else {
                "—".into()
            },
            cell(&values(&r, get(names::P50)), grouped),
            cell(&values(&r, get(names::P99)), grouped),
            cell(&values(&r, fig::redis_us_per_script), fixed(1)),
            cell(&values(&r, per_call), fixed(1)),
            cell(&values(&r, fig::scripts_per_op), fixed(2)),
        );
    }
    md
}

/// Failover times of the Redis deployments.
fn redis_failover(run: &Run) -> String {
    let records = select(run, |r| r.scenario == "redis-failover");
    let mut md = String::from(
        "| deployment | settings | failovers | median, s | min–max, s |\n|---|---|---:|---:|---|\n",
    );
    for (side, case) in distinct(&records, |r| (r.side.clone(), r.case.clone())) {
        let took: Vec<f64> = records
            .iter()
            .filter(|r| r.side == side && r.case == case)
            .filter_map(|r| r.get(names::TOOK))
            .collect();
        let lo = took.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = took.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.2}–{:.2} |",
            match side.as_str() {
                "sentinel" =>
                    "Sentinel: SIGKILL of the master → a Sentinel names the promoted replica",
                "cluster" => "Cluster (3 masters, 1 replica each): SIGKILL of a master → healthy",
                other => other,
            },
            case,
            took.len(),
            median(&took),
            lo,
            hi
        );
    }
    md
}

/// Figures of each build side by side, for comparing builds in one run.
fn builds(run: &Run) -> String {
    let names: Vec<String> = run.builds.iter().map(|b| b.name.clone()).collect();
    let mut md = String::new();
    let _ = write!(md, "| scenario | clients | side | figure |");
    for n in &names {
        let _ = write!(md, " {n} |");
    }
    if names.len() == 2 {
        let _ = write!(md, " {} / {} | ranges overlap |", names[1], names[0]);
    }
    md.push('\n');
    let _ = write!(md, "|---|---:|---|---|");
    for _ in &names {
        md.push_str("---:|");
    }
    if names.len() == 2 {
        md.push_str("---:|---|");
    }
    md.push('\n');
    type Figure = (&'static str, fn(&Record) -> f64, usize);
    let unary: [Figure; 4] = [
        ("Baton / direct ops/s", |_| f64::NAN, 2),
        ("Baton CPU µs / call", fig::baton_us_per_call, 1),
        ("call p50 µs", |r| r.get(names::P50).unwrap_or(f64::NAN), 0),
        ("script calls / op", fig::scripts_per_op, 2),
    ];
    let contended: [Figure; 4] = [
        ("Baton / direct grants/s", |_| f64::NAN, 2),
        (
            "handoff p50 µs",
            |r| r.get(names::HANDOFF_P50).unwrap_or(f64::NAN),
            0,
        ),
        (
            "handoff p99 µs",
            |r| r.get(names::HANDOFF_P99).unwrap_or(f64::NAN),
            0,
        ),
        ("script calls / grant", fig::scripts_per_op, 2),
    ];
    let health: [Figure; 2] = [
        ("Baton CPU µs / call", fig::baton_us_per_call, 1),
        ("call p50 µs", |r| r.get(names::P50).unwrap_or(f64::NAN), 0),
    ];
    let lease: [Figure; 3] = [
        (
            "Baton CPU % of one core",
            |r| fig::pct(r, names::BATON_CPU),
            1,
        ),
        ("Baton RSS MiB", |r| fig::mib(r, names::BATON_RSS), 1),
        ("script calls/s", fig::scripts_per_sec, 0),
    ];
    let mut cpu_ratios = Vec::new();
    let keys = distinct(&select(run, |r| r.side.starts_with("baton")), |r| {
        (r.scenario.clone(), r.clients, r.side.clone())
    });
    for (scenario, clients, side) in keys {
        let figures: &[Figure] = match scenario.as_str() {
            "lock" | "semaphore" | "ratelimit" => &unary,
            "lock-contended" | "lock-fair" | "semaphore-contended" => &contended,
            "leases" => &lease,
            "health" => &health,
            _ => continue,
        };
        for (i, (what, f, decimals)) in figures.iter().enumerate() {
            let mut medians = Vec::new();
            let mut ranges = Vec::new();
            let mut row = String::new();
            for n in &names {
                let r = select(run, |r| {
                    r.scenario == scenario
                        && r.clients == clients
                        && r.side == side
                        && &r.build == n
                });
                let v = if i == 0 && figures.len() == 4 {
                    relative(run, &r, "direct", fig::rate, false)
                } else {
                    values(&r, f)
                };
                medians.push(median(&v));
                let finite = v.iter().copied().filter(|x| x.is_finite());
                ranges.push((
                    finite.clone().fold(f64::INFINITY, f64::min),
                    finite.fold(f64::NEG_INFINITY, f64::max),
                ));
                let _ = write!(row, " {} |", cell(&v, fixed(*decimals)));
            }
            // A figure the scenario does not have (a semaphore's handoff) gets no row.
            if medians.iter().all(|m| !m.is_finite()) {
                continue;
            }
            let _ = write!(
                md,
                "| {} | {} | {} | {} |{row}",
                scenario_label(&scenario),
                clients,
                side_label(&side),
                what
            );
            if let [a, b] = medians[..]
                && *what == "Baton CPU µs / call"
                && (b / a).is_finite()
            {
                cpu_ratios.push(b / a);
            }
            if let ([a, b], [(a_lo, a_hi), (b_lo, b_hi)]) = (&medians[..], &ranges[..]) {
                // Compared at the precision shown.
                let decimals = *decimals;
                let round = |x: f64| format!("{x:.decimals$}").parse::<f64>().unwrap_or(x);
                let overlap = round(a_lo.max(*b_lo)) <= round(a_hi.min(*b_hi));
                let _ = write!(
                    md,
                    " {} | {} |",
                    fixed(2)(b / a),
                    if overlap { "yes" } else { "**no**" }
                );
            }
            md.push('\n');
        }
    }
    if names.len() == 2 && !cpu_ratios.is_empty() {
        let above = cpu_ratios.iter().filter(|r| **r > 1.0).count();
        let _ = writeln!(
            md,
            "\nBaton CPU µs / call, {} / {} over the {} rows above: median {:.2}, above 1 in {}.",
            names[1],
            names[0],
            cpu_ratios.len(),
            median(&cpu_ratios),
            above
        );
    }
    md
}

pub mod layouts;
pub mod targets;

/// The records of `scenario` in `runs`, of each run's last build (the current one when a run
/// compares builds).
pub(crate) fn current<'a>(runs: &'a [Run], scenario: &str) -> Vec<(&'a Run, &'a Record)> {
    let mut out = Vec::new();
    for run in runs {
        let build = run
            .builds
            .last()
            .map(|b| b.name.clone())
            .unwrap_or_default();
        for r in &run.records {
            if r.scenario == scenario && r.build == build {
                out.push((run, r));
            }
        }
    }
    out
}

/// The medians of `f` per distinct key, as used by the targets.
pub(crate) fn median_of<'a>(
    rows: impl Iterator<Item = (&'a Run, &'a Record)>,
    f: impl Fn(&Run, &Record) -> Option<f64>,
) -> Option<f64> {
    let v: Vec<f64> = rows
        .filter_map(|(run, r)| f(run, r))
        .filter(|v| v.is_finite())
        .collect();
    (!v.is_empty()).then(|| median(&v))
}

/// The same-repeat ratio `f(r) / f(direct)` of one record, against `against`.
pub(crate) fn ratio_to(
    run: &Run,
    r: &Record,
    against: &str,
    f: impl Fn(&Record) -> f64,
) -> Option<f64> {
    let base = run.records.iter().find(|b| {
        b.scenario == r.scenario
            && b.case == r.case
            && b.clients == r.clients
            && b.build == r.build
            && b.repeat == r.repeat
            && b.side == against
    })?;
    Some(f(r) / f(base))
}

/// The same-repeat difference `f(r) - f(direct)` of one record.
pub(crate) fn diff_to(
    run: &Run,
    r: &Record,
    against: &str,
    f: impl Fn(&Record) -> f64,
) -> Option<f64> {
    let base = run.records.iter().find(|b| {
        b.scenario == r.scenario
            && b.case == r.case
            && b.clients == r.clients
            && b.build == r.build
            && b.repeat == r.repeat
            && b.side == against
    })?;
    Some(f(r) - f(base))
}
