//! Black-box tests of `baton.v1.AutocompleteService` against a real `redis-server`, over gRPC to
//! an in-process Baton bound to port 0.

mod support;

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use baton::proto::v1::{
    self as pb, AutocompleteMatchKind as Kind, AutocompleteMatchMode as Mode,
    AutocompleteOrder as Order, autocomplete_service_client::AutocompleteServiceClient,
};
use support::{Baton, RedisServer, channel, ms, within};
use tokio::task::JoinSet;
use tonic::{Code, Status, transport::Channel};
use tonic_types::StatusExt;

type Client = AutocompleteServiceClient<Channel>;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Time a Redis call may take in these tests' Batons. A step of a write is sized to a few ms of
/// Redis time, but on a machine loaded many times over Redis waits for a core between steps,
/// and a 400 ms timeout failed Adds there; tests about the timeout set their own.
const TEST_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// A Baton over `redis` with [`TEST_COMMAND_TIMEOUT`].
async fn start_baton(redis: &RedisServer) -> Baton {
    Baton::start_with(redis, |c| c.redis.command_timeout = TEST_COMMAND_TIMEOUT).await
}

async fn setup() -> (RedisServer, Baton, Client) {
    let redis = RedisServer::start().await;
    let baton = start_baton(&redis).await;
    let client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    (redis, baton, client)
}

fn term(display: &str) -> pb::AutocompleteTerm {
    pb::AutocompleteTerm {
        display: display.to_owned(),
        ..Default::default()
    }
}

fn scored(display: &str, score: f64) -> pb::AutocompleteTerm {
    pb::AutocompleteTerm {
        display: display.to_owned(),
        score: Some(score),
        ..Default::default()
    }
}

async fn add(
    client: &mut Client,
    dictionary: &str,
    terms: Vec<pb::AutocompleteTerm>,
) -> pb::AutocompleteServiceAddResponse {
    client
        .add(pb::AutocompleteServiceAddRequest {
            dictionary: dictionary.to_owned(),
            terms,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("Add to {dictionary:?} failed: {s:?}"))
        .into_inner()
}

async fn add_all(client: &mut Client, dictionary: &str, displays: &[&str]) {
    for chunk in displays.chunks(1000) {
        add(client, dictionary, chunk.iter().map(|d| term(d)).collect()).await;
    }
}

async fn remove(
    client: &mut Client,
    dictionary: &str,
    displays: &[&str],
) -> pb::AutocompleteServiceRemoveResponse {
    client
        .remove(pb::AutocompleteServiceRemoveRequest {
            dictionary: dictionary.to_owned(),
            displays: displays.iter().map(|d| (*d).to_owned()).collect(),
        })
        .await
        .unwrap_or_else(|s| panic!("Remove from {dictionary:?} failed: {s:?}"))
        .into_inner()
}

async fn count(client: &mut Client, dictionary: &str) -> u64 {
    client
        .describe(pb::AutocompleteServiceDescribeRequest {
            dictionary: dictionary.to_owned(),
        })
        .await
        .expect("Describe")
        .into_inner()
        .term_count
}

fn request(
    dictionary: &str,
    query: &str,
    mode: Mode,
    order: Order,
    limit: u32,
) -> pb::AutocompleteServiceCompleteRequest {
    pb::AutocompleteServiceCompleteRequest {
        dictionary: dictionary.to_owned(),
        query: query.to_owned(),
        limit,
        mode: mode as i32,
        order: order as i32,
        page_token: String::new(),
        max_edits: None,
    }
}

async fn page(
    client: &mut Client,
    request: pb::AutocompleteServiceCompleteRequest,
) -> pb::AutocompleteServiceCompleteResponse {
    client
        .complete(request.clone())
        .await
        .unwrap_or_else(|s| panic!("Complete {request:?} failed: {s:?}"))
        .into_inner()
}

/// The display texts of the first page.
async fn complete(
    client: &mut Client,
    dictionary: &str,
    query: &str,
    mode: Mode,
    order: Order,
    limit: u32,
) -> Vec<String> {
    page(client, request(dictionary, query, mode, order, limit))
        .await
        .suggestions
        .into_iter()
        .map(|s| s.display)
        .collect()
}

/// Every suggestion, following page tokens to the end (bounded).
async fn all_pages(
    client: &mut Client,
    mut request: pb::AutocompleteServiceCompleteRequest,
) -> Vec<pb::AutocompleteSuggestion> {
    let mut all = Vec::new();
    for _ in 0..100_000 {
        let response = page(client, request.clone()).await;
        assert!(response.suggestions.len() <= request.limit.max(1) as usize);
        all.extend(response.suggestions);
        if response.next_page_token.is_empty() {
            return all;
        }
        request.page_token = response.next_page_token;
    }
    panic!("pagination did not end");
}

fn displays(s: &[pb::AutocompleteSuggestion]) -> Vec<String> {
    s.iter().map(|s| s.display.clone()).collect()
}

fn invalid(status: &Status, field: &str) {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with(&format!("{field}: ")),
        "message should start with {field:?}: {}",
        status.message()
    );
    let details = status.get_error_details();
    let bad = details.bad_request().expect("a BadRequest detail");
    assert_eq!(bad.field_violations[0].field, field);
}

/// The byte order Baton sorts lexicographic results in: matching form, then NFC display.
fn lex_key(display: &str) -> (String, String) {
    let text = baton::autocomplete::Text::new(display).expect("not blank");
    (text.key, text.id)
}

// ---------------------------------------------------------------------------------------------
// The seed notes' scenarios
// ---------------------------------------------------------------------------------------------

/// Players join and leave a guild; prefix completion over the member list follows at once.
#[tokio::test]
async fn guild_join_leave_then_prefix_completion() {
    let (_redis, _baton, mut client) = setup().await;
    let guild = "members:guild-7";
    add_all(
        &mut client,
        guild,
        &[
            "jack",
            "jacob",
            "jacqueline",
            "james",
            "jane",
            "Jabba",
            "bob",
        ],
    )
    .await;
    assert_eq!(count(&mut client, guild).await, 7);
    assert_eq!(
        complete(
            &mut client,
            guild,
            "ja",
            Mode::Prefix,
            Order::Lexicographic,
            10
        )
        .await,
        ["Jabba", "jack", "jacob", "jacqueline", "james", "jane"]
    );
    // The default limit is 10, and results stop at the limit.
    assert_eq!(
        complete(
            &mut client,
            guild,
            "jac",
            Mode::Unspecified,
            Order::Unspecified,
            2
        )
        .await,
        ["jack", "jacob"]
    );

    // Leaving: jack and jacob go; an unknown member is ignored.
    let left = remove(&mut client, guild, &["jack", "jacob", "nobody"]).await;
    assert_eq!((left.removed, left.term_count), (2, 5));
    assert_eq!(
        complete(
            &mut client,
            guild,
            "jac",
            Mode::Prefix,
            Order::Lexicographic,
            10
        )
        .await,
        ["jacqueline"]
    );
    // Joining again.
    add_all(&mut client, guild, &["jack"]).await;
    assert_eq!(
        complete(
            &mut client,
            guild,
            "JAC",
            Mode::Prefix,
            Order::Lexicographic,
            10
        )
        .await,
        ["jack", "jacqueline"]
    );
    // Other guilds are separate.
    assert!(
        complete(
            &mut client,
            "members:guild-8",
            "ja",
            Mode::Prefix,
            Order::Lexicographic,
            10
        )
        .await
        .is_empty()
    );
    assert_eq!(count(&mut client, "members:guild-8").await, 0);
}

