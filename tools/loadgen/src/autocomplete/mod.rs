//! Autocomplete: loading a seeded dictionary through `Add`, then completing from it with
//! concurrent closed-loop clients, through Baton and directly on the same Redis and data.
//!
//! Query kinds ([`Case`]): prefixes of 1 to 5 characters of random terms (lexicographic, by score,
//! automatic mode), word prefixes of 2 to 4 characters of a term's second word, substrings of 3 to
//! 5 characters from anywhere in a term (lexicographic, by score), and prefixes of 3 to 9
//! characters with one typo (two from 7 characters) in fuzzy mode (lexicographic, by score). For
//! prefixes the same queries also run directly: the script Baton runs (`prefix.lua`, `ranked.lua`,
//! through `baton::autocomplete::scripts`) and raw `ZRANGE [p (p\xff BYLEX LIMIT 0 10` on the lex
//! set Baton reads, the floor Baton builds on (without the display texts, scores and payloads
//! Baton also fetches); and the gRPC health check gives the cost of a gRPC call alone.

pub mod baseline;
pub mod terms;

use std::{
    collections::BTreeMap,
    sync::{Arc, OnceLock},
    time::Duration,
};

use baton::{
    autocomplete::{DictionaryKeys, scripts, text::query_form},
    proto::v1::{
        self as pb, AutocompleteMatchMode as M, AutocompleteOrder as O,
        autocomplete_service_client::AutocompleteServiceClient,
    },
};
use hdrhistogram::Histogram;
use redis::{Script, Value, aio::MultiplexedConnection};
use testkit::within;
use tokio::{sync::Barrier, task::JoinSet, time::Instant};
use tonic::transport::Channel;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::{
    BATON_PREFIX, Options, Scenario, Stage, Transport, names,
    probe::{self, Probe},
    record::Record,
    stats::{self, histogram, micros},
};
use terms::{GeneratedTerm, Rng, generate};

/// The dictionary's name.
const DICTIONARY: &str = "names";
/// Terms per `Add` call.
const BATCH: usize = 1000;
/// Concurrent `Add` calls while loading.
const LOADERS: usize = 4;
/// The seed of the terms and the queries.
pub const SEED: u64 = 42;
/// Suggestions per request.
const LIMIT: u32 = 10;
/// Queries drawn per kind (each client walks them in turn).
const QUERIES: usize = 20_000;

/// What is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// Prefixes of 1 to 5 characters, lexicographic.
    PrefixLex,
    /// The same, by score.
    PrefixScore,
    /// The same prefixes in automatic mode.
    Automatic,
    /// Word prefixes of 2 to 4 characters.
    Word,
    /// Substrings of 3 to 5 characters, lexicographic.
    ContainsLex,
    /// The same, by score.
    ContainsScore,
    /// Prefixes of 3 to 9 characters with one typo (two from 7 characters), fuzzy mode,
    /// lexicographic.
    FuzzyLex,
    /// The same, by score.
    FuzzyScore,
    /// The gRPC health check (no Redis).
    Health,
}

impl Case {
    /// Every case, in the order they run.
    pub const ALL: [Case; 9] = [
        Case::PrefixLex,
        Case::Health,
        Case::PrefixScore,
        Case::Automatic,
        Case::Word,
        Case::ContainsLex,
        Case::ContainsScore,
        Case::FuzzyLex,
        Case::FuzzyScore,
    ];

