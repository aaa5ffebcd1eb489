//! Load generator for the Autocomplete service.
//!
//! Starts its own `redis-server` (no persistence) and an in-process Baton on `127.0.0.1:0`, loads
//! a seeded dictionary of realistic names (Latin with diacritics, Cyrillic, Greek, CJK, emoji)
//! through Baton's gRPC `Add`, then measures `Complete` latency with concurrent closed-loop
//! clients for several scenarios, and raw `ZRANGE ... BYLEX` sent straight to the same Redis on
//! the same data in the same run as the baseline. Prints a Markdown report.
//!
//! Baton runs on its own multi-threaded runtime (one worker per core, as `baton serve`), on
//! threads named `baton-*`; the clients run on another runtime, as an application beside the
//! sidecar would. Each scenario reports the CPU time the load generator, Baton and Redis used per
//! request (per-thread `schedstat`, Redis's `INFO cpu`), so the load generator's share of the
//! two cores is measured, not guessed.
//!
//! ```sh
//! cargo bench --bench autocomplete -- --terms 1000000 --clients 16 --seconds 10
//! ```
//!
//! Other flags: `--connections N` (HTTP/2 connections the clients share, default one each),
//! `--client-threads N` (0: one per core, 1: a single-threaded runtime), `--pool N` (Baton's
//! Redis connections, default 4 as `baton serve`), `--loaders N`, `--seed N`, `--no-memory`,
//! `--only 'a|b'` (scenarios whose name contains `a` or `b`). `BATON_BENCH_REDIS_PORT` uses a
//! running Redis instead (flushed first unless `BATON_BENCH_REUSE` is set, which queries the
//! dictionary a previous run left); `BATON_BENCH_VERBOSE` prints Redis's command statistics for
//! the load.
//!
//! `tests/autocomplete.rs` runs it on a tiny dictionary for about a second as a smoke test.

use std::{
    collections::{BTreeMap, HashSet},
    net::TcpListener as StdTcpListener,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use baton::{
    autocomplete::text::query_form,
    config::{RedisConfig, ServeConfig},
    proto::v1::{self as pb, autocomplete_service_client::AutocompleteServiceClient},
    server::{Listeners, serve},
};
use hdrhistogram::Histogram;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Distinct terms in the dictionary.
    pub terms: usize,
    /// Concurrent clients per scenario (closed loops, one request in flight each).
    pub clients: usize,
    /// Connections the clients share (HTTP/2 to Baton; multiplexed to Redis for the baseline).
    pub connections: usize,
    /// Measured time per scenario.
    pub seconds: f64,
    /// Seed of the term generator and of the queries.
    pub seed: u64,
    /// Concurrent `Add` calls while loading.
    pub loaders: usize,
    /// Terms per `Add` call.
    pub batch: usize,
    /// Also measure memory per index (walks every key with `MEMORY USAGE`).
    pub memory: bool,
    /// Worker threads of the load generator's runtime: 0 for one per core (tokio's default, as
    /// an application would have), 1 for a single-threaded runtime.
    pub client_threads: usize,
    /// Baton's Redis connections (`--redis-pool-size`; 4 is Baton's default).
    pub pool: u32,
    /// Run only the scenarios whose name contains one of these (all when empty; `--only` takes
    /// them separated by `|`).
    pub only: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            terms: 1_000_000,
            clients: 16,
            connections: 16,
            seconds: 10.0,
            seed: 42,
            loaders: 4,
            batch: 1000,
            memory: true,
            client_threads: 0,
            pool: 4,
            only: Vec::new(),
        }
    }
}

/// Latency figures of one scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// What was measured.
    pub name: String,
    /// Requests completed.
    pub requests: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Results returned, over all requests.
    pub results: u64,
    /// Requests per second.
    pub rate: f64,
    /// Percentiles in microseconds: p50, p90, p99, p99.9, max.
    pub micros: [u64; 5],
    /// Redis time per request in the scripts or commands it ran, in microseconds (from
    /// `INFO commandstats`).
    pub redis_micros: f64,
    /// CPU time used while measuring (load generator, Baton, Redis).
    pub cpu: CpuTime,
}

