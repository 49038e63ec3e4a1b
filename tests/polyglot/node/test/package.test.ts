// The agentrt-client package itself: installed from its tarball (not the
// repository's tree), complete (every .proto of proto/agentrt), typed, and
// its facade: connect, Chat's typed events, AgentrtError with the details.

import assert from "node:assert/strict";
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { after, before, describe, it } from "node:test";

import grpc from "@grpc/grpc-js";
import {
  AgentrtError,
  type ChatEvent__Output,
  type Client,
  PROTO_DIR,
  PROTO_FILES,
  connect,
  detailsOf,
  loadApi,
  statusOf,
} from "agentrt-client";

import { REPO_ROOT, env } from "./helpers.js";

const kinds = (events: ChatEvent__Output[]) => events.map((e) => e.kind);

/** Every .proto under `dir`/agentrt, relative to `dir`. */
function protosUnder(dir: string, rel = "agentrt"): string[] {
  return fs.readdirSync(path.join(dir, rel), { withFileTypes: true }).flatMap((entry) => {
    const sub = path.join(rel, entry.name);
    if (entry.isDirectory()) return protosUnder(dir, sub);
    return entry.name.endsWith(".proto") ? [sub] : [];
  });
}

describe("the agentrt-client package", () => {
  let client: Client;

  before(() => {
    client = connect(`http://${env("POLYGLOT_ADDR")}`, env("POLYGLOT_KEY_A"));
  });
  after(() => client.close());

  it("is the installed tarball of the server's version", () => {
    const require = createRequire(import.meta.url);
    const manifest = require.resolve("agentrt-client/package.json");
    const installed = path.join(REPO_ROOT, "tests", "polyglot", "node", "node_modules", "agentrt-client");
    assert.equal(path.dirname(manifest), installed);
    assert.ok(!fs.lstatSync(installed).isSymbolicLink(), "agentrt-client is a link, not an installed package");
    assert.equal(PROTO_DIR, path.join(installed, "proto"));
    const cargo = fs.readFileSync(path.join(REPO_ROOT, "Cargo.toml"), "utf8");
    const version = /^\[workspace\.package\]\nversion = "([^"]+)"/m.exec(cargo)?.[1];
    assert.equal(JSON.parse(fs.readFileSync(manifest, "utf8")).version, version);
  });

  it("ships and loads every .proto of proto/agentrt", () => {
    const repo = protosUnder(path.join(REPO_ROOT, "proto")).sort();
    assert.deepEqual(protosUnder(PROTO_DIR).sort(), repo);
    assert.deepEqual([...PROTO_FILES].sort(), repo);
    const api = loadApi();
    for (const service of [api.agentrt.v1.AgentRuntime, api.agentrt.v1.SessionService, api.agentrt.v1.AgentService, api.agentrt.v1.RuntimeAdmin]) {
      assert.equal(typeof service, "function");
    }
    assert.ok(api.agentrt.hooks.v1.HookService.service.BeforeTurn, "no HookService definition");
  });

  it("chat yields the typed events of a turn, for await ends at the last", async () => {
    const session = await client.createSession({ title: "facade" });
    const events: ChatEvent__Output[] = [];
    for await (const event of client.chat(session.session_id, "hello [think]", {}, 30)) {
      events.push(event);
    }
    assert.equal(events[0].kind, "turn_started");
    assert.equal(events.at(-1)?.kind, "turn_finished");
    assert.equal(events.at(-1)?.turn_finished?.outcome, "TURN_OUTCOME_SUCCESS");
    assert.equal(events.map((e) => e.text?.text ?? "").join(""), "echo: hello [think]");
    assert.deepEqual((await client.history(session.session_id)).map((m) => m.role), ["ROLE_USER", "ROLE_ASSISTANT"]);
    // The types are the generated ones: a misspelt field does not compile.
    // @ts-expect-error: TextDelta has no field `txt`
    assert.equal(events[1].text?.txt, undefined);
  });

  it("a busy session is AgentrtError ABORTED with ErrorInfo; a stopped turn's for await throws CANCELLED", async () => {
    const { session_id } = await client.createSession();
    const live = client.chat(session_id, "[hang]", {}, 30);
    const [started] = await live.until((e) => e.kind === "text");
    const { events, error } = await client.chat(session_id, "me too", {}, 30).drain();
    assert.deepEqual(events, []);
    assert.ok(error instanceof AgentrtError, `not an AgentrtError: ${error}`);
    assert.equal(error.code, grpc.status.ABORTED);
    assert.equal(error.codeName, "ABORTED");
    assert.equal(error.reason, "SESSION_BUSY");
    assert.equal(error.errorInfo?.domain, "agentrt");
    assert.equal(error.errorInfo?.metadata.turn_id, started.turn_id);
    assert.equal(error.status?.code, grpc.status.ABORTED);
    assert.deepEqual(error.statusDetails.map((d) => d.type), ["ErrorInfo"]);
    assert.match(error.message, /^ABORTED: .*\(SESSION_BUSY\)$/);
    assert.equal(await client.stop(session_id), true);
    const rest: ChatEvent__Output[] = [];
    await assert.rejects(
      (async () => {
        for await (const event of live) rest.push(event);
      })(),
      (e: unknown) => e instanceof AgentrtError && e.code === grpc.status.CANCELLED,
    );
    assert.equal(rest.at(-1)?.turn_finished?.outcome, "TURN_OUTCOME_CANCELED", `kinds: ${kinds(rest)}`);
    assert.equal(await client.stop(session_id), false);
  });

  it("a refused request carries BadRequest naming the field", async () => {
    const { session_id } = await client.createSession();
    const { error } = await client.chat(session_id, "should not run", { model: "nowhere/x" }, 30).drain();
    assert.equal(error?.code, grpc.status.INVALID_ARGUMENT);
    const fields = error?.badRequest?.field_violations.map((v) => v.field);
    assert.ok(fields?.includes("model"), `BadRequest fields: ${fields}`);
    assert.deepEqual(error?.detail("BadRequest"), error?.badRequest);
    assert.equal(error?.quotaFailure, null);
    assert.equal(error?.retryInfo, null);
    // The same decoding from the raw error's trailer.
    assert.deepEqual(detailsOf(statusOf(error!)), error?.statusDetails);
  });

  it("errors of the generated clients map through unary; a wrong key is UNAUTHENTICATED", async () => {
    const bob = connect(env("POLYGLOT_ADDR"), env("POLYGLOT_KEY_B"));
    const stranger = connect(env("POLYGLOT_ADDR"), "not-a-configured-key");
    try {
      const { session_id } = await client.createSession();
      await assert.rejects(
        bob.unary((cb) => bob.sessions.GetSession({ session_id }, cb)),
        (e: unknown) => e instanceof AgentrtError && e.code === grpc.status.NOT_FOUND,
      );
      const raw = await new Promise<grpc.ServiceError | null>((resolve) =>
        bob.sessions.GetSession({ session_id }, (err) => resolve(err)),
      );
      assert.ok(raw && !(raw instanceof AgentrtError));
      assert.equal(AgentrtError.from(raw).code, grpc.status.NOT_FOUND);
      await assert.rejects(stranger.createSession(), (e: unknown) => e instanceof AgentrtError && e.code === grpc.status.UNAUTHENTICATED);
    } finally {
      bob.close();
      stranger.close();
    }
  });

  it("refuses a URL of another scheme and root certificates for plaintext", () => {
    assert.throws(() => connect("grpc://127.0.0.1:1"), /unsupported URL scheme/);
    assert.throws(() => connect("http://127.0.0.1:1", undefined, { rootCerts: Buffer.from("pem") }), /use https:\/\//);
  });
});
