import type { IncomingHttpHeaders, ServerResponse } from "node:http";
import type { Logger } from "pino";
import type { Dispatcher } from "undici";
import { CheckpointError } from "../../protocol/index.js";
import type { AdmissionTicket } from "../kinds/model/admission-ticket.js";
import type { ModelKind } from "../kinds/model/model-kind.js";
import { CallerStall, onceSocket } from "./caller-stall.js";
import type { CodingWarnings } from "./coding-warnings.js";
import { answerRepresentationRefusal, bodyCodings, callerHeaders } from "./hop-headers.js";
import { refuse } from "./replies.js";
import { isCompleteEvent, lastEventStart, mayEndStream } from "./sse-events.js";
import { UsageTail } from "./usage-tail.js";

/** While a response start waits (held), at most this much of its body is kept before the upstream is paused. */
const WAITING_BYTES = 64 * 1024;
/** A streamed answer's held last event: past this many bytes without an event boundary, all but the newest chunk leave. */
const HELD_EVENT_BYTES = 64 * 1024;

/**
 * One admitted generation call's upstream answer, as an undici dispatch handler writing straight to
 * the caller's response. The response start waits for the ticket (held while admission is closed)
 * with the first bytes queued; from then on each chunk is written through as it comes and the
 * upstream is paused while the caller's socket is full (resumed on 'drain'; a caller that lets the
 * finish wait pass without one is cut), so a stream is never buffered here. The ledger row is written before the response ends, and the response's last
 * bytes wait for it, then leave with the end in one socket write: the final body bytes of an answer
 * with a content-length, and of an answer without one (a stream) an event that may be its last
 * (`data: [DONE]`, a completion or error event: `mayEndStream`), written through only once the next
 * one begins, since a caller may stop reading there without waiting for the terminating chunk
 * (openai-python does). Other complete events leave as they come; an incomplete one waits for its end. If the row cannot be
 * written, the caller's connection is cut instead, so the caller never holds a complete answer the
 * ledger does not know. The ticket stays open (a readiness blocker) until the response
 * has been handed to the caller's socket in full ('finish'); a caller gone before that has the row
 * taken back (`ModelKind.undelivered`).
 *
 * Failures: an upstream error before any answer is a 502, as is an answer whose `Connection` names a
 * header describing its body (`answerRepresentationRefusal`); an upstream lost while the response is held
 * is a 502 at once (the caller re-issues the call after the checkpoint) — unless WAITING_BYTES of its
 * body came first: then the upstream is paused, the loss shows only when the response is released,
 * and the caller's connection is cut after the head; mid-stream the caller's
 * connection is cut. Retiring the ticket or the caller leaving drops the upstream call and fails the
 * ticket; a completed 2xx answer writes the ledger row, unless it is a stream ending in an error event.
 */
export class ForwardedCall implements Dispatcher.DispatchHandler {
  private controller: Dispatcher.DispatchController | null = null;
  /** Set once the upstream answered (status and headers). */
  private head: { status: number; headers: IncomingHttpHeaders } | null = null;
  /** Body chunks that came before the caller's response started; null once it has. */
  private waiting: Buffer[] | null = [];
  private waitingBytes = 0;
  private upstreamDone = false;
  /** The upstream failed before the caller's response started. */
  private lost = false;
  /** We dropped the upstream call: its error callback is ours, not news. */
  private stopped = false;
  private settled = false;
  private readonly tail = new UsageTail();
  /** The answer's content-length, if it has one; its last bytes (without one: its last event) are withheld until the row is written. */
  private length: number | null = null;
  /** Body bytes written to the caller so far. */
  private sent = 0;
  /** The withheld last body bytes: the end of a content-length body, or a stream's last event so far (if held). */
  private last: Buffer | null = null;
  /**
   * The event under way (without a content-length) outgrew HELD_EVENT_BYTES and its older bytes left
   * already, with something in them that may end the stream (its `event: response.completed` line):
   * its end is withheld like that of a short one.
   */
  private leftEventMayEnd = false;
  /** The row is written and the response ended: the ticket waits for the response to leave. */
  private recorded = false;
  private callerGone = false;
  /** 'finish' was emitted: the last bytes were handed to the caller's socket. */
  private handedOver = false;
  /** Armed while the upstream is paused for the caller's full socket; 'drain' disarms it. */
  private readonly stall: CallerStall;