/// Everything measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Terms loaded.
    pub terms: u64,
    /// Time to load them through `Add`.
    pub load: Duration,
    /// Redis time spent in the `Add` scripts.
    pub load_redis: Duration,
    /// CPU time used while loading.
    pub load_cpu: CpuTime,
    /// Redis `used_memory` growth while loading, in bytes.
    pub memory: u64,
    /// Bytes per index (key kind), when measured.
    pub indexes: BTreeMap<String, (u64, u64)>,
    /// The scenarios.
    pub scenarios: Vec<Scenario>,
}

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it, and
    // the suite's smoke test (tests/autocomplete.rs) already covers it, so it stops there.
    if !std::env::args().any(|a| a == "--bench") {
        println!("autocomplete load generator: run it with `cargo bench --bench autocomplete`");
        return Ok(());
    }
    let mut options = Options::default();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().context("a value after the flag");
        match arg.as_str() {
            "--terms" => options.terms = value()?.parse()?,
            "--clients" => options.clients = value()?.parse()?,
            "--connections" => options.connections = value()?.parse()?,
            "--seconds" => options.seconds = value()?.parse()?,
            "--seed" => options.seed = value()?.parse()?,
            "--loaders" => options.loaders = value()?.parse()?,
            "--no-memory" => options.memory = false,
            "--client-threads" => options.client_threads = value()?.parse()?,
            "--pool" => options.pool = value()?.parse()?,
            "--only" => options.only = value()?.split('|').map(str::to_owned).collect(),
            // cargo bench passes --bench to every bench target.
            "--bench" => {}
            other => bail!("unknown argument {other:?}"),
        }
    }
    // The load generator's own runtime; Baton gets another (BatonThread).
    let runtime = match options.client_threads {
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?,
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if n > 0 {
                builder.worker_threads(n);
            }
            builder.enable_all().build()?
        }
    };
    let report = runtime.block_on(run(&options))?;
    println!("{}", markdown(&options, &report));
    Ok(())
}

