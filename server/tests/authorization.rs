//! P12's authorization proof, table-driven from the descriptors: every RPC
//! of every public service (agentrt.v1 and lf.a2a.v1, read from the
//! served descriptor set, so a new RPC without a row fails here) is called
//! through gRPC on a real server with two API-key users and an admin,
//! against alice's session in each state — idle, live (a gated turn),
//! paused on a caller-executed tool call, archived:
//!
//! - bob naming alice's session, turn, A2A task or context gets exactly
//!   what he gets for one that does not exist (code, where the status
//!   comes, message and details, modulo the id itself) — alice's request
//!   ids on her session included — and changes nothing of hers;
//! - alice's own call is answered differently (the fixture is reachable);
//! - nothing bob is sent ever carries alice's name or text;
//! - a request id or A2A message id of alice's, reused by bob on his own
//!   session, starts his own turn;
//! - admin RPCs refuse non-admins with PERMISSION_DENIED whatever they name.
//!
//! Modules: `world` (the server, the scripted model, alice's fixtures),
//! `calls` (the table and how each method is called), `outcome` (answers
//! in a comparable form).

mod authorization {
    pub(crate) mod calls;
    pub(crate) mod outcome;
    pub(crate) mod world;
}

use std::collections::BTreeSet;

use agentrt_proto::a2a::v1 as a2a;
use agentrt_proto::a2a::v1::a2a_service_client::A2aServiceClient;
use agentrt_proto::v1 as pb;
use authorization::calls::{CASES, Case, Scope, call};
use authorization::outcome::Outcome;
use authorization::world::{STATES, State, Target, User, WAIT, World, authed, chat_request};
use futures::StreamExt as _;
use prost::Message as _;
use tonic::Code;

/// The packages whose services are public.
const PUBLIC: &[&str] = &["agentrt.v1", "lf.a2a.v1"];

/// `package.Service/Method` of every RPC the public port describes.
fn described_methods() -> BTreeSet<String> {
    let set = prost_types::FileDescriptorSet::decode(agentrt_proto::FILE_DESCRIPTOR_SET)
        .expect("the descriptor set decodes");
    let mut methods = BTreeSet::new();
    for file in set.file {
        let package = file.package().to_owned();
        if !PUBLIC.contains(&package.as_str()) {
            continue;
        }
        for service in &file.service {
            for method in &service.method {
                methods.insert(format!("{package}.{}/{}", service.name(), method.name()));
            }
        }
    }
    methods
}

/// An id of `id`'s shape that nothing has: its last 8 characters replaced.
fn ghost_id(id: &str, n: usize) -> String {
    let keep = id.len().saturating_sub(8);
    format!("{}{:08x}", &id[..keep], 0xdead_0000_usize + n)
}

#[test]
fn the_table_has_a_row_for_every_described_rpc_and_no_other() {
    let described = described_methods();
    let services: BTreeSet<&str> = described
        .iter()
        .filter_map(|m| m.split('/').next())
        .collect();
    assert_eq!(
        services,
        BTreeSet::from([
            "agentrt.v1.AgentRuntime",
            "agentrt.v1.AgentService",
            "agentrt.v1.RuntimeAdmin",
            "agentrt.v1.SessionService",
            "lf.a2a.v1.A2AService",
        ]),
        "a public service was added or removed: give its RPCs rows in the table"
    );
    let tabled: BTreeSet<String> = CASES.iter().map(|c| c.method.to_owned()).collect();
    let missing: Vec<_> = described.difference(&tabled).collect();
    let stale: Vec<_> = tabled.difference(&described).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "RPCs without a row: {missing:?}; rows without an RPC: {stale:?}"
    );
}

/// Checks one row in one state; what fails is added to `failures`.
async fn check(world: &World, case: &Case, state: State, n: usize, failures: &mut Vec<String>) {
    let fixture = world.fixture(state, n).await;
    let t = fixture.target.clone();
    let label = format!("{} [{}] in {state:?}", case.method, case.variant);
    let mut fail = |what: String| failures.push(format!("{label}: {what}"));
    let before = world.snapshot(&t.session).await;
    let other = call(world, case, User::Bob, &t).await;
    let mut bobs = vec![("alice's", other.clone())];
    match case.scope {
        Scope::Owned { distinct } => {
            let nowhere = Target {
                session: ghost_id(&t.session, n),
                ..t.clone()
            };
            let no_turn = Target {
                turn: ghost_id(&t.turn, n),
                ..t.clone()
            };
            let expected = other.normalized(&t);
            let mut ghost = None;
            for (name, target) in [
                ("a nonexistent", &nowhere),
                ("a nonexistent turn's", &no_turn),
            ] {
                let answer = call(world, case, User::Bob, target).await;
                let seen = answer.normalized(target);
                if seen != expected {
                    fail(format!(
                        "bob on alice's resource got\n    {expected:?}\n  on {name} \
                         resource\n    {seen:?}"
                    ));
                }
                ghost.get_or_insert(seen);
                bobs.push((name, answer));
            }
            // Last: alice's own call may change or delete her session.
            let after = world.snapshot(&t.session).await;
            if before != after {
                fail(format!(
                    "bob's calls changed alice's session: {before} -> {after}"
                ));
            }
            if distinct {
                let own = call(world, case, User::Alice, &t).await.normalized(&t);
                if Some(&own) == ghost.as_ref() {
                    fail(format!("alice's own call looks nonexistent: {own:?}"));
                }
            }
        }
        Scope::Caller => {
            let own = call(world, case, User::Alice, &t).await;
            if !own.is_ok() || !other.is_ok() {
                fail(format!("alice got {own:?}, bob got {other:?}"));
            }
        }
        Scope::Admin => unreachable!("admin rows are checked apart"),
    }
    for (name, answer) in &bobs {
        if answer.text().to_lowercase().contains("alice") || *answer == Outcome::Hung {
            fail(format!("bob's call on {name} resource leaked: {answer:?}"));
        }
    }
    world.release(fixture).await;
}

