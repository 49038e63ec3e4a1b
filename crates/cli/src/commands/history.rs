//! The `history` and `turns` commands: a session's stored messages and its
//! turn records, all or one page.

use agentrt_client::{Client, proto};

use crate::args::{HistoryArgs, TurnsArgs};
use crate::failure::Outcome;
use crate::output::Out;

pub(crate) async fn history(client: &Client, out: &Out, args: HistoryArgs) -> Outcome {
    let HistoryArgs {
        session,
        limit,
        after_seq,
        no_compacted,
    } = args;
    let mut messages = Vec::new();
    let mut page_token = String::new();
    let next = loop {
        let page = client
            .history_page(proto::GetHistoryRequest {
                session_id: session.clone(),
                after_seq,
                page_size: limit.unwrap_or(1_000),
                include_compacted: !no_compacted,
                page_token: std::mem::take(&mut page_token),
            })
            .await?;
        messages.extend(page.messages);
        if limit.is_some() || page.next_page_token.is_empty() {
            break page.next_page_token;
        }
        page_token = page.next_page_token;
    };
    out.history(&session, &messages, &next);
    Ok(())
}

pub(crate) async fn turns(client: &Client, out: &Out, args: TurnsArgs) -> Outcome {
    let TurnsArgs {
        session,
        limit,
        mut page_token,
    } = args;
    let mut turns = Vec::new();
    let next = loop {
        let page = client
            .list_turns(proto::ListTurnsRequest {
                session_id: session.clone(),
                page_size: limit.unwrap_or(500),
                page_token: std::mem::take(&mut page_token),
            })
            .await?;
        turns.extend(page.turns);
        if limit.is_some() || page.next_page_token.is_empty() {
            break page.next_page_token;
        }
        page_token = page.next_page_token;
    };
    out.turns(&session, &turns, &next);
    Ok(())
}
