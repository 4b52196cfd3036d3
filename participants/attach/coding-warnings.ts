import type { Logger } from "pino";

/** Past this many different warnings, the rest are debug too (an upstream could name endless codings). */
const MAX_WARNED = 8;

/**
 * One proxy's warnings about upstream answers coded in a way it cannot see through or pass on as
 * named: the first of each (per coding) is a warning, its repeats are debug. An upstream that codes
 * one answer so codes every one, and a warning per call would fill the log. No metric fits them
 * (`gym_ckpt.refusals` counts refusals; these answers are passed on), so the log is all that says so.
 */
export class CodingWarnings {
  private readonly warned = new Set<string>();

  constructor(private readonly logger: Logger | undefined) {}

  /** An answer whose `chunked` is not its last coding was passed on as it came, naming no content coding (bound: a callback). */
  readonly unframed = (transferEncoding: string): void => {
    this.once(`unframed\u0000${transferEncoding}`, { transfer_encoding: transferEncoding }, "upstream answer's Transfer-Encoding does not end in chunked: its body runs to the connection's close with its chunk framing still in it, passed on as it came with no Content-Encoding");
  };

  /**
   * A tracked call's 2xx answer came coded (`coding`) although the proxy asked for `accept-encoding:
   * identity`: its usage cannot be read from its last bytes (the row has none), nor whether a stream
   * ended in an error event (recorded as a success). The caller still gets the answer.
   */
  codedAnswer(coding: string, captureKey: string): void {
    this.once(`coded\u0000${coding}`, { coding, capture_key: captureKey }, "upstream coded a tracked call's answer despite accept-encoding: identity: its ledger row has no usage, and a stream ending in an error event is recorded as a success");
  }

  private once(key: string, fields: object, message: string): void {
    if (this.warned.has(key) || this.warned.size >= MAX_WARNED) return void this.logger?.debug(fields, message);
    this.warned.add(key);
    this.logger?.warn({ ...fields, repeats_logged_at: "debug" }, message);
  }
}
