// agentrt's A2A gRPC binding driven by the official JS SDK (@a2a-js/sdk):
// its ClientFactory, its gRPC transport (@a2a-js/sdk/client/grpc), its
// typed errors. run.sh exports A2A_TARGET, A2A_KEY, A2A_OTHER_KEY and
// UPSTREAM_URL.
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { Message, TaskState } from "@a2a-js/sdk";
import { ClientFactory, ClientFactoryOptions } from "@a2a-js/sdk/client";
import { GrpcTransportFactory } from "@a2a-js/sdk/client/grpc";

function env(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set: run the suite through tests/a2a/run.sh`);
  return value;
}

const target = env("A2A_TARGET");
const auth = (key) => ({ serviceParameters: key ? { authorization: `Bearer ${key}` } : {} });
const alice = auth(env("A2A_KEY"));
const bob = auth(env("A2A_OTHER_KEY"));

const factory = new ClientFactory(
  ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new GrpcTransportFactory()],
    preferredTransports: ["GRPC"],
  }),
);

/** The card as the SDK reads it over gRPC: a client for a minimal card
 * naming the gRPC interface, then getAgentCard (GetExtendedAgentCard). */
async function connect() {
  const bootstrap = await factory.createFromAgentCard({
    name: "bootstrap",
    supportedInterfaces: [{ url: target, protocolBinding: "GRPC", tenant: "", protocolVersion: "1.0" }],
    capabilities: { streaming: true, extendedAgentCard: true, extensions: [] },
    securitySchemes: {},
    securityRequirements: [],
    defaultInputModes: [],
    defaultOutputModes: [],
    skills: [],
    signatures: [],
  });
  const card = await bootstrap.getAgentCard(alice);
  return { card, client: await factory.createFromAgentCard(card) };
}

const { card, client } = await connect();

function request(text, contextId = "") {
  return {
    tenant: "",
    message: Message.fromJSON({
      messageId: randomUUID(),
      contextId,
      role: "ROLE_USER",
      parts: [{ text }],
    }),
  };
}

const payload = (event) => event.payload?.$case;
const artifactText = (events) =>
  events
    .filter((e) => payload(e) === "artifactUpdate")
    .flatMap((e) => e.payload.value.artifact.parts)
    .map((p) => p.content.value)
    .join("");
const finalState = (events) => {
  const updates = events.filter((e) => payload(e) === "statusUpdate");
  assert.ok(updates.length > 0, "a status update");
  return updates.at(-1).payload.value.status.state;
};
const isWorking = (e) =>
  payload(e) === "statusUpdate" && e.payload.value.status.state === TaskState.TASK_STATE_WORKING;

async function collect(iterable) {
  const out = [];
  for await (const e of iterable) out.push(e);
  return out;
}

/** Reads the stream until `until` holds; returns the events and the rest. */
async function readUntil(iterable, until) {
  const it = iterable[Symbol.asyncIterator]();
  const seen = [];
  for (;;) {
    const { value, done } = await it.next();
    assert.ok(!done, `the stream ended early: ${JSON.stringify(seen)}`);
    seen.push(value);
    if (until(value, seen)) return { seen, it };
  }
}

async function rest(it) {
  const out = [];
  for (;;) {
    const { value, done } = await it.next();
    if (done) return out;
    out.push(value);
  }
}

async function rejectsWith(promiseOrIterable, name) {
  const run = async () => {
    const p = promiseOrIterable;
    if (p && typeof p[Symbol.asyncIterator] === "function") {
      for await (const _ of p) {
        // drain
      }
    } else {
      await p;
    }
  };
  await assert.rejects(run, (err) => {
    assert.equal(err.name, name, `${err.name}: ${err.message}`);
    return true;
  });
}

test("the agent card names the gRPC interface, streaming and bearer auth", () => {
  assert.equal(card.name, "agentrt");
  assert.equal(card.capabilities.streaming, true);
  assert.equal(card.capabilities.pushNotifications, false);
  assert.deepEqual(
    card.supportedInterfaces.map((i) => [i.protocolBinding, i.url, i.protocolVersion]),
    [["GRPC", target, "1.0"]],
  );
  assert.equal(card.securitySchemes.bearer.scheme.value.scheme, "Bearer");
});

test("a streamed message runs to completion", async () => {
  const events = await collect(client.sendMessageStream(request("hello node"), alice));
  assert.equal(payload(events[0]), "task");
  const task = events[0].payload.value;
  assert.equal(task.status.state, TaskState.TASK_STATE_SUBMITTED);
  assert.ok(isWorking(events[1]));
  assert.equal(artifactText(events), "echo: hello node");
  const chunks = events.filter((e) => payload(e) === "artifactUpdate").map((e) => e.payload.value);
  assert.deepEqual(chunks.map((c) => c.lastChunk), [...chunks.slice(1).map(() => false), true]);
  assert.equal(finalState(events), TaskState.TASK_STATE_COMPLETED);
  const stored = await client.getTask({ tenant: "", id: task.id }, alice);
  assert.equal(stored.status.state, TaskState.TASK_STATE_COMPLETED);
  assert.equal(stored.artifacts[0].parts[0].content.value, "echo: hello node");
});

test("cancel ends a hanging task and closes the upstream request", async () => {
  const { seen, it } = await readUntil(client.sendMessageStream(request("[hang] node"), alice), isWorking);
  const id = seen[0].payload.value.id;
  const canceled = await client.cancelTask({ tenant: "", id }, alice);
  assert.equal(canceled.status.state, TaskState.TASK_STATE_CANCELED);
  assert.equal(finalState(await rest(it)), TaskState.TASK_STATE_CANCELED);
  // The fake upstream notices the closed connection on its own thread: ask
  // until it reports nothing open (each ask is a round trip, no sleep).
  const until = Date.now() + 10_000;
  for (;;) {
    const counts = await (await fetch(`${env("UPSTREAM_URL")}/requests`)).json();
    if (counts.open === 0) break;
    assert.ok(Date.now() < until, "the upstream request stayed open after the cancel");
  }
  await rejectsWith(client.cancelTask({ tenant: "", id }, alice), "TaskNotCancelableError");
});

test("a resubscribe after a disconnect misses nothing", async () => {
  const expected = Array.from({ length: 40 }, (_, k) => `tick ${k + 1} `).join("");
  // [gate]: the upstream pauses after "tick 2 " until released, so the task
  // is still live when the caller comes back (no race with its end).
  const { seen, it } = await readUntil(
    client.sendMessageStream(request("[slow 40] [gate] node"), alice),
    (_, all) => all.filter((e) => payload(e) === "artifactUpdate").length === 2,
  );
  await it.return(); // the caller goes away mid-task
  assert.equal(artifactText(seen), "tick 1 tick 2 ");
  const id = seen[0].payload.value.id;
  const replayed = await readUntil(
    client.resubscribeTask({ tenant: "", id }, alice),
    (_, all) => artifactText(all) === "tick 1 tick 2 ",
  );
  assert.equal(payload(replayed.seen[0]), "task");
  const release = await fetch(`${env("UPSTREAM_URL")}/release`, { method: "POST" });
  assert.equal((await release.json()).released, 1);
  const resumed = [...replayed.seen, ...(await rest(replayed.it))];
  assert.equal(artifactText(resumed), expected);
  assert.equal(finalState(resumed), TaskState.TASK_STATE_COMPLETED);
  await rejectsWith(client.resubscribeTask({ tenant: "", id }, alice), "UnsupportedOperationError");
});

test("unknown and other users' tasks are TaskNotFoundError", async () => {
  await rejectsWith(client.getTask({ tenant: "", id: "nope" }, alice), "TaskNotFoundError");
  await rejectsWith(client.getTask({ tenant: "", id: "no-such-context/0190" }, alice), "TaskNotFoundError");
  const events = await collect(client.sendMessageStream(request("mine, node"), alice));
  const id = events[0].payload.value.id;
  await rejectsWith(client.getTask({ tenant: "", id }, bob), "TaskNotFoundError");
});

test("a message to a busy context waits SUBMITTED, then runs", async () => {
  const { seen, it } = await readUntil(client.sendMessageStream(request("[hang] busy node"), alice), isWorking);
  const task = seen[0].payload.value;
  // A2A has no busy error: the second message waits in the context's inbox.
  const queued = await readUntil(
    client.sendMessageStream(request("me too, node", task.contextId), alice),
    (e) => payload(e) === "task",
  );
  const waiting = queued.seen[0].payload.value;
  assert.equal(waiting.status.state, TaskState.TASK_STATE_SUBMITTED);
  assert.notEqual(waiting.id, task.id);
  const got = await client.getTask({ tenant: "", id: waiting.id }, alice);
  assert.equal(got.status.state, TaskState.TASK_STATE_SUBMITTED);
  await client.cancelTask({ tenant: "", id: task.id }, alice);
  assert.equal(finalState(await rest(it)), TaskState.TASK_STATE_CANCELED);
  const after = await rest(queued.it);
  assert.equal(artifactText(after), "echo: me too, node");
  assert.equal(finalState(after), TaskState.TASK_STATE_COMPLETED);
});

test("missing or wrong keys are UNAUTHENTICATED", async () => {
  for (const key of [undefined, "wrong-key"]) {
    await assert.rejects(
      collect(client.sendMessageStream(request("hi"), auth(key))),
      (err) => {
        assert.equal(err.status, 16, `${err.name}: ${err.message}`); // UNAUTHENTICATED
        return true;
      },
    );
  }
});

test("a caller tool call is INPUT_REQUIRED and its result resumes the task", async () => {
  const first = request("[tool lookup] node");
  first.metadata = {
    agentrt_extra_tools: [{ name: "lookup", description: "looks it up", parameters: { type: "object" } }],
  };
  const events = await collect(client.sendMessageStream(first, alice));
  const task = events[0].payload.value;
  const status = events.at(-1).payload.value.status;
  assert.equal(status.state, TaskState.TASK_STATE_INPUT_REQUIRED);
  const call = status.message.parts[0].content.value.tool_call;
  assert.deepEqual([call.call_id, call.name], ["call_1", "lookup"]);

  const answer = {
    tenant: "",
    message: Message.fromJSON({
      messageId: randomUUID(),
      taskId: task.id,
      role: "ROLE_USER",
      parts: [{ data: { call_id: "call_1", content: "42" } }],
    }),
  };
  const resumed = await collect(client.sendMessageStream(answer, alice));
  assert.equal(payload(resumed[0]), "task");
  assert.equal(artifactText(resumed), "tool said: 42");
  assert.equal(finalState(resumed), TaskState.TASK_STATE_COMPLETED);
});
