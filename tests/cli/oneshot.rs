//! The one-shot calls, in text and JSON, and output that cannot be written.

use super::*;

/// describe, ratelimit check, complete and health print text, or JSON with --json, and exit 0
/// (1 for a denied check).
#[tokio::test]
async fn one_shot_commands_print_text_and_json() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = baton.addr().to_string();

    let (code, out, _) = run(&addr, &["health"]).await;
    assert_eq!((code, out.trim()), (0, "readiness: SERVING"));

    let (code, out, _) = run(&addr, &["describe", "lock", "nothing", "--json"]).await;
    assert_eq!(code, 0);
    let state: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(state["held"], false);
    let (code, out, _) = run(&addr, &["describe", "semaphore", "nothing"]).await;
    assert_eq!(code, 0);
    assert!(
        out.starts_with("semaphore \"nothing\": 0 of 0 permits"),
        "{out}"
    );

    let check = [
        "ratelimit",
        "check",
        "api",
        "--limit",
        "1",
        "--period",
        "1m",
        "--json",
    ];
    let (code, out, _) = run(&addr, &check).await;
    assert_eq!(code, 0);
    let first: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(first["allowed"], true);
    let (code, out, _) = run(&addr, &check).await;
    assert_eq!(code, 1);
    let second: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(second["allowed"], false);
    assert!(second["retry_after"].as_f64().expect("a number") > 0.0);

    let mut autocomplete = AutocompleteServiceClient::new(support::channel(baton.addr()).await);
    let terms = ["Anna Smith", "Annabel", "Bob"].map(|display| AutocompleteTerm {
        display: display.to_owned(),
        ..Default::default()
    });
    within(
        Duration::from_secs(5),
        autocomplete.add(AutocompleteServiceAddRequest {
            dictionary: "people".to_owned(),
            terms: terms.to_vec(),
            ..Default::default()
        }),
        "Add",
    )
    .await
    .expect("Add");
    let (code, out, _) = run(&addr, &["complete", "people", "ANN"]).await;
    assert_eq!((code, out.as_str()), (0, "Anna Smith\nAnnabel\n"));
    let (code, out, _) = run(
        &addr,
        &[
            "complete",
            "people",
            "smi",
            "--mode",
            "word-prefix",
            "--json",
        ],
    )
    .await;
    assert_eq!(code, 0);
    let page: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(page["suggestions"][0]["display"], "Anna Smith");
    assert_eq!(page["suggestions"][0]["match"], "word_prefix");

    // Fuzzy: "anan" is one transposition from "Anna..."; --max-edits 0 keeps exact prefixes only.
    let fuzzy = ["complete", "people", "anan", "--mode", "fuzzy", "--json"];
    let (code, out, _) = run(&addr, &fuzzy).await;
    assert_eq!(code, 0);
    let page: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let found: Vec<_> = page["suggestions"]
        .as_array()
        .expect("suggestions")
        .iter()
        .map(|s| {
            (
                s["display"].as_str(),
                s["match"].as_str(),
                s["edit_distance"].as_u64(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            (Some("Anna Smith"), Some("fuzzy"), Some(1)),
            (Some("Annabel"), Some("fuzzy"), Some(1)),
        ]
    );
    assert_eq!(page["incomplete"], false);
    let (code, out, _) = run(&addr, &[&fuzzy[..], &["--max-edits", "0"]].concat()).await;
    assert_eq!(code, 0);
    let page: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(page["suggestions"], serde_json::json!([]));
    // More than 2 is INVALID_ARGUMENT on the field: exit 2, Baton's message.
    let (code, _, stderr) = run(&addr, &[&fuzzy[..], &["--max-edits", "3"]].concat()).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("max_edits"), "{stderr}");

    // Pages: the token goes to standard error in text mode, and --page-token takes it back.
    let (code, out, stderr) = run(&addr, &["complete", "people", "ann", "--limit", "1"]).await;
    assert_eq!((code, out.as_str()), (0, "Anna Smith\n"));
    let token = stderr
        .lines()
        .find_map(|l| l.strip_prefix("next page: "))
        .unwrap_or_else(|| panic!("a next page on standard error: {stderr}"));
    let (code, out, stderr) =
        run(&addr, &["complete", "people", "ann", "--limit", "1", token]).await;
    assert_eq!((code, out.as_str()), (0, "Annabel\n"), "{stderr}");
    assert!(!stderr.contains("next page"), "{stderr}");
}

