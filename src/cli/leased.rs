//! `baton lock`, `baton semaphore` and `baton campaign`: run a command while a stream keeps the
//! lease (a lock's or semaphore's `Hold`, an election's `Campaign`).
//!
//! The command starts once the lease is acquired (the candidate elected), with its fencing token
//! in `BATON_FENCING_TOKEN` (and an election's term in `BATON_ELECTION_TERM` as well), as a job of
//! its own ([`super::job`]). The lease counts as lost when Baton says so, when the stream breaks,
//! or when the newest `expires_at` passes on the local clock with no newer renewal (a frozen or
//! partitioned Baton sends nothing); the command's whole process group then gets SIGTERM, SIGKILL
//! after the grace period, and `baton` exits [`EXIT_LEASE_LOST`]. When the command exits by
//! itself the lease is released at once and its exit code is passed through. SIGINT, SIGTERM and
//! SIGHUP sent to `baton` are passed on to the command's group, which is then waited for (SIGKILL
//! after the grace period, or at once on a second signal) before the lease is released.

use std::{
    pin::Pin,
    time::{Duration, SystemTime},
};

use futures::{Stream, StreamExt};
use nix::sys::signal::Signal;
use tokio::{
    signal::unix::{SignalKind, signal},
    time::{Instant, sleep_until, timeout_at},
};
use tonic::{Code, Status};
use tonic_types::StatusExt;

use super::{
    CampaignArgs, Connection, EXIT_LEASE_LOST, EXIT_NOT_ACQUIRED, EXIT_SOFTWARE, EXIT_UNAVAILABLE,
    Failure, LockArgs, SemaphoreArgs, connect,
    job::{Job, signal_code},
    proto_duration, std_duration,
};
use crate::proto::v1::{
    ElectionServiceCampaignRequest, LeaseLostReason, LockMode, LockServiceHoldRequest,
    LockServiceReleaseRequest, SemaphoreServiceHoldRequest, SemaphoreServiceReleaseRequest,
    election_service_campaign_response, election_service_client::ElectionServiceClient,
    lock_service_client::LockServiceClient, lock_service_hold_response,
    semaphore_service_client::SemaphoreServiceClient, semaphore_service_hold_response,
};

/// Baton's longest wait per call; longer waits are made of several.
const MAX_WAIT: Duration = Duration::from_secs(3600);
/// Attempts of a `Hold` that fails `UNAVAILABLE` before the lease is acquired.
const RETRIES: u32 = 4;
/// Delay before retrying `UNAVAILABLE` when Baton suggested none, and the longest.
const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(100);
const MAX_RETRY_DELAY: Duration = Duration::from_secs(2);

/// Runs `baton lock`.
pub async fn lock(args: LockArgs) -> Result<u8, Failure> {
    let channel = connect(&args.client).await?;
    let mode = if args.shared {
        LockMode::Shared
    } else {
        LockMode::Exclusive
    };
    let request = LockServiceHoldRequest {
        name: args.name.clone(),
        ttl: Some(proto_duration(args.ttl)),
        wait_timeout: None,
        owner: args.owner.clone(),
        fair: args.fair,
        mode: mode.into(),
    };
    let spec = Spec {
        kind: "lock",
        name: args.name,
        addr: args.client.addr,
        timeout: args.client.timeout,
        wait: args.wait,
        grace: args.grace,
        command: args.command,
    };
    run(Target::Lock(LockServiceClient::new(channel), request), spec).await
}

/// Runs `baton semaphore`.
pub async fn semaphore(args: SemaphoreArgs) -> Result<u8, Failure> {
    let channel = connect(&args.client).await?;
    let request = SemaphoreServiceHoldRequest {
        name: args.name.clone(),
        limit: args.limit,
        permits: args.permits,
        ttl: Some(proto_duration(args.ttl)),
        wait_timeout: None,
        owner: args.owner.clone(),
        fair: args.fair,
    };
    let spec = Spec {
        kind: "semaphore",
        name: args.name,
        addr: args.client.addr,
        timeout: args.client.timeout,
        wait: args.wait,
        grace: args.grace,
        command: args.command,
    };
    run(
        Target::Semaphore(SemaphoreServiceClient::new(channel), request),
        spec,
    )
    .await
}

