import type { IncomingHttpHeaders, ServerResponse } from "node:http";
import type { Dispatcher } from "undici";
import { CheckpointError } from "../../protocol/index.js";
import { CallerStall } from "./caller-stall.js";
import type { CodingWarnings } from "./coding-warnings.js";
import { answerRepresentationRefusal, callerHeaders } from "./hop-headers.js";
import { refuse } from "./replies.js";

/**
 * An untracked call's upstream answer (`/v1/models`, …), as an undici dispatch handler: head and
 * chunks written straight to the caller, the upstream paused while the caller's socket is full. The
 * caller leaving drops the upstream call; so does a caller that stopped reading, once its full socket
 * has not drained for `finishWaitMs` (a generation call's bound): it held an upstream connection until shutdown.
 * An answer whose `Connection` names a header describing its body is a 502 instead (`answerRepresentationRefusal`).
 */
export class PassthroughCall implements Dispatcher.DispatchHandler {
  private controller: Dispatcher.DispatchController | null = null;
  private done = false;
  private stopped = false;
  private readonly stall: CallerStall;

  /** `relocate` maps the answer's `Location` onto the proxy (`proxiedLocation`); `warnings` hears of an answer passed on unframed. */
  constructor(
    private readonly res: ServerResponse,
    finishWaitMs: number,
    private readonly relocate?: (location: string) => string,
    private readonly warnings?: CodingWarnings,
  ) {
    this.stall = new CallerStall(res, finishWaitMs);
    res.on("close", this.onCallerClose);
    res.on("drain", this.onDrain);
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    if (this.stopped) controller.abort(new Error("call dropped"));
  }

  onResponseStart(controller: Dispatcher.DispatchController, status: number, headers: IncomingHttpHeaders): void {
    if (status < 200) return; // informational; the final head follows
    const refusal = answerRepresentationRefusal(headers);
    if (refusal) {
      this.stopped = true;
      controller.abort(new Error("call dropped"));
      return refuse(this.res, refusal);
    }
    this.res.writeHead(status, callerHeaders(headers, this.relocate, this.warnings?.unframed));
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.stopped) return;
    if (this.res.write(chunk)) return;
    controller.pause();
    this.stall.arm(() => !this.done);
  }

  onResponseEnd(): void {
    this.done = true;
    this.stall.clear();
    if (!this.stopped) this.res.end();
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.done = true;
    this.stall.clear();
    if (this.stopped) return;
    if (!this.res.headersSent) refuse(this.res, new CheckpointError("upstream_failed", `upstream: ${error.message}`));
    else this.res.destroy();
  }

  private readonly onCallerClose = (): void => {
    this.stall.clear();
    if (this.res.writableFinished || this.done) return;
    this.stopped = true;
    this.controller?.abort(new Error("call dropped"));
  };

  /** Once the upstream is done its socket may carry another call: a late resume must not touch it. */
  private readonly onDrain = (): void => {
    this.stall.clear();
    if (!this.done) this.controller?.resume();
  };
}
