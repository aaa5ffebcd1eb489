//! The gRPC server: services, health and reflection on already-bound listeners, with a graceful
//! drain bounded by a deadline.
//!
//! Health answers for `""` and `liveness` (SERVING while the process serves) and for `readiness`
//! and each Baton service (SERVING while Baton can serve: a single Redis answers `PING`; on a
//! Cluster, at least one master answers with `cluster_state:ok`, see [`Redis::health`]). It is
//! also served alone on the health listener, if any, for probes from outside the pod. Stopping
//! has two stages ([`Stop`]): readiness turns NOT_SERVING while every call is still served (the
//! shutdown delay), then everything turns NOT_SERVING and streams drain.

use std::{io, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use futures::TryStreamExt;
use tokio::{
    net::{TcpListener, UnixListener},
    task::JoinSet,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tonic::transport::{Server, server::TcpIncoming};
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::proto::v1::rate_limit_service_server::RateLimitServiceServer;
use crate::ratelimit::{
    RateLimiter,
    envoy::{EnvoyRateLimitApi, EnvoyRateLimitServer},
    rules::Rules,
    service::RateLimitApi,
};

use crate::autocomplete::{Autocomplete, service::AutocompleteApi};
use crate::election::{Election, Elections, service::ElectionApi};
use crate::proto::v1::autocomplete_service_server::AutocompleteServiceServer;
use crate::proto::v1::election_service_server::ElectionServiceServer;
use crate::{
    config::ServeConfig,
    grpc::{
        authority::FixAuthority,
        conn::{CountCalls, Traffic, Watched},
        deadline::Deadline,
        drain::{EndAtShutdown, TrackCalls},
    },
    lease::WaitLimit,
    lock::{Lock, Locks, service::LockApi},
    metrics::{self, grpc::RpcLayer},
    proto::{
        FILE_DESCRIPTOR_SET,
        v1::{
            lock_service_server::LockServiceServer,
            semaphore_service_server::SemaphoreServiceServer,
        },
    },
    redis::{Health, Notifier, Redis},
    security::{self, Serving},
    semaphore::{Semaphore, Semaphores, service::SemaphoreApi},
};

/// How often readiness checks Redis with `PING`.
pub const READINESS_INTERVAL: Duration = Duration::from_secs(1);

/// How long every client connection must have been quiet (no byte received or written), once
/// every call is answered, before the drain closes those still open: a connection whose client
/// still reads its last answers or says goodbye is left to finish.
pub const FLUSH_GRACE: Duration = Duration::from_millis(500);

/// Streams reset before Baton took them allowed at once on a connection, per stream it may have
/// open (`--max-concurrent-streams`): past them the connection is closed (GOAWAY).
pub const PENDING_RESETS_PER_STREAM: usize = 4;

/// Health service names that follow Redis reachability.
const READY_NAMES: &[&str] = &[
    "readiness",
    "baton.v1.AutocompleteService",
    "baton.v1.ElectionService",
    "baton.v1.LockService",
    "baton.v1.RateLimitService",
    "baton.v1.SemaphoreService",
];
/// Health service names that follow the process.
const LIVE_NAMES: &[&str] = &["", "liveness"];
/// Largest metadata (HTTP/2 header list) a call may carry, in bytes.
pub const MAX_METADATA_BYTES: u32 = 16 * 1024;

/// Methods served beside those of Baton's and health's descriptor sets: reflection, and Envoy's
/// rate limit API.
const OTHER_METHODS: &[&str] = &[
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    crate::ratelimit::envoy::SHOULD_RATE_LIMIT,
];

/// The sockets Baton serves on, bound before [`serve`] so tests can bind port 0.
#[derive(Debug, Default)]
pub struct Listeners {
    /// The TCP listener, if any.
    pub tcp: Option<TcpListener>,
    /// The Unix socket listener and its path (removed when serving ends), if any.
    pub unix: Option<(UnixListener, PathBuf)>,
    /// The TCP listener serving only the health service, if any.
    pub health: Option<TcpListener>,
    /// The listener of the metrics endpoint (`--metrics-listen`), if any.
    pub metrics: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses in `config`. The Unix socket gets its mode and group before anyone
    /// can connect; a stale socket left by a dead Baton is replaced, anything else at its path
    /// (a live socket, a file, a directory) is a [`security::Refused`] error
    /// ([`security::socket::bind`]).
    pub async fn bind(config: &ServeConfig) -> anyhow::Result<Self> {
        let tcp = match config.listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding {addr}"))?,
            ),
            None => None,
        };
        let unix = match &config.socket {
            Some(path) => Some((
                security::socket::bind(
                    path,
                    config.serving.socket_mode,
                    config.serving.socket_group,
                )
                .await?,
                path.clone(),
            )),
            None => None,
        };
        let health = match config.health_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding the health listener {addr}"))?,
            ),
            None => None,
        };
        let metrics = match config.metrics_listen {
            Some(addr) => Some(
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding {addr} for metrics"))?,
            ),
            None => None,
        };
        Ok(Self {
            tcp,
            unix,
            health,
            metrics,
        })
    }
}

