//! `agentrt.v1.SessionService`: thin handlers (authenticate → convert → call
//! the core → map the error).

use agentrt_proto::v1 as pb;
use agentrt_proto::v1::session_service_server::SessionService;
use std::pin::Pin;

use agentrt_runtime::runtime::{BlobRead, UploadStart, UploadStatus};
use agentrt_runtime::{Runtime, RuntimeError};
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt as _};
use tonic::{Request, Response, Status, Streaming};

use crate::call::Call;
use crate::convert;
use crate::status::from_runtime;

/// The `SessionService` implementation.
#[derive(Debug, Clone)]
pub struct SessionServiceHandler {
    runtime: Runtime,
}

impl SessionServiceHandler {
    /// Serves sessions of `runtime`.
    pub fn new(runtime: Runtime) -> Self {
        Self { runtime }
    }
}

#[tonic::async_trait]
impl SessionService for SessionServiceHandler {
    async fn create_session(
        &self,
        req: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let (call, r) = Call::open(req)?;
        let new = convert::new_session(r).map_err(from_runtime)?;
        let session = self
            .runtime
            .create_session(&call.who, new)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(convert::session_to_pb(session)))
    }

    async fn get_session(
        &self,
        req: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let (call, r) = Call::open(req)?;
        let id = r.session_id;
        call.session(&id);
        let session = self
            .runtime
            .get_session(&call.who, &id)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(convert::session_to_pb(session)))
    }

    async fn list_sessions(
        &self,
        req: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let page = self
            .runtime
            .list_sessions(
                &call.who,
                r.page_size as usize,
                &r.page_token,
                Some(r.agent_id),
                Some(r.parent_session_id),
                r.include_archived,
            )
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::ListSessionsResponse {
            sessions: page
                .sessions
                .into_iter()
                .map(convert::session_to_pb)
                .collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn update_session(
        &self,
        req: Request<pb::UpdateSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let (call, r) = Call::open(req)?;
        let id = r.session_id.clone();
        call.session(&id);
        let update = convert::session_update(r).map_err(from_runtime)?;
        let session = self
            .runtime
            .update_session(&call.who, &id, update)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(convert::session_to_pb(session)))
    }

    async fn delete_session(
        &self,
        req: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let id = r.session_id;
        call.session(&id);
        let deleted = self
            .runtime
            .delete_session(&call.who, &id)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::DeleteSessionResponse { deleted }))
    }

    async fn get_history(
        &self,
        req: Request<pb::GetHistoryRequest>,
    ) -> Result<Response<pb::GetHistoryResponse>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        let page = self
            .runtime
            .history(
                &call.who,
                &r.session_id,
                r.after_seq,
                r.page_size as usize,
                &r.page_token,
                r.include_compacted,
            )
            .await
            .map_err(from_runtime)?;
        let last_seq = page.messages.last().map_or(r.after_seq, |m| m.seq);
        Ok(Response::new(pb::GetHistoryResponse {
            messages: page
                .messages
                .into_iter()
                .map(convert::message_to_pb)
                .collect(),
            next_page_token: page.next_page_token,
            last_seq,
        }))
    }

    async fn list_turns(
        &self,
        req: Request<pb::ListTurnsRequest>,
    ) -> Result<Response<pb::ListTurnsResponse>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        let page = self
            .runtime
            .list_turns(
                &call.who,
                &r.session_id,
                r.page_size as usize,
                &r.page_token,
            )
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::ListTurnsResponse {
            turns: page.turns.into_iter().map(convert::turn_to_pb).collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn get_turn(
        &self,
        req: Request<pb::GetTurnRequest>,
    ) -> Result<Response<pb::Turn>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        let turn = self
            .runtime
            .turn_record(&call.who, &r.session_id, &r.turn_id)
            .await
            .map_err(from_runtime)?;
        let turn = turn.ok_or_else(|| {
            Status::not_found("the session has no turn with this turn_id (ListTurns lists them)")
        })?;
        Ok(Response::new(convert::turn_to_pb(turn)))
    }

    async fn upload_blob(
        &self,
        req: Request<Streaming<pb::UploadBlobRequest>>,
    ) -> Result<Response<pb::UploadBlobResponse>, Status> {
        let (call, mut messages) = Call::open(req)?;
        let first = messages.message().await?.ok_or_else(|| {
            Status::invalid_argument(
                "the upload stream is empty: its first message names the session and the upload",
            )
        })?;
        call.session(&first.session_id);
        let start = UploadStart {
            session_id: first.session_id,
            upload_id: first.upload_id,
            size: first.size,
            sha256: first.sha256,
            mime_type: first.mime_type,
            name: first.name,
            write_offset: first.write_offset,
        };
        let head = futures::stream::iter([Ok(Bytes::from(first.data))]);
        let rest = messages.map(|m| match m {
            Ok(m) => Ok(Bytes::from(m.data)),
            Err(status) => {
                tracing::debug!(%status, "an upload stream broke");
                Err(RuntimeError::Unavailable(
                    "the upload stream broke; what arrived is committed",
                ))
            }
        });
        let status = self
            .runtime
            .upload_blob(&call.who, start, head.chain(rest))
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(upload_response(status)))
    }

    async fn get_upload_status(
        &self,
        req: Request<pb::GetUploadStatusRequest>,
    ) -> Result<Response<pb::GetUploadStatusResponse>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        let sha256 = (!r.sha256.is_empty()).then_some(r.sha256.as_str());
        let status = self
            .runtime
            .upload_status(&call.who, &r.session_id, &r.upload_id, sha256)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::GetUploadStatusResponse {
            committed_size: status.committed,
            blob: status.blob.map(convert::blob_ref),
        }))
    }

    async fn list_blobs(
        &self,
        req: Request<pb::ListBlobsRequest>,
    ) -> Result<Response<pb::ListBlobsResponse>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        let (blobs, next_page_token) = self
            .runtime
            .list_blobs(
                &call.who,
                &r.session_id,
                r.page_size as usize,
                &r.page_token,
            )
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::ListBlobsResponse {
            blobs: blobs.into_iter().map(convert::blob_ref).collect(),
            next_page_token,
        }))
    }

    type GetBlobStream = BlobChunks;

    async fn get_blob(
        &self,
        req: Request<pb::GetBlobRequest>,
    ) -> Result<Response<Self::GetBlobStream>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        let read = self
            .runtime
            .get_blob(&call.who, &r.session_id, &r.blob_id, r.read_offset)
            .await
            .map_err(from_runtime)?
            .ok_or_else(|| Status::not_found("the session holds no such blob"))?;
        Ok(Response::new(blob_chunks(read)))
    }
}

