//! Features: the indexes a dictionary keeps.

use super::*;

/// The feature a query in `mode` and `order` needs first, as documented, if any.
fn needed_feature(mode: Mode, order: Order, has: &[Feature]) -> Option<Feature> {
    let mut need = match mode {
        Mode::Fuzzy | Mode::Prefix | Mode::Unspecified => vec![],
        Mode::WordPrefix => vec![Feature::Words],
        Mode::Suffix | Mode::Contains | Mode::Automatic => vec![Feature::Words, Feature::Substring],
    };
    if order == Order::Score && mode != Mode::Fuzzy {
        need.push(Feature::Ranked);
    }
    need.into_iter().find(|f| !has.contains(f))
}

/// Seeded random terms in dictionaries of every feature set: each serves exactly the modes and
/// orders of its features, with the model's results (every page followed), refuses the others
/// with FAILED_PRECONDITION naming the feature to declare, and keeps in Redis no key of an index
/// it did not declare. A dictionary that never declared features has every one.
#[tokio::test]
async fn features_serve_their_modes_exactly_and_keep_only_their_indexes() {
    use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
    let (redis, baton, mut client) = setup().await;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1919);
    let syllables = [
        "ab", "an", "na", "ba", "ca", "bac", "nab", "cab", "ana", "ban",
    ];
    let mut terms: Vec<(String, f64)> = Vec::new();
    let mut seen = HashSet::new();
    while terms.len() < 700 {
        let words: Vec<String> = (0..rng.random_range(1..4))
            .map(|w| {
                let mut word: String = (0..rng.random_range(1..4))
                    .map(|_| syllables[rng.random_range(0..syllables.len())])
                    .collect();
                if w == 0 && rng.random_range(0..10) < 4 {
                    // Many terms under "ab": ranked sets of 2-character prefixes too.
                    word.insert_str(0, "ab");
                }
                if rng.random_range(0..3) == 0 {
                    word[..1].make_ascii_uppercase();
                }
                word
            })
            .collect();
        let display = words.join(" ");
        if seen.insert(display.clone()) {
            terms.push((display, f64::from(rng.random_range(0..20u32))));
        }
    }
    let gone: Vec<String> = terms.iter().step_by(7).map(|t| t.0.clone()).collect();
    let kept: Vec<(String, f64)> = terms
        .iter()
        .filter(|t| !gone.contains(&t.0))
        .cloned()
        .collect();
    // Queries: pieces of terms, trimmed, and a few syllables.
    let queries: Vec<String> = (0..10)
        .map(|i| {
            if i % 5 == 4 {
                return syllables[rng.random_range(0..syllables.len())].to_owned();
            }
            let k = terms[rng.random_range(0..terms.len())].0.to_lowercase();
            let a = rng.random_range(0..k.len());
            let b = rng.random_range(a + 1..=k.len().min(a + 8));
            let q = k[a..b].trim().to_owned();
            if q.is_empty() { "a".to_owned() } else { q }
        })
        .collect();

    let sets: [(&str, Option<&[Feature]>); 7] = [
        ("f-default", None),
        ("f-none", Some(&[])),
        ("f-r", Some(&[Feature::Ranked])),
        ("f-w", Some(&[Feature::Words])),
        ("f-rw", Some(&[Feature::Words, Feature::Ranked])),
        ("f-ws", Some(&[Feature::Substring, Feature::Words])),
        (
            "f-rws",
            Some(&[Feature::Ranked, Feature::Words, Feature::Substring]),
        ),
    ];
    let mut conn = redis.conn().await;
    let (mut compared, mut found, mut refused) = (0, 0, 0);
    for (name, declared) in sets {
        let has: Vec<Feature> = declared.map_or_else(
            || vec![Feature::Ranked, Feature::Words, Feature::Substring],
            |d| {
                let mut d = d.to_vec();
                d.sort_by_key(|f| *f as i32);
                d
            },
        );
        if let Some(d) = declared {
            let r = configure(&mut client, name, d).await.expect("Configure");
            assert_eq!(
                r.features().collect::<Vec<_>>(),
                has.clone(),
                "{name}: Configure's answer"
            );
            assert_eq!(r.term_count, 0);
        }
        for chunk in terms.chunks(350) {
            add(
                &mut client,
                name,
                chunk.iter().map(|(d, s)| scored(d, *s)).collect(),
            )
            .await;
        }
        let gone_refs: Vec<&str> = gone.iter().map(String::as_str).collect();
        remove(&mut client, name, &gone_refs).await;
        let described = client
            .describe(pb::AutocompleteServiceDescribeRequest {
                dictionary: name.to_owned(),
            })
            .await
            .expect("Describe")
            .into_inner();
        assert_eq!(described.term_count, kept.len() as u64, "{name}");
        assert_eq!(
            described.features().collect::<Vec<_>>(),
            has.clone(),
            "{name}: Describe"
        );
        assert_eq!(described.features_declared, declared.is_some(), "{name}");

        // Only the declared indexes are in Redis, and those are.
        let kinds = key_kinds(&mut conn, baton.prefix(), name).await;
        let mut allowed: HashSet<&str> = ["data", "h", "l", "f"].into();
        let mut required: HashSet<&str> = ["data", "h", "l"].into();
        if has.contains(&Feature::Ranked) {
            allowed.extend(["b", "r", "t", "top"]);
            required.extend(["b", "r", "top"]);
        }
        if has.contains(&Feature::Words) {
            allowed.extend(["w", "v"]);
            required.extend(["w", "v"]);
        }
        if has.contains(&Feature::Substring) {
            allowed.insert("vg");
            required.insert("vg");
        }
        for k in &kinds {
            assert!(
                allowed.contains(k.as_str()),
                "{name}: a {k:?} key: {kinds:?}"
            );
        }
        for k in required {
            assert!(kinds.contains(k), "{name}: no {k:?} key: {kinds:?}");
        }

        for mode in [
            Mode::Prefix,
            Mode::WordPrefix,
            Mode::Suffix,
            Mode::Contains,
            Mode::Automatic,
            Mode::Fuzzy,
        ] {
            for order in [Order::Lexicographic, Order::Score] {
                for (i, q) in queries.iter().enumerate() {
                    let limit = [7, 40, 250][i % 3];
                    let req = request(name, q, mode, order, limit);
                    if let Some(feature) = needed_feature(mode, order, &has) {
                        let status = client.complete(req).await.expect_err("refused");
                        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
                        assert!(
                            status.message().contains(feature.as_str_name()),
                            "{name} {mode:?} {order:?}: {status:?}"
                        );
                        refused += 1;
                        continue;
                    }
                    if mode == Mode::Fuzzy {
                        // Served whatever the features (its model is tested above).
                        page(&mut client, fuzzy(name, q, order, limit)).await;
                        continue;
                    }
                    let got = displays(&all_pages(&mut client, req).await);
                    let want = mode_model(&kept, q, mode, order);
                    assert_eq!(got, want, "{name}: {q:?} {mode:?} {order:?}");
                    compared += 1;
                    found += usize::from(!got.is_empty());
                }
            }
        }
    }
    // The test means something: many answers compared, most with matches, refusals seen.
    assert!(compared >= 250, "{compared} answers compared");
    assert!(
        found * 2 >= compared,
        "{found} of {compared} answers had matches"
    );
    assert!(refused >= 250, "{refused} refusals");
}

