// The google.rpc.Status of a failed call, from its grpc-status-details-bin
// trailer, with its details decoded to the messages of
// google/rpc/error_details.proto (ErrorInfo, BadRequest, QuotaFailure, ...).

import path from "node:path";

import type * as grpc from "@grpc/grpc-js";
import protobuf from "protobufjs";

import { PROTO_DIR } from "./api.js";
import type { BadRequest__Output } from "./gen/google/rpc/BadRequest.js";
import type { DebugInfo__Output } from "./gen/google/rpc/DebugInfo.js";
import type { ErrorInfo__Output } from "./gen/google/rpc/ErrorInfo.js";
import type { Help__Output } from "./gen/google/rpc/Help.js";
import type { LocalizedMessage__Output } from "./gen/google/rpc/LocalizedMessage.js";
import type { PreconditionFailure__Output } from "./gen/google/rpc/PreconditionFailure.js";
import type { QuotaFailure__Output } from "./gen/google/rpc/QuotaFailure.js";
import type { RequestInfo__Output } from "./gen/google/rpc/RequestInfo.js";
import type { ResourceInfo__Output } from "./gen/google/rpc/ResourceInfo.js";
import type { RetryInfo__Output } from "./gen/google/rpc/RetryInfo.js";
import type { Status__Output } from "./gen/google/rpc/Status.js";

/** The detail messages of google/rpc/error_details.proto, by name. */
export interface DetailTypes {
  ErrorInfo: ErrorInfo__Output;
  RetryInfo: RetryInfo__Output;
  DebugInfo: DebugInfo__Output;
  QuotaFailure: QuotaFailure__Output;
  PreconditionFailure: PreconditionFailure__Output;
  BadRequest: BadRequest__Output;
  RequestInfo: RequestInfo__Output;
  ResourceInfo: ResourceInfo__Output;
  Help: Help__Output;
  LocalizedMessage: LocalizedMessage__Output;
}

const DETAIL_NAMES: (keyof DetailTypes)[] = [
  "ErrorInfo",
  "RetryInfo",
  "DebugInfo",
  "QuotaFailure",
  "PreconditionFailure",
  "BadRequest",
  "RequestInfo",
  "ResourceInfo",
  "Help",
  "LocalizedMessage",
];

/** One detail of a status: a known google.rpc message, decoded, or the raw bytes of another type. */
export type StatusDetail =
  | { [K in keyof DetailTypes]: { type: K; typeUrl: string; value: DetailTypes[K] } }[keyof DetailTypes]
  | { type: null; typeUrl: string; value: Buffer };

/** The same conversion as the generated types' (see LOADER_OPTIONS). */
const TO_OBJECT: protobuf.IConversionOptions = { longs: Number, enums: String, defaults: true, oneofs: true };
const TYPE_URL_PREFIX = "type.googleapis.com/google.rpc.";

let root: protobuf.Root | null = null;
function rpcRoot(): protobuf.Root {
  if (root === null) {
    const loading = new protobuf.Root();
    loading.resolvePath = (_origin, target) => path.join(PROTO_DIR, target);
    loading.loadSync(["google/rpc/status.proto", "google/rpc/error_details.proto"], { keepCase: true });
    root = loading;
  }
  return root;
}

/** The google.rpc.Status in an error's grpc-status-details-bin trailer, or null when it has none. */
export function statusOf(error: Pick<grpc.ServiceError, "metadata">): Status__Output | null {
  const [bytes] = error.metadata?.get("grpc-status-details-bin") ?? [];
  if (!(bytes instanceof Buffer)) {
    return null;
  }
  const type = rpcRoot().lookupType("google.rpc.Status");
  return type.toObject(type.decode(bytes), TO_OBJECT) as Status__Output;
}

/** The details of a status, each decoded to its google.rpc message where it is one. */
export function detailsOf(status: Status__Output | null): StatusDetail[] {
  return (status?.details ?? []).map((any) => {
    const name = any.type_url.startsWith(TYPE_URL_PREFIX) ? any.type_url.slice(TYPE_URL_PREFIX.length) : "";
    const known = DETAIL_NAMES.find((n) => n === name);
    if (!known) {
      return { type: null, typeUrl: any.type_url, value: Buffer.from(any.value) };
    }
    const type = rpcRoot().lookupType(`google.rpc.${known}`);
    const value = type.toObject(type.decode(any.value), TO_OBJECT);
    return { type: known, typeUrl: any.type_url, value } as StatusDetail;
  });
}

/** The first detail of type `name` among an error's status details, or null. */
export function detailOf<K extends keyof DetailTypes>(
  error: Pick<grpc.ServiceError, "metadata">,
  name: K,
): DetailTypes[K] | null {
  return findDetail(detailsOf(statusOf(error)), name);
}

/** The ErrorInfo (reason, domain, metadata) of a failed call, or null. */
export function errorInfoOf(error: Pick<grpc.ServiceError, "metadata">): ErrorInfo__Output | null {
  return detailOf(error, "ErrorInfo");
}

export function findDetail<K extends keyof DetailTypes>(details: StatusDetail[], name: K): DetailTypes[K] | null {
  const found = details.find((d) => d.type === name);
  return found ? (found.value as DetailTypes[K]) : null;
}
