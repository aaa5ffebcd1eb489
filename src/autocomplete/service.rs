//! The `baton.v1.AutocompleteService` gRPC handler: validates requests into domain types, calls
//! [`Autocomplete`], and turns results back into responses. Validation errors name the proto
//! field (`terms[3].display` for an entry of a batch).

use std::{
    collections::HashMap,
    time::{Duration, SystemTime},
};

use tonic::{Code, Request, Response, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::{
    AUTO_REQUEST_MEMORY, Autocomplete, Completion, DEFAULT_LIMIT, DEFAULT_LIST_LIMIT,
    DEFAULT_RECENT_ITEMS, DEFAULT_RECENT_TTL, Description, FeatureChange, Features, MAX_ABS_SCORE,
    MAX_FORM_BYTES, MAX_NAME_BYTES, MAX_PAYLOAD_BYTES, MAX_RECENT_ITEMS, MAX_RECENT_TTL,
    MAX_REQUEST_ID_BYTES, MAX_RESULTS, MAX_TERMS, MAX_TEXT_BYTES, MIN_RECENT_TTL, MatchKind,
    MatchMode, NewTerm, Order, REQUEST_MEMORY, RecentItem, Record, ScoreChange, Suggestion,
    TermPart, Text, off_workers, term_field, text,
};
use crate::{
    error::{Error, Field, UNAVAILABLE_RETRY_AFTER},
    grpc::wire,
    metrics,
    proto::v1::{self as pb, autocomplete_service_server::AutocompleteService},
};

/// The `ErrorInfo` reason of an `Add` that failed after it may have applied part of its batch.
pub const ADD_MAY_BE_PARTIAL: &str = "ADD_MAY_BE_PARTIAL";
/// The `ErrorInfo` domain of the service's errors.
pub const ERROR_DOMAIN: &str = "baton.v1.AutocompleteService";

/// The AutocompleteService implementation.
#[derive(Clone)]
pub struct AutocompleteApi {
    autocomplete: Autocomplete,
}

impl AutocompleteApi {
    /// A handler over `autocomplete`.
    pub fn new(autocomplete: Autocomplete) -> Self {
        Self { autocomplete }
    }
}

/// A dictionary or list name: 1 to [`MAX_NAME_BYTES`] bytes (also checked by `baton autocomplete
/// load` before it sends anything).
pub(crate) fn name(field: impl Into<Field>, value: &str) -> Result<String, Error> {
    wire::text(field, value, MAX_NAME_BYTES).map(str::to_owned)
}

/// A display text: 1 to [`MAX_TEXT_BYTES`] bytes, no U+0000, something other than whitespace,
/// at most [`MAX_FORM_BYTES`] once normalized (also checked by `baton autocomplete load` on each
/// line it reads, so that a line Baton would refuse stops the load where it is).
pub(crate) fn display(field: impl Into<Field>, value: &str) -> Result<Text, Error> {
    let field = field.into();
    wire::text(field.clone(), value, MAX_TEXT_BYTES)?;
    if value.contains('\0') {
        return Err(Error::invalid(field, "must not contain U+0000"));
    }
    let text = Text::new(value).ok_or_else(|| {
        Error::invalid(
            field.clone(),
            "must contain a character other than whitespace",
        )
    })?;
    if text.key.len() > MAX_FORM_BYTES || text.id.len() > MAX_FORM_BYTES {
        return Err(Error::invalid(
            field,
            format!("grows past {MAX_FORM_BYTES} bytes when normalized"),
        ));
    }
    Ok(text)
}

/// A query's matching form: 1 to [`MAX_TEXT_BYTES`] bytes, no U+0000, not only whitespace.
fn query(value: &str) -> Result<String, Error> {
    let field = "query";
    wire::text(field, value, MAX_TEXT_BYTES)?;
    if value.contains('\0') {
        return Err(Error::invalid(field, "must not contain U+0000"));
    }
    let form = text::query_form(value);
    if form.is_empty() {
        return Err(Error::invalid(
            field,
            "must contain a character other than whitespace",
        ));
    }
    if form.len() > MAX_FORM_BYTES {
        return Err(Error::invalid(
            field,
            format!("grows past {MAX_FORM_BYTES} bytes when normalized"),
        ));
    }
    Ok(form)
}

fn limit(field: impl Into<Field>, value: u32, default: u32, max: u32) -> Result<u32, Error> {
    match value {
        0 => Ok(default),
        v if v <= max => Ok(v),
        v => Err(Error::invalid(
            field,
            format!("{v} is more than the {max} allowed"),
        )),
    }
}

/// A payload: at most [`MAX_PAYLOAD_BYTES`] bytes.
pub(crate) fn payload(
    field: impl Into<Field>,
    value: Option<Vec<u8>>,
) -> Result<Option<Vec<u8>>, Error> {
    match value {
        Some(p) if p.len() > MAX_PAYLOAD_BYTES => Err(Error::invalid(
            field,
            format!(
                "is {} bytes, more than the {MAX_PAYLOAD_BYTES} allowed",
                p.len()
            ),
        )),
        other => Ok(other),
    }
}

/// A recent list's ttl: absent means the default; present, it must be within bounds (zero
/// included: it is not taken for absent).
fn recent_ttl(value: Option<prost_types::Duration>) -> Result<Duration, Error> {
    let field = "ttl";
    let Some(d) = value else {
        return Ok(DEFAULT_RECENT_TTL);
    };
    if wire::millis(field, Some(d))?.is_none() {
        return Err(Error::invalid(
            field,
            format!(
                "0s is outside {} to {} (leave it unset for {})",
                humantime::format_duration(MIN_RECENT_TTL),
                humantime::format_duration(MAX_RECENT_TTL),
                humantime::format_duration(DEFAULT_RECENT_TTL)
            ),
        ));
    }
    wire::bounded(field, Some(d), MIN_RECENT_TTL, MAX_RECENT_TTL)
}

/// The record of an `Add`: under the client's request id, or for a batch with an increment
/// (`increments`), under one made up here (the client learns it from the status if the call
/// fails).
fn record(request_id: &str, increments: bool) -> Result<Option<Record>, Error> {
    wire::optional_text("request_id", request_id, MAX_REQUEST_ID_BYTES)?;
    if !request_id.is_empty() {
        return Ok(Some(Record {
            id: request_id.to_owned(),
            memory: REQUEST_MEMORY,
        }));
    }
    Ok(increments.then(|| Record {
        id: format!("baton-{}", uuid::Uuid::new_v4()),
        memory: AUTO_REQUEST_MEMORY,
    }))
}

/// The status of an `Add` that failed. One that may have left its batch applied in part
/// (`UNAVAILABLE`, or `INTERNAL` after an unexpected Redis error) names the request id to retry
/// with, in its message and in an `ErrorInfo` detail.
fn add_failed(error: Error, record: Option<&Record>) -> Status {
    let code = match error {
        Error::Unavailable(_) | Error::Unanswered(_) => Code::Unavailable,
        Error::Internal(_) => Code::Internal,
        _ => return error.into(),
    };
    let Some(record) = record else {
        return error.into();
    };
    let mut details = ErrorDetails::new();
    if code == Code::Unavailable {
        details.set_retry_info(Some(UNAVAILABLE_RETRY_AFTER));
    }
    details.set_error_info(
        ADD_MAY_BE_PARTIAL,
        ERROR_DOMAIN,
        HashMap::from([("request_id".to_owned(), record.id.clone())]),
    );
    Status::with_error_details(
        code,
        format!(
            "{error}; the batch may be applied in part: send it again with request_id {:?} to \
             apply the rest once",
            record.id
        ),
        details,
    )
}

fn batch_size(field: impl Into<Field>, len: usize) -> Result<(), Error> {
    if len == 0 {
        return Err(Error::invalid(field, "must not be empty"));
    }
    if len > MAX_TERMS {
        return Err(Error::invalid(
            field,
            format!("has {len} entries, more than the {MAX_TERMS} allowed"),
        ));
    }
    Ok(())
}

fn term(i: usize, t: pb::AutocompleteTerm) -> Result<NewTerm, Error> {
    let text = display(term_field(i, TermPart::Display), &t.display)?;
    let score_field = || term_field(i, TermPart::Score);
    let score = match (t.score, t.increment) {
        (None, false) => ScoreChange::Keep,
        (None, true) => {
            return Err(Error::invalid(
                score_field(),
                "is required when increment is true",
            ));
        }
        (Some(v), _) if !v.is_finite() || v.abs() > MAX_ABS_SCORE => {
            return Err(Error::invalid(
                score_field(),
                format!("must be a finite number within ±{MAX_ABS_SCORE:e}"),
            ));
        }
        (Some(v), false) => ScoreChange::Set(v),
        (Some(v), true) => ScoreChange::Increment(v),
    };
    Ok(NewTerm {
        text,
        score,
        payload: payload(term_field(i, TermPart::Payload), t.payload)?,
    })
}

fn texts(field: impl Into<Field>, values: &[String]) -> Result<Vec<Text>, Error> {
    batch_size(field, values.len())?;
    values
        .iter()
        .enumerate()
        .map(|(i, v)| display(term_field(i, TermPart::Removal), v))
        .collect()
}

/// A dictionary's features from `Configure`'s list: each a known feature, once; `SUBSTRING`
/// only with `WORDS`.
fn features(values: &[i32]) -> Result<Features, Error> {
    let mut features = Features {
        ranked: false,
        words: false,
        substring: false,
    };
    for (i, value) in values.iter().enumerate() {
        let field = || Field::from(format!("features[{i}]"));
        let flag = match pb::AutocompleteFeature::try_from(*value) {
            Ok(pb::AutocompleteFeature::Ranked) => &mut features.ranked,
            Ok(pb::AutocompleteFeature::Words) => &mut features.words,
            Ok(pb::AutocompleteFeature::Substring) => &mut features.substring,
            Ok(pb::AutocompleteFeature::Unspecified) => {
                return Err(Error::invalid(
                    field(),
                    "AUTOCOMPLETE_FEATURE_UNSPECIFIED is not a feature",
                ));
            }
            Err(_) => {
                return Err(Error::invalid(
                    field(),
                    format!("{value} is not an AutocompleteFeature"),
                ));
            }
        };
        if *flag {
            return Err(Error::invalid(field(), "repeats a feature listed before"));
        }
        *flag = true;
    }
    if features.substring && !features.words {
        return Err(Error::invalid(
            "features",
            "AUTOCOMPLETE_FEATURE_SUBSTRING needs AUTOCOMPLETE_FEATURE_WORDS (substring matching \
             finds words through the vocabulary)",
        ));
    }
    Ok(features)
}

/// Features as the proto lists them, in the enum's order.
fn feature_list(f: Features) -> Vec<i32> {
    [
        (f.ranked, pb::AutocompleteFeature::Ranked),
        (f.words, pb::AutocompleteFeature::Words),
        (f.substring, pb::AutocompleteFeature::Substring),
    ]
    .into_iter()
    .filter_map(|(on, feature)| on.then_some(feature.into()))
    .collect()
}

/// A change of features as the proto says it.
fn feature_change(c: FeatureChange) -> pb::AutocompleteFeatureChange {
    pb::AutocompleteFeatureChange {
        features: feature_list(c.target),
        building: match c.building {
            Some(b'r') => pb::AutocompleteFeature::Ranked,
            Some(b'w') => pb::AutocompleteFeature::Words,
            Some(b's') => pb::AutocompleteFeature::Substring,
            _ => pb::AutocompleteFeature::Unspecified,
        }
        .into(),
        indexed: c.indexed,
        dropping: feature_list(c.dropping),
    }
}

/// A match mode as the metrics label it.
fn mode_label(mode: MatchMode) -> &'static str {
    match mode {
        MatchMode::Prefix => "prefix",
        MatchMode::WordPrefix => "word_prefix",
        MatchMode::Suffix => "suffix",
        MatchMode::Contains => "contains",
        MatchMode::Automatic => "automatic",
        MatchMode::Fuzzy => "fuzzy",
    }
}

