//! The load generator's scenarios on tiny sizes, as the test suite runs them: every side makes
//! progress without errors, and Redis counts exactly the script calls the scripts imply. Then
//! the report renders the runs, and `docs/PERFORMANCE.md` is what its committed JSON renders to.
//!
//! The scenarios run one at a time (they measure CPU and latency; the smoke runs only assert
//! what holds on a busy machine). They run the `baton` binary of the same build profile
//! (`cargo test --workspace` builds it).

use std::{path::Path, time::Duration};

use loadgen::{
    BuildSpec, Options, Run, Scenario, names, record::Record, report, run as run_scenarios,
};
use testkit::within;
use tokio::sync::Mutex;

/// One scenario at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// Runs `scenarios` of the smoke options, changed by `tweak`.
async fn smoke(scenarios: &[Scenario], tweak: impl FnOnce(&mut Options)) -> (Options, Run) {
    let _one = ONE_AT_A_TIME.lock().await;
    let mut options = Options::smoke();
    options.scenarios = scenarios.to_vec();
    options.builds = vec![BuildSpec {
        name: String::new(),
        path: testkit::baton_bin(),
    }];
    tweak(&mut options);
    let run = within(
        Duration::from_secs(180),
        run_scenarios(&options, "smoke"),
        "the smoke run",
    )
    .await;
    // The JSON reads back as written.
    let json = run.to_json();
    let back: Run = serde_json::from_str(&json).expect("reads back");
    assert_eq!(back.records, run.records);
    (options, run)
}

fn value(r: &Record, name: &str) -> f64 {
    r.get(name)
        .unwrap_or_else(|| panic!("{} {} {}: no {name}", r.scenario, r.clients, r.side))
}

/// Locks, semaphores, rate limits and the health check, uncontended and contended, on every side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_scenarios_progress_and_count_script_calls() {
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| s.closed_loop())
        .collect();
    let (options, run) = smoke(&scenarios, |o| {
        o.transports.push(loadgen::Transport::TcpOwn);
    })
    .await;
    for scenario in &scenarios {
        for clients in options.clients_of(*scenario) {
            for side in options.sides_of(*scenario) {
                assert!(
                    run.records.iter().any(|r| r.scenario == scenario.name()
                        && r.clients == clients
                        && r.side == side.name()),
                    "{} with {clients} clients on {}: not measured",
                    scenario.name(),
                    side.name()
                );
            }
        }
    }
    for r in run.records.iter().filter(|r| r.scenario != "idle") {
        let what = format!("{} with {} clients, {}", r.scenario, r.clients, r.side);
        let ops = value(r, names::OPS) as u64;
        assert!(ops > 0, "{what}: no operation completed: {r:?}");
        assert_eq!(
            value(r, names::ERRORS),
            0.0,
            "{what}: errors, the first: {:?}",
            r.first_error
        );
        let scripts = r.script_calls();
        match r.scenario.as_str() {
            "lock" | "semaphore" => {
                assert_eq!(value(r, names::TIMEOUTS), 0.0, "{what}: refused");
                // One EVALSHA per acquire and one per release, nothing else; at most one wake-up
                // per release.
                assert_eq!(scripts, 2 * ops, "{what}: script calls {:?}", r.commands);
                assert!(r.calls("publish") <= ops, "{what}: PUBLISH per release");
                assert_eq!(value(r, names::CALLS) as u64, 2 * ops, "{what}: calls");
            }
            "ratelimit" => assert_eq!(scripts, ops, "{what}: one script call per decision"),
            "health" => assert_eq!(scripts, 0, "{what}: a health check runs no script"),
            _ => {
                assert!(
                    scripts >= 2 * ops,
                    "{what}: fewer script calls ({scripts}) than an acquire and a release per grant"
                );
                let jain = value(r, names::JAIN);
                assert!(
                    jain > 0.0 && jain <= 1.0 + 1e-9,
                    "{what}: Jain's index {jain}"
                );
                if r.scenario.starts_with("lock") && ops > 1 {
                    assert!(
                        r.get(names::HANDOFF_P50).is_some(),
                        "{what}: no handoff measured"
                    );
                }
            }
        }
        if r.side.starts_with("baton") {
            assert!(
                value(r, names::BATON_RSS) > 0.0 && value(r, names::BATON_CPU) >= 0.0,
                "{what}: Baton's /proc figures"
            );
        }
    }
    let idle = run
        .records
        .iter()
        .find(|r| r.scenario == "idle")
        .expect("idle");
    assert!(
        value(idle, names::IDLE_RSS) > 0.0,
        "Baton's memory was not read"
    );
    for table in ["run", "unary", "contention", "idle", "targets"] {
        let md = report::table_of(table, std::slice::from_ref(&run)).expect(table);
        assert!(md.lines().count() > 2, "{table}: {md}");
    }
    let unary = report::table_of("unary", std::slice::from_ref(&run)).unwrap();
    assert!(unary.contains("Baton, TCP, a connection per client"));
}

