//! The `sessions` commands: create, list, get, update and delete.

use agentrt_client::{Client, proto};

use crate::args::{CreateArgs, ListArgs, SessionsCommand};
use crate::failure::{Failure, Outcome};
use crate::output::Out;

pub(crate) async fn sessions(client: &Client, out: &Out, cmd: SessionsCommand) -> Outcome {
    match cmd {
        SessionsCommand::Create(CreateArgs {
            id,
            title,
            model,
            system,
            agent,
        }) => {
            let s = client
                .create_session(proto::CreateSessionRequest {
                    session_id: id.unwrap_or_default(),
                    title,
                    model,
                    system_prompt: system,
                    agent_id: agent,
                    ..Default::default()
                })
                .await?;
            out.session_id(&s);
        }
        SessionsCommand::List(ListArgs { all, agent, parent }) => {
            let mut token = String::new();
            let mut sessions = Vec::new();
            loop {
                let page = client
                    .list_sessions(proto::ListSessionsRequest {
                        page_token: std::mem::take(&mut token),
                        include_archived: all,
                        agent_id: agent.clone().unwrap_or_default(),
                        parent_session_id: parent.clone().unwrap_or_default(),
                        ..Default::default()
                    })
                    .await?;
                sessions.extend(page.sessions);
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            out.sessions(&sessions);
        }
        SessionsCommand::Get { session } => {
            let s = client.get_session(&session).await?;
            out.session(&s);
        }
        SessionsCommand::Update {
            session,
            title,
            model,
            system,
            archived,
        } => {
            let s = client
                .update_session(proto::UpdateSessionRequest {
                    session_id: session,
                    title,
                    model,
                    system_prompt: system,
                    archived,
                    ..Default::default()
                })
                .await?;
            out.session(&s);
        }
        SessionsCommand::Delete { session } => {
            let deleted = client.delete_session(&session).await?;
            out.deleted(&session, deleted);
            if !deleted {
                return Err(Failure::new(4, format!("no session {session}")));
            }
        }
    }
    Ok(())
}
