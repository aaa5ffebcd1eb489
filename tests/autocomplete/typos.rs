//! Fuzzy mode.

use super::*;

/// The optimal string alignment distance from the closest prefix of `term` to `query`
/// (characters), by the full table: the reference the service is checked against.
fn prefix_distance(term: &[char], query: &[char]) -> usize {
    let (m, n) = (term.len(), query.len());
    let mut d = vec![vec![0usize; n + 1]; m + 1];
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    let mut best = d[0][n];
    for i in 1..=m {
        d[i][0] = i;
        for j in 1..=n {
            let cost = usize::from(term[i - 1] != query[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && term[i - 1] == query[j - 2] && term[i - 2] == query[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
        best = best.min(d[i][n]);
    }
    best
}

/// The edits a fuzzy query of `chars` characters allows, as documented: none below 3
/// characters, 1 from 3, 2 from 7.
fn allowed_edits(chars: usize) -> usize {
    match chars {
        0..=2 => 0,
        3..=6 => 1,
        _ => 2,
    }
}

/// A reference term: display, matching form, score.
struct ModelTerm {
    display: String,
    key: (String, String),
    score: f64,
}

/// The model's answer to a fuzzy query: every match, (distance, term index), in result order.
fn fuzzy_model(
    terms: &[ModelTerm],
    query: &str,
    edits: usize,
    order: Order,
) -> Vec<(usize, usize)> {
    let q: Vec<char> = baton::autocomplete::text::query_form(query)
        .chars()
        .collect();
    let mut found: Vec<(usize, usize)> = terms
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let d = prefix_distance(&t.key.0.chars().collect::<Vec<_>>(), &q);
            (d <= edits).then_some((d, i))
        })
        .collect();
    found.sort_by(|a, b| {
        a.0.cmp(&b.0).then_with(|| {
            let (x, y) = (&terms[a.1], &terms[b.1]);
            let by_score = if order == Order::Score {
                y.score.total_cmp(&x.score)
            } else {
                std::cmp::Ordering::Equal
            };
            by_score.then_with(|| x.key.cmp(&y.key))
        })
    });
    found
}

/// Adds the model's `terms` (display and score) to `dictionary`, `chunk` to an `Add`.
async fn add_model_terms(client: &mut Client, dictionary: &str, terms: &[ModelTerm], chunk: usize) {
    for part in terms.chunks(chunk) {
        add(
            client,
            dictionary,
            part.iter().map(|t| scored(&t.display, t.score)).collect(),
        )
        .await;
    }
}

/// A fuzzy page's results as (distance, display).
fn distances_and_displays(r: &pb::AutocompleteServiceCompleteResponse) -> Vec<(usize, &str)> {
    r.suggestions
        .iter()
        .map(|s| (s.edit_distance as usize, s.display.as_str()))
        .collect()
}

/// The first `limit` of the model's answer `model` as (distance, display).
fn model_page<'t>(
    terms: &'t [ModelTerm],
    model: &[(usize, usize)],
    limit: usize,
) -> Vec<(usize, &'t str)> {
    model
        .iter()
        .take(limit)
        .map(|&(d, i)| (d, terms[i].display.as_str()))
        .collect()
}

/// Typos find terms: a substitution, a deletion, an insertion, and a transposition (which
/// Levenshtein distance counts as 2); exact prefixes come first, and short queries allow none.
#[tokio::test]
async fn fuzzy_finds_typos_and_ranks_exact_prefixes_first() {
    let (_redis, _baton, mut client) = setup().await;
    add(
        &mut client,
        "people",
        vec![
            scored("John Smith", 5.0),
            scored("Jonathan", 9.0),
            scored("Smith", 1.0),
            scored("İstanbul", 3.0),
            scored("Straße", 2.0),
        ],
    )
    .await;
    let ask = |query: &str, order| fuzzy("people", query, order, 10);
    let got = |r: pb::AutocompleteServiceCompleteResponse| {
        r.suggestions
            .into_iter()
            .map(|s| (s.match_kind(), s.display, s.edit_distance))
            .map(|(k, d, e)| (d, e, k))
            .collect::<Vec<_>>()
    };
    // Transposition: one edit.
    let r = page(&mut client, ask("jhon", Order::Lexicographic)).await;
    assert!(!r.incomplete && r.next_page_token.is_empty());
    assert_eq!(
        got(r),
        [
            ("John Smith".to_owned(), 1, Kind::Fuzzy),
            ("Jonathan".to_owned(), 1, Kind::Fuzzy)
        ]
    );
    assert_eq!(
        got(page(&mut client, ask("smtih", Order::Lexicographic)).await),
        [("Smith".to_owned(), 1, Kind::Fuzzy)]
    );
    // The proto's examples: a substitution is one edit; "sitt" is two from every prefix of
    // "smith" ("smit": a substitution and another), more than 4 characters allow.
    assert_eq!(
        got(page(&mut client, ask("smyth", Order::Lexicographic)).await),
        [("Smith".to_owned(), 1, Kind::Fuzzy)]
    );
    assert_eq!(
        got(page(&mut client, ask("sitt", Order::Lexicographic)).await),
        []
    );
    // Exact prefix first, then the typos, each group in the requested order.
    assert_eq!(
        got(page(&mut client, ask("john", Order::Score)).await),
        [
            ("John Smith".to_owned(), 0, Kind::Prefix),
            ("Jonathan".to_owned(), 1, Kind::Fuzzy)
        ]
    );
    assert_eq!(
        got(page(&mut client, ask("smith", Order::Lexicographic)).await),
        [("Smith".to_owned(), 0, Kind::Exact)]
    );
    // Folding applies to both sides: "strase" is one deletion from "strasse" (Straße folded),
    // and "istnbul" one from "i̇stanbul"'s folded form with its dot dropped.
    assert_eq!(
        got(page(&mut client, ask("STRSSE", Order::Lexicographic)).await),
        [("Straße".to_owned(), 1, Kind::Fuzzy)]
    );
    assert_eq!(
        got(page(&mut client, ask("istnbul", Order::Lexicographic)).await),
        [("İstanbul".to_owned(), 1, Kind::Fuzzy)]
    );
    // Two edits from 7 characters: "jonhtan" (transposition + deletion of "a").
    assert_eq!(
        got(page(&mut client, ask("jonhtan", Order::Lexicographic)).await),
        [("Jonathan".to_owned(), 2, Kind::Fuzzy)]
    );
    // max_edits lowers the distance; 2 characters allow no edit.
    let mut one = ask("jonhtan", Order::Lexicographic);
    one.max_edits = Some(1);
    assert!(page(&mut client, one).await.suggestions.is_empty());
    assert!(
        page(&mut client, ask("jx", Order::Lexicographic))
            .await
            .suggestions
            .is_empty()
    );
    assert_eq!(
        got(page(&mut client, ask("jo", Order::Lexicographic)).await).len(),
        2,
        "exact prefixes only"
    );
    // A missing dictionary has no match.
    assert!(
        page(&mut client, fuzzy("none", "jhon", Order::Score, 10))
            .await
            .suggestions
            .is_empty()
    );
}

/// Seeded random terms and random typos against the reference model (optimal string alignment
/// over prefixes of the folded terms): every result at its true distance, in order, and, when
/// the budget was not hit, exactly the model's page.
#[tokio::test]
async fn fuzzy_agrees_with_the_reference_model() {
    use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
    let (_redis, _baton, mut client) = setup().await;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(19);
    // A small alphabet, so that typos meet other terms, with letters that fold (É, ß → ss, K →
    // the Kelvin sign folds to k) and multi-byte characters.
    let alphabet: Vec<char> = "abcdeéèknoßAÉK王".chars().collect();
    let mut terms: Vec<ModelTerm> = Vec::new();
    let mut seen = HashSet::new();
    while terms.len() < 300 {
        let len = rng.random_range(1..10);
        let display: String = (0..len)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect();
        let key = lex_key(&display);
        if seen.insert(key.1.clone()) {
            terms.push(ModelTerm {
                display,
                key,
                score: f64::from(rng.random_range(0..20u32)),
            });
        }
    }
    add_model_terms(&mut client, "fz", &terms, 100).await;
    let lower: Vec<char> = "abcdeéknos王".chars().collect();
    let (mut compared, mut matched) = (0, 0);
    for round in 0..300 {
        // A prefix of a term with up to 2 random edits, or now and then random letters.
        let mut q: Vec<char> = if round % 10 == 9 {
            (0..rng.random_range(1..9))
                .map(|_| lower[rng.random_range(0..lower.len())])
                .collect()
        } else {
            let t: Vec<char> = terms[rng.random_range(0..terms.len())]
                .key
                .0
                .chars()
                .collect();
            t[..rng.random_range(1..=t.len())].to_vec()
        };
        for _ in 0..rng.random_range(0..3) {
            let c = lower[rng.random_range(0..lower.len())];
            let i = rng.random_range(0..q.len());
            match rng.random_range(0..4) {
                0 => q[i] = c,
                1 => q.insert(i, c),
                2 if q.len() > 1 => {
                    q.remove(i);
                }
                _ if i + 1 < q.len() => q.swap(i, i + 1),
                _ => q.push(c),
            }
        }
        let query: String = q.iter().collect();
        let edits = allowed_edits(
            baton::autocomplete::text::query_form(&query)
                .chars()
                .count(),
        );
        for order in [Order::Lexicographic, Order::Score] {
            let model = fuzzy_model(&terms, &query, edits, order);
            let limit = if round % 2 == 0 { 1000 } else { 7 };
            let r = page(&mut client, fuzzy("fz", &query, order, limit)).await;
            assert!(r.next_page_token.is_empty());
            let got = distances_and_displays(&r);
            let want = model_page(&terms, &model, limit as usize);
            if r.incomplete {
                // Every result at its true distance, in order.
                let index: HashMap<&str, usize> = model
                    .iter()
                    .map(|&(_, i)| (terms[i].display.as_str(), i))
                    .collect();
                let mut last: Option<usize> = None;
                for &(d, display) in &got {
                    let at = model
                        .iter()
                        .position(|&(md, i)| md == d && i == index[display])
                        .unwrap_or_else(|| {
                            panic!("{display:?} is not at distance {d} of {query:?}")
                        });
                    assert!(
                        last.is_none_or(|l| l < at),
                        "{query:?}: out of order: {got:?}"
                    );
                    last = Some(at);
                }
            } else {
                assert_eq!(
                    got, want,
                    "query {query:?} ({edits} edits), {order:?}, limit {limit}"
                );
                compared += 1;
            }
            matched += usize::from(!got.is_empty());
            for s in &r.suggestions {
                let kind = s.match_kind();
                let expect = match s.edit_distance {
                    0 if lex_key(&s.display).0 == baton::autocomplete::text::query_form(&query) => {
                        Kind::Exact
                    }
                    0 => Kind::Prefix,
                    _ => Kind::Fuzzy,
                };
                assert_eq!(kind, expect, "{query:?}: {s:?}");
            }
        }
    }
    // The test means something: most queries were compared whole, and found terms.
    assert!(
        compared >= 550,
        "only {compared} of 600 answers were complete"
    );
    assert!(matched >= 300, "only {matched} of 600 answers had a match");
}

/// One typo in a dictionary whose first two characters take every value: the walk looks up only
/// the children that can stay within the query's edits once none is left, so a query of 3 to 6
/// characters is answered whole, in either order, within the budget (looking up every child of
/// every node within one edit of the query costs more than 1,300 reads here, past the budget).
#[tokio::test]
async fn fuzzy_answers_one_typo_whole_in_a_dense_dictionary() {
    use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
    let (_redis, _baton, mut client) = setup().await;
    // No index but the lex sets: fuzzy mode needs nothing else, and the load stays quick.
    configure(&mut client, "dense", &[]).await.unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1919);
    let letters: Vec<char> = ('a'..='z').collect();
    let mut terms: Vec<ModelTerm> = Vec::new();
    let mut seen = HashSet::new();
    while terms.len() < 12_000 {
        let display: String = (0..rng.random_range(6..11))
            .map(|_| letters[rng.random_range(0..26)])
            .collect();
        if seen.insert(display.clone()) {
            terms.push(ModelTerm {
                key: lex_key(&display),
                display,
                score: f64::from(rng.random_range(0..1000u32)),
            });
        }
    }
    add_model_terms(&mut client, "dense", &terms, 1000).await;
    for round in 0..40 {
        // A prefix of 4 to 6 letters of a term, with one edit, keeping 3 to 6 letters.
        let t: Vec<char> = terms[rng.random_range(0..terms.len())]
            .display
            .chars()
            .collect();
        let mut q = t[..rng.random_range(4..=6)].to_vec();
        let (i, c) = (
            rng.random_range(0..q.len() - 1),
            letters[rng.random_range(0..26)],
        );
        match round % 4 {
            0 => q[i] = c,
            1 if q.len() < 6 => q.insert(i, c),
            2 => {
                q.remove(i);
            }
            _ => q.swap(i, i + 1),
        }
        let query: String = q.iter().collect();
        assert_eq!(allowed_edits(q.len()), 1);
        for order in [Order::Lexicographic, Order::Score] {
            let r = page(&mut client, fuzzy("dense", &query, order, 10)).await;
            assert!(
                !r.incomplete,
                "{query:?} ({order:?}) ran out of budget on one typo"
            );
            let got = distances_and_displays(&r);
            let want = model_page(&terms, &fuzzy_model(&terms, &query, 1, order), 10);
            assert_eq!(got, want, "{query:?}, {order:?}");
        }
    }
}

