//! The autocomplete scripts and their arguments: each `.lua` file (with the shared parts it
//! starts with: `rank.lua`, `features.lua`, `write.lua`, `ranking.lua`, `match.lua`) beside a
//! builder that writes its KEYS and ARGV in the script's order, once, for Baton and for tools
//! that call the scripts directly (the load generator). Reads are flagged `no-writes`, so Redis
//! may run them on replicas and during `OOM`.
//!
//! Which keys a write batch declares (the sets its entries may touch, planned in the module
//! above) and how replies read stay with the callers; the order of both is here.

use redis::{Script, ScriptInvocation};

use super::{BUDGET, DictionaryKeys, GATHER, HEAVY_PREFIX, MAX_RANKED_DEPTH, RecentKeys, text};
use super::{DEEP_RANKED, LIGHT_PREFIX, MAX_ABS_SCORE, ScoreChange, TOP_RANKED};

/// `add.lua`: add or update a step of an `Add` batch.
pub const ADD: &str = concat!(
    include_str!("rank.lua"),
    include_str!("features.lua"),
    include_str!("write.lua"),
    include_str!("ranking.lua"),
    include_str!("add.lua")
);
/// `scores.lua`: check that a batch's increments keep every score in range.
pub const SCORES: &str = concat!("#!lua flags=no-writes\n", include_str!("scores.lua"));
/// `remove.lua`: remove a step of a `Remove` batch.
pub const REMOVE: &str = concat!(
    include_str!("rank.lua"),
    include_str!("features.lua"),
    include_str!("write.lua"),
    include_str!("remove.lua")
);
/// `complete.lua`: one page of completions of any mode and order.
pub const COMPLETE: &str = concat!(
    "#!lua flags=no-writes\n",
    include_str!("rank.lua"),
    include_str!("features.lua"),
    include_str!("match.lua"),
    include_str!("complete.lua")
);
/// `prefix.lua`: one page of prefix completions in lexicographic order.
pub const PREFIX: &str = concat!("#!lua flags=no-writes\n", include_str!("prefix.lua"));
/// `ranked.lua`: one page of prefix completions by score.
pub const RANKED: &str = concat!(
    "#!lua flags=no-writes\n",
    include_str!("rank.lua"),
    include_str!("features.lua"),
    include_str!("best.lua"),
    include_str!("ranked.lua")
);
/// `configure.lua`: declare a dictionary's features.
pub const CONFIGURE: &str = concat!(
    include_str!("rank.lua"),
    include_str!("features.lua"),
    include_str!("configure.lua")
);
/// `change.lua`: one step of a change of a dictionary's features.
pub const CHANGE: &str = concat!(
    include_str!("rank.lua"),
    include_str!("features.lua"),
    include_str!("write.lua"),
    include_str!("ranking.lua"),
    include_str!("change.lua")
);
/// `fuzzy.lua`: one page of fuzzy completions.
pub const FUZZY: &str = concat!(
    "#!lua flags=no-writes\n",
    include_str!("rank.lua"),
    include_str!("features.lua"),
    include_str!("best.lua"),
    include_str!("fuzzy.lua")
);
/// `recent_record.lua`: record an item at the front of a recent list.
pub const RECENT_RECORD: &str = include_str!("recent_record.lua");
/// `recent_remove.lua`: remove items from a recent list.
pub const RECENT_REMOVE: &str = include_str!("recent_remove.lua");
/// `recent_list.lua`: one page of a recent list.
pub const RECENT_LIST: &str = concat!("#!lua flags=no-writes\n", include_str!("recent_list.lua"));
/// `recent_complete.lua`: one page of a recent list's items matching a query.
pub const RECENT_COMPLETE: &str = concat!(
    "#!lua flags=no-writes\n",
    include_str!("match.lua"),
    include_str!("recent_complete.lua")
);

/// A score change as the scripts take it: an op (`""` keep, `s` set, `i` add) and a value.
pub fn score_op(change: ScoreChange) -> (&'static str, f64) {
    match change {
        ScoreChange::Keep => ("", 0.0),
        ScoreChange::Set(v) => ("s", v),
        ScoreChange::Increment(v) => ("i", v),
    }
}