/// Runs `baton campaign`.
pub async fn campaign(args: CampaignArgs) -> Result<u8, Failure> {
    let channel = connect(&args.client).await?;
    let request = ElectionServiceCampaignRequest {
        name: args.name.clone(),
        value: args.value.into_bytes(),
        ttl: Some(proto_duration(args.ttl)),
    };
    let spec = Spec {
        kind: "election",
        name: args.name,
        addr: args.client.addr,
        timeout: args.client.timeout,
        wait: args.wait,
        grace: args.grace,
        command: args.command,
    };
    run(
        Target::Election(ElectionServiceClient::new(channel), request),
        spec,
    )
    .await
}

/// What to hold and what to run.
struct Spec {
    kind: &'static str,
    name: String,
    addr: String,
    timeout: Duration,
    wait: Option<Duration>,
    grace: Duration,
    command: Vec<String>,
}

/// A `Hold` stream's events, the same for locks and semaphores.
enum Event {
    Acquired(Grant),
    NotAcquired(String),
    Renewed(Option<prost_types::Timestamp>),
    Lost(String, String),
}

/// What a grant says that `baton` needs.
struct Grant {
    token: String,
    fencing_token: u64,
    expires_at: Option<prost_types::Timestamp>,
}

type Events = Pin<Box<dyn Stream<Item = Result<Event, Status>> + Send>>;

/// The service a lease is held from, with its `Hold` (or `Campaign`) request.
enum Target {
    Lock(LockServiceClient<Connection>, LockServiceHoldRequest),
    Semaphore(
        SemaphoreServiceClient<Connection>,
        SemaphoreServiceHoldRequest,
    ),
    Election(
        ElectionServiceClient<Connection>,
        ElectionServiceCampaignRequest,
    ),
}

impl Target {
    /// Whether Baton bounds the wait (`Hold`'s `wait_timeout`); a campaign waits for as long as
    /// its stream is open, so `baton` bounds it by closing the stream.
    fn waits_on_baton(&self) -> bool {
        !matches!(self, Target::Election(..))
    }

    /// The variables giving the command its fencing token.
    fn env(&self, fencing_token: u64) -> Vec<(&'static str, String)> {
        let token = fencing_token.to_string();
        match self {
            Target::Election(..) => vec![
                ("BATON_ELECTION_TERM", token.clone()),
                ("BATON_FENCING_TOKEN", token),
            ],
            _ => vec![("BATON_FENCING_TOKEN", token)],
        }
    }

    /// Opens a `Hold` stream that waits up to `wait` (a `Campaign`, which waits until it is
    /// closed).
    async fn hold(&mut self, wait: Duration) -> Result<Events, Status> {
        let wait = Some(proto_duration(wait));
        match self {
            Target::Lock(client, request) => {
                let request = LockServiceHoldRequest {
                    wait_timeout: wait,
                    ..request.clone()
                };
                let stream = client.hold(request).await?.into_inner();
                Ok(Box::pin(stream.map(|r| r.map(lock_event))))
            }
            Target::Semaphore(client, request) => {
                let request = SemaphoreServiceHoldRequest {
                    wait_timeout: wait,
                    ..request.clone()
                };
                let stream = client.hold(request).await?.into_inner();
                Ok(Box::pin(stream.map(|r| r.map(semaphore_event))))
            }
            Target::Election(client, request) => {
                let stream = client.campaign(request.clone()).await?.into_inner();
                Ok(Box::pin(stream.map(|r| r.map(election_event))))
            }
        }
    }

    /// Releases the hold whose token is given, within `timeout`. A leadership has no release
    /// call: closing its stream (dropping the events) resigns.
    async fn release(&mut self, token: &str, timeout: Duration) -> Result<(), Status> {
        let call = async {
            match self {
                Target::Lock(client, request) => client
                    .release(LockServiceReleaseRequest {
                        name: request.name.clone(),
                        token: token.to_owned(),
                    })
                    .await
                    .map(drop),
                Target::Semaphore(client, request) => client
                    .release(SemaphoreServiceReleaseRequest {
                        name: request.name.clone(),
                        token: token.to_owned(),
                    })
                    .await
                    .map(drop),
                Target::Election(..) => Ok(()),
            }
        };
        tokio::time::timeout(timeout, call)
            .await
            .unwrap_or_else(|_| Err(Status::deadline_exceeded("release timed out")))
    }
}