/// The work budget: a typo's range too large to rank whole by score says `incomplete`, with
/// results still at their true distance, in a dictionary without ranked sets; in lexicographic
/// order the first page is complete.
#[tokio::test]
async fn fuzzy_says_when_the_budget_cut_it_short() {
    let (_redis, _baton, mut client) = setup().await;
    configure(&mut client, "big", &[]).await.unwrap();
    // "abq" is one edit from every "ab..." term: 9,000 of them, more than a call may read.
    let all: Vec<String> = (0..9000).map(|i| format!("ab{i:05}")).collect();
    for chunk in all.chunks(1000) {
        add(
            &mut client,
            "big",
            chunk
                .iter()
                .map(|d| scored(d, f64::from(d[2..].parse::<u32>().unwrap() % 97)))
                .collect(),
        )
        .await;
    }
    let r = page(&mut client, fuzzy("big", "abq", Order::Score, 10)).await;
    assert!(
        r.incomplete,
        "9,000 candidates ranked whole within the budget?"
    );
    assert_eq!(r.suggestions.len(), 10);
    for s in &r.suggestions {
        assert_eq!((s.edit_distance, s.match_kind()), (1, Kind::Fuzzy), "{s:?}");
    }
    let r = page(&mut client, fuzzy("big", "abq", Order::Lexicographic, 10)).await;
    assert!(!r.incomplete);
    assert_eq!(displays(&r.suggestions), all[..10].to_vec());
    // Exact prefix matches in lexicographic order are read as far as the page goes.
    let r = page(&mut client, fuzzy("big", "ab0", Order::Lexicographic, 1000)).await;
    assert!(!r.incomplete);
    assert_eq!(displays(&r.suggestions), all[..1000].to_vec());
}

