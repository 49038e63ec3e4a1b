//! The store contract suite (`agentrt_testkit::contract`) against both
//! stores of the core: every check is a test of each.

mod memory {
    use agentrt_runtime::store::MemoryStore;

    agentrt_testkit::store_contract_tests!(MemoryStore::new());
}

mod sled {
    use agentrt_runtime::store::SledStore;

    fn open_temp() -> (SledStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        (SledStore::open(dir.path().join("db")).expect("open"), dir)
    }

    agentrt_testkit::store_contract_tests!(guarded: open_temp());
}
