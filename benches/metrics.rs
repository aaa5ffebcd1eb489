//! What recording metrics costs one lock acquire + release: the RPC layer around each of the two
//! calls (a response with a message and `grpc-status` trailers, polled to its end), the grant
//! counted by result, and the two Redis round trips timed and observed. Measured against the same two
//! calls through the same service without the layer, in one thread and in two at once (the
//! counters of one method are shared atomics), in CPU time of this process.
//!
//! ```sh
//! cargo bench --bench metrics            # 2,000,000 operations per side and thread count
//! ```
//!
//! Without `--bench` (as `cargo test --all-targets` runs it) it is a smoke run of a few thousand
//! operations that checks the calls were counted.

use std::{
    convert::Infallible,
    hint::black_box,
    time::{Duration, Instant},
};

use baton::metrics::{self, Acquisition, RedisCall, grpc::RpcLayer};
use bytes::Bytes;
use futures::executor::block_on;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full};
use nix::sys::resource::{UsageWho, getrusage};
use tower_layer::Layer;
use tower_service::Service;

const ACQUIRE: &str = "/baton.v1.LockService/Acquire";
const RELEASE: &str = "/baton.v1.LockService/Release";

/// A handler that answers every call with one message and `grpc-status: 0` trailers, as tonic
/// answers a successful unary call.
#[derive(Clone)]
struct Answer;

impl Service<Request<()>> for Answer {
    type Response = Response<
        http_body_util::combinators::WithTrailers<
            Full<Bytes>,
            std::future::Ready<Option<Result<HeaderMap, Infallible>>>,
        >,
    >;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        let body = Full::new(Bytes::from_static(b"\0\0\0\0\x02\x08\x01"))
            .with_trailers(std::future::ready(Some(Ok(trailers))));
        std::future::ready(Ok(Response::new(body)))
    }
}

/// One call through `service`, its body read to the end.
fn call<S, B>(service: &mut S, path: &'static str)
where
    S: Service<Request<()>, Response = Response<B>, Error = Infallible>,
    B: http_body::Body + Unpin,
    B::Error: std::fmt::Debug,
{
    let request = Request::builder().uri(path).body(()).unwrap_or_default();
    block_on(async {
        let Ok(response) = service.call(request).await;
        let mut body = response.into_body();
        while let Some(frame) = body.frame().await {
            black_box(frame.is_ok());
        }
    });
}

/// CPU time of this process so far.
fn cpu() -> Duration {
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let time = |t: nix::sys::time::TimeVal| {
                Duration::from_secs(u64::try_from(t.tv_sec()).unwrap_or(0))
                    + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap_or(0))
            };
            time(usage.user_time()) + time(usage.system_time())
        }
        Err(_) => Duration::ZERO,
    }
}

/// CPU time per operation (acquire + release) of `threads` threads doing `ops` each.
fn measure(threads: usize, ops: usize, with_metrics: bool) -> f64 {
    let layer = RpcLayer::new([ACQUIRE, RELEASE]);
    let before = cpu();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let layer = layer.clone();
            scope.spawn(move || {
                let mut plain = Answer;
                let mut layered = layer.layer(Answer);
                let lock = metrics::lease("lock");
                for _ in 0..ops {
                    // Each call's script starts by reading the clock for its deadline; recording
                    // adds the reading of its duration.
                    if with_metrics {
                        let script = Instant::now();
                        call(&mut layered, ACQUIRE);
                        lock.acquisition(Acquisition::Acquired, None);
                        metrics::redis_call(RedisCall::Script, script.elapsed());
                        let script = Instant::now();
                        call(&mut layered, RELEASE);
                        metrics::redis_call(RedisCall::Script, script.elapsed());
                    } else {
                        black_box(Instant::now());
                        call(&mut plain, ACQUIRE);
                        black_box(Instant::now());
                        call(&mut plain, RELEASE);
                    }
                }
            });
        }
    });
    let spent = cpu().saturating_sub(before);
    spent.as_secs_f64() * 1e9 / (threads * ops) as f64
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let ops = if full { 2_000_000 } else { 5_000 };
    let mut report = String::from(
        "| threads | without metrics, ns / op | with metrics, ns / op | metrics, ns / call |\n|---:|---:|---:|---:|\n",
    );
    for threads in [1, 2] {
        // Alternate the sides, twice each, and keep the cheaper run of each.
        let mut without = f64::MAX;
        let mut with = f64::MAX;
        for _ in 0..2 {
            without = without.min(measure(threads, ops, false));
            with = with.min(measure(threads, ops, true));
        }
        report.push_str(&format!(
            "| {threads} | {without:.0} | {with:.0} | {:.0} |\n",
            (with - without) / 2.0
        ));
    }
    print!("{report}");
    let scrape = metrics::encode(metrics::Format::Prometheus).unwrap_or_default();
    let counted = format!(
        "baton_rpc_calls_total{{service=\"baton.v1.LockService\",method=\"Acquire\",code=\"OK\"}} {}",
        2 * 3 * ops
    );
    assert!(
        scrape.lines().any(|l| l == counted),
        "every call counted: {counted} in\n{scrape}"
    );
}
