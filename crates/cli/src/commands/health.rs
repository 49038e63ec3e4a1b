//! The `health` and `version` commands.

use std::time::Duration;

use agentrt_client::{Client, Health};
use futures::StreamExt as _;

use crate::failure::{Failure, Outcome};
use crate::output::Out;

/// The services `health` asks by default.
const SERVICES: [&str; 3] = ["readiness", "liveness", ""];

pub(crate) async fn health(
    client: &Client,
    out: &Out,
    service: Option<String>,
    wait: Option<Duration>,
) -> Outcome {
    let services: Vec<String> = match service {
        Some(s) => vec![s],
        None => SERVICES.iter().map(|s| (*s).to_owned()).collect(),
    };
    let mut reports = Vec::new();
    for name in &services {
        let health = match wait {
            Some(limit) => serving_within(client, name, limit).await?,
            None => client.health(name).await?,
        };
        reports.push((name.clone(), health));
    }
    out.health(&reports);
    match reports.iter().find(|(_, h)| *h != Health::Serving) {
        None => Ok(()),
        Some((name, h)) => {
            let name = if name.is_empty() { "the server" } else { name };
            let waited = wait.map_or(String::new(), |w| {
                format!(" after waiting {}", humantime(w))
            });
            Err(Failure::new(
                10,
                format!("{name} is {}{waited}", h.as_str()),
            ))
        }
    }
}

/// Follows `service` until it is SERVING or `limit` has passed; what it
/// reported last.
async fn serving_within(
    client: &Client,
    service: &str,
    limit: Duration,
) -> Result<Health, Failure> {
    let mut updates = client.watch_health(service).await?;
    let mut last = Health::Unknown;
    let watched = tokio::time::timeout(limit, async {
        while let Some(update) = updates.next().await {
            last = update?;
            if last == Health::Serving || last == Health::ServiceUnknown {
                break;
            }
        }
        Ok::<_, agentrt_client::Error>(())
    })
    .await;
    match watched {
        Ok(Err(err)) => Err(err.into()),
        Ok(Ok(())) | Err(_) => Ok(last),
    }
}

fn humantime(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

pub(crate) async fn version(client: &Client, out: &Out) -> Outcome {
    match client.runtime_stats().await {
        Ok(stats) => out.version(Some(&stats.version), None),
        Err(agentrt_client::Error::PermissionDenied { .. }) => {
            out.version(
                None,
                Some("the server tells its version to admin principals only"),
            );
        }
        Err(err) => return Err(err.into()),
    }
    Ok(())
}
