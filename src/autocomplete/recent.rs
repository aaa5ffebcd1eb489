//! Recent lists: items recorded most recent first, listed and completed.

use super::*;

impl Autocomplete {
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