    /// Its name in the records.
    pub fn name(self) -> &'static str {
        match self {
            Case::PrefixLex => "prefix-lex",
            Case::PrefixScore => "prefix-score",
            Case::Automatic => "automatic",
            Case::Word => "word-prefix",
            Case::ContainsLex => "contains-lex",
            Case::ContainsScore => "contains-score",
            Case::FuzzyLex => "fuzzy-lex",
            Case::FuzzyScore => "fuzzy-score",
            Case::Health => "health",
        }
    }

    /// The features of the dictionary its queries need.
    pub fn features(self) -> &'static [pb::AutocompleteFeature] {
        use pb::AutocompleteFeature as F;
        match self {
            Case::PrefixLex | Case::FuzzyLex | Case::FuzzyScore | Case::Health => &[],
            Case::PrefixScore => &[F::Ranked],
            Case::Word => &[F::Words],
            Case::ContainsLex => &[F::Words, F::Substring],
            Case::Automatic | Case::ContainsScore => &[F::Ranked, F::Words, F::Substring],
        }
    }

    fn mode_order(self) -> (M, O) {
        match self {
            Case::PrefixLex => (M::Prefix, O::Lexicographic),
            Case::PrefixScore => (M::Prefix, O::Score),
            Case::Automatic => (M::Automatic, O::Lexicographic),
            Case::Word => (M::WordPrefix, O::Lexicographic),
            Case::ContainsLex => (M::Contains, O::Lexicographic),
            Case::ContainsScore => (M::Contains, O::Score),
            Case::FuzzyLex => (M::Fuzzy, O::Lexicographic),
            Case::FuzzyScore => (M::Fuzzy, O::Score),
            Case::Health => (M::Unspecified, O::Unspecified),
        }
    }
}

/// The seeded queries of each kind.
struct Queries {
    prefixes: Arc<Vec<String>>,
    words: Arc<Vec<String>>,
    substrings: Arc<Vec<String>>,
    typos: Arc<Vec<String>>,
}

impl Queries {
    fn new(terms: &[GeneratedTerm]) -> Self {
        let mut rng = Rng(SEED ^ 0x5eed);
        let prefixes = (0..QUERIES)
            .map(|_| {
                let t = &terms[rng.below(terms.len())].display;
                let n = 1 + rng.below(5);
                t.chars().take(n).collect()
            })
            .collect();
        let substrings = (0..QUERIES)
            .map(|_| {
                let chars: Vec<char> = terms[rng.below(terms.len())].display.chars().collect();
                let n = (3 + rng.below(3)).min(chars.len());
                let start = rng.below(chars.len() - n + 1);
                chars[start..start + n].iter().collect()
            })
            .collect();
        let words = (0..QUERIES)
            .map(|_| {
                let t = &terms[rng.below(terms.len())].display;
                let word = t.split(' ').nth(1).unwrap_or(t);
                word.chars().take(2 + rng.below(3)).collect()
            })
            .collect();
        // A prefix of 3 to 9 characters with one typo, two from 7 characters (each a
        // substitution, an insertion, a deletion or a transposition of adjacent characters).
        let typos = (0..QUERIES)
            .map(|_| {
                let t = &terms[rng.below(terms.len())].display;
                let mut q: Vec<char> = t.chars().take(3 + rng.below(7)).collect();
                let edits = if q.len() >= 7 { 2 } else { 1 };
                for _ in 0..edits {
                    let i = rng.below(q.len());
                    let c = char::from(b'a' + rng.below(26) as u8);
                    match rng.below(4) {
                        0 => q[i] = c,
                        1 => q.insert(i, c),
                        2 if q.len() > 3 => {
                            q.remove(i);
                        }
                        _ if i + 1 < q.len() => q.swap(i, i + 1),
                        _ => q[i] = c,
                    }
                }
                // Leading whitespace is not part of a query; keep it from starting one.
                q.iter().collect::<String>().trim_start().to_owned()
            })
            .filter(|q| !q.is_empty())
            .collect();
        Self {
            typos: Arc::new(typos),
            prefixes: Arc::new(prefixes),
            words: Arc::new(words),
            substrings: Arc::new(substrings),
        }
    }

    fn of(&self, case: Case) -> Arc<Vec<String>> {
        match case {
            Case::Word => Arc::clone(&self.words),
            Case::ContainsLex | Case::ContainsScore => Arc::clone(&self.substrings),
            Case::FuzzyLex | Case::FuzzyScore => Arc::clone(&self.typos),
            _ => Arc::clone(&self.prefixes),
        }
    }
}

