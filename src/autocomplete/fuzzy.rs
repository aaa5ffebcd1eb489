//! The fuzzy walk's steps (`fuzzy.lua`): what each step is given, and the page gathered from
//! their replies.

use redis::Value;

use super::{
    Error, FUZZY_CALLS, FUZZY_ENTRIES, FUZZY_LEX_STEP_CALLS, FUZZY_STEP_CALLS, FUZZY_STEP_ENTRIES,
    MAX_FUZZY_EDITS, MatchKind, Order, Page, Suggestion, bytes, int, parse_value, unexpected,
};

/// Where the next step of a fuzzy walk starts, and the budget it gets.
pub(super) struct FuzzyStep {
    /// The most reads of index sets the step makes.
    pub(super) calls: usize,
    /// The most lex members those reads may return.
    pub(super) entries: usize,
    /// The stage it starts at.
    pub(super) stage: i64,
    /// Where in that stage the previous step stopped (empty for its start).
    pub(super) position: Vec<u8>,
    /// Matches earlier steps found in the groups before the stage's.
    pub(super) before: usize,
    /// Matches earlier steps found in the stage's group.
    pub(super) have: usize,
    /// The ranked member where the best-first read of the node at `position` stopped (empty
    /// when the position is not inside such a read).
    pub(super) resume: Vec<u8>,
    /// The matches that read found so far.
    pub(super) resumed_found: usize,
}

/// A fuzzy page gathered over the steps of its walk (`fuzzy.lua`): each step reads at most
/// [`FUZZY_STEP_CALLS`] index sets ([`FUZZY_LEX_STEP_CALLS`] in lexicographic order), all of them
/// at most [`FUZZY_CALLS`]. A best-first read larger than a step goes on in the next step from
/// the ranked member it stopped at. Should a step still make no progress on its budget, the next
/// one gets what is left of the call's budget at once, as a single longer step, before the walk
/// says it is incomplete.
pub(super) struct FuzzyWalk {
    limit: usize,
    /// The most reads of index sets a step makes.
    step_calls: usize,
    calls: usize,
    entries: usize,
    /// Where the next step starts: stage, position, and where in the position's best-first
    /// read (with the matches it found so far).
    stage: i64,
    position: Vec<u8>,
    resume: Vec<u8>,
    resumed_found: usize,
    /// Whether the next step gets the whole budget left (the last one made no progress).
    wide: bool,
    /// `Some(incomplete)` once the walk is over.
    over: Option<bool>,
    /// Matches found per distance, over the steps.
    found: [usize; 3],
    /// The matches kept: distance, sort key, suggestion.
    kept: Vec<(u8, Vec<u8>, Suggestion)>,
}

impl FuzzyWalk {
    pub(super) fn new(limit: u32, order: Order) -> Self {
        Self {
            limit: limit as usize,
            step_calls: match order {
                Order::Lexicographic => FUZZY_LEX_STEP_CALLS,
                Order::Score => FUZZY_STEP_CALLS,
            },
            calls: FUZZY_CALLS,
            entries: FUZZY_ENTRIES,
            stage: 0,
            position: Vec::new(),
            resume: Vec::new(),
            resumed_found: 0,
            wide: false,
            over: None,
            found: [0; 3],
            kept: Vec::new(),
        }
    }

    /// The next step to run, or `None` once the walk is over.
    pub(super) fn next_step(&self) -> Option<FuzzyStep> {
        if self.over.is_some() {
            return None;
        }
        // The stage's group: stage 0 is group 0, stages 2t - 1 and 2t group t.
        let group = usize::try_from((self.stage + 1) / 2).map_or(0, |g| g.min(2));
        let (calls, entries) = if self.wide {
            (self.calls, self.entries)
        } else {
            (
                self.calls.min(self.step_calls),
                self.entries.min(FUZZY_STEP_ENTRIES),
            )
        };
        Some(FuzzyStep {
            calls,
            entries,
            stage: self.stage,
            position: self.position.clone(),
            before: self.found[..group].iter().sum(),
            have: self.found[group],
            resume: self.resume.clone(),
            resumed_found: self.resumed_found,
        })
    }

