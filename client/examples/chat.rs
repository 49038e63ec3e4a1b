//! Creates a session on a running agentrt server and streams one turn.
//!
//! ```sh
//! cargo run -p agentrt-server &                       # the server, on its defaults
//! cargo run -p agentrt-client --example chat -- "Hello there"
//! ```
//!
//! `AGENTRT_URL` (default `http://127.0.0.1:50051`) and `AGENTRT_TOKEN`
//! (optional bearer key) select the server. The turn continues on the
//! server if the connection drops, and the stream resumes where it was.

use std::time::Duration;

use agentrt_client::{ChatEvent, ChatOptions, Client, OnDisconnect, proto};
use futures::StreamExt as _;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("AGENTRT_URL").unwrap_or_else(|_| "http://127.0.0.1:50051".to_owned());
    let text = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let text = if text.is_empty() {
        "Hello, agentrt".to_owned()
    } else {
        text
    };

    let mut builder = Client::builder(url);
    if let Ok(token) = std::env::var("AGENTRT_TOKEN") {
        builder = builder.token(token);
    }
    let client = builder.connect().await?;
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await?;
    println!("session {}", session.session_id);

    let options = ChatOptions::new(text)
        .timeout(Duration::from_secs(120))
        .on_disconnect(OnDisconnect::Continue);
    let mut events = client.chat(&session.session_id, options).await?;
    while let Some(event) = events.next().await {
        match event?.kind {
            ChatEvent::Text(delta) => print!("{delta}"),
            ChatEvent::TurnFinished { outcome, usage, .. } => {
                println!(
                    "\n[{} · {} output tokens]",
                    outcome.as_str_name(),
                    usage.output_tokens
                );
            }
            _ => {}
        }
    }
    for message in client.history(&session.session_id).await? {
        println!("#{} {:?}", message.seq, message.role());
    }
    Ok(())
}
