import { STATUS_CODES, type ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { CheckpointError, toCheckpointError } from "../../protocol/index.js";
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

/**
 * Node's HTTP parser refused the request before the proxy saw it (a bad header, headers past its
 * limit): answered `invalid_request` in the catalog shape on the raw socket, which is then closed,
 * instead of Node's bare 400/431 with no body.
 */
export function refuseMalformedRequest(error: Error & { code?: string }, socket: Duplex): void {
  // A reset connection has nobody to answer.
  if (error.code === "ECONNRESET" || socket.destroyed) return;
  const refusal = new CheckpointError("invalid_request", `malformed HTTP request (${error.code ?? error.message})`);
  countRefusal(refusal, "model");
  const body = JSON.stringify(refusal.toReply());
  // Not into a response already under way on this connection (a passthrough answering while its
  // request body streams in), as Node's own handler: that one is cut off instead.
  const current = (socket as Duplex & { _httpMessage?: ServerResponse | null })._httpMessage;
  if (socket.writable && !current?.headersSent) {
    socket.write(
      `HTTP/1.1 ${refusal.status} ${STATUS_CODES[refusal.status]}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy();
}
