//! Autocomplete over dictionaries (large term sets with scores and payloads) and recent lists
//! (short most-recent-first lists), with Unicode-correct matching and bounded work per call.
//!
//! Baton computes each text's matching form ([`text::Text`]: NFKC with full case folding) so
//! that Redis only compares bytes; every change is one Lua script (a batch of terms: one per step
//! of bounded work, see [`STEP_WORK`]), and every read is a script flagged `no-writes`.
//!
//! # Redis layout
//!
//! Every key of dictionary `NAME` shares the hash tag `{ac:NAME}`, and every key of recent list
//! `NAME` the tag `{acr:NAME}` (with `%`, `{` and `}` in names percent-encoded), so each script
//! touches one Redis Cluster slot. A term's *lex member* is `KEY \0 ID` (its matching form, then
//! its display text in NFC); its *ranked member* is 8 bytes that sort by descending score,
//! followed by the lex member. Sets by first byte are named by the byte in hex (`XX`).
//!
//! | key | type | holds | lifetime |
//! |---|---|---|---|
//! | `PREFIX{ac:NAME}:l:XX` | sorted set (scores 0) | the lex member of every term whose matching form starts with byte `XX` | while one does |
//! | `PREFIX{ac:NAME}:data` | hash | id → score, display text (when not the id), payload | while the dictionary has terms |
//! | `PREFIX{ac:NAME}:h` | hash | `l:XX`, `b:XX` or `r:P` → 1 for every lex and ranked set there is, `t:P` → the deep set's bound; `""` → 1 while the first-byte ranked sets exist | while one does |
//! | `PREFIX{ac:NAME}:b:XX` | sorted set (scores 0) | ranked members of every term whose matching form starts with byte `XX` (hex) | while the dictionary has more than [`LIGHT_PREFIX`] terms; created past [`HEAVY_PREFIX`] |
//! | `PREFIX{ac:NAME}:t:P` | sorted set (scores 0) | ranked members of the best-ranked terms starting with `P` ([`MAX_RANKED_DEPTH`] + 1 characters): every such term ranked at or before the set's bound (in `h`); up to twice [`DEEP_RANKED`] (and a step's) | while more than [`LIGHT_PREFIX`] terms start with `P`; created past [`HEAVY_PREFIX`] |
//! | `PREFIX{ac:NAME}:top` | sorted set (scores 0) | ranked members of the best-ranked terms: every term ranked at or before its last member; up to twice [`TOP_RANKED`] (and a step's) | as the first-byte ranked sets |
//! | `PREFIX{ac:NAME}:r:P` | sorted set (scores 0) | ranked members of every term starting with `P`, of 1 to [`MAX_RANKED_DEPTH`] characters (one character only when it takes several bytes: an ASCII character's set is its `b:XX`) | while more than [`LIGHT_PREFIX`] terms start with `P`; created past [`HEAVY_PREFIX`] |
//! | `PREFIX{ac:NAME}:w:W` | sorted set (scores 0) | lex members of the terms having word `W` | while a term has `W` |
//! | `PREFIX{ac:NAME}:v` | sorted set (scores 0) | the vocabulary: every word of every term | while the dictionary has terms |
//! | `PREFIX{ac:NAME}:vg:G` | set | the vocabulary words containing gram `G` (2 or 3 characters, or 1 non-ASCII character) | while such a word exists |
//! | `PREFIX{ac:NAME}:f` | hash | `s` → the served [`Features`] as letters (`r`, `w`, `s`; absent: every feature), and the state of a change of them under way ([`FeatureChange`], `features.lua`) | from `Configure` on; not removed with the last term |
//! | `PREFIX{ac:NAME}:f:lease` | string | the id of the Baton driving a change of features | [`CHANGE_LEASE`], renewed by each step; deleted when that Baton shuts down gracefully |
//! | `PREFIX{ac:NAME}:q:ID` | list | what the `Add` batch with request id `ID` did: its fingerprint, then per entry applied `a`/`u` and the score after it | [`REQUEST_MEMORY`] after its last step ([`AUTO_REQUEST_MEMORY`] for ids Baton made up) |
//! | `PREFIX{acr:NAME}` | sorted set | item id → last recorded (µs, Redis clock) | the list's ttl, set anew by each record |
//! | `PREFIX{acr:NAME}:items` | hash | item id → matching form, display text, payload | as above |
//!
//! Dictionaries do not expire: they are user data, kept until their terms are removed; removing
//! the last term removes every key. The gRPC handler is in [`service`]; this module knows nothing
//! of tonic.

pub mod cursor;
mod fuzzy;
pub mod scripts;
pub mod service;
pub mod text;

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use redis::{Script, ScriptInvocation, Value};
use tokio::time::Instant;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    error::{Error, Field},
    redis::{
        Redis,
        reply::{int, unexpected},
    },
};
use cursor::{Cursor, Scope};
pub use text::Text;

/// Longest dictionary or recent list name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest display text or query, in bytes.
pub const MAX_TEXT_BYTES: usize = 256;
/// Longest matching form or NFC form of a text, in bytes (normalization can expand a text).
pub const MAX_FORM_BYTES: usize = 1024;
/// Longest payload, in bytes.
pub const MAX_PAYLOAD_BYTES: usize = 1024;
/// Most terms in one `Add`, or texts in one `Remove` or `RemoveRecent`.
pub const MAX_TERMS: usize = 1000;
/// Results per page when the request says 0.
pub const DEFAULT_LIMIT: u32 = 10;
/// Most results per page.
pub const MAX_RESULTS: u32 = 1000;
/// Largest absolute score.
pub const MAX_ABS_SCORE: f64 = 1e15;
/// A prefix gets its own ranked set once more than this many terms start with it, so that
/// score-ordered prefix completion never ranks more terms than this in one call.
pub const HEAVY_PREFIX: usize = 256;
/// A prefix's ranked set is dropped once this many terms or fewer start with it (half of
/// [`HEAVY_PREFIX`], so that a dictionary hovering around the threshold does not rebuild it on
/// every change).
pub const LIGHT_PREFIX: usize = 128;
/// A candidate set this small (the terms of a few words, or of a prefix without a ranked set) is
/// read whole and put in order in one call.
pub const GATHER: usize = 1024;
const _: () = assert!(HEAVY_PREFIX <= GATHER, "light prefixes are gathered whole");
/// Only prefixes of at most this many characters get a ranked set: each set costs every term
/// under it one more sorted set entry. A score-ordered query on a longer prefix with more than
/// [`HEAVY_PREFIX`] terms reads the deep set of its first characters ([`DEEP_RANKED`]), then
/// walks the ranked set of its longest shorter prefix that has one.
pub const MAX_RANKED_DEPTH: usize = 2;
/// A prefix of [`MAX_RANKED_DEPTH`] + 1 characters with more than [`HEAVY_PREFIX`] terms keeps
/// its best-ranked terms in a *deep set*, cut back towards this many when it passes twice that
/// (at most half this many members a step, so that no step removes many): score-ordered prefix completion of longer queries reads it before it walks the ranked set of
/// the shorter prefix.
pub const DEEP_RANKED: usize = 256;
/// A ranked dictionary keeps its best-ranked terms in one more ranked set, cut back towards this
/// many when it passes twice that (at most [`DEEP_RANKED`] / 2 members a step): score-ordered walks of the whole dictionary start there, in one
/// set, before they merge the sets of every first byte.
pub const TOP_RANKED: usize = 2048;
/// The most index entries one `Complete` call looks at.
pub const BUDGET: usize = 1024;
/// Fuzzy mode: the most reads of index sets one call makes (skip-scan steps and range reads), over
/// all its steps.
pub const FUZZY_CALLS: usize = 1024;
/// Fuzzy mode: the most lex members those reads may return in one call, over all its steps.
pub const FUZZY_ENTRIES: usize = 2048;
/// Fuzzy mode: the most reads of index sets one script call (a step of the walk) makes by score,
/// so that no step holds Redis for more than a few milliseconds.
pub const FUZZY_STEP_CALLS: usize = 256;
/// Fuzzy mode: the same in lexicographic order, whose steps rank nothing and so can read more in
/// the same time.
pub const FUZZY_LEX_STEP_CALLS: usize = 512;
/// Fuzzy mode: the most lex members one step's reads may return.
pub const FUZZY_STEP_ENTRIES: usize = 512;
/// Fuzzy mode: the longest query, in characters of its matching form.
pub const MAX_FUZZY_CHARS: usize = 32;
/// Fuzzy mode: the most edits a match may need.
pub const MAX_FUZZY_EDITS: u32 = 2;
/// Fuzzy mode: the shortest query (in characters) allowed 1 edit.
pub const FUZZY_ONE_EDIT_FROM: usize = 3;
/// Fuzzy mode: the shortest query (in characters) allowed 2 edits.
pub const FUZZY_TWO_EDITS_FROM: usize = 7;
/// Items a recent list keeps when the request says 0.
pub const DEFAULT_RECENT_ITEMS: u32 = 100;
/// Most items a recent list keeps.
pub const MAX_RECENT_ITEMS: u32 = 1000;
/// Items per `ListRecent` page when the request says 0.
pub const DEFAULT_LIST_LIMIT: u32 = 100;
/// How long a recent list lives after its last record, when the request does not say.
pub const DEFAULT_RECENT_TTL: Duration = Duration::from_secs(90 * 24 * 3600);
/// Shortest recent list ttl.
pub const MIN_RECENT_TTL: Duration = Duration::from_secs(1);
/// Longest recent list ttl.
pub const MAX_RECENT_TTL: Duration = Duration::from_secs(3650 * 24 * 3600);
/// The work one step of a write batch may do, in units of one member or field read or written
/// by a script (planned as 12 per entry, 4 per word, 4 per ranked set and for the deep and top
/// sets, 1 per gram of a word): a step is one script call, and this keeps each call to about
/// 2 ms of Redis time on a 2-core machine (a gram set created costs more than other units: a
/// step of one 256-byte term of fresh words, about 530 units, takes 2 to 5 ms), so that a large
/// batch neither runs into Baton's command timeout nor holds up the other clients of the Redis.
pub const STEP_WORK: usize = 1000;
/// Most entries in one step of a write batch, which also bounds what a step copies when it
/// creates a ranked set (at most [`HEAVY_PREFIX`] terms plus a step).
pub const STEP_ENTRIES: usize = 64;
/// The most work one step of a write batch does, in [`STEP_WORK`] units, by construction: a
/// step of more than one entry does at most [`STEP_WORK`] and [`CUT_RESERVE`] (what its entries
/// were planned to cost and the copies and cut-backs its script counts before writing, else its
/// entries that fit go without the one that brings the work, which goes with half the rest, down
/// to alone); a step of one entry may pass that by the copies of making the dictionary
/// ranked (4 per term, at most [`HEAVY_PREFIX`] + 1 terms, and one per possible lex set). The
/// scripts return the work they did, and [`heaviest_step`] keeps the most seen.
pub const MAX_STEP_WORK: usize = STEP_WORK + CUT_RESERVE + 4 * (HEAVY_PREFIX + 1) + FIRST_BYTES;
/// Work a step keeps beyond [`STEP_WORK`] for two cut-backs (of a deep set and of `top`, at most
/// [`DEEP_RANKED`] / 2 members and a read each), so that a set that needs one does not send
/// the step back to be cut.
pub const CUT_RESERVE: usize = 2 * (DEEP_RANKED / 2 + 1);
/// Lex sets there can be: one per ASCII byte but 0, and per first byte of a multi-byte
/// character (0xC2 to 0xF4).
const FIRST_BYTES: usize = 127 + (0xF4 - 0xC2 + 1);
/// Dictionaries whose write features one Baton remembers (the hints are forgotten all at once
/// past this many, and learnt again from the next step of each).
const WRITE_HINTS: usize = 4096;
/// Longest request id, in bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 128;
/// How long Redis remembers what an `Add` with a client's request id did.
pub const REQUEST_MEMORY: Duration = Duration::from_secs(24 * 3600);
/// How long Redis remembers what an `Add` with score increments and without a client's request
/// id did, under the id Baton made up for it (named in the `UNAVAILABLE` status, for a retry).
pub const AUTO_REQUEST_MEMORY: Duration = Duration::from_secs(10 * 60);

