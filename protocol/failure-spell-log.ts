/** What a spell's lines go to (a pino logger fits). */
export interface SpellLogger {
  warn(fields: object, message: string): void;
  info(fields: object, message: string): void;
  debug(fields: object, message: string): void;
}

/**
 * The log of one spell of a failure a process retries by itself (a Gym server down for the
 * collector's retires, NATS unreachable for a participant's heartbeat): its first failure is a
 * warning, the tries after it are debug, and the first success ends the spell in one info line
 * (`ended`, with `failed_tries` and `failing_s`). The message is the caller's, unchanged (an event
 * name stays greppable); the warning says `repeats_logged_at: "debug"`. One warning with its stack per try filled the
 * log for as long as the outage lasted.
 */
export class FailureSpellLog {
  private since: number | undefined;
  private failedTries = 0;

  constructor(
    private readonly logger: SpellLogger | undefined,
    private readonly ended: string,
  ) {}

  /** A try failed; `message` says what failed and what happens next. */
  failed(err: unknown, message: string, fields: object = {}): void {
    this.failedTries++;
    if (this.since !== undefined) {
      this.logger?.debug({ ...fields, err, failed_tries: this.failedTries }, message);
      return;
    }
    this.since = performance.now();
    // Said on the line, so a quiet log after it is not read as the failure having ended.
    this.logger?.warn({ ...fields, err, repeats_logged_at: "debug" }, message);
  }

  /** A try succeeded: a spell of failures, if there was one, is over. */
  succeeded(fields: object = {}): void {
    if (this.since === undefined) return;
    this.logger?.info({ ...fields, failed_tries: this.failedTries, failing_s: Math.round((performance.now() - this.since) / 100) / 10 }, this.ended);
    this.since = undefined;
    this.failedTries = 0;
  }
}