fn lost_event(lost: crate::proto::v1::LeaseLost) -> Event {
    let reason = LeaseLostReason::try_from(lost.reason)
        .map(|r| r.as_str_name().trim_start_matches("LEASE_LOST_REASON_"))
        .unwrap_or("UNKNOWN");
    Event::Lost(reason.to_owned(), lost.message)
}

fn lock_event(response: crate::proto::v1::LockServiceHoldResponse) -> Event {
    use lock_service_hold_response::Event as E;
    match response.event {
        Some(E::Acquired(lease)) => Event::Acquired(Grant {
            token: lease.token,
            fencing_token: lease.fencing_token,
            expires_at: lease.expires_at,
        }),
        Some(E::NotAcquired(missed)) => {
            Event::NotAcquired(match std_duration(missed.holder_remaining_ttl.as_ref()) {
                Some(left) => format!("the holder's lease has {left:?} left"),
                None => "waiters were ahead".to_owned(),
            })
        }
        Some(E::Renewed(renewed)) => Event::Renewed(renewed.expires_at),
        Some(E::Lost(lost)) => lost_event(lost),
        None => Event::Lost("UNKNOWN".to_owned(), "an empty event".to_owned()),
    }
}

fn semaphore_event(response: crate::proto::v1::SemaphoreServiceHoldResponse) -> Event {
    use semaphore_service_hold_response::Event as E;
    match response.event {
        Some(E::Acquired(permit)) => Event::Acquired(Grant {
            token: permit.token,
            fencing_token: permit.fencing_token,
            expires_at: permit.expires_at,
        }),
        Some(E::NotAcquired(missed)) => {
            Event::NotAcquired(format!("{} permits were free", missed.available))
        }
        Some(E::Renewed(renewed)) => Event::Renewed(renewed.expires_at),
        Some(E::Lost(lost)) => lost_event(lost),
        None => Event::Lost("UNKNOWN".to_owned(), "an empty event".to_owned()),
    }
}

fn election_event(response: crate::proto::v1::ElectionServiceCampaignResponse) -> Event {
    use election_service_campaign_response::Event as E;
    match response.event {
        Some(E::Elected(elected)) => Event::Acquired(Grant {
            token: elected.token,
            fencing_token: elected.term,
            expires_at: elected.expires_at,
        }),
        Some(E::Renewed(renewed)) => Event::Renewed(renewed.expires_at),
        Some(E::Lost(lost)) => lost_event(lost),
        None => Event::Lost("UNKNOWN".to_owned(), "an empty event".to_owned()),
    }
}

/// The moment, on this process's monotonic clock, at which the wall-clock `expires_at` passes.
fn local_deadline(expires_at: Option<&prost_types::Timestamp>) -> Instant {
    let now = Instant::now();
    let Some(ts) = expires_at else {
        return now;
    };
    let expires = SystemTime::UNIX_EPOCH
        + Duration::from_secs(u64::try_from(ts.seconds).unwrap_or(0))
        + Duration::from_nanos(u64::try_from(ts.nanos).unwrap_or(0));
    now + expires
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
}

