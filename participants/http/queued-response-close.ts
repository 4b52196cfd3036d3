import type { Server, ServerResponse } from "node:http";
import type { Socket } from "node:net";

/**
 * When a connection dies, Node closes only the response attached to it: a pipelined response still
 * queued behind that one never emits 'close' (nor 'finish'), so whatever waits for it (a model call's
 * admission ticket, a resources request counted in flight, and a retire or shutdown waiting for
 * those) waited for good. Such responses are closed here the way Node closes an attached one
 * (destroyed, then 'close'); one that got the connection meanwhile hears its close from Node.
 */
export function closeQueuedResponsesWithConnection(server: Server): void {
  const queued = new WeakMap<Socket, Set<ServerResponse>>();
  server.on("request", (req, res: ServerResponse) => {
    if (res.socket) return;
    let responses = queued.get(req.socket);
    if (!responses) {
      const waiting = (responses = new Set());
      queued.set(req.socket, waiting);
      // One listener per connection, not per queued response (a caller may pipeline dozens).
      req.socket.once("close", () => {
        for (const response of waiting) {
          response.destroyed = true;
          response.emit("close");
        }
      });
    }
    const waiting = responses;
    waiting.add(res);
    res.once("socket", () => waiting.delete(res));
  });
}