/// A score as text that reads back to the same double in Lua (add.lua stores it as it is).
pub fn score_arg(v: f64) -> String {
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

/// A payload as the scripts take it: empty to keep the current one, else `p` and the bytes.
pub fn payload_arg(payload: Option<&[u8]>) -> Vec<u8> {
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

/// The keys every write step of a dictionary declares first: data, vocabulary, the set of ranked
/// sets, the best-ranked terms, the features.
fn dictionary_invocation<'s>(script: &'s Script, keys: &DictionaryKeys) -> ScriptInvocation<'s> {
    let mut invocation = script.key(&keys.data);
    invocation
        .key(&keys.vocab)
        .key(&keys.heavy)
        .key(keys.top())
        .key(&keys.features);
    invocation
}

/// `configure.lua`'s call: give dictionary `keys` the features `letters` (in the order `rws`).
pub fn configure<'s>(
    script: &'s Script,
    keys: &DictionaryKeys,
    letters: &str,
) -> ScriptInvocation<'s> {
    let mut invocation = script.key(&keys.data);
    invocation.key(&keys.features).arg(letters);
    invocation
}

/// `change.lua`'s call: the step `args` (its name first) of the change of dictionary `keys`'s
/// features driven by `owner`, touching `touched`.
pub fn change<'s>(
    script: &'s Script,
    keys: &DictionaryKeys,
    owner: &str,
    lease_ms: u64,
    touched: &[String],
    args: &[&[u8]],
) -> ScriptInvocation<'s> {
    let mut invocation = dictionary_invocation(script, keys);
    invocation.key(keys.lease());
    for key in touched {
        invocation.key(key);
    }
    invocation.arg(&keys.base).arg(owner).arg(lease_ms);
    for a in args {
        invocation.arg(*a);
    }
    invocation
}

/// One entry of an `add.lua` step.
#[derive(Debug, Clone, Copy)]
pub struct AddEntry<'a> {
    /// The term's id (its display text in NFC).
    pub id: &'a str,
    /// Its matching form.
    pub key: &'a str,
    /// The display text to store (empty when it is the id).
    pub display: &'a str,
    /// What happens to its score.
    pub score: ScoreChange,
    /// The payload to set; `None` keeps the current one.
    pub payload: Option<&'a [u8]>,
    /// The words of its matching form.
    pub words: &'a [String],
}

/// `add.lua`'s arguments for one step of a batch, whose entries [`Add::invocation`] takes.
#[derive(Debug, Clone, Copy)]
pub struct Add<'a> {
    /// The dictionary.
    pub keys: &'a DictionaryKeys,
    /// The key of the batch's record, when Redis remembers what it did.
    pub record: Option<&'a str>,
    /// Every other key the step may touch, each once (every first-byte set when `wide`).
    pub touched: &'a [&'a str],
    /// The step declares every first-byte set (the script asked for it).
    pub wide: bool,
    /// The batch's fingerprint, empty without a record.
    pub fingerprint: &'a str,
    /// The index of the step's first entry in the batch.
    pub first: usize,
    /// How long the record is kept after the step, in milliseconds.
    pub memory_ms: u64,
    /// The work the step may do beyond its entries' planned work ([`STEP_WORK`](super::STEP_WORK) less that):
    /// copies into the ranked sets it creates and cut-backs.
    pub room: usize,
    /// The features the step was planned for, as letters: it declares their keys only.
    pub features: &'a str,
}

impl Add<'_> {
    /// The call of `script` (`add.lua`) for `entries`.
    pub fn invocation<'s, 'e>(
        &self,
        script: &'s Script,
        entries: impl IntoIterator<Item = AddEntry<'e>>,
    ) -> ScriptInvocation<'s> {
        let mut invocation = dictionary_invocation(script, self.keys);
        for key in self.record.iter().chain(self.touched) {
            invocation.key(*key);
        }
        invocation
            .arg(&self.keys.base)
            .arg(HEAVY_PREFIX)
            .arg(MAX_ABS_SCORE)
            .arg(MAX_RANKED_DEPTH)
            .arg(TOP_RANKED)
            .arg(DEEP_RANKED)
            .arg(if self.wide { "1" } else { "" })
            .arg(self.fingerprint)
            .arg(self.first)
            .arg(self.memory_ms)
            .arg(self.room)
            .arg(self.features);
        for entry in entries {
            let (op, value) = score_op(entry.score);
            invocation
                .arg(entry.id)
                .arg(entry.key)
                .arg(entry.display)
                .arg(op)
                .arg(score_arg(value))
                .arg(payload_arg(entry.payload))
                .arg(entry.words.len())
                .arg(entry.words);
        }
        invocation
    }
}

