use std::sync::Mutex;

use super::*;

/// Answers every point with what it was given; `None`: never answers.
#[derive(Debug, Default)]
struct Scripted {
    turn: Option<TurnDecision>,
    tool: Option<ToolCallDecision>,
    result: Option<ToolResultDecision>,
    /// Fails (an error, at once) instead of answering.
    fail: bool,
    /// What each call was sent: the hook name and the arguments / prompt.
    seen: Mutex<Vec<(String, String)>>,
}

impl Scripted {
    async fn answer<T: Clone>(&self, answer: &Option<T>) -> Result<T, HookError> {
        if self.fail {
            return Err(HookError("down".to_owned()));
        }
        match answer {
            Some(a) => Ok(a.clone()),
            None => std::future::pending().await,
        }
    }
}

#[async_trait]
impl HookClient for Scripted {
    async fn before_turn(&self, r: &BeforeTurnRequest) -> Result<TurnDecision, HookError> {
        self.seen
            .lock()
            .unwrap()
            .push((r.turn.hook_name.clone(), r.system_prompt.clone()));
        self.answer(&self.turn).await
    }
    async fn before_model_call(
        &self,
        _: &BeforeModelCallRequest,
    ) -> Result<ModelCallDecision, HookError> {
        self.answer(&Some(ModelCallDecision::Allow)).await
    }
    async fn after_step(&self, _: &AfterStepRequest) -> Result<(), HookError> {
        self.answer(&Some(())).await
    }
    async fn before_tool_call(
        &self,
        r: &BeforeToolCallRequest,
    ) -> Result<ToolCallDecision, HookError> {
        self.seen
            .lock()
            .unwrap()
            .push((r.turn.hook_name.clone(), r.call.arguments_json.clone()));
        self.answer(&self.tool).await
    }
    async fn after_tool_call(
        &self,
        r: &AfterToolCallRequest,
    ) -> Result<ToolResultDecision, HookError> {
        self.seen
            .lock()
            .unwrap()
            .push((r.turn.hook_name.clone(), r.result.clone()));
        self.answer(&self.result).await
    }
}

fn hook(name: &str, fail_open: bool, client: Arc<Scripted>) -> Hook {
    Hook {
        name: name.to_owned(),
        points: HookPoint::ALL.to_vec(),
        timeout: Duration::from_millis(200),
        fail_open,
        client,
    }
}

fn tool_request(arguments: &str) -> BeforeToolCallRequest {
    BeforeToolCallRequest {
        call: HookToolCall {
            call_id: "c1".into(),
            tool_name: "fs__read".into(),
            arguments_json: arguments.into(),
        },
        ..BeforeToolCallRequest::default()
    }
}

#[tokio::test(start_paused = true)]
async fn a_hook_that_never_answers_refuses_when_fail_closed_and_is_ignored_when_fail_open() {
    let silent = Arc::new(Scripted::default());
    let closed = Hooks::new(vec![hook("guard", false, Arc::clone(&silent))]);
    let stop = closed
        .before_turn(BeforeTurnRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        stop,
        HookStop::Failed {
            hook: "guard".into()
        }
    );
    assert!(stop.to_string().contains("\"guard\""), "{stop}");
    assert!(matches!(
        closed.before_tool_call(tool_request("{}")).await,
        ToolGate::Denied(why) if why.contains("not run") && why.contains("guard")
    ));
    let withheld = closed
        .after_tool_call(AfterToolCallRequest::default())
        .await
        .unwrap();
    assert!(withheld.contains("withheld"), "{withheld}");

    let open = Hooks::new(vec![hook("guard", true, silent)]);
    assert_eq!(
        open.before_turn(BeforeTurnRequest::default()).await,
        Ok(None)
    );
    assert_eq!(
        open.before_tool_call(tool_request("{}")).await,
        ToolGate::Run(None)
    );
    assert_eq!(
        open.after_tool_call(AfterToolCallRequest::default()).await,
        None
    );
}

#[tokio::test]
async fn a_failing_hook_is_a_failure_too() {
    let down = Arc::new(Scripted {
        fail: true,
        ..Scripted::default()
    });
    let hooks = Hooks::new(vec![hook("guard", false, down)]);
    assert!(
        hooks
            .before_model_call(BeforeModelCallRequest::default())
            .await
            .is_err()
    );
    assert!(hooks.after_step(AfterStepRequest::default()).await.is_err());
}

