//! Images and files in and out (P15): each provider gets media in its own
//! format, history holds blob references (never bytes), a model that cannot
//! read a kind gets a placeholder and the caller a notice, a large PDF goes
//! up in resumable chunks, blobs are the owner's alone, bounded, and deleted
//! with their session. Through gRPC, against the OpenAI and Anthropic fakes
//! on loopback.

use std::sync::Arc;
use std::time::Duration;

use agentrt_client::{ChatEvent, ChatOptions, Client, proto, sha256_hex};
use agentrt_server::ServerBuilder;
use agentrt_server::config::{MediaName, ProviderConfig, ProviderKind};
use agentrt_testkit::fake_anthropic::{self, FakeAnthropic};
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, text_chunk};
use agentrt_testkit::server::InProcessServer;
use agentrt_testkit::tcp_proxy::TcpProxy;
use base64::Engine as _;
use prost::Message as _;
use serde_json::Value;
use tonic::Code;
use tonic_types::StatusExt as _;

use super::harness::{base_config, mock_provider, with_keys};

const WAIT: Duration = Duration::from_secs(60);
const ALICE: &str = "alice-key-000001";
const BOB: &str = "bob-key-00000001";

fn answer(text: &str) -> FakeReply {
    FakeReply::sse(vec![text_chunk(text), finish_chunk("stop")])
}

fn anthropic_answer(text: &str) -> FakeReply {
    fake_anthropic::stream(vec![
        fake_anthropic::message_start(10, 0),
        fake_anthropic::text_start(0),
        fake_anthropic::text_delta(0, text),
        fake_anthropic::block_stop(0),
        fake_anthropic::message_delta("end_turn", 3),
        fake_anthropic::message_stop(),
    ])
}

/// A PNG of `size` bytes: the signature, then filler (the server checks
/// the signature; no model here decodes it).
fn png(size: usize) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    bytes.extend((0..size - 8).map(|i| (i % 251) as u8));
    bytes
}

/// A "PDF" of `size` bytes.
fn pdf(size: usize) -> Vec<u8> {
    let mut bytes = b"%PDF-1.7\n".to_vec();
    bytes.extend((0..size - 9).map(|i| (i * 7 % 253) as u8));
    bytes
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `mock` (OpenAI-compatible: `vision` reads images, `text-only` nothing)
/// and `claude` (Anthropic: images and PDFs), alice and bob with keys.
fn config(
    dir: &std::path::Path,
    openai: &FakeOpenAi,
    anthropic: &FakeAnthropic,
) -> agentrt_server::Config {
    let mut config = with_keys(base_config(dir), &[(ALICE, "alice"), (BOB, "bob")]);
    config.default_model = "mock/vision".into();
    config.providers.push(ProviderConfig {
        model_reads: Some([("text-only".to_owned(), vec![])].into()),
        ..mock_provider(openai, None)
    });
    config.providers.push(ProviderConfig {
        name: "claude".into(),
        kind: ProviderKind::Anthropic,
        reads: Some(vec![MediaName::Image, MediaName::Pdf]),
        ..mock_provider(anthropic, None)
    });
    config
}

async fn client(server: &InProcessServer, key: &str) -> Client {
    Client::builder(server.url())
        .token(key)
        .connect()
        .await
        .unwrap()
}

async fn session(client: &Client) -> String {
    client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id
}

async fn run(client: &Client, session: &str, options: ChatOptions) -> agentrt_client::TurnSummary {
    let chat = client.chat(session, options).await.unwrap();
    tokio::time::timeout(WAIT, chat.finish())
        .await
        .expect("the turn ended")
        .unwrap()
}

fn notices(summary: &agentrt_client::TurnSummary) -> Vec<String> {
    summary
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::Notice { code, message } => Some(format!("{code}: {message}")),
            _ => None,
        })
        .collect()
}

/// The user message's content parts of an OpenAI request (the first user
/// message).
fn openai_user_parts(body: &Value) -> Vec<Value> {
    let user = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap();
    match &user["content"] {
        Value::Array(parts) => parts.clone(),
        text => vec![serde_json::json!({"type": "text", "text": text})],
    }
}

