// Shared helpers of the Node suite, on the agentrt-client package that
// tests/polyglot/run.sh built from proto/ (packages/node, `npm pack`) and
// installed here: its clients, ChatStream and status detail decoding.
//
// tests/polyglot/run.sh passes POLYGLOT_ADDR, POLYGLOT_KEY_A and
// POLYGLOT_KEY_B (bearer keys of two different users).

import assert from "node:assert/strict";
import path from "node:path";
import { fileURLToPath } from "node:url";

import grpc from "@grpc/grpc-js";
import {
  type AgentRuntimeClient,
  type AgentServiceClient,
  type ChatEvent__Output,
  type ChatRequest,
  ChatStream,
  type Client,
  type SessionServiceClient,
  connect,
  errorInfoOf,
  statusOf,
} from "agentrt-client";

export type { ChatEvent__Output };
export { errorInfoOf, statusOf };
/** The package's event reader, under the suite's name for it. */
export const EventReader = ChatStream;
export type EventReader = ChatStream;

// build/test/helpers.js → the repository root is five levels up.
const here = path.dirname(fileURLToPath(import.meta.url));
export const REPO_ROOT = path.resolve(here, "..", "..", "..", "..", "..");

/** Lets the fake upstream's `[gate]`d streams go on; returns how many were waiting. */
export async function releaseGate(): Promise<number> {
  const response = await fetch(`http://${env("POLYGLOT_UPSTREAM")}/release`, { method: "POST" });
  assert.equal(response.status, 200, `POST /release answered ${response.status}`);
  return ((await response.json()) as { released: number }).released;
}

export function env(name: string): string {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set: run this suite through tests/polyglot/run.sh`);
  }
  return value;
}

/** The services through the package's Client, every call sent as one user. */
export class User {
  readonly client: Client;
  readonly sessions: SessionServiceClient;
  readonly runtime: AgentRuntimeClient;
  readonly agents: AgentServiceClient;
  /** Extra metadata of a call: none; the client adds the key to every call. */
  readonly metadata = new grpc.Metadata();

  constructor(addr: string, key: string) {
    this.client = connect(`http://${addr}`, key);
    this.sessions = this.client.sessions;
    this.runtime = this.client.runtime;
    this.agents = this.client.agents;
  }

  /** Call options with a deadline `seconds` from now. */
  options(seconds = 30): grpc.CallOptions {
    return this.client.options(seconds);
  }

  /** Runs one unary call given as `(callback) => client.Method(req, md, opts, callback)`; rejects with AgentrtError. */
  unary<T>(start: (callback: (err: grpc.ServiceError | null, value?: T) => void) => void): Promise<T> {
    return this.client.unary(start);
  }

  async createSession(title = "polyglot node"): Promise<string> {
    return (await this.client.createSession({ title })).session_id;
  }

  chat(sessionId: string, text: string, extra: Partial<ChatRequest> = {}, seconds = 30): ChatStream {
    return this.client.chat(sessionId, text, extra, seconds);
  }

  close(): void {
    this.client.close();
  }
}

export function textOf(events: ChatEvent__Output[]): string {
  return events.map((e) => (e.kind === "text" ? (e.text?.text ?? "") : "")).join("");
}
