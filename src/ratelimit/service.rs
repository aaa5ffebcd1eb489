//! The `baton.v1.RateLimitService` gRPC handler: turns requests into [`RateLimiter`] checks and
//! decisions back into responses. Validation errors name the proto field.

use tonic::{Request, Response, Status};

use super::{Algorithm, DecidedBy, Decision, MAX_KEY_BYTES, Rate, RateField, RateLimiter};
use crate::{
    error::Error,
    grpc::wire,
    metrics::{self, Api, RateDecision},
    proto::v1::{self as pb, rate_limit_service_server::RateLimitService},
};

/// The RateLimitService implementation.
#[derive(Clone)]
pub struct RateLimitApi {
    limiter: RateLimiter,
}

impl RateLimitApi {
    /// A handler deciding with `limiter`.
    pub fn new(limiter: RateLimiter) -> Self {
        Self { limiter }
    }
}

/// The validated parts of a check request.
fn rate(req: &pb::RateLimitServiceCheckRequest) -> Result<(Rate, u64), Error> {
    let algorithm = match pb::RateLimitAlgorithm::try_from(req.algorithm) {
        Ok(pb::RateLimitAlgorithm::Unspecified | pb::RateLimitAlgorithm::Gcra) => Algorithm::Gcra,
        Ok(pb::RateLimitAlgorithm::FixedWindow) => Algorithm::FixedWindow,
        Ok(pb::RateLimitAlgorithm::SlidingWindow) => Algorithm::SlidingWindow,
        Err(_) => {
            return Err(Error::invalid(
                "algorithm",
                format!("{} is not a known algorithm", req.algorithm),
            ));
        }
    };
    let period = wire::bounded("period", req.period, super::MIN_PERIOD, super::MAX_PERIOD)?;
    let burst = (req.burst != 0).then_some(req.burst);
    let rate = Rate::new(algorithm, req.limit, period, burst).map_err(|(field, reason)| {
        let field = match field {
            RateField::Limit => "limit",
            RateField::Period => "period",
            RateField::Burst => "burst",
        };
        Error::invalid(field, reason)
    })?;
    let cost = req.cost.unwrap_or(1);
    if cost > rate.capacity() {
        let what = match algorithm {
            Algorithm::Gcra => "burst",
            _ => "limit",
        };
        return Err(Error::invalid(
            "cost",
            format!(
                "{cost} is more than the {what} ({}): it could never be allowed",
                rate.capacity()
            ),
        ));
    }
    Ok((rate, cost))
}

/// What decided, as the metrics label it.
pub fn decided_by(by: DecidedBy) -> metrics::DecidedBy {
    match by {
        DecidedBy::Redis => metrics::DecidedBy::Redis,
        DecidedBy::FailOpen => metrics::DecidedBy::FailOpen,
        DecidedBy::FailClosed => metrics::DecidedBy::FailClosed,
    }
}

fn response(decision: &Decision) -> pb::RateLimitServiceCheckResponse {
    let decided_by = match decision.decided_by {
        DecidedBy::Redis => pb::RateLimitDecidedBy::Redis,
        DecidedBy::FailOpen => pb::RateLimitDecidedBy::FailOpen,
        DecidedBy::FailClosed => pb::RateLimitDecidedBy::FailClosed,
    };
    pb::RateLimitServiceCheckResponse {
        allowed: decision.allowed,
        limit: decision.limit,
        remaining: decision.remaining,
        retry_after: Some(wire::duration(if decision.allowed {
            std::time::Duration::ZERO
        } else {
            decision.retry_after.unwrap_or(decision.reset_after)
        })),
        reset_after: Some(wire::duration(decision.reset_after)),
        decided_by: decided_by.into(),
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimitApi {
    async fn check(
        &self,
        request: Request<pb::RateLimitServiceCheckRequest>,
    ) -> Result<Response<pb::RateLimitServiceCheckResponse>, Status> {
        let req = request.into_inner();
        let key = wire::text("key", &req.key, MAX_KEY_BYTES)?;
        let (rate, cost) = rate(&req)?;
        let redis_key = super::limiter_key(self.limiter.key_prefix(), "rl", key, rate.algorithm);
        let decision = self.limiter.check(&redis_key, &rate, cost).await;
        metrics::ratelimit_decision(
            Api::Baton,
            if decision.allowed {
                RateDecision::Allowed
            } else {
                RateDecision::Limited
            },
            decided_by(decision.decided_by),
        );
        Ok(Response::new(response(&decision)))
    }
}
