//! `baton hold`: takes a lock in turns with its peers and says each step on standard output. It
//! is the Helm chart's demo application, so the image needs nothing but Baton itself.

use std::time::Duration;

use tokio::time::Instant;

use super::{EXIT_SOFTWARE, Failure, HoldArgs, connect, stdout_lost};
use crate::proto::v1::{
    LockServiceHoldRequest, lock_service_client::LockServiceClient,
    lock_service_hold_response::Event,
};

/// Takes lock `args.name` through a `Hold` stream, keeps it for `args.hold_for`, releases it,
/// pauses and starts again, until the stream or the connection fails, or a step cannot be
/// written to standard output.
pub async fn hold(mut args: HoldArgs) -> Result<u8, Failure> {
    if args.owner.trim().is_empty() {
        args.owner = own_name();
    }
    let addr = args.client.addr.clone();
    let failed = |status: tonic::Status| Failure::from_status(&status, &addr);
    let mut locks = LockServiceClient::new(connect(&args.client).await?);
    let duration = |d: Duration, flag: &str| {
        prost_types::Duration::try_from(d)
            .map_err(|e| Failure::new(super::EXIT_USAGE, format!("{flag}: {e}")))
    };
    let ttl = duration(args.ttl, "--ttl")?;
    // Wait for the lock as long as a peer may keep it, and a little more.
    let wait = duration(args.hold_for + args.ttl, "--hold-for")?;
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
            .map_err(failed)?
            .into_inner();
        match stream
            .message()
            .await
            .map_err(failed)?
            .and_then(|m| m.event)
        {
            Some(Event::Acquired(lease)) => outln!(
                "{}: holds {:?} with fencing token {}",
                args.owner,
                lease.name,
                lease.fencing_token
            ),
            Some(Event::NotAcquired(_)) => {
                outln!("{}: {:?} is busy; asking again", args.owner, args.name);
                if stdout_lost() {
                    return Ok(0);
                }
                continue;
            }
            other => {
                return Err(Failure::new(
                    EXIT_SOFTWARE,
                    format!("the Hold stream began with {other:?}, not a grant"),
                ));
            }
        }
        // The steps are what `hold` is for: once they cannot be written (a closed pipe exits 0,
        // another failure 74), it stops, and closing the stream releases the lock.
        if stdout_lost() {
            return Ok(0);
        }
        let turn_ends = Instant::now() + args.hold_for;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(turn_ends) => break,
                message = stream.message() => match message.map_err(failed)? {
                    Some(m) => if let Some(Event::Lost(lost)) = m.event {
                        outln!("{}: lost {:?}: {}", args.owner, args.name, lost.message);
                        break;
                    },
                    None => break,
                },
            }
        }
        // Closing the stream releases the lock at once.
        drop(stream);
        outln!("{}: released {:?}", args.owner, args.name);
        if stdout_lost() {
            return Ok(0);
        }
        tokio::time::sleep_until(Instant::now() + args.pause).await;
    }
}

/// A name of this process no peer shares: the host's name and the process id.
fn own_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    let host = if host.is_empty() {
        "baton-hold".to_owned()
    } else {
        host
    };
    format!("{host}-{}", std::process::id())
}
