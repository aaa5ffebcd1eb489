//! Envoy's rate limit API: descriptors matched and not, wildcards, `hits_addend`, shadow mode,
//! and invalid requests.

use super::*;

// ---------------------------------------------------------------------------------------------
// Envoy's rate limit API
// ---------------------------------------------------------------------------------------------

/// A matching descriptor is limited with its full status (code, limit, remaining, reset); one
/// that matches no rule is OK with no limit; a key-only rule limits each value separately.
#[tokio::test]
async fn envoy_matching_and_not_matching_descriptors() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    let ip = |ip: &str| envoy_request("edge", vec![descriptor(&[("remote_address", ip)])]);

    for expected_remaining in [1, 0] {
        let got = should_rate_limit(&baton, ip("10.0.0.1")).await;
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
        let status = &got.statuses[0];
        let limit = status
            .current_limit
            .as_ref()
            .expect("the limit is reported");
        assert_eq!(limit.requests_per_unit, 2);
        assert_eq!(limit.unit(), Unit::Hour);
        assert_eq!(status.limit_remaining, expected_remaining);
        let reset = status
            .duration_until_reset
            .as_ref()
            .expect("reset is reported");
        assert!(
            reset.seconds <= 3600 && (reset.seconds > 0 || reset.nanos > 0),
            "{reset:?}"
        );
    }
    let over = should_rate_limit(&baton, ip("10.0.0.1")).await;
    assert_eq!(codes(&over), (Code::OverLimit, vec![Code::OverLimit]));
    assert_eq!(over.statuses[0].limit_remaining, 0);
    // Another address has its own limit.
    let other = should_rate_limit(&baton, ip("10.0.0.2")).await;
    assert_eq!(codes(&other), (Code::Ok, vec![Code::Ok]));

    // No rule: OK without a limit; an unknown domain: the same.
    for req in [
        envoy_request("edge", vec![descriptor(&[("path", "/nothing")])]),
        envoy_request("edge", vec![descriptor(&[("unknown", "x")])]),
        envoy_request(
            "nowhere",
            vec![descriptor(&[("remote_address", "10.0.0.1")])],
        ),
        // More entries than the rules nest.
        envoy_request(
            "edge",
            vec![descriptor(&[("remote_address", "10.0.0.1"), ("x", "y")])],
        ),
    ] {
        let got = should_rate_limit(&baton, req.clone()).await;
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]), "{req:?}");
        assert!(got.statuses[0].current_limit.is_none(), "{req:?}");
    }

    // Several descriptors: any over the limit makes the whole request over the limit, and each
    // status is its own.
    let got = should_rate_limit(
        &baton,
        envoy_request(
            "edge",
            vec![
                descriptor(&[("path", "/login")]),
                descriptor(&[("remote_address", "10.0.0.1")]),
                descriptor(&[("path", "/none")]),
            ],
        ),
    )
    .await;
    assert_eq!(
        codes(&got),
        (Code::OverLimit, vec![Code::Ok, Code::OverLimit, Code::Ok])
    );
    let login = got.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((login.name.as_str(), login.unit()), ("login", Unit::Hour));
    assert_eq!(got.statuses[0].limit_remaining, 4);

    // A domain's rules are its own.
    let got = should_rate_limit(
        &baton,
        envoy_request("other", vec![descriptor(&[("remote_address", "10.0.0.1")])]),
    )
    .await;
    assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
    assert_eq!(
        got.statuses[0].current_limit.as_ref().unwrap().unit(),
        Unit::Second
    );
}