/// Recent contacts: at most 100 kept, recording again moves to the front, removal works, and
/// completion over the list goes most recent first.
#[tokio::test]
async fn recent_contacts_capped_at_100_with_move_to_front_and_removal() {
    let (redis, baton, mut client) = setup().await;
    let reader = client.clone();
    let list = "recent:user-42";
    let record = |display: String| pb::AutocompleteServiceRecordRecentRequest {
        list: list.to_owned(),
        display,
        ..Default::default()
    };
    let mut last = None;
    for i in 0..105 {
        let r = client
            .record_recent(record(format!("contact {i:03}")))
            .await
            .expect("RecordRecent")
            .into_inner();
        assert_eq!(r.size, (i + 1).min(100));
        assert_eq!(r.evicted, u32::from(i >= 100));
        let at = r.recorded_at.expect("recorded_at");
        if let Some(prev) = last.replace(at) {
            assert!(
                (at.seconds, at.nanos) > (prev.seconds, prev.nanos),
                "recorded_at increases"
            );
        }
    }
    let list_all = |_: &mut Client| {
        let mut client = reader.clone();
        async move {
            let mut items = Vec::new();
            let mut token = String::new();
            loop {
                let r = client
                    .list_recent(pb::AutocompleteServiceListRecentRequest {
                        list: list.to_owned(),
                        limit: 30,
                        page_token: token,
                    })
                    .await
                    .expect("ListRecent")
                    .into_inner();
                items.extend(r.items.into_iter().map(|i| i.display));
                if r.next_page_token.is_empty() {
                    return items;
                }
                token = r.next_page_token;
            }
        }
    };
    let items = list_all(&mut client).await;
    let expected: Vec<String> = (5..105).rev().map(|i| format!("contact {i:03}")).collect();
    assert_eq!(items, expected, "the 100 most recent, newest first");

    // Move to front.
    client
        .record_recent(record("contact 010".into()))
        .await
        .expect("RecordRecent");
    let items = list_all(&mut client).await;
    assert_eq!(items.len(), 100);
    assert_eq!(items[0], "contact 010");
    assert_eq!(items.iter().filter(|d| *d == "contact 010").count(), 1);

    // Removal.
    let removed = client
        .remove_recent(pb::AutocompleteServiceRemoveRecentRequest {
            list: list.to_owned(),
            displays: vec![
                "contact 010".into(),
                "contact 104".into(),
                "stranger".into(),
            ],
        })
        .await
        .expect("RemoveRecent")
        .into_inner();
    assert_eq!((removed.removed, removed.size), (2, 98));
    let items = list_all(&mut client).await;
    assert_eq!(items[0], "contact 103");
    assert!(!items.contains(&"contact 010".to_owned()));

    // Completion over the list, most recent first; a record past the cap evicts the oldest.
    let complete_recent = |query: &str, mode: Mode| pb::AutocompleteServiceCompleteRecentRequest {
        list: list.to_owned(),
        query: query.to_owned(),
        limit: 5,
        mode: mode as i32,
        page_token: String::new(),
    };
    let found = client
        .complete_recent(complete_recent("CONTACT 09", Mode::Prefix))
        .await
        .expect("CompleteRecent")
        .into_inner();
    let names: Vec<_> = found.items.iter().map(|i| i.display.as_str()).collect();
    assert_eq!(
        names,
        [
            "contact 099",
            "contact 098",
            "contact 097",
            "contact 096",
            "contact 095"
        ]
    );
    assert!(!found.next_page_token.is_empty());
    let found = client
        .complete_recent(complete_recent("t 10", Mode::Contains))
        .await
        .expect("CompleteRecent")
        .into_inner();
    let names: Vec<_> = found.items.iter().map(|i| i.display.as_str()).collect();
    assert_eq!(
        names,
        ["contact 103", "contact 102", "contact 101", "contact 100"]
    );
    assert!(found.items.iter().all(|i| i.match_kind() == Kind::Contains));

    // Both keys of the list expire (the default ttl is 90 days).
    let mut conn = redis.conn().await;
    for key in [
        format!("{}{{acr:{list}}}", baton.prefix()),
        format!("{}{{acr:{list}}}:items", baton.prefix()),
    ] {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert!(
            ttl > 89 * 24 * 3600 * 1000,
            "{key} expires in about 90 days: {ttl}"
        );
    }
}

