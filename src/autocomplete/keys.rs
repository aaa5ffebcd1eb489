//! The Redis keys of a dictionary and of a recent list, each under its own hash tag.

use super::*;

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
        first_bytes()
            .flat_map(|b| [self.lex(b), self.first_byte(b)])
            .collect()
    }
}

/// The bytes a matching form can start with, in byte order: an ASCII byte, or the first byte of
/// a multi-byte character (178 in all, a lex set each; rank.lua's `all_lex_names` lists them).
pub fn first_bytes() -> impl Iterator<Item = u8> {
    (1u8..=244).filter(|b| *b < 128 || *b >= 194)
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
}
