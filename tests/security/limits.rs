//! The server's limits: lease streams open at once, streams per connection, message size,
//! connections, the handshake deadline; and clients that stop answering (a silent connection)
//! or stop reading their Hold stream are cut off and their leases released.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use baton::proto::v1::{self as pb, lock_service_client::LockServiceClient};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    time::Instant,
};
use tonic::{Code, transport::Endpoint};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::{
    start,
    support::{
        RedisServer, channel,
        lease::next_renewal,
        lock::{acquire_request, held, hold_request, wait_until_free},
        wait_until, within,
    },
};

/// Past `--max-waiters` callers waiting at once (an `Acquire` with a wait, a waiting `Hold`, over
/// every primitive), a caller that finds the resource busy fails RESOURCE_EXHAUSTED naming the
/// flag instead of waiting, without taking a place in Redis; one that finds it free is still
/// granted, one that does not wait is answered as ever, and once a waiter leaves a new one waits.
/// Waiting callers had no bound: thousands of them, each renewing its place every second,
/// overloaded Redis for every client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_past_the_bound_are_refused() {
    let redis = RedisServer::start().await;
    let baton = start(&redis, |c| c.serving.max_waiters = 2).await;
    let mut locks = baton.client().await;
    let (_holder, _) = held(&mut locks, hold_request("busy", 30_000, None, "")).await;
    let mut waiting = Vec::new();
    for fair in [false, true] {
        let mut client = locks.clone();
        let mut request = acquire_request("busy", 5_000, Some(30_000), "");
        request.fair = fair;
        waiting.push(tokio::spawn(async move { client.acquire(request).await }));
    }
    crate::support::lease::wait_for_waiters(&locks, "busy", 2).await;

    let refused = locks
        .acquire(acquire_request("busy", 5_000, Some(30_000), ""))
        .await
        .expect_err("a third waiter");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("--max-waiters"), "{refused:?}");
    // A Hold's refusal comes as the call's status or as its stream's end.
    let refused = match locks
        .hold(hold_request("busy", 5_000, Some(30_000), ""))
        .await
    {
        Err(status) => status,
        Ok(response) => within(
            Duration::from_secs(5),
            response.into_inner().message(),
            "the Hold's answer",
        )
        .await
        .expect_err("a waiting Hold past the bound"),
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let other = crate::support::lock::describe(&mut locks, "busy")
        .await
        .waiters;
    assert_eq!(other, 2, "the refused callers took no place");

    // Not waiting, or finding the resource free: answered as ever.
    let tried = locks
        .acquire(acquire_request("busy", 5_000, None, ""))
        .await
        .expect("a try")
        .into_inner();
    assert!(!tried.acquired);
    let free = locks
        .acquire(acquire_request("free", 5_000, Some(30_000), ""))
        .await
        .expect("a free lock")
        .into_inner();
    assert!(free.acquired);

    // A waiter leaves; a new one waits in its place.
    waiting.remove(0).abort();
    crate::support::lease::wait_for_waiters(&locks, "busy", 1).await;
    let mut client = locks.clone();
    let again = tokio::spawn(async move {
        client
            .acquire(acquire_request("busy", 5_000, Some(30_000), ""))
            .await
    });
    crate::support::lease::wait_for_waiters(&locks, "busy", 2).await;
    again.abort();
    for w in waiting {
        w.abort();
    }
}

/// Past `--max-lease-streams`, a new Hold or KeepAlive fails RESOURCE_EXHAUSTED naming the flag,
/// while unary calls and health go on; once a stream ends, a new one opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_streams_past_the_bound_are_refused() {
    let redis = RedisServer::start().await;
    let baton = start(&redis, |c| c.serving.max_lease_streams = 3).await;
    let mut locks = baton.client().await;
    let mut open = Vec::new();
    for n in 0..3 {
        open.push(held(&mut locks, hold_request(&format!("s{n}"), 5_000, None, "")).await);
    }
    let refused = locks
        .hold(hold_request("s3", 5_000, None, ""))
        .await
        .expect_err("a fourth stream");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("--max-lease-streams"),
        "{refused:?}"
    );
    let token = open[0].1.token.clone();
    let refused = locks
        .keep_alive(pb::LockServiceKeepAliveRequest {
            name: "s0".to_owned(),
            token,
            ..Default::default()
        })
        .await
        .expect_err("a KeepAlive counts too");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");

    let unary = locks
        .acquire(acquire_request("unary", 1_000, None, ""))
        .await
        .expect("unary calls are served");
    assert!(unary.into_inner().acquired);
    let mut health = HealthClient::new(channel(baton.addr()).await);
    health
        .check(HealthCheckRequest {
            service: "readiness".to_owned(),
        })
        .await
        .expect("health answers");

    drop(open.pop());
    wait_until(
        Duration::from_secs(5),
        "a stream's place to free up",
        || {
            let mut locks = locks.clone();
            async move {
                locks
                    .hold(hold_request("s3", 5_000, None, ""))
                    .await
                    .map(|_| ())
            }
        },
    )
    .await;
}

