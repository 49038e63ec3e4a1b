//! agentrt gRPC server.