/// Admin rows: PERMISSION_DENIED for alice and bob whatever the call
/// names, the same refusal each time; an admin is not refused (Drain last).
async fn check_admin(world: &World, failures: &mut Vec<String>) {
    let rows: Vec<&Case> = CASES.iter().filter(|c| c.scope == Scope::Admin).collect();
    for case in &rows {
        let mut refusals = BTreeSet::new();
        for user in [User::Alice, User::Bob] {
            for name in ["alice", "bob", "root", "nobody"] {
                let target = Target {
                    session: name.into(),
                    turn: String::new(),
                    request_id: String::new(),
                    call_id: String::new(),
                    blob: String::new(),
                };
                let answer = call(world, case, user, &target).await;
                if answer.code() != Some(Code::PermissionDenied) {
                    failures.push(format!("{} by {user:?}: {answer:?}", case.method));
                }
                refusals.insert(format!("{:?}", answer.normalized(&target)));
            }
        }
        if refusals.len() != 1 {
            failures.push(format!("{}: refusals differ: {refusals:?}", case.method));
        }
    }
    for case in rows
        .iter()
        .filter(|c| !c.method.ends_with("/Drain"))
        .chain(rows.iter().filter(|c| c.method.ends_with("/Drain")))
    {
        let target = Target {
            session: "alice".into(),
            turn: String::new(),
            request_id: String::new(),
            call_id: String::new(),
            blob: String::new(),
        };
        let answer = call(world, case, User::Admin, &target).await;
        if !answer.is_ok() {
            failures.push(format!("{} by the admin: {answer:?}", case.method));
        }
    }
}

/// Bob reuses alice's request id (agentrt) and message id (A2A) on his own
/// sessions: each starts a turn of his, never a replay of hers.
async fn check_replays_on_own(world: &World, state: State, n: usize, failures: &mut Vec<String>) {
    let fixture = world.fixture(state, n).await;
    let t = fixture.target.clone();
    let mine = world
        .sessions()
        .create_session(authed(pb::CreateSessionRequest::default(), User::Bob))
        .await
        .expect("bob creates a session")
        .into_inner()
        .session_id;
    let mut chat = chat_request(&mine, "bob asks", "script/quick");
    chat.request_id.clone_from(&t.request_id);
    let mut events = world
        .runtime()
        .chat(authed(chat, User::Bob))
        .await
        .expect("bob's turn is admitted")
        .into_inner();
    let mut seen = Vec::new();
    while let Some(event) = tokio::time::timeout(WAIT, events.next())
        .await
        .expect("bob's turn ends")
    {
        seen.push(event.expect("an event"));
    }
    let turns: BTreeSet<_> = seen.iter().map(|e| e.turn_id.clone()).collect();
    let sessions: BTreeSet<_> = seen.iter().map(|e| e.session_id.clone()).collect();
    let finished = seen.iter().any(|e| {
        matches!(&e.kind, Some(pb::chat_event::Kind::TurnFinished(f))
            if f.outcome == pb::TurnOutcome::Success as i32)
    });
    let foreign = turns.contains(&t.turn) || sessions != BTreeSet::from([mine.clone()]);
    if foreign || !finished || format!("{seen:?}").contains("alice") {
        failures.push(format!(
            "Chat replay of alice's request id on bob's session in {state:?}: {seen:?}"
        ));
    }
    for context in [String::new(), mine] {
        let message = a2a::Message {
            message_id: t.request_id.clone(),
            context_id: context.clone(),
            role: a2a::Role::User as i32,
            parts: vec![a2a::Part {
                content: Some(a2a::part::Content::Text("bob asks".into())),
                ..Default::default()
            }],
            ..Default::default()
        };
        let sent = A2aServiceClient::new(world.channel.clone())
            .send_message(authed(
                a2a::SendMessageRequest {
                    message: Some(message),
                    ..Default::default()
                },
                User::Bob,
            ))
            .await;
        let task = match sent.map(|r| r.into_inner().payload) {
            Ok(Some(a2a::send_message_response::Payload::Task(task))) => task,
            other => {
                failures.push(format!("A2A replay in {state:?} got {other:?}"));
                continue;
            }
        };
        let ours = task.context_id != t.session
            && task.id != t.task()
            && (context.is_empty() || task.context_id == context);
        if !ours || format!("{task:?}").contains("alice") {
            failures.push(format!(
                "A2A message id of alice's reused by bob in {state:?}: {task:?}"
            ));
        }
    }
    world.release(fixture).await;
}

#[tokio::test]
async fn another_users_resource_is_indistinguishable_from_a_nonexistent_one() {
    let world = World::start().await;
    let mut failures = Vec::new();
    let mut n = 0;
    for case in CASES.iter().filter(|c| c.scope != Scope::Admin) {
        for state in STATES {
            n += 1;
            check(&world, case, state, n, &mut failures).await;
        }
    }
    for state in STATES {
        n += 1;
        check_replays_on_own(&world, state, n, &mut failures).await;
    }
    check_admin(&world, &mut failures).await;
    world.stop().await;
    assert!(
        failures.is_empty(),
        "{} authorization failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