/// By score, a walk the budget cuts short has looked at the terms sharing the query's first
/// character first: a two-typo match under the last first character of the dictionary is found
/// although the walk of the 625 two-letter prefixes before it runs out of budget, where a walk
/// in byte order never reached it. In lexicographic order the walk keeps to byte order. The walk
/// runs in script calls of bounded reads.
#[tokio::test]
async fn fuzzy_by_score_looks_under_the_querys_first_character_first() {
    use baton::autocomplete::{FUZZY_CALLS, FUZZY_STEP_CALLS};
    // Reads node-wide counters: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    configure(&mut client, "spread", &[]).await.unwrap();
    let letters = || (b'a'..=b'y').map(char::from);
    let mut terms: Vec<pb::AutocompleteTerm> = letters()
        .flat_map(|x| letters().map(move |y| scored(&format!("{x}{y} filler"), 1.0)))
        .collect();
    terms.push(scored("Zebra Crossing", 5.0));
    for chunk in terms.chunks(500) {
        add(&mut client, "spread", chunk.to_vec()).await;
    }
    // "zerba crosing": a transposition and a deletion from "zebra crossing".
    let mut conn = redis.conn().await;
    conn.reset_stats().await;
    let r = page(
        &mut client,
        fuzzy("spread", "zerba crosing", Order::Score, 10),
    )
    .await;
    assert!(
        r.incomplete,
        "the walk of distance 2 fit in the budget: {r:?}"
    );
    // The walk ran in script calls of at most FUZZY_STEP_CALLS reads, FUZZY_CALLS in all.
    let (steps, reads) = (
        conn.command_calls("evalsha").await,
        conn.command_calls("zrange").await + conn.command_calls("zlexcount").await,
    );
    assert!(
        steps >= (FUZZY_CALLS / FUZZY_STEP_CALLS) as u64 && reads <= FUZZY_CALLS as u64,
        "{steps} script calls made {reads} reads"
    );
    assert_eq!(displays(&r.suggestions), ["Zebra Crossing"]);
    assert_eq!(
        (
            r.suggestions[0].edit_distance,
            r.suggestions[0].match_kind()
        ),
        (2, Kind::Fuzzy)
    );
    let r = page(
        &mut client,
        fuzzy("spread", "zerba crosing", Order::Lexicographic, 10),
    )
    .await;
    assert!(r.incomplete);
    assert!(r.suggestions.is_empty(), "{r:?}");
}