/// Automatic mode: exact matches, then prefix, then word-prefix, then contains, each term once,
/// stopping at the limit, and paging across the groups.
#[tokio::test]
async fn automatic_mode_orders_exact_prefix_word_prefix_contains() {
    let (_redis, _baton, mut client) = setup().await;
    let d = "people";
    add_all(
        &mut client,
        d,
        &[
            "Anna Karenina",
            "anna",
            "Hanna Schmidt",
            "Ann",
            "Joanna Anna",
            "Annabel Lee",
            "Marianne",
            "Zed",
        ],
    )
    .await;
    let all = all_pages(
        &mut client,
        request(d, "ann", Mode::Automatic, Order::Lexicographic, 10),
    )
    .await;
    let got: Vec<(String, Kind)> = all
        .iter()
        .map(|s| (s.display.clone(), s.match_kind()))
        .collect();
    assert_eq!(
        got,
        [
            ("Ann".to_owned(), Kind::Exact),
            ("anna".to_owned(), Kind::Prefix),
            ("Anna Karenina".to_owned(), Kind::Prefix),
            ("Annabel Lee".to_owned(), Kind::Prefix),
            ("Joanna Anna".to_owned(), Kind::WordPrefix),
            ("Hanna Schmidt".to_owned(), Kind::Contains),
            ("Marianne".to_owned(), Kind::Contains),
        ]
    );
    // Stopping at the limit, then going on from where the page stopped, across groups.
    for limit in 1..=7 {
        let paged = all_pages(
            &mut client,
            request(d, "ann", Mode::Automatic, Order::Lexicographic, limit),
        )
        .await;
        assert_eq!(displays(&paged), displays(&all), "limit {limit}");
    }
    let first = complete(
        &mut client,
        d,
        "ann",
        Mode::Automatic,
        Order::Lexicographic,
        3,
    )
    .await;
    assert_eq!(first, ["Ann", "anna", "Anna Karenina"]);
    // Each group by score when asked.
    add(
        &mut client,
        d,
        vec![
            scored("Annabel Lee", 5.0),
            scored("Marianne", 9.0),
            scored("Hanna Schmidt", 1.0),
        ],
    )
    .await;
    let ranked = all_pages(
        &mut client,
        request(d, "ann", Mode::Automatic, Order::Score, 2),
    )
    .await;
    assert_eq!(
        displays(&ranked),
        [
            "Ann",
            "Annabel Lee",
            "anna",
            "Anna Karenina",
            "Joanna Anna",
            "Marianne",
            "Hanna Schmidt"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Modes, scores, payloads
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Unicode
// ---------------------------------------------------------------------------------------------

/// Case folding (full: ß = ss), normalization (composed = decomposed, compatibility forms), in
/// Latin with diacritics, Cyrillic, Greek, CJK and emoji; results keep their display form.
#[tokio::test]
async fn unicode_matching_in_several_scripts() {
    let (_redis, _baton, mut client) = setup().await;
    let reader = client.clone();
    let d = "unicode";
    let decomposed = "Rene\u{301}e Dubois"; // "Renée" with a combining acute accent
    add_all(
        &mut client,
        d,
        &[
            "Straße",
            "Müller",
            decomposed,
            "Zoë Ólafsdóttir",
            "Łódź",
            "Иван Петров",
            "ПЕТЯ",
            "Οδυσσέας Ελύτης",
            "ΣΟΦΙΑ",
            "王伟",
            "张伟明",
            "佐藤太郎",
            "𠮷野家",
            "🎸 Guitar Shop",
            "Rock 🎸",
            "ＡＢＣ Corp",
            "ﬁle",
            "İstanbul Havalimanı",
            "Diyarbakır",
        ],
    )
    .await;
    let c = |q: &str, mode: Mode| {
        let mut client = reader.clone();
        let q = q.to_owned();
        async move { complete(&mut client, d, &q, mode, Order::Lexicographic, 10).await }
    };
    // Full case folding.
    assert_eq!(c("STRASSE", Mode::Prefix).await, ["Straße"]);
    assert_eq!(c("strass", Mode::Prefix).await, ["Straße"]);
    assert_eq!(c("STRAẞE", Mode::Prefix).await, ["Straße"]);
    // Composed query, decomposed term (and back): the display keeps its original form.
    assert_eq!(c("Ren\u{e9}e", Mode::Prefix).await, [decomposed]);
    assert_eq!(c("RENE\u{301}E", Mode::Prefix).await, [decomposed]);
    assert_eq!(c("zoe\u{308}", Mode::Prefix).await, ["Zoë Ólafsdóttir"]);
    assert_eq!(c("ÓLAFS", Mode::WordPrefix).await, ["Zoë Ólafsdóttir"]);
    assert_eq!(c("MÜL", Mode::Prefix).await, ["Müller"]);
    assert_eq!(c("łó", Mode::Prefix).await, ["Łódź"]);
    // No accent folding: "zoe" is not "zoë".
    assert!(c("zoe", Mode::Prefix).await.is_empty());
    // Cyrillic and Greek, with final sigma.
    assert_eq!(c("иван", Mode::Prefix).await, ["Иван Петров"]);
    assert_eq!(c("ПЕТР", Mode::WordPrefix).await, ["Иван Петров"]);
    assert_eq!(c("петя", Mode::Prefix).await, ["ПЕТЯ"]);
    assert_eq!(c("ΟΔΥΣΣΈΑΣ", Mode::Prefix).await, ["Οδυσσέας Ελύτης"]);
    assert_eq!(c("σοφια", Mode::Prefix).await, ["ΣΟΦΙΑ"]);
    assert_eq!(c("ύτης", Mode::Suffix).await, ["Οδυσσέας Ελύτης"]);
    // CJK, including a character outside the Basic Multilingual Plane.
    assert_eq!(c("伟", Mode::Contains).await, ["张伟明", "王伟"]);
    assert_eq!(c("张", Mode::Prefix).await, ["张伟明"]);
    assert_eq!(c("太郎", Mode::Suffix).await, ["佐藤太郎"]);
    assert_eq!(c("𠮷", Mode::Prefix).await, ["𠮷野家"]);
    assert_eq!(c("野", Mode::Contains).await, ["𠮷野家"]);
    // Emoji.
    assert_eq!(c("🎸", Mode::Prefix).await, ["🎸 Guitar Shop"]);
    assert_eq!(c("🎸", Mode::Contains).await, ["Rock 🎸", "🎸 Guitar Shop"]);
    assert_eq!(c("guitar", Mode::WordPrefix).await, ["🎸 Guitar Shop"]);
    // Compatibility forms.
    assert_eq!(c("abc", Mode::Prefix).await, ["ＡＢＣ Corp"]);
    assert_eq!(c("FILE", Mode::Prefix).await, ["ﬁle"]);
    // Turkish dotted capital I: its dot above goes, so plain and capital queries find it (in
    // every mode); the dotless ı stays a letter of its own.
    for q in ["istanbul", "ISTANBUL", "İst", "i\u{307}st"] {
        assert_eq!(c(q, Mode::Prefix).await, ["İstanbul Havalimanı"], "{q}");
    }
    assert_eq!(c("STANB", Mode::Contains).await, ["İstanbul Havalimanı"]);
    assert_eq!(
        c("havalimanı", Mode::WordPrefix).await,
        ["İstanbul Havalimanı"]
    );
    assert!(c("havalimani", Mode::WordPrefix).await.is_empty());
    assert_eq!(c("diyarbakır", Mode::Prefix).await, ["Diyarbakır"]);
    assert!(c("DIYARBAKIR", Mode::Prefix).await.is_empty());
    // Removing by either normalization form of the display.
    let r = remove(&mut client, d, &["Ren\u{e9}e Dubois"]).await;
    assert_eq!(r.removed, 1);
    assert!(c("renee", Mode::Prefix).await.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Pagination and concurrency
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

/// Every bad input fails with INVALID_ARGUMENT naming the field, and changes nothing.
#[tokio::test]
async fn validation_failures_name_the_field_and_change_nothing() {
    let (_redis, _baton, mut client) = setup().await;
    let reader = client.clone();
    let d = "valid";
    add_all(&mut client, d, &["kept"]).await;
    let add_err = |terms: Vec<pb::AutocompleteTerm>, dictionary: &str| {
        let mut client = reader.clone();
        let dictionary = dictionary.to_owned();
        async move {
            client
                .add(pb::AutocompleteServiceAddRequest {
                    dictionary,
                    terms,
                    ..Default::default()
                })
                .await
                .expect_err("Add should fail")
        }
    };
    invalid(&add_err(vec![term("x")], "").await, "dictionary");
    invalid(
        &add_err(vec![term("x")], &"d".repeat(257)).await,
        "dictionary",
    );
    invalid(&add_err(vec![], d).await, "terms");
    invalid(
        &add_err((0..1001).map(|i| term(&i.to_string())).collect(), d).await,
        "terms",
    );
    invalid(
        &add_err(vec![term("ok"), term("")], d).await,
        "terms[1].display",
    );
    invalid(&add_err(vec![term(" \t ")], d).await, "terms[0].display");
    let status = client
        .add(pb::AutocompleteServiceAddRequest {
            dictionary: d.into(),
            terms: vec![term("x")],
            request_id: "r".repeat(129),
        })
        .await
        .expect_err("Add should fail");
    invalid(&status, "request_id");
    invalid(&add_err(vec![term("a\0b")], d).await, "terms[0].display");
    invalid(
        &add_err(vec![term(&"é".repeat(129))], d).await,
        "terms[0].display",
    );
    invalid(
        &add_err(
            vec![
                term("ok"),
                term("ok2"),
                pb::AutocompleteTerm {
                    display: "p".into(),
                    payload: Some(vec![1; 1025]),
                    ..Default::default()
                },
            ],
            d,
        )
        .await,
        "terms[2].payload",
    );
    for bad in [f64::NAN, f64::INFINITY, 1e16, -1e16] {
        invalid(&add_err(vec![scored("s", bad)], d).await, "terms[0].score");
    }
    invalid(
        &add_err(
            vec![pb::AutocompleteTerm {
                display: "s".into(),
                increment: true,
                ..Default::default()
            }],
            d,
        )
        .await,
        "terms[0].score",
    );
    // An increment overflowing the bound, found inside Redis: the whole batch is rejected.
    add(&mut client, d, vec![scored("big", 9e14)]).await;
    let overflow = vec![
        term("new one"),
        pb::AutocompleteTerm {
            display: "big".into(),
            score: Some(9e14),
            increment: true,
            ..Default::default()
        },
    ];
    invalid(&add_err(overflow, d).await, "terms[1].score");
    assert_eq!(
        count(&mut client, d).await,
        2,
        "nothing of the rejected batch was applied"
    );
    assert!(
        complete(
            &mut client,
            d,
            "new",
            Mode::Prefix,
            Order::Lexicographic,
            10
        )
        .await
        .is_empty()
    );

    // Remove.
    let remove_err = |displays: Vec<String>| {
        let mut client = reader.clone();
        async move {
            client
                .remove(pb::AutocompleteServiceRemoveRequest {
                    dictionary: d.into(),
                    displays,
                })
                .await
                .expect_err("Remove should fail")
        }
    };
    invalid(&remove_err(vec![]).await, "displays");
    invalid(
        &remove_err(vec!["kept".into(), String::new()]).await,
        "displays[1]",
    );
    invalid(
        &remove_err((0..1001).map(|i| i.to_string()).collect()).await,
        "displays",
    );
    assert_eq!(count(&mut client, d).await, 2);

    // Complete.
    let complete_err = |req: pb::AutocompleteServiceCompleteRequest| {
        let mut client = reader.clone();
        async move {
            client
                .complete(req)
                .await
                .expect_err("Complete should fail")
        }
    };
    let ok = request(d, "k", Mode::Prefix, Order::Lexicographic, 10);
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            query: String::new(),
            ..ok.clone()
        })
        .await,
        "query",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            query: "   ".into(),
            ..ok.clone()
        })
        .await,
        "query",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            query: "q".repeat(257),
            ..ok.clone()
        })
        .await,
        "query",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            limit: 1001,
            ..ok.clone()
        })
        .await,
        "limit",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            mode: 42,
            ..ok.clone()
        })
        .await,
        "mode",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            order: -1,
            ..ok.clone()
        })
        .await,
        "order",
    );
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            dictionary: String::new(),
            ..ok.clone()
        })
        .await,
        "dictionary",
    );
    for token in ["garbage", "AAAA", "!!", "eyJhIjoxfQ"] {
        invalid(
            &complete_err(pb::AutocompleteServiceCompleteRequest {
                page_token: token.into(),
                ..ok.clone()
            })
            .await,
            "page_token",
        );
    }
    // A real token, tampered with or used for another query.
    add_all(&mut client, d, &["k1", "k2", "k3"]).await;
    let first = page(
        &mut client,
        pb::AutocompleteServiceCompleteRequest {
            limit: 1,
            ..ok.clone()
        },
    )
    .await;
    assert!(!first.next_page_token.is_empty());
    let mut tampered = first.next_page_token.clone().into_bytes();
    let at = tampered.len() / 2;
    tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
    invalid(
        &complete_err(pb::AutocompleteServiceCompleteRequest {
            page_token: String::from_utf8(tampered).unwrap(),
            limit: 1,
            ..ok.clone()
        })
        .await,
        "page_token",
    );
    let other = pb::AutocompleteServiceCompleteRequest {
        query: "k1".into(),
        page_token: first.next_page_token.clone(),
        limit: 1,
        ..ok.clone()
    };
    invalid(&complete_err(other).await, "page_token");
    let other = pb::AutocompleteServiceCompleteRequest {
        order: Order::Score as i32,
        page_token: first.next_page_token.clone(),
        limit: 1,
        ..ok.clone()
    };
    invalid(&complete_err(other).await, "page_token");

    // Recent lists.
    let record_err = |req: pb::AutocompleteServiceRecordRecentRequest| {
        let mut client = reader.clone();
        async move {
            client
                .record_recent(req)
                .await
                .expect_err("RecordRecent should fail")
        }
    };
    let ok = pb::AutocompleteServiceRecordRecentRequest {
        list: "l".into(),
        display: "x".into(),
        ..Default::default()
    };
    invalid(
        &record_err(pb::AutocompleteServiceRecordRecentRequest {
            list: String::new(),
            ..ok.clone()
        })
        .await,
        "list",
    );
    invalid(
        &record_err(pb::AutocompleteServiceRecordRecentRequest {
            display: String::new(),
            ..ok.clone()
        })
        .await,
        "display",
    );
    invalid(
        &record_err(pb::AutocompleteServiceRecordRecentRequest {
            max_items: 1001,
            ..ok.clone()
        })
        .await,
        "max_items",
    );
    invalid(
        &record_err(pb::AutocompleteServiceRecordRecentRequest {
            ttl: Some(ms(10)),
            ..ok.clone()
        })
        .await,
        "ttl",
    );
    invalid(
        &record_err(pb::AutocompleteServiceRecordRecentRequest {
            payload: Some(vec![0; 1025]),
            ..ok.clone()
        })
        .await,
        "payload",
    );
    let list_err = client
        .list_recent(pb::AutocompleteServiceListRecentRequest {
            list: "l".into(),
            limit: 1001,
            page_token: String::new(),
        })
        .await
        .expect_err("ListRecent should fail");
    invalid(&list_err, "limit");
    let list_err = client
        .list_recent(pb::AutocompleteServiceListRecentRequest {
            list: "l".into(),
            limit: 1,
            page_token: "nope".into(),
        })
        .await
        .expect_err("ListRecent should fail");
    invalid(&list_err, "page_token");
    let complete_recent_err = client
        .complete_recent(pb::AutocompleteServiceCompleteRecentRequest {
            list: "l".into(),
            query: String::new(),
            ..Default::default()
        })
        .await
        .expect_err("CompleteRecent should fail");
    invalid(&complete_recent_err, "query");
    let remove_recent_err = client
        .remove_recent(pb::AutocompleteServiceRemoveRecentRequest {
            list: "l".into(),
            displays: vec![],
        })
        .await
        .expect_err("RemoveRecent should fail");
    invalid(&remove_recent_err, "displays");
}

// ---------------------------------------------------------------------------------------------
// Large writes, retries and the Cluster
// ---------------------------------------------------------------------------------------------