/// The Redis keys of one dictionary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DictionaryKeys {
    /// `PREFIX{ac:NAME}`: the start of every key of the dictionary.
    pub base: String,
    /// Scores, display texts and payloads (one field per term).
    pub data: String,
    /// The vocabulary: every word of every term.
    pub vocab: String,
    /// The prefixes that have a ranked set.
    pub heavy: String,
    /// The dictionary's declared [`Features`] (absent: every index).
    pub features: String,
}

impl DictionaryKeys {
    /// The keys of dictionary `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> Self {
        let base = format!("{prefix}{{ac:{}}}", escape(name));
        Self {
            data: format!("{base}:data"),
            vocab: format!("{base}:v"),
            heavy: format!("{base}:h"),
            features: format!("{base}:f"),
            base,
        }
    }

    /// The lex members of the terms whose matching form starts with byte `b`.
    pub fn lex(&self, b: u8) -> String {
        format!("{}:l:{b:02x}", self.base)
    }

    /// The lex set a query or term with matching form `form` (not empty) falls in.
    pub fn lex_of(&self, form: &str) -> String {
        self.lex(form.as_bytes().first().copied().unwrap_or(0))
    }

    /// The ranked set of the terms whose matching form starts with `prefix`, of 1 to
    /// [`MAX_RANKED_DEPTH`] characters (a 1-byte character's is its [`Self::first_byte`] set).
    pub fn ranked(&self, prefix: &str) -> String {
        match prefix.as_bytes() {
            [b] => self.first_byte(*b),
            _ => format!("{}:r:{prefix}", self.base),
        }
    }

    /// The ranked set of the terms whose matching form starts with byte `b`.
    pub fn first_byte(&self, b: u8) -> String {
        format!("{}:b:{b:02x}", self.base)
    }

    /// The terms having word `word`.
    pub fn word(&self, word: &str) -> String {
        format!("{}:w:{word}", self.base)
    }

    /// The vocabulary words containing gram `gram`.
    pub fn vocab_gram(&self, gram: &str) -> String {
        format!("{}:vg:{gram}", self.base)
    }

    /// The best-ranked terms of the dictionary.
    pub fn top(&self) -> String {
        format!("{}:top", self.base)
    }

    /// The deep set of `prefix` ([`MAX_RANKED_DEPTH`] + 1 characters).
    pub fn deep(&self, prefix: &str) -> String {
        format!("{}:t:{prefix}", self.base)
    }

    /// The lease of the Baton driving a change of the dictionary's features.
    pub fn lease(&self) -> String {
        format!("{}:f:lease", self.base)
    }

    /// What the `Add` batch with request id `id` did so far.
    pub fn record(&self, id: &str) -> String {
        format!("{}:q:{id}", self.base)
    }

    /// The ranked sets a term with matching form `key` (not empty) can be in: its first byte's,
    /// then those of its prefixes of 1 to [`MAX_RANKED_DEPTH`] characters longer than a byte.
    pub fn ranked_sets_of(&self, key: &str) -> Vec<String> {
        let mut sets = vec![self.first_byte(key.as_bytes().first().copied().unwrap_or(0))];
        for (n, end) in key
            .char_indices()
            .map(|(i, _)| i)
            .skip(1)
            .chain(std::iter::once(key.len()))
            .enumerate()
        {
            if end > 1 {
                sets.push(self.ranked(&key[..end]));
            }
            if n + 1 >= MAX_RANKED_DEPTH {
                break;
            }
        }
        sets
    }

    /// The deep set a term with matching form `key` can be in: that of its first
    /// [`MAX_RANKED_DEPTH`] + 1 characters, when it has that many.
    pub fn deep_set_of(&self, key: &str) -> Option<String> {
        let end = key
            .char_indices()
            .map(|(i, _)| i)
            .chain(std::iter::once(key.len()))
            .nth(MAX_RANKED_DEPTH + 1)?;
        Some(self.deep(&key[..end]))
    }

    /// Every lex set and first-byte ranked set there can be (a matching form starts with an
    /// ASCII byte or the first byte of a multi-byte character).
    pub fn first_byte_sets(&self) -> Vec<String> {
        (1u8..=244)
            .filter(|b| *b < 128 || *b >= 194)
            .flat_map(|b| [self.lex(b), self.first_byte(b)])
            .collect()
    }
}

/// The Redis keys of one recent list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentKeys {
    /// Item ids by the time they were last recorded.
    pub order: String,
    /// Matching forms, display texts and payloads.
    pub items: String,
}

impl RecentKeys {
    /// The keys of recent list `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> Self {
        let order = format!("{prefix}{{acr:{}}}", escape(name));
        Self {
            items: format!("{order}:items"),
            order,
        }
    }
}

/// Percent-encodes `%`, `{` and `}`, so that a name can neither end the hash tag early nor make
/// two names share a key.
fn escape(name: &str) -> std::borrow::Cow<'_, str> {
    if name.contains(['%', '{', '}']) {
        name.replace('%', "%25")
            .replace('{', "%7B")
            .replace('}', "%7D")
            .into()
    } else {
        name.into()
    }
}

/// How an added term's score changes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScoreChange {
    /// Keep the current score (0 for a new term).
    Keep,
    /// Replace it.
    Set(f64),
    /// Add to it.
    Increment(f64),
}

/// One term to add, already validated.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTerm {
    /// The term's texts.
    pub text: Text,
    /// What happens to its score.
    pub score: ScoreChange,
    /// The payload to set; `None` keeps the current one.
    pub payload: Option<Vec<u8>>,
}

/// Where Redis remembers what an `Add` batch did, so that the batch sent again (a retry) is
/// applied once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The request id: the client's, or one Baton made up.
    pub id: String,
    /// How long the record is kept after the batch's last step.
    pub memory: Duration,
}

/// An `Add` batch, ready to be sent in steps.
struct AddBatch<'a> {
    keys: DictionaryKeys,
    terms: &'a [NewTerm],
    words: Vec<Vec<&'a str>>,
    /// The features the steps are planned for: their keys are declared, the rest not.
    features: Features,
    planned: Vec<Planned>,
    record_key: Option<String>,
    fingerprint: Option<String>,
    memory_ms: u64,
}

impl<'a> AddBatch<'a> {
    fn new(
        keys: DictionaryKeys,
        terms: &'a [NewTerm],
        record: Option<&Record>,
        features: Features,
    ) -> Self {
        let words: Vec<Vec<&str>> = terms.iter().map(|t| text::words(&t.text.key)).collect();
        let planned = plan(
            &keys,
            terms.iter().map(|t| t.text.key.as_str()),
            &words,
            features,
        );
        Self {
            record_key: record.map(|r| keys.record(&r.id)),
            fingerprint: record.map(|_| batch_fingerprint(terms)),
            memory_ms: record.map_or(0, |r| {
                u64::try_from(r.memory.as_millis()).unwrap_or(u64::MAX)
            }),
            keys,
            terms,
            words,
            features,
            planned,
        }
    }

    /// Plans the entries from `at` on for `features` (a step answered that it needs them).
    fn replan(&mut self, at: usize, features: Features) {
        let keys = self.terms[at..].iter().map(|t| t.text.key.as_str());
        let planned = plan(&self.keys, keys, &self.words[at..], features);
        self.planned.truncate(at);
        self.planned.extend(planned);
        self.features = features;
    }

    /// The call of add.lua for the entries `at..end`, declaring every first-byte set when `wide`.
    fn step<'s>(
        &self,
        script: &'s Script,
        at: usize,
        end: usize,
        wide: bool,
    ) -> ScriptInvocation<'s> {
        let keys = &self.keys;
        let wide_sets = wide.then(|| keys.first_byte_sets());
        let touched = declared(&self.planned[at..end], wide_sets.as_deref());
        let planned: usize = self.planned[at..end].iter().map(|p| p.work).sum();
        scripts::Add {
            keys,
            record: self.record_key.as_deref(),
            touched: &touched,
            wide,
            fingerprint: self.fingerprint.as_deref().unwrap_or(""),
            first: at,
            memory_ms: self.memory_ms,
            room: (STEP_WORK + CUT_RESERVE).saturating_sub(planned),
            features: &self.features.letters(),
        }
        .invocation(
            script,
            self.terms[at..end]
                .iter()
                .zip(&self.words[at..end])
                .map(|(term, words)| scripts::AddEntry {
                    id: &term.text.id,
                    key: &term.text.key,
                    display: term.text.stored_display(),
                    score: term.score,
                    payload: term.payload.as_deref(),
                    // Words serve only the word and gram indexes.
                    words: if self.features.words { words } else { &[] },
                }),
        )
    }
}

