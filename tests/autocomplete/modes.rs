//! Modes, scores, payloads.

use super::*;

/// Prefix, word-prefix, suffix and contains modes, with match kinds.
#[tokio::test]
async fn match_modes() {
    let (_redis, _baton, mut client) = setup().await;
    let reader = client.clone();
    let d = "modes";
    add_all(
        &mut client,
        d,
        &[
            "hello fellow",
            "Fellini",
            "yellow",
            "Jean-Luc Picard",
            "O'Brien",
            "Jackson",
            "Smithson",
        ],
    )
    .await;
    let c = |q: &str, mode: Mode| {
        let mut client = reader.clone();
        let q = q.to_owned();
        async move { complete(&mut client, d, &q, mode, Order::Lexicographic, 10).await }
    };
    assert_eq!(
        c("fel", Mode::WordPrefix).await,
        ["Fellini", "hello fellow"]
    );
    assert_eq!(c("luc", Mode::WordPrefix).await, ["Jean-Luc Picard"]);
    assert_eq!(c("brien", Mode::WordPrefix).await, ["O'Brien"]);
    assert_eq!(c("jean-l", Mode::WordPrefix).await, ["Jean-Luc Picard"]);
    assert_eq!(c("ellow", Mode::WordPrefix).await, Vec::<String>::new());
    assert_eq!(c("son", Mode::Suffix).await, ["Jackson", "Smithson"]);
    assert_eq!(c("ello", Mode::Contains).await, ["hello fellow", "yellow"]);
    assert_eq!(c("o f", Mode::Contains).await, ["hello fellow"]);
    assert_eq!(
        c("l", Mode::Contains).await,
        ["Fellini", "hello fellow", "Jean-Luc Picard", "yellow"]
    );
    assert_eq!(c("n-luc p", Mode::Contains).await, ["Jean-Luc Picard"]);
    assert_eq!(c("ello", Mode::Prefix).await, Vec::<String>::new());

    let kinds = page(
        &mut client,
        request(d, "fel", Mode::Contains, Order::Lexicographic, 10),
    )
    .await;
    let kinds: Vec<_> = kinds
        .suggestions
        .iter()
        .map(|s| (s.display.as_str(), s.match_kind()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("Fellini", Kind::Prefix),
            ("hello fellow", Kind::WordPrefix)
        ]
    );
    let exact = page(
        &mut client,
        request(d, "yellow", Mode::Suffix, Order::Lexicographic, 10),
    )
    .await;
    assert_eq!(exact.suggestions[0].match_kind(), Kind::Exact);
    // Separators a word-prefix query starts with match where they begin the term or follow a
    // separator: "-luc" is not found in "Jean-Luc Picard", but in "x -luc".
    assert_eq!(c("-luc", Mode::WordPrefix).await, Vec::<String>::new());
    add_all(&mut client, d, &["x -luc"]).await;
    assert_eq!(c("-luc", Mode::WordPrefix).await, ["x -luc"]);
}

