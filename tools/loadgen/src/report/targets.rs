//! The targets the issues set, each evaluated on the runs a marker names: the figure measured
//! (medians over repeats) and whether it meets the target. A target whose scenario is in none
//! of the runs says so.

use std::fmt::Write as _;

use super::{current, diff_to, fig, median_of, ratio_to};
use crate::{names, record::Record, record::Run};

/// What a target's evaluation found: the figure as text, and whether it is met (`None`: for
/// information, or not measured).
type Found = (String, Option<bool>);

/// One target.
struct Target {
    /// The issue that set it (0: none, a reference figure).
    issue: u32,
    /// What is measured.
    what: &'static str,
    /// The target.
    target: &'static str,
    /// Its evaluation.
    eval: fn(&[Run]) -> Option<Found>,
}

const SIDES: [(&str, &str); 2] = [("baton-tcp", "TCP"), ("baton-uds", "Unix socket")];

/// `f` over the records of `scenario` with `clients` on `side`, as a median.
fn med(
    runs: &[Run],
    scenario: &str,
    clients: usize,
    side: &str,
    f: impl Fn(&Run, &Record) -> Option<f64>,
) -> Option<f64> {
    median_of(
        current(runs, scenario)
            .into_iter()
            .filter(|(_, r)| r.clients == clients && r.side == side),
        f,
    )
}

/// Per transport: `f`'s median, formatted, and whether it passes `ok`.
fn per_side(
    runs: &[Run],
    scenario: &str,
    clients: usize,
    f: impl Fn(&Run, &Record) -> Option<f64> + Copy,
    format: impl Fn(f64) -> String,
    ok: impl Fn(f64) -> bool,
) -> Option<Found> {
    let mut parts = Vec::new();
    let mut met = true;
    for (side, label) in SIDES {
        if let Some(v) = med(runs, scenario, clients, side, f) {
            parts.push(format!("{} ({label})", format(v)));
            met &= ok(v);
        }
    }
    (!parts.is_empty()).then(|| (parts.join(", "), Some(met)))
}

fn value(name: &'static str) -> impl Fn(&Run, &Record) -> Option<f64> + Copy {
    move |_, r| r.get(name)
}

fn autocomplete_p99(runs: &[Run], case: &str, limit_us: f64) -> Option<Found> {
    let terms = median_of(
        current(runs, "autocomplete")
            .into_iter()
            .filter(|(_, r)| r.case == "load"),
        value(names::TERMS),
    )?;
    let p99 = median_of(
        current(runs, "autocomplete")
            .into_iter()
            .filter(|(_, r)| r.case == case && r.side == "baton-tcp"),
        value(names::P99),
    )?;
    Some((
        format!("{:.2} ms on {} terms", p99 / 1000.0, super::grouped(terms)),
        Some(p99 < limit_us && terms >= 1_000_000.0),
    ))
}

fn load_time(runs: &[Run], limit_s: f64) -> Option<Found> {
    let rows = || {
        current(runs, "autocomplete")
            .into_iter()
            .filter(|(_, r)| r.case == "load")
    };
    let took = median_of(rows(), value(names::TOOK))?;
    let terms = median_of(rows(), value(names::TERMS))?;
    Some((
        format!("{took:.1} s for {} terms", super::grouped(terms)),
        Some(took < limit_s && terms >= 1_000_000.0),
    ))
}

/// A figure of the dictionary of the autocomplete run declared with feature set `label` (the
/// `memory-features` records), and its term count.
fn feature_set(runs: &[Run], label: &str, name: &'static str) -> Option<(f64, f64)> {
    let rows = || {
        current(runs, "autocomplete")
            .into_iter()
            .filter(move |(_, r)| r.case == "memory-features" && r.side == label)
    };
    Some((
        median_of(rows(), value(name))?,
        median_of(rows(), value(names::TERMS))?,
    ))
}

