// agentrt from Node: a streamed Chat, a busy session's ErrorInfo, a stopped turn.
//
//   packages/node/build.sh                      # prints the tarball's path
//   npm ci --prefix examples/node
//   npm install --prefix examples/node --no-save packages/node/dist/agentrt-client-0.1.0.tgz
//   node examples/node/chat.mjs --addr 127.0.0.1:50051 [--key KEY] "Hello there"
//
// With the agentrt-client package: creates a session and streams the answer
// to the prompt; starts a second, long turn (--long-prompt) and shows that
// another Chat meanwhile fails with AgentrtError ABORTED, ErrorInfo
// SESSION_BUSY; stops the long turn and shows its outcome and the trailing
// status.

import { parseArgs } from "node:util";

import { connect } from "agentrt-client";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    addr: { type: "string", default: "127.0.0.1:50051" }, // http://HOST:PORT, https://HOST:PORT or HOST:PORT
    key: { type: "string", default: process.env.AGENTRT_TOKEN },
    "long-prompt": { type: "string", default: "Write a long story about a lighthouse keeper." },
  },
});
const prompt = positionals.join(" ") || "Hello there";

const client = connect(values.addr, values.key);
const { session_id } = await client.createSession({ title: "example" });
for await (const event of client.chat(session_id, prompt, {}, 300)) {
  if (event.kind === "text") process.stdout.write(event.text.text);
}
process.stdout.write("\n");

// A second Chat while a turn is live: ABORTED, ErrorInfo SESSION_BUSY. The
// long turn is read with until(): unlike leaving a grpc-js `for await`
// early, it leaves the call running.
const long = client.chat(session_id, values["long-prompt"], {}, 300);
await long.until((event) => event.kind === "text");
const busy = await client.chat(session_id, "and another thing").drain();
if (!busy.error) {
  console.log("the long turn had already finished: no SESSION_BUSY to show");
} else if (busy.error.errorInfo) {
  console.log(`busy: ${busy.error.codeName} ${busy.error.reason} turn_id=${busy.error.errorInfo.metadata.turn_id}`);
} else {
  throw busy.error;
}

// Stop it: the stream still ends with turn_finished; the trailing status
// (CANCELLED) comes after it, as the stream's error.
await client.stop(session_id);
const { events, error } = await long.drain();
const finished = events.find((e) => e.kind === "turn_finished");
console.log(`stopped: outcome ${finished?.turn_finished.outcome}, trailing status ${error ? error.codeName : "OK"}`);
client.close();