/// One entry of a write batch, planned: the keys its step may touch and the work it may cost.
struct Planned {
    keys: Vec<String>,
    work: usize,
}

impl Planned {
    /// The plan of a term with matching form `key` and words `words` in the dictionary `keys`
    /// with `features`: the keys of those features only, and their work.
    fn new(keys: &DictionaryKeys, key: &str, words: &[&str], features: Features) -> Self {
        let mut planned = Vec::with_capacity(4 + 2 * words.len());
        planned.push(keys.lex_of(key));
        let (mut grams, mut word_count, mut sets) = (0, 0, None);
        if features.words {
            word_count = words.len();
            for word in words {
                planned.push(keys.word(word));
                if features.substring {
                    for gram in text::grams(word) {
                        planned.push(keys.vocab_gram(gram));
                        grams += 1;
                    }
                }
            }
        }
        if features.ranked {
            let ranked = keys.ranked_sets_of(key);
            sets = Some(ranked.len());
            planned.extend(ranked);
            planned.extend(keys.deep_set_of(key));
        }
        Self {
            keys: planned,
            work: entry_work(word_count, grams, sets),
        }
    }
}

/// The plans of the terms with matching forms `forms` and words `words` for `features`.
fn plan<'k>(
    keys: &DictionaryKeys,
    forms: impl Iterator<Item = &'k str>,
    words: &[Vec<&str>],
    features: Features,
) -> Vec<Planned> {
    forms
        .zip(words)
        .map(|(form, w)| Planned::new(keys, form, w, features))
        .collect()
}

/// An upper bound of the work of one entry of a write batch, in [`STEP_WORK`] units (a member or
/// field read or written, as the scripts count them): its data, lex member and record (12), its
/// words' postings and vocabulary entries (4 a word), for a word new to the vocabulary one set
/// per gram, and, in a ranked dictionary (`ranked_sets` given), per ranked set (and its deep set
/// and the top set) its field in `h`, a count, a member added and one removed (4 each). Copies
/// into ranked sets a step creates and cut-backs are counted by the script, within the room the
/// step leaves ([`MAX_STEP_WORK`]).
fn entry_work(words: usize, grams: usize, ranked_sets: Option<usize>) -> usize {
    12 + 4 * words + grams + ranked_sets.map_or(0, |n| 4 * (n + 2))
}

/// How many of the items of these work costs (at least one) one step takes within [`STEP_WORK`].
fn within_work(costs: impl Iterator<Item = usize>) -> usize {
    let (mut work, mut n) = (0, 0);
    for cost in costs {
        work += cost;
        if work > STEP_WORK {
            return n.max(1);
        }
        n += 1;
    }
    n
}

/// The most work any write step of this process did (units of [`STEP_WORK`]).
static HEAVIEST_STEP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The most work one write step (`Add`, `Remove`, or a step of a RANKED build) of this process
/// did, as its script counted it, in [`STEP_WORK`] units: at most [`MAX_STEP_WORK`], which tests
/// check.
pub fn heaviest_step() -> u64 {
    HEAVIEST_STEP.load(std::sync::atomic::Ordering::Relaxed)
}

/// The most work any step of a RANKED build of this process did (units of [`STEP_WORK`]).
static HEAVIEST_BUILD_STEP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The most work one step of a RANKED build (change.lua) of this process did, as its script
/// counted it, in [`STEP_WORK`] units: at most [`MAX_STEP_WORK`] too (it is counted in
/// [`heaviest_step`] as well).
pub fn heaviest_build_step() -> u64 {
    HEAVIEST_BUILD_STEP.load(std::sync::atomic::Ordering::Relaxed)
}

/// Notes the work a write step's script reports doing.
fn note_step_work(v: &Value) -> Result<(), Error> {
    let work = count_u64(v)?;
    HEAVIEST_STEP.fetch_max(work, std::sync::atomic::Ordering::Relaxed);
    tracing::trace!(work, "autocomplete write step");
    Ok(())
}

/// How many of `planned` (at least one) the next step takes: at most `most`, within
/// [`STEP_WORK`].
fn next_step(planned: &[Planned], most: usize) -> usize {
    let mut work = 0;
    for (n, p) in planned.iter().take(most).enumerate() {
        work += p.work;
        if work > STEP_WORK {
            return n.max(1);
        }
    }
    planned.len().min(most).max(1)
}

/// How a step of `len` entries (or terms) refused as too much work, its first `fits` fitting,
/// goes on: those entries first (fewer than `len`), then at most the returned number from the
/// entry that brings the work, half of the rest, so that repeated refusals come down to that
/// entry alone (a step of one is never refused so).
fn after_refusal(len: usize, fits: usize) -> (usize, usize) {
    let fits = fits.min(len.saturating_sub(1));
    (fits, ((len - fits) / 2).max(1))
}

/// The keys a step's entries may touch, each once, and every first-byte set when `wide` holds
/// them: what the step declares beyond the dictionary's own keys.
fn declared<'k>(step: &'k [Planned], wide: Option<&'k [String]>) -> Vec<&'k str> {
    let mut seen = std::collections::HashSet::new();
    step.iter()
        .flat_map(|p| &p.keys)
        .chain(wide.into_iter().flatten())
        .map(String::as_str)
        .filter(|key| seen.insert(*key))
        .collect()
}

/// A fingerprint of an `Add` batch, kept in its record: the same request id sent with another
/// batch is refused instead of answered with the other batch's outcome.
fn batch_fingerprint(terms: &[NewTerm]) -> String {
    let mut h = cursor::Fnv::new();
    for term in terms {
        let (op, value) = match term.score {
            ScoreChange::Keep => (0u8, 0.0),
            ScoreChange::Set(v) => (1, v),
            ScoreChange::Increment(v) => (2, v),
        };
        h.write(&(term.text.id.len() as u64).to_be_bytes());
        h.write(term.text.id.as_bytes());
        h.write(&(term.text.display.len() as u64).to_be_bytes());
        h.write(term.text.display.as_bytes());
        h.write(&[op]);
        h.write(&value.to_bits().to_be_bytes());
        match &term.payload {
            None => h.write(&[0]),
            Some(p) => {
                h.write(&[1]);
                h.write(&(p.len() as u64).to_be_bytes());
                h.write(p);
            }
        }
    }
    format!("{:016x}:{}", h.finish(), terms.len())
}

/// An entry's outcome as a step reports it: whether it added the term, and the score after it.
fn outcome(v: &Value) -> Result<(bool, f64), Error> {
    let raw = bytes(v)?;
    let (how, score) = raw.split_first().ok_or_else(|| unexpected("outcome"))?;
    let score = std::str::from_utf8(score)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or_else(|| unexpected("score"))?;
    match how {
        b'a' => Ok((true, score)),
        b'u' => Ok((false, score)),
        _ => Err(unexpected("outcome")),
    }
}

/// What an `Add` did.
#[derive(Debug, Clone, PartialEq)]
pub struct Added {
    /// Entries that created a term.
    pub added: u32,
    /// Entries that updated a term.
    pub updated: u32,
    /// Each entry's resulting score, in order.
    pub scores: Vec<f64>,
    /// Terms in the dictionary afterwards.
    pub term_count: u64,
}

/// The optional indexes of a dictionary, and so the queries it serves beyond lexicographic
/// prefix, exact and fuzzy completion. A dictionary that never declared them has every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// Ranked sets: completion by score (but in fuzzy mode).
    pub ranked: bool,
    /// Word postings and the vocabulary: word-prefix mode.
    pub words: bool,
    /// Gram sets of the vocabulary: suffix, contains and automatic modes (needs `words`).
    pub substring: bool,
}

impl Features {
    /// Every feature: what a dictionary that never declared its features has.
    pub const ALL: Self = Self {
        ranked: true,
        words: true,
        substring: true,
    };

    /// The features as the scripts keep them: letters in the order `rws`.
    pub fn letters(self) -> String {
        let mut s = String::new();
        for (on, c) in [(self.ranked, 'r'), (self.words, 'w'), (self.substring, 's')] {
            if on {
                s.push(c);
            }
        }
        s
    }

    /// The features' names in the proto, comma-separated (`none` for none).
    pub fn names(self) -> String {
        let names: Vec<&str> = [
            (self.ranked, "RANKED"),
            (self.words, "WORDS"),
            (self.substring, "SUBSTRING"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }

    /// The features named by `letters`.
    fn from_letters(letters: &[u8]) -> Self {
        Self {
            ranked: letters.contains(&b'r'),
            words: letters.contains(&b'w'),
            substring: letters.contains(&b's'),
        }
    }

    /// The features a query in `mode` and `order` needs, as letters.
    pub fn needed(mode: MatchMode, order: Order) -> &'static str {
        let score = order == Order::Score;
        match mode {
            MatchMode::Fuzzy => "",
            MatchMode::Prefix if score => "r",
            MatchMode::Prefix => "",
            MatchMode::WordPrefix if score => "wr",
            MatchMode::WordPrefix => "w",
            _ if score => "wsr",
            _ => "ws",
        }
    }
}

/// A dictionary's size and features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Description {
    /// Terms in the dictionary.
    pub term_count: u64,
    /// The features it serves.
    pub features: Features,
    /// Whether `Configure` declared them (else the dictionary has every one).
    pub declared: bool,
    /// The change of features under way, if any.
    pub change: Option<FeatureChange>,
}

/// A change of a dictionary's features under way: indexes built or deleted in steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureChange {
    /// The features the dictionary will have.
    pub target: Features,
    /// The feature whose index is being built (`r`, `w` or `s`), if any.
    pub building: Option<u8>,
    /// Terms (`r`, `w`) or vocabulary words (`s`) the build indexed so far.
    pub indexed: u64,
    /// The features whose keys are being deleted.
    pub dropping: Features,
}

/// How long a Baton driving a change of features holds its lease without a step: another Baton
/// takes the change over once it lapses (a Baton that died mid-change).
pub const CHANGE_LEASE: Duration = Duration::from_secs(5);
/// How often one Baton looks, at most, whether a change of a dictionary's features that its
/// writes or reads found under way has a driver (a driver that died leaves its lease to lapse
/// within [`CHANGE_LEASE`]); it drives the change itself when none does.
pub const CHANGE_CHECK: Duration = CHANGE_LEASE;
/// Terms, words or sets one step of a change of features covers at most (fewer when their
/// postings, gram sets or ranked sets would pass [`STEP_WORK`]).
pub const CHANGE_STEP: usize = 64;

