//! Printing a turn's event stream, shared by `chat` and `watch`.

use std::io::Write as _;

use std::path::Path;

use agentrt_client::{ChatEvent, Client, EventStream, proto};
use futures::StreamExt as _;

use crate::failure::Failure;
use crate::output::Out;

/// What a streamed turn showed.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) events: usize,
    pub(crate) outcome: Option<proto::TurnOutcome>,
}

/// Prints a turn's events until it ends. A trailing status after
/// `turn_finished` was already reported by the events and is not an error
/// here; a failure before it is.
pub(crate) async fn stream(
    out: &Out,
    mut events: EventStream,
    watching: bool,
    save: Option<(&Client, &Path)>,
) -> Result<Seen, Failure> {
    let mut seen = Seen::default();
    while let Some(item) = events.next().await {
        match item {
            Ok(event) => {
                seen.events += 1;
                if let ChatEvent::TurnFinished { outcome, .. } = &event.kind {
                    seen.outcome = Some(*outcome);
                }
                out.event(&event);
                if let Some((client, dir)) = save {
                    let blob = match &event.kind {
                        ChatEvent::Image(i) => i.blob.as_ref(),
                        ChatEvent::File(f) => f.blob.as_ref(),
                        _ => None,
                    };
                    if let Some(blob) = blob {
                        let path =
                            super::blob::save_into(client, &event.session_id, blob, dir).await?;
                        out.saved(&path);
                    }
                }
            }
            Err(_) if seen.outcome.is_some() => {}
            Err(err) => {
                out.end_line();
                return Err(err.into());
            }
        }
    }
    if watching
        && seen
            .outcome
            .is_some_and(|o| o != proto::TurnOutcome::Success)
    {
        return Err(Failure::new(1, "the watched turn did not succeed"));
    }
    let _ = std::io::stdout().flush();
    Ok(seen)
}
