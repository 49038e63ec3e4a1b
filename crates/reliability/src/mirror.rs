//! What the crash battery has read of one session's history, and the
//! checks each newly read message must pass: contiguous seqs, unique ids,
//! every user message stored once, every tool call answered exactly once.

use std::collections::{HashMap, HashSet};

use agentrt_client::proto;

/// The verified history of one session, as the battery has read it.
#[derive(Debug, Default)]
pub(crate) struct Mirror {
    pub(crate) ids: Vec<String>,
    id_set: HashSet<String>,
    user_texts: HashSet<String>,
    users_per_turn: HashMap<String, u32>,
    pub(crate) open_calls: HashSet<String>,
    answered: HashSet<String>,
}

fn text_of(m: &proto::Message) -> String {
    use proto::content_block::Block;
    m.content
        .iter()
        .filter_map(|b| match &b.block {
            Some(Block::Text(t)) => Some(t.text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("")
}

impl Mirror {
    /// Appends messages read after the mirror's end, checking them.
    pub(crate) fn extend(&mut self, sid: &str, msgs: Vec<proto::Message>, v: &mut Vec<String>) {
        use proto::content_block::Block;
        for m in msgs {
            let expected = self.ids.len() as u64 + 1;
            if m.seq != expected {
                v.push(format!(
                    "{sid}: GetHistory has seq {} where {expected} was expected (seqs not contiguous)",
                    m.seq
                ));
                return;
            }
            if !self.id_set.insert(m.id.clone()) {
                v.push(format!("{sid}: message id {} stored twice", m.id));
            }
            self.ids.push(m.id.clone());
            if m.role() == proto::Role::User {
                let text = text_of(&m);
                if !self.user_texts.insert(text.clone()) {
                    v.push(format!(
                        "{sid}: user message {text:?} stored twice (seq {})",
                        m.seq
                    ));
                }
                let n = self.users_per_turn.entry(m.turn_id.clone()).or_default();
                *n += 1;
                if *n > 1 {
                    v.push(format!("{sid}: turn {} has {n} user messages", m.turn_id));
                }
            }
            for block in &m.content {
                match &block.block {
                    Some(Block::ToolCall(c)) => {
                        let fresh =
                            !self.answered.contains(&c.id) && self.open_calls.insert(c.id.clone());
                        if !fresh {
                            v.push(format!("{sid}: tool call {} stored twice", c.id));
                        }
                    }
                    Some(Block::ToolResult(r)) => {
                        if !self.open_calls.remove(&r.call_id) {
                            v.push(format!(
                                "{sid}: tool result for {} without an open call (seq {})",
                                r.call_id, m.seq
                            ));
                        }
                        self.answered.insert(r.call_id.clone());
                    }
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::content_block::Block;

    fn msg(seq: u64, id: &str, turn: &str, role: proto::Role, block: Block) -> proto::Message {
        proto::Message {
            seq,
            id: id.into(),
            turn_id: turn.into(),
            role: role as i32,
            content: vec![proto::ContentBlock { block: Some(block) }],
            ..Default::default()
        }
    }

    fn user(seq: u64, id: &str, turn: &str, text: &str) -> proto::Message {
        let text = Block::Text(proto::TextBlock { text: text.into() });
        msg(seq, id, turn, proto::Role::User, text)
    }

    fn call(seq: u64, id: &str, turn: &str, call: &str) -> proto::Message {
        let block = Block::ToolCall(proto::ToolCallBlock {
            id: call.into(),
            name: "lookup".into(),
            arguments_json: "{}".into(),
        });
        msg(seq, id, turn, proto::Role::Assistant, block)
    }

    fn result(seq: u64, id: &str, turn: &str, call: &str) -> proto::Message {
        let block = Block::ToolResult(proto::ToolResultBlock {
            call_id: call.into(),
            name: "lookup".into(),
            content: "x".into(),
            is_error: false,
            ..Default::default()
        });
        msg(seq, id, turn, proto::Role::Tool, block)
    }

    fn check(msgs: Vec<proto::Message>) -> (Mirror, Vec<String>) {
        let (mut m, mut v) = (Mirror::default(), Vec::new());
        m.extend("s", msgs, &mut v);
        (m, v)
    }

    #[test]
    fn a_clean_history_passes() {
        let (m, v) = check(vec![
            user(1, "a", "t1", "rel text 1 k1"),
            call(2, "b", "t1", "c1"),
            result(3, "c", "t1", "c1"),
            user(4, "d", "t2", "rel text 1 k2"),
        ]);
        assert!(v.is_empty(), "{v:?}");
        assert!(m.open_calls.is_empty());
        assert_eq!(m.ids, ["a", "b", "c", "d"]);
    }

    #[test]
    fn every_broken_invariant_is_reported() {
        let (_, v) = check(vec![user(1, "a", "t1", "k"), user(3, "b", "t2", "k2")]);
        assert!(v[0].contains("not contiguous"), "{v:?}");
        let (_, v) = check(vec![user(1, "a", "t1", "k"), user(2, "b", "t2", "k")]);
        assert!(v[0].contains("stored twice"), "{v:?}");
        let (_, v) = check(vec![user(1, "a", "t1", "k"), user(2, "a", "t2", "k2")]);
        assert!(v[0].contains("id a stored twice"), "{v:?}");
        let (_, v) = check(vec![user(1, "a", "t1", "k"), user(2, "b", "t1", "k2")]);
        assert!(v[0].contains("2 user messages"), "{v:?}");
        let (_, v) = check(vec![result(1, "a", "t1", "c9")]);
        assert!(v[0].contains("without an open call"), "{v:?}");
        let (_, v) = check(vec![
            call(1, "a", "t1", "c1"),
            result(2, "b", "t1", "c1"),
            result(3, "c", "t1", "c1"),
        ]);
        assert!(v[0].contains("without an open call"), "{v:?}");
        let (m, v) = check(vec![call(1, "a", "t1", "c1")]);
        assert!(v.is_empty() && m.open_calls.contains("c1"));
    }
}