/// A query refused because the dictionary lacks feature `letter` (a script's answer), perhaps
/// being built (`progress`: terms indexed so far, or empty).
fn missing_feature(
    mode: MatchMode,
    order: Order,
    letter: &Value,
    progress: Option<&Value>,
) -> Error {
    let progress = progress
        .and_then(|p| bytes(p).ok())
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(&p).into_owned());
    let letter = bytes(letter).ok().and_then(|b| b.first().copied());
    let (feature, what) = match letter {
        Some(b'r') => (
            "AUTOCOMPLETE_FEATURE_RANKED",
            format!("order {}", order.proto_name()),
        ),
        Some(b'w') => (
            "AUTOCOMPLETE_FEATURE_WORDS",
            format!("mode {}", mode.proto_name()),
        ),
        Some(b's') => (
            "AUTOCOMPLETE_FEATURE_SUBSTRING",
            format!("mode {}", mode.proto_name()),
        ),
        _ => return unexpected("missing feature"),
    };
    Error::FailedPrecondition(match progress {
        Some(n) => format!(
            "{what} needs the dictionary's feature {feature}, whose index is being built ({n} \
             indexed so far; Describe shows the progress): try again once it is"
        ),
        None => format!(
            "{what} needs the dictionary's feature {feature}, which it does not keep: declare it \
             with Configure"
        ),
    })
}

/// How a query must match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchMode {
    /// The term starts with the query.
    Prefix,
    /// A word of the term starts with the query.
    WordPrefix,
    /// The term ends with the query.
    Suffix,
    /// The term contains the query.
    Contains,
    /// Exact, then prefix, then word-prefix, then contains matches.
    Automatic,
    /// A prefix of the term is within a few edits of the query.
    Fuzzy,
}

impl MatchMode {
    fn name(self) -> &'static str {
        match self {
            Self::Prefix => "prefix",
            Self::WordPrefix => "word",
            Self::Suffix => "suffix",
            Self::Contains => "contains",
            Self::Automatic => "auto",
            Self::Fuzzy => "fuzzy",
        }
    }

    /// The mode's name in the proto.
    fn proto_name(self) -> &'static str {
        match self {
            Self::Prefix => "AUTOCOMPLETE_MATCH_MODE_PREFIX",
            Self::WordPrefix => "AUTOCOMPLETE_MATCH_MODE_WORD_PREFIX",
            Self::Suffix => "AUTOCOMPLETE_MATCH_MODE_SUFFIX",
            Self::Contains => "AUTOCOMPLETE_MATCH_MODE_CONTAINS",
            Self::Automatic => "AUTOCOMPLETE_MATCH_MODE_AUTOMATIC",
            Self::Fuzzy => "AUTOCOMPLETE_MATCH_MODE_FUZZY",
        }
    }
}

/// How completions are sorted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// By matching form, then by id, in code point order.
    Lexicographic,
    /// By score, highest first, then lexicographically.
    Score,
}

impl Order {
    fn name(self) -> &'static str {
        match self {
            Self::Lexicographic => "lex",
            Self::Score => "score",
        }
    }

    /// The order's name in the proto.
    fn proto_name(self) -> &'static str {
        match self {
            Self::Lexicographic => "AUTOCOMPLETE_ORDER_LEXICOGRAPHIC",
            Self::Score => "AUTOCOMPLETE_ORDER_SCORE",
        }
    }
}

/// How a result matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchKind {
    /// Equal to the query.
    Exact,
    /// Starts with the query.
    Prefix,
    /// A later word starts with the query.
    WordPrefix,
    /// Ends with the query.
    Suffix,
    /// Contains the query elsewhere.
    Contains,
    /// A prefix is within 1 or 2 edits of the query.
    Fuzzy,
}

impl MatchKind {
    fn from_script(v: i64) -> Result<Self, Error> {
        Ok(match v {
            1 => Self::Exact,
            2 => Self::Prefix,
            3 => Self::WordPrefix,
            4 => Self::Suffix,
            5 => Self::Contains,
            6 => Self::Fuzzy,
            _ => return Err(unexpected("match kind")),
        })
    }
}

/// Groups of the automatic mode, in order, numbered as their match kinds.
const AUTO_GROUPS: [u8; 4] = [1, 2, 3, 5];

/// A completion request, already validated.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The query's matching form ([`text::query_form`]); not empty.
    pub query: String,
    /// How it must match.
    pub mode: MatchMode,
    /// How results are sorted.
    pub order: Order,
    /// Most results.
    pub limit: u32,
    /// The previous page's token, or empty.
    pub page_token: String,
    /// Fuzzy mode: the most edits a match may need, as asked (`None`: as the query allows).
    pub max_edits: Option<u32>,
}

/// The most edits a fuzzy query of `chars` characters allows.
pub fn fuzzy_edits(chars: usize) -> u32 {
    if chars >= FUZZY_TWO_EDITS_FROM {
        2
    } else if chars >= FUZZY_ONE_EDIT_FROM {
        1
    } else {
        0
    }
}

/// One completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Suggestion {
    /// The display text as last added.
    pub display: String,
    /// The score.
    pub score: f64,
    /// The payload (empty when none).
    pub payload: Vec<u8>,
    /// How it matched.
    pub kind: MatchKind,
    /// Fuzzy mode: the edits from a prefix of the term to the query (0 in other modes).
    pub distance: u32,
}

/// One page of results.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The results.
    pub items: Vec<T>,
    /// The token of the next page; empty when there are no more results.
    pub next_page_token: String,
    /// Fuzzy mode: the call stopped at its work budget, so matches may be missing.
    pub incomplete: bool,
}

/// One item of a recent list.
#[derive(Debug, Clone, PartialEq)]
pub struct RecentItem {
    /// The display text as last recorded.
    pub display: String,
    /// The payload (empty when none).
    pub payload: Vec<u8>,
    /// When it was last recorded (Redis clock).
    pub recorded_at: SystemTime,
    /// How it matched (completion only).
    pub kind: Option<MatchKind>,
}

/// What a `RecordRecent` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// Items in the list afterwards.
    pub size: u32,
    /// Items dropped beyond the cap.
    pub evicted: u32,
    /// When the item was recorded (Redis clock).
    pub recorded_at: SystemTime,
}

/// The autocomplete primitive. Cheap to clone.
#[derive(Clone)]
pub struct Autocomplete {
    inner: Arc<Inner>,
}

struct Inner {
    redis: Redis,
    /// Per dictionary (its key base), the features its writes need, as the last write step said.
    write_features: std::sync::Mutex<std::collections::HashMap<String, Features>>,
    /// Per dictionary (its key base), when this Baton last looked for a driver of a change of its
    /// features under way ([`CHANGE_CHECK`]).
    change_checks: std::sync::Mutex<std::collections::HashMap<String, Instant>>,
    /// Cancelled when Baton shuts down: drivers of changes of features then give their lease
    /// back, so that another Baton takes the change over at once.
    stop: CancellationToken,
    /// The drivers of changes of features, which shutdown waits for (their lease given back).
    drivers: TaskTracker,
    add: Script,
    scores: Script,
    remove: Script,
    complete: Script,
    prefix: Script,
    ranked: Script,
    fuzzy: Script,
    configure: Script,
    change: Script,
    record: Script,
    forget: Script,
    list: Script,
    complete_recent: Script,
}

impl Autocomplete {
    /// Dictionaries and recent lists stored in `redis`, never shut down.
    pub fn new(redis: Redis) -> Self {
        Self::with_shutdown(redis, CancellationToken::new(), TaskTracker::new())
    }

    /// Dictionaries and recent lists stored in `redis`: once `stop` is cancelled, the changes of
    /// features this Baton drives stop after their current step and give their lease back, in
    /// tasks of `drivers` (which shutdown waits for), and no new one starts.
    pub fn with_shutdown(redis: Redis, stop: CancellationToken, drivers: TaskTracker) -> Self {
        Self {
            inner: Arc::new(Inner {
                redis,
                write_features: std::sync::Mutex::default(),
                change_checks: std::sync::Mutex::default(),
                stop,
                drivers,
                add: Script::new(scripts::ADD),
                scores: Script::new(scripts::SCORES),
                remove: Script::new(scripts::REMOVE),
                complete: Script::new(scripts::COMPLETE),
                prefix: Script::new(scripts::PREFIX),
                ranked: Script::new(scripts::RANKED),
                fuzzy: Script::new(scripts::FUZZY),
                configure: Script::new(scripts::CONFIGURE),
                change: Script::new(scripts::CHANGE),
                record: Script::new(scripts::RECENT_RECORD),
                forget: Script::new(scripts::RECENT_REMOVE),
                list: Script::new(scripts::RECENT_LIST),
                complete_recent: Script::new(scripts::RECENT_COMPLETE),
            }),
        }
    }

    /// The keys of dictionary `name`.
    pub fn dictionary_keys(&self, name: &str) -> DictionaryKeys {
        DictionaryKeys::new(self.inner.redis.key_prefix(), name)
    }

    /// The keys of recent list `name`.
    pub fn recent_keys(&self, name: &str) -> RecentKeys {
        RecentKeys::new(self.inner.redis.key_prefix(), name)
    }

    /// The features the last write step to dictionary `keys` said its writes need (every one
    /// when no step said): what the next batch is planned for. A hint only: a step planned for
    /// fewer than Redis says changes nothing and is planned again.
    fn write_features(&self, keys: &DictionaryKeys) -> Features {
        let hints = self
            .inner
            .write_features
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        hints.get(&keys.base).copied().unwrap_or(Features::ALL)
    }

    /// Notes the features a write step said writes to `dictionary` (whose keys are `keys`) need,
    /// and returns them. A `+` after the letters says a change of its features is under way:
    /// its driver is looked for ([`Self::resume_change`]).
    fn note_write_features(
        &self,
        dictionary: &str,
        keys: &DictionaryKeys,
        needs: &Value,
    ) -> Result<Features, Error> {
        let letters = bytes(needs)?;
        if letters.contains(&b'+') {
            self.resume_change(dictionary, keys);
        }
        let needs = Features::from_letters(&letters);
        let mut hints = self
            .inner
            .write_features
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if hints.len() >= WRITE_HINTS && !hints.contains_key(&keys.base) {
            hints.clear();
        }
        hints.insert(keys.base.clone(), needs);
        Ok(needs)
    }