/// The two stages of stopping a serving Baton.
#[derive(Debug, Clone, Default)]
pub struct Stop {
    /// Cancelled first: readiness turns NOT_SERVING while every call, new ones too, is still
    /// served (the shutdown delay, while the application beside Baton winds down).
    pub unready: CancellationToken,
    /// Cancelled next: the drain starts (readiness turns NOT_SERVING then if it had not yet).
    pub drain: CancellationToken,
}

impl Stop {
    /// Both stages on one token: cancelling it starts the drain at once.
    pub fn at_once(shutdown: CancellationToken) -> Self {
        Self {
            unready: shutdown.clone(),
            drain: shutdown,
        }
    }
}

/// Serves until `shutdown` is cancelled, then drains: listeners stop accepting, open streams end
/// (releasing what they hold), and in-flight calls get up to `config.drain_timeout` to finish
/// before the server stops hard. The rate limit rules file, if configured, is read first; one
/// that does not validate is an error naming each problem's file, line and column.
pub async fn serve(
    config: ServeConfig,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let rules = match config.ratelimit.rules_path.clone() {
        None => None,
        Some(path) => {
            let loaded = tokio::task::spawn_blocking(move || Rules::load(&path))
                .await
                .context("reading the rate limit rules")?;
            match loaded {
                Ok(rules) => Some(rules),
                Err(problems) => {
                    anyhow::bail!("invalid rate limit rules:\n  {}", problems.join("\n  "))
                }
            }
        }
    };
    serve_with_rules(config, rules, listeners, shutdown).await
}

/// [`serve`] with the rate limit rules already read (by [`Rules::load`], from
/// `config.ratelimit.rules_path`, which is reread when it changes): Envoy's rate limit API is
/// served when `rules` is set.
pub async fn serve_with_rules(
    config: ServeConfig,
    rules: Option<Rules>,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve_until(config, rules, listeners, Stop::at_once(shutdown)).await
}