/// A connection may open `--max-concurrent-streams` streams: the next one waits (HTTP/2 makes
/// the client wait) until one ends, while another connection is served at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_per_connection_are_bounded() {
    let redis = RedisServer::start().await;
    let baton = start(&redis, |c| c.serving.max_concurrent_streams = 2).await;
    let mut locks = baton.client().await;
    let (first, _) = held(&mut locks, hold_request("c0", 5_000, None, "")).await;
    let _second = held(&mut locks, hold_request("c1", 5_000, None, "")).await;
    let mut third = locks.clone();
    let waiting = tokio::spawn(async move {
        third
            .acquire(acquire_request("c2", 1_000, None, ""))
            .await
            .map(|r| r.into_inner().acquired)
    });
    // Over another connection, a call is served while the third one waits.
    let mut other = baton.client().await;
    let served = other
        .acquire(acquire_request("c3", 1_000, None, ""))
        .await
        .expect("another connection is served");
    assert!(served.into_inner().acquired);
    assert!(
        !waiting.is_finished(),
        "a third stream ran on a connection limited to two"
    );
    drop(first);
    let acquired = within(
        Duration::from_secs(5),
        waiting,
        "the third call, once a stream ended",
    )
    .await
    .expect("the task")
    .expect("the call");
    assert!(acquired);
}

/// Calls whose client gave up while Baton could not run (a sidecar throttled or frozen: here
/// SIGSTOP) reach it as streams opened and reset before it took them, 2,000 here. They are dropped
/// quietly, up to 4 × `--max-concurrent-streams`: the HTTP/2 layer's default closed the
/// connection past 20 of them (GOAWAY "too_many_resets"), failing every call on it and ending its
/// Hold streams without `lost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_given_up_while_baton_was_frozen_leave_the_connection_alone() {
    let redis = RedisServer::start().await;
    let mut args = redis.baton_args();
    args.extend(["--key-prefix".to_owned(), crate::support::unique_prefix()]);
    let process =
        crate::support::BatonProcess::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .await;
    let mut locks = LockServiceClient::new(channel(process.addr()).await);
    // A ttl far longer than the freeze, however slowly a busy machine writes the rounds below:
    // a freeze past the ttl would rightly end the Hold `lost` (the CI met one with 3 s).
    let (mut stream, _) = held(&mut locks, hold_request("kept", 10_000, None, "")).await;

    let frozen = crate::support::freeze(process.pid());
    // Rounds of calls written (they wait in Baton's socket), then given up: each one's stream is
    // reset behind it, which frees it for the next round. 2,000 in all: more than the streams a
    // connection may have open (1024), less than the 4,096 resets allowed.
    for round in 0..4 {
        let mut given_up = tokio::task::JoinSet::new();
        for i in 0..500 {
            let mut client = locks.clone();
            given_up.spawn(async move {
                client
                    .acquire(acquire_request(
                        &format!("gone-{round}-{i}"),
                        1_000,
                        None,
                        "",
                    ))
                    .await
            });
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        given_up.abort_all();
        while given_up.join_next().await.is_some() {}
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(frozen);

    // The connection lives on: the Hold goes on renewing and a new call on it is served.
    next_renewal(&mut stream).await;
    let served = locks
        .acquire(acquire_request("after", 1_000, None, ""))
        .await
        .expect("a call on the same connection");
    assert!(served.into_inner().acquired);
    next_renewal(&mut stream).await;
}

/// A request larger than `--max-message-size` is refused (tonic's OUT_OF_RANGE, naming the
/// limit) without Baton reading it whole; smaller ones are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_larger_than_the_bound_are_refused() {
    let redis = RedisServer::start().await;
    let baton = start(&redis, |c| c.serving.max_message_bytes = 1024).await;
    let mut locks = baton.client().await;
    let refused = locks
        .acquire(acquire_request(
            &"n".repeat(1000),
            1_000,
            None,
            &"o".repeat(200),
        ))
        .await
        .expect_err("a request over 1 KiB");
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
    assert!(refused.message().contains("1024"), "{refused:?}");
    let served = locks
        .acquire(acquire_request("small", 1_000, None, ""))
        .await
        .expect("a small request");
    assert!(served.into_inner().acquired);
}