/// Scores are set, incremented or kept; payloads kept, replaced or cleared; the display form
/// follows the last add; the score order follows the scores.
#[tokio::test]
async fn scores_payloads_and_updates() {
    let (_redis, _baton, mut client) = setup().await;
    let d = "products";
    let r = add(
        &mut client,
        d,
        vec![
            pb::AutocompleteTerm {
                display: "iPhone".into(),
                score: Some(10.0),
                payload: Some(b"sku-1".to_vec()),
                ..Default::default()
            },
            scored("iPad", 20.0),
            term("iMac"),
            pb::AutocompleteTerm {
                display: "iPhone".into(),
                score: Some(15.0),
                increment: true,
                ..Default::default()
            },
        ],
    )
    .await;
    assert_eq!((r.added, r.updated, r.term_count), (3, 1, 3));
    assert_eq!(r.scores, [10.0, 20.0, 0.0, 25.0]);
    assert_eq!(
        complete(&mut client, d, "i", Mode::Prefix, Order::Score, 10).await,
        ["iPhone", "iPad", "iMac"]
    );

    // An entry without score or payload keeps both; an increment adds to the current score.
    let r = add(
        &mut client,
        d,
        vec![
            term("iPhone"),
            pb::AutocompleteTerm {
                display: "iMac".into(),
                score: Some(-1.5),
                increment: true,
                payload: Some(vec![0, 255]),
            },
        ],
    )
    .await;
    assert_eq!(r.scores, [25.0, -1.5]);
    let page1 = page(&mut client, request(d, "i", Mode::Prefix, Order::Score, 10)).await;
    let got: Vec<_> = page1
        .suggestions
        .iter()
        .map(|s| (s.display.as_str(), s.score, s.payload.clone()))
        .collect();
    assert_eq!(
        got,
        [
            ("iPhone", 25.0, b"sku-1".to_vec()),
            ("iPad", 20.0, vec![]),
            ("iMac", -1.5, vec![0, 255])
        ]
    );
    // Clearing a payload, and a fractional score.
    add(
        &mut client,
        d,
        vec![pb::AutocompleteTerm {
            display: "iPhone".into(),
            payload: Some(vec![]),
            score: Some(0.25),
            ..Default::default()
        }],
    )
    .await;
    let page1 = page(
        &mut client,
        request(d, "iph", Mode::Prefix, Order::Score, 10),
    )
    .await;
    assert_eq!(
        (
            page1.suggestions[0].score,
            page1.suggestions[0].payload.len()
        ),
        (0.25, 0)
    );
    // Ties in score order are broken lexicographically.
    add(
        &mut client,
        d,
        vec![scored("iPod", 20.0), scored("iBook", 20.0)],
    )
    .await;
    assert_eq!(
        complete(&mut client, d, "i", Mode::Prefix, Order::Score, 10).await,
        ["iBook", "iPad", "iPod", "iPhone", "iMac"]
    );
}

/// Score order stays exact through the ranked sets Baton keeps for prefixes with many terms, as
/// they are created, updated and dropped.
#[tokio::test]
async fn ranked_prefix_sets_follow_changes() {
    let (redis, baton, mut client) = setup().await;
    let reader = client.clone();
    let d = "ranked";
    let n = 700;
    let score = |i: usize| ((i * 7919) % 1000) as f64;
    let mut expected: HashMap<String, f64> = HashMap::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(250) {
        let terms = chunk
            .iter()
            .map(|&i| scored(&format!("ab{i:04}"), score(i)))
            .collect();
        add(&mut client, d, terms).await;
    }
    for i in 0..n {
        expected.insert(format!("ab{i:04}"), score(i));
    }
    let check = |expected: HashMap<String, f64>| {
        let mut client = reader.clone();
        async move {
            let mut want: Vec<(String, f64)> = expected.into_iter().collect();
            want.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            for q in ["a", "ab", "ab0", "ab01"] {
                let got =
                    all_pages(&mut client, request(d, q, Mode::Prefix, Order::Score, 37)).await;
                let got: Vec<(String, f64)> =
                    got.into_iter().map(|s| (s.display, s.score)).collect();
                let want: Vec<_> = want
                    .iter()
                    .filter(|(k, _)| k.starts_with(q))
                    .cloned()
                    .collect();
                assert_eq!(got, want, "query {q:?}");
            }
        }
    };
    check(expected.clone()).await;
    let mut conn = redis.conn().await;
    let ranked_key = format!("{}{{ac:{d}}}:r:ab", baton.prefix());
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&ranked_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        exists, 1,
        "a prefix with more than 256 terms has a ranked set"
    );
    let deep: usize = redis::cmd("ZCARD")
        .arg(format!("{}{{ac:{d}}}:t:ab0", baton.prefix()))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        (256..=512).contains(&deep),
        "a 3-character prefix with 700 terms keeps its 256 to 512 best: {deep}"
    );

    // Score changes move terms within the ranked sets.
    let updates: Vec<_> = (0..n)
        .step_by(3)
        .map(|i| (format!("ab{i:04}"), 2000.0 - i as f64))
        .collect();
    add(
        &mut client,
        d,
        updates.iter().map(|(k, s)| scored(k, *s)).collect(),
    )
    .await;
    expected.extend(updates);
    check(expected.clone()).await;

    // Removing most terms drops the ranked set; the order stays exact.
    let gone: Vec<String> = (0..n)
        .filter(|i| i % 7 != 0)
        .map(|i| format!("ab{i:04}"))
        .collect();
    for chunk in gone.chunks(500) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        remove(&mut client, d, &refs).await;
    }
    for k in &gone {
        expected.remove(k);
    }
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&ranked_key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        exists, 0,
        "the ranked set goes once the prefix has 128 terms or fewer"
    );
    check(expected.clone()).await;
    // And comes back when the prefix grows again.
    add(
        &mut client,
        d,
        (0..n)
            .filter(|i| i % 7 != 0)
            .take(300)
            .map(|i| scored(&format!("ab{i:04}"), 1.0))
            .collect(),
    )
    .await;
    for i in (0..n).filter(|i| i % 7 != 0).take(300) {
        expected.insert(format!("ab{i:04}"), 1.0);
    }
    check(expected).await;
}