    /// Takes in the reply of the step `next_step` gave.
    pub(super) fn absorb(&mut self, reply: &[Value]) -> Result<(), Error> {
        let [
            finished,
            next,
            at,
            used_calls,
            used_entries,
            f0,
            f1,
            f2,
            resume,
            resumed_found,
            rows @ ..,
        ] = reply
        else {
            return Err(unexpected("fuzzy reply"));
        };
        self.calls = self.calls.saturating_sub(count(used_calls)?);
        self.entries = self.entries.saturating_sub(count(used_entries)?);
        for (n, f) in self.found.iter_mut().zip([f0, f1, f2]) {
            *n += count(f)?;
        }
        for row in rows.chunks(5) {
            let [distance, key, id, value, kind] = row else {
                return Err(unexpected("fuzzy row"));
            };
            let distance = u8::try_from(int(distance)?)
                .ok()
                .filter(|d| *d <= 2)
                .ok_or_else(|| unexpected("distance"))?;
            let (score, display, payload) = parse_value(id, value)?;
            self.kept.push((
                distance,
                bytes(key)?,
                Suggestion {
                    display,
                    score,
                    payload,
                    kind: MatchKind::from_script(int(kind)?)?,
                    distance: u32::from(distance),
                },
            ));
        }
        if int(finished)? != 0 {
            self.over = Some(false);
            return Ok(());
        }
        if self.calls == 0 || self.entries == 0 {
            self.over = Some(true);
            return Ok(());
        }
        let (next, at, resume) = (int(next)?, bytes(at)?, bytes(resume)?);
        // Stages run from 0 to 2 × the most edits, forward only.
        if next < self.stage || next > 2 * i64::from(MAX_FUZZY_EDITS) {
            return Err(unexpected("fuzzy stage"));
        }
        if next == self.stage && at == self.position && resume == self.resume {
            // No progress on a step's budget: one step with all that is left, then no more.
            if self.wide {
                self.over = Some(true);
                return Ok(());
            }
            self.wide = true;
        } else {
            self.wide = false;
        }
        (self.stage, self.position, self.resume) = (next, at, resume);
        self.resumed_found = count(resumed_found)?;
        Ok(())
    }

    /// The page: each distance in its order (sort keys sort in result order), fewest edits
    /// first; a term that two steps both found (a step done again) counts once.
    pub(super) fn page(mut self) -> Page<Suggestion> {
        self.kept.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let mut seen = std::collections::HashSet::new();
        Page {
            items: self
                .kept
                .into_iter()
                .map(|(_, _, s)| s)
                .filter(|s| seen.insert(s.display.clone()))
                .take(self.limit)
                .collect(),
            next_page_token: String::new(),
            incomplete: self.over.unwrap_or(true),
        }
    }
}

fn count(v: &Value) -> Result<usize, Error> {
    usize::try_from(int(v)?).map_err(|_| unexpected("count"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step's reply with no match: finished or not, where the next step starts, the calls and
    /// entries it used, and where its best-first read stopped.
    fn reply(finished: i64, stage: i64, at: &[u8], calls: i64, resume: &[u8]) -> Vec<Value> {
        vec![
            Value::Int(finished),
            Value::Int(stage),
            Value::BulkString(at.to_vec()),
            Value::Int(calls),
            Value::Int(10),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            Value::BulkString(resume.to_vec()),
            Value::Int(0),
        ]
    }

    #[test]
    fn a_read_that_goes_on_is_progress_and_one_that_does_not_ends_the_walk() {
        let mut walk = FuzzyWalk::new(10, Order::Score);
        walk.absorb(&reply(0, 1, b"ab", 200, b"r1")).unwrap();
        // The same node, the read further on: a step of the usual size.
        walk.absorb(&reply(0, 1, b"ab", 200, b"r2")).unwrap();
        let step = walk.next_step().unwrap();
        assert_eq!(
            (step.calls, step.resume.as_slice()),
            (FUZZY_STEP_CALLS, &b"r2"[..])
        );
        // No progress: one step with all that is left, then the walk is over, incomplete.
        walk.absorb(&reply(0, 1, b"ab", 10, b"r2")).unwrap();
        let step = walk.next_step().unwrap();
        assert_eq!(step.calls, FUZZY_CALLS - 410);
        walk.absorb(&reply(0, 1, b"ab", 5, b"r2")).unwrap();
        assert!(walk.next_step().is_none());
        assert!(walk.page().incomplete);
    }

    #[test]
    fn a_stage_that_goes_back_is_refused() {
        let mut walk = FuzzyWalk::new(10, Order::Lexicographic);
        walk.absorb(&reply(0, 2, b"x\xff", 1, b"")).unwrap();
        assert!(walk.absorb(&reply(0, 1, b"y\xff", 1, b"")).is_err());
        assert!(walk.absorb(&reply(0, 5, b"y\xff", 1, b"")).is_err());
    }
}