/// `baton complete` prints one suggestion per line: control characters in a display are escaped
/// in text (JSON gives them as they are).
#[tokio::test]
async fn complete_escapes_control_characters() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = baton.addr().to_string();
    let mut autocomplete = AutocompleteServiceClient::new(support::channel(baton.addr()).await);
    within(
        Duration::from_secs(5),
        autocomplete.add(AutocompleteServiceAddRequest {
            dictionary: "controls".to_owned(),
            terms: vec![AutocompleteTerm {
                display: "ctl one\nctl \u{1b}[31mtwo\r".to_owned(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        "Add",
    )
    .await
    .expect("Add");
    let (code, out, _) = run(&addr, &["complete", "controls", "ctl"]).await;
    assert_eq!((code, out.as_str()), (0, "ctl one\\nctl \\x1b[31mtwo\\r\n"));
    let (code, out, _) = run(&addr, &["complete", "controls", "ctl", "--json"]).await;
    assert_eq!(code, 0);
    assert_eq!(
        json_of(&out)["suggestions"][0]["display"],
        "ctl one\nctl \u{1b}[31mtwo\r"
    );
}

/// Output that cannot be written (a full disk) is exit code 74; a pipe closed by its reader
/// (`| head -1`) is not an error.
#[tokio::test]
async fn unwritable_output_is_exit_code_74_but_a_closed_pipe_is_not() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = baton.addr().to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("terms.tsv");
    std::fs::write(&file, "a\nb\n").expect("writing the file");
    let path = file.display().to_string();
    let commands: [&[&str]; 3] = [
        &["health"],
        &["describe", "lock", "x", "--json"],
        &["autocomplete", "load", "full", &path],
    ];
    for args in commands {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let mut command = support::baton_command();
        command
            .args(args)
            .env("BATON_ADDR", &addr)
            .stdin(Stdio::null())
            .stdout(full)
            .stderr(Stdio::piped());
        let output = within(
            Duration::from_secs(20),
            tokio::task::spawn_blocking(move || command.output()),
            "baton to exit",
        )
        .await
        .expect("the task")
        .expect("running baton");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(74), "{args:?}: {stderr}");
        assert!(stderr.contains("standard output"), "{stderr}");

        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let mut command = support::baton_command();
        command
            .args(args)
            .env("BATON_ADDR", &addr)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(Stdio::null());
        let status = within(
            Duration::from_secs(20),
            tokio::task::spawn_blocking(move || command.status()),
            "baton to exit",
        )
        .await
        .expect("the task")
        .expect("running baton");
        assert_eq!(status.code(), Some(0), "{args:?}");
    }
}

/// A UTF-8 byte order mark starting the file is not part of its first term.
#[tokio::test]
async fn a_byte_order_mark_is_skipped() {
    let redis = RedisServer::start().await;
    let baton = Baton::start(&redis).await;
    let addr = baton.addr().to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("bom.tsv");
    std::fs::write(&file, "\u{feff}bom\t3\nbomb\t2\n").expect("writing the file");
    let (code, _, stderr) = run(
        &addr,
        &["autocomplete", "load", "bom", &file.display().to_string()],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let (code, out, _) = run(&addr, &["complete", "bom", "bom"]).await;
    assert_eq!((code, out.as_str()), (0, "bom\nbomb\n"));
}
