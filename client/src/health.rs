//! The server's standard gRPC health service (`grpc.health.v1.Health`):
//! the `readiness` and `liveness` services and the overall `""`
//! (docs/contract.md §7).

use futures::StreamExt as _;
use futures::stream::BoxStream;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::{Client, Error};

/// What a health service reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Serving: for `readiness`, turns are admitted.
    Serving,
    /// Not serving: for `readiness`, starting, draining, shutting down or
    /// the store is down.
    NotServing,
    /// The server does not know yet.
    Unknown,
    /// The server has no health service of that name.
    ServiceUnknown,
}

impl From<ServingStatus> for Health {
    fn from(s: ServingStatus) -> Self {
        match s {
            ServingStatus::Serving => Self::Serving,
            ServingStatus::NotServing => Self::NotServing,
            ServingStatus::Unknown => Self::Unknown,
            ServingStatus::ServiceUnknown => Self::ServiceUnknown,
        }
    }
}

impl Health {
    /// The status's name as the health protocol spells it (`SERVING`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Serving => "SERVING",
            Self::NotServing => "NOT_SERVING",
            Self::Unknown => "UNKNOWN",
            Self::ServiceUnknown => "SERVICE_UNKNOWN",
        }
    }
}

impl Client {
    /// What the health service `service` (`"readiness"`, `"liveness"`, or
    /// `""` for the server as a whole) reports now. A name the server does
    /// not serve answers [`Health::ServiceUnknown`].
    pub async fn health(&self, service: &str) -> Result<Health, Error> {
        let mut stub = self.health.clone();
        let req = HealthCheckRequest {
            service: service.to_owned(),
        };
        match self
            .call(None, req, |r| async move { stub.check(r).await })
            .await
        {
            Ok(r) => Ok(r.status().into()),
            Err(err) if err.code() == Some(tonic::Code::NotFound) => Ok(Health::ServiceUnknown),
            Err(err) => Err(err),
        }
    }

    /// The health of `service`: what it reports now, then each change,
    /// until the stream is dropped or the connection ends (no deadline).
    pub async fn watch_health(
        &self,
        service: &str,
    ) -> Result<BoxStream<'static, Result<Health, Error>>, Error> {
        let mut stub = self.health.clone();
        let req = tonic::Request::new(HealthCheckRequest {
            service: service.to_owned(),
        });
        let url = self.url.clone();
        let fail = move |status| Error::from_status(status, "", &url);
        let stream = stub.watch(req).await.map_err(&fail)?.into_inner();
        Ok(stream
            .map(move |item| item.map(|r| r.status().into()).map_err(&fail))
            .boxed())
    }
}