    /// Adds or updates `terms`, in order, in steps of a few entries ([`STEP_WORK`]), each one
    /// atomic script call. Nothing changes when one entry's resulting score would be out of range
    /// (`InvalidArgument` on `terms[i].score`), unless a concurrent change pushes it out of range
    /// after the check made before the first step: then the steps before it stay applied.
    ///
    /// With a `record`, Redis remembers what each step did under the request id for the
    /// record's lifetime: the same batch sent again with the same id (after an error, or while
    /// the first call still runs) applies only what no call applied yet, and answers as one
    /// application would.
    ///
    /// Nothing is sent to Redis at or after `stop_by` (the caller's deadline, less a margin), nor
    /// is a step's answer awaited past it: the batch then fails `Unavailable` with its first
    /// steps applied (the one in flight perhaps too), in time for the caller to hear it.
    pub async fn add(
        &self,
        dictionary: &str,
        terms: &[NewTerm],
        record: Option<&Record>,
        stop_by: Option<Instant>,
    ) -> Result<Added, Error> {
        let keys = self.dictionary_keys(dictionary);
        let hint = self.write_features(&keys);
        let mut batch = AddBatch::new(keys, terms, record, hint);
        if terms
            .iter()
            .any(|t| matches!(t.score, ScoreChange::Increment(_)))
        {
            self.check_scores(&batch, stop_by).await?;
        }
        let mut outcomes: Vec<Option<(bool, f64)>> = vec![None; terms.len()];
        let mut term_count = 0;
        // `cut`: after a step refused as too much work, the entry that brings the work (the
        // entries before it go without it) and the most entries the step it starts may take.
        let (mut at, mut cut, mut wide) = (0, None, false);
        while at < terms.len() {
            let end = match cut {
                Some((from, most)) if from == at => next_step(&batch.planned[at..], most) + at,
                Some((from, _)) if from > at => {
                    (next_step(&batch.planned[at..], STEP_ENTRIES) + at).min(from)
                }
                _ => next_step(&batch.planned[at..], STEP_ENTRIES) + at,
            };
            let invocation = batch.step(&self.inner.add, at, end, wide);
            let reply: Vec<Value> = self.eval_by(&invocation, stop_by, at, terms.len()).await?;
            let [status, rest @ ..] = reply.as_slice() else {
                return Err(unexpected("add reply"));
            };
            match (int(status)?, rest) {
                (0, [count, work, needs, results @ ..]) if results.len() == end - at => {
                    term_count = count_u64(count)?;
                    note_step_work(work)?;
                    for (slot, result) in outcomes[at..end].iter_mut().zip(results) {
                        *slot = Some(outcome(result)?);
                    }
                    (at, wide) = (end, false);
                    cut = cut.filter(|&(from, _)| from >= at);
                    let needs = self.note_write_features(dictionary, &batch.keys, needs)?;
                    if needs != batch.features && at < terms.len() {
                        batch.replan(at, needs);
                    }
                }
                (6, [needs]) => {
                    let needs = self.note_write_features(dictionary, &batch.keys, needs)?;
                    batch.replan(at, needs);
                }
                (1, [entry]) => {
                    let i =
                        at + usize::try_from(int(entry)? - 1).map_err(|_| unexpected("entry"))?;
                    let applied = if at == 0 {
                        String::new()
                    } else {
                        format!(" (a concurrent change; the first {at} entries were applied)")
                    };
                    return Err(Error::invalid(
                        term_field(i, TermPart::Score),
                        format!("the resulting score would be outside ±{MAX_ABS_SCORE:e}{applied}"),
                    ));
                }
                (2, []) => wide = true,
                (3, [fits]) => {
                    let fits = usize::try_from(int(fits)?).map_err(|_| unexpected("fits"))?;
                    let (fits, rest) = after_refusal(end - at, fits);
                    cut = Some((at + fits, rest));
                }
                (4, [done]) => {
                    at = usize::try_from(int(done)?).map_err(|_| unexpected("record"))?;
                    at = at.min(terms.len());
                }
                (5, []) => {
                    return Err(Error::invalid(
                        "request_id",
                        format!(
                            "was used with another batch for this dictionary (ids are remembered \
                             for {})",
                            humantime::format_duration(record.map_or(REQUEST_MEMORY, |r| r.memory))
                        ),
                    ));
                }
                _ => return Err(unexpected("add reply")),
            }
        }
        let mut added = Added {
            added: 0,
            updated: 0,
            scores: Vec::with_capacity(terms.len()),
            term_count,
        };
        for o in outcomes {
            let (new, score) = o.ok_or_else(|| unexpected("add outcome"))?;
            if new {
                added.added += 1;
            } else {
                added.updated += 1;
            }
            added.scores.push(score);
        }
        Ok(added)
    }

    /// Runs a script of a batch whose first `applied` of `entries` entries are applied, waiting
    /// for its answer until `stop_by` at most.
    async fn eval_by<T: redis::FromRedisValue>(
        &self,
        invocation: &ScriptInvocation<'_>,
        stop_by: Option<Instant>,
        applied: usize,
        entries: usize,
    ) -> Result<T, Error> {
        let Some(stop_by) = stop_by else {
            return self.inner.redis.eval(invocation).await;
        };
        // Checked first: a timeout already past would still send the call on its first poll.
        if Instant::now() < stop_by
            && let Ok(reply) =
                tokio::time::timeout_at(stop_by, self.inner.redis.eval(invocation)).await
        {
            return reply;
        }
        Err(Error::Unavailable(format!(
            "the batch did not end before the caller's deadline ({applied} of {entries} entries \
             applied, and perhaps the step in flight)"
        )))
    }

    /// Checks, before the first step of a batch with increments, that no resulting score would
    /// be out of range.
    async fn check_scores(
        &self,
        batch: &AddBatch<'_>,
        stop_by: Option<Instant>,
    ) -> Result<(), Error> {
        let terms = batch.terms;
        let incremented: std::collections::HashSet<&str> = terms
            .iter()
            .filter(|t| matches!(t.score, ScoreChange::Increment(_)))
            .map(|t| t.text.id.as_str())
            .collect();
        let checked: Vec<usize> = (0..terms.len())
            .filter(|i| incremented.contains(terms[*i].text.id.as_str()))
            .collect();
        let invocation = scripts::Scores {
            keys: &batch.keys,
            record: batch.record_key.as_deref(),
            fingerprint: batch.fingerprint.as_deref().unwrap_or(""),
        }
        .invocation(
            &self.inner.scores,
            checked
                .iter()
                .map(|i| (terms[*i].text.id.as_str(), terms[*i].score)),
        );
        let reply: i64 = self.eval_by(&invocation, stop_by, 0, terms.len()).await?;
        if reply == 0 {
            return Ok(());
        }
        let i = usize::try_from(reply - 1)
            .ok()
            .and_then(|n| checked.get(n))
            .ok_or_else(|| unexpected("score check"))?;
        Err(Error::invalid(
            term_field(*i, TermPart::Score),
            format!("the resulting score would be outside ±{MAX_ABS_SCORE:e}"),
        ))
    }

    /// Removes the terms with these texts' ids, in steps of a few terms ([`STEP_WORK`]), each one
    /// atomic script call; returns how many were there and the terms left. A batch cut short by
    /// an error leaves its first steps applied: removing the same terms again is harmless.
    pub async fn remove(&self, dictionary: &str, texts: &[Text]) -> Result<(u32, u64), Error> {
        let keys = self.dictionary_keys(dictionary);
        let words: Vec<Vec<&str>> = texts.iter().map(|t| text::words(&t.key)).collect();
        let forms = || texts.iter().map(|t| t.key.as_str());
        let mut features = self.write_features(&keys);
        let mut planned = plan(&keys, forms(), &words, features);
        let (mut removed, mut term_count) = (0, 0);
        let (mut at, mut wide) = (0, false);
        while at < texts.len() {
            let end = next_step(&planned[at..], STEP_ENTRIES) + at;
            let wide_sets = wide.then(|| keys.first_byte_sets());
            let touched = declared(&planned[at..end], wide_sets.as_deref());
            let invocation = scripts::Remove {
                keys: &keys,
                touched: &touched,
                wide,
                features: &features.letters(),
            }
            .invocation(
                &self.inner.remove,
                texts[at..end]
                    .iter()
                    .zip(&words[at..end])
                    .map(|(text, words)| scripts::RemoveEntry {
                        id: &text.id,
                        key: &text.key,
                        words: if features.words { words } else { &[] },
                    }),
            );
            let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
            let mut needs = None;
            match reply.as_slice() {
                [status, gone, count, work, now] if int(status)? == 0 => {
                    note_step_work(work)?;
                    removed += count_u32(gone)?;
                    term_count = count_u64(count)?;
                    (at, wide) = (end, false);
                    needs = Some(self.note_write_features(dictionary, &keys, now)?);
                }
                [status] if int(status)? == 2 => wide = true,
                [status, now] if int(status)? == 6 => {
                    needs = Some(self.note_write_features(dictionary, &keys, now)?);
                }
                _ => return Err(unexpected("remove reply")),
            }
            if let Some(needs) = needs.filter(|n| *n != features) {
                features = needs;
                planned.truncate(at);
                planned.extend(plan(&keys, forms().skip(at), &words[at..], features));
            }
        }
        Ok((removed, term_count))
    }

