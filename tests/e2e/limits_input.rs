//! Bounds on what one request may cost: pages cut by bytes so clients with
//! gRPC's default 4 MiB receive limit read everything, errors that stay
//! small however much is wrong, bounded tool declarations, checked images
//! and bounded strings. Everything goes through gRPC with the generated
//! clients on their defaults.

use std::collections::BTreeMap;

use agentrt_client::{Client, proto};
use prost::Message as _;
use tonic::{Code, Status};
use tonic_types::StatusExt as _;

use super::harness::{Providers, TestServer, base_config, message_text, new_session, text_request};

/// gRPC's default receive limit, which the generated clients keep.
const DEFAULT_RECEIVE_LIMIT: usize = 4 << 20;

fn violations(status: &Status) -> Vec<(String, String)> {
    let bad = status
        .get_error_details()
        .bad_request()
        .cloned()
        .unwrap_or_else(|| panic!("no BadRequest in {status:?}"));
    bad.field_violations
        .into_iter()
        .map(|v| (v.field, v.description))
        .collect()
}

/// The status of a refused Chat.
async fn refused_chat(client: &Client, req: proto::ChatRequest) -> Status {
    match client.runtime_raw().chat(req).await {
        Ok(_) => panic!("the Chat was admitted"),
        Err(status) => status,
    }
}

/// Asserts `status` is INVALID_ARGUMENT naming `field` with `needle` in its
/// description.
fn assert_names(status: &Status, field: &str, needle: &str) {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let v = violations(status);
    assert!(
        v.iter().any(|(f, d)| f == field && d.contains(needle)),
        "no violation of {field} mentioning {needle:?}: {v:?}"
    );
    assert!(
        status.message().len() < 4096,
        "{} bytes",
        status.message().len()
    );
}

/// Nothing of a refused Chat was stored.
async fn assert_untouched(client: &Client, session: &str) {
    assert!(client.history(session).await.unwrap().is_empty());
    let s = client.get_session(session).await.unwrap();
    assert_eq!((s.message_count, s.last_turn), (0, None));
}

fn image(data: &[u8], mime_type: &str) -> proto::ContentBlock {
    proto::ContentBlock {
        block: Some(proto::content_block::Block::Image(proto::ImageBlock {
            data: data.to_vec(),
            mime_type: mime_type.to_owned(),
            ..proto::ImageBlock::default()
        })),
    }
}

fn tool(name: &str, schema: String) -> proto::ToolDefinition {
    proto::ToolDefinition {
        name: name.to_owned(),
        description: String::new(),
        parameters_json_schema: schema,
    }
}

