//! `ListTasks`: the tasks of one context (a session's turns), newest first,
//! from the turn records (`Runtime::list_turns`), each as `GetTask` shows
//! it. A page ends early rather than pass [`PAGE_BYTES`] (so a client with
//! gRPC's default 4 MiB limit reads any page); the filters (`status`,
//! `status_timestamp_after`) apply to the records of a page, so a filtered
//! page may hold fewer tasks than asked — follow `next_page_token`.

use std::time::SystemTime;

use agentrt_proto::a2a::v1 as a2a;
use agentrt_runtime::error::FieldViolation;
use agentrt_runtime::runtime::page_token_after;
use agentrt_runtime::types::{Principal, TurnRecord};
use agentrt_runtime::{Runtime, RuntimeError};
use prost::Message as _;
use tonic::Status;

use super::errors::{from_runtime, invalid_params};
use super::ids::{MAX_CONTEXT_ID, context_id_ok};
use super::tasks::{state_of, task_of};

/// Tasks per page when the caller sets no `page_size` (the A2A default).
const DEFAULT_PAGE: i32 = 50;
/// The largest `page_size` A2A allows.
const MAX_PAGE: i32 = 100;
/// A page ends before its tasks pass this many bytes (a single larger task
/// comes alone).
const PAGE_BYTES: usize = 2 << 20;
/// Records read at a time when counting the tasks that match a filter.
const COUNT_BATCH: usize = 500;

/// What the caller asked for, checked.
struct Query {
    context: String,
    page_size: usize,
    state: Option<a2a::TaskState>,
    after: Option<SystemTime>,
    history_length: Option<i32>,
    include_artifacts: bool,
}

impl Query {
    fn of(request: &a2a::ListTasksRequest) -> Result<Self, Status> {
        let mut violations = Vec::new();
        if !context_id_ok(&request.context_id) {
            violations.push(FieldViolation::new(
                "context_id",
                format!(
                    "agentrt lists the tasks of one context: set context_id (1-{MAX_CONTEXT_ID} \
                     characters of A-Z a-z 0-9 . _ : -, a context id this server returned); \
                     agentrt.v1 SessionService.ListSessions lists the contexts"
                ),
            ));
        }
        let page_size = request.page_size.unwrap_or(DEFAULT_PAGE);
        if !(1..=MAX_PAGE).contains(&page_size) {
            violations.push(FieldViolation::new(
                "page_size",
                format!("is {page_size}; it must be 1-{MAX_PAGE} (unset: {DEFAULT_PAGE})"),
            ));
        }
        let state = match a2a::TaskState::try_from(request.status) {
            Ok(a2a::TaskState::Unspecified) => None,
            Ok(state) => Some(state),
            Err(_) => {
                violations.push(FieldViolation::new(
                    "status",
                    format!("{} is not a TaskState", request.status),
                ));
                None
            }
        };
        if request.history_length.is_some_and(|n| n < 0) {
            violations.push(FieldViolation::new(
                "history_length",
                "must not be negative",
            ));
        }
        let after = request
            .status_timestamp_after
            .as_ref()
            .map(|t| {
                SystemTime::try_from(*t).map_err(|_| {
                    FieldViolation::new("status_timestamp_after", "is not a valid timestamp")
                })
            })
            .transpose()
            .unwrap_or_else(|violation| {
                violations.push(violation);
                None
            });
        if !violations.is_empty() {
            return Err(invalid_params(violations));
        }
        Ok(Self {
            context: request.context_id.clone(),
            page_size: usize::try_from(page_size).unwrap_or(1),
            state,
            after,
            history_length: request.history_length,
            include_artifacts: request.include_artifacts.unwrap_or(false),
        })
    }

    fn filtered(&self) -> bool {
        self.state.is_some() || self.after.is_some()
    }

    /// The record passes the filters.
    fn matches(&self, record: &TurnRecord) -> bool {
        let state_ok = self.state.is_none_or(|s| state_of(record.status) == s);
        let at = record.finished_at.unwrap_or(record.started_at);
        state_ok && self.after.is_none_or(|after| at >= after)
    }
}

/// One page of `ListTasks` for `who`.
pub(super) async fn list_tasks(
    runtime: &Runtime,
    who: &Principal,
    request: &a2a::ListTasksRequest,
) -> Result<a2a::ListTasksResponse, Status> {
    let query = Query::of(request)?;
    let context = query.context.as_str();
    let page = match runtime
        .list_turns(who, context, query.page_size, &request.page_token)
        .await
    {
        // An unknown (or another user's) context has no tasks.
        Err(RuntimeError::SessionNotFound) => return Ok(empty(query.page_size)),
        other => other.map_err(from_runtime)?,
    };
    let mut tasks = Vec::new();
    let mut bytes = 0usize;
    let mut next_page_token = page.next_page_token;
    let mut handled: Option<&str> = None;
    for record in &page.turns {
        if query.matches(record) {
            let detail = runtime
                .turn_detail(who, context, record.clone())
                .await
                .map_err(from_runtime)?;
            let mut task = task_of(&detail, query.history_length);
            if !query.include_artifacts {
                task.artifacts.clear();
            }
            let len = task.encoded_len();
            if let Some(last) = handled.filter(|_| bytes.saturating_add(len) > PAGE_BYTES) {
                next_page_token = page_token_after(last);
                break;
            }
            bytes = bytes.saturating_add(len);
            tasks.push(task);
        }
        handled = Some(&record.turn_id);
    }
    let total = total(runtime, who, &query).await?;
    Ok(a2a::ListTasksResponse {
        tasks,
        next_page_token,
        page_size: i32::try_from(query.page_size).unwrap_or(MAX_PAGE),
        total_size: i32::try_from(total).unwrap_or(i32::MAX),
    })
}

/// How many tasks of the context match the query (all of them without a
/// filter, counted by the store; with one, by reading the records).
async fn total(runtime: &Runtime, who: &Principal, query: &Query) -> Result<u64, Status> {
    let context = query.context.as_str();
    if !query.filtered() {
        return runtime
            .count_turns(who, context)
            .await
            .map_err(from_runtime);
    }
    let (mut count, mut token) = (0u64, String::new());
    loop {
        let page = runtime
            .list_turns(who, context, COUNT_BATCH, &token)
            .await
            .map_err(from_runtime)?;
        let matching = page.turns.iter().filter(|r| query.matches(r)).count();
        count = count.saturating_add(u64::try_from(matching).unwrap_or(u64::MAX));
        if page.next_page_token.is_empty() {
            return Ok(count);
        }
        token = page.next_page_token;
    }
}

fn empty(page_size: usize) -> a2a::ListTasksResponse {
    a2a::ListTasksResponse {
        tasks: Vec::new(),
        next_page_token: String::new(),
        page_size: i32::try_from(page_size).unwrap_or(MAX_PAGE),
        total_size: 0,
    }
}
