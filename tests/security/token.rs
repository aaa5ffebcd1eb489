//! The API token: calls without it, with a malformed or a wrong one are refused
//! `UNAUTHENTICATED` with a message saying what to send; health needs none; the token file is
//! reread when it changes.

use std::time::Duration;

use baton::proto::v1::{self as pb, lock_service_client::LockServiceClient};
use tonic::{
    Code, Request, Status,
    metadata::MetadataValue,
    service::{Interceptor, interceptor::InterceptedService},
    transport::Channel,
};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest,
};

use crate::{
    start,
    support::{RedisServer, channel, ms, uds_channel, wait_until},
};

const FIRST: &str = "first-token-8b1f0c2e9a7d4c11";
const SECOND: &str = "second-token-5d3e2a1b0c9f8e77";

/// Adds `authorization: VALUE` to every call, if given.
#[derive(Clone)]
struct Authorization(Option<&'static str>);

impl Interceptor for Authorization {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = self.0 {
            request.metadata_mut().insert(
                "authorization",
                MetadataValue::try_from(value).expect("an ASCII value"),
            );
        }
        Ok(request)
    }
}

type Locks = LockServiceClient<InterceptedService<Channel, Authorization>>;

/// Adds two `authorization` values to every call, in this order.
#[derive(Clone)]
struct TwoAuthorizations(&'static str, &'static str);

impl Interceptor for TwoAuthorizations {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        for value in [self.0, self.1] {
            request.metadata_mut().append(
                "authorization",
                MetadataValue::try_from(value).expect("an ASCII value"),
            );
        }
        Ok(request)
    }
}

fn locks(channel: &Channel, authorization: Option<&'static str>) -> Locks {
    LockServiceClient::with_interceptor(channel.clone(), Authorization(authorization))
}

async fn acquire(locks: &mut Locks, name: &str) -> Result<pb::LockServiceAcquireResponse, Status> {
    locks
        .acquire(pb::LockServiceAcquireRequest {
            name: name.to_owned(),
            ttl: Some(ms(10_000)),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

fn assert_unauthenticated<T: std::fmt::Debug>(result: Result<T, Status>, says: &str) {
    match result {
        Err(status) if status.code() == Code::Unauthenticated => assert!(
            status.message().contains(says),
            "the message {:?} does not say {says:?}",
            status.message()
        ),
        other => panic!("expected UNAUTHENTICATED saying {says:?}, got {other:?}"),
    }
}

/// Without the token, with a malformed or a wrong one, or with two `authorization` values, a call
/// fails UNAUTHENTICATED saying what to send, over TCP and over the socket; either token of the file gets in; health answers
/// without one, reflection does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_need_the_api_token() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{FIRST}\n\n{SECOND}\n")).expect("writing the token");
    let baton = start(&redis, |c| c.serving.api_token_file = Some(file.clone())).await;

    for channel in [
        channel(baton.addr()).await,
        uds_channel(baton.socket_path()).await,
    ] {
        assert_unauthenticated(
            acquire(&mut locks(&channel, None), "a").await,
            "requires an API token",
        );
        assert_unauthenticated(
            acquire(&mut locks(&channel, Some(FIRST)), "a").await,
            "must be `Bearer <token>`",
        );
        assert_unauthenticated(
            acquire(
                &mut locks(&channel, Some("Bearer first-token-8b1f0c2e9a7d4c1")),
                "a",
            )
            .await,
            "not valid",
        );
        assert_unauthenticated(
            acquire(&mut locks(&channel, Some("Bearer not-the-token")), "a").await,
            "not valid",
        );
        // Two values: which one would count is a guess (the first used to, so a wrong token
        // before the right one was refused and the reverse let in), so neither does.
        for (a, b) in [
            (
                "Bearer not-the-token",
                "Bearer first-token-8b1f0c2e9a7d4c11",
            ),
            (
                "Bearer first-token-8b1f0c2e9a7d4c11",
                "Bearer not-the-token",
            ),
            (
                "Bearer first-token-8b1f0c2e9a7d4c11",
                "Bearer first-token-8b1f0c2e9a7d4c11",
            ),
        ] {
            let mut two =
                LockServiceClient::with_interceptor(channel.clone(), TwoAuthorizations(a, b));
            let got = two
                .acquire(pb::LockServiceAcquireRequest {
                    name: "a".to_owned(),
                    ttl: Some(ms(10_000)),
                    ..Default::default()
                })
                .await;
            assert_unauthenticated(got, "more than once");
        }
        let lock = format!("t-{}", uuid::Uuid::new_v4().simple());
        let first = acquire(
            &mut locks(&channel, Some("Bearer first-token-8b1f0c2e9a7d4c11")),
            &lock,
        )
        .await
        .expect("the first token gets in");
        assert!(first.acquired);
        let second = acquire(
            &mut locks(&channel, Some("bearer second-token-5d3e2a1b0c9f8e77")),
            &lock,
        )
        .await
        .expect("the second token gets in");
        assert!(!second.acquired, "the lock is held by the first call");

        let mut health = HealthClient::new(channel.clone());
        health
            .check(HealthCheckRequest {
                service: "readiness".to_owned(),
            })
            .await
            .expect("health needs no token");

        let mut reflection = ServerReflectionClient::new(channel.clone());
        let asked = reflection
            .server_reflection_info(tokio_stream::iter([ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            }]))
            .await;
        let refused = match asked {
            Err(status) => status,
            Ok(response) => {
                let mut stream = response.into_inner();
                stream
                    .message()
                    .await
                    .expect_err("reflection answers nothing without the token")
            }
        };
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    }
}

/// The token file is reread: after it changes, the new token gets in and the old one is
/// refused; a file then emptied is refused and the token in force stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_rotated_with_its_file() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("token");
    std::fs::write(&file, FIRST).expect("writing the token");
    let baton = start(&redis, |c| {
        c.serving.api_token_file = Some(file.clone());
        c.serving.credentials_reload = Duration::from_millis(50);
    })
    .await;
    let channel = channel(baton.addr()).await;
    let old = "Bearer first-token-8b1f0c2e9a7d4c11";
    let new = "Bearer second-token-5d3e2a1b0c9f8e77";
    acquire(&mut locks(&channel, Some(old)), "r1")
        .await
        .expect("the first token gets in");

    // Replaced as a Secret is: a new file renamed over the old one.
    let staged = dir.path().join("token.new");
    std::fs::write(&staged, format!("{SECOND}\n")).expect("writing the new token");
    std::fs::rename(&staged, &file).expect("renaming");
    wait_until(
        Duration::from_secs(5),
        "the new token to be accepted",
        || {
            let mut locks = locks(&channel, Some(new));
            async move { acquire(&mut locks, "r2").await.map(|_| ()) }
        },
    )
    .await;
    assert_unauthenticated(
        acquire(&mut locks(&channel, Some(old)), "r3").await,
        "not valid",
    );

    // An empty file holds no token: refused, the token in force stays for several rereads.
    std::fs::write(&file, "").expect("emptying the token file");
    let until = tokio::time::Instant::now() + Duration::from_millis(500);
    while tokio::time::Instant::now() < until {
        acquire(&mut locks(&channel, Some(new)), "r4")
            .await
            .expect("the token in force stays after an empty file");
        assert_unauthenticated(acquire(&mut locks(&channel, None), "r4").await, "requires");
        // Paced: a few dozen checks over several rereads of the file.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
