//! Black-box tests of `baton.v1.AutocompleteService` against a real `redis-server`, over gRPC to
//! an in-process Baton bound to port 0. One module per group of promises in docs/autocomplete.md:
//!
//! - [`scenarios`]: whole uses: a guild's member names, recent contacts, automatic mode;
//! - [`modes`]: match modes, scores, payloads;
//! - [`unicode`]: folding and Unicode;
//! - [`pages`]: pages, and writers racing readers;
//! - [`validation`]: bad input and its statuses;
//! - [`writes`]: large batches in bounded steps, retries, request ids, the Cluster;
//! - [`recent`]: recent lists;
//! - [`loading`]: `baton autocomplete load`;
//! - [`typos`]: `FUZZY` mode against a reference model;
//! - [`features`]: the indexes a dictionary keeps, and changes of them;
//! - [`ranked_build`]: `RANKED` built in the background;
//!
//! The helpers below are shared by every module.

#[path = "../support/mod.rs"]
mod support;

mod features;
mod loading;
mod modes;
mod pages;
mod ranked_build;
mod recent;
mod scenarios;
mod typos;
mod unicode;
mod validation;
mod writes;

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
use pb::AutocompleteFeature as Feature;
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

/// Describes `dictionary` until no change of its features is under way (bounded), returning the
/// last answer and how many answers showed a build under way.
async fn until_changed(
    client: &mut Client,
    dictionary: &str,
) -> (pb::AutocompleteServiceDescribeResponse, usize) {
    let mut building = 0;
    // A build of a few thousand terms takes seconds; a loaded machine (one CI run took more than
    // a minute for 4,000 terms' grams) makes it minutes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
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

/// A fuzzy request for `query` (max edits as the query allows).
fn fuzzy(
    dictionary: &str,
    query: &str,
    order: Order,
    limit: u32,
) -> pb::AutocompleteServiceCompleteRequest {
    request(dictionary, query, Mode::Fuzzy, order, limit)
}

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

/// Dictionaries of more than this many terms (or prefixes) have ranked sets.
const HEAVY: usize = baton::autocomplete::HEAVY_PREFIX;

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