/// Nested rules apply to the full descriptor only; wildcard prefixes, GCRA with a 1.5 s period,
/// unlimited and blocking rules, `replaces`, and limit overrides from Envoy's route config.
#[tokio::test]
async fn envoy_nested_wildcard_and_special_rules() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    let one = |entries: &[(&str, &str)]| envoy_request("edge", vec![descriptor(entries)]);

    // tenant alone has no limit; (tenant, plan=free) has a sliding window of 3 per day.
    let got = should_rate_limit(&baton, one(&[("tenant", "acme")])).await;
    assert!(got.statuses[0].current_limit.is_none());
    for remaining in [2, 1, 0] {
        let got = should_rate_limit(&baton, one(&[("tenant", "acme"), ("plan", "free")])).await;
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
        assert_eq!(got.statuses[0].limit_remaining, remaining);
        let limit = got.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.unit(), limit.requests_per_unit),
            ("free-plan", Unit::Day, 3)
        );
    }
    let got = should_rate_limit(&baton, one(&[("tenant", "acme"), ("plan", "free")])).await;
    assert_eq!(codes(&got), (Code::OverLimit, vec![Code::OverLimit]));
    // Another tenant on the same rule has its own count; gold is unlimited.
    let got = should_rate_limit(&baton, one(&[("tenant", "other"), ("plan", "free")])).await;
    assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
    for _ in 0..5 {
        let got = should_rate_limit(&baton, one(&[("tenant", "acme"), ("plan", "gold")])).await;
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
        assert_eq!(got.statuses[0].limit_remaining, u32::MAX);
    }

    // /api/* : GCRA, 3 per 1500 ms with a burst of 2; the unit is not a standard one.
    let api = |path: &str| one(&[("path", path)]);
    let a = should_rate_limit(&baton, api("/api/users")).await;
    let b = should_rate_limit(&baton, api("/api/users")).await;
    let c = should_rate_limit(&baton, api("/api/users")).await;
    assert_eq!(codes(&a).1, vec![Code::Ok]);
    assert_eq!(codes(&b).1, vec![Code::Ok]);
    assert_eq!(codes(&c).1, vec![Code::OverLimit]);
    let limit = c.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.unit(), limit.requests_per_unit),
        ("api", Unit::Unknown, 3)
    );
    // Retry after one interval (500 ms) at most.
    let retry = c.statuses[0].duration_until_reset.as_ref().unwrap();
    assert!(
        retry.seconds == 0 && retry.nanos > 0 && retry.nanos <= 500_000_000,
        "{retry:?}"
    );
    // A different path under the prefix has its own bucket.
    assert_eq!(
        codes(&should_rate_limit(&baton, api("/api/orders")).await).1,
        vec![Code::Ok]
    );

    // requests_per_unit: 0 blocks everything without touching Redis.
    let got = should_rate_limit(&baton, one(&[("banned", "1")])).await;
    assert_eq!(codes(&got), (Code::OverLimit, vec![Code::OverLimit]));

    // vip replaces the login limit when both match: the login limit is not counted.
    let got = should_rate_limit(
        &baton,
        envoy_request(
            "edge",
            vec![
                descriptor(&[("path", "/login")]),
                descriptor(&[("vip", "true")]),
            ],
        ),
    )
    .await;
    assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok, Code::Ok]));
    assert!(got.statuses[0].current_limit.is_none(), "login is replaced");
    assert_eq!(got.statuses[1].current_limit.as_ref().unwrap().name, "vip");
    let alone = should_rate_limit(&baton, one(&[("path", "/login")])).await;
    assert_eq!(
        alone.statuses[0].limit_remaining, 4,
        "the replaced request did not count"
    );

    // A limit override from Envoy's route config applies even without a rule.
    let mut d = descriptor(&[("custom", "x")]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour.into(),
    });
    let req = envoy_request("edge", vec![d]);
    assert_eq!(
        codes(&should_rate_limit(&baton, req.clone()).await).1,
        vec![Code::Ok]
    );
    let got = should_rate_limit(&baton, req).await;
    assert_eq!(codes(&got).1, vec![Code::OverLimit]);
    assert_eq!(
        got.statuses[0].current_limit.as_ref().unwrap().unit(),
        Unit::Hour
    );
}