/// `scores.lua`'s arguments: the batch whose increments are checked, given as (id, change) to
/// [`Scores::invocation`].
#[derive(Debug, Clone, Copy)]
pub struct Scores<'a> {
    /// The dictionary.
    pub keys: &'a DictionaryKeys,
    /// The key of the batch's record, when Redis remembers what it did.
    pub record: Option<&'a str>,
    /// The batch's fingerprint, empty without a record.
    pub fingerprint: &'a str,
}

impl Scores<'_> {
    /// The call of `script` (`scores.lua`) for the incremented `terms`.
    pub fn invocation<'s, 'e>(
        &self,
        script: &'s Script,
        terms: impl IntoIterator<Item = (&'e str, ScoreChange)>,
    ) -> ScriptInvocation<'s> {
        let mut invocation = script.key(&self.keys.data);
        if let Some(record) = self.record {
            invocation.key(record);
        }
        invocation.arg(self.fingerprint).arg(MAX_ABS_SCORE);
        for (id, change) in terms {
            let (op, value) = score_op(change);
            invocation.arg(id).arg(op).arg(score_arg(value));
        }
        invocation
    }
}

/// One entry of a `remove.lua` step: a term's id, matching form and words.
#[derive(Debug, Clone, Copy)]
pub struct RemoveEntry<'a> {
    /// The term's id.
    pub id: &'a str,
    /// Its matching form.
    pub key: &'a str,
    /// The words of its matching form.
    pub words: &'a [String],
}

/// `remove.lua`'s arguments for one step of a batch, whose entries [`Remove::invocation`] takes.
#[derive(Debug, Clone, Copy)]
pub struct Remove<'a> {
    /// The dictionary.
    pub keys: &'a DictionaryKeys,
    /// Every other key the step may touch, each once (every first-byte set when `wide`).
    pub touched: &'a [&'a str],
    /// The step declares every first-byte set (the script asked for it).
    pub wide: bool,
    /// The features the step was planned for, as letters: it declares their keys only.
    pub features: &'a str,
}

impl Remove<'_> {
    /// The call of `script` (`remove.lua`) for `entries`.
    pub fn invocation<'s, 'e>(
        &self,
        script: &'s Script,
        entries: impl IntoIterator<Item = RemoveEntry<'e>>,
    ) -> ScriptInvocation<'s> {
        let mut invocation = dictionary_invocation(script, self.keys);
        for key in self.touched {
            invocation.key(*key);
        }
        invocation
            .arg(&self.keys.base)
            .arg(LIGHT_PREFIX)
            .arg(MAX_RANKED_DEPTH)
            .arg(if self.wide { "1" } else { "" })
            .arg(self.features);
        for entry in entries {
            invocation
                .arg(entry.id)
                .arg(entry.key)
                .arg(entry.words.len())
                .arg(entry.words);
        }
        invocation
    }
}

/// `prefix.lua`'s and `ranked.lua`'s arguments: a page of terms starting with `query`.
#[derive(Debug, Clone, Copy)]
pub struct Prefix<'a> {
    /// The dictionary.
    pub keys: &'a DictionaryKeys,
    /// The query's matching form (not empty).
    pub query: &'a str,
    /// Suggestions per page.
    pub limit: u32,
    /// Where the page starts (empty for the first), from the previous page's reply.
    pub position: &'a [u8],
}

impl Prefix<'_> {
    /// The call of `script` (`prefix.lua`): in lexicographic order.
    pub fn lexicographic<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.key(self.keys.lex_of(self.query));
        invocation
            .key(&self.keys.data)
            .arg(self.limit)
            .arg(self.query)
            .arg(self.position);
        invocation
    }

    /// The call of `script` (`ranked.lua`): by score.
    pub fn ranked<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.key(self.keys.lex_of(self.query));
        invocation
            .key(&self.keys.data)
            .key(&self.keys.heavy)
            .arg(&self.keys.base)
            .arg(self.limit)
            .arg(self.query)
            .arg(self.position)
            .arg(MAX_RANKED_DEPTH)
            .arg(HEAVY_PREFIX)
            .arg(BUDGET);
        invocation
    }
}

