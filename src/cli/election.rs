//! `baton leader` (who leads an election, once) and `baton observe` (every change, as it
//! happens); `baton campaign` is in [`super::leased`].

use futures::StreamExt;
use serde_json::{Value, json};

use super::{
    EXIT_NO, EXIT_UNAVAILABLE, Failure, LeaderArgs, ObserveArgs, connect,
    oneshot::{human, print, request, secs},
    std_duration, stdout_gone, stdout_lost,
};
use crate::proto::v1::{
    ElectionLeader, ElectionServiceLeaderRequest, ElectionServiceObserveRequest,
    election_service_client::ElectionServiceClient,
};

/// The leader as JSON (null when nobody leads); its value as text (invalid UTF-8 replaced).
fn leader_json(leader: Option<&ElectionLeader>) -> Value {
    leader.map_or(Value::Null, |l| {
        json!({
            "term": l.term,
            "value": String::from_utf8_lossy(&l.value),
            "value_revision": l.value_revision,
            "remaining_ttl": secs(std_duration(l.remaining_ttl.as_ref())),
        })
    })
}

/// The leader for people: `"pod-a" (term 7, value revision 0, 9.870s left)`.
fn leader_text(l: &ElectionLeader) -> String {
    format!(
        "{:?} (term {}, value revision {}, {} left)",
        String::from_utf8_lossy(&l.value),
        l.term,
        l.value_revision,
        human(std_duration(l.remaining_ttl.as_ref()))
    )
}

/// Runs `baton leader`: exit 0 when someone leads, 1 when nobody does.
pub async fn leader(args: LeaderArgs) -> Result<u8, Failure> {
    let channel = connect(&args.client).await?;
    let state = ElectionServiceClient::new(channel)
        .leader(request(
            ElectionServiceLeaderRequest {
                name: args.name.clone(),
            },
            &args.client,
        ))
        .await
        .map_err(|s| Failure::from_status(&s, &args.client.addr))?
        .into_inner();
    let value = json!({
        "name": args.name,
        "leader": leader_json(state.leader.as_ref()),
        "last_term": state.last_term,
        "candidates": state.candidates,
    });
    let text = match &state.leader {
        Some(l) => format!(
            "election {:?}: led by {}, {} candidates waiting",
            args.name,
            leader_text(l),
            state.candidates
        ),
        None => format!(
            "election {:?}: no leader (last term {}), {} candidates waiting",
            args.name, state.last_term, state.candidates
        ),
    };
    print(args.json, &value, &text);
    Ok(if state.leader.is_some() { 0 } else { EXIT_NO })
}

/// Runs `baton observe`: one line per state, until `--count` states were printed, an interrupt,
/// standard output's reader is gone (exit 0, as for any closed pipe; 74 for a write that failed
/// otherwise), or the stream fails (then the view may be stale: exit 69 for `UNAVAILABLE`).
/// Opening the stream and its first state are bounded by `--timeout`, as any call; the stream
/// then runs without a deadline.
pub async fn observe(args: ObserveArgs) -> Result<u8, Failure> {
    let channel = connect(&args.client).await?;
    let addr = &args.client.addr;
    let timeout = args.client.timeout;
    let opened = async {
        let mut states = ElectionServiceClient::new(channel)
            .observe(ElectionServiceObserveRequest {
                name: args.name.clone(),
            })
            .await?
            .into_inner();
        let first = states.next().await;
        Ok::<_, tonic::Status>((states, first))
    };
    let (mut states, first) = match tokio::time::timeout(timeout, opened).await {
        Ok(Ok(opened)) => opened,
        Ok(Err(status)) => return Err(Failure::from_status(&status, addr)),
        Err(_) => {
            return Err(Failure::new(
                EXIT_UNAVAILABLE,
                format!(
                    "Baton at {addr} sent no state of election {:?} within {} (--timeout)",
                    args.name,
                    humantime::format_duration(timeout)
                ),
            ));
        }
    };
    let mut next = Some(first);
    let gone = stdout_gone();
    tokio::pin!(gone);
    let mut printed = 0;
    while args.count.is_none_or(|count| printed < count) {
        let state = match next.take() {
            Some(state) => state,
            None => tokio::select! {
                state = states.next() => state,
                () = &mut gone => return Ok(0),
            },
        };
        let state = match state {
            Some(Ok(state)) => state,
            Some(Err(status)) => return Err(Failure::from_status(&status, addr)),
            None => {
                return Err(Failure::new(
                    EXIT_UNAVAILABLE,
                    format!("Baton at {addr} ended the observation"),
                ));
            }
        };
        let value = json!({
            "name": args.name,
            "leader": leader_json(state.leader.as_ref()),
            "last_term": state.last_term,
        });
        let text = match &state.leader {
            Some(l) => format!("led by {}", leader_text(l)),
            None => format!("no leader (last term {})", state.last_term),
        };
        print(args.json, &value, &text);
        if stdout_lost() {
            // Nobody reads what follows: a closed pipe exits 0, another failure 74.
            return Ok(0);
        }
        printed += 1;
    }
    Ok(0)
}