/// By score, a dictionary with ranked sets answers fuzzy queries whose groups are far larger
/// than the budget whole: a range all within the walk's distance is read best first from the
/// ranked sets (its terms that come closer skipped one by one), not read whole and ranked. The
/// answers equal the reference model, pages of 10 and of 300, where a dictionary without ranked
/// sets runs out of budget on the same queries.
#[tokio::test]
async fn fuzzy_by_score_reads_large_groups_best_first_from_ranked_sets() {
    use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
    let (_redis, _baton, mut client) = setup().await;
    configure(&mut client, "flat", &[]).await.unwrap();
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(1999);
    // 4,000 terms under "ab" and 600 under "xb" from a small alphabet, so that prefixes of 1 to
    // 4 characters hold hundreds of terms each, with scores in a narrow range (many ties).
    let mut terms: Vec<ModelTerm> = Vec::new();
    let mut seen = HashSet::new();
    while terms.len() < 4600 {
        let head = if terms.len() < 4000 { "ab" } else { "xb" };
        let tail: String = (0..rng.random_range(1..7))
            .map(|_| ['a', 'b', 'c', 'd', 'e'][rng.random_range(0..5)])
            .collect();
        let display = format!("{head}{tail}");
        if seen.insert(display.clone()) {
            terms.push(ModelTerm {
                key: lex_key(&display),
                display,
                score: f64::from(rng.random_range(0..50u32)),
            });
        }
    }
    for dictionary in ["ranked", "flat"] {
        add_model_terms(&mut client, dictionary, &terms, 1000).await;
    }
    let (mut flat_incomplete, mut compared) = (0, 0);
    for query in [
        "abq", "abc", "abcd", "abx", "acb", "bac", "xbc", "zbcd", "abced", "abdca", "aabc",
        "abcdeab", "abcdde", "xbcda",
    ] {
        let edits = allowed_edits(query.chars().count());
        let model = fuzzy_model(&terms, query, edits, Order::Score);
        for limit in [10, 300] {
            let r = page(&mut client, fuzzy("ranked", query, Order::Score, limit)).await;
            let got = distances_and_displays(&r);
            let want = model_page(&terms, &model, limit as usize);
            if r.incomplete {
                // Two edits over hundreds of nodes may still pass the budget: every result is
                // then at its true distance, in the model's order.
                assert_eq!(
                    edits, 2,
                    "{query:?}, limit {limit}: one edit ran out of budget"
                );
                let mut at = 0;
                for g in &got {
                    at += model[at..]
                        .iter()
                        .position(|&(d, i)| (d, terms[i].display.as_str()) == *g)
                        .unwrap_or_else(|| panic!("{query:?}: {g:?} out of order or wrong"))
                        + 1;
                }
            } else {
                assert_eq!(got, want, "{query:?} ({edits} edits), limit {limit}");
                compared += usize::from(!want.is_empty());
            }
            let flat = page(&mut client, fuzzy("flat", query, Order::Score, limit)).await;
            flat_incomplete += usize::from(flat.incomplete && !r.incomplete);
        }
    }
    eprintln!(
        "{compared} complete answers; {flat_incomplete} of them out of budget without ranked sets"
    );
    assert!(compared >= 20, "only {compared} answers were complete");
    // The same queries need more than the budget without ranked sets: the test means something.
    assert!(
        flat_incomplete >= 6,
        "only {flat_incomplete} flat answers ran out"
    );
}