/// `complete.lua`'s arguments.
#[derive(Debug, Clone, Copy)]
pub struct Complete<'a> {
    /// The dictionary.
    pub keys: &'a DictionaryKeys,
    /// The match mode's name (`prefix`, `word`, `contains`, `auto`).
    pub mode: &'a str,
    /// The order's name (`lex`, `score`).
    pub order: &'a str,
    /// Suggestions per page.
    pub limit: u32,
    /// The query's matching form (not empty).
    pub query: &'a str,
    /// The group of automatic mode the page starts in.
    pub group: u8,
    /// Where the page starts (empty for the first).
    pub position: &'a [u8],
    /// The features the query needs, as letters (`r`, `w`, `s`): the script refuses it when the
    /// dictionary lacks one.
    pub need: &'a str,
}

impl Complete<'_> {
    /// The call of `script` (`complete.lua`).
    pub fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let (words, starts_sep, ends_sep) = text::query_words(self.query);
        let flags = match (starts_sep, ends_sep) {
            (false, false) => "",
            (true, false) => "s",
            (false, true) => "e",
            (true, true) => "se",
        };
        let mut invocation = script.key(self.keys.lex_of(self.query));
        invocation
            .key(&self.keys.data)
            .key(&self.keys.vocab)
            .key(&self.keys.heavy)
            .arg(&self.keys.base)
            .arg(self.mode)
            .arg(self.order)
            .arg(self.limit)
            .arg(self.query)
            .arg(u32::from(self.group))
            .arg(self.position)
            .arg(text::WORD_SEPARATORS)
            .arg(GATHER)
            .arg(BUDGET)
            .arg(MAX_RANKED_DEPTH)
            .arg(flags)
            .arg(HEAVY_PREFIX)
            .arg(self.need)
            .arg(words);
        invocation
    }
}

/// `fuzzy.lua`'s arguments: one step of the walk for the terms a prefix of which is within
/// `max_edits` edits of `query`.
#[derive(Debug, Clone, Copy)]
pub struct Fuzzy<'a> {
    /// The dictionary.
    pub keys: &'a DictionaryKeys,
    /// The order's name (`lex`, `score`).
    pub order: &'a str,
    /// Suggestions in the page.
    pub limit: u32,
    /// The most edits a match may need (0 to 2).
    pub max_edits: u32,
    /// The query's matching form (not empty).
    pub query: &'a str,
    /// The most reads of index sets this step makes.
    pub calls: usize,
    /// The most lex members those reads may return.
    pub entries: usize,
    /// The stage the step starts at (0 for the first step).
    pub stage: i64,
    /// The position in that stage the previous step stopped at (empty for the stage's start).
    pub position: &'a [u8],
    /// Matches earlier steps found in the groups before the stage's.
    pub before: usize,
    /// Matches earlier steps found in the stage's group.
    pub have: usize,
    /// When the position is a trie node whose best-first read an earlier step began: the ranked
    /// member that read stopped at (empty otherwise).
    pub resume: &'a [u8],
    /// The matches that best-first read found so far.
    pub resumed_found: usize,
}

impl Fuzzy<'_> {
    /// The call of `script` (`fuzzy.lua`): it declares the data, the heavy hash and every lex set
    /// there can be, in byte order.
    pub fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.key(&self.keys.data);
        invocation.key(&self.keys.heavy);
        for b in super::keys::first_bytes() {
            invocation.key(self.keys.lex(b));
        }
        invocation
            .arg(self.order)
            .arg(self.limit)
            .arg(self.max_edits)
            .arg(self.calls)
            .arg(self.entries)
            .arg(self.query)
            .arg(&self.keys.base)
            .arg(MAX_RANKED_DEPTH)
            .arg(HEAVY_PREFIX)
            .arg(self.stage)
            .arg(self.position)
            .arg(self.before)
            .arg(self.have)
            .arg(self.resume)
            .arg(self.resumed_found);
        invocation
    }
}

/// `recent_record.lua`'s arguments.
#[derive(Debug, Clone, Copy)]
pub struct RecentRecord<'a> {
    /// The list.
    pub keys: &'a RecentKeys,
    /// The item's id.
    pub id: &'a str,
    /// Its matching form.
    pub key: &'a str,
    /// The display text to store (empty when it is the id).
    pub display: &'a str,
    /// The payload to set; `None` keeps the current one.
    pub payload: Option<&'a [u8]>,
    /// Items the list keeps.
    pub max_items: u32,
    /// The list's ttl from now, in milliseconds.
    pub ttl_ms: u64,
}

