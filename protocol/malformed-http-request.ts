import { STATUS_CODES, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Duplex } from "node:stream";
import { CheckpointError } from "./errors.js";

/**
 * Node's HTTP parser refused a request before any route saw it (a bad header, headers past its
 * limit): answers `invalid_request` in the catalog shape on the raw socket, then closes it, instead
 * of a bare 400/431 with no body. Not into a response already under way on that connection (a
 * passthrough answering while its request body streams in), as Node's own handler: that one is cut
 * off instead; nor behind an earlier request still being answered (pipelined), whose answer it would
 * be read as. `counted` sees the refusal when it is answered (a participant's refusal metric).
 */
export function refuseMalformedHttpRequest(error: Error & { code?: string }, socket: Duplex, counted?: (refusal: CheckpointError) => void): void {
  // A reset connection has nobody to answer.
  if (error.code === "ECONNRESET" || socket.destroyed) return;
  const refusal = new CheckpointError("invalid_request", `malformed HTTP request (${error.code ?? error.message})`);
  counted?.(refusal);
  const body = JSON.stringify(refusal.toReply());
  // The response the connection writes next, if any. A client reads what is written here as the
  // answer to the oldest request it has not been answered yet: only when that is the refused
  // request (no response pending, or its own, unstarted, whose request is not all in) is it written.
  // Pipelined behind a request wholly received and still being answered (an op running), it would
  // answer that op `invalid_request`, "nothing ran", while it runs: the connection closes instead.
  const current = (socket as Duplex & { _httpMessage?: { headersSent?: boolean; req?: { complete?: boolean } } | null })._httpMessage;
  if (socket.writable && !current?.headersSent && !current?.req?.complete) {
    socket.write(
      `HTTP/1.1 ${refusal.status} ${STATUS_CODES[refusal.status]}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy();
}

/**
 * An `Expect` other than `100-continue` (which Node answers itself): the catalog refusal,
 * `invalid_request`, instead of Node's bare 417 without a body. `counted` as above.
 */
export function refuseUnknownExpectations(server: Server, counted?: (refusal: CheckpointError) => void): void {
  server.on("checkExpectation", (req: IncomingMessage, res: ServerResponse) => {
    const refusal = new CheckpointError("invalid_request", `unsupported Expect header: ${JSON.stringify(String(req.headers.expect).slice(0, 100))}`);
    counted?.(refusal);
    const body = JSON.stringify(refusal.toReply());
    res.writeHead(refusal.status, { "content-type": "application/json", "content-length": Buffer.byteLength(body), connection: "close" }).end(body);
  });
}