/// [`serve_with_rules`] stopped in two stages: readiness turns NOT_SERVING when `stop.unready`
/// is cancelled, and the drain starts when `stop.drain` is.
pub async fn serve_until(
    config: ServeConfig,
    rules: Option<Rules>,
    listeners: Listeners,
    stop: Stop,
) -> anyhow::Result<()> {
    let shutdown = stop.drain;
    let settings = config
        .summary()
        .into_iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join(" ");
    tracing::info!(version = env!("CARGO_PKG_VERSION"), config = %settings, "baton starting");
    // Serving-side security: the TLS and token files are read (and then watched) first.
    let serving = Serving::start(&config.serving, shutdown.clone())?;
    warn_of_exposure(&config, &serving);
    let redis = Redis::new(&config.redis)?;
    // A Redis that answers but is too old stops Baton here; one that does not answer yet is
    // checked again on every connection, and readiness says whether it answers.
    match redis.check_server().await {
        Err(unsupported) => return Err(unsupported.into()),
        Ok(Err(e)) => tracing::warn!(error = %e, "redis does not answer yet; serving, not ready"),
        Ok(Ok(())) => {}
    }
    let notifier = Notifier::start(
        redis.pubsub_source(),
        redis.command_timeout(),
        shutdown.child_token(),
    );
    let pings = config.client_keepalive_interval;
    // Clean-ups (releases, waiters' removals), keepalive streams and the drivers of changes of
    // autocomplete features: the drain waits for them.
    let tasks = TaskTracker::new();
    let autocomplete_api = AutocompleteApi::new(Autocomplete::with_shutdown(
        redis.clone(),
        shutdown.clone(),
        tasks.clone(),
    ));
    // One bound on the callers waiting at once, over every leased primitive.
    let waiting = WaitLimit::new(config.serving.max_waiters);
    let locks = Locks::new(
        Lock::new(redis.clone()),
        notifier.clone(),
        tasks.clone(),
        waiting.clone(),
    );
    let lock_api = LockApi::new(locks, shutdown.clone(), pings);
    let elections = Elections::new(
        Election::new(redis.clone(), notifier.clone()),
        notifier.clone(),
        tasks.clone(),
        waiting.clone(),
    );
    let election_api = ElectionApi::new(elections, shutdown.clone(), pings);
    let semaphore_api = SemaphoreApi::new(
        Semaphores::new(
            Semaphore::new(redis.clone()),
            notifier,
            tasks.clone(),
            waiting,
        ),
        shutdown.clone(),
        pings,
    );

    // Rate limit decisions use their own pool, bounded by the (tighter) rate limit timeout.
    let limiter = RateLimiter::connect(&config.redis, &config.ratelimit)?;
    let ratelimit_api = RateLimitApi::new(limiter.clone());
    let envoy_api = rules.map(|rules| {
        tracing::info!(domains = ?rules.domains(), files = ?rules.sources(), "serving Envoy's rate limit API");
        let api = EnvoyRateLimitApi::new(limiter, Arc::new(rules));
        if let Some(path) = config.ratelimit.rules_path.clone() {
            api.reload_every(path, config.ratelimit.reload_interval, shutdown.clone());
        }
        api
    });

    let reporter = HealthReporter::new();
    let health = crate::grpc::health::Health::server(reporter.clone());
    for name in LIVE_NAMES {
        reporter
            .set_service_status(name, ServingStatus::Serving)
            .await;
    }
    for name in READY_NAMES {
        reporter
            .set_service_status(name, ServingStatus::NotServing)
            .await;
    }
    // Its own token, so that the drain can end it too: it then says NOT_SERVING once, if it had
    // not already.
    let unready = stop.unready.child_token();
    let mut readiness = tokio::spawn(readiness(redis, reporter.clone(), unready.clone()));

    // Every method served, for the metrics layer's labels; any other path counts as `unknown`.
    let mut paths = crate::proto::method_paths(FILE_DESCRIPTOR_SET);
    paths.extend(crate::proto::method_paths(
        tonic_health::pb::FILE_DESCRIPTOR_SET,
    ));
    paths.extend(OTHER_METHODS.iter().map(|p| (*p).to_owned()));
    let rpc_metrics = RpcLayer::new(paths.iter().map(String::as_str));

    // Ends the streams of health and reflection once their watchers were told NOT_SERVING.
    let end_streams = CancellationToken::new();
    // Every call until its answer is sent, for the drain.
    let calls = TaskTracker::new();
    let router = || -> anyhow::Result<_> {
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;
        // The largest message each service decodes and encodes (--max-message-size).
        let size = config.serving.max_message_bytes;
        macro_rules! sized {
            ($server:expr) => {
                $server
                    .max_decoding_message_size(size)
                    .max_encoding_message_size(size)
            };
        }
        Ok(Server::builder()
            .http2_keepalive_interval(config.client_keepalive_interval)
            .http2_keepalive_timeout(Some(config.client_keepalive_timeout))
            .max_concurrent_streams(config.serving.max_concurrent_streams)
            // Calls their clients gave up on before Baton took them (a short deadline while Baton
            // was throttled or frozen) arrive as streams opened and reset at once, and a reset
            // frees the client's stream at once: one that gives up on a thousand calls a second
            // sends a thousand a second while Baton cannot run. The HTTP/2 layer's default
            // closes the connection past 20 of them, ending its lease streams without `lost`.
            // Each one waiting costs what an open stream does (its headers, at most
            // MAX_METADATA_BYTES), so the bound is a few times the open streams' bound.
            .http2_max_pending_accept_reset_streams(Some(
                (config.serving.max_concurrent_streams as usize)
                    .saturating_mul(PENDING_RESETS_PER_STREAM),
            ))
            // A call's metadata (its HTTP/2 header list), as advertised to clients: past it the
            // call fails, far past it the connection is closed (docs/security.md, Limits).
            .http2_max_header_list_size(MAX_METADATA_BYTES)
            .layer(TrackCalls::new(calls.clone()))
            .layer(rpc_metrics.clone())
            // Inside the metrics layer, so that a request whose framing is broken is counted as
            // the client's fault (INVALID_ARGUMENT), not as a server error.
            .layer(tower::util::MapResponseLayer::new(
                crate::grpc::wire::broken_request_is_invalid,
            ))
            // Inside the metrics layer, so a call past its deadline is counted with its code.
            .layer(Deadline)
            // Tells each connection's writes how many of its calls are at work.
            .layer(CountCalls)
            // Inside the metrics layer, so refused calls are counted with their code.
            .layer(serving.guard())
            // Their streams have no end of their own: they end when shutdown begins.
            .add_service(EndAtShutdown::new(health.clone(), end_streams.clone()))
            .add_service(EndAtShutdown::new(reflection_v1, end_streams.clone()))
            .add_service(EndAtShutdown::new(reflection_v1alpha, end_streams.clone()))
            .add_service(sized!(AutocompleteServiceServer::new(
                autocomplete_api.clone()
            )))
            .add_service(sized!(ElectionServiceServer::new(election_api.clone())))
            .add_service(sized!(LockServiceServer::new(lock_api.clone())))
            .add_service(sized!(RateLimitServiceServer::new(ratelimit_api.clone())))
            .add_optional_service(
                envoy_api
                    .clone()
                    .map(|api| sized!(EnvoyRateLimitServer::new(api))),
            )
            .add_service(sized!(SemaphoreServiceServer::new(semaphore_api.clone()))))
    };

    let mut servers = JoinSet::new();
    let mut socket_path = None;
    // The traffic of every client connection, for the drain.
    let traffic = Traffic::new();
    let (tcp_traffic, unix_traffic) = (traffic.clone(), traffic.clone());
    if let Some(tcp) = listeners.tcp {
        tracing::info!(addr = %tcp.local_addr()?, tls = serving.tls(), "serving gRPC over TCP");
        let incoming = serving.tcp(tcp, shutdown.clone()).map_ok(move |conn| {
            let refused = conn.refused();
            Watched::refusing(conn, refused, &tcp_traffic)
        });
        let stop = shutdown.clone().cancelled_owned();
        servers.spawn(router()?.serve_with_incoming_shutdown(incoming, stop));
    }
    if let Some((unix, path)) = listeners.unix {
        tracing::info!(path = %path.display(), "serving gRPC over a Unix socket");
        let stop = shutdown.clone().cancelled_owned();
        // grpc C-core and grpc-java clients send the socket path as `:authority`.
        let incoming = serving
            .unix(unix, shutdown.clone())
            .map_ok(move |io| Watched::new(FixAuthority::new(io), &unix_traffic));
        servers.spawn(router()?.serve_with_incoming_shutdown(incoming, stop));
        socket_path = Some(path);
    }
    if servers.is_empty() {
        anyhow::bail!("no listener to serve on");
    }
    if let Some(tcp) = listeners.health {
        tracing::info!(addr = %tcp.local_addr()?, "serving gRPC health alone over TCP");
        let incoming = TcpIncoming::from(tcp).with_nodelay(Some(true));
        let stop = shutdown.clone().cancelled_owned();
        servers.spawn(
            Server::builder()
                .layer(TrackCalls::new(calls.clone()))
                // Counted like the calls of the API's listeners (any other path as `unknown`).
                .layer(rpc_metrics.clone())
                .add_service(EndAtShutdown::new(health.clone(), end_streams.clone()))
                .serve_with_incoming_shutdown(incoming, stop),
        );
    }
    let metrics = listeners.metrics.map(|listener| {
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(addr = %addr, path = metrics::http::PATH, "serving metrics");
        }
        tokio::spawn(metrics::http::serve(listener, shutdown.clone()))
    });

    let result = tokio::select! {
        biased;
        () = shutdown.cancelled() => {
            // Readiness ends by saying NOT_SERVING unless it already had (the shutdown delay), so
            // that a `Watch` sees it once; then liveness follows.
            unready.cancel();
            let _ = (&mut readiness).await;
            for name in LIVE_NAMES {
                reporter.set_service_status(*name, ServingStatus::NotServing).await;
            }
            end_streams.cancel();
            tracing::info!(deadline = ?config.drain_timeout, "shutting down: draining open calls and streams");
            // The calls and streams first, then the releases and clean-ups still being retried
            // (a client that left just before, a Redis slow to answer), all by one deadline.
            let drained = async {
                calls.close();
                let answered = async {
                    calls.wait().await;
                    // An idle deadline, pushed back by any connection's traffic: a client still
                    // reading its last answers (or saying goodbye) keeps its connection.
                    loop {
                        let quiet = traffic.quiet_for();
                        if quiet >= FLUSH_GRACE {
                            break;
                        }
                        tokio::time::sleep(FLUSH_GRACE - quiet).await;
                    }
                };
                let served = tokio::select! {
                    served = first_failure(&mut servers) => Some(served),
                    () = answered => None,
                };
                let served = served.unwrap_or_else(|| {
                    // Every call is answered and its last frames had time to leave: a
                    // connection still open waits only for a client that no longer answers.
                    servers.abort_all();
                    Ok(())
                });
                tasks.close();
                tasks.wait().await;
                served
            };
            match tokio::time::timeout(config.drain_timeout, drained).await {
                Ok(r) => r,
                Err(_) => {
                    servers.abort_all();
                    tracing::warn!(
                        releases_pending = tasks.len(),
                        "drain deadline passed; stopping hard (leases not yet released end at their ttl)"
                    );
                    Ok(())
                }
            }
        }
        r = first_failure(&mut servers) => r.and(Err(anyhow::anyhow!("the gRPC server stopped on its own"))),
    };
    readiness.abort();
    if let Some(metrics) = metrics {
        metrics.abort();
    }
    if let Some(path) = socket_path
        && let Err(e) = std::fs::remove_file(&path)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "could not remove the socket file");
    }
    tracing::info!("stopped");
    result
}