/// The signals `baton` forwards to the command: those that ask it to stop (SIGINT, SIGTERM,
/// SIGHUP, SIGQUIT), and those a program may act on and go on (SIGUSR1, SIGUSR2, SIGALRM). A
/// signal whose default action ends `baton` and that it did not catch would end it with the
/// command still running, and its lease released under it.
struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    user1: tokio::signal::unix::Signal,
    user2: tokio::signal::unix::Signal,
    alarm: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self, Failure> {
        let listen = |kind| {
            signal(kind)
                .map_err(|e| Failure::new(EXIT_SOFTWARE, format!("cannot listen for signals: {e}")))
        };
        Ok(Self {
            interrupt: listen(SignalKind::interrupt())?,
            terminate: listen(SignalKind::terminate())?,
            hangup: listen(SignalKind::hangup())?,
            quit: listen(SignalKind::quit())?,
            user1: listen(SignalKind::user_defined1())?,
            user2: listen(SignalKind::user_defined2())?,
            alarm: listen(SignalKind::alarm())?,
        })
    }

    async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = self.hangup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
            _ = self.user1.recv() => Signal::SIGUSR1,
            _ = self.user2.recv() => Signal::SIGUSR2,
            _ = self.alarm.recv() => Signal::SIGALRM,
        }
    }

    /// Whether `sig` asks the command to stop (then `baton` waits for it, up to `--grace`), or
    /// is only passed on.
    fn stops(sig: Signal) -> bool {
        matches!(
            sig,
            Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP | Signal::SIGQUIT
        )
    }

    /// Resolves at the next signal: a second interrupt ends a stop's grace period.
    async fn again(&mut self) {
        self.recv().await;
    }
}

async fn run(mut target: Target, spec: Spec) -> Result<u8, Failure> {
    let mut signals = Signals::new()?;
    let (mut events, grant) = tokio::select! {
        acquired = acquire(&mut target, &spec) => acquired?,
        // Nothing is held yet; the stream being opened is dropped, which cancels it.
        sig = signals.recv() => return Ok(signal_code(sig)),
    };

    let mut job = match Job::spawn(&spec.command, &target.env(grant.fencing_token)) {
        Ok(job) => job,
        Err(e) => {
            drop(events);
            let _ = target.release(&grant.token, spec.timeout).await;
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Err(Failure::new(
                code,
                format!("cannot run {:?}: {e}", spec.command[0]),
            ));
        }
    };

    let mut deadline = local_deadline(grant.expires_at.as_ref());
    let (reason, message) = loop {
        tokio::select! {
            code = job.wait() => {
                // Released before baton exits, so the next holder can go ahead at once; the
                // stream's closing would release it too (and is what resigns a leadership).
                let _ = target.release(&grant.token, spec.timeout).await;
                drop(events);
                return Ok(code);
            }
            event = events.next() => match event {
                Some(Ok(Event::Renewed(expires_at))) => deadline = local_deadline(expires_at.as_ref()),
                Some(Ok(Event::Lost(reason, message))) => break (reason, message),
                Some(Ok(_)) => {}
                Some(Err(status)) => break (
                    "DISCONNECTED".to_owned(),
                    format!("the stream broke: {:?}: {}", status.code(), status.message()),
                ),
                None => break ("DISCONNECTED".to_owned(), "the stream ended without a lost event".to_owned()),
            },
            () = sleep_until(deadline) => break (
                "EXPIRED".to_owned(),
                "no renewal arrived before the lease's expires_at".to_owned(),
            ),
            sig = signals.recv() => {
                if !Signals::stops(sig) {
                    job.signal(sig);
                    continue;
                }
                let code = job.stop(sig, spec.grace, signals.again()).await;
                let _ = target.release(&grant.token, spec.timeout).await;
                drop(events);
                return Ok(code);
            }
        }
    };
    drop(events);
    let what = if spec.kind == "election" {
        format!("the leadership of election {:?}", spec.name)
    } else {
        format!("the lease on {} {:?}", spec.kind, spec.name)
    };
    noteln!("baton: {what} was lost ({reason}): {message}; stopping the command");
    job.stop(Signal::SIGTERM, spec.grace, signals.again()).await;
    Ok(EXIT_LEASE_LOST)
}

