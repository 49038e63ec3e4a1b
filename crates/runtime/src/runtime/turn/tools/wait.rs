//! The tool phase's wait: for the calls' results, bounded by cancellation,
//! the deadline and — while it waits for the caller — the pause's bound,
//! with heartbeats meanwhile; and the suspension of a phase that waits
//! only for its caller when the server drains.

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;

use super::super::emitter::Emitter;
use super::super::step::{StepEnd, ToolCallRequest};
use super::super::{Turn, TurnEnd, until};
use super::{Reach, ToolWait, ToolsEnd};
use crate::events::{EventKind, Phase, ToolStatus, ToolUse};
use crate::runtime::delegate::Progress;
use crate::toolbox::ToolOutcome;
use crate::types::CancelReason;
use tokio::sync::mpsc;

impl Turn {
    /// Waits until every call has its result in `results`, or the phase
    /// ends otherwise (how is returned).
    pub(super) async fn wait_tools(
        &mut self,
        calls: &[ToolCallRequest],
        (waits, progress): (
            &mut FuturesUnordered<ToolWait>,
            &mut mpsc::Receiver<Progress>,
        ),
        results: &mut [Option<ToolOutcome>],
        reach: &[Reach],
        emitter: &mut Emitter,
    ) -> ToolsEnd {
        let cancel = self.live.cancel.clone();
        let mut draining = self.inner.lifecycle.draining();
        while !waits.is_empty() {
            // Only calls waiting for the caller are left: a drain need not
            // wait for them.
            let suspendable = self.record.pause.is_some()
                && results
                    .iter()
                    .zip(reach)
                    .all(|(r, reach)| r.is_some() || reach.pausable());
            let drained = *draining.borrow_and_update();
            if suspendable && drained {
                return ToolsEnd::Suspended;
            }
            tokio::select! {
                biased;
                () = cancel.cancelled() => {
                    return match self.cancelled() {
                        StepEnd::Cancelled(CancelReason::Shutdown) if suspendable => {
                            ToolsEnd::Suspended
                        }
                        StepEnd::TimedOut => ToolsEnd::TimedOut,
                        StepEnd::Cancelled(reason) => ToolsEnd::Cancelled(reason),
                        _ => ToolsEnd::Cancelled(CancelReason::Stopped),
                    };
                }
                Ok(()) = draining.changed(), if !drained => {}
                () = until(self.wait_bound()) => return ToolsEnd::TimedOut,
                Some((i, output)) = waits.next() => results[i] = Some(output),
                Some((i, detail)) = progress.recv() => {
                    if let Some(call) = calls.get(i).filter(|_| results[i].is_none()) {
                        emitter.emit(running(call, detail)).await;
                    }
                }
                () = tokio::time::sleep_until(emitter.heartbeat_due()) => {
                    let waiting = calls
                        .iter()
                        .zip(results.iter())
                        .find(|(_, r)| r.is_none())
                        .map(|(c, _)| c.name.clone());
                    emitter.emit(EventKind::Heartbeat { phase: Phase::Tool, tool: waiting }).await;
                }
            }
        }
        ToolsEnd::Done
    }

    /// A phase suspended by a drain: the answers there are stored (out of
    /// call order); the calls still waited for stay open in history and in
    /// the pause.
    pub(super) async fn store_suspended(
        &mut self,
        calls: Vec<ToolCallRequest>,
        results: Vec<Option<ToolOutcome>>,
        emitter: &mut Emitter,
    ) -> Result<(), TurnEnd> {
        let mut open = Vec::new();
        for (call, result) in calls.into_iter().zip(results) {
            match result {
                Some(output) => self.store_tool_result(call, output, None, emitter).await?,
                None => open.push(call.id),
            }
        }
        if let Some(pause) = &mut self.record.pause {
            pause.calls.retain(|c| open.contains(&c.call_id));
        }
        Ok(())
    }
}

/// A `tool_use` RUNNING event of `call` telling its progress.
fn running(call: &ToolCallRequest, detail: String) -> EventKind {
    EventKind::ToolUse(Box::new(ToolUse {
        call_id: call.id.clone(),
        tool_name: call.name.clone(),
        status: ToolStatus::Running,
        input_summary: super::input_summary(&call.arguments_json),
        arguments_json: call.arguments_json.clone(),
        detail,
        content: String::new(),
        references: Vec::new(),
    }))
}
