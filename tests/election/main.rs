//! Black-box tests of `baton.v1.ElectionService` against a real `redis-server`, over gRPC to
//! in-process Batons (and the `baton` binary, where a Baton must die). One module per group of
//! promises of docs/guarantees.md ("Leader election"), so the test of a promise is found from the
//! promise's name:
//!
//! - [`leadership`]: who leads and in which order, terms, takeover after a resignation, a
//!   candidate that leaves or vanishes, a vanished client or a dead Baton;
//! - [`observers`]: `Observe` in order, never backwards, never missing the last change, a slow
//!   observer holding nothing up;
//! - [`calls`]: `Proclaim` (racing a takeover too) and `Leader`, bad input, keys;
//! - [`faults`]: loss before expiry when Redis stops answering, one broken leadership alone in
//!   its batched renewal, shutdown;
//! - [`scripts`]: each scheduling rule of the election scripts on a crafted Redis state, without
//!   gRPC or waiting (`cargo test --test election scripts::`: a few seconds).
//!
//! With `BATON_TEST_TOPOLOGY=cluster` the same tests run on a local Redis Cluster. Candidates in
//! separate processes are in `tests/python/test_election_contract.py`.

#[path = "../support/mod.rs"]
mod support;

mod calls;
mod faults;
mod leadership;
mod observers;
mod scripts;

use std::time::Duration;

use baton::proto::v1::{
    self as pb, election_service_campaign_response::Event,
    election_service_client::ElectionServiceClient,
};
use support::{Baton, channel, lease::next_event, ms, wait_until, within};
use tonic::{Streaming, transport::Channel};

/// An ElectionService client.
type Client = ElectionServiceClient<Channel>;

/// The events of a `Campaign` stream.
type Campaign = Streaming<pb::ElectionServiceCampaignResponse>;

/// The states of an `Observe` stream.
type Observer = Streaming<pb::ElectionServiceObserveResponse>;

/// How long any one step may take on a loaded machine before a test gives up on it.
const STEP: Duration = Duration::from_secs(5);

/// The longest a takeover may take after the leader's stream closed: measured 1-2 ms; waiting
/// candidates that missed their wake-up would instead try again at their next renewal, a second
/// later.
const HANDOFF_BOUND: Duration = Duration::from_millis(200);

/// An ElectionService client of `baton` over a new TCP connection.
async fn client(baton: &Baton) -> Client {
    ElectionServiceClient::new(channel(baton.addr()).await)
}

/// A Campaign request.
fn campaign_request(name: &str, value: &str, ttl_ms: u64) -> pb::ElectionServiceCampaignRequest {
    pb::ElectionServiceCampaignRequest {
        name: name.to_owned(),
        value: value.as_bytes().to_vec(),
        ttl: Some(ms(ttl_ms)),
    }
}

/// Joins election `name` with `value`, panicking if the call fails.
async fn campaign(client: &mut Client, name: &str, value: &str, ttl_ms: u64) -> Campaign {
    client
        .campaign(campaign_request(name, value, ttl_ms))
        .await
        .unwrap_or_else(|s| panic!("Campaign {name:?} ({value}) failed: {s:?}"))
        .into_inner()
}

/// The next event of a campaign, which must be `elected`, within `limit`.
async fn elected(stream: &mut Campaign, limit: Duration, what: &str) -> pb::ElectionElected {
    match next_event(stream, limit, what).await {
        Event::Elected(e) => e,
        other => panic!("{what}: expected elected, got {other:?}"),
    }
}

/// The election's state, panicking if the call fails.
async fn leader(client: &mut Client, name: &str) -> pb::ElectionServiceLeaderResponse {
    client
        .leader(pb::ElectionServiceLeaderRequest {
            name: name.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Leader {name:?} failed: {s:?}"))
        .into_inner()
}

/// Waits (bounded) until `Leader` of `name` satisfies `check`, returning that answer.
async fn wait_for_leader(
    client: &Client,
    name: &str,
    what: &str,
    check: impl Fn(&pb::ElectionServiceLeaderResponse) -> bool,
) -> pb::ElectionServiceLeaderResponse {
    let check = &check;
    wait_until(STEP, what, || {
        let mut client = client.clone();
        async move {
            let state = leader(&mut client, name).await;
            if check(&state) { Ok(state) } else { Err(state) }
        }
    })
    .await
}

/// Waits (bounded) until `n` candidates wait in election `name`.
async fn wait_for_candidates(client: &Client, name: &str, n: u32) {
    let what = format!("{n} candidate(s) waiting in {name:?}");
    wait_for_leader(client, name, &what, |s| s.candidates == n).await;
}

/// Changes the leader's value, panicking if the call fails.
async fn proclaim(
    client: &mut Client,
    name: &str,
    token: &str,
    value: &[u8],
) -> pb::ElectionServiceProclaimResponse {
    client
        .proclaim(pb::ElectionServiceProclaimRequest {
            name: name.to_owned(),
            token: token.to_owned(),
            value: value.to_vec(),
        })
        .await
        .unwrap_or_else(|s| panic!("Proclaim {name:?} failed: {s:?}"))
        .into_inner()
}

/// Follows election `name`, panicking if the call fails.
async fn observe(client: &mut Client, name: &str) -> Observer {
    client
        .observe(pb::ElectionServiceObserveRequest {
            name: name.to_owned(),
        })
        .await
        .unwrap_or_else(|s| panic!("Observe {name:?} failed: {s:?}"))
        .into_inner()
}

/// The next state of an observer, within [`STEP`]; panics if the stream fails or ends.
async fn next_state(observer: &mut Observer, what: &str) -> pb::ElectionServiceObserveResponse {
    within(STEP, observer.message(), what)
        .await
        .unwrap_or_else(|s| panic!("{what}: the Observe stream failed: {s:?}"))
        .unwrap_or_else(|| panic!("{what}: the Observe stream ended"))
}

/// An observed state in a form that is quick to compare: (term, revision, value), or for nobody
/// leading (last term, `u64::MAX`, empty).
fn summary(state: &pb::ElectionServiceObserveResponse) -> (u64, u64, String) {
    match &state.leader {
        Some(l) => {
            assert_eq!(
                state.last_term, l.term,
                "last_term is the leader's: {state:?}"
            );
            (
                l.term,
                l.value_revision,
                String::from_utf8_lossy(&l.value).into_owned(),
            )
        }
        None => (state.last_term, u64::MAX, String::new()),
    }
}