#[tokio::test]
async fn rewrites_chain_and_a_denial_stops_the_chain() {
    let rewrite = Arc::new(Scripted {
        tool: Some(ToolCallDecision::Rewrite {
            arguments_json: r#"{"path":"/safe"}"#.into(),
        }),
        ..Scripted::default()
    });
    let allow = Arc::new(Scripted {
        tool: Some(ToolCallDecision::Allow),
        ..Scripted::default()
    });
    let hooks = Hooks::new(vec![
        hook("first", false, Arc::clone(&rewrite)),
        hook("second", false, Arc::clone(&allow)),
    ]);
    assert_eq!(
        hooks
            .before_tool_call(tool_request(r#"{"path":"/etc"}"#))
            .await,
        ToolGate::Run(Some(r#"{"path":"/safe"}"#.into()))
    );
    // Each hook is told its own name; the second sees the rewrite.
    assert_eq!(
        allow.seen.lock().unwrap()[0],
        ("second".to_owned(), r#"{"path":"/safe"}"#.to_owned())
    );
    assert_eq!(rewrite.seen.lock().unwrap()[0].0, "first");

    let deny = Arc::new(Scripted {
        tool: Some(ToolCallDecision::Deny {
            reason: format!("no\n{}", "x".repeat(5000)),
        }),
        ..Scripted::default()
    });
    let after = Arc::new(Scripted::default());
    let hooks = Hooks::new(vec![
        hook("deny", false, deny),
        hook("after", false, Arc::clone(&after)),
    ]);
    let ToolGate::Denied(why) = hooks.before_tool_call(tool_request("{}")).await else {
        panic!("not denied");
    };
    assert!(why.contains("denied") && why.contains("fs__read"), "{why}");
    assert!(why.len() < 1300 && !why.contains('\n'), "{}", why.len());
    assert!(after.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn rewritten_arguments_that_are_not_an_object_count_as_a_failed_call() {
    let bad = Arc::new(Scripted {
        tool: Some(ToolCallDecision::Rewrite {
            arguments_json: "[1]".into(),
        }),
        ..Scripted::default()
    });
    let closed = Hooks::new(vec![hook("guard", false, Arc::clone(&bad))]);
    assert!(matches!(
        closed.before_tool_call(tool_request("{}")).await,
        ToolGate::Denied(_)
    ));
    let open = Hooks::new(vec![hook("guard", true, bad)]);
    assert_eq!(
        open.before_tool_call(tool_request("{}")).await,
        ToolGate::Run(None)
    );
}

#[tokio::test]
async fn before_turn_replaces_the_prompt_or_refuses_with_the_reason() {
    let replace = Arc::new(Scripted {
        turn: Some(TurnDecision::Allow {
            system_prompt: Some("be careful".into()),
        }),
        ..Scripted::default()
    });
    let hooks = Hooks::new(vec![hook("prompt", false, replace)]);
    let request = BeforeTurnRequest {
        system_prompt: "original".into(),
        ..BeforeTurnRequest::default()
    };
    assert_eq!(
        hooks.before_turn(request.clone()).await,
        Ok(Some("be careful".into()))
    );
    let refuse = Arc::new(Scripted {
        turn: Some(TurnDecision::Refuse {
            reason: "off topic".into(),
        }),
        ..Scripted::default()
    });
    let hooks = Hooks::new(vec![hook("topic", false, refuse)]);
    assert_eq!(
        hooks.before_turn(request).await,
        Err(HookStop::Refused {
            hook: "topic".into(),
            reason: "off topic".into()
        })
    );
}

#[tokio::test]
async fn a_hook_is_called_only_at_its_points() {
    let client = Arc::new(Scripted {
        fail: true,
        ..Scripted::default()
    });
    let hooks = Hooks::new(vec![Hook {
        points: vec![HookPoint::AfterToolCall],
        ..hook("only_after", false, client)
    }]);
    assert!(!hooks.serves(HookPoint::BeforeTurn));
    assert_eq!(
        hooks.before_turn(BeforeTurnRequest::default()).await,
        Ok(None)
    );
    assert!(hooks.serves(HookPoint::AfterToolCall));
}

#[test]
fn requests_are_proto3_json() {
    let request = AfterStepRequest {
        turn: TurnContext {
            session_id: "s".into(),
            ..TurnContext::default()
        },
        step: 2,
        usage: HookUsage {
            input_tokens: 12,
            ..HookUsage::default()
        },
        ..AfterStepRequest::default()
    };
    let json = serde_json::to_value(&request).unwrap();
    assert_eq!(json["turn"]["sessionId"], "s");
    assert_eq!(json["stopReason"], "");
    assert_eq!(json["step"], 2);
    // uint64 is a decimal string in proto3 JSON.
    assert_eq!(json["usage"]["inputTokens"], "12");
    for point in HookPoint::ALL {
        assert_eq!(HookPoint::from_name(point.name()), Some(point));
    }
    assert_eq!(HookPoint::from_name("BeforeTurn"), None);
}
