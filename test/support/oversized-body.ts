import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/**
 * An HTTP server on 127.0.0.1 (ephemeral port) answering `status` with a JSON-ish body of `bytes`
 * bytes, written as the client reads it. Bounded, so an uncapped client reads it all rather than
 * hang; `cancelled` resolves once a client went away before the body's end. Make `bytes` well past
 * the limit under test (twice it): socket buffers take megabytes the client has not read yet.
 */
export interface OversizedBodyServer {
  url: string;
  cancelled: Promise<void>;
  /** How many bodies were sent to their end (a client read them whole). */
  completed(): number;
  close(): Promise<void>;
}

const CHUNK = Buffer.alloc(64 * 1024, 0x20); // spaces: a body that JSON.parse would take, once ended by "{}"

export async function startOversizedBody(
  bytes: number,
  options: { status?: number; /** answers a request itself (returns true), say the op beside a /readyz */ route?: (req: IncomingMessage, res: ServerResponse) => boolean } = {},
): Promise<OversizedBodyServer> {
  let onCancel!: () => void;
  const cancelled = new Promise<void>((resolve) => (onCancel = resolve));
  let completed = 0;
  const server: Server = createServer((req, res) => {
    req.resume();
    if (options.route?.(req, res)) return;
    res.writeHead(options.status ?? 200, { "content-type": "application/json" });
    let sent = 0;
    let ended = false;
    res.on("close", () => void (ended || onCancel()));
    const pump = () => {
      while (sent < bytes - 2) {
        const piece = CHUNK.subarray(0, Math.min(CHUNK.length, bytes - 2 - sent));
        sent += piece.length;
        if (!res.write(piece)) return void res.once("drain", pump);
      }
      ended = true;
      res.end("{}", () => void (completed += 1));
    };
    pump();
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    cancelled,
    completed: () => completed,
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}
