//! Black-box tests of `baton.v1.RateLimitService` and of Envoy's rate limit API
//! (`envoy.service.ratelimit.v3.RateLimitService`) against a real `redis-server`, over gRPC to an
//! in-process Baton bound to port 0.
//!
//! - [`algorithms`]: each algorithm against its model, bounds, keys, and invalid arguments;
//! - [`failure`]: Redis down or frozen, and the failure mode;
//! - [`envoy`]: Envoy's API, its descriptors, wildcards, hits and shadow mode;
//! - [`rules`]: the rules file, its reloads, and bad files.
//!
//! This file holds the helpers they share.

#[path = "../support/mod.rs"]
mod support;

mod algorithms;
mod envoy;
mod failure;
mod rules;

use std::{path::PathBuf, time::Duration};

use baton::{
    config::FailureMode,
    proto::v1::{self as pb, rate_limit_service_client::RateLimitServiceClient},
    ratelimit::rules::Rules,
};
use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::{
            RateLimitDescriptor,
            rate_limit_descriptor::{Entry, RateLimitOverride},
        },
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, rate_limit::Unit},
        },
    },
    google::protobuf::{UInt64Value, value::Kind},
};
use support::{Baton, RedisServer, baton_command, ms, run_baton, std_duration, wait_until, within};
use tokio::{task::JoinSet, time::Instant};
use tonic::transport::Channel;

type Client = RateLimitServiceClient<Channel>;
type EnvoyClient = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient<Channel>;

/// The rate limit timeout of tests that are not about Redis failing: long enough that a loaded
/// CI machine running tests in parallel never falls back to the failure mode.
const RELAXED_TIMEOUT: Duration = Duration::from_secs(2);

const GCRA: pb::RateLimitAlgorithm = pb::RateLimitAlgorithm::Gcra;
const FIXED: pb::RateLimitAlgorithm = pb::RateLimitAlgorithm::FixedWindow;
const SLIDING: pb::RateLimitAlgorithm = pb::RateLimitAlgorithm::SlidingWindow;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn request(
    key: &str,
    limit: u64,
    period_ms: u64,
    algorithm: pb::RateLimitAlgorithm,
    cost: Option<u64>,
) -> pb::RateLimitServiceCheckRequest {
    pb::RateLimitServiceCheckRequest {
        key: key.to_owned(),
        limit,
        period: Some(ms(period_ms)),
        cost,
        algorithm: algorithm.into(),
        burst: 0,
    }
}

async fn check(
    client: &mut Client,
    req: pb::RateLimitServiceCheckRequest,
) -> pb::RateLimitServiceCheckResponse {
    client
        .check(req.clone())
        .await
        .unwrap_or_else(|s| panic!("Check {req:?} failed: {s:?}"))
        .into_inner()
}

/// A peek (cost 0) decided by Redis, sent again while the failure mode answers it: a peek counts
/// nothing, and on a busy machine a short rate limit timeout can pass before Redis answers.
async fn peek_decided_by_redis(
    client: &mut Client,
    req: pb::RateLimitServiceCheckRequest,
) -> pb::RateLimitServiceCheckResponse {
    assert_eq!(req.cost, Some(0), "only a peek may be sent again");
    wait_until(Duration::from_secs(20), "a peek decided by Redis", || {
        let mut client = client.clone();
        let req = req.clone();
        async move {
            let got = check(&mut client, req).await;
            if got.decided_by() == pb::RateLimitDecidedBy::Redis {
                Ok(got)
            } else {
                Err(got)
            }
        }
    })
    .await
}

fn micros(d: Option<&prost_types::Duration>) -> u64 {
    d.map(|d| u64::try_from(std_duration(d).as_micros()).expect("fits"))
        .unwrap_or_else(|| panic!("a duration was expected"))
}

/// Redis's clock, in microseconds since the Unix epoch.
async fn redis_time(conn: &mut support::RedisConn) -> u64 {
    let (secs, us): (u64, u64) = redis::cmd("TIME")
        .query_async(conn)
        .await
        .expect("TIME answers");
    secs * 1_000_000 + us
}

fn rules_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/ratelimit_rules.yaml")
}

/// A Baton with the relaxed rate limit timeout.
async fn baton(redis: &RedisServer) -> Baton {
    Baton::start_with(redis, |c| c.ratelimit.timeout = RELAXED_TIMEOUT).await
}

/// A Baton serving Envoy's API with the test rules, and the relaxed rate limit timeout.
async fn envoy_baton(redis: &RedisServer) -> Baton {
    Baton::start_with(redis, move |c| {
        c.ratelimit.timeout = RELAXED_TIMEOUT;
        c.ratelimit.rules_path = Some(rules_path());
    })
    .await
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

fn envoy_request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

async fn should_rate_limit(baton: &Baton, req: RateLimitRequest) -> RateLimitResponse {
    baton
        .envoy_ratelimit_client()
        .await
        .should_rate_limit(req.clone())
        .await
        .unwrap_or_else(|s| panic!("ShouldRateLimit {req:?} failed: {s:?}"))
        .into_inner()
}

/// The codes of a response: overall first, then each descriptor's.
fn codes(r: &RateLimitResponse) -> (Code, Vec<Code>) {
    (
        r.overall_code(),
        r.statuses.iter().map(|s| s.code()).collect(),
    )
}

fn metadata_string(r: &RateLimitResponse, field: &str) -> Option<String> {
    match r
        .dynamic_metadata
        .as_ref()?
        .fields
        .get(field)?
        .kind
        .as_ref()?
    {
        Kind::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn metadata_list(r: &RateLimitResponse, field: &str) -> Vec<String> {
    let Some(Kind::ListValue(list)) = r
        .dynamic_metadata
        .as_ref()
        .and_then(|m| m.fields.get(field))
        .and_then(|v| v.kind.as_ref())
    else {
        return Vec::new();
    };
    list.values
        .iter()
        .filter_map(|v| match &v.kind {
            Some(Kind::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

/// Sends `signal` to the Redis server (SIGSTOP waits until every thread of it is stopped).
fn signal(redis: &RedisServer, signal: nix::sys::signal::Signal) {
    redis.signal(signal);
}