/// Leases held through `Hold` streams and by direct renewals: all granted, renewed, released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_held_renewed_and_released() {
    let (options, run) = smoke(&[Scenario::Leases], |_| {}).await;
    let leases: Vec<&Record> = run
        .records
        .iter()
        .filter(|r| r.scenario == "leases")
        .collect();
    assert_eq!(leases.len(), options.sides_of(Scenario::Leases).len());
    for r in leases {
        let what = format!("leases, {}", r.side);
        assert_eq!(
            value(r, names::HELD) as usize,
            options.leases,
            "{what}: held"
        );
        // The direct side renews every lease three times in the window (a third of the ttl
        // apart), a script call each; Baton about as often, in fewer calls when it batches.
        let scripts = r.script_calls();
        let due = 3 * options.leases as u64;
        if r.side.starts_with("baton") {
            assert!(
                (1..=due * 2).contains(&scripts),
                "{what}: {scripts} script calls where {due} renewals are due"
            );
        } else {
            assert!(
                scripts >= due / 2 && scripts <= due * 2,
                "{what}: {scripts} script calls where {due} renewals are due"
            );
        }
        let renewals = value(r, names::RENEWALS) as u64;
        assert!(
            renewals >= due / 4 && renewals > 0,
            "{what}: {renewals} renewals seen where {due} are due"
        );
        assert_eq!(
            value(r, names::RELEASED),
            1.0,
            "{what}: leases left behind after the holders let go"
        );
    }
    let md = report::table_of("leases", &[run]).unwrap();
    assert!(md.contains("Baton, Unix socket"), "{md}");
}

/// Leader failover and the fair lock's handoff: every handoff measured, each within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_hands_over_every_time() {
    let (options, run) = smoke(&[Scenario::LeaderFailover], |_| {}).await;
    for side in ["campaign", "fair-lock-hold"] {
        let r = run
            .records
            .iter()
            .find(|r| r.scenario == "leader-failover" && r.side == side)
            .unwrap_or_else(|| panic!("{side}: not measured"));
        assert_eq!(value(r, names::OPS) as usize, options.handoffs, "{side}");
        assert!(
            value(r, names::MAX) < 1_000_000.0,
            "{side}: a handoff took {} µs",
            value(r, names::MAX)
        );
    }
    let md = report::table_of("leader-failover", &[run]).unwrap();
    assert!(md.contains("Campaign"), "{md}");
}

