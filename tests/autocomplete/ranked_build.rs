//! RANKED built in the background.

use super::*;

/// Adds and removes random terms of the RANKED build tests to `dictionary` (and `model`) until
/// no change of its features is under way, at least `rounds` times: new terms, scores set and
/// incremented, terms removed, spread over the whole dictionary (before and after a build's
/// cursor); each Add carries a request id and is sent twice. Returns the rounds made while a
/// build of RANKED was under way.
async fn write_until_changed(
    client: &mut Client,
    dictionary: &str,
    model: &mut std::collections::BTreeMap<String, f64>,
    seed: u64,
    rounds: usize,
) -> usize {
    use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut during = 0;
    for round in 0.. {
        let described = client
            .describe(pb::AutocompleteServiceDescribeRequest {
                dictionary: dictionary.to_owned(),
            })
            .await
            .expect("Describe")
            .into_inner();
        match described.change {
            None if round >= rounds => return during,
            Some(c) if c.building == Feature::Ranked as i32 => during += 1,
            _ => {}
        }
        let existing: Vec<String> = model.keys().cloned().collect();
        let mut batch = Vec::new();
        for i in 0..40 {
            let (display, score, increment) = match i % 4 {
                0 | 1 => (
                    ranked_term(&mut rng),
                    f64::from(rng.random_range(-20..60)),
                    false,
                ),
                2 => (
                    existing[rng.random_range(0..existing.len())].clone(),
                    f64::from(rng.random_range(-20..60)),
                    false,
                ),
                _ => (
                    existing[rng.random_range(0..existing.len())].clone(),
                    f64::from(rng.random_range(1..30)),
                    true,
                ),
            };
            let entry = model.entry(display.clone()).or_insert(0.0);
            *entry = if increment { *entry + score } else { score };
            batch.push(pb::AutocompleteTerm {
                display,
                score: Some(score),
                increment,
                payload: None,
            });
        }
        // With a request id, sent twice (a retry): applied once, answered the same.
        let request = pb::AutocompleteServiceAddRequest {
            dictionary: dictionary.to_owned(),
            terms: batch,
            request_id: format!("build-{seed}-{round}"),
        };
        let first = client.add(request.clone()).await.expect("Add").into_inner();
        let again = client.add(request).await.expect("Add again").into_inner();
        assert_eq!(first, again, "a retry answers as the first application");
        let gone: Vec<String> = (0..25)
            .map(|_| existing[rng.random_range(0..existing.len())].clone())
            .collect();
        for g in &gone {
            model.remove(g);
        }
        let gone: Vec<&str> = gone.iter().map(String::as_str).collect();
        remove(client, dictionary, &gone).await;
    }
    unreachable!()
}