/// Display texts of the most work one term can ask of Redis: 256 bytes of words of fresh
/// letters, so that nearly every 2- and 3-letter gram of every word is new (each is a set Baton
/// writes to), the same for the same `seed`.
fn heaviest_displays(n: usize, seed: u64) -> Vec<String> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    (0..n)
        .map(|i| {
            let mut s = format!("{i:04}");
            while s.len() < 256 {
                // Words of 1 to 60 letters; long ones have the most grams.
                let len = 1 + (next() % 60) as usize;
                s.push(' ');
                for _ in 0..len {
                    if s.len() == 256 {
                        break;
                    }
                    s.push(char::from(b'a' + (next() % 26) as u8));
                }
            }
            s.truncate(256);
            s.trim_end().to_owned()
        })
        .collect()
}

/// The durations of the script calls SLOWLOG logged since it was reset (every node), longest
/// first.
async fn slow_scripts(conn: &mut support::RedisConn) -> Vec<Duration> {
    let logs: Vec<Vec<redis::Value>> = conn
        .on_every_node(redis::cmd("SLOWLOG").arg("GET").arg(-1))
        .await;
    let mut durations = Vec::new();
    for entry in logs.into_iter().flatten() {
        let redis::Value::Array(fields) = entry else {
            panic!("a SLOWLOG entry: {entry:?}");
        };
        let micros: u64 = redis::from_redis_value_ref(&fields[2]).expect("a duration");
        let args: Vec<Vec<u8>> = redis::from_redis_value_ref(&fields[3]).expect("arguments");
        let command = String::from_utf8_lossy(&args[0]).to_ascii_lowercase();
        if command == "evalsha" || command == "eval" {
            durations.push(Duration::from_micros(micros));
        }
    }
    durations.sort_unstable_by(|a, b| b.cmp(a));
    durations
}

/// Script calls every node ran since the last `CONFIG RESETSTAT`, and their total duration
/// (`INFO commandstats`).
async fn script_stats(conn: &mut support::RedisConn) -> (u64, Duration) {
    let stats: Vec<String> = conn
        .on_every_node(redis::cmd("INFO").arg("commandstats"))
        .await;
    let (mut calls, mut micros) = (0, 0);
    for line in stats.iter().flat_map(|s| s.lines()) {
        let Some(fields) = line.strip_prefix("cmdstat_evalsha:") else {
            continue;
        };
        let field = |name: &str| -> u64 {
            fields
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                .map_or(0, |n| n.trim().parse().expect("a number"))
        };
        calls += field("calls");
        micros += field("usec");
    }
    (calls, Duration::from_micros(micros))
}

/// A 1000-term Add of the largest terms Baton takes (256 bytes of fresh words each, 1 KiB
/// payloads, score increments) answers OK and counts each increment once, in script calls that
/// each hold Redis a short while: on average less than an eighth of the command timeout, and
/// each less than a quarter of it, but for at most one in a hundred (a busy machine may stall
/// the odd call on its way).
#[tokio::test]
async fn largest_add_runs_in_short_script_calls() {
    // Reads and resets node-wide logs and counters.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let mut conn = redis.conn().await;
    let timeout = baton::config::DEFAULT_REDIS_COMMAND_TIMEOUT;
    // Script calls of more than a tenth of the timeout are logged (logging every call would
    // make a reply too large to read in time).
    let logged = (timeout / 10).as_micros().to_string();
    for (name, value) in [
        ("slowlog-log-slower-than", logged.as_str()),
        ("slowlog-max-len", "10000"),
    ] {
        let _: Vec<()> = conn
            .on_every_node(redis::cmd("CONFIG").arg("SET").arg(name).arg(value))
            .await;
    }
    let displays = heaviest_displays(1000, 12);
    let terms: Vec<pb::AutocompleteTerm> = displays
        .iter()
        .map(|d| pb::AutocompleteTerm {
            display: d.clone(),
            score: Some(1.0),
            increment: true,
            payload: Some(vec![b'p'; 1024]),
        })
        .collect();
    let _: Vec<()> = conn.on_every_node(redis::cmd("SLOWLOG").arg("RESET")).await;
    conn.reset_stats().await;
    let started = std::time::Instant::now();
    let added = within(
        Duration::from_secs(300),
        client.add(pb::AutocompleteServiceAddRequest {
            dictionary: "heavy".into(),
            terms,
            ..Default::default()
        }),
        "the Add",
    )
    .await
    .unwrap_or_else(|s| panic!("the largest Add failed: {s:?}"))
    .into_inner();
    let took = started.elapsed();
    let slow = slow_scripts(&mut conn).await;
    let (calls, total) = script_stats(&mut conn).await;
    let average = total / u32::try_from(calls.max(1)).expect("calls fit");
    eprintln!(
        "1000 largest terms: {took:?} in all; {calls} script calls, {total:?} of Redis time, \
         {average:?} on average; the longest {:?}",
        &slow[..slow.len().min(5)]
    );
    assert_eq!(added.added, 1000);
    assert_eq!(added.term_count, 1000);
    assert!(added.scores.iter().all(|s| *s == 1.0), "{:?}", added.scores);
    let heaviest = baton::autocomplete::heaviest_step();
    assert!(
        heaviest <= baton::autocomplete::MAX_STEP_WORK as u64,
        "a write step did {heaviest} units of work"
    );
    assert!(
        average < timeout / 8,
        "script calls took {average:?} on average, more than {:?}",
        timeout / 8
    );
    let long = slow.iter().filter(|d| **d >= timeout / 4).count();
    assert!(
        long as u64 <= calls / 100,
        "{long} of {calls} script calls held Redis for more than {:?}: {slow:?}",
        timeout / 4
    );
    // Everything is there: each term by its last word, with its score counted once.
    for d in displays.iter().step_by(97) {
        let last = d.rsplit(' ').next().expect("a word");
        let got = all_pages(
            &mut client,
            request("heavy", last, Mode::WordPrefix, Order::Lexicographic, 100),
        )
        .await;
        let hit = got
            .iter()
            .find(|s| &s.display == d)
            .unwrap_or_else(|| panic!("{d:?} is not found by {last:?}"));
        assert_eq!(hit.score, 1.0);
        assert_eq!(hit.payload.len(), 1024);
    }
}

/// No write step does more work than its budget, whatever the batch: the largest ones (1000
/// terms, payloads, increments) into one prefix, across the creation of its ranked and deep sets
/// and the dictionary's, through many cut-backs of the deep set and of `top`, then `Remove`s of
/// nearly every term (dropping those sets) and a change of features. Each write script reports
/// the work it did (members and fields read or written, copies and cut-backs included), which is
/// deterministic; the longest script calls by `SLOWLOG` are printed, and checked only against a
/// margin a busy machine keeps.
#[tokio::test]
async fn write_steps_stay_within_their_work_budget() {
    use baton::autocomplete::{MAX_STEP_WORK, STEP_WORK, heaviest_step};
    // Reads and resets node-wide logs.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let mut conn = redis.conn().await;
    for (name, value) in [
        ("slowlog-log-slower-than", "5000"),
        ("slowlog-max-len", "10000"),
    ] {
        let _: Vec<()> = conn
            .on_every_node(redis::cmd("CONFIG").arg("SET").arg(name).arg(value))
            .await;
    }
    let _: Vec<()> = conn.on_every_node(redis::cmd("SLOWLOG").arg("RESET")).await;
    conn.reset_stats().await;
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    // 9000 terms of one prefix "abc", with fresh words up to 256 bytes, in batches of 1000:
    // the dictionary, "ab" and "abc" pass 256 terms within the first batch, and random scores
    // keep terms joining the deep set of "abc" and top past twice their size.
    let mut displays = Vec::new();
    for batch in 0..9 {
        let terms: Vec<pb::AutocompleteTerm> = (0..1000)
            .map(|i| {
                let mut d = format!("abc{batch}{i:03}");
                let len = if i % 50 == 0 { 256 } else { 40 };
                while d.len() < len {
                    d.push(' ');
                    for _ in 0..(1 + next() % 12) {
                        d.push(char::from(b'a' + (next() % 26) as u8));
                    }
                }
                d.truncate(len);
                let d = d.trim_end().to_owned();
                displays.push(d.clone());
                pb::AutocompleteTerm {
                    display: d,
                    score: Some((next() % 1_000_000) as f64),
                    increment: i % 3 == 0,
                    payload: Some(vec![b'p'; 1024]),
                }
            })
            .collect();
        within(
            Duration::from_secs(120),
            client.add(pb::AutocompleteServiceAddRequest {
                dictionary: "budget".into(),
                terms,
                ..Default::default()
            }),
            "an Add",
        )
        .await
        .unwrap_or_else(|s| panic!("Add failed: {s:?}"));
    }
    assert_eq!(count(&mut client, "budget").await, 9000);
    let mut key_kinds = HashSet::new();
    let keys: Vec<String> = conn
        .on_every_node::<Vec<String>>(redis::cmd("KEYS").arg("*budget*"))
        .await
        .into_iter()
        .flatten()
        .collect();
    for k in &keys {
        key_kinds.extend(
            ["r:ab", "t:abc", ":top", ":b:61"]
                .into_iter()
                .filter(|p| k.ends_with(p)),
        );
    }
    assert_eq!(
        key_kinds.len(),
        4,
        "the ranked sets were not all made: {keys:?}"
    );
    let after_adds = heaviest_step();
    // Nearly every term goes, 1000 at a time: the deep set, the prefix's and the first-byte sets
    // and top are dropped on the way.
    for chunk in displays[..8900].chunks(1000) {
        let chunk: Vec<&str> = chunk.iter().map(String::as_str).collect();
        remove(&mut client, "budget", &chunk).await;
    }
    assert_eq!(count(&mut client, "budget").await, 100);
    configure(&mut client, "budget", &[Feature::Ranked])
        .await
        .expect("Configure");
    until_changed(&mut client, "budget").await;
    let heaviest = heaviest_step();
    let slow = slow_scripts(&mut conn).await;
    let (calls, total) = script_stats(&mut conn).await;
    eprintln!(
        "heaviest write step: {after_adds} units after the Adds, {heaviest} in all (budget \
         {STEP_WORK}, at most {MAX_STEP_WORK}); {calls} script calls, {total:?} of Redis time; \
         the longest {:?}",
        &slow[..slow.len().min(5)]
    );
    // (Steps of every test of this process count: all are bound alike.)
    assert!(
        heaviest <= MAX_STEP_WORK as u64,
        "a write step did {heaviest} units of work, more than {MAX_STEP_WORK}"
    );
    assert!(
        after_adds >= STEP_WORK as u64 / 2,
        "the Adds never came near the budget ({after_adds}): the test lost its point"
    );
    let timeout = baton::config::DEFAULT_REDIS_COMMAND_TIMEOUT;
    let long = slow.iter().filter(|d| **d >= timeout / 4).count();
    assert!(
        long as u64 <= calls / 100,
        "{long} of {calls} script calls held Redis for more than {:?}: {slow:?}",
        timeout / 4
    );
}