fn mode(value: i32) -> Result<MatchMode, Error> {
    match pb::AutocompleteMatchMode::try_from(value) {
        Ok(pb::AutocompleteMatchMode::Unspecified | pb::AutocompleteMatchMode::Prefix) => {
            Ok(MatchMode::Prefix)
        }
        Ok(pb::AutocompleteMatchMode::WordPrefix) => Ok(MatchMode::WordPrefix),
        Ok(pb::AutocompleteMatchMode::Suffix) => Ok(MatchMode::Suffix),
        Ok(pb::AutocompleteMatchMode::Contains) => Ok(MatchMode::Contains),
        Ok(pb::AutocompleteMatchMode::Automatic) => Ok(MatchMode::Automatic),
        Ok(pb::AutocompleteMatchMode::Fuzzy) => Ok(MatchMode::Fuzzy),
        Err(_) => Err(Error::invalid(
            "mode",
            format!("{value} is not an AutocompleteMatchMode"),
        )),
    }
}

fn order(value: i32) -> Result<Order, Error> {
    match pb::AutocompleteOrder::try_from(value) {
        Ok(pb::AutocompleteOrder::Unspecified | pb::AutocompleteOrder::Lexicographic) => {
            Ok(Order::Lexicographic)
        }
        Ok(pb::AutocompleteOrder::Score) => Ok(Order::Score),
        Err(_) => Err(Error::invalid(
            "order",
            format!("{value} is not an AutocompleteOrder"),
        )),
    }
}

