//! The operator hooks ([`crate::hooks`]) inside a running turn: the
//! `BeforeModelCall` gate of each model request after the first (the first
//! is gated in its pre-start), `AfterStep` once a step finished, and the
//! `BeforeToolCall` / `AfterToolCall` hooks around each server tool call.
//! A hook's refusal, or a fail-closed hook that did not answer, ends the
//! turn at a model step ([`StepEnd::Hook`]); at a tool call it denies the
//! call or withholds its result instead, and the model is told.

use std::sync::Arc;

use super::Turn;
use super::step::{StepEnd, StepOutput, ToolCallRequest};
use crate::hooks::{
    AfterStepRequest, AfterToolCallRequest, BeforeToolCallRequest, HookPoint, HookToolCall, Hooks,
    ToolGate, TurnContext,
};
use crate::model::{ModelRequest, ModelStream};
use crate::toolbox::ToolOutcome;

fn hook_call(call: &ToolCallRequest) -> HookToolCall {
    HookToolCall {
        call_id: call.id.clone(),
        tool_name: call.name.clone(),
        arguments_json: call.arguments_json.clone(),
    }
}

/// The tool hooks of one step's server calls, shared by them.
#[derive(Debug)]
pub(super) struct ToolHooks {
    hooks: Hooks,
    turn: TurnContext,
    step: u32,
    /// The tool policy's bound on a result, which a replacement keeps too.
    max_result_bytes: usize,
}

impl ToolHooks {
    /// Whether `call` runs, and with which arguments.
    pub(super) async fn before(&self, call: &ToolCallRequest) -> ToolGate {
        if !self.hooks.serves(HookPoint::BeforeToolCall) {
            return ToolGate::Run(None);
        }
        self.hooks
            .before_tool_call(BeforeToolCallRequest {
                turn: self.turn.clone(),
                step: self.step,
                call: hook_call(call),
            })
            .await
    }

    /// `outcome`, or its replacement when a hook redacted (or withheld) it;
    /// a replacement carries no media.
    pub(super) async fn after(&self, call: &ToolCallRequest, outcome: ToolOutcome) -> ToolOutcome {
        if !self.hooks.serves(HookPoint::AfterToolCall) {
            return outcome;
        }
        let replaced = self
            .hooks
            .after_tool_call(AfterToolCallRequest {
                turn: self.turn.clone(),
                step: self.step,
                call: hook_call(call),
                result: outcome.content.clone(),
                is_error: outcome.is_error,
            })
            .await;
        match replaced {
            Some(mut content) => {
                crate::toolbox::hooks::cut(&mut content, self.max_result_bytes);
                ToolOutcome {
                    content,
                    is_error: outcome.is_error,
                    media: Vec::new(),
                }
            }
            None => outcome,
        }
    }
}

impl Turn {
    /// What every hook call of this turn says about it.
    fn hook_context(&self) -> TurnContext {
        crate::runtime::hooks::context(&self.session, &self.record.turn_id, &self.record.model)
    }

    /// The tool hooks of the current step's server calls, when any hook
    /// serves them.
    pub(super) fn tool_hooks(&self) -> Option<Arc<ToolHooks>> {
        let hooks = &self.inner.config.hooks;
        if !hooks.serves(HookPoint::BeforeToolCall) && !hooks.serves(HookPoint::AfterToolCall) {
            return None;
        }
        Some(Arc::new(ToolHooks {
            hooks: hooks.clone(),
            turn: self.hook_context(),
            step: self.record.steps,
            max_result_bytes: self.inner.toolbox.policy().max_result_bytes,
        }))
    }

    /// Starts model request `request` of the current step once the
    /// `BeforeModelCall` hooks let it.
    pub(super) async fn gated_stream(&self, request: ModelRequest) -> Result<ModelStream, StepEnd> {
        crate::runtime::hooks::before_model_call(
            &self.inner,
            &self.hook_context(),
            self.record.steps,
            request.messages.len(),
            &request.tools,
        )
        .await
        .map_err(StepEnd::Hook)?;
        self.runner
            .model
            .provider
            .stream(request)
            .await
            .map_err(StepEnd::Failed)
    }

    /// Runs the `AfterStep` hooks on a step that finished: the step's end,
    /// or [`StepEnd::Hook`] when a fail-closed hook did not answer.
    pub(super) async fn after_step(&self, end: StepEnd, output: &StepOutput) -> StepEnd {
        let hooks = &self.inner.config.hooks;
        let StepEnd::Finished(reason) = end else {
            return end;
        };
        if !hooks.serves(HookPoint::AfterStep) {
            return end;
        }
        let request = AfterStepRequest {
            turn: self.hook_context(),
            step: self.record.steps,
            stop_reason: reason.as_str().to_owned(),
            text: output.text.clone(),
            tool_calls: output.tool_calls.iter().map(hook_call).collect(),
            usage: output.usage.unwrap_or_default().into(),
        };
        match hooks.after_step(request).await {
            Ok(()) => end,
            Err(stop) => StepEnd::Hook(stop),
        }
    }
}