    /// A dictionary's size and features.
    pub async fn describe(&self, dictionary: &str) -> Result<Description, Error> {
        let keys = self.dictionary_keys(dictionary);
        // One key per command (not one script): each is answered, or redirected, on its own
        // while the dictionary's slot migrates between Cluster nodes.
        let redis = &self.inner.redis;
        let count: Value = redis.command(redis::cmd("HLEN").arg(&keys.data)).await?;
        let state: Vec<Value> = redis
            .command(
                redis::cmd("HMGET")
                    .arg(&keys.features)
                    .arg(&["s", "g", "b", "n", "d"]),
            )
            .await?;
        let driver: Value = redis.command(redis::cmd("GET").arg(keys.lease())).await?;
        let [letters, target, building, indexed, dropping] = state.as_slice() else {
            return Err(unexpected("describe reply"));
        };
        let declared = !matches!(letters, Value::Nil);
        let indexed = match indexed {
            Value::Nil => 0,
            n => std::str::from_utf8(&bytes(n)?)
                .ok()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| unexpected("indexed"))?,
        };
        let change = match target {
            Value::Nil => None,
            target => Some(FeatureChange {
                target: Features::from_letters(&bytes(target)?),
                building: match building {
                    Value::Nil => None,
                    b => bytes(b)?.first().copied(),
                },
                indexed,
                dropping: match dropping {
                    Value::Nil => Features::from_letters(b""),
                    d => Features::from_letters(&bytes(d)?),
                },
            }),
        };
        if change.is_some() && matches!(driver, Value::Nil) {
            // The Baton that drove the change is gone (or it just ended): go on with it.
            self.drive(dictionary);
        }
        Ok(Description {
            term_count: count_u64(&count)?,
            features: if declared {
                Features::from_letters(&bytes(letters)?)
            } else {
                Features::ALL
            },
            declared,
            change,
        })
    }

    /// A write or a read of `dictionary` (keys `keys`) found a change of its features under way:
    /// at most once per [`CHANGE_CHECK`] per dictionary, looks in the background whether a Baton
    /// holds the change's lease, and drives the change when none does. So a change whose driver
    /// died (its Baton killed or restarted) goes on while the dictionary is used, and does not
    /// wait for the next `Describe` or `Configure`.
    fn resume_change(&self, dictionary: &str, keys: &DictionaryKeys) {
        {
            let mut checks = self
                .inner
                .change_checks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            if checks
                .get(&keys.base)
                .is_some_and(|last| now.duration_since(*last) < CHANGE_CHECK)
            {
                return;
            }
            if checks.len() >= WRITE_HINTS && !checks.contains_key(&keys.base) {
                checks.clear();
            }
            checks.insert(keys.base.clone(), now);
        }
        let this = self.clone();
        let (dictionary, lease) = (dictionary.to_owned(), keys.lease());
        tokio::spawn(async move {
            let driver: Result<Value, Error> = this
                .inner
                .redis
                .command(redis::cmd("GET").arg(&lease))
                .await;
            if matches!(driver, Ok(Value::Nil)) {
                this.drive(&dictionary);
            }
        });
    }

    /// Drives the change of `dictionary`'s features under way, in the background, unless another
    /// Baton holds its lease or this one is shutting down.
    pub fn drive(&self, dictionary: &str) {
        if self.inner.stop.is_cancelled() {
            return;
        }
        let this = self.clone();
        let dictionary = dictionary.to_owned();
        self.inner.drivers.spawn(async move {
            if let Err(error) = this.run_change(&dictionary).await {
                tracing::warn!(%dictionary, %error, "a change of autocomplete features stopped; the next Describe, Configure or write of the dictionary resumes it");
            }
        });
    }

    /// Takes the change's lease and runs its steps until the change is over or the lease lost.
    async fn run_change(&self, dictionary: &str) -> Result<(), Error> {
        let keys = self.dictionary_keys(dictionary);
        let owner = uuid::Uuid::new_v4().to_string();
        let lease_ms = u64::try_from(CHANGE_LEASE.as_millis()).unwrap_or(u64::MAX);
        // The first step takes the lease unless another driver holds it (it then answers -2).
        // Steps refused because the range moved under them (busy writers) are read again; this
        // many in a row stops the driver (the next Describe, Configure or write resumes the change).
        let mut refused = 0;
        // A RANKED build step covers at most `most` terms, and declares every first-byte set
        // when `wide` (the step said it needs them).
        // After a step refused as too much work, `then` is what the step after the next covers:
        // the next covers the terms that fit, the one after it half of the rest, from the term
        // that brings the work.
        let (mut most, mut then, mut wide) = (CHANGE_STEP, CHANGE_STEP, false);
        loop {
            if self.inner.stop.is_cancelled() {
                // Shutting down: the lease goes back (if this driver holds it), so that another
                // Baton resumes the change at its next look instead of after the lease lapses.
                let release: &[&[u8]] = &[b"release"];
                let invocation =
                    scripts::change(&self.inner.change, &keys, &owner, lease_ms, &[], release);
                let _: Vec<Value> = self.inner.redis.eval(&invocation).await?;
                return Ok(());
            }
            let (touched, args) = self.next_change_step(&keys, most, wide).await?;
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let invocation =
                scripts::change(&self.inner.change, &keys, &owner, lease_ms, &touched, &args);
            let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
            match reply.first().map(int).transpose()? {
                Some(1) => {
                    if let Some(work) = reply.get(1) {
                        note_step_work(work)?;
                        HEAVIEST_BUILD_STEP
                            .fetch_max(count_u64(work)?, std::sync::atomic::Ordering::Relaxed);
                    }
                    (refused, most, then, wide) = (0, then, CHANGE_STEP, false);
                }
                Some(3) => {
                    let fits = reply.get(1).map(int).transpose()?.unwrap_or(0);
                    let fits = usize::try_from(fits).map_err(|_| unexpected("fits"))?;
                    (most, then) = match after_refusal(most, fits) {
                        (0, rest) => (rest, CHANGE_STEP),
                        (fits, rest) => (fits, rest),
                    };
                }
                Some(4) => wide = true,
                Some(0) if refused < 100 => refused += 1,
                Some(0) => {
                    return Err(Error::Unavailable(
                        "the change's steps kept being refused".into(),
                    ));
                }
                Some(2 | -2) => return Ok(()),
                _ => return Err(unexpected("change reply")),
            }
        }
    }

    /// Reads what the next step of the change of `keys`'s features covers: the keys it touches
    /// and its arguments (change.lua). A step of a RANKED build covers at most `most` terms and
    /// declares every first-byte set when `wide`.
    async fn next_change_step(
        &self,
        keys: &DictionaryKeys,
        most: usize,
        wide: bool,
    ) -> Result<(Vec<String>, Vec<Vec<u8>>), Error> {
        let redis = &self.inner.redis;
        let state: Vec<Option<Vec<u8>>> = redis
            .command(
                redis::cmd("HMGET")
                    .arg(&keys.features)
                    .arg(&["g", "b", "c", "d", "dc"]),
            )
            .await?;
        let field = |i: usize| state.get(i).cloned().flatten();
        let Some(_) = field(0) else {
            // No change under way: the step says so and releases the lease.
            return Ok((Vec::new(), vec![b"drop-r".to_vec()]));
        };
        let dropping = field(3).unwrap_or_default();
        let mut touched = Vec::new();
        let mut args: Vec<Vec<u8>> = Vec::new();
        let grams_of = |words: &[String], touched: &mut Vec<String>| -> Vec<Vec<u8>> {
            let mut out = Vec::new();
            for w in words {
                for g in text::grams(w) {
                    touched.push(keys.vocab_gram(g));
                    out.push(g.as_bytes().to_vec());
                }
            }
            out
        };
        if dropping.contains(&b'r') {
            let fields: Vec<String> = redis.command(redis::cmd("HKEYS").arg(&keys.heavy)).await?;
            args.push(b"drop-r".to_vec());
            for name in fields
                .into_iter()
                .filter(|f| f.starts_with("b:") || f.starts_with("r:") || f.starts_with("t:"))
                .take(CHANGE_STEP)
            {
                touched.push(format!("{}:{name}", keys.base));
                args.push(name.into_bytes());
            }
        } else if dropping.contains(&b'w') {
            let words: Vec<String> = redis
                .command(
                    redis::cmd("ZRANGE")
                        .arg(&keys.vocab)
                        .arg(0)
                        .arg(CHANGE_STEP - 1),
                )
                .await?;
            let mut words = words;
            if dropping.contains(&b's') {
                // Each word's gram sets go with it: as many words as fit a step's work.
                words.truncate(within_work(words.iter().map(|w| 2 + text::grams(w).len())));
            }
            args.push(b"drop-w".to_vec());
            args.push(words.len().to_string().into_bytes());
            for w in &words {
                touched.push(keys.word(w));
                args.push(w.as_bytes().to_vec());
            }
            if dropping.contains(&b's') {
                args.extend(grams_of(&words, &mut touched));
            }
        } else if dropping.contains(&b's') {
            let from = field(4).unwrap_or_default();
            let mut words = self.words_after(keys, &from).await?;
            let fit = within_work(words.iter().map(|w| 1 + text::grams(w).len()));
            let all = words.len() < CHANGE_STEP && fit == words.len();
            words.truncate(fit);
            args.push(b"drop-s".to_vec());
            args.push(from);
            args.push(if all {
                Vec::new()
            } else {
                words
                    .last()
                    .map(|w| w.as_bytes().to_vec())
                    .unwrap_or_default()
            });
            args.extend(grams_of(&words, &mut touched));
        } else if let Some(building) = field(1) {
            let cursor = field(2).unwrap_or_default();
            if building == b"r" {
                let (lex, members) = self.terms_after(keys, &cursor, most).await?;
                // As many terms as fit a step's work, each planned as an Add of a new term to
                // the ranked sets: its lex member and data read, and per ranked set (and its deep
                // set and top) a field, a count and a member (`entry_work`).
                let forms: Vec<String> = members.iter().map(|m| member_form(m)).collect();
                let costs: Vec<usize> = forms
                    .iter()
                    .map(|f| 2 + 4 * (keys.ranked_sets_of(f).len() + 2))
                    .collect();
                let k = within_work(costs.iter().copied()).min(members.len());
                let planned: usize = costs[..k].iter().sum();
                touched.push(lex);
                for form in &forms[..k] {
                    touched.extend(keys.ranked_sets_of(form));
                    touched.extend(keys.deep_set_of(form));
                }
                if wide {
                    touched.extend(keys.first_byte_sets());
                }
                args.push(b"build-r".to_vec());
                for n in [HEAVY_PREFIX, MAX_RANKED_DEPTH, TOP_RANKED, DEEP_RANKED] {
                    args.push(n.to_string().into_bytes());
                }
                args.push(cursor);
                args.push(
                    (STEP_WORK + CUT_RESERVE)
                        .saturating_sub(planned)
                        .to_string()
                        .into_bytes(),
                );
                args.push(if wide { b"1".to_vec() } else { Vec::new() });
                args.push(k.to_string().into_bytes());
                args.extend(members.into_iter().take(k));
            } else if building == b"w" {
                let (lex, members) = self.terms_after(keys, &cursor, CHANGE_STEP).await?;
                // As many terms as fit a step's work: a posting and a vocabulary entry a word.
                let mut members = members;
                members.truncate(within_work(
                    members
                        .iter()
                        .map(|m| 1 + 2 * text::words(&member_form(m)).len()),
                ));
                touched.push(lex);
                args.push(b"build-w".to_vec());
                args.push(cursor);
                args.push(members.len().to_string().into_bytes());
                for m in members {
                    let form = member_form(&m);
                    let words = text::words(&form);
                    args.push(m);
                    args.push(words.len().to_string().into_bytes());
                    for w in words {
                        touched.push(keys.word(w));
                        args.push(w.as_bytes().to_vec());
                    }
                }
            } else {
                let mut words = self.words_after(keys, &cursor).await?;
                // As many words as fit a step's work: a gram set a gram.
                words.truncate(within_work(words.iter().map(|w| 1 + text::grams(w).len())));
                args.push(b"build-s".to_vec());
                args.push(cursor);
                args.push(words.len().to_string().into_bytes());
                for w in &words {
                    let grams = text::grams(w);
                    args.push(w.as_bytes().to_vec());
                    args.push(grams.len().to_string().into_bytes());
                    for g in grams {
                        touched.push(keys.vocab_gram(g));
                        args.push(g.as_bytes().to_vec());
                    }
                }
            }
        } else {
            // Nothing left: the step ends the change.
            args.push(b"drop-r".to_vec());
        }
        touched.sort();
        touched.dedup();
        Ok((touched, args))
    }

    /// The lex set of the build cursor `cursor`'s first byte and its first `limit` lex members
    /// after the cursor (a build walks the lex sets one after the other).
    async fn terms_after(
        &self,
        keys: &DictionaryKeys,
        cursor: &[u8],
        limit: usize,
    ) -> Result<(String, Vec<Vec<u8>>), Error> {
        let lex = keys.lex(cursor.first().copied().unwrap_or(1));
        let members = self
            .inner
            .redis
            .command(
                redis::cmd("ZRANGE")
                    .arg(&lex)
                    .arg([b"(".as_slice(), cursor].concat())
                    .arg("+")
                    .arg("BYLEX")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(limit),
            )
            .await?;
        Ok((lex, members))
    }

    /// The first [`CHANGE_STEP`] vocabulary words after `from` (all from the first when empty).
    async fn words_after(&self, keys: &DictionaryKeys, from: &[u8]) -> Result<Vec<String>, Error> {
        let start = if from.is_empty() {
            b"-".to_vec()
        } else {
            [b"(".as_slice(), from].concat()
        };
        self.inner
            .redis
            .command(
                redis::cmd("ZRANGE")
                    .arg(&keys.vocab)
                    .arg(start)
                    .arg("+")
                    .arg("BYLEX")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(CHANGE_STEP),
            )
            .await
    }

    /// Gives a dictionary `features`: at once while it is empty (the features stay when its last
    /// term goes); on a dictionary with other features and terms, starts a change (indexes
    /// built or deleted in the background, driven by this Baton) and answers its progress.
    /// `FailedPrecondition` while a change to other features is under way.
    pub async fn configure(
        &self,
        dictionary: &str,
        features: Features,
    ) -> Result<Description, Error> {
        let keys = self.dictionary_keys(dictionary);
        let letters = features.letters();
        let invocation = scripts::configure(&self.inner.configure, &keys, &letters);
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
        let [status, current, count, target] = reply.as_slice() else {
            return Err(unexpected("configure reply"));
        };
        let term_count = count_u64(count)?;
        let current = Features::from_letters(&bytes(current)?);
        match int(status)? {
            0 => Ok(Description {
                term_count,
                features: current,
                declared: true,
                change: None,
            }),
            2 => {
                self.drive(dictionary);
                self.describe(dictionary).await
            }
            3 => Err(Error::FailedPrecondition(format!(
                "a change of the dictionary's features to {} is under way: wait for it to end \
                 (Describe shows its progress)",
                Features::from_letters(&bytes(target)?).names()
            ))),
            _ => Err(unexpected("configure reply")),
        }
    }

    /// One page of a dictionary's completions.
    pub async fn complete(
        &self,
        dictionary: &str,
        request: &Completion,
    ) -> Result<Page<Suggestion>, Error> {
        if request.mode == MatchMode::Fuzzy {
            return self.complete_fuzzy(dictionary, request).await;
        }
        let scope = Scope {
            call: "complete",
            name: dictionary,
            query: &request.query,
            mode: request.mode.name(),
            order: request.order.name(),
        };
        let start = cursor::decode("page_token", &scope, &request.page_token)?;
        let (group, position) = match start {
            Some(c) => {
                if request.mode == MatchMode::Automatic && !AUTO_GROUPS.contains(&c.group) {
                    return Err(corrupt_token());
                }
                (c.group, c.position)
            }
            None => (AUTO_GROUPS[0], Vec::new()),
        };
        let keys = self.dictionary_keys(dictionary);
        // Prefix queries, the most common, have scripts of their own (prefix.lua, ranked.lua):
        // the same results as complete.lua's, with less for Redis to run per call.
        let prefix = scripts::Prefix {
            keys: &keys,
            query: &request.query,
            limit: request.limit,
            position: &position,
        };
        let invocation = match (request.mode, request.order) {
            (MatchMode::Prefix, Order::Lexicographic) => prefix.lexicographic(&self.inner.prefix),
            (MatchMode::Prefix, Order::Score) => prefix.ranked(&self.inner.ranked),
            _ => scripts::Complete {
                keys: &keys,
                mode: request.mode.name(),
                order: request.order.name(),
                limit: request.limit,
                query: &request.query,
                group,
                position: &position,
                need: Features::needed(request.mode, request.order),
            }
            .invocation(&self.inner.complete),
        };
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
        let [next_group, next_position, rows @ ..] = reply.as_slice() else {
            return Err(unexpected("complete reply"));
        };
        if matches!(next_group, Value::Int(-1)) {
            if rows
                .first()
                .and_then(|p| bytes(p).ok())
                .is_some_and(|p| !p.is_empty())
            {
                // Refused while the feature is being built: make sure the build goes on.
                self.resume_change(dictionary, &keys);
            }
            return Err(missing_feature(
                request.mode,
                request.order,
                next_position,
                rows.first(),
            ));
        }
        let mut items = Vec::with_capacity(rows.len() / 3);
        for row in rows.chunks(3) {
            let [id, value, kind] = row else {
                return Err(unexpected("complete row"));
            };
            let (score, display, payload) = parse_value(id, value)?;
            items.push(Suggestion {
                display,
                score,
                payload,
                kind: MatchKind::from_script(int(kind)?)?,
                distance: 0,
            });
        }
        Ok(Page {
            items,
            next_page_token: next_token(&scope, next_group, next_position)?,
            incomplete: false,
        })
    }

    /// The page of a fuzzy completion (fuzzy.lua): matches within the edits the query allows,
    /// fewest edits first, in one page.
    async fn complete_fuzzy(
        &self,
        dictionary: &str,
        request: &Completion,
    ) -> Result<Page<Suggestion>, Error> {
        if !request.page_token.is_empty() {
            return Err(Error::invalid(
                "page_token",
                "must be empty in FUZZY mode, whose results come in one page",
            ));
        }
        let chars = request.query.chars().count();
        if chars > MAX_FUZZY_CHARS {
            return Err(Error::invalid(
                "query",
                format!(
                    "has {chars} characters when normalized, more than the {MAX_FUZZY_CHARS} \
                     FUZZY mode allows"
                ),
            ));
        }
        let edits = match request.max_edits {
            Some(asked) if asked > MAX_FUZZY_EDITS => {
                return Err(Error::invalid(
                    "max_edits",
                    format!("{asked} is more than the {MAX_FUZZY_EDITS} allowed"),
                ));
            }
            Some(asked) => asked.min(fuzzy_edits(chars)),
            None => fuzzy_edits(chars),
        };
        let keys = self.dictionary_keys(dictionary);
        let mut walk = fuzzy::FuzzyWalk::new(request.limit, request.order);
        while let Some(step) = walk.next_step() {
            let invocation = scripts::Fuzzy {
                keys: &keys,
                order: request.order.name(),
                limit: request.limit,
                max_edits: edits,
                query: &request.query,
                calls: step.calls,
                entries: step.entries,
                stage: step.stage,
                position: &step.position,
                before: step.before,
                have: step.have,
                resume: &step.resume,
                resumed_found: step.resumed_found,
            }
            .invocation(&self.inner.fuzzy);
            let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
            walk.absorb(&reply)?;
        }
        Ok(walk.page())
    }

    /// Records `text` at the front of a recent list kept to `max_items`, living `ttl` from now.
    pub async fn record(
        &self,
        list: &str,
        text: &Text,
        payload: Option<&[u8]>,
        max_items: u32,
        ttl: Duration,
    ) -> Result<Recorded, Error> {
        let keys = self.recent_keys(list);
        let invocation = scripts::RecentRecord {
            keys: &keys,
            id: &text.id,
            key: &text.key,
            display: text.stored_display(),
            payload,
            max_items,
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
        }
        .invocation(&self.inner.record);
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
        match reply.as_slice() {
            [size, evicted, stamp] => Ok(Recorded {
                size: count_u32(size)?,
                evicted: count_u32(evicted)?,
                recorded_at: micros_time(&bytes(stamp)?)?,
            }),
            _ => Err(unexpected("record reply")),
        }
    }

    /// Removes items from a recent list; returns how many were there and the items left.
    pub async fn remove_recent(&self, list: &str, texts: &[Text]) -> Result<(u32, u32), Error> {
        let keys = self.recent_keys(list);
        let invocation = scripts::recent_remove(
            &self.inner.forget,
            &keys,
            texts.iter().map(|t| t.id.as_str()),
        );
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
        match reply.as_slice() {
            [removed, size] => Ok((count_u32(removed)?, count_u32(size)?)),
            _ => Err(unexpected("remove reply")),
        }
    }

    /// One page of a recent list, most recent first.
    pub async fn list_recent(
        &self,
        list: &str,
        limit: u32,
        page_token: &str,
    ) -> Result<Page<RecentItem>, Error> {
        let scope = Scope {
            call: "list-recent",
            name: list,
            query: "",
            mode: "",
            order: "",
        };
        let position = match cursor::decode("page_token", &scope, page_token)? {
            Some(c) => stamp_position(c.position)?,
            None => Vec::new(),
        };
        let keys = self.recent_keys(list);
        let invocation = scripts::recent_list(&self.inner.list, &keys, limit, &position);
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
        let [more, rows @ ..] = reply.as_slice() else {
            return Err(unexpected("list reply"));
        };
        let items = recent_items(rows, false)?;
        let next_page_token = match (int(more)?, rows.chunks(3).last()) {
            (1, Some([_, stamp, _])) => cursor::encode(
                &scope,
                &Cursor {
                    group: 1,
                    position: bytes(stamp)?,
                },
            ),
            _ => String::new(),
        };
        Ok(Page {
            items,
            next_page_token,
            incomplete: false,
        })
    }

    /// One page of a recent list's items matching `query` (a matching form), most recent first.
    pub async fn complete_recent(
        &self,
        list: &str,
        query: &str,
        mode: MatchMode,
        limit: u32,
        page_token: &str,
    ) -> Result<Page<RecentItem>, Error> {
        let scope = Scope {
            call: "complete-recent",
            name: list,
            query,
            mode: mode.name(),
            order: "",
        };
        let (group, position) = match cursor::decode("page_token", &scope, page_token)? {
            Some(c) => {
                if mode == MatchMode::Automatic && !AUTO_GROUPS.contains(&c.group) {
                    return Err(corrupt_token());
                }
                (c.group, stamp_position(c.position)?)
            }
            None => (AUTO_GROUPS[0], Vec::new()),
        };
        let keys = self.recent_keys(list);
        let invocation = scripts::RecentComplete {
            keys: &keys,
            mode: mode.name(),
            limit,
            query,
            group,
            position: &position,
        }
        .invocation(&self.inner.complete_recent);
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
        let [next_group, next_position, rows @ ..] = reply.as_slice() else {
            return Err(unexpected("complete reply"));
        };
        Ok(Page {
            items: recent_items(rows, true)?,
            next_page_token: next_token(&scope, next_group, next_position)?,
            incomplete: false,
        })
    }
}

