//! Envoy's rate limit API (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`) over
//! the same limiter, with limits from the [`Rules`] file.
//!
//! Each descriptor with a limit is one decision (one script call); the decisions of a request run
//! concurrently. Every descriptor's status is filled in: its code, the limit that applied, the
//! units remaining, and the time until reset (when over the limit: until the request would be
//! allowed). Shadow-mode rules and failure-mode answers are reported in the response's dynamic
//! metadata, which Envoy stores under the `envoy.filters.http.ratelimit` namespace (visible in
//! access logs); Baton logs shadow-mode hits at debug level and failure-mode answers as warnings
//! (at most one a second).
//!
//! Envoy fills the descriptor entries' `string` fields with whatever bytes it took from the
//! request (a header's value, a path), which need not be UTF-8: a client sending `x-user: caf\xe9`
//! in Latin-1 makes Envoy send an entry value that a strict protobuf decoder refuses, failing the
//! whole call, and Envoy's failure mode then decides every limit of that request. So the method
//! is served by [`EnvoyRateLimitServer`], which decodes the request as [`LenientRateLimitRequest`]
//! (the same message with `bytes` for the entries' keys and values) and turns each key and value
//! that is not UTF-8 into text with [`entry_text`].

use std::{
    collections::HashMap,
    fmt::Write as _,
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::{
            RateLimitDescriptor,
            rate_limit_descriptor::{Entry, RateLimitOverride},
        },
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit as PbUnit},
        },
    },
    google::protobuf::{self as gpb, UInt64Value, value::Kind},
};
use tokio_util::sync::CancellationToken;
use tonic::{
    Request, Response, Status,
    codegen::{Body, BoxFuture, Context, Poll, Service, StdError, http},
    server::{Grpc, NamedService, UnaryService},
};

use super::{
    Algorithm, DecidedBy, Decision, MAX_UNITS, Rate, RateLimiter,
    rules::{
        self, MAX_DESCRIPTORS, MAX_DOMAIN_BYTES, MAX_ENTRIES, MAX_ENTRY_BYTES, Quota, Rule, Rules,
        Unit,
    },
};
use crate::{
    codec::LeanCodec,
    config::FailureMode,
    error::Error,
    metrics::{self, Api, RateDecision},
};

