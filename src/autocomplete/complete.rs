//! Completion reads of a dictionary: one page of a mode's matches, and the fuzzy walk's page
//! gathered over its steps.

use super::*;

impl Autocomplete {
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
}