impl RecentRecord<'_> {
    /// The call of `script` (`recent_record.lua`).
    pub fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.key(&self.keys.order);
        invocation
            .key(&self.keys.items)
            .arg(self.id)
            .arg(self.key)
            .arg(self.display)
            .arg(payload_arg(self.payload))
            .arg(self.max_items)
            .arg(self.ttl_ms);
        invocation
    }
}

/// `recent_remove.lua`'s call removing the items `ids` from the list `keys`.
pub fn recent_remove<'s, 'e>(
    script: &'s Script,
    keys: &RecentKeys,
    ids: impl IntoIterator<Item = &'e str>,
) -> ScriptInvocation<'s> {
    let mut invocation = script.key(&keys.order);
    invocation.key(&keys.items);
    for id in ids {
        invocation.arg(id);
    }
    invocation
}

/// `recent_list.lua`'s call for a page of `limit` items of `keys` from `position` (empty for the
/// first page).
pub fn recent_list<'s>(
    script: &'s Script,
    keys: &RecentKeys,
    limit: u32,
    position: &[u8],
) -> ScriptInvocation<'s> {
    let mut invocation = script.key(&keys.order);
    invocation.key(&keys.items).arg(limit).arg(position);
    invocation
}

/// `recent_complete.lua`'s arguments.
#[derive(Debug, Clone, Copy)]
pub struct RecentComplete<'a> {
    /// The list.
    pub keys: &'a RecentKeys,
    /// The match mode's name.
    pub mode: &'a str,
    /// Items per page.
    pub limit: u32,
    /// The query's matching form.
    pub query: &'a str,
    /// The group of automatic mode the page starts in.
    pub group: u8,
    /// Where the page starts (empty for the first).
    pub position: &'a [u8],
}

impl RecentComplete<'_> {
    /// The call of `script` (`recent_complete.lua`).
    pub fn invocation<'s>(&self, script: &'s Script) -> ScriptInvocation<'s> {
        let mut invocation = script.key(&self.keys.order);
        invocation
            .key(&self.keys.items)
            .arg(self.mode)
            .arg(self.limit)
            .arg(self.query)
            .arg(u32::from(self.group))
            .arg(self.position)
            .arg(text::WORD_SEPARATORS);
        invocation
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// rank.lua's written-out list of every lex set (and its bytes) is the list of the lex sets
    /// Baton declares, in the same order: `fuzzy.lua` maps the list's entries to its keys.
    #[test]
    fn the_lex_sets_lua_lists_are_those_baton_declares() {
        let rank = include_str!("rank.lua");
        let body = &rank[rank.find("local function all_lex_names()").unwrap()..];
        let body = &body[..body.find("\nend\n").unwrap()];
        let (names, bytes) = body.split_once("}, {").unwrap();
        let names: Vec<&str> = names.split('\'').skip(1).step_by(2).collect::<Vec<_>>();
        let bytes: Vec<u8> = bytes
            .split(|c: char| !c.is_ascii_digit())
            .filter(|t| !t.is_empty())
            .map(|t| t.parse().unwrap())
            .collect();
        let declared: Vec<u8> = super::super::keys::first_bytes().collect();
        assert_eq!(bytes, declared);
        // Each name is the end of its lex set's key: the dictionary's base, ':', then the name.
        let keys = DictionaryKeys::new("p:", "d");
        let expected: Vec<String> = declared
            .iter()
            .map(|b| keys.lex(*b)[keys.base.len() + 1..].to_owned())
            .collect();
        assert_eq!(names, expected);
    }

    /// The write scripts count a gram set's member as Baton plans it.
    #[test]
    fn the_scripts_weigh_grams_as_baton_plans_them() {
        let line = format!("\nlocal GRAM_WORK = {}\n", super::super::GRAM_WORK);
        assert!(include_str!("write.lua").contains(&line), "{line:?}");
    }

    /// Reads are flagged `no-writes`; writes are not.
    #[test]
    fn reads_are_flagged() {
        for read in [
            SCORES,
            COMPLETE,
            PREFIX,
            RANKED,
            FUZZY,
            RECENT_LIST,
            RECENT_COMPLETE,
        ] {
            assert!(read.starts_with("#!lua flags=no-writes\n"));
        }
        for write in [ADD, REMOVE, RECENT_RECORD, RECENT_REMOVE] {
            assert!(!write.starts_with("#!"));
        }
    }
}
