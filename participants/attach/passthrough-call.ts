import type { IncomingHttpHeaders, ServerResponse } from "node:http";
import type { Dispatcher } from "undici";
import { CheckpointError } from "../../protocol/index.js";
import { callerHeaders } from "./hop-headers.js";
import { refuse } from "./replies.js";

/**
 * An untracked call's upstream answer (`/v1/models`, …), as an undici dispatch handler: head and
 * chunks written straight to the caller, the upstream paused while the caller's socket is full. The
 * caller leaving drops the upstream call.
 */
export class PassthroughCall implements Dispatcher.DispatchHandler {
  private controller: Dispatcher.DispatchController | null = null;
  private done = false;
  private stopped = false;

  /** `relocate` maps the answer's `Location` onto the proxy (`proxiedLocation`). */
  constructor(
    private readonly res: ServerResponse,
    private readonly relocate?: (location: string) => string,
  ) {
    res.on("close", this.onCallerClose);
    res.on("drain", this.onDrain);
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    if (this.stopped) controller.abort(new Error("call dropped"));
  }

  onResponseStart(_controller: Dispatcher.DispatchController, status: number, headers: IncomingHttpHeaders): void {
    if (status >= 200) this.res.writeHead(status, callerHeaders(headers, this.relocate));
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (!this.res.write(chunk)) controller.pause();
  }

  onResponseEnd(): void {
    this.done = true;
    this.res.end();
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.done = true;
    if (this.stopped) return;
    if (!this.res.headersSent) refuse(this.res, new CheckpointError("upstream_failed", `upstream: ${error.message}`));
    else this.res.destroy();
  }

  private readonly onCallerClose = (): void => {
    if (this.res.writableFinished || this.done) return;
    this.stopped = true;
    this.controller?.abort(new Error("call dropped"));
  };

  /** Once the upstream is done its socket may carry another call: a late resume must not touch it. */
  private readonly onDrain = (): void => {
    if (!this.done) this.controller?.resume();
  };
}
