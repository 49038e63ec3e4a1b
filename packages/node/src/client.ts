// A thin typed facade over the generated clients: one channel with the
// bearer key on every call, Chat's event stream read event by event, and
// failures as AgentrtError (the code plus the decoded google.rpc details).

import * as grpc from "@grpc/grpc-js";

import { loadApi } from "./api.js";
import type { RuntimeAdminClient } from "./gen/agentrt/v1/RuntimeAdmin.js";
import type { AgentServiceClient } from "./gen/agentrt/v1/AgentService.js";
import type { AgentRuntimeClient } from "./gen/agentrt/v1/AgentRuntime.js";
import type { SessionServiceClient } from "./gen/agentrt/v1/SessionService.js";
import type { ChatEvent__Output } from "./gen/agentrt/v1/ChatEvent.js";
import type { ChatRequest } from "./gen/agentrt/v1/ChatRequest.js";
import type { ContentBlock } from "./gen/agentrt/v1/ContentBlock.js";
import type { CreateSessionRequest } from "./gen/agentrt/v1/CreateSessionRequest.js";
import type { Message__Output } from "./gen/agentrt/v1/Message.js";
import type { Session__Output } from "./gen/agentrt/v1/Session.js";
import type { SubmitToolApprovalRequest } from "./gen/agentrt/v1/SubmitToolApprovalRequest.js";
import type { SubmitToolResultRequest } from "./gen/agentrt/v1/SubmitToolResultRequest.js";
import type { BadRequest__Output } from "./gen/google/rpc/BadRequest.js";
import type { ErrorInfo__Output } from "./gen/google/rpc/ErrorInfo.js";
import type { QuotaFailure__Output } from "./gen/google/rpc/QuotaFailure.js";
import type { RetryInfo__Output } from "./gen/google/rpc/RetryInfo.js";
import type { Status__Output } from "./gen/google/rpc/Status.js";
import { type DetailTypes, type StatusDetail, detailsOf, findDetail, statusOf } from "./status.js";

/** The routing header: lets a service mesh send one session's calls to one replica. */
export const SESSION_HEADER = "x-agentrt-session";

/**
 * A failed agentrt call: a grpc.ServiceError (`code`, `details`, `metadata`)
 * with the google.rpc.Status of its trailer decoded (`statusDetails`, and
 * `errorInfo`, `reason`, `badRequest`, `quotaFailure`, `retryInfo`).
 */
export class AgentrtError extends Error implements grpc.ServiceError {
  readonly code: grpc.status;
  /** The status message. */
  readonly details: string;
  readonly metadata: grpc.Metadata;
  /** The google.rpc.Status of the trailer, or null when the server sent none. */
  readonly status: Status__Output | null;
  /** The status details, decoded. */
  readonly statusDetails: StatusDetail[];

  constructor(code: grpc.status, details: string, metadata = new grpc.Metadata(), options?: { cause?: unknown }) {
    const status = statusOf({ metadata });
    const statusDetails = detailsOf(status);
    const reason = findDetail(statusDetails, "ErrorInfo")?.reason;
    super(`${grpc.status[code] ?? code}: ${details}${reason ? ` (${reason})` : ""}`, options);
    this.name = "AgentrtError";
    this.code = code;
    this.details = details;
    this.metadata = metadata;
    this.status = status;
    this.statusDetails = statusDetails;
  }

  /** The error of a failed call of the generated clients (an AgentrtError stays as it is). */
  static from(error: grpc.ServiceError | AgentrtError): AgentrtError {
    if (error instanceof AgentrtError) {
      return error;
    }
    return new AgentrtError(error.code, error.details, error.metadata, { cause: error });
  }

  /** The status code's name: "ABORTED", "NOT_FOUND", ... */
  get codeName(): string {
    return grpc.status[this.code] ?? String(this.code);
  }

  /** The first detail of type `name` ("QuotaFailure", ...), or null. */
  detail<K extends keyof DetailTypes>(name: K): DetailTypes[K] | null {
    return findDetail(this.statusDetails, name);
  }

  /** The ErrorInfo detail: `reason` (SESSION_BUSY, ...), `domain` ("agentrt") and `metadata`. */
  get errorInfo(): ErrorInfo__Output | null {
    return this.detail("ErrorInfo");
  }

  /** The ErrorInfo reason, or null. */
  get reason(): string | null {
    return this.errorInfo?.reason ?? null;
  }

  /** The BadRequest detail: the refused fields and why. */
  get badRequest(): BadRequest__Output | null {
    return this.detail("BadRequest");
  }

  /** The QuotaFailure detail: the quota that was exceeded. */
  get quotaFailure(): QuotaFailure__Output | null {
    return this.detail("QuotaFailure");
  }

