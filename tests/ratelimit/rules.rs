//! The rules file: bad configuration reported at startup, directories, reloads, and bad files
//! refused naming the position, within bounds.

use super::*;

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

/// Bad rate limit flags and a bad rules file are reported together, each naming its flag, the
/// file, the line and column, the domain and the setting, and the binary exits with code 2.
#[tokio::test]
async fn bad_ratelimit_configuration_is_reported_at_startup() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("rules.yaml");
    std::fs::write(
        &file,
        "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n  - key: path\n    rate_limit: {period: 2s, requests_per_unit: 5, algorithm: leaky}\n",
    )
    .expect("writing rules");
    let mut command = baton_command();
    command.args([
        "serve",
        "--ratelimit-timeout",
        "soon",
        "--ratelimit-failure-mode",
        "maybe",
        "--ratelimit-config",
    ]);
    command.arg(&file);
    let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    let at = |place: &str| format!("{}:{place}: ", file.display());
    for needle in [
        "--ratelimit-timeout / BATON_RATELIMIT_TIMEOUT".to_owned(),
        "--ratelimit-failure-mode / BATON_RATELIMIT_FAILURE_MODE".to_owned(),
        at("4:24") + "domain \"web\": descriptors[0].rate_limit.unit: \"fortnight\"",
        at("6:63") + "domain \"web\": descriptors[1].rate_limit.algorithm: \"leaky\"",
    ] {
        assert!(stderr.contains(&needle), "{needle:?} missing in:\n{stderr}");
    }

    let mut command = baton_command();
    command.args(["serve", "--ratelimit-config", "/nonexistent/rules.yaml"]);
    let (status, stderr) = run_baton(command, Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent/rules.yaml"), "{stderr}");
}

/// A directory of rules files is read whole, and the test rules file itself is valid; one of
/// them that cannot be read refuses the rules.
#[tokio::test]
async fn rules_directory_loads() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::copy(rules_path(), dir.path().join("a.yaml")).expect("copy");
    std::fs::write(dir.path().join("b.yml"), "domain: third\n").expect("write");
    std::fs::write(dir.path().join("notes.txt"), "not yaml: [").expect("write");
    let rules = within(
        Duration::from_secs(5),
        async { Rules::load(dir.path()) },
        "loading",
    )
    .await
    .expect("valid");
    assert_eq!(rules.domains(), vec!["edge", "other", "third"]);

    // A rules file that is not a readable regular file refuses the rules, naming it, instead of
    // being skipped with its domains (whose traffic would then pass unlimited after a reload).
    std::os::unix::fs::symlink(dir.path().join("gone"), dir.path().join("c.yaml")).expect("link");
    std::fs::create_dir(dir.path().join("d.yml")).expect("dir");
    let errors = Rules::load(dir.path()).expect_err("a dangling link and a directory");
    for name in ["c.yaml", "d.yml"] {
        assert!(
            errors.iter().any(|e| e.contains(name)),
            "{name} not named in {errors:?}"
        );
    }
}

/// A Baton serving Envoy's API with the rules of `file`, reread every 50 ms.
async fn reloading_baton(redis: &RedisServer, file: &std::path::Path) -> Baton {
    let path = file.to_owned();
    Baton::start_with(redis, move |c| {
        c.ratelimit.timeout = RELAXED_TIMEOUT;
        c.ratelimit.rules_path = Some(path);
        c.ratelimit.reload_interval = Duration::from_millis(50);
    })
    .await
}