/// Loads the dictionary on `stage` and measures every case, appending the records.
pub async fn run(options: &Options, stage: &Stage, records: &mut Vec<Record>) {
    let mut probe = Probe::new(stage.redis.client().await, Some(stage.baton.pid()));
    let clients = options.autocomplete_clients.max(1);
    let channels = stage.channels(Transport::Tcp, clients).await;

    let terms = Arc::new(generate(options.terms, SEED));
    // The floor, on the same Redis: the lex members alone in one sorted set, by raw ZADDs.
    let bare = baseline::bare_sorted_set(&probe.admin, &terms, "bench:bare").await;
    eprintln!(
        "autocomplete: bare sorted set of {} terms by ZADD in {:.1} s, {:.0} B/term",
        terms.len(),
        bare.took,
        bare.bytes as f64 / terms.len().max(1) as f64
    );
    records.push(baseline_record("zadd", terms.len(), &bare));
    // Other layouts of the same lex members, to weigh what a more compact index would save.
    for layout in baseline::layouts(&probe.admin, &terms).await {
        eprintln!(
            "autocomplete: lex members as {}: {} keys ({} listpack), {:.0} B/term",
            layout.name,
            layout.keys,
            layout.listpack,
            layout.loaded.bytes as f64 / terms.len().max(1) as f64
        );
        let mut r = baseline_record(layout.name, terms.len(), &layout.loaded);
        r.case = "layout".to_owned();
        r.set(names::KEYS, layout.keys as f64);
        r.set(names::LISTPACK_KEYS, layout.listpack as f64);
        records.push(r);
    }
    // The query kinds measured: every one, or those the options name, on a dictionary declared
    // with only the features they need.
    let cases: Vec<Case> = Case::ALL
        .into_iter()
        .filter(|c| {
            options.autocomplete_cases.is_empty()
                || options.autocomplete_cases.iter().any(|n| n == c.name())
        })
        .collect();
    let focused = !options.autocomplete_cases.is_empty();
    if focused {
        let mut features: Vec<i32> = cases
            .iter()
            .flat_map(|c| c.features().iter().map(|f| *f as i32))
            .collect();
        features.sort_unstable();
        features.dedup();
        AutocompleteServiceClient::new(channels[0].clone())
            .configure(pb::AutocompleteServiceConfigureRequest {
                dictionary: DICTIONARY.to_owned(),
                features,
            })
            .await
            .expect("Configure");
    }
    let slowlog = baseline::slowlog_watch(&probe.admin).await;
    let memory_before = probe::used_memory(&mut probe.admin).await;
    let mark = probe.mark().await;
    let (took, retried) = load_terms(&channels, DICTIONARY, &terms).await;
    let mut load = Record {
        scenario: Scenario::Autocomplete.name().to_owned(),
        case: "load".to_owned(),
        clients: LOADERS,
        side: "baton-tcp".to_owned(),
        ..Record::default()
    };
    probe.usage(mark, &mut load).await;
    let slowest = slowlog.stop().await;
    load.set(SCRIPT_MAX, slowest.max_us as f64);
    load.set(SLOW_1MS, slowest.over_1ms as f64);
    load.set(SLOW_5MS, slowest.over_5ms as f64);
    load.set(COMMAND_MAX, slowest.inner_max_us as f64);
    eprintln!(
        "autocomplete: longest script call while loading {} us ({}), {} of 1 ms or more, {} of 5 ms or more ({} full logs); longest other command {} us ({})",
        slowest.max_us,
        slowest.command,
        slowest.over_1ms,
        slowest.over_5ms,
        slowest.full_logs,
        slowest.inner_max_us,
        slowest.inner_command
    );
    load.set(SLOW_FULL, slowest.full_logs as f64);
    load.set(ADD_RETRIED, retried as f64);
    let count = AutocompleteServiceClient::new(channels[0].clone())
        .describe(pb::AutocompleteServiceDescribeRequest {
            dictionary: DICTIONARY.to_owned(),
        })
        .await
        .expect("Describe")
        .into_inner()
        .term_count;
    load.set(names::TERMS, count as f64);
    load.set(names::TOOK, took.as_secs_f64());
    load.set(
        names::MEMORY,
        probe::used_memory(&mut probe.admin)
            .await
            .saturating_sub(memory_before) as f64,
    );
    eprintln!(
        "autocomplete: {count} terms loaded in {:.1} s",
        took.as_secs_f64()
    );
    records.push(load);

    let keys = Arc::new(DictionaryKeys::new(BATON_PREFIX, DICTIONARY));
    let queries = Queries::new(&terms);
    let mut conns = Vec::with_capacity(clients);
    for _ in 0..clients {
        conns.push(stage.redis.client().await);
    }
    let scripts = Arc::new((Script::new(scripts::PREFIX), Script::new(scripts::RANKED)));
    for case in cases {
        let mut sides = vec!["baton-tcp"];
        if matches!(case, Case::PrefixLex | Case::PrefixScore) {
            sides.push("direct");
        }
        if case == Case::PrefixLex {
            sides.push("zrange");
        }
        for side in sides {
            let record = measure(
                options,
                &mut probe,
                case,
                side,
                Callers {
                    channels: &channels,
                    conns: &conns,
                    keys: &keys,
                    scripts: &scripts,
                    queries: queries.of(case),
                },
            )
            .await;
            eprintln!(
                "autocomplete {:<15} {:<10} {:>8.0}/s p50 {} us p99 {} us",
                case.name(),
                side,
                record.get(names::RATE).unwrap_or(0.0),
                record.get(names::P50).unwrap_or(0.0),
                record.get(names::P99).unwrap_or(0.0)
            );
            records.push(record);
        }
    }

    let mut memory = Record {
        scenario: Scenario::Autocomplete.name().to_owned(),
        case: "memory".to_owned(),
        side: "redis".to_owned(),
        ..Record::default()
    };
    memory.set(names::TERMS, count as f64);
    for (kind, (bytes, keys)) in index_memory(&mut probe.admin, &keys.base).await {
        memory.set(&format!("bytes:{kind}"), bytes as f64);
        memory.set(&format!("keys:{kind}"), keys as f64);
    }
    records.push(memory);
    if options.autocomplete_build_ranked {
        records.push(build_ranked(&channels, &mut probe, count).await);
    }
    if focused {
        return;
    }

    // The same terms in dictionaries declared with fewer features, each loaded and measured on
    // its own: what a dictionary serving only some modes costs.
    for (label, features) in FEATURE_SETS {
        let dictionary = format!("{DICTIONARY}-{label}");
        AutocompleteServiceClient::new(channels[0].clone())
            .configure(pb::AutocompleteServiceConfigureRequest {
                dictionary: dictionary.clone(),
                features: features.iter().map(|f| *f as i32).collect(),
            })
            .await
            .expect("Configure");
        let before = probe::used_memory(&mut probe.admin).await;
        let (took, retried) = load_terms(&channels, &dictionary, &terms).await;
        let grown = probe::used_memory(&mut probe.admin)
            .await
            .saturating_sub(before);
        let mut r = Record {
            scenario: Scenario::Autocomplete.name().to_owned(),
            case: "memory-features".to_owned(),
            side: label.to_owned(),
            ..Record::default()
        };
        r.set(names::TERMS, terms.len() as f64);
        r.set(names::TOOK, took.as_secs_f64());
        r.set(names::MEMORY, grown as f64);
        r.set(ADD_RETRIED, retried as f64);
        let keys = DictionaryKeys::new(BATON_PREFIX, &dictionary);
        let mut total = 0;
        for (kind, (bytes, n)) in index_memory(&mut probe.admin, &keys.base).await {
            r.set(&format!("bytes:{kind}"), bytes as f64);
            r.set(&format!("keys:{kind}"), n as f64);
            total += bytes;
        }
        eprintln!(
            "autocomplete: {label}: loaded in {:.1} s, {:.0} B/term (MEMORY USAGE), {:.0} B/term \
             (used_memory growth)",
            took.as_secs_f64(),
            total as f64 / terms.len().max(1) as f64,
            grown as f64 / terms.len().max(1) as f64
        );
        records.push(r);
    }

    // RediSearch's suggestions, and the bare sorted set again, on a server of their own.
    if let Some(search) = baseline::SearchServer::start().await {
        let sug = search.suggestions(&terms, "bench:sug").await;
        let bare = baseline::bare_sorted_set(&search.conn, &terms, "bench:bare").await;
        eprintln!(
            "autocomplete: {}: FT.SUGADD {:.1} s, {:.0} B/term; bare sorted set {:.1} s, {:.0} B/term",
            search.version,
            sug.took,
            sug.bytes as f64 / terms.len().max(1) as f64,
            bare.took,
            bare.bytes as f64 / terms.len().max(1) as f64
        );
        records.push(baseline_record(
            &format!("ft-sug {}", search.version),
            terms.len(),
            &sug,
        ));
        records.push(baseline_record(
            &format!("zadd {}", search.version),
            terms.len(),
            &bare,
        ));
        search.stop().await;
    }
}