/// Score order stays exact through the ranked sets of first bytes (one per byte of multi-byte
/// first characters too) and of non-ASCII character prefixes, as they are created, updated and
/// dropped, for prefix queries and for common substring queries that walk the whole dictionary.
#[tokio::test]
async fn ranked_sets_by_first_byte_follow_changes() {
    let (redis, baton, mut client) = setup().await;
    let reader = client.clone();
    let d = "bytes";
    let score = |i: usize| ((i * 7919) % 500) as f64;
    let mut expected: HashMap<String, f64> = HashMap::new();
    let mut all = Vec::new();
    for i in 0..300 {
        all.push(format!("Жанна {i:03}"));
        all.push(format!("王{i:03}"));
        all.push(format!("ab{i:03}"));
    }
    for i in 0..60 {
        all.push(format!("Élise {i:03}"));
    }
    for chunk in all.chunks(400) {
        let terms = chunk
            .iter()
            .map(|t| {
                scored(
                    t,
                    score(t.len() * 31 + t.chars().last().map_or(0, |c| c as usize)),
                )
            })
            .collect();
        add(&mut client, d, terms).await;
    }
    for t in &all {
        expected.insert(
            t.clone(),
            score(t.len() * 31 + t.chars().last().map_or(0, |c| c as usize)),
        );
    }
    let check = |expected: HashMap<String, f64>| {
        let mut client = reader.clone();
        async move {
            let mut want: Vec<(String, f64)> = expected.into_iter().collect();
            want.sort_by(|a, b| {
                b.1.total_cmp(&a.1)
                    .then_with(|| lex_key(&a.0).cmp(&lex_key(&b.0)))
            });
            let cases = [
                ("ж", Mode::Prefix),
                ("жа", Mode::Prefix),
                ("жанна 0", Mode::Prefix),
                ("王", Mode::Prefix),
                ("王0", Mode::Prefix),
                ("é", Mode::Prefix),
                ("a", Mode::Prefix),
                ("ab1", Mode::Prefix),
                // One character: no gram to find words by, so the whole dictionary is walked.
                ("1", Mode::Contains),
            ];
            for (q, mode) in cases {
                let got = all_pages(&mut client, request(d, q, mode, Order::Score, 41)).await;
                let got: Vec<(String, f64)> =
                    got.into_iter().map(|s| (s.display, s.score)).collect();
                let want: Vec<_> = want
                    .iter()
                    .filter(|(t, _)| {
                        let key = lex_key(t).0;
                        let q = lex_key(q).0;
                        match mode {
                            Mode::Prefix => key.starts_with(&q),
                            _ => key.contains(&q),
                        }
                    })
                    .cloned()
                    .collect();
                assert_eq!(got, want, "query {q:?} {mode:?}");
            }
        }
    };
    check(expected.clone()).await;
    let conn = redis.conn().await;
    let base = format!("{}{{ac:{d}}}", baton.prefix());
    let exists = |keys: Vec<String>| {
        let mut conn = conn.clone();
        async move {
            let mut out = Vec::new();
            for k in keys {
                let n: i64 = redis::cmd("EXISTS")
                    .arg(&k)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                out.push((k, n == 1));
            }
            out
        }
    };
    let sets = || {
        [
            "b:d0", "b:e7", "b:c3", "b:61", "r:ж", "r:жа", "r:王", "r:ab", "r:é",
        ]
        .map(|s| format!("{base}:{s}"))
        .to_vec()
    };
    let present: Vec<bool> = exists(sets()).await.into_iter().map(|(_, e)| e).collect();
    // Every first byte has a set once the dictionary is large; characters past 256 terms.
    assert_eq!(
        present,
        [true, true, true, true, true, true, true, true, false]
    );

    // Score changes move terms in every set they are in.
    let updates: Vec<(String, f64)> = all
        .iter()
        .step_by(4)
        .map(|t| (t.clone(), 1000.0 - t.len() as f64))
        .collect();
    for chunk in updates.chunks(300) {
        add(
            &mut client,
            d,
            chunk.iter().map(|(t, s)| scored(t, *s)).collect(),
        )
        .await;
    }
    expected.extend(updates);
    check(expected.clone()).await;

    // Removing all but 100 terms drops every set; the order stays exact.
    let gone: Vec<String> = all.iter().skip(100).cloned().collect();
    for chunk in gone.chunks(500) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        remove(&mut client, d, &refs).await;
    }
    for t in &gone {
        expected.remove(t);
    }
    for (k, e) in exists(sets()).await {
        assert!(!e, "{k} is dropped");
    }
    let marks: Vec<String> = redis::cmd("HKEYS")
        .arg(format!("{base}:h"))
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    let mut marks: Vec<&str> = marks.iter().map(String::as_str).collect();
    marks.sort_unstable();
    // Only the lex sets of the first bytes left are marked.
    assert_eq!(
        marks,
        ["l:61", "l:d0", "l:e7"],
        "no ranked set is left marked"
    );
    check(expected.clone()).await;

    // And they come back when the dictionary grows again.
    for chunk in gone.chunks(500) {
        add(
            &mut client,
            d,
            chunk.iter().map(|t| scored(t, 3.0)).collect(),
        )
        .await;
    }
    for t in &gone {
        expected.insert(t.clone(), 3.0);
    }
    let present: Vec<bool> = exists(sets()).await.into_iter().map(|(_, e)| e).collect();
    assert_eq!(
        present,
        [true, true, true, true, true, true, true, true, false]
    );
    check(expected).await;
}