/// Changed rules are put in force without a restart; invalid ones are refused and the rules in
/// force kept.
#[tokio::test]
async fn envoy_rules_reload_when_the_file_changes() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("rules.yaml");
    let write = |limit: &str| {
        std::fs::write(
            &file,
            format!("domain: live\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"),
        )
        .expect("writing rules");
    };
    write("5");
    let baton = reloading_baton(&redis, &file).await;
    let limit_now = || async {
        let got = should_rate_limit(
            &baton,
            envoy_request("live", vec![descriptor(&[("k", "v")])]),
        )
        .await;
        got.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
    };
    assert_eq!(limit_now().await, Some(5));

    write("7");
    wait_until(Duration::from_secs(5), "the new limit in force", || async {
        match limit_now().await {
            Some(7) => Ok(()),
            other => Err(other),
        }
    })
    .await;

    // An invalid file is refused: the rules in force stay, across several reload intervals.
    write("lots");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(limit_now().await, Some(7));
}

/// Fixed windows of different lengths for one descriptor count apart, as envoyproxy/ratelimit
/// counts them: a descriptor sent with and without a route's limit override spends each limit
/// once (one count for both restarted at every switch, and admitted everything), and a reload that
/// changes a rule's unit counts in windows of the new length while the old window's count stays,
/// found again when the unit changes back.
#[tokio::test]
async fn envoy_fixed_windows_of_different_lengths_count_apart() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    // The rules give remote_address 2 an hour; the override 2 a day.
    let plain = || descriptor(&[("remote_address", "10.9.9.9")]);
    let overridden = || {
        let mut d = plain();
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: Unit::Day.into(),
        });
        d
    };
    let mut allowed = (0, 0);
    for i in 0..10 {
        let (d, count) = if i % 2 == 0 {
            (plain(), &mut allowed.0)
        } else {
            (overridden(), &mut allowed.1)
        };
        let got = should_rate_limit(&baton, envoy_request("edge", vec![d])).await;
        if got.statuses[0].code() == Code::Ok {
            *count += 1;
        }
    }
    assert_eq!(allowed, (2, 2), "(the rule's hour, the override's day)");

    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("rules.yaml");
    let rules = |unit: &str| {
        format!(
            "domain: live\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: 3}}\n"
        )
    };
    replace_file(&file, &rules("hour"));
    let baton = reloading_baton(&redis, &file).await;
    // A peek (hits 0) counts nothing: (the unit in force, the units left).
    let peek = || async {
        let mut d = descriptor(&[("k", "v")]);
        d.hits_addend = Some(UInt64Value { value: 0 });
        let got = should_rate_limit(&baton, envoy_request("live", vec![d])).await;
        let status = &got.statuses[0];
        (
            status.current_limit.as_ref().map(|l| l.unit()),
            status.limit_remaining,
        )
    };
    let spend = || async {
        should_rate_limit(
            &baton,
            envoy_request("live", vec![descriptor(&[("k", "v")])]),
        )
        .await
        .statuses[0]
            .code()
    };
    for _ in 0..3 {
        assert_eq!(spend().await, Code::Ok);
    }
    assert_eq!(spend().await, Code::OverLimit);
    assert_eq!(peek().await, (Some(Unit::Hour), 0));

    replace_file(&file, &rules("day"));
    wait_until(
        Duration::from_secs(5),
        "the day's rule in force",
        || async {
            match peek().await {
                (Some(Unit::Day), left) => Ok(left),
                other => Err(other),
            }
        },
    )
    .await;
    assert_eq!(peek().await, (Some(Unit::Day), 3), "a new window length");
    assert_eq!(spend().await, Code::Ok);

    replace_file(&file, &rules("hour"));
    wait_until(Duration::from_secs(5), "the hour's rule back", || async {
        match peek().await {
            (Some(Unit::Hour), _) => Ok(()),
            other => Err(other),
        }
    })
    .await;
    assert_eq!(peek().await, (Some(Unit::Hour), 0), "the hour's count kept");
    assert_eq!(spend().await, Code::OverLimit);
}

/// The positions `FILE:LINE:COLUMN:` that `text` gives for `file`, in order.
fn positions(text: &str, file: &std::path::Path) -> Vec<(u32, u32)> {
    let needle = format!("{}:", file.display());
    text.match_indices(&needle)
        .filter_map(|(at, _)| {
            let mut parts = text[at + needle.len()..].splitn(3, ':');
            let line = parts.next()?.parse().ok()?;
            let column = parts.next()?.parse().ok()?;
            Some((line, column))
        })
        .collect()
}

