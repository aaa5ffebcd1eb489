//! Small gRPC clients of a running Baton for the command line: `baton health` asks the health
//! service (a probe for scripts and the Helm chart's test hook) and `baton hold` takes a lock in
//! turns with its peers and says so (the Helm chart's demo application).
//!
//! Both find Baton at `--addr` or `BATON_ADDR`, the variable the chart gives application
//! containers: `unix:///path/to/baton.sock` or `HOST:PORT`.

use std::{io::Write as _, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::Args;
use tokio::{net::UnixStream, time::Instant};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::proto::v1::{
    LockServiceHoldRequest, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event,
};

/// `baton health` arguments.
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Baton's address: `unix:///path/to/baton.sock` or `HOST:PORT`.
    #[arg(long, env = "BATON_ADDR")]
    pub addr: String,
    /// The health service to ask about: `readiness`, `liveness` or a `baton.v1.*Service`.
    #[arg(long, default_value = "readiness")]
    pub service: String,
    /// Time allowed for connecting and answering (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// `baton hold` arguments.
#[derive(Debug, Args)]
pub struct HoldArgs {
    /// Baton's address: `unix:///path/to/baton.sock` or `HOST:PORT`.
    #[arg(long, env = "BATON_ADDR")]
    pub addr: String,
    /// The lock to take.
    #[arg(long, default_value = "demo")]
    pub name: String,
    /// Who holds it, as `Describe` shows it (a pod's name by default).
    #[arg(long, env = "HOSTNAME", default_value = "baton-hold")]
    pub owner: String,
    /// The lease's ttl, renewed while the lock is held (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// How long each turn holds the lock (e.g. 5s).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub hold_for: Duration,
    /// Pause between releasing the lock and asking for it again (e.g. 2s).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub pause: Duration,
}

/// Connects to Baton at `addr` (`unix:///path`, `unix:/path`, `http://HOST:PORT` or
/// `HOST:PORT`) within `timeout`.
pub async fn connect(addr: &str, timeout: Duration) -> anyhow::Result<Channel> {
    let path = addr
        .strip_prefix("unix://")
        .or_else(|| addr.strip_prefix("unix:"));
    let connecting = async {
        match path {
            Some(path) => {
                let path = PathBuf::from(path);
                // The URI is required but unused: every connection goes to the socket.
                Endpoint::from_static("http://localhost")
                    .connect_with_connector(tower::service_fn(move |_| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                UnixStream::connect(path).await?,
                            ))
                        }
                    }))
                    .await
            }
            None => {
                let uri = if addr.contains("://") {
                    addr.to_owned()
                } else {
                    format!("http://{addr}")
                };
                Endpoint::from_shared(uri)
                    .with_context(|| format!("{addr:?} is not an address"))?
                    .connect()
                    .await
            }
        }
        .with_context(|| format!("connecting to {addr}"))
    };
    tokio::time::timeout(timeout, connecting)
        .await
        .with_context(|| format!("connecting to {addr}: no connection within {timeout:?}"))?
}

/// Asks the health service about `args.service`; `Ok(true)` when it is SERVING.
pub async fn health(args: &HealthArgs) -> anyhow::Result<bool> {
    let deadline = Instant::now() + args.timeout;
    let channel = connect(&args.addr, args.timeout).await?;
    let mut client = HealthClient::new(channel);
    let ask = client.check(HealthCheckRequest {
        service: args.service.clone(),
    });
    let status = tokio::time::timeout_at(deadline, ask)
        .await
        .with_context(|| format!("no answer within {:?}", args.timeout))?
        .context("health check")?
        .into_inner()
        .status();
    out(&format!("{}: {}", args.service, status.as_str_name()));
    Ok(status == ServingStatus::Serving)
}

/// Takes lock `args.name` through a `Hold` stream, keeps it for `args.hold_for`, releases it,
/// pauses and starts again, saying each step on standard output, until the stream or the
/// connection fails.
pub async fn hold(args: &HoldArgs) -> anyhow::Result<()> {
    let channel = connect(&args.addr, Duration::from_secs(10)).await?;
    let mut locks = LockServiceClient::new(channel);
    let ttl = prost_types::Duration::try_from(args.ttl).context("--ttl")?;
    // Wait for the lock as long as a peer may keep it, and a little more.
    let wait = prost_types::Duration::try_from(args.hold_for + args.ttl).context("--hold-for")?;
    loop {
        let mut stream = locks
            .hold(LockServiceHoldRequest {
                name: args.name.clone(),
                ttl: Some(ttl),
                wait_timeout: Some(wait),
                owner: args.owner.clone(),
                ..Default::default()
            })
            .await
            .context("Hold")?
            .into_inner();
        match stream.message().await.context("Hold")? {
            Some(m) => match m.event {
                Some(Event::Acquired(lease)) => out(&format!(
                    "{}: holds {:?} with fencing token {}",
                    args.owner, lease.name, lease.fencing_token
                )),
                Some(Event::NotAcquired(_)) => {
                    out(&format!(
                        "{}: {:?} is busy; asking again",
                        args.owner, args.name
                    ));
                    continue;
                }
                other => anyhow::bail!("unexpected first event {other:?}"),
            },
            None => anyhow::bail!("the Hold stream ended before acquiring"),
        }
        let turn_ends = Instant::now() + args.hold_for;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(turn_ends) => break,
                message = stream.message() => match message.context("Hold")? {
                    Some(m) => if let Some(Event::Lost(lost)) = m.event {
                        out(&format!("{}: lost {:?}: {}", args.owner, args.name, lost.message));
                        break;
                    },
                    None => break,
                },
            }
        }
        // Closing the stream releases the lock at once.
        drop(stream);
        out(&format!("{}: released {:?}", args.owner, args.name));
        tokio::time::sleep_until(Instant::now() + args.pause).await;
    }
}

/// Writes a line to standard output, ignoring a failed write (`println!` would panic on a closed
/// stdout).
fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{text}");
}