  constructor(
    private readonly res: ServerResponse,
    private readonly ticket: AdmissionTicket,
    private readonly kind: ModelKind,
    private readonly logger: Logger | undefined,
    private readonly finishWaitMs: number,
    /** Maps the answer's `Location` onto the proxy (`proxiedLocation`). */
    private readonly relocate?: (location: string) => string,
    /** The proxy's warnings about answers coded so that the proxy cannot read (or name) them. */
    private readonly warnings?: CodingWarnings,
  ) {
    this.stall = new CallerStall(res, finishWaitMs);
    ticket.abort.signal.addEventListener("abort", this.onRetired, { once: true });
    res.on("close", this.onCallerClose);
    res.on("finish", this.onFinished);
  }

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller;
    if (this.stopped) controller.abort(new Error("call dropped"));
  }

  onResponseStart(_controller: Dispatcher.DispatchController, status: number, headers: IncomingHttpHeaders): void {
    if (status < 200) return; // informational; the final head follows
    // Its body would leave without what says how to read it: a 502 at once (held or not), no row.
    const refusal = answerRepresentationRefusal(headers);
    if (refusal) {
      this.stopUpstream();
      refuse(this.res, refusal);
      return this.failOnce();
    }
    this.head = { status, headers };
    // Asked for `accept-encoding: identity`, yet coded: the row's usage and the error-event check read
    // the last bytes as sent, so both miss. Said, not refused: the caller's answer is fine as it is.
    if (status < 300) {
      const coding = bodyCodings(headers);
      if (coding !== undefined) this.warnings?.codedAnswer(coding, this.ticket.captureKey);
    }
    const length = Number(headers["content-length"]);
    this.length = headers["content-length"] !== undefined && Number.isSafeInteger(length) && length > 0 ? length : null;
    this.kind.responseStart(this.ticket).then(this.release, this.onRefused);
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.stopped) return;
    this.tail.push(chunk);
    if (this.waiting) {
      this.waiting.push(chunk);
      this.waitingBytes += chunk.length;
      if (this.waitingBytes >= WAITING_BYTES) controller.pause();
    } else if (!this.send(chunk)) this.pauseForCaller();
  }

  /**
   * Writes a body chunk through, withholding the bytes that would complete a content-length body, or
   * (without a content-length) the stream's last event if it may end the stream or is incomplete.
   * Returns false while the caller's socket is full.
   */
  private send(chunk: Buffer): boolean {
    if (this.length !== null) {
      if (this.sent + chunk.length >= this.length) {
        this.last = this.last ? Buffer.concat([this.last, chunk]) : chunk;
        return true;
      }
      this.sent += chunk.length;
      return this.res.write(chunk);
    }
    const pending = this.last ? Buffer.concat([this.last, chunk]) : chunk;
    const start = lastEventStart(pending);
    let cut = start;
    const event = pending.subarray(start);
    // A complete event that cannot end the stream leaves at once; one that may (or one still arriving) waits
    // for the next. One whose older bytes left already (below) is judged by them too: its name is there.
    if (isCompleteEvent(event) && !mayEndStream(event) && !(start === 0 && this.leftEventMayEnd)) cut = pending.length;
    // Not an event stream (or one huge event, a long answer's `response.completed`): keep the memory bounded,
    // still withholding the newest bytes.
    else if (start === 0 && pending.length - chunk.length >= HELD_EVENT_BYTES) {
      cut = pending.length - chunk.length;
      this.leftEventMayEnd ||= mayEndStream(pending.subarray(0, cut));
    }
    // The bytes held begin an event (or nothing is held): nothing of it has left.
    if (start > 0 || cut === pending.length) this.leftEventMayEnd = false;
    this.last = cut < pending.length ? pending.subarray(cut) : null;
    if (cut === 0) return !this.res.writableNeedDrain;
    this.sent += cut;
    return this.res.write(pending.subarray(0, cut));
  }

  onResponseEnd(): void {
    this.upstreamDone = true;
    // The finish wait (after the row) takes over from here.
    this.clearStall();
    if (!this.waiting) this.finish();
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    if (this.settled || this.stopped) return;
    if (!this.head) {
      refuse(this.res, new CheckpointError("upstream_failed", `upstream: ${error.message}`));
      return this.failOnce();
    }
    if (!this.waiting) {
      this.res.destroy();
      return this.failOnce();
    }
    // Answered, but the caller's response has not started: fail at once if it is held; a start still
    // being decided sees `lost` in release().
    this.lost = true;
    if (this.ticket.held) this.upstreamLost();
  }

  /** The ticket lets the response start: write the head and what came so far, then stream. */
  private readonly release = (): void => {
    if (this.res.destroyed) {
      this.stopUpstream();
      return this.failOnce();
    }
    if (this.lost) return this.upstreamLost();
    const { status, headers } = this.head!;
    this.res.writeHead(status, callerHeaders(headers, this.relocate, this.warnings?.unframed));
    const waiting = this.waiting!;
    this.waiting = null;
    let room = true;
    for (const chunk of waiting) room = this.send(chunk) && room;
    if (this.upstreamDone) return this.finish();
    this.res.on("drain", this.onDrain);
    if (room) this.controller?.resume();
    else this.pauseForCaller();
  };

  /** The ticket was retired while the response waited. */
  private readonly onRefused = (error: unknown): void => {
    this.stopUpstream();
    if (!this.res.headersSent && !this.res.destroyed) refuse(this.res, error);
    this.failOnce();
  };

  private readonly onRetired = (): void => {
    this.stopUpstream();
    if (!this.res.headersSent) refuse(this.res, new CheckpointError("stale_attempt", `${this.ticket.captureKey} was retired`));
    else this.res.destroy();
    this.failOnce();
  };

  private readonly onCallerClose = (): void => {
    this.callerGone = true;
    this.clearStall();
    this.ticket.abort.signal.removeEventListener("abort", this.onRetired);
    // Only 'finish' says the response left: Node's `writableFinished` is computed (ended, nothing
    // buffered) and also reads true once a socket that died under the last write dropped its buffer,
    // a case that never emits 'finish'. Trusting it left the ticket open for good, and a retire of
    // its attempt waiting for it.
    if (this.handedOver) return;
    this.stopUpstream();
    if (this.recorded) void this.kind.undelivered(this.ticket);
    else this.failOnce();
  };

  /** The whole response was handed to the caller's socket: a recorded call is delivered. */
  private readonly onFinished = (): void => {
    // After a 'close' (a socket destroyed as its last write completed) the close decided: taken back.
    if (this.callerGone) return;
    this.handedOver = true;
    if (this.recorded) this.kind.delivered(this.ticket);
  };

  /** Once the upstream is done its socket may carry another call: a late resume must not touch it. */
  private readonly onDrain = (): void => {
    this.clearStall();
    if (!this.upstreamDone) this.controller?.resume();
  };

  /**
   * The caller's socket is full: the upstream waits for 'drain'. A caller that stopped reading
   * mid-stream would keep the answer from ever completing (and its key a readiness blocker for
   * ever), so past the finish wait without a 'drain' it counts as gone: its connection is cut, which
   * drops the upstream call and fails the ticket (no row).
   */
  private pauseForCaller(): void {
    this.controller?.pause();
    this.stall.arm(() => !this.upstreamDone);
  }

  private clearStall(): void {
    this.stall.clear();
  }

  private upstreamLost(): void {
    if (!this.res.headersSent && !this.res.writableEnded) refuse(this.res, new CheckpointError("upstream_failed", "upstream: the connection closed before the response completed"));
    this.failOnce();
  }

  private finish(): void {
    const { status, headers } = this.head!;
    // A 200 stream ending in an error event failed as a non-2xx answer does: the client raises and re-issues it.
    if (this.settled || status < 200 || status >= 300 || this.tail.endsInError()) {
      // A non-2xx (or failed) answer was not delivered: no row, a restored cut given back; settled already: nothing more to do.
      this.failOnce();
      return void this.endResponse();
    }
    this.settled = true;
    // The row first (in the file, then in memory: a few microtask turns on the hot path), then the
    // end: the caller cannot issue its next call before the row is its parent.
    const staging = headers["x-ng-staging-key"];
    const stagingKey = typeof staging === "string" && staging ? staging.slice(0, 512) : null;
    this.kind.record(this.ticket, { stagingKey, usage: this.tail.usage() }).then(
      () => {
        // The ticket stays open (a readiness blocker) until 'finish' or 'close' says whether the
        // response left; a caller gone while the row was written never gets it.
        this.recorded = true;
        // Retired, or the caller left, while the row was written: nothing more leaves for the caller.
        if (this.ticket.abort.signal.aborted || this.callerGone || this.res.destroyed) return void this.kind.undelivered(this.ticket);
        this.endResponse();
        // A caller that stopped reading leaves 'finish' pending for ever: past the wait it counts as
        // gone (its connection is cut, the row taken back), so its ticket cannot block every prepare.
        // Not before the response has the connection: a pipelined call's waits behind earlier ones.
        onceSocket(this.res, () => {
          if (this.res.writableFinished || this.res.destroyed) return;
          const stalled = setTimeout(() => {
            if (!this.res.writableFinished) this.res.destroy();
          }, this.finishWaitMs);
          stalled.unref();
          this.res.once("close", () => clearTimeout(stalled));
        });
      },
      (error: unknown) => {
        this.logger?.error({ err: error, capture_key: this.ticket.captureKey }, "ledger row write failed; the call is cut off");
        this.res.destroy();
      },
    );
  }

  private endResponse(): void {
    if (this.res.writableEnded) return;
    if (this.last) this.res.end(this.last);
    else this.res.end();
  }

  private stopUpstream(): void {
    this.stopped = true;
    this.controller?.abort(new Error("call dropped"));
  }

  private failOnce(): void {
    if (this.settled) return;
    this.settled = true;
    this.kind.fail(this.ticket);
  }
}