/// RANKED (with WORDS and SUBSTRING, built one after the other) added to a dictionary with
/// thousands of terms is built in the background while Adds (new terms, scores set and
/// incremented) and Removes go on all over the dictionary; queries by score are refused, saying
/// so, until it ends. Then every query by score, in every mode, equals the model, and the ranked
/// sets satisfy, key by key, the invariants readers rely on (first-byte, prefix and deep sets,
/// top); no write or build step did more than its work budget.
#[tokio::test]
async fn ranked_added_to_a_dictionary_with_terms_is_built_exactly_under_writes() {
    use baton::autocomplete::{MAX_STEP_WORK, heaviest_build_step, heaviest_step};
    use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
    let (redis, baton, mut client) = setup().await;
    let d = "late-ranked";
    configure(&mut client, d, &[]).await.expect("none");
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(19_195);
    let mut model = std::collections::BTreeMap::new();
    while model.len() < 3500 {
        model.insert(ranked_term(&mut rng), f64::from(rng.random_range(-20..60)));
    }
    let initial: Vec<pb::AutocompleteTerm> = model.iter().map(|(d, s)| scored(d, *s)).collect();
    for chunk in initial.chunks(1000) {
        add(&mut client, d, chunk.to_vec()).await;
    }
    let started = configure(
        &mut client,
        d,
        &[Feature::Ranked, Feature::Words, Feature::Substring],
    )
    .await
    .expect("a change");
    let change = started.change.expect("a change under way");
    assert_eq!(change.building(), Feature::Ranked, "{change:?}");
    assert!(started.features.is_empty(), "nothing new served yet");
    match client
        .complete(request(d, "an", Mode::Prefix, Order::Score, 10))
        .await
    {
        Err(status) => {
            assert_eq!(status.code(), Code::FailedPrecondition);
            assert!(
                status.message().contains("being built")
                    && status.message().contains("AUTOCOMPLETE_FEATURE_RANKED"),
                "{status:?}"
            );
        }
        Ok(_) => {
            let (done, _) = until_changed(&mut client, d).await;
            assert!(done.features.contains(&(Feature::Ranked as i32)));
        }
    }
    // Lexicographic queries are served meanwhile.
    assert_eq!(
        complete(&mut client, d, "ana", Mode::Prefix, Order::Lexicographic, 3)
            .await
            .len(),
        3
    );
    let during = write_until_changed(&mut client, d, &mut model, 7, 10).await;
    assert!(during >= 1, "no write during the build");
    let (done, _) = until_changed(&mut client, d).await;
    assert_eq!(
        done.features().collect::<Vec<_>>(),
        vec![Feature::Ranked, Feature::Words, Feature::Substring]
    );
    assert_eq!(done.term_count, model.len() as u64);
    let mut conn = redis.conn().await;
    let (prefixes, deeps, cut) = check_ranked_sets(&mut conn, baton.prefix(), d, &model).await;
    assert!(
        prefixes >= 4 && deeps >= 2 && cut,
        "{prefixes} prefix sets, {deeps} deep sets, cut back: {cut}"
    );
    check_score_queries(&mut client, d, &model, true).await;
    // More writes on the built sets keep them exact.
    write_until_changed(&mut client, d, &mut model, 8, 3).await;
    check_ranked_sets(&mut conn, baton.prefix(), d, &model).await;
    let (heaviest, build) = (heaviest_step(), heaviest_build_step());
    eprintln!(
        "{during} write rounds during the build; heaviest step {heaviest} units, heaviest build \
         step {build} (at most {MAX_STEP_WORK})"
    );
    assert!(build > 0, "no build step noted");
    assert!(
        heaviest <= MAX_STEP_WORK as u64,
        "a step did {heaviest} units of work, more than {MAX_STEP_WORK}"
    );
}

