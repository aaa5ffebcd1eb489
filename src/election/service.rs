//! The `baton.v1.ElectionService` gRPC handler: turns requests into election calls and their
//! outcomes into responses. Validation errors name the proto field; `Campaign` is the shared
//! `Hold` stream of [`Leases`], `Observe` the election's own ([`super::observe`]).

use std::time::Duration;

use futures::StreamExt;
use tonic::{Request, Response, Status};

use super::{
    CAMPAIGN_WAIT, CampaignRequest, Election, Elections, Leader, Leadership, MAX_VALUE_BYTES,
    Refusal, observe,
};
use crate::{
    error::Error,
    grpc::{
        leases::{self, EventStream, Leases},
        wire,
    },
    lease::{MAX_TTL, MIN_KEEPALIVE_TTL},
    proto::v1::{
        self as pb, election_service_campaign_response::Event as CampaignEvent,
        election_service_server::ElectionService,
    },
};

/// The ElectionService implementation.
#[derive(Clone)]
pub struct ElectionApi {
    leases: Leases<Election>,
    shutdown: tokio_util::sync::CancellationToken,
}

impl ElectionApi {
    /// A handler over `elections` whose streams end when `shutdown` is cancelled; `pings` is the
    /// server's HTTP/2 keepalive interval.
    pub fn new(
        elections: Elections,
        shutdown: tokio_util::sync::CancellationToken,
        pings: Option<Duration>,
    ) -> Self {
        Self {
            leases: Leases::new(elections, shutdown.clone(), pings),
            shutdown,
        }
    }
}

/// A value: at most [`MAX_VALUE_BYTES`].
fn value(value: Vec<u8>) -> Result<Vec<u8>, Error> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(Error::invalid(
            "value",
            format!(
                "is {} bytes, more than the {MAX_VALUE_BYTES} allowed",
                value.len()
            ),
        ));
    }
    Ok(value)
}

fn leader_message(leader: Leader) -> pb::ElectionLeader {
    pb::ElectionLeader {
        term: leader.term,
        value: leader.value,
        value_revision: leader.revision,
        remaining_ttl: Some(wire::duration(leader.remaining)),
    }
}

fn elected(leadership: &Leadership, ttl: Duration) -> pb::ElectionServiceCampaignResponse {
    pb::ElectionServiceCampaignResponse {
        event: Some(CampaignEvent::Elected(pb::ElectionElected {
            name: leadership.name.clone(),
            token: leadership.token.clone(),
            term: leadership.term,
            remaining_ttl: Some(wire::duration(leadership.remaining)),
            expires_at: Some(leases::expires_at(leadership, ttl)),
        })),
    }
}

/// A campaign waits for as long as its stream is open ([`CAMPAIGN_WAIT`]): its wait ending is
/// not an answer the contract has.
fn not_elected(_: Refusal) -> Result<pb::ElectionServiceCampaignResponse, Status> {
    Err(
        Error::Unavailable("the campaign's wait ended without an election; campaign again".into())
            .into(),
    )
}

#[tonic::async_trait]
impl ElectionService for ElectionApi {
    type CampaignStream = EventStream<pb::ElectionServiceCampaignResponse>;

    async fn campaign(
        &self,
        request: Request<pb::ElectionServiceCampaignRequest>,
    ) -> Result<Response<Self::CampaignStream>, Status> {
        let client = self.leases.client(&request);
        let req = request.into_inner();
        let campaign = CampaignRequest {
            name: leases::name(&req.name)?.to_owned(),
            ttl: wire::bounded("ttl", req.ttl, MIN_KEEPALIVE_TTL, MAX_TTL)?,
            value: value(req.value)?,
            wait: CAMPAIGN_WAIT,
        };
        let events = self.leases.hold(campaign, client, elected, not_elected)?;
        Ok(Response::new(events))
    }

    async fn proclaim(
        &self,
        request: Request<pb::ElectionServiceProclaimRequest>,
    ) -> Result<Response<pb::ElectionServiceProclaimResponse>, Status> {
        let req = request.into_inner();
        let name = leases::name(&req.name)?;
        let token = leases::token(&req.token)?;
        let value = value(req.value)?;
        let proclaimed = self
            .leases
            .engine()
            .primitive()
            .proclaim(name, &token, &value)
            .await?;
        Ok(Response::new(pb::ElectionServiceProclaimResponse {
            term: proclaimed.term,
            value_revision: proclaimed.revision,
        }))
    }

    async fn leader(
        &self,
        request: Request<pb::ElectionServiceLeaderRequest>,
    ) -> Result<Response<pb::ElectionServiceLeaderResponse>, Status> {
        let req = request.into_inner();
        let name = leases::name(&req.name)?;
        let state = self.leases.engine().primitive().state(name).await?;
        Ok(Response::new(pb::ElectionServiceLeaderResponse {
            last_term: state.leader.as_ref().map_or(state.last_term, |l| l.term),
            leader: state.leader.map(leader_message),
            candidates: state.candidates,
        }))
    }

    type ObserveStream = EventStream<pb::ElectionServiceObserveResponse>;

    async fn observe(
        &self,
        request: Request<pb::ElectionServiceObserveRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let req = request.into_inner();
        let name = leases::name(&req.name)?.to_owned();
        self.leases.open()?;
        let states = observe::observe(self.leases.engine(), name, self.shutdown.clone());
        let messages = states.map(|state| {
            let state = state?;
            Ok(pb::ElectionServiceObserveResponse {
                last_term: state.last_term,
                leader: state.leader.map(leader_message),
            })
        });
        Ok(Response::new(Box::pin(messages)))
    }
}
