import type { ServerResponse } from "node:http";
import { toCheckpointError } from "../../protocol/index.js";

/** A small JSON answer with its length (ledger API, health, refusals). */
export function json(res: ServerResponse, status: number, body: unknown): void {
  const payload = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(payload) });
  res.end(payload);
}

/** A refusal body with its documented code; `status` overrides the code's own (502 for upstream failures). */
export function refuse(res: ServerResponse, error: unknown, status?: number): void {
  const refusal = toCheckpointError(error);
  json(res, status ?? refusal.status, refusal.toReply());
}