/// A long prefix with few, low-scored terms under a shorter prefix with many: by score, Baton
/// reads the best terms of the 3-character prefix, then walks the 2-character prefix's ranked set
/// best first, a bounded number of entries per call, and the pages (some empty, with a token to
/// go on) end up with every term once, in order.
#[tokio::test]
async fn sparse_long_prefix_by_score_pages_past_the_budget() {
    let (_redis, _baton, mut client) = setup().await;
    let d = "sparse";
    let mut terms: Vec<pb::AutocompleteTerm> = (0..3000)
        .map(|i| scored(&format!("abz{i:04}"), 100.0 + (i % 97) as f64))
        .collect();
    // More than are ranked in one call: past the deep set's best, the walk is the way.
    for i in 0..300 {
        terms.push(scored(&format!("abzz{i:03}"), (i % 50) as f64));
    }
    for chunk in terms.chunks(1000) {
        add(&mut client, d, chunk.to_vec()).await;
    }
    let mut calls = 0;
    let mut got = Vec::new();
    let mut req = request(d, "abzz", Mode::Prefix, Order::Score, 50);
    loop {
        let response = page(&mut client, req.clone()).await;
        calls += 1;
        got.extend(displays(&response.suggestions));
        if response.next_page_token.is_empty() {
            break;
        }
        req.page_token = response.next_page_token;
        assert!(calls < 100, "pagination did not end");
    }
    let mut want: Vec<(i64, String)> = (0..300)
        .map(|i| (-((i % 50) as i64), format!("abzz{i:03}")))
        .collect();
    want.sort();
    let want: Vec<String> = want.into_iter().map(|(_, t)| t).collect();
    assert_eq!(got, want);
    assert!(calls > 7, "the walk went past its budget: {calls} calls");
}

