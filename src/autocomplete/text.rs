//! Text handling: the identity of a term (its display text in NFC) and its matching form (NFKC
//! with full case folding, whitespace collapsed), computed here so that Redis only compares bytes.

use caseless::Caseless;
use unicode_normalization::UnicodeNormalization;

/// Characters outside ASCII that separate words for word-prefix matching, as they appear in
/// matching forms (NFKC already turns most Unicode spaces and full-width punctuation into ASCII).
/// ASCII characters other than letters and digits always separate words.
pub const WORD_SEPARATORS: &str = concat!(
    "\u{00A1}\u{00A7}\u{00AB}\u{00B6}\u{00B7}\u{00BB}\u{00BF}\u{00D7}\u{00F7}",
    "\u{2010}\u{2012}\u{2013}\u{2014}\u{2015}\u{2016}\u{2018}\u{2019}\u{201A}\u{201B}",
    "\u{201C}\u{201D}\u{201E}\u{201F}\u{2020}\u{2021}\u{2022}\u{2027}",
    "\u{2030}\u{2032}\u{2035}\u{2039}\u{203A}\u{2043}\u{2212}\u{2E3A}\u{2E3B}",
    "\u{3001}\u{3002}\u{3003}\u{3008}\u{3009}\u{300A}\u{300B}\u{300C}\u{300D}\u{300E}",
    "\u{300F}\u{3010}\u{3011}\u{3014}\u{3015}\u{3016}\u{3017}\u{3018}\u{3019}\u{301A}",
    "\u{301B}\u{301C}\u{301D}\u{301E}\u{301F}\u{30FB}",
);

/// Whether `c` separates words in a matching form: ASCII other than letters and digits, or one
/// of [`WORD_SEPARATORS`]. The Lua scripts apply the same rule.
pub fn is_separator(c: char) -> bool {
    if c.is_ascii() {
        !c.is_ascii_alphanumeric()
    } else {
        WORD_SEPARATORS.contains(c)
    }
}

/// The words of a matching form (maximal runs of non-separators), each once, in order.
pub fn words(form: &str) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for word in form.split(is_separator).filter(|w| !w.is_empty()) {
        if !out.contains(&word) {
            out.push(word);
        }
    }
    out
}

/// The grams of a vocabulary word, as the scripts index them (`grams_of` in rank.lua): every
/// character outside ASCII and every sequence of 2 and 3 characters, each once, in order.
pub fn grams(word: &str) -> Vec<&str> {
    let bounds: Vec<usize> = word
        .char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(word.len()))
        .collect();
    let chars = bounds.len() - 1;
    let mut seen = std::collections::HashSet::with_capacity(3 * chars);
    let mut out = Vec::with_capacity(3 * chars);
    for i in 0..chars {
        let single = &word[bounds[i]..bounds[i + 1]];
        let candidates = [
            (single.len() > 1).then_some(single),
            bounds.get(i + 2).map(|&end| &word[bounds[i]..end]),
            bounds.get(i + 3).map(|&end| &word[bounds[i]..end]),
        ];
        for gram in candidates.into_iter().flatten() {
            if seen.insert(gram) {
                out.push(gram);
            }
        }
    }
    out
}

/// A query's words (runs of non-separators, in order, repeats kept) and whether it starts and
/// ends with a separator.
pub fn query_words(form: &str) -> (Vec<&str>, bool, bool) {
    let words = form.split(is_separator).filter(|w| !w.is_empty()).collect();
    let starts = form.chars().next().is_some_and(is_separator);
    let ends = form.chars().next_back().is_some_and(is_separator);
    (words, starts, ends)
}

/// A display text with the two forms Baton derives from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text {
    /// The text as the client sent it, returned in results.
    pub display: String,
    /// The text in NFC: two canonically equivalent texts are the same term or item.
    pub id: String,
    /// The matching form: NFKC with full case folding, whitespace runs as one space, no leading
    /// or trailing whitespace.
    pub key: String,
}

impl Text {
    /// The forms of `display`; `None` when its matching form is empty (only whitespace).
    pub fn new(display: &str) -> Option<Self> {
        let key = matching_form(display, false);
        if key.is_empty() {
            return None;
        }
        // ASCII is its own NFC.
        let id = if display.is_ascii() {
            display.to_owned()
        } else {
            display.nfc().collect()
        };
        Some(Self {
            display: display.to_owned(),
            id,
            key,
        })
    }

