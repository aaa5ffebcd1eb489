//! Bulk loading from a file.

use super::*;

/// `baton autocomplete load DICT FILE` loads every line (display, score, payload; blank lines
/// skipped) in batches, loading again ends with the same terms, and a bad line stops the load
/// with exit code 2 and `FILE:LINE`, the batches before it loaded; a missing file or a
/// directory is exit code 2 too.
#[tokio::test]
async fn cli_load_reads_a_file_of_terms_in_batches() {
    let (_redis, baton, mut client) = setup().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("terms.tsv");
    let mut text = String::new();
    for i in 0..2500 {
        match i % 3 {
            0 => text.push_str(&format!("term {i:04}\n")),
            1 => text.push_str(&format!("term {i:04}\t{i}\n")),
            _ => text.push_str(&format!("term {i:04}\t{i}\tid-{i}\r\n")),
        }
        if i % 1000 == 0 {
            text.push('\n');
        }
    }
    std::fs::write(&file, &text).expect("writing the file");
    let addr = baton.addr().to_string();
    let load = |path: &std::path::Path, dictionary: &str| {
        let mut command = support::baton_command();
        command
            .args(["autocomplete", "load", "--addr", &addr, "--batch", "300"])
            .args(["--parallel", "3", dictionary])
            .arg(path);
        support::run_baton(command, Duration::from_secs(60))
    };
    for _ in 0..2 {
        let (status, stderr) = load(&file, "from-file").await;
        assert!(status.success(), "{status}: {stderr}");
        assert_eq!(count(&mut client, "from-file").await, 2500);
    }
    let got = page(
        &mut client,
        request("from-file", "term 2498", Mode::Prefix, Order::Score, 10),
    )
    .await;
    assert_eq!(got.suggestions.len(), 1);
    assert_eq!(got.suggestions[0].score, 2498.0);
    assert_eq!(got.suggestions[0].payload, b"id-2498");
    let best = complete(
        &mut client,
        "from-file",
        "term",
        Mode::Prefix,
        Order::Score,
        2,
    )
    .await;
    assert_eq!(best, ["term 2498", "term 2497"]);

    // A bad score on line 1203: the four batches of 300 before it are loaded, nothing after.
    let bad = dir.path().join("bad.tsv");
    let lines: Vec<String> = (0..1500)
        .map(|i| {
            if i == 1202 {
                "broken\tnot-a-score".to_owned()
            } else {
                format!("other {i:04}")
            }
        })
        .collect();
    std::fs::write(&bad, lines.join("\n")).expect("writing the file");
    let (status, stderr) = load(&bad, "bad-file").await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:1203:", bad.display())) && stderr.contains("not a number"),
        "{stderr}"
    );
    assert_eq!(count(&mut client, "bad-file").await, 1202);
    // A missing file is bad usage too, and loads nothing; so is a directory (which opens, and
    // fails only when read).
    let (status, stderr) = load(&dir.path().join("missing"), "missing").await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert_eq!(count(&mut client, "missing").await, 0);
    let (status, stderr) = load(dir.path(), "a-directory").await;
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("a directory"), "{stderr}");
    assert_eq!(count(&mut client, "a-directory").await, 0);
}