fn upload_response(status: UploadStatus) -> pb::UploadBlobResponse {
    pb::UploadBlobResponse {
        committed_size: status.committed,
        blob: status.blob.map(convert::blob_ref),
    }
}

/// A blob's bytes as `GetBlobResponse` chunks.
pub type BlobChunks = Pin<Box<dyn Stream<Item = Result<pb::GetBlobResponse, Status>> + Send>>;

/// Most bytes in one `GetBlobResponse` (the store's own chunks are gathered up
/// to this, so a large blob is not thousands of tiny messages).
const CHUNK_BYTES: usize = 256 << 10;

/// `read`'s bytes in chunks of up to [`CHUNK_BYTES`], the first carrying
/// the blob's reference (an empty read is that one chunk). A store failure
/// midway ends the stream `UNAVAILABLE`.
fn blob_chunks(read: BlobRead) -> BlobChunks {
    struct State {
        bytes: agentrt_runtime::blobs::BlobStream,
        blob: Option<pb::BlobRef>,
        buffered: BytesMut,
        ended: bool,
    }
    let state = State {
        bytes: read.bytes,
        blob: Some(convert::blob_ref(read.blob)),
        buffered: BytesMut::new(),
        ended: false,
    };
    Box::pin(futures::stream::unfold(state, |mut st| async move {
        while !st.ended && st.buffered.len() < CHUNK_BYTES {
            match st.bytes.next().await {
                Some(Ok(chunk)) => st.buffered.extend_from_slice(&chunk),
                Some(Err(e)) => {
                    tracing::error!(error = %e, "reading a blob failed");
                    st.ended = true;
                    st.buffered.clear();
                    st.blob = None;
                    let status = Status::unavailable(
                        "the blob store failed while reading; retry from read_offset",
                    );
                    return Some((Err(status), st));
                }
                None => st.ended = true,
            }
        }
        if st.buffered.is_empty() && st.blob.is_none() {
            return None;
        }
        let take = st.buffered.len().min(CHUNK_BYTES);
        let data = st.buffered.split_to(take).to_vec();
        let chunk = pb::GetBlobResponse {
            blob: st.blob.take(),
            data,
        };
        Some((Ok(chunk), st))
    }))
}