/// Features of an empty dictionary change at once: the same features again are accepted
/// (idempotent); once its last term is removed the dictionary keeps its features (and only that
/// key), and they can change at once again.
#[tokio::test]
async fn features_of_an_empty_dictionary_change_at_once() {
    let (redis, baton, mut client) = setup().await;
    let d = "cfg";
    configure(&mut client, d, &[Feature::Ranked])
        .await
        .expect("empty");
    configure(&mut client, d, &[Feature::Words])
        .await
        .expect("still empty");
    add_all(&mut client, d, &["alpha beta", "alpine"]).await;
    let again = configure(&mut client, d, &[Feature::Words])
        .await
        .expect("same");
    assert_eq!(again.features().collect::<Vec<_>>(), vec![Feature::Words]);
    assert_eq!(again.term_count, 2);
    assert!(again.change.is_none());
    // By word is served, by score is not.
    assert_eq!(
        complete(
            &mut client,
            d,
            "bet",
            Mode::WordPrefix,
            Order::Lexicographic,
            10
        )
        .await,
        ["alpha beta"]
    );
    let status = client
        .complete(request(d, "al", Mode::Prefix, Order::Score, 10))
        .await
        .expect_err("not ranked");
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(
        status.message().contains("AUTOCOMPLETE_FEATURE_RANKED")
            && status.message().contains("AUTOCOMPLETE_ORDER_SCORE"),
        "{status:?}"
    );
    // A dictionary with terms that never declared features has every one: declaring all of
    // them changes nothing.
    add_all(&mut client, "old", &["alpha"]).await;
    let all = configure(
        &mut client,
        "old",
        &[Feature::Words, Feature::Substring, Feature::Ranked],
    )
    .await
    .expect("every one");
    assert!(all.change.is_none() && all.features.len() == 3);
    // Emptied, the dictionary keeps only its features, which can change at once again.
    remove(&mut client, d, &["alpha beta", "alpine"]).await;
    let mut conn = redis.conn().await;
    assert_eq!(
        key_kinds(&mut conn, baton.prefix(), d).await,
        HashSet::from(["f".to_owned()])
    );
    let described = client
        .describe(pb::AutocompleteServiceDescribeRequest {
            dictionary: d.to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        described.features().collect::<Vec<_>>(),
        vec![Feature::Words]
    );
    assert!(described.features_declared && described.change.is_none());
    configure(&mut client, d, &[Feature::Ranked])
        .await
        .expect("empty again");
    add_all(&mut client, d, &["alpha beta"]).await;
    assert_eq!(
        complete(&mut client, d, "al", Mode::Prefix, Order::Score, 10).await,
        ["alpha beta"]
    );
}

/// Bad feature lists fail INVALID_ARGUMENT naming the field, and change nothing.
#[tokio::test]
async fn configure_validation_names_the_field() {
    let (_redis, _baton, mut client) = setup().await;
    let cases: [(&str, Vec<i32>, &str); 6] = [
        ("v", vec![Feature::Unspecified as i32], "features[0]"),
        ("v", vec![Feature::Words as i32, 99], "features[1]"),
        ("v", vec![-1], "features[0]"),
        (
            "v",
            vec![Feature::Ranked as i32, Feature::Ranked as i32],
            "features[1]",
        ),
        ("v", vec![Feature::Substring as i32], "features"),
        ("", vec![], "dictionary"),
    ];
    for (dictionary, features, field) in cases {
        let status = client
            .configure(pb::AutocompleteServiceConfigureRequest {
                dictionary: dictionary.to_owned(),
                features: features.clone(),
            })
            .await
            .expect_err("should fail");
        invalid(&status, field);
    }
    let described = client
        .describe(pb::AutocompleteServiceDescribeRequest {
            dictionary: "v".to_owned(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!described.features_declared, "nothing changed");
    assert_eq!(described.features.len(), 3);
}

/// The contents of the word, vocabulary and gram keys of dictionary `name` (its key suffix →
/// sorted members), to compare two dictionaries' indexes key by key.
async fn word_indexes(
    conn: &mut support::RedisConn,
    prefix: &str,
    name: &str,
) -> std::collections::BTreeMap<String, Vec<Vec<u8>>> {
    let base = format!("{prefix}{{ac:{name}}}:");
    let mut out = std::collections::BTreeMap::new();
    for key in conn.keys(&format!("{base}*")).await {
        let rest = key[base.len()..].to_owned();
        let mut members: Vec<Vec<u8>> = if rest.starts_with("w:") || rest == "v" {
            redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(conn)
                .await
                .expect("ZRANGE")
        } else if rest.starts_with("vg:") {
            redis::cmd("SMEMBERS")
                .arg(&key)
                .query_async(conn)
                .await
                .expect("SMEMBERS")
        } else {
            continue;
        };
        members.sort();
        out.insert(rest, members);
    }
    out
}

/// Terms for the background change tests: words shared between terms, in several scripts.
fn change_terms(n: usize, salt: usize) -> Vec<String> {
    let words = [
        "anna", "smith", "jean-luc", "zoë", "王伟", "müller", "ivanov", "иван", "lee",
    ];
    (0..n)
        .map(|i| {
            let j = i * 7 + salt;
            format!(
                "{} {} {}{}",
                words[j % words.len()],
                words[(j / 3) % words.len()],
                ["x", "qu", "ba"][j % 3],
                j
            )
        })
        .collect()
}

/// WORDS and SUBSTRING added to a dictionary with terms are built in the background while Adds
/// and Removes go on; queries needing them are refused until the build ends (saying so), and then
/// the postings, vocabulary and gram sets are exactly those of a dictionary that had the
/// features from the start and saw the same writes, key by key. Dropping them deletes every key
/// of theirs, and dropping RANKED every ranked set.
#[tokio::test]
async fn features_added_to_a_dictionary_with_terms_are_built_exactly_under_writes() {
    let (redis, baton, mut client) = setup().await;
    let (late, early) = ("late", "early");
    configure(&mut client, late, &[]).await.expect("late");
    configure(&mut client, early, &[Feature::Words, Feature::Substring])
        .await
        .expect("early");
    let initial = change_terms(1500, 0);
    let refs: Vec<&str> = initial.iter().map(String::as_str).collect();
    add_all(&mut client, late, &refs).await;
    add_all(&mut client, early, &refs).await;

    let started = configure(&mut client, late, &[Feature::Words, Feature::Substring])
        .await
        .expect("a change");
    assert!(started.change.is_some(), "a change under way: {started:?}");
    // Writes while the build runs, the same to both dictionaries.
    let writer = {
        let mut client = client.clone();
        tokio::spawn(async move {
            for round in 0..30 {
                let fresh = change_terms(20, 5000 + round * 20);
                let fresh: Vec<&str> = fresh.iter().map(String::as_str).collect();
                let gone = change_terms(15, round * 45);
                let gone: Vec<&str> = gone.iter().map(String::as_str).collect();
                for d in [late, early] {
                    add_all(&mut client, d, &fresh).await;
                    remove(&mut client, d, &gone).await;
                }
            }
        })
    };
    let status = client
        .complete(request(
            late,
            "smi",
            Mode::WordPrefix,
            Order::Lexicographic,
            10,
        ))
        .await;
    if let Err(status) = &status {
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(status.message().contains("being built"), "{status:?}");
    }
    // SUBSTRING is built after WORDS: while it waits its turn, a query needing it is told so,
    // not told to declare a feature the change is about to build.
    let status = client
        .complete(request(
            late,
            "mit",
            Mode::Contains,
            Order::Lexicographic,
            10,
        ))
        .await;
    if let Err(status) = &status {
        assert_eq!(status.code(), Code::FailedPrecondition);
        let message = status.message();
        assert!(
            message.contains("being built") || message.contains("builds after"),
            "{status:?}"
        );
        assert!(!message.contains("declare it"), "{status:?}");
    }
    writer.await.expect("writer");
    let (done, _) = until_changed(&mut client, late).await;
    assert_eq!(
        done.features().collect::<Vec<_>>(),
        vec![Feature::Words, Feature::Substring]
    );
    let mut conn = redis.conn().await;
    let built = word_indexes(&mut conn, baton.prefix(), late).await;
    let from_start = word_indexes(&mut conn, baton.prefix(), early).await;
    assert!(from_start.len() > 50, "{} keys", from_start.len());
    assert_eq!(
        built.keys().collect::<Vec<_>>(),
        from_start.keys().collect::<Vec<_>>(),
        "the same keys"
    );
    for (k, v) in &from_start {
        assert_eq!(built.get(k), Some(v), "key {k}");
    }
    for (q, mode) in [("smi", Mode::WordPrefix), ("ller", Mode::Contains)] {
        let a = all_pages(
            &mut client,
            request(late, q, mode, Order::Lexicographic, 100),
        )
        .await;
        let b = all_pages(
            &mut client,
            request(early, q, mode, Order::Lexicographic, 100),
        )
        .await;
        assert!(!a.is_empty());
        assert_eq!(displays(&a), displays(&b), "{q:?}");
    }

    // Dropping them deletes every key of theirs; dropping RANKED (a dictionary with every
    // feature by default) every ranked set.
    configure(&mut client, late, &[]).await.expect("drop");
    let all_terms = change_terms(600, 1);
    let all_refs: Vec<&str> = all_terms.iter().map(String::as_str).collect();
    add_all(&mut client, "ranked", &all_refs).await;
    assert!(
        key_kinds(&mut conn, baton.prefix(), "ranked")
            .await
            .contains("b")
    );
    configure(&mut client, "ranked", &[Feature::Words, Feature::Substring])
        .await
        .expect("drop ranked");
    until_changed(&mut client, late).await;
    until_changed(&mut client, "ranked").await;
    assert_eq!(
        key_kinds(&mut conn, baton.prefix(), late).await,
        HashSet::from(["data", "h", "l", "f"].map(str::to_owned))
    );
    assert_eq!(
        key_kinds(&mut conn, baton.prefix(), "ranked").await,
        HashSet::from(["data", "h", "l", "f", "w", "v", "vg"].map(str::to_owned))
    );
    assert_eq!(
        complete(
            &mut client,
            "ranked",
            "anna",
            Mode::Prefix,
            Order::Lexicographic,
            3
        )
        .await
        .len(),
        3
    );
}

/// A change whose driving Baton died (its lease taken, no step made) is taken over by another
/// Baton's next Describe once the lease lapses, and finished; other features during a change are
/// refused.
#[tokio::test]
async fn a_change_whose_driver_died_is_finished_by_another_baton() {
    let (redis, baton, mut client) = setup().await;
    let d = "orphan";
    configure(&mut client, d, &[]).await.expect("none");
    let terms = change_terms(400, 3);
    let refs: Vec<&str> = terms.iter().map(String::as_str).collect();
    add_all(&mut client, d, &refs).await;
    // A Baton that took the change's lease and died before its first step.
    let mut conn = redis.conn().await;
    let lease = format!("{}{{ac:{d}}}:f:lease", baton.prefix());
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("a-dead-baton")
        .arg("PX")
        .arg(1500)
        .query_async(&mut conn)
        .await
        .expect("SET");
    let started = configure(&mut client, d, &[Feature::Words])
        .await
        .expect("the change");
    assert_eq!(started.change.as_ref().map(|c| c.indexed), Some(0));
    let status = configure(&mut client, d, &[Feature::Words, Feature::Substring])
        .await
        .expect_err("another change");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    // While the dead Baton's lease lasts nothing moves; another Baton's Describe then takes over.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stalled = client
        .describe(pb::AutocompleteServiceDescribeRequest {
            dictionary: d.to_owned(),
        })
        .await
        .expect("Describe")
        .into_inner();
    let change = stalled.change.expect("still under way");
    assert_eq!(
        change.indexed, 0,
        "no step while the dead Baton's lease lasts"
    );
    assert_eq!(change.building(), Feature::Words);
    assert_eq!(
        stalled.features.len(),
        0,
        "WORDS not served before it is built"
    );
    let prefix = baton.prefix().to_owned();
    let other = Baton::start_with(&redis, |c| {
        c.redis.command_timeout = TEST_COMMAND_TIMEOUT;
        c.redis.key_prefix = prefix;
    })
    .await;
    let mut other_client = AutocompleteServiceClient::new(channel(other.addr()).await);
    let (done, _) = until_changed(&mut other_client, d).await;
    assert_eq!(done.features().collect::<Vec<_>>(), vec![Feature::Words]);
    assert_eq!(
        complete(
            &mut client,
            d,
            "smi",
            Mode::WordPrefix,
            Order::Lexicographic,
            1000
        )
        .await
        .len(),
        terms.iter().filter(|t| t.contains("smith")).count()
    );
}

/// A Baton shut down gracefully while it drives a change of features stops after its current
/// step and gives the change's lease back before it exits: the change stays under way, with no
/// lease left to lapse, and another Baton takes it over at its first look and finishes it.
#[tokio::test]
async fn a_driver_shut_down_gives_the_change_back() {
    let (redis, mut baton, mut client) = setup().await;
    let d = "handover";
    configure(&mut client, d, &[]).await.expect("none");
    let terms = change_terms(20_000, 11);
    for chunk in terms.chunks(1000) {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        add_all(&mut client, d, &refs).await;
    }
    let lease = format!("{}{{ac:{d}}}:f:lease", baton.prefix());
    let mut conn = redis.conn().await;
    configure(&mut client, d, &[Feature::Words, Feature::Substring])
        .await
        .expect("the change");
    // The driver holds the lease from its first step on.
    within(
        Duration::from_secs(30),
        async {
            loop {
                if lease_holder(&mut conn, &lease).await.is_some() {
                    return;
                }
                // A background job whose steps publish nothing: a short pause between looks.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        },
        "the driver to take the lease",
    )
    .await;
    baton.shutdown().await.expect("a graceful stop");
    assert_eq!(
        lease_holder(&mut conn, &lease).await,
        None,
        "the lease was given back at shutdown"
    );
    let (_other, mut other_client) = other_baton(&redis, &baton).await;
    let stopped = until_described(&mut other_client, d).await;
    assert!(
        stopped.change.is_some(),
        "the change was still under way when its driver stopped (else the test proves nothing: \
         give it more terms)"
    );
    let (done, _) = until_changed(&mut other_client, d).await;
    assert_eq!(
        done.features().collect::<Vec<_>>(),
        vec![Feature::Words, Feature::Substring]
    );
    assert_eq!(
        complete(
            &mut other_client,
            d,
            "smi",
            Mode::WordPrefix,
            Order::Lexicographic,
            1000
        )
        .await
        .len(),
        terms
            .iter()
            .filter(|t| t.contains("smith"))
            .count()
            .min(1000)
    );
}

/// Who holds the lease `key` of a change of features (its driver's id), if anyone.
async fn lease_holder(conn: &mut support::RedisConn, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET")
}

/// The keys every `Add` step (EVALSHA) in the slow log declared, most first: the log keeps every
/// call once `slowlog-log-slower-than` is 0.
async fn declared_keys_per_step(conn: &mut support::RedisConn) -> Vec<u64> {
    let logs: Vec<Vec<redis::Value>> = conn
        .on_every_node(redis::cmd("SLOWLOG").arg("GET").arg(-1))
        .await;
    let mut counts = Vec::new();
    for entry in logs.into_iter().flatten() {
        let redis::Value::Array(fields) = entry else {
            panic!("a SLOWLOG entry: {entry:?}");
        };
        let args: Vec<Vec<u8>> = redis::from_redis_value_ref(&fields[3]).expect("arguments");
        if args[0].eq_ignore_ascii_case(b"evalsha") {
            counts.push(
                String::from_utf8_lossy(&args[2])
                    .parse::<u64>()
                    .expect("numkeys"),
            );
        }
    }
    counts.sort_unstable_by(|a, b| b.cmp(a));
    counts
}

/// Writes declare (and Baton computes) only the keys of the features a dictionary has: a
/// dictionary without features gets steps of its lex sets and fixed keys, not the hundreds of
/// posting, gram and ranked-set keys of the same terms with every feature. Baton learns a
/// dictionary's features from its write steps' answers; when they grew since (a `Configure`),
/// the next step planned for fewer changes nothing, says so, and is planned again, for `Add` and
/// for `Remove`: every index stays exact.
#[tokio::test]
async fn writes_declare_only_the_keys_of_the_features_they_need() {
    // Reads and resets node-wide logs.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let mut conn = redis.conn().await;
    let names = change_terms(60, 1);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    configure(&mut client, "lean", &[]).await.unwrap();
    add_all(&mut client, "lean", &refs[..30]).await;
    add_all(&mut client, "full", &refs[..30]).await;
    let _: Vec<()> = conn
        .on_every_node(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("slowlog-log-slower-than")
                .arg(0),
        )
        .await;
    let mut reset = redis::cmd("SLOWLOG");
    reset.arg("RESET");
    let _: Vec<String> = conn.on_every_node(&reset).await;
    add_all(&mut client, "lean", &refs[30..]).await;
    let lean = declared_keys_per_step(&mut conn).await;
    let _: Vec<String> = conn.on_every_node(&reset).await;
    add_all(&mut client, "full", &refs[30..]).await;
    let full = declared_keys_per_step(&mut conn).await;
    assert!(!lean.is_empty() && !full.is_empty());
    // Five fixed keys and a lex set per first byte (9 words start the terms).
    assert!(
        lean[0] <= 14,
        "a step without features declared {lean:?} keys"
    );
    // Steps get smaller when Redis runs them slowly (a loaded machine: the pace), so the keys of
    // every feature are counted over the batch's steps.
    assert!(
        full.iter().sum::<u64>() > 100,
        "the steps with every feature declared {full:?} keys"
    );

    // The features grew behind Baton's back: the next steps are planned again.
    remove(&mut client, "lean", &refs).await;
    configure(
        &mut client,
        "lean",
        &[Feature::Ranked, Feature::Words, Feature::Substring],
    )
    .await
    .unwrap();
    let many = change_terms(400, 3);
    let many_refs: Vec<&str> = many.iter().map(String::as_str).collect();
    add_all(&mut client, "lean", &many_refs).await;
    add_all(&mut client, "model", &many_refs).await;
    for (query, mode, order) in [
        ("smi", Mode::WordPrefix, Order::Lexicographic),
        ("ller", Mode::Contains, Order::Score),
        ("an", Mode::Prefix, Order::Score),
        ("zoë s", Mode::Automatic, Order::Lexicographic),
    ] {
        let got = all_pages(&mut client, request("lean", query, mode, order, 50)).await;
        let want = all_pages(&mut client, request("model", query, mode, order, 50)).await;
        assert!(!want.is_empty(), "{query:?} {mode:?}");
        assert_eq!(
            displays(&got),
            displays(&want),
            "{query:?} {mode:?} {order:?}"
        );
    }

    // Removes too: a dictionary Baton last wrote without features gets WORDS, then loses its
    // terms; no posting or vocabulary entry of theirs is left.
    configure(&mut client, "lean2", &[]).await.unwrap();
    add_all(&mut client, "lean2", &refs).await;
    configure(&mut client, "lean2", &[Feature::Words])
        .await
        .unwrap();
    let (d, _) = until_changed(&mut client, "lean2").await;
    assert_eq!(d.features, vec![Feature::Words as i32]);
    remove(&mut client, "lean2", &refs).await;
    let left = key_kinds(&mut conn, baton.prefix(), "lean2").await;
    assert_eq!(left, HashSet::from(["f".to_owned()]), "keys left: {left:?}");
}
