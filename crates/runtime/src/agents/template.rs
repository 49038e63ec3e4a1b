//! A profile's system prompt template, rendered with minijinja.
//!
//! Variables: `user` (the session owner's id), `session` (`id`, `title`,
//! `metadata`), `now` (RFC 3339, UTC, seconds), `date` (`YYYY-MM-DD`),
//! `time` (`HH:MM:SS`, UTC), `memory` (block name → text) and `agent`
//! (`id`, `version`, `description`, `model`, `fields`). An undefined
//! variable renders empty. Rendering is bounded: a template spends at most
//! [`FUEL`] instructions and its output at most [`MAX_RENDERED_BYTES`], so a
//! loop in a profile cannot stall a turn.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{Environment, context};

/// Instructions a template may execute per rendering.
pub const FUEL: u64 = 200_000;
/// Largest rendered system prompt, in bytes.
pub const MAX_RENDERED_BYTES: usize = 256 * 1024;

/// What a template is rendered with.
#[derive(Debug, Clone, Copy)]
pub struct PromptContext<'a> {
    /// The session owner's id.
    pub user: &'a str,
    /// The session's id.
    pub session_id: &'a str,
    /// Its title (may be empty).
    pub title: &'a str,
    /// Its metadata.
    pub metadata: &'a BTreeMap<String, String>,
    /// The memory blocks (the session's snapshot or the latest).
    pub memory: &'a BTreeMap<String, String>,
    /// The agent version.
    pub agent: &'a super::AgentVersion,
    /// The time the prompt is rendered for.
    pub now: SystemTime,
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(FUEL));
    env.set_recursion_limit(32);
    env
}

/// Checks that `template` compiles; `Err` says where it does not.
pub fn check_template(template: &str) -> Result<(), String> {
    environment()
        .template_from_str(template)
        .map(|_| ())
        .map_err(|e| describe(&e))
}

/// Renders `template` with `ctx`.
pub fn render(template: &str, ctx: &PromptContext<'_>) -> Result<String, String> {
    let env = environment();
    let (date, time) = utc(ctx.now);
    let agent = ctx.agent;
    let out = env
        .render_str(
            template,
            context! {
                user => ctx.user,
                session => context! {
                    id => ctx.session_id,
                    title => ctx.title,
                    metadata => ctx.metadata,
                },
                now => format!("{date}T{time}Z"),
                date => date,
                time => time,
                memory => ctx.memory,
                agent => context! {
                    id => &agent.id,
                    version => agent.version,
                    description => &agent.spec.description,
                    model => &agent.spec.model,
                    fields => &agent.spec.fields,
                },
            },
        )
        .map_err(|e| describe(&e))?;
    if out.len() > MAX_RENDERED_BYTES {
        return Err(format!(
            "the rendered prompt has {} bytes; the limit is {MAX_RENDERED_BYTES}",
            out.len()
        ));
    }
    Ok(out)
}

/// A template error in one line: what and where.
fn describe(e: &minijinja::Error) -> String {
    match e.line() {
        Some(line) => format!("{} (line {line})", e.kind()),
        None => e.kind().to_string(),
    }
    .chars()
    .chain(
        e.detail()
            .map(|d| format!(": {d}"))
            .unwrap_or_default()
            .chars(),
    )
    .take(300)
    .collect()
}

/// `(YYYY-MM-DD, HH:MM:SS)` of `t` in UTC.
fn utc(t: SystemTime) -> (String, String) {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, d) = civil(days);
    (
        format!("{y:04}-{m:02}-{d:02}"),
        format!("{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60),
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01.
fn civil(days: i64) -> (i64, u32, u32) {
    // Eras of 400 years (146 097 days) starting on March 1st, so the leap
    // day is the last day of a year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::agents::{AgentSource, AgentSpec, AgentVersion};

    fn agent() -> AgentVersion {
        AgentVersion {
            id: "helper".into(),
            version: 3,
            source: AgentSource::Api,
            spec: AgentSpec {
                fields: [("tone".to_owned(), "dry".to_owned())].into(),
                ..AgentSpec::default()
            },
            created_at: UNIX_EPOCH,
        }
    }

    #[test]
    fn dates_are_the_utc_calendar() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(59), (1970, 3, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
        assert_eq!(civil(20_790), (2026, 12, 3));
        let t = UNIX_EPOCH + Duration::from_secs(20_790 * 86_400 + 13 * 3600 + 56 * 60 + 41);
        assert_eq!(utc(t), ("2026-12-03".into(), "13:56:41".into()));
    }

    #[test]
    fn a_template_sees_the_user_session_date_memory_and_agent() {
        let metadata = [("team".to_owned(), "infra".to_owned())].into();
        let memory = [("human".to_owned(), "likes tea".to_owned())].into();
        let agent = agent();
        let ctx = PromptContext {
            user: "alice",
            session_id: "s1",
            title: "Plans",
            metadata: &metadata,
            memory: &memory,
            agent: &agent,
            now: UNIX_EPOCH + Duration::from_secs(20_790 * 86_400),
        };
        let out = render(
            "{{ user }}|{{ session.title }}|{{ session.metadata.team }}|{{ date }}|\
             {{ memory.human }}|{{ agent.id }} v{{ agent.version }} {{ agent.fields.tone }}|{{ nope }}",
            &ctx,
        )
        .unwrap();
        assert_eq!(out, "alice|Plans|infra|2026-12-03|likes tea|helper v3 dry|");
    }

    #[test]
    fn a_runaway_template_runs_out_of_fuel() {
        let agent = agent();
        let empty = BTreeMap::new();
        let ctx = PromptContext {
            user: "u",
            session_id: "s",
            title: "",
            metadata: &empty,
            memory: &empty,
            agent: &agent,
            now: UNIX_EPOCH,
        };
        let err = render(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            &ctx,
        )
        .unwrap_err();
        assert!(err.contains("fuel"), "{err}");
        assert!(check_template("{{ unclosed").is_err());
    }
}