/// Starts Redis and Baton, loads the dictionary and runs every scenario.
pub async fn run(options: &Options) -> anyhow::Result<Report> {
    let redis = match std::env::var("BATON_BENCH_REDIS_PORT") {
        // An already running Redis (for looking at the data afterwards); flushed first.
        Ok(port) => {
            let flush = std::env::var_os("BATON_BENCH_REUSE").is_none();
            RedisProcess::existing(port.parse()?, flush).await?
        }
        Err(_) => RedisProcess::start()?,
    };
    let prefix = "bench:";
    let mut config = RedisConfig::new(redis.url());
    config.key_prefix = prefix.to_owned();
    config.pool_size = options.pool;
    config.command_timeout = Duration::from_secs(5);
    let mut serve_config = ServeConfig::new(config);
    serve_config.listen = Some("127.0.0.1:0".parse()?);
    let shutdown = CancellationToken::new();
    let _stop = shutdown.clone().drop_guard();
    let (addr, server) = BatonThread::start(serve_config, shutdown.clone()).await?;
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?;
    let connect = || async {
        for _ in 0..200 {
            if let Ok(c) = endpoint.connect().await {
                return Ok(c);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        bail!("Baton did not accept connections")
    };

    let client = redis::Client::open(redis.url())?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let before = used_memory(&mut conn).await?;

    // Load.
    let dictionary = "names";
    let terms = Arc::new(generate(options.terms, options.seed));
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(&mut conn)
        .await?;
    let cpu_before = CpuSnapshot::take(&mut conn).await?;
    let started = Instant::now();
    let mut loaders = JoinSet::new();
    // BATON_BENCH_REUSE (with BATON_BENCH_REDIS_PORT): query the dictionary a previous run left.
    let reuse = std::env::var_os("BATON_BENCH_REUSE").is_some();
    for l in 0..if reuse { 0 } else { options.loaders } {
        let mut api = AutocompleteServiceClient::new(connect().await?);
        let terms = Arc::clone(&terms);
        let (batch, loaders_n) = (options.batch, options.loaders);
        loaders.spawn(async move {
            let mut at = l * batch;
            while at < terms.len() {
                let chunk = &terms[at..(at + batch).min(terms.len())];
                api.add(pb::AutocompleteServiceAddRequest {
                    dictionary: dictionary.to_owned(),
                    terms: chunk
                        .iter()
                        .map(|t| pb::AutocompleteTerm {
                            display: t.display.clone(),
                            score: Some(t.score),
                            increment: false,
                            payload: t.payload.clone(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .await
                .context("Add")?;
                at += batch * loaders_n;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = loaders.join_next().await {
        done??;
    }
    let load = started.elapsed();
    let load_cpu = CpuSnapshot::take(&mut conn).await?.since(&cpu_before);
    let load_redis = Duration::from_secs_f64(redis_usec(&mut conn).await? / 1e6);
    if std::env::var_os("BATON_BENCH_VERBOSE").is_some() {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        eprintln!("commands while loading:\n{info}");
    }
    let mut api = AutocompleteServiceClient::new(connect().await?);
    let count = api
        .describe(pb::AutocompleteServiceDescribeRequest {
            dictionary: dictionary.to_owned(),
        })
        .await?
        .into_inner()
        .term_count;
    if count != terms.len() as u64 {
        bail!("loaded {count} terms, expected {}", terms.len());
    }
    let memory = used_memory(&mut conn).await?.saturating_sub(before);

    // Queries, seeded.
    let mut rng = Rng(options.seed ^ 0x5eed);
    let prefixes: Vec<String> = (0..20_000)
        .map(|_| {
            let t = &terms[rng.below(terms.len())].display;
            let n = 1 + rng.below(5);
            t.chars().take(n).collect()
        })
        .collect();
    let substrings: Vec<String> = (0..20_000)
        .map(|_| {
            let chars: Vec<char> = terms[rng.below(terms.len())].display.chars().collect();
            let n = (3 + rng.below(3)).min(chars.len());
            let start = rng.below(chars.len() - n + 1);
            chars[start..start + n].iter().collect()
        })
        .collect();
    let words: Vec<String> = (0..20_000)
        .map(|_| {
            let t = &terms[rng.below(terms.len())].display;
            let word = t.split(' ').nth(1).unwrap_or(t);
            word.chars().take(2 + rng.below(3)).collect()
        })
        .collect();

    let seconds = Duration::from_secs_f64(options.seconds);
    let mut scenarios = Vec::new();
    use pb::{AutocompleteMatchMode as M, AutocompleteOrder as O};
    let complete = |name: &str, queries: &Vec<String>, mode: M, order: O| {
        let queries = Arc::new(queries.clone());
        let name = name.to_owned();
        let connect = &connect;
        let url = redis.url();
        async move {
            let mut channels = Vec::new();
            for _ in 0..options.connections.clamp(1, options.clients) {
                channels.push(connect().await?);
            }
            measure(url.clone(), name, options.clients, seconds, move |i, n| {
                let mut api = AutocompleteServiceClient::new(channels[i % channels.len()].clone());
                let queries = Arc::clone(&queries);
                async move {
                    let query = queries[n % queries.len()].clone();
                    let page = api
                        .complete(pb::AutocompleteServiceCompleteRequest {
                            dictionary: dictionary.to_owned(),
                            query,
                            limit: 10,
                            mode: mode as i32,
                            order: order as i32,
                            page_token: String::new(),
                        })
                        .await?
                        .into_inner();
                    anyhow::Ok(page.suggestions.len() as u64)
                }
            })
            .await
        }
    };
    let wanted = |name: &str| {
        options.only.is_empty() || options.only.iter().any(|o| name.contains(o.as_str()))
    };
    let completions = [
        (
            "Complete: prefix of 1-5 characters, lexicographic",
            &prefixes,
            M::Prefix,
            O::Lexicographic,
        ),
        (
            "Complete: prefix of 1-5 characters, by score",
            &prefixes,
            M::Prefix,
            O::Score,
        ),
        (
            "Complete: automatic, 1-5 characters, lexicographic",
            &prefixes,
            M::Automatic,
            O::Lexicographic,
        ),
        (
            "Complete: word prefix of 2-4 characters, lexicographic",
            &words,
            M::WordPrefix,
            O::Lexicographic,
        ),
        (
            "Complete: contains 3-5 characters, lexicographic",
            &substrings,
            M::Contains,
            O::Lexicographic,
        ),
        (
            "Complete: contains 3-5 characters, by score",
            &substrings,
            M::Contains,
            O::Score,
        ),
    ];
    for (i, (name, queries, mode, order)) in completions.into_iter().enumerate() {
        if wanted(name) {
            scenarios.push(complete(name, queries, mode, order).await?);
        }
        if i > 0 {
            continue;
        }
        // After the first: the floor of any call through Baton on this machine (a gRPC health
        // check, no Redis), and raw ZRANGE on Redis (the floor of prefix completion).
        let health = "gRPC health check through Baton (no Redis): the floor of any call";
        if wanted(health) {
            let mut channels = Vec::new();
            for _ in 0..options.connections.clamp(1, options.clients) {
                channels.push(connect().await?);
            }
            scenarios.push(
                measure(
                    redis.url(),
                    health.to_owned(),
                    options.clients,
                    seconds,
                    move |i, _| {
                        let mut health = HealthClient::new(channels[i % channels.len()].clone());
                        async move {
                            health
                                .check(HealthCheckRequest {
                                    service: "liveness".to_owned(),
                                })
                                .await?;
                            anyhow::Ok(0)
                        }
                    },
                )
                .await?,
            );
        }
        if wanted(RAW_ZRANGE) {
            scenarios.push(
                raw_zrange(
                    &redis,
                    &format!("{prefix}{{ac:{dictionary}}}"),
                    &prefixes,
                    options,
                    seconds,
                )
                .await?,
            );
        }
    }

    let indexes = if options.memory {
        index_memory(&mut conn, &format!("{prefix}{{ac:{dictionary}}}")).await?
    } else {
        BTreeMap::new()
    };
    shutdown.cancel();
    server.stop().await?;
    Ok(Report {
        terms: count,
        load,
        load_redis,
        load_cpu,
        memory,
        indexes,
        scenarios,
    })
}

/// The name of the raw `ZRANGE` scenario.
const RAW_ZRANGE: &str =
    "Raw ZRANGE ... BYLEX LIMIT 0 10 on the same Redis, prefix of 1-5 characters";

/// Raw `ZRANGE lex [p (p\xff BYLEX LIMIT 0 10` on the same Redis: the floor Baton builds on.
async fn raw_zrange(
    redis: &RedisProcess,
    base: &str,
    prefixes: &[String],
    options: &Options,
    seconds: Duration,
) -> anyhow::Result<Scenario> {
    // Each prefix with the lex set it is in (that of its first byte), as Baton reads it.
    let forms: Arc<Vec<(String, String)>> = Arc::new(
        prefixes
            .iter()
            .map(|p| {
                let form = query_form(p);
                let lex = format!("{base}:l:{:02x}", form.as_bytes()[0]);
                (form, lex)
            })
            .collect(),
    );
    let client = redis::Client::open(redis.url())?;
    let mut conns = Vec::new();
    for _ in 0..options.connections.clamp(1, options.clients) {
        conns.push(client.get_multiplexed_async_connection().await?);
    }
    measure(
        redis.url(),
        RAW_ZRANGE.to_owned(),
        options.clients,
        seconds,
        move |i, n| {
            let mut conn = conns[i % conns.len()].clone();
            let (form, lex) = forms[n % forms.len()].clone();
            async move {
                let mut hi = form.clone().into_bytes();
                hi.push(0xff);
                let mut lo = b"[".to_vec();
                lo.extend_from_slice(form.as_bytes());
                let mut hi_arg = b"(".to_vec();
                hi_arg.extend_from_slice(&hi);
                let rows: Vec<Vec<u8>> = redis::cmd("ZRANGE")
                    .arg(&lex)
                    .arg(lo)
                    .arg(hi_arg)
                    .arg("BYLEX")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(10)
                    .query_async(&mut conn)
                    .await?;
                anyhow::Ok(rows.len() as u64)
            }
        },
    )
    .await
}

/// Runs `clients` closed loops of `call(client index, request number)` for `seconds`, after a
/// short warm-up, and reports the latency distribution.
async fn measure<F, Fut>(
    redis_url: String,
    name: String,
    clients: usize,
    seconds: Duration,
    call: F,
) -> anyhow::Result<Scenario>
where
    F: Fn(usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = anyhow::Result<u64>> + Send,
{
    let call = Arc::new(call);
    let stats = redis::Client::open(redis_url)?;
    let mut stats = stats.get_multiplexed_async_connection().await?;
    let warmup = Duration::from_millis((seconds.as_millis() / 10).min(1000) as u64);
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + seconds;
    let mut tasks = JoinSet::new();
    let reset = tokio::spawn({
        let mut stats = stats.clone();
        async move {
            tokio::time::sleep_until(measure_from.into()).await;
            redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async::<()>(&mut stats)
                .await?;
            CpuSnapshot::take(&mut stats).await
        }
    });
    for i in 0..clients {
        let call = Arc::clone(&call);
        tasks.spawn(async move {
            let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let (mut errors, mut results) = (0u64, 0u64);
            let mut n = i * 7919;
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let outcome = call(i, n).await;
                n += 1;
                if sent < measure_from {
                    continue;
                }
                let micros = sent.elapsed().as_micros() as u64;
                match outcome {
                    Ok(r) => {
                        histogram.record(micros.max(1))?;
                        results += r;
                    }
                    Err(_) => errors += 1,
                }
            }
            anyhow::Ok((histogram, errors, results))
        });
    }
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let (mut errors, mut results) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let (h, e, r) = done??;
        all.add(h)?;
        errors += e;
        results += r;
    }
    let cpu_from = reset.await??;
    let cpu = CpuSnapshot::take(&mut stats).await?.since(&cpu_from);
    let redis_usec = redis_usec(&mut stats).await?;
    let requests = all.len();
    Ok(Scenario {
        redis_micros: redis_usec / requests.max(1) as f64,
        cpu,
        name,
        requests,
        errors,
        results,
        rate: requests as f64 / seconds.as_secs_f64(),
        micros: [
            all.value_at_quantile(0.5),
            all.value_at_quantile(0.9),
            all.value_at_quantile(0.99),
            all.value_at_quantile(0.999),
            all.max(),
        ],
    })
}

/// Time Redis spent executing commands since the last `CONFIG RESETSTAT`, in microseconds: the
/// scripts (`EVALSHA`, which includes the commands they call) when there are any, else every
/// command (the raw baseline's `ZRANGE`), never `INFO` itself.
async fn redis_usec(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    // cmdstat_evalsha:calls=1,usec=2,usec_per_call=2.00,...
    let usec =
        |l: &str| -> Option<f64> { l.split("usec=").nth(1)?.split(',').next()?.parse().ok() };
    let scripts: f64 = info
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(usec)
        .sum();
    if scripts > 0.0 {
        return Ok(scripts);
    }
    Ok(info
        .lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(usec)
        .sum())
}

async fn used_memory(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<u64> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("used_memory in INFO")
}

/// Bytes and keys per kind of key (lex sets, data, ranked sets, word and gram postings, ...).
async fn index_memory(
    conn: &mut redis::aio::MultiplexedConnection,
    base: &str,
) -> anyhow::Result<BTreeMap<String, (u64, u64)>> {
    let mut totals = BTreeMap::new();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{}*", base.replace('{', "\\{").replace('}', "\\}")))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        for key in keys {
            let bytes: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .arg("SAMPLES")
                .arg(0)
                .query_async(conn)
                .await?;
            let rest = &key[base.len()..];
            let kind = match rest {
                b":data" => "data: score, display text, payload",
                b":h" => "h: which lex and ranked sets exist",
                b":top" => "top: the best-ranked terms",
                b":v" => "v: the vocabulary (every word)",
                _ if rest.starts_with(b":l:") => {
                    "l:*: every term, in lexicographic order, by first byte"
                }
                _ if rest.starts_with(b":b:") => "b:*: ranked sets of first bytes",
                _ if rest.starts_with(b":t:") => {
                    "t:*: deep sets (best terms of 3-character prefixes)"
                }
                _ if rest.starts_with(b":r:") => {
                    "r:*: ranked sets of short prefixes with many terms"
                }
                _ if rest.starts_with(b":w:") => "w:*: terms of each word",
                _ if rest.starts_with(b":vg:") => "vg:*: vocabulary words of each gram",
                _ => "other",
            };
            let entry = totals.entry(kind.to_owned()).or_insert((0, 0));
            entry.0 += bytes.unwrap_or(0);
            entry.1 += 1;
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    Ok(totals)
}

/// The report as Markdown.
pub fn markdown(options: &Options, report: &Report) -> String {
    let mut out = String::new();
    let per_term = |b: u64| b as f64 / report.terms.max(1) as f64;
    out.push_str(&format!(
        "Loaded {} terms through `Add` ({} per call, {} concurrent calls) in {:.1} s ({:.0} terms/s, Redis busy {:.1} s); Redis used_memory grew by {:.0} MiB ({:.0} bytes per term).\n\n",
        report.terms,
        options.batch,
        options.loaders,
        report.load.as_secs_f64(),
        report.terms as f64 / report.load.as_secs_f64(),
        report.load_redis.as_secs_f64(),
        report.memory as f64 / (1 << 20) as f64,
        per_term(report.memory),
    ));
    let c = &report.load_cpu;
    out.push_str(&format!(
        "CPU while loading: Redis {:.1} s, Baton {:.1} s, load generator {:.1} s.\n\n",
        c.redis as f64 / 1e9,
        c.baton as f64 / 1e9,
        c.load_generator as f64 / 1e9,
    ));
    if !report.indexes.is_empty() {
        out.push_str("| index | keys | MiB | bytes per term |\n|---|---:|---:|---:|\n");
        for (kind, (bytes, keys)) in &report.indexes {
            out.push_str(&format!(
                "| {kind} | {keys} | {:.1} | {:.0} |\n",
                *bytes as f64 / (1 << 20) as f64,
                per_term(*bytes)
            ));
        }
        out.push('\n');
    }
    out.push_str(&format!(
        "{} concurrent clients over {} connections, load generator on {}, Baton on its own runtime with {} Redis connections, {:.0} s per scenario, limit 10. CPU µs/request: CPU time of each side while measuring, per request.\n\n",
        options.clients,
        options.connections.clamp(1, options.clients),
        match options.client_threads {
            0 => "one thread per core".to_owned(),
            n => format!("{n} thread(s)"),
        },
        options.pool,
        options.seconds
    ));
    out.push_str("| scenario | requests/s | p50 µs | p90 µs | p99 µs | p99.9 µs | max µs | results/request | errors | Redis µs/request (commands) | CPU µs/request: load generator | Baton | Redis |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for s in &report.scenarios {
        let per = |ns: u64| ns as f64 / 1e3 / s.requests.max(1) as f64;
        out.push_str(&format!(
            "| {} | {:.0} | {} | {} | {} | {} | {} | {:.1} | {} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            s.name,
            s.rate,
            s.micros[0],
            s.micros[1],
            s.micros[2],
            s.micros[3],
            s.micros[4],
            s.results as f64 / s.requests.max(1) as f64,
            s.errors,
            s.redis_micros,
            per(s.cpu.load_generator),
            per(s.cpu.baton),
            per(s.cpu.redis),
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Baton
// ---------------------------------------------------------------------------------------------

/// Prefix of the names of the threads Baton runs on, which tells its CPU time from the load
/// generator's.
const BATON_THREADS: &str = "baton";

/// Baton serving on its own multi-threaded runtime (one worker per core, as `baton serve`), on
/// threads named `baton-*`, apart from the load generator's.
struct BatonThread {
    done: tokio::sync::oneshot::Receiver<anyhow::Result<()>>,
}

impl BatonThread {
    /// Binds `config.listen` and serves until `shutdown`; returns the bound address.
    async fn start(
        config: ServeConfig,
        shutdown: CancellationToken,
    ) -> anyhow::Result<(std::net::SocketAddr, Self)> {
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel();
        let (done_tx, done) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name(format!("{BATON_THREADS}-main"))
            .spawn(move || {
                let served = (|| {
                    let runtime = tokio::runtime::Builder::new_multi_thread()
                        .enable_all()
                        .thread_name(format!("{BATON_THREADS}-worker"))
                        .build()?;
                    runtime.block_on(async {
                        let listeners = Listeners::bind(&config).await;
                        let listeners = match listeners {
                            Ok(l) => l,
                            Err(e) => {
                                let _ = bound_tx.send(Err(anyhow::anyhow!("{e:#}")));
                                return Ok(());
                            }
                        };
                        let addr = listeners
                            .tcp
                            .as_ref()
                            .context("a TCP listener")?
                            .local_addr()?;
                        let _ = bound_tx.send(Ok(addr));
                        serve(config, listeners, shutdown).await
                    })
                })();
                let _ = done_tx.send(served);
            })?;
        let addr = bound_rx.await.context("Baton's thread ended")??;
        Ok((addr, Self { done }))
    }

    /// Waits for Baton to finish serving (after its shutdown token is cancelled).
    async fn stop(self) -> anyhow::Result<()> {
        self.done.await.context("Baton's thread ended")?
    }
}

// ---------------------------------------------------------------------------------------------
// CPU time
// ---------------------------------------------------------------------------------------------

/// CPU time used so far, in nanoseconds, by this process's threads (by thread id, from
/// `/proc/self/task/*/schedstat`) and by Redis (`INFO cpu`).
#[derive(Debug, Clone, Default)]
struct CpuSnapshot {
    threads: BTreeMap<u32, (bool, u64)>,
    redis: u64,
}

/// CPU time between two snapshots, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTime {
    /// The load generator: every thread of the process but Baton's.
    pub load_generator: u64,
    /// Baton's threads.
    pub baton: u64,
    /// Redis (all its threads).
    pub redis: u64,
}

impl CpuSnapshot {
    async fn take(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<Self> {
        let mut threads = BTreeMap::new();
        for entry in std::fs::read_dir("/proc/self/task")? {
            let dir = entry?.path();
            let Some(tid) = dir.file_name().and_then(|n| n.to_str()?.parse().ok()) else {
                continue;
            };
            // A thread may end while we look: skip it.
            let (Ok(comm), Ok(stat)) = (
                std::fs::read_to_string(dir.join("comm")),
                std::fs::read_to_string(dir.join("schedstat")),
            ) else {
                continue;
            };
            let ns = stat.split_whitespace().next().and_then(|v| v.parse().ok());
            if let Some(ns) = ns {
                threads.insert(tid, (comm.starts_with(BATON_THREADS), ns));
            }
        }
        let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
        let seconds = |name: &str| -> f64 {
            info.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0)
        };
        let redis = ((seconds("used_cpu_sys:") + seconds("used_cpu_user:")) * 1e9) as u64;
        Ok(Self { threads, redis })
    }

    /// The CPU time used since `earlier` (threads that ended in between are not counted).
    fn since(&self, earlier: &Self) -> CpuTime {
        let mut cpu = CpuTime {
            redis: self.redis.saturating_sub(earlier.redis),
            ..CpuTime::default()
        };
        for (tid, (baton, ns)) in &self.threads {
            let before = earlier.threads.get(tid).map_or(0, |t| t.1);
            let used = ns.saturating_sub(before);
            if *baton {
                cpu.baton += used;
            } else {
                cpu.load_generator += used;
            }
        }
        cpu
    }
}

// ---------------------------------------------------------------------------------------------
// redis-server
// ---------------------------------------------------------------------------------------------

/// A private `redis-server` without persistence, killed on drop.
struct RedisProcess {
    child: Option<Child>,
    port: u16,
    _dir: Option<tempfile::TempDir>,
}

impl RedisProcess {
    /// Starts `redis-server` on a free port; a port taken between picking and binding (another
    /// process's server answers there) is retried on another one.
    fn start() -> anyhow::Result<Self> {
        let mut failures = Vec::new();
        for _ in 0..5 {
            match Self::start_on_free_port() {
                Ok(process) => return Ok(process),
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
        bail!("redis-server did not start: {}", failures.join("; "))
    }

    fn start_on_free_port() -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("baton-bench-").tempdir()?;
        let port = StdTcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(dir.path().join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning redis-server")?;
        let mut process = Self {
            child: Some(child),
            port,
            _dir: Some(dir),
        };
        let client = redis::Client::open(process.url())?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(child) = process.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!("redis-server on port {port} exited with {status}");
            }
            // The server answering must be this child, not one that took the port first.
            let info = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut conn| redis::cmd("INFO").arg("server").query::<String>(&mut conn));
            if let Ok(info) = info {
                let pid = info
                    .lines()
                    .find_map(|l| l.strip_prefix("process_id:"))
                    .and_then(|p| p.trim().parse::<u32>().ok());
                let own = process.child.as_ref().map(Child::id);
                if pid == own {
                    return Ok(process);
                }
                bail!("port {port} is served by another redis-server (pid {pid:?})");
            }
            if Instant::now() > deadline {
                bail!("redis-server did not start on port {port}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    async fn existing(port: u16, flush: bool) -> anyhow::Result<Self> {
        let process = Self {
            child: None,
            port,
            _dir: None,
        };
        let client = redis::Client::open(process.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        if flush {
            redis::cmd("FLUSHALL")
                .arg("ASYNC")
                .query_async::<()>(&mut conn)
                .await?;
        }
        Ok(process)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Seeded terms
// ---------------------------------------------------------------------------------------------

/// One generated term.
#[derive(Debug, Clone)]
pub struct GeneratedTerm {
    /// Its display text.
    pub display: String,
    /// Its score (popularity).
    pub score: f64,
    /// Its payload, for half of them.
    pub payload: Option<Vec<u8>>,
}

/// SplitMix64: small, seeded, reproducible everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, list: &[&'a str]) -> &'a str {
        list[self.below(list.len())]
    }
}

const FIRST: &[&str] = &[
    "Anna",
    "Aaron",
    "Adam",
    "Adèle",
    "Agnieszka",
    "Ahmed",
    "Aiko",
    "Alba",
    "Alejandro",
    "Aleksandr",
    "Alice",
    "Amélie",
    "Ana",
    "Andrés",
    "Andrzej",
    "Ángel",
    "Anja",
    "Antoine",
    "Antonio",
    "Arjun",
    "Ayşe",
    "Beatriz",
    "Benjamin",
    "Björn",
    "Bob",
    "Bruno",
    "Camille",
    "Carlos",
    "Chen",
    "Chloé",
    "Clara",
    "Cristina",
    "Daniel",
    "Dávid",
    "Diego",
    "Dmitri",
    "Élodie",
    "Elena",
    "Eliška",
    "Emma",
    "Emre",
    "Érica",
    "Eva",
    "Fatima",
    "Felix",
    "Fernando",
    "François",
    "Frida",
    "Gabriel",
    "Giulia",
    "Grégoire",
    "Hana",
    "Hannah",
    "Héctor",
    "Helga",
    "Hiroshi",
    "Ingrid",
    "Isabel",
    "Ivan",
    "Jakub",
    "James",
    "Jan",
    "Javier",
    "Jean",
    "Jörg",
    "José",
    "Juan",
    "Julia",
    "Jürgen",
    "Karin",
    "Kenji",
    "Laura",
    "Léa",
    "Lena",
    "Liam",
    "Lucía",
    "Łukasz",
    "Magnus",
    "Małgorzata",
    "María",
    "Marco",
    "Margrét",
    "Mateo",
    "Mehmet",
    "Mia",
    "Miguel",
    "Mikko",
    "Noah",
    "Noémie",
    "Olga",
    "Oliver",
    "Óscar",
    "Paula",
    "Pedro",
    "Pierre",
    "Priya",
    "Rafael",
    "Ramón",
    "Renée",
    "Rocío",
    "Rui",
    "Sakura",
    "Sara",
    "Sebastián",
    "Siobhán",
    "Sofía",
    "Søren",
    "Stefan",
    "Sven",
    "Tomás",
    "Umut",
    "Valentina",
    "Víctor",
    "Wei",
    "Yuki",
    "Zoë",
    "Žofia",
    "Иван",
    "Ольга",
    "Дмитрий",
    "Наталья",
    "Сергей",
    "Анна",
    "Γιώργος",
    "Μαρία",
    "Νίκος",
    "Ελένη",
    "Δημήτρης",
    "Σοφία",
];

const LAST: &[&str] = &[
    "Smith",
    "Johnson",
    "Müller",
    "Schmidt",
    "García",
    "Martínez",
    "López",
    "González",
    "Rodríguez",
    "Fernández",
    "Pérez",
    "Sánchez",
    "Dubois",
    "Lefèvre",
    "Moreau",
    "Rossi",
    "Bianchi",
    "Ferrari",
    "Nowak",
    "Kowalski",
    "Wiśniewski",
    "Novák",
    "Dvořák",
    "Svoboda",
    "Jensen",
    "Nielsen",
    "Hansen",
    "Andersson",
    "Johansson",
    "Ólafsdóttir",
    "Jónsson",
    "Kovačević",
    "Horváth",
    "Nagy",
    "Yılmaz",
    "Kaya",
    "Öztürk",
    "Sato",
    "Suzuki",
    "Takahashi",
    "Tanaka",
    "Kim",
    "Lee",
    "Park",
    "Nguyễn",
    "Trần",
    "Patel",
    "Sharma",
    "Singh",
    "O'Brien",
    "O'Connor",
    "MacDonald",
    "Fitzgerald",
    "Brown",
    "Taylor",
    "Wilson",
    "Anderson",
    "Thomas",
    "Moore",
    "Martin",
    "Jackson",
    "Thompson",
    "White",
    "Harris",
    "Clark",
    "Lewis",
    "Robinson",
    "Walker",
    "Young",
    "Allen",
    "King",
    "Wright",
    "Scott",
    "Hill",
    "Green",
    "Adams",
    "Baker",
    "Nelson",
    "Carter",
    "Mitchell",
    "Roberts",
    "Turner",
    "Phillips",
    "Campbell",
    "Parker",
    "Evans",
    "Edwards",
    "Collins",
    "Stewart",
    "Morris",
    "Rogers",
    "Reed",
    "Cook",
    "Morgan",
    "Bell",
    "Murphy",
    "Bailey",
    "Cooper",
    "Richardson",
    "Cox",
    "Howard",
    "Ward",
    "Torres",
    "Peterson",
    "Gray",
    "Ramírez",
    "James",
    "Watson",
    "Brooks",
    "Kelly",
    "Sanders",
    "Price",
    "Bennett",
    "Wood",
    "Barnes",
    "Ross",
    "Henderson",
    "Coleman",
    "Jenkins",
    "Straße",
    "Weiß",
    "Groß",
    "Иванов",
    "Петрова",
    "Смирнов",
    "Кузнецова",
    "Παπαδόπουλος",
    "Οικονόμου",
    "Γεωργίου",
    "Καραγιάννης",
];

const CJK_SURNAMES: &[&str] = &[
    "王", "李", "张", "刘", "陈", "杨", "黄", "赵", "吴", "周", "徐", "孙", "马", "朱", "胡", "郭",
    "何", "高", "林", "罗", "佐藤", "鈴木", "高橋", "田中", "渡辺", "김", "이", "박", "최", "정",
];
const CJK_GIVEN: &[&str] = &[
    "伟", "芳", "娜", "敏", "静", "丽", "强", "磊", "军", "洋", "勇", "艳", "杰", "娟", "涛", "明",
    "超", "秀", "霞", "平", "刚", "桂", "英", "华", "玉", "萍", "红", "鹏", "辉", "琳", "𠮷", "𡈽",
    "太郎", "花子", "翔", "陽菜", "민준", "서연", "지호", "하은",
];

const BRANDS: &[&str] = &[
    "Acme",
    "Globex",
    "Initech",
    "Umbrella",
    "Stark",
    "Wayne",
    "Hooli",
    "Vandelay",
    "Soylent",
    "Zürich",
    "Ñandú",
    "Kōbō",
    "Škoda",
    "Łódź",
    "Café Noir",
    "Crème",
    "Smörgås",
    "Fjällräven",
];
const PRODUCTS: &[&str] = &[
    "Blender",
    "Toaster",
    "Kettle",
    "Headphones",
    "Speaker",
    "Guitar",
    "Backpack",
    "Sneakers",
    "Espresso Machine",
    "Desk Lamp",
    "Office Chair",
    "Monitor",
    "Keyboard",
    "Mouse",
    "Router",
    "Camera",
    "Tripod",
    "Drone",
    "Scooter",
    "Bicycle",
    "Tent",
    "Sleeping Bag",
    "Jacket",
];
const EMOJI: &[&str] = &[
    "🎸", "🚲", "☕", "🎧", "📷", "⛺", "🍕", "🚀", "🌍", "❤️", "👍", "🐈",
];

/// `n` distinct terms, the same for the same seed: people (Latin with diacritics, Cyrillic,
/// Greek), CJK names, and product names, some with emoji.
pub fn generate(n: usize, seed: u64) -> Vec<GeneratedTerm> {
    let mut rng = Rng(seed);
    let mut seen = HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let roll = rng.below(100);
        let display = if roll < 70 {
            let mut s = rng.pick(FIRST).to_owned();
            if rng.below(100) < 40 {
                s.push(' ');
                s.push(char::from(b'A' + rng.below(26) as u8));
                s.push('.');
            }
            s.push(' ');
            s.push_str(rng.pick(LAST));
            if rng.below(100) < 35 {
                s.push(if rng.below(2) == 0 { ' ' } else { '-' });
                s.push_str(rng.pick(LAST));
            }
            s
        } else if roll < 82 {
            let mut s = rng.pick(CJK_SURNAMES).to_owned();
            s.push_str(rng.pick(CJK_GIVEN));
            if rng.below(2) == 0 {
                s.push_str(rng.pick(CJK_GIVEN));
            }
            if rng.below(100) < 30 {
                s.push_str(&format!(" {}", rng.below(1000)));
            }
            s
        } else {
            let mut s = String::new();
            if rng.below(100) < 25 {
                s.push_str(rng.pick(EMOJI));
                s.push(' ');
            }
            s.push_str(rng.pick(BRANDS));
            s.push(' ');
            s.push_str(rng.pick(PRODUCTS));
            s.push_str(&format!(
                " {}{}",
                char::from(b'A' + rng.below(26) as u8),
                rng.below(10_000)
            ));
            s
        };
        if seen.insert(display.clone()) {
            let score = (rng.below(1_000_000) as f64).powf(0.5).floor();
            let payload = (rng.below(2) == 0).then(|| format!("id:{}", out.len()).into_bytes());
            out.push(GeneratedTerm {
                display,
                score,
                payload,
            });
        }
    }
    out
}
