// The agentrt services as @grpc/grpc-js client constructors, loaded from the
// .proto files the package ships (proto/) with @grpc/proto-loader, and their
// TypeScript types (generated into gen/ with the same options).

import path from "node:path";
import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

import type { ProtoGrpcType as AdminApi } from "./gen/admin.js";
import type { ProtoGrpcType as AgentsApi } from "./gen/agents.js";
import type { ProtoGrpcType as HooksApi } from "./gen/hooks.js";
import type { ProtoGrpcType as RuntimeApi } from "./gen/runtime.js";
import type { ProtoGrpcType as SessionsApi } from "./gen/sessions.js";

/** The package's proto/ directory: agentrt/v1, agentrt/hooks/v1 and google/rpc. */
export const PROTO_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "proto");

/** The .proto files of agentrt's services, relative to PROTO_DIR. */
export const PROTO_FILES = [
  "agentrt/v1/common.proto",
  "agentrt/v1/sessions.proto",
  "agentrt/v1/runtime.proto",
  "agentrt/v1/agents.proto",
  "agentrt/v1/admin.proto",
  "agentrt/hooks/v1/hooks.proto",
];

/**
 * The options the types were generated with: field names as in the .proto
 * (`session_id`), 64-bit integers as numbers, enums as their names
 * (`"TURN_OUTCOME_SUCCESS"`), default values filled in, and the name of the
 * set field of each oneof (`event.kind === "text"`).
 */
export const LOADER_OPTIONS: protoLoader.Options = {
  keepCase: true,
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: [PROTO_DIR],
};

/** Every agentrt package and service: `api.agentrt.v1.AgentRuntime`, `api.agentrt.hooks.v1.HookService`, ... */
export type AgentrtApi = RuntimeApi & SessionsApi & AgentsApi & AdminApi & HooksApi;

let loaded: AgentrtApi | null = null;

/** The services' client constructors and definitions (loaded once). */
export function loadApi(): AgentrtApi {
  loaded ??= grpc.loadPackageDefinition(protoLoader.loadSync(PROTO_FILES, LOADER_OPTIONS)) as unknown as AgentrtApi;
  return loaded;
}
