import type { IncomingMessage, Server, ServerResponse } from "node:http";
import type { Socket } from "node:net";

/**
 * The HTTP API's connections, for its stop. app.close() ends the connections idle at that moment and
 * then waits for every other one to end: for ever for one whose request is still arriving (Node
 * stops timing requests out once its server closes: a client that died mid-request, a slow
 * sender), and until the client drops it for one kept alive after an answer sent during the stop
 * (Fastify's keep-alive timeout, 72 s). The daemon's stop, and the lease release after it, waited
 * as long. Once stopping, a connection is closed as soon as it carries no whole request left to
 * answer: ops under way are still answered, nothing waits on a client. A request whose body is still
 * arriving has run nothing and never will: it is answered `refuseArriving` (with `Connection: close`)
 * at once, so its client learns that, instead of a cut connection it must read as `outcome_unknown`.
 * One whose head is still arriving has no response to answer on: its connection is closed.
 */
export class StoppingConnections {
  /** Per open connection, its requests whose response has not closed yet, with their responses. */
  private readonly requests = new Map<Socket, Map<IncomingMessage, ServerResponse>>();
  private stopping = false;

  constructor(
    server: Server,
    private readonly refuseArriving: (res: ServerResponse) => void,
  ) {
    server.on("connection", (socket: Socket) => {
      // Accepted as the listener closes: not served.
      if (this.stopping) return void socket.destroy();
      this.requests.set(socket, new Map());
      socket.once("close", () => this.requests.delete(socket));
    });
    server.on("request", (req: IncomingMessage, res: ServerResponse) => {
      this.requests.get(req.socket)?.set(req, res);
      res.once("close", () => {
        this.requests.get(req.socket)?.delete(req);
        if (this.stopping) this.closeIfDone(req.socket);
      });
    });
  }

  /** Refuses every request still arriving, closes every connection with no whole request left to answer; the others after their last answer. */
  stop(): void {
    this.stopping = true;
    for (const requests of this.requests.values()) {
      for (const [req, res] of requests) {
        // Node writes it after the answers to the requests before it on that connection (pipelined),
        // and closes the connection after it. Fastify runs no handler for a request answered so.
        if (!req.complete && !res.headersSent) this.refuseArriving(res);
      }
    }
    for (const socket of this.requests.keys()) this.closeIfDone(socket);
  }

  /** Whether a request was pipelined behind `req` on its connection (answered after it, in order). */
  hasRequestBehind(req: IncomingMessage): boolean {
    const order = [...(this.requests.get(req.socket)?.keys() ?? [])];
    const at = order.indexOf(req);
    return at >= 0 && at < order.length - 1;
  }

  private closeIfDone(socket: Socket): void {
    const requests = this.requests.get(socket);
    if (!requests || [...requests.keys()].some((req) => req.complete)) return;
    // destroySoon: an answer already given is written out first.
    socket.destroySoon();
  }
}