fn baton_cpu(runs: &[Run], scenario: &str) -> Option<Found> {
    per_side(
        runs,
        scenario,
        64,
        |_, r| Some(fig::baton_us_per_call(r)),
        |v| format!("{v:.1} µs"),
        |v| v < 20.0,
    )
}

fn cpu_against_redis(runs: &[Run], clients: usize, side: &str) -> Option<Found> {
    let mut parts = Vec::new();
    let mut met = true;
    for scenario in ["lock", "semaphore", "ratelimit"] {
        let baton = med(runs, scenario, clients, side, |_, r| {
            Some(fig::baton_us_per_call(r))
        });
        let redis = med(runs, scenario, clients, side, |_, r| {
            Some(fig::redis_us_per_script(r))
        });
        if let (Some(b), Some(r)) = (baton, redis) {
            parts.push(format!("{scenario} {b:.1} vs {r:.1} µs"));
            met &= b <= r;
        }
    }
    (!parts.is_empty()).then(|| (parts.join(", "), Some(met)))
}

fn handoff(runs: &[Run], scenario: &str) -> Option<Found> {
    let mut parts = Vec::new();
    let mut met = true;
    for (side, label) in SIDES {
        let p50 = med(runs, scenario, 16, side, value(names::HANDOFF_P50));
        let p99 = med(runs, scenario, 16, side, value(names::HANDOFF_P99));
        if let (Some(a), Some(b)) = (p50, p99) {
            parts.push(format!(
                "{:.2} / {:.2} ms ({label})",
                a / 1000.0,
                b / 1000.0
            ));
            met &= a < 500.0 && b < 3000.0;
        }
    }
    (!parts.is_empty()).then(|| (parts.join(", "), Some(met)))
}

fn lease_figure(
    runs: &[Run],
    f: impl Fn(&Run, &Record) -> Option<f64> + Copy,
    format: impl Fn(f64) -> String,
    ok: impl Fn(f64) -> bool,
) -> Option<Found> {
    let leases = current(runs, "leases")
        .into_iter()
        .map(|(_, r)| r.clients)
        .max()?;
    let mut found = per_side(runs, "leases", leases, f, format, ok)?;
    if leases < 10_000 {
        found = (format!("{} (with {leases} leases)", found.0), Some(false));
    }
    Some(found)
}