/// Warns of a TCP listener that callers beyond this machine can reach without TLS, and of an
/// API token sent over it in the clear.
fn warn_of_exposure(config: &ServeConfig, serving: &Serving) {
    let Some(addr) = config.listen else { return };
    if serving.tls() || addr.ip().is_loopback() {
        return;
    }
    if config.serving.api_token_file.is_some() {
        tracing::warn!(addr = %addr, "serving gRPC in the clear beyond this machine: API tokens cross the network readable; give --tls-cert and --tls-key");
    } else {
        tracing::warn!(addr = %addr, "serving gRPC in the clear and without an API token beyond this machine: anyone who reaches it can take and release locks");
    }
}

/// Waits until every server has ended, returning the first error.
async fn first_failure(
    servers: &mut JoinSet<Result<(), tonic::transport::Error>>,
) -> anyhow::Result<()> {
    while let Some(joined) = servers.join_next().await {
        joined.context("server task")?.context("gRPC server")?;
    }
    Ok(())
}

/// Keeps readiness in step with Redis: SERVING while Baton can serve ([`Redis::health`], asked
/// every [`READINESS_INTERVAL`]), until `unready` is cancelled, which turns it NOT_SERVING for
/// good. A Cluster with some masters down stays SERVING (the names on the other masters are
/// served) and says which are down in the log.
///
/// Each change is made before it is logged: a log line that cannot be written (a closed stderr)
/// must not keep readiness from following Redis.
async fn readiness(redis: Redis, reporter: HealthReporter, unready: CancellationToken) {
    let mut ticks = tokio::time::interval(READINESS_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<ServingStatus> = None;
    // What the health service says now: NOT_SERVING until Redis first answers. Only a change is
    // reported, so that a `Watch` sees each status once.
    let mut reported = ServingStatus::NotServing;
    let mut last_partial: Option<String> = None;
    let mut last_refused = false;
    loop {
        let health = tokio::select! {
            biased;
            () = unready.cancelled() => break,
            health = async {
                ticks.tick().await;
                redis.health().await
            } => health,
        };
        let status = match health {
            Health::Up | Health::Partial(_) => ServingStatus::Serving,
            Health::Down(_) => ServingStatus::NotServing,
        };
        let changed = last != Some(status);
        let refused = matches!(&health, Health::Down(e) if crate::redis::refuses_credentials(e));
        if status != reported {
            for name in READY_NAMES {
                reporter.set_service_status(name, status).await;
            }
            reported = status;
        }
        last = Some(status);
        match &health {
            // Said again when the cause turns into a refusal: a password to fix, not an outage.
            Health::Down(e) if refused && (changed || !last_refused) => {
                tracing::warn!(error = %e, "redis refuses Baton's credentials (authentication failed); readiness is NOT_SERVING")
            }
            Health::Down(e) if changed => {
                tracing::warn!(error = %e, "redis is not answering; readiness is NOT_SERVING")
            }
            Health::Up if changed || last_partial.is_some() => {
                tracing::info!("redis answers; readiness is SERVING")
            }
            Health::Partial(down) if last_partial.as_ref() != Some(down) => {
                tracing::warn!(
                    down = %down,
                    "part of the cluster cannot serve: calls for the names on its slots fail; readiness is SERVING"
                )
            }
            _ => {}
        }
        last_refused = refused;
        last_partial = match health {
            Health::Partial(down) => Some(down),
            _ => None,
        };
    }
    if reported != ServingStatus::NotServing {
        for name in READY_NAMES {
            reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
    }
    tracing::info!("stopping: readiness is NOT_SERVING");
}
