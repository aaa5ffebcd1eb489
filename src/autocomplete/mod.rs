//! Autocomplete over dictionaries (large term sets with scores and payloads) and recent lists
//! (short most-recent-first lists), with Unicode-correct matching and bounded work per call.
//!
//! Baton computes each text's matching form ([`text::Text`]: NFKC with full case folding) so
//! that Redis only compares bytes; every change is one Lua script, and every read is a script
//! flagged `no-writes`.
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
//! | `PREFIX{ac:NAME}:t:P` | sorted set (scores 0) | ranked members of the best-ranked terms starting with `P` ([`MAX_RANKED_DEPTH`] + 1 characters): every such term ranked at or before the set's bound (in `h`); [`DEEP_RANKED`] to twice that | while more than [`LIGHT_PREFIX`] terms start with `P`; created past [`HEAVY_PREFIX`] |
//! | `PREFIX{ac:NAME}:top` | sorted set (scores 0) | ranked members of the best-ranked terms: every term ranked at or before its last member; [`TOP_RANKED`] to twice that | as the first-byte ranked sets |
//! | `PREFIX{ac:NAME}:r:P` | sorted set (scores 0) | ranked members of every term starting with `P`, of 1 to [`MAX_RANKED_DEPTH`] characters (one character only when it takes several bytes: an ASCII character's set is its `b:XX`) | while more than [`LIGHT_PREFIX`] terms start with `P`; created past [`HEAVY_PREFIX`] |
//! | `PREFIX{ac:NAME}:w:W` | sorted set (scores 0) | lex members of the terms having word `W` | while a term has `W` |
//! | `PREFIX{ac:NAME}:v` | sorted set (scores 0) | the vocabulary: every word of every term | while the dictionary has terms |
//! | `PREFIX{ac:NAME}:vg:G` | set | the vocabulary words containing gram `G` (2 or 3 characters, or 1 non-ASCII character) | while such a word exists |
//! | `PREFIX{acr:NAME}` | sorted set | item id → last recorded (µs, Redis clock) | the list's ttl, set anew by each record |
//! | `PREFIX{acr:NAME}:items` | hash | item id → matching form, display text, payload | as above |
//!
//! Dictionaries do not expire: they are user data, kept until their terms are removed; removing
//! the last term removes every key. The gRPC handler is in [`service`]; this module knows nothing
//! of tonic.

pub mod cursor;
pub mod service;
pub mod text;

use std::{
    sync::{Arc, LazyLock},
    time::{Duration, SystemTime},
};

use redis::{Script, Value};

use crate::{error::Error, redis::Redis};
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
pub const MAX_BATCH: usize = 1000;
/// Results per page when the request says 0.
pub const DEFAULT_LIMIT: u32 = 10;
/// Most results per page.
pub const MAX_LIMIT: u32 = 1000;
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
/// its best-ranked terms in a *deep set*, cut back to this many when it passes twice that:
/// score-ordered prefix completion of longer queries reads it before it walks the ranked set of
/// the shorter prefix.
pub const DEEP_RANKED: usize = 256;
/// A ranked dictionary keeps its best-ranked terms in one more ranked set, cut back to this many
/// when it passes twice that: score-ordered walks of the whole dictionary start there, in one
/// set, before they merge the sets of every first byte.
pub const TOP_RANKED: usize = 2048;
/// The most index entries one `Complete` call looks at.
pub const BUDGET: usize = 1024;
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
}