/// Every target, in the order of the table.
const TARGETS: &[Target] = &[
    Target {
        issue: 0,
        what: "the machine, for scale: Redis CPU per direct lock acquire + release, 64 clients",
        target: "26.4 µs in the quiet run of ea3c5f1 (History)",
        eval: |runs| {
            let v = med(runs, "lock", 64, "direct", |_, r| {
                Some(fig::redis_us_per_op(r))
            })?;
            Some((format!("{v:.1} µs"), None))
        },
    },
    Target {
        issue: 0,
        what: "the machine, for scale: raw `ZRANGE … BYLEX` p99 on the autocomplete dictionary, 16 clients",
        target: "448 µs in run 1 of 2026-11-21 (History)",
        eval: |runs| {
            let v = median_of(
                current(runs, "autocomplete")
                    .into_iter()
                    .filter(|(_, r)| r.side == "zrange"),
                value(names::P99),
            )?;
            Some((format!("{v:.0} µs"), None))
        },
    },
    Target {
        issue: 6,
        what: "uncontended lock, 64 clients: Baton / direct ops/s",
        target: "≥ 0.5",
        eval: |runs| {
            per_side(
                runs,
                "lock",
                64,
                |run, r| ratio_to(run, r, "direct", fig::rate),
                |v| format!("{v:.2}"),
                |v| v >= 0.5,
            )
        },
    },
    Target {
        issue: 6,
        what: "Baton CPU per call, lock, 64 clients",
        target: "< 20 µs",
        eval: |runs| baton_cpu(runs, "lock"),
    },
    Target {
        issue: 6,
        what: "Baton CPU per call, semaphore, 64 clients",
        target: "< 20 µs",
        eval: |runs| baton_cpu(runs, "semaphore"),
    },
    Target {
        issue: 6,
        what: "Baton CPU per call, rate limit, 64 clients",
        target: "< 20 µs",
        eval: |runs| baton_cpu(runs, "ratelimit"),
    },
    Target {
        issue: 6,
        what: "script calls per operation through Baton, every unary scenario and client count",
        target: "= direct",
        eval: |runs| {
            let mut worst: Option<f64> = None;
            for scenario in ["lock", "semaphore", "ratelimit"] {
                for (run, r) in current(runs, scenario) {
                    if r.side.starts_with("baton")
                        && let Some(d) = diff_to(run, r, "direct", fig::scripts_per_op)
                    {
                        worst = Some(worst.unwrap_or(0.0).max(d.abs()));
                    }
                }
            }
            worst.map(|w| (format!("largest difference {w:.3}"), Some(w < 0.005)))
        },
    },
    Target {
        issue: 6,
        what: "added p50 of one lock call, 1 client",
        target: "< 100 µs",
        eval: |runs| {
            per_side(
                runs,
                "lock",
                1,
                |run, r| diff_to(run, r, "direct", |x| x.get(names::P50).unwrap_or(f64::NAN)),
                |v| format!("{v:.0} µs"),
                |v| v < 100.0,
            )
        },
    },
    Target {
        issue: 6,
        what: "non-fair contended lock, 16 clients: handoff p50 / p99",
        target: "< 0.5 / < 3 ms",
        eval: |runs| handoff(runs, "lock-contended"),
    },
    Target {
        issue: 6,
        what: "fair contended lock, 16 clients: handoff p50 / p99",
        target: "< 0.5 / < 3 ms",
        eval: |runs| handoff(runs, "lock-fair"),
    },
    Target {
        issue: 6,
        what: "fair contended lock, 16 clients: Jain's index",
        target: "≥ 0.99",
        eval: |runs| {
            per_side(
                runs,
                "lock-fair",
                16,
                value(names::JAIN),
                |v| format!("{v:.3}"),
                |v| v >= 0.99,
            )
        },
    },
    Target {
        issue: 6,
        what: "10,000 leases held: Baton resident memory",
        target: "< 100 MB",
        eval: |runs| {
            lease_figure(
                runs,
                value(names::BATON_RSS),
                |v| format!("{:.1} MB", v / 1e6),
                |v| v < 100e6,
            )
        },
    },
    Target {
        issue: 6,
        what: "10,000 leases held: Baton CPU for renewals",
        target: "< 5 % of one core",
        eval: |runs| {
            lease_figure(
                runs,
                |_, r| Some(fig::pct(r, names::BATON_CPU)),
                |v| format!("{v:.1} %"),
                |v| v < 5.0,
            )
        },
    },
    Target {
        issue: 6,
        what: "idle Baton resident memory",
        target: "< 20 MB",
        eval: |runs| {
            let v = median_of(current(runs, "idle").into_iter(), value(names::IDLE_RSS))?;
            Some((format!("{:.1} MB", v / 1e6), Some(v < 20e6)))
        },
    },
    Target {
        issue: 7,
        what: "10,000 leases held: Redis script calls per second",
        target: "tens, not thousands (< 100)",
        eval: |runs| {
            lease_figure(
                runs,
                |_, r| Some(fig::scripts_per_sec(r)),
                |v| format!("{v:.0}/s"),
                |v| v < 100.0,
            )
        },
    },
    Target {
        issue: 5,
        what: "rate limit decisions, 64 clients: Baton / direct (the same script) decisions/s",
        target: "reported",
        eval: |runs| {
            per_side(
                runs,
                "ratelimit",
                64,
                |run, r| ratio_to(run, r, "direct", fig::rate),
                |v| format!("{v:.2}"),
                |_| true,
            )
            .map(|(t, _)| (t, None))
        },
    },
    Target {
        issue: 4,
        what: "autocomplete, 16 clients: prefix of 1-5 characters p99",
        target: "< 2 ms",
        eval: |runs| autocomplete_p99(runs, "prefix-lex", 2000.0),
    },
    Target {
        issue: 4,
        what: "autocomplete: ranked (by score) prefix p99",
        target: "< 3 ms",
        eval: |runs| autocomplete_p99(runs, "prefix-score", 3000.0),
    },
    Target {
        issue: 4,
        what: "autocomplete: contains p99 (lexicographic)",
        target: "< 10 ms",
        eval: |runs| autocomplete_p99(runs, "contains-lex", 10_000.0),
    },
    Target {
        issue: 4,
        what: "autocomplete: loading 1,000,000 terms through `Add`",
        target: "< 60 s",
        eval: |runs| load_time(runs, 60.0),
    },
    Target {
        issue: 19,
        what: "autocomplete: loading 1,000,000 terms through the API, every index",
        target: "< 20 s",
        eval: |runs| load_time(runs, 20.0),
    },
    Target {
        issue: 19,
        what: "autocomplete: the same, a dictionary declared without features (prefix, exact, fuzzy)",
        target: "< 20 s",
        eval: |runs| {
            let (took, terms) = feature_set(runs, "none", names::TOOK)?;
            Some((
                format!("{took:.1} s for {} terms", super::grouped(terms)),
                Some(took < 20.0 && terms >= 1_000_000.0),
            ))
        },
    },
    Target {
        issue: 19,
        what: "autocomplete: longest script call while loading 1,000,000 terms (`SLOWLOG`)",
        target: "a few ms (≤ 5 ms)",
        eval: |runs| {
            let rows = || {
                current(runs, "autocomplete")
                    .into_iter()
                    .filter(|(_, r)| r.case == "load")
            };
            let longest = median_of(rows(), value(crate::autocomplete::SCRIPT_MAX))?;
            let over = median_of(rows(), value(crate::autocomplete::SLOW_5MS))?;
            let terms = median_of(rows(), value(names::TERMS))?;
            // Runs before it was recorded have no longest command inside a script.
            let inner = median_of(rows(), value(crate::autocomplete::COMMAND_MAX))
                .filter(|us| us.is_finite())
                .map_or(String::new(), |us| {
                    format!(
                        "; the longest single command inside a script {:.1} ms",
                        us / 1000.0
                    )
                });
            Some((
                format!(
                    "{:.1} ms; {over:.0} calls of 5 ms or more{inner}",
                    longest / 1000.0
                ),
                Some(longest <= 5000.0 && terms >= 1_000_000.0),
            ))
        },
    },
    Target {
        issue: 19,
        what: "autocomplete: Redis memory per term, a dictionary declared `RANKED` (prefix and by score)",
        target: "≤ 300 B",
        eval: |runs| {
            let (bytes, terms) = feature_set(runs, "ranked", names::MEMORY)?;
            let per = bytes / terms.max(1.0);
            Some((
                format!("{per:.0} B on {} terms", super::grouped(terms)),
                Some(per <= 300.0 && terms >= 1_000_000.0),
            ))
        },
    },
    Target {
        issue: 19,
        what: "autocomplete: Redis memory per term, every index (substring included)",
        target: "≤ 600 B",
        eval: |runs| {
            let rows = || {
                current(runs, "autocomplete")
                    .into_iter()
                    .filter(|(_, r)| r.case == "load")
            };
            let bytes = median_of(rows(), value(names::MEMORY))?;
            let terms = median_of(rows(), value(names::TERMS))?;
            let per = bytes / terms.max(1.0);
            Some((
                format!("{per:.0} B on {} terms", super::grouped(terms)),
                Some(per <= 600.0 && terms >= 1_000_000.0),
            ))
        },
    },
    Target {
        issue: 18,
        what: "leader failover (Campaign close → next elected) p50 / p99, beside the fair lock Hold handoff",
        target: "about the lock handoff (p50 within 1.5×)",
        eval: |runs| {
            let rows = || current(runs, "leader-failover").into_iter();
            let of = |side: &str, name: &'static str| {
                median_of(rows().filter(|(_, r)| r.side == side), value(name))
            };
            let (e50, e99) = (of("campaign", names::P50)?, of("campaign", names::P99)?);
            let (l50, l99) = (
                of("fair-lock-hold", names::P50)?,
                of("fair-lock-hold", names::P99)?,
            );
            Some((
                format!(
                    "{:.2} / {:.2} ms against {:.2} / {:.2} ms",
                    e50 / 1000.0,
                    e99 / 1000.0,
                    l50 / 1000.0,
                    l99 / 1000.0
                ),
                Some(e50 <= 1.5 * l50),
            ))
        },
    },
    Target {
        issue: 20,
        what: "Baton CPU per call ≤ Redis CPU per script call, 16 clients, 4 shared connections (TCP)",
        target: "≤",
        eval: |runs| cpu_against_redis(runs, 16, "baton-tcp"),
    },
    Target {
        issue: 20,
        what: "the same, 16 clients, one connection per client (TCP)",
        target: "≤",
        eval: |runs| cpu_against_redis(runs, 16, "baton-tcp-own"),
    },
    Target {
        issue: 20,
        what: "the same, 64 clients, 4 shared connections (TCP)",
        target: "≤",
        eval: |runs| cpu_against_redis(runs, 64, "baton-tcp"),
    },
    Target {
        issue: 20,
        what: "the same, 64 clients, one connection per client (TCP)",
        target: "≤",
        eval: |runs| cpu_against_redis(runs, 64, "baton-tcp-own"),
    },
    Target {
        issue: 20,
        what: "uncontended lock, 64 clients, one connection per client: Baton / direct ops/s",
        target: "≥ 0.5",
        eval: |runs| {
            let v = med(runs, "lock", 64, "baton-tcp-own", |run, r| {
                ratio_to(run, r, "direct", fig::rate)
            })?;
            Some((format!("{v:.2}"), Some(v >= 0.5)))
        },
    },
    Target {
        issue: 20,
        what: "64 clients: Baton CPU per call with a connection per client / with 4",
        target: "≤ 1.1",
        eval: |runs| {
            let mut parts = Vec::new();
            let mut met = true;
            for scenario in ["lock", "semaphore", "ratelimit"] {
                let per_call = |side| {
                    med(runs, scenario, 64, side, |_, r| {
                        Some(fig::baton_us_per_call(r))
                    })
                };
                if let (Some(own), Some(shared)) =
                    (per_call("baton-tcp-own"), per_call("baton-tcp"))
                {
                    parts.push(format!(
                        "{scenario} {:.2} ({own:.1} / {shared:.1} µs)",
                        own / shared
                    ));
                    met &= own <= 1.1 * shared;
                }
            }
            (!parts.is_empty()).then(|| (parts.join(", "), Some(met)))
        },
    },
];

/// The targets table over `runs`; with `measured_only`, without the targets none of them measured.
pub fn table(runs: &[Run], measured_only: bool) -> String {
    let mut md =
        String::from("| issue | figure | target | measured | met? |\n|---:|---|---|---|---|\n");
    for t in TARGETS {
        let found = (t.eval)(runs);
        if measured_only && found.is_none() {
            continue;
        }
        let (measured, met) = found.unwrap_or_else(|| ("not measured".into(), None));
        let met = match met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "—",
        };
        let issue = if t.issue == 0 {
            "—".to_owned()
        } else {
            t.issue.to_string()
        };
        let _ = writeln!(
            md,
            "| {issue} | {} | {} | {measured} | {met} |",
            t.what, t.target
        );
    }
    md
}