/// The `request_id` a failed Add's status names (its `ErrorInfo` detail), if any.
fn request_id_of(status: &Status) -> Option<String> {
    status
        .get_error_details()
        .error_info()
        .and_then(|info| info.metadata.get("request_id").cloned())
}

/// Terms in the batches of [`increments`].
const INCREMENTS: usize = 200;

/// A batch of [`INCREMENTS`] score increments (one per term, each term's text long enough for
/// the batch to take many steps), sent to `dictionary`.
fn increments(dictionary: &str) -> pb::AutocompleteServiceAddRequest {
    pb::AutocompleteServiceAddRequest {
        dictionary: dictionary.into(),
        terms: (0..INCREMENTS)
            .map(|i| pb::AutocompleteTerm {
                display: format!(
                    "counter {i:04}{}",
                    &heaviest_displays(1, i as u64)[0][4..100]
                ),
                score: Some(1.0),
                increment: true,
                payload: None,
            })
            .collect(),
        ..Default::default()
    }
}

/// Sends `batch` again (as a retry) with the request id `status` names, and checks that every
/// increment counted once and that the answer is that of one application.
async fn retry_counts_once(
    client: &mut Client,
    status: &Status,
    batch: &pb::AutocompleteServiceAddRequest,
) {
    let id = request_id_of(status).unwrap_or_else(|| panic!("no request id in {status:?}"));
    assert!(
        status.message().contains(&id),
        "the message names the id: {status:?}"
    );
    let answer = client
        .add(pb::AutocompleteServiceAddRequest {
            request_id: id,
            ..batch.clone()
        })
        .await
        .unwrap_or_else(|s| panic!("the retry failed: {s:?}"))
        .into_inner();
    assert!(
        answer.scores.iter().all(|s| *s == 1.0),
        "increments counted more than once: {:?}",
        &answer.scores[..5]
    );
    assert_eq!(answer.added as usize, INCREMENTS, "as if applied once");
    assert_eq!(answer.updated, 0);
    assert_eq!(answer.term_count as usize, INCREMENTS);
    let all = all_pages(
        client,
        request(
            &batch.dictionary,
            "counter",
            Mode::Prefix,
            Order::Score,
            1000,
        ),
    )
    .await;
    assert_eq!(all.len(), INCREMENTS);
    for s in &all {
        assert_eq!(s.score, 1.0, "{} counted more than once", s.display);
    }
}

/// Sends `batch` through a Baton of its own over `redis` (with `deadline` when set, and then a
/// command timeout longer than it), stops Redis (SIGSTOP) as soon as the batch's first step has
/// written, and returns the call's status once it failed, with Redis running again and the
/// number of terms applied by then (or while Redis resumed).
async fn add_stalled_mid_batch(
    redis: &RedisServer,
    prefix: &str,
    batch: &pb::AutocompleteServiceAddRequest,
    deadline: Option<Duration>,
) -> (Status, u64) {
    let baton = Baton::start_with(redis, |c| {
        c.redis.key_prefix = prefix.to_owned();
        if let Some(d) = deadline {
            c.redis.command_timeout = 2 * d;
        }
    })
    .await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    // Redis knows the scripts (a first call loads them), as it does in service.
    let warm_up = pb::AutocompleteServiceAddRequest {
        dictionary: "warm-up".into(),
        terms: batch.terms[..1].to_vec(),
        ..Default::default()
    };
    client.add(warm_up).await.expect("warm-up Add");

    let mut conn = redis.conn().await;
    let _: Vec<()> = conn
        .on_every_node(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("notify-keyspace-events")
                .arg("Kh"),
        )
        .await;
    let data = baton::autocomplete::DictionaryKeys::new(prefix, &batch.dictionary).data;
    let url = match redis.cluster() {
        Some(cluster) => cluster.node_for_key(&data).await.url(),
        None => redis.url(),
    };
    let mut events = redis::Client::open(url)
        .expect("a client")
        .get_async_pubsub()
        .await
        .expect("a subscriber");
    events
        .subscribe(format!("__keyspace@0__:{data}"))
        .await
        .expect("SUBSCRIBE");
    let mut events = events.into_on_message();
    let mut call = tonic::Request::new(batch.clone());
    if let Some(d) = deadline {
        call.set_timeout(d);
    }
    let mut add = tokio::spawn(async move { client.add(call).await });
    tokio::select! {
        event = within(
            Duration::from_secs(30),
            futures::StreamExt::next(&mut events),
            "the first step's write",
        ) => {
            event.expect("an event");
        }
        done = &mut add => panic!("the Add ended before its first step: {done:?}"),
    }
    redis.signal(nix::sys::signal::Signal::SIGSTOP);
    let failed = within(Duration::from_secs(30), add, "the Add to a stopped Redis")
        .await
        .expect("the Add task");
    redis.signal(nix::sys::signal::Signal::SIGCONT);
    let status = failed.expect_err("Redis stopped before the batch's end");
    let reader = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let dictionary = batch.dictionary.clone();
    let applied = support::wait_until(Duration::from_secs(10), "Redis to answer", || {
        let mut reader = reader.clone();
        let dictionary = dictionary.clone();
        async move { try_count(&mut reader, &dictionary).await }
    })
    .await;
    (status, applied)
}

/// The terms of `dictionary` in Redis, or why they could not be counted.
async fn try_count(client: &mut Client, dictionary: &str) -> Result<u64, Status> {
    client
        .describe(pb::AutocompleteServiceDescribeRequest {
            dictionary: dictionary.into(),
        })
        .await
        .map(|d| d.into_inner().term_count)
}

/// An Add of score increments whose step timed out after it reached Redis (Redis stopped
/// mid-batch, then resumed) answers UNAVAILABLE with its first steps applied, naming the request
/// id Baton made up for it; retried with that id through another Baton, each increment counts
/// once and the answer is that of one application.
#[tokio::test]
async fn increment_stalled_mid_batch_counts_once_when_retried() {
    // Stops Redis and sets keyspace events.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let batch = increments("counters");
    let (status, applied) = add_stalled_mid_batch(&redis, baton.prefix(), &batch, None).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        applied > 0 && (applied as usize) < INCREMENTS,
        "{applied} terms applied: the batch stopped midway"
    );
    retry_counts_once(&mut client, &status, &batch).await;
}

/// An Add still running near its caller's deadline (Redis stopped mid-batch) answers
/// UNAVAILABLE before that deadline, naming the request id Baton made up; retried with the id,
/// the rest is applied, each increment once.
#[tokio::test]
async fn add_near_the_callers_deadline_answers_in_time() {
    // Stops Redis and sets keyspace events.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let batch = increments("deadline");
    // Long enough for the first steps on a busy machine; the Baton's command timeout is longer,
    // so the caller's deadline is what ends the call.
    let deadline = Duration::from_secs(2);
    let (status, applied) =
        add_stalled_mid_batch(&redis, baton.prefix(), &batch, Some(deadline)).await;
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("deadline"),
        "stopped by the deadline: {status:?}"
    );
    assert!(
        applied > 0 && (applied as usize) < INCREMENTS,
        "{applied} terms applied: the batch stopped midway"
    );
    retry_counts_once(&mut client, &status, &batch).await;
}

