//! Pagination and concurrency.

use super::*;

/// Paging through thousands of results returns each exactly once, in order, in every mode and
/// order, and across changes made between pages.
#[tokio::test]
async fn pagination_through_thousands_returns_each_once() {
    let (_redis, _baton, mut client) = setup().await;
    let d = "big";
    let n = 3000;
    let names: Vec<String> = (0..n)
        .map(|i| match i % 3 {
            0 => format!("Member {i:05} Smith"),
            // In the postings of both "smith" and "smithson".
            1 => format!("member-{i:05} Smith Smithson"),
            _ => format!("Émile {i:05} Blacksmith"),
        })
        .collect();
    for chunk in names.chunks(1000) {
        let terms = chunk
            .iter()
            .enumerate()
            .map(|(i, d)| scored(d, (i % 50) as f64))
            .collect();
        add(&mut client, d, terms).await;
    }
    assert_eq!(count(&mut client, d).await, n as u64);
    let cases = [
        ("mem", Mode::Prefix, n * 2 / 3),
        // Longer than the deepest ranked prefix, more terms than are ranked in one call.
        ("member", Mode::Prefix, n * 2 / 3),
        ("smi", Mode::WordPrefix, n * 2 / 3),
        ("smith", Mode::Contains, n),
        ("son", Mode::Suffix, n / 3),
        ("m", Mode::Automatic, n),
        (
            "00",
            Mode::Contains,
            names.iter().filter(|d| d.contains("00")).count(),
        ),
    ];
    for (q, mode, expected) in cases {
        for order in [Order::Lexicographic, Order::Score] {
            let got = all_pages(&mut client, request(d, q, mode, order, 97)).await;
            let unique: HashSet<&str> = got.iter().map(|s| s.display.as_str()).collect();
            assert_eq!(got.len(), expected, "{q:?} {mode:?} {order:?}: count");
            assert_eq!(
                unique.len(),
                expected,
                "{q:?} {mode:?} {order:?}: duplicates"
            );
            if mode != Mode::Automatic {
                // In order within the mode.
                let keys: Vec<_> = got.iter().map(|s| (s.score, lex_key(&s.display))).collect();
                for w in keys.windows(2) {
                    let ordered = match order {
                        Order::Score => w[0].0 > w[1].0 || (w[0].0 == w[1].0 && w[0].1 < w[1].1),
                        _ => w[0].1 < w[1].1,
                    };
                    assert!(
                        ordered,
                        "{q:?} {mode:?} {order:?}: {:?} then {:?}",
                        w[0], w[1]
                    );
                }
            }
        }
    }

    // Terms added and removed between pages: each term is seen once; none after its removal;
    // none added behind the mark.
    let mut req = request(d, "member", Mode::Prefix, Order::Lexicographic, 100);
    let mut seen: Vec<String> = Vec::new();
    let mut removed_at = HashMap::new();
    loop {
        let response = page(&mut client, req.clone()).await;
        seen.extend(displays(&response.suggestions));
        if response.next_page_token.is_empty() {
            break;
        }
        req.page_token = response.next_page_token;
        let victim = format!("Member {:05} Smith", (seen.len() * 3 + 600) % n / 3 * 3);
        if remove(&mut client, d, &[victim.as_str()]).await.removed == 1 {
            removed_at.insert(victim, seen.len());
        }
        let ahead = term(&format!("Member {:05} New", seen.len()));
        add(&mut client, d, vec![ahead, term("member 0 behind")]).await;
    }
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no duplicates");
    for (victim, at) in removed_at {
        assert!(
            !seen[at..].contains(&victim),
            "{victim} came after its removal"
        );
    }
    assert!(
        !seen.contains(&"member 0 behind".to_owned()),
        "a term added behind the mark is not returned"
    );
}

