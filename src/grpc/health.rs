//! The standard gRPC health service, with `Watch` of a service the server does not know answered
//! as grpc.health.v1 defines it: a `SERVICE_UNKNOWN` status, the call left open, where
//! tonic-health fails the call `NOT_FOUND`. Baton's service names never change while it runs, so
//! nothing follows that status until shutdown ends the stream.

use std::pin::Pin;

use futures::{Stream, StreamExt, stream};
use tonic::{Code, Request, Response, Status};
use tonic_health::{
    pb::{
        HealthCheckRequest, HealthCheckResponse,
        health_check_response::ServingStatus,
        health_server::{self, HealthServer},
    },
    server::{HealthReporter, HealthService},
};

/// The health service over the statuses a [`HealthReporter`] sets.
pub struct Health {
    inner: HealthService,
}

impl Health {
    /// A server answering with the statuses `reporter` sets.
    pub fn server(reporter: HealthReporter) -> HealthServer<Self> {
        HealthServer::new(Self {
            inner: HealthService::from_health_reporter(reporter),
        })
    }
}

/// The statuses a `Watch` call sends.
type Statuses = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl health_server::Health for Health {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        health_server::Health::check(&self.inner, request).await
    }

    type WatchStream = Statuses;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Statuses>, Status> {
        match health_server::Health::watch(&self.inner, request).await {
            Ok(statuses) => Ok(Response::new(Box::pin(statuses.into_inner()))),
            Err(status) if status.code() == Code::NotFound => {
                let unknown = HealthCheckResponse {
                    status: ServingStatus::ServiceUnknown.into(),
                };
                Ok(Response::new(Box::pin(
                    stream::once(async move { Ok(unknown) }).chain(stream::pending()),
                )))
            }
            Err(status) => Err(status),
        }
    }
}