  /** The RetryInfo detail: how long to wait before trying again. */
  get retryInfo(): RetryInfo__Output | null {
    return this.detail("RetryInfo");
  }
}

/**
 * The events of a Chat or Subscribe call, read one at a time (`next`,
 * `until`, `drain`) or with `for await`. A non-OK trailing status (after the
 * last event, e.g. CANCELLED for a stopped turn) is kept in `error`; `for
 * await` throws it. Leaving a loop early does not end the call: read on, or
 * `cancel()` it.
 */
export class ChatStream implements AsyncIterable<ChatEvent__Output> {
  private readonly queue: ChatEvent__Output[] = [];
  private waiting: (() => void) | null = null;
  private ended = false;
  /** The trailing error once the call has ended with one. */
  error: AgentrtError | null = null;

  constructor(readonly call: grpc.ClientReadableStream<ChatEvent__Output>) {
    call.on("data", (event: ChatEvent__Output) => {
      this.queue.push(event);
      this.wake();
    });
    call.on("error", (error: grpc.ServiceError) => {
      this.error = AgentrtError.from(error);
      this.ended = true;
      this.wake();
    });
    call.on("end", () => {
      this.ended = true;
      this.wake();
    });
  }

  private wake(): void {
    const waiting = this.waiting;
    this.waiting = null;
    waiting?.();
  }

  /** The next event, or null once the stream has ended (see `error`). */
  async next(): Promise<ChatEvent__Output | null> {
    while (this.queue.length === 0 && !this.ended) {
      await new Promise<void>((resolve) => (this.waiting = resolve));
    }
    return this.queue.shift() ?? null;
  }

  /** Reads events until one satisfies `done`; returns all read (the last matched). Throws if the stream ends first. */
  async until(done: (event: ChatEvent__Output) => boolean): Promise<ChatEvent__Output[]> {
    const seen: ChatEvent__Output[] = [];
    for (let event = await this.next(); event; event = await this.next()) {
      seen.push(event);
      if (done(event)) {
        return seen;
      }
    }
    throw new Error(
      `the stream ended before the awaited event (${this.error?.message ?? "OK"}); kinds: ${seen.map((e) => e.kind)}`,
    );
  }

  /** Reads to the end: the remaining events and the trailing error (null when OK). */
  async drain(): Promise<{ events: ChatEvent__Output[]; error: AgentrtError | null }> {
    const events: ChatEvent__Output[] = [];
    for (let event = await this.next(); event; event = await this.next()) {
      events.push(event);
    }
    return { events, error: this.error };
  }

  /** Cancels the call (the turn goes on or stops as the request's on_disconnect says). */
  cancel(): void {
    this.call.cancel();
  }

  [Symbol.asyncIterator](): AsyncIterator<ChatEvent__Output> {
    return {
      next: async () => {
        const event = await this.next();
        if (event) {
          return { value: event, done: false };
        }
        if (this.error) {
          throw this.error;
        }
        return { value: undefined, done: true };
      },
    };
  }
}

export interface ConnectOptions {
  /** PEM root certificates for an https:// URL (default: Node's trust roots). */
  rootCerts?: Buffer;
  /** @grpc/grpc-js channel options. */
  channelOptions?: grpc.ChannelOptions;
}

/** The agentrt services on one channel, every call sent with one key. */
export class Client {
  readonly channel: grpc.Channel;
  readonly sessions: SessionServiceClient;
  readonly runtime: AgentRuntimeClient;
  readonly agents: AgentServiceClient;
  readonly admin: RuntimeAdminClient;

  constructor(target: string, credentials: grpc.ChannelCredentials, token?: string, options: grpc.ChannelOptions = {}) {
    const api = loadApi();
    this.channel = new grpc.Channel(target, credentials, options);
    const interceptors: grpc.Interceptor[] = token ? [bearer(token)] : [];
    const clientOptions: grpc.ClientOptions = { channelOverride: this.channel, interceptors };
    this.sessions = new api.agentrt.v1.SessionService(target, credentials, clientOptions);
    this.runtime = new api.agentrt.v1.AgentRuntime(target, credentials, clientOptions);
    this.agents = new api.agentrt.v1.AgentService(target, credentials, clientOptions);
    this.admin = new api.agentrt.v1.RuntimeAdmin(target, credentials, clientOptions);
  }

  /** Call options with a deadline `seconds` from now (none when undefined). */
  options(seconds?: number): grpc.CallOptions {
    return seconds === undefined ? {} : { deadline: Date.now() + seconds * 1000 };
  }

  /** Metadata with the routing header of `sessionId` (the key is added to every call anyway). */
  metadata(sessionId?: string): grpc.Metadata {
    const metadata = new grpc.Metadata();
    if (sessionId) {
      metadata.set(SESSION_HEADER, sessionId);
    }
    return metadata;
  }