/// By score, a query too common for the word index walks the whole dictionary best first: the
/// set of its best-ranked terms, then every first byte's set merged. Pages stay exact as terms
/// are removed and as scores move terms into and out of the best-ranked set.
#[tokio::test]
async fn whole_dictionary_by_score_goes_from_the_best_terms_to_the_rest() {
    let (redis, baton, mut client) = setup().await;
    let d = "scored";
    let firsts = ["a", "b", "ж", "王"];
    let mut expected: HashMap<String, f64> = HashMap::new();
    for i in 0..5000 {
        let t = format!("{}{i:04}", firsts[i % 4]);
        expected.insert(t, ((i * 7919) % 2003) as f64);
    }
    let all: Vec<(String, f64)> = expected.iter().map(|(t, s)| (t.clone(), *s)).collect();
    for chunk in all.chunks(1000) {
        add(
            &mut client,
            d,
            chunk.iter().map(|(t, s)| scored(t, *s)).collect(),
        )
        .await;
    }
    let mut conn = redis.conn().await;
    let n: usize = redis::cmd("ZCARD")
        .arg(format!("{}{{ac:{d}}}:top", baton.prefix()))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        (baton::autocomplete::TOP_RANKED..=2 * baton::autocomplete::TOP_RANKED).contains(&n),
        "{n} best-ranked terms kept"
    );
    let reader = client.clone();
    let check = |expected: HashMap<String, f64>| {
        let mut client = reader.clone();
        async move {
            let mut want: Vec<(String, f64)> = expected
                .into_iter()
                .filter(|(t, _)| t.contains('1'))
                .collect();
            want.sort_by(|a, b| {
                b.1.total_cmp(&a.1)
                    .then_with(|| lex_key(&a.0).cmp(&lex_key(&b.0)))
            });
            // One character: no gram to find words by, so the whole dictionary is walked.
            let got = all_pages(
                &mut client,
                request(d, "1", Mode::Contains, Order::Score, 97),
            )
            .await;
            let got: Vec<(String, f64)> = got.into_iter().map(|s| (s.display, s.score)).collect();
            assert_eq!(got, want);
        }
    };
    check(expected.clone()).await;

    // The best terms go; some others rise into the best, and some of the best sink.
    let mut best: Vec<(String, f64)> = expected.iter().map(|(t, s)| (t.clone(), *s)).collect();
    best.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let gone: Vec<String> = best.iter().take(300).map(|(t, _)| t.clone()).collect();
    let refs: Vec<&str> = gone.iter().map(String::as_str).collect();
    remove(&mut client, d, &refs).await;
    for t in &gone {
        expected.remove(t);
    }
    let mut moves: Vec<(String, f64)> = best[300..500]
        .iter()
        .map(|(t, _)| (t.clone(), -1.0))
        .collect();
    moves.extend(best[4000..4200].iter().map(|(t, _)| (t.clone(), 5000.0)));
    add(
        &mut client,
        d,
        moves.iter().map(|(t, s)| scored(t, *s)).collect(),
    )
    .await;
    expected.extend(moves);
    check(expected).await;
}

/// A query too common for the word index walks the whole dictionary, whose terms Baton keeps by
/// first byte: pages go from one first byte to the next without losing or repeating a term,
/// also when a page ends exactly where a first byte's terms do.
#[tokio::test]
async fn whole_dictionary_walk_pages_across_first_bytes() {
    let (_redis, _baton, mut client) = setup().await;
    let d = "spread";
    let mut terms = Vec::new();
    for first in ["a", "b", "ж", "王", "🎸"] {
        for k in 0..5 {
            terms.push(format!("{first}1-{k}"));
            terms.push(format!("{first}2-{k}"));
        }
    }
    let refs: Vec<&str> = terms.iter().map(String::as_str).collect();
    add_all(&mut client, d, &refs).await;
    let mut want: Vec<String> = terms.iter().filter(|t| t.contains('1')).cloned().collect();
    want.sort_by_key(|t| lex_key(t));
    for limit in [1, 4, 5, 7, 10, 25, 26] {
        // One character: no gram to find words by.
        let got = all_pages(
            &mut client,
            request(d, "1", Mode::Contains, Order::Lexicographic, limit),
        )
        .await;
        assert_eq!(displays(&got), want, "limit {limit}");
        let got = all_pages(
            &mut client,
            request(d, "1", Mode::Contains, Order::Score, limit),
        )
        .await;
        assert_eq!(got.len(), want.len(), "limit {limit}, by score");
    }
}
