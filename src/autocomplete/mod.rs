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

mod change;
mod complete;
pub mod cursor;
mod fuzzy;
mod keys;
mod plan;
mod recent;
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
    error::{Error, Field, in_words},
    redis::{
        Redis,
        reply::{int, unexpected},
    },
};
use cursor::{Cursor, Scope};
pub use keys::{DictionaryKeys, RecentKeys};
use plan::*;
pub use plan::{heaviest_build_step, heaviest_shared_step, heaviest_step};
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
/// sets, [`GRAM_WORK`] per gram of a word): a step is one script call, and this keeps each call
/// to about 2 ms of Redis time on a 2-core machine, whatever the terms' words, so that a large
/// batch neither runs into Baton's command timeout nor holds up the other clients of the Redis.
pub const STEP_WORK: usize = 1000;
/// The Redis time a write step aims at, by the clock of its script: a batch's (or a change's)
/// steps are cut smaller than [`STEP_WORK`] when the last ones took longer than this for their
/// work (`Pace`), so that terms whose every word is new, whose keys are mostly created by the
/// step, still make short steps.
pub const STEP_TIME: Duration = Duration::from_millis(2);
/// The units of one member added to or removed from a gram set (a word of the vocabulary in the
/// set of one of its grams): each is a command on a set of its own, which costs Redis about four
/// times a member of a sorted set or hash written with others (measured on terms of fresh words,
/// where every word's grams are written: docs/autocomplete.md, "Writes"). The scripts count it
/// so too (`GRAM_WORK` in write.lua).
pub const GRAM_WORK: usize = 4;
/// Most entries in one step of a write batch, which also bounds what a step copies when it
/// creates a ranked set (at most [`HEAVY_PREFIX`] terms plus a step).
pub const STEP_ENTRIES: usize = 64;
/// The most work one entry of a write batch can be planned to do: a matching form of
/// [`MAX_FORM_BYTES`] has at most half as many words and twice as many grams (two a byte: a
/// 2- and a 3-character gram starting at each ASCII character), and a term is in at most
/// [`MAX_RANKED_DEPTH`] + 1 ranked sets. A display text of 256 bytes in one ASCII word plans
/// 2,068 with every feature.
pub const MAX_ENTRY_WORK: usize =
    12 + 4 * (MAX_FORM_BYTES / 2) + GRAM_WORK * 2 * MAX_FORM_BYTES + 4 * (MAX_RANKED_DEPTH + 3);
