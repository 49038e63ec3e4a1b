//! agentrt client.