/// Replaces `file`'s contents at once (write beside it, then rename), so that a reload never
/// reads half a file.
fn replace_file(file: &std::path::Path, text: &str) {
    let part = file.with_extension("part");
    std::fs::write(&part, text).expect("writing the new contents");
    std::fs::rename(&part, file).expect("renaming into place");
}

/// A rules file with a YAML syntax error (an unclosed flow sequence, an unclosed quote) stops the
/// binary at once with exit code 2 and the error's line and column, instead of hanging.
#[tokio::test]
async fn malformed_rules_file_exits_2_naming_the_position() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The block entry inside the flow list; the quote that never closes.
    let cases = [
        (
            "flow.yaml",
            "domain: x\ndescriptors: [\n  - key: a\n",
            (3, 3),
        ),
        (
            "quote.yaml",
            "domain: \"x\ndescriptors:\n  - key: a\n",
            (1, 9),
        ),
    ];
    for (name, text, place) in cases {
        let file = dir.path().join(name);
        std::fs::write(&file, text).expect("writing rules");
        let mut command = baton_command();
        command.args(["serve", "--ratelimit-config"]).arg(&file);
        let started = Instant::now();
        let (status, stderr) = run_baton(command, Duration::from_secs(20)).await;
        assert_eq!(status.code(), Some(2), "{name}: {stderr}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{name}: took {:?}",
            started.elapsed()
        );
        assert_eq!(
            positions(&stderr, &file),
            vec![place],
            "{name}: FILE:LINE:COLUMN of the error in:\n{stderr}"
        );
    }
}

/// With reloading on, a valid rules file replaced by a malformed one leaves the rules in force and
/// logs the refusal with the error's position, without the process growing; a later valid file is
/// put in force.
#[tokio::test]
async fn malformed_rules_on_reload_keep_the_rules_in_force() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("rules.yaml");
    let valid = |limit: u32| {
        format!(
            "domain: live\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
        )
    };
    replace_file(&file, &valid(5));
    let mut args = redis.baton_args();
    args.extend(
        [
            "--ratelimit-timeout",
            "2s",
            "--ratelimit-config-reload",
            "50ms",
            "--ratelimit-config",
        ]
        .map(String::from),
    );
    args.push(file.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let baton = support::BatonProcess::spawn(&args).await;
    let client = EnvoyClient::new(support::channel(baton.addr()).await);
    let limit_now = || {
        let mut client = client.clone();
        async move {
            let got = client
                .should_rate_limit(envoy_request("live", vec![descriptor(&[("k", "v")])]))
                .await
                .expect("ShouldRateLimit answers")
                .into_inner();
            got.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.requests_per_unit)
        }
    };
    assert_eq!(limit_now().await, Some(5));

    replace_file(&file, "domain: x\ndescriptors: [\n  - key: a\n");
    wait_until(
        Duration::from_secs(10),
        "the refusal of the malformed file in the log",
        || async {
            let stderr = baton.stderr();
            if stderr.contains("keeping the rules in force")
                && !positions(&stderr, &file).is_empty()
            {
                Ok(())
            } else {
                Err(stderr)
            }
        },
    )
    .await;
    assert_eq!(limit_now().await, Some(5), "the rules in force stay");
    let rss_kib = std::fs::read_to_string(format!("/proc/{}/status", baton.pid()))
        .expect("reading the process status")
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS in the process status");
    assert!(rss_kib < 256 * 1024, "resident memory {rss_kib} KiB");

    replace_file(&file, &valid(7));
    wait_until(
        Duration::from_secs(10),
        "the next valid rules in force",
        || async {
            match limit_now().await {
                Some(7) => Ok(()),
                other => Err(other),
            }
        },
    )
    .await;
}