/// Acquires the lease: a `Hold` stream whose first event is `acquired`. A wait longer than
/// Baton's longest is made of several; `UNAVAILABLE` before the grant (nothing is held then) is
/// retried after the delay Baton suggests.
async fn acquire(target: &mut Target, spec: &Spec) -> Result<(Events, Grant), Failure> {
    let deadline = spec.wait.map(|w| Instant::now() + w);
    let mut failures = 0;
    loop {
        let left = deadline.map_or(MAX_WAIT, |d| d.saturating_duration_since(Instant::now()));
        let call = left.min(MAX_WAIT);
        let started = Instant::now();
        // A Baton that does not answer (frozen, or a listener that never replies) is given
        // `--timeout` to open the stream, and a lock's or permits' first event is due by the
        // wait plus `--timeout`: past that the attempt is unavailable, and the retries that
        // follow are bounded the same way, instead of lasting until the connection's pings fail.
        let opened = timeout_at(started + spec.timeout, target.hold(call)).await;
        let status = match opened.unwrap_or_else(|_| Err(no_answer(spec))) {
            Ok(mut events) => {
                let answer_by = started + call + spec.timeout;
                match first_event(
                    &mut events,
                    deadline,
                    target.waits_on_baton(),
                    answer_by,
                    spec,
                )
                .await
                {
                    Err(()) => {
                        return Err(not_acquired(
                            spec,
                            "other candidates led, or were ahead of it, all along",
                        ));
                    }
                    Ok(Some(Ok(Event::Acquired(grant)))) => return Ok((events, grant)),
                    Ok(Some(Ok(Event::NotAcquired(why)))) => {
                        if deadline.is_none() || left > MAX_WAIT {
                            continue;
                        }
                        return Err(not_acquired(spec, &why));
                    }
                    Ok(Some(Ok(_))) => Status::internal("the stream did not start with a grant"),
                    Ok(Some(Err(status))) => status,
                    Ok(None) => Status::unavailable("the stream ended before its first event"),
                }
            }
            Err(status) => status,
        };
        failures += 1;
        let delay = status
            .get_details_retry_info()
            .and_then(|info| info.retry_delay)
            .unwrap_or(DEFAULT_RETRY_DELAY)
            .min(MAX_RETRY_DELAY);
        let retry_at = Instant::now() + delay;
        let give_up = match deadline {
            // A campaign retried after its wait would give up at once: UNAVAILABLE is its
            // outcome then.
            Some(d) if !target.waits_on_baton() => retry_at >= d,
            Some(d) => failures >= RETRIES && Instant::now() >= d,
            None => failures >= RETRIES,
        };
        let transient = status.code() == Code::Unavailable || super::connection_broke(&status);
        if !transient || give_up {
            let mut failure = Failure::from_status(&status, &spec.addr);
            if failure.code == EXIT_UNAVAILABLE {
                failure.message = format!(
                    "Baton at {} is unavailable after {failures} attempt{}: {}",
                    spec.addr,
                    if failures == 1 { "" } else { "s" },
                    status.message()
                );
            }
            return Err(failure);
        }
        sleep_until(retry_at).await;
    }
}

/// The stream's first event; `Err` when `deadline` passes first and the wait is `baton`'s to
/// bound (a campaign's). When Baton bounds the wait, the event is due by `answer_by`, past which
/// the attempt is unavailable.
async fn first_event(
    events: &mut Events,
    deadline: Option<Instant>,
    waits_on_baton: bool,
    answer_by: Instant,
    spec: &Spec,
) -> Result<Option<Result<Event, Status>>, ()> {
    match deadline {
        _ if waits_on_baton => Ok(timeout_at(answer_by, events.next())
            .await
            .unwrap_or_else(|_| Some(Err(no_answer(spec))))),
        Some(deadline) => timeout_at(deadline, events.next()).await.map_err(drop),
        None => Ok(events.next().await),
    }
}

/// The status of an attempt Baton did not answer in time.
fn no_answer(spec: &Spec) -> Status {
    Status::unavailable(format!(
        "no answer within {} (--timeout){}",
        humantime::format_duration(spec.timeout),
        if spec.wait.is_some() {
            " beyond the wait"
        } else {
            ""
        }
    ))
}

/// The failure of a wait that ended first.
fn not_acquired(spec: &Spec, why: &str) -> Failure {
    let waited = humantime::format_duration(spec.wait.unwrap_or_default());
    let message = if spec.kind == "election" {
        format!("not elected in {:?} within {waited}: {why}", spec.name)
    } else {
        format!(
            "{} {:?} not acquired within {waited}: {why}",
            spec.kind, spec.name
        )
    };
    Failure::new(EXIT_NOT_ACQUIRED, message)
}