#[cfg(test)]
mod tests {
    use agentrt_runtime::store::{MemoryStore, Store as _, message_wire_bytes, session_wire_bytes};
    use agentrt_runtime::types::{
        ContentBlock, LastTurn, MediaKind, MediaRef, Message, NewMessage, NewSession, Role,
        StopReason, TurnStatus, Usage,
    };
    use prost::Message as _;

    use crate::convert;

    /// The page budget relies on the store's estimate never being below
    /// the real protobuf encoding (plus the page's framing of the element).
    #[tokio::test]
    async fn wire_size_estimates_are_upper_bounds_of_the_encoding() {
        let framed = |len: usize| len + 1 + prost::length_delimiter_len(len);
        let media = |kind| MediaRef {
            kind,
            blob_id: "f".repeat(64),
            mime_type: "application/vnd.openxmlformats-officedocument".into(),
            size: u64::MAX,
            name: "n".repeat(255),
        };
        let blocks = vec![
            ContentBlock::text("hello"),
            ContentBlock::text("x".repeat(300_000)),
            ContentBlock::Thinking {
                thinking: "t".repeat(200),
                signature: "sig".into(),
            },
            ContentBlock::Image {
                data: vec![0xff; 70_000],
                mime_type: "image/jpeg".into(),
            },
            ContentBlock::ToolCall {
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments_json: r#"{"city":"Oslo"}"#.into(),
            },
            ContentBlock::ToolResult {
                call_id: "call_1".into(),
                name: "get_weather".into(),
                content: "sunny".repeat(1000),
                is_error: true,
                interrupted: Some(agentrt_runtime::types::Interrupted::OutcomeUnknown),
                media: vec![media(MediaKind::Image), media(MediaKind::File)],
            },
            ContentBlock::Media(media(MediaKind::File)),
            ContentBlock::Media(media(MediaKind::Image)),
            ContentBlock::File {
                data: vec![b'%'; 1000],
                mime_type: "application/pdf".into(),
                name: "n".repeat(255),
            },
            ContentBlock::text(""),
        ];
        for content in [vec![], blocks.clone(), blocks[..1].to_vec()] {
            let mut body = NewMessage::new("turn-1", Role::Assistant, content);
            body.model = Some("mock/some-model-with-a-long-name".into());
            body.usage = Some(Usage {
                input_tokens: u64::MAX,
                output_tokens: u64::MAX,
                reasoning_tokens: u64::MAX,
                cached_input_tokens: u64::MAX,
            });
            body.stop_reason = Some(StopReason::ClientGone);
            let message = Message {
                seq: u64::MAX,
                body,
                compacted: true,
            };
            let estimate = message_wire_bytes(&message);
            let real = framed(convert::message_to_pb(message).encoded_len());
            assert!(estimate >= real, "message: estimate {estimate} < {real}");
        }

        let store = MemoryStore::new();
        let new = NewSession {
            id: Some("s".repeat(128)),
            owner: "alice".into(),
            agent_id: "a".repeat(256),
            project_id: "p".repeat(256),
            title: "t".repeat(65_536),
            system_prompt: "s".repeat(65_536),
            metadata: (0..64)
                .map(|i| (format!("key-{i}"), "v".repeat(1000)))
                .collect(),
            ..NewSession::default()
        };
        let created = store.create_session(new).await.unwrap();
        let agentrt_runtime::store::CreateOutcome::Created(mut session) = created else {
            panic!("not created");
        };
        session.message_count = u64::MAX;
        session.archived = true;
        for last_turn in [
            None,
            Some(LastTurn {
                turn_id: "0198f5d2-6a4e-7c0e-9d4b-3f2a1b0c9d8e".into(),
                status: TurnStatus::Interrupted,
                started_at: std::time::SystemTime::now(),
                finished_at: Some(std::time::SystemTime::now()),
            }),
        ] {
            session.last_turn = last_turn;
            let estimate = session_wire_bytes(&session);
            let real = framed(convert::session_to_pb(session.clone()).encoded_len());
            assert!(estimate >= real, "session: estimate {estimate} < {real}");
        }
    }
}