    /// The display text to store: empty when it equals the id (the common case), which saves
    /// storing it twice.
    pub fn stored_display(&self) -> &str {
        if self.display == self.id {
            ""
        } else {
            &self.display
        }
    }
}

/// The matching form of a query: as for terms, except that one trailing space is kept, so that
/// "ann " asks for a word "ann" followed by more.
pub fn query_form(query: &str) -> String {
    matching_form(query, true)
}

/// Unicode compatibility caseless matching (The Unicode Standard, 3.13, D146), recomposed to NFKC
/// for compactness: NFKC(toCasefold(NFKD(toCasefold(NFD(s))))). Whitespace runs become one
/// space; leading whitespace goes, and trailing whitespace too unless `keep_trailing`.
fn matching_form(s: &str, keep_trailing: bool) -> String {
    if s.is_ascii() {
        // ASCII is its own NFKC, and folds by lowercasing: the common case, without the
        // iterator chain.
        return collapse(
            s.chars().map(|c| c.to_ascii_lowercase()),
            s.len(),
            keep_trailing,
        );
    }
    let folded = drop_dot_above(
        s.chars()
            .nfd()
            .default_case_fold()
            .nfkd()
            .default_case_fold(),
    )
    .nfkc();
    collapse(folded, s.len(), keep_trailing)
}

/// Drops U+0307 COMBINING DOT ABOVE from a soft-dotted `i` or `j` (in a decomposed, folded
/// text), where it adds nothing a reader sees: full case folding turns Turkish `İ` into `i` +
/// U+0307, and without this `istanbul` would not find `İstanbul`. A dot above after another
/// mark of the same class (an accent already above the `i`) is kept, as is one on any other
/// letter (`ż` stays `ż`), and a second dot above after the one dropped (`i` + U+0307 + U+0307
/// keeps one).
fn drop_dot_above(chars: impl Iterator<Item = char>) -> impl Iterator<Item = char> {
    let mut soft_dotted = false;
    chars.filter(move |&c| {
        let class = unicode_normalization::char::canonical_combining_class(c);
        if class == 0 {
            soft_dotted = matches!(c, 'i' | 'j');
            true
        } else if c == '\u{0307}' && soft_dotted {
            // The dot the letter has anyway; one more above it is a mark a reader sees.
            soft_dotted = false;
            false
        } else {
            if class == 230 {
                soft_dotted = false;
            }
            true
        }
    })
}