/// The bytes of a request, sent as they are: what a client with a broken encoder sends.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Self;
    type Decoder = Self;

    fn encoder(&mut self) -> Self {
        Self
    }

    fn decoder(&mut self) -> Self {
        Self
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let len = bytes::Buf::remaining(src);
        Ok(Some(bytes::Buf::copy_to_bytes(src, len).to_vec()))
    }
}

/// A request that does not decode (a name that is not UTF-8, a message cut short) fails
/// INVALID_ARGUMENT with the decoder's reason, not INTERNAL, in every service: naming the field
/// first, with a BadRequest detail, when the decoder stopped at one (nested fields outer first);
/// well-formed requests on the same connection are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_do_not_decode_are_invalid_arguments() {
    let redis = RedisServer::start().await;
    let baton = start(&redis, |_| {}).await;
    let mut grpc = tonic::client::Grpc::new(channel(baton.addr()).await);
    // Field 1 (the name of every request below), 4 bytes that are not UTF-8; then a field 1
    // that says 16 bytes and holds 1.
    let not_utf8 = vec![0x0a, 4, 0xff, 0xfe, b'a', b'b'];
    let cut_short = vec![0x0a, 16, b'a'];
    // A key of wire type 7, which no field has.
    let garbled = vec![0x0f];
    for path in [
        "/baton.v1.LockService/Acquire",
        "/baton.v1.LockService/Describe",
        "/baton.v1.SemaphoreService/Describe",
        "/baton.v1.ElectionService/Leader",
    ] {
        let field = "name";
        for (bytes, starts, named) in [
            (
                &not_utf8,
                format!("{field}: invalid string value"),
                Some(field),
            ),
            (
                &cut_short,
                format!("{field}: buffer underflow"),
                Some(field),
            ),
            (&garbled, "the request does not decode: ".to_owned(), None),
        ] {
            let refused = undecoded(&mut grpc, path, bytes.clone()).await;
            assert!(
                refused.message().starts_with(&starts),
                "{path}: {refused:?}"
            );
            assert_eq!(bad_field(&refused).as_deref(), named, "{path}: {refused:?}");
        }
    }
    // A term of an Add (field 2) whose display (field 1) is not UTF-8.
    let term = [0x0a, 2, 0xff, 0xfe];
    let mut add = vec![0x0a, 1, b'd', 0x12, term.len() as u8];
    add.extend_from_slice(&term);
    let refused = undecoded(&mut grpc, "/baton.v1.AutocompleteService/Add", add).await;
    assert!(
        refused
            .message()
            .starts_with("terms.display: invalid string value"),
        "{refused:?}"
    );
    assert_eq!(bad_field(&refused).as_deref(), Some("terms.display"));
    let mut locks = baton.client().await;
    let served = locks
        .acquire(acquire_request("fine", 1_000, None, ""))
        .await
        .expect("a well-formed request");
    assert!(served.into_inner().acquired);
}