/// Bad fuzzy requests fail INVALID_ARGUMENT naming the field, and fuzzy is for dictionaries.
#[tokio::test]
async fn fuzzy_validation_names_the_field() {
    let (_redis, _baton, mut client) = setup().await;
    add_all(&mut client, "v", &["alpha"]).await;
    let ok = fuzzy("v", "alpah", Order::Lexicographic, 10);
    assert_eq!(page(&mut client, ok.clone()).await.suggestions.len(), 1);
    let cases = [
        (
            pb::AutocompleteServiceCompleteRequest {
                max_edits: Some(3),
                ..ok.clone()
            },
            "max_edits",
        ),
        (
            pb::AutocompleteServiceCompleteRequest {
                max_edits: Some(1),
                mode: Mode::Prefix as i32,
                ..ok.clone()
            },
            "max_edits",
        ),
        (
            pb::AutocompleteServiceCompleteRequest {
                query: "a".repeat(33),
                ..ok.clone()
            },
            "query",
        ),
        // 17 characters that fold to 34 ("ß" → "ss").
        (
            pb::AutocompleteServiceCompleteRequest {
                query: "ß".repeat(17),
                ..ok.clone()
            },
            "query",
        ),
        (
            pb::AutocompleteServiceCompleteRequest {
                limit: 1001,
                ..ok.clone()
            },
            "limit",
        ),
        (
            pb::AutocompleteServiceCompleteRequest {
                page_token: "AAAA".into(),
                ..ok.clone()
            },
            "page_token",
        ),
    ];
    for (req, field) in cases {
        let status = client.complete(req.clone()).await.expect_err("should fail");
        invalid(&status, field);
    }
    // 32 characters are allowed.
    page(
        &mut client,
        pb::AutocompleteServiceCompleteRequest {
            query: "a".repeat(32),
            ..ok.clone()
        },
    )
    .await;
    let status = client
        .complete_recent(pb::AutocompleteServiceCompleteRecentRequest {
            list: "l".into(),
            query: "alpha".into(),
            mode: Mode::Fuzzy as i32,
            ..Default::default()
        })
        .await
        .expect_err("fuzzy recent");
    invalid(&status, "mode");
}