/// A `*` anywhere in a rule's value stands for any run of characters, none included, as in
/// envoyproxy/ratelimit: `/api/*/action`, `*.png` and `a*b*c` limit the values they match (each
/// value counted on its own) and no others, and an exact rule still comes first.
#[tokio::test]
async fn envoy_wildcards_anywhere_in_a_value() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("wild.yaml");
    std::fs::write(
        &file,
        r#"domain: wild
descriptors:
  - key: path
    value: /api/*/action
    rate_limit: {name: action, unit: hour, requests_per_unit: 1}
  - key: path
    value: "*.png"
    rate_limit: {name: png, unit: hour, requests_per_unit: 5}
  - key: path
    value: a*b*c
    rate_limit: {name: abc, unit: hour, requests_per_unit: 5}
  - key: path
    value: /api/v9/action
    rate_limit: {name: exact, unit: hour, requests_per_unit: 5}
"#,
    )
    .expect("writing rules");
    let baton = Baton::start_with(&redis, |c| {
        c.ratelimit.timeout = RELAXED_TIMEOUT;
        c.ratelimit.rules_path = Some(file);
    })
    .await;
    let ask = |path: &str| {
        should_rate_limit(
            &baton,
            envoy_request("wild", vec![descriptor(&[("path", path)])]),
        )
    };
    let limit_name = |got: &RateLimitResponse| {
        got.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.name.clone())
    };
    for (path, want) in [
        ("/api/v1/action", Some("action")),
        ("/api//action", Some("action")),
        ("/api/action", None),
        ("/api/v1/action/x", None),
        ("/api/v9/action", Some("exact")),
        ("logo.png", Some("png")),
        (".png", Some("png")),
        ("logo.png.jpg", None),
        ("abc", Some("abc")),
        ("a-b-c", Some("abc")),
        ("acb", None),
    ] {
        let got = ask(path).await;
        assert_eq!(
            limit_name(&got).as_deref(),
            want,
            "{path}: {:?}",
            got.statuses
        );
    }
    // One unit an hour for each value matched: /api/v1/action is spent, /api/v2/action is not.
    let again = ask("/api/v1/action").await;
    assert_eq!(codes(&again), (Code::OverLimit, vec![Code::OverLimit]));
    let other = ask("/api/v2/action").await;
    assert_eq!(codes(&other), (Code::Ok, vec![Code::Ok]));
}

/// `hits_addend` counts that many hits (per request, or per descriptor when it sets its own).
#[tokio::test]
async fn envoy_hits_addend() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    let mut req = envoy_request("edge", vec![descriptor(&[("path", "/login")])]);
    req.hits_addend = 3;
    let got = should_rate_limit(&baton, req.clone()).await;
    assert_eq!(codes(&got).1, vec![Code::Ok]);
    assert_eq!(got.statuses[0].limit_remaining, 2);
    let got = should_rate_limit(&baton, req).await;
    assert_eq!(codes(&got).1, vec![Code::OverLimit]);
    assert_eq!(
        got.statuses[0].limit_remaining, 2,
        "the denied hits were not counted"
    );

    // The descriptor's own hits_addend wins over the request's; 0 peeks.
    let mut d = descriptor(&[("path", "/login")]);
    d.hits_addend = Some(UInt64Value { value: 2 });
    let mut req = envoy_request("edge", vec![d.clone()]);
    req.hits_addend = 50;
    let got = should_rate_limit(&baton, req).await;
    assert_eq!(codes(&got).1, vec![Code::Ok]);
    assert_eq!(got.statuses[0].limit_remaining, 0);
    d.hits_addend = Some(UInt64Value { value: 0 });
    let got = should_rate_limit(&baton, envoy_request("edge", vec![d])).await;
    assert_eq!(
        codes(&got).1,
        vec![Code::OverLimit],
        "a peek at an exhausted limit"
    );

    // More hits than the GCRA burst of /api/* (2) can ever allow: over the limit, reporting the
    // time until the bucket is full (at most its 1 s depth), not a wait that never ends.
    let mut d = descriptor(&[("path", "/api/huge")]);
    d.hits_addend = Some(UInt64Value { value: u64::MAX });
    let got = should_rate_limit(&baton, envoy_request("edge", vec![d])).await;
    assert_eq!(codes(&got).1, vec![Code::OverLimit]);
    let reset = got.statuses[0]
        .duration_until_reset
        .as_ref()
        .map(|d| Duration::from_secs(u64::try_from(d.seconds).expect("not negative")));
    assert!(
        reset.is_some_and(|r| r <= Duration::from_secs(1)),
        "{reset:?}"
    );
}

/// Shadow mode allows over the limit but reports it, in the status's remaining count and in
/// the dynamic metadata Envoy logs.
#[tokio::test]
async fn envoy_shadow_mode_allows_but_reports() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    let req = envoy_request("edge", vec![descriptor(&[("experiment", "new-limits")])]);
    let first = should_rate_limit(&baton, req.clone()).await;
    assert_eq!(codes(&first), (Code::Ok, vec![Code::Ok]));
    assert!(first.dynamic_metadata.is_none(), "nothing to report yet");
    for _ in 0..3 {
        let got = should_rate_limit(&baton, req.clone()).await;
        assert_eq!(
            codes(&got),
            (Code::Ok, vec![Code::Ok]),
            "shadow mode never denies"
        );
        assert_eq!(got.statuses[0].limit_remaining, 0);
        assert_eq!(
            metadata_list(&got, "baton.shadow_over_limit"),
            vec!["experiment".to_owned()]
        );
    }
}

/// Malformed Envoy requests fail with INVALID_ARGUMENT; without a rules file Envoy's API is not
/// served at all.
#[tokio::test]
async fn envoy_invalid_requests_and_unconfigured() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    let mut client = baton.envoy_ratelimit_client().await;
    let mut negative = descriptor(&[("path", "/login")]);
    negative.is_negative_hits = true;
    for (req, prefix) in [
        (
            envoy_request("", vec![descriptor(&[("a", "b")])]),
            "domain: ",
        ),
        (envoy_request("edge", vec![]), "descriptors: "),
        (
            envoy_request("edge", vec![descriptor(&[])]),
            "descriptors: ",
        ),
        (
            envoy_request("edge", vec![descriptor(&[("", "b")])]),
            "descriptors: ",
        ),
        (
            envoy_request("edge", vec![descriptor(&[("a", &"v".repeat(1025))])]),
            "descriptors: ",
        ),
        (
            envoy_request("edge", vec![descriptor(&[("a", "b")]); 65]),
            "descriptors: ",
        ),
        (envoy_request("edge", vec![negative]), "descriptors: "),
    ] {
        let status = client
            .should_rate_limit(req.clone())
            .await
            .expect_err("rejected");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().starts_with(prefix), "{status:?}");
    }

    let plain = Baton::start(&redis).await;
    let status = plain
        .envoy_ratelimit_client()
        .await
        .should_rate_limit(envoy_request("edge", vec![descriptor(&[("a", "b")])]))
        .await
        .expect_err("not served");
    assert_eq!(status.code(), tonic::Code::Unimplemented);
}

/// Envoy's request as bytes on the wire: its entries' `string` fields with any bytes in them, as
/// Envoy sends a header's raw value (a Latin-1 `x-user: caf\xe9`).
#[derive(Clone, PartialEq, prost::Message)]
struct RawRequest {
    #[prost(bytes = "vec", tag = "1")]
    domain: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<RawDescriptor>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawDescriptor {
    #[prost(message, repeated, tag = "1")]
    entries: Vec<RawEntry>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawEntry {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// A request whose descriptors field holds bytes that are no message at all.
#[derive(Clone, PartialEq, prost::Message)]
struct Garbage {
    #[prost(string, tag = "1")]
    domain: String,
    #[prost(bytes = "vec", tag = "2")]
    descriptors: Vec<u8>,
}

fn raw_request(domain: &[u8], descriptors: &[&[(&str, &[u8])]]) -> RawRequest {
    RawRequest {
        domain: domain.to_vec(),
        descriptors: descriptors
            .iter()
            .map(|entries| RawDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| RawEntry {
                        key: k.as_bytes().to_vec(),
                        value: v.to_vec(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// `ShouldRateLimit` with a request encoded from `req` as it stands.
async fn should_rate_limit_raw<T: prost::Message + Send + 'static>(
    baton: &Baton,
    req: T,
) -> Result<RateLimitResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(support::channel(baton.addr()).await);
    grpc.ready().await.expect("the channel is ready");
    grpc.unary(
        tonic::Request::new(req),
        http::uri::PathAndQuery::from_static(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        ),
        tonic_prost::ProstCodec::<T, RateLimitResponse>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

/// An entry value that is not UTF-8 (a header's raw bytes, as Envoy passes them) is decided and
/// counted like any other, each such value apart from the others and from the valid values that
/// resemble it, and the other descriptors of the same call are still decided: the call does not
/// fail (which Envoy's failure mode would answer, bypassing every limit of the request). A
/// request that does not decode at all, or whose domain is not UTF-8, is INVALID_ARGUMENT.
#[tokio::test]
async fn envoy_values_that_are_not_utf8_are_decided() {
    let redis = RedisServer::start().await;
    let baton = envoy_baton(&redis).await;
    let ip = |value: &'static [u8]| raw_request(b"edge", &[&[("remote_address", value)]]);
    let decide = |req: RawRequest| {
        let baton = &baton;
        async move {
            should_rate_limit_raw(baton, req.clone())
                .await
                .unwrap_or_else(|s| panic!("ShouldRateLimit {req:?} failed: {s:?}"))
        }
    };

    // remote_address: 2 an hour, each value its own count.
    for remaining in [1, 0] {
        let got = decide(ip(b"caf\xe9")).await;
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
        assert_eq!(got.statuses[0].limit_remaining, remaining);
        assert_eq!(
            got.statuses[0]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            2
        );
    }
    let over = decide(ip(b"caf\xe9")).await;
    assert_eq!(codes(&over), (Code::OverLimit, vec![Code::OverLimit]));
    // Another invalid value, and the valid values it could be mistaken for, count apart.
    for value in [
        &b"caf\xe8"[..],
        "caf\u{fffd}".as_bytes(),
        "café".as_bytes(),
        b"caf\xe9\xe9",
        // Valid, with the U+0000 a query parameter's `%00` gives: not the text of `caf\xe9`.
        b"caf\0e9",
    ] {
        let got = decide(ip(value)).await;
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]), "{value:?}");
        assert_eq!(got.statuses[0].limit_remaining, 1, "{value:?}");
    }

    // A client's own limit used up stays used up when another descriptor of the call carries
    // bytes that are not UTF-8.
    for _ in 0..2 {
        let got = decide(ip(b"10.0.0.9")).await;
        assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
    }
    let got = decide(raw_request(
        b"edge",
        &[
            &[("remote_address", b"\xff\xfe")],
            &[("remote_address", b"10.0.0.9")],
        ],
    ))
    .await;
    assert_eq!(
        codes(&got),
        (Code::OverLimit, vec![Code::Ok, Code::OverLimit])
    );

    // A wildcard rule matches a value whose bytes after the prefix are not UTF-8.
    let got = decide(raw_request(b"edge", &[&[("path", b"/api/\xe9t\xe9")]])).await;
    assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
    assert_eq!(got.statuses[0].current_limit.as_ref().unwrap().name, "api");

    // Bounds apply to the bytes sent.
    let got = decide(ip(&[0xe9; 1024])).await;
    assert_eq!(codes(&got), (Code::Ok, vec![Code::Ok]));
    let status = should_rate_limit_raw(&baton, ip(&[0xe9; 1025]))
        .await
        .expect_err("too long");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    // What does not decode is the client's error, not Baton's.
    for garbage in [
        Garbage {
            domain: "edge".to_owned(),
            descriptors: vec![0xff; 3],
        },
        Garbage {
            domain: "edge".to_owned(),
            descriptors: vec![0x0a, 0x05, 0x0a],
        },
    ] {
        let status = should_rate_limit_raw(&baton, garbage)
            .await
            .expect_err("does not decode");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    }
    let status = should_rate_limit_raw(&baton, raw_request(b"ed\xe9e", &[&[("a", b"b")]]))
        .await
        .expect_err("a domain that is not UTF-8");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().starts_with("domain: "), "{status:?}");
}