/// A request whose gRPC framing is broken (no message at all, a frame whose length prefix
/// promises more than it carries, a compression flag set without a `grpc-encoding` or neither 0
/// nor 1) is the client's fault: INVALID_ARGUMENT saying so, where tonic answers INTERNAL (which
/// Baton counted and logged as its own error), for a unary method and a streaming one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_whose_framing_is_broken_are_invalid_arguments() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let redis = RedisServer::start().await;
    let baton = start(&redis, |_| {}).await;
    let channel = channel(baton.addr()).await;
    // A gRPC frame saying 16 bytes, holding 1; frames of 2 bytes flagged compressed (1) and 7.
    let cut_short = vec![0, 0, 0, 0, 16, 0x0a];
    let compressed = vec![1, 0, 0, 0, 2, 0x0a, 0];
    let flag_7 = vec![7, 0, 0, 0, 2, 0x0a, 0];
    let ended = "the request ended before a whole message";
    let flagged = "the request's compression flag is wrong";
    for path in [
        "/baton.v1.LockService/Acquire",
        "/baton.v1.LockService/Hold",
    ] {
        for (what, body, says) in [
            ("no message", Vec::new(), ended),
            ("a message cut short", cut_short.clone(), ended),
            ("a compressed message", compressed.clone(), flagged),
            ("flag 7", flag_7.clone(), flagged),
        ] {
            let request = http::Request::builder()
                .method("POST")
                .uri(format!("http://{}{path}", baton.addr()))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(tonic::body::Body::new(http_body_util::Full::new(
                    bytes::Bytes::from(body),
                )))
                .expect("a request");
            let response = within(
                Duration::from_secs(10),
                channel.clone().oneshot(request),
                "the answer",
            )
            .await
            .expect("an HTTP answer");
            let status = match tonic::Status::from_header_map(response.headers()) {
                Some(status) => status,
                None => {
                    let trailers = response
                        .into_body()
                        .collect()
                        .await
                        .expect("the body")
                        .trailers()
                        .cloned()
                        .expect("trailers");
                    tonic::Status::from_header_map(&trailers).expect("a status")
                }
            };
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "{path}, {what}: {status:?}"
            );
            assert!(
                status.message().starts_with(says),
                "{path}, {what}: {status:?}"
            );
        }
    }
    let served = baton
        .client()
        .await
        .acquire(acquire_request("fine", 1_000, None, ""))
        .await
        .expect("a well-formed request");
    assert!(served.into_inner().acquired);
}

/// The refusal of `bytes` sent to `path` as a request, which must be INVALID_ARGUMENT.
async fn undecoded(
    grpc: &mut tonic::client::Grpc<tonic::transport::Channel>,
    path: &'static str,
    bytes: Vec<u8>,
) -> tonic::Status {
    grpc.ready().await.expect("the connection");
    let refused = grpc
        .unary(
            tonic::Request::new(bytes),
            http::uri::PathAndQuery::from_static(path),
            RawCodec,
        )
        .await
        .expect_err("a request that does not decode");
    assert_eq!(refused.code(), Code::InvalidArgument, "{path}: {refused:?}");
    refused
}

/// The field a BadRequest detail of `status` names, if any.
fn bad_field(status: &tonic::Status) -> Option<String> {
    use tonic_types::StatusExt;
    let bad = status.get_error_details().bad_request()?.clone();
    bad.field_violations.first().map(|v| v.field.clone())
}

/// A connection that says nothing is closed after `--handshake-timeout`, and past
/// `--max-connections` a new connection waits until one closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_bounded_and_must_begin_in_time() {
    let redis = RedisServer::start().await;
    let baton = start(&redis, |c| {
        c.serving.max_connections = 2;
        c.serving.handshake_timeout = Duration::from_millis(500);
    })
    .await;
    let addr = baton.addr();

    let mut mute = TcpStream::connect(addr).await.expect("connecting");
    let opened = Instant::now();
    // Baton sends its HTTP/2 settings, then closes the connection at the deadline.
    let mut sent = Vec::new();
    // Closed either way: an end of file or a reset.
    let _closed = within(
        Duration::from_secs(10),
        mute.read_to_end(&mut sent),
        "Baton closing a mute connection",
    )
    .await;
    assert!(
        opened.elapsed() >= Duration::from_millis(400),
        "closed after {:?}",
        opened.elapsed()
    );

    // Two connections (one is the socket's health check, which may still be closing) take
    // every place: wait until a third cannot be served.
    let _a = TcpStream::connect(addr).await.expect("connecting");
    let _b = TcpStream::connect(addr).await.expect("connecting");
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_millis(300))
        .timeout(Duration::from_millis(300));
    let lazy = endpoint.connect_lazy();
    let refused = HealthClient::new(lazy)
        .check(HealthCheckRequest::default())
        .await;
    assert!(
        refused.is_err(),
        "a third connection was served: {refused:?}"
    );
    // The mute ones are closed at their deadline: places free up.
    wait_until(
        Duration::from_secs(10),
        "a place for a new connection",
        || {
            let endpoint = endpoint.clone();
            async move {
                let channel = endpoint.connect().await.map_err(|e| e.to_string())?;
                HealthClient::new(channel)
                    .check(HealthCheckRequest::default())
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await;
}

/// A TCP relay whose connections can be frozen: it then stops passing the client's bytes on and
/// drops Baton's, as a network that went silent would; it records when Baton closed its side.
struct Relay {
    addr: SocketAddr,
    frozen: watch::Sender<bool>,
    closed: Arc<Mutex<Option<Instant>>>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let addr = listener.local_addr().expect("address");
        let (frozen, _) = watch::channel(false);
        let closed = Arc::new(Mutex::new(None));
        let (tx, record) = (frozen.clone(), closed.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(baton) = TcpStream::connect(target).await else {
                    continue;
                };
                let (client_rx, mut client_tx) = client.into_split();
                let (mut baton_rx, baton_tx) = baton.into_split();
                // Frozen, nothing from the client goes on any more.
                tokio::spawn(pass(client_rx, baton_tx, tx.subscribe(), None));
                let frozen = tx.subscribe();
                let record = record.clone();
                tokio::spawn(async move {
                    let mut buf = [0; 16 * 1024];
                    loop {
                        match baton_rx.read(&mut buf).await {
                            Ok(n) if n > 0 => {
                                // Frozen: Baton's bytes are dropped.
                                if !*frozen.borrow()
                                    && client_tx.write_all(&buf[..n]).await.is_err()
                                {
                                    return;
                                }
                            }
                            _ => {
                                *record.lock().expect("lock") = Some(Instant::now());
                                return;
                            }
                        }
                    }
                });
            }
        });
        Self {
            addr,
            frozen,
            closed,
        }
    }

    fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    fn closed_at(&self) -> Option<Instant> {
        *self.closed.lock().expect("lock")
    }
}