/// A client's request id makes an Add safe to send again: sent twice, one after the other or at
/// the same time, the batch is applied once and every call answers as one application would;
/// the id is scoped to the dictionary, and sent with another batch it is refused.
#[tokio::test]
async fn request_id_applies_a_batch_once() {
    let (_redis, _baton, mut client) = setup().await;
    let batch = |id: &str, n: u32| pb::AutocompleteServiceAddRequest {
        dictionary: "ids".into(),
        terms: (0..n)
            .map(|i| pb::AutocompleteTerm {
                display: format!("t{}", i % 150),
                score: Some(f64::from(i % 7)),
                increment: i % 3 != 0,
                payload: Some(vec![u8::try_from(i % 256).unwrap()]),
            })
            .collect(),
        request_id: id.into(),
    };
    let once = client.add(batch("r1", 400)).await.unwrap().into_inner();
    assert_eq!(once.added, 150);
    assert_eq!(once.updated, 250);
    let again = client.add(batch("r1", 400)).await.unwrap().into_inner();
    assert_eq!(again, once, "the same answer");
    let scores = |answer: &pb::AutocompleteServiceAddResponse| -> HashMap<String, f64> {
        let mut last = HashMap::new();
        for (i, s) in answer.scores.iter().enumerate() {
            last.insert(format!("t{}", i % 150), *s);
        }
        last
    };
    let expected = scores(&once);
    let check = |got: Vec<pb::AutocompleteSuggestion>| {
        assert_eq!(got.len(), 150);
        for s in got {
            assert_eq!(Some(&s.score), expected.get(&s.display), "{}", s.display);
        }
    };
    check(
        all_pages(
            &mut client,
            request("ids", "t", Mode::Prefix, Order::Lexicographic, 1000),
        )
        .await,
    );

    // At the same time, from three clients: one application.
    let mut calls = JoinSet::new();
    for _ in 0..3 {
        let mut c = client.clone();
        let b = batch("r2", 400);
        calls.spawn(async move { c.add(b).await.map(tonic::Response::into_inner) });
    }
    let mut answers = Vec::new();
    while let Some(done) = within(Duration::from_secs(30), calls.join_next(), "the calls").await {
        answers.push(done.expect("no panic").expect("Add"));
    }
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
    assert_eq!(answers[0].updated, 400, "every term was there");
    let doubled: HashMap<String, f64> = scores(&answers[0]);
    for (display, score) in &expected {
        // Each increment of the second batch counted once on top of the first's scores.
        let set_last = (0..400u32)
            .filter(|i| format!("t{}", i % 150) == *display)
            .any(|i| i % 3 == 0);
        if !set_last {
            assert_eq!(doubled[display], 2.0 * score, "{display}");
        }
    }

    // Another batch under a known id is refused; in another dictionary the id is free.
    let status = client
        .add(batch("r1", 10))
        .await
        .expect_err("r1 belongs to another batch");
    invalid(&status, "request_id");
    let elsewhere = client
        .add(pb::AutocompleteServiceAddRequest {
            dictionary: "other".into(),
            ..batch("r1", 10)
        })
        .await
        .expect("the id is free in another dictionary")
        .into_inner();
    assert_eq!(elsewhere.added, 10);
}

/// A batch with a request id whose steps create ranked sets midway (a prefix passing 256 terms,
/// deep sets, so that steps are refused as too much work and cut where their entries fit), sent
/// at the same time by three callers through two Batons on one Redis, then again: each entry is
/// applied once (increments counted once), every caller gets the same answer, and the ranked
/// sets and every query by score equal the model of the batch applied once.
#[tokio::test]
async fn a_batch_creating_ranked_sets_midway_applies_once_through_two_batons() {
    use rand::{RngExt, SeedableRng, rngs::Xoshiro256PlusPlus};
    let (redis, baton, client) = setup().await;
    let (_other, other_client) = other_baton(&redis, &baton).await;
    let d = "midway";
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(20_261_127);
    let mut model = std::collections::BTreeMap::new();
    // 240 terms under "ab" (its set is created past 256) and 400 others: the dictionary is
    // ranked before the batch.
    while model.len() < 640 {
        let display = if model.len() < 240 {
            format!(
                "ab{} {}",
                ["ca", "ba", "nab"][rng.random_range(0..3)],
                rng.random_range(0..100_000)
            )
        } else {
            ranked_term(&mut rng)
        };
        model.insert(display, f64::from(rng.random_range(-20..60)));
    }
    let initial: Vec<pb::AutocompleteTerm> = model.iter().map(|(t, s)| scored(t, *s)).collect();
    add(&mut client.clone(), d, initial).await;
    let existing: Vec<String> = model.keys().cloned().collect();
    // The batch: new terms under "ab" and elsewhere (scores set), increments of existing terms
    // and of the batch's own, in an order that spreads the new "ab" terms over many steps.
    let mut entries = Vec::new();
    let mut fresh = Vec::new();
    for i in 0..1000 {
        let entry = match i % 4 {
            0 => {
                let t = format!(
                    "ab{} {}",
                    ["cab", "zu", "mo"][rng.random_range(0..3)],
                    100_000 + i
                );
                fresh.push(t.clone());
                scored(&t, f64::from(rng.random_range(-20..60)))
            }
            1 => {
                let t = ranked_term(&mut rng);
                fresh.push(t.clone());
                scored(&t, f64::from(rng.random_range(-20..60)))
            }
            2 => pb::AutocompleteTerm {
                increment: true,
                ..scored(
                    &existing[rng.random_range(0..existing.len())],
                    f64::from(rng.random_range(1..9)),
                )
            },
            _ => pb::AutocompleteTerm {
                increment: true,
                ..scored(
                    &fresh[rng.random_range(0..fresh.len())],
                    f64::from(rng.random_range(1..9)),
                )
            },
        };
        entries.push(entry);
    }
    let request = pb::AutocompleteServiceAddRequest {
        dictionary: d.into(),
        terms: entries.clone(),
        request_id: "midway-1".into(),
    };
    let mut calls = JoinSet::new();
    for mut c in [client.clone(), client.clone(), other_client.clone()] {
        let r = request.clone();
        calls.spawn(async move { c.add(r).await.map(tonic::Response::into_inner) });
    }
    let mut answers = Vec::new();
    while let Some(done) = within(Duration::from_secs(120), calls.join_next(), "the calls").await {
        answers.push(done.expect("no panic").expect("Add"));
    }
    let again = other_client
        .clone()
        .add(request.clone())
        .await
        .expect("the batch again")
        .into_inner();
    answers.push(again);
    assert!(
        answers.iter().all(|a| a == &answers[0]),
        "every caller, the same answer"
    );
    // The model: the batch applied once, entry by entry.
    let mut added = 0;
    for (i, e) in entries.iter().enumerate() {
        let score = e.score.expect("a score");
        let now = match model.get(&e.display) {
            Some(old) if e.increment => old + score,
            None if e.increment => score,
            _ => score,
        };
        if !model.contains_key(&e.display) {
            added += 1;
        }
        model.insert(e.display.clone(), now);
        assert_eq!(answers[0].scores[i], now, "entry {i}: {}", e.display);
    }
    assert_eq!(answers[0].added, added);
    assert_eq!(answers[0].updated, 1000 - added);
    assert_eq!(answers[0].term_count, model.len() as u64);
    let mut conn = redis.conn().await;
    let (prefixes, _, _) = check_ranked_sets(&mut conn, baton.prefix(), d, &model).await;
    assert!(prefixes >= 1, "the batch created a prefix's ranked set");
    check_score_queries(&mut client.clone(), d, &model, true).await;
}