/// Which part of a batch entry a field name points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TermPart {
    /// `terms[i].display`
    Display,
    /// `terms[i].score`
    Score,
    /// `terms[i].payload`
    Payload,
    /// `displays[i]`
    Removal,
}

/// The proto field name of part of batch entry `i` (e.g. `terms[3].score`), for error details.
pub fn term_field(i: usize, part: TermPart) -> Field {
    if i >= MAX_TERMS {
        return Field::Borrowed(if part == TermPart::Removal {
            "displays"
        } else {
            "terms"
        });
    }
    Field::Owned(match part {
        TermPart::Display => format!("terms[{i}].display"),
        TermPart::Score => format!("terms[{i}].score"),
        TermPart::Payload => format!("terms[{i}].payload"),
        TermPart::Removal => format!("displays[{i}]"),
    })
}

/// The matching form of lex member `member` (`key \0 id`).
fn member_form(member: &[u8]) -> String {
    let end = member.iter().position(|b| *b == 0).unwrap_or(member.len());
    String::from_utf8_lossy(&member[..end]).into_owned()
}

fn corrupt_token() -> Error {
    Error::invalid(
        "page_token",
        "is corrupt: pass a next_page_token exactly as returned",
    )
}

/// A recent list position must be a recorded-at time (digits).
fn stamp_position(position: Vec<u8>) -> Result<Vec<u8>, Error> {
    if position.is_empty() || (position.len() <= 20 && position.iter().all(u8::is_ascii_digit)) {
        Ok(position)
    } else {
        Err(corrupt_token())
    }
}