/// The feature sets of the dictionaries measured beside the main one (which has every feature),
/// each with its label in the records.
pub const FEATURE_SETS: [(&str, &[pb::AutocompleteFeature]); 4] = [
    ("none", &[]),
    ("ranked", &[pb::AutocompleteFeature::Ranked]),
    (
        "ranked+words",
        &[
            pb::AutocompleteFeature::Ranked,
            pb::AutocompleteFeature::Words,
        ],
    ),
    (
        "ranked+words+substring",
        &[
            pb::AutocompleteFeature::Ranked,
            pb::AutocompleteFeature::Words,
            pb::AutocompleteFeature::Substring,
        ],
    ),
];

/// Adds `RANKED` to the dictionary (which has `terms` terms and was declared without it) and
/// waits for the background build to end, watching Describe every 200 ms: how long it took,
/// Redis's and Baton's CPU, and the longest step by the slow log.
async fn build_ranked(channels: &[Channel], probe: &mut Probe, terms: u64) -> Record {
    let mut client = AutocompleteServiceClient::new(channels[0].clone());
    let describe = |mut client: AutocompleteServiceClient<Channel>| async move {
        client
            .describe(pb::AutocompleteServiceDescribeRequest {
                dictionary: DICTIONARY.to_owned(),
            })
            .await
            .expect("Describe")
            .into_inner()
    };
    let mut features = describe(client.clone()).await.features;
    assert!(
        !features.contains(&(pb::AutocompleteFeature::Ranked as i32)),
        "--autocomplete-build-ranked needs a dictionary without RANKED: name query kinds that do not need it"
    );
    features.push(pb::AutocompleteFeature::Ranked as i32);
    features.sort_unstable();
    let slowlog = baseline::slowlog_watch(&probe.admin).await;
    let mark = probe.mark().await;
    let started = Instant::now();
    client
        .configure(pb::AutocompleteServiceConfigureRequest {
            dictionary: DICTIONARY.to_owned(),
            features,
        })
        .await
        .expect("Configure");
    // A background job that publishes nothing when it ends: its progress is polled.
    while describe(client.clone()).await.change.is_some() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = started.elapsed();
    let mut record = Record {
        scenario: Scenario::Autocomplete.name().to_owned(),
        case: "build-ranked".to_owned(),
        side: "baton-tcp".to_owned(),
        ..Record::default()
    };
    probe.usage(mark, &mut record).await;
    let slowest = slowlog.stop().await;
    record.set(names::TERMS, terms as f64);
    record.set(names::TOOK, took.as_secs_f64());
    record.set(SCRIPT_MAX, slowest.max_us as f64);
    record.set(SLOW_1MS, slowest.over_1ms as f64);
    record.set(SLOW_5MS, slowest.over_5ms as f64);
    record.set(COMMAND_MAX, slowest.inner_max_us as f64);
    eprintln!(
        "autocomplete: RANKED built on {terms} terms in {:.1} s, longest step {} us, {} of 5 ms or more",
        took.as_secs_f64(),
        slowest.max_us,
        slowest.over_5ms
    );
    record
}