/// Adds and removes running during queries never show a partial entry or one from another
/// dictionary: every result is whole (display, score and payload agree) and belongs here.
#[tokio::test]
async fn concurrent_adds_and_removes_never_show_partial_or_foreign_entries() {
    let (_redis, baton, client) = setup().await;
    let entry = |dict: &str, i: u32| pb::AutocompleteTerm {
        display: format!("{dict} item {i:04}"),
        score: Some(f64::from(i)),
        payload: Some(format!("{dict}/{i}").into_bytes()),
        increment: false,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    for dict in ["alpha", "beta"] {
        let mut writer = AutocompleteServiceClient::new(channel(baton.addr()).await);
        let stop = Arc::clone(&stop);
        tasks.spawn(async move {
            let mut round = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let base = (round % 4) * 100;
                let terms = (base..base + 300).map(|i| entry(dict, i)).collect();
                writer
                    .add(pb::AutocompleteServiceAddRequest {
                        dictionary: dict.into(),
                        terms,
                        ..Default::default()
                    })
                    .await
                    .expect("Add");
                let gone: Vec<String> = (base..base + 300)
                    .step_by(2)
                    .map(|i| format!("{dict} item {i:04}"))
                    .collect();
                writer
                    .remove(pb::AutocompleteServiceRemoveRequest {
                        dictionary: dict.into(),
                        displays: gone,
                    })
                    .await
                    .expect("Remove");
                round += 1;
            }
            0usize
        });
    }
    for r in 0..4 {
        let mut reader = client.clone();
        let stop = Arc::clone(&stop);
        tasks.spawn(async move {
            let modes = [
                Mode::Prefix,
                Mode::Contains,
                Mode::WordPrefix,
                Mode::Automatic,
                Mode::Suffix,
            ];
            let mut checked = 0;
            let mut n = r;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let dict = if n % 2 == 0 { "alpha" } else { "beta" };
                let query = ["item 0", "item", "ite", "0", "1", "ha item", "a it"][n % 7];
                let mode = modes[n % modes.len()];
                let order = if n % 3 == 0 {
                    Order::Score
                } else {
                    Order::Lexicographic
                };
                let got = all_pages(&mut reader, request(dict, query, mode, order, 50)).await;
                for s in got {
                    let i: u32 = s
                        .display
                        .rsplit(' ')
                        .next()
                        .unwrap()
                        .parse()
                        .expect("a number");
                    assert_eq!(s.display, format!("{dict} item {i:04}"), "foreign entry");
                    assert_eq!(s.score, f64::from(i), "{}", s.display);
                    assert_eq!(
                        s.payload,
                        format!("{dict}/{i}").into_bytes(),
                        "{}",
                        s.display
                    );
                    checked += 1;
                }
            }
            checked
        });
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut checked = 0;
    while let Some(done) = within(
        Duration::from_secs(30),
        tasks.join_next(),
        "the workers to stop",
    )
    .await
    {
        checked += done.expect("no worker panicked");
    }
    assert!(checked > 1000, "only {checked} results were checked");
}

/// Reads never write: completing and listing change nothing in Redis.
#[tokio::test]
async fn reads_never_write() {
    // Counts writes node-wide: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    add_all(
        &mut client,
        "d",
        &(0..400)
            .map(|i| format!("name {i}"))
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .await;
    client
        .record_recent(pb::AutocompleteServiceRecordRecentRequest {
            list: "l".into(),
            display: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut conn = redis.conn().await;
    let before = conn
        .info_sum("persistence", "rdb_changes_since_last_save")
        .await;
    for mode in [
        Mode::Prefix,
        Mode::WordPrefix,
        Mode::Suffix,
        Mode::Contains,
        Mode::Automatic,
        Mode::Fuzzy,
    ] {
        for order in [Order::Lexicographic, Order::Score] {
            all_pages(&mut client, request("d", "n", mode, order, 50)).await;
            all_pages(&mut client, request("d", "e 1", mode, order, 50)).await;
            // Typos of every distance, and a budget-cutting one.
            all_pages(&mut client, request("d", "nmae 12", mode, order, 50)).await;
            all_pages(&mut client, request("d", "naem", mode, order, 1000)).await;
        }
    }
    client
        .list_recent(pb::AutocompleteServiceListRecentRequest {
            list: "l".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .complete_recent(pb::AutocompleteServiceCompleteRecentRequest {
            list: "l".into(),
            query: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .describe(pb::AutocompleteServiceDescribeRequest {
            dictionary: "d".into(),
        })
        .await
        .unwrap();
    let after = conn
        .info_sum("persistence", "rdb_changes_since_last_save")
        .await;
    assert_eq!(before, after, "reads changed Redis");
}

/// Removing every term of a dictionary leaves no key behind.
#[tokio::test]
async fn removing_every_term_leaves_no_key() {
    let (redis, baton, mut client) = setup().await;
    let names: Vec<String> = (0..600)
        .map(|i| format!("Ünïcode name {i} 王{i} 🎸"))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    add_all(&mut client, "gone", &refs).await;
    let mut conn = redis.conn().await;
    let keys = |conn: &mut support::RedisConn| {
        let mut conn = conn.clone();
        let pattern = format!("{}*", baton.prefix());
        async move { conn.keys(&pattern).await }
    };
    assert!(keys(&mut conn).await.len() > 10);
    for chunk in refs.chunks(250) {
        remove(&mut client, "gone", chunk).await;
    }
    assert_eq!(keys(&mut conn).await, Vec::<String>::new());
    assert_eq!(count(&mut client, "gone").await, 0);
}