/// On a Redis Cluster, an Add or a Remove made while the dictionary's slot is half migrated
/// (the lex set of its term already moved, the term data not yet) changes nothing and fails
/// UNAVAILABLE; Adds (a batch of many steps with a request id among them) go on while the rest
/// of the slot moves, retried when refused; afterwards every term is indexed, found by prefix,
/// by word and by score, and every increment counted once.
#[tokio::test]
async fn adds_during_a_slot_migration_leave_every_term_indexed() {
    if support::TestTopology::from_env() != support::TestTopology::Cluster {
        eprintln!("skipped: needs BATON_TEST_TOPOLOGY=cluster");
        return;
    }
    // Migrates a slot.
    let redis = RedisServer::start_private().await;
    let baton = start_baton(&redis).await;
    let mut client = AutocompleteServiceClient::new(channel(baton.addr()).await);
    let dict = "moving";
    let base: Vec<String> = (0..600)
        .map(|i| format!("{} base {i:03}", ["north", "south", "east", "west"][i % 4]))
        .collect();
    add_all(
        &mut client,
        dict,
        &base.iter().map(String::as_str).collect::<Vec<_>>(),
    )
    .await;
    let cluster = redis.cluster().expect("a cluster");
    let keys = baton::autocomplete::DictionaryKeys::new(baton.prefix(), dict);
    let slot = support::topology::key_slot(&keys.data);
    let source = cluster.node_for_slot(slot).await;
    let target = cluster
        .masters()
        .await
        .into_iter()
        .find(|m| m.port != source.port)
        .expect("another master");
    let migration = cluster.begin_migration(slot, target.port).await;
    // The lex set of the terms starting with "n" moves ahead of the rest.
    let mut node = cluster.node_client(source.port).await;
    let moved: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(target.port)
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(keys.lex(b'n'))
        .query_async(&mut node)
        .await
        .expect("MIGRATE");
    assert_eq!(moved, "OK");
    let newcomer = |i: u32| scored(&format!("newcomer {i}"), f64::from(i));
    let half = client
        .add(pb::AutocompleteServiceAddRequest {
            dictionary: dict.into(),
            terms: vec![newcomer(0)],
            ..Default::default()
        })
        .await;
    let half_removal = client
        .remove(pb::AutocompleteServiceRemoveRequest {
            dictionary: dict.into(),
            displays: vec!["north base 000".into()],
        })
        .await;
    assert_eq!(count(&mut client, dict).await, 600, "nothing was applied");

    // More Adds while the rest of the slot moves, each retried until it is taken.
    let mut writer = client.clone();
    let movers = pb::AutocompleteServiceAddRequest {
        dictionary: dict.into(),
        terms: (0..300)
            .map(|i| pb::AutocompleteTerm {
                display: format!("mover {i:03} of the many steps"),
                score: Some(1.0),
                increment: true,
                payload: None,
            })
            .collect(),
        request_id: "movers".into(),
    };
    let adds = tokio::spawn(async move {
        loop {
            match writer.add(movers.clone()).await {
                Ok(_) => break,
                Err(s) if s.code() == Code::Unavailable => continue,
                Err(s) => panic!("Add of the movers during the migration: {s:?}"),
            }
        }
        for i in 1..=30 {
            loop {
                let r = writer
                    .add(pb::AutocompleteServiceAddRequest {
                        dictionary: dict.into(),
                        terms: vec![newcomer(i)],
                        ..Default::default()
                    })
                    .await;
                match r {
                    Ok(_) => break,
                    Err(s) if s.code() == Code::Unavailable => continue,
                    Err(s) => panic!("Add of newcomer {i} during the migration: {s:?}"),
                }
            }
        }
    });
    migration.finish().await;
    within(
        Duration::from_secs(60),
        adds,
        "the Adds during the migration",
    )
    .await
    .expect("no Add panicked");
    // The refused calls, retried.
    add(&mut client, dict, vec![newcomer(0)]).await;
    assert_eq!(
        remove(&mut client, dict, &["north base 000"]).await.removed,
        1
    );
    let got = all_pages(
        &mut client,
        request(dict, "north base 00", Mode::Prefix, Order::Score, 7),
    )
    .await;
    assert_eq!(displays(&got), ["north base 004", "north base 008"]);
    let got = all_pages(
        &mut client,
        request(dict, "mover", Mode::Prefix, Order::Score, 50),
    )
    .await;
    assert_eq!(got.len(), 300);
    assert!(
        got.iter().all(|s| s.score == 1.0),
        "an increment counted twice"
    );

    let expected: Vec<String> = (0..=30).map(|i| format!("newcomer {i}")).collect();
    for mode in [Mode::Prefix, Mode::WordPrefix, Mode::Contains] {
        for order in [Order::Lexicographic, Order::Score] {
            let got = all_pages(&mut client, request(dict, "newcomer", mode, order, 7)).await;
            let mut names = displays(&got);
            names.sort_by_key(|d| d.trim_start_matches("newcomer ").parse::<u32>().unwrap());
            assert_eq!(names, expected, "{mode:?} {order:?}");
            for s in &got {
                let i: f64 = s.display.trim_start_matches("newcomer ").parse().unwrap();
                assert_eq!(s.score, i, "{}", s.display);
            }
        }
    }
    assert_eq!(count(&mut client, dict).await, 600 - 1 + 31 + 300);
    let status = half.expect_err("an Add across a half-migrated slot cannot run");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let status = half_removal.expect_err("a Remove across a half-migrated slot cannot run");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
}

// ---------------------------------------------------------------------------------------------
// Recent lists
// ---------------------------------------------------------------------------------------------

/// A recent list's `ttl` present but zero, negative or malformed is refused naming `ttl`, and
/// nothing is recorded; absent, the list lives 90 days.
#[tokio::test]
async fn recent_ttl_present_but_zero_is_refused() {
    let (redis, baton, mut client) = setup().await;
    let record = |ttl: Option<prost_types::Duration>| pb::AutocompleteServiceRecordRecentRequest {
        list: "l".into(),
        display: "x".into(),
        ttl,
        ..Default::default()
    };
    let bad = [
        ms(0),
        prost_types::Duration {
            seconds: -1,
            nanos: 0,
        },
        prost_types::Duration {
            seconds: 0,
            nanos: -5,
        },
        prost_types::Duration {
            seconds: 1,
            nanos: 1_000_000_000,
        },
    ];
    for ttl in bad {
        let status = client
            .record_recent(record(Some(ttl)))
            .await
            .expect_err(&format!("ttl {ttl:?} should be refused"));
        invalid(&status, "ttl");
    }
    let listed = client
        .list_recent(pb::AutocompleteServiceListRecentRequest {
            list: "l".into(),
            ..Default::default()
        })
        .await
        .expect("ListRecent")
        .into_inner();
    assert!(
        listed.items.is_empty(),
        "a refused call recorded {listed:?}"
    );
    let key = baton::autocomplete::RecentKeys::new(baton.prefix(), "l").order;
    let mut conn = redis.conn().await;
    client
        .record_recent(record(None))
        .await
        .expect("RecordRecent");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    let ninety_days = 90 * 24 * 3600 * 1000;
    assert!(
        pttl > ninety_days - 60_000 && pttl <= ninety_days,
        "absent ttl: {pttl} ms"
    );
    client
        .record_recent(record(Some(ms(5000))))
        .await
        .expect("RecordRecent");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > 0 && pttl <= 5000, "5 s ttl: {pttl} ms");
}

// ---------------------------------------------------------------------------------------------
// Bulk loading from a file
// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Fuzzy mode
// ---------------------------------------------------------------------------------------------