fn kind(k: MatchKind) -> pb::AutocompleteMatchKind {
    match k {
        MatchKind::Exact => pb::AutocompleteMatchKind::Exact,
        MatchKind::Prefix => pb::AutocompleteMatchKind::Prefix,
        MatchKind::WordPrefix => pb::AutocompleteMatchKind::WordPrefix,
        MatchKind::Suffix => pb::AutocompleteMatchKind::Suffix,
        MatchKind::Contains => pb::AutocompleteMatchKind::Contains,
        MatchKind::Fuzzy => pb::AutocompleteMatchKind::Fuzzy,
    }
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

fn suggestion(s: Suggestion) -> pb::AutocompleteSuggestion {
    pb::AutocompleteSuggestion {
        display: s.display,
        score: s.score,
        payload: s.payload,
        match_kind: kind(s.kind).into(),
        edit_distance: s.distance,
    }
}

fn recent_item(item: RecentItem) -> pb::AutocompleteRecentItem {
    pb::AutocompleteRecentItem {
        display: item.display,
        payload: item.payload,
        recorded_at: Some(timestamp(item.recorded_at)),
        match_kind: item
            .kind
            .map_or(pb::AutocompleteMatchKind::Unspecified, kind)
            .into(),
    }
}

#[tonic::async_trait]
impl AutocompleteService for AutocompleteApi {
    async fn add(
        &self,
        request: Request<pb::AutocompleteServiceAddRequest>,
    ) -> Result<Response<pb::AutocompleteServiceAddResponse>, Status> {
        // Steps run only while the caller can still hear how far the batch went: until a fifth
        // (at most a second) before its deadline.
        let stop_by = wire::deadline(request.metadata()).and_then(|d| {
            tokio::time::Instant::now().checked_add(d - (d / 5).min(Duration::from_secs(1)))
        });
        let req = request.into_inner();
        let dictionary = name("dictionary", &req.dictionary)?;
        batch_size("terms", req.terms.len())?;
        // An increment is a score with `increment` set (one without a score is refused with the
        // terms, below).
        let increments = req.terms.iter().any(|t| t.increment && t.score.is_some());
        let record = record(&req.request_id, increments)?;
        let entries = req.terms.len();
        let sent = req.terms;
        // Checking and normalizing the terms is CPU work: done off the async workers, with the
        // planning, and given up once the caller's deadline is near.
        let make = move |in_time: &dyn Fn() -> Result<(), Error>| {
            sent.into_iter()
                .enumerate()
                .map(|(i, t)| {
                    in_time()?;
                    term(i, t)
                })
                .collect::<Result<Vec<_>, _>>()
        };
        let added = self
            .autocomplete
            .add(&dictionary, entries, make, record.as_ref(), stop_by)
            .await
            .map_err(|e| add_failed(e, record.as_ref()))?;
        metrics::autocomplete_terms(u64::from(added.added), u64::from(added.updated), 0);
        Ok(Response::new(pb::AutocompleteServiceAddResponse {
            added: added.added,
            updated: added.updated,
            scores: added.scores,
            term_count: added.term_count,
        }))
    }

    async fn remove(
        &self,
        request: Request<pb::AutocompleteServiceRemoveRequest>,
    ) -> Result<Response<pb::AutocompleteServiceRemoveResponse>, Status> {
        let req = request.into_inner();
        let dictionary = name("dictionary", &req.dictionary)?;
        let displays = req.displays;
        let (removed, term_count) = self
            .autocomplete
            .remove(&dictionary, move || texts("displays", &displays))
            .await?;
        metrics::autocomplete_terms(0, 0, u64::from(removed));
        Ok(Response::new(pb::AutocompleteServiceRemoveResponse {
            removed,
            term_count,
        }))
    }

    async fn describe(
        &self,
        request: Request<pb::AutocompleteServiceDescribeRequest>,
    ) -> Result<Response<pb::AutocompleteServiceDescribeResponse>, Status> {
        let req = request.into_inner();
        let dictionary = name("dictionary", &req.dictionary)?;
        let Description {
            term_count,
            features,
            declared,
            change,
        } = self.autocomplete.describe(&dictionary).await?;
        Ok(Response::new(pb::AutocompleteServiceDescribeResponse {
            term_count,
            features: feature_list(features),
            features_declared: declared,
            change: change.map(feature_change),
        }))
    }

    async fn configure(
        &self,
        request: Request<pb::AutocompleteServiceConfigureRequest>,
    ) -> Result<Response<pb::AutocompleteServiceConfigureResponse>, Status> {
        let req = request.into_inner();
        let dictionary = name("dictionary", &req.dictionary)?;
        let features = features(&req.features)?;
        let d = self.autocomplete.configure(&dictionary, features).await?;
        Ok(Response::new(pb::AutocompleteServiceConfigureResponse {
            features: feature_list(d.features),
            term_count: d.term_count,
            change: d.change.map(feature_change),
        }))
    }

    async fn complete(
        &self,
        request: Request<pb::AutocompleteServiceCompleteRequest>,
    ) -> Result<Response<pb::AutocompleteServiceCompleteResponse>, Status> {
        let req = request.into_inner();
        let dictionary = name("dictionary", &req.dictionary)?;
        let mode = mode(req.mode)?;
        if req.max_edits.is_some() && mode != MatchMode::Fuzzy {
            return Err(
                Error::invalid("max_edits", "is only for AUTOCOMPLETE_MATCH_MODE_FUZZY").into(),
            );
        }
        let completion = Completion {
            query: query(&req.query)?,
            mode,
            order: order(req.order)?,
            limit: limit("limit", req.limit, DEFAULT_LIMIT, MAX_RESULTS)?,
            page_token: req.page_token,
            max_edits: req.max_edits,
        };
        metrics::autocomplete_query("complete", mode_label(completion.mode));
        let page = self.autocomplete.complete(&dictionary, &completion).await?;
        Ok(Response::new(pb::AutocompleteServiceCompleteResponse {
            suggestions: page.items.into_iter().map(suggestion).collect(),
            next_page_token: page.next_page_token,
            incomplete: page.incomplete,
        }))
    }

    async fn record_recent(
        &self,
        request: Request<pb::AutocompleteServiceRecordRecentRequest>,
    ) -> Result<Response<pb::AutocompleteServiceRecordRecentResponse>, Status> {
        let req = request.into_inner();
        let list = name("list", &req.list)?;
        let text = display("display", &req.display)?;
        let payload = payload("payload", req.payload)?;
        let max_items = limit(
            "max_items",
            req.max_items,
            DEFAULT_RECENT_ITEMS,
            MAX_RECENT_ITEMS,
        )?;
        let ttl = recent_ttl(req.ttl)?;
        let recorded = self
            .autocomplete
            .record(&list, &text, payload.as_deref(), max_items, ttl)
            .await?;
        Ok(Response::new(pb::AutocompleteServiceRecordRecentResponse {
            size: recorded.size,
            evicted: recorded.evicted,
            recorded_at: Some(timestamp(recorded.recorded_at)),
        }))
    }

    async fn remove_recent(
        &self,
        request: Request<pb::AutocompleteServiceRemoveRecentRequest>,
    ) -> Result<Response<pb::AutocompleteServiceRemoveRecentResponse>, Status> {
        let req = request.into_inner();
        let list = name("list", &req.list)?;
        let displays = req.displays;
        // Normalizing up to a batch of texts is CPU work: done off the async workers.
        let texts = off_workers(move || texts("displays", &displays)).await??;
        let (removed, size) = self.autocomplete.remove_recent(&list, &texts).await?;
        Ok(Response::new(pb::AutocompleteServiceRemoveRecentResponse {
            removed,
            size,
        }))
    }

    async fn list_recent(
        &self,
        request: Request<pb::AutocompleteServiceListRecentRequest>,
    ) -> Result<Response<pb::AutocompleteServiceListRecentResponse>, Status> {
        let req = request.into_inner();
        let list = name("list", &req.list)?;
        let limit = limit("limit", req.limit, DEFAULT_LIST_LIMIT, MAX_RECENT_ITEMS)?;
        let page = self
            .autocomplete
            .list_recent(&list, limit, &req.page_token)
            .await?;
        Ok(Response::new(pb::AutocompleteServiceListRecentResponse {
            items: page.items.into_iter().map(recent_item).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn complete_recent(
        &self,
        request: Request<pb::AutocompleteServiceCompleteRecentRequest>,
    ) -> Result<Response<pb::AutocompleteServiceCompleteRecentResponse>, Status> {
        let req = request.into_inner();
        let list = name("list", &req.list)?;
        let query = query(&req.query)?;
        let mode = mode(req.mode)?;
        if mode == MatchMode::Fuzzy {
            return Err(Error::invalid("mode", "FUZZY is for dictionaries only").into());
        }
        let limit = limit("limit", req.limit, DEFAULT_LIMIT, MAX_RESULTS)?;
        metrics::autocomplete_query("complete_recent", mode_label(mode));
        let page = self
            .autocomplete
            .complete_recent(&list, &query, mode, limit, &req.page_token)
            .await?;
        Ok(Response::new(
            pb::AutocompleteServiceCompleteRecentResponse {
                items: page.items.into_iter().map(recent_item).collect(),
                next_page_token: page.next_page_token,
            },
        ))
    }
}
