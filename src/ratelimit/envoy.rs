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

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::RateLimitDescriptor,
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, DescriptorStatus, RateLimit, rate_limit::Unit as PbUnit},
            rate_limit_service_server::RateLimitService,
        },
    },
    google::protobuf::{self as gpb, value::Kind},
};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::{
    Algorithm, DecidedBy, Decision, MAX_UNITS, Rate, RateLimiter,
    rules::{
        self, MAX_DESCRIPTORS, MAX_DOMAIN_BYTES, MAX_ENTRIES, MAX_ENTRY_BYTES, Quota, Rule, Rules,
        Unit,
    },
};
use crate::{
    config::FailureMode,
    error::Error,
    metrics::{self, Api, RateDecision},
};

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

fn validate(req: &RateLimitRequest) -> Result<(), Error> {
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

#[tonic::async_trait]
impl RateLimitService for EnvoyRateLimitApi {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let req = request.into_inner();
        validate(&req)?;
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
        Ok(Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok }.into(),
            statuses,
            dynamic_metadata: report.metadata(),
            ..Default::default()
        }))
    }
}