/// Times one `Add` of a load is sent again after it failed `UNAVAILABLE`.
const ADD_RETRIES: u32 = 20;

/// Loads `terms` into `dictionary` through `Add` (batches of [`BATCH`], [`LOADERS`] in flight);
/// returns how long it took and how many `Add`s were sent again. A batch that fails
/// `UNAVAILABLE` (Redis slow to answer under load) is sent again as it is: its terms set their
/// scores (no increment), so a partly applied batch sent again ends with the same terms, the
/// documented way to converge without a request id (whose records would cost Redis work per
/// entry that a file load does not pay either).
async fn load_terms(
    channels: &[Channel],
    dictionary: &str,
    terms: &Arc<Vec<GeneratedTerm>>,
) -> (Duration, u64) {
    let started = Instant::now();
    let mut loaders = JoinSet::new();
    for l in 0..LOADERS {
        let mut api = AutocompleteServiceClient::new(channels[l % channels.len()].clone());
        let terms = Arc::clone(terms);
        let dictionary = dictionary.to_owned();
        loaders.spawn(async move {
            let mut retries = 0u64;
            let mut at = l * BATCH;
            while at < terms.len() {
                let chunk = &terms[at..(at + BATCH).min(terms.len())];
                let request = pb::AutocompleteServiceAddRequest {
                    dictionary: dictionary.clone(),
                    terms: chunk
                        .iter()
                        .map(|t| pb::AutocompleteTerm {
                            display: t.display.clone(),
                            score: Some(t.score),
                            increment: false,
                            payload: t.payload.clone(),
                        })
                        .collect(),
                    request_id: String::new(),
                };
                let mut tries = 0;
                loop {
                    match api.add(request.clone()).await {
                        Ok(_) => break,
                        Err(s) if s.code() == tonic::Code::Unavailable && tries < ADD_RETRIES => {
                            tries += 1;
                            retries += 1;
                            eprintln!("autocomplete: Add sent again ({tries}): {}", s.message());
                        }
                        Err(s) => panic!("Add: {s:?}"),
                    }
                }
                at += BATCH * LOADERS;
            }
            retries
        });
    }
    let limit = Duration::from_secs(600);
    let mut retries = 0;
    while let Some(done) = within(limit, loaders.join_next(), "the dictionary to load").await {
        retries += done.expect("a loader task");
    }
    (started.elapsed(), retries)
}

