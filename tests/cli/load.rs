//! `baton autocomplete load`: restarts, bad lines, duplicates, resends and the file's form.

use super::*;

/// A Baton killed under a load's call and started again on the same address: the batch is sent
/// again (with its request id) and the load ends as if nothing happened; a Baton that does not
/// come back fails the load with 69, saying the connection failed, without a TLS hint.
#[tokio::test]
async fn a_load_outlives_a_baton_restart() {
    let redis = RedisServer::start().await;
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), support::unique_prefix()]);
    let addr = format!("127.0.0.1:{}", support::free_port());
    let mut serve = Serve::start(&addr, &args).await;
    let load = [
        "autocomplete",
        "load",
        "restarted",
        "-",
        "--batch",
        "1",
        "--parallel",
        "1",
        "--json",
    ];
    let mut run = Run::start_piped(&addr, &load);
    run.say("one\t1");
    wait_until(Duration::from_secs(10), "the first line loaded", || {
        let addr = addr.clone();
        async move {
            match term_count(&addr, "restarted").await {
                1 => Ok(()),
                n => Err(n),
            }
        }
    })
    .await;
    // Frozen, Baton takes the next call and does nothing with it; killed, its connection closes
    // under the call.
    let frozen = testkit::freeze(serve.pid());
    run.say("two\t2");
    tokio::time::sleep(Duration::from_millis(300)).await;
    serve.kill();
    drop(frozen);
    let _serve = Serve::start(&addr, &args).await;
    run.say("three\t3");
    drop(run.child.stdin.take());
    let status = run.exit(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "stderr: {}", run.stderr());
    let summary = json_of(&run.stdout());
    assert_eq!(summary["added"], 3, "{summary}");
    assert_eq!(summary["updated"], 0, "{summary}");
    assert!(summary["resent"].as_u64() >= Some(1), "{summary}");
    assert_eq!(summary["term_count"], 3, "{summary}");
    drop(_serve);

    // Gone for good: the resends run out.
    let mut serve = Serve::start(&addr, &args).await;
    let mut run = Run::start_piped(&addr, &load);
    run.say("four\t4");
    wait_until(Duration::from_secs(10), "the line loaded", || {
        let addr = addr.clone();
        async move {
            match term_count(&addr, "restarted").await {
                4 => Ok(()),
                n => Err(n),
            }
        }
    })
    .await;
    serve.kill();
    run.say("five\t5");
    let status = run.exit(Duration::from_secs(20)).await;
    let stderr = run.stderr();
    assert_eq!(status.code(), Some(69), "stderr: {stderr}");
    assert!(stderr.contains("-: the batch from line 2"), "{stderr}");
    assert!(stderr.contains("the connection to Baton at"), "{stderr}");
    assert!(!stderr.contains("TLS"), "{stderr}");
}

/// A line Baton would refuse only once it is normalized (255 bytes growing past 1024) stops the
/// load at that line, with `FILE:LINE`: every line before it loaded, none after.
#[tokio::test]
async fn a_line_growing_past_the_limit_stops_the_load_at_its_line() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = baton.addr().to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("grows.tsv");
    let lines: Vec<String> = (1..=50)
        .map(|i| {
            if i == 25 {
                "\u{FDFA}".repeat(85)
            } else {
                format!("t{i:02}\t{i}")
            }
        })
        .collect();
    std::fs::write(&file, lines.join("\n")).expect("writing the file");
    let path = file.display().to_string();
    let (code, _, stderr) = run(
        &addr,
        &[
            "autocomplete",
            "load",
            "grows",
            &path,
            "--batch",
            "10",
            "--parallel",
            "4",
        ],
    )
    .await;
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains(&format!("{path}:25: ")) && stderr.contains("normalized"),
        "{stderr}"
    );
    assert_eq!(term_count(&addr, "grows").await, 24, "{stderr}");
}

/// A term named on many lines ends with its last line's score, whatever the calls in flight (to
/// a Baton of its own process, which serves calls in parallel).
#[tokio::test]
async fn the_last_line_naming_a_term_wins() {
    let redis = RedisServer::start().await;
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), support::unique_prefix()]);
    let addr = format!("127.0.0.1:{}", support::free_port());
    let _serve = Serve::start(&addr, &args).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("same.tsv");
    // 40 terms named on 20 lines in a row each, so that calls naming one term are in flight
    // together; canonically equivalent spellings are one term.
    let text: String = (0..800)
        .map(|i| {
            let term = i / 20;
            let display = if i % 3 == 0 {
                format!("Zoë {term:02}")
            } else {
                format!("Zoe\u{308} {term:02}")
            };
            format!("{display}\t{i}\n")
        })
        .collect();
    std::fs::write(&file, text).expect("writing the file");
    let path = file.display().to_string();
    let load = [
        "autocomplete",
        "load",
        "same",
        &path,
        "--batch",
        "1",
        "--parallel",
        "16",
        "--json",
    ];
    let (code, out, stderr) = run(&addr, &load).await;
    assert_eq!(code, 0, "{stderr}");
    let summary = json_of(&out);
    assert_eq!(
        (&summary["added"], &summary["updated"]),
        (&40.into(), &760.into()),
        "{summary}"
    );
    let (code, out, _) = run(
        &addr,
        &["complete", "same", "zo", "--limit", "100", "--json"],
    )
    .await;
    assert_eq!(code, 0);
    let got = json_of(&out);
    let suggestions = got["suggestions"].as_array().expect("suggestions");
    assert_eq!(suggestions.len(), 40, "{got}");
    for s in suggestions {
        let display = s["display"].as_str().expect("a display");
        let term: u64 = display[display.len() - 2..].parse().expect("a number");
        assert_eq!(s["score"], (term * 20 + 19) as f64, "{display}");
    }
}

