// The polyglot scenarios through the agentrt-client package (@grpc/grpc-js)
// against agentrt-server and the scripted fake upstream
// (tests/polyglot/fake_upstream.py).

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, describe, it } from "node:test";

import grpc from "@grpc/grpc-js";

import type { GetAgentResponse__Output } from "agentrt-client/types/agentrt/v1/GetAgentResponse";
import type { GetBlobResponse__Output } from "agentrt-client/types/agentrt/v1/GetBlobResponse";
import type { GetMemoryResponse__Output } from "agentrt-client/types/agentrt/v1/GetMemoryResponse";
import type { UpdateMemoryResponse__Output } from "agentrt-client/types/agentrt/v1/UpdateMemoryResponse";
import type { GetHistoryResponse__Output } from "agentrt-client/types/agentrt/v1/GetHistoryResponse";
import type { UploadBlobResponse__Output } from "agentrt-client/types/agentrt/v1/UploadBlobResponse";
import type { Session__Output } from "agentrt-client/types/agentrt/v1/Session";
import type { StopSessionResponse__Output } from "agentrt-client/types/agentrt/v1/StopSessionResponse";
import {
  type ChatEvent__Output,
  User,
  EventReader,
  env,
  errorInfoOf,
  releaseGate,
  statusOf,
  textOf,
} from "./helpers.js";

function finishedOf(events: ChatEvent__Output[]) {
  const done = events.filter((e) => e.kind === "turn_finished");
  assert.equal(done.length, 1, `expected one turn_finished, kinds: ${events.map((e) => e.kind)}`);
  return done[0].turn_finished!;
}

function seqs(events: ChatEvent__Output[]): number[] {
  return events.map((e) => e.seq);
}

function range(from: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => from + i);
}

/** Expects `promise` to reject with a gRPC status `code`; returns the error. */
async function rejectsWith(promise: Promise<unknown>, code: grpc.status): Promise<grpc.ServiceError> {
  try {
    await promise;
  } catch (error) {
    const err = error as grpc.ServiceError;
    assert.equal(err.code, code, `expected ${grpc.status[code]}, got ${grpc.status[err.code]}: ${err.details}`);
    return err;
  }
  assert.fail(`expected ${grpc.status[code]}, the call succeeded`);
}