/// The most work one step of a write batch does, in [`STEP_WORK`] units, by construction: a
/// step of more than one entry does at most [`STEP_WORK`] and [`CUT_RESERVE`] (what its entries
/// were planned to cost and the copies and cut-backs its script counts before writing, else its
/// entries that fit go without the one that brings the work, which goes with half the rest, down
/// to alone); a step of one entry does its own work (at most [`MAX_ENTRY_WORK`]), and may pass
/// its room by the copies of making the dictionary ranked (4 per term, at most
/// [`HEAVY_PREFIX`] + 1 terms, and one per possible lex set). The scripts return the work they
/// did, and [`heaviest_step`] and [`heaviest_shared_step`] keep the most seen.
pub const MAX_STEP_WORK: usize =
    MAX_ENTRY_WORK + CUT_RESERVE + 4 * (HEAVY_PREFIX + 1) + FIRST_BYTES;
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
/// being built (`progress`: terms indexed so far, `queued` when the change under way builds it
/// after another feature, or empty).
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
    Error::FailedPrecondition(match progress.as_deref() {
        Some("queued") => format!(
            "{what} needs the dictionary's feature {feature}, whose index the change under way \
             builds after the one it is building now (Describe shows the progress): try again \
             once it is"
        ),
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
    write_features: Hints<Features>,
    /// Per dictionary (its key base), the pace of its write steps (their budget of work).
    paces: Hints<Pace>,
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
                write_features: Hints::default(),
                paces: Hints::default(),
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
        self.inner
            .write_features
            .get(&keys.base)
            .unwrap_or(Features::ALL)
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
        self.inner.write_features.keep(&keys.base, needs);
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
    /// The terms are made by `make` (from what the client sent: checking and normalizing them),
    /// and the batch is planned, in one task off the async runtime's workers, so that a batch of
    /// many long terms does not hold a worker (and every call it serves) for long. `make` is
    /// given a check to call before each entry, which fails once `stop_by` has passed; the
    /// batch then fails `Unavailable` with nothing applied. `entries` is the number of terms
    /// `make` makes, for that message.
    ///
    /// Nothing is sent to Redis at or after `stop_by` (the caller's deadline, less a margin), nor
    /// is a step's answer awaited past it: the batch then fails `Unavailable` with its first
    /// steps applied (the one in flight perhaps too), in time for the caller to hear it. A batch
    /// not ready by `stop_by` fails so too, at `stop_by`, with nothing applied.
    pub async fn add<F>(
        &self,
        dictionary: &str,
        entries: usize,
        make: F,
        record: Option<&Record>,
        stop_by: Option<Instant>,
    ) -> Result<Added, Error>
    where
        F: FnOnce(&dyn Fn() -> Result<(), Error>) -> Result<Vec<NewTerm>, Error> + Send + 'static,
    {
        let keys = self.dictionary_keys(dictionary);
        let hint = self.write_features(&keys);
        let not_ready = move || {
            Error::Unavailable(format!(
                "the batch was not ready before the caller's deadline (0 of {entries} entries \
                 applied)"
            ))
        };
        let ready_by = stop_by.map(Instant::into_std);
        let owned_record = record.cloned();
        let prepare = off_workers(move || {
            let in_time = || match ready_by {
                Some(t) if std::time::Instant::now() >= t => Err(not_ready()),
                _ => Ok(()),
            };
            let terms = make(&in_time)?;
            in_time()?;
            Ok::<_, Error>(AddBatch::new(keys, terms, owned_record.as_ref(), hint))
        });
        let mut batch = match stop_by {
            None => prepare.await??,
            // The task is not waited for past `stop_by` (it sees the time too, and gives up).
            Some(stop_by) => tokio::time::timeout_at(stop_by, prepare)
                .await
                .map_err(|_| not_ready())???,
        };
        if batch
            .terms
            .iter()
            .any(|t| matches!(t.score, ScoreChange::Increment(_)))
        {
            self.check_scores(&batch, stop_by).await?;
        }
        let total = batch.terms.len();
        let mut outcomes: Vec<Option<(bool, f64)>> = vec![None; total];
        let mut term_count = 0;
        // `cut`: after a step refused as too much work, the entry that brings the work (the
        // entries before it go without it) and the most entries the step it starts may take.
        let (mut at, mut cut, mut wide) = (0, None, false);
        let mut pace = self.inner.paces.get(&batch.keys.base).unwrap_or_default();
        while at < total {
            let budget = pace.budget();
            let end = match cut {
                Some((from, most)) if from == at => {
                    next_step(&batch.planned[at..], most, budget) + at
                }
                Some((from, _)) if from > at => {
                    (next_step(&batch.planned[at..], STEP_ENTRIES, budget) + at).min(from)
                }
                _ => next_step(&batch.planned[at..], STEP_ENTRIES, budget) + at,
            };
            let invocation = batch.step(&self.inner.add, at, end, wide);
            let reply: Vec<Value> = self.eval_by(&invocation, stop_by, at, total).await?;
            let [status, rest @ ..] = reply.as_slice() else {
                return Err(unexpected("add reply"));
            };
            match (int(status)?, rest) {
                (0, [count, work, micros, needs, results @ ..]) if results.len() == end - at => {
                    term_count = count_u64(count)?;
                    note_step_work(work, end - at)?;
                    let planned = batch.planned[at..end].iter().map(|p| p.work).sum();
                    pace.note(planned, budget, step_micros(micros)?);
                    self.inner.paces.keep(&batch.keys.base, pace);
                    for (slot, result) in outcomes[at..end].iter_mut().zip(results) {
                        *slot = Some(outcome(result)?);
                    }
                    (at, wide) = (end, false);
                    cut = cut.filter(|&(from, _)| from >= at);
                    let needs = self.note_write_features(dictionary, &batch.keys, needs)?;
                    if needs != batch.features && at < total {
                        batch = replanned(batch, at, needs).await?;
                    }
                }
                (6, [needs]) => {
                    let needs = self.note_write_features(dictionary, &batch.keys, needs)?;
                    batch = replanned(batch, at, needs).await?;
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
                    at = at.min(total);
                }
                (5, []) => {
                    return Err(Error::invalid(
                        "request_id",
                        format!(
                            "was used with another batch for this dictionary (ids are remembered \
                             for {})",
                            in_words(record.map_or(REQUEST_MEMORY, |r| r.memory))
                        ),
                    ));
                }
                _ => return Err(unexpected("add reply")),
            }
        }
        let mut added = Added {
            added: 0,
            updated: 0,
            scores: Vec::with_capacity(total),
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
    async fn check_scores(&self, batch: &AddBatch, stop_by: Option<Instant>) -> Result<(), Error> {
        let terms = &batch.terms;
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
    ///
    /// The texts are made by `make` (from what the client sent: checking and normalizing them),
    /// and the batch is planned, in one task off the async runtime's workers, as for
    /// [`Self::add`].
    pub async fn remove<F>(&self, dictionary: &str, make: F) -> Result<(u32, u64), Error>
    where
        F: FnOnce() -> Result<Vec<Text>, Error> + Send + 'static,
    {
        let keys = self.dictionary_keys(dictionary);
        let mut features = self.write_features(&keys);
        let (texts, words, mut planned) = {
            let keys = keys.clone();
            off_workers(move || {
                let texts = make()?;
                let words: Vec<Vec<String>> = texts.iter().map(|t| owned_words(&t.key)).collect();
                let planned = plan(
                    &keys,
                    texts.iter().map(|t| t.key.as_str()),
                    &words,
                    features,
                );
                Ok::<_, Error>((texts, words, planned))
            })
            .await??
        };
        let (mut removed, mut term_count) = (0, 0);
        let (mut at, mut wide) = (0, false);
        let mut pace = self.inner.paces.get(&keys.base).unwrap_or_default();
        while at < texts.len() {
            let budget = pace.budget();
            let end = next_step(&planned[at..], STEP_ENTRIES, budget) + at;
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
                [status, gone, count, work, micros, now] if int(status)? == 0 => {
                    note_step_work(work, end - at)?;
                    let step: usize = planned[at..end].iter().map(|p| p.work).sum();
                    pace.note(step, budget, step_micros(micros)?);
                    self.inner.paces.keep(&keys.base, pace);
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
                // Planning what is left is CPU work too (rare: the features changed).
                let rest: Vec<(String, Vec<String>)> = texts[at..]
                    .iter()
                    .map(|t| t.key.clone())
                    .zip(words[at..].iter().cloned())
                    .collect();
                let keys = keys.clone();
                planned.extend(
                    off_workers(move || {
                        let (forms, words): (Vec<String>, Vec<Vec<String>>) =
                            rest.into_iter().unzip();
                        plan(&keys, forms.iter().map(String::as_str), &words, needs)
                    })
                    .await?,
                );
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

/// Runs `work` (CPU work on a whole batch: normalizing, planning) on a thread of the blocking
/// pool, off the async runtime's workers, and returns its result.
pub(crate) async fn off_workers<T, F>(work: F) -> Result<T, Error>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Internal(format!("a batch's preparation failed: {e}")))
}

/// `batch` with its entries from `at` on planned again for `features`, off the async runtime's
/// workers.
async fn replanned(mut batch: AddBatch, at: usize, features: Features) -> Result<AddBatch, Error> {
    off_workers(move || {
        batch.replan(at, features);
        batch
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Batch field names point at the entry.
    #[test]
    fn batch_field_names() {
        assert_eq!(term_field(0, TermPart::Display), "terms[0].display");
        assert_eq!(term_field(999, TermPart::Score), "terms[999].score");
        assert_eq!(term_field(7, TermPart::Removal), "displays[7]");
        assert_eq!(term_field(MAX_TERMS, TermPart::Payload), "terms");
    }
}