/// A batch applied in part by a Baton killed in the middle of it, then sent again to a Baton
/// started again on the same address, counts each of its terms once, as added.
#[tokio::test]
async fn a_resent_batch_counts_its_terms_once() {
    let redis = RedisServer::start().await;
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), support::unique_prefix()]);
    let addr = format!("127.0.0.1:{}", support::free_port());
    let mut serve = Serve::start(&addr, &args).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("new.tsv");
    let text: String = (0..1000)
        .map(|i| {
            format!(
                "new term {i:04} with words to index {}\t{i}\n",
                i * 7919 % 1000
            )
        })
        .collect();
    std::fs::write(&file, text).expect("writing the file");
    let path = file.display().to_string();
    let mut run = Run::start(&addr, &["autocomplete", "load", "counted", &path, "--json"]);
    let mut client: Option<AutocompleteServiceClient<tonic::transport::Channel>> = None;
    // Frozen once its first steps are applied, and killed: the batch is applied in part.
    let applied = loop {
        let channel = match &mut client {
            Some(c) => c,
            None => client.insert(AutocompleteServiceClient::new(
                support::channel(addr.parse().expect("an address")).await,
            )),
        };
        let count = channel
            .describe(baton::proto::v1::AutocompleteServiceDescribeRequest {
                dictionary: "counted".to_owned(),
            })
            .await
            .expect("Describe")
            .into_inner()
            .term_count;
        if count > 0 {
            let _frozen = testkit::freeze(serve.pid());
            serve.kill();
            break count;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    assert!(
        applied < 1000,
        "the batch was applied whole before Baton was killed"
    );
    let _serve = Serve::start(&addr, &args).await;
    let status = run.exit(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "stderr: {}", run.stderr());
    let summary = json_of(&run.stdout());
    assert!(summary["resent"].as_u64() >= Some(1), "{summary}");
    assert_eq!(
        (&summary["added"], &summary["updated"]),
        (&1000.into(), &0.into()),
        "{summary}"
    );
    assert_eq!(summary["term_count"], 1000, "{summary}");
}

/// A file truncated, or replaced, while it is read is not a load that succeeded: the load ends
/// with 70, saying the file changed while it was read and how much was loaded. Before, it said
/// "loaded N terms" and exited 0, N being whatever was read before the change.
#[tokio::test]
async fn a_file_changed_while_it_is_read_fails_the_load() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = baton.addr().to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    // Sent a term a call, the file takes far longer to load than to change; replaced, it is
    // read on whole, so it is smaller.
    for (dictionary, replace, lines) in [("truncated", false, 200_000), ("replaced", true, 5_000)] {
        let terms: String = (0..lines).map(|i| format!("term{i:06}\t{i}\n")).collect();
        let file = dir.path().join(format!("{dictionary}.tsv"));
        std::fs::write(&file, &terms).expect("writing the file");
        let path = file.display().to_string();
        let mut run = Run::start(
            &addr,
            &[
                "autocomplete",
                "load",
                dictionary,
                &path,
                "--batch",
                "1",
                "--parallel",
                "1",
            ],
        );
        wait_until(Duration::from_secs(15), "the first terms loaded", || {
            let addr = addr.clone();
            async move {
                match term_count(&addr, dictionary).await {
                    0 => Err(0),
                    _ => Ok(()),
                }
            }
        })
        .await;
        if replace {
            let other = dir.path().join("other.tsv");
            std::fs::write(&other, "other\n").expect("writing the other file");
            std::fs::rename(&other, &file).expect("renaming over the file");
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .expect("opening the file")
                .set_len(0)
                .expect("truncating the file");
        }
        let status = run.exit(Duration::from_secs(120)).await;
        let stderr = run.stderr();
        assert_eq!(status.code(), Some(70), "{dictionary}: {stderr}");
        assert!(stderr.contains("changed while it was read"), "{stderr}");
        let what = if replace { "replaced" } else { "truncated" };
        assert!(stderr.contains(what), "{stderr}");
        let loaded = term_count(&addr, dictionary).await;
        assert!(
            stderr.contains(&format!("the {loaded} terms read were loaded")),
            "{loaded}: {stderr}"
        );
        assert!(run.stdout().is_empty(), "{}", run.stdout());
    }
}