/// `Add`s of a load sent again after they failed `UNAVAILABLE`.
pub const ADD_RETRIED: &str = "adds_retried";

/// The longest script call while loading (µs), by `SLOWLOG`.
pub const SCRIPT_MAX: &str = "script_max_us";
/// Script calls of 1 ms or more while loading.
pub const SLOW_1MS: &str = "scripts_1ms";
/// Script calls of 5 ms or more while loading.
pub const SLOW_5MS: &str = "scripts_5ms";
/// The longest command other than a script call while loading (µs), by `SLOWLOG`: one the
/// scripts run, of a few members (see `baseline::Slowest::inner_max_us`).
pub const COMMAND_MAX: &str = "command_max_us";
/// Reads of the slow log that found it full (it may have dropped entries: 0 in a good run).
pub const SLOW_FULL: &str = "slowlog_full";

/// A record of loading the terms into a baseline structure (`side` says which, and where).
fn baseline_record(side: &str, terms: usize, loaded: &baseline::Loaded) -> Record {
    let mut r = Record {
        scenario: Scenario::Autocomplete.name().to_owned(),
        case: "baseline".to_owned(),
        side: side.to_owned(),
        ..Record::default()
    };
    r.set(names::TERMS, terms as f64);
    r.set(names::TOOK, loaded.took);
    r.set(names::MEMORY, loaded.bytes as f64);
    r
}