#[tokio::test]
async fn an_image_reaches_each_provider_its_way_and_history_holds_a_reference() {
    let openai = FakeOpenAi::start(vec![answer("a pattern"), answer("no image here")]).await;
    let anthropic = FakeAnthropic::start(vec![anthropic_answer("still a pattern")]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut builder = ServerBuilder::new(config(dir.path(), &openai, &anthropic));
    let local = agentrt_testkit::local_model::provider(|c| c.max_tokens = 8);
    if let Some(local) = local {
        builder = builder.model_provider("lm", Arc::new(local));
    }
    let has_local = agentrt_testkit::local_model::model_path().is_some();
    let server = InProcessServer::start(builder).await;
    let alice = client(&server, ALICE).await;
    let s = session(&alice).await;
    let image = png(300_000);

    // OpenAI: an image_url part with the bytes as a data URL.
    let first = run(
        &alice,
        &s,
        ChatOptions::new("what is this?").image("image/png", image.clone()),
    )
    .await;
    assert_eq!(first.outcome, Some(proto::TurnOutcome::Success));
    assert!(notices(&first).is_empty(), "{:?}", notices(&first));
    let parts = openai_user_parts(&openai.requests()[0].body);
    assert_eq!(parts[0]["text"], "what is this?");
    assert_eq!(
        parts[1]["image_url"]["url"],
        format!("data:image/png;base64,{}", b64(&image))
    );

    // History: one reference, and a page that does not carry the bytes.
    let page = alice
        .sessions_raw()
        .get_history(authed(
            proto::GetHistoryRequest {
                session_id: s.clone(),
                ..Default::default()
            },
            ALICE,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(
        page.encoded_len() < 4_096,
        "{} bytes of history",
        page.encoded_len()
    );
    let Some(proto::content_block::Block::Image(stored)) = &page.messages[0].content[1].block
    else {
        panic!("{:?}", page.messages[0])
    };
    assert_eq!(stored.blob_id, sha256_hex(&image));
    assert_eq!((stored.size, stored.data.len()), (image.len() as u64, 0));
    let (_, read) = alice.get_blob(&s, &stored.blob_id).await.unwrap();
    assert!(read == image, "GetBlob returns the bytes sent");

    // Anthropic, a later turn: the earlier image as an image block.
    let second = run(&alice, &s, ChatOptions::new("and now?").model("claude/c")).await;
    assert_eq!(second.outcome, Some(proto::TurnOutcome::Success));
    let body = &anthropic.requests()[0].body;
    let block = &body["messages"][0]["content"][1];
    assert_eq!(block["type"], "image");
    assert_eq!(block["source"]["media_type"], "image/png");
    assert_eq!(block["source"]["data"], b64(&image));

    // A text-only model: a placeholder, a notice, and the turn succeeds.
    let third = run(
        &alice,
        &s,
        ChatOptions::new("text only?").model("mock/text-only"),
    )
    .await;
    assert_eq!(third.outcome, Some(proto::TurnOutcome::Success));
    let told = notices(&third);
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].starts_with("MEDIA_NOT_SHOWN: mock/text-only cannot read an image"),
        "{told:?}"
    );
    let body = &openai.requests()[1].body;
    assert!(!body.to_string().contains("image_url"), "{body}");
    let parts = openai_user_parts(body);
    let text = parts[0]["text"].as_str().unwrap();
    assert!(
        text.contains("an image (image/png, 293 KB) was attached here; this model cannot read it"),
        "{text}"
    );

    // The local model reads no images either: it is told, and so is the
    // caller.
    if has_local {
        let local = run(&alice, &s, ChatOptions::new("and you?").model("lm/smollm2")).await;
        assert_eq!(local.outcome, Some(proto::TurnOutcome::Success));
        let told = notices(&local);
        assert!(
            told.len() == 1 && told[0].contains("lm/smollm2 cannot read an image"),
            "{told:?}"
        );
    }
    server.stop().await;
}

fn authed<T>(message: T, key: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    req
}

fn upload_message(
    session: &str,
    upload_id: &str,
    data: &[u8],
    offset: usize,
) -> proto::UploadBlobRequest {
    proto::UploadBlobRequest {
        session_id: session.to_owned(),
        upload_id: upload_id.to_owned(),
        size: data.len() as u64,
        sha256: sha256_hex(data),
        mime_type: "application/pdf".to_owned(),
        name: "report.pdf".to_owned(),
        write_offset: offset as u64,
        data: Vec::new(),
    }
}

fn chunk(data: &[u8]) -> proto::UploadBlobRequest {
    proto::UploadBlobRequest {
        data: data.to_vec(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_20_mib_pdf_upload_resumes_after_a_cut_and_reaches_anthropic_as_a_document() {
    const CHUNK: usize = 256 << 10;
    let openai = FakeOpenAi::start(vec![answer("unused")]).await;
    let anthropic = FakeAnthropic::start(vec![anthropic_answer("a long report")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server =
        InProcessServer::start(ServerBuilder::new(config(dir.path(), &openai, &anthropic))).await;
    let alice = client(&server, ALICE).await;
    let s = session(&alice).await;
    let doc = pdf(20 << 20);

    // Half of it through a proxy that is then cut.
    let proxy = TcpProxy::start(&server.addr().to_string()).await;
    let via_proxy = Client::builder(format!("http://{}", proxy.addr()))
        .token(ALICE)
        .connect()
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut stub = via_proxy.sessions_raw();
    let upload = tokio::spawn(async move {
        let messages =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
        stub.upload_blob(authed(messages, ALICE)).await
    });
    tx.send(upload_message(&s, "pdf-1", &doc, 0)).await.unwrap();
    let half = doc.len() / 2;
    for piece in doc[..half].chunks(CHUNK) {
        tx.send(chunk(piece)).await.unwrap();
    }
    // Wait until the server has committed most of what was sent (it
    // commits in parts of 1 MiB), then cut the connection mid-stream.
    let committed = tokio::time::timeout(WAIT, async {
        loop {
            let status = alice.upload_status(&s, "pdf-1", None).await.unwrap();
            if status.committed_size >= (half - (1 << 20)) as u64 {
                return status.committed_size;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the server commits the first half");
    proxy.cut();
    let cut = upload.await.unwrap();
    assert!(cut.is_err(), "the cut stream fails: {cut:?}");
    drop(tx);
    // Whatever arrived whole is committed; the rest is resumed from there.
    let status = alice.upload_status(&s, "pdf-1", None).await.unwrap();
    assert!(
        status.committed_size >= committed && status.committed_size <= half as u64,
        "{} committed of {half} sent",
        status.committed_size
    );
    assert!(status.blob.is_none());
    let offset = status.committed_size as usize;
    // Resuming elsewhere than the committed offset is refused.
    let mut sessions = alice.sessions_raw();
    let wrong = sessions
        .upload_blob(authed(
            futures::stream::iter([upload_message(&s, "pdf-1", &doc, 0)]),
            ALICE,
        ))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), Code::InvalidArgument, "{wrong:?}");
    assert_eq!(
        wrong.get_details_bad_request().unwrap().field_violations[0].field,
        "write_offset"
    );
    let rest: Vec<_> = std::iter::once(upload_message(&s, "pdf-1", &doc, offset))
        .chain(doc[offset..].chunks(CHUNK).map(chunk))
        .collect();
    let done = sessions
        .upload_blob(authed(futures::stream::iter(rest), ALICE))
        .await
        .unwrap()
        .into_inner();
    let blob = done.blob.expect("the upload completed");
    assert_eq!(blob.blob_id, sha256_hex(&doc));
    assert_eq!(
        (blob.size, blob.name.as_str()),
        (doc.len() as u64, "report.pdf")
    );

    // A Chat that refers to it: Anthropic gets a document block.
    let summary = run(
        &alice,
        &s,
        ChatOptions::new("summarise it")
            .model("claude/c")
            .blob(&blob),
    )
    .await;
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    let body = &anthropic.requests()[0].body;
    let block = &body["messages"][0]["content"][1];
    assert_eq!(block["type"], "document");
    assert_eq!(block["title"], "report.pdf");
    assert_eq!(block["source"]["media_type"], "application/pdf");
    assert!(block["source"]["data"] == b64(&doc), "the document's bytes");

    // GetBlob returns identical bytes; bob gets NOT_FOUND.
    let (read_ref, read) = alice.get_blob(&s, &blob.blob_id).await.unwrap();
    assert_eq!(read_ref, blob);
    assert!(read == doc, "GetBlob returns the uploaded bytes");
    let bob = client(&server, BOB).await;
    let err = bob.get_blob(&s, &blob.blob_id).await.unwrap_err();
    assert!(
        matches!(err, agentrt_client::Error::NotFound { .. }),
        "{err:?}"
    );
    let bobs = session(&bob).await;
    let err = bob.get_blob(&bobs, &blob.blob_id).await.unwrap_err();
    assert!(
        matches!(err, agentrt_client::Error::NotFound { .. }),
        "{err:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn blobs_go_with_their_session_are_bounded_per_user_and_inline_media_per_block() {
    let openai = FakeOpenAi::start(vec![answer("seen")]).await;
    let anthropic = FakeAnthropic::start(vec![anthropic_answer("unused")]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), &openai, &anthropic);
    config.blobs.quota_bytes = 1 << 20;
    config.blobs.max_inline_bytes = 300 << 10;
    let server = InProcessServer::start(ServerBuilder::new(config)).await;
    let alice = client(&server, ALICE).await;

    // Oversized inline media: INVALID_ARGUMENT naming the block and the
    // limit; nothing stored.
    let s = session(&alice).await;
    let refused = alice
        .chat(
            &s,
            ChatOptions::new("big").image("image/png", png(400 << 10)),
        )
        .await;
    let Err(err) = refused else {
        panic!("an oversized image was admitted")
    };
    let agentrt_client::Error::InvalidArgument { violations, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(violations[0].0, "content[1].image.data");
    assert!(violations[0].1.contains("307200"), "{violations:?}");
    assert!(alice.history(&s).await.unwrap().is_empty());

    // Within the quota: two sessions' media; deleting one session deletes
    // its blobs (the other's stay).
    let kept = session(&alice).await;
    let a = png(250 << 10);
    let b = pdf(250 << 10);
    run(
        &alice,
        &s,
        ChatOptions::new("a").image("image/png", a.clone()),
    )
    .await;
    run(
        &alice,
        &kept,
        ChatOptions::new("b").file("application/pdf", "b.pdf", b.clone()),
    )
    .await;
    let b_id = sha256_hex(&b);
    let uploaded = alice
        .upload_blob(&kept, "application/pdf", "c.pdf", &pdf(300 << 10))
        .await
        .unwrap();
    // Over the quota now: 800 KiB held, 300 KiB more asked.
    let err = alice
        .upload_blob(&kept, "application/pdf", "d.pdf", &pdf(301 << 10))
        .await
        .unwrap_err();
    let agentrt_client::Error::ResourceExhausted { status, .. } = &err else {
        panic!("{err:?}")
    };
    let failure = status.get_details_quota_failure().expect("a QuotaFailure");
    assert_eq!(failure.violations[0].subject, "blob_bytes", "{err:?}");
    // Deleting the first session frees its image.
    assert!(alice.delete_session(&s).await.unwrap());
    let a_gone = alice.get_blob(&kept, &sha256_hex(&a)).await.unwrap_err();
    assert!(matches!(a_gone, agentrt_client::Error::NotFound { .. }));
    alice
        .upload_blob(&kept, "application/pdf", "d.pdf", &pdf(301 << 10))
        .await
        .expect("room again once a session's blobs are gone");
    let (_, still) = alice.get_blob(&kept, &b_id).await.unwrap();
    assert!(still == b);
    // ListBlobs: what the kept session holds, in id order.
    let listed: Vec<String> = alice
        .list_blobs(&kept)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    let mut names = listed.clone();
    names.sort();
    assert_eq!(names, ["b.pdf", "c.pdf", "d.pdf"], "{listed:?}");
    assert_eq!(uploaded.kind(), proto::MediaKind::File);
    // The directory holds no bytes of the deleted session's image.
    let found = walk(&dir.path().join("blobs"))
        .into_iter()
        .any(|p| p.ends_with(sha256_hex(&a)));
    assert!(!found, "the deleted session's blob is gone from disk");
    server.stop().await;
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test]
async fn a_caller_tools_images_and_files_are_stored_shown_and_given_to_the_model() {
    use agentrt_testkit::fake_openai::sse_data;
    let call = serde_json::json!({"index": 0, "id": "call_1", "type": "function",
                                  "function": {"name": "camera", "arguments": "{}"}});
    let openai = FakeOpenAi::start(vec![
        FakeReply::sse(vec![
            sse_data(
                &serde_json::json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}),
            ),
            finish_chunk("tool_calls"),
        ]),
        answer("two pictures"),
    ])
    .await;
    let anthropic = FakeAnthropic::start(vec![anthropic_answer("unused")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server =
        InProcessServer::start(ServerBuilder::new(config(dir.path(), &openai, &anthropic))).await;
    let alice = client(&server, ALICE).await;
    let s = session(&alice).await;
    // One image uploaded first, one sent inline with the result.
    let big = png(200_000);
    let uploaded = alice
        .upload_blob(&s, "image/png", "big.png", &big)
        .await
        .unwrap();
    let small = png(2_000);

    let mut req = super::harness::text_request(&s, "take two pictures");
    req.extra_tools = vec![proto::ToolDefinition {
        name: "camera".into(),
        description: "takes a picture".into(),
        parameters_json_schema: r#"{"type":"object"}"#.into(),
    }];
    let mut chat = alice.chat_with(req).await.unwrap();
    let seen =
        super::harness::read_until(&mut chat, |e| matches!(e.kind, ChatEvent::ToolCall { .. }))
            .await;
    let turn_id = seen[0].turn_id.clone();
    let image = |data: Vec<u8>, blob_id: &str| proto::ContentBlock {
        block: Some(proto::content_block::Block::Image(proto::ImageBlock {
            data,
            mime_type: "image/png".into(),
            blob_id: blob_id.into(),
            ..Default::default()
        })),
    };
    // A bad block is refused naming it; nothing is delivered.
    let bad = alice
        .submit_tool_result_with_media(proto::SubmitToolResultRequest {
            session_id: s.clone(),
            turn_id: turn_id.clone(),
            call_id: "call_1".into(),
            content: "two pictures".into(),
            is_error: false,
            media: vec![image(b"<svg/>".to_vec(), "")],
        })
        .await
        .unwrap_err();
    let agentrt_client::Error::InvalidArgument { violations, .. } = &bad else {
        panic!("{bad:?}")
    };
    assert_eq!(violations[0].0, "media[0].image.data");
    alice
        .submit_tool_result_with_media(proto::SubmitToolResultRequest {
            session_id: s.clone(),
            turn_id: turn_id.clone(),
            call_id: "call_1".into(),
            content: "two pictures".into(),
            is_error: false,
            media: vec![
                image(small.clone(), ""),
                image(Vec::new(), &uploaded.blob_id),
            ],
        })
        .await
        .unwrap();
    let rest = tokio::time::timeout(WAIT, chat.finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest.outcome, Some(proto::TurnOutcome::Success));
    let shown: Vec<(String, u64, usize)> = rest
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::Image(i) => {
                let b = i.blob.as_ref().unwrap();
                Some((b.blob_id.clone(), b.size, i.data.len()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        shown,
        vec![
            (sha256_hex(&small), small.len() as u64, small.len()),
            (uploaded.blob_id.clone(), big.len() as u64, 0),
        ]
    );
    // The model got both after the tool message.
    let body = &openai.requests()[1].body;
    let last = body["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["role"], "user");
    let urls: Vec<&str> = last["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["image_url"]["url"].as_str())
        .collect();
    assert_eq!(
        urls,
        [
            format!("data:image/png;base64,{}", b64(&small)),
            format!("data:image/png;base64,{}", b64(&big)),
        ]
    );
    let history = alice.history(&s).await.unwrap();
    let Some(proto::content_block::Block::ToolResult(result)) = &history[2].content[0].block else {
        panic!("{:?}", history[2])
    };
    let ids: Vec<&str> = result.media.iter().map(|m| m.blob_id.as_str()).collect();
    assert_eq!(ids, [sha256_hex(&small), uploaded.blob_id.clone()]);
    server.stop().await;
}
