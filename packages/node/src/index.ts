// agentrt-client: the agentrt services for @grpc/grpc-js with TypeScript
// types, the google.rpc status details and a thin typed facade.
//
//   const client = connect("http://127.0.0.1:50051", "KEY");
//   const { session_id } = await client.createSession();
//   for await (const event of client.chat(session_id, "Hello there")) {
//     if (event.kind === "text") process.stdout.write(event.text!.text);
//   }
//
// Every generated type is at "agentrt-client/types/<path>", e.g.
// "agentrt-client/types/agentrt/v1/ChatEvent" (ChatEvent, ChatEvent__Output).

export { type AgentrtApi, LOADER_OPTIONS, PROTO_DIR, PROTO_FILES, loadApi } from "./api.js";
export { AgentrtError, ChatStream, Client, type ConnectOptions, SESSION_HEADER, connect } from "./client.js";
export {
  type DetailTypes,
  type StatusDetail,
  detailOf,
  detailsOf,
  errorInfoOf,
  findDetail,
  statusOf,
} from "./status.js";

export type { ChatEvent, ChatEvent__Output } from "./gen/agentrt/v1/ChatEvent.js";
export type { ChatRequest } from "./gen/agentrt/v1/ChatRequest.js";
export type { ContentBlock, ContentBlock__Output } from "./gen/agentrt/v1/ContentBlock.js";
export type { Message__Output } from "./gen/agentrt/v1/Message.js";
export type { Session__Output } from "./gen/agentrt/v1/Session.js";
export type { AgentRuntimeClient } from "./gen/agentrt/v1/AgentRuntime.js";
export type { AgentServiceClient } from "./gen/agentrt/v1/AgentService.js";
export type { RuntimeAdminClient } from "./gen/agentrt/v1/RuntimeAdmin.js";
export type { SessionServiceClient } from "./gen/agentrt/v1/SessionService.js";
export type { HookServiceHandlers } from "./gen/agentrt/hooks/v1/HookService.js";
export type { Status__Output } from "./gen/google/rpc/Status.js";
