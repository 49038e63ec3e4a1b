//! End-to-end tests: a real server (tonic, runtime core, sled on disk) on
//! `127.0.0.1:0`, driven through the client crate.

mod e2e {
    mod agents;
    mod approvals;
    mod budgets;
    mod busy;
    mod chat;
    mod compaction;
    mod control;
    mod delegate;
    mod fault_matrix;
    pub(crate) mod harness;
    mod hooks;
    mod identity;
    mod isolation;
    mod limits_input;
    mod limits_model;
    mod mcp;
    mod media;
    mod openai;
    mod restricted;
    mod server_tools;
    mod sessions;
    mod speakers;
    mod tools;
    mod turns;
}