/// What the clients of a case call through.
struct Callers<'a> {
    channels: &'a [Channel],
    conns: &'a [MultiplexedConnection],
    keys: &'a Arc<DictionaryKeys>,
    scripts: &'a Arc<(Script, Script)>,
    queries: Arc<Vec<String>>,
}

/// Starts the measured window once every client has warmed up.
struct Gate {
    warm_until: Instant,
    paused: Barrier,
    go: Barrier,
    until: OnceLock<Instant>,
}

/// One client's call: returns the suggestions it got.
async fn call(
    case: Case,
    side: &str,
    n: usize,
    grpc: &mut (AutocompleteServiceClient<Channel>, HealthClient<Channel>),
    conn: &mut MultiplexedConnection,
    callers: (&DictionaryKeys, &(Script, Script), &[String]),
) -> Result<u64, String> {
    let (keys, scripts, queries) = callers;
    let query = &queries[n % queries.len()];
    match side {
        "baton-tcp" if case == Case::Health => grpc
            .1
            .check(HealthCheckRequest {
                service: "liveness".to_owned(),
            })
            .await
            .map(|_| 0)
            .map_err(|s| format!("Health/Check: {s:?}")),
        "baton-tcp" => {
            let (mode, order) = case.mode_order();
            grpc.0
                .complete(pb::AutocompleteServiceCompleteRequest {
                    dictionary: DICTIONARY.to_owned(),
                    query: query.clone(),
                    limit: LIMIT,
                    mode: mode.into(),
                    order: order.into(),
                    page_token: String::new(),
                    max_edits: None,
                })
                .await
                .map(|r| r.into_inner().suggestions.len() as u64)
                .map_err(|s| format!("Complete: {s:?}"))
        }
        "direct" => {
            let form = query_form(query);
            let prefix = scripts::Prefix {
                keys,
                query: &form,
                limit: LIMIT,
                position: &[],
            };
            let invocation = if case == Case::PrefixScore {
                prefix.ranked(&scripts.1)
            } else {
                prefix.lexicographic(&scripts.0)
            };
            let reply: Vec<Value> = invocation
                .invoke_async(conn)
                .await
                .map_err(|e| format!("prefix script: {e}"))?;
            Ok(reply.len().saturating_sub(2) as u64 / 3)
        }
        _ => {
            let form = query_form(query);
            let mut lo = b"[".to_vec();
            lo.extend_from_slice(form.as_bytes());
            let mut hi = b"(".to_vec();
            hi.extend_from_slice(form.as_bytes());
            hi.push(0xff);
            let rows: Vec<Vec<u8>> = redis::cmd("ZRANGE")
                .arg(keys.lex_of(&form))
                .arg(lo)
                .arg(hi)
                .arg("BYLEX")
                .arg("LIMIT")
                .arg(0)
                .arg(LIMIT)
                .query_async(conn)
                .await
                .map_err(|e| format!("ZRANGE: {e}"))?;
            Ok(rows.len() as u64)
        }
    }
}