#[tokio::test]
async fn a_history_beyond_4_mib_is_read_page_by_page_with_the_default_receive_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(dir.path());
    // The whole history stays visible: no compaction.
    config.compaction.max_tokens = 1 << 40;
    let server = TestServer::start_with(config, &Providers::default()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    // Six turns of 700 kB each: twelve messages, about 8.4 MB, while the
    // default page (100 messages) used to be one response.
    let mut sent = Vec::new();
    for i in 0..6 {
        let text = format!("{i}{}", char::from(b'a' + i).to_string().repeat(700_000));
        client
            .chat(&session, &text)
            .await
            .unwrap()
            .finish()
            .await
            .unwrap();
        sent.push(text);
    }
    let mut sessions = client.sessions_raw();
    let (mut token, mut seqs, mut texts, mut pages, mut largest) =
        (String::new(), Vec::new(), Vec::new(), 0, 0);
    loop {
        let page = sessions
            .get_history(proto::GetHistoryRequest {
                session_id: session.clone(),
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("page {pages}: {s:?}"))
            .into_inner();
        pages += 1;
        largest = largest.max(page.encoded_len());
        assert!(!page.messages.is_empty() || page.next_page_token.is_empty());
        seqs.extend(page.messages.iter().map(|m| m.seq));
        texts.extend(page.messages.iter().map(message_text));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seqs, (1..=12).collect::<Vec<u64>>(), "{pages} pages");
    for (i, text) in sent.iter().enumerate() {
        assert_eq!(&texts[2 * i], text);
        assert_eq!(texts[2 * i + 1], format!("You said: {text}"));
    }
    assert!(pages >= 3, "{pages} pages");
    assert!(
        largest <= DEFAULT_RECEIVE_LIMIT / 2,
        "a page of {largest} bytes"
    );
    eprintln!("history: {pages} pages, largest {largest} bytes");
    server.stop().await;
}

#[tokio::test]
async fn a_listing_beyond_4_mib_is_read_page_by_page_with_the_default_receive_limit() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    // 30 sessions of about 190 kB (title, system prompt, metadata near their
    // 64 KiB limits): 5.7 MB, while the default page (50) was one response.
    let mut created = Vec::new();
    for i in 0..30u8 {
        let fill = |c: u8| char::from(c).to_string().repeat(64_000);
        let metadata: BTreeMap<String, String> = (0..10)
            .map(|k| (format!("k{k}"), "m".repeat(6_000)))
            .collect();
        let s = client
            .create_session(proto::CreateSessionRequest {
                title: format!("{i}{}", fill(b't')),
                system_prompt: fill(b'p'),
                metadata: metadata.into_iter().collect(),
                ..Default::default()
            })
            .await
            .unwrap();
        created.push(s.session_id);
    }
    let mut sessions = client.sessions_raw();
    let (mut token, mut listed, mut pages, mut largest) = (String::new(), Vec::new(), 0, 0);
    loop {
        let page = sessions
            .list_sessions(proto::ListSessionsRequest {
                page_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("page {pages}: {s:?}"))
            .into_inner();
        pages += 1;
        largest = largest.max(page.encoded_len());
        listed.extend(page.sessions.into_iter().map(|s| s.session_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    created.reverse(); // newest activity first
    assert_eq!(listed, created, "{pages} pages");
    assert!(pages >= 3, "{pages} pages");
    assert!(
        largest <= DEFAULT_RECEIVE_LIMIT / 2,
        "a page of {largest} bytes"
    );
    eprintln!("listing: {pages} pages, largest {largest} bytes");
    server.stop().await;
}

#[tokio::test]
async fn a_hundred_thousand_bad_blocks_get_a_small_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let mut req = text_request(&session, "hi");
    req.content = vec![image(b"", "x"); 100_000];
    let status = refused_chat(&client, req).await;
    assert_names(&status, "content", "limit is 256 blocks");
    let trailer = status.details().len() + status.message().len();
    assert!(trailer < 1024, "trailer of {trailer} bytes");
    eprintln!("100k bad blocks: trailer {trailer} bytes");

    // Under the block limit, with every block wrong: the error lists the
    // first ones (at most ten, within the BadRequest's byte budget) and
    // counts the rest.
    let mut req = text_request(&session, "hi");
    req.content = vec![image(b"<svg/>", "image/svg+xml\r\n"); 256];
    let status = refused_chat(&client, req).await;
    assert_eq!(status.code(), Code::InvalidArgument);
    let v = violations(&status);
    let listed = v.len() - 1;
    assert!((1..=10).contains(&listed), "{v:?}");
    assert!(
        v[listed].1.contains(&format!("{} more", 256 - listed)),
        "{v:?}"
    );
    let trailer = status.details().len() + status.message().len();
    assert!(trailer < 8 << 10, "trailer of {trailer} bytes");
    eprintln!("256 bad blocks: trailer {trailer} bytes");
    assert_untouched(&client, &session).await;
    server.stop().await;
}

#[tokio::test]
async fn oversized_or_too_many_extra_tools_are_refused_before_anything_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let schema = |pad: usize| format!(r#"{{"type":"object","description":"{}"}}"#, "d".repeat(pad));

    let mut big = text_request(&session, "hi");
    big.extra_tools = vec![tool("small", schema(10)), tool("big", schema(17_000))];
    let status = refused_chat(&client, big).await;
    assert_names(
        &status,
        "extra_tools[1].parameters_json_schema",
        "limit is 16384",
    );

    let mut total = text_request(&session, "hi");
    total.extra_tools = (0..20)
        .map(|i| tool(&format!("t{i}"), schema(15_000)))
        .collect();
    let status = refused_chat(&client, total).await;
    assert_names(&status, "extra_tools", "limit is 262144");

    let mut many = text_request(&session, "hi");
    many.extra_tools = (0..129)
        .map(|i| tool(&format!("t{i}"), schema(1)))
        .collect();
    let status = refused_chat(&client, many).await;
    assert_names(&status, "extra_tools", "limit is 128");

    let mut deep = text_request(&session, "hi");
    let nested = format!(
        r#"{{"type":"object","default":{}0{}}}"#,
        "[".repeat(40),
        "]".repeat(40)
    );
    deep.extra_tools = vec![tool("deep", nested)];
    let status = refused_chat(&client, deep).await;
    assert_names(
        &status,
        "extra_tools[0].parameters_json_schema",
        "32 levels",
    );

    assert_untouched(&client, &session).await;
    // Declarations within the limits still work.
    let mut fine = text_request(&session, "hi");
    fine.extra_tools = vec![tool("fine", schema(15_000))];
    client
        .chat_with(fine)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    server.stop().await;
}

#[tokio::test]
async fn image_blocks_must_be_an_accepted_type_whose_bytes_match() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01";

    let with = |block: proto::ContentBlock| {
        let mut req = text_request(&session, "look");
        req.content.push(block);
        req
    };
    let svg = refused_chat(&client, with(image(b"<svg onload=x/>", "image/svg+xml"))).await;
    assert_names(&svg, "content[1].image.mime_type", "image/png, image/jpeg");

    let crlf = refused_chat(&client, with(image(png, "image/png\r\nX-Injected: 1"))).await;
    assert_names(
        &crlf,
        "content[1].image.mime_type",
        "not an accepted image type",
    );
    let echoed = format!("{} {:?}", crlf.message(), violations(&crlf));
    assert!(!crlf.message().contains(['\r', '\n']), "{echoed}");
    assert!(
        violations(&crlf)
            .iter()
            .all(|(_, d)| !d.contains(['\r', '\n']))
    );

    let long = refused_chat(&client, with(image(png, &"image/".repeat(10_000)))).await;
    assert!(
        long.message().len() < 1024,
        "{} bytes",
        long.message().len()
    );

    let disguised = refused_chat(&client, with(image(b"<svg/>", "image/png"))).await;
    assert_names(
        &disguised,
        "content[1].image.data",
        "does not match mime_type image/png",
    );
    assert_untouched(&client, &session).await;

    client
        .chat_with(with(image(png, "image/png")))
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(client.history(&session).await.unwrap().len(), 2);
    server.stop().await;
}

#[tokio::test]
async fn oversized_strings_are_refused_naming_the_field_and_nothing_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    // A 3 MiB model override of a provider that serves any model name.
    let mut req = text_request(&session, "hi");
    req.model = format!("gate/{}", "m".repeat(3 << 20));
    let status = refused_chat(&client, req).await;
    assert_names(&status, "model", "the limit is 256");

    let mut req = text_request(&session, "hi");
    req.excluded_tools = vec!["x".repeat(100_000)];
    let status = refused_chat(&client, req).await;
    assert_names(&status, "excluded_tools[0]", "the limit is 256");
    assert_untouched(&client, &session).await;

    let huge = "a".repeat(1 << 20);
    let mut sessions = client.sessions_raw();
    let status = sessions
        .create_session(proto::CreateSessionRequest {
            agent_id: huge.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_names(&status, "agent_id", "the limit is 256");
    let status = sessions
        .list_sessions(proto::ListSessionsRequest {
            agent_id: huge.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_names(&status, "agent_id", "the limit is 256");
    let status = sessions
        .list_sessions(proto::ListSessionsRequest {
            page_token: huge.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_names(&status, "page_token", "ListSessions");
    let status = sessions
        .get_history(proto::GetHistoryRequest {
            session_id: session.clone(),
            page_token: "9".repeat(100_000),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_names(&status, "page_token", "GetHistory");
    let status = sessions
        .update_session(proto::UpdateSessionRequest {
            session_id: session.clone(),
            model: Some(format!("gate/{huge}")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_names(&status, "model", "the limit is 256");
    let status = client
        .runtime_raw()
        .submit_tool_result(proto::SubmitToolResultRequest {
            session_id: session.clone(),
            turn_id: "t".into(),
            call_id: huge.clone(),
            content: "r".into(),
            is_error: false,
            media: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_names(&status, "call_id", "the limit is 256");
    assert_eq!(client.get_session(&session).await.unwrap().model, "");
    assert_untouched(&client, &session).await;
    server.stop().await;
}
