//! The driver of a change of a dictionary's features: the steps that build or delete indexes
//! in the background, under a lease in Redis that any Baton takes over when its holder is gone.

use super::*;

impl Autocomplete {
    /// A write or a read of `dictionary` (keys `keys`) found a change of its features under way:
    /// at most once per [`CHANGE_CHECK`] per dictionary, looks in the background whether a Baton
    /// holds the change's lease, and drives the change when none does. So a change whose driver
    /// died (its Baton killed or restarted) goes on while the dictionary is used, and does not
    /// wait for the next `Describe` or `Configure`.
    pub(super) fn resume_change(&self, dictionary: &str, keys: &DictionaryKeys) {
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
        let mut pace = Pace::default();
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
            let budget = pace.budget();
            let (touched, args, planned) = self.next_change_step(&keys, most, wide, budget).await?;
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let invocation =
                scripts::change(&self.inner.change, &keys, &owner, lease_ms, &touched, &args);
            let reply: Vec<Value> = self.inner.redis.eval(&invocation).await?;
            match reply.first().map(int).transpose()? {
                Some(1) => {
                    let micros = reply.get(1).map(step_micros).transpose()?.unwrap_or(0);
                    pace.note(planned, budget, micros);
                    if let Some(work) = reply.get(2) {
                        let terms = reply.get(3).map(count_u64).transpose()?.unwrap_or(0);
                        note_step_work(work, usize::try_from(terms).unwrap_or(usize::MAX))?;
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

    /// Reads what the next step of the change of `keys`'s features covers: the keys it touches,
    /// its arguments (change.lua), and the work it was planned at within `budget` (0 for a step
    /// not planned by its work). A step of a RANKED build covers at most `most` terms and
    /// declares every first-byte set when `wide`.
    async fn next_change_step(
        &self,
        keys: &DictionaryKeys,
        most: usize,
        wide: bool,
        budget: usize,
    ) -> Result<(Vec<String>, Vec<Vec<u8>>, usize), Error> {
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
            return Ok((Vec::new(), vec![b"drop-r".to_vec()], 0));
        };
        let dropping = field(3).unwrap_or_default();
        let mut touched = Vec::new();
        let mut args: Vec<Vec<u8>> = Vec::new();
        // The work of the items a step takes, within the budget.
        let mut planned = 0;
        let mut fit = |costs: Vec<usize>| -> usize {
            let n = within_work(costs.iter().copied(), budget).min(costs.len());
            planned = costs[..n].iter().sum();
            n
        };
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
                words.truncate(fit(words
                    .iter()
                    .map(|w| 2 + GRAM_WORK * text::grams(w).len())
                    .collect()));
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
            let n = fit(words
                .iter()
                .map(|w| 1 + GRAM_WORK * text::grams(w).len())
                .collect());
            let all = words.len() < CHANGE_STEP && n == words.len();
            words.truncate(n);
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
                let k = fit(costs).min(members.len());
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
                members.truncate(fit(members
                    .iter()
                    .map(|m| 1 + 2 * text::words(&member_form(m)).len())
                    .collect()));
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
                // As many words as fit a step's work: a gram set a gram, `GRAM_WORK` units each.
                words.truncate(fit(words
                    .iter()
                    .map(|w| 1 + GRAM_WORK * text::grams(w).len())
                    .collect()));
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
        Ok((touched, args, planned))
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
}