/// Runs the clients of `case` on `side` for a window after a short warm-up.
async fn measure(
    options: &Options,
    probe: &mut Probe,
    case: Case,
    side: &'static str,
    callers: Callers<'_>,
) -> Record {
    let clients = options.autocomplete_clients.max(1);
    let window = options.autocomplete_window;
    let warmup = (window / 10).min(Duration::from_secs(1));
    let gate = Arc::new(Gate {
        warm_until: Instant::now() + warmup,
        paused: Barrier::new(clients + 1),
        go: Barrier::new(clients + 1),
        until: OnceLock::new(),
    });
    let mut tasks = JoinSet::new();
    for i in 0..clients {
        let channel = callers.channels[i % callers.channels.len()].clone();
        let mut grpc = (
            AutocompleteServiceClient::new(channel.clone()),
            HealthClient::new(channel),
        );
        let mut conn = callers.conns[i % callers.conns.len()].clone();
        let keys = Arc::clone(callers.keys);
        let scripts = Arc::clone(callers.scripts);
        let queries = Arc::clone(&callers.queries);
        let gate = Arc::clone(&gate);
        tasks.spawn(async move {
            let mut n = i * 7919;
            let what = (&*keys, &*scripts, queries.as_slice());
            while Instant::now() < gate.warm_until {
                let _ = call(case, side, n, &mut grpc, &mut conn, what).await;
                n += 1;
            }
            gate.paused.wait().await;
            gate.go.wait().await;
            let until = *gate.until.get().expect("the window is set before it opens");
            let mut latency = histogram();
            let (mut ops, mut errors, mut results, mut first_error) = (0u64, 0u64, 0u64, None);
            while Instant::now() < until {
                let sent = Instant::now();
                match call(case, side, n, &mut grpc, &mut conn, what).await {
                    Ok(r) => {
                        latency.saturating_record(micros(sent.elapsed()));
                        ops += 1;
                        results += r;
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e);
                    }
                }
                n += 1;
            }
            (latency, ops, errors, results, first_error)
        });
    }
    within(
        warmup + Duration::from_secs(60),
        gate.paused.wait(),
        "the clients to warm up",
    )
    .await;
    // The longest script call of the window, by Redis's slow log (the raw ZRANGE side runs none).
    let slowlog = baseline::slowlog_watch(&probe.admin).await;
    let mark = probe.mark().await;
    gate.until
        .set(Instant::now() + window)
        .expect("the window is set once");
    gate.go.wait().await;
    let mut all: Histogram<u64> = histogram();
    let (mut ops, mut errors, mut results, mut first_error) = (0u64, 0u64, 0u64, None);
    while let Some(done) = within(
        window + Duration::from_secs(60),
        tasks.join_next(),
        "the clients to finish the window",
    )
    .await
    {
        let (h, o, e, r, f) = done.expect("a client task");
        all.add(&h).expect("histograms add");
        ops += o;
        errors += e;
        results += r;
        if first_error.is_none() {
            first_error = f;
        }
    }
    let mut record = Record {
        scenario: Scenario::Autocomplete.name().to_owned(),
        case: case.name().to_owned(),
        clients,
        side: side.to_owned(),
        ..Record::default()
    };
    probe.usage(mark, &mut record).await;
    let slowest = slowlog.stop().await;
    if side != "zrange" && case != Case::Health {
        record.set(SCRIPT_MAX, slowest.max_us as f64);
        record.set(SLOW_5MS, slowest.over_5ms as f64);
    }
    let secs = record.get(names::SECS).unwrap_or(1.0).max(1e-9);
    record.set(names::OPS, ops as f64);
    record.set(names::ERRORS, errors as f64);
    record.set(names::RESULTS, results as f64);
    record.set(names::RATE, ops as f64 / secs);
    stats::latency(&mut record, &all);
    record.first_error = first_error;
    record
}

/// Bytes and keys per kind of key of the dictionary at `base` (`MEMORY USAGE` of every key).
async fn index_memory(
    conn: &mut MultiplexedConnection,
    base: &str,
) -> BTreeMap<&'static str, (u64, u64)> {
    let mut totals = BTreeMap::new();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{}*", base.replace('{', "\\{").replace('}', "\\}")))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .expect("SCAN");
        for key in keys {
            let bytes: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(conn)
                .await
                .expect("MEMORY USAGE");
            let rest = &key[base.len()..];
            let kind = match rest {
                b":data" => "data",
                b":h" => "h",
                b":top" => "top",
                b":v" => "v",
                _ if rest.starts_with(b":l:") => "l",
                _ if rest.starts_with(b":b:") => "b",
                _ if rest.starts_with(b":t:") => "t",
                _ if rest.starts_with(b":r:") => "r",
                _ if rest.starts_with(b":w:") => "w",
                _ if rest.starts_with(b":vg:") => "vg",
                _ => "other",
            };
            let entry = totals.entry(kind).or_insert((0, 0));
            entry.0 += bytes.unwrap_or(0);
            entry.1 += 1;
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    totals
}