/// A rules file beyond the loader's bounds is refused quickly with a clear reason: not UTF-8 (with
/// its position), too large, not a regular file, aliases expanding past the node budget, nesting
/// too deep, too many documents, too many rules, too many files in a directory.
#[tokio::test]
async fn rules_beyond_the_bounds_are_refused_quickly() {
    use baton::ratelimit::rules::{MAX_DOCUMENTS, MAX_FILE_BYTES, MAX_FILES, MAX_RULES};
    let dir = tempfile::tempdir().expect("temp dir");
    let big = dir.path().join("big.yaml");
    let padding = usize::try_from(MAX_FILE_BYTES).expect("fits");
    std::fs::write(&big, format!("domain: d\n#{}\n", "x".repeat(padding))).expect("write");
    let crowded = dir.path().join("crowded");
    std::fs::create_dir(&crowded).expect("mkdir");
    for i in 0..=MAX_FILES {
        std::fs::write(
            crowded.join(format!("{i:04}.yaml")),
            format!("domain: d{i}\n"),
        )
        .expect("write");
    }
    let laughs = (1..8).fold(
        "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_owned(),
        |text, i| {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            format!("{text}a{i}: &a{i} [{refs}]\n")
        },
    );
    let deep = format!(
        "domain: d\ndescriptors: {}{}\n",
        "[".repeat(100),
        "]".repeat(100)
    );
    let documents = "---\ndomain: d\n".repeat(MAX_DOCUMENTS + 1);
    let rules = format!(
        "domain: d\ndescriptors: [{}]\n",
        (0..=MAX_RULES)
            .map(|i| format!("{{key: k{i}}}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let texts = [
        ("laughs.yaml", laughs),
        ("deep.yaml", deep),
        ("documents.yaml", documents),
        ("rules.yaml", rules),
    ];
    for (name, text) in texts {
        let file = dir.path().join(name);
        std::fs::write(&file, text).expect("write");
    }
    let latin1 = dir.path().join("latin1.yaml");
    std::fs::write(&latin1, b"domain: d\ndescriptors:\n  - key: caf\xe9\n").expect("write");
    let cases = [
        (
            latin1.clone(),
            "latin1.yaml:3:13: not UTF-8 text".to_owned(),
        ),
        (big.clone(), "larger than".to_owned()),
        (PathBuf::from("/dev/zero"), "not a regular file".to_owned()),
        (crowded.clone(), format!("more than {MAX_FILES}")),
        (
            dir.path().join("laughs.yaml"),
            "aliases count as copies".to_owned(),
        ),
        (dir.path().join("deep.yaml"), "nest deeper than".to_owned()),
        (
            dir.path().join("documents.yaml"),
            format!("more than {MAX_DOCUMENTS} YAML documents"),
        ),
        (
            dir.path().join("rules.yaml"),
            format!("more than {MAX_RULES} rules"),
        ),
    ];
    for (path, reason) in cases {
        let started = Instant::now();
        let loading = path.clone();
        let errors = within(
            Duration::from_secs(30),
            tokio::task::spawn_blocking(move || Rules::load(&loading)),
            "the loader to end",
        )
        .await
        .expect("the loader does not panic")
        .expect_err(&format!("{} must be refused", path.display()));
        assert!(
            errors.iter().any(|e| e.contains(&reason)),
            "{}: {reason:?} missing in {errors:#?}",
            path.display()
        );
        assert!(
            errors
                .iter()
                .all(|e| e.starts_with(&path.display().to_string())),
            "{errors:#?}"
        );
        assert!(errors.len() <= 51, "{} problems reported", errors.len());
        eprintln!("{}: refused in {:?}", path.display(), started.elapsed());
    }
}

/// Pieces that random rules texts are made of and mutations insert: YAML's indicators, flow and
/// block structure, anchors and aliases, tags, quotes, documents, odd characters, and the rules'
/// own settings.
const YAML_PIECES: &[&str] = &[
    "- ",
    ": ",
    ":",
    "[",
    "]",
    "{",
    "}",
    ", ",
    "\n",
    "  ",
    "    ",
    "\t",
    "'",
    "\"",
    "&a ",
    "*a",
    "&b ",
    "*b",
    "!!str ",
    "!t ",
    "|\n",
    ">-\n",
    "---\n",
    "...\n",
    "? ",
    "# c\n",
    "%YAML 1.2\n",
    "\\",
    "domain: d\n",
    "domain: ",
    "descriptors:\n",
    "descriptors: ",
    "key: k",
    "value: v*",
    "value: *",
    "rate_limit: {unit: second, requests_per_unit: 1}",
    "rate_limit:\n",
    "requests_per_unit: ",
    "unit: ",
    "period: 1s",
    "algorithm: gcra",
    "burst: ",
    "99999999999999999999999",
    "0",
    "~",
    "null",
    "true",
    "é",
    "\u{feff}",
    "\r\n",
    "\r",
    "@",
    "`",
    "*",
    "<<: *a",
    "\u{0}",
    "\u{85}",
    "replaces: [{name: x}]",
    "shadow_mode: true",
];

/// A text of random pieces, or a valid rules text changed by a few random edits.
fn rules_texts() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::{prelude::*, sample::Index};
    let seeds = vec![
        std::fs::read_to_string(rules_path()).expect("the test rules"),
        "domain: d\ndescriptors:\n  - key: k\n    value: a*b\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      - key: j\n        rate_limit: &r {unit: minute, requests_per_unit: 2, algorithm: gcra, burst: 3}\n      - key: i\n        rate_limit: *r\n".to_owned(),
        "domain: x\ndescriptors: [{key: a, value: '1'}, {key: b, rate_limit: {unlimited: true}}]\n---\ndomain: y\n".to_owned(),
    ];
    let edit = (0..4u8, any::<Index>(), any::<Index>(), any::<Index>());
    prop_oneof![
        prop::collection::vec(prop::sample::select(YAML_PIECES), 0..80).prop_map(|p| p.concat()),
        (
            prop::sample::select(seeds),
            prop::collection::vec(edit, 1..10)
        )
            .prop_map(|(seed, edits)| {
                let mut chars: Vec<char> = seed.chars().collect();
                for (kind, at, len, piece) in edits {
                    let at = at.index(chars.len() + 1);
                    let end = (at + len.index(16)).min(chars.len());
                    match kind {
                        0 => {
                            let piece = piece.get(YAML_PIECES);
                            chars.splice(at..at, piece.chars());
                        }
                        1 => {
                            chars.drain(at..end);
                        }
                        2 => {
                            let copy: Vec<char> = chars[at..end].to_vec();
                            chars.splice(at..at, copy);
                        }
                        _ => chars.truncate(at),
                    }
                }
                chars.into_iter().collect()
            }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config {
        cases: 2000,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5EED_0012),
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })]

    /// Random and mutated rules texts always end the loader within a time bound, without a
    /// panic, either with rules or with problems whose first one names `FILE:LINE:COLUMN`.
    #[test]
    fn rules_loader_ends_on_any_text(text in rules_texts()) {
        let (done, answer) = std::sync::mpsc::channel();
        let input = text.clone();
        std::thread::spawn(move || {
            let _ = done.send(Rules::from_yaml("fuzz.yaml", &input).map(|r| r.domains().len()));
        });
        let result = answer
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("the loader did not answer ({e}) for {text:?}"));
        if let Err(problems) = result {
            let first = problems.first().unwrap_or_else(|| panic!("no problem given for {text:?}"));
            let place = first.strip_prefix("fuzz.yaml:").and_then(|rest| {
                let mut parts = rest.splitn(3, ':');
                let line: usize = parts.next()?.parse().ok()?;
                let column: usize = parts.next()?.parse().ok()?;
                (line >= 1 && column >= 1).then_some(())
            });
            proptest::prop_assert!(place.is_some(), "{first:?} for {text:?}");
        }
    }
}