describe("agentrt through @grpc/grpc-js", () => {
  let alice: User;
  let bob: User;

  before(() => {
    alice = new User(env("POLYGLOT_ADDR"), env("POLYGLOT_KEY_A"));
    bob = new User(env("POLYGLOT_ADDR"), env("POLYGLOT_KEY_B"));
  });
  after(() => {
    alice.close();
    bob.close();
  });

  const stop = (user: User, session_id: string) =>
    user.unary<StopSessionResponse__Output>((cb) => user.runtime.StopSession({ session_id }, user.metadata, user.options(), cb));
  const history = (user: User, session_id: string) =>
    user.unary<GetHistoryResponse__Output>((cb) => user.sessions.GetHistory({ session_id }, user.metadata, user.options(), cb));
  const getSession = (user: User, session_id: string) =>
    user.unary<Session__Output>((cb) => user.sessions.GetSession({ session_id }, user.metadata, user.options(), cb));

  it("a turn yields every event kind and is stored", async () => {
    const sid = await alice.createSession();
    const { events, error } = await alice.chat(sid, "hello [think]").drain();
    assert.equal(error, null);
    const kinds = events.map((e) => e.kind);
    assert.equal(kinds[0], "turn_started");
    assert.equal(kinds.at(-1), "turn_finished");
    for (const expected of ["reasoning", "text", "step", "message_stored", "usage"]) {
      assert.ok(kinds.includes(expected as never), `no ${expected} event in ${kinds}`);
    }
    assert.deepEqual(seqs(events), range(1, events.length));
    assert.ok(events[0].turn_id);
    assert.ok(events.every((e) => e.session_id === sid && e.turn_id === events[0].turn_id));
    const reasoning = events.map((e) => e.reasoning?.text ?? "").join("");
    assert.equal(reasoning, "thinking hard");
    assert.equal(textOf(events), "echo: hello [think]");
    assert.equal(finishedOf(events).outcome, "TURN_OUTCOME_SUCCESS");
    const usage = events.find((e) => e.kind === "usage")!.usage!.usage!;
    assert.equal(usage.input_tokens, 10);
    assert.equal(usage.output_tokens, 3);
    const stored = events.filter((e) => e.kind === "message_stored").map((e) => e.message_stored!.role);
    assert.deepEqual(stored, ["ROLE_USER", "ROLE_ASSISTANT"]);

    const { messages } = await history(alice, sid);
    assert.deepEqual(messages.map((m) => m.role), ["ROLE_USER", "ROLE_ASSISTANT"]);
    const textIn = (i: number) => messages[i].content.map((b) => b.text?.text ?? "").join("");
    assert.equal(textIn(0), "hello [think]");
    assert.equal(textIn(1), "echo: hello [think]");
  });

  it("a second Chat on a busy session is ABORTED with ErrorInfo SESSION_BUSY", async () => {
    const sid = await alice.createSession();
    const live = alice.chat(sid, "[hang]");
    const first = await live.until((e) => e.kind === "text");
    try {
      const { events, error } = await alice.chat(sid, "me too").drain();
      assert.deepEqual(events, []);
      assert.ok(error, "the second Chat succeeded");
      assert.equal(error.code, grpc.status.ABORTED, error.details);
      const status = statusOf(error);
      assert.equal(status?.code, grpc.status.ABORTED);
      const info = errorInfoOf(error);
      assert.equal(info?.reason, "SESSION_BUSY");
      assert.equal(info?.domain, "agentrt");
      assert.equal(info?.metadata.turn_id, first[0].turn_id);
    } finally {
      assert.equal((await stop(alice, sid)).stopped, true);
    }
    const { events } = await live.drain();
    assert.equal(finishedOf(events).outcome, "TURN_OUTCOME_CANCELED");
  });

  it("Subscribe with after_seq resumes with the next event", async () => {
    const sid = await alice.createSession();
    // [gate]: the upstream pauses after "tick 2 " until released, so the turn
    // is still live when the watcher attaches (no race with its end).
    const chat = alice.chat(sid, "[slow 30] [gate]", { on_disconnect: "ON_DISCONNECT_CONTINUE" });
    const seen = await chat.until((e) => e.text?.text === "tick 2 ");
    const { seq, turn_id } = seen.at(-1)!;
    // after_seq one before "tick 2 ": the replay starts with it, which also
    // shows the watcher is attached before the upstream is released.
    const watch = new EventReader(
      alice.runtime.Subscribe({ session_id: sid, after_seq: seq - 1 }, alice.metadata, alice.options()),
    );
    const first = await watch.next();
    assert.ok(first, "Subscribe ended without an event");
    assert.deepEqual([first.seq, first.kind, first.text?.text], [seq, "text", "tick 2 "]);
    chat.call.cancel(); // on_disconnect CONTINUE: the turn runs on, the watcher sees the rest
    assert.equal(await releaseGate(), 1);
    const { events: rest, error } = await watch.drain();
    const events = [first, ...rest];
    assert.equal(error, null);
    assert.deepEqual(seqs(events), range(seq, events.length));
    assert.ok(events.every((e) => e.turn_id === turn_id));
    assert.equal(events.at(-1)!.kind, "turn_finished");
    assert.equal(finishedOf(events).outcome, "TURN_OUTCOME_SUCCESS");
    const ticks = range(1, 30).map((k) => `tick ${k} `).join("");
    assert.equal(textOf(seen) + textOf(rest), ticks);
  });

  it("StopSession cancels the live turn; the trailing status is CANCELLED", async () => {
    const sid = await alice.createSession();
    const live = alice.chat(sid, "[hang]");
    await live.until((e) => e.kind === "text");
    assert.equal((await stop(alice, sid)).stopped, true);
    const { events, error } = await live.drain();
    assert.equal(events.at(-1)!.kind, "turn_finished");
    const done = finishedOf(events);
    assert.equal(done.outcome, "TURN_OUTCOME_CANCELED");
    assert.equal(done.cancel_reason, "CANCEL_REASON_STOPPED");
    assert.equal(error?.code, grpc.status.CANCELLED, `trailing status ${error?.code}`);
    assert.equal((await stop(alice, sid)).stopped, false);
  });

  it("a caller-executed tool gets its result through SubmitToolResult", async () => {
    const sid = await alice.createSession();
    const chat = alice.chat(sid, "find it [tool lookup]", {
      extra_tools: [
        {
          name: "lookup",
          description: "looks a word up",
          parameters_json_schema: '{"type":"object","properties":{"q":{"type":"string"}}}',
        },
      ],
    });
    const seen = await chat.until((e) => e.kind === "tool_call");
    const { turn_id, tool_call } = seen.at(-1)!;
    assert.equal(tool_call!.name, "lookup");
    assert.equal(tool_call!.call_id, "call_1");
    assert.deepEqual(JSON.parse(tool_call!.arguments_json), { q: "find it [tool lookup]" });
    await alice.unary((cb) =>
      alice.runtime.SubmitToolResult(
        { session_id: sid, turn_id, call_id: tool_call!.call_id, content: "forty-two" },
        alice.metadata,
        alice.options(),
        cb,
      ),
    );
    const { events, error } = await chat.drain();
    assert.equal(error, null);
    assert.equal(textOf(events), "tool said: forty-two");
    assert.equal(finishedOf(events).outcome, "TURN_OUTCOME_SUCCESS");
    assert.deepEqual(seqs([...seen, ...events]), range(1, seen.length + events.length));
  });

  /** A turn paused on caller tool `wait`: its reader and its tool_call event. */
  async function waitingOnATool(sid: string) {
    const chat = alice.chat(sid, "first [tool wait]", {
      extra_tools: [
        { name: "wait", description: "waits for the caller", parameters_json_schema: '{"type":"object","properties":{}}' },
      ],
    });
    const seen = await chat.until((e) => e.kind === "tool_call");
    return { chat, call: seen.at(-1)! };
  }
  const submit = (sid: string, turn_id: string, call_id: string) =>
    alice.unary((cb) =>
      alice.runtime.SubmitToolResult(
        { session_id: sid, turn_id, call_id, content: "done" },
        alice.metadata,
        alice.options(),
        cb,
      ),
    );

  it("ON_BUSY_ENQUEUE queues a message that runs as its own turn after the live one", async () => {
    const sid = await alice.createSession();
    const { chat, call } = await waitingOnATool(sid);
    const queued = alice.chat(sid, "second", { on_busy: "ON_BUSY_ENQUEUE" });
    const [head] = await queued.until((e) => e.kind === "queued");
    assert.equal(Number(head.queued!.position), 1);
    await submit(sid, call.turn_id, call.tool_call!.call_id);
    const first = await chat.drain();
    assert.equal(first.error, null);
    assert.equal(finishedOf(first.events).outcome, "TURN_OUTCOME_SUCCESS");
    const { events, error } = await queued.drain();
    assert.equal(error, null);
    assert.equal(events[0].kind, "turn_started");
    assert.deepEqual([...new Set(events.map((e) => e.turn_id))], [head.turn_id]);
    assert.equal(textOf(events), "echo: second");
    assert.equal(finishedOf(events).outcome, "TURN_OUTCOME_SUCCESS");
  });

  it("ON_BUSY_STEER joins the live turn at its next step", async () => {
    const sid = await alice.createSession();
    const { chat, call } = await waitingOnATool(sid);
    const steer = alice.chat(sid, "and this too", { on_busy: "ON_BUSY_STEER" });
    await submit(sid, call.turn_id, call.tool_call!.call_id);
    const { events, error } = await steer.drain();
    assert.equal(error, null);
    assert.equal(events[0].kind, "steered");
    assert.ok(Number(events[0].steered!.message_seq) > 0);
    assert.deepEqual([...new Set(events.map((e) => e.turn_id))], [call.turn_id]);
    assert.equal(textOf(events), "echo: and this too");
    assert.equal(finishedOf(events).outcome, "TURN_OUTCOME_SUCCESS");
    assert.equal((await chat.drain()).error, null);
  });

  it("an approved server tool call runs; a second decision is FAILED_PRECONDITION", async () => {
    const sid = await alice.createSession();
    const chat = alice.chat(sid, "approve [tool t__echo]", { require_approval: ["*"] });
    const seen = await chat.until((e) => e.kind === "approval_required");
    const asked = seen.at(-1)!.approval_required!;
    assert.equal(asked.name, "t__echo");
    const decide = () =>
      alice.unary((cb) =>
        alice.runtime.SubmitToolApproval(
          { session_id: sid, call_id: asked.call_id, approved: true, reason: "" },
          alice.metadata,
          alice.options(),
          cb,
        ),
      );
    await decide();
    await assert.rejects(decide(), (e: grpc.ServiceError) => e.code === grpc.status.FAILED_PRECONDITION);
    const { events, error } = await chat.drain();
    assert.equal(error, null);
    assert.ok(textOf(events).startsWith("tool said: "), textOf(events));
    assert.equal(finishedOf(events).outcome, "TURN_OUTCOME_SUCCESS");
  });

  it("a 2 s client deadline ends the turn TIMED_OUT, then DEADLINE_EXCEEDED", async () => {
    const sid = await alice.createSession();
    const { events, error } = await alice.chat(sid, "[hang]", {}, 2).drain();
    assert.equal(error?.code, grpc.status.DEADLINE_EXCEEDED, `trailing status ${error?.code}`);
    // The server ends the turn a margin before the deadline, so the outcome
    // reaches the client before the trailing status.
    assert.equal(events.at(-1)?.kind, "turn_finished");
    assert.equal(finishedOf(events).outcome, "TURN_OUTCOME_TIMED_OUT");
  });

  it("another user's session is NOT_FOUND", async () => {
    const sid = await alice.createSession();
    assert.equal((await getSession(alice, sid)).session_id, sid);
    await rejectsWith(getSession(bob, sid), grpc.status.NOT_FOUND);
    const { events, error } = await bob.chat(sid, "not yours").drain();
    assert.deepEqual(events, []);
    assert.equal(error?.code, grpc.status.NOT_FOUND);
    await rejectsWith(history(bob, sid), grpc.status.NOT_FOUND);
  });

  it("bad input is rejected before any event", async () => {
    const sid = await alice.createSession();
    const { events, error } = await alice.chat(sid, "should not run", { model: "nowhere/x" }).drain();
    assert.deepEqual(events, []);
    assert.equal(error?.code, grpc.status.INVALID_ARGUMENT);
    await rejectsWith(getSession(alice, "no-such-session"), grpc.status.NOT_FOUND);
    assert.deepEqual((await history(alice, sid)).messages, []);
  });

  it("an unknown key is UNAUTHENTICATED", async () => {
    const stranger = new User(env("POLYGLOT_ADDR"), "not-a-configured-key");
    try {
      await rejectsWith(stranger.createSession(), grpc.status.UNAUTHENTICATED);
    } finally {
      stranger.close();
    }
  });

  it("an uploaded file and an inline image reach the model, and GetBlob reads them back", async () => {
    const sid = await alice.createSession();
    const text = Buffer.from("quarterly numbers\n".repeat(20_000));
    const sha256 = createHash("sha256").update(text).digest("hex");
    const uploaded = await alice.unary<UploadBlobResponse__Output>((cb) => {
      const call = alice.sessions.UploadBlob(alice.metadata, alice.options(), cb);
      call.write({
        session_id: sid,
        upload_id: "node-upload",
        size: text.length,
        sha256,
        mime_type: "text/plain",
        name: "numbers.txt",
        write_offset: 0,
      });
      for (let at = 0; at < text.length; at += 64 << 10) {
        call.write({ data: text.subarray(at, at + (64 << 10)) });
      }
      call.end();
    });
    assert.equal(uploaded.committed_size, text.length);
    assert.equal(uploaded.blob?.blob_id, sha256);

    const png = Buffer.concat([Buffer.from("89504e470d0a1a0a", "hex"), Buffer.alloc(10_000, 7)]);
    const { events, error } = await alice
      .chat(sid, "[media] look", {
        content: [
          { text: { text: "[media] look" } },
          { image: { data: png, mime_type: "image/png" } },
          { file: { blob_id: sha256, mime_type: "text/plain" } },
        ],
      })
      .drain();
    assert.equal(error, null);
    assert.equal(finishedOf(events).outcome, "TURN_OUTCOME_SUCCESS");
    // The model was shown the image; the text file went as text.
    assert.equal(textOf(events), "saw: image/png");
    assert.deepEqual(events.filter((e) => e.kind === "notice"), []);

    const { messages } = await history(alice, sid);
    const blocks = messages[0].content;
    assert.deepEqual(blocks.map((b) => b.block), ["text", "image", "file"]);
    assert.equal(blocks[1].image?.data.length, 0);
    assert.equal(blocks[1].image?.size, png.length);
    assert.equal(blocks[2].file?.name, "numbers.txt");

    const read = (user: User, blob_id: string) =>
      new Promise<Buffer>((resolve, reject) => {
        const parts: Buffer[] = [];
        const call = user.sessions.GetBlob({ session_id: sid, blob_id }, user.metadata, user.options());
        call.on("data", (chunk: GetBlobResponse__Output) => parts.push(Buffer.from(chunk.data)));
        call.on("error", reject);
        call.on("end", () => resolve(Buffer.concat(parts)));
      });
    assert.ok((await read(alice, sha256)).equals(text));
    assert.ok((await read(alice, blocks[1].image!.blob_id)).equals(png));
    await rejectsWith(read(bob, sha256), grpc.status.NOT_FOUND);
  });

  it("a session of an agent and the user's own memory", async () => {
    const got = await alice.unary<GetAgentResponse__Output>((cb) =>
      alice.agents.GetAgent({ agent_id: "helper" }, alice.metadata, alice.options(), cb),
    );
    assert.equal(got.agent?.agent_id, "helper");
    assert.equal(got.agent?.source, "AGENT_SOURCE_CONFIG");
    const session = await alice.unary<Session__Output>((cb) =>
      alice.sessions.CreateSession({ agent_id: "helper" }, alice.metadata, alice.options(), cb),
    );
    assert.equal(session.agent_id, "helper");
    assert.ok(session.agent_version >= 1);
    const written = await alice.unary<UpdateMemoryResponse__Output>((cb) =>
      alice.agents.UpdateMemory(
        { agent_id: "helper", edits: [{ block: "todo", set: "water the plants" }] },
        alice.metadata,
        alice.options(),
        cb,
      ),
    );
    assert.equal(written.blocks.todo, "water the plants");
    const read = (user: User, user_id = "") =>
      user.unary<GetMemoryResponse__Output>((cb) =>
        user.agents.GetMemory({ agent_id: "helper", user_id }, user.metadata, user.options(), cb),
      );
    assert.equal((await read(alice)).blocks.todo, "water the plants");
    assert.equal((await read(bob)).blocks.todo, undefined);
    await rejectsWith(read(bob, "alice"), grpc.status.PERMISSION_DENIED);
    const { events, error } = await alice.chat(session.session_id, "hello agent").drain();
    assert.equal(error, null);
    assert.equal(finishedOf(events).outcome, "TURN_OUTCOME_SUCCESS");
  });
});