impl DictionaryKeys {
    /// The keys of dictionary `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> Self {
        let base = format!("{prefix}{{ac:{}}}", escape(name));
        Self {
            data: format!("{base}:data"),
            vocab: format!("{base}:v"),
            heavy: format!("{base}:h"),
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
}

impl MatchMode {
    fn name(self) -> &'static str {
        match self {
            Self::Prefix => "prefix",
            Self::WordPrefix => "word",
            Self::Suffix => "suffix",
            Self::Contains => "contains",
            Self::Automatic => "auto",
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
}

impl MatchKind {
    fn from_script(v: i64) -> Result<Self, Error> {
        Ok(match v {
            1 => Self::Exact,
            2 => Self::Prefix,
            3 => Self::WordPrefix,
            4 => Self::Suffix,
            5 => Self::Contains,
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
}

/// One page of results.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The results.
    pub items: Vec<T>,
    /// The token of the next page; empty when there are no more results.
    pub next_page_token: String,
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
    add: Script,
    remove: Script,
    complete: Script,
    prefix: Script,
    ranked: Script,
    record: Script,
    forget: Script,
    list: Script,
    complete_recent: Script,
}

impl Autocomplete {
    /// Dictionaries and recent lists stored in `redis`.
    pub fn new(redis: Redis) -> Self {
        Self {
            inner: Arc::new(Inner {
                redis,
                add: Script::new(concat!(
                    include_str!("rank.lua"),
                    include_str!("write.lua"),
                    include_str!("add.lua")
                )),
                remove: Script::new(concat!(
                    include_str!("rank.lua"),
                    include_str!("write.lua"),
                    include_str!("remove.lua")
                )),
                complete: Script::new(concat!(
                    "#!lua flags=no-writes\n",
                    include_str!("rank.lua"),
                    include_str!("match.lua"),
                    include_str!("complete.lua")
                )),
                prefix: Script::new(concat!(
                    "#!lua flags=no-writes\n",
                    include_str!("prefix.lua")
                )),
                ranked: Script::new(concat!(
                    "#!lua flags=no-writes\n",
                    include_str!("rank.lua"),
                    include_str!("ranked.lua")
                )),
                record: Script::new(include_str!("recent_record.lua")),
                forget: Script::new(include_str!("recent_remove.lua")),
                list: Script::new(concat!(
                    "#!lua flags=no-writes\n",
                    include_str!("recent_list.lua")
                )),
                complete_recent: Script::new(concat!(
                    "#!lua flags=no-writes\n",
                    include_str!("match.lua"),
                    include_str!("recent_complete.lua")
                )),
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

    /// Adds or updates `terms` in one atomic step; nothing changes when one entry's resulting
    /// score would be out of range (`InvalidArgument` on `terms[i].score`).
    pub async fn add(&self, dictionary: &str, terms: &[NewTerm]) -> Result<Added, Error> {
        let keys = self.dictionary_keys(dictionary);
        let mut invocation = self.inner.add.key(&keys.data);
        invocation
            .key(&keys.vocab)
            .key(&keys.heavy)
            .arg(&keys.base)
            .arg(HEAVY_PREFIX)
            .arg(MAX_ABS_SCORE)
            .arg(MAX_RANKED_DEPTH)
            .arg(TOP_RANKED)
            .arg(DEEP_RANKED);
        for term in terms {
            let (op, value) = match term.score {
                ScoreChange::Keep => ("", 0.0),
                ScoreChange::Set(v) => ("s", v),
                ScoreChange::Increment(v) => ("i", v),
            };
            invocation
                .arg(&term.text.id)
                .arg(&term.text.key)
                .arg(term.text.stored_display())
                .arg(op)
                .arg(score_arg(value))
                .arg(payload_arg(term.payload.as_deref()));
            let words = text::words(&term.text.key);
            invocation.arg(words.len()).arg(words);
        }
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
        match reply.as_slice() {
            [status, index] if int(status)? == 1 => {
                let i = usize::try_from(int(index)? - 1).map_err(|_| unexpected("entry"))?;
                Err(Error::invalid(
                    term_field(i, TermPart::Score),
                    format!("the resulting score would be outside ±{MAX_ABS_SCORE:e}"),
                ))
            }
            [status, added, updated, count, scores @ ..] if int(status)? == 0 => Ok(Added {
                added: count_u32(added)?,
                updated: count_u32(updated)?,
                scores: scores.iter().map(score).collect::<Result<_, _>>()?,
                term_count: count_u64(count)?,
            }),
            _ => Err(unexpected("add reply")),
        }
    }

    /// Removes the terms with these texts' ids; returns how many were there and the terms left.
    pub async fn remove(&self, dictionary: &str, texts: &[Text]) -> Result<(u32, u64), Error> {
        let keys = self.dictionary_keys(dictionary);
        let mut invocation = self.inner.remove.key(&keys.data);
        invocation
            .key(&keys.vocab)
            .key(&keys.heavy)
            .arg(&keys.base)
            .arg(LIGHT_PREFIX)
            .arg(MAX_RANKED_DEPTH);
        for text in texts {
            let words = text::words(&text.key);
            invocation
                .arg(&text.id)
                .arg(&text.key)
                .arg(words.len())
                .arg(words);
        }
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
        match reply.as_slice() {
            [removed, count] => Ok((count_u32(removed)?, count_u64(count)?)),
            _ => Err(unexpected("remove reply")),
        }
    }

    /// The number of terms in a dictionary (0 when it does not exist).
    pub async fn term_count(&self, dictionary: &str) -> Result<u64, Error> {
        let keys = self.dictionary_keys(dictionary);
        let count: i64 = self
            .inner
            .redis
            .command(redis::cmd("HLEN").arg(&keys.data))
            .await?;
        u64::try_from(count).map_err(|_| unexpected("count"))
    }

    /// One page of a dictionary's completions.
    pub async fn complete(
        &self,
        dictionary: &str,
        request: &Completion,
    ) -> Result<Page<Suggestion>, Error> {
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
        let reply: Vec<Value> = match (request.mode, request.order) {
            (MatchMode::Prefix, Order::Lexicographic) => {
                let mut invocation = self.inner.prefix.key(keys.lex_of(&request.query));
                invocation
                    .key(&keys.data)
                    .arg(request.limit)
                    .arg(&request.query)
                    .arg(position);
                self.inner.redis.eval(&invocation).await?
            }
            (MatchMode::Prefix, Order::Score) => {
                let mut invocation = self.inner.ranked.key(keys.lex_of(&request.query));
                invocation
                    .key(&keys.data)
                    .key(&keys.heavy)
                    .arg(&keys.base)
                    .arg(request.limit)
                    .arg(&request.query)
                    .arg(position)
                    .arg(MAX_RANKED_DEPTH)
                    .arg(HEAVY_PREFIX)
                    .arg(BUDGET);
                self.inner.redis.eval(&invocation).await?
            }
            _ => {
                self.complete_script(&keys, request, group, position)
                    .await?
            }
        };
        let [next_group, next_position, rows @ ..] = reply.as_slice() else {
            return Err(unexpected("complete reply"));
        };
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
            });
        }
        Ok(Page {
            items,
            next_page_token: next_token(&scope, next_group, next_position)?,
        })
    }

    /// Runs complete.lua: every query but prefixes outside automatic mode.
    async fn complete_script(
        &self,
        keys: &DictionaryKeys,
        request: &Completion,
        group: u8,
        position: Vec<u8>,
    ) -> Result<Vec<Value>, Error> {
        let (words, starts_sep, ends_sep) = text::query_words(&request.query);
        let flags = match (starts_sep, ends_sep) {
            (false, false) => "",
            (true, false) => "s",
            (false, true) => "e",
            (true, true) => "se",
        };
        let mut invocation = self.inner.complete.key(keys.lex_of(&request.query));
        invocation
            .key(&keys.data)
            .key(&keys.vocab)
            .key(&keys.heavy)
            .arg(&keys.base)
            .arg(request.mode.name())
            .arg(request.order.name())
            .arg(request.limit)
            .arg(&request.query)
            .arg(u32::from(group))
            .arg(position)
            .arg(text::WORD_SEPARATORS)
            .arg(GATHER)
            .arg(BUDGET)
            .arg(MAX_RANKED_DEPTH)
            .arg(flags)
            .arg(HEAVY_PREFIX)
            .arg(words);
        self.inner.redis.eval(&invocation).await
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
        let mut invocation = self.inner.record.key(&keys.order);
        invocation
            .key(&keys.items)
            .arg(&text.id)
            .arg(&text.key)
            .arg(text.stored_display())
            .arg(payload_arg(payload))
            .arg(max_items)
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
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
        let mut invocation = self.inner.forget.key(&keys.order);
        invocation.key(&keys.items);
        for text in texts {
            invocation.arg(&text.id);
        }
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
        let mut invocation = self.inner.list.key(&keys.order);
        invocation.key(&keys.items).arg(limit).arg(position);
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
        let mut invocation = self.inner.complete_recent.key(&keys.order);
        invocation
            .key(&keys.items)
            .arg(mode.name())
            .arg(limit)
            .arg(query)
            .arg(u32::from(group))
            .arg(position)
            .arg(text::WORD_SEPARATORS);
        let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
        let [next_group, next_position, rows @ ..] = reply.as_slice() else {
            return Err(unexpected("complete reply"));
        };
        Ok(Page {
            items: recent_items(rows, true)?,
            next_page_token: next_token(&scope, next_group, next_position)?,
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
///
/// Errors carry `&'static str` field names, so the names of the [`MAX_BATCH`] possible entries
/// are built once, on first use, and kept for the life of the process (about 100 KiB).
pub fn term_field(i: usize, part: TermPart) -> &'static str {
    static NAMES: LazyLock<Vec<[&'static str; 4]>> = LazyLock::new(|| {
        (0..MAX_BATCH)
            .map(|i| {
                let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
                [
                    leak(format!("terms[{i}].display")),
                    leak(format!("terms[{i}].score")),
                    leak(format!("terms[{i}].payload")),
                    leak(format!("displays[{i}]")),
                ]
            })
            .collect()
    });
    let column = part as usize;
    match NAMES.get(i) {
        Some(names) => names[column],
        None => ["terms", "terms", "terms", "displays"][column],
    }
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

/// A score as text that reads back to the same double in Lua (add.lua stores it as it is).
fn score_arg(v: f64) -> String {
    if v == 0.0 {
        // Not "-0e0": -0 is stored as 0.
        return "0".to_owned();
    }
    // Rust's shortest round-trip digits, in plain or exponent notation, whichever is shorter
    // (it is stored as given); Lua's tonumber reads either back exactly.
    let plain = format!("{v}");
    let exponent = format!("{v:e}");
    if plain.len() <= exponent.len() {
        plain
    } else {
        exponent
    }
}

fn payload_arg(payload: Option<&[u8]>) -> Vec<u8> {
    match payload {
        None => Vec::new(),
        Some(p) => {
            let mut v = Vec::with_capacity(p.len() + 1);
            v.push(b'p');
            v.extend_from_slice(p);
            v
        }
    }
}

fn unexpected(what: &str) -> Error {
    Error::Internal(format!("unexpected {what} from Redis"))
}

fn int(v: &Value) -> Result<i64, Error> {
    redis::from_redis_value_ref(v).map_err(|_| unexpected("integer"))
}

fn bytes(v: &Value) -> Result<Vec<u8>, Error> {
    match v {
        Value::BulkString(b) => Ok(b.clone()),
        Value::Nil => Ok(Vec::new()),
        _ => Err(unexpected("string")),
    }
}

fn score(v: &Value) -> Result<f64, Error> {
    let raw = bytes(v)?;
    std::str::from_utf8(&raw)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .ok_or_else(|| unexpected("score"))
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

    /// Batch field names point at the entry.
    #[test]
    fn batch_field_names() {
        assert_eq!(term_field(0, TermPart::Display), "terms[0].display");
        assert_eq!(term_field(999, TermPart::Score), "terms[999].score");
        assert_eq!(term_field(7, TermPart::Removal), "displays[7]");
        assert_eq!(term_field(MAX_BATCH, TermPart::Payload), "terms");
    }

    /// Scores pass to Lua in a form that reads back exactly.
    #[test]
    fn score_text_round_trips() {
        for v in [0.0, -0.0, 1.0, 0.1, -2.5e-300, 1e15, 123_456_789.123_456_78] {
            assert_eq!(score_arg(v).parse::<f64>().unwrap(), v);
        }
        assert_eq!(score_arg(-0.0), "0");
        assert_eq!(score_arg(512.0), "512");
        assert_eq!(score_arg(1e15), "1e15");
        assert_eq!(score_arg(-2.5e-300), "-2.5e-300");
    }
}
