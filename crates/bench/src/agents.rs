//! The `agents` part: what running a session as an agent costs a turn.
//! One server, one session of each kind, sequential turns on the same
//! paced fake stream: a plain session, then an agent session whose system
//! prompt is a template over the user's memory blocks (rendered from the
//! session's memory snapshot) with the memory tools offered. Each block of
//! turns has its own CPU window.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use agentrt_client::proto;
use serde::Serialize;

use crate::driver::{Recorder, agentrt_turn};
use crate::load::{LOAD_HEAD, Load, load_row};
use crate::markdown::{ms, table};
use crate::scenarios::{Env, Measure, create_session};
use crate::server::ServerSpec;

/// The agent the part runs: a template with the usual variables and two
/// memory blocks, and the memory tools.
const AGENT: &str = "\n[[agents]]\n\
     id = \"bench\"\n\
     system_prompt = \"You help {{ user }} with {{ session.title }} on {{ date }}. \
     Notes: {{ memory.notes }} Style: {{ memory.style }} ({{ agent.fields.tone }})\"\n\
     tools = [\"memory_read\", \"memory_write\"]\n\
     fields = { tone = \"plain\" }\n";

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct AgentsPart {
    /// Turns of a session without an agent.
    pub(crate) plain: Load,
    /// Turns of the agent session.
    pub(crate) agent: Load,
    /// Agent TTFE quantile − plain TTFE quantile.
    pub(crate) ttfe_overhead_p50_us: f64,
    pub(crate) ttfe_overhead_p99_us: f64,
}

/// Runs `turns` turns on a plain session, then as many on an agent session.
pub(crate) async fn agents(env: &Env, turns: usize) -> Result<AgentsPart, String> {
    let p = env.plan.s1;
    let spec = ServerSpec {
        config_tail: env.spec.config_tail.clone() + AGENT,
        ..env.spec.clone()
    };
    let run = env.fresh_server_with(&spec, "agents", 1).await?;
    let client = &run.clients[0];
    create_session(client, "plain").await?;
    client
        .create_session(proto::CreateSessionRequest {
            session_id: "agent".into(),
            agent_id: "bench".into(),
            title: "the benchmark".into(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("create the agent session: {e}"))?;
    for (block, text) in [
        ("notes", "likes short answers; works on the storage layer"),
        ("style", "British spelling"),
    ] {
        client
            .set_memory("bench", block, text)
            .await
            .map_err(|e| format!("set memory {block}: {e}"))?;
    }
    let mut loads = Vec::new();
    for (label, session) in [
        ("agents plain session", "plain"),
        ("agents agent session", "agent"),
    ] {
        let rec = Recorder::default();
        let measure = Measure::begin(run.server.pid());
        let start = Instant::now();
        for _ in 0..turns {
            rec.add(
                agentrt_turn(
                    client,
                    session,
                    Some((&env.fake, p)),
                    "",
                    env.plan.turn_limit,
                )
                .await,
            );
        }
        let elapsed = start.elapsed();
        loads.push(
            measure
                .end(label, 1, &rec.take(), elapsed, run.rss_startup_kb)
                .await,
        );
    }
    run.server.terminate(Duration::from_secs(10)).await;
    let agent = loads.pop().unwrap_or_default();
    let plain = loads.pop().unwrap_or_default();
    Ok(AgentsPart {
        ttfe_overhead_p50_us: agent.ttfe.p50_us - plain.ttfe.p50_us,
        ttfe_overhead_p99_us: agent.ttfe.p99_us - plain.ttfe.p99_us,
        plain,
        agent,
    })
}

/// The part's section of the report.
pub(crate) fn markdown(a: &AgentsPart) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## Agent sessions\n\nSequential turns on a plain session, then on an agent session \
         (a template over two memory blocks, memory tools offered). TTFE of the agent session − \
         the plain one: p50 {} ms, p99 {} ms.\n",
        ms(a.ttfe_overhead_p50_us),
        ms(a.ttfe_overhead_p99_us)
    );
    out.push_str(&table(LOAD_HEAD, &[load_row(&a.plain), load_row(&a.agent)]));
    out
}
