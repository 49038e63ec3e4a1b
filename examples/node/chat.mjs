// agentrt from Node: a streamed Chat, a busy session's ErrorInfo, a stopped turn.
//
//   npm ci --prefix examples/node
//   node examples/node/chat.mjs --addr 127.0.0.1:50051 [--key KEY] "Hello there"
//
// Loads proto/ with @grpc/proto-loader, then: creates a session and streams
// the answer to the prompt; starts a second, long turn (--long-prompt) and
// shows that another Chat meanwhile is ABORTED with ErrorInfo SESSION_BUSY;
// stops the long turn and shows its outcome and the trailing status.

import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";
import protobuf from "protobufjs";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    addr: { type: "string", default: "127.0.0.1:50051" },
    key: { type: "string", default: process.env.AGENTRT_TOKEN },
    "long-prompt": { type: "string", default: "Write a long story about a lighthouse keeper." },
  },
});
const prompt = positionals.join(" ") || "Hello there";

const proto = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..", "proto");
const definition = protoLoader.loadSync(["agentrt/v1/sessions.proto", "agentrt/v1/runtime.proto"], {
  keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true, includeDirs: [proto],
});
const { agentrt } = grpc.loadPackageDefinition(definition);
const creds = grpc.credentials.createInsecure();
const sessions = new agentrt.v1.SessionService(values.addr, creds);
const runtime = new agentrt.v1.AgentRuntime(values.addr, creds);
const md = new grpc.Metadata();
if (values.key) md.set("authorization", `Bearer ${values.key}`);
const opts = () => ({ deadline: Date.now() + 300_000 });
// x-agentrt-session lets a mesh send a session's calls to one replica.
const routed = (session_id) => {
  const m = md.clone();
  if (session_id) m.set("x-agentrt-session", session_id);
  return m;
};
const unary = (client, method, request) =>
  new Promise((resolve, reject) =>
    client[method](request, routed(request.session_id), opts(), (err, res) => (err ? reject(err) : resolve(res))));
const chat = (session_id, text) =>
  runtime.Chat({ session_id, content: [{ text: { text } }] }, routed(session_id), opts());

// google.rpc.Status {code = 1, message = 2, repeated Any details = 3} and
// google.rpc.ErrorInfo {reason = 1, domain = 2, map<string,string> metadata = 3}.
const rpc = new protobuf.Root().define("google.rpc");
rpc.add(new protobuf.Type("Any").add(new protobuf.Field("type_url", 1, "string")).add(new protobuf.Field("value", 2, "bytes")));
rpc.add(new protobuf.Type("Status").add(new protobuf.Field("code", 1, "int32"))
  .add(new protobuf.Field("message", 2, "string")).add(new protobuf.Field("details", 3, "Any", "repeated")));
rpc.add(new protobuf.Type("ErrorInfo").add(new protobuf.Field("reason", 1, "string"))
  .add(new protobuf.Field("domain", 2, "string")).add(new protobuf.MapField("metadata", 3, "string", "string")));

/** The ErrorInfo in a failed call's grpc-status-details-bin trailer, or null. */
function errorInfo(err) {
  const [bytes] = err.metadata?.get("grpc-status-details-bin") ?? [];
  if (!bytes) return null;
  const status = rpc.lookupType("Status").decode(bytes);
  const any = status.details.find((d) => d.type_url === "type.googleapis.com/google.rpc.ErrorInfo");
  return any ? rpc.lookupType("ErrorInfo").toObject(rpc.lookupType("ErrorInfo").decode(any.value)) : null;
}

const { session_id } = await unary(sessions, "CreateSession", { title: "example" });
for await (const event of chat(session_id, prompt)) {
  if (event.kind === "text") process.stdout.write(event.text.text);
}
process.stdout.write("\n");

// A second Chat while a turn is live: ABORTED, ErrorInfo SESSION_BUSY. The
// long turn's events are collected with listeners: leaving a `for await`
// early would cancel the call.
const long = chat(session_id, values["long-prompt"]);
const events = [];
const ended = new Promise((resolve) => {
  long.on("error", (err) => resolve(err)); // the non-OK trailing status, after the last event
  long.on("end", () => resolve(null));
});
await new Promise((resolve) => long.on("data", (event) => {
  events.push(event);
  if (event.kind === "text") resolve();
}));
try {
  for await (const _ of chat(session_id, "and another thing"));
  console.log("the long turn had already finished: no SESSION_BUSY to show");
} catch (err) {
  const info = errorInfo(err);
  if (err.code !== grpc.status.ABORTED || !info) throw err;
  console.log(`busy: ${grpc.status[err.code]} ${info.reason} turn_id=${info.metadata.turn_id}`);
}

// Stop it: the stream still ends with turn_finished; the trailing status
// (CANCELLED) arrives after it as the stream's error event.
await unary(runtime, "StopSession", { session_id });
const trailing = await ended;
const finished = events.find((e) => e.kind === "turn_finished");
console.log(`stopped: outcome ${finished?.turn_finished.outcome}, trailing status ${trailing ? grpc.status[trailing.code] : "OK"}`);
sessions.close();
runtime.close();