/// Collects `chars` with whitespace runs as one space and no leading whitespace, nor trailing
/// whitespace unless `keep_trailing` (then one space).
fn collapse(chars: impl Iterator<Item = char>, len: usize, keep_trailing: bool) -> String {
    let mut out = String::with_capacity(len);
    let mut space = false;
    for c in chars {
        if c.is_whitespace() {
            space = !out.is_empty();
        } else {
            if space {
                out.push(' ');
                space = false;
            }
            out.push(c);
        }
    }
    if space && keep_trailing {
        out.push(' ');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> String {
        Text::new(s).expect("not blank").key
    }

    /// Full case folding: "ß" folds to "ss", final sigma to sigma, and so on.
    #[test]
    fn full_case_folding() {
        assert_eq!(key("Straße"), key("STRASSE"));
        assert_eq!(key("Straße"), "strasse");
        assert_eq!(key("ΟΔΥΣΣΕΥΣ"), key("Οδυσσευς"));
        assert_eq!(key("ΟΔΥΣΣΕΥΣ"), key("οδυσσευς"));
        assert_eq!(key("ПРИВЕТ"), "привет");
    }

    /// Turkish dotted capital I folds to a plain `i` (its dot above dropped), so `istanbul` and
    /// `ISTANBUL` find `İstanbul`; the dotless `ı` stays a letter of its own.
    #[test]
    fn dotted_capital_i() {
        assert_eq!(key("İstanbul"), "istanbul");
        assert_eq!(key("İSTANBUL"), key("istanbul"));
        assert_eq!(key("i\u{307}stanbul"), "istanbul");
        assert_eq!(query_form("İst"), "ist");
        assert_eq!(key("DİYARBAKIR"), "diyarbakir");
        assert_eq!(key("Diyarbakır"), "diyarbakır");
        // The dot stays where it means something: on other letters, and above another accent.
        assert_eq!(key("Żaneta"), "\u{17c}aneta");
        assert_eq!(key("i\u{301}\u{307}"), "\u{ed}\u{307}");
        // Under a mark below (Lithuanian į̇), the dot above still goes.
        assert_eq!(key("\u{12e}\u{307}"), "\u{12f}");
        // Only the first dot above goes: a second one stays, on `i` and on `İ`.
        assert_eq!(key("i\u{307}\u{307}x"), "i\u{307}x");
        assert_eq!(key("\u{130}\u{307}x"), "i\u{307}x");
    }

    /// Composed and decomposed forms, and compatibility forms, match.
    #[test]
    fn normalization() {
        assert_eq!(key("Caf\u{e9}"), key("Cafe\u{301}"));
        assert_eq!(key("ＡＢＣ"), "abc");
        assert_eq!(key("\u{fb01}le"), "file");
        // The id is NFC: both spellings of "é" are one term.
        assert_eq!(
            Text::new("Caf\u{e9}").unwrap().id,
            Text::new("Cafe\u{301}").unwrap().id
        );
        // The display is kept as given.
        assert_eq!(Text::new("Cafe\u{301}").unwrap().display, "Cafe\u{301}");
    }

    /// Astral-plane characters pass through untouched.
    #[test]
    fn astral_plane() {
        assert_eq!(key("🎸 Guitar"), "🎸 guitar");
        assert_eq!(key("𠮷野家"), "𠮷野家");
    }

    /// Whitespace collapses; blank texts have no matching form.
    #[test]
    fn whitespace() {
        assert_eq!(key("  Anna \t Smith  "), "anna smith");
        assert_eq!(key("Anna\u{3000}Smith"), "anna smith");
        assert_eq!(query_form(" anna  "), "anna ");
        assert_eq!(query_form("anna"), "anna");
        assert!(Text::new(" \t\u{3000}").is_none());
    }

    /// The ASCII shortcut gives what the full folding gives.
    #[test]
    fn ascii_shortcut_matches_full_folding() {
        let full = |s: &str| {
            let folded: String = s
                .chars()
                .nfd()
                .default_case_fold()
                .nfkd()
                .default_case_fold()
                .nfkc()
                .collect();
            collapse(folded.chars(), s.len(), true)
        };
        let all: String = (0u8..128).map(char::from).collect();
        for s in [
            all.as_str(),
            "  Anna  K. O'BRIEN-Smith\t\x1c\x7f ",
            "ABC xyz 123 !@#",
        ] {
            assert_eq!(query_form(s), full(s), "{s:?}");
            assert_eq!(Text::new(s).unwrap().id, s.nfc().collect::<String>());
        }
    }

    /// Folding a matching form again changes nothing.
    #[test]
    fn idempotent() {
        for s in [
            "Straße",
            "ΣΊΣΥΦΟΣ",
            "Ǆemal",
            "ﬃ",
            "Å",
            "ᾼ",
            "Ⅻ",
            "𝔄𝔅",
            "한국어",
            "がぎ",
        ] {
            let once = key(s);
            assert_eq!(key(&once), once, "{s}");
        }
    }

    /// Words split at separators, each once.
    #[test]
    fn words_and_query_words() {
        assert_eq!(words("o'brien-smith smith"), ["o", "brien", "smith"]);
        assert_eq!(words("王伟 🎸 guitar"), ["王伟", "🎸", "guitar"]);
        assert_eq!(words("jean\u{2013}luc"), ["jean", "luc"]);
        assert_eq!(query_words("anna "), (vec!["anna"], false, true));
        assert_eq!(query_words("-x y"), (vec!["x", "y"], true, false));
        assert_eq!(query_words("--"), (vec![], true, true));
    }

    /// Grams are the non-ASCII characters and the 2- and 3-character sequences, each once.
    #[test]
    fn grams_of_words() {
        assert_eq!(grams("a"), Vec::<&str>::new());
        assert_eq!(grams("ab"), ["ab"]);
        assert_eq!(grams("abcd"), ["ab", "abc", "bc", "bcd", "cd"]);
        assert_eq!(grams("aaaa"), ["aa", "aaa"]);
        assert_eq!(grams("жx"), ["ж", "жx"]);
        assert_eq!(grams("王伟王"), ["王", "王伟", "王伟王", "伟", "伟王"]);
    }

    /// Every separator is outside ASCII and survives normalization as itself.
    #[test]
    fn separators_are_normalized_forms() {
        for c in WORD_SEPARATORS.chars() {
            assert!(!c.is_ascii(), "{c:?}");
            assert!(!c.is_alphanumeric(), "{c:?}");
            assert_eq!(key(&format!("a{c}b")), format!("a{c}b"), "{c:?}");
        }
    }
}
