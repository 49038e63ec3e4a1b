//! The `admin` commands: the operator calls.

use agentrt_client::Client;

use crate::args::AdminCommand;
use crate::failure::Outcome;
use crate::output::Out;

pub(crate) async fn admin(client: &Client, out: &Out, cmd: AdminCommand) -> Outcome {
    match cmd {
        AdminCommand::Stats => out.stats(&client.runtime_stats().await?),
        AdminCommand::Drain { timeout } => out.drained(client.drain(timeout).await?),
        AdminCommand::Undrain => out.undrained(client.undrain().await?),
        AdminCommand::SetDefaultModel { model, thinking } => {
            let previous = client
                .set_default_model(&model, thinking.map(Into::into))
                .await?;
            out.default_model(&model, &previous);
        }
        AdminCommand::Invalidate => out.invalidated(client.invalidate_runners().await?),
        AdminCommand::Reset { user } => out.reset(client.reset_runners(&user).await?),
        AdminCommand::Usage { user } => out.user_usage(&client.user_usage(&user).await?),
        AdminCommand::Replicas {
            limit,
            mut page_token,
        } => {
            let mut leases = Vec::new();
            // Every page lists every replica: the last page's are the
            // freshest.
            let (replicas, next) = loop {
                let page = client
                    .list_replicas(limit.unwrap_or(1_000), &std::mem::take(&mut page_token))
                    .await?;
                leases.extend(page.leases);
                if limit.is_some() || page.next_page_token.is_empty() {
                    break (page.replicas, page.next_page_token);
                }
                page_token = page.next_page_token;
            };
            out.replicas(&replicas, &leases, &next);
        }
    }
    Ok(())
}