/// A client whose connection goes silent (nothing passes either way, the TCP connection stays
/// open) loses its 1 s lease soon after the ttl, and Baton closes the connection once its pings
/// go unanswered for the keepalive timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_cut_off_and_its_lease_released() {
    let redis = RedisServer::start().await;
    let baton = start(&redis, |c| {
        c.client_keepalive_interval = Some(Duration::from_millis(200));
        c.client_keepalive_timeout = Duration::from_secs(1);
    })
    .await;
    let relay = Relay::start(baton.addr()).await;
    let mut through = LockServiceClient::new(crate::support::channel(relay.addr).await);
    let (mut stream, _) = held(&mut through, hold_request("silent", 1_000, None, "")).await;
    next_renewal(&mut stream).await;

    relay.freeze();
    let frozen = Instant::now();
    let observer = baton.client().await;
    wait_until_free(&observer, "silent", Duration::from_secs(10)).await;
    let released = frozen.elapsed();
    // ttl (1 s) of silence, then the expiry last reported (at most a ttl): 2 s, plus margins.
    assert!(
        released < Duration::from_secs(4),
        "released {released:?} after the silence began"
    );
    wait_until(
        Duration::from_secs(10),
        "Baton to close the silent connection",
        || async { relay.closed_at().ok_or("open") },
    )
    .await;
    let closed = relay.closed_at().expect("closed") - frozen;
    // Pings every 200 ms, each answered within 1 s: closed within about 1.2 s, plus margins.
    assert!(
        closed < Duration::from_secs(4),
        "closed {closed:?} after the silence began"
    );
}

/// A client that stops reading its Hold stream while its connection stays alive (it answers
/// pings) is cut off once the renewals it leaves unread fill its HTTP/2 window (a small one
/// here) and wait longer than the lease's ttl: the lease is released and another holder gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_loses_its_lease() {
    let redis = RedisServer::start().await;
    let baton = start(&redis, |c| {
        c.client_keepalive_interval = Some(Duration::from_millis(200))
    })
    .await;
    let small_window = Endpoint::from_shared(format!("http://{}", baton.addr()))
        .expect("endpoint")
        .initial_stream_window_size(Some(64))
        .connect()
        .await
        .expect("connecting");
    let mut reader = LockServiceClient::new(small_window);
    let (stream, _) = held(&mut reader, hold_request("unread", 600, None, "")).await;
    let stopped = Instant::now();

    let mut other = baton.client().await;
    let mut next = other
        .hold(hold_request("unread", 600, Some(10_000), ""))
        .await
        .expect("Hold")
        .into_inner();
    let taken = within(
        Duration::from_secs(10),
        next.message(),
        "the lock to pass on",
    )
    .await;
    let waited = stopped.elapsed();
    assert!(
        matches!(
            taken,
            Ok(Some(pb::LockServiceHoldResponse {
                event: Some(pb::lock_service_hold_response::Event::Acquired(_))
            }))
        ),
        "{taken:?}"
    );
    // The window fills within a few renewals; then a ttl unread and the last expiry promised.
    assert!(
        waited < Duration::from_secs(4),
        "passed on after {waited:?}"
    );
    drop(stream);
}