/// The full name of Envoy's rate limit service.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";
/// The path of its one method.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `envoy.service.ratelimit.v3.RateLimitRequest` as it is decoded: the same fields and tags, with
/// the descriptor entries' `string` fields read as `bytes` (the same wire type), so that a value
/// that is not UTF-8 does not fail the call. The domain stays a `string`: it comes from Envoy's
/// configuration, which is UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LenientRateLimitRequest {
    /// The rules' domain.
    #[prost(string, tag = "1")]
    pub domain: String,
    /// The descriptors, each decided apart.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<LenientDescriptor>,
    /// The hits of every descriptor without its own `hits_addend` (0 means 1).
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor` with [`LenientEntry`] entries.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LenientDescriptor {
    /// The entries, matched one rule level each.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<LenientEntry>,
    /// A limit from Envoy's route configuration, in place of the rules'.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// This descriptor's hits, in place of the request's.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
    /// Whether the hits are a refund (refused).
    #[prost(bool, tag = "4")]
    pub is_negative_hits: bool,
}

/// `RateLimitDescriptor.Entry` with its key and value as the bytes sent.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct LenientEntry {
    /// The descriptor key.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// The descriptor value.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

impl From<RateLimitRequest> for LenientRateLimitRequest {
    fn from(req: RateLimitRequest) -> Self {
        Self {
            domain: req.domain,
            descriptors: req
                .descriptors
                .into_iter()
                .map(|d| LenientDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| LenientEntry {
                            key: e.key.into_bytes(),
                            value: e.value.into_bytes(),
                        })
                        .collect(),
                    limit: d.limit,
                    hits_addend: d.hits_addend,
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
            hits_addend: req.hits_addend,
        }
    }
}

impl LenientRateLimitRequest {
    /// The request with every entry's key and value as text ([`entry_text`]).
    pub fn into_request(self) -> RateLimitRequest {
        RateLimitRequest {
            domain: self.domain,
            descriptors: self
                .descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: entry_text(e.key),
                            value: entry_text(e.value),
                        })
                        .collect(),
                    limit: d.limit,
                    hits_addend: d.hits_addend,
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
            hits_addend: self.hits_addend,
        }
    }
}

/// A descriptor key or value as text: UTF-8 without U+0000 as it is; otherwise each U+0000
/// becomes `\0` `00` and each byte of every invalid sequence U+0000 followed by its two
/// lowercase hex digits (`caf\xe9` is `caf\0e9`; no invalid byte is `00`).
///
/// The mapping loses nothing, whatever the bytes: a text without U+0000 is the value itself, and
/// in any other text every U+0000 is followed by two hex digits that say the byte it stands for,
/// so distinct byte strings give distinct texts (a valid `caf\0e9`, from a query parameter's
/// `%00`, is `caf\000e9`, not the text of `caf\xe9`).
pub fn entry_text(bytes: Vec<u8>) -> String {
    let bytes = match String::from_utf8(bytes) {
        Ok(text) if !text.contains('\0') => return text,
        Ok(text) => text.into_bytes(),
        Err(e) => e.into_bytes(),
    };
    let mut text = String::with_capacity(bytes.len() * 3);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\0' => text.push_str("\u{0}00"),
                c => text.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(text, "\0{b:02x}");
        }
    }
    text
}

/// The `envoy.service.ratelimit.v3.RateLimitService` implementation.
#[derive(Clone)]
pub struct EnvoyRateLimitApi {
    limiter: RateLimiter,
    rules: Arc<RwLock<Arc<Rules>>>,
}

impl EnvoyRateLimitApi {
    /// A handler enforcing `rules` with `limiter`.
    pub fn new(limiter: RateLimiter, rules: Arc<Rules>) -> Self {
        Self {
            limiter,
            rules: Arc::new(RwLock::new(rules)),
        }
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        match self.rules.read() {
            Ok(rules) => Arc::clone(&rules),
            // A writer panicked mid-swap; the value inside is still a whole `Arc`.
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Checks the rules at `path` every `every` until `shutdown`, and puts them in force when
    /// their files changed and are valid; invalid files are logged (each problem with its file,
    /// line and column) and the rules in force kept. Files are read and parsed off the runtime's
    /// threads, by a loader bounded in size, nesting and count, so a reload always ends.
    pub fn reload_every(&self, path: PathBuf, every: Duration, shutdown: CancellationToken) {
        if every.is_zero() {
            return;
        }
        let in_force = Arc::clone(&self.rules);
        tokio::spawn(async move {
            let read = |path: PathBuf| async move {
                tokio::task::spawn_blocking(move || rules::read_all(&path))
                    .await
                    .unwrap_or_else(|e| Err(vec![format!("reading the rules: {e}")]))
            };
            let mut seen = read(path.clone()).await;
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = ticks.tick() => {}
                }
                let now = read(path.clone()).await;
                if now == seen {
                    continue;
                }
                let verdict = match &now {
                    Err(errors) => Err(errors.clone()),
                    Ok(files) => {
                        let (path, files) = (path.clone(), files.clone());
                        tokio::task::spawn_blocking(move || Rules::from_files(&path, &files))
                            .await
                            .unwrap_or_else(|e| Err(vec![format!("reading the rules: {e}")]))
                    }
                };
                match verdict {
                    Ok(new) => {
                        tracing::info!(domains = ?new.domains(), "rate limit rules reloaded");
                        match in_force.write() {
                            Ok(mut current) => *current = Arc::new(new),
                            Err(poisoned) => *poisoned.into_inner() = Arc::new(new),
                        }
                    }
                    Err(problems) => {
                        tracing::error!(
                            problems = %problems.join("; "),
                            "invalid rate limit rules; keeping the rules in force"
                        );
                    }
                }
                seen = now;
            }
        });
    }
}

/// What one descriptor needs.
enum Plan {
    /// No rule applies: OK, no limit reported.
    NoLimit,
    /// An unlimited (or replaced-by-another) rule: OK.
    Unlimited,
    /// A rule allowing nothing.
    Blocked(Arc<Rule>, Unit),
    /// A decision in Redis.
    Check {
        rule: Option<Arc<Rule>>,
        rate: Rate,
        unit: Unit,
        key: String,
        cost: u64,
    },
}

fn unit_of(value: i32) -> Option<Unit> {
    Some(match PbUnit::try_from(value).ok()? {
        PbUnit::Second => Unit::Second,
        PbUnit::Minute => Unit::Minute,
        PbUnit::Hour => Unit::Hour,
        PbUnit::Day => Unit::Day,
        PbUnit::Week => Unit::Week,
        PbUnit::Month => Unit::Month,
        PbUnit::Year => Unit::Year,
        PbUnit::Unknown => return None,
    })
}

fn pb_unit(unit: Unit) -> PbUnit {
    match unit {
        Unit::Second => PbUnit::Second,
        Unit::Minute => PbUnit::Minute,
        Unit::Hour => PbUnit::Hour,
        Unit::Day => PbUnit::Day,
        Unit::Week => PbUnit::Week,
        Unit::Month => PbUnit::Month,
        Unit::Year => PbUnit::Year,
        Unit::Other => PbUnit::Unknown,
    }
}

/// Checks the request's bounds, on the bytes as sent.
fn validate(req: &LenientRateLimitRequest) -> Result<(), Error> {
    if req.domain.is_empty() || req.domain.len() > MAX_DOMAIN_BYTES {
        return Err(Error::invalid(
            "domain",
            format!("must be 1 to {MAX_DOMAIN_BYTES} bytes"),
        ));
    }
    if req.descriptors.is_empty() || req.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Error::invalid(
            "descriptors",
            format!(
                "{} descriptors; send 1 to {MAX_DESCRIPTORS}",
                req.descriptors.len()
            ),
        ));
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() || d.entries.len() > MAX_ENTRIES {
            return Err(Error::invalid(
                "descriptors",
                format!(
                    "descriptors[{i}] has {} entries; send 1 to {MAX_ENTRIES}",
                    d.entries.len()
                ),
            ));
        }
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() || e.key.len() > MAX_ENTRY_BYTES || e.value.len() > MAX_ENTRY_BYTES
            {
                return Err(Error::invalid(
                    "descriptors",
                    format!(
                        "descriptors[{i}].entries[{j}]: the key must be 1 to {MAX_ENTRY_BYTES} bytes and the value at most {MAX_ENTRY_BYTES}"
                    ),
                ));
            }
        }
        if d.is_negative_hits {
            return Err(Error::invalid(
                "descriptors",
                format!("descriptors[{i}].is_negative_hits: refunds are not supported"),
            ));
        }
        if let Some(limit) = &d.limit
            && unit_of(limit.unit).is_none()
        {
            return Err(Error::invalid(
                "descriptors",
                format!(
                    "descriptors[{i}].limit.unit: {} is not a known unit",
                    limit.unit
                ),
            ));
        }
    }
    Ok(())
}

fn entries(d: &RateLimitDescriptor) -> impl ExactSizeIterator<Item = (&str, &str)> {
    d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()))
}

impl EnvoyRateLimitApi {
    /// Chooses what each descriptor needs: its rule (or the request's limit override), minus the
    /// limits that another matched rule replaces.
    fn plan(&self, rules: &Rules, req: &RateLimitRequest) -> Vec<Plan> {
        let known = rules.has_domain(&req.domain);
        let matched: Vec<Option<Arc<Rule>>> = req
            .descriptors
            .iter()
            .map(|d| {
                if d.limit.is_some() {
                    None
                } else {
                    rules.find(&req.domain, entries(d))
                }
            })
            .collect();
        let replaced = rules::replaced(&matched);
        let request_hits = if req.hits_addend == 0 {
            1
        } else {
            u64::from(req.hits_addend)
        };
        let prefix = self.limiter.key_prefix();
        req.descriptors
            .iter()
            .zip(matched)
            .zip(replaced)
            .map(|((d, rule), replaced)| {
                // More than any limit can allow, kept exact in Lua's doubles.
                let cost = d
                    .hits_addend
                    .as_ref()
                    .map_or(request_hits, |h| h.value)
                    .min(MAX_UNITS + 1);
                let key_for = |rate: &Rate| {
                    super::rate_key(
                        prefix,
                        "rl-envoy",
                        &rules::limiter_name(&req.domain, entries(d)),
                        rate,
                    )
                };
                // A limit override from Envoy's route config applies in a known domain, as in
                // envoyproxy/ratelimit (never in shadow mode), counted like envoyproxy counts.
                if let Some(limit) = d.limit.filter(|_| known) {
                    let unit = unit_of(limit.unit).unwrap_or(Unit::Second);
                    let period = unit.period().unwrap_or(Duration::from_secs(1));
                    return match Rate::new(
                        Algorithm::AlignedWindow,
                        u64::from(limit.requests_per_unit),
                        period,
                        None,
                    ) {
                        Ok(rate) => Plan::Check {
                            rule: None,
                            key: key_for(&rate),
                            rate,
                            unit,
                            cost,
                        },
                        Err(_) => Plan::Blocked(
                            Arc::new(Rule {
                                quota: Quota::Blocked { unit },
                                name: String::new(),
                                replaces: Vec::new(),
                                shadow: false,
                                path: req.domain.clone(),
                            }),
                            unit,
                        ),
                    };
                }
                let Some(rule) = rule else {
                    return Plan::NoLimit;
                };
                if replaced {
                    return Plan::Unlimited;
                }
                match rule.quota.clone() {
                    Quota::Unlimited => Plan::Unlimited,
                    Quota::Blocked { unit } => Plan::Blocked(rule, unit),
                    Quota::Limited { rate, unit } => Plan::Check {
                        key: key_for(&rate),
                        rule: Some(rule),
                        rate,
                        unit,
                        cost,
                    },
                }
            })
            .collect()
    }
}

fn current_limit(rule: Option<&Rule>, requests: u64, unit: Unit) -> RateLimit {
    RateLimit {
        name: rule.map(|r| r.name.clone()).unwrap_or_default(),
        requests_per_unit: u32::try_from(requests).unwrap_or(u32::MAX),
        unit: pb_unit(unit).into(),
    }
}

fn duration(d: Duration) -> gpb::Duration {
    gpb::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        // subsec_nanos is below 1e9, which fits in i32.
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

fn string_value(s: impl Into<String>) -> gpb::Value {
    gpb::Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

/// What the response's dynamic metadata reports.
#[derive(Default)]
struct Report {
    shadow: Vec<String>,
    failure: Option<FailureMode>,
}

impl Report {
    fn metadata(self) -> Option<gpb::Struct> {
        if self.shadow.is_empty() && self.failure.is_none() {
            return None;
        }
        let mut fields = HashMap::new();
        if !self.shadow.is_empty() {
            let values = self.shadow.into_iter().map(string_value).collect();
            fields.insert(
                "baton.shadow_over_limit".to_owned(),
                gpb::Value {
                    kind: Some(Kind::ListValue(gpb::ListValue { values })),
                },
            );
        }
        if let Some(mode) = self.failure {
            let mode = match mode {
                FailureMode::Open => "open",
                FailureMode::Closed => "closed",
            };
            fields.insert("baton.failure_mode".to_owned(), string_value(mode));
        }
        Some(gpb::Struct { fields })
    }
}

fn status(plan: &Plan, decision: Option<&Decision>, report: &mut Report) -> DescriptorStatus {
    let (rule, over, current, remaining, reset) = match (plan, decision) {
        (Plan::NoLimit, _) => return ok_status(None, 0),
        (Plan::Unlimited, _) => return ok_status(None, u32::MAX),
        (Plan::Blocked(rule, unit), _) => (
            Some(rule.as_ref()),
            true,
            current_limit(Some(rule), 0, *unit),
            0,
            None,
        ),
        (
            Plan::Check {
                rule, rate, unit, ..
            },
            Some(d),
        ) => {
            if d.decided_by != DecidedBy::Redis {
                report.failure = Some(match d.decided_by {
                    DecidedBy::FailClosed => FailureMode::Closed,
                    _ => FailureMode::Open,
                });
            }
            let reset = if d.allowed {
                d.reset_after
            } else {
                d.retry_after.unwrap_or(d.reset_after)
            };
            (
                rule.as_deref(),
                !d.allowed,
                current_limit(rule.as_deref(), rate.limit, *unit),
                u32::try_from(d.remaining).unwrap_or(u32::MAX),
                Some(duration(reset)),
            )
        }
        // Every check has its decision; nothing to report otherwise.
        (Plan::Check { .. }, None) => return ok_status(None, 0),
    };
    let shadowed = over && rule.is_some_and(|r| r.shadow);
    let decided_by = decision.map_or(metrics::DecidedBy::Rules, |d| {
        super::service::decided_by(d.decided_by)
    });
    let counted = match (over, shadowed) {
        (false, _) => RateDecision::Allowed,
        (true, true) => RateDecision::Shadow,
        (true, false) => RateDecision::Limited,
    };
    metrics::ratelimit_decision(Api::Envoy, counted, decided_by);
    if shadowed && let Some(rule) = rule {
        tracing::debug!(rule = %rule.path, name = %rule.name, "over the limit in shadow mode: allowed");
        report.shadow.push(if rule.name.is_empty() {
            rule.path.clone()
        } else {
            rule.name.clone()
        });
    }
    DescriptorStatus {
        code: if over && !shadowed {
            Code::OverLimit
        } else {
            Code::Ok
        }
        .into(),
        current_limit: Some(current),
        limit_remaining: remaining,
        duration_until_reset: reset,
        quota: None,
    }
}

fn ok_status(limit: Option<RateLimit>, remaining: u32) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok.into(),
        current_limit: limit,
        limit_remaining: remaining,
        duration_until_reset: None,
        quota: None,
    }
}

impl EnvoyRateLimitApi {
    /// Decides every descriptor of `req` (`ShouldRateLimit`). A request out of bounds fails with
    /// `INVALID_ARGUMENT`.
    pub async fn should_rate_limit(
        &self,
        req: LenientRateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        validate(&req)?;
        let req = req.into_request();
        let rules = self.rules();
        if !rules.has_domain(&req.domain) {
            tracing::debug!(domain = %req.domain, "no rules for this domain: not limited");
        }
        let plans = self.plan(&rules, &req);
        let decisions = futures::future::join_all(plans.iter().map(|plan| async move {
            match plan {
                Plan::Check {
                    rate, key, cost, ..
                } => Some(self.limiter.check(key, rate, *cost).await),
                _ => None,
            }
        }))
        .await;
        let mut report = Report::default();
        let statuses: Vec<DescriptorStatus> = plans
            .iter()
            .zip(&decisions)
            .map(|(plan, decision)| status(plan, decision.as_ref(), &mut report))
            .collect();
        let over = statuses
            .iter()
            .any(|s| s.code == i32::from(Code::OverLimit));
        Ok(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok }.into(),
            statuses,
            dynamic_metadata: report.metadata(),
            ..Default::default()
        })
    }
}

/// The `envoy.service.ratelimit.v3.RateLimitService` server, written out rather than generated
/// so that its requests are decoded as [`LenientRateLimitRequest`], with Baton's codec
/// ([`LeanCodec`]): a request that does not decode at all fails with `INVALID_ARGUMENT`. Any other
/// method of the service is `UNIMPLEMENTED`.
#[derive(Clone)]
pub struct EnvoyRateLimitServer {
    api: EnvoyRateLimitApi,
    max_decoding_message_size: Option<usize>,
    max_encoding_message_size: Option<usize>,
}

impl EnvoyRateLimitServer {
    /// The server of `api`, with tonic's default message sizes.
    pub fn new(api: EnvoyRateLimitApi) -> Self {
        Self {
            api,
            max_decoding_message_size: None,
            max_encoding_message_size: None,
        }
    }

    /// Refuses requests larger than `limit` bytes.
    #[must_use]
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.max_decoding_message_size = Some(limit);
        self
    }

    /// Refuses to send responses larger than `limit` bytes.
    #[must_use]
    pub fn max_encoding_message_size(mut self, limit: usize) -> Self {
        self.max_encoding_message_size = Some(limit);
        self
    }
}

/// `ShouldRateLimit` as tonic's unary service.
struct ShouldRateLimit(EnvoyRateLimitApi);

impl UnaryService<LenientRateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: Request<LenientRateLimitRequest>) -> Self::Future {
        let api = self.0.clone();
        Box::pin(async move {
            api.should_rate_limit(request.into_inner())
                .await
                .map(Response::new)
        })
    }
}

impl<B> Service<http::Request<B>> for EnvoyRateLimitServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async {
                let mut response = http::Response::new(tonic::body::Body::default());
                let headers = response.headers_mut();
                headers.insert(
                    Status::GRPC_STATUS,
                    (tonic::Code::Unimplemented as i32).into(),
                );
                headers.insert(
                    http::header::CONTENT_TYPE,
                    tonic::metadata::GRPC_CONTENT_TYPE,
                );
                Ok(response)
            });
        }
        let method = ShouldRateLimit(self.api.clone());
        let mut grpc =
            Grpc::new(LeanCodec::<RateLimitResponse, LenientRateLimitRequest>::default())
                .apply_max_message_size_config(
                    self.max_decoding_message_size,
                    self.max_encoding_message_size,
                );
        Box::pin(async move { Ok(grpc.unary(method, req).await) })
    }
}

impl NamedService for EnvoyRateLimitServer {
    const NAME: &'static str = SERVICE_NAME;
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    /// UTF-8 is kept as it is; anything else maps to distinct texts holding a U+0000.
    #[test]
    fn entry_text_is_lossless() {
        assert_eq!(entry_text(b"caf\xc3\xa9".to_vec()), "café");
        // A U+0000 is escaped in valid text too, so that it cannot pass for an invalid byte.
        assert_eq!(entry_text(b"a\0b".to_vec()), "a\u{0}00b");
        assert_ne!(
            entry_text(b"caf\0e9".to_vec()),
            entry_text(b"caf\xe9".to_vec())
        );
        assert_eq!(entry_text(b"caf\xe9".to_vec()), "caf\u{0}e9");
        assert_eq!(entry_text(b"\xff\xfe".to_vec()), "\u{0}ff\u{0}fe");
        // A cut-short sequence: each byte on its own.
        assert_eq!(entry_text(b"\xe2\x82".to_vec()), "\u{0}e2\u{0}82");
        // The NULs of a value that is not UTF-8 are escaped, so that it cannot pass for another.
        assert_eq!(entry_text(b"\0e9\xe9".to_vec()), "\u{0}00e9\u{0}e9");
        let values: [&[u8]; 9] = [
            b"caf\xe9",
            b"caf\xe8",
            b"caf\xe9\xe9",
            b"\0e9\xe9",
            b"\xe9\xe9",
            b"caf\xef\xbf\xbd",
            b"caf\0e9",
            b"caf\0",
            b"caf\x0000",
        ];
        let texts: std::collections::HashSet<String> =
            values.iter().map(|v| entry_text(v.to_vec())).collect();
        assert_eq!(texts.len(), values.len(), "{texts:?}");
        assert!(texts.contains("caf\u{fffd}"), "valid UTF-8 stays as it is");
    }

    /// Every field of Envoy's request survives the lenient decoding.
    #[test]
    fn lenient_request_keeps_every_field() {
        let strict = RateLimitRequest {
            domain: "edge".to_owned(),
            descriptors: vec![
                RateLimitDescriptor {
                    entries: vec![
                        Entry {
                            key: "path".to_owned(),
                            value: "/login".to_owned(),
                        },
                        Entry {
                            key: "user".to_owned(),
                            value: String::new(),
                        },
                    ],
                    limit: Some(RateLimitOverride {
                        requests_per_unit: 7,
                        unit: 3,
                    }),
                    hits_addend: Some(UInt64Value { value: 5 }),
                    is_negative_hits: true,
                },
                RateLimitDescriptor::default(),
            ],
            hits_addend: 9,
        };
        let wire = strict.encode_to_vec();
        let lenient = LenientRateLimitRequest::decode(wire.as_slice()).expect("decodes");
        assert_eq!(lenient.encode_to_vec(), wire);
        assert_eq!(lenient.clone().into_request(), strict);
        assert_eq!(LenientRateLimitRequest::from(strict), lenient);
    }
}