/// The dictionary loads and every query kind answers on every side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autocomplete_loads_and_completes() {
    let (options, run) = smoke(&[Scenario::Autocomplete], |o| {
        o.autocomplete_window = Duration::from_millis(300);
    })
    .await;
    let load = run
        .records
        .iter()
        .find(|r| r.scenario == "autocomplete" && r.case == "load")
        .expect("the load");
    assert_eq!(value(load, names::TERMS) as usize, options.terms);
    assert!(value(load, names::REDIS_CPU) > 0.0 && value(load, names::MEMORY) > 0.0);
    let memory = run
        .records
        .iter()
        .find(|r| r.case == "memory")
        .expect("memory per index");
    assert!(memory.values.keys().any(|k| k.starts_with("bytes:l")));
    // The other layouts of the lex members, each measured on the same Redis.
    let layouts: Vec<&Record> = run.records.iter().filter(|r| r.case == "layout").collect();
    assert_eq!(
        layouts.iter().map(|r| r.side.as_str()).collect::<Vec<_>>(),
        ["chunks", "short", "short-chunks"]
    );
    for r in &layouts {
        let keys = value(r, names::KEYS) as usize;
        let want = if r.side == "short" {
            1
        } else {
            options
                .terms
                .div_ceil(loadgen::autocomplete::baseline::LAYOUT_CHUNK)
        };
        assert_eq!(keys, want, "{}", r.side);
        assert!(
            value(r, names::LISTPACK_KEYS) as usize <= keys,
            "{}",
            r.side
        );
        assert!(value(r, names::MEMORY) > 0.0, "{}", r.side);
    }
    let mut baton_cpu = 0.0;
    let queries: Vec<&Record> = run
        .records
        .iter()
        .filter(|r| {
            r.scenario == "autocomplete"
                && !matches!(
                    r.case.as_str(),
                    "load" | "memory" | "baseline" | "layout" | "memory-features"
                )
        })
        .collect();
    // The longest script while loading was read from SLOWLOG (calls of 1 ms or more), and the
    // bare sorted set of the same terms was loaded and measured on the same Redis.
    assert!(load.get(loadgen::autocomplete::SCRIPT_MAX).is_some());
    let bare = run
        .records
        .iter()
        .find(|r| r.case == "baseline" && r.side == "zadd")
        .expect("the bare sorted set");
    assert_eq!(value(bare, names::TERMS) as usize, options.terms);
    assert!(value(bare, names::MEMORY) > 0.0 && value(bare, names::TOOK) > 0.0);
    assert_eq!(
        queries.len(),
        12,
        "9 kinds through Baton (fuzzy included), 2 direct, raw ZRANGE"
    );
    for r in queries {
        let what = format!("{} {}", r.case, r.side);
        assert_eq!(value(r, names::ERRORS), 0.0, "{what}: {:?}", r.first_error);
        assert!(value(r, names::OPS) > 0.0, "{what}: no request");
        assert!(
            value(r, names::RESULTS) > 0.0 || r.case == "health",
            "{what}: no results"
        );
        if r.side == "direct" {
            assert_eq!(
                r.calls("evalsha") as f64,
                value(r, names::OPS),
                "{what}: one script call per request"
            );
        }
        if r.side.starts_with("baton") {
            baton_cpu += value(r, names::BATON_CPU);
        }
        assert!(value(r, names::LOADGEN_CPU) >= 0.0);
    }
    assert!(baton_cpu > 0.0, "Baton's CPU time was measured");
    // A dictionary per feature set, each loaded whole and measured: fewer features, fewer bytes.
    let declared: Vec<&Record> = run
        .records
        .iter()
        .filter(|r| r.case == "memory-features")
        .collect();
    let sides: Vec<&str> = declared.iter().map(|r| r.side.as_str()).collect();
    assert_eq!(
        sides,
        loadgen::autocomplete::FEATURE_SETS.map(|(label, _)| label)
    );
    let bytes = |r: &Record| -> f64 {
        r.values
            .iter()
            .filter(|(k, _)| k.starts_with("bytes:"))
            .map(|(_, v)| v)
            .sum()
    };
    for pair in declared.windows(2) {
        assert!(
            bytes(pair[0]) < bytes(pair[1]),
            "{} keeps less than {}",
            pair[0].side,
            pair[1].side
        );
    }
    assert!(
        !declared[0].values.contains_key("bytes:w") && !declared[0].values.contains_key("bytes:b"),
        "a dictionary without features has no word or ranked set: {:?}",
        declared[0].values
    );
    for r in &declared {
        assert_eq!(value(r, names::TERMS) as usize, options.terms);
    }
    for table in [
        "autocomplete-load",
        "autocomplete",
        "autocomplete-memory",
        "autocomplete-baseline",
        "autocomplete-modes",
    ] {
        let md = report::table_of(table, std::slice::from_ref(&run)).unwrap();
        assert!(md.lines().count() > 2, "{table}: {md}");
    }
}

/// The same scripts as Redis Functions and through EVALSHA: both decide, and Redis counts the
/// calls of each kind, none of the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_and_scripts_both_run() {
    let (_, run) = smoke(&[Scenario::Functions], |_| {}).await;
    assert_eq!(run.records.len(), 4, "two operations, two ways");
    for r in &run.records {
        let what = format!("{} {}", r.case, r.side);
        let ops = value(r, names::OPS) as u64;
        assert!(ops > 0, "{what}: nothing done");
        assert_eq!(value(r, names::ERRORS), 0.0, "{what}: {:?}", r.first_error);
        let per_op = if r.case == "lock-cycle" { 2 } else { 1 };
        let (own, other) = if r.side == "fcall" {
            ("fcall", "evalsha")
        } else {
            ("evalsha", "fcall")
        };
        assert_eq!(r.calls(own), per_op * ops, "{what}: {:?}", r.commands);
        assert_eq!(r.calls(other), 0, "{what}: {:?}", r.commands);
    }
    let md = report::table_of("functions", &[run]).unwrap();
    assert!(md.contains("`FCALL`"), "{md}");
}

/// A Sentinel failover of the test deployment, within 8 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_completes() {
    let (_, run) = smoke(&[Scenario::RedisFailover], |_| {}).await;
    let [r] = run.records.as_slice() else {
        panic!("one failover: {:?}", run.records)
    };
    let took = value(r, names::TOOK);
    assert!(took > 0.0 && took < 8.0, "the failover took {took} s");
    let md = report::table_of("redis-failover", &[run]).unwrap();
    assert!(md.contains("Sentinel"), "{md}");
}