  /**
   * Runs one unary call of a generated client, given as
   * `(callback) => client.sessions.GetSession(request, callback)`; a failure
   * rejects with AgentrtError.
   */
  unary<T>(start: (callback: (error: grpc.ServiceError | null, value?: T) => void) => void): Promise<T> {
    return new Promise((resolve, reject) => {
      start((error, value) => (error ? reject(AgentrtError.from(error)) : resolve(value as T)));
    });
  }

  /** Creates a session (`agent_id` for a session of an agent, `title`, ...). */
  createSession(request: CreateSessionRequest = {}, seconds = 30): Promise<Session__Output> {
    return this.unary((cb) => this.sessions.CreateSession(request, this.metadata(), this.options(seconds), cb));
  }

  /** The first page of the session's stored messages, oldest first. */
  async history(sessionId: string, seconds = 30): Promise<Message__Output[]> {
    const response = await this.unary<{ messages: Message__Output[] }>((cb) =>
      this.sessions.GetHistory({ session_id: sessionId }, this.metadata(sessionId), this.options(seconds), cb),
    );
    return response.messages;
  }

  /**
   * Sends a user message (a text, or content blocks) and streams the turn's
   * events. `extra` sets other ChatRequest fields (`model`, `on_busy`,
   * `extra_tools`, ...); `seconds` is the call's deadline, before which the
   * server ends the turn as TIMED_OUT.
   */
  chat(sessionId: string, content: string | ContentBlock[], extra: Partial<ChatRequest> = {}, seconds?: number): ChatStream {
    const blocks = typeof content === "string" ? [{ text: { text: content } }] : content;
    const request: ChatRequest = { session_id: sessionId, content: blocks, ...extra };
    return new ChatStream(this.runtime.Chat(request, this.metadata(sessionId), this.options(seconds)));
  }

  /** Watches the session's live turn: the events after `afterSeq` (replayed), then the rest as they happen. */
  subscribe(sessionId: string, afterSeq = 0, seconds?: number): ChatStream {
    const request = { session_id: sessionId, after_seq: afterSeq };
    return new ChatStream(this.runtime.Subscribe(request, this.metadata(sessionId), this.options(seconds)));
  }

  /** Stops the session's live turn; false when none was running. */
  async stop(sessionId: string, seconds = 30): Promise<boolean> {
    const response = await this.unary<{ stopped: boolean }>((cb) =>
      this.runtime.StopSession({ session_id: sessionId }, this.metadata(sessionId), this.options(seconds), cb),
    );
    return response.stopped;
  }

  /** Answers a caller-executed tool call (a `tool_call` event). */
  async submitToolResult(request: SubmitToolResultRequest, seconds = 30): Promise<void> {
    await this.unary((cb) =>
      this.runtime.SubmitToolResult(request, this.metadata(request.session_id), this.options(seconds), cb),
    );
  }

  /** Approves or denies a server tool call (an `approval_required` event). */
  async submitToolApproval(request: SubmitToolApprovalRequest, seconds = 30): Promise<void> {
    await this.unary((cb) =>
      this.runtime.SubmitToolApproval(request, this.metadata(request.session_id), this.options(seconds), cb),
    );
  }

  /** Closes the channel; calls still running are cancelled. */
  close(): void {
    this.channel.close();
  }
}

/** Adds `authorization: Bearer KEY` to every call (call credentials would refuse a plaintext channel). */
function bearer(token: string): grpc.Interceptor {
  return (options, nextCall) =>
    new grpc.InterceptingCall(nextCall(options), {
      start(metadata, listener, next) {
        metadata.set("authorization", `Bearer ${token}`);
        next(metadata, listener);
      },
    });
}

/**
 * A client of the server at `url`: `http://HOST:PORT` or `HOST:PORT` in
 * plaintext (a local server), `https://HOST:PORT` over TLS verified against
 * Node's trust roots (or `options.rootCerts`). `token` is the bearer key
 * sent with every call. The channel connects on first use.
 */
export function connect(url: string, token?: string, options: ConnectOptions = {}): Client {
  const https = url.startsWith("https://");
  let target = url;
  if (https || url.startsWith("http://")) {
    target = url.slice(url.indexOf("://") + 3).replace(/\/+$/, "");
  } else if (url.includes("://")) {
    throw new Error(`unsupported URL scheme in ${url}: use http://, https:// or HOST:PORT`);
  }
  if (!https && options.rootCerts) {
    throw new Error(`rootCerts given for a plaintext URL (${url}): use https://`);
  }
  const credentials = https ? grpc.credentials.createSsl(options.rootCerts ?? null) : grpc.credentials.createInsecure();
  return new Client(target, credentials, token, options.channelOptions);
}