/// A TCP relay that can pause its connections as a stopped client process would: while paused
/// it reads nothing either way, so every byte waits in the sockets' buffers and passes on once
/// it resumes. It records when the client last sent Baton anything.
struct Pausable {
    addr: SocketAddr,
    paused: watch::Sender<bool>,
    last_from_client: Arc<Mutex<Instant>>,
}

impl Pausable {
    async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let addr = listener.local_addr().expect("address");
        let (paused, _) = watch::channel(false);
        let last_from_client = Arc::new(Mutex::new(Instant::now()));
        let (tx, heard) = (paused.clone(), last_from_client.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(baton) = TcpStream::connect(target).await else {
                    continue;
                };
                let (client_rx, client_tx) = client.into_split();
                let (baton_rx, baton_tx) = baton.into_split();
                tokio::spawn(pass(
                    client_rx,
                    baton_tx,
                    tx.subscribe(),
                    Some(heard.clone()),
                ));
                tokio::spawn(pass(baton_rx, client_tx, tx.subscribe(), None));
            }
        });
        Self {
            addr,
            paused,
            last_from_client,
        }
    }

    fn last_from_client(&self) -> Instant {
        *self.last_from_client.lock().expect("lock")
    }
}

/// Copies `from` to `to`, reading nothing while `paused`; notes each read in `heard`.
async fn pass(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
    heard: Option<Arc<Mutex<Instant>>>,
) {
    let mut buf = [0; 16 * 1024];
    loop {
        if *paused.borrow_and_update() {
            if paused.changed().await.is_err() {
                return;
            }
            continue;
        }
        tokio::select! {
            _ = paused.changed() => {}
            n = from.read(&mut buf) => match n {
                Ok(n) if n > 0 => {
                    if let Some(heard) = &heard {
                        *heard.lock().expect("lock") = Instant::now();
                    }
                    if to.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
                _ => return,
            },
        }
    }
}

/// A client paused for less than its lease's ttl keeps the lease, however its pause falls
/// between Baton's pings: an idle client is heard only when it answers a ping (a ping interval
/// after it was last heard), so a pause that begins just before a ping leaves it silent for
/// the pause and almost a ping interval more. Here a 1.5 s pause of a 2 s lease begins 0.9 s
/// after the client last answered: silent for 2.4 s, more than the ttl, and still within what a
/// paused client may be silent for. The lease stays held and the stream goes on renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_paused_for_less_than_its_ttl_keeps_its_lease() {
    let redis = RedisServer::start().await;
    let baton = start(&redis, |c| {
        c.client_keepalive_interval = Some(Duration::from_secs(1))
    })
    .await;
    let relay = Pausable::start(baton.addr()).await;
    let mut through = LockServiceClient::new(channel(relay.addr).await);
    let (mut stream, _) = held(&mut through, hold_request("paused", 2_000, None, "")).await;
    // Idle but for Baton's pings, which come a second after the client was last heard.
    let acquired = Instant::now();
    wait_until(
        Duration::from_secs(10),
        "the client to answer a ping",
        || async {
            if relay.last_from_client() > acquired + Duration::from_millis(500) {
                Ok(())
            } else {
                Err("not yet")
            }
        },
    )
    .await;
    let answered = relay.last_from_client();
    tokio::time::sleep_until(answered + Duration::from_millis(900)).await;
    relay.paused.send_replace(true);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    relay.paused.send_replace(false);
    let resumed = Instant::now();

    // Renewals only (those sent during the pause first), for two more seconds: no `lost`.
    let renewals =
        crate::support::lease::renewals_until(&mut stream, resumed + Duration::from_secs(2)).await;
    assert!(!renewals.is_empty(), "no renewal after the pause");
    let described = baton
        .client()
        .await
        .describe(pb::LockServiceDescribeRequest {
            name: "paused".into(),
        })
        .await
        .expect("Describe")
        .into_inner();
    assert!(described.held, "the paused client's lease was released");
}
