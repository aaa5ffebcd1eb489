//! The planning of `Add` and `Remove` batches into steps of bounded work ([`STEP_WORK`]): what
//! each step holds and declares, and where a refused step is cut.

use super::*;

/// An `Add` batch, ready to be sent in steps. It owns its terms, so that it can be made (and
/// planned again) off the async runtime's workers: normalizing and planning a batch of many
/// terms is CPU work ([`Autocomplete::add`]).
pub(super) struct AddBatch {
    pub(super) keys: DictionaryKeys,
    pub(super) terms: Vec<NewTerm>,
    pub(super) words: Vec<Vec<String>>,
    /// The features the steps are planned for: their keys are declared, the rest not.
    pub(super) features: Features,
    pub(super) planned: Vec<Planned>,
    pub(super) record_key: Option<String>,
    pub(super) fingerprint: Option<String>,
    pub(super) memory_ms: u64,
}

impl AddBatch {
    pub(super) fn new(
        keys: DictionaryKeys,
        terms: Vec<NewTerm>,
        record: Option<&Record>,
        features: Features,
    ) -> Self {
        let words: Vec<Vec<String>> = terms.iter().map(|t| owned_words(&t.text.key)).collect();
        let planned = plan(
            &keys,
            terms.iter().map(|t| t.text.key.as_str()),
            &words,
            features,
        );
        Self {
            record_key: record.map(|r| keys.record(&r.id)),
            fingerprint: record.map(|_| batch_fingerprint(&terms)),
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
    pub(super) fn replan(&mut self, at: usize, features: Features) {
        let keys = self.terms[at..].iter().map(|t| t.text.key.as_str());
        let planned = plan(&self.keys, keys, &self.words[at..], features);
        self.planned.truncate(at);
        self.planned.extend(planned);
        self.features = features;
    }

    /// The call of add.lua for the entries `at..end`, declaring every first-byte set when `wide`.
    pub(super) fn step<'s>(
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
pub(super) struct Planned {
    pub(super) keys: Vec<String>,
    pub(super) work: usize,
}

impl Planned {
    /// The plan of a term with matching form `key` and words `words` in the dictionary `keys`
    /// with `features`: the keys of those features only, and their work.
    pub(super) fn new(
        keys: &DictionaryKeys,
        key: &str,
        words: &[impl AsRef<str>],
        features: Features,
    ) -> Self {
        let mut planned = Vec::with_capacity(4 + 2 * words.len());
        planned.push(keys.lex_of(key));
        let (mut grams, mut word_count, mut sets) = (0, 0, None);
        if features.words {
            word_count = words.len();
            for word in words {
                let word = word.as_ref();
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

/// The words of matching form `form` ([`text::words`]), owned.
pub(super) fn owned_words(form: &str) -> Vec<String> {
    text::words(form).into_iter().map(str::to_owned).collect()
}

/// The plans of the terms with matching forms `forms` and words `words` for `features`.
pub(super) fn plan<'k>(
    keys: &DictionaryKeys,
    forms: impl Iterator<Item = &'k str>,
    words: &[Vec<String>],
    features: Features,
) -> Vec<Planned> {
    forms
        .zip(words)
        .map(|(form, w)| Planned::new(keys, form, w, features))
        .collect()
}

/// An upper bound of the work of one entry of a write batch, in [`STEP_WORK`] units (a member or
/// field read or written, as the scripts count them): its data, lex member and record (12), its
/// words' postings and vocabulary entries (4 a word), for a word new to the vocabulary
/// [`GRAM_WORK`] per gram (the word added to the gram's set), and, in a ranked dictionary
/// (`ranked_sets` given), per ranked set (and its deep set and the top set) its field in `h`, a
/// count, a member added and one removed (4 each). Copies into ranked sets a step creates and
/// cut-backs are counted by the script, within the room the step leaves ([`MAX_STEP_WORK`]).
pub(super) fn entry_work(words: usize, grams: usize, ranked_sets: Option<usize>) -> usize {
    12 + 4 * words + GRAM_WORK * grams + ranked_sets.map_or(0, |n| 4 * (n + 2))
}

/// How many of the items of these work costs (at least one) one step takes within `budget`
/// (at most [`STEP_WORK`], [`Pace::budget`]).
pub(super) fn within_work(costs: impl Iterator<Item = usize>, budget: usize) -> usize {
    let (mut work, mut n) = (0, 0);
    for cost in costs {
        work += cost;
        if work > budget {
            return n.max(1);
        }
        n += 1;
    }
    n
}

/// Per dictionary (its key base), what this Baton learnt from its write steps (the features its
/// writes need, the pace of its steps): a hint for the next batch, for at most [`WRITE_HINTS`]
/// dictionaries (past that, all are forgotten, and learnt again from their next steps).
pub(super) struct Hints<T>(std::sync::Mutex<std::collections::HashMap<String, T>>);

impl<T> Default for Hints<T> {
    fn default() -> Self {
        Self(std::sync::Mutex::default())
    }
}

impl<T: Copy> Hints<T> {
    /// The hint kept for the dictionary with key base `base`, if any.
    pub(super) fn get(&self, base: &str) -> Option<T> {
        let hints = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        hints.get(base).copied()
    }

    /// Keeps `hint` for the dictionary with key base `base`.
    pub(super) fn keep(&self, base: &str, hint: T) {
        let mut hints = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if hints.len() >= WRITE_HINTS && !hints.contains_key(base) {
            hints.clear();
        }
        hints.insert(base.to_owned(), hint);
    }
}

/// The Redis time in microseconds a write step's script reports (`elapsed` in write.lua): 0 when
/// Redis's clock went back meanwhile.
pub(super) fn step_micros(v: &Value) -> Result<u64, Error> {
    Ok(u64::try_from(int(v)?).unwrap_or(0))
}

/// The smallest budget [`Pace`] cuts a step's work down to.
const MIN_STEP_BUDGET: usize = STEP_WORK / 10;

/// The pace of a run of write steps (a batch's, a change's): the work budget of the next step.
/// It is [`STEP_WORK`] until steps report taking longer than [`STEP_TIME`] for it: each step's
/// script reports its Redis time, and the budget is what [`STEP_TIME`] buys at the rate the
/// steps ran (microseconds a planned unit, smoothed over the last steps), at most
/// [`STEP_WORK`] and at least [`MIN_STEP_BUDGET`]. The units of the plan are what bounds a
/// step's work; the pace only makes steps smaller, where the terms' work costs more time a unit
/// than planned (every word new: a key created for each posting and gram).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Pace {
    micros_per_unit: Option<f64>,
}

impl Pace {
    /// The work budget of the next step.
    pub(super) fn budget(self) -> usize {
        let Some(rate) = self.micros_per_unit else {
            return STEP_WORK;
        };
        let micros = STEP_TIME.as_secs_f64() * 1e6;
        // (A rate of 0 or less, from a clock that went back, changes nothing.)
        if rate <= 0.0 {
            return STEP_WORK;
        }
        ((micros / rate) as usize).clamp(MIN_STEP_BUDGET, STEP_WORK)
    }

    /// Notes that a step planned at `planned` units took `micros` of Redis time. A step planned
    /// at less than half the budget it was cut from (a batch's last, a step of one small entry)
    /// is mostly its fixed cost, and is not counted.
    pub(super) fn note(&mut self, planned: usize, budget: usize, micros: u64) {
        if planned == 0 || planned < budget / 2 {
            return;
        }
        let rate = micros as f64 / planned as f64;
        self.micros_per_unit = Some(match self.micros_per_unit {
            None => rate,
            Some(old) => 0.7 * old + 0.3 * rate,
        });
    }
}

/// The most work any write step of this process did (units of [`STEP_WORK`]).
pub(super) static HEAVIEST_STEP: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// The most work any write step of more than one entry (or term) of this process did.
static HEAVIEST_SHARED_STEP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The most work one write step (`Add`, `Remove`, or a step of a RANKED build) of this process
/// did, as its script counted it, in [`STEP_WORK`] units: at most [`MAX_STEP_WORK`], which tests
/// check.
pub fn heaviest_step() -> u64 {
    HEAVIEST_STEP.load(std::sync::atomic::Ordering::Relaxed)
}

/// The most work one write step of more than one entry (or, in a RANKED build, term) of this
/// process did, as its script counted it: at most [`STEP_WORK`] + [`CUT_RESERVE`], which tests
/// check.
pub fn heaviest_shared_step() -> u64 {
    HEAVIEST_SHARED_STEP.load(std::sync::atomic::Ordering::Relaxed)
}

/// The most work any step of a RANKED build of this process did (units of [`STEP_WORK`]).
pub(super) static HEAVIEST_BUILD_STEP: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// The most work one step of a RANKED build (change.lua) of this process did, as its script
/// counted it, in [`STEP_WORK`] units: at most [`MAX_STEP_WORK`] too (it is counted in
/// [`heaviest_step`] as well).
pub fn heaviest_build_step() -> u64 {
    HEAVIEST_BUILD_STEP.load(std::sync::atomic::Ordering::Relaxed)
}

/// Notes the work a write step of `entries` entries (or terms) reports doing.
pub(super) fn note_step_work(v: &Value, entries: usize) -> Result<(), Error> {
    let work = count_u64(v)?;
    HEAVIEST_STEP.fetch_max(work, std::sync::atomic::Ordering::Relaxed);
    if entries > 1 {
        HEAVIEST_SHARED_STEP.fetch_max(work, std::sync::atomic::Ordering::Relaxed);
    }
    tracing::trace!(work, entries, "autocomplete write step");
    Ok(())
}

/// How many of `planned` (at least one) the next step takes: at most `most`, within `budget`
/// (at most [`STEP_WORK`], [`Pace::budget`]).
pub(super) fn next_step(planned: &[Planned], most: usize, budget: usize) -> usize {
    let mut work = 0;
    for (n, p) in planned.iter().take(most).enumerate() {
        work += p.work;
        if work > budget {
            return n.max(1);
        }
    }
    planned.len().min(most).max(1)
}

/// How a step of `len` entries (or terms) refused as too much work, its first `fits` fitting,
/// goes on: those entries first (fewer than `len`), then at most the returned number from the
/// entry that brings the work, half of the rest, so that repeated refusals come down to that
/// entry alone (a step of one is never refused so).
pub(super) fn after_refusal(len: usize, fits: usize) -> (usize, usize) {
    let fits = fits.min(len.saturating_sub(1));
    (fits, ((len - fits) / 2).max(1))
}

/// The keys a step's entries may touch, each once, and every first-byte set when `wide` holds
/// them: what the step declares beyond the dictionary's own keys.
pub(super) fn declared<'k>(step: &'k [Planned], wide: Option<&'k [String]>) -> Vec<&'k str> {
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
pub(super) fn batch_fingerprint(terms: &[NewTerm]) -> String {
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
pub(super) fn outcome(v: &Value) -> Result<(bool, f64), Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The budget follows the Redis time steps take for their work, within its bounds, and a
    /// step planned at less than half its budget does not move it.
    #[test]
    fn the_pace_cuts_steps_that_take_too_long() {
        let mut pace = Pace::default();
        assert_eq!(pace.budget(), STEP_WORK);
        // 1000 units in 1 ms: faster than STEP_TIME asks, the budget stays at its most.
        pace.note(1000, 1000, 1000);
        assert_eq!(pace.budget(), STEP_WORK);
        // Steps of 6 µs a unit: the rate moves towards 6 a step at a time.
        let mut budgets = Vec::new();
        for _ in 0..20 {
            let budget = pace.budget();
            pace.note(budget, budget, u64::try_from(6 * budget).unwrap());
            budgets.push(pace.budget());
        }
        assert!(budgets.windows(2).all(|w| w[1] <= w[0]), "{budgets:?}");
        let settled = (STEP_TIME.as_secs_f64() * 1e6 / 6.0) as usize;
        assert!(budgets[19].abs_diff(settled) <= 2, "{budgets:?}");
        // A step planned at less than half the budget (a batch's last) is not counted.
        let before = pace.budget();
        pace.note(before / 3, before, 1_000_000);
        assert_eq!(pace.budget(), before);
        // A stall counts once, and the budget never goes below its least.
        pace.note(before, before, 10_000_000);
        assert_eq!(pace.budget(), MIN_STEP_BUDGET);
        for _ in 0..30 {
            let budget = pace.budget();
            pace.note(budget, budget, u64::try_from(budget).unwrap());
        }
        assert_eq!(pace.budget(), STEP_WORK);
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
        assert_eq!(next_step(&planned(&[400, 400, 400]), 64, STEP_WORK), 2);
        assert_eq!(next_step(&planned(&[5000, 1]), 64, STEP_WORK), 1);
        assert_eq!(next_step(&planned(&[10; 100]), 64, STEP_WORK), 64);
        assert_eq!(next_step(&planned(&[10; 100]), 3, STEP_WORK), 3);
        assert_eq!(next_step(&planned(&[10; 5]), 64, STEP_WORK), 5);
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
        // It goes alone, within the most one entry can plan: its 255 2-letter and 254 3-letter
        // grams, if all distinct, a word and two ranked sets.
        let most = entry_work(1, 255 + 254, Some(2));
        assert_eq!(most, 2068);
        assert!(heaviest.work > STEP_WORK, "{}", heaviest.work);
        assert!(heaviest.work <= most, "{}", heaviest.work);
        assert!(most <= MAX_ENTRY_WORK);
        let mut two = planned(&[10]);
        two.insert(0, heaviest);
        assert_eq!(next_step(&two, 64, STEP_WORK), 1);
    }
}
