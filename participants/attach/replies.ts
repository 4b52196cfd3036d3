import type { Server, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { refuseMalformedHttpRequest, refuseUnknownExpectations, toCheckpointError } from "../../protocol/index.js";
import { countRefusal } from "../telemetry/instruments.js";
import { DECODED_CODINGS } from "./request-body-coding.js";

/** A small JSON answer with its length (ledger API, health, refusals), and any `headers` of its own. */
export function json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const payload = JSON.stringify(body);
  res.writeHead(status, { ...headers, "content-type": "application/json", "content-length": Buffer.byteLength(payload) });
  res.end(payload);
}

/**
 * A refusal body with its documented code; `status` overrides the code's own (502 for upstream
 * failures). Counted in `gym_ckpt.refusals` as the model participant's, like every data-plane refusal.
 * A body coding the proxy cannot decode is answered with the codings it can in `Accept-Encoding`
 * (RFC 9110 §12.5.3: a 415 for a content coding ought to list them).
 */
export function refuse(res: ServerResponse, error: unknown, status?: number): void {
  const refusal = toCheckpointError(error);
  countRefusal(error, "model");
  json(res, status ?? refusal.status, refusal.toReply(), refusal.code === "unsupported_content_coding" ? { "accept-encoding": DECODED_CODINGS } : {});
}

/** A request Node's HTTP parser refused: the catalog refusal on the raw socket, counted as the model participant's. */
export function refuseMalformedRequest(error: Error & { code?: string }, socket: Duplex): void {
  refuseMalformedHttpRequest(error, socket, (refusal) => countRefusal(refusal, "model"));
}

/** An `Expect` Node does not know: the catalog refusal instead of a bare 417, counted as the model participant's. */
export function refuseUnknownExpectationsOn(server: Server): void {
  refuseUnknownExpectations(server, (refusal) => countRefusal(refusal, "model"));
}
