import type { Server, ServerResponse } from "node:http";
import type { Logger } from "pino";
import type { ModelKind } from "../kinds/model/model-kind.js";
import { SHUTDOWN_DRAIN_MS } from "../gym/server-runtime.js";

/**
 * How the attach proxy stops, in two steps around its participant's stop:
 *  - `stopAdmitting()`, the moment shutdown begins (even while the participant still starts): the
 *    listener closes, new generation calls and responses held for an open checkpoint are refused
 *    `admission_closed`, and every connection closes after its current response.
 *  - `close()`, once the participant stopped: responses already started get the same bounded drain
 *    as the Gym servers' requests, what is left is cut (a row written for a cut call is taken back),
 *    then the ledger closes (its stripe lock files and owner file removed), all before NATS and
 *    telemetry close: a shutdown cut short after that (SIGKILL past a supervisor's grace) leaves
 *    nothing in the ledger directory for the next start to take over.
 */
export class AttachProxyShutdown {
  /** Requests whose response has not closed yet. */
  private active = 0;
  private idle: (() => void) | undefined;
  private stopping = false;
  private listenerClosed: Promise<void> | undefined;

  constructor(
    private readonly server: Server,
    private readonly kind: ModelKind,
    private readonly logger?: Logger,
    private readonly drainMs = SHUTDOWN_DRAIN_MS,
  ) {
    server.on("request", (_req, res: ServerResponse) => {
      this.active += 1;
      // A kept-alive connection would carry new calls on through the drain.
      if (this.stopping) res.shouldKeepAlive = false;
      res.once("close", () => {
        this.active -= 1;
        // A connection whose answer was under way when the stop began was kept alive (its head had
        // gone out): now idle, it is closed rather than left to carry more calls through the drain.
        if (this.stopping) this.server.closeIdleConnections();
        if (this.active === 0) this.idle?.();
      });
    });
  }

  stopAdmitting(): void {
    if (this.stopping) return;
    this.stopping = true;
    this.kind.stopAdmitting();
    this.closeListener();
  }

  /** Stops listening, once; a signal during the listen itself finds the listener up only in close(). */
  private closeListener(): void {
    if (this.listenerClosed === undefined && this.server.listening) this.listenerClosed = new Promise((resolve) => this.server.close(() => resolve()));
    this.server.closeIdleConnections();
  }

  async close(): Promise<void> {
    this.stopAdmitting();
    this.closeListener();
    if (this.active > 0) {
      let timer: NodeJS.Timeout | undefined;
      const drained = await Promise.race([
        new Promise<boolean>((resolve) => (this.idle = () => resolve(true))),
        new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), this.drainMs))),
      ]);
      clearTimeout(timer);
      // Their callers see the connection close; said in the log, not dropped silently.
      if (!drained) this.logger?.warn({ requests: this.active, drain_ms: this.drainMs }, "shutdown: requests still running after the drain are cut");
    }
    this.server.closeAllConnections();
    await this.listenerClosed;
    await this.kind.close();
  }
}