/// A dictionary of 3,000 scored terms given `RANKED` back after it was dropped, whose build's
/// driving Baton dies midway (its lease taken over by a Baton that never steps, for 1.5 s): its
/// name and terms once the build is seen stalled while that lease lasts. Builds that end before
/// their driver could be stopped are checked and tried again on fresh dictionaries.
async fn ranked_build_with_a_dead_driver(
    redis: &RedisServer,
    baton: &Baton,
    client: &mut Client,
    seed: u64,
) -> (String, std::collections::BTreeMap<String, f64>) {
    use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
    let mut conn = redis.conn().await;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let mut model = std::collections::BTreeMap::new();
    while model.len() < 3000 {
        model.insert(ranked_term(&mut rng), f64::from(rng.random_range(-20..60)));
    }
    let initial: Vec<pb::AutocompleteTerm> = model.iter().map(|(d, s)| scored(d, *s)).collect();
    for attempt in 0..5 {
        let d = format!("again-{seed}-{attempt}");
        for chunk in initial.chunks(1000) {
            add(client, &d, chunk.to_vec()).await;
        }
        assert!(key_kinds(&mut conn, baton.prefix(), &d).await.contains("t"));
        configure(client, &d, &[]).await.expect("drop RANKED");
        until_changed(client, &d).await;
        assert_eq!(
            key_kinds(&mut conn, baton.prefix(), &d).await,
            HashSet::from(["data", "h", "l", "f"].map(str::to_owned)),
            "every ranked set dropped"
        );
        configure(client, &d, &[Feature::Ranked])
            .await
            .expect("RANKED again");
        // The driver dies midway: another id takes its lease, so its next step changes nothing
        // and it stops.
        let lease = format!("{}{{ac:{d}}}:f:lease", baton.prefix());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let killed = loop {
            let n: Option<String> = redis::cmd("HGET")
                .arg(format!("{}{{ac:{d}}}:f", baton.prefix()))
                .arg("n")
                .query_async(&mut conn)
                .await
                .expect("HGET");
            match n.map(|n| n.parse::<usize>().expect("n")) {
                None => break false,
                Some(n) if n > 0 => {
                    let _: () = redis::cmd("SET")
                        .arg(&lease)
                        .arg("a-dead-baton")
                        .arg("PX")
                        .arg(1500)
                        .query_async(&mut conn)
                        .await
                        .expect("SET");
                    break true;
                }
                Some(_) => {}
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the build did not start"
            );
            tokio::task::yield_now().await;
        };
        let first = until_described(client, &d).await;
        if !killed || first.change.is_none() {
            // The build ended first: RANKED is served; try again on a fresh dictionary.
            until_changed(client, &d).await;
            check_ranked_sets(&mut conn, baton.prefix(), &d, &model).await;
            continue;
        }
        let indexed = first.change.as_ref().map(|c| c.indexed).unwrap_or(0);
        assert!(indexed > 0 && (indexed as usize) < model.len(), "{first:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let stalled = until_described(client, &d).await;
        assert_eq!(
            stalled.change.as_ref().map(|c| c.indexed),
            Some(indexed),
            "no step while the dead Baton's lease lasts"
        );
        return (d, model);
    }
    panic!("every build ended before its driver could be stopped");
}

/// RANKED dropped (every ranked set deleted) and added back is built again; a build whose
/// driving Baton dies midway stalls while that lease lasts and is finished by another Baton's
/// Describe, with exact sets and results.
#[tokio::test]
async fn ranked_dropped_then_added_back_and_a_dead_builder_is_taken_over() {
    let (redis, baton, mut client) = setup().await;
    let (d, model) = ranked_build_with_a_dead_driver(&redis, &baton, &mut client, 2024).await;
    let (_other, mut other_client) = other_baton(&redis, &baton).await;
    let (done, _) = until_changed(&mut other_client, &d).await;
    assert_eq!(done.features().collect::<Vec<_>>(), vec![Feature::Ranked]);
    let mut conn = redis.conn().await;
    check_ranked_sets(&mut conn, baton.prefix(), &d, &model).await;
    check_score_queries(&mut client, &d, &model, false).await;
}

/// A build whose driving Baton died is finished by the dictionary's use alone, with no
/// `Describe` or `Configure`: another Baton's `Add`s (and its queries refused while the index
/// is built) find the change under way, and once the dead driver's lease lapses that Baton
/// drives it (at most one look per dictionary every `CHANGE_CHECK`), with exact sets and
/// results, the terms added meanwhile included.
#[tokio::test]
async fn a_build_whose_driver_died_is_finished_by_writes_alone() {
    use baton::autocomplete::{CHANGE_CHECK, CHANGE_LEASE};
    let (redis, baton, mut client) = setup().await;
    let (d, mut model) = ranked_build_with_a_dead_driver(&redis, &baton, &mut client, 2025).await;
    let (_other, mut other_client) = other_baton(&redis, &baton).await;
    let mut conn = redis.conn().await;
    let features = format!("{}{{ac:{d}}}:f", baton.prefix());
    // The dead lease lapses within CHANGE_LEASE, the next look comes within CHANGE_CHECK, and
    // the build of 3,000 terms then takes a few seconds on a busy machine.
    let deadline =
        tokio::time::Instant::now() + CHANGE_LEASE + CHANGE_CHECK + Duration::from_secs(60);
    let mut added = 0u32;
    loop {
        let changing: bool = redis::cmd("HEXISTS")
            .arg(&features)
            .arg("g")
            .query_async(&mut conn)
            .await
            .expect("HEXISTS");
        if !changing {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the build did not go on under writes ({added} Adds)"
        );
        let display = format!("resumed {added:04}");
        add(
            &mut other_client,
            &d,
            vec![scored(&display, f64::from(added))],
        )
        .await;
        model.insert(display, f64::from(added));
        added += 1;
        // A query by score is refused while the index is built, saying so.
        if let Err(status) = other_client
            .complete(request(&d, "res", Mode::Prefix, Order::Score, 10))
            .await
        {
            assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
            assert!(status.message().contains("being built"), "{status:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(added > 0, "the build was still under way after the stall");
    let described = until_described(&mut other_client, &d).await;
    assert!(described.change.is_none(), "{described:?}");
    assert_eq!(
        described.features().collect::<Vec<_>>(),
        vec![Feature::Ranked]
    );
    check_ranked_sets(&mut conn, baton.prefix(), &d, &model).await;
    check_score_queries(&mut client, &d, &model, false).await;
}