/// A fuzzy request for `query` (max edits as the query allows).
fn fuzzy(
    dictionary: &str,
    query: &str,
    order: Order,
    limit: u32,
) -> pb::AutocompleteServiceCompleteRequest {
    request(dictionary, query, Mode::Fuzzy, order, limit)
}

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
/// in byte order never reached it. In lexicographic order the walk keeps to byte order.
#[tokio::test]
async fn fuzzy_by_score_looks_under_the_querys_first_character_first() {
    let (_redis, _baton, mut client) = setup().await;
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
    let r = page(
        &mut client,
        fuzzy("spread", "zerba crosing", Order::Score, 10),
    )
    .await;
    assert!(
        r.incomplete,
        "the walk of distance 2 fit in the budget: {r:?}"
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

// ---------------------------------------------------------------------------------------------
// Features: the indexes a dictionary keeps
// ---------------------------------------------------------------------------------------------

use pb::AutocompleteFeature as Feature;

/// Declares `features` for `dictionary`.
async fn configure(
    client: &mut Client,
    dictionary: &str,
    features: &[Feature],
) -> Result<pb::AutocompleteServiceConfigureResponse, Status> {
    client
        .configure(pb::AutocompleteServiceConfigureRequest {
            dictionary: dictionary.to_owned(),
            features: features.iter().map(|f| *f as i32).collect(),
        })
        .await
        .map(tonic::Response::into_inner)
}

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

/// The kinds of key (`l`, `b`, `w`, `vg`, `data`, ...) dictionary `name` has in Redis.
async fn key_kinds(conn: &mut support::RedisConn, prefix: &str, name: &str) -> HashSet<String> {
    let base = format!("{prefix}{{ac:{name}}}:");
    conn.keys(&format!("{base}*"))
        .await
        .iter()
        .map(|k| {
            let rest = &k[base.len()..];
            rest.split(':').next().unwrap_or(rest).to_owned()
        })
        .collect()
}

/// The model's answer to a query over `terms` (display, score): every match in result order.
/// Terms are lowercase ASCII words (their matching form is their lowercase) split by one space.
fn mode_model(terms: &[(String, f64)], query: &str, mode: Mode, order: Order) -> Vec<String> {
    let word_starts = |k: &str| -> Vec<usize> {
        std::iter::once(0)
            .chain(k.match_indices(' ').map(|(i, _)| i + 1))
            .collect()
    };
    // (group, term) for each match; the group orders automatic mode.
    let mut matches: Vec<(u8, &(String, f64))> = Vec::new();
    for t in terms {
        let k = t.0.to_lowercase();
        let word = word_starts(&k)
            .into_iter()
            .any(|i| k[i..].starts_with(query));
        let later_word = word_starts(&k)
            .into_iter()
            .any(|i| i > 0 && k[i..].starts_with(query));
        let group = match mode {
            Mode::Prefix => k.starts_with(query).then_some(0),
            Mode::WordPrefix => word.then_some(0),
            Mode::Suffix => k.ends_with(query).then_some(0),
            Mode::Contains => k.contains(query).then_some(0),
            Mode::Automatic => {
                if k == query {
                    Some(1)
                } else if k.starts_with(query) {
                    Some(2)
                } else if later_word {
                    Some(3)
                } else if k.contains(query) {
                    Some(4)
                } else {
                    None
                }
            }
            _ => unreachable!("not modelled"),
        };
        if let Some(g) = group {
            matches.push((g, t));
        }
    }
    matches.sort_by(|a, b| {
        let lex = lex_key(&a.1.0).cmp(&lex_key(&b.1.0));
        a.0.cmp(&b.0).then(match order {
            Order::Score => b.1.1.total_cmp(&a.1.1).then(lex),
            _ => lex,
        })
    });
    matches.into_iter().map(|(_, t)| t.0.clone()).collect()
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

/// Describes `dictionary` until no change of its features is under way (bounded), returning the
/// last answer and how many answers showed a build under way.
async fn until_changed(
    client: &mut Client,
    dictionary: &str,
) -> (pb::AutocompleteServiceDescribeResponse, usize) {
    let mut building = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let d = client
            .describe(pb::AutocompleteServiceDescribeRequest {
                dictionary: dictionary.to_owned(),
            })
            .await
            .expect("Describe")
            .into_inner();
        match &d.change {
            None => return (d, building),
            Some(c) => building += usize::from(c.building != Feature::Unspecified as i32),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the change of {dictionary:?} did not end: {d:?}"
        );
        // Waiting on a background job whose steps publish nothing: a short pause between polls.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    assert!(
        full[0] > 100,
        "a step with every feature declared {full:?} keys"
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

// ---------------------------------------------------------------------------------------------
// RANKED built in the background
// ---------------------------------------------------------------------------------------------

/// The 8 bytes that rank a score in a ranked set: they sort, byte by byte, by descending score.
fn rank_bytes(score: f64) -> [u8; 8] {
    let score = if score == 0.0 { 0.0 } else { score };
    let mut b = score.to_bits().to_be_bytes();
    if score >= 0.0 {
        b[0] ^= 0x7F;
        for x in &mut b[1..] {
            *x ^= 0xFF;
        }
    }
    b
}

/// What the ranked sets of dictionary `name` hold, checked against its terms (display → score)
/// with the invariants readers rely on: once `h` has `""` (the dictionary passed 256 terms, as it
/// must have when it has more), every first-byte set `b:XX` holds exactly the terms of its byte
/// and `top` exactly the terms ranked at or before its last member; every `r:P` in `h` exactly
/// the terms starting with `P`; every deep set `t:P` exactly those ranked at or before its bound;
/// no ranked set exists that `h` does not list. Returns how many `r:` and `t:` sets there are and
/// whether some deep set was cut back (its bound is a member).
async fn check_ranked_sets(
    conn: &mut support::RedisConn,
    prefix: &str,
    name: &str,
    terms: &std::collections::BTreeMap<String, f64>,
) -> (usize, usize, bool) {
    let base = format!("{prefix}{{ac:{name}}}:");
    // (matching form, ranked member) of every term.
    let all: Vec<(String, Vec<u8>)> = terms
        .iter()
        .map(|(display, score)| {
            let (key, id) = lex_key(display);
            let mut member = rank_bytes(*score).to_vec();
            member.extend_from_slice(key.as_bytes());
            member.push(0);
            member.extend_from_slice(id.as_bytes());
            (key, member)
        })
        .collect();
    let expect = |pred: &dyn Fn(&str, &[u8]) -> bool| -> Vec<Vec<u8>> {
        let mut v: Vec<Vec<u8>> = all
            .iter()
            .filter(|(k, m)| pred(k, m))
            .map(|(_, m)| m.clone())
            .collect();
        v.sort();
        v
    };
    let h: HashMap<String, Vec<u8>> = redis::cmd("HGETALL")
        .arg(format!("{base}h"))
        .query_async(conn)
        .await
        .expect("HGETALL");
    let ranked = h.contains_key("");
    assert_eq!(
        ranked,
        terms.len() > HEAVY,
        "{name}: ranked with {} terms",
        terms.len()
    );
    let (mut prefixes, mut deeps, mut cut) = (0, 0, false);
    for (field, value) in &h {
        if let Some(hex) = field.strip_prefix("b:") {
            let b = u8::from_str_radix(hex, 16).expect("hex");
            assert!(ranked, "{name}: {field} while not ranked");
            let want = expect(&|k, _| k.as_bytes()[0] == b);
            assert_eq!(
                ranked_members(conn, &base, field).await,
                want,
                "{name}: {field}"
            );
        } else if let Some(p) = field.strip_prefix("r:") {
            prefixes += 1;
            let want = expect(&|k, _| k.starts_with(p));
            assert_eq!(
                ranked_members(conn, &base, field).await,
                want,
                "{name}: {field}"
            );
        } else if let Some(p) = field.strip_prefix("t:") {
            deeps += 1;
            let bound = value.clone();
            let want = if bound == b"\xff" {
                expect(&|k, _| k.starts_with(p))
            } else {
                cut = true;
                expect(&|k, m| k.starts_with(p) && m <= bound.as_slice())
            };
            assert_eq!(
                ranked_members(conn, &base, field).await,
                want,
                "{name}: {field}"
            );
        }
    }
    if ranked {
        let firsts: HashSet<u8> = all.iter().map(|(k, _)| k.as_bytes()[0]).collect();
        for b in firsts {
            assert!(h.contains_key(&format!("b:{b:02x}")), "{name}: b:{b:02x}");
        }
        let top = ranked_members(conn, &base, "top").await;
        let last = top.last().expect("a top set").clone();
        assert_eq!(top, expect(&|_, m| m <= last.as_slice()), "{name}: top");
    }
    for key in conn.keys(&format!("{base}*")).await {
        let rest = &key[base.len()..];
        if ["b:", "r:", "t:"].iter().any(|k| rest.starts_with(k)) {
            assert!(
                h.contains_key(rest),
                "{name}: {rest} exists, not listed in h"
            );
        }
        if rest == "top" {
            assert!(ranked, "{name}: top while not ranked");
        }
    }
    (prefixes, deeps, cut)
}

/// The members of sorted set `<base><set>`, in order.
async fn ranked_members(conn: &mut support::RedisConn, base: &str, set: &str) -> Vec<Vec<u8>> {
    redis::cmd("ZRANGE")
        .arg(format!("{base}{set}"))
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .expect("ZRANGE")
}

/// Dictionaries of more than this many terms (or prefixes) have ranked sets.
const HEAVY: usize = baton::autocomplete::HEAVY_PREFIX;

/// A seeded random term for the RANKED build tests: lowercase words, many sharing the first 1, 2
/// and 3 characters ("a", "an", "ana"; "ж", "жа"), so that the build creates first-byte, prefix
/// and deep sets (of one-byte and two-byte characters), and cuts deep sets back.
fn ranked_term(rng: &mut rand::rngs::Xoshiro256PlusPlus) -> String {
    use rand::RngExt;
    let syllables = ["ab", "ba", "ca", "bac", "nab", "cab", "zu", "mo"];
    let first = match rng.random_range(0..20) {
        0..6 => "ana",
        6..9 => "anb",
        9..10 => ["anc", "anz"][rng.random_range(0..2)],
        10..13 => "ab",
        13..14 => ["am", "az"][rng.random_range(0..2)],
        14..18 => ["жа", "жа", "жа", "жу", "王"][rng.random_range(0..5)],
        _ => ["b", "c", "m", "z", "9"][rng.random_range(0..5)],
    };
    let mut words = vec![format!(
        "{first}{}",
        syllables[rng.random_range(0..syllables.len())]
    )];
    for _ in 0..rng.random_range(0..3) {
        words.push(syllables[rng.random_range(0..syllables.len())].to_owned());
    }
    words.push(rng.random_range(0..100_000u32).to_string());
    words.join(" ")
}

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

/// Every query by score of dictionary `name` (prefixes of 1 to 5 characters, and every mode that
/// uses scores when it has WORDS and SUBSTRING), every page followed, equals the model's answer.
async fn check_score_queries(
    client: &mut Client,
    name: &str,
    model: &std::collections::BTreeMap<String, f64>,
    every_mode: bool,
) {
    let terms: Vec<(String, f64)> = model.iter().map(|(d, s)| (d.clone(), *s)).collect();
    let mut queries: Vec<(String, Mode)> = [
        "a", "an", "ana", "anab", "anaba", "b", "9", "anz", "ж", "жа", "жаb", "王",
    ]
    .iter()
    .map(|q| (q.to_string(), Mode::Prefix))
    .collect();
    for t in terms.iter().step_by(terms.len() / 3 + 1) {
        for n in 1..=5 {
            let q: String =
                t.0.chars()
                    .take(n)
                    .collect::<String>()
                    .trim_end()
                    .to_owned();
            queries.push((q, Mode::Prefix));
        }
    }
    if every_mode {
        for (q, mode) in [
            ("ba", Mode::WordPrefix),
            ("cab", Mode::WordPrefix),
            ("nab", Mode::Contains),
            ("aba", Mode::Contains),
            ("7", Mode::Suffix),
            ("37", Mode::Suffix),
            ("ana", Mode::Automatic),
            ("ba", Mode::Automatic),
        ] {
            queries.push((q.to_owned(), mode));
        }
    }
    let mut results = 0;
    for (q, mode) in queries {
        let want = mode_model(&terms, &q, mode, Order::Score);
        let got = all_pages(client, request(name, &q, mode, Order::Score, 97)).await;
        assert_eq!(displays(&got), want, "{name}: {q:?} {mode:?} by score");
        results += want.len();
    }
    assert!(results > 2000, "{results} results compared");
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

/// Another Baton on the same Redis and key prefix as `baton`, and an autocomplete client of it.
async fn other_baton(redis: &RedisServer, baton: &Baton) -> (Baton, Client) {
    let prefix = baton.prefix().to_owned();
    let other = Baton::start_with(redis, |c| {
        c.redis.command_timeout = TEST_COMMAND_TIMEOUT;
        c.redis.key_prefix = prefix;
    })
    .await;
    let client = AutocompleteServiceClient::new(channel(other.addr()).await);
    (other, client)
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

/// Describes `dictionary` once.
async fn until_described(
    client: &mut Client,
    dictionary: &str,
) -> pb::AutocompleteServiceDescribeResponse {
    client
        .describe(pb::AutocompleteServiceDescribeRequest {
            dictionary: dictionary.to_owned(),
        })
        .await
        .expect("Describe")
        .into_inner()
}
