import type { Server, ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { refuseMalformedHttpRequest, refuseUnknownExpectations, toCheckpointError } from "../../protocol/index.js";
import { countRefusal } from "../telemetry/instruments.js";

/** A small JSON answer with its length (ledger API, health, refusals). */
export function json(res: ServerResponse, status: number, body: unknown): void {
  const payload = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(payload) });
  res.end(payload);
}

/**
 * A refusal body with its documented code; `status` overrides the code's own (502 for upstream
 * failures). Counted in `gym_ckpt.refusals` as the model participant's, like every data-plane refusal.
 */
export function refuse(res: ServerResponse, error: unknown, status?: number): void {
  const refusal = toCheckpointError(error);
  countRefusal(error, "model");
  json(res, status ?? refusal.status, refusal.toReply());
}

/** A request Node's HTTP parser refused: the catalog refusal on the raw socket, counted as the model participant's. */
export function refuseMalformedRequest(error: Error & { code?: string }, socket: Duplex): void {
  refuseMalformedHttpRequest(error, socket, (refusal) => countRefusal(refusal, "model"));
}

/** An `Expect` Node does not know: the catalog refusal instead of a bare 417, counted as the model participant's. */
export function refuseUnknownExpectationsOn(server: Server): void {
  refuseUnknownExpectations(server, (refusal) => countRefusal(refusal, "model"));
}