fn next_token(scope: &Scope<'_>, group: &Value, position: &Value) -> Result<String, Error> {
    let group = u8::try_from(int(group)?).map_err(|_| unexpected("group"))?;
    if group == 0 {
        return Ok(String::new());
    }
    Ok(cursor::encode(
        scope,
        &Cursor {
            group,
            position: bytes(position)?,
        },
    ))
}

fn recent_items(rows: &[Value], with_kind: bool) -> Result<Vec<RecentItem>, Error> {
    let width = if with_kind { 4 } else { 3 };
    let mut items = Vec::with_capacity(rows.len() / width);
    for row in rows.chunks(width) {
        let (id, stamp, value, kind) = match row {
            [id, stamp, value] => (id, stamp, value, None),
            [id, stamp, value, kind] => (id, stamp, value, Some(kind)),
            _ => return Err(unexpected("recent row")),
        };
        // "<key>\0<display>\0<payload>"
        let value = bytes(value)?;
        let mut parts = value.splitn(3, |b| *b == 0);
        let (Some(_), Some(display), Some(payload)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(unexpected("recent item"));
        };
        items.push(RecentItem {
            display: display_or_id(display, id)?,
            payload: payload.to_vec(),
            recorded_at: micros_time(&bytes(stamp)?)?,
            kind: kind
                .map(|k| int(k).and_then(MatchKind::from_script))
                .transpose()?,
        });
    }
    Ok(items)
}

/// Parses a data hash value "<score>\0<display>\0<payload>".
fn parse_value(id: &Value, value: &Value) -> Result<(f64, String, Vec<u8>), Error> {
    let value = bytes(value)?;
    let mut parts = value.splitn(3, |b| *b == 0);
    let (Some(score), Some(display), Some(payload)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(unexpected("term data"));
    };
    let score = std::str::from_utf8(score)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or_else(|| unexpected("score"))?;
    Ok((score, display_or_id(display, id)?, payload.to_vec()))
}

fn display_or_id(display: &[u8], id: &Value) -> Result<String, Error> {
    let raw = if display.is_empty() {
        bytes(id)?
    } else {
        display.to_vec()
    };
    String::from_utf8(raw).map_err(|_| unexpected("display text"))
}

fn micros_time(stamp: &[u8]) -> Result<SystemTime, Error> {
    let micros: u64 = std::str::from_utf8(stamp)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| unexpected("time"))?;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_micros(micros))
}

fn bytes(v: &Value) -> Result<Vec<u8>, Error> {
    match v {
        Value::BulkString(b) => Ok(b.clone()),
        Value::Nil => Ok(Vec::new()),
        _ => Err(unexpected("string")),
    }
}

fn count_u32(v: &Value) -> Result<u32, Error> {
    u32::try_from(int(v)?).map_err(|_| unexpected("count"))
}

fn count_u64(v: &Value) -> Result<u64, Error> {
    u64::try_from(int(v)?).map_err(|_| unexpected("count"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(k: &str) -> &str {
        crate::redis::hash_tag(k).unwrap_or_else(|| panic!("{k} has no hash tag"))
    }

    /// Every key of a dictionary or list carries one hash tag, and names cannot collide.
    #[test]
    fn keys_share_one_hash_tag() {
        for name in ["guild", "}", "{}", "a}b{c", "50%", "ünïcødé 🎸", ""] {
            let keys = DictionaryKeys::new("baton:", name);
            let t = tag(&keys.base);
            for k in [
                &keys.lex(b'a'),
                &keys.lex_of("\u{436}"),
                &keys.data,
                &keys.vocab,
                &keys.heavy,
                &keys.word("}{x"),
                &keys.vocab_gram("}"),
            ] {
                assert_eq!(tag(k), t, "{name}: {k}");
            }
            for k in [
                &keys.ranked("a"),
                &keys.ranked("a}"),
                &keys.ranked("\u{436}"),
                &keys.first_byte(0xd0),
            ] {
                assert_eq!(tag(k), t, "{name}: {k}");
            }
            assert_eq!(keys.ranked("a"), keys.first_byte(b'a'));
            assert!(keys.first_byte(0xd0).ends_with(":b:d0"));
            let recent = RecentKeys::new("baton:", name);
            assert_eq!(tag(&recent.items), tag(&recent.order));
            assert_ne!(tag(&recent.order), t);
        }
        assert_ne!(
            DictionaryKeys::new("p:", "a}b").base,
            DictionaryKeys::new("p:", "a%7Db").base
        );
    }

    /// The ranked and deep sets of a term are those the scripts find (`ranked_prefixes` and
    /// `first_chars` in rank.lua): first byte, then prefixes of 1 and 2 characters longer than a
    /// byte; the deep set of the first 3 characters.
    #[test]
    fn sets_of_a_term() {
        let keys = DictionaryKeys::new("p:", "d");
        let names = |v: Vec<String>| -> Vec<String> {
            v.into_iter()
                .map(|k| k.trim_start_matches("p:{ac:d}:").to_owned())
                .collect()
        };
        assert_eq!(names(keys.ranked_sets_of("a")), ["b:61"]);
        assert_eq!(names(keys.ranked_sets_of("ab")), ["b:61", "r:ab"]);
        assert_eq!(names(keys.ranked_sets_of("abc")), ["b:61", "r:ab"]);
        assert_eq!(names(keys.ranked_sets_of("\u{436}")), ["b:d0", "r:\u{436}"]);
        assert_eq!(
            names(keys.ranked_sets_of("\u{436}xy")),
            ["b:d0", "r:\u{436}", "r:\u{436}x"]
        );
        assert_eq!(keys.deep_set_of("ab"), None);
        assert_eq!(keys.deep_set_of("abc"), Some("p:{ac:d}:t:abc".to_owned()));
        assert_eq!(
            keys.deep_set_of("\u{436}xyz"),
            Some("p:{ac:d}:t:\u{436}xy".to_owned())
        );
        assert_eq!(keys.first_byte_sets().len(), 2 * (127 + 51));
    }

    /// A step takes entries within the work budget, at least one, at most `most`.
    #[test]
    fn steps_stay_within_the_budget() {
        let planned = |works: &[usize]| -> Vec<Planned> {
            works
                .iter()
                .map(|w| Planned {
                    keys: Vec::new(),
                    work: *w,
                })
                .collect()
        };
        assert_eq!(next_step(&planned(&[400, 400, 400]), 64), 2);
        assert_eq!(next_step(&planned(&[5000, 1]), 64), 1);
        assert_eq!(next_step(&planned(&[10; 100]), 64), 64);
        assert_eq!(next_step(&planned(&[10; 100]), 3), 3);
        assert_eq!(next_step(&planned(&[10; 5]), 64), 5);
        // One word of 256 pseudo-random letters: about as many grams as a term can have.
        let mut x = 1u32;
        let long_word: String = (0..256)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                char::from(b'a' + u8::try_from((x >> 16) % 26).unwrap())
            })
            .collect();
        let heaviest = Planned::new(
            &DictionaryKeys::new("p:", "d"),
            &long_word,
            &[&long_word],
            Features::ALL,
        );
        assert!(heaviest.work > 400, "{}", heaviest.work);
        assert!(
            heaviest.work <= STEP_WORK,
            "a step of one: {}",
            heaviest.work
        );
    }

    /// Batch field names point at the entry.
    #[test]
    fn batch_field_names() {
        assert_eq!(term_field(0, TermPart::Display), "terms[0].display");
        assert_eq!(term_field(999, TermPart::Score), "terms[999].score");
        assert_eq!(term_field(7, TermPart::Removal), "displays[7]");
        assert_eq!(term_field(MAX_TERMS, TermPart::Payload), "terms");
    }
}