/// Fuzzy walks made in several steps while a writer adds and removes other terms: every answer
/// holds each term once, at its true distance, each distance in the requested order; a complete
/// answer holds every match among the terms nobody touched (pages of more than a step's entries
/// included); terms written meanwhile may be found or not, as with pages.
#[tokio::test]
async fn fuzzy_walks_in_steps_under_writes_stay_consistent() {
    use baton::autocomplete::FUZZY_STEP_ENTRIES;
    use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
    let (_redis, baton, mut client) = setup().await;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(20);
    let alphabet: Vec<char> = "abcdeknoséß".chars().collect();
    let mut all: Vec<ModelTerm> = Vec::new();
    let mut seen = HashSet::new();
    while all.len() < 3000 {
        // Half the terms start with "abc", so that a page of "abc" or of a typo of it takes
        // more entries than a step reads.
        let head = if all.len().is_multiple_of(2) {
            "abc"
        } else {
            ""
        };
        let display: String = head
            .chars()
            .chain(
                (0..rng.random_range(1..9)).map(|_| alphabet[rng.random_range(0..alphabet.len())]),
            )
            .collect();
        let key = lex_key(&display);
        if seen.insert(key.1.clone()) {
            all.push(ModelTerm {
                display,
                key,
                score: f64::from(rng.random_range(0..50u32)),
            });
        }
    }
    // The first 2,500 stay; the writer adds and removes the other 500 all along.
    let (stable, churn) = all.split_at(2500);
    add_model_terms(&mut client, "busy", stable, 500).await;
    let by_display: HashMap<&str, &ModelTerm> =
        all.iter().map(|t| (t.display.as_str(), t)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
        let churn: Vec<(String, f64)> =
            churn.iter().map(|t| (t.display.clone(), t.score)).collect();
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let mut rounds = 0u32;
            while !stop.load(Ordering::Relaxed) {
                for part in churn.chunks(50) {
                    add(
                        &mut client,
                        "busy",
                        part.iter().map(|(d, s)| scored(d, *s)).collect(),
                    )
                    .await;
                    let displays: Vec<&str> = part.iter().map(|(d, _)| d.as_str()).collect();
                    remove(&mut client, "busy", &displays).await;
                }
                rounds += 1;
            }
            rounds
        })
    };
    let (mut complete, mut long) = (0, 0);
    for round in 0..80 {
        let query: String = match round % 4 {
            0 => "abc".to_owned(),
            1 => ["abd", "acb", "bc", "abcd"][rng.random_range(0..4)].to_owned(),
            _ => {
                let t: Vec<char> = stable[rng.random_range(0..stable.len())]
                    .key
                    .0
                    .chars()
                    .collect();
                let mut q = t[..rng.random_range(3.min(t.len())..=t.len())].to_vec();
                let i = rng.random_range(0..q.len());
                q[i] = alphabet[rng.random_range(0..alphabet.len())];
                q.into_iter().collect()
            }
        };
        let qc: Vec<char> = baton::autocomplete::text::query_form(&query)
            .chars()
            .collect();
        let edits = allowed_edits(qc.len());
        let order = if round % 8 < 4 {
            Order::Lexicographic
        } else {
            Order::Score
        };
        let limit = 1000;
        let r = page(&mut client, fuzzy("busy", &query, order, limit)).await;
        // Where a term sorts in the answer: distance, then the order's key.
        let rank = |d: usize, t: &ModelTerm| match order {
            Order::Score => (d, -t.score, t.key.clone()),
            _ => (d, 0.0, t.key.clone()),
        };
        let mut shown = HashSet::new();
        let mut last = None;
        for s in &r.suggestions {
            assert!(
                shown.insert(s.display.as_str()),
                "{:?} twice for {query:?}",
                s.display
            );
            let term = by_display[s.display.as_str()];
            let d = prefix_distance(&term.key.0.chars().collect::<Vec<_>>(), &qc);
            assert_eq!(s.edit_distance as usize, d, "{:?} for {query:?}", s.display);
            assert!(d <= edits);
            let at = rank(d, term);
            if let Some(before) = &last {
                assert!(before < &at, "{:?} out of order for {query:?}", s.display);
            }
            last = Some(at);
        }
        if !r.incomplete {
            // Every untouched match that sorts before the page's end is in it (all of them
            // when the page is not full).
            complete += 1;
            let full = r.suggestions.len() == limit as usize;
            for t in stable {
                let d = prefix_distance(&t.key.0.chars().collect::<Vec<_>>(), &qc);
                if d <= edits && (!full || Some(rank(d, t)) < last) {
                    assert!(
                        shown.contains(t.display.as_str()),
                        "{:?} missing for {query:?}",
                        t.display
                    );
                }
            }
            if r.suggestions.len() > FUZZY_STEP_ENTRIES {
                long += 1; // more than one step's reads could hold
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = within(Duration::from_secs(60), writer, "the writer")
        .await
        .expect("the writer");
    assert!(rounds > 0, "the writer never finished a round");

    assert!(complete >= 40, "only {complete} of 80 answers complete");
    assert!(
        long >= 5,
        "only {long} complete answers of more than one step's entries"
    );
}

/// By score, a best-first read larger than a step goes on in the next step from where it
/// stopped. Here the terms starting with "abcde" rank below 1,200 others starting with "abc":
/// the read from the ranked sets passes all of those before it finds the page: more than a
/// step's budget, and more than the one longer call that read again from the start could read
/// (the code before ran out of budget on the first query). The answers, exact prefixes and one
/// typo away, are whole and equal the reference model.
#[tokio::test]
async fn fuzzy_best_first_reads_go_on_across_steps() {
    use baton::autocomplete::{FUZZY_CALLS, FUZZY_STEP_CALLS};
    // Reads node-wide counters: on a Cluster, one of this test's own.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let mut terms: Vec<ModelTerm> = Vec::new();
    let mut push = |display: String, score: u32| {
        terms.push(ModelTerm {
            key: lex_key(&display),
            display,
            score: f64::from(score),
        });
    };
    // 1,200 terms under "abc" ranked above the 300 under "abcde".
    for i in 0..1200u32 {
        push(format!("abc{:04} high", i), 100 + i % 400);
    }
    for i in 0..300u32 {
        push(format!("abcde {:03} low", i), i % 50);
    }
    add_model_terms(&mut client, "deep", &terms, 500).await;
    let mut conn = redis.conn().await;
    for (query, limit) in [("abcde", 10), ("abcde", 40), ("abdce", 10), ("abcdf", 10)] {
        conn.reset_stats().await;
        let r = page(&mut client, fuzzy("deep", query, Order::Score, limit)).await;
        let (steps, reads) = (
            conn.command_calls("evalsha").await,
            conn.command_calls("zrange").await + conn.command_calls("zlexcount").await,
        );
        let edits = allowed_edits(query.chars().count());
        let model = fuzzy_model(&terms, query, edits, Order::Score);
        assert!(
            !r.incomplete,
            "{query:?}, limit {limit}: ran out of budget in {steps} steps"
        );
        assert_eq!(
            distances_and_displays(&r),
            model_page(&terms, &model, limit as usize),
            "{query:?}, limit {limit}"
        );
        // Reading past 1,200 better terms takes several steps, as a step's best-first read
        // gets at most FUZZY_STEP_CALLS entries, within the call's budget of reads.
        assert!(
            steps > (1200 / FUZZY_STEP_CALLS) as u64 && reads <= FUZZY_CALLS as u64,
            "{query:?}: {steps} script calls made {reads} reads"
        );
    }
}