/// `docs/PERFORMANCE.md` is what its committed JSON renders to: no figure is edited by hand.
#[test]
fn the_performance_document_is_generated() {
    for name in ["PERFORMANCE.md", "autocomplete.md"] {
        let doc = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../docs")
            .join(name);
        let text = std::fs::read_to_string(&doc).expect("the document");
        assert!(
            text.contains("<!-- loadgen: "),
            "docs/{name} has generated tables"
        );
        let rendered =
            report::render_document(&text, doc.parent().expect("docs/")).expect("renders");
        assert!(
            rendered == text,
            "docs/{name} differs from what its JSON renders to: run `cargo run -p loadgen -- report docs/{name}`"
        );
    }
}

/// `loadgen terms` writes the autocomplete scenario's terms as a file for `baton autocomplete
/// load`: the same terms for the same count, one a line, `display<TAB>score[<TAB>payload]`, in
/// the scenario's order.
#[test]
fn the_terms_file_is_the_scenarios_terms() {
    let loadgen = || std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"));
    let path = std::env::temp_dir().join(format!("loadgen-terms-{}.tsv", std::process::id()));
    let status = loadgen()
        .args(["terms", "--terms", "500", "--out"])
        .arg(&path)
        .status()
        .expect("loadgen runs");
    assert!(status.success(), "loadgen terms: {status}");
    let written = std::fs::read_to_string(&path).expect("the file");
    std::fs::remove_file(&path).expect("removed");
    let out = loadgen()
        .args(["terms", "--terms", "500"])
        .output()
        .expect("loadgen runs");
    assert!(out.status.success(), "loadgen terms: {:?}", out.status);
    assert_eq!(
        String::from_utf8(out.stdout).expect("UTF-8"),
        written,
        "the same terms twice"
    );
    let want = loadgen::autocomplete::terms::generate(500, loadgen::autocomplete::SEED);
    let lines: Vec<&str> = written.lines().collect();
    assert_eq!(lines.len(), want.len());
    for (line, term) in lines.iter().zip(&want) {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields[0], term.display, "{line:?}");
        assert_eq!(fields[1].parse::<f64>().ok(), Some(term.score), "{line:?}");
        match &term.payload {
            Some(p) => assert_eq!(
                fields.get(2).map(|f| f.as_bytes()),
                Some(&p[..]),
                "{line:?}"
            ),
            None => assert_eq!(fields.len(), 2, "{line:?}"),
        }
    }
}

/// The processes whose parent is `pid`, with their command lines.
fn children(pid: u32) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(child) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // The fields after the command name, which is in parentheses and may hold spaces.
        let after = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
        if after.split(' ').nth(1) == Some(&pid.to_string()) {
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            found.push((child, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
        }
    }
    found
}

/// A run stopped by SIGTERM or SIGINT stops the Redis servers and Batons it started, and exits
/// with the shell's code for the signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_run_leaves_no_processes() {
    use nix::{sys::signal, unistd::Pid};
    let _one = ONE_AT_A_TIME.lock().await;
    let baton = testkit::baton_bin();
    for (stop, code) in [
        (signal::Signal::SIGTERM, 143),
        (signal::Signal::SIGINT, 130),
    ] {
        let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
            .args([
                "run",
                "--scenario",
                "lock",
                "--clients",
                "1",
                "--transport",
                "tcp",
            ])
            .args([
                "--repeat",
                "1",
                "--seconds",
                "120",
                "--warmup",
                "0.1",
                "--baton",
            ])
            .arg(format!("b={}", baton.display()))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("loadgen starts");
        let pid = run.id().expect("a pid");
        // The direct side runs first; the run is stopped once its Baton is up beside Redis.
        let started = within(
            Duration::from_secs(120),
            async {
                loop {
                    let now = children(pid);
                    let has = |what: &str| now.iter().any(|(_, c)| c.contains(what));
                    if has("redis-server") && has(&baton.display().to_string()) {
                        return now;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            "the run's Redis server and Baton to start",
        )
        .await;
        signal::kill(Pid::from_raw(pid as i32), stop).expect("signalled");
        let output = within(
            Duration::from_secs(60),
            run.wait_with_output(),
            "loadgen to exit",
        )
        .await
        .expect("loadgen exited");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(code), "{stop}: {stderr}");
        assert!(stderr.contains("stopped by"), "{stop}: {stderr}");
        for (child, cmdline) in started {
            assert!(
                signal::kill(Pid::from_raw(child), None).is_err(),
                "{stop}: {cmdline} (pid {child}) outlived the run"
            );
        }
    }
}
